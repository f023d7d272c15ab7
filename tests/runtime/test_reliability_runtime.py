"""Reliability on real (tiny) Ray runs: the NaN guard, and a SIGTERM-stopped run resumed with
``trainer.resume_from=auto`` past partial directories, with retention and run ids, to ``total_steps`` (the
command-line stops of test_cluster_stop_runtime.py check their resume bit for bit up to the next stop and leave
going on to the end to this one)."""

import json
import os
import signal

import pytest
import torch
from runtime_helpers import compose_run

from verl_digen.driver.outputs import RunOutputs
from verl_digen.driver.runtime import DigenRuntime, RunStopped
from verl_digen.driver.steps import Steps
from verl_digen.workers import checkpoint as ckpt

pytestmark = pytest.mark.ray


def _fit(cfg, **kw):
    trainer = DigenRuntime(cfg, log=kw.pop("log", lambda _: None))
    try:
        return trainer, trainer.fit()
    finally:
        trainer.shutdown()


def test_nan_rewards_skip_the_optimizer_step_and_stop_naming_the_reward(ray_session, tmp_path):
    lines: list[str] = []
    cfg = compose_run("trainer.total_steps=4", "trainer.save_freq=1", "trainer.max_nonfinite_steps=2",
                      "digen.tag.policy=never", "reward.name=latent_target", "+reward.kwargs={target: nan}",
                      tmp_path=tmp_path)
    with pytest.raises(RunStopped) as err:
        _fit(cfg, log=lines.append)
    stop = err.value
    assert stop.exit_code == 3 and "non-finite reward" in str(stop) and "2 consecutive" in str(stop)
    assert any(line.startswith("step 1: non-finite reward") and "skipped" in line for line in lines), lines
    root = tmp_path / "ckpt"
    # step 1 was skipped (weights unchanged, finite) and saved; step 2 stopped the run before its save
    assert [s for s, _ in ckpt.complete_checkpoints(root)] == [1]
    payload, _ = ckpt.read(root / "global_step_1", 0)
    assert ckpt.non_finite(payload["params"]) is None and ckpt.non_finite(payload["optim"]) is None
    assert not any(payload["optim"].values())  # AdamW never stepped: no moments, no step count
    assert stop.checkpoint == str(root / "global_step_1")
    timeline = json.loads((tmp_path / "trace" / "digen_timeline.json").read_text())
    assert timeline["complete"] is False and "non-finite reward" in timeline["stopped"]
    assert not (root / ckpt.LOCK_FILE).exists()  # released


def _check_recent_records_equal_full_history(monkeypatch) -> list[int]:
    """Make every step's metrics also be computed from the whole timeline and compare (the runtime
    reads only the recent records, so per-step driver work stays flat in a long run)."""
    checked: list[int] = []
    step_metrics = Steps._step_metrics

    def full_history(self, sched, step, done, start, end, records, decisions):
        out = step_metrics(self, sched, step, done, start, end, records, decisions)
        assert out == step_metrics(self, sched, step, done, start, end, sched.timeline.records, sched.decisions)
        checked.append(self.start_step + step + 1)
        return out

    monkeypatch.setattr(Steps, "_step_metrics", full_history)
    return checked


def test_sigterm_stops_after_the_step_and_auto_resume_continues(ray_session, tmp_path, monkeypatch):
    # TCSS: the next step's stale generations are in flight when the signal stops the run
    common = ["trainer.save_freq=2", "trainer.max_checkpoints=1", "digen.tag.policy=never",
              "digen.tcss.staleness=0.5", "data.train_batch_size=4"]
    report = RunOutputs.report

    def report_then_signal(self, result, step, *args):
        report(self, result, step, *args)
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill <pid>` would, in the middle of a run

    monkeypatch.setattr(RunOutputs, "report", report_then_signal)
    with pytest.raises(RunStopped) as err:
        _fit(compose_run("trainer.total_steps=4", *common, tmp_path=tmp_path))
    monkeypatch.setattr(RunOutputs, "report", report)
    stop = err.value
    root = tmp_path / "ckpt"
    assert stop.exit_code == 128 + signal.SIGTERM and "SIGTERM after step 1" in str(stop)
    assert stop.checkpoint == str(root / "global_step_1")  # saved on the way out (save_freq=2 would not)
    first = ckpt.read_meta(root / "global_step_1")["extra"]
    trace = json.loads((tmp_path / "trace" / "digen_trace.json").read_text())
    assert trace["otherData"]["run_id"] == first["run_id"] and trace["otherData"]["complete"] is False

    # leftovers a crash could leave: neither is ever taken for a checkpoint
    (root / ".partial-global_step_3").mkdir()
    (root / "global_step_9").mkdir()
    torch.save({"params": {}}, root / "global_step_9" / ckpt.TRAINER_FILE)
    checked = _check_recent_records_equal_full_history(monkeypatch)
    trainer, result = _fit(compose_run("trainer.total_steps=3", "trainer.resume_from=auto", *common,
                                       tmp_path=tmp_path))
    assert checked == [2, 3]
    assert trainer.resume_path == str(root / "global_step_1")
    assert [r.step for r in result.reports] == [2, 3]
    # retention: only the newest complete checkpoint is kept; it names this run and the one it continues
    assert [s for s, _ in ckpt.complete_checkpoints(root)] == [3]
    meta = ckpt.read_meta(root / "global_step_3")["extra"]
    assert meta["run_id"] == result.run_id != first["run_id"] and meta["parent_run"] == first["run_id"]
    assert meta["data_position"] == 3 * 4
    # the streamed timeline holds both runs: the first up to its checkpoint (step 1), then the resumed one
    from verl_digen.schedule.export import read_runs

    (h1, r1), (h2, r2) = read_runs(tmp_path / "trace" / "digen_timeline.jsonl")
    assert (h1["run_id"], h2["run_id"], h2["first_step"]) == (first["run_id"], result.run_id, 1)
    assert {r["step"] for r in r1} == {0} and {r["step"] for r in r2} == {0, 1}
    # a stale micro-batch of step 3 was generated during step 2: the recent-records window covered it
    assert result.reports[-1].metrics["digen/stale_fraction"] > 0
    # ... and trained in step 3 by version 2: its rows are reported as stale
    last = result.reports[-1].metrics
    assert last["actor/ratio_mean_stale"] > 0 and 0 <= last["actor/clip_frac_stale"] <= 1


def test_a_stopped_generator_stops_the_run_naming_what_it_waited_on(ray_session, tmp_path):
    import ray

    cfg = compose_run("trainer.stall_timeout_s=4", "digen.tag.policy=never", tmp_path=tmp_path)
    trainer = DigenRuntime(cfg, log=lambda _: None)
    pid = None
    try:
        trainer.init_workers()
        pid = ray.get(trainer.gen_wg.workers[0].runtime_info.remote())["pid"]
        os.kill(pid, signal.SIGSTOP)  # hung, as a stopped or deadlocked process is
        with pytest.raises(RunStopped) as err:
            trainer.fit()
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        trainer.shutdown()
    assert err.value.exit_code == 4
    assert "no action finished for 4 s" in str(err.value) and "generate on gen0 (step 1" in str(err.value)
    assert json.loads((tmp_path / "trace" / "digen_timeline.json").read_text())["stopped"].startswith("stalled")


def test_a_rendezvous_port_taken_before_rank_0_binds_it_starts_the_groups_again(ray_session, tmp_path, monkeypatch):
    # the race on a busy node, made certain: verl's choice of the colocated group's MASTER_PORT hands out, the first
    # time, a port another socket holds; rank 0's store cannot bind it, and the run starts its groups again on the
    # port verl picks next, says so, and trains
    import socket
    from types import SimpleNamespace

    import ray
    from verl.single_controller.ray import base

    pick = base.get_master_addr_port
    picked = []

    def options(**opts):  # verl calls get_master_addr_port.options(...).remote(...)
        def remote(**kwargs):
            picked.append(kwargs)
            if len(picked) == 1:
                return ray.put((ray.util.get_node_ip_address(), str(taken)))
            return pick.options(**opts).remote(**kwargs)
        return SimpleNamespace(remote=remote)

    monkeypatch.setattr(base, "get_master_addr_port", SimpleNamespace(options=options))
    lines = []
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        _, result = _fit(compose_run("trainer=colocated", tmp_path=tmp_path), log=lines.append)
    assert len(picked) == 2, lines
    assert any(f"another process took rendezvous port {taken}" in line and "again (2/3)" in line for line in lines)
    assert [r.step for r in result.reports] == [1] and "actor/loss" in result.reports[0].metrics
