"""The stop decisions without Ray: SIGTERM against the grace (``trainer.stop_grace_s``), SIGUSR1's requeue,
and the run's own Ray head's session cleanup (tests/runtime/test_cluster_stop_runtime.py runs them for real)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_digen.driver.cluster import session_processes
from verl_digen.driver.stopping import (
    REQUEUE_EXIT_CODE,
    STOP_EXIT_S,
    AbandonStep,
    StepClock,
    StopSignals,
    abandon_cause,
    exit_code_of,
    grace_decision,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_step_clock_estimates_what_is_left_of_the_step_and_its_save():
    now = Clock()
    clock = StepClock(now)
    assert clock.remaining() is None  # nothing measured
    clock.begin()
    now.t += 30.0
    clock.finished()  # a 30 s step
    clock.save_s = 2.0
    clock.begin()
    now.t += 12.0
    assert clock.remaining() == pytest.approx(30.0 - 12.0 + 2.0)
    now.t += 40.0  # slower than the last one: only its save is left to expect
    assert clock.remaining() == pytest.approx(2.0)


@pytest.mark.parametrize("remaining,grace,finish", [
    (None, 25.0, False), (1.0, 25.0, True), (25.0 - STOP_EXIT_S, 25.0, True), (25.0 - STOP_EXIT_S + 0.1, 25.0, False),
    (28.0, 5.0, False), (1e6, None, True)])
def test_the_grace_decides_between_finishing_and_abandoning(remaining, grace, finish):
    decided, why = grace_decision(remaining, grace)
    assert decided is finish
    if grace is not None and remaining is not None:
        assert f"trainer.stop_grace_s={grace:g}" in why and ("within" if finish else "more than") in why


def test_exit_codes_say_requeue_for_usr1_and_the_signal_otherwise():
    assert exit_code_of(signal.SIGUSR1) == REQUEUE_EXIT_CODE == 75
    assert exit_code_of(signal.SIGTERM) == 143 and exit_code_of(signal.SIGINT) == 130


def _send(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.01)  # the handler runs in the main thread at the next bytecode


def test_sigterm_abandons_at_once_when_the_step_does_not_fit_and_usr1_waits_for_the_step():
    with StopSignals(lambda _: None, decide=lambda: (False, "about 28 s left")) as sig:
        _send(signal.SIGUSR1)
        _send(signal.SIGUSR1)  # a repeat changes nothing
        assert sig.requested == signal.SIGUSR1
        with pytest.raises(AbandonStep) as ab:
            _send(signal.SIGTERM)
        assert ab.value.signum == signal.SIGTERM and ab.value.why == "about 28 s left"
    with StopSignals(lambda _: None, decide=lambda: (True, "fits")) as sig:
        _send(signal.SIGTERM)
        assert sig.requested == signal.SIGTERM
        with pytest.raises(AbandonStep, match="a second signal"):
            _send(signal.SIGTERM)
    with StopSignals(lambda _: None, decide=lambda: (False, "never asked for SIGINT")) as sig:
        _send(signal.SIGINT)  # Ctrl-C always finishes the step first
        assert sig.requested == signal.SIGINT


def test_a_step_finished_on_sigterm_that_runs_past_the_grace_is_abandoned_then():
    """decide() estimates the step from the last one; a slower step is abandoned when the grace's budget for
    it (deadline()) has passed since the SIGTERM, not left to the scheduler's SIGKILL. A step that ends in
    time leaves nothing armed."""
    with StopSignals(lambda _: None, decide=lambda: (True, "about 0.1 s left"), deadline=lambda: 0.3) as sig:
        _send(signal.SIGTERM)
        assert sig.requested == signal.SIGTERM
        t0 = time.monotonic()
        with pytest.raises(AbandonStep, match="ran past the 0.3 s") as ab:
            time.sleep(5)  # the step, slower than its estimate
        assert ab.value.signum == signal.SIGTERM and 0.2 < time.monotonic() - t0 < 2.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    before = signal.getsignal(signal.SIGALRM)
    with StopSignals(lambda _: None, decide=lambda: (True, "fits"), deadline=lambda: 5.0):
        _send(signal.SIGTERM)
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 4.0  # armed while the step finishes
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is before


def test_an_abandon_raised_inside_a_c_extension_is_found_behind_its_wrapper():
    ab = AbandonStep(signal.SIGTERM, "why")
    try:
        try:
            raise ab
        except AbandonStep as inner:
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set") from inner
    except SystemError as err:
        assert abandon_cause(err) is ab
    assert abandon_cause(RuntimeError("a worker died")) is None


def test_session_processes_finds_a_whole_session_but_not_its_zombies():
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(session_processes(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = session_processes(proc.pid)
        assert proc.pid in members and len(members) == 2
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert session_processes(proc.pid) == []


def test_the_heads_watchdog_kills_its_session_when_the_driver_dies_without_stopping_it(tmp_path):
    """A driver killed with SIGKILL cannot stop its Ray head; the watchdog leading the head's session sees its
    parent go and kills every process of the session (here a stand-in for ``ray start`` and a child of it
    that, like Ray's agents, would outlive it)."""
    pid_file = tmp_path / "watchdog.pid"
    head = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); " \
           "time.sleep(120)"
    driver = ("import subprocess, sys, time; from pathlib import Path; "
              f"p = subprocess.Popen([sys.executable, '-m', 'verl_digen.driver.cluster', 'watch', "
              f"str(__import__('os').getpid()), sys.executable, '-c', {head!r}], start_new_session=True); "
              f"Path({str(pid_file)!r}).write_text(str(p.pid)); time.sleep(120)")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env)
    try:
        deadline = time.monotonic() + 60
        while (not pid_file.exists() or len(session_processes(int(pid_file.read_text()))) < 3) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        sid = int(pid_file.read_text())
        assert len(session_processes(sid)) == 3  # the watchdog, the head stand-in and its child
        proc.kill()  # the driver, as the OOM killer would
        proc.wait()
        killed = time.monotonic()
        while session_processes(sid) and time.monotonic() < killed + 10:
            time.sleep(0.05)
        assert session_processes(sid) == [] and time.monotonic() - killed < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid_file.exists():
            for pid in session_processes(int(pid_file.read_text())):
                os.kill(pid, signal.SIGKILL)


def test_a_head_that_misses_rays_start_up_wait_is_started_again_and_other_failures_are_not(monkeypatch, capsys):
    """Ray gives its raylet a fixed 30 s to register; a loaded machine (CI's second xdist worker starting its
    own clusters) misses it. The run starts its head again on fresh ports, saying so; any other failure of the
    head, and a third slow start, reach the user at once."""
    from verl_digen.driver.cluster import OwnHead

    tries: list[str] = []

    def fails_with(*messages):
        def start_once(num_cpus, timeout_s):
            tries.append(messages[len(tries)])
            if tries[-1] != "ok":
                raise RuntimeError(f"the run's own Ray head (ray start) exited with 1; its output:\n{tries[-1]}")
            return "head"
        return start_once

    slow = "Exception: The current node timed out during startup. This could happen because ..."
    monkeypatch.setattr(OwnHead, "_start_once", staticmethod(fails_with(slow, slow, "ok")))
    assert OwnHead.start(2) == "head" and len(tries) == 3
    assert capsys.readouterr().out.count("starting it again") == 2

    tries.clear()
    monkeypatch.setattr(OwnHead, "_start_once", staticmethod(fails_with("port 6379 in use")))
    with pytest.raises(RuntimeError, match="port 6379 in use"):
        OwnHead.start(2)
    assert len(tries) == 1

    tries.clear()
    monkeypatch.setattr(OwnHead, "_start_once", staticmethod(fails_with(slow, slow, slow, "ok")))
    with pytest.raises(RuntimeError, match="timed out during startup"):
        OwnHead.start(2)
    assert len(tries) == 3
