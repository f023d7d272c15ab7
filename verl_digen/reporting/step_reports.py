"""Every global step's report, held compactly: a long run's driver must not grow by a dict per step.

A step's metrics are ~45 floats under names every step shares. :class:`StepReports` keeps each step's
values in one flat ``array('d')`` and each distinct name set once, so a step costs ~8 bytes per
metric instead of a dict's ~1.5 KB (``bench/soak.py``, docs/benchmarks.md "Soak"). Reading it gives
back :class:`StepReport` objects with the same names and values (ints and bools come back as floats).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload


@dataclass
class StepReport:
    """What one global step measured (also logged through verl's Tracking)."""

    step: int
    metrics: dict[str, float]


class StepReports(Sequence[StepReport]):
    """An append-only list of step reports; ``reports[i]`` builds the i-th report on demand."""

    def __init__(self) -> None:
        self._steps = array("q")
        self._names: list[tuple[str, ...]] = []  # each distinct name set, once
        self._name_ids: dict[tuple[str, ...], int] = {}
        self._which = array("H")  # per report: its name set
        self._starts = array("Q", [0])  # per report: where its values start in _values
        self._values = array("d")

    def append(self, report: StepReport) -> None:
        names = tuple(report.metrics)
        try:
            values = [float(v) for v in report.metrics.values()]
        except (TypeError, ValueError) as err:
            raise TypeError(f"step {report.step}: every metric must be a number ({err})") from None
        which = self._name_ids.get(names)
        if which is None:
            which = self._name_ids[names] = len(self._names)
            self._names.append(names)
        self._steps.append(report.step)
        self._which.append(which)
        self._values.extend(values)
        self._starts.append(len(self._values))

    def __len__(self) -> int:
        return len(self._steps)

    @overload
    def __getitem__(self, i: int) -> StepReport: ...

    @overload
    def __getitem__(self, i: slice) -> list[StepReport]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"report {i} of {len(self)}")
        names = self._names[self._which[i]]
        values = self._values[self._starts[i]:self._starts[i + 1]]
        return StepReport(self._steps[i], dict(zip(names, values)))

    def __iter__(self) -> Iterator[StepReport]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"StepReports({len(self)} steps)"

