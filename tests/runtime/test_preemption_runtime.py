"""Preemption as a cluster scheduler does it: ``kill -TERM`` to a run started from the command line.

The run starts its own Ray (as a user's does), so Ray's own driver set-up happens inside the process that
gets the signal; the in-process signal tests (test_reliability_runtime.py) start Ray before the run.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_helpers import TINY

from verl_digen.workers import checkpoint as ckpt

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


def test_sigterm_to_a_command_line_run_saves_and_exits_143_with_the_resume_line(tmp_path):
    args = [a for a in TINY if not a.startswith(("trainer.total_steps=", "trainer.logger="))]
    cmd = [sys.executable, "-m", "verl_digen.main", *args, "trainer.total_steps=50", "trainer.save_freq=100",
           "trainer.logger=[console]", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
           f"trainer.trace_dir={tmp_path / 'trace'}", "hydra.run.dir=" + str(tmp_path / "hydra")]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:  # the console block of the first finished step
            if line.startswith("step 1/50") or time.monotonic() > deadline:
                break
        assert proc.poll() is None, "the run ended before its first step"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    saved = ckpt.complete_checkpoints(tmp_path / "ckpt")
    assert saved, "no checkpoint was written on the way out"
    last = str(saved[-1][1])
    assert "resume with: python -m verl_digen.main" in err and f"trainer.resume_from={last}" in err, err[-3000:]
    assert (tmp_path / "trace" / "digen_trace.json").exists()
