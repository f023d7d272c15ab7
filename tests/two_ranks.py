"""Run a test's function on two spawned gloo ranks (no Ray) and hand back what rank 0 returned: the
two-rank cases of the model and trainer tests, computed once per module and compared in the test process."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, main: Callable[[int, int], Any], init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    result = main(rank, 2)
    if rank == 0:
        torch.save(result, out)
    dist.barrier()
    dist.destroy_process_group()


def run_on_two_ranks(main: Callable[[int, int], Any], workdir: Path) -> Any:
    """``main(rank, world)`` on two processes of one gloo group (a module-level function: spawn pickles it by
    name); returns rank 0's result."""
    init, out = str(workdir / "init"), str(workdir / "out.pt")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_entry, args=(main, init, out), nprocs=2, join=True)
    return torch.load(out, weights_only=False)
