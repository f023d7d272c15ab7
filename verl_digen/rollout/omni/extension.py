"""The worker extension vLLM-Omni mixes into its diffusion workers (``worker_extension_cls``), so that the
generator can install a full fine-tune's weights into the running engine through ``collective_rpc``.
Imports nothing of vllm: the methods run on the worker, where ``self.model_runner.pipeline`` is the RL
pipeline the engine built."""

from __future__ import annotations

import torch

EXTENSION_CLASS = "verl_digen.rollout.omni.extension.DigenWorkerExtension"
#: the collective_rpc method name (one home: the backend calls it by this name)
LOAD_WEIGHTS = "digen_load_weights"


class DigenWorkerExtension:
    """Mixed into vllm-omni's ``DiffusionWorker``: weight updates of the served transformer."""

    model_runner: object  # set by the worker this class is mixed into

    def digen_load_weights(self, state: dict[str, torch.Tensor]) -> int:
        """Load the trainer's transformer weights (diffusers names) into the pipeline; returns their count."""
        pipeline = getattr(self.model_runner, "pipeline", None)
        load = getattr(pipeline, "digen_load_transformer_weights", None)
        if load is None:
            raise RuntimeError(f"the served pipeline {type(pipeline).__name__} is not a verl-digen RL pipeline: "
                               "full fine-tune updates need one (rollout.vllm_pipeline null)")
        load(state)
        return len(state)
