"""MixGRPO through the Ray runtime: digen (TAG, TSP, GAP) equals colocated in float64 over two steps whose SDE
windows differ (progressive: the window moves on between the steps)."""

import pytest
from runtime_helpers import compose_run, train

from verl_digen.schedule.actions import TAG_GENERATE

pytestmark = pytest.mark.ray

MIX = ["algorithm.name=mix_grpo", "rollout.num_steps=6", "rollout.train_steps=2", "rollout.sample_strategy=progressive",
       "trainer.total_steps=2"]


def test_mix_grpo_digen_with_tag_and_tsp_equals_colocated_over_two_steps(ray_session, tmp_path):
    digen = compose_run(*MIX, "trainer=digen", "digen.tag.policy=static:2", "digen.tsp.degree=2",
                        "digen.gap.enable=true", "rollout.micro_batch_size=1", tmp_path=tmp_path / "d")
    colocated = compose_run(*MIX, "trainer=colocated", tmp_path=tmp_path / "c")
    sel = digen.sampler().selection
    assert [sel.window(6, 0, s) for s in range(2)] == [(2, 4), (4, 6)]  # the window slides between the steps
    res_d, params_d = train(digen)
    res_c, params_c = train(colocated)
    assert [r for r in res_d.timeline.records if r.kind == TAG_GENERATE], "TAG was forced on but never ran"
    assert len(res_d.reports) == len(res_c.reports) == 2
    worst = max(float((params_d[k].double() - params_c[k].double()).abs().max()) for k in params_c)
    assert worst <= 1e-10, f"parameters differ by {worst:.3e}"
    moved = [abs(a.metrics["reward/mean"] - b.metrics["reward/mean"]) for a, b in zip(res_d.reports, res_c.reports)]
    assert max(moved) <= 1e-10, moved
