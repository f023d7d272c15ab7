"""The VLM judge end to end with a tiny random-weight Qwen2-VL built from a transformers config (and a
tiny word-level tokenizer), saved as a checkpoint directory and loaded the way a real one is."""

from __future__ import annotations

import pytest
import torch

from verl_digen.config import ConfigError, compose, validate
from verl_digen.rewards import build_reward

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]


def build_tiny_judge(path) -> str:
    """A ~30k-parameter Qwen2-VL (random weights, seed 0) + a character-level tokenizer + the Qwen2-VL
    image processor, written with ``save_pretrained`` to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    vocab = {t: i for i, t in enumerate(SPECIALS + [chr(i) for i in range(32, 127)] + ["\n"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"], vision_end_token_id=vocab["<|vision_end|>"])
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2VLForConditionalGeneration(cfg).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    return build_tiny_judge(tmp_path_factory.mktemp("tiny_qwen2vl"))


@pytest.fixture(scope="module")
def judge(judge_dir):
    return build_reward({"name": "vlm_judge", "model_path": judge_dir, "dtype": "float64", "device": "cpu"})


def _images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_score_is_the_expected_digit_of_an_independent_forward(judge, judge_dir):
    """Batched, left-padded scoring equals a one-sample forward built here from the chat markup."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2VLImageProcessor

    from verl_digen.rewards.base import to_pil
    from verl_digen.rewards.vlm_judge import DEFAULT_QUESTION

    images, prompts = _images(2), ["a cat", "a very long prompt about a red car at night"]
    scores = judge(images, prompts)
    assert scores.dtype == torch.float64 and scores.shape == (2,)
    assert bool(((scores >= 0) & (scores <= 9)).all())

    tok = AutoTokenizer.from_pretrained(judge_dir)
    proc = Qwen2VLImageProcessor.from_pretrained(judge_dir)
    model = AutoModelForImageTextToText.from_pretrained(judge_dir, dtype=torch.float64).eval()
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    for i, prompt in enumerate(prompts):
        vision = proc(images=to_pil(images[i: i + 1]), return_tensors="pt")
        pads = "<|image_pad|>" * (int(vision["image_grid_thw"][0].prod()) // 4)
        question = DEFAULT_QUESTION.format(prompt=prompt, max_digit=9)
        text = (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
                f"{pads}<|vision_end|>{question}<|im_end|>\n<|im_start|>assistant\n")
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        mm = (ids["input_ids"] == model.config.image_token_id).int()
        with torch.no_grad():
            logits = model(**ids, pixel_values=vision["pixel_values"].double(),
                           image_grid_thw=vision["image_grid_thw"], mm_token_type_ids=mm).logits[0, -1]
        p = torch.softmax(logits[digits], dim=0)
        assert float(scores[i]) == pytest.approx(float((p * torch.arange(10.0, dtype=torch.float64)).sum()),
                                                 abs=1e-9)


def test_deterministic_and_prompt_and_question_dependent(judge, judge_dir):
    images = _images(2, seed=1)
    a = judge(images, ["a cat", "a cat"])
    assert torch.equal(a, judge(images, ["a cat", "a cat"]))  # no sampling
    assert not torch.equal(a, judge(images, ["a dog on a boat", "a cat"]))  # the prompt reaches the judge
    other = build_reward({"name": "vlm_judge", "model_path": judge_dir, "dtype": "float64", "device": "cpu",
                          "question": "Score {prompt} from 0 to {max_digit}.", "system": None, "max_digit": 4})
    b = other(images, ["a cat", "a cat"])
    assert not torch.allclose(a, b) and bool((b <= 4).all())


def test_judge_scores_generated_images_on_the_generator_path(judge_dir, tmp_path):
    """Config -> validate -> the generator's reward -> a tiny diffusion model's decoded samples scored."""
    from verl_digen.workers import policy as P

    cfg = compose([f"trainer.trace_dir={tmp_path}/t", "reward.name=vlm_judge",
                   f"+reward.kwargs={{model_path: {judge_dir}, dtype: float64, device: cpu}}"])
    assert validate(cfg) == []
    wcfg = cfg.worker_config()
    reward = build_reward(wcfg.reward)
    model = P.freeze(P.build_policy(wcfg))
    traj = P.generate_rows(model, wcfg, step=0, version=0, rows=[(0, 0), (0, 1)], prompts=["a cat", "a cat"])
    images = traj.images.clone()
    scored = P.score_trajectories(reward, traj)
    assert torch.equal(scored.rewards, reward(images, ["a cat", "a cat"]))
    assert set(scored.reward_components) == {"vlm_judge"}


@pytest.mark.parametrize("kwargs, key, part", [
    ("{dtype: float64}", "reward.kwargs", "a model_path"),
    ("{model_path: /nonexistent/judge}", "reward.kwargs.model_path", "an existing checkpoint directory"),
    ("{model_path: JUDGE, temperature: 0.5}", "reward.kwargs", "unknown: ['temperature']"),
])
def test_bad_judge_options_refused_before_ray(kwargs, key, part, judge_dir, tmp_path):
    cfg = compose([f"trainer.trace_dir={tmp_path}/t", "reward.name=vlm_judge",
                   f"+reward.kwargs={kwargs.replace('JUDGE', judge_dir)}"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key and part in str(err.value)


def test_bad_constructor_arguments():
    from verl_digen.rewards.vlm_judge import VLMJudge

    with pytest.raises(ValueError, match="max_digit must be an integer in"):
        VLMJudge("x", max_digit=10)
    with pytest.raises(ValueError, match="question may use only"):
        VLMJudge("x", question="rate {image}")
