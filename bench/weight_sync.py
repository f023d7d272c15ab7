"""Weight sync at size: the collective and object-store backends moving a >= 1 GB state between processes of
this machine, against the limit measured between the same processes in the same run.

    python bench/weight_sync.py --json                  # 1 GiB of float32 in DiT-shaped tensors, 1-4 generators
    python bench/weight_sync.py --gib 0.01 --json       # seconds (the suite's smoke run)

Collective (``workers/sync.py``, the code a run uses): one trainer process stages the version in buckets and
serves pickups; generator processes receive bucket by bucket into their weights, and relay to each other.
Between the trainer and generator 1, before any sync, the same run measures the limit: a raw gloo send of the
same tensors into the receiver's own tensors, a plain loopback TCP stream of the same bytes, and a memcpy of them.
Then, with 1, 2 and 4 generators, every generator picks up the version twice: straight from the trainer one after
another, and in relay waves (the first from the trainer, then every generator that holds it serves one more),
which is what ``WeightSync.sync`` does. Object store: the same state returned by one Ray actor and installed by
another (what ``export_weights`` / ``load_weights`` do), timed from the driver.

Rows (``--json``: one JSON list on the last line), one per backend and generator count: ``gb_per_s`` (one
pickup in steady state: model bytes over the receiver's seconds; ``first_pickup_gb_per_s``: the run's first,
which allocates the staging buffers), ``limit_gb_per_s`` (the loopback stream), ``fraction_of_limit``,
``raw_gloo_gb_per_s``, ``memcpy_gb_per_s``, ``hashed_bytes``, ``host_copy_bytes``, ``staging_peak_bytes`` /
``bucket_bytes``, ``trainer_sent_bytes`` / ``model_bytes`` (relay), ``direct_s`` / ``relay_s`` /
``relay_speedup``, and every generator bit-identical to the trainer (``identical``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import sys
import time
from typing import Any

import torch
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from verl_digen.schedule import ledger  # noqa: E402
from verl_digen.workers.buckets import layout_of, pack_owned, plan_for  # noqa: E402
from verl_digen.workers.sync import Packer, SyncGroup  # noqa: E402


def dit_state(gib: float, seed: int = 0, hidden: int = 2048) -> dict[str, torch.Tensor]:
    """A DiT-shaped float32 state of about ``gib`` GiB: per block q/k/v/out projections (16 MiB each at width
    2048: packed), an MLP of 4x width (64 MiB each: moved in place), biases and norms (``hidden`` shrinks for
    small sizes so that there are always several blocks)."""
    while hidden > 64 and (12 * hidden * hidden * 4) * 4 > gib * 2 ** 30:
        hidden //= 2
    g = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    block = 0
    while sum(t.numel() * 4 for t in state.values()) < gib * 2 ** 30:
        p = f"blocks.{block:03d}."
        for name in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out"):
            state[p + name + ".weight"] = torch.randn(hidden, hidden, generator=g)
            state[p + name + ".bias"] = torch.randn(hidden, generator=g)
        state[p + "ff.up.weight"] = torch.randn(4 * hidden, hidden, generator=g)
        state[p + "ff.down.weight"] = torch.randn(hidden, 4 * hidden, generator=g)
        state[p + "norm.weight"] = torch.randn(hidden, generator=g)
        block += 1
    return state


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _socket_limit(group: SyncGroup, peer: int, send: bool, buf: torch.Tensor) -> float:
    """Seconds to stream ``buf``'s bytes over a plain loopback TCP connection to / from ``peer``."""
    view = memoryview(buf.numpy()).cast("B")
    if send:
        port = int(group.store.get("bench/socket_port").decode())
        with socket.create_connection(("127.0.0.1", port)) as s:
            t0 = time.perf_counter()
            s.sendall(view)
            s.recv(1)
            return time.perf_counter() - t0
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        group.store.set("bench/socket_port", str(srv.getsockname()[1]))
        conn, _ = srv.accept()
        with conn:
            t0, got = time.perf_counter(), 0
            while got < len(view):
                got += conn.recv_into(view[got:], len(view) - got)
            conn.sendall(b"k")
            return time.perf_counter() - t0


def schedule(generators: int, relay: bool) -> list[list[tuple[int, int]]]:
    """Waves of (source rank, destination rank) pickups of one version (rank 0 = the trainer): direct, one
    after another; relay, as ``WeightSync.sync`` runs them (each holder serves one more per wave)."""
    if not relay:
        return [[(0, g)] for g in range(1, generators + 1)]
    holders, waiting, waves = [], list(range(1, generators + 1)), []
    while waiting:
        sources = holders or [0]
        wave = list(zip(sources, waiting[:len(sources)], strict=False))
        waiting = waiting[len(wave):]
        holders += [d for _, d in wave]
        waves.append(wave)
    return waves


def member(rank: int, world: int, port: int, secret: str, gib: float, bucket_bytes: int, counts: list[int],
           out: Any) -> None:
    """One process of the benchmark: rank 0 the trainer, the others generators."""
    torch.set_num_threads(1)
    state = dit_state(gib)  # the trainer's version; generators keep it to check what they receive
    group = SyncGroup("127.0.0.1", port, world, rank, timeout_s=600, secret=secret)
    plan = plan_for(layout_of(state), bucket_bytes, 1)  # one trainer rank: what a relay moves too
    live = {k: torch.zeros_like(v).fill_(0) for k, v in state.items()} if rank else state  # pages touched
    report: dict[str, Any] = {"rank": rank}
    scratch: list[torch.Tensor] = []  # a relay's two buffers, kept between relays (as GeneratorWorker does)
    group.pg.barrier().wait()  # every member built its state: nothing else runs while we time
    if rank == 0:
        t0 = time.perf_counter()
        staged = pack_owned(plan, plan.owned(0, 1), ((n, live[n]) for n, _, _ in plan.layout), "cpu")
        report["stage_s"] = time.perf_counter() - t0
    # 1. the limits between trainer and generator 1, on the same tensors
    flat = torch.cat([t.reshape(-1) for t in state.values()]) if rank in (0, 1) else None
    if rank in (0, 1):
        warm = torch.zeros(1024)  # gloo connects a pair on its first message: not part of the limit
        (group.pg.send if rank == 0 else group.pg.recv)([warm], 1 - rank, 0).wait()
        t0 = time.perf_counter()
        for t in live.values():  # raw gloo, straight into the receiver's tensors
            (group.pg.send if rank == 0 else group.pg.recv)([t], 1 - rank, 0).wait()
        report["raw_gloo_s"] = time.perf_counter() - t0
        report["socket_s"] = _socket_limit(group, 1 - rank, rank == 0,
                                           flat if rank == 0 else torch.empty_like(flat).fill_(0))
        if rank == 1:
            dst = torch.empty_like(flat).fill_(0)
            t0 = time.perf_counter()
            dst.copy_(flat)
            report["memcpy_s"] = time.perf_counter() - t0
            live = {k: torch.zeros_like(v).fill_(0) for k, v in state.items()}
    group.pg.barrier().wait()
    # a run picks up once per step: the first pickup allocates the staging buffers the later ones reuse
    for g in range(1, world):
        if rank == g:
            t1 = time.perf_counter()
            group.receive(0, plan, live, [0])
            report["first_pickup_s"] = time.perf_counter() - t1
        elif rank == 0:
            group.serve(g, 0, plan, lambda k, slot: staged[k])
    group.pg.barrier().wait()
    # 2. pickups with 1..G generators, direct then relayed
    for g in counts:
        for relay in (False, True):
            if rank:
                for t in live.values():
                    t.zero_()
            group.pg.barrier().wait()
            t0 = time.perf_counter()
            sent0 = group.counters["sent"]
            for wave in schedule(g, relay):
                for src, dst in wave:
                    if rank == dst:
                        t1 = time.perf_counter()
                        moved = group.receive(1, plan, live, [src])
                        report[f"{g}/{relay}/pickup_s"] = time.perf_counter() - t1
                        report[f"{g}/{relay}/moved"] = moved
                    elif rank == src == 0:
                        group.serve(dst, 1, plan, lambda k, slot: staged[k])
                    elif rank == src:
                        packer = Packer(live, bucket_bytes, group.device, scratch)
                        scratch = packer.scratch
                        moved = group.serve(dst, 1, packer.plan, packer.bucket)
                        report[f"{g}/{relay}/relay_staging"] = packer.staging_bytes
            report[f"{g}/{relay}/done_at"] = time.perf_counter() - t0
            report[f"{g}/{relay}/sent"] = group.counters["sent"] - sent0
            if 0 < rank <= g:
                report[f"{g}/{relay}/identical"] = all(torch.equal(live[k], state[k]) for k in state)
            group.pg.barrier().wait()
    out.put(report)
    group.pg.barrier().wait()  # rank 0 hosts the store: everyone leaves together


def collective_rows(gib: float, bucket_mb: int, counts: list[int]) -> list[dict[str, Any]]:
    from verl_digen.workers.sync import new_secret

    ctx = mp.get_context("spawn")
    world = 1 + max(counts)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = ctx.Queue()
    bucket_bytes = bucket_mb << 20
    secret = new_secret()  # one for the group, handed to every member (what the driver does through Ray)
    procs = [ctx.Process(target=member, args=(r, world, port, secret, gib, bucket_bytes, counts, out))
             for r in range(world)]
    for p in procs:
        p.start()
    reports: dict[int, dict[str, Any]] = {}
    while len(reports) < world:
        try:
            r = out.get(timeout=5)
            reports[r["rank"]] = r
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError("a benchmark member died (its traceback is above)") from None
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"benchmark member exited with {p.exitcode}")
    model = _nbytes(dit_state(gib))
    gen1, trainer = reports[1], reports[0]
    gb = model / 1e9
    limit = gb / gen1["socket_s"]
    rows = []
    for g in counts:
        pick = gen1[f"{g}/False/pickup_s"]
        moved = gen1[f"{g}/False/moved"]
        direct = max(reports[r][f"{g}/False/done_at"] for r in range(g + 1))
        relayed = max(reports[r][f"{g}/True/done_at"] for r in range(g + 1))
        staging = max([reports[r][f"{g}/{relay}/moved"][ledger.STAGING_PEAK] for r in range(1, g + 1)
                       for relay in (False, True)] + [reports[r].get(f"{g}/True/relay_staging", 0)
                                                      for r in range(1, g + 1)])
        rows.append({
            "backend": "collective", "generators": g, "model_bytes": model, "tensors": len(dit_state(gib)),
            "bucket_bytes": bucket_mb << 20, "gb_per_s": gb / pick, "limit_gb_per_s": limit,
            "fraction_of_limit": gb / pick / limit, "raw_gloo_gb_per_s": gb / gen1["raw_gloo_s"],
            "first_pickup_gb_per_s": gb / gen1["first_pickup_s"],
            "fraction_of_raw_gloo": gen1["raw_gloo_s"] / pick, "memcpy_gb_per_s": gb / gen1["memcpy_s"],
            "stage_s": trainer["stage_s"],
            "hashed_bytes": moved.get(ledger.HASHED, 0), "host_copy_bytes": moved.get(ledger.HOST_COPIES, 0),
            "staging_peak_bytes": staging, "staging_buckets": staging / (bucket_mb << 20),
            "trainer_sent_bytes_direct": trainer[f"{g}/False/sent"], "trainer_sent_bytes": trainer[f"{g}/True/sent"],
            "trainer_sent_over_model": trainer[f"{g}/True/sent"] / model,
            "direct_s": direct, "relay_s": relayed, "relay_speedup": direct / relayed,
            "identical": all(reports[r][f"{g}/{relay}/identical"] for r in range(1, g + 1) for relay in (False, True)),
        })
    return rows


def object_store_row(gib: float) -> dict[str, Any]:
    """The object-store backend's path: an actor returns the state (export_weights), another installs it."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote
        class Holder:
            def __init__(self, gib: float, zeros: bool) -> None:
                torch.set_num_threads(1)
                self.state = dit_state(gib)
                if zeros:
                    self.state = {k: torch.zeros_like(v) for k, v in self.state.items()}

            def export(self) -> dict[str, torch.Tensor]:
                return self.state

            def load(self, state: dict[str, torch.Tensor]) -> bool:
                for k, v in state.items():
                    self.state[k].copy_(v)
                want = dit_state(gib)
                return all(torch.equal(self.state[k], want[k]) for k in want)

        trainer, generator = Holder.remote(gib, False), Holder.remote(gib, True)
        ray.get([trainer.export.remote(), generator.load.remote({})])  # both built
        t0 = time.perf_counter()
        ok = ray.get(generator.load.remote(trainer.export.remote()))
        seconds = time.perf_counter() - t0
    finally:
        ray.shutdown()
    model = _nbytes(dit_state(gib))
    moved = ledger.pickup_ledger(model, "object_store", inter_node=False, on_gpu=False)
    return {"backend": "object_store", "generators": 1, "model_bytes": model, "gb_per_s": model / 1e9 / seconds,
            "pickup_s": seconds, "hashed_bytes": moved.get(ledger.HASHED, 0),
            "host_copy_bytes": moved.get(ledger.HOST_COPIES, 0), "serialized_bytes": moved.get(ledger.SERIALIZED, 0),
            "identical": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="state size in GiB (float32)")
    ap.add_argument("--bucket-mb", type=int, default=256, help="collective bucket size in MiB")
    ap.add_argument("--generators", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--no-object-store", action="store_true", help="skip the Ray object-store row")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = collective_rows(args.gib, args.bucket_mb, sorted(set(args.generators)))
    if not args.no_object_store:
        rows.append(object_store_row(args.gib))
    for r in rows:
        if r["backend"] == "collective":
            print(f"collective, {r['generators']} generator(s): pickup {r['gb_per_s']:.2f} GB/s = "
                  f"{r['fraction_of_limit']:.2f} of the loopback limit ({r['limit_gb_per_s']:.2f} GB/s; raw gloo "
                  f"{r['raw_gloo_gb_per_s']:.2f}, memcpy {r['memcpy_gb_per_s']:.2f}); hashed {r['hashed_bytes']} B, "
                  f"host copies {r['host_copy_bytes']} B, staging {r['staging_buckets']:.2f} bucket(s); trainer sent "
                  f"{r['trainer_sent_over_model']:.2f} x the model with relays; everyone served: direct "
                  f"{r['direct_s']:.2f} s, relay {r['relay_s']:.2f} s ({r['relay_speedup']:.2f}x); "
                  f"identical: {r['identical']}")
        else:
            print(f"object store: pickup {r['gb_per_s']:.2f} GB/s ({r['pickup_s']:.2f} s); serialized "
                  f"{r['serialized_bytes']} B, host copies {r['host_copy_bytes']} B; identical: {r['identical']}")
    print(f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
