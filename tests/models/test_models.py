"""Model adapters: every tiny architecture on its real diffusers class, per-row sigmas, CFG, decoding,
prompt embeddings, LoRA, the registry and the real loading path (on tiny models saved to disk)."""

from __future__ import annotations

import json
import os

import diffusers
import pytest
import torch

from verl_digen.models import (
    MODEL_REGISTRY,
    Conditioning,
    WeightsNotFoundError,
    apply_lora,
    build_model,
    build_tiny_model,
    canonical_arch,
    disable_adapters,
    load_lora_state_dict,
    load_pretrained,
    load_transformer,
    lora_parameters,
    lora_state_dict,
)
from verl_digen.models.conditioning import HashedPromptEncoder, PipelinePromptEncoder
from verl_digen.models.packing import image_ids, pack_2x2, unpack_2x2
from verl_digen.models.tiny import tiny_components

ARCHS = ["flux", "sd3", "qwen_image", "wan", "wan2_2", "hunyuan_video"]
VIDEO_ARCHS = ["wan", "wan2_2", "hunyuan_video"]
CFG_ARCHS = ["sd3", "qwen_image", "wan", "wan2_2"]  # undistilled: real CFG branch
DISTILLED_ARCHS = ["flux", "hunyuan_video"]  # guidance embedding
PROMPTS = ["a red cat", "two dogs on a hill at dawn", "x"]
F64 = torch.float64

_CACHE: dict[tuple, object] = {}


def tiny64(arch: str, **kw):
    """float64 tiny models are shared across tests (they are never mutated outside LoRA tests)."""
    key = (arch, tuple(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = build_tiny_model(arch, dtype=F64, **kw)
    return _CACHE[key]


def inputs(model, b: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, *model.latent_shape, generator=g, dtype=F64)
    sigmas = torch.tensor([0.95, 0.4, 0.1, 0.7, 0.25][:b], dtype=F64)
    return x, sigmas, model.encode_prompts((PROMPTS * 2)[:b])


# -- building and the velocity contract ---------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_builds_on_real_class_with_velocity_of_latent_shape(arch):
    model = tiny64(arch)
    assert model.arch == arch and isinstance(model, MODEL_REGISTRY[arch])
    assert type(model.transformer).__module__.startswith("diffusers.")
    n_params = sum(p.numel() for p in model.transformer.parameters())
    assert 30_000 <= n_params <= 100_000
    assert len(model.latent_shape) == (4 if arch in VIDEO_ARCHS else 3)
    x, s, c = inputs(model)
    v = model.velocity(x, s, c, 1.0)
    assert v.shape == x.shape and v.dtype == F64 and torch.isfinite(v).all()
    assert v.std() > 1e-3  # not a degenerate (zero-initialized) output


@pytest.mark.parametrize("arch", ARCHS)
def test_per_row_sigmas_equal_rows_evaluated_alone(arch):
    """Timestep parallelism: rows of one batch at different sigmas == each sample alone at its sigma."""
    model = tiny64(arch)
    x, s, c = inputs(model, b=3)
    scale = 4.0
    batched = model.velocity(x, s, c, scale)
    for i in range(3):
        alone = model.velocity(x[i : i + 1], s[i : i + 1], c.index([i]), scale)
        torch.testing.assert_close(batched[i : i + 1], alone, rtol=0, atol=1e-12)
    # the sigma actually reaches the transformer
    other = model.velocity(x[:1], s[1:2], c.index([0]), scale)
    assert (other - batched[:1]).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ["flux", "sd3"])
def test_per_row_sigmas_float32_close(arch):
    model = build_tiny_model(arch)
    x, s, c = inputs(model, b=2)
    x, s, c = x.float(), s.float(), c.to(dtype=torch.float32)
    batched = model.velocity(x, s, c)
    alone = torch.cat([model.velocity(x[i : i + 1], s[i : i + 1], c.index([i])) for i in range(2)])
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)


def test_scalar_sigma_broadcasts_and_bad_shapes_raise():
    model = tiny64("flux")
    x, s, c = inputs(model, b=2)
    torch.testing.assert_close(model.velocity(x, torch.tensor(0.5), c), model.velocity(x, torch.full((2,), 0.5), c))
    with pytest.raises(ValueError, match="sigmas"):
        model.velocity(x, torch.rand(3, dtype=F64), c)
    with pytest.raises(ValueError, match="4-D"):
        model.velocity(x.unsqueeze(2), s[:2], c)
    with pytest.raises(ValueError, match="rows"):
        model.velocity(x, s[:2], c.index([0]))
    with pytest.raises(ValueError, match="5-D"):
        tiny64("wan").velocity(torch.zeros(2, 4, 16, 16, dtype=F64), s[:2], c)


# -- guidance -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", [*CFG_ARCHS, "flux_cfg"])
def test_cfg_combines_branches_and_scale_one_is_conditional(arch):
    model = tiny64("flux", guidance_embeds=False) if arch == "flux_cfg" else tiny64(arch)
    assert not model.guidance_distilled
    x, s, c = inputs(model)
    assert c.negative is not None and c.negative.keys() == c.tensors.keys()
    pos_only = Conditioning(c.tensors)
    v_pos = model.velocity(x, s, pos_only, 7.0)  # no negative: no CFG even at scale 7
    v_neg = model.velocity(x, s, Conditioning(c.negative), 1.0)
    torch.testing.assert_close(model.velocity(x, s, c, 1.0), v_pos, rtol=0, atol=0)
    guided = model.velocity(x, s, c, 4.5)
    assert (guided - v_pos).abs().max() > 1e-3
    torch.testing.assert_close(guided, v_neg + 4.5 * (v_pos - v_neg), rtol=0, atol=1e-11)


@pytest.mark.parametrize("arch", DISTILLED_ARCHS)
def test_distilled_guidance_is_an_embedding_not_a_branch(arch):
    model = tiny64(arch)
    assert model.guidance_distilled
    x, s, c = inputs(model)
    assert c.negative is None  # no negative prompt is encoded for distilled models
    v1, v4 = model.velocity(x, s, c, 1.0), model.velocity(x, s, c, 4.0)
    assert (v1 - v4).abs().max() > 1e-6
    with_neg = Conditioning(c.tensors, negative={k: v.clone() for k, v in c.tensors.items()})
    torch.testing.assert_close(model.velocity(x, s, with_neg, 4.0), v4, rtol=0, atol=0)


def test_qwen_image_cfg_renorm_keeps_conditional_token_norm():
    base = tiny64("qwen_image")
    model = MODEL_REGISTRY["qwen_image"](
        base.transformer, base.vae, base.prompt_encoder, base.latent_shape, cfg_renorm=True
    )
    x, s, c = inputs(model)
    v_pos = model.velocity(x, s, Conditioning(c.tensors), 1.0)
    guided = model.velocity(x, s, c, 4.0)
    torch.testing.assert_close(pack_2x2(guided).norm(dim=-1), pack_2x2(v_pos).norm(dim=-1))


def test_packing_roundtrip():
    x = torch.randn(2, 4, 6, 8)
    assert pack_2x2(x).shape == (2, 12, 16)
    assert torch.equal(unpack_2x2(pack_2x2(x), 6, 8), x)


@pytest.mark.parametrize("pipeline", ["FluxPipeline", "QwenImagePipeline"])
def test_non_square_packing_and_positions_equal_the_diffusers_pipelines(pipeline):
    """A 6 x 10 latent (rows x columns) is packed, unpacked and positioned as diffusers' own pipeline does it
    for a 48 x 80 px image (its helpers, vae_scale_factor 8): a swapped height and width would differ."""
    cls = getattr(diffusers, pipeline)
    x = torch.randn(2, 4, 6, 10, dtype=F64)
    tokens = cls._pack_latents(x, 2, 4, 6, 10)
    assert torch.equal(pack_2x2(x), tokens)
    assert torch.equal(unpack_2x2(tokens, 6, 10), cls._unpack_latents(tokens, 48, 80, 8).reshape(x.shape))
    if pipeline == "FluxPipeline":
        assert torch.equal(image_ids(6, 10, "cpu", F64), cls._prepare_latent_image_ids(2, 3, 5, "cpu", F64))


@pytest.mark.parametrize("arch", ARCHS)
def test_non_square_latents_sample_and_decode_with_height_and_width_in_place(arch):
    model = build_model(arch, dtype="float64", latent_size=4, latent_width=6)
    assert tuple(model.latent_shape[-2:]) == (4, 6)
    x, s, c = inputs(model, b=2)
    assert model.velocity(x, s, c, 1.0).shape == x.shape
    h, w = model.decode(x).shape[-2:]
    assert h * 6 == w * 4 and h > 4  # pixels keep the latent's aspect ratio
    with pytest.raises(ValueError, match="latent_width must be a positive even number, got 5"):
        build_model(arch, latent_size=4, latent_width=5)


# -- decoding -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arch,expected",
    [
        ("flux", (2, 3, 64, 64)),
        ("sd3", (2, 3, 64, 64)),
        ("qwen_image", (2, 3, 64, 64)),
        ("wan", (2, 3, 3, 32, 32)),
        ("wan2_2", (2, 3, 3, 128, 128)),  # residual VAE with 2x2 pixel patchify: 8x spatial
        ("hunyuan_video", (2, 3, 9, 64, 64)),  # causal 3-D VAE: 4x temporal, F -> 4(F-1)+1
    ],
)
def test_decode_shape_and_range(arch, expected):
    model = build_tiny_model(arch)
    x = torch.randn(2, *model.latent_shape)
    pixels = model.decode(x)
    assert pixels.shape == expected and pixels.dtype == torch.float32
    assert pixels.min() >= 0 and pixels.max() <= 1 and pixels.std() > 0


# -- determinism and prompts ----------------------------------------------------------------------------
def test_same_seed_same_weights_and_float32_float64_agree():
    a, b, c = build_tiny_model("sd3", seed=1), build_tiny_model("sd3", seed=1), build_tiny_model("sd3", seed=2)
    d = tiny_components("sd3", seed=1)[0]
    for pa, pb, pd in zip(a.transformer.parameters(), b.transformer.parameters(), d.parameters()):
        assert torch.equal(pa, pb) and torch.equal(pa, pd)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.transformer.parameters(), c.transformer.parameters()))
    a64 = build_tiny_model("sd3", seed=1, dtype=F64)
    assert all(torch.equal(p.double(), q) for p, q in zip(a.transformer.parameters(), a64.transformer.parameters()))
    # building does not disturb the caller's RNG
    torch.manual_seed(5)
    r1 = torch.rand(1)
    torch.manual_seed(5)
    build_tiny_model("flux", seed=9)
    assert torch.equal(torch.rand(1), r1)


def test_hashed_prompt_embeddings_are_deterministic_per_text():
    model = tiny64("hunyuan_video")
    c1 = model.encode_prompts(["a cat", "a dog", "a cat"])
    c2 = model.encode_prompts(["a dog"])
    t = c1.tensors
    assert set(t) == {"prompt_embeds", "pooled_prompt_embeds", "prompt_mask"}
    assert torch.equal(t["prompt_embeds"][0], t["prompt_embeds"][2])
    assert torch.equal(t["prompt_embeds"][1], c2.tensors["prompt_embeds"][0])
    assert not torch.allclose(t["prompt_embeds"][0], t["prompt_embeds"][1])
    assert not torch.allclose(t["pooled_prompt_embeds"][0], t["pooled_prompt_embeds"][1])
    assert t["prompt_mask"].dtype == torch.long and t["prompt_mask"][0].sum() == 3  # "a cat": 2 words + 1
    enc = HashedPromptEncoder(8, 16, 4, salt="s")
    e32, e64 = enc(["hello"], dtype=torch.float32), enc(["hello"], dtype=F64)
    assert torch.equal(e32["prompt_embeds"], e64["prompt_embeds"].float())
    # negative = the empty prompt's embedding, one row per prompt
    neg = tiny64("sd3").encode_prompts(["a", "b"]).negative
    assert torch.equal(neg["prompt_embeds"][0], neg["prompt_embeds"][1])
    assert torch.equal(neg["prompt_embeds"][0], tiny64("sd3").prompt_encoder([""])["prompt_embeds"][0])


class _StubPipeline:
    """Stands in for a loaded pipeline: returns variable-length Qwen-style embeddings."""

    def encode_prompt(self, prompt, device=None, max_sequence_length=None):
        lengths = [len(p.split()) + 1 for p in prompt]
        n = max(lengths)
        embeds = torch.randn(len(prompt), n, 6)
        mask = torch.tensor([[1] * k + [0] * (n - k) for k in lengths])
        return embeds, mask


def test_pipeline_prompt_encoder_pads_to_fixed_length():
    enc = PipelinePromptEncoder(_StubPipeline(), MODEL_REGISTRY[canonical_arch("qwen_image")], max_sequence_length=10)
    out = enc(["a b c", "d"], dtype=F64)
    assert out["prompt_embeds"].shape == (2, 10, 6) and out["prompt_embeds"].dtype == F64
    assert out["prompt_mask"].tolist()[1] == [1, 1] + [0] * 8


# -- gradients and LoRA ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_batched_gradient_equals_sum_of_per_row_gradients(arch):
    """The property TSP relies on, checked at the adapter level in float64."""
    model = build_tiny_model(arch, dtype=F64)
    x, s, c = inputs(model, b=2)
    params = [p for p in model.transformer.parameters() if p.requires_grad]
    target = torch.randn_like(x)

    def grads(rows):
        v = model.velocity(x[rows], s[rows], c.index(rows), 3.0)
        return torch.autograd.grad((v * target[rows]).sum(), params, allow_unused=True)

    full = grads([0, 1])
    per_row = [grads([i]) for i in range(2)]
    for g_full, g0, g1 in zip(full, *per_row):
        if g_full is None:
            continue
        torch.testing.assert_close(g_full, g0 + g1, rtol=1e-9, atol=1e-11)


def _perturb_lora(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.2)


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_trainable_params_export_and_disable(arch):
    model = build_tiny_model(arch, dtype=F64)
    x, s, c = inputs(model, b=2)
    base = model.velocity(x, s, c, 3.0)
    apply_lora(model, rank=2, alpha=4)
    torch.testing.assert_close(model.velocity(x, s, c, 3.0), base, rtol=0, atol=0)  # B = 0 at init
    trainable = [n for n, p in model.transformer.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.dtype == F64 for p in lora_parameters(model))
    _perturb_lora(model, 0)
    tuned = model.velocity(x, s, c, 3.0)
    assert (tuned - base).abs().max() > 1e-6
    # gradients reach only the adapters
    tuned.square().mean().backward()
    assert all(p.grad is None for p in model.transformer.parameters() if not p.requires_grad)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_parameters(model))
    with disable_adapters(model):
        torch.testing.assert_close(model.velocity(x, s, c, 3.0), base, rtol=0, atol=0)
    assert [n for n, p in model.transformer.named_parameters() if p.requires_grad] == trainable
    torch.testing.assert_close(model.velocity(x, s, c, 3.0), tuned, rtol=0, atol=0)
    sd = lora_state_dict(model)
    assert sd and all("lora_A" in k or "lora_B" in k for k in sd)
    assert len(sd) == len(trainable)


def test_lora_state_dict_roundtrip_and_errors():
    src, dst = build_tiny_model("flux", dtype=F64), build_tiny_model("flux", dtype=F64)
    apply_lora(src, 4)
    apply_lora(dst, 4)
    _perturb_lora(src, 1)
    x, s, c = inputs(src, b=2)
    load_lora_state_dict(dst, lora_state_dict(src))
    torch.testing.assert_close(dst.velocity(x, s, c, 3.5), src.velocity(x, s, c, 3.5), rtol=0, atol=0)
    bad = dict(lora_state_dict(src))
    bad.pop(next(iter(bad)))
    with pytest.raises(ValueError, match="missing"):
        load_lora_state_dict(dst, bad)
    with pytest.raises(ValueError, match="rank"):
        apply_lora(build_tiny_model("sd3"), 0)
    with pytest.raises(ValueError, match="already"):
        apply_lora(src, 2)
    custom = build_tiny_model("wan")
    apply_lora(custom, 2, target_modules=["to_q"])
    assert all(".to_q." in n for n in lora_state_dict(custom))
    with pytest.raises(ValueError, match="no LoRA"):
        lora_state_dict(build_tiny_model("sd3"))


# -- registry and loading -------------------------------------------------------------------------------
def test_registry_names_aliases_and_unknown_arch():
    assert set(MODEL_REGISTRY) == set(ARCHS)
    assert canonical_arch("SD3.5") == "sd3" and canonical_arch("Qwen-Image") == "qwen_image"
    with pytest.raises(ValueError, match="known") as err:
        build_model("stable-cascade")
    assert all(a in str(err.value) for a in ARCHS)
    model = build_model("hunyuan", dtype="fp64", latent_size=8, num_frames=2)
    assert model.latent_shape == (4, 2, 8, 8) and model.dtype == F64
    with pytest.raises(ValueError, match="dtype"):
        build_model("flux", dtype="int3")


@pytest.mark.parametrize("source", ["/nonexistent/weights/FLUX.1-dev", "verl-digen-tests/not-a-cached-model"])
def test_missing_weights_fail_clearly(source):
    """local_files_only: a path that is not there, or a hub id not in the cache, fails fast and says why."""
    with pytest.raises(WeightsNotFoundError, match="present locally") as err:
        load_pretrained("flux", source)
    assert source in str(err.value)
    with pytest.raises(WeightsNotFoundError, match="transformer"):
        load_transformer("sd3", source)
    with pytest.raises(FileNotFoundError):  # WeightsNotFoundError is a FileNotFoundError
        build_model("wan", pretrained=source)


def _save_tiny_pipeline(arch: str, path: str, seed: int) -> diffusers.ModelMixin:
    transformer, vae = tiny_components(arch, seed=seed)
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    if arch == "flux":
        pipe = diffusers.FluxPipeline(
            scheduler=scheduler,
            vae=vae,
            transformer=transformer,
            text_encoder=None,
            tokenizer=None,
            text_encoder_2=None,
            tokenizer_2=None,
        )
    else:
        pipe = diffusers.StableDiffusion3Pipeline(
            scheduler=scheduler,
            vae=vae,
            transformer=transformer,
            text_encoder=None,
            tokenizer=None,
            text_encoder_2=None,
            tokenizer_2=None,
            text_encoder_3=None,
            tokenizer_3=None,
        )
    pipe.save_pretrained(path)
    return transformer


@pytest.mark.parametrize("arch", ["flux", "sd3"])
def test_real_loading_path_on_a_saved_tiny_pipeline(arch, tmp_path):
    saved = _save_tiny_pipeline(arch, str(tmp_path), seed=7)
    assert json.load(open(os.path.join(tmp_path, "model_index.json")))["transformer"][1].endswith("Model")
    with pytest.raises(ValueError, match="text_encoders=False"):
        load_pretrained(arch, str(tmp_path), F64)
    model = load_pretrained(arch, str(tmp_path), F64, height=32, width=32, text_encoders=False)
    assert model.arch == arch and model.dtype == F64 and model.latent_shape == (4, 16, 16)
    assert model.scheduler_config["shift"] == 3.0
    assert model.guidance_distilled == (arch == "flux")
    for p, q in zip(saved.parameters(), model.transformer.parameters()):
        assert torch.equal(p.double(), q)
    x, s, c = inputs(model, b=2)
    assert model.velocity(x, s, c, 3.0).shape == x.shape
    assert model.decode(x).shape == (2, 3, 32, 32)
    wide = build_model(arch, pretrained=str(tmp_path), dtype=F64, latent_size=4, latent_width=8, text_encoders=False)
    assert wide.latent_shape == (4, 4, 8) and wide.decode(inputs(wide, b=1)[0]).shape == (1, 3, 8, 16)
    # the trainer-side path: only the transformer, from its subfolder; LoRA applies to it too
    transformer = load_transformer(arch, str(tmp_path), torch.float32)
    assert type(transformer) is type(saved)
    assert all(torch.equal(p, q) for p, q in zip(saved.parameters(), transformer.parameters()))
    apply_lora(model, 2)
    assert lora_state_dict(model)


# -- one home per architecture: its facts (verl_digen/archs.py), which the adapter class points to -------------
def test_every_adapter_points_to_its_facts_and_the_registry_is_built_from_them():
    """Adding a model = one adapter file + its ``register_arch(ArchFacts(...))``: every registered architecture's
    adapter class is found from its facts, points back to them, and carries every fact the loader, the tiny
    builder and the prompt encoder read."""
    from verl_digen.archs import ARCH_ALIASES, ARCHS
    from verl_digen.models.adapter import DiffusersAdapter
    from verl_digen.models.arch import REQUIRED_ATTRIBUTES
    from verl_digen.models.spec import PretrainedSpec, TinySpec

    assert set(MODEL_REGISTRY) == set(ARCHS)
    assert ARCH_ALIASES == {a.lower(): cls.arch for cls in MODEL_REGISTRY.values() for a in cls.aliases}
    for arch, cls in MODEL_REGISTRY.items():
        facts = ARCHS[arch]
        assert cls.facts is facts and f"{cls.__module__}.{cls.__qualname__}" == facts.adapter
        assert (cls.arch, cls.aliases, cls.pretrained, cls.latent_ndim, cls.sequence_plan) == (
            facts.name, facts.aliases, facts.pretrained, facts.latent_ndim, facts.sequence_plan)
        assert cls.vae_factors(None) == facts.vae_factors
        assert all(hasattr(cls, a) for a in REQUIRED_ATTRIBUTES), cls
        assert isinstance(cls.pretrained, PretrainedSpec) and isinstance(cls.tiny, TinySpec)
        for name in (cls.pretrained.pipeline_class, cls.pretrained.transformer_class, cls.pretrained.vae_class):
            assert hasattr(diffusers, name), (cls, name)  # the installed diffusers has every class named
        assert (cls.pretrained.num_frames is not None) == (cls.latent_ndim == 5)
        kwargs = cls.tiny.transformer_kwargs
        assert cls.text_dim_key in kwargs and (cls.pooled_dim_key is None or cls.pooled_dim_key in kwargs)
        assert cls.encode_with_pipeline.__func__ is not DiffusersAdapter.encode_with_pipeline.__func__, cls
        assert canonical_arch(cls.arch.upper()) == cls.arch
        assert all(canonical_arch(a) == cls.arch for a in cls.aliases)


def test_adding_a_model_is_one_class_and_one_register_call():
    """A throwaway architecture, declared the way an adapter file declares one (facts + class) and registered
    with one call, is at once buildable tiny, loadable from weights, encodable through a pipeline, known to the
    torch-free config side, and refused on name clashes."""
    from dataclasses import replace

    from verl_digen.archs import ARCH_ALIASES, ARCHS, ArchFacts, Companions, arch_facts, register_arch, unregister_arch
    from verl_digen.models.adapter import DiffusersAdapter
    from verl_digen.models.arch import register, unregister
    from verl_digen.models.loading import hashed_encoder_for, latent_shape_for
    from verl_digen.models.sd3 import SD3Model
    from verl_digen.models.spec import PretrainedSpec

    toy = ArchFacts(
        name="toy_sd3", aliases=("Toy-SD3",), adapter="tests.models.test_models.ToyModel",
        pretrained=PretrainedSpec("StableDiffusion3Pipeline", "SD3Transformer2DModel", "AutoencoderKL",
                                  ("text_encoder",), 48, 48, max_sequence_length=7),
        latent_ndim=4, vae_factors=(8, 1), companions=Companions(1e9, 1e8, "a toy encoder"),
        rl_pipeline="verl_digen.rollout.omni.pipelines.DigenSD3Pipeline", verl_omni_hints=("toy-sd3",),
    )

    class ToyModel(SD3Model):  # the whole "new file"
        facts = toy

        @classmethod
        def encode_with_pipeline(cls, pipeline, prompts, *, device, dtype, max_sequence_length):
            return {"prompt_embeds": torch.ones(len(prompts), max_sequence_length, 32),
                    "pooled_prompt_embeds": torch.zeros(len(prompts), 32)}

    register(ToyModel)
    try:
        assert ToyModel.arch == "toy_sd3" and arch_facts("TOY-SD3") is toy
        model = build_model("TOY-SD3", dtype="float64", latent_size=8)
        assert type(model) is ToyModel and model.latent_shape == (4, 8, 8)
        x, s, c = inputs(model, b=2)
        assert model.velocity(x, s, c, 3.0).shape == x.shape
        out = PipelinePromptEncoder(object(), ToyModel)(["a", "b"], dtype=F64)
        assert out["prompt_embeds"].shape == (2, 7, 32) and out["prompt_embeds"].dtype == F64
        assert latent_shape_for("toy_sd3", model.transformer, model.vae) == (4, 24, 24)  # 48 px / 2x VAE
        assert hashed_encoder_for("toy_sd3", model.transformer).pooled_dim == 32
        with pytest.raises(ValueError, match="already registered"):
            register(type("Clash", (ToyModel,), {"facts": replace(toy, name="toy2", aliases=("sd3.5",))}))
        with pytest.raises(TypeError, match="lower-case"):
            register(type("Upper", (ToyModel,), {"facts": replace(toy, name="Toy3", aliases=())}))
    finally:
        unregister("toy_sd3")
    assert "toy_sd3" not in MODEL_REGISTRY and "toy_sd3" not in ARCHS and "toy-sd3" not in ARCH_ALIASES

    stray = register_arch(replace(toy, adapter="verl_digen.models.sd3.SD3Model"))  # a class with other facts
    try:
        with pytest.raises(TypeError, match="not the registered facts"):
            MODEL_REGISTRY["toy_sd3"]
    finally:
        unregister_arch(stray.name)

    class Undeclared(DiffusersAdapter):  # forgot its facts
        def _forward(self, latents, sigmas, tensors, guidance_scale):
            return latents

        def _decode_latents(self, latents):
            return latents

    with pytest.raises(TypeError, match="facts"):
        register(Undeclared)


# -- Wan2.2 TI2V-5B -------------------------------------------------------------------------------------
def test_wan22_per_row_timestep_equals_the_pipelines_per_token_timestep():
    """The Wan2.2 TI2V pipeline passes one timestep per latent token (``expand_timesteps``); for text-to-
    video those are the row's t everywhere, and the adapter's one-per-row timestep gives the same velocity."""
    model = tiny64("wan2_2")
    x, s, c = inputs(model, b=3)
    v = model.velocity(x, s, c, 1.0)
    f, h, w = model.latent_shape[1:]
    per_token = (s * 1000)[:, None].expand(3, f * (h // 2) * (w // 2))
    ref = model.transformer(hidden_states=x, timestep=per_token, encoder_hidden_states=c.tensors["prompt_embeds"],
                            return_dict=False)[0]
    torch.testing.assert_close(v, ref, rtol=0, atol=1e-12)
    assert model.vae.config.is_residual and model.vae.config.patch_size == 2  # the Wan2.2 VAE family


def _save_wan_pipeline(path: str, arch: str, two_experts: bool = False) -> None:
    transformer, vae = tiny_components(arch, seed=3)
    extra = {}
    if two_experts:  # Wan2.2 A14B layout: a high-noise and a low-noise expert
        extra = {"transformer_2": tiny_components(arch, seed=4)[0], "boundary_ratio": 0.875}
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                                 scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=5.0),
                                 expand_timesteps=not two_experts, **extra)
    pipe.save_pretrained(path)


def test_wan22_loads_from_a_saved_pipeline_with_its_own_vae_compression(tmp_path):
    _save_wan_pipeline(str(tmp_path), "wan2_2")
    model = build_model("wan2.2", pretrained=str(tmp_path), dtype="float64", latent_size=6, num_frames=5,
                        text_encoders=False)
    # latent side from the VAE's own spatial factor (8 for the tiny Wan2.2 VAE), frames by its temporal one (1)
    assert type(model).arch == "wan2_2" and model.latent_shape == (4, 5, 6, 6)
    assert model.pipeline.config.expand_timesteps and model.scheduler_config["shift"] == 5.0
    x, s, c = inputs(model, b=2)
    assert model.velocity(x, s, c, 4.0).shape == x.shape
    assert model.decode(x).shape == (2, 3, 5, 48, 48)
    sized = load_pretrained("wan2_2", str(tmp_path), F64, height=48, width=32, num_frames=5, text_encoders=False)
    assert sized.latent_shape == (4, 5, 6, 4)  # pixels / the VAE's 8x
    two = tmp_path / "a14b"
    _save_wan_pipeline(str(two), "wan2_2", two_experts=True)
    for arch in ("wan2_2", "wan"):
        with pytest.raises(ValueError, match="two-expert"):
            load_pretrained(arch, str(two), F64, text_encoders=False)


def test_wan22_one_grpo_training_step_moves_the_policy():
    """Sampling, reward on decoded video, advantages and one TSP update on the tiny Wan2.2."""
    from verl_digen.algo.selection import StepSelection
    from verl_digen.driver.local import LocalRunConfig, run_local
    from verl_digen.rollout.sampler import SamplerConfig

    cfg = LocalRunConfig(arch="wan2_2", steps=1, prompts_per_step=1, group_size=2, micro_batch_size=2,
                         dtype="float64", sampler=SamplerConfig(num_steps=2, eta=0.7,
                                                                selection=StepSelection("first_k", k=2), decode=True))
    (row,) = run_local(cfg, log=lambda *_: None)
    assert row["rows"] == 4 and row["reward_std"] > 0
    assert 0 < row["grad_norm"] < float("inf")
