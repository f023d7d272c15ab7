"""The byte ledger (schedule/ledger.py): how ledgers add up, and the cost model's publish, pickup and TAG switch
prices re-derived by hand from the bytes the runtime moves over the preset's links (the runtime's side of the
same formulas is held in tests/runtime/test_runtime.py and tests/workers/test_fsdp_trainer.py)."""

import pytest

from verl_digen.schedule import ledger, presets


def test_a_ledger_sums_bytes_keeps_the_largest_staging_and_lists_only_what_moved():
    a = {}
    ledger.add(a, ledger.INTRA_NODE, 10)
    ledger.add(a, ledger.INTRA_NODE, 5)
    ledger.add(a, ledger.STAGING_PEAK, 7)
    ledger.add(a, ledger.STAGING_PEAK, 3)
    ledger.add(a, ledger.HASHED, 0)
    assert a == {ledger.INTRA_NODE: 15, ledger.STAGING_PEAK: 7}
    merged = ledger.merge([a, {ledger.STAGING_PEAK: 9, ledger.INTER_NODE: 1}])
    assert merged == {ledger.INTRA_NODE: 15, ledger.STAGING_PEAK: 9, ledger.INTER_NODE: 1}
    assert ledger.as_pairs(merged) == ((ledger.INTRA_NODE, 15), (ledger.INTER_NODE, 1), (ledger.STAGING_PEAK, 9))
    with pytest.raises(ValueError, match="unknown ledger kind 'bytes'"):
        ledger.add(a, "bytes", 1)
    with pytest.raises(ValueError, match=">= 0"):
        ledger.add(a, ledger.HASHED, -1)


def test_the_collective_pickup_moves_the_model_once_and_hashes_and_serializes_nothing():
    n = 24 * 10 ** 9  # FLUX-12B in bf16
    assert ledger.pickup_ledger(n, "collective", inter_node=True, on_gpu=True) == {
        ledger.DEVICE_TO_DEVICE: n, ledger.INTER_NODE: n}
    verified = ledger.pickup_ledger(n, "collective", inter_node=False, on_gpu=True, verify_payload=True)
    assert verified[ledger.HASHED] == verified[ledger.HOST_DEVICE] == n
    store = ledger.pickup_ledger(n, "object_store", inter_node=True, on_gpu=True)
    assert store[ledger.SERIALIZED] == store[ledger.HOST_COPIES] == store[ledger.HOST_DEVICE] == n
    links = ledger.Links(intra_gbs=150, inter_gbs=25)
    # at 24 GB over a 25 GB/s NIC the transfer is ~1 s; the object store adds its host passes on top
    assert ledger.price(ledger.pickup_ledger(n, "collective", True, True), links) == pytest.approx(n / 25e9)
    assert ledger.price(store, links) > 2 * ledger.price(ledger.pickup_ledger(n, "collective", True, True), links)


@pytest.mark.parametrize("name", ["flux-12b-32", "qwen-image-20b-32", "hunyuanvideo-13b-hetero"])
def test_preset_sync_and_switch_prices_are_the_moved_bytes_over_the_links(name):
    """Re-derived without ledger.py: a pickup is the bf16 model over the slower pool's NIC (no serialization,
    no hash, no host copy); publishing is the all-gather of the shards a rank lacks (no host copy); a switch
    moves the rank's optimizer state over PCIe and gathers the model into the generation copy, and back it
    moves the state only (the copy stays on the device)."""
    spec = presets.get(name).spec
    m = presets.derive(spec.model, spec.setting, spec.gen, spec.train, spec.gen_workers, spec.train_workers)
    fab, r = spec.train.fabric, spec.train_workers
    weights = spec.model.params_b * 1e9 * fab.param_bytes
    nic = min(spec.gen.fabric, fab, key=lambda f: f.inter_gbs).nic_gbs  # the slower pool's network
    assert m.weight_sync == pytest.approx(weights / (nic * 1e9), rel=1e-9)
    gather = weights * (r - 1) / r / (fab.link_gbs(r) * 1e9)
    assert m.publish == pytest.approx(gather, rel=1e-9)
    state = presets.STATE_BYTES * spec.model.params_b * 1e9 / r / (spec.train.gpu.host_gbs * 1e9)
    assert m.switch_to_gen == pytest.approx(state + gather, rel=1e-9)
    assert m.switch_to_train == pytest.approx(state, rel=1e-9)
