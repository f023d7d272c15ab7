"""Why and how a run stops before its last step: ``RunStopped`` (the one line to print, the checkpoint
to resume from, the exit code), SIGINT / SIGTERM handling and the stall guard on the Ray backend.
See docs/user-guide.md ("Faults and stopping") for what a user sees."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from verl_digen.driver.ray_backend import RayBackend
from verl_digen.schedule.executor import Completion


class RunStopped(RuntimeError):
    """The run stopped before ``trainer.total_steps``: a signal, or non-finite values. ``str()`` is the
    one line to show; ``checkpoint`` is the complete checkpoint to resume from (None: none exists);
    ``exit_code`` is what the process should exit with."""

    def __init__(self, reason: str, exit_code: int, checkpoint: str | None = None) -> None:
        where = (f"resume from {checkpoint} (trainer.resume_from={checkpoint}, or trainer.resume_from=auto)"
                 if checkpoint else "no checkpoint to resume from (set trainer.save_freq to write them)")
        super().__init__(f"{reason}; {where}")
        self.reason, self.exit_code, self.checkpoint = reason, exit_code, checkpoint


class GuardedBackend(RayBackend):
    """The Ray backend that stops with ``RunStopped`` when no action finishes for ``stall_timeout_s``
    (a hung or stopped worker would otherwise block the driver forever, silently)."""

    def __init__(self, *args: Any, stall_timeout_s: float | None = None, base_step: int = 0,
                 checkpoint=lambda: None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stall_timeout_s = stall_timeout_s
        self.base_step = base_step
        self.checkpoint = checkpoint

    def wait(self) -> tuple[list[Completion], float]:
        """``RayBackend.wait`` with a bound on how long nothing may finish."""
        while not self._ready:
            if not self._pump(self.stall_timeout_s):
                raise RunStopped(self._stall_message(), 4, self.checkpoint())
        return super().wait()

    def _stall_message(self) -> str:
        calls = {id(c): c.action for c in self._inflight.values()}.values()
        what = ", ".join(sorted(f"{a.kind} on {a.worker} (step {self.base_step + a.step + 1}"
                                f"{'' if a.mb is None else f', micro-batch {a.mb}'})" for a in calls))
        return (f"stalled: no action finished for {self.stall_timeout_s:g} s (trainer.stall_timeout_s) while "
                f"waiting on {what}: a worker is hung, stopped or too slow for the timeout")


class StopSignals:
    """SIGINT / SIGTERM during a run: the first asks the run to stop after the current global step
    (its checkpoint and trace are written), a second abandons the step at once. Only in the main
    thread (Python delivers signals there); previous handlers come back on exit."""

    def __init__(self, log) -> None:
        self.log = log
        self.requested: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is None:
            self.requested = signum
            # straight to fd 2: print() here could re-enter a buffered write the main thread is in
            try:
                os.write(2, f"received {name}: stopping after the current step (send it again to abandon "
                            f"the step)\n".encode())
            except OSError:
                pass
            return
        raise AbandonStep(signum)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


class AbandonStep(BaseException):
    """A second signal: leave the current step now (a BaseException, so no ``except Exception`` eats it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
