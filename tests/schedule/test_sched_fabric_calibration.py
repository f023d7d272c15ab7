"""Topology, the colocated baselines, the algorithm terms of the cost model, and the calibration."""

from __future__ import annotations

import pytest

from verl_digen.schedule import calibration, presets
from verl_digen.schedule.actions import GENERATE, SWITCH_TO_GEN, UPDATE
from verl_digen.schedule.config import COLOCATED, ScheduleConfig
from verl_digen.schedule.costs import Affine, BaselineCosts, CostModel, Hardware, Pool, trained_steps
from verl_digen.schedule.fabric import Fabric
from verl_digen.schedule.gap import spread_mb_size
from verl_digen.schedule.simulator import simulate


def test_ring_takes_the_slowest_link_the_pool_crosses():
    f = Fabric(gpus_per_node=8, intra_gbs=100.0, nic_gbs=25.0, nics_per_node=1)
    assert f.ring(8e9, 1) == 0.0
    assert f.ring(8e9, 8) == pytest.approx(8e9 * 7 / 8 / 100e9)  # one node: NVLink
    assert f.ring(8e9, 16) == pytest.approx(8e9 * 15 / 16 / 25e9)  # two nodes: one NIC each
    fat = Fabric(gpus_per_node=8, intra_gbs=100.0, nic_gbs=25.0, nics_per_node=8)
    assert fat.ring(8e9, 16) == pytest.approx(8e9 * 15 / 16 / 100e9)  # 8 NICs: NVLink is slower again
    assert f.send(5e9) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="sharding"):
        Fabric(sharding="zero3")
    with pytest.raises(ValueError, match="nic_gbs"):
        Fabric(nic_gbs=0)


def test_fsdp_pass_full_hybrid_and_lora():
    f = Fabric(gpus_per_node=4, intra_gbs=100.0, nic_gbs=10.0)
    p = 1e9
    full = 2 * f.ring(2 * p, 8) + f.ring(4 * p, 8)
    assert f.fsdp_pass(p, 8) == pytest.approx(full)
    assert f.fsdp_pass(p, 8) == pytest.approx((2 * 2e9 + 4e9) * 7 / 8 / 10e9)
    hybrid = Fabric(gpus_per_node=4, intra_gbs=100.0, nic_gbs=10.0, sharding="hybrid")
    in_node = 2 * hybrid.ring(2 * p, 4) + hybrid.ring(4 * p, 4)
    assert hybrid.fsdp_pass(p, 8) == pytest.approx(in_node + 2 * 4e9 * (1 / 2) / 10e9)
    assert f.fsdp_pass(p, 8, trainable=0.0) == pytest.approx(2 * f.ring(2 * p, 8))  # LoRA: no gradient traffic
    assert hybrid.gather_full(p, 8) == pytest.approx(hybrid.ring(2 * p, 4))


def test_a_pass_takes_max_of_compute_and_communication():
    a = Affine(fixed=0.5, per_unit=1.0, floor=3.0)
    assert a(0) == 0.0 and a(1) == 3.0 and a(2) == 3.0 and a(4) == pytest.approx(4.5)
    assert a.scaled(2.0)(1) == 6.0


def test_trained_steps_is_upstreams_int_everywhere():
    assert trained_steps(16, 0.6) == 9  # int(9.6), not round
    assert trained_steps(20, 0.6) == 12 and trained_steps(3, 0.1) == 1
    assert presets.get("flux-12b-16").model.steps_trained == 9
    with pytest.raises(ValueError, match="fraction"):
        trained_steps(10, 0.0)


def test_preset_resize_rederives_sharded_state_and_collectives():
    m = presets.get("wan2.1-14b-32").model
    one_node = m.with_workers(24, 8)  # an 8-GPU trainer pool fits one NVLink node
    assert one_node.trainer.workers == 8
    assert one_node.switch_to_train == pytest.approx(m.switch_to_train * 16 / 8)  # state sharded over fewer ranks
    assert one_node.trainer.hardware.train_pass.floor < m.trainer.hardware.train_pass.floor / 3


def test_per_sample_loop_trains_one_sample_per_pass():
    hw = Hardware(train_pass=Affine(fixed=1.0, per_unit=0.5))
    m = CostModel(Pool(hw, 1), Pool(hw, 2), steps_trained=4)
    # 6 samples over 2 ranks: 3 each, 4 passes of one row: 12 x 1.5
    assert m.train_time(6, 1, 2, hw, per_sample=True) == pytest.approx(12 * 1.5)
    # batched: 4 passes of 3 rows
    assert m.train_time(6, 1, 2, hw) == pytest.approx(4 * (1.0 + 1.5))
    assert m.train_time(6, 2, 2, hw, per_sample=True) == pytest.approx(3 * 2 * 2.0)  # TSP 2: two-row passes


def test_colocated_baselines_pay_what_users_runs_pay():
    hw = Hardware(generate=Affine(0.5, 2.0), score=Affine(0.0, 0.1), train_pass=Affine(0.2, 1.0, floor=1.5))
    b = BaselineCosts(shard_gather=0.3, sampling_forwards=10, rollout_wake=4.0, rollout_sleep=1.0)
    m = CostModel(Pool(hw, 2), Pool(hw, 2), steps_trained=3, switch_to_gen=0.7, switch_to_train=0.6, baselines=b)
    ideal, native, vo, bypass = (m.colocated_phases(8, 1, x) for x in ("ideal", "native", "verl-omni",
                                                                      "verl-omni-bypass"))
    assert ideal[GENERATE] == pytest.approx(0.5 + 2 * 2.0)  # 2 samples per GPU, one batched call
    # per-sample loop, each forward waits for its all-gather: 2 x (0.5 + max(2.0, 10 x 0.3))
    assert native[GENERATE] == pytest.approx(2 * (0.5 + 3.0))
    assert native[UPDATE] == pytest.approx(2 * 3 * 1.5) and native[SWITCH_TO_GEN] == 0.0
    assert vo[SWITCH_TO_GEN] == pytest.approx(0.7 + 4.0)
    # recompute: per pass max(0.25 x (0.2 + 2 rows x 1.0), 1.5 / 3) on top of the plain update
    assert vo[UPDATE] == pytest.approx(ideal[UPDATE] + 3 * max(0.25 * 2.2, 0.5))
    # bypass_mode: the same engine and switches, the rollout's log-probs as the old ones (no recompute pass)
    assert bypass == {**vo, UPDATE: pytest.approx(ideal[UPDATE])}
    assert bypass[UPDATE] < vo[UPDATE] and bypass[SWITCH_TO_GEN] == pytest.approx(0.7 + 4.0)
    with pytest.raises(ValueError, match="unknown colocated baseline"):
        m.colocated_phases(8, 1, "megatron")
    cfg = ScheduleConfig(prompts=2, group_size=4, mb_size=4, mode=COLOCATED, partition="batch")
    assert simulate(cfg, m, baseline="native").step_time == pytest.approx(sum(native.values()))


def test_spread_mb_size_gives_every_generator_work():
    assert spread_mb_size(4, 8, 16) == 2 and spread_mb_size(4, 8, 8) == 4 and spread_mb_size(1, 6, 8) == 1


def test_efficiency_fit_reproduces_its_figures_and_the_preset_constants():
    mfu, half = calibration.fit_efficiency()
    assert presets.GPU_B.mfu_max == pytest.approx(mfu, abs=0.005)
    assert presets.GPU_B.tokens_half == pytest.approx(half, rel=0.02)
    bed = calibration.hopper(mfu, half)
    run = calibration.QwenOcr()
    assert run.step(bed) == pytest.approx(calibration.VO_FULL_4_H200, rel=1e-3)
    assert run.generation(bed, batched=False) == pytest.approx(calibration.VO_UNBATCHED_GEN, rel=1e-3)
    assert run.generation(bed, batched=True) < run.generation(bed, batched=False) / 1.5


def test_engine_fit_reproduces_the_lending_figures_and_the_preset_constants():
    """The engine's software time is the published lending switch / reclaim less the model's transfers."""
    wake, sleep = calibration.fit_engine_switch()
    assert presets.ENGINE_WAKE_S == pytest.approx(wake, abs=0.01)
    assert presets.ENGINE_SLEEP_S == pytest.approx(sleep, abs=0.01)
    rows = {r["figure"]: r["model"] for r in calibration.verl_omni_rows()}
    switch, reclaim = (rows[f"verl-omni hybrid lending {w} (5B, 3 GPUs), s"] for w in ("switch", "reclaim"))
    assert switch == pytest.approx(calibration.VO_LEND_SWITCH, abs=0.01)
    assert reclaim == pytest.approx(calibration.VO_LEND_RECLAIM, abs=0.01)
    # the transfers alone are what a 5B model's weights and state take over the links (~1.2 s each)
    assert 1.0 < calibration.VO_LEND_SWITCH - wake < 1.5 and 1.0 < calibration.VO_LEND_RECLAIM - sleep < 1.5


def test_calibration_rows_are_mostly_held_out():
    rows = calibration.verl_omni_rows()
    roles = [r["role"] for r in rows]
    assert roles.count("fit") == 4 and roles.count("held_out") >= len(rows) / 2
    for r in rows:
        assert r["error"] == pytest.approx(r["model"] / r["published"] - 1)
