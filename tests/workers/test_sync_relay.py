"""CollectiveSync's driver-side bookkeeping without Ray: who sends a pickup (every trainer rank, or a generator
that already holds the published version and serves nobody), to which group rank, and how many sources are
free; actors are stand-ins whose calls return named refs, and a ref is "ready" when the test says so. Also the
switch stash's small helpers (scripts/mutation.sh's ``workers`` scope)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl_digen.workers import switch
from verl_digen.workers import sync as S


class Actor:
    """A Ray actor stand-in: ``actor.method.remote(*args)`` logs the call and returns a ref naming it."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def __getattr__(self, method: str) -> SimpleNamespace:
        def remote(*args):
            ref = f"{self.name}.{method}{args}"
            self.log.append(ref)
            return ref
        return SimpleNamespace(remote=remote)


@pytest.fixture
def world(monkeypatch):
    log: list = []
    done: set = set()
    monkeypatch.setattr(S, "_ready", lambda refs: all(r in done for r in refs))
    trainers = [Actor(f"t{i}", log) for i in range(2)]
    generators = [Actor(f"g{i}", log) for i in range(4)]
    backend = S.CollectiveSync()
    backend.generators = generators
    return backend, trainers, generators, log, done


def test_a_pickup_draws_from_every_trainer_rank_until_a_generator_holds_the_version(world):
    backend, trainers, gens, log, done = world
    assert backend.timeout_s == 300.0 and backend._version is None
    assert backend.publish(trainers, 7) == ["t0.stage_weights(7,)", "t1.stage_weights(7,)"]
    refs = backend.pickup(trainers, gens[0], 0, 7, "published")
    assert refs == ["t0.send_weights_to(2, 7)", "t1.send_weights_to(2, 7)", "g0.recv_weights(7, [0, 1])"]
    assert backend.sources_free(7) == 1  # nobody holds it yet: the trainers are the one source
    done.update(refs)  # generator 0 holds version 7 now
    refs = backend.pickup(trainers, gens[1], 1, 7, "published")
    assert refs == ["g0.send_weights_to(3, 7)", "g1.recv_weights(7, [2])"]  # relayed by generator 0 (rank 2)
    # generator 0 is serving generator 1 and generator 1 is not done: the trainers again
    refs = backend.pickup(trainers, gens[2], 2, 7, "published")
    assert refs[:2] == ["t0.send_weights_to(4, 7)", "t1.send_weights_to(4, 7)"]
    assert backend.sources_free(7) == 1
    done.update(log)  # every transfer landed: generators 0, 1 and 2 hold it and serve nobody
    assert backend.sources_free(7) == 3


def test_a_busy_relay_passes_the_next_pickup_to_the_next_free_holder(world):
    backend, trainers, gens, log, done = world
    backend.publish(trainers, 7)
    done.update(backend.pickup(trainers, gens[0], 0, 7, "published"))
    done.update(backend.pickup(trainers, gens[1], 1, 7, "published"))  # relayed by 0; both hold it, both free
    assert backend.pickup(trainers, gens[2], 2, 7, "published")[0] == "g0.send_weights_to(4, 7)"  # 0 is busy now
    assert backend.pickup(trainers, gens[3], 3, 7, "published") == ["g1.send_weights_to(5, 7)",
                                                                     "g3.recv_weights(7, [3])"]  # 1 is rank 3


def test_a_pickup_of_another_version_never_relays_and_is_not_held(world):
    backend, trainers, gens, log, done = world
    backend.publish(trainers, 7)
    done.update(backend.pickup(trainers, gens[0], 0, 7, "published"))
    refs = backend.pickup(trainers, gens[1], 1, 6, "older")  # a late pickup of the previous version
    assert refs[:2] == ["t0.send_weights_to(3, 6)", "t1.send_weights_to(3, 6)"]
    assert set(backend._held) == {0} and backend.sources_free(6) == 1
    backend.publish(trainers, 8)  # a new version forgets who held the old one
    assert backend.pickup(trainers, gens[2], 2, 8, "published")[0] == "t0.send_weights_to(4, 8)"


def test_object_store_publish_exports_the_published_version():
    log: list = []
    assert S.ObjectStoreSync().publish([Actor("t0", log)], 4) == ["t0.export_weights(4,)"]


def test_a_stash_is_true_when_it_holds_gradients_or_optimizer_state():
    assert not switch.TrainingStash()
    assert switch.TrainingStash(grads={"w": torch.ones(1)})
    assert switch.TrainingStash(optim={"w": {"exp_avg": torch.ones(1)}})


def test_a_sharded_tensor_counts_its_local_shard_only():
    class Sharded:  # a DTensor's interface: the global tensor is 4x the local shard
        def to_local(self):
            return torch.ones(3, dtype=torch.float64)

    assert switch._nbytes(Sharded()) == 24
    assert switch._nbytes(torch.ones(2, 2)) == 16


def _trained_pair():
    """Two parameters with gradients, one of them with AdamW state (the other never stepped)."""
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([a, b])
    a.grad = torch.full((3,), 2.0)
    opt.step()
    a.grad, b.grad = torch.full((3,), 3.0), torch.full((2,), 4.0)
    opt.state[a]["note"] = "kept as it is"  # a non-tensor entry
    return a, b, opt


def test_a_cpu_stash_takes_copies_of_gradients_and_optimizer_state_and_counts_their_bytes():
    a, b, opt = _trained_pair()
    grad_a, state_a = a.grad, dict(opt.state[a])
    tensor_bytes = sum(v.numel() * v.element_size() for v in state_a.values() if torch.is_tensor(v))
    into = switch.TrainingStash()
    moved = switch.stash([("a", a), ("b", b)], opt, torch.device("cpu"), into)
    assert moved == 3 * 4 + 2 * 4 + tensor_bytes
    assert a.grad is None and b.grad is None and set(into.grads) == {"a", "b"} and set(into.optim) == {"a"}
    grad_a.add_(1.0)  # the stash holds copies, not the tensors it took
    assert torch.equal(into.grads["a"], torch.full((3,), 3.0))
    assert all(into.optim["a"][k] is not v for k, v in state_a.items() if torch.is_tensor(v))
    assert into.optim["a"]["note"] == "kept as it is" and a not in opt.state
    assert switch.restore([("a", a), ("b", b)], opt, torch.device("cpu"), into) == 0  # nothing crosses a bus
    assert torch.equal(a.grad, torch.full((3,), 3.0)) and opt.state[a]["note"] == "kept as it is"


def _worker_config(arch: str, **kw):
    from verl_digen.rollout.sampler import SamplerConfig
    from verl_digen.workers.config import PolicyConfig, WorkerConfig

    return WorkerConfig(policy=PolicyConfig(arch=arch, dtype="float64"), sampler=SamplerConfig(num_steps=4),
                        rollout_backend="vllm", **kw)


def test_engine_kwargs_are_vllm_omnis_names_for_the_run_settings():
    from verl_digen.workers import vllm_backend as V

    cfg = _worker_config("sd3", vllm_max_batch=3, vllm_memory_fraction=0.5)
    assert V.engine_kwargs(cfg, "pkg.Pipeline", 1234) == {
        "custom_pipeline_args": {"pipeline_class": "pkg.Pipeline"}, "worker_extension_cls": V.EXTENSION_CLASS,
        "max_num_seqs": 3, "request_batch_max_wait_ms": V.BATCH_WAIT_MS, "dtype": "float64", "master_port": 1234,
        "gpu_memory_utilization": 0.5, "enforce_eager": True}
    assert V.engine_kwargs(_worker_config("sd3", vllm_compile=True), "p", 1)["enforce_eager"] is False
    assert "enforce_eager" not in V.engine_kwargs(_worker_config("hunyuan_video"), "p", 1)  # the diffusers adapter


def test_buckets_fill_up_to_their_size_in_name_order():
    from verl_digen.workers.vllm_backend import buckets_of

    state = {n: torch.ones(1) for n in "ecdba"}  # 4 bytes each
    assert [list(b) for b in buckets_of(state, 8)] == [["a", "b"], ["c", "d"], ["e"]]  # each exactly full
    assert [list(b) for b in buckets_of(state, 3)] == [[n] for n in "abcde"]  # a larger tensor alone
