"""What the opt-in vLLM tier (tests/workers/test_vllm_engine.py) builds before it starts the real engine:
tiny local SD3 and FLUX diffusers checkpoints, every component random-weight and built offline.

The transformer and VAE are verl-digen's tiny components of the architecture (``models.tiny.tiny_components``);
the text encoders are tiny CLIP and T5 configs, their tokenizers built from a character vocabulary (no
download: only PyPI is reachable here). Sizes follow the tiny transformer. SD3: ``joint_attention_dim`` = T5's
``d_model`` (the two CLIPs' hidden states, concatenated, are zero-padded up to it) and ``pooled_projection_dim``
= the sum of the two CLIP projection dims, as in the released SD3. FLUX: T5's ``d_model`` =
``joint_attention_dim`` and the CLIP's pooled output (its hidden size) = ``pooled_projection_dim``.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

CLIP_HIDDEN = 16  # each of the two CLIPs; 16 + 16 <= TINY_TEXT_DIM (T5's d_model)
CLIP_MAX_LEN = 77


def _clip_tokenizer():
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTokenizer

    chars = sorted(ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=CLIP_MAX_LEN), vocab


def _t5_tokenizer():
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -3.0) for c in string.ascii_letters + string.digits + string.punctuation]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def _clip_encoder(vocab: dict[str, int], projection_dim: int | None, seed: int, hidden: int = CLIP_HIDDEN):
    """A tiny CLIP text model, with a projection (SD3) or without (FLUX: ``projection_dim=None``)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=CLIP_MAX_LEN,
                         projection_dim=projection_dim or hidden, bos_token_id=vocab["<|startoftext|>"],
                         eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"])
    torch.manual_seed(seed)
    return (CLIPTextModel(cfg) if projection_dim is None else CLIPTextModelWithProjection(cfg)).eval()


def _t5_encoder(vocab_size: int, d_model: int, seed: int):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=1, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=32, dropout_rate=0.0,
                   feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(seed)
    return T5EncoderModel(cfg).eval()


def save_tiny_sd3(path: str | Path, seed: int = 0, shift: float = 3.0) -> str:
    """A complete SD3 diffusers checkpoint (``model_index.json`` and the nine component folders) at ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    from verl_digen.models.spec import TINY_POOLED_DIM, TINY_TEXT_DIM
    from verl_digen.models.tiny import tiny_components

    transformer, vae = tiny_components("sd3", seed)
    tok, vocab = _clip_tokenizer()
    tok_2, _ = _clip_tokenizer()
    tok_3 = _t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        te = _clip_encoder(vocab, TINY_POOLED_DIM // 2, seed + 1)
        te_2 = _clip_encoder(vocab, TINY_POOLED_DIM - TINY_POOLED_DIM // 2, seed + 2)
        te_3 = _t5_encoder(len(tok_3), TINY_TEXT_DIM, seed + 3)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), vae=vae,
        text_encoder=te, tokenizer=tok, text_encoder_2=te_2, tokenizer_2=tok_2, text_encoder_3=te_3,
        tokenizer_3=tok_3,
    )
    pipe.save_pretrained(str(path))
    return str(path)


def save_tiny_flux(path: str | Path, seed: int = 0, shift: float = 3.0) -> str:
    """A complete FLUX.1-dev-style checkpoint (guidance-distilled tiny transformer, CLIP + T5) at ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from verl_digen.models.spec import TINY_POOLED_DIM, TINY_TEXT_DIM
    from verl_digen.models.tiny import tiny_components

    transformer, vae = tiny_components("flux", seed)
    tok, vocab = _clip_tokenizer()
    tok_2 = _t5_tokenizer()
    with torch.random.fork_rng(devices=[]):
        te = _clip_encoder(vocab, None, seed + 1, hidden=TINY_POOLED_DIM)
        te_2 = _t5_encoder(len(tok_2), TINY_TEXT_DIM, seed + 2)
    pipe = FluxPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), vae=vae,
                        text_encoder=te, tokenizer=tok, text_encoder_2=te_2, tokenizer_2=tok_2)
    pipe.save_pretrained(str(path))
    return str(path)


SAVERS = {"sd3": save_tiny_sd3, "flux": save_tiny_flux}


def save_tiny_wan(path: str | Path, seed: int = 0, shift: float = 3.0) -> str:
    """A complete Wan2.1-style checkpoint (tiny transformer, tiny Wan VAE, UMT5) at ``path``. The tiny VAE's
    config keeps diffusers' default compression factors (8, 4) though it compresses 2x / 1x; both sides read the
    same config, so the served and the trainer's latent shapes agree (only the decoded size is small)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    from verl_digen.models.spec import TINY_TEXT_DIM
    from verl_digen.models.tiny import tiny_components

    transformer, vae = tiny_components("wan", seed)
    tok = _t5_tokenizer()
    cfg = UMT5Config(vocab_size=len(tok), d_model=TINY_TEXT_DIM, d_kv=8, d_ff=2 * TINY_TEXT_DIM, num_layers=1,
                     num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=32,
                     dropout_rate=0.0, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
                     decoder_start_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        te = UMT5EncoderModel(cfg).eval()
    pipe = WanPipeline(tokenizer=tok, text_encoder=te, transformer=transformer, vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=shift))
    pipe.save_pretrained(str(path))
    return str(path)


SAVERS["wan"] = save_tiny_wan


def _qwen_tokenizer():
    """A byte-level character vocabulary with Qwen's chat-template special tokens."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|endoftext|>",
                         pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": [
        "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]})
    return tok


def save_tiny_qwen_image(path: str | Path, seed: int = 0, shift: float = 3.0) -> str:
    """A complete Qwen-Image checkpoint (tiny transformer and VAE, a tiny Qwen2.5-VL text encoder whose last
    hidden state is ``joint_attention_dim`` wide) at ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from verl_digen.models.spec import TINY_TEXT_DIM
    from verl_digen.models.tiny import tiny_components

    transformer, vae = tiny_components("qwen_image", seed)
    tok = _qwen_tokenizer()
    ids = tok.convert_tokens_to_ids
    eos = ids("<|endoftext|>")
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=TINY_TEXT_DIM, intermediate_size=2 * TINY_TEXT_DIM,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
                         rope_parameters={"rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 1e4}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TINY_TEXT_DIM,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[0],
                           window_size=112),
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        te = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), vae=vae, text_encoder=te,
                             tokenizer=tok, transformer=transformer)
    pipe.save_pretrained(str(path))
    return str(path)


SAVERS["qwen_image"] = save_tiny_qwen_image


def _llama_tokenizer():
    """A byte-level character vocabulary with the Llama-3 chat-template special tokens HunyuanVideo's prompt
    template uses."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    vocab.update({t: len(vocab) + i for i, t in enumerate(specials)})
    model = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|end_of_text|>"))
    model.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        pre_tokenizers.Split(pattern="", behavior="isolated")])
    tok = PreTrainedTokenizerFast(tokenizer_object=model, bos_token=specials[0], eos_token=specials[1],
                                  pad_token=specials[1])
    tok.add_special_tokens({"additional_special_tokens": specials[2:]})
    return tok


def save_tiny_hunyuan_video(path: str | Path, seed: int = 0, shift: float = 3.0) -> str:
    """A complete HunyuanVideo 1.0 checkpoint (tiny transformer and causal 3-D VAE, a tiny Llama and a CLIP) at
    ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline
    from transformers import LlamaConfig, LlamaModel

    from verl_digen.models.spec import TINY_POOLED_DIM, TINY_TEXT_DIM
    from verl_digen.models.tiny import tiny_components

    transformer, vae = tiny_components("hunyuan_video", seed)
    tok = _llama_tokenizer()
    tok_2, vocab = _clip_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=TINY_TEXT_DIM, intermediate_size=2 * TINY_TEXT_DIM,
                      num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        te = LlamaModel(cfg).eval()
        te_2 = _clip_encoder(vocab, None, seed + 2, hidden=TINY_POOLED_DIM)
    pipe = HunyuanVideoPipeline(text_encoder=te, tokenizer=tok, transformer=transformer, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=shift), text_encoder_2=te_2,
                                tokenizer_2=tok_2)
    pipe.save_pretrained(str(path))
    return str(path)


SAVERS["hunyuan_video"] = save_tiny_hunyuan_video


def serve_once(cfg, queue) -> None:
    """A generator process of ``test_two_engines_on_one_node_each_run``: start ``VllmOmniRollout`` on the CPU,
    generate one micro-batch, report the engine's rendezvous port and what the worker's environment holds after."""
    import os

    torch.set_num_threads(1)
    try:
        import vllm_cpu_platform

        vllm_cpu_platform.install()
        from verl_digen.workers.vllm_backend import VllmOmniRollout

        backend = VllmOmniRollout(cfg, "cpu")
        traj = backend.generate(1, 0, [0, 1], [0, 0], ["a red cube", "two cats"])
        queue.put({"port": backend.master_port, "log_probs": list(traj.log_probs.shape),
                   "finite": bool(torch.isfinite(traj.log_probs).all()), "env_port": os.environ.get("MASTER_PORT")})
        backend.engine.close()
    except BaseException as err:  # noqa: BLE001 - reported to the test
        queue.put({"error": repr(err)})



def live_text_encoders(checkpoint: str) -> int:
    """How many text encoders of ``checkpoint`` live in this process: modules whose class is named as one of its
    ``model_index.json`` text encoders (transformers' or vllm-omni's own re-implementation of the same name)."""
    import gc
    import json

    index = json.loads((Path(checkpoint) / "model_index.json").read_text())
    names = {v[1] for k, v in index.items() if k.startswith("text_encoder") and isinstance(v, list) and v[1]}
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.nn.Module) and type(o).__name__ in names)


def text_encoder_count(checkpoint: str) -> int:
    """The text encoders one copy of ``checkpoint``'s pipeline has."""
    import json

    index = json.loads((Path(checkpoint) / "model_index.json").read_text())
    return sum(1 for k, v in index.items() if k.startswith("text_encoder") and isinstance(v, list) and v[1])
