"""The worker extension vLLM-Omni mixes into its diffusion workers (``worker_extension_cls``), so that the
generator can install a full fine-tune's weights into the running engine through ``collective_rpc``.
Imports nothing of vllm: the methods run on the worker, where ``self.model_runner.pipeline`` is the RL
pipeline the engine built."""

from __future__ import annotations

import torch

EXTENSION_CLASS = "verl_digen.rollout.omni.extension.DigenWorkerExtension"
#: the collective_rpc method names (one home: the backend calls them by these names)
LOAD_WEIGHTS = "digen_load_weights"
LOAD_LORA = "digen_load_lora"
READ_WEIGHTS = "digen_read_weights"
READ_LORA = "digen_read_lora"
ENCODE = "digen_encode_prompts"
ATTENTION = "digen_attention_backends"


class DigenWorkerExtension:
    """Mixed into vllm-omni's ``DiffusionWorker``: weight updates of the served transformer."""

    model_runner: object  # set by the worker this class is mixed into

    def re_init_pipeline(self, custom_pipeline_args: dict) -> None:
        """Build the RL pipeline named by ``custom_pipeline_args``. vllm-omni mixes its own
        ``CustomPipelineWorkerExtension`` (which has this method) into the worker only when no
        ``worker_extension_cls`` is given (``vllm_omni/diffusion/worker/diffusion_worker.py:1737-1741``), yet
        calls it whenever a ``pipeline_class`` is (``:1713-1715``): an extension must provide it. Delegates to
        vllm-omni's (``:1113-1136``), imported here, on the worker, so this module still imports without vllm."""
        from vllm_omni.diffusion.worker.diffusion_worker import CustomPipelineWorkerExtension

        CustomPipelineWorkerExtension.re_init_pipeline(self, custom_pipeline_args)  # type: ignore[arg-type]

    def digen_load_weights(self, state: dict[str, torch.Tensor]) -> int:
        """Load the trainer's transformer weights (diffusers names) into the pipeline; returns their count."""
        pipeline = getattr(self.model_runner, "pipeline", None)
        load = getattr(pipeline, "digen_load_transformer_weights", None)
        if load is None:
            raise RuntimeError(f"the served pipeline {type(pipeline).__name__} is not a verl-digen RL pipeline: "
                               "full fine-tune updates need one (rollout.vllm_pipeline null)")
        load(state)
        return len(state)

    def digen_load_lora(self, state: dict[str, torch.Tensor], config: dict) -> int:
        """Install LoRA adapters (PEFT names, ``rollout.omni.lora.peft_config``) into a pipeline that serves them
        itself (HunyuanVideo's diffusers pipeline); returns their count."""
        pipeline = getattr(self.model_runner, "pipeline", None)
        load = getattr(pipeline, "digen_load_lora", None)
        if load is None:
            raise RuntimeError(f"the served pipeline {type(pipeline).__name__} installs no LoRA adapters itself: "
                               "use LoRARequest (rollout.omni.lora.LoraSlot)")
        load(state, config)
        return len(state)

    def digen_read_weights(self, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
        """The served transformer's weights under the trainer's names and shapes (``layout``), read back."""
        return self._pipeline_method("digen_read_transformer_weights")(layout)

    def digen_encode_prompts(self, prompts: list[str], negatives: list[str], cfg: bool) -> tuple[dict, dict | None]:
        """The prompts' conditioning from the engine's own text encoders (CPU tensors), for
        ``Trajectories.cond``: the generator loads no text encoders of its own."""
        cond = self._pipeline_method("digen_encode")(prompts, negatives, cfg)
        return cond.tensors, cond.negative

    def digen_read_lora(self) -> dict[str, torch.Tensor]:
        """The adapters a pipeline installed itself (``digen_load_lora``), read back."""
        return self._pipeline_method("digen_read_lora")()

    def digen_attention_backends(self) -> dict[str, list[str]]:
        """The attention backends the served pipeline's layers run on (vllm-omni's ``Attention.attn_backend``
        names; a diffusers model's ``set_attention_backend`` choice where it has one): bench/gpu_check.py --vllm."""
        pipeline = getattr(self.model_runner, "pipeline", None)
        names: set[str] = set()
        for module in pipeline.modules() if isinstance(pipeline, torch.nn.Module) else ():
            backend = getattr(module, "attn_backend", None)
            if backend is not None and hasattr(backend, "get_name"):
                names.add(str(backend.get_name()))
            elif getattr(module, "_attention_backend", None) is not None:
                names.add(f"diffusers:{module._attention_backend}")
        return {"attention_backends": sorted(names)}

    def _pipeline_method(self, name: str):  # noqa: ANN202
        pipeline = getattr(self.model_runner, "pipeline", None)
        method = getattr(pipeline, name, None)
        if method is None:
            raise RuntimeError(f"the served pipeline {type(pipeline).__name__} has no {name}: reading the weights "
                               "back needs a verl-digen RL pipeline (rollout.vllm_pipeline null)")
        return method
