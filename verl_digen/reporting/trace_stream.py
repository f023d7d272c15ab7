"""The timeline streamed to disk while a run goes: one JSON line per record, appended at every global step.

A run that dies (a killed driver, a lost node) still leaves every completed step's records in
``<trace_dir>/<mode>_timeline.jsonl``; the whole-run files (``<mode>_trace.json`` and
``<mode>_timeline.json``) are written atomically when the run ends or stops (docs/architecture.md,
"Runtime"). Each run starts with a header line naming it (``run_id``, ``first_step``); its records'
steps and versions count from ``first_step`` and its times from its own start. A resumed run appends
to the file after the records of the steps its checkpoint holds (what a crashed run did past them is
dropped), so the file holds the whole history: :func:`read_runs` gives it run by run. The driver keeps
only a window of records in memory while the run goes; :func:`restore_segments` reads the run back at
its end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from verl_digen.schedule.export import read_runs
from verl_digen.schedule.timeline import Record, Timeline, record_dict, record_of


class RecordStream:
    """Appends the records added to ``records`` (a run's growing timeline list) since the last
    ``flush``; each flush costs only the new records, however long the run."""

    def __init__(self, path: str | Path, records: list, header: dict, keep_through: int = 0) -> None:
        """``keep_through``: the global step a resumed run continues from; the file's earlier runs are kept
        up to it (0: a fresh run, the file starts over)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records = records
        self.pos = len(records)
        self.offset = 0
        kept = _lines_through(self.path, keep_through) if keep_through > 0 and self.path.exists() else []
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept) + json.dumps({"header": header}) + "\n", encoding="utf-8")
        tmp.replace(self.path)  # the earlier history is never half-rewritten
        self._f: IO[str] | None = self.path.open("a", encoding="utf-8")

    def flush(self) -> int:
        """Write the new records and push them to the OS; returns how many were written."""
        if self._f is None:
            return 0
        new = self.records[self.pos:]
        if new:
            self._f.write("".join(json.dumps(self._row(r)) + "\n" for r in new))
            self._f.flush()
        self.pos += len(new)
        return len(new)

    def follow(self, records: list, offset: int) -> None:
        """Continue with another segment's growing list (validation cuts a run into segments, each
        scheduled from its own step 0): its records get ``offset`` added to their step and version."""
        self.flush()
        self.records, self.pos, self.offset = records, len(records), offset

    def _row(self, record: Record) -> dict:
        row = record_dict(record)
        if self.offset:
            row["step"] += self.offset
            row["version"] += self.offset
        return row

    def close(self) -> None:
        """Flush what is left and close the file (idempotent)."""
        if self._f is not None:
            self.flush()
            self._f.close()
            self._f = None


def read_stream(path: str | Path) -> tuple[dict, list[dict]]:
    """The header and the records of the last run in a streamed timeline (:func:`read_runs` has them
    all)."""
    runs = read_runs(path)
    return runs[-1] if runs else ({}, [])


def restore_segments(path: str | Path, segments: list[tuple[int, Timeline]]) -> None:
    """Refill each ``(offset, timeline)`` segment of the file's last run with its records, read back from
    the stream: the runtime drops records once streamed (``forget_read``), and rebuilds the whole
    timeline here once, at the end, for the invariant check, the trace and the profile. A segment's
    records are those of its steps, ``offset <= step < offset + timeline.steps``, back on its own step
    and version numbering."""
    _, rows = read_stream(path)
    for offset, timeline in segments:
        timeline.records[:] = [record_of({**r, "step": r["step"] - offset, "version": r["version"] - offset})
                               for r in rows if offset <= r["step"] < offset + timeline.steps]


def _lines_through(path: Path, step: int) -> list[str]:
    """The lines of ``path`` that hold global steps ``< step`` (0-based: the steps a checkpoint of
    ``step`` completed), with the headers of the runs they belong to."""
    out: list[str] = []
    for header, records in read_runs(path):
        first = int(header.get("first_step", 0))
        kept = [r for r in records if first + int(r["step"]) < step]
        if kept:
            out.append(json.dumps({"header": header}))
            out.extend(json.dumps(r) for r in kept)
    return out
