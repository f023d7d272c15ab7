"""Hand-computed values for the simulator, split search, cost model, timeline, fabric and profiler.

Written for survivors of the schedule mutation run (docs/testing.md, "Mutation testing"): the
simulator's result rows, labels and ablation ladder, the split search's rows, options and verdict, action
labels, the cost model's colocated phases and edges, the timeline checks, the fabric and profiler
input checks. Every expected value is derived by hand in a comment (small instances, binary-exact
numbers), so a test fails on a changed formula, default or key, not only on a crash.
"""

from __future__ import annotations

import pytest

from verl_digen.schedule.actions import Action
from verl_digen.schedule.config import ScheduleConfig
from verl_digen.schedule.costs import Affine, CostModel, Hardware, Pool
from verl_digen.schedule.simulator import ablation_configs, describe, run_ablation, simulate

# One small cluster for the simulator and planner tests: 2 generators + 1 trainer of one GPU type.
# generate(s) = 1 + 0.5 s, score(s) = 0.25 s, train_pass(rows) = 0.5 + 0.25 rows; K = 2 trained steps.
HW = Hardware(generate=Affine(1.0, 0.5), score=Affine(0.0, 0.25), train_pass=Affine(0.5, 0.25))
MODEL = CostModel(Pool(HW, 2), Pool(HW, 1), steps_trained=2, optimizer_step=0.5)
CFG = ScheduleConfig(prompts=2, group_size=2, mb_size=2, steps=2, policy="never")


def test_action_repr_names_every_field():
    a = Action("update", ("trainer",), 2, 1, mb=3, stale=True, start=1.5, count=2)
    assert repr(a) == "Action(update trainer step=2 v=1 mb=3 stale @1.5)"
    assert repr(Action("generate", ("gen0", "gen1"), 0, 0)) == "Action(generate gen0,gen1 step=0 v=0 @0)"
    assert list(a.micro_batches) == [3, 4] and a.worker == "trainer"


def test_describe_labels_each_mode():
    assert describe(CFG) == "digen gap m=2 never"
    tcss = ScheduleConfig(prompts=2, group_size=4, mb_size=2, tsp_degree=2, policy="bts", staleness=0.5)
    assert describe(tcss) == "digen gap m=2 tsp=2 bts tcss=0.5"
    assert describe(ScheduleConfig(prompts=2, group_size=4, mb_size=2, staleness=1.0)) == "digen gap m=2 never tcss=1"
    separate = ScheduleConfig(prompts=2, group_size=2, mb_size=2, mode="separate", partition="batch")
    assert describe(separate) == "separate"


def test_simulated_row_hand_computed():
    r = simulate(CFG, MODEL)
    # M = 2 micro-batches of 2 samples, one per generator: generate 1 + 0.5 * 2 = 2, score 0.5 -> 2.5.
    # update (2 samples, K = 2 passes of 2 rows on one rank): 2 x (0.5 + 0.25 * 2) = 2; two updates and
    # the optimizer step: 2.5 + 2 + 2 + 0.5 = 7 per step (on-policy: step 2 waits for step 1's weights).
    assert r.stage_costs.update == 2.0 and r.makespan == 14.0
    row = r.row()
    assert list(row) == ["label", "mode", "policy", "baseline", "step_time", "throughput", "fraction_of_ideal",
                         "ideal", "generator_busy", "trainer_busy"]
    assert row["label"] == "digen gap m=2 never" and row["mode"] == "digen" and row["policy"] == "never"
    assert row["baseline"] is None and row["step_time"] == 7.0
    assert row["throughput"] == pytest.approx(8 / (14 * 3))  # 4 samples x 2 steps / (14 s x 3 GPUs)
    # on-policy, every step waits for its first unit (2 + 0.5) before its 4.5 s of trainer work: the
    # synchronous bottleneck bound is 7, the step itself
    assert row["ideal"] == 7.0 and row["fraction_of_ideal"] == 1.0
    # each generator works 2.5 s per step of 7; the trainer 4.5 s
    assert row["generator_busy"] == pytest.approx(5 / 14) and row["trainer_busy"] == pytest.approx(9 / 14)
    assert simulate(CFG, MODEL, label="mine").row()["label"] == "mine"


def test_colocated_row_has_no_policy_and_no_bounds():
    cfg = ScheduleConfig(prompts=2, group_size=2, mb_size=2, steps=2, mode="colocated", partition="batch")
    row = simulate(cfg, MODEL, baseline="native").row()
    assert row["label"] == "colocated:native" and row["mode"] == "colocated" and row["baseline"] == "native"
    assert row["policy"] is None and row["ideal"] is None and row["fraction_of_ideal"] is None
    assert row["generator_busy"] == 1.0 and row["trainer_busy"] == 1.0
    from verl_digen.schedule.colocated import colocated_costs

    res = simulate(cfg, MODEL, baseline="native")
    # 3 GPUs (2 generator + 1 trainer) run 4 samples a step for 2 steps
    assert res.makespan == res.timeline.makespan > 0 and res.total_gpus == 3
    assert res.throughput == pytest.approx(8 / (res.makespan * 3))
    assert res.stage_costs == colocated_costs(MODEL, cfg.batch, cfg.tsp_degree, "native")


def test_ablation_ladder_configs_exactly():
    base = ScheduleConfig(prompts=2, group_size=2, mb_size=2, steps=2)
    rungs = ablation_configs(base, 1, 2)
    assert [r.label for r in rungs] == ["colocated:ideal", "colocated:native", "colocated:verl-omni",
                                        "colocated:verl-omni-bypass", "naive (separate)", "+GAP", "+TSP",
                                        "+TAG (bts)", "+TCSS (0.25)"]
    assert [r.baseline for r in rungs] == ["ideal", "native", "verl-omni", "verl-omni-bypass"] + ["ideal"] * 5
    common = dict(prompts=2, group_size=2, steps=2)
    colo = ScheduleConfig(mb_size=2, mode="colocated", partition="batch", **common)
    assert [r.config for r in rungs[:4]] == [colo] * 4
    assert rungs[4].config == ScheduleConfig(mb_size=2, mode="separate", partition="batch", train_loop="per_sample",
                                             **common)
    gap = ScheduleConfig(mb_size=1, mode="digen", partition="gap", train_loop="per_sample", **common)
    assert rungs[5].config == gap
    # +TSP switches to the base's training loop (batched here; naive and +GAP use per_sample)
    assert rungs[6].config == ScheduleConfig(mb_size=1, tsp_degree=2, **common)
    assert rungs[7].config == ScheduleConfig(mb_size=1, tsp_degree=2, policy="bts", **common)
    assert rungs[8].config == ScheduleConfig(mb_size=1, tsp_degree=2, policy="bts", staleness=0.25, **common)
    per_sample = ablation_configs(ScheduleConfig(prompts=2, group_size=2, mb_size=2, train_loop="per_sample"), 1, 2)
    assert per_sample[6].config.train_loop == "per_sample"
    spread = ablation_configs(ScheduleConfig(prompts=2, group_size=4, mb_size=4), 2, 1, "adaptive:0.5", 0.0,
                              generators=4)
    # 8 samples over 4 generators: 2 per generator, GAP partition; no TCSS rung at staleness 0
    assert spread[4].config == ScheduleConfig(prompts=2, group_size=4, mb_size=2, mode="separate",
                                              partition="gap", train_loop="per_sample")
    assert [r.label for r in spread][-1] == "+TAG (adaptive:0.5)" and len(spread) == 8


def test_run_ablation_defaults_and_spread_over_the_model_generators():
    results = run_ablation(CFG, MODEL, 1, 2)
    assert [r.label for r in results][-2:] == ["+TAG (bts)", "+TCSS (0.25)"]
    assert results[-1].config.staleness == 0.25 and results[-1].config.policy == "bts"
    assert [r.baseline for r in results[:4]] == ["ideal", "native", "verl-omni", "verl-omni-bypass"]
    # naive spreads the 4 samples over the model's 2 generators: micro-batches of 2, GAP partition
    assert results[4].config.partition == "gap" and results[4].config.mb_size == 2
    assert results[5].config.mb_size == 1 and results[6].config.tsp_degree == 2


# --- the split search (split_search.py, ``digen plan``) ---------------------------------------------


def _plan_wl():
    from verl_digen.schedule.profile_io import Workload

    return Workload(prompts=2, group_size=2, mb_size=2, tsp_degree=1, staleness=0.5, steps=2)


def test_search_enumerates_splits_sizes_units_policies_and_stalenesses():
    from verl_digen.schedule.split_search import mb_sizes_for, search

    said = []
    plan = search(MODEL, _plan_wl(), 3, policies=("never",), progress=said.append, tsp_degrees=(1,), keep=None)
    rows = plan.rows
    assert said[0] == f"{plan.candidates} configurations priced by their lower bounds; simulating from the cheapest"
    # keep=None simulates everything: micro-batch sizes 2 (the workload's, a group) and 4 (two groups), and 1
    # on 2 generators (GAP's default there: a group spread over both); one release unit (a group) per update
    # or both of the step, except at 4 where the step is one unit
    assert (mb_sizes_for(_plan_wl(), 1), mb_sizes_for(_plan_wl(), 2)) == ([2, 4], [1, 2, 4])
    expected = {(g, 3 - g, mb, u, "never", st) for g in (1, 2) for mb in ((2, 4) if g == 1 else (1, 2, 4))
                for st in (0.0, 0.5) for u in ((1,) if mb == 4 else (1, 2))}
    got = {(r.generators, r.trainers, r.mb_size, r.update_units, r.policy, r.staleness) for r in rows}
    assert got == expected and len(rows) == len(expected) == plan.candidates == plan.simulated
    for r in rows:
        cfg = r.result.config
        assert (cfg.steps, cfg.mode, cfg.policy, cfg.staleness, cfg.mb_size, cfg.update_units) == (
            2, "digen", "never", r.staleness, r.mb_size, r.update_units)
        # each row simulates its own split (not the given cluster's)
        want = simulate(cfg, MODEL.with_workers(r.generators, r.trainers))
        assert r.result.step_time == want.step_time
        d = r.as_dict()
        assert d == {"mode": "digen", "generators": r.generators, "trainers": r.trainers, "mb_size": r.mb_size,
                     "policy": "never",
                     "staleness": r.staleness, "tsp_degree": 1, "update_units": r.update_units, "rows_per_pass": None,
                     "step_time": r.result.step_time, "throughput": r.result.throughput,
                     "fraction_of_ideal": r.result.fraction_of_ideal}
    assert [r.result.step_time for r in rows] == sorted(r.result.step_time for r in rows)
    # each row ran on its own split: its generate actions used exactly that many generators
    for r in rows:
        gens = {rec.worker for rec in r.result.timeline.records if rec.worker.startswith("gen")}
        assert gens == {f"gen{i}" for i in range(r.generators)}


@pytest.mark.slow
def test_search_prunes_by_the_bounds_and_keeps_the_exact_best():
    from verl_digen.schedule.profile_io import Workload
    from verl_digen.schedule.split_search import search

    wl = Workload(prompts=4, group_size=4, mb_size=2, tsp_degree=2, staleness=0.25, steps=2)
    every = search(MODEL, wl, 5, keep=None)
    pruned = search(MODEL, wl, 5, keep=3)
    assert pruned.candidates == every.candidates == every.simulated > pruned.simulated  # the bounds pruned some
    key = lambda r: (r.generators, r.mb_size, r.tsp_degree, r.update_units, r.policy, r.staleness)  # noqa: E731
    assert [r.result.step_time for r in pruned.rows] == [r.result.step_time for r in every.rows[:3]]
    assert [key(r) for r in pruned.rows] == [key(r) for r in every.rows[:3]]
    # no simulated step beats its own bound, which is what makes the pruning exact
    assert all(r.result.step_time >= r.result.bounds.ideal - 1e-9 for r in every.rows)
    with pytest.raises(ValueError, match="keep must be >= 1"):
        search(MODEL, wl, 5, keep=0)


def test_search_bounds_rows_per_pass_by_the_memory_cap():
    from verl_digen.schedule.profile_io import Workload
    from verl_digen.schedule.split_search import search

    wl = Workload(prompts=4, group_size=4, mb_size=2, tsp_degree=2, staleness=0.0, steps=1)
    asked = []

    def cap(trainers: int, mb: int, tag: bool) -> int | None:
        asked.append((trainers, mb, tag))
        if trainers == 1:
            return 0  # one trainer GPU holds nothing
        return 1 if tag else None  # TAG's generation copy leaves room for one row per pass

    plan = search(MODEL, wl, 4, policies=("never", "bts"), row_cap=cap, keep=None, colocated_cap=2)
    # (0, 4): trainer=colocated on all 4 GPUs, its rows per pass capped too (16 samples x 2 steps over 4 ranks
    # would be 8 rows per pass at TSP 2)
    assert {(r.generators, r.trainers) for r in plan.rows} == {(0, 4), (1, 3), (2, 2)}
    (colo,) = [r for r in plan.rows if r.mode == "colocated"]  # TSP 1 and 2 run the same 2-row passes: one row
    assert (colo.tsp_degree, colo.rows_per_pass, colo.policy, colo.result.config.mode) == (2, 2, "never", "colocated")
    uncapped = [r for r in search(MODEL, wl, 4, policies=("never",), keep=None).rows if r.mode == "colocated"]
    assert min(r.result.step_time for r in uncapped) < colo.result.step_time  # the cap costs passes
    assert any(n.endswith("do not fit the GPUs' memory") for n in plan.notes)
    plan = search(MODEL, wl, 4, policies=("never", "bts"), row_cap=cap, keep=None)
    assert {t for t, _, _ in asked} == {1, 2, 3} and {tag for _, _, tag in asked} == {False, True}
    for r in plan.rows:
        if r.mode == "colocated":  # no memory cap known for it: the passes the TSP degree gives
            assert r.rows_per_pass is None and r.result.config.rows_per_pass is None
            continue
        assert r.rows_per_pass == (1 if r.policy == "bts" else None)
        assert r.result.config.rows_per_pass == r.rows_per_pass


def test_search_options_min_trainers_fixed_split_and_default_policies():
    from verl_digen.schedule.split_search import search

    wl = _plan_wl()
    # (0, n): trainer=colocated on all n GPUs, searched wherever the batch splits evenly over them
    assert {(r.generators, r.trainers) for r in search(MODEL, wl, 2, policies=("never",), keep=None).rows} == {
        (0, 2), (1, 1)}
    assert {(r.generators, r.trainers) for r in search(MODEL, wl, 2, policies=("never",), keep=None,
                                                       colocated=False).rows} == {(1, 1)}
    rows = search(MODEL, wl, 4, policies=("never",), stalenesses=(0.0,), min_trainers=2, keep=None).rows
    assert {(r.generators, r.trainers) for r in rows} == {(0, 4), (1, 3), (2, 2)}
    with pytest.raises(ValueError, match="at least 2 GPUs, got 1"):
        search(MODEL, wl, 1)

    def no_resize(g, r, f):
        raise AssertionError("a fixed split must not resize the cluster")

    fixed = CostModel(Pool(HW, 2), Pool(HW, 1), steps_trained=2, optimizer_step=0.5, resize=no_resize)
    rows = search(fixed, wl, 3, stalenesses=(0.0,), fixed_split=True, keep=None).rows
    assert {(r.generators, r.trainers) for r in rows} == {(2, 1)}
    assert {r.policy for r in rows} == {"never", "adaptive", "bts"}  # the default policies
    with pytest.raises(ValueError, match="fixed by its hardware"):
        search(fixed, wl, 4, fixed_split=True)


def test_colocated_baselines_and_best_model():
    from verl_digen.schedule.split_search import PlanRow, best_model, colocated_baselines

    colo = colocated_baselines(MODEL, _plan_wl())
    assert list(colo) == ["ideal", "native", "verl-omni", "verl-omni-bypass"]
    for b, r in colo.items():
        assert r.label == f"colocated:{b}" and r.baseline == b
        assert (r.config.steps, r.config.partition, r.config.mode, r.config.mb_size) == (2, "batch", "colocated", 2)
    row = PlanRow(2, 1, 2, "never", 0.0, colo["ideal"])
    assert best_model(MODEL, row) is MODEL
    other = best_model(MODEL, PlanRow(1, 2, 2, "never", 0.0, colo["ideal"]))
    assert (other.generator.workers, other.trainer.workers) == (1, 2)


def _verdict(step, base, ideal, busy_g, busy_t, policy="bts", staleness=0.25):
    from types import SimpleNamespace

    from verl_digen.schedule.split_search import PlanRow, verdict

    res = SimpleNamespace(step_time=step, busy={"generator": busy_g, "trainer": busy_t})
    colo = {"ideal": SimpleNamespace(step_time=ideal), "verl-omni": SimpleNamespace(step_time=base),
            "native": SimpleNamespace(step_time=base * 2)}
    return verdict(PlanRow(2, 1, 2, policy, staleness, res), colo, MODEL)


# the FSDP line for MODEL: train_pass floor 0 on both sides, one-row compute 0.5 + 0.25 = 0.75 s
FSDP = ("  FSDP traffic per training pass: 0.00 s over all 3 GPUs vs 0.00 s inside the 1-GPU trainer pool "
        "(compute of a one-row pass: 0.75 s)")


def test_verdict_recommends_digen_with_the_ratio_and_the_full_pipeline():
    lines = _verdict(step=4.0, base=10.0, ideal=5.0, busy_g=0.9, busy_t=0.9)
    assert lines == [
        "recommendation: digen, 2 generate + 1 train, bts, staleness 0.25: 2.50x colocated:verl-omni",
        FSDP,
        "  digen's pipeline is full (generators busy 90%, trainer 90%): the difference is the work each pool "
        "does (per-pass communication, per-call overheads), not bubbles",
    ]


def test_verdict_stays_colocated_on_a_tie_and_names_the_bound_pool():
    lines = _verdict(step=5.0, base=5.0, ideal=1.0, busy_g=0.5, busy_t=0.9)
    assert lines == [
        "recommendation: stay colocated: colocated:verl-omni is 1.00x faster than digen's best split",
        FSDP,
        "  digen is trainer-bound (trainer busy 90%, generators 50%): more trainer GPUs, a larger TSP degree or "
        "fewer trained steps help it",
    ]
    lines = _verdict(step=8.0, base=4.0, ideal=1.0, busy_g=0.9, busy_t=0.5)
    assert lines[0] == "recommendation: stay colocated: colocated:verl-omni is 2.00x faster than digen's best split"
    assert lines[2] == ("  digen is generator-bound (generators busy 90%, trainer 50%): TAG lends the trainer's "
                        "bubbles to generation")
    # neither pool near full: no bound line (a trainer busier than the generators is not enough)
    assert _verdict(step=8.0, base=4.0, ideal=1.0, busy_g=0.4, busy_t=0.5) == lines[:2]
    assert len(_verdict(step=8.0, base=4.0, ideal=1.0, busy_g=0.89, busy_t=0.89)) == 2


def test_verdict_notes_when_an_ideal_colocated_run_would_win():
    lines = _verdict(step=4.0, base=10.0, ideal=3.0, busy_g=0.5, busy_t=0.5)
    assert lines[1] == ("  (an idealized colocated run, 3.0 s/step, would beat digen: the gain comes from what "
                        "colocated runs pay beyond the ideal, not from more compute)")
    assert len(lines) == 3
    # equal to the ideal, or digen not faster than the baseline: no such note
    assert len(_verdict(step=3.0, base=10.0, ideal=3.0, busy_g=0.5, busy_t=0.5)) == 2
    assert len(_verdict(step=10.0, base=10.0, ideal=3.0, busy_g=0.5, busy_t=0.5)) == 2


# --- the simulator's executor call, the cost model's scalars and the config helpers ---------------


def _sched(cfg=CFG, model=MODEL):
    from verl_digen.schedule.profiler import Profiler
    from verl_digen.schedule.scheduler import StepScheduler

    costs = model.stage_costs(cfg.mb_size, cfg.tsp_degree)
    return StepScheduler(cfg, costs, model.generator.workers, cfg.policy, Profiler(costs)), costs


def test_execute_checks_the_timeline_by_default_and_draws_noise_from_its_seed(monkeypatch):
    from verl_digen.schedule import executor
    from verl_digen.schedule.simulator import execute

    checked = []
    monkeypatch.setattr(executor, "check_timeline", lambda tl: checked.append(tl))
    sched, costs = _sched()
    tl = execute(sched, costs)
    assert checked == [tl]
    sched, costs = _sched()
    execute(sched, costs, check=False)
    assert len(checked) == 1
    monkeypatch.undo()
    # noise 0: every action takes its cost exactly; noise > 0: seeded log-normal jitter (seed 0 included)
    sched, costs = _sched()
    recs = execute(sched, costs).records
    assert all(r.duration == costs.duration(r.kind) for r in recs)
    plain = [r.duration for r in recs]
    noisy = [r.duration for r in execute(*_sched(), noise=0.3, seed=0).records]
    assert noisy != plain and noisy == [r.duration for r in execute(*_sched(), noise=0.3, seed=0).records]
    assert noisy != [r.duration for r in execute(*_sched(), noise=0.3, seed=1).records]


def test_stage_costs_carry_every_scalar_and_the_training_loop():
    from verl_digen.schedule.costs import StageCosts, trained_steps

    m = CostModel(Pool(HW, 2), Pool(HW, 2), steps_trained=2, switch_to_gen=0.1, switch_to_train=0.2,
                  optimizer_step=0.3, weight_sync=0.4, publish=0.5)
    c = m.stage_costs(2)
    # 2 samples x 1 timestep = 2 rows per pass over 2 ranks: 1 row each, 0.5 + 0.25 = 0.75 per pass, 2 passes
    assert c == StageCosts(generate=2.0, tag_generate=2.0, score=0.5, update=1.5, switch_to_gen=0.1,
                           switch_to_train=0.2, optimizer_step=0.3, weight_sync=0.4, publish=0.5)
    # per_sample: each rank trains its one sample in K = 2 one-row passes: also 1.5; with 4 samples, 3.0,
    # while batched 4 samples = 2 rows per rank per pass: 2 x (0.5 + 0.5) = 2.0
    assert m.stage_costs(2, update_samples=4, per_sample=True).update == 3.0
    assert m.stage_costs(2, update_samples=4).update == 2.0
    from dataclasses import replace

    from verl_digen.schedule.config import PER_SAMPLE

    cfg = ScheduleConfig(prompts=1, group_size=4, mb_size=4, update="micro_batch")  # updates of 4 samples
    assert cfg.stage_costs(m, 2).update == 2.0 and replace(cfg, train_loop=PER_SAMPLE).stage_costs(m, 2).update == 3.0
    assert trained_steps(10, 1.0) == 10 and trained_steps(10, 0.25) == 2 and trained_steps(3, 0.1) == 1
    with pytest.raises(ValueError, match=r"timestep fraction must be in \(0, 1\], got 1.5"):
        trained_steps(10, 1.5)


def test_with_workers_resizes_through_the_model_hook():
    calls = []

    def resize(g, r, fsdp):
        calls.append((g, r, fsdp))
        return CostModel(Pool(HW, g), Pool(HW, r))

    m = CostModel(Pool(HW, 2), Pool(HW, 1), resize=resize)
    out = m.with_workers(3, 4)
    assert calls == [(3, 4, None)] and (out.generator.workers, out.trainer.workers) == (3, 4)
    m.colocated_model()
    assert calls[-1] == (2, 1, 3)


def test_config_partition_kind_and_update_granularity():
    from verl_digen.schedule.gap import BATCH

    cfg = ScheduleConfig(prompts=2, group_size=2, mb_size=2, partition="batch")
    assert cfg.make_partition(2).kind == BATCH
    assert ScheduleConfig(prompts=2, group_size=2, mb_size=1, update="micro_batch").update_size(2) == 1
    assert ScheduleConfig(prompts=2, group_size=2, mb_size=1).update_size(2) == 2


# --- input checks at their boundaries ------------------------------------------------------------


def test_fabric_checks_at_their_boundaries():
    from verl_digen.schedule.fabric import Fabric

    Fabric(gpus_per_node=1, nics_per_node=1, intra_gbs=0.5, nic_gbs=0.5, param_bytes=0.5, reduce_bytes=0.5)
    for kw in ({"gpus_per_node": 2.0}, {"gpus_per_node": 0}, {"nics_per_node": 1.5}, {"nics_per_node": 0}):
        with pytest.raises(ValueError, match="must be a positive integer"):
            Fabric(**kw)
    for bad in ("fast", float("inf"), float("nan"), 0, -1.0):
        with pytest.raises(ValueError, match=f"fabric nic_gbs must be a positive number, got {bad!r}"):
            Fabric(nic_gbs=bad)


def test_profiler_warmup_means_and_versions():
    from verl_digen.schedule.costs import StageCosts
    from verl_digen.schedule.profiler import Profiler

    prior = StageCosts(generate=1.0, tag_generate=1.0, score=0.0, update=1.0)
    p = Profiler(prior, warmup=0)  # no warm-up is allowed: the first observation counts
    p.observe("generate", 3.0)
    assert p.mean("generate") == 3.0 and p.version == 1
    with pytest.raises(ValueError, match="warmup must be >= 0, got -1"):
        Profiler(prior, warmup=-1)
    p = Profiler(prior, warmup=2)
    for d in (1.0, 3.0):
        p.observe("score", d)
    # only warm-up observations and a zero prior: their mean (1 + 3) / 2
    assert p.mean("score") == 2.0 and p.version == 2 and p.estimate().score == 2.0
    assert p.mean("generate") is None and p.estimate().generate == 1.0
    p.observe("score", 6.0)
    assert p.mean("score") == 6.0 and p.version == 3
    with pytest.raises(ValueError, match="unknown action kind 'nap'"):
        p.observe("nap", 1.0)
    with pytest.raises(ValueError, match="negative duration -1.0 for 'score'"):
        p.observe("score", -1.0)


# --- timeline and bounds helpers on hand-made records ---------------------------------------------


def test_step_ends_take_each_steps_latest_optimizer_step_only():
    from verl_digen.schedule.timeline import Record, Timeline

    tl = Timeline(workers=["gen0", "trainer"], micro_batches=1, steps=2)
    tl.add(Record("trainer", "optimizer_step", None, 0, 0, 0.25, 0.5))
    tl.add(Record("gen0", "generate", 0, 1, 0, 0.0, 9.0))
    tl.add(Record("trainer", "optimizer_step", None, 1, 1, 4.0, 5.0))
    tl.add(Record("trainer", "optimizer_step", None, 1, 1, 3.0, 4.0))
    assert tl.step_ends() == [0.5, 5.0]


def test_step_stage_costs_mean_and_window_bounds_edges():
    from verl_digen.schedule.bounds import step_bounds, step_stage_costs, window_bounds
    from verl_digen.schedule.costs import StageCosts
    from verl_digen.schedule.timeline import Record

    fallback = StageCosts(generate=9.0, tag_generate=9.0, score=9.0, update=9.0)
    recs = [Record("gen0", "generate", 0, 0, 0, 0.0, 1.0), Record("gen0", "generate", 1, 0, 0, 1.0, 4.0)]
    got = step_stage_costs(recs, fallback)
    assert (got.generate, got.score) == (2.0, 9.0)  # mean of 1 and 3; score did not run
    # a record within 1 ns before the window start counts as inside it
    start = 1.0
    recs = [Record("gen0", "generate", 0, 0, 0, start - 1e-9, 2.0), Record("gen0", "score", 0, 0, 0, 2.0, 2.5),
            Record("trainer", "update", 0, 0, 0, 2.5, 3.5), Record("trainer", "optimizer_step", None, 0, 0, 3.5, 4.0)]
    costs = StageCosts(generate=1.0 + 1e-9, tag_generate=9.0, score=0.5, update=1.0, optimizer_step=0.5)
    b = window_bounds(recs, 0, start, fallback, 1, 1, unit_size=4, trainer_ranks=1)
    assert b == step_bounds(costs, 1, 1, unit_size=4, generated=1)
    # unit 4 over G + R = 2: two generation rounds before the first update can start
    assert b.bottleneck == pytest.approx(2 * (1.0 + 1e-9) + 0.5 + 1.0 + 0.5)


# --- the colocated scheduler, cost-model checks and fabric formulas -------------------------------


def test_colocated_scheduler_records_each_phase_once_per_worker():
    from verl_digen.schedule.colocated import PHASES, ColocatedScheduler, colocated_costs
    from verl_digen.schedule.executor import SimBackend, run

    cfg = ScheduleConfig(prompts=2, group_size=2, mb_size=2, steps=2, mode="colocated", partition="batch")
    costs = colocated_costs(MODEL, cfg.batch)
    assert costs.tag_generate == 0.0 and costs.weight_sync == 0.0
    sched = ColocatedScheduler(cfg, ["gen0", "trainer"])
    first = sched.start(0.0)
    assert sched.next_actions(0.0) == []  # one phase at a time
    with pytest.raises(ValueError, match="is not the running phase"):
        sched.on_complete(Action("generate", ("gen0",), 0, 0), 1.0)
    assert first[0].kind == PHASES[0] and first[0].mb is None and first[0].samples == ()
    sched = ColocatedScheduler(cfg, ["gen0", "trainer"])
    tl = run(sched, SimBackend(costs))
    assert (tl.micro_batches, tl.steps, tl.mode) == (1, 2, "colocated")
    data = {"generate", "score", "update"}
    for w in ("gen0", "trainer"):
        got = [(r.kind, r.mb, r.step, r.version, r.samples) for r in tl.by_worker()[w]]
        want = [(k, 0 if k in data else None, s, s, 4 if k in data else 0) for s in range(2) for k in PHASES]
        assert got == want


def test_cost_checks_name_the_bad_value():
    from verl_digen.schedule.costs import BaselineCosts

    for field_name in ("fixed", "per_unit", "floor"):
        with pytest.raises(ValueError, match=f"cost '{field_name}' must be >= 0, got -1"):
            Affine(**{field_name: -1})
    with pytest.raises(ValueError, match="cost 'rollout_wake' must be >= 0"):
        BaselineCosts(rollout_wake=-1.0)
    with pytest.raises(ValueError, match="cost 'publish' must be >= 0"):
        CostModel(Pool(HW, 1), Pool(HW, 1), publish=-1.0)
    with pytest.raises(ValueError, match="steps_trained must be a positive integer, got 2.0"):
        CostModel(Pool(HW, 1), Pool(HW, 1), steps_trained=2.0)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"keep_fraction must be in \\(0, 1\\], got {bad}"):
            CostModel(Pool(HW, 1), Pool(HW, 1), keep_fraction=bad)
    CostModel(Pool(HW, 1), Pool(HW, 1), keep_fraction=1.0)


def test_native_baseline_pays_no_context_switch():
    m = CostModel(Pool(HW, 1), Pool(HW, 1), switch_to_gen=0.5, switch_to_train=0.25)
    assert m.colocated_phases(2)["switch_to_train"] == 0.25
    native = m.colocated_phases(2, baseline="native")
    assert (native["switch_to_gen"], native["switch_to_train"]) == (0.0, 0.0)


def test_fabric_ring_hybrid_and_send_hand_computed():
    from verl_digen.schedule.fabric import HYBRID, Fabric

    f = Fabric(gpus_per_node=8, intra_gbs=100.0, nic_gbs=25.0, sharding=HYBRID)
    # inside a node: 2 GB over 2 ranks moves 1 GB at 100 GB/s; across 2 nodes the 25 GB/s NIC is the link
    assert f.ring(2e9, 2) == pytest.approx(0.01, rel=1e-12)
    assert f.ring(2e9, 16) == pytest.approx(2e9 * 15 / 16 / 25e9, rel=1e-12)
    assert f.ring(0.5, 2) == pytest.approx(0.25 / 100e9, rel=1e-12)  # under one byte still costs
    assert f.ring(0.0, 4) == 0.0 and f.ring(1e9, 1) == 0.0 and f.ring(1e9, 0) == 0.0
    # HSDP over 24 ranks (3 nodes): shard groups of 8 (two 2-byte gathers + one 4-byte reduce-scatter of
    # 1e9 parameters: 2 x 0.0175 + 0.035 = 0.07) + the cross-node all-reduce 2 x 4e9 x 2/3 / 25e9 = 16/75
    assert f.fsdp_pass(1e9, 24) == pytest.approx(0.07 + 16 / 75, rel=1e-12)
    assert f.send(5e9) == pytest.approx(0.2, rel=1e-12)


# --- the step scheduler's trace: labels, decisions and what a policy sees -------------------------


class _Recorder:
    """A TAG policy that asks for ``k`` micro-batches at every bubble and records what it was shown."""

    name = "recorder"

    def __init__(self, k: int) -> None:
        self.k = k
        self.seen: list[tuple] = []

    def decide(self, ctx) -> int:
        self.seen.append((ctx.step, ctx.bubble, ctx.costs_version, ctx.free_slots, ctx.trainer_ranks,
                          ctx.undispatched))
        return self.k


def test_scheduler_trace_with_tag_tcss_publish_and_sync_hand_checked():
    from collections import Counter

    from verl_digen.schedule.costs import StageCosts
    from verl_digen.schedule.executor import SimBackend, run
    from verl_digen.schedule.scheduler import Decision, StepScheduler

    cfg = ScheduleConfig(prompts=2, group_size=4, mb_size=1, steps=3, staleness=0.25)
    costs = StageCosts(generate=1.0, tag_generate=1.5, score=0.25, update=2.0, switch_to_gen=0.25,
                       switch_to_train=0.25, optimizer_step=0.5, weight_sync=0.25, publish=0.5)
    pol = _Recorder(3)  # asks for more than the 2 free slots: the scheduler caps it
    s = StepScheduler(cfg, costs, 2, pol, trainer_ranks=2)
    assert (s.M, s.unit_size, s.update_size, s.stale_budget) == (8, 4, 4, 2)
    tl = run(s, SimBackend(costs))
    assert tl.workers == ["gen0", "gen1", "trainer", "tag0", "tag1"]
    assert (tl.mode, tl.trainer_ranks, tl.staleness, tl.micro_batches, tl.steps) == ("digen", 2, 0.25, 8, 3)
    # Step 0: switch at 0 (0.25), the TAG slots generate mbs 2, 3 (0.25-1.75) and, at the second bubble,
    # 6, 7 (1.75-3.25) while gen0/gen1 generate and score 0, 1, 4, 5; switch back 3.25-3.5; unit 0 (mbs 0-3,
    # scored by 2.5) trains 3.5-5.5, unit 1 5.5-7.5, optimizer step 7.5-8, publish of version 1 8-8.5.
    # Each later step repeats that 8 s later. Publishes and syncs carry (step, version) = (v - 1, v);
    # switches and optimizer steps (s, s); the last step publishes nothing.
    side = [(r.worker, r.kind, r.step, r.version, r.start, r.end) for r in tl.records
            if r.kind in ("publish", "weight_sync", "switch_to_gen", "switch_to_train", "optimizer_step")]
    assert side == [
        ("trainer", "switch_to_gen", 0, 0, 0.0, 0.25), ("trainer", "switch_to_train", 0, 0, 3.25, 3.5),
        ("trainer", "optimizer_step", 0, 0, 7.5, 8.0), ("trainer", "publish", 0, 1, 8.0, 8.5),
        ("gen0", "weight_sync", 0, 1, 8.5, 8.75), ("gen1", "weight_sync", 0, 1, 8.5, 8.75),
        ("trainer", "switch_to_gen", 1, 1, 8.5, 8.75), ("trainer", "switch_to_train", 1, 1, 11.25, 11.5),
        ("trainer", "optimizer_step", 1, 1, 15.5, 16.0), ("trainer", "publish", 1, 2, 16.0, 16.5),
        ("gen0", "weight_sync", 1, 2, 16.5, 16.75), ("gen1", "weight_sync", 1, 2, 16.5, 16.75),
        ("trainer", "switch_to_gen", 2, 2, 16.5, 16.75), ("trainer", "switch_to_train", 2, 2, 19.25, 19.5),
        ("trainer", "optimizer_step", 2, 2, 23.5, 24.0),
    ]
    assert all(r.version == r.step for r in tl.records if r.kind in ("score", "update", "tag_generate"))
    # idle generators run ahead on the old version, up to the budget of 2 stale micro-batches a step
    assert Counter(r.step for r in tl.records if r.stale) == {1: 2, 2: 2}
    assert Counter((r.kind, r.samples, r.count) for r in tl.records) == {
        ("score", 1, 1): 24, ("generate", 1, 1): 16, ("tag_generate", 1, 1): 8, ("update", 4, 4): 6,
        ("weight_sync", 0, 1): 4, ("switch_to_gen", 0, 1): 3, ("switch_to_train", 0, 1): 3,
        ("optimizer_step", 0, 1): 3, ("publish", 0, 1): 2}
    # what the policy saw: (step, bubble, profiler version = completions so far, free slots, ranks, undispatched)
    # e.g. at 1.75: the switch, 2 generations, 2 scorings and 2 TAG generations completed -> version 7
    assert pol.seen == [(0, 1, 0, 2, 2, 6), (0, 2, 7, 2, 2, 2), (1, 1, 26, 2, 2, 6), (2, 1, 50, 2, 2, 6)]
    assert s.decisions == [Decision(0, 0.0, 6, 2, 2), Decision(0, 1.75, 2, 2, 2), Decision(1, 8.5, 6, 2, 2),
                           Decision(2, 16.5, 6, 2, 2)]
    with pytest.raises(RuntimeError, match="already started"):
        s.start(0.0)


def test_scheduler_constructor_checks_and_defaults():
    from verl_digen.schedule.costs import StageCosts
    from verl_digen.schedule.scheduler import StepScheduler

    costs = StageCosts(generate=1.0, tag_generate=1.0, score=0.0, update=1.0)
    cfg = ScheduleConfig(prompts=1, group_size=2, mb_size=1)
    assert StepScheduler(cfg, costs, 1).timeline.workers == ["gen0", "trainer", "tag0"]  # one rank by default
    with pytest.raises(ValueError, match="needs at least one worker, got 2.0"):
        StepScheduler(cfg, costs, 2.0)
    with pytest.raises(ValueError, match="needs at least one rank, got 1.0"):
        StepScheduler(cfg, costs, 1, trainer_ranks=1.0)
    with pytest.raises(ValueError, match="needs at least one worker, got 0"):
        StepScheduler(cfg, costs, 0)
    with pytest.raises(ValueError, match="needs at least one rank, got 0"):
        StepScheduler(cfg, costs, 1, trainer_ranks=0)
    sched = StepScheduler(ScheduleConfig(prompts=1, group_size=2, mb_size=1, steps=3, staleness=0.5), costs, 1,
                          "static:1")
    assert (sched.policy.name, sched.timeline.steps, sched.timeline.staleness) == ("static", 3, 0.5)


# --- refitting a profile from measured samples ----------------------------------------------------


def test_fit_samples_defaults_zero_seconds_and_update_rows_hand_computed():
    from verl_digen.schedule.costs import Hardware as Hw
    from verl_digen.schedule.profile_io import fit_samples

    m = CostModel(Pool(Hw(), 1), Pool(Hw(), 2), steps_trained=4, keep_fraction=0.5)
    f = fit_samples(m, [
        {"kind": "tag_generate", "size": 2, "seconds": 5.0}, {"kind": "tag_generate", "size": 4, "seconds": 9.0},
        {"kind": "score", "seconds": 0.5}, {"kind": "score", "size": 3, "seconds": 1.5},  # size defaults to 1
        {"kind": "weight_sync", "seconds": 0.0}, {"kind": "weight_sync", "seconds": 1.0},  # 0 s is a measurement
        {"kind": "train_pass", "size": 1, "seconds": 1.0}, {"kind": "train_pass", "size": 2, "seconds": 1.5},
    ])
    # TAG samples fit the trainer GPU's generate; score (no pool) the generator's; train_pass the trainer's
    assert f.trainer.hardware.generate == Affine(1.0, 2.0) and f.generator.hardware.generate == Affine()
    assert f.generator.hardware.score == Affine(0.0, 0.5) and f.trainer.hardware.score == Affine()
    assert f.trainer.hardware.train_pass == Affine(0.5, 0.5) and f.generator.hardware.train_pass == Affine()
    assert f.weight_sync == 0.5
    # update of 8 samples, K = 4 passes of one timestep (TSP degree defaults to 1), half the samples kept,
    # 2 ranks: ceil(8 x 0.5 x 1 / 2) = 2 rows a pass, 8 s / 4 passes = 2 s; 16 samples: 4 rows, 3 s
    g = fit_samples(m, [{"kind": "update", "size": 8, "seconds": 8.0}, {"kind": "update", "size": 16, "seconds": 12.0}])
    assert g.trainer.hardware.train_pass == Affine(1.0, 0.5)
    # K = 3 at degree 2: passes [2, 1], rows from the first (full) pass: 4 samples -> 2 rows, 3 s / 2 passes
    m3 = CostModel(Pool(Hw(), 1), Pool(Hw(), 2), steps_trained=3, keep_fraction=0.5)
    h = fit_samples(m3, [{"kind": "update", "size": 4, "tsp_degree": 2, "seconds": 3.0},
                         {"kind": "update", "size": 8, "tsp_degree": 2, "seconds": 5.0}])
    assert h.trainer.hardware.train_pass == Affine(0.5, 0.5)
    for bad in ({"kind": "score"}, {"kind": "score", "seconds": -0.5}):
        with pytest.raises(ValueError, match=r"samples\[0\]: needs non-negative 'seconds'"):
            fit_samples(m, [bad])


def test_schedulers_start_at_time_zero_by_default():
    from verl_digen.schedule.colocated import ColocatedScheduler
    from verl_digen.schedule.costs import StageCosts
    from verl_digen.schedule.scheduler import StepScheduler

    costs = StageCosts(generate=1.0, tag_generate=1.0, score=0.0, update=1.0)
    first = StepScheduler(ScheduleConfig(prompts=1, group_size=2, mb_size=1), costs, 1).start()
    assert first and {a.start for a in first} == {0.0}
    colocated = ColocatedScheduler(ScheduleConfig(prompts=1, group_size=2, mb_size=1, mode="colocated"), ["w0"])
    assert [a.start for a in colocated.start()] == [0.0]


def test_a_policy_asking_for_more_than_is_left_gets_what_is_left_once_per_event():
    """The scheduler caps a decision at the free slots and the undispatched micro-batches, and decides
    once per event: with 2 slots and a policy that asks for 1, the decision at 0 switches to generation
    mode (free here), the switch's end (a new event, also at 0) decides for the other slot, and the next
    decisions come when every slot is free (at 1 and 2): with every slot free the trainer may go on
    generating though updates wait, and it switches back once the policy starts nothing more (at 3)."""
    from dataclasses import dataclass

    from verl_digen.schedule.costs import uniform_stage_costs
    from verl_digen.schedule.scheduler import StepScheduler
    from verl_digen.schedule.simulator import execute

    @dataclass
    class Ask:
        n: int
        name: str = "ask"

        def decide(self, ctx) -> int:
            return self.n

    costs = uniform_stage_costs(1.0, 0.1, tag_generate=1.0)
    cfg = ScheduleConfig(prompts=3, group_size=1, mb_size=1)  # 3 micro-batches, 1 generator, 4 slots
    greedy = StepScheduler(cfg, costs, 1, Ask(99), trainer_ranks=4)
    execute(greedy, costs)
    assert [(d.undispatched, d.slots, d.free_slots) for d in greedy.decisions] == [(2, 2, 4)]
    assert sum(r.kind == "tag_generate" for r in greedy.timeline.records) == 2
    one = StepScheduler(ScheduleConfig(prompts=6, group_size=1, mb_size=1), costs, 1, Ask(1), trainer_ranks=2)
    execute(one, costs)
    assert [(d.time, d.undispatched, d.slots, d.free_slots) for d in one.decisions] == [
        (0.0, 5, 1, 2), (0.0, 4, 1, 1), (1.0, 3, 1, 2), (2.0, 1, 1, 2)]
    switch = next(r for r in one.timeline.records if r.kind == "switch_to_train")
    assert (switch.start, min(r.start for r in one.timeline.records if r.kind == "update")) == (3.0, 3.0)


def test_profile_dict_round_trip_keeps_keep_fraction_name_and_pools():
    from verl_digen.schedule.costs import Hardware as Hw
    from verl_digen.schedule.profile_io import fit_samples, model_from_dict, model_to_dict

    m = CostModel(Pool(HW, 2), Pool(HW, 1), steps_trained=2, keep_fraction=0.5)
    d = model_to_dict(m)
    assert d["name"] == "" and d["keep_fraction"] == 0.5
    assert model_from_dict(d)[0] == m
    with pytest.raises(ValueError, match="not a verl-digen profile \\(format 'other'\\)"):
        model_from_dict({**d, "format": "other"})
    del d["generator"]["hardware"]["generate"]["per_unit"]  # a missing coefficient reads as 0
    assert model_from_dict(d)[0].generator.hardware.generate == Affine(1.0, 0.0)
    # a sample names its pool: generation measured on the trainer fits the trainer's hardware
    f = fit_samples(CostModel(Pool(Hw(), 1), Pool(Hw(), 1)),
                    [{"kind": "generate", "pool": "trainer", "size": 1, "seconds": 2.0},
                     {"kind": "generate", "pool": "trainer", "size": 2, "seconds": 3.0}])
    assert f.trainer.hardware.generate == Affine(1.0, 1.0) and f.generator.hardware.generate == Affine()


def test_single_size_samples_scale_the_prior_or_set_a_rate(tmp_path):
    from verl_digen.schedule.costs import Hardware as Hw
    from verl_digen.schedule.profile_io import dump_profile, fit_samples, load

    two = [{"kind": "generate", "size": 2, "seconds": 4.0}, {"kind": "generate", "size": 2, "seconds": 2.0}]
    # a zero prior: no shape to scale, the mean 3 s over 2 samples becomes a per-sample rate
    assert fit_samples(CostModel(Pool(Hw(), 1), Pool(Hw(), 1)), two).generator.hardware.generate == Affine(0.0, 1.5)
    # prior 0.25 + 0.125 x 2 = 0.5 s at size 2, measured 3 s: the prior scaled by 6
    prior = Hw(generate=Affine(0.25, 0.125))
    fitted = fit_samples(CostModel(Pool(prior, 1), Pool(Hw(), 1)), two).generator.hardware.generate
    assert fitted == Affine(0.25, 0.125).scaled(6.0)
    path = tmp_path / "p.yaml"
    dump_profile(MODEL, path)
    assert load(path)[0] == MODEL and "name: ''" in path.read_text()


def test_throughput_of_an_empty_run_is_unbounded():
    import math

    from verl_digen.schedule.bounds import throughput

    assert throughput(8, 2.0, 2) == 2.0 and throughput(8, 0.0, 2) == math.inf


def test_sim_backend_noise_is_mean_one_log_normal_and_completions_name_their_action():
    import math
    import statistics

    from verl_digen.schedule.costs import StageCosts
    from verl_digen.schedule.executor import SimBackend, run
    from verl_digen.schedule.scheduler import StepScheduler

    costs = StageCosts(generate=2.0, tag_generate=1.0, score=0.5, update=1.0)
    backend = SimBackend(costs, noise=0.3, seed=0)
    n = 20_000
    for _ in range(n):
        backend.launch(Action("generate", ("gen0",), 0, 0, 0))
    ends = [t for t, _, _ in backend._heap]
    logs = [math.log(t / 2.0) for t in ends]
    # multiplicative exp(N(0, 0.3) - 0.3^2 / 2): mean 1 (std of the mean ~0.002), log-std 0.3
    assert statistics.fmean(ends) / 2.0 == pytest.approx(1.0, abs=0.008)
    assert statistics.pstdev(logs) == pytest.approx(0.3, abs=0.01)
    seen: list[str] = []
    sched = StepScheduler(ScheduleConfig(prompts=1, group_size=2, mb_size=1), costs, 1)
    run(sched, SimBackend(costs), on_complete=lambda c: seen.append(c.action.kind))
    assert seen == [r.kind for r in sorted(sched.timeline.records, key=lambda r: r.end)]
