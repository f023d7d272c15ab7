"""Timeline exports: Chrome/Perfetto trace JSON (one track per worker) and a Gantt PNG (Figure 1 style).

matplotlib is imported only inside :func:`save_gantt_png`, so the scheduling core stays stdlib-only.
"""

from __future__ import annotations

import json
from pathlib import Path

from .actions import ActionKind as K
from .timeline import TRAINER, Timeline, is_tag_slot

#: one colour per action kind (a colour-blind-safe palette; no two kinds share one)
COLORS = {
    K.GENERATE: "#4C72B0",
    K.TAG_GENERATE: "#64B5CD",
    K.SCORE: "#DD8452",
    K.UPDATE: "#55A868",
    K.SWITCH_TO_GEN: "#937860",
    K.SWITCH_TO_TRAIN: "#DA8BC3",
    K.OPTIMIZER_STEP: "#C44E52",
    K.PUBLISH: "#CCB974",
    K.WEIGHT_SYNC: "#8172B2",
}
#: hatch of a stale (TCSS) generation: the bar keeps its kind's colour
STALE_HATCH = "//"
STALE_LABEL = "stale (TCSS, one version old)"
STEP_LABEL = "step end (optimizer step done)"


def _label(r) -> str:
    if r.mini_batch is not None:
        return f"{r.kind} s{r.step} mini-batch {r.mini_batch}"
    if r.mb is None:
        return r.kind
    mbs = f"{r.mb}" if r.count == 1 else f"{r.mb}-{r.mb + r.count - 1}"
    return f"{r.kind} s{r.step} mb{mbs}" + (" (stale)" if r.stale else "")


def chrome_trace(timeline: Timeline, title: str = "verl-digen") -> dict:
    """Trace Event Format (opens in ui.perfetto.dev / chrome://tracing); times in microseconds."""
    tids = {w: i for i, w in enumerate(timeline.workers)}
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": title}}]
    for w, tid in tids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": w}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": tid, "args": {"sort_index": tid}})
    for r in sorted(timeline.records, key=lambda r: (r.start, r.worker)):
        events.append({
            "ph": "X",
            "name": _label(r),
            "cat": r.kind,
            "pid": 0,
            "tid": tids.get(r.worker, len(tids)),
            "ts": r.start * 1e6,
            "dur": max(0.0, r.end - r.start) * 1e6,
            "args": {"kind": r.kind, "step": r.step, "mb": r.mb, "count": r.count, "version": r.version,
                     "stale": r.stale, **({"bytes": dict(r.moved)} if r.moved else {}),
                     **({"mini_batch": r.mini_batch} if r.mini_batch is not None else {}),
                     **({"dispatch_s": r.dispatch} if r.issued is not None else {})},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def save_chrome_trace(timeline: Timeline, path: str | Path, title: str = "verl-digen") -> None:
    Path(path).write_text(json.dumps(chrome_trace(timeline, title)))


def gantt_legend(timeline: Timeline, max_steps: int | None = None) -> list[tuple[str, str | None, str | None]]:
    """The legend of :func:`save_gantt_png` as (label, colour, hatch) rows: each action kind present,
    then stale work and the step-end marker when there are any (tested without drawing)."""
    recs, ends = _shown(timeline, max_steps)
    rows: list[tuple[str, str | None, str | None]] = [(k, COLORS[k], None) for k in COLORS
                                                      if any(r.kind == k for r in recs)]
    rows += [(k, "#999999", None) for k in sorted({r.kind for r in recs} - set(COLORS))]
    if any(r.stale for r in recs):
        rows.append((STALE_LABEL, None, STALE_HATCH))
    if ends:
        rows.append((STEP_LABEL, None, None))
    return rows


def _shown(timeline: Timeline, max_steps: int | None) -> tuple[list, list[float]]:
    """The records and step ends drawn: the first ``max_steps`` steps (all when None)."""
    recs = timeline.records
    ends = timeline.step_ends()
    if max_steps is not None and len(ends) > max_steps:  # cut at the end of the last shown step
        cut = ends[max_steps - 1]
        recs = [r for r in recs if r.start < cut - 1e-12]
        ends = ends[:max_steps]
    return recs, ends


def gantt_rows(timeline: Timeline, recs: list) -> list[str]:
    """The workers a Gantt chart shows: all but the TAG slots that ran nothing in ``recs`` (a run whose
    policy never switched has R empty ``tagJ`` rows otherwise)."""
    busy = {r.worker for r in recs}
    return [w for w in timeline.workers if not is_tag_slot(w) or w in busy]


def gantt_figure(timeline: Timeline, title: str = "", max_steps: int | None = None):
    """One row per worker (TAG slots only when they generated), one bar per action coloured by kind,
    stale generations hatched, a dashed line at each step's end; the legend sits right of the axes,
    clear of the time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    recs, ends = _shown(timeline, max_steps)
    workers = gantt_rows(timeline, recs)
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(workers) + 1.8))
    for y, w in enumerate(reversed(workers)):
        for r in recs:
            if r.worker != w or r.end <= r.start:
                continue
            ax.barh(y, r.end - r.start, left=r.start, height=0.8, color=COLORS.get(r.kind, "#999999"),
                    edgecolor="white", linewidth=0.4, hatch=STALE_HATCH if r.stale else None)
    first = min((r.step for r in recs), default=0)
    for i, end in enumerate(ends):
        ax.axvline(end, color="black", linestyle="--", linewidth=0.9)
        ax.text(end, len(workers) - 0.45, f" step {first + i + 1}", fontsize=7, va="bottom", ha="right")
    ax.set_yticks(range(len(workers)))
    ax.set_yticklabels([f"{w} (pool)" if w == TRAINER else w for w in reversed(workers)])
    ax.set_ylim(-0.6, len(workers) - 0.1)
    ax.set_xlabel("time (s)")
    if title:
        ax.set_title(title, pad=14)
    handles = []
    for label, color, hatch in gantt_legend(timeline, max_steps):
        if label == STEP_LABEL:
            handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.9, label=label))
        elif hatch:
            handles.append(Patch(facecolor="white", edgecolor="black", hatch=hatch, label=label))
        else:
            handles.append(Patch(color=color, label=label))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
              borderaxespad=0.0)
    fig.tight_layout()
    return fig


def save_gantt_png(timeline: Timeline, path: str | Path, title: str = "", max_steps: int | None = None) -> None:
    """:func:`gantt_figure` written as a PNG (the legend kept inside the image)."""
    import matplotlib.pyplot as plt

    fig = gantt_figure(timeline, title, max_steps)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def timeline_from_file(path: str | Path) -> Timeline:
    """The ``Timeline`` a run wrote to ``<mode>_timeline.json`` (or streamed to ``<mode>_timeline.jsonl``);
    workers in the run's order when the file names them, else generators, trainer, TAG slots."""
    from .timeline import record_of

    if str(path).endswith(".jsonl"):  # the stream: a header line per run (a resumed run appends its own)
        data = _joined_runs(path)
    else:
        data = json.loads(Path(path).read_text())
    recs = [record_of(r) for r in data.get("records", [])]
    workers = data.get("workers") or sorted({r.worker for r in recs}, key=_worker_order)
    steps = len({r.step for r in recs})
    return Timeline(list(workers), 0, steps, data.get("mode", "digen"), recs,
                    staleness=float(data.get("staleness", 0.0)))


def _joined_runs(path: str | Path) -> dict:
    """A streamed timeline's runs as one: steps and versions counted from the first run's first step,
    and each run's times after the end of the one before (each run's clock starts at its own start)."""
    runs = read_runs(path)
    base = int(runs[0][0].get("first_step", 0)) if runs else 0
    records: list[dict] = []
    t = 0.0
    for header, recs in runs:
        shift = int(header.get("first_step", 0)) - base
        for r in recs:
            records.append({**r, "step": r["step"] + shift, "version": r["version"] + shift,
                            "start": r["start"] + t, "end": r["end"] + t,
                            **({"issued": r["issued"] + t} if r.get("issued") is not None else {})})
        t = max((r["end"] for r in records), default=t)
    head = runs[-1][0] if runs else {}
    return {**head, "records": records}


def read_runs(path: str | Path) -> list[tuple[dict, list[dict]]]:
    """(header, records) of every run in a streamed timeline (``<mode>_timeline.jsonl``, written by
    ``reporting/trace_stream.py``: a header line per run, then its records), oldest first; a torn last
    line, from a killed writer, is dropped."""
    runs: list[tuple[dict, list[dict]]] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            break
        if "header" in obj:
            runs.append((obj["header"], []))
        elif runs:
            runs[-1][1].append(obj)
        else:  # records before any header: one run without a name
            runs.append(({}, [obj]))
    return runs


def _worker_order(w: str) -> tuple[int, int, str]:
    digits = "".join(c for c in w if c.isdigit())
    rank = 0 if w.startswith("gen") else 1 if w == TRAINER else 2
    return rank, int(digits) if digits else 0, w
