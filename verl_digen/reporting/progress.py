"""Driver-side helpers of the step loop: a moving window over the growing timeline (and forgetting what
every reader has passed), and the progress bar."""

from __future__ import annotations

import sys
from typing import TextIO

from verl_digen.reporting import metric_names as names


class Recent:
    """A growing list read from a moving start: ``since(keep)`` skips (for good) leading items for
    which ``keep`` is false and returns the rest, so a long run never rescans its whole history."""

    def __init__(self, items: list) -> None:
        self.items, self.pos = items, 0

    def since(self, keep) -> list:
        while self.pos < len(self.items) and not keep(self.items[self.pos]):
            self.pos += 1
        return self.items[self.pos:]


def forget_read(items: list, *readers) -> int:
    """Delete the leading ``items`` that every reader (each with a ``pos`` into ``items``: a
    :class:`Recent`, a ``RecordStream``) has passed, and move the readers back; returns how many went.
    The step loop calls it once a step, so the driver holds a window of the run, not its history."""
    k = min(r.pos for r in readers)
    if k > 0:
        del items[:k]
        for r in readers:
            r.pos -= k
    return k


class Progress:
    """A tqdm bar over global steps with the headline metrics, on a terminal only: redirected to a file,
    every redraw would stay in it, so there (and when disabled) the step blocks are plain lines."""

    def __init__(self, total: int, enabled: bool, log, stream: TextIO | None = None) -> None:
        self.bar = None
        self.log = log
        stream = sys.stderr if stream is None else stream
        if enabled and stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="global steps", unit="step", dynamic_ncols=True, file=stream)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{metrics[names.REWARD_MEAN]:+.4f}", step_s=f"{metrics[names.STEP_S]:.2f}")

    def write(self, text: str) -> None:
        """A line (or block) printed above the bar, which is redrawn below it."""
        if self.bar is not None:
            self.bar.write(text)
        else:
            self.log(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
