"""A weight-sync backend in one file (tests/workers/test_sync_registry.py loads it): registering is all it takes
for ``digen.sync.backend=toy_relay`` to pass validation and for ``WeightSync`` to drive it."""

from typing import Any

from verl_digen.workers.sync import SyncBackend, register_sync_backend


@register_sync_backend("toy_relay")
class ToyRelaySync(SyncBackend):
    """Every trainer rank gathers; a pickup hands rank 0's result to ``load_weights``. Declared not
    restartable, so the run keeps generator restarts off."""

    publish_returns_weights = True

    def publish(self, trainers: list, version: int) -> list:
        return [w.export_weights.remote(version) for w in trainers]

    def pickup(self, trainers: list, generator: Any, index: int, version: int, published: Any) -> list:
        return [generator.load_weights.remote(version, published)]
