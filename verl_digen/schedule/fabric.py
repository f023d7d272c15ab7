"""Cluster topology and what its collectives cost: the communication FSDP, TAG and weight sync pay.

A pool of ``ranks`` GPUs fills whole nodes of ``gpus_per_node``. Collectives use the ring ("bus
bandwidth") model: an all-gather or reduce-scatter of a tensor of ``S`` bytes over ``N`` ranks moves
``S (N - 1) / N`` bytes over every link of the ring, so it takes that over the *slowest link the pool
crosses*: the per-GPU intra-node link inside one node, the node's network (NICs x link speed) as soon
as the pool spans two nodes. That is why a 16-GPU trainer pool inside two NVLink nodes with one NIC
each communicates several times slower than 8 GPUs in one node, and why more NICs per node close the
gap. docs/calibration.md lists the figures each preset uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FULL = "full"  # FSDP shards over the whole pool
HYBRID = "hybrid"  # HSDP: shard inside a node, replicate across nodes (gradients all-reduced across)
SHARDINGS = (FULL, HYBRID)


@dataclass(frozen=True)
class Fabric:
    """Nodes of ``gpus_per_node`` GPUs; bandwidths in GB/s (bytes, not bits)."""

    gpus_per_node: int = 8
    intra_gbs: float = 150.0  # per-GPU collective bandwidth inside a node (NVLink; PCIe is ~12-25)
    nic_gbs: float = 25.0  # one NIC: 200 Gb/s = 25 GB/s, 400 Gb/s = 50 GB/s
    nics_per_node: int = 1
    sharding: str = FULL
    param_bytes: float = 2.0  # dtype of the all-gathered parameters (bf16)
    reduce_bytes: float = 4.0  # dtype of the gradient reduce-scatter (fp32 reduction)

    def __post_init__(self) -> None:
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be a positive integer, got {self.gpus_per_node!r}")
        if not isinstance(self.nics_per_node, int) or self.nics_per_node < 1:
            raise ValueError(f"nics_per_node must be a positive integer, got {self.nics_per_node!r}")
        for name in ("intra_gbs", "nic_gbs", "param_bytes", "reduce_bytes"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"fabric {name} must be a positive number, got {v!r}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"unknown FSDP sharding {self.sharding!r}; expected one of {SHARDINGS}")

    @property
    def inter_gbs(self) -> float:
        """A node's network bandwidth (all its NICs together)."""
        return self.nic_gbs * self.nics_per_node

    def nodes(self, ranks: int) -> int:
        return max(1, math.ceil(ranks / self.gpus_per_node))

    def link_gbs(self, ranks: int) -> float:
        """Bandwidth of the slowest link a ring over ``ranks`` GPUs crosses."""
        if self.nodes(ranks) == 1:
            return self.intra_gbs
        return min(self.intra_gbs, self.inter_gbs)

    def ring(self, nbytes: float, ranks: int) -> float:
        """Seconds of one all-gather or reduce-scatter of ``nbytes`` (total) over ``ranks``."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        return nbytes * (ranks - 1) / ranks / (self.link_gbs(ranks) * 1e9)

    def shard_group(self, ranks: int) -> int:
        """The ranks one FSDP shard group spans: all of them, or one node's with HSDP."""
        return min(ranks, self.gpus_per_node) if self.sharding == HYBRID else ranks

    def fsdp_pass(self, params: float, ranks: int, trainable: float | None = None) -> float:
        """Communication of one forward+backward pass: all-gather (forward), all-gather (backward),
        reduce-scatter of the ``trainable`` parameters' gradients (all by default; ~0 for LoRA); HSDP
        adds the cross-node all-reduce of the gradient shards."""
        grads = params if trainable is None else trainable
        group = self.shard_group(ranks)
        comm = 2 * self.ring(params * self.param_bytes, group) + self.ring(grads * self.reduce_bytes, group)
        if group < ranks:
            n = self.nodes(ranks)
            comm += 2 * grads * self.reduce_bytes * (n - 1) / n / (self.inter_gbs * 1e9)
        return comm

    def gather_full(self, params: float, ranks: int) -> float:
        """Materialize the full weights on every rank of a sharded pool (TAG's switch, a rollout
        engine's resharding, one forward of sampling through FSDP shards)."""
        return self.ring(params * self.param_bytes, self.shard_group(ranks))

    def all_to_all(self, nbytes: float, ranks: int) -> float:
        """Seconds of one all-to-all in which each of ``ranks`` GPUs holds ``nbytes`` and keeps 1/ranks of
        it (Ulysses sequence parallelism: tokens-sharded to heads-sharded and back)."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        return nbytes * (ranks - 1) / ranks / (self.link_gbs(ranks) * 1e9)

    def send(self, nbytes: float) -> float:
        """One point-to-point stream between pools (a weight pickup): one NIC."""
        return nbytes / (self.nic_gbs * 1e9)
