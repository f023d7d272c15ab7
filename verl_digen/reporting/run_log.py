"""What a run leaves for people: the per-step metrics file, readable console lines, the resolved config.

- ``<trace_dir>/<mode>_metrics.jsonl``: one JSON line per global step, appended as the step completes,
  so the curves (``reporting/plots.py``) and ``digen plot`` redraw a run from disk and the driver keeps no
  growing history for them. A resumed run keeps the lines of the steps up to its checkpoint and
  appends after them; a fresh run starts the file anew.
- The console backend of verl's ``Tracking`` prints one unreadable dict per step; ``ConsoleLogger``
  replaces it with the metrics rounded to 4 significant digits: a block grouped by prefix (for a
  terminal), or one line of the headline figures (``trainer.log_format=line``, the default when output is
  not a terminal: a cluster job's log), written through the progress bar (``tqdm.write``) so lines and bar
  do not interleave. Every other backend (wandb, tensorboard, ...) and the metrics file still receive every
  value at full precision.
- ``config.yaml``: the resolved run config, in the trace directory and in every checkpoint.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_digen.defaults import LOG_FORMATS
from verl_digen.reporting import metric_names as names

CONFIG_FILE = "config.yaml"

#: console groups in this order; any other prefix follows alphabetically, keys without one last
GROUP_ORDER = ("reward", "val", "actor", "timing", "perf", "pool", "time", "digen")


def metrics_path(trace_dir: str | Path, mode: str) -> Path:
    """Where a run of ``mode`` appends its per-step metrics."""
    return Path(trace_dir) / f"{mode}_metrics.jsonl"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics file, one per step in step order (a step written twice: the last line
    wins); a last line cut short by a killed run is skipped."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)]


def read_run_metrics(trace_dir: str | Path, mode: str) -> list[dict[str, Any]]:
    """A run's per-step rows (:func:`read_metrics` of its metrics file) with its validation passes' ``val/*``
    metrics (``<trace_dir>/val/<mode>_val.jsonl``, where validation writes them) on the rows of their steps."""
    path = metrics_path(trace_dir, mode)
    by_step = {r["step"]: r for r in (read_metrics(path) if path.exists() else [])}
    val = Path(trace_dir, "val", f"{mode}_val.jsonl")
    for row in read_metrics(val) if val.exists() else []:
        by_step.setdefault(row["step"], {"step": row["step"]}).update(
            {k: v for k, v in row.items() if k.startswith("val/")})
    return [by_step[step] for step in sorted(by_step)]


class MetricsLog:
    """Append-only per-step metrics file. Opening it keeps the rows of steps ``<= keep_through`` (the
    steps a resumed run continues from) and drops the rest, which a fresh run (``keep_through=0``)
    or the steps after a checkpoint would otherwise duplicate."""

    def __init__(self, path: str | Path, keep_through: int = 0, run_id: str = "") -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r["step"] <= keep_through] if (
            keep_through > 0 and self.path.exists()) else []
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.path)

    def append(self, step: int, metrics: dict[str, Any]) -> None:
        """One line for ``step`` (numbers only; NaN and infinities kept as JSON's extensions)."""
        row = {"step": int(step), "run_id": self.run_id,
               **{k: float(v) for k, v in metrics.items() if _is_number(v)}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def format_value(v: Any) -> str:
    """4 significant digits; integers (and integral floats below 1e6) without a decimal point."""
    if isinstance(v, bool) or not _is_number(v):
        return str(v)
    f = float(v)
    if math.isfinite(f) and f == int(f) and abs(f) < 1e6:
        return str(int(f))
    return f"{f:.4g}"


def _group_key(group: str) -> tuple[int, str]:
    if group in GROUP_ORDER:
        return GROUP_ORDER.index(group), group
    return (len(GROUP_ORDER) + (1 if group == "" else 0)), group


def format_metrics(metrics: dict[str, Any], step: int, total: int | None = None, width: int = 120) -> str:
    """The console block of one step: a header, then one line per metric prefix (``reward/``,
    ``actor/``, ...) with each value rounded by :func:`format_value`; a group longer than ``width``
    characters goes on over indented lines."""
    groups: dict[str, list[str]] = {}
    for key, value in metrics.items():
        if not _is_number(value):
            continue
        group, _, name = key.partition("/") if "/" in key else ("", "", key)
        groups.setdefault(group, []).append(f"{name}={format_value(value)}")
    label_w = max((len(g) for g in groups), default=1)
    lines = [f"step {step}" + (f"/{total}" if total else "")]
    for g in sorted(groups, key=_group_key):
        line = f"  {(g or '-'):<{label_w}}  "
        indent, first = " " * len(line), True
        for item in groups[g]:
            if not first and len(line) + 2 + len(item) > width:
                lines.append(line)
                line, first = indent, True
            line += item if first else "  " + item
            first = False
        lines.append(line)
    return "\n".join(lines)


#: the figures of a one-line step log: (metric, label), in this order; a metric the step lacks is left out
LINE_FIELDS = ((names.REWARD_MEAN, "reward"), (names.actor("loss"), "loss"), (names.STEP_S, "step_s"),
               (names.SAMPLES_PER_WORKER_S, "samples_per_worker_s"), (names.GENERATOR_BUSY, "gen_busy"),
               (names.TRAINER_BUSY, "trn_busy"),
               (names.STALE_FRACTION, "stale"), (names.VAL_REWARD_MEAN, "val_reward"), (names.RETRIES, "retries"),
               (names.RESTARTS, "restarts"))
ONLY_WHEN_NONZERO = (names.RETRIES, names.RESTARTS)  # faults: shown in the steps that had some


def format_line(metrics: dict[str, Any], step: int, total: int | None = None) -> str:
    """One line per step for cluster logs: step, reward mean +- std, loss, step time, throughput (the block's
    and the summary's samples per worker-second, by the same name), pool busy fractions, staleness, and
    validation and faults when the step has them, as ``label=value`` pairs a grep or awk can take apart."""
    parts = [f"step {step}" + (f"/{total}" if total else "")]
    for key, label in LINE_FIELDS:
        value = metrics.get(key)
        if not _is_number(value) or (key in ONLY_WHEN_NONZERO and not value):
            continue
        text = format_value(value)
        if key == names.REWARD_MEAN and _is_number(metrics.get(names.REWARD_STD)):
            text += f"+-{format_value(metrics[names.REWARD_STD])}"
        parts.append(f"{label}={text}")
    return "  ".join(parts)


class ConsoleLogger:
    """The console backend of ``Tracking`` for a run: :func:`format_metrics` (``fmt="block"``) or
    :func:`format_line` (``"line"``) through ``write`` (the progress bar's writer while a bar is shown, so
    bar and lines do not interleave)."""

    def __init__(self, write: Callable[[str], None] = print, total: int | None = None, fmt: str = "block") -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
        self.write = write
        self.total = total
        self.fmt = fmt

    def log(self, data: dict[str, Any], step: int) -> None:
        if self.fmt == "line":
            self.write(format_line(data, step, self.total))
        else:
            self.write(format_metrics(data, step, self.total))

    def flush(self) -> None:
        """Nothing buffered (``Tracking`` may call it)."""

    def finish(self) -> None:
        """Nothing to close (``Tracking`` may call it)."""


def install_console(tracking: Any, console: ConsoleLogger) -> bool:
    """Replace the console backend of a verl ``Tracking`` by ``console`` (the other backends are left
    as they are); False when the run has no console backend."""
    loggers = getattr(tracking, "logger", None)
    if not isinstance(loggers, dict) or "console" not in loggers:
        return False
    loggers["console"] = console
    if hasattr(tracking, "console_logger"):
        tracking.console_logger = console
    return True


def resolved_config_yaml(cfg: Any) -> str:
    """The run config with every default filled in, as YAML (what the run really used)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_resolved_config(cfg: Any, directory: str | Path) -> Path:
    """Write ``config.yaml`` into ``directory`` (atomically) and return its path."""
    out = Path(directory) / CONFIG_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(resolved_config_yaml(cfg))
    tmp.replace(out)
    return out


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON next to ``path`` and rename it into place: a reader never sees half a file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(p)
