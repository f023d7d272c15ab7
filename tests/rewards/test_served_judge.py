"""A reward function that calls a served judge (verl-omni's ``reward.reward_model``; rewards/served.py).

The end-to-end check runs verl-omni's own ``genrm_ocr.compute_score_ocr`` (from the snapshot, with its real
``openai`` / ``aiohttp`` / ``Levenshtein`` imports) against a real HTTP server that speaks the chat-completions
API (tests/chat_stub.py, deterministic replies), started by verl-digen's server launcher on the path a
generator scores with: ``build_reward(worker_config().reward)``. vLLM itself serves the judge only on a GPU
machine (not run here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verl_digen.config import ConfigError, compose, validate
from verl_digen.integrations import verl_omni as vo

ROOT = Path(__file__).resolve().parents[2]
GENRM = "verl_omni/utils/reward_score/genrm_ocr.py"


def _judge_file(tmp_path: Path) -> Path:
    f = tmp_path / "judge_fn.py"
    f.write_text("async def compute_score(data_source, solution_image, ground_truth, extra_info,\n"
                 "                        reward_router_address, reward_model_tokenizer=None, model_name=None):\n"
                 "    return 1.0\n")
    return f


def test_verl_omnis_reward_model_converts_to_a_served_judge(tmp_path):
    """reward.reward_model.enable=True with vllm -> reward.served (model, tensor parallel, memory share)."""
    model = tmp_path / "Qwen3-VL-8B-Instruct"
    model.mkdir()
    fn = {"custom_reward_function": {"path": str(_judge_file(tmp_path)), "name": "compute_score"}}
    out = vo.from_verl_omni_config({"reward": {**fn, "reward_model": {
        "enable": True, "model_path": str(model),
        "rollout": {"name": "vllm", "tensor_model_parallel_size": 1, "gpu_memory_utilization": 0.4}}}})
    assert (out["reward.served.model_path"], out["reward.served.tensor_parallel_size"],
            out["reward.served.gpu_memory_utilization"]) == (str(model), 1, 0.4)
    assert "resources.reward.workers" not in out  # on the generating GPUs, as verl-omni's shares the actor's
    assert "reward.served.model_path" not in vo.from_verl_omni_config(
        {"reward": {**fn, "reward_model": {"enable": False, "model_path": str(model)}}})
    notes: list[str] = []  # a verl-digen reward written in replaces the functions: nothing calls the judge
    assert "reward.served.model_path" not in vo.from_verl_omni_config(
        {"reward": {**fn, "name": "ocr", "reward_model": {"enable": True, "model_path": str(model)}}}, notes=notes)
    with pytest.raises(ConfigError) as err:
        vo.from_verl_omni_config({"reward": {**fn, "reward_model": {"enable": True, "model_path": str(model),
                                                                    "rollout": {"name": "sglang"}}}})
    assert err.value.key == "reward.reward_model.rollout.name"


def test_verl_omnis_reward_pool_and_tensor_parallel_are_carried(tmp_path):
    """enable_resource_pool=True: the judge's own nnodes x n_gpus_per_node GPUs -> resources.reward.workers; the
    scripts' tensor_model_parallel_size=4 is carried (checked against the judge's GPUs by validate)."""
    model = tmp_path / "Qwen3-VL-8B-Instruct"
    model.mkdir()
    fn = {"custom_reward_function": {"path": str(_judge_file(tmp_path)), "name": "compute_score"}}
    rm = {"enable": True, "model_path": str(model), "enable_resource_pool": True, "nnodes": 2, "n_gpus_per_node": 4,
          "rollout": {"name": "vllm", "tensor_model_parallel_size": 4}}
    out = vo.from_verl_omni_config({"reward": {**fn, "reward_model": rm}})
    assert (out["resources.reward.workers"], out["reward.served.tensor_parallel_size"]) == (8, 4)
    with pytest.raises(ConfigError) as err:
        vo.from_verl_omni_config({"reward": {**fn, "reward_model": {**rm, "n_gpus_per_node": 0}}})
    assert err.value.key == "reward.reward_model.n_gpus_per_node"


@pytest.mark.parametrize("case", ["not-served", "model-missing", "tp-2", "no-function", "command-without-port",
                                  "pool-not-multiple", "pool-without-judge", "tp-zero", "node-resource-no-pool",
                                  "seconds-negative", "startup-zero", "pool-negative"])
def test_served_judge_refusals_before_ray(case, tmp_path):
    model = tmp_path / "judge"
    model.mkdir()
    f = _judge_file(tmp_path)
    args = [f"trainer.trace_dir={tmp_path}/t", f"custom_reward_function.path={f}",
            f"reward.served.model_path={model}", "reward.served.command=[python,stub.py,--port,'{port}']"]
    key, part = {
        "not-served": ("custom_reward_function.path", "missing a required argument: 'reward_router_address'); "
                       "it calls a served reward model: set reward.served.model_path"),
        "model-missing": ("reward.served.model_path", "a checkpoint on this machine (it does not exist)"),
        "tp-2": ("reward.served.tensor_parallel_size", "a divisor of the generator pool's 1 GPU(s), where the "
                 "judge is served (replicas x 2 GPUs), or give the judge a pool of its own: resources.reward.workers"),
        "pool-not-multiple": ("resources.reward.workers", "a multiple of reward.served.tensor_parallel_size=2"),
        "pool-without-judge": ("resources.reward.workers", "0 unless reward.served.model_path is set"),
        "tp-zero": ("reward.served.tensor_parallel_size", "a positive integer (GPUs of one replica)"),
        "node-resource-no-pool": ("resources.reward.node_resource", "null unless resources.reward.workers > 0"),
        "seconds-negative": ("reward.served.seconds_per_image", "null or a finite number of seconds > 0"),
        "startup-zero": ("reward.served.startup_s", "null or a finite number of seconds > 0"),
        "pool-negative": ("resources.reward.workers", "an integer in [0, 4096]"),
        "no-function": ("reward.served.model_path", "null unless a reward function calls it"),
        "command-without-port": ("reward.served.command", "one of them holding {port}"),
    }[case]
    if case == "not-served":
        args = args[:2]
    elif case == "model-missing":
        args[2] = f"reward.served.model_path={tmp_path}/nope"
    elif case == "tp-2":
        args.append("reward.served.tensor_parallel_size=2")
    elif case == "no-function":
        args.pop(1)
    elif case == "command-without-port":
        args[3] = "reward.served.command=[python,stub.py]"
    elif case == "pool-not-multiple":
        args += ["reward.served.tensor_parallel_size=2", "resources.reward.workers=3"]
    elif case == "pool-without-judge":
        args = args[:1] + ["resources.reward.workers=2"]
    elif case == "tp-zero":
        args.append("reward.served.tensor_parallel_size=0")
    elif case == "node-resource-no-pool":
        args.append("resources.reward.node_resource=L4")
    elif case == "seconds-negative":
        args.append("reward.served.seconds_per_image=-1")
    elif case == "startup-zero":
        args.append("reward.served.startup_s=0")
    elif case == "pool-negative":
        args.append("resources.reward.workers=-1")
    with pytest.raises(ConfigError) as err:
        validate(compose(args))
    assert err.value.key == key and part in str(err.value), str(err.value)


@pytest.mark.parametrize("mode,over,want", [
    ("digen", ["resources.generator.workers=4", "reward.served.tensor_parallel_size=2"], (4, 2, 2, False)),
    ("digen", ["resources.generator.workers=1", "reward.served.tensor_parallel_size=4", "resources.reward.workers=8"],
     (8, 4, 2, True)),
    ("colocated", ["resources.generator.workers=2", "resources.trainer.workers=2",
                   "reward.served.tensor_parallel_size=4", "data.train_batch_size=4"], (4, 4, 1, False)),
    ("digen", [], (1, 1, 1, False)),
])
def test_the_judge_is_replicas_times_tensor_parallel_gpus(mode, over, want, tmp_path):
    """Accepted before Ray: judge GPUs = replicas x TP, on the generator pool (colocated: every worker) or on
    resources.reward.workers GPUs of its own; only TP > 1 or a pool of its own starts replicas apart."""
    from verl_digen.config import judge

    model = tmp_path / "judge"
    model.mkdir()
    cfg = compose([f"trainer.trace_dir={tmp_path}/t", f"custom_reward_function.path={_judge_file(tmp_path)}",
                   f"reward.served.model_path={model}", "reward.served.command=[python,stub.py,--port,'{port}']",
                   f"trainer={mode}", *over])
    validate(cfg)
    place = judge.placement(cfg)
    assert (place.gpus, place.tensor_parallel_size, place.replicas, place.own_pool) == want
    assert place.pooled == (want[1] > 1 or want[3])


def test_a_missing_judge_package_names_the_extra(tmp_path, monkeypatch):
    f = tmp_path / "needs_aiohttp.py"
    f.write_text("import aiohttp\n\ndef compute_score(images, prompts):\n"
                 "    return [0.0]\n")
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # as where it is not installed
    with pytest.raises(ConfigError) as err:
        validate(compose([f"trainer.trace_dir={tmp_path}/t", f"custom_reward_function.path={f}"]))
    assert err.value.key == "custom_reward_function.path"
    assert "importing it failed (ModuleNotFoundError: import of aiohttp halted" in str(err.value)
    assert "install it with `pip install verl-digen[judge]`" in str(err.value)


SERVED_RUN = """
import json, os, socket, sys, time
import torch
from verl_digen.config import compose, validate
from verl_digen.rewards import Rows, build_reward
from verl_digen.rewards import served

args = json.loads(sys.argv[1])
cfg = compose(args["overrides"])
assert validate(cfg) == [], validate(cfg)
reward = build_reward(cfg.worker_config().reward)  # what a generator builds
bright, dark = torch.full((3, 16, 16), 0.9), torch.full((3, 16, 16), 0.1)
images = torch.stack([bright, dark, dark, bright])
t0 = time.perf_counter()
parts = reward.components(images, args["prompts"], rows=Rows("train", tuple(args["ids"]))) if hasattr(
    reward, "components") else {"custom": reward(images, args["prompts"], rows=Rows("train", tuple(args["ids"])))}
seconds = time.perf_counter() - t0
(server,) = served._SERVERS.values()
address = server.address
served.stop_all()
closed = socket.socket().connect_ex(tuple([address.split(":")[0], int(address.split(":")[1])])) != 0
print(json.dumps({"parts": {k: v.tolist() for k, v in parts.items()}, "startup_s": server.startup_s,
                  "seconds": seconds, "closed": closed, "exit": server.proc.returncode}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("multi", [False, True], ids=["custom", "multi"])
def test_compute_score_ocr_runs_against_a_served_chat_server(multi, verl_omni_snapshots, tmp_path):
    """verl-omni's compute_score_ocr, unchanged, scores generated images through the served judge: the launcher
    starts the server (here the chat stub, in place of vLLM), the function gets reward_router_address and
    model_name, the micro-batch's requests go out together, each sample is scored against its own row's
    ground truth, and the server stops with the process. With the multi-reward manager the OCR function and
    verl-omni's JPEG function share the one server."""
    import Levenshtein

    snaps = verl_omni_snapshots
    model = tmp_path / "Qwen3-VL-8B-Instruct"
    model.mkdir()
    rows = [("a sign", "bright sign"), ("a sign", "dark sign"), ("a sign", "bright"), ("a cat", "dark sign")]
    data = tmp_path / "ocr.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "data_source": "ocr", "reward_model": {"ground_truth": g},
                                        "extra_info": {"index": i}}) + "\n" for i, (p, g) in enumerate(rows)))
    log = tmp_path / "requests.jsonl"
    genrm = snaps.omni / GENRM
    overrides = [f"trainer.trace_dir={tmp_path}/t", f"data.train_files={data}", f"reward.served.model_path={model}",
                 f"reward.served.command=[{sys.executable},{ROOT / 'tests' / 'chat_stub.py'},--port,'{{port}}',"
                 f"--log,{log}]", "reward.served.startup_timeout_s=60"]
    if multi:
        jpeg = snaps.omni / "verl_omni/utils/reward_score/jpeg_compressibility.py"
        overrides.append(f"+reward.functions={{ocr: {{path: {genrm}, name: compute_score_ocr, weight: 0.5}}, "
                         f"jpeg: {{path: {jpeg}, name: compute_score, weight: 0.5}}}}")
    else:
        overrides += [f"custom_reward_function.path={genrm}", "custom_reward_function.name=compute_score_ocr"]
    # images 0 and 3 are bright, 1 and 2 dark; sample i is scored against row ids[i]
    ids, prompts = [0, 1, 2, 3], [p for p, _ in rows]
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SERVED_RUN),
                           json.dumps({"overrides": overrides, "ids": ids, "prompts": prompts})],
                          env=snaps.env(pinned_verl=False), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    read = ["BRIGHT SIGN", "DARK SIGN", "DARK SIGN", "BRIGHT SIGN"]  # what the stub reads in each image

    def ocr_score(text: str, truth: str) -> float:  # genrm_ocr's rule, recomputed here
        gt, got = truth.replace(" ", "").lower(), text.replace(" ", "").lower()
        dist = 0 if gt in got else min(Levenshtein.distance(got, gt), len(gt))
        return 1 - dist / len(gt)

    want = [ocr_score(read[i], rows[r][1]) for i, r in enumerate(ids)]
    assert want[:2] == [1.0, 1.0] and max(want[2:]) < 1  # rows 2, 3 expect other text than the stub reads
    key = "ocr" if multi else "custom"
    assert out["parts"][key] == pytest.approx(want, abs=1e-12)
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(sent) == 4 and {s["model"] for s in sent} == {str(model)}  # model_name: the served model's path
    assert sorted(round(s["mean"]) for s in sent) == [26, 26, 230, 230]
    assert out["closed"] and out["exit"] is not None  # the server stopped with the reward
    if multi:
        assert set(out["parts"]) == {"ocr", "jpeg"} and all(v < 0 for v in out["parts"]["jpeg"])
    print(f"served judge (chat stub): start {out['startup_s']:.2f} s, {out['seconds'] / 4 * 1000:.1f} ms per image")
