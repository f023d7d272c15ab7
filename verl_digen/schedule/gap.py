"""Micro-batch formation: the generation-axis pipeline (GAP) and the batch-dimension baseline.

A step's batch is ``P`` prompts x ``n`` samples (the GRPO group). Samples are ordered group-major
(prompt 0's samples first) and cut into micro-batches of ``m`` samples. Advantages need a whole
group, so a micro-batch can enter the Update Queue only when every micro-batch of its *release unit*
(the micro-batches sharing its groups) is scored:

- GAP (``m`` divides ``n``): a group is ``n / m`` micro-batches, spread round-robin over the
  generator workers, so the group completes after ``ceil(n / (m G))`` waves instead of after one
  worker generated it whole. Many small pipeline units.
- batch dimension (``n`` divides ``m``): each micro-batch holds whole prompts and one worker generates
  a prompt's whole group; at most ``P`` units, the first complete only when a worker finished it.

Either way the final gradient is the same (only the accumulation order changes). The planned
sample -> worker assignment is round-robin over micro-batches (micro-batch ``i`` -> worker
``i mod G``), which keeps worker loads within one micro-batch of each other (within one sample when
``m = 1``); the scheduler dispatches dynamically in the same order, so without TAG it reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass

GAP = "gap"
BATCH = "batch"
PARTITIONS = (GAP, BATCH)


@dataclass(frozen=True)
class MicroBatch:
    """One pipeline unit: ``samples`` are (prompt, sample-index) pairs; ``worker`` is the planned one."""

    index: int
    samples: tuple[tuple[int, int], ...]
    unit: int  # release unit: micro-batches of one unit enter the Update Queue together
    worker: int

    @property
    def size(self) -> int:
        return len(self.samples)

    @property
    def prompts(self) -> tuple[int, ...]:
        return tuple(sorted({p for p, _ in self.samples}))


@dataclass(frozen=True)
class Partition:
    """The micro-batches of one step plus the facts the scheduler needs about them."""

    kind: str
    prompts: int
    group_size: int
    mb_size: int
    workers: int
    micro_batches: tuple[MicroBatch, ...]
    unit_size: int  # micro-batches per release unit

    @property
    def count(self) -> int:
        return len(self.micro_batches)

    @property
    def batch(self) -> int:
        return self.prompts * self.group_size

    def worker_loads(self) -> list[int]:
        loads = [0] * self.workers
        for mb in self.micro_batches:
            loads[mb.worker] += mb.size
        return loads

    def group_completion_waves(self) -> list[int]:
        """Per prompt: the 1-based wave (round of micro-batches on the workers) that completes it,
        under the planned assignment with equal generation times."""
        per_worker_pos: dict[int, int] = {}
        done: dict[int, int] = {}
        for mb in self.micro_batches:
            wave = per_worker_pos.get(mb.worker, 0) + 1
            per_worker_pos[mb.worker] = wave
            for p in mb.prompts:
                done[p] = max(done.get(p, 0), wave)
        return [done[p] for p in range(self.prompts)]


def validate(prompts: int, group_size: int, mb_size: int, workers: int, kind: str) -> None:
    """Raise ValueError with a clear message for a configuration no partition can serve."""
    for name, v in (("prompts", prompts), ("group_size", group_size), ("micro-batch size", mb_size)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"the generator pool needs at least one worker, got {workers!r}")
    batch = prompts * group_size
    if batch % mb_size:
        raise ValueError(f"micro-batch size {mb_size} does not divide the batch {prompts} x {group_size} = {batch}")
    if kind == GAP:
        if group_size % mb_size and mb_size % group_size:
            raise ValueError(
                f"GAP micro-batch size {mb_size} must divide the group size {group_size} or be a multiple of it"
            )
    elif kind == BATCH:
        if mb_size % group_size:
            raise ValueError(
                f"batch-dimension micro-batches hold whole prompts: size {mb_size} must be a multiple "
                f"of the group size {group_size}"
            )
    else:
        raise ValueError(f"unknown partition {kind!r}; expected one of {PARTITIONS}")


def partition(prompts: int, group_size: int, mb_size: int, workers: int, kind: str = GAP) -> Partition:
    """Cut ``prompts x group_size`` samples into micro-batches of ``mb_size`` (see module docstring)."""
    validate(prompts, group_size, mb_size, workers, kind)
    samples = [(p, j) for p in range(prompts) for j in range(group_size)]
    unit_size = max(1, group_size // mb_size)
    mbs = []
    for i in range(len(samples) // mb_size):
        chunk = tuple(samples[i * mb_size : (i + 1) * mb_size])
        mbs.append(MicroBatch(index=i, samples=chunk, unit=i // unit_size, worker=i % workers))
    return Partition(kind, prompts, group_size, mb_size, workers, tuple(mbs), unit_size)


def gap_partition(prompts: int, group_size: int, workers: int, mb_size: int | None = None) -> Partition:
    """GAP with a default micro-batch size that spreads one group over all workers."""
    if mb_size is None:
        mb_size = default_gap_mb_size(group_size, workers)
    return partition(prompts, group_size, mb_size, workers, GAP)


def batch_partition(prompts: int, group_size: int, workers: int, mb_size: int | None = None) -> Partition:
    """Batch-dimension baseline; by default one prompt (whole group) per micro-batch."""
    return partition(prompts, group_size, mb_size or group_size, workers, BATCH)


def default_gap_mb_size(group_size: int, workers: int) -> int:
    """Largest divisor of the group size that still gives every worker a piece of a group."""
    best = 1
    for d in range(1, group_size + 1):
        if group_size % d == 0 and group_size // d >= workers:
            best = d
    return best


def spread_mb_size(prompts: int, group_size: int, workers: int) -> int:
    """Largest divisor of the group size that still gives every worker at least one micro-batch of
    the batch (naive disaggregation spread over all generators, one call each where it divides)."""
    best = 1
    for d in range(1, group_size + 1):
        if group_size % d == 0 and prompts * group_size // d >= workers:
            best = d
    return best
