"""Exact values for scheduler pieces that the behavioural tests reach only through comparisons.

Written for survivors of the schedule mutation run (docs/testing.md): BTS's fresh state field by field,
the bounds with a publish over two steps (hand-computed) and with free generation, the GAP size
helpers at their edges, worker loads, the TAG policies at their thresholds, TCSS's stale budget where
float rounding lands just below an integer, and the JSON/dict key names other tools read.
"""

import pytest

from verl_digen.schedule.bounds import step_bounds
from verl_digen.schedule.bts import IDLE, BtsPolicy, ModelState
from verl_digen.schedule.calibration import _row
from verl_digen.schedule.config import DIGEN, SEPARATE, ScheduleConfig
from verl_digen.schedule.costs import StageCosts
from verl_digen.schedule.gap import BATCH, batch_partition, default_gap_mb_size, gap_partition, spread_mb_size
from verl_digen.schedule.policies import Adaptive, BubbleContext, Never, Static


def test_fresh_state_field_by_field():
    s = ModelState.fresh(4, 3, stale_budget=2, slots=2, lagging=1)
    assert (s.now, s.dispatched, s.gen_end, s.gen_task, s.gen_mb) == (0.0, 0, [0.0] * 3, [IDLE] * 3, [-1] * 3)
    assert (s.score_queue, s.next_score_queue, s.scored, s.update_queue, s.not_updated, s.generating) == (
        [], 0, {}, 0, 4, 0)
    assert (s.stale_left, s.next_undispatched, s.gen_lagging, s.slots) == (2, 4, [True, False, False], 2)
    plain = ModelState.fresh(4, 2)
    assert (plain.stale_left, plain.next_undispatched, plain.gen_lagging, plain.slots) == (0, 0, [False, False], 1)


def test_bounds_hand_computed_with_a_publish_between_two_steps():
    c = StageCosts(generate=1.0, tag_generate=2.0, score=0.5, update=0.25, optimizer_step=0.5, publish=1.0)
    b = step_bounds(c, micro_batches=2, gen_workers=1, steps=2)
    # trainer work per step: 2 x 0.25 + 0.5 + 1 x (2 - 1) / 2 = 1.5; the area balances at x = 0.625 TAG mbs
    assert b.as_dict() == {"area": 2.75, "bottleneck": 2.25, "critical_path": 2.125, "ideal": 2.75}


def test_synchronous_bounds_count_every_steps_fill_and_drain():
    c = StageCosts(generate=1.0, tag_generate=2.0, score=0.5, update=0.25, optimizer_step=0.5, publish=1.0)
    b = step_bounds(c, micro_batches=2, gen_workers=1, steps=2, synchronous=True)
    # generators idle from each step's last scoring to the next publish: 2 x (0.25 + 0.5) + 1 x 1.0 = 2.5, so
    # gen(x) = 2 x ((2 - x) x 1 + 2 x 0.5) + 2.5 = 8.5 - 2x against trainer(x) = 2 x (2x + 1.5): x = 11/12,
    # area = (4 x 11/12 + 3) / 2 = 10/3; each step waits for its first unit (1 + 0.5) before its 1.5 of work
    assert b.area == pytest.approx(10 / 3, abs=1e-12)
    assert (b.bottleneck, b.critical_path) == (3.0, 2.125)
    # a run with TCSS may overlap the steps: only the first step's fill counts (the bounds above: 2.75, 2.25)
    loose = step_bounds(c, micro_batches=2, gen_workers=1, steps=2)
    assert (loose.area, loose.bottleneck) == (2.75, 2.25)


def test_bounds_with_free_generation():
    b = step_bounds(StageCosts(generate=0.0, tag_generate=0.0, score=1.0, update=0.5), 2, 2)
    # generators score 2 mbs on 2 workers (1 s), then one update (0.5): 1.5; trainer: first score + 2 updates
    assert (b.area, b.bottleneck, b.critical_path) == (1.5, 2.0, 1.5)


def test_gap_size_helpers_at_their_edges():
    assert default_gap_mb_size(4, 1) == 4 and default_gap_mb_size(8, 3) == 2
    assert spread_mb_size(1, 4, 1) == 4 and spread_mb_size(2, 4, 3) == 2
    assert gap_partition(3, 2, 2, mb_size=1).worker_loads() == [3, 3]
    assert gap_partition(1, 4, 3, mb_size=1).worker_loads() == [2, 1, 1]
    assert batch_partition(2, 2, 1).kind == BATCH


def _ctx(micro_batches=10, undispatched=3, tags=0, free_slots=3):
    costs = StageCosts(generate=1.0, tag_generate=1.0, score=0.1, update=0.1)
    return BubbleContext(step=0, now=0.0, micro_batches=micro_batches, undispatched=undispatched, tags=tags,
                         bubble=1, costs=costs, costs_version=0, unit_size=1, update_size=1, gen_workers=1,
                         snapshot=lambda: None, free_slots=free_slots)


def test_policies_at_their_thresholds():
    assert Never().decide(_ctx()) == 0 and str(Never()) == "never" and str(BtsPolicy()) == "bts"
    assert Static(2).decide(_ctx(tags=1)) == 1
    assert Static(2).decide(_ctx(tags=2)) == 0
    # exactly at the threshold (0.3 x 10 = 3 undispatched) it still lends; one below, it waits
    assert Adaptive(0.3).decide(_ctx(undispatched=3)) == 3
    assert Adaptive(0.3).decide(_ctx(undispatched=2)) == 0
    assert Adaptive(0.0).ratio == 0.0 and Adaptive(1.0).ratio == 1.0
    with pytest.raises(ValueError, match="adaptive ratio"):
        Adaptive(1.5)


def test_update_size_and_stale_budget():
    sep = ScheduleConfig(prompts=4, group_size=2, mb_size=2, mode=SEPARATE)
    assert sep.update_size(1) == 4
    assert ScheduleConfig(prompts=4, group_size=2, mb_size=2, mode=SEPARATE, update="micro_batch").update_size(1) == 1
    # 0.29 x 100 is 28.999999999999996 in floating point: the budget is still 29
    tcss = ScheduleConfig(prompts=25, group_size=4, mb_size=1, mode=DIGEN, staleness=0.29)
    assert tcss.stale_budget() == 29


def test_calibration_row_keys():
    assert _row("f", 2.0, 3.0, "fit", "n") == {"figure": "f", "published": 2.0, "model": 3.0, "error": 0.5,
                                               "role": "fit", "note": "n"}


def test_static_policy_counts_its_tag_micro_batches_across_bubbles():
    # slow generators, one TAG slot: the trainer has many bubbles per step, static:2 may fill only two
    from verl_digen.schedule.costs import uniform_stage_costs
    from verl_digen.schedule.scheduler import StepScheduler
    from verl_digen.schedule.simulator import execute

    costs = uniform_stage_costs(4.0, 0.1, score=0.1, tag_generate=1.0)
    cfg = ScheduleConfig(prompts=8, group_size=2, mb_size=1, steps=2, policy="static:2")
    sched = StepScheduler(cfg, costs, 2)
    tl = execute(sched, costs)
    tags = [r.step for r in tl.records if r.kind == "tag_generate"]
    assert tags.count(0) == 2 and tags.count(1) == 2, tags


def test_profile_defaults_key_names_and_error_locations(tmp_path):
    import json

    import yaml

    from verl_digen.schedule.costs import Affine
    from verl_digen.schedule.profile_io import _SCALARS, FORMAT, VERSION, dump_profile, model_from_dict, model_to_dict

    minimal = {"generator": {"workers": 2, "hardware": {"generate": {"per_unit": 2.0}}}, "trainer": {"workers": 1}}
    m, wl = model_from_dict(minimal)
    assert wl is None and (m.steps_trained, m.keep_fraction) == (1, 1.0)
    assert all(getattr(m, k) == 0.0 for k in _SCALARS)
    assert m.generator.hardware.name == "gpu" and m.generator.hardware.generate == Affine(0.0, 2.0, 0.0)
    assert m.trainer.hardware.train_pass == Affine()
    d = model_to_dict(m, "n")
    assert list(d)[:3] == ["format", "version", "name"]
    assert (d["format"], d["version"], d["name"]) == (FORMAT, VERSION, "n")
    assert d["keep_fraction"] == 1.0 and model_from_dict(d)[0] == m
    for bad, match in (({**minimal, "format": "other"}, "not a verl-digen profile"),
                       ({**minimal, "version": VERSION + 1}, "newer"),
                       ({**minimal, "trainer": {"workers": 1, "hardware": {"score": {"slope": 1}}}},
                        r"trainer\.hardware\.score: unknown keys"),
                       ({**minimal, "baselines": {"bogus": 1.0}}, "baselines: expected"),
                       ({**minimal, "workload": {"bogus": 1}}, "workload: unknown keys")):
        with pytest.raises(ValueError, match=match):
            model_from_dict(bad)
    dump_profile(m, tmp_path / "p.json", "n")
    assert (tmp_path / "p.json").read_text() == json.dumps(d, indent=2) + "\n"
    dump_profile(m, tmp_path / "p.yaml", "n")
    assert list(yaml.safe_load((tmp_path / "p.yaml").read_text()))[:3] == ["format", "version", "name"]
