"""A served judge that runs apart from the scoring processes (rewards/served.py, config/judge.py): tensor parallel
replicas on the generator pool, or a pool of its own. Replicas are named Ray actors the driver starts; every
scoring process routes its samples across them in turn. The servers here are tests/chat_stub.py (a real HTTP
chat-completions server) in place of vLLM."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch

from verl_digen.config import compose
from verl_digen.rewards import Rows, build_reward, served
from verl_digen.rewards.custom import served_specs, with_pool

STUB = Path(__file__).resolve().parents[1] / "chat_stub.py"

JUDGE_FN = """
async def compute_score(data_source, solution_image, ground_truth, extra_info, reward_router_address,
                        reward_model_tokenizer=None, model_name=None):
    import json, urllib.request
    urllib.request.urlopen(f"http://{reward_router_address}/v1/models", timeout=10).read()
    return float(reward_router_address.rsplit(":", 1)[1])  # which replica scored it
"""


def test_the_router_takes_the_replicas_in_turn_across_calls():
    r = served.Router(["a:1", "b:2", "c:3"])
    assert r.take(2) == ["a:1", "b:2"] and r.take(4) == ["c:3", "a:1", "b:2", "c:3"] and r.take(1) == ["a:1"]
    with pytest.raises(ValueError):
        served.Router([])


def test_generator_pool_replicas_take_tensor_parallel_consecutive_ranks():
    """Replica k sits in rank k*TP's placement bundle and sees the GPUs Ray gave ranks k*TP .. k*TP+TP-1."""
    assert served.replica_devices(["3", "1", "0", "2"], 2) == [(0, "3,1"), (2, "0,2")]
    assert served.replica_devices(["0", "1", "2", "3"], 4) == [(0, "0,1,2,3")]
    assert served.replica_devices(["not set", "not set"], 2) == [(0, None)]  # a CPU run: no devices to give
    with pytest.raises(ValueError):
        served.replica_devices(["0", "1", "2"], 2)


@pytest.mark.parametrize("functions", [False, True], ids=["custom", "multi"])
def test_a_judge_apart_reaches_every_function_spec_with_its_replica_count(functions, tmp_path):
    """worker_config: with TP 2 on 4 generator GPUs every custom function's served spec says 2 replicas apart;
    the driver's pool name reaches each of them (with_pool); TP 1 on the generator pool stays in-process."""
    model = tmp_path / "judge"
    model.mkdir()
    fn = tmp_path / "fn.py"
    fn.write_text(JUDGE_FN)
    over = [f"reward.served.model_path={model}", "resources.generator.workers=4"]
    if functions:
        over.append(f"+reward.functions={{a: {{path: {fn}, name: compute_score, weight: 0.5}}, "
                    f"b: {{path: {fn}, name: compute_score, weight: 0.5}}}}")
    else:
        over.append(f"custom_reward_function.path={fn}")
    spec = compose([*over, "reward.served.tensor_parallel_size=2"]).worker_config().reward
    found = served_specs(spec)
    assert len(found) == (2 if functions else 1) and all(s["replicas"] == 2 and s["pool"] is None for s in found)
    named = served_specs(with_pool(spec, "digen_judge_x_"))
    assert [s["pool"] for s in named] == ["digen_judge_x_"] * len(found)
    assert [s["replicas"] for s in served_specs(compose(over).worker_config().reward)] == [0] * len(found)
    own = compose([*over, "resources.reward.workers=2"]).worker_config().reward
    assert [s["replicas"] for s in served_specs(own)] == [2] * len(found)


def _stub_spec(tmp_path: Path, replicas: int = 0, pool: str | None = None, log: Path | None = None):
    model = tmp_path / "judge"
    model.mkdir(exist_ok=True)
    command = (sys.executable, str(STUB), "--port", "{port}") + (("--log", str(log)) if log else ())
    return served.ServedSpec(model_path=str(model), command=command, startup_timeout_s=60, replicas=replicas,
                             pool=pool)


def _closed(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


def test_a_scoring_process_spreads_its_samples_over_the_replicas(tmp_path, monkeypatch):
    """The micro-batch's samples go to the replicas in turn: each function call gets its replica's address,
    and each replica answers the requests routed to it (two real chat servers)."""
    spec = _stub_spec(tmp_path, replicas=2, pool="digen_judge_t_")
    replicas = [served.JudgeServer(spec) for _ in range(2)]
    try:
        monkeypatch.setitem(served._ROUTERS, spec, served.Router([r.address for r in replicas]))
        fn = tmp_path / "fn.py"
        fn.write_text(JUDGE_FN)
        served_dict = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()}
        reward = build_reward({"name": "custom", "path": str(fn), "function": "compute_score", "served": served_dict})
        ports = [float(r.address.rsplit(":", 1)[1]) for r in replicas]
        first = reward(torch.rand(3, 3, 8, 8), ["a", "b", "c"], rows=Rows("train", (0, 1, 2))).tolist()
        second = reward(torch.rand(2, 3, 8, 8), ["a", "b"], rows=Rows("train", (0, 1))).tolist()
        assert first == [ports[0], ports[1], ports[0]] and second == [ports[1], ports[0]]
    finally:
        for r in replicas:
            r.stop()
    assert all(_closed(r.address) for r in replicas)


def test_a_judge_apart_without_the_drivers_pool_name_is_refused_in_the_scoring_process(tmp_path):
    with pytest.raises(RuntimeError, match="the run's driver starts it"):
        served.router(_stub_spec(tmp_path, replicas=2))


def test_the_driver_starts_named_replicas_that_a_scoring_actor_finds(ray_session, tmp_path):
    """start_replicas (the driver's part) on the shared Ray session: two named replica actors, each serving;
    another actor (as a generator would) finds them by the pool name and routes over both; stop_replicas
    stops the servers."""
    ray = ray_session
    log = tmp_path / "requests.jsonl"
    spec = _stub_spec(tmp_path, replicas=2, pool=f"digen_judge_{tmp_path.name}_", log=log)
    actors = served.start_replicas(spec, [({}, None), ({}, None)])
    try:
        addresses = ray.get([a.address.remote() for a in actors])
        assert len(set(addresses)) == 2

        @ray.remote(num_cpus=0)
        def scorer(spec):
            from verl_digen.rewards import served as s

            return s.router(spec).take(4)

        assert ray.get(scorer.remote(spec)) == [addresses[0], addresses[1], addresses[0], addresses[1]]
    finally:
        served.stop_replicas(actors)
    assert all(_closed(a) for a in addresses)
    assert not log.exists() or all(json.loads(line) for line in log.read_text().splitlines())
