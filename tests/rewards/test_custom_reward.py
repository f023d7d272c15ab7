"""verl's ``custom_reward_function.path`` / ``.name``: a user's batched reward function, checked before
Ray, built where the generator builds its reward (``build_reward(worker_config().reward)``) and scored
through ``score_trajectories`` like every other reward."""

from __future__ import annotations

import pytest
import torch

from verl_digen.algo.trajectory import Trajectories
from verl_digen.config import ConfigError, compose, validate
from verl_digen.rewards import MultiReward, build_reward
from verl_digen.workers.policy import score_trajectories

REWARD_FILE = '''
import torch

def compute_score(images, prompts, scale=1.0):
    """mean pixel x scale + the prompt's length / 100 (prompts[i] goes with images[i])"""
    return [scale * float(im.mean()) + len(p) / 100 for im, p in zip(images, prompts)]

def not_batched(image):
    return 0.0

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def reward_file(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text(REWARD_FILE)
    return f


def _cfg(tmp_path, *overrides):
    return compose([f"trainer.trace_dir={tmp_path}/trace", f"trainer.default_local_dir={tmp_path}/ckpt", *overrides])


def _expected(images, prompts, scale=1.0):
    return torch.tensor([scale * float(im.mean()) + len(p) / 100 for im, p in zip(images, prompts)],
                        dtype=torch.float64)


def test_custom_function_is_the_reward_generators_build(tmp_path, reward_file):
    cfg = _cfg(tmp_path, f"custom_reward_function.path={reward_file}",
               "+custom_reward_function.reward_kwargs={scale: 2.0}")
    assert validate(cfg) == []
    reward = build_reward(cfg.worker_config().reward)  # what GeneratorWorker.init_model does
    images = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    prompts = ["a", "bb", "ccc"]
    out = reward(images, prompts)
    assert out.dtype == torch.float64 and torch.equal(out, _expected(images, prompts, 2.0))
    # the generator's scoring path: rewards and the 'custom' component filled, images dropped
    traj = Trajectories.__new__(Trajectories)
    traj.images, traj.prompts, traj.final_latents = images, prompts, torch.zeros(3, 4)
    traj.prompt_ids = torch.arange(3)
    scored = score_trajectories(reward, traj)
    assert torch.equal(scored.rewards, _expected(images, prompts, 2.0)) and set(scored.reward_components) == {"custom"}
    assert scored.images is None


def test_the_dry_run_prints_the_custom_function_as_the_reward(tmp_path, reward_file):
    """The dry run's config says what scores the samples: ``reward.name: custom`` when the custom function
    replaced the default reward (it printed the default's name), and the default when no function is set."""
    import yaml

    from verl_digen.main import dry_run

    def printed_reward(cfg) -> dict:
        return yaml.safe_load(dry_run(cfg).split("\n\n", 1)[0])["reward"]

    assert printed_reward(_cfg(tmp_path, f"custom_reward_function.path={reward_file}"))["name"] == "custom"
    plain = _cfg(tmp_path)
    assert printed_reward(plain)["name"] == plain.reward.name != "custom"


def test_custom_function_as_one_weighted_component(tmp_path, reward_file):
    cfg = _cfg(tmp_path, f"custom_reward_function.path={reward_file}",
               "reward.weights={custom: 0.5, brightness: 1.0}")
    assert validate(cfg) == []
    reward = build_reward(cfg.worker_config().reward)
    assert isinstance(reward, MultiReward) and set(reward.rewards) == {"custom", "brightness"}
    images, prompts = torch.rand(2, 3, 8, 8), ["x", "yy"]
    parts = reward.components(images, prompts)
    assert torch.equal(parts["custom"], _expected(images, prompts))
    assert torch.allclose(reward(images, prompts), 0.5 * parts["custom"] + parts["brightness"])


def test_video_is_scored_frame_by_frame():
    import tempfile
    from pathlib import Path

    from verl_digen.rewards.custom import CustomReward

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "r.py"
        f.write_text("def compute_score(images, prompts):\n    return images.mean(dim=(1, 2, 3))\n")
        video = torch.rand(2, 3, 4, 6, 6)
        out = CustomReward(str(f))(video, ["a", "b"])
    assert torch.allclose(out, video.mean(dim=(1, 3, 4)).mean(dim=1).double())


def test_wrong_output_is_a_clear_error(tmp_path):
    from verl_digen.rewards.custom import CustomReward

    f = tmp_path / "r.py"
    f.write_text("def compute_score(images, prompts):\n    return [1.0]\n")
    with pytest.raises(RuntimeError, match=r"returned shape \(1,\) for 2 images"):
        CustomReward(str(f))(torch.rand(2, 3, 4, 4), ["a", "b"])


#: verl-omni's per-sample contract (its reward_score/*.py functions): the OCR-style score compares the
#: image with the row's ground truth; a dict result gives "score"
PER_SAMPLE_FILE = '''
import torch

def compute_score(data_source, solution_image, ground_truth, extra_info, bonus=0.0, **kwargs):
    assert solution_image.dtype == torch.uint8 and solution_image.shape[0] == 3
    mean = float(solution_image.float().mean()) / 255
    return {"score": mean + len(ground_truth or "") + extra_info.get("w", 0) + bonus, "raw": mean,
            "source": data_source}
'''


def test_verl_omnis_per_sample_function_gets_the_rows_ground_truth(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_digen.rewards import Rows

    data = tmp_path / "ocr.parquet"
    pq.write_table(pa.table({
        "data_source": ["ocr", "ocr"],
        "prompt": [[{"role": "user", "content": 'a sign that says "hi"'}], [{"role": "user", "content": "a cat"}]],
        "reward_model": [{"ground_truth": "hi"}, {"ground_truth": "meow!"}],
        "extra_info": [{"w": 10}, {"w": 20}]}), data)
    f = tmp_path / "omni_reward.py"
    f.write_text(PER_SAMPLE_FILE)
    cfg = _cfg(tmp_path, f"data.train_files={data}", "data.train_batch_size=2", f"custom_reward_function.path={f}",
               "+custom_reward_function.reward_kwargs={bonus: 0.5}")
    assert validate(cfg) == []
    reward = build_reward(cfg.worker_config().reward)  # what the generator builds, with the data files' rows
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    prompts = ["a cat", 'a sign that says "hi"']
    pixels = [float((im.clamp(0, 1) * 255).round().to(torch.uint8).float().mean()) / 255 for im in images]
    want = torch.tensor([pixels[0] + 5 + 20 + 0.5, pixels[1] + 2 + 10 + 0.5], dtype=torch.float64)
    assert torch.allclose(reward(images, prompts, rows=Rows("train", (1, 0))), want, rtol=0, atol=1e-12)
    # without rows (the built-in prompts, a .txt file): no row fields
    assert torch.allclose(reward(images, prompts), torch.tensor(pixels, dtype=torch.float64) + 0.5, atol=1e-12)
    with pytest.raises(RuntimeError, match=r"sample 0 \(prompt 'a cat'\) claims train row 0, which has another"):
        reward(images, prompts, rows=Rows("train", (0, 0)))
    # video: the whole (3, F, H, W) sample in one call, as verl-omni passes it (HPSv3 picks its own frames)
    video = torch.rand(2, 3, 4, 6, 6)
    out = reward(video, ["a cat", "a cat"], rows=Rows("train", (1, 1)))
    assert torch.allclose(out, torch.tensor([float((v.clamp(0, 1) * 255).round().mean()) / 255 + 25.5
                                             for v in video], dtype=torch.float64), atol=1e-12)


#: ground truth and extra_info echoed: score = ground truth's number + extra_info's index / 100
ROW_ECHO = """
def compute_score(data_source, solution_image, ground_truth, extra_info):
    return float(ground_truth) + extra_info["index"] / 100 + (1000.0 if data_source == "val_src" else 0.0)
"""


def test_rows_are_rows_repeated_prompts_and_a_prompt_in_both_files(tmp_path):
    """verl-omni's data_process writes every row with its own extra_info.index: a train file that repeats a
    prompt is accepted, each sample gets its own row (by prompt id), and a training prompt that is also in the
    val file gets its training row in training and the val row in validation (through score_trajectories)."""
    import json

    train, val, f = tmp_path / "train.jsonl", tmp_path / "val.jsonl", tmp_path / "echo.py"
    rows = [("a", "1"), ("b", "2"), ("a", "3")]
    train.write_text("".join(json.dumps({"prompt": p, "data_source": "train_src", "reward_model": {"ground_truth": g},
                                         "extra_info": {"index": i}}) + "\n" for i, (p, g) in enumerate(rows)))
    val.write_text(json.dumps({"prompt": "a", "data_source": "val_src", "reward_model": {"ground_truth": "7"},
                               "extra_info": {"index": 0}}) + "\n")
    f.write_text(ROW_ECHO)
    cfg = _cfg(tmp_path, f"data.train_files={train}", f"data.val_files={val}", "trainer.test_freq=1",
               "data.train_batch_size=3", f"custom_reward_function.path={f}")
    assert validate(cfg) == []
    reward = build_reward(cfg.worker_config().reward)

    def scored(ids, prompts, split):
        traj = Trajectories.__new__(Trajectories)
        traj.images, traj.prompts, traj.final_latents = torch.rand(len(ids), 3, 4, 4), prompts, None
        traj.prompt_ids = torch.tensor(ids)
        return score_trajectories(reward, traj, split=split).rewards.tolist()

    assert scored([0, 1, 2, 2], ["a", "b", "a", "a"], "train") == [1.0, 2.01, 3.02, 3.02]
    assert scored([0], ["a"], "val") == [1007.0]


def test_an_async_per_sample_function_is_awaited(tmp_path):
    """verl-omni's reward manager awaits coroutine functions (genrm_ocr's compute_score_ocr is one)."""
    from verl_digen.rewards.custom import CustomReward

    f = tmp_path / "async_reward.py"
    f.write_text("async def compute_score(data_source, solution_image, ground_truth, extra_info):\n"
                 "    return float(solution_image.float().mean()) / 255\n")
    images = torch.rand(2, 3, 4, 4)
    want = torch.tensor([float((im * 255).round().mean()) / 255 for im in images], dtype=torch.float64)
    assert torch.allclose(CustomReward(str(f))(images, ["a", "b"]), want, atol=1e-12)


BAD = {
    "missing-file": (lambda t, f: [f"custom_reward_function.path={t}/nope.py"], "custom_reward_function.path",
                     "no such file"),
    "not-python": (lambda t, f: [f"custom_reward_function.path={(t / 'r.txt').write_text('x') and t / 'r.txt'}"],
                   "custom_reward_function.path", "expected a .py file"),
    "import-fails": (lambda t, f: [f"custom_reward_function.path={(t / 'b.py').write_text('import nope_x') and t / 'b.py'}"],  # noqa: E501
                     "custom_reward_function.path", "importing it failed (ModuleNotFoundError"),
    "no-function": (lambda t, f: [f"custom_reward_function.path={f}", "custom_reward_function.name=compute"],
                    "custom_reward_function.name", "has no function 'compute' (custom_reward_function.name; "
                    "functions defined there: compute_score, not_batched)"),
    "not-callable": (lambda t, f: [f"custom_reward_function.path={f}", "custom_reward_function.name=NOT_A_FUNCTION"],
                     "custom_reward_function.path", "is a int, not a function"),
    "wrong-signature": (lambda t, f: [f"custom_reward_function.path={f}", "custom_reward_function.name=not_batched"],
                        "custom_reward_function.path", "cannot be called as not_batched(images, prompts)"),
    "unknown-kwarg": (lambda t, f: [f"custom_reward_function.path={f}", "+custom_reward_function.reward_kwargs={k: 1}"],
                      "custom_reward_function.path", "cannot be called as compute_score(images, prompts, k=...)"),
    "weights-without-custom": (lambda t, f: [f"custom_reward_function.path={f}", "reward.weights={brightness: 1.0}"],
                               "reward.weights", "an entry 'custom'"),
    "other-reward-name": (lambda t, f: [f"custom_reward_function.path={f}", "reward.name=brightness"],
                          "reward.name", "reward.weights={custom: 1.0, brightness: w}"),
    "custom-without-path": (lambda t, f: ["reward.name=custom"], "custom_reward_function.path", "names 'custom'"),
    "per-sample-wrong-kwarg": (lambda t, f: [f"custom_reward_function.path={_per_sample(t)}",
                                             "+custom_reward_function.reward_kwargs={k: 1}"],
                               "custom_reward_function.path", "cannot be called as compute_score(data_source=..., "
                               "solution_image=..., ground_truth=..., extra_info=..., k=...)"),
}


def _per_sample(tmp_path) -> str:
    f = tmp_path / "strict.py"
    f.write_text("def compute_score(data_source, solution_image, ground_truth, extra_info):\n    return 1.0\n")
    return str(f)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_custom_reward_is_refused_before_ray(case, tmp_path, reward_file):
    make, key, part = BAD[case]
    with pytest.raises(ConfigError) as err:
        validate(_cfg(tmp_path, *make(tmp_path, reward_file)))
    assert err.value.key == key, str(err.value)
    assert part in str(err.value)


def test_a_reward_file_is_imported_once_per_process_until_it_changes(tmp_path):
    """validate, the memory plan and the reward build each load the function: one import, not three
    (a file with side effects at import, a slow import, ran once per load); an edited file is re-read."""
    import os

    from verl_digen.rewards.custom import load_function

    log = tmp_path / "imports.txt"
    f = tmp_path / "counted.py"
    f.write_text(f"open({str(log)!r}, 'a').write('x')\ndef compute_score(images, prompts):\n    return [1.0]\n")
    cfg = _cfg(tmp_path, f"custom_reward_function.path={f}")
    validate(cfg)
    build_reward(cfg.worker_config().reward)
    assert load_function(str(f), "compute_score")([0], ["p"]) == [1.0]
    assert log.read_text() == "x"
    f.write_text(f"open({str(log)!r}, 'a').write('y')\ndef compute_score(images, prompts):\n    return [2.0]\n")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))  # a new version, even within a tick
    assert load_function(str(f), "compute_score")([0], ["p"]) == [2.0] and log.read_text() == "xy"


#: verl-omni's HPSv3 reward's shape: it loads $custom_reward_model_path (else model_name) on its first call
CHECKPOINT_FILE = """
def compute_score_hpsv3(data_source, solution_image, ground_truth, extra_info, model_name=None, **kwargs):
    raise AssertionError("not called before Ray")
"""


def test_a_reward_checkpoint_not_on_this_machine_is_refused_before_ray(tmp_path, monkeypatch):
    """The HPSv3 script exports custom_reward_model_path; a missing file, or a hub id not in the cache, used
    to fail in the first reward call, minutes after Ray and the pools started."""
    f = tmp_path / "hpsv3_reward.py"
    f.write_text(CHECKPOINT_FILE)
    overrides = [f"custom_reward_function.path={f}", "custom_reward_function.name=compute_score_hpsv3"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    for where, why in ((str(tmp_path / "CKPT" / "HPSv3.safetensors"), "which does not exist"),
                       ("nobody/hpsv3-not-cached", "which is not in the Hugging Face cache")):
        monkeypatch.setenv("custom_reward_model_path", where)
        with pytest.raises(ConfigError) as err:
            validate(_cfg(tmp_path, *overrides))
        assert err.value.key == "custom_reward_function.path"
        assert f"compute_score_hpsv3 loads its model from $custom_reward_model_path = {where!r}, {why}" in str(
            err.value)
    ckpt = tmp_path / "HPSv3.safetensors"
    ckpt.write_bytes(b"weights")
    monkeypatch.setenv("custom_reward_model_path", str(ckpt))
    assert validate(_cfg(tmp_path, *overrides)) == []
