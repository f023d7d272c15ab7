"""The after-run probe's collective: how long an all-gather between two processes of the run takes, so a profile
measured on one unsharded trainer rank can price what sharding the trainer adds (``costs.Sharded``). Both ends
call :func:`time_all_gather` at once; the group is its own (a store on rank 0's address, gloo) and is gone after."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from verl_digen.workers.sync import _gloo_group, _local_address, bind_listener


def _store(host: str, port: int, world: int, timeout: timedelta, listener: Any) -> dist.TCPStore:
    """The probe group's store: rank 0 serves it on the socket it bound (``listener``), the others join."""
    if listener is not None:
        return dist.TCPStore(host, int(port), world, is_master=True, timeout=timeout,
                             master_listen_fd=listener.fileno())
    return dist.TCPStore(host, int(port), world, is_master=False, timeout=timeout)


def time_all_gather(host: str, port: int, rank: int, world: int, numels: list[int], reps: int = 20,
                    timeout_s: float = 60.0) -> list[tuple[int, float]]:
    """Per size: (bytes gathered, median seconds) of an all-gather of ``numel`` float32 elements per rank over
    a gloo group of ``world`` processes of its own, after 3 warm-up calls (the gather FSDP2 runs on CPU ranks)."""
    timeout = timedelta(seconds=timeout_s)
    listener = bind_listener(host, int(port)) if rank == 0 else None
    try:
        store = _store(host, port, world, timeout, listener)
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


#: what :func:`time_sharded` times, each sharded as the trainer shards (``fsdp.shard_transformer``) against the same
#: work on an unsharded copy: a training pass (forward + backward), the optimizer step (gradient-norm clip, the
#: ranks' skip verdict, AdamW) and the switch to generation as the runtime's makes it (:func:`switch_out`)
TIMED_WORK = ("pass", "switch", "step")


def _trained(transformer: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in transformer.named_parameters() if p.requires_grad]


def switch_out(transformer: torch.nn.Module, gen: torch.nn.Module, optimizer: torch.optim.Optimizer,
               into: Any, sharded: bool) -> None:
    """The switch to generation of a CPU trainer rank (``HybridWorker.switch_to_gen``): its gradients and optimizer
    state moved into the stash ``into`` (``switch.stash``: on a sharded rank one copy per DTensor shard, with
    DTensor dispatch), then, ``sharded``, the full weights gathered into the generation copy ``gen``
    (``fsdp.copy_full_state``; an unsharded rank generates with its own weights). :func:`switch_back` undoes it."""
    from verl_digen.workers import fsdp, switch

    switch.stash(_trained(transformer), optimizer, torch.device("cpu"), into)
    if sharded:
        fsdp.copy_full_state(transformer, gen)


def switch_back(transformer: torch.nn.Module, optimizer: torch.optim.Optimizer, stashed: Any) -> None:
    """The training state :func:`switch_out` stashed, put back (``switch.restore``; not timed: the probe prices the
    switch to generation, the way back is the run's own ``switch_to_train``)."""
    from verl_digen.workers import switch

    switch.restore(_trained(transformer), optimizer, torch.device("cpu"), stashed)


def time_sharded(cfg: Any, host: str, port: int, rank: int, world: int, rows: list[int], reps: int = 9,
                 timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """What sharding the trainer adds, timed on this process and ``world - 1`` others of the run (all call it at
    once): fresh copies of the policy (``policy.build_policy``), one sharded over a gloo group of these processes
    (the process's default group for the call, as FSDP2 needs one; gone after), one not. Per item of
    :data:`TIMED_WORK` (the pass at each size of ``rows``, rows per rank; the step and the switch in a run's
    order, :func:`_time_sharded`), the median seconds of ``reps`` runs after two warm-ups: ``alone`` (the
    unsharded work on rank 0, the others idle), ``plain`` (the unsharded work on every process at once: the host
    shared as a sharded run shares it) and ``sharded`` (the sharded work on every process at once, its
    collectives included). Rank 0's figures; ``[]`` on the others, where this process already has a default group
    (a sharded trainer, whose own costs hold its collectives), and where the group does not form within
    ``timeout_s`` (a peer that had one)."""
    from verl_digen.workers import fsdp
    from verl_digen.workers import policy as P

    if dist.is_initialized():
        return []
    timeout = timedelta(seconds=timeout_s)
    listener = bind_listener(host, int(port)) if rank == 0 else None
    try:
        store = _store(host, port, world, timeout, listener)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    except RuntimeError:  # no group (a DistError is one): the profile keeps the bare all-gather's latency
        if listener is not None:
            listener.close()
        return []
    try:
        try:
            return _time_sharded(cfg, rank, world, rows, reps, fsdp, P)
        finally:
            dist.destroy_process_group()
    finally:
        if listener is not None:
            listener.close()


def interleaved(variants: list[tuple[str, Callable[[], dict[str, float]]]], reps: int,
                warmup: int = 2) -> dict[str, dict[str, float]]:
    """Per timed work, per variant (name, a call that runs it once and returns the seconds of each work it timed),
    the median of ``reps`` runs after ``warmup``, the variants taking turns (one run of each per round): a load on
    the host that comes and goes over seconds (other jobs) falls on all of them alike, so their differences (what
    sharding adds) are not the drift."""
    times: dict[str, dict[str, list[float]]] = {}
    for i in range(warmup + reps):
        for name, run in variants:
            for work, seconds in run().items():
                if i >= warmup:
                    times.setdefault(work, {}).setdefault(name, []).append(seconds)
    return {work: {name: statistics.median(ts) for name, ts in by.items()} for work, by in times.items()}


#: a part of one timed run (:func:`_time_sharded`): the name its seconds are kept under (``None``: untimed) and the
#: work, called with the model it runs on
Part = tuple[str | None, Callable[[Any], None]]


def _time_sharded(cfg: Any, rank: int, world: int, rows: list[int], reps: int, fsdp: Any,
                  P: Any) -> list[dict[str, Any]]:
    """:func:`time_sharded` on a formed group. The pass is timed on its own at each size. The optimizer step and
    the switch are timed the way a colocated run reaches them, each once a round: sampling steps on the generation
    weights, the training state put back (the run's ``switch_to_train``), a training pass, the step, then the
    switch, so neither starts from the state its own previous run left (timed back to back, the sharded switch sat
    at the fast end of a run's)."""
    from verl_digen.workers import switch

    cpu = torch.device("cpu")
    plain, sharded, gen = (P.build_policy(cfg, cpu) for _ in range(3))
    fsdp.shard_transformer(sharded.transformer, world, cpu)
    optims = {id(m): torch.optim.AdamW([p for p in m.transformer.parameters() if p.requires_grad], lr=1e-6)
              for m in (plain, sharded)}

    def once(m: Any, active: bool, parts: list[Part]) -> dict[str, float]:
        """``parts`` in order on ``m`` (``active``: this rank works, else it only meets the others at each
        barrier): the seconds of each named part, every rank starting each part together."""
        seconds = {}
        for name, work in parts:
            dist.barrier()
            t0 = time.perf_counter()
            if active:
                work(m)
            if name is not None:
                seconds[name] = time.perf_counter() - t0
        dist.barrier()
        return seconds

    def three(parts: list[Part]) -> dict[str, dict[str, float]]:
        """(alone, plain, sharded): ``parts`` on the unsharded copy on rank 0 alone, on every rank, sharded,
        interleaved (:func:`interleaved`)."""
        return interleaved([("alone", lambda: once(plain, rank == 0, parts)),
                            ("plain", lambda: once(plain, True, parts)),
                            ("sharded", lambda: once(sharded, True, parts))], reps)

    passes = {}
    for r in rows:
        cond = plain.encode_prompts(["a probe"] * r)
        g = torch.Generator().manual_seed(r)
        x, sigmas = torch.randn(r, *plain.latent_shape, generator=g), torch.rand(r, generator=g)

        def one_pass(m: Any, x: torch.Tensor = x, sigmas: torch.Tensor = sigmas, cond: Any = cond) -> None:
            m.transformer.zero_grad(set_to_none=False)
            m.velocity(x, sigmas, cond).square().mean().backward()

        passes[r] = one_pass
    out = [{"work": "pass", "size": r, **three([("pass", passes[r])])["pass"]} for r in rows]

    def step(m: Any) -> None:  # as the trainer's optimizer_step: clip, agree on a skip (sharded), AdamW
        params = [p for p in m.transformer.parameters() if p.requires_grad]
        fsdp.clip_grad_norm(params, 1.0, cpu)
        if m is sharded:
            flag = torch.zeros(1)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        optims[id(m)].step()

    stashes = {id(m): switch.TrainingStash() for m in (plain, sharded)}

    noise, prompts = torch.randn(rows[0], *plain.latent_shape), plain.encode_prompts(["a probe"] * rows[0])

    @torch.no_grad()
    def generate(m: Any) -> None:  # what a colocated rank runs between its switches: sampling steps on its weights
        for sigma in torch.linspace(1.0, 0.1, 8):
            (gen if m is sharded else m).velocity(noise, sigma.expand(rows[0]), prompts)

    def to_train(m: Any) -> None:  # the previous round's switch undone, where this rank made one
        if stashes[id(m)]:
            switch_back(m.transformer, optims[id(m)], stashes[id(m)])

    def to_gen(m: Any) -> None:
        switch_out(m.transformer, gen.transformer, optims[id(m)], stashes[id(m)], m is sharded)

    cycle = three([(None, generate), (None, to_train), (None, passes[rows[0]]), ("step", step), ("switch", to_gen)])
    out += [{"work": "step", **cycle["step"]}, {"work": "switch", **cycle["switch"]}]
    return out if rank == 0 else []
