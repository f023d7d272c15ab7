"""Weights as a byte stream cut into fixed-size buckets: the unit the collective weight sync moves.

Every tensor of a state, in sorted-name order, is laid end to end as raw bytes; bucket ``k`` is bytes
``[k B, (k+1) B)`` of that stream (``B`` = ``digen.sync.bucket_mb``), so a tensor may span buckets and no
bucket exceeds ``B``: staging memory is bounded by the bucket size whatever the largest tensor is (verl's
checkpoint engine cuts tensors into chunks of its bucket size likewise). Sender and receiver derive the same
:class:`BucketPlan` from the layout alone (names, dtypes, shapes) and the number of sources (:func:`plan_for`:
``S`` senders move buckets of ``B / S``), which the handshake has them agree on first, so no per-bucket header
is sent. Buckets are owned round-robin by the sources of a pickup (each trainer rank packs and sends only its
own), and packing / unpacking are device-local copies (``torch.Tensor.copy_`` on ``uint8`` views): nothing
crosses to host memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from verl_digen.workers.sync_spec import SYNC_PACK_MB

#: ``digen.sync.bucket_mb``'s default: verl's ``update_weights_bucket_megabytes`` (its checkpoint engine)
DEFAULT_BUCKET_MB = 2048

Layout = tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]


def layout_of(state: Mapping[str, torch.Tensor]) -> Layout:
    """(name, dtype, shape) of every tensor in sorted-name order (a DTensor gives its global shape)."""
    return tuple((name, state[name].dtype, tuple(state[name].shape)) for name in sorted(state))


def layout_hash(layout: Layout) -> int:
    """A 63-bit hash of a layout: both ends of a transfer must agree before any bytes move."""
    h = hashlib.sha256()
    for name, dtype, shape in layout:
        h.update(f"{name}|{dtype}|{shape};".encode())
    return int.from_bytes(h.digest()[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Piece:
    """Bytes ``[start, start + length)`` of tensor ``name``, at ``offset`` in its bucket."""

    name: str
    start: int
    length: int
    offset: int


@dataclass(frozen=True)
class BucketPlan:
    """The byte-stream cut of one layout into buckets of at most ``bucket_bytes``.

    With ``pack_bytes``, a tensor of at least that size starts a bucket of its own and is cut into
    ``bucket_bytes`` chunks: each such bucket is one piece of one tensor, which a receiver takes straight into
    that tensor's bytes (:meth:`direct`: no staging, no copy) and a relay sends straight from them. Smaller
    tensors are packed together into buckets of at most ``pack_bytes``, the only ones a receiver stages. Without
    it every bucket is packed to ``bucket_bytes``."""

    layout: Layout
    bucket_bytes: int
    sizes: tuple[int, ...]  # bytes of each bucket
    pieces: tuple[tuple[Piece, ...], ...]  # per bucket, the tensor pieces it holds in stream order
    pack_bytes: int | None = None

    @classmethod
    def of(cls, layout: Layout, bucket_bytes: int, pack_bytes: int | None = None) -> BucketPlan:
        if bucket_bytes < 1 or (pack_bytes is not None and pack_bytes < 1):
            raise ValueError(f"bucket sizes must be at least one byte, got {bucket_bytes} and {pack_bytes}")
        pieces: list[list[Piece]] = []
        sizes: list[int] = []
        full = True  # whether the last bucket takes no more pieces
        for name, dtype, shape in layout:
            nbytes = _nbytes(dtype, shape)
            alone = pack_bytes is not None and nbytes >= pack_bytes
            cap = bucket_bytes if pack_bytes is None or alone else pack_bytes
            full = full or alone
            done = 0
            while done < nbytes:
                if full or sizes[-1] == cap:
                    pieces.append([])
                    sizes.append(0)
                    full = False
                length = min(nbytes - done, cap - sizes[-1])
                pieces[-1].append(Piece(name, done, length, sizes[-1]))
                sizes[-1] += length
                done += length
            full = full or alone  # nothing packs behind a tensor of its own
        return cls(layout, bucket_bytes, tuple(sizes), tuple(tuple(p) for p in pieces), pack_bytes)

    def fingerprint(self) -> int:
        """A 63-bit hash of the layout and the cut: both ends of a transfer must agree on it before any bytes
        move (the same tensors cut differently would land in the wrong places)."""
        return layout_hash(self.layout + (("", self.bucket_bytes, self.pack_bytes),))

    def direct(self, k: int) -> bool:
        """Whether bucket ``k`` is one piece of one tensor (received into it and sent from it in place)."""
        return len(self.pieces[k]) == 1

    def piece_view(self, k: int, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The bytes of ``tensors`` that direct bucket ``k`` holds, as a view (no copy)."""
        (p,) = self.pieces[k]
        return byte_view(tensors[p.name])[p.start:p.start + p.length]

    def staged_size(self) -> int:
        """The largest bucket that is not direct: what one staging buffer must hold."""
        return max((s for k, s in enumerate(self.sizes) if not self.direct(k)), default=0)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def owned(self, source: int, sources: int) -> list[int]:
        """The buckets source ``source`` of ``sources`` sends (round-robin: equal shares within a bucket)."""
        if not 0 <= source < sources:
            raise ValueError(f"source {source} out of range for {sources} sources")
        return list(range(source, len(self), sources))


#: packed buckets (the tensors smaller than this, packed together) hold at most this: the only buckets a
#: receiver stages, so its staging is two of them whatever ``digen.sync.bucket_mb`` is
PACK_BYTES = SYNC_PACK_MB << 20


def plan_for(layout: Layout, bucket_bytes: int, sources: int) -> BucketPlan:
    """The plan of a pickup from ``sources`` senders: tensors of at least ``PACK_BYTES`` (or the bucket size)
    move in place in chunks of ``bucket_bytes / sources``, smaller ones packed in buckets of ``PACK_BYTES /
    sources``; the receiver, two buckets in flight per source, stages at most two packed buckets of
    ``PACK_BYTES`` however many trainer ranks send (a relay, one source, moves full-size buckets)."""
    n = max(1, sources)
    return BucketPlan.of(layout, max(1, bucket_bytes // n), max(1, min(PACK_BYTES, bucket_bytes) // n))


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * torch.empty((), dtype=dtype).element_size()


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a contiguous tensor's storage (no copy)."""
    if not t.is_contiguous():
        raise ValueError("bucket packing needs contiguous tensors")
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def new_bucket(plan: BucketPlan, index: int, device: torch.device | str) -> torch.Tensor:
    return torch.empty(plan.sizes[index], dtype=torch.uint8, device=device)


@torch.no_grad()
def pack(plan: BucketPlan, index: int, tensors: Mapping[str, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Bucket ``index`` filled from ``tensors`` (full tensors on ``out``'s device) into ``out``."""
    for p in plan.pieces[index]:
        out[p.offset:p.offset + p.length].copy_(byte_view(tensors[p.name])[p.start:p.start + p.length])
    return out


@torch.no_grad()
def unpack(plan: BucketPlan, index: int, bucket: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> None:
    """Bucket ``index``'s bytes written into ``tensors`` (the live weights, or a staging copy), in place."""
    for p in plan.pieces[index]:
        byte_view(tensors[p.name])[p.start:p.start + p.length].copy_(bucket[p.offset:p.offset + p.length])


@torch.no_grad()
def pack_owned(plan: BucketPlan, owned: list[int], full_tensors: Iterator[tuple[str, torch.Tensor]],
               device: torch.device | str) -> dict[int, torch.Tensor]:
    """The ``owned`` buckets packed from a stream of (name, full tensor) in layout order, one tensor at a
    time: a sharded trainer rank gathers each tensor (a collective every rank runs) and keeps only the bytes
    of its own buckets, so its staging is its share of the model, never the whole of it."""
    mine = set(owned)
    by_name: dict[str, list[tuple[int, Piece]]] = {}
    for b in owned:
        for p in plan.pieces[b]:
            by_name.setdefault(p.name, []).append((b, p))
    out = {b: new_bucket(plan, b, device) for b in owned}
    names = [name for name, _, _ in plan.layout]
    for (name, full), want in zip(full_tensors, names, strict=True):
        if name != want:
            raise ValueError(f"tensor stream out of layout order: got {name!r}, expected {want!r}")
        for b, p in by_name.get(name, ()):
            if b in mine:
                src = byte_view(full.contiguous())
                out[b][p.offset:p.offset + p.length].copy_(src[p.start:p.start + p.length])
    return out
