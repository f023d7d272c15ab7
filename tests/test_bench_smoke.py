"""Benchmarks must keep running: one fast pass of each, checking the JSON contract of its last line."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _last_json(args: list[str]) -> list[dict]:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tsp_bench_emits_rows():
    rows = _last_json(["bench/tsp.py", "--json", "--reps", "1", "--warmup", "0", "--archs", "flux", "wan",
                       "--k", "2", "--batch", "2", "--latent", "8"])
    assert [r["arch"] for r in rows] == ["flux", "wan"]
    assert all(r["speedup"] > 0 and r["seq_ms"] > 0 and r["tsp_ms"] > 0 for r in rows)
