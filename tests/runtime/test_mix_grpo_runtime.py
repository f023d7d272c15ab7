"""GRPO-Guard, Flow-DPPO and DiffusionNFT through the Ray runtime (one module: one Ray session): digen (TAG, TSP,
GAP) equals colocated in float64 over two steps. GRPO-Guard and Flow-DPPO train two mini-batches per step, so the
second one's old transition mean is the step's starting weights', not the current ones (Flow-DPPO's threshold is
low enough that rows are dropped); DiffusionNFT's old copy lags the weights (a fixed decay), so step 2's v_old is
neither the initial nor the trained weights. The one-rank digen run with GAP, TSP of degree 2 and TAG on its one
trainer rank is held here (for GRPO's loss family). MixGRPO's sliding window (digen and colocated against verl's
loop) is test_mini_batches_runtime.py's."""

import pytest
from runtime_helpers import compose_run, train

from verl_digen.schedule.actions import TAG_GENERATE

pytestmark = pytest.mark.ray

#: 2 prompts, one per mini-batch: two optimizer steps per global step
MINI = ["actor.ppo_mini_batch_size=1", "actor.lr=0.02", "trainer.total_steps=2"]
CASES = {
    "grpo_guard": ["algorithm.name=grpo_guard", *MINI],
    "flow_dppo": ["algorithm.name=flow_dppo", "actor.kl_mask_threshold=1e-12", *MINI],
}


def _equal_over_two_steps(digen, colocated):
    """Train both; digen's TAG ran, and parameters, reward and loss equal colocated's to 1e-10 at each step.
    Returns digen's run."""
    res_d, params_d = train(digen)
    res_c, params_c = train(colocated)
    assert [r for r in res_d.timeline.records if r.kind == TAG_GENERATE], "TAG was forced on but never ran"
    assert len(res_d.reports) == len(res_c.reports) == 2
    worst = max(float((params_d[k].double() - params_c[k].double()).abs().max()) for k in params_c)
    assert worst <= 1e-10, f"parameters differ by {worst:.3e}"
    for a, b in zip(res_d.reports, res_c.reports):
        for key in ("reward/mean", "actor/loss"):
            assert abs(a.metrics[key] - b.metrics[key]) <= 1e-10, (key, a.metrics[key], b.metrics[key])
    return res_d


@pytest.mark.parametrize("name", list(CASES))
def test_digen_with_tag_and_tsp_equals_colocated_over_two_steps(name, ray_session, tmp_path):
    case = CASES[name]
    digen = compose_run(*case, "trainer=digen", "digen.tag.policy=static:2", "digen.tsp.degree=2",
                        "digen.gap.enable=true", "rollout.micro_batch_size=1", tmp_path=tmp_path / "d")
    colocated = compose_run(*case, "trainer=colocated", tmp_path=tmp_path / "c")
    res_d = _equal_over_two_steps(digen, colocated)
    if name == "flow_dppo":  # the second mini-batch's rows moved past the threshold: some were dropped
        assert max(r.metrics["actor/clip_frac"] for r in res_d.reports) > 0


NFT = ["algorithm.name=diffusion_nft", "algorithm.old_policy_decay=0.5", "actor.mix_beta=0.3", "actor.kl_coef=0.05",
       "actor.lr=0.02", "trainer.total_steps=2"]


def test_diffusion_nft_digen_with_tag_and_tsp_equals_colocated_over_two_steps(ray_session, tmp_path):
    digen = compose_run(*NFT, "trainer=digen", "digen.tag.policy=static:2", "digen.tsp.degree=1",
                        "digen.tsp.rows_per_pass=3", "digen.gap.enable=true", "rollout.micro_batch_size=1",
                        tmp_path=tmp_path / "d")
    colocated = compose_run(*NFT, "trainer=colocated", tmp_path=tmp_path / "c")
    assert digen.sampler().clean_only and digen.sampler().selection.kind == "random_k"
    _equal_over_two_steps(digen, colocated)
