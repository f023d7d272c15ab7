"""The adapters' small parts that the velocity tests do not reach: decoding latents exactly as each released
pipeline does (scaling, shift, per-channel statistics), Qwen-Image's prompt call, the registry's cleanup, and
the message of weights that are not there (scripts/mutation.sh's ``models`` scope)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from verl_digen.archs import ARCHS, arch_facts, register_arch
from verl_digen.models import build_model
from verl_digen.models.arch import MODEL_REGISTRY, register, unregister
from verl_digen.models.loading import _missing
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
    elif arch == "hunyuan_video":
        out = vae.decode(latents / cfg.scaling_factor).sample
    else:  # SD3, FLUX
        out = vae.decode(latents / cfg.scaling_factor + (cfg.shift_factor or 0.0)).sample
    return (out.float() / 2 + 0.5).clamp(0, 1)


@pytest.mark.parametrize("arch,shift", [("sd3", None), ("flux", 0.25), ("flux", None), ("qwen_image", None),
                                        ("hunyuan_video", None)])
def test_decode_is_the_released_pipelines_decode(arch, shift):
    model = build_model(arch, dtype=torch.float64, seed=0, latent_size=4)
    if shift is not None or arch == "flux":  # a VAE with and without a shift factor
        model.vae.register_to_config(shift_factor=shift)
    latents = torch.randn(2, *model.latent_shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.equal(model.decode(latents), _pipeline_decode(arch, model.vae, latents))


def test_qwen_image_decodes_in_bfloat16():
    """The channel statistics take the latents' dtype: a bf16 VAE gets bf16 inputs."""
    model = build_model("qwen_image", dtype=torch.bfloat16, seed=0, latent_size=4)
    latents = torch.randn(1, *model.latent_shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    want = _pipeline_decode("qwen_image", model.vae.to(torch.float64), latents.double())
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
