"""The timeline streamed to disk while a run goes: one JSON line per record, appended at every global step.

A run that dies (a killed driver, a lost node) still leaves every completed step's records in
``<trace_dir>/<mode>_timeline.jsonl``; the whole-run files (``<mode>_trace.json`` and
``<mode>_timeline.json``) are written atomically when the run ends or stops (docs/architecture.md,
"Runtime"). The first line is a header naming the run.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import IO


class RecordStream:
    """Appends the records added to ``records`` (a run's growing timeline list) since the last
    ``flush``; each flush costs only the new records, however long the run."""

    def __init__(self, path: str | Path, records: list, header: dict) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records = records
        self.pos = len(records)
        self.offset = 0
        self._f: IO[str] | None = self.path.open("w", encoding="utf-8")
        self._f.write(json.dumps({"header": header}) + "\n")
        self._f.flush()

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

    def _row(self, record) -> dict:
        row = _as_dict(record)
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


def _as_dict(record) -> dict:
    """A record's fields (plain values: a shallow copy, far cheaper than ``dataclasses.asdict``)."""
    return dict(vars(record)) if hasattr(record, "__dict__") else asdict(record)


def read_stream(path: str | Path) -> tuple[dict, list[dict]]:
    """The header and the records of a streamed timeline (a torn last line, from a killed writer, is
    dropped)."""
    header: dict = {}
    records: list[dict] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            break
        if "header" in obj:
            header = obj["header"]
        else:
            records.append(obj)
    return header, records
