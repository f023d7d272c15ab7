"""Why and how a run stops before its last step: ``RunStopped`` (the one line to print, the checkpoint
to resume from, the exit code), SIGINT / SIGTERM / SIGUSR1 handling, the decision whether the step in
progress fits the scheduler's grace (``trainer.stop_grace_s``), and the NaN guard's driver half.
See docs/user-guide.md ("Faults and stopping") for what a user sees."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any


class RunStopped(RuntimeError):
    """The run stopped before ``trainer.total_steps``: a signal, or non-finite values. ``str()`` is the
    one line to show; ``checkpoint`` is the complete checkpoint to resume from (None: none exists);
    ``exit_code`` is what the process should exit with."""

    def __init__(self, reason: str, exit_code: int, checkpoint: str | None = None) -> None:
        where = (f"resume from {checkpoint} (trainer.resume_from={checkpoint}, or trainer.resume_from=auto)"
                 if checkpoint else "no checkpoint to resume from (set trainer.save_freq to write them)")
        super().__init__(f"{reason}; {where}")
        self.reason, self.exit_code, self.checkpoint = reason, exit_code, checkpoint


#: exit code of a run stopped by SIGUSR1 (a scheduler's advance warning): saved, requeue it and resume with
#: ``trainer.resume_from=auto`` (EX_TEMPFAIL: a temporary failure, the caller is invited to retry)
REQUEUE_EXIT_CODE = 75
#: seconds a stop leaves between the end of the finished step and the grace's end (the driver's exit:
#: workers killed, the run's own Ray head stopped)
STOP_EXIT_S = 3.0


def exit_code_of(signum: int) -> int:
    """The exit code of a run stopped by ``signum``."""
    return REQUEUE_EXIT_CODE if signum == signal.SIGUSR1 else 128 + signum


class StepClock:
    """When the step in progress began and how long the last one took (the run's own estimate of this
    one), plus the last checkpoint's save time: what ``grace_decision`` needs."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self.began: float | None = None
        self.last_s: float | None = None
        self.save_s = 0.0

    def begin(self) -> None:
        self.began = self._now()

    def finished(self) -> None:
        if self.began is not None:
            self.last_s = self._now() - self.began

    def remaining(self) -> float | None:
        """Seconds until the step in progress and its save are done (None: nothing measured yet)."""
        if self.began is None or self.last_s is None:
            return None
        return max(0.0, self.last_s - (self._now() - self.began)) + self.save_s


def grace_decision(remaining: float | None, grace_s: float | None) -> tuple[bool, str]:
    """Finish the step in progress (True) or abandon it at once, and why: it is finished when what is left
    of it and its save, plus ``STOP_EXIT_S`` for the exit, fits the grace before the scheduler's SIGKILL."""
    if grace_s is None:
        return True, "trainer.stop_grace_s=null: always finishing the step"
    if remaining is None:
        return False, "no step has finished yet to estimate this one from"
    verdict = "within" if remaining + STOP_EXIT_S <= grace_s else "more than"
    return verdict == "within", (f"about {remaining:.1f} s left of the step and its save, plus {STOP_EXIT_S:g} s to "
                                 f"exit: {verdict} trainer.stop_grace_s={grace_s:g}")


class StopSignals:
    """Signals during a run (Python delivers them in the main thread; previous handlers come back on exit):

    - SIGINT: stop after the current global step (its checkpoint and trace are written); a second
      abandons the step at once.
    - SIGTERM (a scheduler's stop, followed by SIGKILL after its grace): finish the step when
      ``decide()`` says it fits the grace, else abandon it at once; a second abandons it. ``decide`` estimates
      from the last step; a step slower than that is abandoned when ``deadline()`` seconds (what the grace
      leaves the step) have passed since the signal (SIGALRM), so the exit still comes before the SIGKILL.
    - SIGUSR1 (a scheduler's advance warning): stop after the current step, checkpointed, with
      ``REQUEUE_EXIT_CODE``."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, log, decide: Callable[[], tuple[bool, str]] | None = None,
                 deadline: Callable[[], float | None] | None = None) -> None:
        self.log = log
        self.decide = decide
        self.deadline = deadline
        self.requested: int | None = None
        self._old: dict[int, Any] = {}
        self._budget: float | None = None  # the armed deadline's seconds

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    @staticmethod
    def _say(line: str) -> None:
        try:  # straight to fd 2: print() here could re-enter a buffered write the main thread is in
            os.write(2, (line + "\n").encode())
        except OSError:
            pass

    def _handle(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGUSR1:
            if self.requested is None:
                self.requested = signum
                self._say(f"received {name}: saving at the end of the current step, then stopping with exit code "
                          f"{REQUEUE_EXIT_CODE} (requeue; trainer.resume_from=auto continues)")
            return
        if self.requested in (signal.SIGINT, signal.SIGTERM):
            raise AbandonStep(signum, "a second signal")
        self.requested = signum
        if signum == signal.SIGTERM and self.decide is not None:
            finish, why = self.decide()
            if not finish:
                self._say(f"received {name}: abandoning the current step at once ({why}); the last complete "
                          f"checkpoint stays")
                raise AbandonStep(signum, why)
            self._say(f"received {name}: finishing the current step ({why}); send it again to abandon the step")
            self._arm(self.deadline() if self.deadline is not None else None)
            return
        self._say(f"received {name}: stopping after the current step (send it again to abandon the step)")

    def _arm(self, budget: float | None) -> None:
        """Abandon the step being finished ``budget`` seconds from now (None: no deadline)."""
        if budget is None or threading.current_thread() is not threading.main_thread():
            return
        self._budget = max(budget, 0.01)
        self._old.setdefault(signal.SIGALRM, signal.signal(signal.SIGALRM, self._overrun))
        signal.setitimer(signal.ITIMER_REAL, self._budget)

    def _overrun(self, _signum: int, _frame) -> None:
        why = (f"the step and its save ran past the {self._budget:.1f} s trainer.stop_grace_s leaves them: "
               "slower than the last step")
        self._say(f"received SIGTERM earlier: abandoning the current step now ({why}); the last complete "
                  "checkpoint stays")
        raise AbandonStep(signal.SIGTERM, why)

    def __exit__(self, *exc) -> None:
        if self._budget is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._budget = None
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


class AbandonStep(BaseException):
    """Leave the current step now, for ``why`` (a second signal, or a step that does not fit the grace);
    a BaseException, so no ``except Exception`` eats it."""

    def __init__(self, signum: int, why: str = "a second signal") -> None:
        super().__init__(signum, why)
        self.signum, self.why = signum, why


def abandon_cause(err: BaseException) -> AbandonStep | None:
    """The ``AbandonStep`` behind ``err``: raised by the signal handler while Ray's C extension waited, it
    comes out wrapped (``SystemError: ... returned a result with an exception set``)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, AbandonStep):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class NonFiniteGuard:
    """The NaN guard's driver half: the trainer skipped the optimizer step of a non-finite step
    (``TSPActorWorker.optimizer_step``); name the quantity, count consecutive bad steps, and stop with
    ``RunStopped`` per ``trainer.on_nonfinite`` / ``trainer.max_nonfinite_steps``."""

    def __init__(self, on_nonfinite: str, max_steps: int, log: Callable[[str], None]) -> None:
        self.on_nonfinite, self.max_steps, self.log = on_nonfinite, max_steps, log
        self.streak = 0

    def check(self, step: int, done: Any, checkpoint: str | None) -> None:
        """After global step ``step`` (``done``: its ``StepResults``); ``checkpoint``: where a stop resumes."""
        opt, rewards = done.optimizer, done.rewards
        if not opt.skipped:
            self.streak = 0
            return
        bad_rewards = [r for r in rewards if not math.isfinite(r)]
        norm = opt.grad_norm
        if bad_rewards:
            what = f"reward ({len(bad_rewards)} of {len(rewards)} samples, e.g. {bad_rewards[0]})"
        elif not math.isfinite(done.train.loss):
            what = f"loss (actor/loss = {done.train.loss})"
        elif opt.nonfinite == "grad_norm" or (norm is not None and not math.isfinite(norm)):
            what = f"gradient norm ({norm})"
        else:
            what = str(opt.nonfinite)
        self.streak += 1
        self.log(f"step {step}: non-finite {what}: optimizer step skipped, weights unchanged "
                 f"({self.streak}/{self.max_steps} consecutive)")
        if self.on_nonfinite == "stop" or self.streak >= self.max_steps:
            raise RunStopped(f"stopped at step {step}: non-finite {what} in {self.streak} consecutive step(s) "
                             f"(trainer.on_nonfinite={self.on_nonfinite}, trainer.max_nonfinite_steps="
                             f"{self.max_steps})", 3, checkpoint)
