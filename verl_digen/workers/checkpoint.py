"""Trainer checkpoints at global-step boundaries: full (gathered) trainable weights and optimizer
state written by rank 0, every rank's RNG state, the policy version and the driver's own ``extra``
(step counter, data position).

Full state dicts make a checkpoint independent of the trainer pool's size. Every rank reads the
same directory on load, so on a multi-node pool ``path`` must be on a shared filesystem.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

TRAINER_FILE = "trainer.pt"


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def rng_state() -> dict[str, Any]:
    """Every random stream this process may draw from."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainer_path(path: str | Path) -> Path:
    """The checkpoint's trainer file; a clear error when there is none."""
    p = Path(path)
    f = p / TRAINER_FILE
    if not f.is_file():
        what = "does not exist" if not p.exists() else f"has no {TRAINER_FILE}"
        raise FileNotFoundError(f"no trainer checkpoint at {str(p)!r}: the path {what}")
    return f


def write(path: str | Path, rank: int, payload: dict[str, Any] | None) -> None:
    """Rank 0 writes ``payload`` (atomically: a torn file never looks like a checkpoint); every rank
    writes its RNG state."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), p / rng_file(rank))
    if payload is not None:
        tmp = p / (TRAINER_FILE + ".tmp")
        torch.save(payload, tmp)
        tmp.replace(p / TRAINER_FILE)


def read(path: str | Path, rank: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(trainer payload, this rank's RNG state or None when the checkpoint came from a smaller pool)."""
    payload = torch.load(trainer_path(path), map_location="cpu", weights_only=False)
    rng = Path(path) / rng_file(rank)
    return payload, (torch.load(rng, weights_only=False) if rng.is_file() else None)
