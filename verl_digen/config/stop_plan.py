"""How long a checkpoint takes to save and how early a scheduler must warn the run: printed by the dry run
(``trainer.dry_run=true``) so that Slurm's ``--signal=B:USR1@<lead>`` (recipes/slurm/digen.sbatch) leaves
time for the step in progress and its save (docs/cluster.md).

The save time is the checkpoint's size over ``WRITE_BYTES_PER_S`` (an assumption, below), or the time the
run's last checkpoint took when ``trainer.default_local_dir`` holds one that recorded it (``SAVE_BEGAN_KEY``).
The size counts what ``workers/checkpoint.py`` writes to ``trainer.pt``: the trained weights and AdamW's two
moments in the master dtype, the EMA when there is one, and the export with ``trainer.export_on_save``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from verl_digen.config.schema import RunConfig, master_dtype
from verl_digen.dtypes import BYTES

#: bytes per second one writer puts on the checkpoint filesystem: trainer rank 0 writes the whole gathered
#: ``trainer.pt`` alone. 1 GB/s is a shared filesystem's (Lustre, GPFS, a fast NFS) single-client rate; a local
#: NVMe is faster, a plain NFS mount often slower: the run's measured figure replaces it once it has one
WRITE_BYTES_PER_S = 1e9
#: the lead covers the step and its save times this factor (a step varies; the warning can come just after a
#: step began) plus ``LEAD_MARGIN_S`` (the driver's exit, Ray's processes, the requeue), rounded up to 10 s
LEAD_FACTOR = 1.25
LEAD_MARGIN_S = 60.0
#: the key of a checkpoint's ``extra`` (meta.json) holding when its save began (time.time()); meta.json's
#: ``saved_at`` is when it ended
SAVE_BEGAN_KEY = "save_began"


@dataclass
class StopPlan:
    checkpoint_bytes: float | None  # None: model size unknown
    save_s: float | None
    save_source: str  # where save_s comes from
    step_s: float | None  # the predicted (simulator) step time
    grace_s: float | None  # trainer.stop_grace_s

    @property
    def lead_s(self) -> int | None:
        """Slurm's ``--signal`` lead time in seconds (None: no step-time prediction or no save time)."""
        return signal_lead_s(self.step_s, self.save_s)

    def render(self) -> str:
        lines = ["stopping:"]
        if self.save_s is None:
            lines.append("  save       size unknown (set digen.profile to a preset for an estimate)")
        else:
            size = f"{self.checkpoint_bytes / 1e9:.1f} GB" if self.checkpoint_bytes is not None else "size unknown"
            lines.append(f"  save       {self.save_s:.0f} s per checkpoint ({size}; {self.save_source})")
        lead = self.lead_s
        if lead is None:
            lines.append("  --signal   no lead time without a predicted step time (set digen.profile) and a save time")
        else:
            lines.append(f"  --signal   sbatch --signal=B:USR1@{lead}: ({self.step_s:.0f} s step + {self.save_s:.0f} s "
                         f"save) x {LEAD_FACTOR:g} + {LEAD_MARGIN_S:.0f} s, rounded up to 10 s "
                         "(recipes/slurm/digen.sbatch, docs/cluster.md)")
        if self.grace_s is not None and self.save_s is not None:
            left = self.grace_s - self.save_s
            lines.append(f"  grace      trainer.stop_grace_s={self.grace_s:g}: a SIGTERM "
                         + (f"finishes the step in progress when less than about {left:.0f} s of it is left (the save "
                            "takes the rest), else abandons it and keeps the last checkpoint" if left > 0 else
                            "abandons the step in progress and keeps the last checkpoint (the save alone outlasts "
                            "the grace): stop with the advance warning (SIGUSR1) instead"))
        return "\n".join(lines)


def signal_lead_s(step_s: float | None, save_s: float | None) -> int | None:
    """``(step + save) x LEAD_FACTOR + LEAD_MARGIN_S``, rounded up to 10 s; None when either time is unknown."""
    if step_s is None or save_s is None:
        return None
    return int(math.ceil(((step_s + save_s) * LEAD_FACTOR + LEAD_MARGIN_S) / 10.0) * 10)


def checkpoint_bytes(cfg: RunConfig) -> float | None:
    """Bytes of one checkpoint's ``trainer.pt`` (and export), from the model size; None when it is unknown."""
    from verl_digen.config.memory import model_size, trainable_params

    size = model_size(cfg)
    if size is None:
        return None
    copies = 3 + (cfg.actor.ema_decay is not None) + cfg.trainer.export_on_save  # weights, AdamW's 2 moments
    return copies * trainable_params(cfg, size) * BYTES[master_dtype(cfg)]


def measured_save(cfg: RunConfig) -> tuple[float, float] | None:
    """(seconds, bytes) of the latest checkpoint in ``trainer.default_local_dir`` that recorded its save time."""
    from verl_digen.workers import checkpoint as ckpt

    found = ckpt.latest(cfg.trainer.default_local_dir) if cfg.trainer.default_local_dir else None
    if found is None:
        return None
    try:
        meta = ckpt.read_meta(found)
        began = float(meta["extra"][SAVE_BEGAN_KEY])
        return float(meta["saved_at"]) - began, float(sum(meta["files"].values()))
    except (ckpt.CheckpointError, KeyError, TypeError, ValueError, OSError):
        return None  # an older checkpoint without the figure: the estimate stands


def stop_plan(cfg: RunConfig, step_s: float | None) -> StopPlan:
    """The save time and Slurm lead time of a validated config whose predicted step time is ``step_s``."""
    grace = cfg.trainer.stop_grace_s
    measured = measured_save(cfg)
    if measured is not None:
        save_s, size = measured
        return StopPlan(size, save_s, f"measured: the run's last checkpoint in {cfg.trainer.default_local_dir}",
                        step_s, grace)
    size = checkpoint_bytes(cfg)
    if size is None:
        return StopPlan(None, None, "", step_s, grace)
    return StopPlan(size, size / WRITE_BYTES_PER_S, f"at an assumed {WRITE_BYTES_PER_S / 1e9:g} GB/s, one writer; "
                    "the run's own figure once it has saved", step_s, grace)
