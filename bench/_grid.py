"""Shared synthetic instance of the BTS benchmarks: B micro-batches, update/generation ratio."""

from __future__ import annotations

from verl_digen.schedule.costs import Affine, CostModel, Hardware, Pool

B_VALUES = (8, 16, 32, 64, 128)
RATIOS = (0.1, 0.25, 0.5, 1.0, 2.0)
GEN_WORKERS = 4


def cluster(ratio: float) -> CostModel:
    """4 generator GPUs + 1 trainer GPU; per sample: generate 1.0 s (also on the trainer), score 0.05 s,
    train ``ratio`` s (one pass, no fixed cost); context switch 0.05 s each way, optimizer 0.02 s, sync 0.1 s.
    With one-sample micro-batches and groups of one, B is the number of micro-batches and ``ratio`` the
    update/generation time ratio of one micro-batch (the axes of the paper's Figure 10)."""
    hw = Hardware("synthetic", generate=Affine(0.0, 1.0), score=Affine(0.0, 0.05), train_pass=Affine(0.0, ratio))
    return CostModel(Pool(hw, GEN_WORKERS), Pool(hw, 1), steps_trained=1, switch_to_gen=0.05,
                     switch_to_train=0.05, optimizer_step=0.02, weight_sync=0.1)
