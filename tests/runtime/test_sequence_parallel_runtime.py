"""Ulysses sequence parallelism through the Ray runtime (``actor.ulysses_sequence_parallel_size``).

Two trainer ranks that form one Ulysses group (each holding half of every row's video tokens, FSDP2 over
both) train the tiny Wan2.1 to the weights one trainer rank reaches, with a KL reference (sharded and cut
like the policy), two mini-batches and TAG lending the trainer to generation; each row's loss is counted
once in the metrics.
"""

import pytest
from runtime_helpers import compose_run, train

from verl_digen.models.ulysses import plan_for

pytestmark = pytest.mark.ray

#: two mini-batches (one prompt each): the second trains moved weights, so its ratio, loss and KL are not trivial
WAN = ["model.arch=wan", "model.num_frames=2", "actor.kl_coef=0.05", "digen.tag.policy=static:1",
       "rollout.micro_batch_size=1", "actor.ppo_mini_batch_size=1"]


def test_a_two_rank_ulysses_group_trains_like_one_rank(ray_session, tmp_path):
    res_1, params_1 = train(compose_run(*WAN, tmp_path=tmp_path / "one"))
    res_sp, params_sp = train(compose_run(*WAN, "resources.trainer.workers=2",
                                           "actor.ulysses_sequence_parallel_size=2", tmp_path=tmp_path / "sp"))
    assert params_1.keys() == params_sp.keys() and params_1
    # Wan's time embedding has its gradient summed in float32 upstream (~1e-8 relative apart: the plan's
    # float32_reduced); the second mini-batch trains on weights the first moved, which spreads that to ~1e-9 everywhere
    for name, p in params_1.items():
        tol = 1e-6 if name.startswith(plan_for("wan").float32_reduced) else 1e-8
        worst = float((p - params_sp[name]).abs().max())
        assert worst <= tol, f"{name} differs by {worst:.3e}"
    m1, msp = res_1.reports[-1].metrics, res_sp.reports[-1].metrics
    assert m1["actor/loss"] != 0 and m1["actor/kl"] > 0 and m1["actor/ratio_mean"] != 1
    for key in ("actor/loss", "actor/ratio_mean", "actor/kl"):
        assert msp[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-12), key
