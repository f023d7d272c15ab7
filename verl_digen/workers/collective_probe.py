"""The after-run probe's collective: how long an all-gather between two processes of the run takes, so a profile
measured on one unsharded trainer rank can price what sharding the trainer adds (``costs.Sharded``). Both ends
call :func:`time_all_gather` at once; the group is its own (a store on rank 0's address, gloo) and is gone after."""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from verl_digen.workers.sync import _gloo_group, _local_address, bind_listener


def time_all_gather(host: str, port: int, rank: int, world: int, numels: list[int], reps: int = 20,
                    timeout_s: float = 60.0) -> list[tuple[int, float]]:
    """Per size: (bytes gathered, median seconds) of an all-gather of ``numel`` float32 elements per rank over
    a gloo group of ``world`` processes of its own, after 3 warm-up calls (the gather FSDP2 runs on CPU ranks)."""
    timeout = timedelta(seconds=timeout_s)
    listener = bind_listener(host, int(port)) if rank == 0 else None
    try:
        if listener is not None:
            store = dist.TCPStore(host, int(port), world, is_master=True, timeout=timeout,
                                  master_listen_fd=listener.fileno())
        else:
            store = dist.TCPStore(host, int(port), world, is_master=False, timeout=timeout)
        pg = _gloo_group(store, rank, world, timeout, host if rank == 0 else _local_address(host))
        out = []
        for n in numels:
            x = torch.zeros(n)
            parts = [torch.empty(n) for _ in range(world)]
            times = []
            for i in range(3 + reps):
                t0 = time.perf_counter()
                pg.allgather([parts], [x]).wait()
                if i >= 3:
                    times.append(time.perf_counter() - t0)
            out.append((4 * n * world, statistics.median(times)))
        return out
    finally:
        if listener is not None:
            listener.close()
