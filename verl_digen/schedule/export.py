"""Timeline exports: Chrome/Perfetto trace JSON (one track per worker) and a Gantt PNG (Figure 1 style).

matplotlib is imported only inside :func:`save_gantt_png`, so the scheduling core stays stdlib-only.
"""

from __future__ import annotations

import json
from pathlib import Path

from .timeline import TRAINER, Timeline

COLORS = {
    "generate": "#4C72B0",
    "tag_generate": "#64B5CD",
    "score": "#DD8452",
    "update": "#55A868",
    "switch_to_gen": "#BBBBBB",
    "switch_to_train": "#BBBBBB",
    "optimizer_step": "#C44E52",
    "weight_sync": "#8172B2",
}


def _label(r) -> str:
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
                     "stale": r.stale},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def save_chrome_trace(timeline: Timeline, path: str | Path, title: str = "verl-digen") -> None:
    Path(path).write_text(json.dumps(chrome_trace(timeline, title)))


def save_gantt_png(timeline: Timeline, path: str | Path, title: str = "", max_steps: int | None = None) -> None:
    """One row per worker, one bar per action, colored by kind; stale generations hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    recs = timeline.records
    ends = timeline.step_ends()
    if max_steps is not None and len(ends) > max_steps:  # cut at the end of the last shown step
        cut = ends[max_steps - 1]
        recs = [r for r in recs if r.start < cut - 1e-12]
    workers = list(timeline.workers)
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(workers) + 1.5))
    for y, w in enumerate(reversed(workers)):
        for r in recs:
            if r.worker != w or r.end <= r.start:
                continue
            ax.barh(y, r.end - r.start, left=r.start, height=0.8, color=COLORS.get(r.kind, "#999999"),
                    edgecolor="white", linewidth=0.4, hatch="//" if r.stale else None)
    ax.set_yticks(range(len(workers)))
    ax.set_yticklabels([f"{w} (pool)" if w == TRAINER else w for w in reversed(workers)])
    ax.set_xlabel("time (s)")
    if title:
        ax.set_title(title)
    kinds = [k for k in COLORS if any(r.kind == k for r in recs)]
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.15), ncol=len(kinds), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
