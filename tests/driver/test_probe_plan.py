"""The after-run probe's plan (no Ray): actions alone, and the pairs it runs two at once."""

import pytest

from verl_digen.config import compose
from verl_digen.driver.probe import OneAtATime, _repetition
from verl_digen.schedule.actions import GENERATE, SCORE, SWITCH_TO_GEN, SWITCH_TO_TRAIN, TAG_GENERATE, UPDATE
from verl_digen.schedule.costs import PAIRED, uniform_stage_costs
from verl_digen.schedule.executor import SimBackend, events


def _rows(step, pairs):
    return [(p, s) for p, s in pairs], ["a prompt"] * len(pairs)


def test_the_probe_runs_generations_and_scores_two_at_once_with_the_trainer_switched():
    cfg = compose(["data.train_batch_size=2", "rollout.n=2", "rollout.micro_batch_size=2", "rollout.num_steps=3",
                   "rollout.train_steps=2", "trainer=digen", "digen.tag.policy=never"])
    groups = _repetition(cfg, _rows, 5, (0, 0))
    kinds = [[a.kind for a, _, _ in g] for g in groups]
    alone = [k for (k,) in (g for g in kinds if len(g) == 1)]
    assert alone == [GENERATE, SCORE, UPDATE, GENERATE, SCORE, UPDATE, SWITCH_TO_GEN, TAG_GENERATE,
                     GENERATE, TAG_GENERATE, SWITCH_TO_TRAIN]  # each alone, right before the two at once
    pairs = [g for g in groups if len(g) == 2]  # at the micro-batch size (TAG's): generations, then their scores
    assert [[a.kind for a, _, _ in g] for g in pairs] == [[GENERATE, TAG_GENERATE], [SCORE, SCORE]]
    assert kinds.index([GENERATE, TAG_GENERATE]) > kinds.index([SWITCH_TO_GEN])  # with the trainer switched
    assert kinds[-1] == [SWITCH_TO_TRAIN]
    for gens, scores in zip(pairs[::2], pairs[1::2]):
        (g, _, gs), (t, _, ts) = gens
        i = groups.index(gens)  # the same two generations alone, just before: the ratio's reference
        assert [gs["alone"], ts["alone"]] == [groups[i - 2][0][0], groups[i - 1][0][0]]
        assert [(a.kind, a.workers, len(a.samples)) for a in (gs["alone"], ts["alone"])] == [
            (g.kind, g.workers, len(g.samples)), (t.kind, t.workers, len(t.samples))]
        assert (gs["kind"], gs["action"], gs["beside"]) == (PAIRED, GENERATE, TAG_GENERATE)
        assert (ts["kind"], ts["action"], ts["beside"]) == (PAIRED, TAG_GENERATE, GENERATE)
        assert len(g.samples) == len(t.samples) == gs["size"] == ts["size"]
        assert [a.mb for a, _, _ in scores] == [g.mb, t.mb]  # each pool scores its own generation
        assert not {g.mb, t.mb} & {a.mb for grp in groups[:i - 2] for a, _, _ in grp}  # not an earlier id
    assert [gs["size"] for (_, _, gs), _ in pairs[::2]] == [cfg.rollout.micro_batch_size]


def test_a_group_is_launched_at_once_and_each_action_timed():
    """Each group starts when the one before completed; the actions of a group start together."""
    from verl_digen.schedule.actions import Action

    one, two, three = (Action(GENERATE, (w,), 0, 0, 0) for w in ("gen0", "tag0", "gen1"))
    sched = OneAtATime([[one], [two, three]])
    backend = SimBackend(uniform_stage_costs(generate=1.0, update=1.0))
    for _ in events(sched, backend):
        pass
    assert sched.done and two.issued == three.issued == pytest.approx(1.0)
    assert [sched.seconds[id(a)] for a in (one, two, three)] == pytest.approx([1.0, 1.0, 1.0])


def test_a_paired_sample_carries_the_seconds_of_its_action_alone():
    from verl_digen.driver.probe import _paired, _sample
    from verl_digen.schedule.actions import Action

    before = Action(GENERATE, ("gen0",), 0, 0, 0)
    got = _sample(_paired(GENERATE, TAG_GENERATE, 4, before), {id(before): 0.25})
    assert got == {"kind": PAIRED, "action": GENERATE, "beside": TAG_GENERATE, "size": 4, "alone": 0.25}
