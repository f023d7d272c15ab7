"""The opt-in vLLM tier's served judge: vLLM itself (``python -m vllm.entrypoints.openai.api_server``, the command
``reward.served`` starts when no ``command`` replaces it) serves a tiny random-weight Qwen2-VL checkpoint, and
verl-omni's own ``genrm_ocr.compute_score_ocr`` scores images through it on the generator's path
(``build_reward(worker_config().reward)``), as tests/rewards/test_served_judge.py does against the chat stub.

Marked ``vllm``: tests/conftest.py skips it where vllm-omni does not import (CI, this machine); it runs in the
venv ``scripts/vllm_tier.sh`` makes, on a GPU, or on CPU where vLLM has a CPU platform. Not run where it was
written (no vLLM there); docs/testing.md says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GENRM = "verl_omni/utils/reward_score/genrm_ocr.py"

RUN = """
import json, sys, time
import torch
from verl_digen.config import compose, validate
from verl_digen.rewards import Rows, build_reward, served

args = json.loads(sys.argv[1])
cfg = compose(args["overrides"])
assert validate(cfg) == [], validate(cfg)
reward = build_reward(cfg.worker_config().reward)  # what a generator builds: the default command is vLLM's
images = torch.stack([torch.full((3, 28, 28), 0.9), torch.full((3, 28, 28), 0.1)])
t0 = time.perf_counter()
first = reward(images, ["a sign", "a sign"], rows=Rows("train", (0, 1))).tolist()
seconds = time.perf_counter() - t0
again = reward(images, ["a sign", "a sign"], rows=Rows("train", (0, 1))).tolist()
(server,) = served._SERVERS.values()
argv = server.spec.argv(server.port)
served.stop_all()
print(json.dumps({"first": first, "again": again, "startup_s": server.startup_s, "seconds": seconds,
                  "argv": argv, "exit": server.proc.returncode}))
"""


def _vllm_can_serve() -> str | None:
    """Why vLLM cannot serve a model here (None: a GPU, or a vLLM built for the CPU)."""
    import torch

    if torch.cuda.is_available():
        return None
    try:
        from vllm.platforms import current_platform

        return None if current_platform.is_cpu() else f"vLLM has no device here ({type(current_platform).__name__})"
    except Exception as err:  # vllm's platform probe failing is a reason too
        return f"vLLM's platform does not resolve: {err}"


def test_vllm_serves_the_judge_and_compute_score_ocr_scores_through_it(verl_omni_snapshots, tmp_path):
    """The real engine behind reward_router_address: it starts from reward.served alone (model path, tensor parallel
    1), answers every sample's chat request with the judge's text, each sample gets a score in [0, 1] (the OCR
    distance to its row's ground truth), greedy decoding scores the same images the same twice, and the server
    stops with the process."""
    why = _vllm_can_serve()
    if why:
        pytest.skip(why)
    from test_vlm_judge import build_tiny_judge

    judge = build_tiny_judge(tmp_path / "tiny_qwen2vl")
    data = tmp_path / "ocr.jsonl"
    data.write_text("".join(json.dumps({"prompt": "a sign", "data_source": "ocr", "reward_model": {"ground_truth": g},
                                        "extra_info": {"index": i}}) + "\n" for i, g in enumerate(["ab", "cd"])))
    genrm = verl_omni_snapshots.omni / GENRM
    overrides = [f"trainer.trace_dir={tmp_path}/t", f"data.train_files={data}", f"reward.served.model_path={judge}",
                 "reward.served.gpu_memory_utilization=0.3", "reward.served.startup_timeout_s=900",
                 f"custom_reward_function.path={genrm}", "custom_reward_function.name=compute_score_ocr"]
    # the real vllm, not the suite's import stubs (genrm_ocr imports no verl_omni module: this checkout is enough)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(ROOT),
           "GENRM_OCR_TEMPERATURE": "0", "GENRM_OCR_MAX_TOKENS": "8", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN), json.dumps({"overrides": overrides})],
                          env=env, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["argv"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and judge in out["argv"]
    assert len(out["first"]) == 2 and all(0.0 <= s <= 1.0 for s in out["first"]), out
    assert out["again"] == out["first"]  # temperature 0: the engine's greedy answer, the same score
    assert out["exit"] is not None
    print(f"served judge (vLLM, tiny Qwen2-VL): start {out['startup_s']:.1f} s, "
          f"{out['seconds'] / 2 * 1000:.0f} ms per image")
