"""The validation pass on real (tiny) runs: which steps validate, that the scores are those of the weights
after that step on the fixed seed stream (against an independent evaluation of the saved checkpoint),
that cutting a run at its validation steps changes nothing in training, and what reaches the outputs
(metrics file, PNG grid, tensorboard scalars and image, timeline on one time axis)."""

import json

import pytest
import torch
from PIL import Image
from runtime_helpers import compose_run

from verl_digen.driver.runtime import DigenRuntime
from verl_digen.reporting.trace_stream import read_stream
from verl_digen.rewards import build_reward
from verl_digen.workers import policy as P
from verl_digen.workers.export import load_trained_policy

pytestmark = pytest.mark.ray

VAL_PROMPTS = ["a red circle", "a blue square", "a green triangle", "two cats", "a yellow sun"]
#: 2 prompts x 2 samples per step; validation every 2 steps of 3 -> after steps 2 and 3
RUN = ["trainer.total_steps=3", "trainer.test_freq=2", "trainer.log_val_generations=4", "digen.tag.policy=never"]


def _fit(cfg, lines=None):
    trainer = DigenRuntime(cfg, log=(lines.append if lines is not None else lambda _: None))
    try:
        return trainer.fit(), trainer
    finally:
        trainer.shutdown()


@pytest.fixture(scope="module")
def val_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("val") / "val.txt"
    path.write_text("\n".join(VAL_PROMPTS) + "\n")
    return path


@pytest.fixture(scope="module")
def validated(ray_session, tmp_path_factory, val_file):
    """A digen run that validates after steps 2 and 3, logging to tensorboard, saving every step."""
    tmp = tmp_path_factory.mktemp("validated")
    mp = pytest.MonkeyPatch()
    mp.setenv("TENSORBOARD_DIR", str(tmp / "tb"))
    lines: list[str] = []
    cfg = compose_run(*RUN, f"data.val_files={val_file}", "trainer.save_freq=1",
                      "trainer.logger=[console,tensorboard]", tmp_path=tmp)
    try:
        result, _ = _fit(cfg, lines)
    finally:
        mp.undo()
    return cfg, result, lines, tmp


def test_validates_after_every_test_freq_steps_and_the_last(validated):
    _, result, lines, _ = validated
    assert [v.step for v in result.validations] == [2, 3]
    for v in result.validations:
        assert sorted(v.rewards) == list(range(len(VAL_PROMPTS)))  # every validation prompt, once
        assert v.metrics["val/samples"] == len(VAL_PROMPTS)
        assert any(ln.startswith(f"step {v.step}: validation reward {v.metrics['val/reward_mean']:+.4f}")
                   for ln in lines)


def test_scores_are_those_of_the_weights_after_the_step(validated):
    """Independent of the run's workers: the checkpoint of step 2, loaded on the driver, sampled on the
    validation seed stream and scored, gives the run's validation rewards of step 2 (not those of the
    version the generators held before the step, nor of step 3)."""
    cfg, result, _, tmp = validated
    wcfg = cfg.worker_config()
    reward = build_reward(wcfg.reward)
    by_step = {v.step: v for v in result.validations}
    for step in (2, 3):
        model, _ = load_trained_policy(tmp / "ckpt" / f"global_step_{step}")
        ref = P.validation_rows(P.freeze(model), reward, wcfg, step, [(i, 0) for i in range(len(VAL_PROMPTS))],
                                VAL_PROMPTS, 0)
        got = [by_step[step].rewards[i] for i in range(len(VAL_PROMPTS))]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref["rewards"]), rtol=0, atol=1e-12)
    assert by_step[2].rewards != by_step[3].rewards  # the weights moved between the two


def test_outputs_png_metrics_file_tensorboard_and_one_time_axis(validated):
    cfg, result, _, tmp = validated
    trace = tmp / "trace"
    rows = [json.loads(ln) for ln in (trace / "val" / "digen_val.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 3]
    assert {r["run_id"] for r in rows} == {result.run_id} and result.run_id  # as on the training metrics
    assert rows[0]["val/reward_mean"] == pytest.approx(result.validations[0].metrics["val/reward_mean"])

    # a 2 x 2 grid of the first 4 samples (4-pixel white padding), each tile at least MIN_TILE wide with
    # its caption (prompt, reward) under it
    from verl_digen.driver.validation import MIN_TILE

    png = Image.open(trace / "val" / "digen_step_3.png")
    tile = (png.size[0] - 12) // 2
    assert png.size[0] == 2 * tile + 12 and tile >= MIN_TILE and png.size[1] > png.size[0]
    assert result.validations[1].png == str(trace / "val" / "digen_step_3.png")

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp / "tb"), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Images("val/generations")] == [2, 3]
    assert acc.Images("val/generations")[0].width == png.size[0]
    assert [e.step for e in acc.Scalars("val/reward_mean")] == [2, 3]

    # one time axis: segment 2 (step 3) starts after the validation of step 2; step 3's time holds none of it
    tl = result.timeline
    assert tl.steps == 3 and sorted({r.step for r in tl.records}) == [0, 1, 2]
    seg1_end = max(r.end for r in tl.records if r.step <= 1)
    seg2_start = min(r.start for r in tl.records if r.step == 2)
    assert seg2_start - seg1_end >= result.validations[0].metrics["val/seconds"]
    step3_end = max(r.end for r in tl.records if r.step == 2)
    assert result.reports[2].metrics["timing/step_s"] <= step3_end - seg1_end - result.validations[0].metrics[
        "val/seconds"] + 1e-6
    # the streamed timeline holds the same records with the run's step numbers
    _, streamed = read_stream(trace / "digen_timeline.jsonl")
    assert [(r["worker"], r["kind"], r["step"], r["version"]) for r in streamed] == [
        (r.worker, r.kind, r.step, r.version) for r in tl.records]


def test_colocated_baseline_validates_on_its_ranks_with_the_same_scores_and_cutting_changes_nothing(
        validated, ray_session, tmp_path, val_file):
    """The colocated baseline validates only after its last step, so its run is not cut: every training number
    of digen's run, cut at step 2 for its validation, equals it (placement-invariant training in float64), and
    so does the validation of step 3 (test_freq=3: once, after the last step)."""
    _, result, _, _ = validated
    col, _ = _fit(compose_run("trainer=colocated", "trainer.total_steps=3", "trainer.test_freq=3",
                              f"data.val_files={val_file}", tmp_path=tmp_path))
    assert [v.step for v in col.validations] == [3]
    for a, b in zip(result.reports, col.reports, strict=True):
        for key in ("reward/mean", "actor/loss", "actor/grad_norm"):
            assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-9, abs=1e-12), (a.step, key)
    ref = result.validations[1].rewards  # digen's after step 3: placement-invariant sampling and training
    assert col.validations[0].rewards == pytest.approx(ref, rel=1e-9, abs=1e-12)


@pytest.fixture(scope="module")
def ema_validated(ray_session, tmp_path_factory, val_file):
    """The validated run with an EMA, validating the EMA, exporting at every save."""
    tmp = tmp_path_factory.mktemp("ema")
    cfg = compose_run(*RUN, f"data.val_files={val_file}", "trainer.save_freq=1", "actor.ema_decay=0.5",
                      "trainer.val_with_ema=true", "trainer.export_on_save=true", tmp_path=tmp)
    lines: list[str] = []
    result, _ = _fit(cfg, lines)
    return cfg, result, lines, tmp


def test_validation_with_ema_scores_the_ema_and_leaves_training_unchanged(validated, ema_validated):
    """trainer.val_with_ema: the validation of step N scores the EMA saved in step N's checkpoint; the
    generators then go on from the trained weights, so every training number equals the run without an
    EMA; trainer.export_on_save puts both exports into each checkpoint."""
    _, plain, _, _ = validated
    cfg, result, lines, tmp_path = ema_validated
    for a, b in zip(result.reports, plain.reports, strict=True):
        for key in ("reward/mean", "actor/loss", "actor/grad_norm"):
            assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-9, abs=1e-12), (a.step, key)
    wcfg = cfg.worker_config()
    reward = build_reward(wcfg.reward)
    for v in result.validations:
        path = tmp_path / "ckpt" / f"global_step_{v.step}"
        ema, _ = load_trained_policy(path, ema=True)
        ref = P.validation_rows(P.freeze(ema), reward, wcfg, v.step, [(i, 0) for i in range(len(VAL_PROMPTS))],
                                VAL_PROMPTS, 0)
        assert [v.rewards[i] for i in range(len(VAL_PROMPTS))] == pytest.approx(ref["rewards"], rel=0, abs=1e-12)
        assert v.rewards != plain.validations[[w.step for w in plain.validations].index(v.step)].rewards
        for sub in ("export", "export/ema"):
            info = json.loads((path / sub / "export.json").read_text())
            assert info["kind"] == "full" and info["ema"] == (sub == "export/ema")
            assert (path / sub / "transformer" / "config.json").is_file()
    assert any("export in" in ln and "global_step_3" in ln for ln in lines)


def test_colocated_validation_with_ema_matches_digen_and_trains_on(ema_validated, ray_session, tmp_path, val_file):
    """The colocated ranks validate the EMA themselves (a sharded generation copy made from it) and then
    generate the next step from the trained weights again: both validations equal digen's."""
    _, result, _, _ = ema_validated
    col, _ = _fit(compose_run("trainer=colocated", *RUN, f"data.val_files={val_file}", "actor.ema_decay=0.5",
                              "trainer.val_with_ema=true", tmp_path=tmp_path))
    assert [v.step for v in col.validations] == [2, 3]
    for c, d in zip(col.validations, result.validations, strict=True):
        assert c.rewards == pytest.approx(d.rewards, rel=1e-9, abs=1e-12), c.step
