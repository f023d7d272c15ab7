"""Versioned trainer -> generator weight sync: publish once, every generator picks up on its own.

After the optimizer step the trainer *publishes* the new version once (every rank takes part in
gathering the possibly sharded weights; rank 0 keeps them). Each generator then *picks it up* at its
own next trajectory boundary; nobody waits for anybody to drain, and the trainer goes on training.
Two backends move the same thing (the whole transformer state, or only the LoRA adapters):

- ``object_store``: publishing puts trainer rank 0's gathered weights in Ray's object store (the
  return value of ``export_weights``); a pickup is ``load_weights(version, ref)`` on that generator,
  which fetches the one object (Ray ships it between nodes; the driver never materializes it).
- ``collective``: verl gives every worker group its own MASTER_ADDR/PORT, so no process group spans
  two pools. ``SyncGroup`` builds one explicitly (``TCPStore`` + ``ProcessGroupGloo``, or
  ``ProcessGroupNCCL`` on GPU) over trainer rank 0 (group rank 0) and every generator (ranks 1..G).
  Publishing stages the gathered weights on trainer rank 0; a pickup is a point-to-point transfer to
  that one generator (a checked header, an acknowledgement, then each tensor in sorted-name order).
  The store has no authentication of its own, so the driver makes a per-run secret and hands it only
  to the group's members, through their Ray actors: the header carries the run's group id, and the
  transfer ends with a MAC (HMAC-SHA256 with that secret over the version, the layout and a SHA-256
  of the payload). A generator installs nothing whose MAC does not verify, and says so.
  Trainer rank 0 serves it from a second actor thread (the trainer actors get ``max_concurrency=2``),
  so training is not interrupted. gloo runs send/recv from any thread; NCCL point-to-point calls run
  on the communicator's own stream and are serialized per peer pair (one pickup at a time per
  generator, which the scheduler guarantees). Receiving straight into the generator's live weights
  is not done: the generator receives into a staging dict and swaps when the transfer is complete.

``WeightSync`` is the driver-side helper: ``setup`` once; ``publish(version)`` and
``pickup(index, version)`` return the refs of the calls taking part (the runtime's event loop waits
on them); ``sync(version)`` is publish + every pickup, blocking (resume, tests). It delegates to the
:class:`SyncBackend` registered under ``digen.sync.backend``: backends register with
:func:`register_sync_backend` (as verl's ``core_algos`` registers advantage estimators), so a new
backend is one file (a ``SyncBackend`` subclass under the decorator), accepted by the config once that
file is imported. What the rest of the runtime needs to know about a backend is on its class
(``restartable``, ``publish_returns_weights``, ``trainer_threads``), not in checks of its name.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist

from verl_digen.registry import Registry

#: ``digen.sync.backend`` name -> backend class (a :class:`verl_digen.registry.Registry`)
SYNC_BACKENDS: Registry[type[SyncBackend]] = Registry("sync backend")


def register_sync_backend(name: str) -> Callable[[type[SyncBackend]], type[SyncBackend]]:
    """Class decorator: make ``name`` a ``digen.sync.backend`` value. A second, different class under
    a taken name raises (re-importing the same module does not)."""
    if not name or not name.replace("_", "").isalnum() or name != name.lower():
        raise ValueError(f"sync backend name {name!r} must be lower-case letters, digits and '_'")

    def deco(cls: type[SyncBackend]) -> type[SyncBackend]:
        SYNC_BACKENDS.register(name, cls)
        cls.name = name
        return cls

    return deco


def unregister_sync_backend(name: str) -> None:
    """Remove ``name`` from the registry (tests, plugins that replace a backend)."""
    SYNC_BACKENDS.unregister(name)


def sync_backend_names() -> tuple[str, ...]:
    """The registered backend names, sorted."""
    return tuple(sorted(SYNC_BACKENDS))


def sync_backend(name: str) -> type[SyncBackend]:
    """The backend class registered under ``name``; a ValueError names it and lists the registered ones."""
    return SYNC_BACKENDS.lookup(name)


def layout_hash(state: dict[str, torch.Tensor]) -> int:
    """A 63-bit hash of the (name, dtype, shape) layout: both ends must agree before any bytes move."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)};".encode())
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)


def new_secret() -> str:
    """A run's weight-sync secret (hex), made by the driver and sent only to the group's members."""
    return secrets.token_hex(32)


def group_id(secret: str) -> int:
    """The run's group id (in every header; not secret): a transfer from another run is refused early."""
    return int.from_bytes(hashlib.sha256(b"digen-sync|" + bytes.fromhex(secret)).digest()[:8], "little") >> 1


def payload_digest(state: dict[str, torch.Tensor]) -> bytes:
    """SHA-256 over every tensor's bytes in sorted-name order (the MAC's message)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous().reshape(-1)
        h.update(name.encode() + b"\0")
        h.update(t.view(torch.uint8).numpy())
    return h.digest()


class SyncGroup:
    """One member of the explicit cross-pool process group (rank 0 = trainer rank 0 = the source).
    ``secret`` (hex, from :func:`new_secret`) is the run's: only a sender holding it gets a transfer
    installed."""

    def __init__(self, host: str, port: int, world: int, rank: int, backend: str = "gloo",
                 timeout_s: float = 300.0, *, secret: str) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"sync-group rank {rank} out of range for world {world}")
        if len(secret) < 32:
            raise ValueError("the weight-sync group needs the run's secret (new_secret())")
        self._key = bytes.fromhex(secret)
        self.group_id = group_id(secret)
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world, self.backend = rank, world, backend
        self._listener: socket.socket | None = None
        if rank == 0:
            # the store listens on the pool's address only (TCPStore alone would bind every interface)
            self._listener = bind_listener(host, int(port))
            self.store = dist.TCPStore(host, int(port), world, is_master=True, timeout=timeout,
                                       master_listen_fd=self._listener.fileno())
        else:
            self.store = dist.TCPStore(host, int(port), world, is_master=False, timeout=timeout)
        if backend == "gloo":
            self.pg = _gloo_group(self.store, rank, world, timeout, host if rank == 0 else _local_address(host))
            self.device = torch.device("cpu")
        elif backend == "nccl":
            from torch._C._distributed_c10d import ProcessGroupNCCL

            self.pg = ProcessGroupNCCL(self.store, rank, world)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"unknown sync backend {backend!r}; expected 'gloo' or 'nccl'")

    def _header(self, version: int, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.tensor([self.group_id, version, len(state), layout_hash(state)], dtype=torch.int64,
                            device=self.device)

    def _mac(self, version: int, state: dict[str, torch.Tensor]) -> torch.Tensor:
        msg = struct.pack("<qqq", self.group_id, version, layout_hash(state)) + payload_digest(state)
        mac = hmac.new(self._key, msg, hashlib.sha256).digest()
        return torch.frombuffer(bytearray(mac), dtype=torch.int64).to(self.device)

    def _send(self, t: torch.Tensor, peer: int) -> None:
        self.pg.send([t], peer, 0).wait()

    def _recv(self, t: torch.Tensor, peer: int) -> None:
        self.pg.recv([t], peer, 0).wait()

    def send(self, dst: int, version: int, state: dict[str, torch.Tensor]) -> None:
        """Send ``state`` to group rank ``dst`` (rank 0 only) once the receiver accepted the header."""
        if self.rank != 0:
            raise RuntimeError("only sync-group rank 0 (trainer rank 0) sends weights")
        if not 0 < dst < self.world:
            raise ValueError(f"weight-sync destination {dst} out of range 1..{self.world - 1}")
        self._send(self._header(version, state), dst)
        ack = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._recv(ack, dst)
        if not int(ack.item()):
            raise RuntimeError(f"weight sync of version {version} refused by sync rank {dst} "
                               "(layout or version mismatch)")
        for name in sorted(state):
            self._send(state[name].detach().to(self.device).contiguous(), dst)
        self._send(self._mac(version, state), dst)

    def recv(self, version: int, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Receive the tensors named and shaped like ``template`` (this worker's own weights) into a
        staging dict (the caller swaps them in)."""
        if self.rank == 0:
            raise RuntimeError("sync-group rank 0 is the sender")
        header = self._header(-1, {})
        self._recv(header, 0)
        ok = bool(torch.equal(header, self._header(version, template)))
        self._send(torch.tensor([1 if ok else 0], dtype=torch.int64, device=self.device), 0)
        if not ok:
            gid, v, n, lh = header.tolist()
            if gid != self.group_id:
                raise RuntimeError(f"weight sync of version {version} refused: the sender is not of this run "
                                   f"(group id {gid:x}, expected {self.group_id:x}); nothing was loaded")
            raise RuntimeError(
                f"weight sync mismatch: trainer sends version {v} ({n} tensors, layout {lh:x}); this generator "
                f"expects version {version} ({len(template)} tensors, layout {layout_hash(template):x})")
        out = {}
        for name in sorted(template):
            ref = template[name]
            buf = torch.empty(ref.shape, dtype=ref.dtype, device=self.device)
            self._recv(buf, 0)
            out[name] = buf.to("cpu")
        mac = torch.zeros(4, dtype=torch.int64, device=self.device)
        self._recv(mac, 0)
        if not hmac.compare_digest(mac.cpu().numpy().tobytes(), self._mac(version, out).cpu().numpy().tobytes()):
            raise RuntimeError(f"weight sync of version {version} refused: its MAC does not verify (the sender "
                               "does not hold this run's secret, or the payload changed); nothing was loaded")
        return out


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` only (handed to ``TCPStore`` as its listen fd)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def _local_address(peer: str) -> str:
    """This node's address on the route to ``peer`` (what gloo binds its own sockets to)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in peer else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))  # no packet is sent: this only picks the outgoing interface
            return s.getsockname()[0]
    except OSError:
        return peer


def _gloo_group(store: Any, rank: int, world: int, timeout: timedelta, host: str) -> Any:
    """A gloo group whose sockets bind to ``host`` (gloo's default device binds the hostname's
    address); falls back to the default device where this torch lacks the options API."""
    try:
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        opts._timeout = timeout
        return dist.ProcessGroupGloo(store, rank, world, opts)
    except (AttributeError, RuntimeError, TypeError):
        return dist.ProcessGroupGloo(store, rank, world, timeout)


def _handles(wg: Any) -> list:
    return list(wg.workers) if hasattr(wg, "workers") else list(wg)


class SyncBackend:
    """Driver side of one way to move a published version to the generators.

    ``setup`` runs once with the actor handles; ``publish`` starts every trainer rank's part of
    publishing ``version`` (the refs of the calls; the first is trainer rank 0's); ``pickup`` starts
    one generator's install of it (``published`` is that first publish ref). Worker-side methods it
    may call: trainers ``export_weights`` / ``stage_weights`` / ``send_weights_to`` /
    ``join_sync_group``, generators ``load_weights`` / ``recv_weights`` / ``join_sync_group``.
    """

    name: str = ""
    # a restarted generator actor can pick up again (no group membership to rebuild), so generator
    # restarts (trainer.generator_max_restarts) may be on
    restartable: bool = False
    # publish's first ref is the weights themselves: the driver never fetches it, and a restarted
    # generator's restore may reload from it
    publish_returns_weights: bool = False
    # concurrent calls each trainer actor serves (2: rank 0 answers pickups while it trains)
    trainer_threads: int = 1

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s

    def setup(self, trainers: list, generators: list, device: str = "cpu") -> None:
        """Prepare the transport once (nothing by default)."""

    def publish(self, trainers: list, version: int) -> list[ray.ObjectRef]:
        raise NotImplementedError

    def pickup(self, trainers: list, generator: Any, index: int, version: int,
               published: ray.ObjectRef) -> list[ray.ObjectRef]:
        raise NotImplementedError


@register_sync_backend("object_store")
class ObjectStoreSync(SyncBackend):
    """Trainer rank 0's gathered weights are its ``export_weights`` return value in Ray's object
    store; a pickup hands that one object to ``load_weights`` (Ray ships it between nodes)."""

    restartable = True
    publish_returns_weights = True

    def publish(self, trainers: list, version: int) -> list[ray.ObjectRef]:
        return [w.export_weights.remote(version) for w in trainers]

    def pickup(self, trainers: list, generator: Any, index: int, version: int,
               published: ray.ObjectRef) -> list[ray.ObjectRef]:
        return [generator.load_weights.remote(version, published)]


@register_sync_backend("collective")
class CollectiveSync(SyncBackend):
    """Point-to-point over an explicit trainer-rank-0 + generators group (:class:`SyncGroup`: gloo,
    or nccl when ``device == 'cuda'``), store hosted on trainer rank 0's node. Rank 0 serves pickups
    from a second actor thread; a restarted generator cannot rejoin the group."""

    trainer_threads = 2

    def setup(self, trainers: list, generators: list, device: str = "cpu") -> None:
        host, port = ray.get(trainers[0].get_available_master_addr_port.remote())
        world = 1 + len(generators)
        backend = "nccl" if device == "cuda" else "gloo"
        secret = new_secret()  # this run's: only through the members' Ray actors (token-authenticated)
        calls = [trainers[0].join_sync_group.remote(host, int(port), world, 0, backend, self.timeout_s, secret)]
        calls += [
            g.join_sync_group.remote(host, int(port), world, i + 1, backend, self.timeout_s, secret)
            for i, g in enumerate(generators)
        ]
        ray.get(calls, timeout=self.timeout_s)

    def publish(self, trainers: list, version: int) -> list[ray.ObjectRef]:
        return [w.stage_weights.remote(version) for w in trainers]

    def pickup(self, trainers: list, generator: Any, index: int, version: int,
               published: ray.ObjectRef) -> list[ray.ObjectRef]:
        return [trainers[0].send_weights_to.remote(index + 1, version), generator.recv_weights.remote(version)]


class WeightSync:
    """Driver-side trainer -> generator weight sync; ``sync`` returns seconds taken.

    ``trainer_wg`` / ``generator_wg`` are verl ``RayWorkerGroup``s (or lists of actor handles) of
    ``TSPActorWorker``/``HybridWorker`` and ``GeneratorWorker``. Every trainer rank takes part in
    gathering the (possibly sharded) weights; only trainer rank 0 sends. ``backend`` names a
    registered :class:`SyncBackend`.
    """

    def __init__(self, backend: str = "object_store", timeout_s: float = 300.0) -> None:
        self.impl = sync_backend(backend)(timeout_s)
        self.backend = backend
        self.timeout_s = timeout_s
        self.trainers: list = []
        self.generators: list = []
        self.history: list[float] = []
        self.published: tuple[int, ray.ObjectRef] | None = None

    @property
    def restartable(self) -> bool:
        """Whether a restarted generator can pick up again (see :class:`SyncBackend`)."""
        return self.impl.restartable

    @property
    def publish_returns_weights(self) -> bool:
        """Whether publish's first ref is the weights themselves (never fetched by the driver)."""
        return self.impl.publish_returns_weights

    def setup(self, trainer_wg: Any, generator_wg: Any, device: str = "cpu") -> None:
        """Remember the workers and let the backend prepare its transport (``collective``: the
        cross-pool group, gloo or nccl when ``device == 'cuda'``)."""
        self.trainers, self.generators = _handles(trainer_wg), _handles(generator_wg)
        if not self.trainers or not self.generators:
            raise ValueError("weight sync needs at least one trainer and one generator worker")
        self.impl.setup(self.trainers, self.generators, device)

    def publish(self, version: int) -> list[ray.ObjectRef]:
        """Every trainer rank gathers ``version``; rank 0 keeps it (object store: as its return value,
        remembered as ``self.published``; collective: staged on the worker)."""
        if not self.trainers:
            raise RuntimeError("WeightSync.setup must be called before publish")
        refs = self.impl.publish(self.trainers, version)
        self.published = (version, refs[0])
        return refs

    def pickup(self, index: int, version: int) -> list[ray.ObjectRef]:
        """Generator ``index`` installs the published ``version`` (the refs of every call taking part)."""
        if self.published is None or self.published[0] != version:
            have = None if self.published is None else self.published[0]
            raise RuntimeError(f"generator {index} asked for version {version}, but the published one is {have}")
        return self.impl.pickup(self.trainers, self.generators[index], index, version, self.published[1])

    def sync(self, version: int) -> float:
        """Publish ``version`` and install it on every generator; returns wall seconds."""
        t0 = time.perf_counter()
        ray.get(self.publish(version), timeout=self.timeout_s)
        refs = [r for i in range(len(self.generators)) for r in self.pickup(i, version)]
        ray.get(refs, timeout=self.timeout_s)
        seconds = time.perf_counter() - t0
        self.history.append(seconds)
        return seconds
