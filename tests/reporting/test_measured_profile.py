"""The runtime's measured profile (no Ray): the run's records, the probe's samples and pooled hardware."""

from dataclasses import replace

import pytest

from verl_digen.config import compose
from verl_digen.reporting.metrics import (
    busy_others,
    host_contention,
    measured_profile,
    sharding_adds,
)
from verl_digen.schedule.actions import GENERATE, OPTIMIZER_STEP, SCORE, TAG_GENERATE, UPDATE
from verl_digen.schedule.costs import Affine, Sharded
from verl_digen.schedule.profile_io import dump_profile, load
from verl_digen.schedule.timeline import TRAINER, Record, Timeline

BASE = ["data.train_batch_size=2", "rollout.n=2", "rollout.micro_batch_size=2", "rollout.num_steps=3",
        "rollout.train_steps=2", "trainer=digen", "digen.tag.policy=never"]


def _timeline() -> Timeline:
    """Two steps of 1 generator + 1 trainer rank (the first is warm-up and not a cost)."""
    tl = Timeline(["gen0", TRAINER], micro_batches=1, steps=2)
    for step, slow in ((0, 10.0), (1, 1.0)):
        t = 10.0 * step
        tl.add(Record("gen0", GENERATE, 0, step, step, t, t + 0.10 * slow, samples=2))
        tl.add(Record("gen0", SCORE, 0, step, step, t + 0.2, t + 0.21, samples=2))
        tl.add(Record(TRAINER, UPDATE, 0, step, step, t + 0.3, t + 0.35, samples=2))
        tl.add(Record(TRAINER, OPTIMIZER_STEP, None, step, step, t + 0.4, t + 0.41))
    return tl


#: the probe, one action at a time: generation at two sizes (per call 0.04 s + 0.01 s per sample),
#: a TAG cycle on the trainer (switches, one micro-batch on a trainer rank)
PROBES = [
    {"pool": "generator", "kind": "generate", "size": 2, "seconds": 0.06},
    {"pool": "generator", "kind": "generate", "size": 4, "seconds": 0.08},
    {"kind": "switch_to_gen", "seconds": 0.003},
    {"kind": "tag_generate", "size": 2, "seconds": 0.06},
    {"kind": "switch_to_train", "seconds": 0.001},
]


def test_probe_gives_the_shape_and_the_run_the_level():
    model, _ = measured_profile(compose(BASE), _timeline(), PROBES)
    gen = model.generator.hardware.generate
    assert gen(2) == pytest.approx(0.10)  # the run's level at its own size (its contention included)
    assert gen(4) / gen(2) == pytest.approx(0.08 / 0.06)  # the probe's per-call vs per-sample split
    assert model.switch_to_gen == pytest.approx(0.003) and model.switch_to_train == pytest.approx(0.001)
    assert model.optimizer_step == pytest.approx(0.01)  # the run's own measurement
    # one hardware type: a trainer rank generates (TAG) at the generator's cost, though this run never did
    trn = model.trainer.hardware
    assert [trn.generate(n) for n in (2, 4)] == pytest.approx([gen(2), gen(4)])
    assert trn.score(2) == pytest.approx(model.generator.hardware.score(2)) and trn.score(2) > 0


def test_pools_of_different_hardware_are_not_pooled():
    cfg = compose([*BASE, "resources.generator.node_resource=nodeA", "resources.trainer.node_resource=nodeB"])
    model, _ = measured_profile(cfg, _timeline(), PROBES)
    assert model.generator.hardware.generate(2) == pytest.approx(0.10)
    assert model.trainer.hardware.generate(2) == pytest.approx(0.06)  # its own TAG probe only
    assert model.trainer.hardware.score(2) == 0.0  # never measured on the trainer's hardware


def test_without_probes_a_never_run_cannot_price_tag():
    model, _ = measured_profile(compose([*BASE, "resources.generator.node_resource=nodeA",
                                         "resources.trainer.node_resource=nodeB"]), _timeline())
    assert model.trainer.hardware.generate(2) == 0.0 and model.switch_to_gen == 0.0


def test_the_fit_recovers_per_call_overhead_and_per_row_compute_exactly():
    """Synthetic records at two sizes, each duration exactly overhead + rows x per-row (float64): the fit
    gives both back to rounding, and one load spike (a call 20x its peers) moves neither."""
    gen, score = (0.0375, 0.0125), (0.004, 0.0005)  # (per call, per sample)
    train = (0.02, 0.003)  # one training pass: per call, per row (K = 2 steps trained in one pass: 2 rows a sample)
    tl = Timeline(["gen0", TRAINER], micro_batches=2, steps=4)
    for step in range(4):
        t = 10.0 * step
        for i, n in enumerate((2, 4, 2, 4) if step else (2, 4)):  # step 0 is warm-up: dropped whatever it holds
            spike = 20.0 if (step, i) == (2, 0) else 1.0
            tl.add(Record("gen0", GENERATE, i, step, step, t, t + spike * (gen[0] + gen[1] * n), samples=n))
            tl.add(Record("gen0", SCORE, i, step, step, t + 1, t + 1 + score[0] + score[1] * n, samples=n))
            tl.add(Record(TRAINER, UPDATE, i, step, step, t + 2, t + 2 + train[0] + train[1] * 2 * n, samples=n))
    model, _ = measured_profile(compose(BASE), tl)
    hw = model.generator.hardware
    for got, want in ((hw.generate, gen), (hw.score, score), (model.trainer.hardware.train_pass, train)):
        assert (got.fixed, got.per_unit) == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_fit_affine_is_least_squares_and_refuses_one_size():
    from verl_digen.schedule.profile_io import fit_affine

    # y = 1 + 2x at x = 0, 1, 2 with the middle point 0.3 high: the least-squares line is 1.1 + 2x
    got = fit_affine([(0.0, 1.0, 1.0), (1.0, 3.3, 1.0), (2.0, 5.0, 1.0)])
    assert (got.fixed, got.per_unit) == pytest.approx((1.1, 2.0), rel=1e-12)
    assert fit_affine([(1.0, 2.0, 1.0), (2.0, 1.0, 1.0)]).per_unit == 0.0  # falling: the mean, per call
    through_origin = fit_affine([(1.0, 1.0, 1.0), (3.0, 4.0, 1.0)])  # the line's intercept would be -0.5
    assert through_origin.fixed == 0.0 and through_origin.per_unit == pytest.approx(13 / 10)
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_affine([(2.0, 1.0, 1.0), (2.0, 3.0, 2.0)])


#: the probe's sharding samples: an all-gather between two processes at 8 and 8,008 bytes (1 ms + 0.125 us per
#: byte) and the trainer's collective counts
SHARDING = [{"kind": "all_gather", "size": 8, "seconds": 0.001001},
            {"kind": "all_gather", "size": 8008, "seconds": 0.002001},
            {"kind": "sharded_calls", "pass_calls": 8, "pass_bytes": 3000, "switch_calls": 66, "switch_bytes": 1000,
             "step_calls": 1}]


def test_a_one_rank_profile_prices_what_sharding_the_trainer_adds():
    model, _ = measured_profile(compose(BASE), _timeline(), PROBES + SHARDING)
    c = model.sharded.collective
    assert (c.fixed, c.per_unit) == pytest.approx((0.001, 1.25e-7), rel=1e-9)
    one = model.stage_costs(2)  # the run's own layout (one trainer rank): nothing added
    assert (one.switch_to_gen, one.optimizer_step) == (model.switch_to_gen, model.optimizer_step)
    two = model.with_workers(1, 2).stage_costs(2)  # two ranks: 66 gathers of the state, one norm reduction
    assert two.switch_to_gen == pytest.approx(model.switch_to_gen + 66 * 0.001 + 1.25e-7 * 1000)
    assert two.optimizer_step == pytest.approx(model.optimizer_step + 0.001)
    # colocated on both workers: the same per switch and step, and 8 collectives (3,000 bytes) per training pass
    ph = model.colocated_phases(4, tsp_degree=1)
    assert ph["switch_to_gen"] == pytest.approx(two.switch_to_gen)
    assert ph["optimizer_step"] == pytest.approx(two.optimizer_step)
    plain = replace(model, sharded=Sharded()).colocated_phases(4, tsp_degree=1)
    assert ph["update"] - plain["update"] == pytest.approx(2 * (8 * 0.001 + 1.25e-7 * 3000))  # K = 2 passes
    # a run whose trainer is sharded measured its collectives: no term on top
    col, _ = measured_profile(compose([*BASE, "trainer=colocated"]), _timeline(), PROBES + SHARDING)
    assert col.sharded == Sharded()


#: the probe's own work sharded over two processes (``collective_probe.time_sharded``): a training pass at 2 and 8
#: rows per rank (alone, unsharded with both busy, sharded with both busy), the switch's gather, the optimizer step
WORK = [{"kind": "sharded_work", "work": "pass", "size": 2, "alone": 0.010, "plain": 0.015, "sharded": 0.027},
        {"kind": "sharded_work", "work": "pass", "size": 8, "alone": 0.020, "plain": 0.030, "sharded": 0.048},
        {"kind": "sharded_work", "work": "switch", "alone": 0.001, "plain": 0.002, "sharded": 0.052},
        {"kind": "sharded_work", "work": "step", "alone": 0.002, "plain": 0.003, "sharded": 0.011}]


def test_the_probes_sharded_work_sets_each_works_latency_per_collective():
    """Sharding adds per pass the sharded pass (both processes busy) less the time alone, in time-alone units (the
    simulator slows both by the update's contention, so it prices the probe's sharded pass): with no contention
    0.017 at 2 rows and 0.028 at 8 (per pass 0.04 / 3, per row 0.011 / 6); at contention 0.5, 0.027 / 1.5 - 0.010
    and 0.048 / 1.5 - 0.020. The switch (stash and gather) and the step add sharded - unsharded, both busy (0.050,
    0.008): an unsharded rank's switch only stashes, which the profile's own switch_to_gen holds. Each work's
    collectives share what is left after the bytes (0.125 us each)."""
    added, per_row = sharding_adds(WORK)
    assert added == pytest.approx({"pass": 0.04 / 3, "switch": 0.050, "step": 0.008})
    assert per_row == pytest.approx(0.011 / 6)
    assert sharding_adds(WORK, 0.5) == (pytest.approx({"pass": 0.02 / 3, "switch": 0.050, "step": 0.008}),
                                        pytest.approx(0.004 / 6))
    model, _ = measured_profile(compose(BASE), _timeline(), PROBES + SHARDING + WORK)
    assert "update" not in dict(model.host_contention)  # this run's update never overlapped anything
    sh = model.sharded
    assert sh.pass_latency == pytest.approx((0.04 / 3 - 1.25e-7 * 3000) / 8)
    assert sh.pass_per_row == pytest.approx(0.011 / 6)
    assert sh.switch_latency == pytest.approx((0.050 - 1.25e-7 * 1000) / 66)
    assert sh.step_latency == pytest.approx(0.008)  # SHARDING counts one reduction
    two = model.with_workers(1, 2).stage_costs(2)  # two ranks: what the probe measured, on the run's costs
    assert two.switch_to_gen == pytest.approx(model.switch_to_gen + 0.050)
    assert two.optimizer_step == pytest.approx(model.optimizer_step + 0.008)
    plain = replace(model, sharded=Sharded()).colocated_phases(4, tsp_degree=1)
    # 2 passes of 2 rows (a sample per rank, K = 2): the probe's sharded pass at 2 rows each
    assert model.colocated_phases(4, tsp_degree=1)["update"] - plain["update"] == pytest.approx(2 * 0.017)


def test_from_probe_scales_each_works_latency_over_more_ranks():
    counts = {"pass_calls": 8, "pass_bytes": 4000, "switch_calls": 10, "switch_bytes": 2000, "step_calls": 2}
    sh = Sharded.from_probe(Affine(0.001, 1e-6), counts, {"pass": 0.020, "step": 0.0})
    assert sh.pass_latency == pytest.approx((0.020 - 0.004) / 8)
    assert sh.switch_latency == 0.0 and sh.switch(2) == pytest.approx(10 * 0.001 + 0.002)  # not timed: the bare
    assert sh.step_latency == 0.0  # nothing added: the bare all-gather's latency stands in
    # over W ranks a ring pays each collective's latency W - 1 times and 2 (W - 1) / W of the bytes
    assert sh.per_pass(4) == pytest.approx(8 * 0.002 * 3 + 1e-6 * 4000 * 1.5)
    assert sh.per_pass(1) == 0.0
    rows = replace(sh, pass_per_row=1e-4)  # a per-row part: per extra rank, as the latency
    assert rows.per_pass(4, 10) == pytest.approx(sh.per_pass(4) + 1e-4 * 10 * 3) and rows.per_pass(1, 10) == 0.0
    with pytest.raises(ValueError, match="pass_latency"):
        Sharded(pass_latency=-1.0)


def test_the_sharded_term_survives_the_profile_file(tmp_path):
    model, workload = measured_profile(compose(BASE), _timeline(), PROBES + SHARDING + WORK)
    dump_profile(model, tmp_path / "p.json", workload=workload)
    assert load(tmp_path / "p.json")[0].sharded == model.sharded != Sharded()


def _generation_half_slowed_by_updates() -> Timeline:
    """Two steps of 4 generations on gen0: the odd ones (0.15 s) overlap a trainer update over their whole
    length, the even ones (0.1 s) run alone, so each other busy process adds half."""
    tl = Timeline(["gen0", TRAINER], micro_batches=4, steps=2)
    for step in range(2):
        t = 10.0 * step
        for i in range(4):
            busy = i % 2 == 1
            end = t + (0.15 if busy else 0.1)
            tl.add(Record("gen0", GENERATE, i, step, step, t, end, samples=2))
            if busy:  # the trainer works over the whole generation
                tl.add(Record(TRAINER, UPDATE, i - 1, step, step, t, end, samples=2))
            t = end + 1.0
    return tl


def test_a_cpu_run_measures_how_much_the_other_pool_slows_an_action():
    """Generation alone takes 0.1 s; beside a busy trainer 0.15 s: each other busy process adds half. The
    profile keeps the time alone and the contention, which the simulator applies (processor sharing)."""
    tl = _generation_half_slowed_by_updates()
    recs = [r for r in tl.records if r.step == 1]
    others = busy_others(recs, trainer_ranks=1)
    assert [o for r, o in zip(recs, others) if r.kind == GENERATE] == pytest.approx([0.0, 1.0, 0.0, 1.0])
    assert host_contention(recs, others) == pytest.approx({GENERATE: 0.5})  # no update ran alone: none for it
    # an update alone takes 0.04 s by the probe, beside generation 0.15 s: each other process adds 2.75x
    alone = host_contention(recs, others, lambda kind, n: 0.04 if kind == UPDATE else 0.0)
    assert alone[UPDATE] == pytest.approx(0.15 / 0.04 - 1) and alone[GENERATE] == pytest.approx(0.5)
    two = busy_others(recs, trainer_ranks=2)  # a trainer unit of two ranks: two processes, sharing the host too
    assert [o for r, o in zip(recs, two) if r.kind == GENERATE] == pytest.approx([0.0, 2.0, 0.0, 2.0])
    assert [o for r, o in zip(recs, two) if r.kind == UPDATE] == pytest.approx([2.0, 2.0])
    model, _ = measured_profile(compose(BASE), tl)  # one hardware type: TAG generation contends as generation
    assert dict(model.host_contention) == pytest.approx({GENERATE: 0.5, TAG_GENERATE: 0.5})
    assert model.generator.hardware.generate(2) == pytest.approx(0.1)  # alone
    gpu, _ = measured_profile(compose([*BASE, "trainer.device=cuda"]), tl)  # pools of their own: no sharing
    assert gpu.host_contention == () and gpu.generator.hardware.generate(2) == pytest.approx(0.125)
    # the probe's update alone: 0.1 s at 2 samples, so beside generation (0.15 s) each other process adds half,
    # and the sharded pass is priced in time-alone units at that contention (sharding_adds(WORK, 0.5))
    updates = [{"kind": "update", "size": n, "tsp_degree": 2, "seconds": t} for n, t in ((2, 0.1), (4, 0.15))]
    probed, _ = measured_profile(compose(BASE), tl, PROBES + updates + SHARDING + WORK)
    assert dict(probed.host_contention)[UPDATE] == pytest.approx(0.5)
    assert probed.sharded.pass_latency == pytest.approx((0.02 / 3 - 1.25e-7 * 3000) / 8)


def test_the_simulator_shares_the_host_between_busy_processes():
    from verl_digen.schedule.actions import Action
    from verl_digen.schedule.costs import uniform_stage_costs
    from verl_digen.schedule.executor import SimBackend

    costs = uniform_stage_costs(generate=1.0, update=2.0)
    backend = SimBackend(costs, contention={GENERATE: 1.0, UPDATE: 1.0})
    gen, upd = Action(GENERATE, ("gen0",), 0, 0, 0), Action(UPDATE, (TRAINER,), 0, 0, 0)
    backend.launch(gen)
    backend.launch(upd)
    done, t = backend.wait()  # both at half speed: generation's 1 s of work ends at 2 s
    assert [c.action for c in done] == [gen] and t == pytest.approx(2.0)
    done, t = backend.wait()  # the update's last 1 s of work alone
    assert [c.action for c in done] == [upd] and t == pytest.approx(3.0)
    alone = SimBackend(costs)  # no contention: each at its own duration
    alone.launch(gen)
    alone.launch(upd)
    assert [alone.wait()[1], alone.wait()[1]] == [1.0, 2.0]
    kinds = SimBackend(costs, contention={UPDATE: 1.0})  # only updates slow down beside another process
    kinds.launch(gen)
    kinds.launch(upd)
    assert [kinds.wait()[1], kinds.wait()[1]] == pytest.approx([1.0, 2.5])  # 0.5 s of work shared, 1.5 alone


def test_generation_mostly_beside_an_update_counts_as_contended():
    """A pipelined run's generations overlap the trainer for about 70 % of their span (as on the CPU run):
    each such record gives its slowdown per other process, (0.0812 / 0.05 - 1) / 0.7 = 0.8915."""
    recs = []
    for i in range(3):
        t = 10.0 * i
        recs.append(Record("gen0", GENERATE, i, 1, 1, t, t + 0.05, samples=4))  # alone
        recs.append(Record("gen0", GENERATE, i, 1, 1, t + 1, t + 1.0812, samples=4))
        recs.append(Record(TRAINER, UPDATE, i, 1, 1, t + 1 + 0.3 * 0.0812, t + 1.0812, samples=4))
    others = busy_others(recs, trainer_ranks=1)
    assert sorted(round(o, 9) for r, o in zip(recs, others) if r.kind == GENERATE) == [0, 0, 0, 0.7, 0.7, 0.7]
    assert host_contention(recs, others)[GENERATE] == pytest.approx((0.0812 / 0.05 - 1) / 0.7)


def test_an_action_beside_another_kind_slows_by_that_pair():
    """``beside``: a generation next to a generation (the probe ran two at once) slows by 1.0 per other process,
    next to an update by the kind's own 0.25; an action on two processes (a colocated phase) is beside its own kind
    on its second one."""
    from verl_digen.schedule.actions import Action
    from verl_digen.schedule.costs import uniform_stage_costs
    from verl_digen.schedule.executor import SimBackend

    costs = uniform_stage_costs(generate=1.0, update=1.0)
    pairs = {(GENERATE, GENERATE): 1.0, (GENERATE, TAG_GENERATE): 1.0, (TAG_GENERATE, GENERATE): 1.0}
    backend = SimBackend(costs, contention={GENERATE: 0.25}, beside=pairs)
    backend.launch(Action(GENERATE, ("gen0",), 0, 0, 0))
    backend.launch(Action(TAG_GENERATE, ("tag0",), 0, 0, 0))
    assert backend.wait()[1] == pytest.approx(2.0)  # both at half speed
    upd = SimBackend(costs, contention={GENERATE: 0.25}, beside=pairs)
    upd.launch(Action(GENERATE, ("gen0",), 0, 0, 0))
    upd.launch(Action(UPDATE, (TRAINER,), 0, 0, 0))
    assert [c.action.kind for c in upd.wait()[0]] == [UPDATE]  # an update beside anything: not slowed
    assert upd.clock == pytest.approx(1.0)
    assert upd.wait()[1] == pytest.approx(1.2)  # 1 / 1.25 of the generation done by then, the last 0.2 s alone
    # one action on two processes (colocated: generator 0 and the trainer) runs beside its own kind
    both = SimBackend(costs, contention={GENERATE: 0.25}, beside=pairs, processes=lambda a: 2)
    both.launch(Action(GENERATE, ("gen0", TRAINER), 0, 0, 0))
    assert both.wait()[1] == pytest.approx(2.0)
    only = SimBackend(costs, beside={(GENERATE, GENERATE): 0.5}, processes=lambda a: 2)  # no per-kind figure at all
    only.launch(Action(GENERATE, ("gen0", TRAINER), 0, 0, 0))
    assert only.wait()[1] == pytest.approx(1.5)


#: the probe's generations two at once (generator 0 and trainer rank 0) and scores two at once, at 2 samples: alone
#: a generation takes 0.06 s (PROBES), at once 0.09 and 0.12 s; a score alone 0.01 s (the run's), at once 0.015
PAIRED = [{"kind": "paired", "action": "generate", "beside": "tag_generate", "size": 2, "seconds": 0.09},
          {"kind": "paired", "action": "tag_generate", "beside": "generate", "size": 2, "seconds": 0.12},
          {"kind": "paired", "action": "score", "beside": "score", "size": 2, "seconds": 0.015},
          {"kind": "paired", "action": "score", "beside": "score", "size": 2, "seconds": 0.015}]


def test_the_probes_pairs_price_a_generation_beside_a_generation():
    """One hardware type: both generation kinds share the median of (0.09 / 0.06 - 1, 0.12 / 0.06 - 1) = 0.75 for
    every pair of them; the score beside a score 0.5 by its alone cost, here the probe's 0.01 s."""
    from verl_digen.reporting.metrics import paired_contention

    scores = [{"pool": "generator", "kind": "score", "size": 2, "seconds": 0.01},
              {"pool": "generator", "kind": "score", "size": 4, "seconds": 0.01}]
    model, _ = measured_profile(compose(BASE), _timeline(), PROBES + scores + PAIRED)
    beside = {(k, o): c for k, o, c in model.host_contention_beside}
    assert beside == pytest.approx({(k, o): 0.75 for k in (GENERATE, TAG_GENERATE) for o in (GENERATE, TAG_GENERATE)}
                                   | {(SCORE, SCORE): 0.5})
    assert model.shared_host()["beside"] == beside
    # pools of two hardware types: each pair as measured
    alone = {GENERATE: 0.06, TAG_GENERATE: 0.06, SCORE: 0.01}
    apart = paired_contention(PAIRED, lambda kind, n: alone[kind], same_hw=False)
    assert apart == pytest.approx({(GENERATE, TAG_GENERATE): 0.5, (TAG_GENERATE, GENERATE): 1.0, (SCORE, SCORE): 0.5})
    # a sample that carries its action's seconds alone just before (the host's load then) is set against those
    drifted = [{**PAIRED[0], "alone": 0.09}, {**PAIRED[1], "alone": 0.08}]
    assert paired_contention(drifted, lambda kind, n: alone[kind], same_hw=False) == pytest.approx(
        {(GENERATE, TAG_GENERATE): 0.0, (TAG_GENERATE, GENERATE): 0.5})
    # a colocated step from this profile: its generation (both processes at once) 1.75x the time alone
    col = compose([*BASE, "trainer=colocated"])
    from verl_digen.schedule.simulator import simulate

    sim = simulate(col.schedule_config(steps=1), model)
    gen = next(r for r in sim.timeline.records if r.kind == GENERATE)
    assert gen.duration == pytest.approx(1.75 * model.generator.hardware.generate(2))
    plain = simulate(col.schedule_config(steps=1), replace(model, host_contention_beside=()))
    assert next(r for r in plain.timeline.records if r.kind == GENERATE).duration == pytest.approx(
        model.generator.hardware.generate(2))  # this run's generations never overlapped anything: no contention


def test_the_pairs_survive_the_profile_file(tmp_path):
    model, workload = measured_profile(compose(BASE), _timeline(), PROBES + PAIRED)
    dump_profile(model, tmp_path / "p.json", workload=workload)
    assert load(tmp_path / "p.json")[0].host_contention_beside == model.host_contention_beside != ()
    from verl_digen.schedule.profile_io import model_from_dict

    with pytest.raises(ValueError, match="host_contention_beside"):
        model_from_dict({"generator": {"workers": 1}, "trainer": {"workers": 1},
                         "host_contention_beside": {"generate": {"nope": 1.0}}})


def test_the_runs_own_contention_stands_where_it_measured_the_kind():
    """A run whose generations overlapped its updates (each other process adds half) keeps that figure for every
    generation, the probe's pairs (0.75) only where the run measured nothing: the score beside a score."""
    tl = _generation_half_slowed_by_updates()
    probes = [{"pool": "generator", "kind": "generate", "size": n, "seconds": 0.1} for n in (2, 4)]
    scores = [{"pool": "generator", "kind": "score", "size": n, "seconds": 0.01} for n in (2, 4)]
    model, _ = measured_profile(compose(BASE), tl, probes + scores + PAIRED)
    assert dict(model.host_contention)[GENERATE] == pytest.approx(0.5)
    assert {(k, o): c for k, o, c in model.host_contention_beside} == pytest.approx({(SCORE, SCORE): 0.5})
