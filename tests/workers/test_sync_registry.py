"""The weight-sync backend registry, and both registries (sync backends, TAG policies) as the run config
sees them: a backend or policy in one file is accepted by name, an unknown name lists the registered ones
(docs/architecture.md, "Registries"). No Ray: actor handles are stand-ins that record the calls."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from verl_digen.config import ConfigError, compose, validate
from verl_digen.driver.faults import fault_policy
from verl_digen.schedule.tag_policy import unregister_tag_policy
from verl_digen.workers import sync_spec
from verl_digen.workers.sync import (
    SYNC_BACKENDS,
    CollectiveSync,
    ObjectStoreSync,
    SyncBackend,
    WeightSync,
    register_sync_backend,
    sync_backend,
    sync_backend_names,
    unregister_sync_backend,
)

TESTS = Path(__file__).parent


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def toy_backend():
    yield _load(TESTS / "toy_sync_backend.py")
    unregister_sync_backend("toy_relay")


@pytest.fixture
def toy_policy():
    yield _load(TESTS.parent / "schedule" / "toy_tag_policy.py")
    unregister_tag_policy("one_slot")


class _Actor:
    """An actor handle stand-in: ``h.method.remote(*args)`` records the call and returns a fake ref."""

    def __init__(self, log: list, who: str) -> None:
        self._log, self._who = log, who

    def __getattr__(self, method: str):
        log, who = self._log, self._who

        class _Method:
            @staticmethod
            def remote(*args):
                log.append((who, method, args))
                return f"ref:{who}.{method}{args}"

        return _Method


def _sync(name: str, trainers: int = 2, generators: int = 2) -> tuple[WeightSync, list]:
    log: list = []
    ws = WeightSync(name)
    ws.trainers = [_Actor(log, f"trn{i}") for i in range(trainers)]
    ws.generators = [_Actor(log, f"gen{i}") for i in range(generators)]
    return ws, log


def test_builtin_backends_are_registered_with_their_properties():
    assert sync_backend_names() == ("collective", "object_store")
    assert sync_backend("object_store") is ObjectStoreSync and sync_backend("collective") is CollectiveSync
    assert (ObjectStoreSync.restartable, ObjectStoreSync.publish_returns_weights, ObjectStoreSync.trainer_threads) \
        == (True, True, 1)
    assert (CollectiveSync.restartable, CollectiveSync.publish_returns_weights, CollectiveSync.trainer_threads) \
        == (False, False, 2)


def test_the_names_a_config_check_reads_without_ray_are_the_registered_ones(monkeypatch):
    """``workers/sync_spec.py`` (what ``validate`` reads: no ray, no torch) names exactly the backends
    ``workers/sync.py`` registers, and reads the registry itself once that is imported (a plugin's too)."""
    ours = {name for name, cls in SYNC_BACKENDS.items() if cls.__module__ == "verl_digen.workers.sync"}
    assert ours == set(sync_spec.BUILTIN)
    monkeypatch.delitem(sys.modules, "verl_digen.workers.sync")  # as in a dry run
    assert sync_spec.sync_backend_names() == tuple(sorted(sync_spec.BUILTIN))


def test_builtin_backends_issue_the_same_calls_as_before():
    ws, log = _sync("object_store")
    refs = ws.publish(3)
    assert [c[:2] for c in log] == [("trn0", "export_weights"), ("trn1", "export_weights")]
    assert ws.pickup(1, 3) == [f"ref:gen1.load_weights{(3, refs[0])}"]
    ws, log = _sync("collective")
    ws.publish(4)
    assert [c[1] for c in log] == ["stage_weights", "stage_weights"]
    log.clear()
    ws.pickup(1, 4)  # every trainer rank sends its buckets; generator 1 is group rank 2 + 1
    assert log == [("trn0", "send_weights_to", (3, 4)), ("trn1", "send_weights_to", (3, 4)),
                   ("gen1", "recv_weights", (4, [0, 1]))]
    with pytest.raises(RuntimeError, match="asked for version 5, but the published one is 4"):
        ws.pickup(0, 5)


def test_a_backend_in_one_file_is_accepted_by_the_config_and_driven_by_weight_sync(toy_backend):
    assert "toy_relay" in sync_backend_names()
    assert "toy_relay" in sync_spec.sync_backend_names()  # the config check reads the live registry once imported
    cfg = compose(["digen.sync.backend=toy_relay", "trainer.generator_max_restarts=2"])
    validate(cfg)
    assert cfg.worker_config().sync_backend == "toy_relay"
    assert fault_policy(cfg).max_restarts == 0  # the toy declares itself not restartable
    ws, log = _sync("toy_relay", trainers=1, generators=2)
    assert isinstance(ws.impl, toy_backend.ToyRelaySync) and ws.publish_returns_weights and not ws.restartable
    assert toy_backend.ToyRelaySync.name == "toy_relay"  # the class knows the name it was registered under
    refs = ws.publish(7)
    ws.pickup(0, 7)
    assert log == [("trn0", "export_weights", (7,)), ("gen0", "load_weights", (7, refs[0]))]


def test_an_unknown_backend_lists_the_registered_ones(toy_backend):
    with pytest.raises(ValueError, match=r"^unknown sync backend 'nccl_p2p'; registered: collective, object_store, "
                                         r"toy_relay$"):
        WeightSync("nccl_p2p")
    unregister_sync_backend("toy_relay")
    with pytest.raises(ConfigError) as err:
        validate(compose(["digen.sync.backend=toy_relay"]))
    assert err.value.key == "digen.sync.backend"
    assert str(err.value).endswith("'toy_relay' is invalid: expected one of collective, object_store")


def test_a_second_backend_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="'object_store' is already registered by verl_digen.workers.sync"):
        @register_sync_backend("object_store")
        class Impostor(SyncBackend):
            pass
    assert sync_backend("object_store") is ObjectStoreSync
    for bad in ("Object-Store", "sync backend", "ObjectStore", "", "_"):  # "-", space, upper case, nothing, no letter
        with pytest.raises(ValueError, match="lower-case"):
            register_sync_backend(bad)


def test_a_tag_policy_in_one_file_is_accepted_by_the_run_config(toy_policy):
    cfg = compose(["digen.tag.policy=one_slot:2"])
    validate(cfg)
    assert cfg.schedule_config().policy == "one_slot:2"
    with pytest.raises(ConfigError) as err:
        validate(compose(["digen.tag.policy=one_slot:-1"]))
    assert "one_slot needs a bubble count >= 0" in str(err.value)


def test_an_unknown_tag_policy_in_the_run_config_lists_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        validate(compose(["digen.tag.policy=greedy"]))
    assert err.value.key == "digen.tag.policy"
    assert "'greedy'" in str(err.value) and "adaptive[:R], bts, never, static:K" in str(err.value)


def test_weight_sync_drives_its_backend_with_its_timeout_and_records_each_sync(monkeypatch):
    """``sync``: publish, then every pickup, each waited for with the sync's timeout (the backend gets the same
    one for its own waits); the seconds of each sync are kept for the report."""
    from verl_digen.workers import sync as S

    waits = []
    monkeypatch.setattr(S.ray, "get", lambda refs, timeout=None: waits.append((list(refs), timeout)))
    log: list = []
    ws = WeightSync("object_store", 12.5)
    ws.trainers, ws.generators = [_Actor(log, "trn0")], [_Actor(log, "gen0"), _Actor(log, "gen1")]
    assert WeightSync("collective", 7.0).impl.timeout_s == 7.0
    with pytest.raises(RuntimeError, match="asked for version 1, but the published one is None"):
        ws.pickup(0, 1)  # nothing published yet
    seconds = ws.sync(1)
    assert [t for _, t in waits] == [12.5, 12.5] and len(waits[1][0]) == 2  # publish, then both pickups at once
    assert ws.history == [seconds] and seconds >= 0
    assert [c[1] for c in log] == ["export_weights", "load_weights", "load_weights"]


def test_a_whole_state_received_from_one_source_keeps_the_templates_dtypes_and_the_payload_check():
    """``SyncGroup.recv`` (tools, tests): new tensors shaped and typed like the template, on the group's device,
    received from one source with the caller's payload check."""
    from verl_digen.workers.buckets import layout_of
    from verl_digen.workers.sync import SyncGroup

    group = SyncGroup.__new__(SyncGroup)  # no rendezvous: ``receive`` is recorded
    group.device = torch.device("meta")
    calls = []
    group.receive = lambda *args: calls.append(args)
    template = {"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.zeros(3, dtype=torch.bfloat16)}
    out = group.recv(4, template, bucket_bytes=64, verify_payload=True, source=2)
    assert {k: (v.dtype, tuple(v.shape), v.device.type) for k, v in out.items()} == {
        "w": (torch.float64, (2, 3), "meta"), "b": (torch.bfloat16, (3,), "meta")}
    ((version, plan, into, sources, verify),) = calls
    assert (version, sources, verify, into is out) == (4, [2], True, True) and plan.layout == layout_of(template)


def test_a_bucket_is_made_on_the_requested_device():
    from verl_digen.workers.buckets import layout_of, new_bucket, plan_for

    plan = plan_for(layout_of({"w": torch.zeros(4, dtype=torch.float64)}), 64, 1)
    bucket = new_bucket(plan, 0, "meta")
    assert bucket.device.type == "meta" and bucket.dtype == torch.uint8 and bucket.numel() == plan.sizes[0]


def test_a_staging_buffer_is_bytes_on_the_groups_device_and_reused_when_it_fits():
    from verl_digen.workers.sync import SyncGroup

    group = SyncGroup.__new__(SyncGroup)
    group.device, group._pool = torch.device("meta"), []
    buf = group._staging(64)
    assert (buf.dtype, buf.numel(), buf.device.type) == (torch.uint8, 64, "meta")  # 64 bytes, not 64 floats
    group._pool = [buf]
    assert group._staging(40) is buf and group._pool == []  # 64 <= 2 x 40: the previous pickup's buffer
    group._pool = [buf]
    assert group._staging(16) is not buf  # four times too large: a new one


def test_hashing_a_host_bucket_counts_no_device_copy():
    import hashlib

    from verl_digen.schedule import ledger
    from verl_digen.workers.sync import _hash_into

    out: dict[str, int] = {}
    digest = hashlib.sha256()
    _hash_into(digest, torch.arange(8, dtype=torch.uint8), out)
    assert out == {ledger.HASHED: 8} and digest.digest() == hashlib.sha256(bytes(range(8))).digest()


def test_an_empty_tensors_byte_view_is_empty_bytes_on_its_device():
    from verl_digen.workers.buckets import byte_view

    for t in (torch.empty(0, dtype=torch.float64, device="meta"), torch.zeros(2, 0, dtype=torch.bfloat16)):
        v = byte_view(t)
        assert (v.dtype, v.numel(), v.device) == (torch.uint8, 0, t.device)
    assert torch.equal(byte_view(torch.tensor([1.0], dtype=torch.float64)),
                       torch.tensor([0, 0, 0, 0, 0, 0, 240, 63], dtype=torch.uint8))


def test_a_peer_on_this_node_is_counted_intra_node():
    from verl_digen.schedule import ledger
    from verl_digen.workers.sync import SyncGroup

    group = SyncGroup.__new__(SyncGroup)
    group.node, group._nodes = "n1", {0: "n1", 1: "n2"}
    assert (group._where(0), group._where(1)) == (ledger.INTRA_NODE, ledger.INTER_NODE)
