"""LoRA adapters for a running vLLM-Omni engine: one directory and one adapter id for the whole run.

vllm-omni loads an adapter from a PEFT directory the first time a request names its id and skips an id it
already holds (``vllm_omni/diffusion/lora/manager.py:808-834``). So each new policy version overwrites the
one directory and the backend removes the id from the engine first; the directory goes when the slot is
closed (or garbage-collected), so no version leaves files behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from verl_digen.archs import arch_facts

#: the engine-side identity of the policy's adapters, the same for every version
ADAPTER_ID = 1
ADAPTER_NAME = "digen_policy"
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def engine_renames(arch: str) -> dict[str, str]:
    """Adapter module names of verl-digen's (diffusers') transformer -> the name of the module they land on in
    vllm-omni 0.30.0's re-implementation, where it differs (``ArchFacts.engine_lora_renames``): Qwen-Image's and
    Wan's attention output is one ``RowParallelLinear`` named ``to_out``
    (vllm_omni/diffusion/models/qwen_image/qwen_image_transformer.py:647, wan2_2/wan2_2_transformer.py:399,591),
    not diffusers' ``to_out`` ModuleList (``to_out.0``); the engine refuses an adapter naming a module it lacks
    ("expected target modules in ...", vllm_omni/diffusion/lora/manager.py:727)."""
    return dict(arch_facts(arch).engine_lora_renames)


def lora_through_extension(arch: str) -> bool:
    """Whether verl-digen's pipeline installs LoRA adapters itself, through the worker extension
    (``extension.LOAD_LORA``), because vllm-omni's LoRA manager cannot wrap its layers: an architecture served
    through vllm-omni's diffusers adapter (``ArchFacts.engine_diffusers_adapter``: HunyuanVideo 1.0,
    ``pipelines.DigenHunyuanVideoPipeline.digen_load_lora``)."""
    return arch_facts(arch).engine_diffusers_adapter


def engine_name(name: str, renames: dict[str, str]) -> str:
    """``name`` (a PEFT key or a target-module suffix) as the engine's modules are named."""
    for old, new in renames.items():
        if name == old or name.endswith(f".{old}"):
            return name[: len(name) - len(old)] + new
        name = name.replace(f".{old}.", f".{new}.")
        if name.startswith(f"{old}."):
            name = f"{new}." + name[len(old) + 1:]
    return name


def peft_config(rank: int, alpha: float | None, target_modules: Sequence[str]) -> dict[str, Any]:
    """The PEFT ``adapter_config.json`` of the trainer's adapters (``models.lora.apply_lora``'s settings)."""
    return {"peft_type": "LORA", "r": int(rank), "lora_alpha": float(alpha if alpha is not None else rank),
            "target_modules": list(target_modules), "lora_dropout": 0.0, "bias": "none"}


class LoraSlot:
    """The one adapter directory of a rollout engine; ``write`` installs a version's adapter weights."""

    def __init__(self, config: dict[str, Any], make_request: Callable[[str, int, str], Any],
                 renames: dict[str, str] | None = None) -> None:
        self.renames = dict(renames or {})  # engine_renames(arch) of the served architecture
        self.config = {**config, "target_modules": [engine_name(t, self.renames) for t in config["target_modules"]]}
        self.make_request = make_request
        self.dir = Path(tempfile.mkdtemp(prefix="digen_lora_"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.dir), True)
        self.version: int | None = None

    def write(self, version: int, state: dict[str, torch.Tensor]) -> Any:
        """Overwrite the directory with ``state`` (PEFT names, as ``models.lora.lora_state_dict`` gives them);
        returns the engine request for it (same name, id and path every version)."""
        from safetensors.torch import save_file

        if self.closed:
            raise RuntimeError("the LoRA slot is closed")
        tmp = self.dir / f".{WEIGHTS_FILE}.tmp"
        save_file({f"base_model.model.{engine_name(k, self.renames)}": v.detach().to("cpu").contiguous()
                   for k, v in state.items()}, str(tmp))
        os.replace(tmp, self.dir / WEIGHTS_FILE)
        (self.dir / CONFIG_FILE).write_text(json.dumps(self.config))
        self.version = int(version)
        return self.make_request(ADAPTER_NAME, ADAPTER_ID, str(self.dir))

    def read(self) -> dict[str, torch.Tensor]:
        """The adapters the engine serves, read back from the directory under the trainer's names."""
        from safetensors.torch import load_file

        back = {new: old for old, new in self.renames.items()}
        prefix = "base_model.model."
        return {engine_name(k[len(prefix):], back): v for k, v in load_file(str(self.dir / WEIGHTS_FILE)).items()}

    @property
    def closed(self) -> bool:
        return not self._cleanup.alive

    def close(self) -> None:
        """Remove the directory (idempotent)."""
        self._cleanup()
