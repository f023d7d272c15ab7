"""bench/gpu_check.py on CPU (``--device cpu --quick``): the GPU check's code runs in CI so it never rots."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_on_cpu_and_every_check_passes():
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--quick", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out,) = json.loads(proc.stdout.strip().splitlines()[-1])  # one JSON list on the last line
    assert out["ok"] and out["device"] == "cpu"
    checks = out["checks"]
    assert set(checks) == {"tsp", "memory_plan", "logprob_batch", "fsdp_update", "tag_switch", "weight_buckets"}
    assert all(c["ok"] for c in checks.values())
    assert checks["tsp"]["grad_rel_gap"] < 1e-4 and checks["tsp"]["tsp_tflops"] > 0
    assert checks["memory_plan"]["plain"]["estimate_mib"] > checks["memory_plan"]["checkpointing"]["estimate_mib"]
    assert checks["fsdp_update"]["max_weight_change"] > 0 and checks["tag_switch"]["bit_identical"] is True
    assert checks["logprob_batch"]["max_abs_bf16_vs_fp32"] > 0  # bf16 moves the log-probs: what recompute guards
    buckets = checks["weight_buckets"]
    assert buckets["bit_identical"] is True and buckets["buckets"] > 1 and buckets["pack_gbps"] > 0
