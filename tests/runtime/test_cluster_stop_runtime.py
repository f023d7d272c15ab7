"""Stopping as cluster schedulers do it, on command-line runs that start their own Ray head (driver/cluster.py):

- a SIGTERM to the run's whole process group (``timeout``, ``scancel`` of a job step, a pod stop) stops it like
  one to the driver: exit 143, the step's checkpoint (written on the way out: not a ``save_freq`` step), the
  trace marked incomplete, the resume line on stderr, and no Ray process it started alive 5 s later. The run's
  own head leads a session of its own, so the group holds the driver alone: this is also ``kill -TERM`` to the
  driver (a cluster scheduler's preemption), with Ray's driver set-up inside the signalled process;
- SIGUSR1 (Slurm's ``--signal`` advance warning) saves after the step and exits ``REQUEUE_EXIT_CODE`` (on a
  cluster the run was told to join, which it leaves running);
- ``trainer.resume_from=auto`` then continues to the end, bit-identical to an unstopped run (every tensor
  of the final checkpoint; every reward metric of every step bit-identical, the actor's to a sum's rounding);
- with ``trainer.stop_grace_s`` shorter than a (slowed) step, the step is abandoned at once and the exit
  comes within the grace, keeping the previous checkpoint.

One chain of runs covers the first three (each run's start costs ~10-30 s on 2 cores: imports, its Ray head,
its workers).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runtime_helpers import TINY, compose_run, train

from verl_digen.driver.cluster import session_processes
from verl_digen.driver.stopping import REQUEUE_EXIT_CODE
from verl_digen.workers import checkpoint as ckpt

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300


class Run:
    """``python -m verl_digen.main`` in a session (and process group) of its own, output to a file."""

    def __init__(self, tmp_path: Path, name: str, *overrides: str, join: str | None = None) -> None:
        """``join``: the Ray cluster the run is told to join (``RAY_ADDRESS``); None: it starts a head of its own."""
        args = [a for a in TINY if not a.startswith("trainer.logger=")]
        self.log, self.err_log = tmp_path / f"{name}.log", tmp_path / f"{name}.err"
        cmd = [sys.executable, "-m", "verl_digen.main", *args, "trainer.logger=[console]", *overrides,
               f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"trainer.trace_dir={tmp_path / 'trace'}",
               "hydra.run.dir=" + str(tmp_path / "hydra")]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        if join is not None:
            env["RAY_ADDRESS"] = join
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        with open(self.log, "w") as out, open(self.err_log, "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True)

    def err(self) -> str:
        return self.err_log.read_text(errors="replace")

    def text(self) -> str:
        """stdout, then stderr."""
        return self.log.read_text(errors="replace") + self.err()

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text(), re.M):
            assert self.proc.poll() is None, f"the run ended before {pattern!r}:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n{self.text()[-3000:]}"
            time.sleep(0.1)

    def finish(self, timeout: float = START_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def sessions(self) -> list[int]:
        """The driver's session and its own Ray head's (the head's pid is its session id)."""
        head = re.search(r"started a Ray cluster of its own at \S+ \(head pid (\d+)", self.text())
        assert head, self.text()[-3000:]
        return [self.proc.pid, int(head[1])]


def _assert_nothing_left(run: Run, exited_at: float) -> None:
    time.sleep(max(0.0, exited_at + 5.0 - time.monotonic()))
    left = {sid: session_processes(sid) for sid in run.sessions()}
    assert not any(left.values()), f"processes alive 5 s after the run exited: {left}"


def test_usr1_then_a_group_sigterm_stop_cleanly_and_auto_resume_is_bit_identical(ray_session, tmp_path):
    # tiny steps (~0.1 s): a signal after step k lands in step k + 1 or k + 2, well before the last; save_freq=11:
    # the checkpoints of runs 1 and 2 are the signals' own
    common = ["trainer.total_steps=12", "trainer.save_freq=11"]
    # 1: the advance warning after step 1: saved after its step (save_freq would not), exit 75, resume line. This
    # run joins the test session's Ray when told (RAY_ADDRESS; a head of its own costs ~5 s) and leaves it running
    session = ray_session.get_runtime_context().gcs_address
    first = Run(tmp_path, "usr1", *common, join=session)
    first.wait_for(r"^step 1/12")
    first.proc.send_signal(signal.SIGUSR1)
    assert first.finish() == REQUEUE_EXIT_CODE, first.text()[-3000:]
    saved = [s for s, _ in ckpt.complete_checkpoints(tmp_path / "ckpt")]
    assert saved and saved[-1] < 11, first.text()[-3000:]
    assert "stopped by SIGUSR1 after step" in first.text() and "resume with:" in first.text()
    assert f"joined the Ray cluster at {session}" in first.text(), first.text()[-3000:]
    assert [n["Alive"] for n in ray_session.nodes()] == [True]  # the cluster it joined is not stopped with it

    # 2: resumed with auto; a SIGTERM to the whole process group after step 5 (the 12-step run)
    second = Run(tmp_path, "group", *common, "trainer.resume_from=auto")
    second.wait_for(r"^step 5/12")
    os.killpg(second.proc.pid, signal.SIGTERM)
    signalled = time.monotonic()
    assert second.finish() == 128 + signal.SIGTERM, second.text()[-3000:]
    exited = time.monotonic()
    assert exited - signalled < 10.0, second.text()[-3000:]
    last = ckpt.complete_checkpoints(tmp_path / "ckpt")[-1]
    assert saved[-1] < last[0] < 11, second.text()[-3000:]  # written on the way out
    assert "resume with: python -m verl_digen.main" in second.err(), second.text()[-3000:]
    assert f"trainer.resume_from={last[1]}" in second.err()
    trace = json.loads((tmp_path / "trace" / "digen_trace.json").read_text())["otherData"]
    assert trace["complete"] is False and "SIGTERM" in trace["stopped"], trace
    assert "received SIGTERM: finishing the current step" in second.text()  # well within the default grace
    _assert_nothing_left(second, exited)

    # 3: resumed again to the end; equal to a run that was never stopped
    third = Run(tmp_path, "rest", *common, "trainer.resume_from=auto")
    assert third.finish() == 0, third.text()[-3000:]
    _assert_nothing_left(third, time.monotonic())
    resumed, _ = ckpt.read(tmp_path / "ckpt" / "global_step_12", 0)
    result, _ = train(compose_run(*common, tmp_path=tmp_path / "straight"))
    straight, _ = ckpt.read(tmp_path / "straight" / "ckpt" / "global_step_12", 0)
    assert _tensors(straight) and _tensors(straight).keys() == _tensors(resumed).keys()
    for name, value in _tensors(straight).items():  # weights, AdamW state, counters: every tensor
        assert torch.equal(value, _tensors(resumed)[name]), name
    rows = [json.loads(line) for line in (tmp_path / "trace" / "digen_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13))  # the stopped runs' steps, then the resumed ones
    for row, report in zip(rows, result.reports, strict=True):  # every training number, step by step: the
        # rewards bit-identical (summed in (prompt, sample) order), the actor's to the rounding of a sum (its row
        # losses are merged in completion order: 1 ulp seen under load)
        rewards = {k: v for k, v in report.metrics.items() if k.startswith("reward/")}
        assert rewards and {k: row[k] for k in rewards} == rewards, row["step"]
        trained = {k: v for k, v in report.metrics.items() if k.startswith("actor/")}
        assert trained and {k: row[k] for k in trained} == pytest.approx(trained, rel=1e-12, abs=1e-15), row["step"]


def _tensors(tree, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a checkpoint payload, by its path."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list | tuple) else ()
    return {k: v for key, sub in items for k, v in _tensors(sub, f"{prefix}/{key}").items()}


def test_a_step_longer_than_the_grace_is_abandoned_at_once_keeping_the_last_checkpoint(tmp_path):
    # two scores a step: step 1's take 4 s each (the driver's estimate of a step: 8 s), every later one 15 s
    # (the 30 s step); the signal lands in step 2
    reward = tmp_path / "slow_reward.py"
    reward.write_text("import time\n\n\ndef compute_score(images, prompts, sleep_s=0.0, slow_s=0.0, calls=''):\n"
                      "    with open(calls, 'a+') as f:\n        f.seek(0)\n        n = len(f.read())\n"
                      "        f.write('x')\n"
                      "    time.sleep(sleep_s if n < 2 else slow_s)\n    return [float(i.mean()) for i in images]\n")
    run = Run(tmp_path, "grace", "trainer.total_steps=6", "trainer.save_freq=1", "trainer.stop_grace_s=5",
              f"custom_reward_function.path={reward}",
              f"custom_reward_function.reward_kwargs={{sleep_s: 4, slow_s: 15, calls: '{tmp_path / 'calls'}'}}")
    run.wait_for(r"^step 1/6")
    time.sleep(0.5)  # into step 2 (30 s)
    os.killpg(run.proc.pid, signal.SIGTERM)
    signalled = time.monotonic()
    assert run.finish() == 128 + signal.SIGTERM, run.text()[-3000:]
    took = time.monotonic() - signalled
    print(f"exit {took:.1f} s after the group SIGTERM in a 30 s step")
    assert took < 8.0, run.text()[-3000:]  # the bound for a 5 s grace
    text = run.text()
    assert "abandoning the current step at once" in text and "more than trainer.stop_grace_s=5" in text, text[-3000:]
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path / "ckpt")] == [1]
    assert f"trainer.resume_from={tmp_path / 'ckpt' / 'global_step_1'}" in text
    _assert_nothing_left(run, time.monotonic())


STRANGER = """
import sys, ray
try:
    ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False)
    print("joined", len(ray.nodes()))
except Exception as err:
    print("refused", type(err).__name__)
"""

OWN_HEAD_AND_A_STRANGER = """
import os, subprocess, sys, ray
from ray._private.utils import read_ray_address
from verl_digen.driver.cluster import OwnHead
before = read_ray_address()
head = OwnHead.start(1)
try:
    print("address file kept", read_ray_address() == before)
    print("own address file", read_ray_address(head.temp_dir).endswith(":" + head.address.split(":")[-1]))
    ray.init(address=head.address, include_dashboard=False, log_to_driver=False)
    print("driver", os.environ["RAY_AUTH_MODE"], len(ray.nodes()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_NUM_REDIS_GET_RETRIES"] = "5"  # a refused join retries once a second, 20 times by default
    out = subprocess.run([sys.executable, "-c", sys.argv[1], head.address], env=env, capture_output=True,
                         text=True, timeout=120)
    print("stranger", out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "no output")
finally:
    ray.shutdown()
    head.stop()
print("gone", not os.path.exists(head.temp_dir) and read_ray_address() == before)
"""


def test_an_own_head_takes_only_the_runs_token_and_is_not_what_a_plain_ray_init_joins():
    """The run's own head turns Ray's token authentication on with a secret of the run's own (unless the user
    chose RAY_AUTH_MODE): the driver joins it, a process on the machine without the token is refused.

    ``ray start`` writes its address where every later ``ray.init()`` on the machine looks first (the default
    temp dir's ``ray_current_cluster``): another job would join this run's head, or fail on its dead address once
    it is gone. The run's head keeps that file in a temp dir of its own, removed with it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    out = subprocess.run([sys.executable, "-c", OWN_HEAD_AND_A_STRANGER, STRANGER], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=START_TIMEOUT_S)
    lines = out.stdout.splitlines()
    assert "driver token 1" in lines, out.stdout + out.stderr[-3000:]
    assert any(line.startswith("stranger refused") for line in lines), out.stdout + out.stderr[-3000:]
    for held in ("address file kept True", "own address file True", "gone True"):
        assert held in lines, out.stdout + out.stderr[-3000:]
