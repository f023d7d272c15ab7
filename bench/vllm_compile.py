"""Compiled against eager for the vLLM-Omni engine (``rollout.vllm_compile``), on CPU in the vLLM tier's venv:
engine start-up s, the first micro-batch's s (where ``torch.compile`` compiles, lazily) and the steady per-step s
of a tiny SD3 engine, each setting in a fresh process. The tier's CPU hooks report no inductor support, so for the
compiled run this script lets vllm-omni compile on the CPU (inductor's C++ backend; needs a C++ compiler).

    /tmp/verl-digen-vllm-venv/bin/python bench/vllm_compile.py      # one JSON line per setting, then a summary
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parent.parent / "tests" / "workers"
PIDS, SIDS = [0, 0, 1, 1], [0, 1, 0, 1]
PROMPTS = ["a red cube", "a red cube", "two cats on a mat", "two cats on a mat"]
STEPS, REPEATS = 8, 3


def one(compile_: bool) -> dict:
    torch.set_num_threads(1)
    sys.path.insert(0, str(TESTS))
    import vllm_cpu_platform
    from vllm_engine_helpers import save_tiny_sd3

    from verl_digen.algo.selection import StepSelection
    from verl_digen.rollout.sampler import SamplerConfig
    from verl_digen.workers.config import PolicyConfig, WorkerConfig
    from verl_digen.workers.vllm_backend import VllmOmniRollout

    vllm_cpu_platform.install()
    if compile_:
        vllm_cpu_platform.CpuOmniPlatform.supports_torch_inductor = classmethod(lambda cls: True)
    sampler = SamplerConfig(num_steps=STEPS, shift=3.0, sde="flow_grpo", eta=0.7, guidance_scale=2.0,
                            selection=StepSelection("first_k", k=3), decode=True)
    with tempfile.TemporaryDirectory(prefix="digen_vllm_compile_") as tmp:
        ckpt = save_tiny_sd3(Path(tmp) / "sd3", seed=0)
        cfg = WorkerConfig(policy=PolicyConfig(arch="sd3", pretrained=ckpt, dtype="float32", latent_size=16),
                           sampler=sampler, seed=1, rollout_backend="vllm", vllm_max_batch=len(PROMPTS),
                           vllm_compile=compile_)
        t0 = time.perf_counter()
        backend = VllmOmniRollout(cfg, "cpu")
        start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        backend.generate(1, 0, PIDS, SIDS, PROMPTS)
        first_s = time.perf_counter() - t0
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            backend.generate(1, 0, PIDS, SIDS, PROMPTS)
            times.append(time.perf_counter() - t0)
        backend.close()
        backend.engine.close()
    steady = min(times)
    return {"compile": compile_, "engine_start_s": round(start_s, 2), "first_generate_s": round(first_s, 2),
            "generate_s": round(steady, 3), "per_step_s": round(steady / STEPS, 4), "steps": STEPS}


def main() -> None:
    # --json is accepted for the benches' interface: the rows are always one JSON list, the last line
    if len(sys.argv) > 1 and sys.argv[1] in ("eager", "compiled"):
        print("RESULT " + json.dumps(one(sys.argv[1] == "compiled")), flush=True)
        return
    rows = []
    for setting in ("eager", "compiled"):
        out = subprocess.run([sys.executable, __file__, setting], capture_output=True, text=True, timeout=900)
        line = next((x for x in out.stdout.splitlines() if "RESULT " in x), None)
        row = json.loads(line.split("RESULT ", 1)[1]) if line else {"compile": setting == "compiled",
                                                                     "error": out.stderr[-800:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
