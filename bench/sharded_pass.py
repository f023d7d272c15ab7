"""What sharding adds to one training pass on this host: the tiny model's forward + backward as FSDP2 runs it
over 2 gloo ranks (two processes, like trainer=colocated on the CPU bench) against the same pass unsharded in one
process, at two row sizes. The cost model prices a sharded pass as ``costs.Sharded.per_pass``: the trainer's
collective count times each collective's latency as the runtime's probe measured it, running the same pass sharded
over two of the run's processes (``collective_probe.time_sharded``); this measures it standalone, in processes of
its own, so the two can be set side by side (issue 41: the colocated cross-mode error).

    python bench/sharded_pass.py --json [--arch flux] [--rows 4 16] [--reps 6]   # one JSON object, the last line
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _pass_seconds(model, rows: int, reps: int, sharded: bool) -> float:
    """Median seconds of one forward + backward over ``rows`` rows (2 warm-up passes; ranks start together)."""
    cond = model.encode_prompts(["a photo"] * rows)
    x, sigmas = torch.randn(rows, *model.latent_shape), torch.rand(rows)
    times = []
    for i in range(2 + reps):
        if sharded:
            dist.barrier()
        t0 = time.perf_counter()
        model.velocity(x, sigmas, cond).square().mean().backward()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    torch.set_num_threads(1)
    from verl_digen.models import build_model
    from verl_digen.workers import fsdp

    model = build_model(args.arch, latent_size=args.latent_size, seed=0)
    calls = fsdp.sharded_calls(model.transformer)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        fsdp.shard_transformer(model.transformer, world, torch.device("cpu"))
    out = {r: _pass_seconds(model, r, args.reps, world > 1) for r in args.rows}
    if rank == 0:
        queue.put((out, calls))
    if world > 1:
        dist.destroy_process_group()


def _run(world: int, args: argparse.Namespace) -> tuple[dict[int, float], dict[str, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="flux")
    ap.add_argument("--latent-size", type=int, default=16)
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object on the last line")
    args = ap.parse_args()
    alone, calls = _run(1, args)
    sharded, _ = _run(2, args)
    extra = {r: sharded[r] - alone[r] for r in args.rows}
    for r in args.rows:
        print(f"{r:4d} rows: unsharded {1e3 * alone[r]:7.1f} ms, 2 ranks {1e3 * sharded[r]:7.1f} ms, "
              f"sharding adds {1e3 * extra[r]:6.1f} ms ({1e3 * extra[r] / calls['pass_calls']:.2f} ms per collective, "
              f"{calls['pass_calls']} per pass)")
    if args.json:
        print(json.dumps({"arch": args.arch, "unsharded_s": alone, "sharded_s": sharded, "extra_s": extra,
                          "pass_calls": calls["pass_calls"], "pass_bytes": calls["pass_bytes"]}))


if __name__ == "__main__":
    main()
