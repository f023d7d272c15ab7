"""``trainer=digen`` inside the real verl-omni (snapshot a1139ba), with both supported verls.

Everything runs verl-omni's own code in fresh interpreters: the snapshot and (for "pinned") the verl commit
it pins go first on ``PYTHONPATH``, vllm / vllm_omni are import stubs (tests/verl_omni_helpers.py), and
"0.9.1" is the verl installed here. The training runs go through ``python -m
verl_omni.trainer.main_diffusion_v1`` (Ray, verl-omni's TaskRunner, TransferQueue) on verl-omni's SD3.5 v1
example script (verl 0.9.1), and on its Qwen-Image OCR LoRA, Wan2.2 DanceGRPO and SD3.5 separate_async scripts
(pinned verl; the separate_async one is the v1 script's lines plus its own, and holds the v1 script's checks
there), each shrunk to a tiny random-weight model and two steps. Skipped when the snapshots are absent.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from verl_omni_helpers import (
    DEPS_REASON,
    ENTRY_V0,
    ENTRY_V1,
    RUN_TINY,
    RUN_TINY_OWN_REWARD,
    SKIP_REASON,
    Snapshots,
    capture_commands,
    classify_example,
    example_scripts,
    omni_deps_present,
    table_row,
    tarballs_present,
    training_call,
)

pytestmark = [pytest.mark.skipif(not tarballs_present(), reason=SKIP_REASON),
              pytest.mark.skipif(not omni_deps_present(), reason=DEPS_REASON),
              pytest.mark.slow, pytest.mark.ray]  # its autouse fixture starts verl-omni runs (Ray)

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = {"pinned": True, "0.9.1": False}  # id -> put verl-omni's pinned verl first on the path
SD35_V1 = "flowgrpo_trainer/sd35/run_sd35_medium_ocr_lora_v1.sh"
#: SD35_V1's separate_async twin: the same lines plus the separate_async keys (which verl-digen reports and
#: does not convert); with the pinned verl it is the training run of SD35_V1's checks (SD35_V1 itself trains with
#: verl 0.9.1, and its dry run uses the pinned verl)
SD35_TWIN = "flowgrpo_trainer/sd35/run_sd35_medium_ocr_lora_v1_separate_async.sh"
#: which run holds the SD3.5 v1 example's two-step checks, per verl version
TRAIN_RUN = {"pinned": f"script-{SD35_TWIN}", "0.9.1": "train-0.9.1"}
SD35_V0 = "flowgrpo_trainer/sd35/run_sd35_medium_ocr_lora.sh"
#: more of verl-omni's own scripts run tiny end to end through the v1 entry (with the pinned verl): a v0
#: DiffusionNFT LoRA script and a v0 video script switched to v1 as the migration guide says, and the separate_async one
#: (the guide's "runs tiny" column reads RUN_TINY)
MORE_SCRIPTS = tuple(script for script in RUN_TINY if script != SD35_V1)
MIGRATION_DOC = ROOT / "docs" / "migrating-from-verl-omni.md"

#: what the tiny CPU run changes in the example script (besides the migration guide's additions)
SHRINK = [
    "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",  # two optimizer steps per step, as the scripts' halves give
    "actor_rollout_ref.rollout.pipeline.height=64", "actor_rollout_ref.rollout.pipeline.width=64",
    "actor_rollout_ref.rollout.pipeline.num_inference_steps=4", "actor_rollout_ref.rollout.algo.sde_window_size=2",
    "actor_rollout_ref.rollout.algo.sde_window_range=[0,3]", "trainer.total_training_steps=2",
    "trainer.logger=[console]", "trainer.save_freq=-1", "trainer.device=cpu",
    "+model.path=null", "+model.latent_size=8", "+reward.name=latent_mean", "+trainer.progress=false",
    # Ray's dashboard is no part of what these runs check: without it each run's head starts no dashboard
    # module processes (~3 CPU-s a run on 2 cores, beside the other xdist worker's tests)
    "+ray_kwargs.ray_init.include_dashboard=false",
]


def _overrides(snaps: Snapshots, script: str, scratch: Path) -> tuple[str, list[str]]:
    call = training_call(capture_commands(snaps.omni / "examples" / script, snaps.omni, scratch))
    assert call is not None, f"no training call captured from {script}"
    module, args = call
    dropped = ("data.train_files=", "data.val_files=")
    return module, [_tiny_rank(a) for a in args if not a.startswith(dropped)]


#: the tiny models' layers are 32 wide, and validate bounds a LoRA rank by the adapted layers' sizes
TINY_MAX_RANK = 32


def _tiny_rank(arg: str) -> str:
    """A script's LoRA rank, written for a 12-20B model, shrunk with the model to what the tiny one holds."""
    key, eq, value = arg.partition("=")
    if eq and key.lstrip("+").endswith("model.lora_rank") and value.isdigit() and int(value) > TINY_MAX_RANK:
        return f"{key}={TINY_MAX_RANK}"
    return arg


def _digen_flags(tmp: Path, small: bool = True) -> list[str]:
    prompts = tmp / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cube"}\n{"prompt": "a blue sphere"}\n')
    return [f"data.train_files={prompts}", f"data.val_files={prompts}", "trainer.use_v1=true",
            "trainer.v1.trainer_mode=digen", "+trainer=digen",
            "algorithm.global_std=False", "+resources.generator.workers=1", "+resources.trainer.workers=1",
            *(["+verl_omni=small"] if small else [])]


#: Qwen-Image scripts run with their own reward (verl-omni's compute_score_ocr; the multi-reward one adds its
#: JPEG function) against a served judge stub
OWN_REWARD = {"ocr": "flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh",
              "multi": "flowgrpo_trainer/qwen_image/run_qwen_image_ocr_multi_reward.sh"}


def own_reward_args(snaps: Snapshots, tmp: Path, script: str) -> list[str]:
    """A Qwen-Image OCR script, shrunk and switched to v1, keeping its own reward: verl-omni's
    compute_score_ocr against a served judge (a chat-completions stub in place of vLLM: tests/chat_stub.py),
    each prompt row with its own ground truth."""
    _, args = _overrides(snaps, script, tmp / "capture")
    args = [a for a in args if not a.startswith(("trainer.use_v1=", "trainer.v1.trainer_mode="))]
    crf = "reward.custom_reward_function.path="  # relative to verl-omni's root, where its scripts run
    args = [f"{crf}{snaps.omni / a[len(crf):]}" if a.startswith(crf) else a for a in args]
    rows = tmp / "ocr.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"a sign that says {t}", "data_source": "ocr", "reward_model":
                                        {"ground_truth": t}, "extra_info": {"index": i}}) + "\n"
                            for i, t in enumerate(["bright sign", "dark sign"])))
    judge = tmp / "Qwen3-VL-8B-Instruct"
    judge.mkdir(exist_ok=True)
    stub = ROOT / "tests" / "chat_stub.py"
    flags = [f if not f.startswith(("data.train_files=", "data.val_files=")) else f.split("=")[0] + f"={rows}"
             for f in _digen_flags(tmp)]
    return ["-m", ENTRY_V1, *args, *flags, *[s for s in SHRINK if s != "+reward.name=latent_mean"],
            f"reward.reward_model.model_path={judge}",
            # the script's 4 needs the judge on 4 GPUs (refused on this run's 1 generator: a divisor of its GPUs)
            "reward.reward_model.rollout.tensor_model_parallel_size=1",
            "+model.arch=qwen_image",  # the multi-reward script's model path ($HOME/huggingface/...) names no arch
            f"+reward.served.command=[{sys.executable},{stub},--port,'{{port}}',--log,{tmp / 'judge.jsonl'}]",
            f"+trainer.trace_dir={tmp / 'trace'}"]


#: how many of the module's subprocesses run at once: each training run is a Ray cluster of its own (~2 GB);
#: eleven at once beside the other xdist worker's Ray tests filled CI's 24 GB and timed Ray's start-up out
MAX_AT_ONCE = 3
#: the longest one subprocess may run once started
RUN_TIMEOUT_S = 600


def _run(snaps: Snapshots, args: list[str], pinned: bool, cwd: Path, platform: bool = True) -> tuple[int, str]:
    """(exit code, output) of one fresh interpreter; killed after RUN_TIMEOUT_S (exit code -9)."""
    t0 = time.perf_counter()
    with (cwd / "output.log").open("w+") as log:
        proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=snaps.env(pinned, platform), stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        try:
            proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.seek(0)
        # each run's seconds, for `-s`: where the module's time goes (they overlap MAX_AT_ONCE at a time)
        print(f"{cwd.name}: {time.perf_counter() - t0:.1f} s (ended {time.strftime('%H:%M:%S')})", flush=True)
        return proc.returncode, log.read()


REGISTRY_CHECK = """
import json, sys
import verl
lazy = "verl_omni" not in sys.modules and "verl_digen.plugin" in sys.modules
import verl.utils.chat_template as chat_template
from verl_omni.trainer.diffusion.v1 import get_diffusion_trainer_cls
import verl_omni.utils.diffusion_attention as attention
cls = get_diffusion_trainer_cls("digen")
from hydra import compose, initialize_config_dir
with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
    cfg = compose("diffusion_trainer", overrides=["trainer.use_v1=true", "trainer.v1.trainer_mode=digen",
                                                  "+trainer=digen", "+verl_omni=small"])
print("registry check: " + json.dumps({"lazy": lazy, "verl": verl.__version__, "chat_template": chat_template.__name__,
                  "cls": cls.__module__ + "." + cls.__qualname__,
                  "sync": get_diffusion_trainer_cls("sync").__name__,
                  "guard": getattr(attention.validate_attention_consistency, "__digen_guard__", False),
                  "policy": cfg.digen.tag.policy, "mode": cfg.trainer.mode,
                  "units": cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units,
                  "device": cfg.trainer.device}), flush=True)
"""
#: how REGISTRY_CHECK's line in a run's output begins
REGISTRY_LINE = "registry check: "
#: REGISTRY_CHECK (its config folder: argv[1]), then the verl-omni entry argv[2] with the overrides after it, as
#: ``python -m`` runs it: the check shares the interpreter of a run on the same verl (a run's first imports are
#: the check's) instead of paying verl's and verl-omni's imports in one of its own
CHECK_THEN_RUN = REGISTRY_CHECK + """
import runpy
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


class Launched:
    """Every subprocess of this module, queued when the module starts in the order its tests read them and
    run MAX_AT_ONCE at a time: most of their time is imports, Ray and worker start-up, which overlap on a 2-core
    machine. Each test waits for its own."""

    def __init__(self, snaps: Snapshots, tmp_factory: pytest.TempPathFactory) -> None:
        self.snaps, self.jobs = snaps, {}
        self.pool = ThreadPoolExecutor(max_workers=MAX_AT_ONCE)
        # the pinned verl's registry check rides on the v0 refusal (both with VERL_PLATFORM, no Ray); 0.9.1's runs
        # alone, as verl 0.9.1's only other run is a training run without VERL_PLATFORM, whose `python -m` line the
        # plugin reads (sys.orig_argv) to keep trainer.device=cpu
        config_dir = str(snaps.omni / "verl_omni" / "trainer" / "config")
        self.registry = {"pinned": "v0", "0.9.1": "registry-0.9.1"}
        self._start("registry-0.9.1", ["-c", REGISTRY_CHECK, config_dir], False,
                    tmp_factory.mktemp("registry_0_9_1"))
        for script in MORE_SCRIPTS:  # the user's switch to the v1 entry replaces a v0 script's module
            tmp = tmp_factory.mktemp(Path(script).stem)
            _, args = _overrides(snaps, script, tmp / "capture")
            args = [a for a in args if not a.startswith(("trainer.use_v1=", "trainer.v1.trainer_mode="))]
            trace = f"+trainer.trace_dir={tmp / 'trace'}"
            self._start(f"script-{script}", ["-m", ENTRY_V1, *args, *_digen_flags(tmp), *SHRINK, trace], True, tmp,
                        platform=False)
        tmp = tmp_factory.mktemp("v0")  # the v0 example with the digen flags
        module, args = _overrides(snaps, SD35_V0, tmp / "capture")
        flags = [f for f in _digen_flags(tmp) if f != "trainer.use_v1=true"]
        self._start("v0", ["-c", CHECK_THEN_RUN, config_dir, ENTRY_V0, *args, *flags], True, tmp)
        tmp = tmp_factory.mktemp("dry_run")
        module, args = _overrides(snaps, SD35_V1, tmp / "capture")
        # as a verl-omni user runs it on a machine without GPUs: no VERL_PLATFORM in the environment
        self._start("dry-run", ["-m", module, *args, *_digen_flags(tmp), "+trainer.dry_run=true",
                                "+reward.name=latent_mean", "trainer.device=cpu"], True, tmp, platform=False)
        for name, pinned in VERSIONS.items():  # the SD3.5 v1 example, shrunk, two steps, where TRAIN_RUN says
            if TRAIN_RUN[name] != f"train-{name}":
                continue
            tmp = tmp_factory.mktemp(f"run_{name.replace('.', '_')}")
            module, args = _overrides(snaps, SD35_V1, tmp / "capture")
            assert module == ENTRY_V1
            trace = f"+trainer.trace_dir={tmp / 'trace'}"
            # as a verl-omni user runs it on a machine without GPUs: no VERL_PLATFORM in the environment
            self._start(f"train-{name}", ["-m", module, *args, *_digen_flags(tmp), *SHRINK, trace], pinned, tmp,
                        platform=False)
        for name, script in OWN_REWARD.items():  # Qwen-Image OCR scripts with their own reward, served judge
            tmp = tmp_factory.mktemp(f"own_reward_{name}")
            self._start(f"own-reward-{name}", own_reward_args(snaps, tmp, script), True, tmp, platform=False)
        tmp = tmp_factory.mktemp("own_reward_ocr_colocated")  # the same OCR run with trainer=colocated, whose
        # first step is all its test compares
        self._start("own-reward-ocr-colocated", [*own_reward_args(snaps, tmp, OWN_REWARD["ocr"]), "trainer=colocated",
                                                 "trainer.total_training_steps=1"], True, tmp, platform=False)

    def _start(self, name: str, args: list[str], pinned: bool, cwd: Path, platform: bool = True) -> None:
        self.jobs[name] = (self.pool.submit(_run, self.snaps, args, pinned, cwd, platform), cwd)

    def result(self, name: str) -> tuple[int, str, Path]:
        """(exit code, output, working directory) of one subprocess, waiting for it."""
        job, cwd = self.jobs[name]
        return (*job.result(), cwd)

    def close(self) -> None:
        """Drop what has not started; what runs ends within RUN_TIMEOUT_S."""
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module", autouse=True)
def launched(verl_omni_snapshots, tmp_path_factory):
    runs = Launched(verl_omni_snapshots, tmp_path_factory)
    yield runs
    runs.close()


def test_every_example_script_is_accounted_for_in_the_migration_guide(verl_omni_snapshots, tmp_path):
    """docs/migrating-from-verl-omni.md has one row per example script of the snapshot, and every column of it
    (entry, converts, validates, runs tiny, what differs) is what the converter and this module give today."""
    rows = {}
    for line in MIGRATION_DOC.read_text().splitlines():
        m = re.match(r"^\| `([^`]+\.sh)` \|", line)
        if m:
            rows[m.group(1)] = line.rstrip()
    scripts = example_scripts(verl_omni_snapshots.omni)
    assert len(scripts) >= 50
    for script in scripts:
        row = classify_example(script, verl_omni_snapshots.omni, tmp_path)
        assert row.script in rows, f"docs/migrating-from-verl-omni.md has no row for examples/{row.script}"
        assert rows[row.script] == table_row(row), (
            f"examples/{row.script}: the guide says\n{rows[row.script]}\nthe converter and the tests give\n"
            f"{table_row(row)}")
    assert set(rows) == {s.relative_to(verl_omni_snapshots.omni / "examples").as_posix() for s in scripts}


def test_the_runs_tiny_column_names_exactly_the_scripts_this_module_trains():
    """The guide's "runs tiny" cells come from RUN_TINY / RUN_TINY_OWN_REWARD: each script named there is one
    this module launches, and each script it launches is named there."""
    trained = {SD35_V1, *MORE_SCRIPTS}
    assert set(RUN_TINY) == trained
    assert set(RUN_TINY_OWN_REWARD) == set(OWN_REWARD.values()) - trained
    assert all(script in RUN_TINY and "own" in RUN_TINY[script] for script in set(OWN_REWARD.values()) & trained)


@pytest.mark.parametrize("version", list(VERSIONS))
def test_real_registry_lazy_import_and_composition(launched, version):
    """`import verl` runs verl-digen's plugin without importing verl-omni; verl-omni's registry then has
    `digen` next to its own modes; `+trainer=digen +verl_omni=small` compose into verl-omni's real config;
    on verl 0.9.1 verl-omni's old import path is served by the compat alias, on the pin by verl itself."""
    rc, out, _ = launched.result(launched.registry[version])
    lines = [line for line in out.splitlines() if line.startswith(REGISTRY_LINE)]
    assert lines, f"rc {rc}, no registry check line:\n{out[-4000:]}"
    got = json.loads(lines[0][len(REGISTRY_LINE):])
    assert got["lazy"] is True
    assert got["verl"] == ("0.9.0.dev" if VERSIONS[version] else "0.9.1")
    assert got["chat_template"] == ("verl.utils.chat_template" if VERSIONS[version]
                                    else "verl.utils.tokenizer.chat_template")
    assert got["cls"] == "verl_digen.integrations.verl_omni.DigenVerlOmniTrainer"
    assert got["sync"] == "PolicyGradientDiffusionTrainerV1Sync"
    assert got["guard"] is True
    assert (got["policy"], got["mode"], got["units"], got["device"]) == ("bts", "digen", 1, "cuda")


@pytest.mark.parametrize("script", MORE_SCRIPTS)
def test_more_example_scripts_train_tiny_through_verl_omnis_v1_entry(launched, script):
    """Qwen-Image OCR LoRA with DiffusionNFT, Wan2.2 DanceGRPO (704x1280, 8 frames: a non-square latent and 9
    frames) and SD3.5's separate_async script, each from its own shell lines, train two steps under trainer=digen
    (the FlowGRPO Qwen-Image OCR LoRA script trains with its own reward: the own_reward tests)."""
    rc, out, tmp = launched.result(f"script-{script}")
    assert rc == 0, f"{script} failed:\n{out[-6000:]}"
    if script.startswith("diffusionnft_trainer/"):  # converted to DiffusionNFT, not trained as FlowGRPO
        assert "(DiffusionNFT's rollout is a plain ODE)" in out, out[-6000:]
    timeline = json.loads((tmp / "trace" / "digen_timeline.json").read_text())
    assert {r["step"] for r in timeline["records"] if r["kind"] == "optimizer_step"} == {0, 1}
    rows = [json.loads(line) for line in (tmp / "trace" / "digen_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/grad_norm"] > 0 for r in rows)


def test_v0_entry_with_digen_is_refused_before_ray(launched):
    """The v0 example with the digen flags: a message saying what to change, exit 2, Ray never started."""
    rc, out, _ = launched.result("v0")
    assert rc == 2, out[-3000:]
    assert f"verl-digen: python -m {ENTRY_V0}" in out and f"python -m {ENTRY_V1} trainer.use_v1=true" in out
    assert "ray init kwargs" not in out  # refused in the driver, before verl-omni starts Ray


def test_dry_run_through_v1_entry_prints_the_plan_and_does_not_train(launched):
    rc, out, _ = launched.result("dry-run")
    assert rc == 0, out[-3000:]
    assert "resource plan:" in out
    assert "ray init kwargs" not in out and "step:1" not in out
    # trainer.device=cpu without VERL_PLATFORM: the plugin kept verl's auto_set_device from making it cuda
    assert "VERL_PLATFORM=cpu is set for this run" in out, out[-3000:]
    assert "on any cpu node" in out and "on any cuda node" not in out, out[-3000:]


@pytest.mark.parametrize("version", list(VERSIONS))
def test_example_trains_two_steps_through_verl_omnis_v1_entry(launched, version):
    """The SD3.5 v1 example with verl 0.9.1, and its separate_async twin (SD35_TWIN: the same lines and more) with
    the pinned verl, shrunk, through verl-omni's v1 entry with no VERL_PLATFORM: verl-digen's runtime trains two
    steps, validates, and names every conversion note and unconverted key."""
    rc, out, tmp = launched.result(TRAIN_RUN[version])
    assert rc == 0, f"verl-omni run failed ({version}):\n{out[-6000:]}"
    # verl-digen's runtime (trainer mode digen, not verl-omni's sync trainer) ran both steps and wrote its
    # checked timeline (the Ray actors' log lines may reach the driver after it exits, so they are not used)
    timeline = json.loads((tmp / "trace" / "digen_timeline.json").read_text())
    assert timeline["mode"] == "digen"
    assert {r["step"] for r in timeline["records"] if r["kind"] == "optimizer_step"} == {0, 1}
    # the script's data.val_files / trainer.test_freq=20 carried: validated after the last step, through Ray
    val = [json.loads(line) for line in (tmp / "trace" / "val" / "digen_val.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [2], val
    # no silent drift: conversion notes and every unconverted key the script sets are named (in the driver)
    for needle in ("verl-omni -> verl-digen: actor_rollout_ref.rollout.algo.sde_type=cps",
                   "verl-omni -> verl-digen: actor_rollout_ref.rollout.algo.sde_window_range=[0, 3]",
                   "verl-omni -> verl-digen: reward.reward_model.model_path='Qwen/Qwen2.5-VL-3B-Instruct' is not "
                   "converted", "verl-omni -> verl-digen: actor_rollout_ref.model.attn_backend=",
                   "verl-omni keys at their defaults have no verl-digen counterpart"):
        assert needle in out, f"missing log line {needle!r} ({version})"


@pytest.mark.parametrize("name", list(OWN_REWARD))
def test_qwen_image_ocr_scripts_train_with_their_own_reward_own_reward(launched, name):
    """The Qwen-Image OCR LoRA and multi-reward scripts through verl-omni's v1 entry with trainer=digen and no
    +reward.name: compute_score_ocr scores every sample by asking the served judge (the chat-completions stub,
    started on the generator) and comparing the reply with the sample's own row's ground truth; the multi-reward
    script adds verl-omni's JPEG function (0.5 each), which takes only solution_image."""
    import itertools

    import Levenshtein

    rc, out, tmp = launched.result(f"own-reward-{name}")
    assert rc == 0, f"own-reward run failed:\n{out[-6000:]}"
    rows = [json.loads(line) for line in (tmp / "trace" / "digen_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/grad_norm"] > 0 for r in rows)
    sent = [json.loads(line) for line in (tmp / "judge.jsonl").read_text().splitlines()]
    # 2 steps x 2 prompts x 2 samples, then the validation's 2 prompts; model_name is the served model's path
    assert len(sent) == 10 and {s["model"] for s in sent} == {str(tmp / "Qwen3-VL-8B-Instruct")}

    def ocr(mean: float, truth: str) -> float:  # the stub's reply scored by genrm_ocr's rule
        got, gt = ("BRIGHT SIGN" if mean > 127.5 else "DARK SIGN").replace(" ", "").lower(), truth.replace(" ", "")
        return 1 - (0 if gt in got else min(Levenshtein.distance(got, gt), len(gt))) / len(gt)

    truths = ["bright sign", "bright sign", "dark sign", "dark sign"]  # step 1: rows 0, 1, each sampled twice
    means = [s["mean"] for s in sent[:4]]
    possible = {round(sum(ocr(m, t) for m, t in zip(means, perm)) / 4, 12) for perm in itertools.permutations(truths)}
    if name == "ocr":
        assert round(rows[0]["reward/mean"], 12) in possible, (rows[0]["reward/mean"], possible)
    else:  # 0.5 x the OCR part as above + 0.5 x the JPEG part, -kB / 500: a 64 x 64 image's is a few -0.001
        jpeg = [(rows[0]["reward/mean"] - 0.5 * p) / 0.5 for p in possible]
        assert any(-0.05 < j < 0 for j in jpeg), (rows[0]["reward/mean"], possible)


def test_the_ocr_scripts_first_step_with_its_own_reward_equals_colocated_own_reward(launched):
    """The OCR script with its own reward and served judge: trainer=digen's first step (its samples as the judge
    saw them, their rewards, the loss and the gradient) equals trainer=colocated's on the same line."""
    def first_step(name: str, prefix: str) -> tuple[dict, list[float]]:
        rc, out, tmp = launched.result(name)
        assert rc == 0, f"{name} failed:\n{out[-6000:]}"
        row = json.loads((tmp / "trace" / f"{prefix}_metrics.jsonl").read_text().splitlines()[0])
        sent = [json.loads(line) for line in (tmp / "judge.jsonl").read_text().splitlines()]
        keys = ("step", "reward/mean", "reward/std", "actor/loss", "actor/grad_norm", "actor/ratio_mean")
        return {k: row[k] for k in keys}, sorted(s["mean"] for s in sent[:4])  # step 1: 2 prompts x 2 samples

    digen, colocated = first_step("own-reward-ocr", "digen"), first_step("own-reward-ocr-colocated", "colocated")
    assert digen[0]["step"] == 1 and digen[0]["actor/grad_norm"] > 0
    assert digen == colocated
