"""The byte ledger: what an action moved, by kind, and what moving it costs.

Weight movement decides whether disaggregation pays at 12-20B parameters, so the runtime counts the bytes
each publish, pickup and TAG switch moves (``workers/sync.py``, ``workers/actor.py``) and the cost model
prices those actions from the same counts (:func:`pickup_ledger`, :func:`publish_ledger`,
:func:`switch_ledger` with :func:`price`): one set of formulas for verl-digen and for every baseline, and a
test holds the formulas against the worker's counters. Pure Python, like the rest of ``schedule/``.

A ledger is a plain ``dict[str, int]`` (bytes per kind); missing kinds are zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: bytes a transport moved between two devices' memories (NCCL; gloo between CPU processes, whose
#: device is the host)
DEVICE_TO_DEVICE = "device_to_device"
#: bytes copied between host and device memory (PCIe); zero on a CPU run, where the device is the host
HOST_DEVICE = "host_device"
#: the transport's bytes split by where the peer was: the same node, or another node
INTRA_NODE = "intra_node"
INTER_NODE = "inter_node"
#: bytes read by a hash (``digen.sync.verify_payload``, checksums); the default sync path hashes none
HASHED = "hashed"
#: bytes serialized through Ray's object store (the ``object_store`` sync backend)
SERIALIZED = "serialized"
#: bytes this rank received from the other ranks' shards to materialize full tensors (FSDP all-gather)
GATHERED = "gathered"
#: bytes copied into a new host (CPU) buffer beyond the transport's own
HOST_COPIES = "host_copies"
#: bytes of a TAG generation copy released at a switch (freed rather than kept resident)
FREED = "freed"
#: the most bytes of staging buffers held at one moment during the action (a maximum, not a sum)
STAGING_PEAK = "staging_peak"

KINDS = (DEVICE_TO_DEVICE, HOST_DEVICE, INTRA_NODE, INTER_NODE, HASHED, SERIALIZED, GATHERED, HOST_COPIES,
         FREED, STAGING_PEAK)
_MAXED = (STAGING_PEAK,)


def add(ledger: dict[str, int], kind: str, nbytes: int) -> None:
    """Count ``nbytes`` of ``kind`` into ``ledger`` (a maximum for ``staging_peak``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown ledger kind {kind!r}; expected one of {KINDS}")
    n = int(nbytes)
    if n < 0:
        raise ValueError(f"ledger bytes must be >= 0, got {n} for {kind!r}")
    if n == 0:
        return  # a ledger lists only what moved
    ledger[kind] = max(ledger.get(kind, 0), n) if kind in _MAXED else ledger.get(kind, 0) + n


def merge(ledgers: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """One ledger for several (the ranks of one action): sums, and the largest staging peak."""
    out: dict[str, int] = {}
    for ledger in ledgers:
        for kind, n in ledger.items():
            add(out, kind, n)
    return out


def as_pairs(ledger: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """The non-zero entries in :data:`KINDS` order: what a timeline ``Record`` keeps (hashable, small)."""
    return tuple((k, int(ledger[k])) for k in KINDS if ledger.get(k))


@dataclass(frozen=True)
class Links:
    """Bandwidths (GB/s, bytes) that price a ledger: the point-to-point link inside a node and between
    nodes, host<->device (PCIe), the trainer's all-gather (per rank, ring), a hash and Ray's
    serialization (per core)."""

    intra_gbs: float
    inter_gbs: float
    host_gbs: float = 25.0
    gather_gbs: float = 150.0
    hash_gbs: float = 1.0  # SHA-256 on one core (0.5-2 GB/s)
    serialize_gbs: float = 5.0  # pickling into the object store: one memcpy-class pass per end
    memcpy_gbs: float = 20.0  # a copy into a new host buffer (one core's memcpy)

    def __post_init__(self) -> None:
        for name, v in vars(self).items():
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"link {name} must be a positive number of GB/s, got {v!r}")


def price(ledger: Mapping[str, int], links: Links) -> float:
    """Seconds of the moves in ``ledger`` on ``links``, one after the other (the runtime overlaps none of
    them inside one action). Device-to-device bytes are priced once, by where they went (intra/inter)."""
    terms = ((INTRA_NODE, links.intra_gbs), (INTER_NODE, links.inter_gbs), (HOST_DEVICE, links.host_gbs),
             (GATHERED, links.gather_gbs), (HASHED, links.hash_gbs), (SERIALIZED, links.serialize_gbs),
             (HOST_COPIES, links.memcpy_gbs))
    return sum(ledger.get(kind, 0) / (gbs * 1e9) for kind, gbs in terms)


def _transport(nbytes: float, inter_node: bool) -> dict[str, int]:
    where = INTER_NODE if inter_node else INTRA_NODE
    return {DEVICE_TO_DEVICE: int(nbytes), where: int(nbytes)}


def pickup_ledger(model_bytes: float, backend: str, inter_node: bool, on_gpu: bool,
                  verify_payload: bool = False) -> dict[str, int]:
    """What one generator's pickup of a published version moves (the receiving side's count).

    ``collective``: the model's bytes once over the transport, device to device, into the live weights;
    ``verify_payload`` hashes them on the host (a host copy on a GPU). ``object_store``: the weights are
    fetched from the object store (serialized, a host copy) and copied onto the generator's device."""
    n = int(model_bytes)
    if backend == "collective":
        out = _transport(n, inter_node)
        if verify_payload:
            out[HASHED] = n
            if on_gpu:
                out[HOST_DEVICE] = n
        return out
    if backend == "object_store":
        out = {SERIALIZED: n, HOST_COPIES: n, **_transport(n, inter_node)}
        if on_gpu:
            out[HOST_DEVICE] = n
        return out
    raise ValueError(f"no ledger formula for sync backend {backend!r}; expected 'collective' or 'object_store'")


def publish_ledger(model_bytes: float, ranks: int, backend: str, on_gpu: bool) -> dict[str, int]:
    """What publishing a version moves on one trainer rank: the all-gather of the shards it does not hold
    (none on one rank), then the copy it keeps (collective: its 1/``ranks`` share of the buckets, on the
    device; object store: rank 0 copies the whole state to host memory and serializes it)."""
    n = int(model_bytes)
    out = {GATHERED: n * (ranks - 1) // ranks} if ranks > 1 else {}
    if backend == "object_store":
        out.update({HOST_COPIES: n, SERIALIZED: n})
        if on_gpu:
            out[HOST_DEVICE] = n
    elif backend != "collective":
        raise ValueError(f"no ledger formula for sync backend {backend!r}; expected 'collective' or 'object_store'")
    return out


def switch_ledger(model_bytes: float, state_bytes: float, ranks: int, to_gen: bool, resident: bool,
                  on_gpu: bool) -> dict[str, int]:
    """What one trainer rank's TAG switch moves. ``to_gen``: the rank's training state (``state_bytes``:
    its share of gradients and optimizer state) goes to host memory on a GPU (into a stash of host copies on a
    CPU rank), and a sharded rank
    all-gathers the full generation weights (``model_bytes``) into its generation copy (the copy's own
    allocation too unless it stayed ``resident``). Back to training: the state returns; a copy that may not
    stay resident is freed (never moved to the host: it is re-gathered next time anyway)."""
    out: dict[str, int] = {}
    if state_bytes and (on_gpu or to_gen):  # a CPU rank copies its state into a stash and hands it back as is
        out[HOST_DEVICE if on_gpu else HOST_COPIES] = int(state_bytes)
    if ranks > 1:
        if to_gen:
            out[GATHERED] = int(model_bytes) * (ranks - 1) // ranks
        elif not resident:
            out[FREED] = int(model_bytes)
    return out
