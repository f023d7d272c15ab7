"""Versioned trainer -> generator weight sync: publish once, every generator picks up on its own.

After the optimizer step the trainer *publishes* the new version once; each generator then *picks it up*
at its own next trajectory boundary. Nobody waits for anybody to drain, and the trainer goes on training.
Two backends move the same thing (the whole transformer state, or only the LoRA adapters):

- ``object_store``: publishing puts trainer rank 0's gathered weights in Ray's object store (the return
  value of ``export_weights``); a pickup is ``load_weights(version, ref)`` on that generator. Simple and
  restartable (a restarted generator reloads from the object), for small models and LoRA: the weights are
  gathered into host memory and serialized.
- ``collective``: weights move device to device in fixed-size buckets (``workers/buckets.py``,
  ``digen.sync.bucket_mb``) over an explicit process group of every trainer rank and every generator
  (:class:`SyncGroup`: gloo, or NCCL on GPU; verl gives each worker group its own MASTER_ADDR/PORT, so the
  group is built with its own ``TCPStore``). Publishing: every trainer rank gathers the new version tensor
  by tensor and keeps, on its device, only the buckets it owns (round-robin: its 1/R share). A pickup
  draws from every trainer rank at once, each sending its own buckets, or, once another generator holds
  the version, from that generator (a relay), so no single link carries G x the model. The generator
  receives bucket by bucket straight into its live weights (it is between trajectories): a large tensor in
  place, the small ones packed, staging two packed buckets of at most 64 MiB (``buckets.plan_for``).
  Trainer ranks and relaying generators serve from a second actor thread, so training and generation go on.

The driver makes a per-run secret and hands it only to the group's members, through their Ray actors. The
group's rendezvous store (``workers/sync_store.py``) serves only a connection that proves it holds the secret,
and stops listening once every member joined (torch's ``TCPStore`` would serve anyone). Every transfer starts
with a mutual challenge-response over fresh nonces (HMAC-SHA256 of the group id, the version, the layout and the
source's place): a member without the secret can neither send nor receive, and a recorded transfer cannot be
replayed. The channel is authenticated, not the payload: hashing 40 GB on a CPU would cost more than moving it.
An integrity check of the bytes is opt-in (``digen.sync.verify_payload``: SHA-256 over the payload on both ends,
the buckets staged until it verifies). Every call returns a byte ledger (``schedule/ledger.py``): what it moved,
by kind.

``WeightSync`` is the driver-side helper: ``setup`` once; ``publish(version)`` and ``pickup(index, version)``
return the refs of the calls taking part (the runtime's event loop waits on them); ``sync(version)`` is
publish + every pickup, blocking (resume, tests), in waves so that generators relay to each other. It
delegates to the :class:`SyncBackend` registered under ``digen.sync.backend``: backends register with
:func:`register_sync_backend` (as verl's ``core_algos`` registers advantage estimators), so a new backend is
one file (a ``SyncBackend`` subclass under the decorator), accepted by the config once that file is imported.
What the rest of the runtime needs to know about a backend is on its class (``restartable``,
``publish_returns_weights``, ``trainer_threads``, ``generator_threads``), not in checks of its name.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist

from verl_digen.registry import Registry
from verl_digen.schedule import ledger
from verl_digen.workers.buckets import (
    DEFAULT_BUCKET_MB,
    BucketPlan,
    layout_of,
    new_bucket,
    pack,
    plan_for,
    unpack,
)
from verl_digen.workers.sync_store import StoreServer, SyncStore

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


def new_secret() -> str:
    """A run's weight-sync secret (hex), made by the driver and sent only to the group's members."""
    return secrets.token_hex(32)


def group_id(secret: str) -> int:
    """The run's group id (in every handshake; not secret): a transfer from another run is refused early."""
    return int.from_bytes(hashlib.sha256(b"digen-sync|" + bytes.fromhex(secret)).digest()[:8], "little") >> 1


class SyncRefused(RuntimeError):
    """A weight transfer refused before any of its tensors was installed (handshake or payload check)."""


def _nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _words(b: bytes) -> list[int]:
    """Bytes (a multiple of 8) as signed int64 words, the handshake tensors' element type."""
    return list(struct.unpack(f"<{len(b) // 8}q", b))


def _bytes(words: list[int]) -> bytes:
    return struct.pack(f"<{len(words)}q", *words)


NONCE_BYTES = 32
DEFAULT_BUCKET_BYTES = DEFAULT_BUCKET_MB << 20
_MAC_WORDS = 4  # HMAC-SHA256 as int64 words
_HEAD = 5  # group id, version, layout hash, sources, source index


class SyncGroup:
    """One member of the explicit cross-pool process group for weight sync.

    Ranks ``0 .. sources-1`` are the trainer ranks, the rest the generators; any member holding a
    version can be a pickup's source (trainer ranks send their own buckets; a generator relays the whole
    version it holds). ``secret`` (hex, from :func:`new_secret`) is the run's; every transfer starts with a
    mutual challenge-response over fresh nonces (HMAC-SHA256 of the group id, the version, the layout and
    the source's place), so a member without the secret can neither send nor receive, and a recorded
    handshake cannot be replayed. Tensors then move as buckets (``workers/buckets.py``) on ``self.device``;
    no pass over the payload is made unless ``verify_payload`` asks for one. ``counters`` accumulates the
    bytes this member sent and received (the benchmark's and the ledger's source)."""

    def __init__(self, host: str, port: int, world: int, rank: int, backend: str = "gloo",
                 timeout_s: float = 300.0, *, secret: str, node: str | None = None) -> None:
        if not 0 <= rank < world:
            raise ValueError(f"sync-group rank {rank} out of range for world {world}")
        if len(secret) < 32:
            raise ValueError("the weight-sync group needs the run's secret (new_secret())")
        self._key = bytes.fromhex(secret)
        self.group_id = group_id(secret)
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world, self.backend = rank, world, backend
        self.store_server: StoreServer | None = None
        if rank == 0:
            # the store (workers/sync_store.py) serves the run's members only, on the pool's address only,
            # and stops listening once every member joined
            self.store_server = StoreServer(bind_listener(host, int(port)), self._key, world)
        self.store = SyncStore(host, int(port), self._key, timeout_s)
        if backend == "gloo":
            self.pg = _gloo_group(self.store, rank, world, timeout, host if rank == 0 else _local_address(host))
            self.device = torch.device("cpu")
        elif backend == "nccl":
            from torch._C._distributed_c10d import ProcessGroupNCCL

            self.pg = ProcessGroupNCCL(self.store, rank, world)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"unknown sync backend {backend!r}; expected 'gloo' or 'nccl'")
        # where every member runs: a peer on this node is counted intra-node, any other inter-node
        self.node = node or socket.gethostname()
        self.store.set(f"digen/node/{rank}", self.node)
        # read once here, so a pickup never waits on the store
        self._nodes: dict[int, str] = {r: self.store.get(f"digen/node/{r}").decode() for r in range(world)}
        self.counters = {"sent": 0, "received": 0}
        self._pool: list[torch.Tensor] = []  # the last pickup's staging buffers, reused by the next

    # -- transport ------------------------------------------------------------------------------------
    def _send(self, t: torch.Tensor, peer: int) -> None:
        self.pg.send([t], peer, 0).wait()

    def _recv(self, t: torch.Tensor, peer: int) -> None:
        self.pg.recv([t], peer, 0).wait()

    def _words_tensor(self, words: list[int]) -> torch.Tensor:
        return torch.tensor(words, dtype=torch.int64, device=self.device)

    def _where(self, peer: int) -> str:
        return ledger.INTRA_NODE if self._nodes[peer] == self.node else ledger.INTER_NODE

    def _count(self, out: dict[str, int], peer: int, nbytes: int, direction: str) -> None:
        ledger.add(out, ledger.DEVICE_TO_DEVICE, nbytes)
        ledger.add(out, self._where(peer), nbytes)
        self.counters[direction] += nbytes

    def _mac(self, label: bytes, head: list[int], *nonces: bytes) -> list[int]:
        msg = label + _bytes(head) + b"".join(nonces)
        return _words(hmac.new(self._key, msg, hashlib.sha256).digest())

    # -- the source's side ------------------------------------------------------------------------------
    def serve(self, dst: int, version: int, plan: BucketPlan, bucket: Callable[[int, int], torch.Tensor],
              source: int = 0, sources: int = 1, verify_payload: bool = False) -> dict[str, int]:
        """Send this member's buckets of ``version`` (``plan.owned(source, sources)``) to ``dst`` once the
        handshake passed. ``bucket(k, slot)`` returns bucket ``k`` on ``self.device``: a staged one, or one
        packed into the caller's scratch buffer ``slot`` (0 or 1: two sends are in flight at most, so two
        scratch buffers bound a relay's staging). Returns the ledger."""
        if not 0 <= dst < self.world or dst == self.rank:
            raise ValueError(f"weight-sync destination {dst} out of range (world {self.world}, this rank {self.rank})")
        head = [self.group_id, version, plan.fingerprint(), sources, source]
        challenge = torch.zeros(_HEAD + NONCE_BYTES // 8, dtype=torch.int64, device=self.device)
        self._recv(challenge, dst)
        nonce_r = _bytes(challenge.tolist()[_HEAD:])
        nonce_s = _nonce()
        self._send(self._words_tensor(head + _words(nonce_s) + self._mac(b"digen-send", head, nonce_r, nonce_s)), dst)
        answer = torch.zeros(1 + _MAC_WORDS, dtype=torch.int64, device=self.device)
        self._recv(answer, dst)
        ok, *mac_r = answer.tolist()
        if not ok:
            raise SyncRefused(f"weight sync of version {version} refused by sync rank {dst} (another run, or the "
                              "layout or version differs); nothing was sent")
        if not hmac.compare_digest(_bytes(mac_r), _bytes(self._mac(b"digen-recv", head, nonce_s, nonce_r))):
            raise SyncRefused(f"weight sync of version {version}: sync rank {dst} does not hold this run's secret; "
                              "nothing was sent")
        out: dict[str, int] = {}
        digest = hashlib.sha256() if verify_payload else None
        inflight: list[Any] = [None, None]
        for i, k in enumerate(plan.owned(source, sources)):
            slot = i % 2
            if inflight[slot] is not None:
                inflight[slot].wait()  # the send that used this slot's buffer is done with it
            buf = bucket(k, slot)
            if digest is not None:
                _hash_into(digest, buf, out)
            inflight[slot] = self.pg.send([buf], dst, 0)
            self._count(out, dst, buf.numel(), "sent")
        for work in inflight:
            if work is not None:
                work.wait()
        if digest is not None:
            self._send(self._words_tensor(self._mac(b"digen-payload", head, nonce_r, digest.digest())), dst)
        return out

    def send(self, dst: int, version: int, state: dict[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
             verify_payload: bool = False) -> dict[str, int]:
        """Send a whole ``state`` (this member is the pickup's only source), packing buckets as it goes."""
        packer = Packer(state, bucket_bytes, self.device)
        return self.serve(dst, version, packer.plan, packer.bucket, verify_payload=verify_payload)

    # -- the receiver's side ----------------------------------------------------------------------------
    def receive(self, version: int, plan: BucketPlan, into: Mapping[str, torch.Tensor], sources: list[int],
                verify_payload: bool = False, on_landed: Callable[[int], None] | None = None) -> dict[str, int]:
        """Receive ``version`` from ``sources`` (group ranks; source ``i`` sends ``plan.owned(i, len)``) into
        ``into`` (tensors on ``self.device`` laid out as ``plan.layout``: the live weights, written bucket by
        bucket). Each source is handled on its own thread: its handshake, then its buckets, two in flight (with
        ``buckets.plan_for``'s buckets of 1/S the size, S sources stage two full buckets in all), so a source
        busy serving another generator never holds up the others and no order among concurrent pickups can
        deadlock. A source's bytes are written
        only after its own handshake passed; with ``verify_payload`` every bucket is staged and written only
        after every source's payload MAC verified. Raises :class:`SyncRefused` when refused before any byte was
        written, a plain ``RuntimeError`` when other sources' buckets had landed (the weights are then torn).
        ``on_landed(k)`` is called once bucket ``k``'s bytes are in ``into`` (an engine's ``EngineSink`` then
        hands the tensors it completed to the engine). Returns the ledger."""
        if not sources:
            raise ValueError("a weight pickup needs at least one source")
        out: dict[str, int] = {}
        staged: dict[int, torch.Tensor] = {}
        window = 2
        errors: list[BaseException] = []
        landed = [0]  # buckets written into ``into``
        # a direct bucket (one piece of one tensor) lands in place; packed ones go through two staging buffers per
        # source, reused bucket after bucket and kept for the next pickup (no fresh allocation, no first-touch
        # page faults in steady state); with verify_payload every bucket is staged until it verifies
        size = plan.staged_size()
        packed = [sum(not plan.direct(k) for k in plan.owned(i, len(sources))) for i in range(len(sources))]
        bases = [] if verify_payload else [[self._staging(size) for _ in range(min(window, n))] for n in packed]
        self._pool = [b for per_source in bases for b in per_source]
        ledger.add(out, ledger.STAGING_PEAK, sum(b.numel() for b in self._pool))

        def stream(i: int, src: int) -> None:
            try:
                head = [self.group_id, version, plan.fingerprint(), len(sources), i]
                nonce = self._handshake(src, version, head, plan)  # 1. the source proves it holds the secret
                pending: list[tuple[int, torch.Tensor, Any]] = []
                staged_n = 0
                for k in plan.owned(i, len(sources)):  # 2. its buckets, in order
                    if verify_payload:
                        buf = new_bucket(plan, k, self.device)
                    elif plan.direct(k):
                        buf = plan.piece_view(k, into)  # straight into the weights
                    else:  # free: the bucket that used it two packed buckets ago has landed
                        buf = bases[i][staged_n % window][:plan.sizes[k]]
                        staged_n += 1
                    pending.append((k, buf, self.pg.recv([buf], src, 0)))
                    if len(pending) == window:
                        self._land(pending.pop(0), plan, into, staged, verify_payload, landed, on_landed)
                while pending:
                    self._land(pending.pop(0), plan, into, staged, verify_payload, landed, on_landed)
                if verify_payload:  # 3. its payload MAC over what arrived
                    mac = torch.zeros(_MAC_WORDS, dtype=torch.int64, device=self.device)
                    self._recv(mac, src)
                    digest = hashlib.sha256()
                    for k in plan.owned(i, len(sources)):
                        _hash_into(digest, staged[k], out)
                    if not hmac.compare_digest(_bytes(mac.tolist()), _bytes(self._mac(b"digen-payload", head, nonce,
                                                                                      digest.digest()))):
                        raise SyncRefused(f"weight sync of version {version} refused: the payload from sync rank "
                                          f"{src} does not match its MAC (it changed on the way); nothing was loaded")
            except BaseException as err:  # noqa: BLE001 - re-raised by the caller
                errors.append(err)

        threads = [threading.Thread(target=stream, args=(i, src), daemon=True) for i, src in enumerate(sources)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            if landed[0] and isinstance(errors[0], SyncRefused):
                raise RuntimeError(f"{errors[0]} (but {landed[0]} bucket(s) of other sources had landed: this "
                                   "member's weights are torn until a pickup completes)") from errors[0]
            raise errors[0]
        for i, src in enumerate(sources):
            self._count(out, src, sum(plan.sizes[k] for k in plan.owned(i, len(sources))), "received")
        if verify_payload:
            ledger.add(out, ledger.STAGING_PEAK, sum(b.numel() for b in staged.values()))
            for k, buf in staged.items():
                unpack(plan, k, buf, into)
                if on_landed is not None:
                    on_landed(k)
        return out

    def _handshake(self, src: int, version: int, head: list[int], plan: BucketPlan) -> bytes:
        nonce_r = _nonce()
        self._send(self._words_tensor(head + _words(nonce_r)), src)
        reply = torch.zeros(_HEAD + NONCE_BYTES // 8 + _MAC_WORDS, dtype=torch.int64, device=self.device)
        self._recv(reply, src)
        words = reply.tolist()
        got, nonce_s, mac_s = words[:_HEAD], _bytes(words[_HEAD:_HEAD + NONCE_BYTES // 8]), words[-_MAC_WORDS:]
        ok = got == head and hmac.compare_digest(_bytes(mac_s), _bytes(self._mac(b"digen-send", head, nonce_r,
                                                                                 nonce_s)))
        answer = [1, *self._mac(b"digen-recv", head, nonce_s, nonce_r)] if ok else [0] * (1 + _MAC_WORDS)
        self._send(self._words_tensor(answer), src)
        if ok:
            return nonce_r
        gid, v, lh, n, i = got
        if gid != self.group_id:
            raise SyncRefused(f"weight sync of version {version} refused: the sender is not of this run "
                              f"(group id {gid:x}, expected {self.group_id:x}); nothing was loaded")
        if got != head:
            raise SyncRefused(
                f"weight sync mismatch: sync rank {src} sends version {v} (layout and buckets {lh:x}, source {i} of "
                f"{n}); this generator expects version {version} ({len(plan.layout)} tensors, layout and buckets "
                f"{head[2]:x}, digen.sync.bucket_mb alike on both ends; source "
                f"{head[4]} of {head[3]}); nothing was loaded")
        raise SyncRefused(f"weight sync of version {version} refused: its handshake does not verify (the sender "
                          "does not hold this run's secret, or replays an old transfer); nothing was loaded")

    def _staging(self, nbytes: int) -> torch.Tensor:
        """A staging buffer of at least ``nbytes`` from the previous pickup's, else a new one."""
        for i, buf in enumerate(self._pool):
            if nbytes <= buf.numel() <= 2 * nbytes:
                return self._pool.pop(i)
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def _land(self, item: tuple[int, torch.Tensor, Any], plan: BucketPlan, into: Mapping[str, torch.Tensor],
              staged: dict[int, torch.Tensor], verify_payload: bool, landed: list[int],
              on_landed: Callable[[int], None] | None = None) -> None:
        """Wait for one bucket and install it (or stage it until the payload verifies)."""
        k, buf, work = item
        work.wait()
        if verify_payload:
            staged[k] = buf
            return
        if not plan.direct(k):
            unpack(plan, k, buf, into)
        landed[0] += 1
        if on_landed is not None:
            on_landed(k)

    def recv(self, version: int, template: dict[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
             verify_payload: bool = False, source: int = 0) -> dict[str, torch.Tensor]:
        """Receive a whole state shaped like ``template`` from one source into new tensors (tests, tools)."""
        out = {k: torch.empty(v.shape, dtype=v.dtype, device=self.device) for k, v in template.items()}
        self.receive(version, plan_for(layout_of(template), bucket_bytes, 1), out, [source], verify_payload)
        return out


class Packer:
    """Buckets packed on demand from a whole state (a relaying generator's live weights, a lone sender's
    state) into two scratch buffers: :meth:`SyncGroup.serve`'s ``bucket`` for a source that staged nothing.
    ``scratch``: buffers to reuse (a member keeps its relay's two between relays)."""

    def __init__(self, state: dict[str, torch.Tensor], bucket_bytes: int, device: torch.device,
                 scratch: list[torch.Tensor] | None = None) -> None:
        self.plan = plan_for(layout_of(state), bucket_bytes, 1)
        self.tensors = {k: v.detach().to(device).contiguous() for k, v in state.items()}
        size = self.plan.staged_size()
        old = [b for b in scratch or [] if size <= b.numel() <= 2 * size][:2]
        self.scratch = old + [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(2 - len(old))]

    def bucket(self, k: int, slot: int) -> torch.Tensor:
        if self.plan.direct(k):
            return self.plan.piece_view(k, self.tensors)  # sent from the weights themselves
        return pack(self.plan, k, self.tensors, self.scratch[slot][:self.plan.sizes[k]])

    @property
    def staging_bytes(self) -> int:
        return sum(b.numel() for b in self.scratch)


def _hash_into(digest: Any, buf: torch.Tensor, out: dict[str, int]) -> None:
    """Feed a bucket to the payload digest (host bytes: a GPU bucket is copied out first, and counted)."""
    host = buf
    if buf.device.type != "cpu":
        host = buf.to("cpu")
        ledger.add(out, ledger.HOST_DEVICE, buf.numel())
    digest.update(host.numpy())
    ledger.add(out, ledger.HASHED, buf.numel())


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
    ``join_sync_group``, generators ``load_weights`` / ``recv_weights`` / ``send_weights_to`` /
    ``join_sync_group``.
    """

    name: str = ""
    # a restarted generator actor can pick up again (no group membership to rebuild), so generator
    # restarts (trainer.generator_max_restarts) may be on
    restartable: bool = False
    # publish's first ref is the weights themselves: the driver never fetches it, and a restarted
    # generator's restore may reload from it
    publish_returns_weights: bool = False
    # concurrent calls each trainer actor serves (2: a rank serves pickups while it trains)
    trainer_threads: int = 1
    # concurrent calls each generator actor serves (2: a generator relays a version while it generates)
    generator_threads: int = 1

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s

    def setup(self, trainers: list, generators: list, device: str = "cpu") -> None:
        """Prepare the transport once (nothing by default)."""

    def publish(self, trainers: list, version: int) -> list[ray.ObjectRef]:
        raise NotImplementedError

    def pickup(self, trainers: list, generator: Any, index: int, version: int,
               published: ray.ObjectRef) -> list[ray.ObjectRef]:
        raise NotImplementedError

    def sources_free(self, version: int) -> int | None:
        """How many pickups of ``version`` may start now without queueing on a busy source (``sync``'s
        wave size); None: any number."""
        return None


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
    """Bucketed, device-to-device transfers over one group of every trainer rank (group ranks 0..R-1)
    and every generator (R..R+G-1) (:class:`SyncGroup`: gloo, or NCCL when ``device == 'cuda'``), its
    store on trainer rank 0's node. A pickup draws from every trainer rank, or relays from a generator
    that already holds the version and is not serving anyone (its own pickup finished). A restarted
    generator cannot rejoin the group."""

    trainer_threads = 2
    generator_threads = 2

    def __init__(self, timeout_s: float = 300.0) -> None:
        super().__init__(timeout_s)
        self.generators: list = []
        self._held: dict[int, list[ray.ObjectRef]] = {}  # generator -> refs of its pickup of the published version
        self._serving: dict[int, list[ray.ObjectRef]] = {}  # generator -> refs of the relay it serves
        self._version: int | None = None

    def setup(self, trainers: list, generators: list, device: str = "cpu") -> None:
        host, port = ray.get(trainers[0].get_available_master_addr_port.remote())
        self.generators = list(generators)
        world = len(trainers) + len(generators)
        backend = "nccl" if device == "cuda" else "gloo"
        secret = new_secret()  # this run's: only through the members' Ray actors (token-authenticated)
        members = [*trainers, *generators]
        ray.get([m.join_sync_group.remote(host, int(port), world, rank, backend, self.timeout_s, secret)
                 for rank, m in enumerate(members)], timeout=self.timeout_s)

    def publish(self, trainers: list, version: int) -> list[ray.ObjectRef]:
        self._version, self._held, self._serving = version, {}, {}
        return [w.stage_weights.remote(version) for w in trainers]

    def _relay_source(self) -> int | None:
        """A generator that holds the published version and serves nobody now (lowest index first)."""
        for g, refs in sorted(self._held.items()):
            if g in self._serving and _ready(self._serving[g]):
                del self._serving[g]
            if g not in self._serving and _ready(refs):
                return g
        return None

    def pickup(self, trainers: list, generator: Any, index: int, version: int,
               published: ray.ObjectRef) -> list[ray.ObjectRef]:
        ranks = len(trainers)  # group ranks: the trainer ranks first, then the generators
        dst = ranks + index
        source = self._relay_source() if version == self._version else None
        if source is None:
            refs = [t.send_weights_to.remote(dst, version) for t in trainers]
            refs.append(generator.recv_weights.remote(version, list(range(ranks))))
        else:
            refs = [self.generators[source].send_weights_to.remote(dst, version),
                    generator.recv_weights.remote(version, [ranks + source])]
            self._serving[source] = refs
        if version == self._version:
            self._held[index] = refs
        return refs

    def sources_free(self, version: int) -> int | None:
        if version != self._version:
            return 1
        return max(1, sum(1 for g, refs in self._held.items() if _ready(refs) and (
            g not in self._serving or _ready(self._serving[g]))))


def _ready(refs: list[ray.ObjectRef]) -> bool:
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    return len(done) == len(refs)


class WeightSync:
    """Driver-side trainer -> generator weight sync; ``sync`` returns seconds taken.

    ``trainer_wg`` / ``generator_wg`` are verl ``RayWorkerGroup``s (or lists of actor handles) of
    ``TSPActorWorker``/``HybridWorker`` and ``GeneratorWorker``. ``backend`` names a registered
    :class:`SyncBackend`.
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
        """Every trainer rank gathers ``version``; the backend keeps it (object store: rank 0's return
        value, remembered as ``self.published``; collective: each rank's buckets, staged on it)."""
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
        """Publish ``version`` and install it on every generator; returns wall seconds. Pickups go in waves
        as wide as the backend has free sources, so generators that hold the version relay it."""
        t0 = time.perf_counter()
        ray.get(self.publish(version), timeout=self.timeout_s)
        waiting = list(range(len(self.generators)))
        while waiting:
            width = self.impl.sources_free(version) or len(waiting)
            wave, waiting = waiting[:width], waiting[width:]
            ray.get([r for i in wave for r in self.pickup(i, version)], timeout=self.timeout_s)
        seconds = time.perf_counter() - t0
        self.history.append(seconds)
        return seconds
