"""A mixed cluster's strongest colocated alternative: the baselines on one pool's GPUs alone
(``split_search.pool_alone`` / ``best_subsets``), as the dry run and the ladder print them."""

import pytest

from verl_digen.schedule import presets
from verl_digen.schedule.costs import Affine, CostModel, Hardware, Pool
from verl_digen.schedule.profile_io import Workload
from verl_digen.schedule.split_search import baseline_config, best_subsets, colocated_baselines, pool_alone

SLOW = Hardware("slow", generate=Affine(1.0, 4.0), score=Affine(0.0, 0.1), train_pass=Affine(0.2, 2.0))
FAST = Hardware("fast", generate=Affine(0.5, 1.0), score=Affine(0.0, 0.1), train_pass=Affine(0.1, 0.5))
MIXED = CostModel(Pool(SLOW, 4), Pool(FAST, 4), steps_trained=2)
WL = Workload(prompts=4, group_size=4, mb_size=4, steps=2)


def test_pool_alone_keeps_one_hardware_and_the_pool_size():
    alone = pool_alone(MIXED, "trainer")
    assert (alone.generator.hardware, alone.trainer.hardware) == (FAST, FAST)
    assert (alone.generator.workers, alone.trainer.workers) == (2, 2)
    assert pool_alone(CostModel(Pool(SLOW, 1), Pool(FAST, 3)), "generator") is None  # one GPU: no colocated run
    with pytest.raises(ValueError, match="pool must be one of"):
        pool_alone(MIXED, "colocated")


def test_best_subset_is_the_faster_pool_that_fits():
    cfg = baseline_config(WL)
    subsets, notes = best_subsets(MIXED, cfg)
    assert {s.pool for s in subsets.values()} == {"trainer"}  # the fast pool wins every baseline
    assert not subsets["verl-omni"].memory_checked and notes == ["best-subset: memory not checked (no run config)"]
    # on the fast GPUs alone it beats all 8 GPUs paced by the slow ones
    assert subsets["verl-omni"].result.step_time < colocated_baselines(MIXED, WL)["verl-omni"].step_time
    # the fast pool does not fit: the slow one is what is left, and the note says why
    left, notes = best_subsets(MIXED, cfg, fits=lambda pool: pool == "generator")
    assert {s.pool for s in left.values()} == {"generator"} and left["ideal"].memory_checked
    assert notes == ["best-subset: colocated on the trainer pool's 4 GPUs alone (fast) does not fit their memory"]
    assert left["verl-omni"].result.step_time > subsets["verl-omni"].result.step_time
    none, notes = best_subsets(MIXED, cfg, fits=lambda pool: False)
    assert none == {} and len(notes) == 2


def test_hetero_preset_subset_is_re_derived_on_the_stronger_testbed():
    """The issue's figure: colocated:verl-omni on the 8 C cards alone, not all 16 at the A cards' pace."""
    p = presets.get("hunyuanvideo-13b-hetero")
    alone = pool_alone(p.model, "trainer", p.spec)
    assert alone.generator.hardware == alone.trainer.hardware  # one testbed, sharded over these 8 GPUs
    assert alone.generator.hardware.name == p.spec.train.gpu.name and alone.total_workers == 8
    wl = Workload(prompts=32, group_size=16, mb_size=16, steps=3)
    subsets, _ = best_subsets(p.model, baseline_config(wl), p.spec)
    assert subsets["verl-omni"].pool == "trainer"
    assert subsets["verl-omni"].result.step_time == pytest.approx(1750.6, abs=0.1)
    assert subsets["ideal"].result.step_time < subsets["verl-omni-bypass"].result.step_time \
        < subsets["verl-omni"].result.step_time


def test_strongest_baseline_is_the_fastest_user_run_never_this_projects_colocated():
    from verl_digen.schedule.split_search import STRONGEST, against_baseline, strongest_baseline

    times = {"ideal": 1.0, "native": 9.0, "verl-omni": 5.0, "verl-omni-bypass": 4.0}
    # colocated:ideal (trainer=colocated, a layout the planner searches) is faster but is no baseline
    assert strongest_baseline(times) == ("colocated:verl-omni-bypass", 4.0)
    assert strongest_baseline({**times, "native": 3.5}) == ("colocated:native", 3.5)
    # on a mixed cluster a subset run can be stronger than every run on all GPUs; an ideal subset never counts
    subsets, _ = best_subsets(MIXED, baseline_config(WL))
    fast = {b: s.result.step_time for b, s in subsets.items()}
    label, t = strongest_baseline({b: 100.0 for b in times}, subsets)
    assert t == min(fast["verl-omni"], fast["verl-omni-bypass"]) and label.startswith("best-subset colocated:")
    assert "trainer pool's 4 GPUs alone (fast)" in label
    assert strongest_baseline({b: 0.1 for b in times}, subsets)[1] == 0.1
    with pytest.raises(ValueError, match="no user baseline"):
        strongest_baseline({"ideal": 1.0})
    # against_baseline: one named baseline, or the strongest
    colos = colocated_baselines(MIXED, WL)
    assert against_baseline(colos, "verl-omni") == ("colocated:verl-omni", colos["verl-omni"].step_time)
    want = min(colos[b].step_time for b in ("native", "verl-omni", "verl-omni-bypass"))
    assert against_baseline(colos, STRONGEST)[1] == want


def test_separate_baseline_is_verl_omnis_synchronous_mode_on_the_two_pools():
    from verl_digen.schedule.split_search import SEPARATE_BASELINE, separate_baseline, strongest_baseline

    res = separate_baseline(MIXED, WL)
    # one batched call per generator where whole groups divide its share (4 x 4 samples over 4 generators: 4)
    assert (res.config.mode, res.config.mb_size, res.config.policy, res.config.staleness) == ("separate", 4, "never", 0)
    assert res.label == SEPARATE_BASELINE
    # generation, scoring and training one after the other: never faster than the generator pool's share of
    # generation plus one training pass of the batch's rows on the trainer pool
    share = WL.prompts * WL.group_size // MIXED.generator.workers
    gen = MIXED.generator.hardware.generate
    assert res.step_time >= gen.fixed + gen.per_unit * share + MIXED.trainer.hardware.train_pass.fixed
    # a share that whole groups do not divide falls back to GAP's spread
    three = CostModel(Pool(SLOW, 3), Pool(FAST, 4), steps_trained=2)
    assert separate_baseline(three, WL).config.mb_size < WL.prompts * WL.group_size // 3
    # the strongest baseline counts it on a mixed cluster
    assert strongest_baseline({"verl-omni": 1e9}, None, res.step_time) == (SEPARATE_BASELINE, res.step_time)


def test_a_baseline_that_does_not_fit_is_never_the_strongest():
    from verl_digen.schedule.split_search import STRONGEST, against_baseline, strongest_baseline

    times = {"ideal": 1.0, "native": 9.0, "verl-omni": 5.0, "verl-omni-bypass": 4.0}
    assert strongest_baseline(times, unfit={"verl-omni-bypass"}) == ("colocated:verl-omni", 5.0)
    assert strongest_baseline(times, unfit={"verl-omni", "verl-omni-bypass"}) == ("colocated:native", 9.0)
    with pytest.raises(ValueError, match="no user baseline that fits"):
        strongest_baseline(times, unfit={"native", "verl-omni", "verl-omni-bypass"})
    colos = colocated_baselines(MIXED, WL)
    assert against_baseline(colos, "verl-omni", unfit={"verl-omni"})[0] == \
        "colocated:verl-omni (does not fit its GPUs' memory)"
    assert against_baseline(colos, STRONGEST, unfit={"verl-omni", "verl-omni-bypass"})[0] == "colocated:native"


def test_a_memory_cap_splits_verl_omnis_per_timestep_passes_and_never_packs_more():
    colos = colocated_baselines(MIXED, WL)  # 16 samples on 8 GPUs: 2 rows per rank per timestep
    one = colocated_baselines(MIXED, WL, rows={b: 1 for b in colos})
    roomy = colocated_baselines(MIXED, WL, rows={b: 64 for b in colos})
    for b in ("ideal", "verl-omni", "verl-omni-bypass"):
        assert one[b].step_time > colos[b].step_time == roomy[b].step_time, b
    assert one["native"].step_time == colos["native"].step_time  # one row per pass already
