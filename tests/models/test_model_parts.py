"""The adapters' small parts that the velocity tests do not reach: decoding latents exactly as each released
pipeline does (scaling, shift, per-channel statistics), Qwen-Image's prompt call, the registry's cleanup, and
the message of weights that are not there (scripts/mutation.sh's ``models`` scope)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.normalization import FP32LayerNorm

from verl_digen.archs import ARCHS, arch_facts, register_arch
from verl_digen.models import build_model, loading
from verl_digen.models.adapter import DiffusersAdapter
from verl_digen.models.arch import MODEL_REGISTRY, _Adapters, _check, register, unregister
from verl_digen.models.base import Conditioning
from verl_digen.models.conditioning.hashed import prompt_seed
from verl_digen.models.conditioning.text import PipelinePromptEncoder
from verl_digen.models.loading import _missing, hashed_encoder_for, latent_shape_for
from verl_digen.models.lora import apply_lora, default_lora_targets
from verl_digen.models.precision import promote_fp32_layers
from verl_digen.models.qwen_image import QwenImageModel
from verl_digen.models.sd3 import SD3Model

torch.set_num_threads(1)


def _pipeline_decode(arch: str, vae, latents: torch.Tensor) -> torch.Tensor:
    """What the released diffusers pipeline does before ``VaeImageProcessor.postprocess``, then [-1, 1] -> [0, 1]."""
    cfg = vae.config
    if arch == "qwen_image":  # a one-frame video VAE with per-channel mean and std
        mean = torch.tensor(cfg.latents_mean, dtype=torch.float64).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std, dtype=torch.float64).view(1, -1, 1, 1, 1)
        out = vae.decode(latents.unsqueeze(2) * std + mean).sample[:, :, 0]
    elif arch in ("wan", "wan2_2"):  # per-channel mean and std, frames kept
        mean = torch.tensor(cfg.latents_mean, dtype=torch.float64).view(1, -1, 1, 1, 1)
        std = torch.tensor(cfg.latents_std, dtype=torch.float64).view(1, -1, 1, 1, 1)
        out = vae.decode(latents * std + mean).sample
    elif arch == "hunyuan_video":
        out = vae.decode(latents / cfg.scaling_factor).sample
    else:  # SD3, FLUX
        out = vae.decode(latents / cfg.scaling_factor + (cfg.shift_factor or 0.0)).sample
    return (out.float() / 2 + 0.5).clamp(0, 1)


@pytest.mark.parametrize("arch,shift", [("sd3", None), ("sd3", 0.25), ("flux", 0.25), ("flux", None),
                                        ("qwen_image", None), ("hunyuan_video", None), ("wan", None), ("wan2_2", None)])
def test_decode_is_the_released_pipelines_decode(arch, shift):
    model = build_model(arch, dtype=torch.float64, seed=0, latent_size=4)
    if arch in ("sd3", "flux"):  # a VAE with and without a shift factor
        model.vae.register_to_config(shift_factor=shift)
    latents = torch.randn(2, *model.latent_shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(model.decode(latents), _pipeline_decode(arch, model.vae, latents))


@pytest.mark.parametrize("arch", ["qwen_image", "wan"])
def test_channel_statistics_decode_in_bfloat16(arch):
    """The channel statistics take the latents' dtype: a bf16 VAE gets bf16 inputs."""
    model = build_model(arch, dtype=torch.bfloat16, seed=0, latent_size=4)
    latents = torch.randn(1, *model.latent_shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    want = _pipeline_decode(arch, model.vae.to(torch.float64), latents.double())
    model.vae.to(torch.bfloat16)
    torch.testing.assert_close(model.decode(latents), want, atol=0.05, rtol=0)


def test_qwen_image_asks_the_pipeline_for_the_text_length_on_the_device_and_pads_to_it():
    calls: list[dict] = []

    def encode_prompt(**kw):
        calls.append(kw)
        return torch.ones(2, 3, 4), None  # variable-length embeddings, no mask

    out = QwenImageModel.encode_with_pipeline(SimpleNamespace(encode_prompt=encode_prompt), ["a", "b"],
                                              device="cpu", dtype=torch.float32, max_sequence_length=5)
    assert calls == [{"prompt": ["a", "b"], "device": "cpu", "max_sequence_length": 5}]
    assert out["prompt_embeds"].shape == (2, 5, 4) and out["prompt_mask"].tolist() == [[1, 1, 1, 0, 0]] * 2


def test_unregister_forgets_the_adapter_class_and_takes_an_architecture_never_looked_up():
    facts = replace(arch_facts("sd3"), name="toy_unreg", aliases=(), verl_omni_hints=("toy-unreg",))
    toy = type("ToyUnreg", (SD3Model,), {"facts": facts})
    register(toy)
    assert MODEL_REGISTRY["toy_unreg"] is toy
    unregister("toy_unreg")
    assert "toy_unreg" not in MODEL_REGISTRY._classes and "toy_unreg" not in ARCHS  # the class is not kept
    register_arch(facts)  # declared, its class never looked up: nothing to forget but the facts
    unregister("toy_unreg")
    assert "toy_unreg" not in ARCHS


def test_missing_weights_say_where_they_were_looked_for(tmp_path):
    err = _missing(str(tmp_path), "the transformer", OSError("no config.json"))
    assert f"cannot load the transformer from local directory '{tmp_path}'" in str(err)
    assert str(err).endswith("Underlying error: OSError: no config.json")
    assert "from path or hub id 'org/model'" in str(_missing("org/model", "the VAE", KeyError("x")))


def _inputs(model):
    g = torch.Generator().manual_seed(5)
    x = torch.randn((2, *model.latent_shape), generator=g, dtype=torch.float64)
    return x, torch.tensor([0.9, 0.4], dtype=torch.float64), model.encode_prompts(["a cat", "a dog runs far"])


@pytest.mark.parametrize("arch", ["qwen_image", "hunyuan_video"])
def test_padded_prompt_tokens_do_not_reach_the_velocity(arch):
    """The prompt mask goes to the transformer: changing the embeddings of padded tokens (mask 0) changes
    nothing, bit for bit."""
    model = build_model(arch, dtype=torch.float64, seed=0, latent_size=4)
    x, s, cond = _inputs(model)
    mask = cond.tensors["prompt_mask"]
    assert bool((mask == 0).any())
    padded = cond.tensors["prompt_embeds"].clone()
    padded[mask == 0] += 5.0
    other = Conditioning({**cond.tensors, "prompt_embeds": padded}, cond.negative)
    assert torch.equal(model.velocity(x, s, other, 3.0), model.velocity(x, s, cond, 3.0))


def test_hunyuan_video_velocity_is_the_pipelines_transformer_call():
    """diffusers' HunyuanVideoPipeline: timestep = 1000 sigma and guidance = 1000 scale, passed already scaled."""
    model = build_model("hunyuan_video", dtype=torch.float64, seed=0, latent_size=4)
    x, s, cond = _inputs(model)
    t = cond.tensors
    want = model.transformer(hidden_states=x, timestep=s * 1000, encoder_hidden_states=t["prompt_embeds"],
                             encoder_attention_mask=t["prompt_mask"], pooled_projections=t["pooled_prompt_embeds"],
                             guidance=torch.full((2,), 3000.0, dtype=torch.float64), return_dict=False)[0]
    assert torch.equal(model.velocity(x, s, cond, 3.0), want)


@pytest.mark.parametrize("arch,factors", [("hunyuan_video", (4, 4)), ("wan2_2", (8, 1))])
def test_the_tiny_video_vae_compresses_as_it_declares(arch, factors):
    """The tiny video VAE's config factors are its real ones: F latent frames decode to (F - 1) * temporal + 1
    frames of ``spatial`` times the latent side."""
    model = build_model(arch, dtype=torch.float64, seed=0, latent_size=4)
    spatial, temporal = type(model).vae_factors(model.vae)
    _, frames, h, w = model.latent_shape
    pixels = model.decode(torch.zeros(1, *model.latent_shape, dtype=torch.float64))
    assert pixels.shape == (1, 3, (frames - 1) * temporal + 1, h * spatial, w * spatial)
    assert (spatial, temporal) == factors


def test_conditioning_to_casts_floating_tensors_and_keeps_masks():
    cond = Conditioning({"e": torch.ones(2, 3), "mask": torch.ones(2, 3, dtype=torch.long)},
                        {"e": torch.zeros(2, 3), "mask": torch.ones(2, 3, dtype=torch.long)}).to("cpu", torch.float64)
    for tensors in (cond.tensors, cond.negative):
        assert tensors["e"].dtype == torch.float64 and tensors["mask"].dtype == torch.long


def test_the_package_imports_its_names_on_first_use():
    import verl_digen.models as M
    from verl_digen.models.sd3 import SD3Model as direct

    M.__dict__.pop("SD3Model", None)  # as before its first use
    assert M.SD3Model is direct and M.__dict__["SD3Model"] is direct  # imported, then kept
    with pytest.raises(AttributeError, match="no_such_name"):
        M.no_such_name  # noqa: B018


def test_a_fresh_adapter_registry_resolves_every_architecture():
    fresh = _Adapters()
    assert fresh["sd3"] is SD3Model and fresh["qwen_image"] is QwenImageModel


def test_vae_factors_of_an_image_vae_are_two_to_the_downsamplings():
    vae = SimpleNamespace(config=SimpleNamespace(block_out_channels=(8, 8, 8, 8)))  # SD3's VAE: 3 downsamplings
    assert SD3Model.vae_factors(vae) == (8, 1)


@pytest.mark.parametrize("arch,height,width,frames", [("flux", 100, 60, None), ("sd3", 100, 60, None),
                                                     ("wan", 100, 60, 10)])
def test_latent_shapes_are_whole_numbers(arch, height, width, frames):
    """Pixel sizes that do not divide: the latent shape rounds down (and to even sides when packed), in ints."""
    model = build_model(arch, dtype=torch.float64, seed=0, latent_size=4)
    shape = latent_shape_for(arch, model.transformer, model.vae, height, width, frames)
    assert all(type(d) is int for d in shape)


def test_hashed_prompts_are_eight_tokens_salted_by_architecture():
    model = build_model("sd3", dtype=torch.float64, seed=0, latent_size=4)
    enc = hashed_encoder_for("sd3", model.transformer)
    assert enc.seq_len == 8 and enc.salt == "hashed-sd3"


def test_qwen_image_plain_cfg_unless_asked_and_adapter_options_pass_through():
    transformer = torch.nn.Linear(1, 1)
    model = QwenImageModel(transformer, None, None, (16, 8, 8), negative_prompt="blurry")
    assert not model.cfg_renorm and model.negative_prompt == "blurry"


def _fake_pipeline(model, moved: list, **parts):
    """A loaded pipeline's parts around a tiny model (what ``load_pretrained`` reads of it)."""
    return SimpleNamespace(transformer=model.transformer, vae=model.vae, to=moved.append, **parts)


def test_load_pretrained_builds_the_adapter_from_the_pipelines_parts(monkeypatch):
    tiny = build_model("qwen_image", dtype=torch.float64, seed=0, latent_size=4)
    calls: list[tuple] = []
    moved: list = []
    pipe = _fake_pipeline(tiny, moved, text_encoder=object(), scheduler=SimpleNamespace(config={"shift": 3.0}))
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: calls.append((a, k)) or pipe)
    model = loading.load_pretrained("qwen_image", "ckpt", torch.float64, "cpu", latent_size=4)
    assert calls == [(("qwen_image", "ckpt", torch.float64), {"text_encoders": True, "local_files_only": True})]
    assert moved == ["cpu"] and model.pipeline is pipe and model.negative_prompt == ""
    assert model.cfg_renorm and model.scheduler_config == {"shift": 3.0}  # the released pipeline's settings
    assert isinstance(model.prompt_encoder, PipelinePromptEncoder) and model.prompt_encoder.pipeline is pipe
    factor = QwenImageModel.vae_factors(tiny.vae)[0]
    assert model.latent_shape == latent_shape_for("qwen_image", tiny.transformer, tiny.vae, 4 * factor, 4 * factor)
    # saved without text encoders or scheduler: hashed prompts, no scheduler config, the released pixel size
    bare = _fake_pipeline(tiny, moved, text_encoder=None)
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: bare)
    model = loading.load_pretrained("qwen_image", "ckpt", torch.float64, text_encoders=False)
    assert model.scheduler_config is None and not isinstance(model.prompt_encoder, PipelinePromptEncoder)
    assert model.latent_shape == latent_shape_for("qwen_image", tiny.transformer, tiny.vae)


def test_load_pretrained_refuses_a_pipeline_with_only_some_text_encoders(monkeypatch):
    tiny = build_model("flux", dtype=torch.float64, seed=0, latent_size=4)
    pipe = _fake_pipeline(tiny, [], text_encoder=object(), text_encoder_2=None)
    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pipe)
    with pytest.raises(ValueError, match=r"'ckpt' lacks text encoder\(s\) \['text_encoder_2'\]"):
        loading.load_pretrained("flux", "ckpt", torch.float64)


def test_sd3_velocity_is_the_pipelines_transformer_call():
    """diffusers' StableDiffusion3Pipeline: timestep = 1000 sigma; under CFG the negative rows first."""
    model = build_model("sd3", dtype=torch.float64, seed=0, latent_size=4)
    x, s, cond = _inputs(model)
    t = cond.tensors
    want = model.transformer(hidden_states=x, encoder_hidden_states=t["prompt_embeds"],
                             pooled_projections=t["pooled_prompt_embeds"], timestep=s * 1000, return_dict=False)[0]
    assert torch.equal(model.velocity(x, s, cond), want)  # guidance 1 by default: no CFG branch


def test_velocity_takes_any_input_dtype_and_answers_in_it():
    """float32 latents, sigmas and prompt tensors are cast to the model's float64 (masks stay integers), and the
    velocity comes back in the latents' dtype: equal to the float64 call on the same values."""
    model = build_model("qwen_image", dtype=torch.float64, seed=0, latent_size=4)
    x, s, cond = _inputs(model)
    x, s = x.float().double(), torch.tensor([0.5, 0.25], dtype=torch.float64)
    cond = cond.to(dtype=torch.float32).to(dtype=torch.float64)  # float32-representable prompt values
    want = model.velocity(x, s, cond, 3.0)
    got = model.velocity(x.float(), s.float(), cond.to(dtype=torch.float32), 3.0)
    assert got.dtype == torch.float32 and torch.equal(got, want.float())
    assert model.uses_cfg(1.5, cond) and not model.uses_cfg(1.0, cond)


def test_encode_prompts_in_the_models_dtype_and_refuses_a_bare_string():
    model = build_model("sd3", dtype=torch.float64, seed=0, latent_size=4)
    cond = model.encode_prompts(["a cat", "a dog"])
    floats = [v for v in (*cond.tensors.values(), *cond.negative.values()) if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float64 for v in floats)
    with pytest.raises(ValueError, match="a non-empty list of prompts"):
        model.encode_prompts("a cat")


def test_check_refuses_an_adapter_that_misses_a_declaration_or_a_hook():
    facts = arch_facts("sd3")
    with pytest.raises(TypeError, match=r"Bare does not declare \['facts'"):
        _check(type("Bare", (), {}), facts)
    with pytest.raises(TypeError, match="Abstract does not implement _forward"):
        _check(type("Abstract", (SD3Model,), {"_forward": DiffusersAdapter._forward}), facts)
    assert _check(SD3Model, facts) is SD3Model


def test_conditioning_keeps_its_extras_and_no_salt_is_the_empty_salt():
    cond = Conditioning({"e": torch.ones(1, 2)}, None, {"shape": (4, 4)})
    assert cond.to(dtype=torch.float64).extras == {"shape": (4, 4)}
    assert prompt_seed("a cat") == prompt_seed("a cat", salt="")


def test_apply_lora_settings_and_what_it_trains():
    model = build_model("sd3", dtype=torch.float64, seed=0, latent_size=4)
    apply_lora(model, rank=1, alpha=4, dropout=0.25, init_lora_weights="gaussian")
    config = model.transformer.peft_config["default"]
    assert (config.r, config.lora_alpha, config.lora_dropout, config.init_lora_weights) == (1, 4.0, 0.25, "gaussian")
    assert set(config.target_modules) == set(default_lora_targets(model))
    named = dict(model.transformer.named_parameters())
    assert all(p.requires_grad == ("lora_" in n) for n, p in named.items())  # the base weights stay frozen
    assert all(p.dtype == torch.float64 for n, p in named.items() if "lora_" in n)
    assert apply_lora(build_model("sd3", dtype=torch.float64, seed=0, latent_size=4), 2).transformer.peft_config[
        "default"].lora_alpha == 2.0  # alpha defaults to the rank


def test_default_lora_targets_are_the_models_own_else_attention():
    assert default_lora_targets(object()) == ["to_q", "to_k", "to_v", "to_out.0"]
    assert default_lora_targets(SimpleNamespace(default_lora_targets=("proj",))) == ["proj"]


def test_promoted_layer_norm_is_a_float64_layer_norm_with_its_weight_and_bias():
    norm = FP32LayerNorm(4, elementwise_affine=True, bias=True).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        norm.bias.copy_(torch.tensor([0.5, -0.5, 0.25, 0.0]))
    x = torch.randn(3, 4, dtype=torch.float64)
    want = F.layer_norm(x, (4,), norm.weight, norm.bias, norm.eps)
    assert promote_fp32_layers(norm) == 1 and torch.equal(norm(x), want)
    assert norm(x.float()).dtype == torch.float32
