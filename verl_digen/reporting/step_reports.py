"""Every global step's report, held compactly: a long run's driver must not grow by a dict per step.

A step's metrics are ~45 floats under names every step shares. :class:`StepReports` keeps each step's
values in one flat ``array('d')`` and each distinct name set once, so a step costs ~8 bytes per
metric instead of a dict's ~1.5 KB (``bench/soak.py``, docs/benchmarks.md "Soak"). Once ``spill_values``
values are held they go to an anonymous temporary file (removed when the reports are, or at exit), so the
driver keeps only ~18 bytes per step (its number, name set and offset) whatever the run's length; reading an
old report reads its values back. Reading gives back :class:`StepReport` objects with the same names and
values (ints and bools come back as floats).
"""

from __future__ import annotations

import os
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, overload

#: values held in memory before they go to the spill file (32 KB: ~90 steps of a real run's reports)
SPILL_VALUES = 4096


@dataclass
class StepReport:
    """What one global step measured (also logged through verl's Tracking)."""

    step: int
    metrics: dict[str, float]


class StepReports(Sequence[StepReport]):
    """An append-only list of step reports; ``reports[i]`` builds the i-th report on demand. Values past the
    last ``spill_values`` live in a temporary file (see the module docstring)."""

    def __init__(self, spill_values: int = SPILL_VALUES) -> None:
        self._steps = array("q")
        self._names: list[tuple[str, ...]] = []  # each distinct name set, once
        self._name_ids: dict[tuple[str, ...], int] = {}
        self._which = array("H")  # per report: its name set
        self._starts = array("Q", [0])  # per report: where its values start (over the spilled and held ones)
        self._values = array("d")  # the values not spilled yet: from index ``_spilled`` on
        self._spilled = 0
        self._spill_values = spill_values
        self._file: IO[bytes] | None = None

    def _spill(self) -> None:
        """Move the held values to the end of the spill file (every report's values are then wholly in one
        place: a spill happens between appends)."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="digen-reports-", buffering=0)
        self._file.seek(0, os.SEEK_END)
        self._file.write(self._values.tobytes())
        self._spilled += len(self._values)
        self._values = array("d")

    def _read(self, start: int, stop: int) -> array:
        if start >= self._spilled:
            return self._values[start - self._spilled:stop - self._spilled]
        assert self._file is not None
        self._file.seek(start * 8)
        out = array("d")
        out.frombytes(self._file.read((stop - start) * 8))
        return out

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
        self._starts.append(self._spilled + len(self._values))
        if len(self._values) >= self._spill_values:
            self._spill()

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
        values = self._read(self._starts[i], self._starts[i + 1])
        return StepReport(self._steps[i], dict(zip(names, values)))

    def __iter__(self) -> Iterator[StepReport]:
        return (self[i] for i in range(len(self)))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled whole: the spilled values come back into the copy's memory (a file does not travel)."""
        state = dict(self.__dict__)
        state["_values"] = self._read(0, self._spilled + len(self._values))
        state["_spilled"], state["_file"] = 0, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"StepReports({len(self)} steps)"

