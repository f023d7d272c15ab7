"""``bench/gpu_check.py --vllm``: one vLLM-Omni engine (``rollout.backend=vllm``) on a tiny SD3 checkpoint, what only
a run of the real engine on the device can tell. Needs vllm and vllm-omni (``scripts/vllm_tier.sh install``, or the
wheel set ``scripts/vllm_tier.sh wheels`` builds for a lent machine). On a CPU (``--device cpu``) it runs on the
vLLM tier's CPU hooks (tests/workers/vllm_cpu_platform.py), so the check itself is exercised without a GPU.

``python bench/vllm_check.py [--device cpu] [--json]`` (or ``bench/gpu_check.py --vllm``) prints one JSON object,
the last line: the attention backends the engine's layers run on, engine start-up s, one full weight update's s
and bytes (bucketed into the engine, ``VllmOmniRollout.load_weights``), peak device memory against the memory plan's
engine terms for this model (weights, text encoders, VAE, requests in flight; the plan's fixed engine runtime
reported apart), and the log-prob difference between the engine and the trainer's recompute after the update.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

TESTS = Path(__file__).resolve().parent.parent / "tests" / "workers"  # the tier's tiny checkpoints and CPU hooks
PIDS, SIDS = [0, 0, 1, 1], [0, 1, 0, 1]
PROMPTS = ["a red cube", "a red cube", "two cats on a mat", "two cats on a mat"]
LATENT = 16


def _peak_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def _nbytes(module: Any) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values()) if module is not None else 0


def check_vllm(device: str) -> dict[str, Any]:
    """Start one engine, update its weights once, generate, recompute (see the module doc)."""
    sys.path.insert(0, str(TESTS))
    from vllm_engine_helpers import save_tiny_sd3

    from verl_digen.algo.loss import LossConfig
    from verl_digen.algo.selection import StepSelection
    from verl_digen.algo.tsp import recompute_log_probs
    from verl_digen.config.memory import ENGINE_RUNTIME_GIB, GEN_VALUES_PER_TOKEN, GIB
    from verl_digen.models.loading import load_pretrained
    from verl_digen.rollout.omni.extension import ATTENTION
    from verl_digen.rollout.sampler import SamplerConfig
    from verl_digen.workers.config import PolicyConfig, WorkerConfig
    from verl_digen.workers.vllm_backend import VllmOmniRollout, _first

    if device == "cpu":
        import vllm_cpu_platform

        vllm_cpu_platform.install()
    dtype = "bfloat16" if device == "cuda" else "float32"
    tdtype = torch.bfloat16 if device == "cuda" else torch.float32
    sampler = SamplerConfig(num_steps=4, shift=3.0, sde="flow_grpo", eta=0.7, guidance_scale=2.0,
                            selection=StepSelection("first_k", k=3), decode=True)
    with tempfile.TemporaryDirectory(prefix="digen_vllm_check_") as tmp:
        ckpt = save_tiny_sd3(Path(tmp) / "sd3", seed=0)
        cfg = WorkerConfig(policy=PolicyConfig(arch="sd3", pretrained=ckpt, dtype=dtype, latent_size=LATENT),
                           sampler=sampler, seed=11, rollout_backend="vllm", vllm_max_batch=len(PROMPTS))
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before = _peak_bytes(device)
        t0 = time.perf_counter()
        backend = VllmOmniRollout(cfg, device)
        startup_s = time.perf_counter() - t0
        try:
            attention = _first(backend._rpc(ATTENTION, ()))["attention_backends"]
            backend.generate(1, 0, PIDS, SIDS, PROMPTS)  # warm
            trainer = load_pretrained("sd3", ckpt, tdtype, device, latent_size=LATENT)
            gen = torch.Generator(device="cpu").manual_seed(0)
            with torch.no_grad():
                for p in trainer.transformer.parameters():
                    p.add_(0.02 * torch.randn(p.shape, generator=gen).to(p.device, p.dtype))
            state = dict(trainer.transformer.state_dict())
            update_bytes = sum(t.numel() * t.element_size() for t in state.values())
            t0 = time.perf_counter()
            backend.load_weights(1, state)
            if device == "cuda":
                torch.cuda.synchronize()
            update_s = time.perf_counter() - t0
            traj = backend.generate(1, 1, PIDS, SIDS, PROMPTS)
            train_cfg = sampler.train_config(LossConfig())
            with torch.no_grad():
                ref = recompute_log_probs(trainer, traj, train_cfg)
            diff = float((ref.double().cpu() - traj.log_probs.double()).abs().max())
            peak = _peak_bytes(device) - (before if device == "cpu" else 0)
            t = trainer.transformer
            hidden = int(t.config.num_attention_heads * t.config.attention_head_dim)
            tokens = (LATENT // 2) ** 2 + int(getattr(trainer.prompt_encoder, "seq_len", 0) or 0)
            requests = len(PROMPTS) * 2 * GEN_VALUES_PER_TOKEN * tokens * hidden * tdtype.itemsize  # x2: CFG rows
            pipe = getattr(trainer.prompt_encoder, "pipeline", None)
            encoders = sum(_nbytes(getattr(pipe, n, None)) for n in ("text_encoder", "text_encoder_2",
                                                                      "text_encoder_3"))
            plan = update_bytes + encoders + _nbytes(trainer.vae) + requests
        finally:
            backend.close()
            backend.engine.close()
    ok = diff < (1e-2 if device == "cuda" else 5e-4) and startup_s > 0 and update_s > 0
    return {"ok": ok, "device": device, "attention_backends": attention, "engine_start_s": round(startup_s, 3),
            "weight_update_s": round(update_s, 4), "weight_update_bytes": update_bytes,
            "peak_memory_bytes": peak, "plan_engine_bytes": int(plan),
            "plan_engine_runtime_bytes": int(ENGINE_RUNTIME_GIB * GIB),
            "peak_memory": "torch.cuda.max_memory_allocated" if device == "cuda" else "process max RSS growth (host)",
            "logprob_max_abs_diff_vs_recompute": diff, "pid": os.getpid()}


def main() -> None:
    import argparse
    import importlib.util
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", action="store_true", help="accepted for the benches' interface: the figures are "
                    "always one JSON object, the last line")
    args = ap.parse_args()
    if importlib.util.find_spec("vllm_omni") is None:
        raise SystemExit("vllm-omni is not installed here: scripts/vllm_tier.sh install (its venv) runs this check")
    if args.device == "cpu":
        torch.set_num_threads(1)
    result = check_vllm(args.device)
    print(json.dumps(result))
    raise SystemExit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
