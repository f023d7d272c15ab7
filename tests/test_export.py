"""``digen export``: a checkpoint's trained policy, loaded back with diffusers (full fine-tune) or
peft (LoRA) alone, predicts exactly the same velocities (float64 tiny models)."""

from __future__ import annotations

import json

import diffusers
import pytest
import torch

from verl_digen.cli import main
from verl_digen.config import checks, compose
from verl_digen.models import build_model
from verl_digen.workers import checkpoint as ckpt
from verl_digen.workers import policy as P


def _trained_checkpoint(tmp_path, *overrides):
    """A checkpoint as the trainer writes it, of a policy whose trainable weights moved ("trained")."""
    cfg = compose(["model.dtype=float64", "model.latent_size=4", *overrides])
    wcfg = cfg.worker_config()
    model = P.build_policy(wcfg)
    named = [(n, p) for n, p in model.transformer.named_parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in named:
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    payload = {"params": {n: p.detach().clone() for n, p in named}, "optim": {}, "param_groups": [],
               "version": 3, "lora": wcfg.policy.lora}
    path = ckpt.step_dir(tmp_path / "ckpt", 3)
    ckpt.save(path, 0, payload, {"step": 3, "run_id": "r", "config": checks.fingerprint(cfg)}, barrier=lambda: None)
    return path, model


def _velocity(model, transformer=None):
    if transformer is not None:
        model.transformer = transformer
    x = torch.randn(2, *model.latent_shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cond = model.encode_prompts(["a cat", "a dog"])
    return model.velocity(x, torch.tensor([0.7, 0.3], dtype=torch.float64), cond)


def test_full_finetune_export_loads_with_diffusers(tmp_path, capsys):
    path, trained = _trained_checkpoint(tmp_path)
    out = tmp_path / "exports" / "out"  # its parent made too
    assert main(["export", str(path), str(out)]) == 0
    assert "exported step 3" in capsys.readouterr().out
    info = json.loads((out / "export.json").read_text())
    assert info == {"checkpoint": str(path.resolve()), "step": 3, "version": 3, "arch": "flux", "base_model": None,
                    "dtype": "float64", "transformer_class": "FluxTransformer2DModel", "run_id": "r", "ema": False,
                    "verified": True, "kind": "full", "transformer": "transformer", "note": info["note"]}
    assert "build_model('flux', seed=0)" in info["note"]  # a tiny model: how to rebuild its base
    assert main(["export", str(path), str(out)]) == 0  # exporting again into the same folder replaces it
    loaded = diffusers.FluxTransformer2DModel.from_pretrained(out / "transformer",
                                                              torch_dtype=torch.float64).eval()
    assert loaded.dtype == torch.float64
    base = build_model("flux", dtype=torch.float64, seed=0, latent_size=4)
    v_trained, v_base = _velocity(trained), _velocity(base)
    assert torch.equal(_velocity(base, loaded), v_trained)
    assert not torch.allclose(v_trained, v_base)  # the export carries the training


def test_lora_export_is_a_peft_adapter(tmp_path):
    from peft import LoraConfig, set_peft_model_state_dict
    from safetensors.torch import load_file

    path, trained = _trained_checkpoint(tmp_path, "model.lora_rank=2", "model.lora_alpha=4")
    for _ in range(2):  # the second export into the same folder replaces the first
        assert main(["export", str(path), str(tmp_path / "out")]) == 0
    adapter = tmp_path / "out" / "adapter"
    info = json.loads((tmp_path / "out" / "export.json").read_text())
    assert (info["kind"], info["adapter"], info["tensors"]) == ("lora", "adapter",
                                                              len(load_file(adapter / "adapter_model.safetensors")))
    config = LoraConfig.from_pretrained(adapter)
    assert (config.r, config.lora_alpha) == (2, 4.0)
    base = build_model("flux", dtype=torch.float64, seed=0, latent_size=4)
    v_base = _velocity(base)
    base.transformer.add_adapter(config)
    result = set_peft_model_state_dict(base.transformer, load_file(adapter / "adapter_model.safetensors"))
    assert not result.unexpected_keys
    v_trained = _velocity(trained)
    assert torch.equal(_velocity(base), v_trained) and not torch.allclose(v_trained, v_base)


@pytest.mark.parametrize("make, part", [
    (lambda t: t / "nope", "the path does not exist"),
    (lambda t: (t / "half").mkdir() or t / "half", "it has no meta.json"),
])
def test_bad_checkpoint_path_is_one_clear_line(tmp_path, capsys, make, part):
    assert main(["export", str(make(tmp_path)), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("digen: error: no trainer checkpoint at") and part in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_corrupt_checkpoint_is_refused_and_an_old_one_exported_unverified(tmp_path, capsys):
    path, _ = _trained_checkpoint(tmp_path)
    good = (path / ckpt.TRAINER_FILE).read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    (path / ckpt.TRAINER_FILE).write_bytes(bytes(bad))
    assert main(["export", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path / ckpt.TRAINER_FILE}' is corrupt" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    (path / ckpt.TRAINER_FILE).write_bytes(good)
    for f in path.glob("*.xxh3"):  # as saved before the digests existed
        f.unlink()
    meta = json.loads((path / ckpt.META_FILE).read_text())
    meta.pop("checksum")
    meta["files"] = {k: v for k, v in meta["files"].items() if not k.endswith(".xxh3")}
    (path / ckpt.META_FILE).write_text(json.dumps(meta))
    assert main(["export", str(path), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "unverified" in out and "exported step 3" in out
    assert json.loads((tmp_path / "out" / "export.json").read_text())["verified"] is False


def test_the_exported_policy_is_the_model_the_checkpoint_records():
    """``digen export`` rebuilds the policy from the run config a checkpoint records: every model setting is read,
    and a setting the config leaves out takes the run's default."""
    from verl_digen.workers.config import PolicyConfig
    from verl_digen.workers.export import _policy_config

    full = {"model.arch": "wan", "model.path": "/ckpt", "model.dtype": "bfloat16", "model.latent_size": 8,
            "model.latent_width": 12, "model.num_frames": 9, "model.seed": 3, "model.lora_rank": 4,
            "model.lora_alpha": 8.0, "model.target_modules": ["to_q", "to_v"]}
    assert _policy_config({"extra": {"config": full}}) == PolicyConfig(
        arch="wan", pretrained="/ckpt", dtype="bfloat16", latent_size=8, latent_width=12, num_frames=9, seed=3,
        lora_rank=4, lora_alpha=8.0, lora_target_modules=("to_q", "to_v"))
    assert _policy_config({"extra": {"config": {"model.arch": "flux"}}}) == PolicyConfig(arch="flux")
    with pytest.raises(ckpt.CheckpointError, match="records no model settings"):
        _policy_config({"extra": {}})


def test_an_export_on_save_drops_what_a_killed_export_left(tmp_path):
    from verl_digen.workers.export import EXPORT_DIR, export_into_checkpoint

    path, _ = _trained_checkpoint(tmp_path)
    partial = path / f".{EXPORT_DIR}.partial"
    partial.mkdir()
    (partial / "stray.bin").write_bytes(b"left by a killed export")
    info = export_into_checkpoint(path)
    assert info["kind"] == "full" and (path / EXPORT_DIR / "transformer").is_dir()
    assert not (path / EXPORT_DIR / "stray.bin").exists() and not partial.exists()
