"""Rewards: hand-checked values, determinism, video handling, registry, combiner, clear errors."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
import torch

from verl_digen.rewards import (
    DEFAULT_LEARNABLE_REWARD,
    REWARDS,
    Brightness,
    Colorfulness,
    HPSv2,
    ImageRewardScore,
    JpegCompressibility,
    JpegIncompressibility,
    LatentMean,
    LatentTarget,
    MissingRewardDependencyError,
    MissingRewardWeightsError,
    MultiReward,
    OcrReward,
    PickScore,
    RandomCNN,
    Reward,
    build_reward,
    extract_quoted_text,
    levenshtein,
    ocr_similarity,
    register_reward,
    to_pil,
)

PIXEL_REWARDS = ["jpeg_compressibility", "jpeg_incompressibility", "brightness", "colorfulness", "random_cnn"]


def _images(batch: int = 4, size: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _prompts(batch: int = 4) -> list[str]:
    return [f"prompt {i}" for i in range(batch)]


# ---------------------------------------------------------------- hand-checked values


def test_brightness_of_constant_images():
    images = torch.stack([torch.full((3, 8, 8), c) for c in (0.0, 0.25, 1.0)])
    torch.testing.assert_close(Brightness()(images, _prompts(3)), torch.tensor([0.0, 0.25, 1.0], dtype=torch.float64))
    red = torch.zeros(1, 3, 4, 4)
    red[:, 0] = 1.0
    assert Brightness()(red, ["r"]).item() == pytest.approx(0.299)


def test_colorfulness_gray_is_zero_and_known_value():
    gray = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1)).expand(3, 3, 8, 8)
    assert torch.equal(Colorfulness()(gray, _prompts(3)), torch.zeros(3, dtype=torch.float64))
    # constant pure red: rg = 255, yb = 127.5, no spread -> C = 0.3 * sqrt(255^2 + 127.5^2)
    red = torch.zeros(1, 3, 4, 4)
    red[:, 0] = 1.0
    expected = 0.3 * (255.0**2 + 127.5**2) ** 0.5
    assert Colorfulness()(red, ["r"]).item() == pytest.approx(expected)
    # half red / half green: mean rg = 0, yb = 127.5; std rg = 255, std yb = 0 -> C = 255 + 0.3 * 127.5
    split = torch.zeros(1, 3, 4, 4)
    split[:, 0, :, :2] = 1.0
    split[:, 1, :, 2:] = 1.0
    assert Colorfulness()(split, ["rg"]).item() == pytest.approx(255.0 + 0.3 * 127.5)


def test_jpeg_noise_is_less_compressible_than_flat():
    flat = torch.full((1, 3, 64, 64), 0.5)
    noise = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    images = torch.cat([flat, noise])
    comp = JpegCompressibility()(images, _prompts(2))
    incomp = JpegIncompressibility()(images, _prompts(2))
    assert comp[0] > comp[1] and incomp[1] > incomp[0]
    torch.testing.assert_close(comp, -incomp)
    assert (incomp > 0).all() and incomp[1] > 5 * incomp[0]
    with pytest.raises(ValueError, match="quality"):
        JpegCompressibility(quality=0)


def test_latent_rewards():
    latents = torch.stack([torch.full((4, 2, 2), v) for v in (0.0, 0.5, 2.0)])
    images = _images(3)
    torch.testing.assert_close(
        LatentMean()(images, _prompts(3), latents), torch.tensor([0.0, 0.5, 2.0], dtype=torch.float64)
    )
    torch.testing.assert_close(
        LatentTarget()(images, _prompts(3), latents), torch.tensor([-1.0, -0.5, -1.0], dtype=torch.float64)
    )
    assert LatentMean(target=0.5)(images, _prompts(3), latents)[1].item() == 0.0
    # video latents (B, C, F, h, w) and video images are taken whole, not per frame
    video_latents = torch.ones(3, 4, 5, 2, 2)
    assert torch.equal(
        LatentMean()(torch.rand(3, 3, 5, 8, 8), _prompts(3), video_latents), torch.ones(3, dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="latents"):
        LatentMean()(images, _prompts(3))


def test_default_learnable_reward_follows_the_latent_shift():
    reward = build_reward(DEFAULT_LEARNABLE_REWARD)
    base = torch.randn(8, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    low, high = reward(_images(8), _prompts(8), base), reward(_images(8), _prompts(8), base + 0.3)
    torch.testing.assert_close(high - low, torch.full((8,), 0.3, dtype=torch.float64))


# ---------------------------------------------------------------- random CNN


def test_random_cnn_deterministic_per_seed_and_differs_across_seeds():
    images = _images(4)
    first = RandomCNN(seed=3)
    a, b = first(images, _prompts()), first(images, _prompts())
    c = RandomCNN(seed=3)(images, _prompts())
    assert torch.equal(a, b) and torch.equal(a, c)
    d = RandomCNN(seed=4)(images, _prompts())
    assert not torch.allclose(a, d)
    assert a.std() > 0  # it discriminates between images


def test_random_cnn_does_not_touch_global_rng_and_is_batch_invariant():
    state = torch.random.get_rng_state()
    reward = RandomCNN(seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)
    images = _images(6, size=24)
    batched = reward(images, _prompts(6))
    alone = torch.cat([reward(images[i : i + 1], ["x"]) for i in range(6)])
    torch.testing.assert_close(batched, alone, rtol=0, atol=1e-12)
    assert not batched.requires_grad


# ---------------------------------------------------------------- shapes, dtypes, video


@pytest.mark.parametrize("name", PIXEL_REWARDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shapes_and_dtypes(name, dtype):
    out = build_reward(name)(_images(3).to(dtype), _prompts(3))
    assert out.shape == (3,) and out.dtype == torch.float64 and torch.isfinite(out).all()


@pytest.mark.parametrize("name", PIXEL_REWARDS)
def test_video_is_frame_average(name):
    reward = build_reward(name)
    video = torch.rand(2, 3, 4, 16, 16, generator=torch.Generator().manual_seed(5))
    out = reward(video, _prompts(2))
    per_frame = torch.stack([reward(video[:, :, f], _prompts(2)) for f in range(4)], dim=1)
    assert out.shape == (2,)
    torch.testing.assert_close(out, per_frame.mean(dim=1))


def test_video_frame_stride():
    reward = Brightness()
    reward.frame_stride = 2
    video = torch.stack([torch.full((3, 4, 4), v) for v in (0.0, 1.0, 0.2, 1.0)], dim=1)[None]
    assert reward(video, ["v"]).item() == pytest.approx(0.1)


def test_bad_inputs_raise_clearly():
    reward = Brightness()
    with pytest.raises(ValueError, match="shape"):
        reward(torch.rand(2, 4, 8, 8), _prompts(2))
    with pytest.raises(ValueError, match="shape"):
        reward(torch.rand(3, 8, 8), _prompts(3))
    with pytest.raises(ValueError, match="prompts"):
        reward(_images(2), _prompts(3))
    with pytest.raises(TypeError, match="floating"):
        reward(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), _prompts(2))
    with pytest.raises(TypeError, match="list of strings"):
        reward(_images(1), "one prompt")
    with pytest.raises(ValueError, match="batch size"):
        reward(_images(2), _prompts(2), latents=torch.zeros(3, 4))


def test_out_of_range_pixels_are_clamped():
    assert Brightness()(torch.full((1, 3, 4, 4), 3.0), ["x"]).item() == pytest.approx(1.0)


# ---------------------------------------------------------------- registry


def test_registry_names_and_specs():
    assert {
        "jpeg_compressibility",
        "brightness",
        "colorfulness",
        "latent_mean",
        "random_cnn",
        "pickscore",
        "hpsv2",
        "imagereward",
        "ocr",
    } <= set(REWARDS)
    assert isinstance(build_reward("brightness"), Brightness)
    cnn = build_reward({"name": "random_cnn", "seed": 7})
    assert isinstance(cnn, RandomCNN) and cnn.seed == 7
    assert build_reward("random_cnn", seed=2).seed == 2
    assert build_reward(cnn) is cnn
    multi = build_reward({"brightness": 1.0, "colorfulness": 0.01})
    assert isinstance(multi, MultiReward) and multi.weights == {"brightness": 1.0, "colorfulness": 0.01}


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown reward 'nope'.*brightness.*random_cnn"):
        build_reward("nope")
    with pytest.raises(ValueError, match="unknown reward"):
        build_reward({"name": "nope"})
    with pytest.raises(TypeError):
        build_reward(3)
    with pytest.raises(ValueError, match="already built"):
        build_reward(Brightness(), seed=1)
    with pytest.raises(ValueError, match="'name' key"):
        build_reward({"brightness": "heavy"})
    with pytest.raises(ValueError, match="reward 'brightness' is already registered by .*Brightness"):
        register_reward("brightness", Colorfulness)
    assert register_reward("brightness", Brightness) is Brightness  # the same one again: a re-import


def test_register_custom_reward():
    class Ones(Reward):
        name = "ones"

        def score(self, images, prompts, latents):
            return torch.ones(images.shape[0])

    register_reward("test_ones", Ones)  # or @register_reward("test_ones") on the class
    try:
        out = build_reward({"test_ones": 2.0, "brightness": 1.0})(torch.zeros(2, 3, 4, 4), _prompts(2))
        torch.testing.assert_close(out, torch.full((2,), 2.0, dtype=torch.float64))
    finally:
        REWARDS.unregister("test_ones")


# ---------------------------------------------------------------- combiner


def test_multi_reward_is_the_weighted_sum():
    images, prompts, latents = _images(5), _prompts(5), torch.randn(5, 4, 2, 2)
    multi = MultiReward(
        {"brightness": 2.0, "jpeg_compressibility": -0.5, "cnn": {"name": "random_cnn", "seed": 1, "weight": 0.25}}
    )
    parts = multi.components(images, prompts, latents)
    assert list(parts) == ["brightness", "jpeg_compressibility", "cnn"]
    manual = (
        2.0 * Brightness()(images, prompts)
        - 0.5 * JpegCompressibility()(images, prompts)
        + 0.25 * RandomCNN(seed=1)(images, prompts)
    )
    torch.testing.assert_close(parts["cnn"], RandomCNN(seed=1)(images, prompts))
    torch.testing.assert_close(multi(images, prompts, latents), manual)
    torch.testing.assert_close(multi.weighted_sum(parts), manual)
    assert multi(images, prompts).dtype == torch.float64


def test_multi_reward_video_latents_and_instances():
    video, latents = torch.rand(2, 3, 3, 8, 8), torch.randn(2, 4, 3, 2, 2)
    cnn = RandomCNN(seed=9)
    multi = MultiReward({"latent_mean": 1.0, "cnn": 3.0}, rewards={"cnn": cnn})
    assert multi.rewards["cnn"] is cnn
    expected = LatentMean()(video, _prompts(2), latents) + 3.0 * cnn(video, _prompts(2))
    torch.testing.assert_close(multi(video, _prompts(2), latents), expected)


def test_multi_reward_errors():
    with pytest.raises(ValueError, match="at least one"):
        MultiReward({})
    with pytest.raises(ValueError, match="finite"):
        MultiReward({"brightness": float("nan")})
    with pytest.raises(ValueError, match="without a weight"):
        MultiReward({"brightness": 1.0}, rewards={"other": Brightness()})
    with pytest.raises(ValueError, match="unknown reward"):
        MultiReward({"nope": 1.0})
    with pytest.raises(KeyError, match="colorfulness"):
        MultiReward({"brightness": 1.0, "colorfulness": 1.0}).weighted_sum({"brightness": torch.zeros(2)})


# ---------------------------------------------------------------- OCR text math (always runs)


def test_levenshtein_and_similarity():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3 and levenshtein("abc", "abc") == 0 and levenshtein("ab", "ba") == 2
    assert extract_quoted_text('a neon sign that says "Open Late" at night') == "Open Late"
    assert extract_quoted_text("a sign saying “Café”") == "Café"
    assert extract_quoted_text("no quotes here") == "no quotes here"
    assert ocr_similarity("OPEN late", "Open Late") == 1.0  # case and spaces do not count
    assert ocr_similarity("openlote", "openlate") == pytest.approx(1 - 1 / 8)
    assert ocr_similarity("", "hello") == 0.0
    assert ocr_similarity("something much longer than it", "hi") == 0.0  # distance capped at len(target)


def test_ocr_reward_with_injected_recognizer():
    seen = []

    def recognizer(image):
        seen.append(image.size)
        return "HELL0"

    reward = OcrReward(recognizer=recognizer)
    out = reward(_images(2), ['a card reading "hello"', 'a card reading "bye"'])
    torch.testing.assert_close(out, torch.tensor([0.8, 0.0], dtype=torch.float64))
    assert seen == [(16, 16), (16, 16)]
    video = OcrReward(recognizer=recognizer, frame_stride=2)(torch.rand(1, 3, 5, 8, 8), ['"hello"'])
    assert video.item() == pytest.approx(0.8) and len(seen) == 5  # frames 0, 2, 4
    with pytest.raises(ValueError, match="frame_stride"):
        OcrReward(recognizer=recognizer, frame_stride=0)


@pytest.mark.skipif(
    importlib.util.find_spec("rapidocr_onnxruntime") is None,
    reason="rapidocr-onnxruntime not installed (optional: pip install verl-digen[rewards])",
)
@pytest.mark.slow
def test_ocr_reward_with_rapidocr():
    from PIL import Image, ImageDraw, ImageFont

    canvas = Image.new("RGB", (256, 96), "white")
    ImageDraw.Draw(canvas).text((16, 20), "HELLO", fill="black", font=ImageFont.load_default(size=48))
    image = torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)[None].float() / 255
    out = OcrReward()(image.expand(2, -1, -1, -1), ['a sign that says "hello"', 'a sign that says "zzzzz"'])
    assert out[0] >= 0.8 and out[1] == 0.0


# ---------------------------------------------------------------- external loaders: clear errors


@pytest.mark.parametrize(
    ("factory", "modules", "pip_name"),
    [
        (PickScore, ["transformers"], "transformers"),
        (HPSv2, ["open_clip", "hpsv2", "hpsv2.src", "hpsv2.src.open_clip"], "open_clip_torch"),
        (ImageRewardScore, ["ImageReward"], "image-reward"),
        (OcrReward, ["rapidocr_onnxruntime"], "rapidocr-onnxruntime"),
    ],
)
def test_missing_package_errors_name_the_package(monkeypatch, factory, modules, pip_name):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(MissingRewardDependencyError, match=rf"pip install {pip_name}.*verl-digen\[rewards\]"):
        factory()


def test_missing_package_error_via_registry(monkeypatch):
    monkeypatch.setitem(sys.modules, "ImageReward", None)
    with pytest.raises(ImportError, match="image-reward"):
        build_reward("imagereward")


def test_pickscore_missing_weights_names_the_id(tmp_path):
    with pytest.raises(MissingRewardWeightsError, match="laion/CLIP-ViT-H-14-laion2B-s32B-b79K"):
        PickScore(cache_dir=str(tmp_path))
    processor_dir = _tiny_clip(tmp_path)[1]
    with pytest.raises(MissingRewardWeightsError, match="yuvalkirstain/PickScore_v1"):
        PickScore(processor_path=processor_dir, cache_dir=str(tmp_path))
    with pytest.raises(MissingRewardWeightsError, match="absent' does not exist"):
        PickScore(model_path=str(tmp_path / "absent"), processor_path=processor_dir)


def test_single_file_weights_missing(monkeypatch, tmp_path):
    from verl_digen.rewards.external import resolve_hub_file

    with pytest.raises(MissingRewardWeightsError, match="xswu/HPSv2.*HPS_v2.1_compressed.pt"):
        resolve_hub_file(None, "xswu/HPSv2", "HPS_v2.1_compressed.pt", "hpsv2", cache_dir=str(tmp_path))
    with pytest.raises(MissingRewardWeightsError, match="absent.pt"):
        resolve_hub_file(str(tmp_path / "absent.pt"), "x/y", "f", "hpsv2")
    present = tmp_path / "w.pt"
    present.write_bytes(b"")
    assert resolve_hub_file(str(present), "x/y", "f", "hpsv2") == str(present)


# ---------------------------------------------------------------- PickScore on a tiny CLIP the test builds


def _tiny_clip(root) -> tuple[str, str]:
    """Save a random tiny CLIP model and a char-level processor; returns (model_dir, processor_dir)."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    chars = sorted(ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[])
    image_processor = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor_dir, model_dir = str(root / "processor"), str(root / "model")
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(processor_dir)
    text = dict(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=77,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
    )
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8
    )
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).save_pretrained(model_dir)
    return model_dir, processor_dir


def test_pickscore_scores_with_a_tiny_local_clip(tmp_path):
    pytest.importorskip("transformers")
    model_dir, processor_dir = _tiny_clip(tmp_path)
    reward = build_reward("pickscore", model_path=model_dir, processor_path=processor_dir, device="cpu", batch_size=2)
    images, prompts = _images(3, size=20), ["a cat", "a dog on a mat", "x"]
    out = reward(images, prompts)
    assert out.shape == (3,) and out.dtype == torch.float64 and torch.isfinite(out).all()
    # scores do not depend on chunking, and match the logit-scaled cosine computed by hand
    whole = PickScore(model_path=model_dir, processor_path=processor_dir, device="cpu", batch_size=8)(images, prompts)
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)
    proc, model = reward.processor, reward.model
    pixels = proc(images=to_pil(images), return_tensors="pt")["pixel_values"]
    tokens = proc(text=prompts, padding=True, return_tensors="pt")
    img = model.vision_model(pixel_values=pixels).pooler_output @ model.visual_projection.weight.T
    txt = model.text_model(**tokens).pooler_output @ model.text_projection.weight.T
    cos = torch.nn.functional.cosine_similarity(img, txt, dim=-1)
    torch.testing.assert_close(out, (model.logit_scale.exp() * cos).double(), rtol=1e-4, atol=1e-4)
