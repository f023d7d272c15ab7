"""Curves of a run, drawn from the files it leaves (``<mode>_metrics.jsonl``, ``<mode>_timeline.json``).

``curve_panels`` turns the per-step rows into the panels (tested without drawing); ``save_curves_png``
draws them: the reward mean with a band of one standard deviation over the step's samples, the step
time (with the ideal of the step's own measured costs when the mode has one), and each pool's busy
fraction. ``plot_trace_dir`` is ``digen plot``: the Gantt and the curves of every run in a trace dir.
matplotlib is imported only when drawing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_digen.reporting import metric_names as names
from verl_digen.reporting.run_log import read_run_metrics

#: the panels of ``<mode>_curves.png``, top to bottom
PANELS = ("reward", "step time", "busy fraction")


@dataclass
class Panel:
    """One axis: lines over the steps, and optionally a band (low, high) around the first line."""

    title: str
    ylabel: str
    lines: dict[str, list[float]] = field(default_factory=dict)
    band: tuple[list[float], list[float]] | None = None


def curve_panels(rows: list[dict[str, Any]]) -> tuple[list[int], list[Panel]]:
    """(steps, panels) of the rows of a metrics file (see ``run_log.read_metrics``)."""
    steps = [int(r["step"]) for r in rows]

    def col(key: str) -> list[float]:
        return [float(r.get(key, float("nan"))) for r in rows]

    mean, std = col(names.REWARD_MEAN), [float(r.get(names.REWARD_STD, 0.0)) for r in rows]
    reward = Panel("reward", "reward (mean ± std over samples)", {"mean": mean},
                   ([m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in zip(mean, std, strict=True)]))
    val = sorted({k for r in rows for k in r if k.startswith("val/") and "reward" in k and k.endswith("mean")})
    for key in val:  # a validation pass logs only on its steps: NaN elsewhere leaves gaps
        reward.lines[key] = col(key)
    timing = Panel("step time", "seconds", {"step": col(names.STEP_S)})
    if any(names.IDEAL_STEP_S in r for r in rows):
        timing.lines["ideal (own measured costs)"] = col(names.IDEAL_STEP_S)
    busy = Panel("busy fraction", "busy fraction of the pool")
    # a colocated run has no generator pool: its generator busy and bubble are both 0
    if any(r.get(names.GENERATOR_BUSY, 0.0) + r.get(names.GENERATOR_BUBBLE, 0.0) > 0 for r in rows):
        busy.lines["generator pool"] = col(names.GENERATOR_BUSY)
    busy.lines["trainer pool"] = col(names.TRAINER_BUSY)
    return steps, [reward, timing, busy]


def save_curves_png(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Draw :func:`curve_panels` of ``rows`` as one PNG (three panels sharing the step axis)."""
    if not rows:
        raise ValueError(f"no per-step metrics to draw for {path}: the run wrote no step")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps, panels = curve_panels(rows)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels) + 0.6), sharex=True)
    marker = "o" if len(steps) <= 50 else None
    for ax, panel in zip(axes, panels, strict=True):
        if panel.band is not None:
            ax.fill_between(steps, *panel.band, alpha=0.25, linewidth=0, label="± std")
        for label, ys in panel.lines.items():
            ax.plot(steps, ys, marker=marker, markersize=3, linestyle="--" if label.startswith("ideal") else "-",
                    label=label)
        ax.set_title(panel.title, fontsize=9, loc="left")
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0.0)
    axes[-1].set_ylim(-0.02, 1.02)
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel("global step")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Path(path)


def plot_trace_dir(trace_dir: str | Path, out_dir: str | Path | None = None, mode: str | None = None,
                   gantt_steps: int | None = 3) -> list[Path]:
    """``<mode>_gantt.png`` and ``<mode>_curves.png`` of each run in ``trace_dir`` (or of ``mode``),
    written to ``out_dir`` (default: ``trace_dir``); the paths written."""
    from verl_digen.schedule.export import read_runs, save_gantt_png, timeline_from_file

    src = Path(trace_dir)
    if not src.is_dir():
        raise ValueError(f"trace dir {str(src)!r} is not a directory (expected a run's trainer.trace_dir)")
    suffixes = ("_timeline.json", "_timeline.jsonl", "_metrics.jsonl")
    modes = sorted({f.name[: -len(s)] for s in suffixes for f in src.glob(f"*{s}")})
    if mode is not None:
        if mode not in modes:
            raise ValueError(f"no {mode}_timeline.json or {mode}_metrics.jsonl in {src} (found runs: "
                             f"{', '.join(modes) or 'none'})")
        modes = [mode]
    if not modes:
        raise ValueError(f"no run outputs in {src}: expected <mode>_timeline.json or <mode>_metrics.jsonl "
                         "(written when trainer.trace_dir is set)")
    out = Path(out_dir) if out_dir is not None else src
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for m in modes:
        timeline_file, metrics_file = src / f"{m}_timeline.json", src / f"{m}_metrics.jsonl"
        stream = src / f"{m}_timeline.jsonl"
        # the streamed records: all a killed run left, and a resumed run's whole history (its .json holds only
        # the last run)
        if stream.exists() and (not timeline_file.exists() or len(read_runs(stream)) > 1):
            timeline_file = stream
        if timeline_file.exists():
            timeline = timeline_from_file(timeline_file)
            if timeline.records:
                gantt = out / f"{m}_gantt.png"
                shown = f", first {gantt_steps} steps" if gantt_steps else ""
                save_gantt_png(timeline, gantt, title=f"{m} run{shown}", max_steps=gantt_steps or None)
                written.append(gantt)
        if metrics_file.exists():
            rows = read_run_metrics(src, m)
            if rows:
                written.append(save_curves_png(rows, out / f"{m}_curves.png", title=f"{m} run"))
    return written
