"""The served judge apart from the scoring processes, through the Ray runtime (driver/run_pools.py
``RunPools._start_judge``, rewards/served.py): tensor parallel 2 on a 2-worker generator pool (one replica in
rank 0's placement bundle), and a pool of its own of 2 GPUs at tensor parallel 1 (two replicas). The judge is
tests/chat_stub.py, a real HTTP chat-completions server; the reward function records the address each sample was
sent to and asks it."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from runtime_helpers import compose_run, train

pytestmark = pytest.mark.ray

STUB = Path(__file__).resolve().parents[1] / "chat_stub.py"

JUDGE_FN = """
import os, urllib.request

def compute_score(data_source, solution_image, ground_truth, extra_info, reward_router_address,
                  reward_model_tokenizer=None, model_name=None, log=None):
    urllib.request.urlopen(f"http://{reward_router_address}/v1/models", timeout=10).read()
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {reward_router_address}\\n")
    return 0.5
"""


def _closed(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


@pytest.mark.parametrize("layout,replicas", [
    (["reward.served.tensor_parallel_size=2"], 1),
    (["resources.reward.workers=2"], 2),
], ids=["tp2-generator-pool", "own-pool"])
def test_a_run_scores_through_replicas_the_driver_started(ray_session, tmp_path, layout, replicas):
    model = tmp_path / "judge"
    model.mkdir()
    fn, log = tmp_path / "fn.py", tmp_path / "sent.log"
    fn.write_text(JUDGE_FN)
    cfg = compose_run("trainer=digen", "resources.generator.workers=2", "digen.tag.policy=never",
                      "rollout.micro_batch_size=1", f"custom_reward_function.path={fn}",
                      f"+custom_reward_function.reward_kwargs={{log: {log}}}", f"reward.served.model_path={model}",
                      f"reward.served.command=[{sys.executable},{STUB},--port,'{{port}}']",
                      "reward.served.startup_timeout_s=60", *layout, tmp_path=tmp_path)
    train(cfg)
    sent = [line.split() for line in log.read_text().splitlines()]
    addresses = {a for _, a in sent}
    assert len(sent) == 4 and len(addresses) == replicas, sent  # every sample, spread over every replica
    assert len({pid for pid, _ in sent}) == 2  # both generators scored, through the same replicas
    assert all(_closed(a) for a in addresses)  # the run stopped its judge
