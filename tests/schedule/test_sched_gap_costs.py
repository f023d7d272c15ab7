"""GAP partition, the cost model (fixed + per-row, TSP, colocated phases) and the online profiler."""

from __future__ import annotations

import itertools

import pytest

from verl_digen.schedule.bounds import step_bounds
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import Affine, CostModel, Hardware, Pool, StageCosts, passes
from verl_digen.schedule.gap import batch_partition, gap_partition, partition
from verl_digen.schedule.profiler import Profiler
from verl_digen.schedule.scheduler import StepScheduler
from verl_digen.schedule.simulator import execute


def test_paper_example_two_gpus_two_prompts_two_samples():
    bd = batch_partition(prompts=2, group_size=2, workers=2)
    gap = gap_partition(prompts=2, group_size=2, workers=2)
    assert bd.count == 2 and gap.count == 4  # GAP: more pipeline units
    # one group's samples on different workers under GAP, on one worker under batch partition
    assert {mb.worker for mb in gap.micro_batches if mb.prompts == (0,)} == {0, 1}
    assert {mb.worker for mb in bd.micro_batches if mb.prompts == (0,)} == {0}
    # first group done after one wave of micro-batches; time = waves x per-micro-batch generation time
    per_sample = Affine(0.0, 1.0)
    t_bd = min(bd.group_completion_waves()) * per_sample(bd.mb_size)
    t_gap = min(gap.group_completion_waves()) * per_sample(gap.mb_size)
    assert t_gap == pytest.approx(t_bd / 2)
    # and the scheduler agrees: first update starts earlier under GAP
    costs_model = CostModel(Pool(Hardware(generate=per_sample, score=Affine(0, 0.01),
                                          train_pass=Affine(0, 0.1)), 2),
                            Pool(Hardware(generate=per_sample, train_pass=Affine(0, 0.1)), 1))

    def first_update(kind: str, m: int) -> float:
        cfg = ScheduleConfig(prompts=2, group_size=2, mb_size=m, partition=kind)
        costs = costs_model.stage_costs(m)
        tl = execute(StepScheduler(cfg, costs, 2), costs)
        return min(r.start for r in tl.records if r.kind == "update")

    assert first_update("gap", 1) < first_update("batch", 2)


@pytest.mark.parametrize("P,n,G", list(itertools.product([1, 2, 3, 8], [1, 2, 4, 6, 8], [1, 2, 3, 4, 8])))
def test_gap_groups_complete_and_load_balanced(P, n, G):
    part = gap_partition(P, n, G)
    samples = [s for mb in part.micro_batches for s in mb.samples]
    assert sorted(samples) == [(p, j) for p in range(P) for j in range(n)]  # every sample exactly once
    for mb in part.micro_batches:  # a unit's micro-batches cover whole groups
        unit = [x for x in part.micro_batches if x.unit == mb.unit]
        prompts = {p for x in unit for p, _ in x.samples}
        assert sum(x.size for x in unit) == len(prompts) * n
    loads = part.worker_loads()
    assert max(loads) - min(loads) <= part.mb_size
    if n >= G and n % G == 0:  # group spread over all workers: balanced to the sample, groups in order
        assert max(loads) - min(loads) <= 1
        assert part.group_completion_waves() == sorted(part.group_completion_waves())
    if part.mb_size == 1:
        assert max(loads) - min(loads) <= 1


def test_gap_spreads_groups_batch_partition_does_not():
    gap = gap_partition(prompts=4, group_size=8, workers=4)
    assert gap.mb_size == 2 and gap.unit_size == 4
    assert gap.group_completion_waves() == [1, 2, 3, 4]
    bd = batch_partition(prompts=4, group_size=8, workers=4)
    assert bd.group_completion_waves() == [1, 1, 1, 1]  # all groups finish together, late


def test_partition_errors():
    with pytest.raises(ValueError, match="does not divide"):
        partition(3, 2, 4, 2)
    with pytest.raises(ValueError, match="divide the group size"):
        partition(2, 6, 4, 2, "gap")  # 4 neither divides 6 nor is a multiple of it
    with pytest.raises(ValueError, match="at least one worker"):
        partition(2, 2, 1, 0)
    with pytest.raises(ValueError, match="unknown partition"):
        partition(2, 2, 1, 1, "diagonal")


def test_train_cost_is_fixed_plus_per_row_and_tsp_amortizes_the_fixed_part():
    hw = Hardware(train_pass=Affine(fixed=1.0, per_unit=0.1), generate=Affine(0.5, 1.0))
    model = CostModel(Pool(hw, 4), Pool(hw, 2), steps_trained=6)
    assert passes(6, 1) == [1] * 6 and passes(6, 4) == [4, 2] and passes(6, 10) == [6]
    seq = model.stage_costs(2, tsp_degree=1).update  # 6 passes x (1 + 0.1 x 1 row per rank)
    tsp = model.stage_costs(2, tsp_degree=6).update  # 1 pass x (1 + 0.1 x 6 rows per rank)
    assert seq == pytest.approx(6 * 1.1)
    assert tsp == pytest.approx(1.6)
    # not linear in the micro-batch size
    assert model.stage_costs(4, 6).update < 2 * model.stage_costs(2, 6).update
    # TAG: each trainer rank is its own generator slot and samples a whole micro-batch
    assert model.stage_costs(4).tag_generate == pytest.approx(hw.generate(4))


def test_colocated_phases_use_every_gpu_and_the_slowest_hardware():
    fast = Hardware("fast", generate=Affine(0, 1.0), score=Affine(0, 0.1), train_pass=Affine(0.5, 0.2))
    slow = Hardware("slow", generate=Affine(0, 2.0), score=Affine(0, 0.1), train_pass=Affine(0.5, 0.4))
    model = CostModel(Pool(slow, 2), Pool(fast, 2), steps_trained=2)
    ph = model.colocated_phases(batch=8)
    assert ph["generate"] == pytest.approx(2.0 * 2)  # 2 samples per GPU, slow GPUs decide
    assert ph["update"] == pytest.approx(2 * (0.5 + 0.4 * 2))


def test_profiler_warmup_and_running_mean():
    prior = StageCosts(generate=1.0, tag_generate=1.0, score=0.1, update=0.5)
    prof = Profiler(prior, warmup=1)
    assert prof.estimate() == prior
    prof.observe("generate", 10.0)  # cold start, ignored
    assert prof.estimate().generate == 1.0
    prof.observe("generate", 2.0)
    prof.observe("generate", 4.0)
    assert prof.estimate().generate == pytest.approx(3.0)
    prof.observe("weight_sync", 0.7)  # prior 0: even a warm-up observation beats it
    assert prof.estimate().weight_sync == pytest.approx(0.7)
    with pytest.raises(ValueError):
        prof.observe("nap", 1.0)
    with pytest.raises(ValueError):
        prof.observe("update", -1.0)


def test_bounds_equal_hand_computed_values():
    """One micro-batch, one generator, one trainer rank: g 2, TAG 3, score 0.5, update 1, optimizer 0.25,
    publish 0.125. Area: the half micro-batch split, max(2 x 0.5 + 0.5 + 1.25, 3 x 0.5 + 1.25) = 2.75;
    bottleneck: fill (one generation + score, 2.5) + trainer work 1.25; critical path: generate, score,
    update, optimizer step = 3.75. Two steps: the second adds the trainer's work with one publish."""
    costs = StageCosts(generate=2.0, tag_generate=3.0, score=0.5, update=1.0, optimizer_step=0.25, publish=0.125)
    one = step_bounds(costs, 1, 1)
    assert (one.area, one.bottleneck, one.critical_path) == pytest.approx((2.75, 3.75, 3.75))
    two = step_bounds(costs, 1, 1, steps=2)
    assert two.critical_path == pytest.approx((3.75 + 1.0 + 0.25 + 0.125) / 2)
    # with four TAG slots the trainer side of the area shrinks: x = 2.5 / 2.75 balances 3.75 - 2x and 0.75x + 1.25
    four = step_bounds(costs, 1, 1, trainer_ranks=4)
    assert four.area == pytest.approx(3.75 - 2 * (2.5 / 2.75))


def test_gap_group_completion_is_the_last_wave_of_the_group():
    assert gap_partition(2, 3, 2, mb_size=1).group_completion_waves() == [2, 3]
