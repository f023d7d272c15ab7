"""The validation pass's pieces without Ray: which steps validate, how a run is cut, how prompts are shared,
the fixed seed stream, the image grid and its tensorboard image, and timelines/streams across segments."""

import json

import pytest
import torch

from verl_digen.config import ConfigError, compose, validate
from verl_digen.driver.validation import (
    MIN_TILE,
    Validator,
    captioned_grid,
    image_grid,
    log_images,
    segments,
    validation_steps,
)
from verl_digen.reporting.trace_stream import RecordStream, read_stream
from verl_digen.rewards import build_reward
from verl_digen.schedule.timeline import Record, Timeline, concat_timelines
from verl_digen.workers import policy as P

torch.set_num_threads(1)


@pytest.mark.parametrize(("start", "total", "freq", "steps", "cuts"), [
    (0, 5, 2, [2, 4, 5], [2, 2, 1]),
    (0, 4, 2, [2, 4], [2, 2]),
    (3, 7, 2, [4, 6, 7], [1, 2, 1]),  # a resumed run validates on the same global steps
    (0, 3, 10, [3], [3]),  # only after the last step
    (0, 3, 0, [], [3]),
    (0, 3, -1, [], [3]),
    (5, 5, 2, [], []),
])
def test_validation_steps_and_segments(start, total, freq, steps, cuts):
    assert validation_steps(start, total, freq) == steps
    assert segments(start, total, freq) == cuts
    assert sum(cuts) == total - start


def _validator(tmp_path, n_prompts, keep, *extra):
    val = tmp_path / "val.txt"
    val.write_text("".join(f"prompt {i}\n" for i in range(n_prompts)))
    return Validator(compose([f"data.val_files={val}", f"trainer.log_val_generations={keep}",
                              f"trainer.trace_dir={tmp_path}/trace", *extra]))


def test_shares_cover_every_prompt_once_and_keep_the_first_images(tmp_path):
    v = _validator(tmp_path, 7, 4)
    shares = v.shares(3)
    rows = [r for s in shares for r in s[0]]
    assert rows == [(i, 0) for i in range(7)]
    assert [len(s[0]) for s in shares] == [2, 2, 3]
    assert [s[2] for s in shares] == [2, 2, 0]  # images of rows 0..3
    assert [t for s in shares for t in s[1]] == v.prompts
    assert [s[2] for s in v.shares(8)] == [0, 1, 1, 1, 1, 0, 0, 0]  # more workers than prompts: empty shares


def test_image_grid_tiles_row_major_with_padding():
    imgs = torch.stack([torch.full((3, 2, 3), 10 * (i + 1), dtype=torch.uint8) for i in range(3)])
    grid = image_grid(imgs, pad=1)
    assert grid.shape == (2 * 4 + 1, 2 * 3 + 1, 3)  # 2 columns, 2 rows of 3 x 2 tiles
    assert torch.equal(grid[1:4, 1:3], imgs[0]) and torch.equal(grid[1:4, 4:6], imgs[1])
    assert torch.equal(grid[5:8, 1:3], imgs[2])
    assert int(grid[5:8, 4:6].min()) == 255 and int(grid[0].min()) == 255  # empty cell, padding
    with pytest.raises(ValueError, match="uint8"):
        image_grid(imgs.float())


def test_validation_grid_has_a_readable_captioned_tile_per_sample():
    imgs = torch.stack([torch.full((8, 16, 3), 40 * (i + 1), dtype=torch.uint8) for i in range(3)])
    imgs[0, 0, 0] = torch.tensor([1, 2, 3], dtype=torch.uint8)  # one odd pixel: scaled, not blurred
    grid = captioned_grid(imgs, ["a red cube", "a blue sphere on a long table by the sea", "x"], [0.5, -1.0, 2.0])
    scale = MIN_TILE // 8  # the shorter side (8 px) scaled up by a whole factor to MIN_TILE
    th, tw, pad = 8 * scale, 16 * scale, 4
    assert torch.equal(grid[pad:pad + scale, pad:pad + scale], torch.tensor([1, 2, 3], dtype=torch.uint8).expand(
        scale, scale, 3))  # the odd pixel is a scale x scale block
    assert torch.equal(grid[pad + th - 1, pad + tw - 1], imgs[0, -1, -1])
    caption = grid[pad + th: pad + th + 40, pad: pad + tw]
    assert int((caption < 128).sum()) > 50  # text under the tile
    second = grid[pad + th: pad + th + 40, 2 * pad + tw: 2 * pad + 2 * tw]
    assert not torch.equal(caption, second)  # each tile its own caption
    assert grid.shape[0] > 2 * th and grid.shape[1] == 2 * tw + 3 * pad  # 2 columns, 2 rows
    with pytest.raises(ValueError, match="as many prompts and rewards"):
        captioned_grid(imgs, ["a"], [0.0])


def test_log_images_writes_a_tensorboard_image(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    class Tracking:  # verl's Tracking keeps its backends in .logger (tensorboard's adapter has .writer)
        class _Tb:
            writer = SummaryWriter(str(tmp_path))

        logger = {"tensorboard": _Tb(), "console": object()}

    grid = image_grid(torch.zeros(2, 4, 4, 3, dtype=torch.uint8))
    assert log_images(Tracking(), grid, 7, "caption") == ["tensorboard"]
    acc = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    acc.Reload()
    (img,) = acc.Images("val/generations")
    assert (img.step, img.width, img.height) == (7, grid.shape[1], grid.shape[0])


def test_validation_samples_use_a_fixed_stream_whatever_the_version(tmp_path):
    """The same weights validated as version 2 and as version 9 give the same samples (validations
    differ only by the weights), and those are not any training step's samples."""
    cfg = compose(["model.dtype=float64", "model.latent_size=8", "rollout.num_steps=3", "rollout.train_steps=2"])
    wcfg = cfg.worker_config()
    model = P.freeze(P.build_policy(wcfg, "cpu"))
    reward = build_reward(wcfg.reward)
    rows, texts = [(0, 0), (1, 0)], ["a cat", "a dog"]
    a = P.validation_rows(model, reward, wcfg, 2, rows, texts, 2)
    b = P.validation_rows(model, reward, wcfg, 9, rows, texts, 1)
    assert a["rewards"] == b["rewards"] and torch.equal(a["images"][:1], b["images"])
    assert a["images"].dtype == torch.uint8 and a["images"].shape[0] == 2 and a["images"].shape[-1] == 3
    for step in (0, 2):  # training steps draw other noise
        train = P.score_trajectories(reward, P.generate_rows(model, wcfg, step, 2, rows, texts))
        assert train.rewards.tolist() != a["rewards"]


def test_log_val_generations_checked_before_ray(tmp_path):
    for bad in ("-1", "true", "2.5"):
        with pytest.raises(ConfigError, match="trainer.log_val_generations"):
            validate(compose([f"trainer.log_val_generations={bad}"]))


def _timeline(steps, t0):
    tl = Timeline(workers=["gen0", "trainer"], micro_batches=1, steps=steps)
    for s in range(steps):
        tl.add(Record("gen0", "generate", 0, s, s, t0 + s, t0 + s + 0.5))
        tl.add(Record("trainer", "optimizer_step", None, s, s, t0 + s + 0.5, t0 + s + 1))
    return tl


def test_concat_timelines_shifts_steps_and_versions():
    a, b = _timeline(2, 0.0), _timeline(1, 5.0)
    assert concat_timelines([(0, a)]) is a
    out = concat_timelines([(0, a), (2, b)])
    assert out.steps == 3 and len(out.records) == 6
    assert [(r.step, r.version) for r in out.records] == [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2)]
    assert out.records[4].start == 5.0 and b.records[0].step == 0  # times kept, parts untouched
    with pytest.raises(ValueError):
        concat_timelines([])


def test_record_stream_follows_segments_with_their_offset(tmp_path):
    path = tmp_path / "t.jsonl"
    first: list = []
    stream = RecordStream(path, first, {"run_id": "r"})
    first.extend(_timeline(2, 0.0).records)
    stream.flush()
    second: list = []
    stream.follow(second, 2)
    second.extend(_timeline(1, 5.0).records)
    stream.close()
    header, rows = read_stream(path)
    assert header == {"run_id": "r"}
    assert [(r["step"], r["version"]) for r in rows] == [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2)]
    assert json.loads(path.read_text().splitlines()[-1])["start"] == 5.5  # times as recorded
