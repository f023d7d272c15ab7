"""Deployable exports of a trainer checkpoint (``digen export <checkpoint> <dir>``).

- Full fine-tune: ``<dir>/transformer/``, the diffusers ``save_pretrained`` of the trained transformer
  (load with ``<TransformerClass>.from_pretrained(<dir>/transformer)`` and put it into the base
  pipeline, e.g. ``FluxPipeline.from_pretrained(base, transformer=...)``).
- LoRA: ``<dir>/adapter/``, a PEFT adapter (``adapter_config.json`` + ``adapter_model.safetensors``
  with peft's key names), loadable with ``transformer.add_adapter(LoraConfig.from_pretrained(d))`` +
  ``set_peft_model_state_dict``, or ``PeftModel.from_pretrained``.
- ``<dir>/export.json``: the source checkpoint, its step, the architecture and model settings.
- ``ema=True`` (``digen export --ema``): the same of the checkpoint's EMA of the trained weights
  (``actor.ema_decay``) instead of the weights themselves.
- ``trainer.export_on_save``: every checkpoint gets its export in ``<checkpoint>/export/`` (and
  ``<checkpoint>/export/ema/`` with an EMA), written by :func:`export_into_checkpoint`.

Why rebuild instead of copying tensors: the checkpoint holds only the trainable tensors; the export
must be a complete model (or an adapter plus the base model it applies to), built the same way the
workers build the policy (``workers/policy.build_policy``) from the model settings the checkpoint
recorded. Runs on CPU in the checkpoint's dtype; the whole transformer is held in host memory once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from verl_digen.workers import checkpoint as ckpt

EXPORT_INFO = "export.json"
EXPORT_DIR = "export"  # inside a checkpoint (trainer.export_on_save)


def _policy_config(meta: dict[str, Any]):
    from verl_digen.workers.config import PolicyConfig

    c = (meta.get("extra") or {}).get("config") or {}
    if "model.arch" not in c:
        raise ckpt.CheckpointError("the checkpoint records no model settings (written by an older verl-digen); "
                                   "it cannot be exported")
    tm = c.get("model.target_modules")
    return PolicyConfig(arch=c["model.arch"], pretrained=c.get("model.path"), dtype=c.get("model.dtype", "float32"),
                        latent_size=c.get("model.latent_size"),
                        latent_width=c.get("model.latent_width"), num_frames=c.get("model.num_frames"),
                        seed=int(c.get("model.seed", 0)), lora_rank=int(c.get("model.lora_rank", 0)),
                        lora_alpha=c.get("model.lora_alpha"), lora_target_modules=tuple(tm) if tm else None)


def load_trained_policy(path: str | Path, ema: bool = False):
    """(the policy with the checkpoint's trained weights, or their EMA, its meta.json); a clear
    ``CheckpointError`` for a path that is not a complete checkpoint, whose tensors do not fit the recorded
    model, or (``ema``) that holds no EMA."""
    from verl_digen.workers import policy as P
    from verl_digen.workers.config import WorkerConfig

    meta = ckpt.read_meta(path)
    meta["verified"] = ckpt.verify(path)  # refuses a file whose bytes changed since the save
    pcfg = _policy_config(meta)
    model = P.build_policy(WorkerConfig(policy=pcfg), "cpu")
    saved = ckpt.safe_load(Path(path) / ckpt.TRAINER_FILE)
    if ema and not saved.get("ema"):
        raise ckpt.CheckpointError(f"checkpoint at {str(path)!r} holds no EMA of the weights (the run had no "
                                   "actor.ema_decay): export it without --ema")
    params = saved["ema" if ema else "params"]
    trainable = {n: p for n, p in model.transformer.named_parameters() if p.requires_grad}
    if set(params) != set(trainable):
        missing, extra = sorted(set(trainable) - set(params))[:5], sorted(set(params) - set(trainable))[:5]
        raise ckpt.CheckpointError(f"checkpoint at {str(path)!r} does not fit the recorded model "
                                   f"({pcfg.arch}, lora_rank={pcfg.lora_rank}): missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for name, p in trainable.items():
            p.copy_(params[name])
    return model, meta


def export_checkpoint(path: str | Path, out_dir: str | Path, ema: bool = False) -> dict[str, Any]:
    """Write the deployable export of the checkpoint at ``path`` (its EMA with ``ema``) into ``out_dir``;
    returns export.json (paths in it are relative to ``out_dir``)."""
    from safetensors.torch import save_file

    model, meta = load_trained_policy(path, ema)
    pcfg = _policy_config(meta)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"checkpoint": str(Path(path).resolve()), "step": (meta.get("extra") or {}).get("step"),
                            "version": meta.get("version"), "arch": pcfg.arch, "base_model": pcfg.pretrained,
                            "dtype": pcfg.dtype, "transformer_class": type(model.transformer).__name__,
                            "run_id": (meta.get("extra") or {}).get("run_id"), "ema": ema,
                            "verified": meta["verified"]}
    if pcfg.lora:
        from peft import get_peft_model_state_dict

        from verl_digen.models.lora import ADAPTER_NAME

        adapter = out / "adapter"
        adapter.mkdir(exist_ok=True)
        model.transformer.peft_config[ADAPTER_NAME].save_pretrained(adapter)
        state = get_peft_model_state_dict(model.transformer, adapter_name=ADAPTER_NAME)
        save_file({k: v.detach().contiguous() for k, v in state.items()}, adapter / "adapter_model.safetensors")
        info.update(kind="lora", adapter=adapter.name, tensors=len(state))
    else:
        target = out / "transformer"
        model.transformer.save_pretrained(target)
        info.update(kind="full", transformer=target.name)
    if pcfg.pretrained is None:
        info["note"] = ("tiny random-weight model: the base transformer is rebuilt by "
                        f"verl_digen.models.build_model({pcfg.arch!r}, seed={pcfg.seed})")
    (out / EXPORT_INFO).write_text(json.dumps(info, indent=1, sort_keys=True))
    return info


def export_into_checkpoint(path: str | Path, ema: bool = False) -> dict[str, Any]:
    """``trainer.export_on_save``: the export of a just-saved checkpoint in its own ``export/`` folder (with
    ``ema``, the EMA's in ``export/ema/``), so it is copied, kept and pruned with the checkpoint. Written into
    a partial folder and renamed: a reader never sees half an export."""
    root = Path(path)
    final, tmp = root / EXPORT_DIR, root / f".{EXPORT_DIR}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    info = export_checkpoint(root, tmp)
    if ema:
        export_checkpoint(root, tmp / "ema", ema=True)
    shutil.rmtree(final, ignore_errors=True)  # a re-saved step's checkpoint dir is new: nothing there
    tmp.rename(final)
    return info
