"""Stopping as cluster schedulers do it, on command-line runs (driver/cluster.py):

- a SIGTERM to the run's whole process group (``timeout``, ``scancel`` of a job step, a pod stop) stops it like
  one to the driver: exit 143, the step's checkpoint (written on the way out: not a ``save_freq`` step), the
  trace marked incomplete, the resume line on stderr, and no Ray process it started alive 5 s later. The run's
  own head leads a session of its own, so the group holds the driver alone: this is also ``kill -TERM`` to the
  driver (a cluster scheduler's preemption), with Ray's driver set-up inside the signalled process;
- SIGUSR1 (Slurm's ``--signal`` advance warning) saves after the step and exits ``REQUEUE_EXIT_CODE`` (on a
  cluster the run was told to join, which it leaves running);
- ``trainer.resume_from=auto`` resumes from the signal's checkpoint bit-identical to an unstopped run (every
  tensor of the next signal's checkpoint; every reward metric of every step bit-identical, the actor's to a sum's
  rounding). A resumed run that goes on to ``total_steps``: test_reliability_runtime.py;
- the run's own head takes only the run's token and keeps its address file to itself;
- with ``trainer.stop_grace_s`` shorter than a (slowed) step, the step is abandoned at once and the exit
  comes within the grace, keeping the previous checkpoint.

Two tests, two command-line runs with a head of their own and one joining the test session's Ray (each run's
start costs ~10-30 s on 2 cores: imports, its Ray head, its workers).
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
from ray._private.utils import read_ray_address
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
            env["RAY_ADDRESS"] = join  # with this process's Ray settings (its token, when it has one)
        else:  # the run's own head makes a token of its own
            env = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
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


@pytest.fixture
def start(tmp_path):
    """Starts ``Run``s in ``tmp_path``; any still running when the test ends (it failed) is killed with its group,
    its own head with it (the head's watchdog sees the driver gone)."""
    started: list[Run] = []

    def run(name: str, *overrides: str, join: str | None = None) -> Run:
        started.append(Run(tmp_path, name, *overrides, join=join))
        return started[-1]

    yield run
    for r in started:
        if r.proc.poll() is None:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()


def _assert_nothing_left(run: Run, exited_at: float) -> None:
    """No process of the driver's session or its own head's is alive 5 s after the run exited. A session gains no
    member once it is empty (a process joins its parent's session, and ``setsid`` makes a new one), so the check
    passes as soon as both are empty and fails with what is still alive 5 s after the exit."""
    sessions = run.sessions()
    while True:
        left = {sid: session_processes(sid) for sid in sessions}
        if not any(left.values()):
            return
        assert time.monotonic() < exited_at + 5.0, f"processes alive 5 s after the run exited: {left}"
        time.sleep(0.1)


def test_usr1_then_a_group_sigterm_stop_cleanly_and_the_resume_is_bit_identical(ray_session, tmp_path, start):
    # tiny steps (~0.1 s): a signal after step k lands in step k + 1 or k + 2; save_freq=9: the checkpoints of
    # both runs are the signals' own
    common = ["trainer.total_steps=10", "trainer.save_freq=9"]
    # 1: the advance warning after step 1: saved after its step (save_freq would not), exit 75, resume line. This
    # run joins the test session's Ray when told (RAY_ADDRESS; a head of its own costs ~5 s) and leaves it running
    session = ray_session.get_runtime_context().gcs_address
    first = start("usr1", *common, join=session)
    first.wait_for(r"^step 1/10")
    first.proc.send_signal(signal.SIGUSR1)
    assert first.finish() == REQUEUE_EXIT_CODE, first.text()[-3000:]
    saved = [s for s, _ in ckpt.complete_checkpoints(tmp_path / "ckpt")]
    assert saved and saved[-1] < 9, first.text()[-3000:]
    assert "stopped by SIGUSR1 after step" in first.text() and "resume with:" in first.text()
    assert f"joined the Ray cluster at {session}" in first.text(), first.text()[-3000:]
    assert [n["Alive"] for n in ray_session.nodes()] == [True]  # the cluster it joined is not stopped with it

    # 2: resumed with auto from run 1's checkpoint, on a head of its own; a SIGTERM to the whole process group
    # after step 4
    second = start("group", *common, "trainer.resume_from=auto")
    second.wait_for(r"^step 4/10")
    os.killpg(second.proc.pid, signal.SIGTERM)
    signalled = time.monotonic()
    assert second.finish() == 128 + signal.SIGTERM, second.text()[-3000:]
    exited = time.monotonic()
    assert exited - signalled < 10.0, second.text()[-3000:]
    stopped, path = ckpt.complete_checkpoints(tmp_path / "ckpt")[-1]
    assert saved[-1] < stopped < 9, second.text()[-3000:]  # written on the way out
    assert f"resumed from {tmp_path / 'ckpt' / f'global_step_{saved[-1]}'}" in second.text(), second.text()[-3000:]
    assert "resume with: python -m verl_digen.main" in second.err(), second.text()[-3000:]
    assert f"trainer.resume_from={path}" in second.err()
    trace = json.loads((tmp_path / "trace" / "digen_trace.json").read_text())["otherData"]
    assert trace["complete"] is False and "SIGTERM" in trace["stopped"], trace
    assert "received SIGTERM: finishing the current step" in second.text()  # well within the default grace
    _assert_nothing_left(second, exited)

    # the resumed run equals one that was never stopped, up to the SIGTERM's checkpoint: the same run saving
    # at that step (a save changes no training number; resuming that checkpoint in turn is the same reader on the
    # same writer's files)
    result, _ = train(compose_run("trainer.total_steps=10", f"trainer.save_freq={stopped}",
                                  tmp_path=tmp_path / "straight"))
    resumed, _ = ckpt.read(path, 0)
    straight, _ = ckpt.read(tmp_path / "straight" / "ckpt" / f"global_step_{stopped}", 0)
    assert _tensors(straight) and _tensors(straight).keys() == _tensors(resumed).keys()
    for name, value in _tensors(straight).items():  # weights, AdamW state, counters: every tensor
        assert torch.equal(value, _tensors(resumed)[name]), name
    rows = [json.loads(line) for line in (tmp_path / "trace" / "digen_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, stopped + 1))  # run 1's steps, then run 2's
    for row, report in zip(rows, result.reports[:stopped], strict=True):  # every training number, step by step:
        # the rewards bit-identical (summed in (prompt, sample) order), the actor's to the rounding of a sum (its
        # row losses are merged in completion order: 1 ulp seen under load)
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


SLOW_REWARD = """
import os, time


def compute_score(images, prompts, sleep_s=0.0, slow_s=0.0, calls="", gate=""):
    # scores once the test has checked the run's head (the gate file exists); step 1's two calls sleep sleep_s,
    # every later one slow_s
    deadline = time.monotonic() + 300
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(calls, "a+") as f:
        f.seek(0)
        n = len(f.read())
        f.write("x")
    time.sleep(sleep_s if n < 2 else slow_s)
    return [float(i.mean()) for i in images]
"""

STRANGER = """
import sys, ray
try:
    ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False)
    print("joined", len(ray.nodes()))
except Exception as err:
    print("refused", type(err).__name__)
"""


def test_a_step_longer_than_the_grace_is_abandoned_at_once_on_a_head_that_takes_only_the_runs_token(tmp_path, start):
    """The run's own head turns Ray's token authentication on with a secret of the run's own (unless the user
    chose RAY_AUTH_MODE): the driver joins it, a process on the machine without the token is refused. ``ray
    start`` writes its address where every later ``ray.init()`` on the machine looks first (the default temp
    dir's ``ray_current_cluster``): another job would join this run's head, or fail on its dead address once it
    is gone; the run's head keeps that file in a temp dir of its own, removed with it.

    Then a SIGTERM to the group in a step longer than ``trainer.stop_grace_s=5``: abandoned at once, the exit
    within the grace, the last checkpoint kept, nothing left."""
    # two scores a step: step 1's take 3 s each (the driver's estimate of a step: 6 s, so a signal up to ~4 s
    # into step 2 is abandoned), every later one 15 s (the 30 s step); the signal lands in step 2
    reward, gate = tmp_path / "slow_reward.py", tmp_path / "gate"
    reward.write_text(SLOW_REWARD)
    run = start("grace", "trainer.total_steps=6", "trainer.save_freq=1", "trainer.stop_grace_s=5",
              f"custom_reward_function.path={reward}",
              f"custom_reward_function.reward_kwargs={{sleep_s: 3, slow_s: 15, calls: '{tmp_path / 'calls'}', "
              f"gate: '{gate}'}}")
    run.wait_for(r"started a Ray cluster of its own")
    head = _own_head(run)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    # a refused join retries once a second, 20 times by default; once more is enough here: the head is up (its
    # line was printed), so a join that the token does not stop succeeds at its first try
    env["RAY_NUM_REDIS_GET_RETRIES"] = "2"
    out = subprocess.run([sys.executable, "-c", STRANGER, head["address"]], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.startswith("refused"), out.stdout + out.stderr[-3000:]
    gate.touch()

    run.wait_for(r"^step 1/6")
    time.sleep(0.5)  # into step 2 (30 s)
    os.killpg(run.proc.pid, signal.SIGTERM)
    signalled = time.monotonic()
    assert run.finish() == 128 + signal.SIGTERM, run.text()[-3000:]
    exited = time.monotonic()
    print(f"exit {exited - signalled:.1f} s after the group SIGTERM in a 30 s step")
    assert exited - signalled < 8.0, run.text()[-3000:]  # the bound for a 5 s grace
    text = run.text()
    assert "abandoning the current step at once" in text and "more than trainer.stop_grace_s=5" in text, text[-3000:]
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path / "ckpt")] == [1]
    assert f"trainer.resume_from={tmp_path / 'ckpt' / 'global_step_1'}" in text
    _assert_nothing_left(run, exited)
    assert not os.path.exists(head["temp_dir"])  # its address file went with it
    assert head["port"] not in (read_ray_address() or "")


def _own_head(run: Run) -> dict:
    """What the run's own head is while it runs: its address, its temp dir (from the head's command line), its
    token setting (from the environment the driver gave it), and which address files name it."""
    pid = run.sessions()[1]
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    port = next(a.split("=", 1)[1] for a in args if a.startswith("--port="))
    temp_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--temp-dir="))
    environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    env = dict(line.split("=", 1) for line in environ if "=" in line)
    assert env.get("RAY_AUTH_MODE") == "token" and re.fullmatch(r"[0-9a-f]{64}", env.get("RAY_AUTH_TOKEN", "")), \
        {k: v for k, v in env.items() if k.startswith("RAY_AUTH")}
    assert (read_ray_address(temp_dir) or "").endswith(f":{port}")  # its own temp dir's file names it ...
    assert f":{port}" not in (read_ray_address() or "")  # ... and the one every ray.init() reads does not
    return {"address": f"127.0.0.1:{port}", "port": f":{port}", "temp_dir": temp_dir}
