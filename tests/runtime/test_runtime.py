"""The Ray runtime end to end: real worker groups on CPU, tiny models, the scheduler's timeline."""

import json
import pickle
import tempfile
from pathlib import Path

import pytest
import ray
import torch
from runtime_helpers import compose_run

from verl_digen.config import ConfigError
from verl_digen.driver import steps
from verl_digen.driver.runtime import DigenRuntime
from verl_digen.reporting.metric_names import step_names
from verl_digen.reporting.progress import Recent, forget_read
from verl_digen.schedule import TimelineError, check_timeline, ledger
from verl_digen.schedule.actions import OPTIMIZER_STEP
from verl_digen.schedule.profile_io import load_profile
from verl_digen.schedule.timeline import Record

pytestmark = pytest.mark.ray


def _run(cfg, inspect=None):
    """Run ``cfg``; returns its result and ``inspect(trainer)`` taken before the workers go away."""
    trainer = DigenRuntime(cfg, log=lambda _: None)
    try:
        result = trainer.fit()
        seen = inspect(trainer) if inspect else None
    finally:
        trainer.shutdown()
    return result, seen


def _train(cfg):
    """Run ``cfg`` and return (result, rank-0 trainer parameters)."""
    # full_state is collective over the trainer ranks; rank 0 holds the result
    return _run(cfg, lambda t: t.trn_wg.full_state()[0]["params"])


def _assert_params_close(a, b, atol):
    assert a.keys() == b.keys() and a
    worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert worst <= atol, f"parameters differ by {worst:.3e}"


def test_real_timeline_keeps_the_invariants_with_tcss(ray_session, tmp_path):
    cfg = compose_run("trainer.total_steps=3", "digen.tcss.staleness=0.5", "data.train_batch_size=4",
                      "rollout.micro_batch_size=2", tmp_path=tmp_path)
    def one_trajectory_bytes(t):
        rows, texts = t.prompts.rows(0, [(0, 0)])
        return len(pickle.dumps(ray.get(t.gen_wg.workers[0].generate.remote(0, 2, rows, texts))))

    result, traj_bytes = _run(cfg, one_trajectory_bytes)
    check_timeline(result.timeline, staleness_bound=0.5)
    assert len([r for r in result.timeline.records if r.kind == OPTIMIZER_STEP]) == 3
    # per-worker pickup: each generator swaps versions on its own, between its trajectories
    pickups = [r for r in result.timeline.records if r.kind == "weight_sync"]
    assert {r.version for r in pickups} == {1, 2} and all(r.worker.startswith("gen") for r in pickups)
    # the data plane stays off the driver: per step it fetches less than one trajectory's bytes
    for r in result.reports:
        assert 0 < r.metrics["perf/driver_bytes"] < traj_bytes, (r.metrics["perf/driver_bytes"], traj_bytes)
    metrics = [r.metrics for r in result.reports]
    assert [r.step for r in result.reports] == [1, 2, 3]
    for m in metrics:
        assert set(m) <= step_names(), set(m) - step_names()  # every name is in the schema docs/metrics.md reads
        assert m["digen/stale_fraction"] <= 0.5
        # the ratio split by staleness: stale keys exactly in steps that trained stale micro-batches, and
        # fresh rows are trained by the policy that sampled them (ratio 1 up to rounding, never clipped)
        assert ("actor/ratio_mean_stale" in m) == (m["digen/stale_fraction"] > 0) == ("actor/clip_frac_stale" in m)
        assert m["actor/ratio_mean_fresh"] == pytest.approx(1.0, abs=1e-4) and m["actor/clip_frac_fresh"] == 0.0
        assert 0 <= m["pool/trainer_busy"] <= 1 and 0 <= m["pool/generator_busy"] <= 1
        assert m["timing/step_s"] > 0 and m["perf/samples_per_worker_s"] > 0
    # the trace opens in Perfetto (Chrome trace JSON) and the profile loads into the simulator
    trace = json.loads(Path(result.trace_path).read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    model = load_profile(result.profile_path)
    assert model.generator.hardware.generate.per_unit + model.generator.hardware.generate.fixed > 0
    assert model.trainer.hardware.train_pass.fixed + model.trainer.hardware.train_pass.per_unit > 0


def test_resume_reproduces_the_uninterrupted_run_and_a_broken_invariant_fails_the_run(ray_session, tmp_path,
                                                                                        monkeypatch):
    """The uninterrupted run is also the one whose end-of-run invariant check is made to fail (a check of the
    whole timeline after the last step: its training, checkpoints and workers are those of a passing run)."""
    import verl_digen.driver.runtime as runtime

    def strict(timeline, staleness_bound=None):
        check_timeline(timeline, staleness_bound)
        raise TimelineError("step 0 micro-batch 0 generated 2 times (expected once)")

    common = ["trainer.total_steps=4", "trainer.save_freq=2", "digen.tag.policy=never"]
    cfg = compose_run(*common, tmp_path=tmp_path / "a")
    with monkeypatch.context() as mp:
        mp.setattr(runtime, "check_timeline", strict)
        trainer = DigenRuntime(cfg, log=lambda _: None)
        try:
            with pytest.raises(TimelineError, match="broke a scheduling invariant: step 0 micro-batch 0 generated 2"):
                trainer.fit()
            straight = trainer.trn_wg.full_state()[0]["params"]
        finally:
            trainer.shutdown()
    trace_dir = Path(cfg.trainer.trace_dir)
    assert "generated 2 times" in (trace_dir / "digen_violation.txt").read_text()
    assert (trace_dir / "digen_trace.json").is_file()  # what was measured is kept for inspection
    assert not (trace_dir / "digen_profile.json").exists()  # no profile from a broken run

    ckpt = tmp_path / "a" / "ckpt" / "global_step_2"
    assert ckpt.is_dir()
    resumed_cfg = compose_run(*common, f"trainer.resume_from={ckpt}", tmp_path=tmp_path / "b")
    result, resumed = _train(resumed_cfg)
    assert [r.step for r in result.reports] == [3, 4]
    _assert_params_close(straight, resumed, atol=1e-10)


def test_reward_rises_over_a_short_digen_run_whose_driver_holds_only_a_window(ray_session, tmp_path, monkeypatch):
    # no trace_dir: the timeline streams to a scratch file, which the run removes
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = compose_run("model.dtype=float32", "model.latent_size=16", "data.train_batch_size=4", "rollout.n=4",
                      "rollout.micro_batch_size=4", "rollout.num_steps=6", "rollout.train_steps=4",
                      "trainer.total_steps=8", "trainer.trace_dir=null", f"trainer.default_local_dir={tmp_path}")
    held: list[int] = []  # records in the driver's memory after each step's forgetting

    def counted(items, *readers):
        gone = forget_read(items, *readers)
        if readers and isinstance(readers[0], Recent) and items and isinstance(items[0], Record):
            held.append(len(items))
        return gone

    monkeypatch.setattr(steps, "forget_read", counted)
    result, _ = _run(cfg)
    rewards = [r.metrics["reward/mean"] for r in result.reports]
    spread = max(r.metrics["reward/std"] for r in result.reports)
    assert sum(rewards[-2:]) / 2 - sum(rewards[:2]) / 2 > 2 * spread, rewards
    # the driver held about two steps of records at a time, and the whole run came back at the end
    per_step = len(result.timeline.records) / 8
    assert len(held) == 8 and max(held) <= 2.5 * per_step, (held, per_step)
    check_timeline(result.timeline)
    assert sorted(r.step for r in result.timeline.records if r.kind == OPTIMIZER_STEP) == list(range(8))
    assert not list(tmp_path.glob("digen-timeline-*"))


@pytest.mark.parametrize("backend", ["collective"])
def test_lora_digen_run_with_collective_sync(ray_session, tmp_path, backend):
    cfg = compose_run("model.lora_rank=2", f"digen.sync.backend={backend}", "trainer.total_steps=2",
                      "actor.recompute_log_prob=true", tmp_path=tmp_path)
    def inspect(t):
        held = t.gen_wg.weights_version()  # picked up during the run, each generator on its own
        t.sync.sync(2)  # the final version is never published by the run: nobody generates with it
        adapters = ray.get(t.trn_wg.workers[0].export_weights.remote())
        return held, t.gen_wg.weights_checksum()[0], t.trn_wg.weights_checksum()[0], adapters

    result, (held, gen_sum, trn_sum, adapters) = _run(cfg, inspect)
    check_timeline(result.timeline)
    assert held == [1]
    pickups = [r for r in result.timeline.records if r.kind == "weight_sync"]
    assert pickups and all(r.worker.startswith("gen") and r.version == 1 for r in pickups)
    assert gen_sum == trn_sum
    # the byte ledger: each pickup moved the adapters once, device to device on this node, hashing nothing,
    # exactly what the cost model prices a collective pickup with; the publish staged them; the trace says so
    nbytes = sum(v.numel() * v.element_size() for v in adapters.values())
    priced = ledger.pickup_ledger(nbytes, "collective", inter_node=False, on_gpu=False)
    assert [dict(r.moved) for r in pickups] == [{**priced, ledger.STAGING_PEAK: nbytes}] * len(pickups)  # 1 bucket
    publishes = [r for r in result.timeline.records if r.kind == "publish"]
    assert publishes and all(dict(r.moved) == {ledger.STAGING_PEAK: nbytes} for r in publishes)
    events = json.loads(Path(result.trace_path).read_text())["traceEvents"]
    assert [e["args"]["bytes"] for e in events if e.get("cat") == "weight_sync"] == [dict(r.moved) for r in pickups]
    assert all(torch.isfinite(torch.tensor(r.metrics["actor/loss"])) for r in result.reports)
    for r in result.reports:  # the old log-probs are the trainer's own: ratio 1, the rollout's gap reported
        m = r.metrics
        assert m["actor/ratio_min"] == m["actor/ratio_max"] == 1.0 and m["actor/clip_frac"] == 0.0
        assert 0.0 <= m["actor/rollout_logprob_diff_mean"] <= m["actor/rollout_logprob_diff_max"] < 1e-3


def test_a_node_resource_no_node_has_fails_before_any_worker_starts(ray_session, tmp_path):
    cfg = compose_run("resources.generator.node_resource=H100x", tmp_path=tmp_path)
    trainer = DigenRuntime(cfg, log=lambda _: None)
    with pytest.raises(ConfigError, match="resources.generator.node_resource.*H100x.*custom resources: none"):
        trainer.init_workers()
    assert trainer.gen_wg is None and trainer.trn_wg is None


def test_a_hub_id_missing_from_the_cache_fails_before_any_worker_starts(ray_session, tmp_path, monkeypatch):
    import ray

    cfg = compose_run("model.path=verl-digen-tests/not-a-cached-model", tmp_path=tmp_path)
    # a CPU run on a Ray of its own is one machine: refused by validate, before Ray
    with pytest.raises(ConfigError, match="model.path.*not-a-cached-model.*Hugging Face cache"):
        DigenRuntime(cfg, log=lambda _: None)
    # told to join a cluster, validate cannot know its nodes: the runtime checks once Ray is up, before any worker
    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    trainer = DigenRuntime(cfg, log=lambda _: None)
    with pytest.raises(ConfigError, match="model.path.*not-a-cached-model.*Hugging Face cache"):
        trainer.init_workers()
    assert trainer.gen_wg is None and trainer.trn_wg is None


def test_pools_larger_than_the_cluster_fail_before_any_worker_starts(ray_session, tmp_path):
    # 16 > the 8 CPUs of the test session (and below validate's per-machine limit, so Ray is what refuses)
    cfg = compose_run("resources.generator.workers=16", "rollout.micro_batch_size=2", tmp_path=tmp_path)
    trainer = DigenRuntime(cfg, log=lambda _: None)
    with pytest.raises(ConfigError, match="resources.generator.workers"):
        trainer.init_workers()
    assert trainer.gen_wg is None and trainer.trn_wg is None
