"""Run a test's function on two spawned gloo ranks (no Ray) and hand back what rank 0 returned: the
two-rank cases of the model and trainer tests, computed once per module and compared in the test process."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: a collective that waits this long has hung (one rank never joined it): the test fails instead of the suite
#: hanging (gloo's own timeout, and the parent's deadline for both ranks)
TIMEOUT_S = 300.0


def _entry(rank: int, main: Callable[[int, int], Any], init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=TIMEOUT_S))
    result = main(rank, 2)
    if rank == 0:
        torch.save(result, out)
    dist.barrier()
    dist.destroy_process_group()


def run_on_two_ranks(main: Callable[[int, int], Any], workdir: Path, timeout_s: float = TIMEOUT_S) -> Any:
    """``main(rank, world)`` on two processes of one gloo group (a module-level function: spawn pickles it by
    name); returns rank 0's result. Raises ``TimeoutError`` (after ending both) when they are not done within
    ``timeout_s``."""
    init, out = str(workdir / "init"), str(workdir / "out.pt")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.start_processes(_entry, args=(main, init, out), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(10)
            raise TimeoutError(f"two gloo ranks still running after {timeout_s:g} s: a collective hung")
    return torch.load(out, weights_only=False)
