"""The platform hooks vllm-omni 0.30.0 lacks on CPU, supplied by the opt-in vLLM tier
(tests/workers/test_vllm_engine.py). Imports vllm and vllm-omni: import it only where they import.

vllm-omni resolves ``vllm_omni.platforms.current_omni_platform`` lazily to the first platform whose probe finds a
device (``vllm_omni/platforms/__init__.py:132-168``); with no GPU it is ``UnspecifiedOmniPlatform``
(``vllm_omni/platforms/interface.py:394``), which names the CPU as its device and leaves the rest of the interface
raising ``NotImplementedError`` (or, through vLLM's ``Platform.__getattr__``, ``vllm/platforms/interface.py:1153``,
resolving to ``torch.cpu``'s attribute of that name, or None where ``torch.cpu`` has none). vLLM's own
``vllm.platforms.current_platform`` is likewise ``UnspecifiedPlatform`` with a CUDA build of vllm and no GPU.

``install()`` turns both objects into the CPU classes below in place (their ``__class__``), so every module that
already bound them sees the hooks (on a machine with a GPU it leaves the platforms alone). With one diffusion
stage and ``custom_pipeline_args`` the engine runs inline in the calling process
(``vllm_omni/engine/stage_runtime.py:1201-1202``: an ``InlineStageDiffusionClient`` thread) with the in-process
executor (``vllm_omni/diffusion/executor/abstract.py:40-42``: one device), so patching this process is enough: no
worker process is spawned.

The hooks are numbered below, each with the call it answers (paths in the vllm-omni / vllm packages). Test
code only: verl-digen's own code never imports this module.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from vllm.platforms.interface import UnspecifiedPlatform
from vllm_omni.diffusion.attention.backends.sdpa import SDPABackend, SDPAImpl
from vllm_omni.platforms.interface import UnspecifiedOmniPlatform


def _memory() -> tuple[int, int]:
    """(available, total) host memory in bytes."""
    import psutil  # a vllm dependency

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


class CpuSDPAImpl(SDPAImpl):
    """``AttentionImpl.forward`` dispatches on the platform kind and raises for any other
    (``vllm_omni/diffusion/attention/backends/abstract.py:280-299``); SDPA's CUDA path is plain
    ``torch.nn.functional.scaled_dot_product_attention`` (``backends/sdpa.py:138-145``), which runs on CPU."""

    def forward(self, query, key, value, attn_metadata=None):
        return self.forward_cuda(query, key, value, attn_metadata)


class CpuSDPABackend(SDPABackend):
    @staticmethod
    def get_impl_cls() -> type[SDPAImpl]:
        return CpuSDPAImpl


class CpuOmniPlatform(UnspecifiedOmniPlatform):
    """The CPU as one device, gloo for the (one-rank) process groups, PyTorch SDPA for attention."""

    device_name = "cpu"
    device_type = "cpu"
    # 1. diffusion/distributed/parallel_state.py:400,721: the backend of init_distributed_environment and of
    #    the model-parallel groups (the CUDA platform's is nccl)
    dist_backend = "gloo"

    # 2. diffusion/worker/diffusion_worker.py:331-332 (init_device): the worker's device
    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def set_device(cls, device: Any) -> None:
        return None

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    # 3. torch.cuda.synchronize / empty_cache around loads, steps and timings (diffusion_worker.py:435,487,848,
    #    ...; diffusion_model_runner.py:1020): CPU ops are synchronous and have no cache to empty
    @classmethod
    def synchronize(cls) -> None:
        return None

    @classmethod
    def empty_cache(cls) -> None:
        return None

    # 4. memory queries: diffusion_worker.py:841-852,919-937,981-983 (the load's memory report)
    @classmethod
    def get_free_memory(cls, device: Any = None) -> int:
        return _memory()[0]

    @classmethod
    def get_device_memory(cls, device: Any = None) -> tuple[int, int]:
        return _memory()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return _memory()[1]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "cpu"

    # 5. diffusion/worker/diffusion_model_runner.py:802 (before each request batch) and :616-617 (the output's
    #    peak memory): torch.cuda's peak statistics, which torch.cpu lacks (the base resolves them to None)
    @classmethod
    def reset_peak_memory_stats(cls, device: Any = None) -> None:
        return None

    @classmethod
    def max_memory_allocated(cls, device: Any = None) -> int:
        return 0

    @classmethod
    def max_memory_reserved(cls, device: Any = None) -> int:
        return 0

    # 6. diffusion/attention/selector.py:68: the attention backend of every diffusion Attention layer
    @classmethod
    def get_diffusion_attn_backend_cls(cls, selected_backend: str | None, head_size: int,
                                       allow_trtllm_default: bool = False) -> str:
        return f"{__name__}.CpuSDPABackend"

    # 7. diffusion/worker/diffusion_model_runner.py:386: no torch.compile with inductor
    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False


class CpuVllmPlatform(UnspecifiedPlatform):
    """vLLM's own platform, which vllm-omni's model runner also asks."""

    # 8. vllm/utils/mem_utils.py:88 (DeviceMemoryProfiler, around the model load at
    #    vllm_omni/diffusion/worker/diffusion_model_runner.py:343): torch.cuda's allocated bytes
    @classmethod
    def get_current_memory_usage(cls, device: Any = None) -> float:
        return 0.0

    # 9. vllm/utils/platform_utils.py:44-47: page-locked host memory needs a CUDA driver (LoRA weights are
    #    pinned when loaded to CPU, vllm/lora/lora_model.py:129,156-162); install() also resets the
    #    ``PIN_MEMORY`` constant vllm/utils/torch_utils.py:75 took from this at import
    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False


def install() -> bool:
    """Make vllm-omni's and vLLM's current platforms the CPU ones, in place (idempotent). Where vllm-omni found a
    device platform (a GPU) nothing is patched and the engine runs there; returns whether the CPU hooks are in."""
    import vllm.platforms
    import vllm_omni.platforms

    omni = vllm_omni.platforms.current_omni_platform  # resolves it (no GPU: UnspecifiedOmniPlatform)
    if type(omni) is CpuOmniPlatform:
        return True
    if type(omni) is not UnspecifiedOmniPlatform:
        return False
    omni.__class__ = CpuOmniPlatform
    if type(vllm.platforms.current_platform) is UnspecifiedPlatform:
        vllm.platforms.current_platform.__class__ = CpuVllmPlatform
    from vllm.utils.platform_utils import is_pin_memory_available

    is_pin_memory_available.cache_clear()
    for name, module in list(sys.modules.items()):  # the modules that copied PIN_MEMORY at import
        if name.split(".")[0] in ("vllm", "vllm_omni") and getattr(module, "PIN_MEMORY", None) is True:
            module.PIN_MEMORY = False
    return True
