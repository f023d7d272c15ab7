"""A generator worker in one process, without Ray (workers/generator.py): its guards before ``init_model`` and
before a sync group, its version check, its collective pickup's bookkeeping (a recorded stand-in group), and
the policy helpers it reports with (``policy.weights_checksum``, ``policy_weights``, ``freeze``)."""

from __future__ import annotations

import pytest
import torch
from workers_helpers import rows_of, tiny_cfg

from verl_digen.workers import generator as G
from verl_digen.workers import policy as P
from verl_digen.workers.generator import GeneratorWorker, VersionMismatchError


@pytest.fixture(autouse=True)
def _one_rank(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29551"}.items():
        monkeypatch.setenv(key, value)


class _Group:
    """A sync group stand-in: ``receive`` records its arguments and returns a ledger."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def receive(self, version, plan, into, sources, verify_payload):
        self.calls.append((version, plan, into, sources, verify_payload))
        return {"received": 1}


def test_calls_before_init_model_or_a_sync_group_are_refused():
    w = GeneratorWorker(tiny_cfg())
    with pytest.raises(RuntimeError, match="init_model"):
        w.score(None)
    assert w.sync_counters() == {"sent": 0, "received": 0}
    w.init_model()
    with pytest.raises(RuntimeError, match="join_sync_group must be called"):
        w.recv_weights(1, [0])


def test_a_generator_samples_the_requested_step_with_the_version_it_holds():
    cfg = tiny_cfg()
    w = GeneratorWorker(cfg)
    w.init_model()
    rows, prompts = rows_of([0, 1], 1)
    got = w.generate(3, 0, rows, prompts)
    want = P.generate_rows(P.freeze(P.build_policy(cfg)), cfg, 3, 0, rows, prompts)
    assert torch.equal(got.states, want.states) and torch.equal(got.log_probs, want.log_probs)
    with pytest.raises(VersionMismatchError, match="generator rank 0 holds policy version 0 but was asked"):
        w.generate(3, 1, rows, prompts)


def test_a_collective_pickup_receives_the_live_adapters_with_the_runs_payload_check():
    cfg = tiny_cfg(lora_rank=2, sync_verify_payload=True)
    w = GeneratorWorker(cfg)
    w.init_model()
    w._sync = group = _Group()
    assert w.recv_weights(0, [0]) == {"version": 0, "moved": {"received": 1}, "received": True}  # the held one
    out = w.recv_weights(2, [0, 1])
    assert out == {"version": 2, "moved": {"received": 1}, "received": True} and w.version == 2
    (_, _, live, _, verify), (version, plan, live2, sources, _) = group.calls
    assert verify is True and (version, sources) == (2, [0, 1])
    assert set(live) == set(P.live_weights(w.model, True)) and all("lora" in k for k in live)
    with pytest.raises(VersionMismatchError, match="refusing to go back"):
        w.recv_weights(1, [0])


def test_a_generator_joins_the_sync_group_from_its_node(monkeypatch):
    made = []
    monkeypatch.setattr(G, "SyncGroup", lambda *a, **kw: made.append((a, kw)) or "group")
    monkeypatch.setattr(P, "node_id", lambda: "node-7")
    w = GeneratorWorker(tiny_cfg())
    w.join_sync_group("10.0.0.1", 1234, 3, 2, "gloo", 60.0, secret="ab")
    assert w._sync == "group"
    assert made == [(("10.0.0.1", 1234, 3, 2, "gloo", 60.0), {"secret": "ab", "node": "node-7"})]


# -- policy helpers --------------------------------------------------------------------------------------------
def test_the_weights_checksum_tells_dtypes_and_shapes_apart():
    c = P.weights_checksum
    zeros = torch.zeros(2, 3, dtype=torch.float64)
    assert c({"w": zeros}) == c({"w": zeros.clone()})
    assert c({"w": zeros}) != c({"w": zeros.reshape(3, 2)})  # same bytes, another shape
    assert c({"w": torch.zeros(2, dtype=torch.float32)}) != c({"w": torch.zeros(2, dtype=torch.int32)})
    assert c({"w": zeros}) != c({"v": zeros})


def test_policy_weights_are_copies_and_a_frozen_policy_trains_nothing():
    cfg = tiny_cfg()
    model = P.build_policy(cfg)
    weights = P.policy_weights(model, False)
    live = P.live_weights(model, False)
    assert weights.keys() == live.keys()
    assert all(torch.equal(weights[k], v) and weights[k].data_ptr() != v.data_ptr() for k, v in live.items())
    P.freeze(model)
    assert not any(p.requires_grad for p in model.transformer.parameters()) and not model.transformer.training


def test_node_id_is_the_ray_nodes_inside_ray_and_none_outside(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert P.node_id() is None
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("Ctx", (), {"get_node_id": lambda self: "n1"})())
    assert P.node_id() == "n1"
