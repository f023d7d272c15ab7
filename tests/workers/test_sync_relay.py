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
    generators = [Actor(f"g{i}", log) for i in range(3)]
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
