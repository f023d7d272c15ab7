"""The worker method each action kind runs is stated once (``WORKER_METHODS``) and exists on the worker
classes that run it; no worker call depends on a kind's name happening to match a method."""

import json

from verl_digen.driver.ray_backend import WORKER_METHODS
from verl_digen.schedule.actions import ActionKind as K
from verl_digen.workers.actor import HybridWorker, TSPActorWorker
from verl_digen.workers.generator import GeneratorWorker

RUNS_ON = {  # colocated ranks (HybridWorker) generate with tag_generate and score their own share
    K.GENERATE: [GeneratorWorker],
    K.TAG_GENERATE: [HybridWorker],
    K.SCORE: [GeneratorWorker, HybridWorker],
    K.UPDATE: [TSPActorWorker, HybridWorker],
    K.SWITCH_TO_GEN: [HybridWorker],
    K.SWITCH_TO_TRAIN: [HybridWorker],
    K.OPTIMIZER_STEP: [TSPActorWorker, HybridWorker],
}


def test_every_kind_but_the_weight_transfers_names_a_method_its_workers_have():
    assert set(WORKER_METHODS) == set(K) - {K.PUBLISH, K.WEIGHT_SYNC}  # those go through workers/sync.py
    for kind, method in WORKER_METHODS.items():
        for cls in RUNS_ON[kind]:
            assert callable(getattr(cls, method, None)), f"{cls.__name__} has no {method} for {kind}"


def test_kinds_are_plain_strings_wherever_they_are_stored():
    assert json.dumps([K.UPDATE]) == '["update"]'
    assert f"{K.SCORE} s0" == "score s0" and str(K.SCORE) == "score"
    assert K("publish") is K.PUBLISH and {"weight_sync": 1}[K.WEIGHT_SYNC] == 1
