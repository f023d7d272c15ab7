"""Versioned trainer -> generator weight sync: Ray's object store or a cross-pool collective.

Two backends move the same thing (the whole transformer state, or only the LoRA adapters):

- ``object_store``: trainer rank 0 returns its gathered weights from ``export_weights`` as a Ray object;
  every generator's ``load_weights(version, ref)`` resolves that one reference (Ray ships the object
  between nodes; the driver never materializes it).
- ``collective``: verl gives every worker group its own MASTER_ADDR/PORT, so no process group spans
  two pools. ``SyncGroup`` builds one explicitly (``TCPStore`` + ``ProcessGroupGloo``, or
  ``ProcessGroupNCCL`` on GPU) over trainer rank 0 (group rank 0) and every generator (ranks 1..G),
  and broadcasts each tensor in sorted-name order after a checked header (version, count, layout hash).

``WeightSync`` is the driver-side helper the trainer loop calls: ``setup`` once, ``sync(version)`` after
every optimizer step; it returns the measured seconds (``launch`` is the non-blocking form for an
event loop that waits on the returned refs itself).
"""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist

BACKENDS = ("object_store", "collective")


def layout_hash(state: dict[str, torch.Tensor]) -> int:
    """A 63-bit hash of the (name, dtype, shape) layout: both ends must agree before any bytes move."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)};".encode())
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)


class SyncGroup:
    """One member of the explicit cross-pool process group (rank 0 = trainer rank 0 = the source)."""

    def __init__(self, host: str, port: int, world: int, rank: int, backend: str = "gloo",
                 timeout_s: float = 300.0) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"sync-group rank {rank} out of range for world {world}")
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world, self.backend = rank, world, backend
        self.store = dist.TCPStore(host, int(port), world, is_master=(rank == 0), timeout=timeout)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(self.store, rank, world, timeout)
            self.device = torch.device("cpu")
        elif backend == "nccl":
            from torch._C._distributed_c10d import ProcessGroupNCCL

            self.pg = ProcessGroupNCCL(self.store, rank, world)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"unknown sync backend {backend!r}; expected 'gloo' or 'nccl'")

    def _broadcast(self, t: torch.Tensor) -> None:
        self.pg.broadcast(t, 0).wait()

    def _agree(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.pg.allreduce([flag], opts).wait()
        return bool(flag.item())

    def _header(self, version: int, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor([version, len(state), layout_hash(state)], dtype=torch.int64, device=self.device)

    def send(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Broadcast ``state`` (rank 0 only) after the receivers agreed on version and layout."""
        if self.rank != 0:
            raise RuntimeError("only sync-group rank 0 (trainer rank 0) sends weights")
        self._broadcast(self._header(version, state))
        if not self._agree(True):
            raise RuntimeError(f"weight sync of version {version} refused by a generator (layout or version mismatch)")
        for name in sorted(state):
            t = state[name].detach().to(self.device).contiguous()
            self._broadcast(t)

    def recv(self, version: int, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Receive the tensors named and shaped like ``template`` (this worker's own weights)."""
        if self.rank == 0:
            raise RuntimeError("sync-group rank 0 is the sender")
        header = self._header(-1, {})
        self._broadcast(header)
        mine = self._header(version, template)
        ok = bool(torch.equal(header, mine))
        if not self._agree(ok):
            v, n, lh = header.tolist()
            raise RuntimeError(
                f"weight sync mismatch: trainer sends version {v} ({n} tensors, layout {lh:x}); this generator "
                f"expects version {version} ({len(template)} tensors, layout {layout_hash(template):x})"
                if not ok else "weight sync refused by another generator"
            )
        out = {}
        for name in sorted(template):
            ref = template[name]
            buf = torch.empty(ref.shape, dtype=ref.dtype, device=self.device)
            self._broadcast(buf)
            out[name] = buf.to("cpu")
        return out


def _handles(wg: Any) -> list:
    return list(wg.workers) if hasattr(wg, "workers") else list(wg)


class WeightSync:
    """Driver-side trainer -> generator weight sync; ``sync`` returns seconds taken.

    ``trainer_wg`` / ``generator_wg`` are verl ``RayWorkerGroup``s (or lists of actor handles) of
    ``TSPActorWorker``/``HybridWorker`` and ``GeneratorWorker``. Every trainer rank takes part in
    gathering the (possibly sharded) weights; only trainer rank 0 sends.
    """

    def __init__(self, backend: str = "object_store", timeout_s: float = 300.0) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown sync backend {backend!r}; expected one of {BACKENDS}")
        self.backend = backend
        self.timeout_s = timeout_s
        self.trainers: list = []
        self.generators: list = []
        self.history: list[float] = []

    def setup(self, trainer_wg: Any, generator_wg: Any, device: str = "cpu") -> None:
        """Remember the workers; for ``collective``, build the cross-pool group (gloo, or nccl when
        ``device == 'cuda'``) with trainer rank 0's node as the store host."""
        self.trainers, self.generators = _handles(trainer_wg), _handles(generator_wg)
        if not self.trainers or not self.generators:
            raise ValueError("weight sync needs at least one trainer and one generator worker")
        if self.backend != "collective":
            return
        host, port = ray.get(self.trainers[0].get_available_master_addr_port.remote())
        world = 1 + len(self.generators)
        backend = "nccl" if device == "cuda" else "gloo"
        calls = [self.trainers[0].join_sync_group.remote(host, int(port), world, 0, backend, self.timeout_s)]
        calls += [
            g.join_sync_group.remote(host, int(port), world, i + 1, backend, self.timeout_s)
            for i, g in enumerate(self.generators)
        ]
        ray.get(calls, timeout=self.timeout_s)

    def launch(self, version: int) -> list[ray.ObjectRef]:
        """Start moving ``version`` to every generator without waiting: the refs of every call taking
        part (trainer ranks and generators); the sync is done when all of them are."""
        if not self.trainers:
            raise RuntimeError("WeightSync.setup must be called before sync")
        if self.backend == "object_store":
            refs = [w.export_weights.remote(version) for w in self.trainers]
            return [g.load_weights.remote(version, refs[0]) for g in self.generators] + refs[1:]
        sends = [w.send_weights.remote(version) for w in self.trainers]
        return sends + [g.recv_weights.remote(version) for g in self.generators]

    def sync(self, version: int) -> float:
        """Move the trainer's weights of ``version`` to every generator; returns wall seconds."""
        t0 = time.perf_counter()
        ray.get(self.launch(version), timeout=self.timeout_s)
        seconds = time.perf_counter() - t0
        self.history.append(seconds)
        return seconds
