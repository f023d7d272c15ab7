"""Ulysses sequence parallelism in the cost model: rows shared over groups, 1/P of a row's compute plus the
all-to-alls, whole groups only in the planner, and the profile format carrying it."""

import dataclasses

import pytest

from verl_digen.schedule import presets
from verl_digen.schedule.costs import Affine, CostModel, Hardware, Pool
from verl_digen.schedule.fabric import Fabric
from verl_digen.schedule.profile_io import Workload, model_from_dict, model_to_dict
from verl_digen.schedule.split_search import search


def test_all_to_all_moves_all_but_the_kept_share_over_the_slowest_link():
    nvlink = Fabric(gpus_per_node=8, intra_gbs=100.0, nic_gbs=10.0)
    assert nvlink.all_to_all(4e9, 4) == pytest.approx(4e9 * 3 / 4 / 100e9)
    assert nvlink.all_to_all(4e9, 16) == pytest.approx(4e9 * 15 / 16 / 10e9)  # two nodes: the NIC
    assert nvlink.all_to_all(4e9, 1) == 0.0


def test_a_preset_row_costs_a_pth_of_its_compute_plus_the_all_to_alls():
    spec = presets.SPECS["wan2.1-14b-720p-32"]
    one = spec.build(sequence_parallel=1).model
    four = spec.build(sequence_parallel=4).model
    assert four.sequence_parallel == 4 and one.sequence_parallel == 1
    s, wan, fab = spec.setting, spec.model, spec.train.fabric
    per_call = fab.all_to_all(presets.tokens(wan, s) / 4 * wan.hidden * fab.param_bytes, 4)
    calls = presets.ALL_TO_ALLS * wan.blocks * (2 + s.activation_checkpointing) * wan.cfg_passes  # CFG trained
    want = one.trainer.hardware.train_pass.per_unit / 4 + calls * per_call
    assert four.trainer.hardware.train_pass.per_unit == pytest.approx(want, rel=1e-12)
    assert four.trainer.hardware.train_pass.fixed == one.trainer.hardware.train_pass.fixed


def _model(sp: int, trainers: int = 8) -> CostModel:
    hw = Hardware(generate=Affine(1.0, 2.0), score=Affine(0.1, 0.1), train_pass=Affine(0.5, 1.0))
    return CostModel(Pool(hw, 4), Pool(hw, trainers), steps_trained=2, sequence_parallel=sp)


def test_rows_are_shared_over_the_groups_not_the_ranks():
    # 16 samples x 2 steps on 8 ranks: 4 rows a rank; in groups of 4, 2 groups train 16 rows each
    assert _model(1).train_time(16, 2, 8, _model(1).trainer.hardware) == pytest.approx(0.5 + 4 * 1.0)
    assert _model(4).train_time(16, 2, 8, _model(4).trainer.hardware) == pytest.approx(0.5 + 16 * 1.0)
    assert _model(4).data_parallel(8) == 2 and _model(4).data_parallel(2) == 1
    with pytest.raises(ValueError, match="sequence_parallel"):
        _model(0)


def test_the_planner_proposes_only_trainer_pools_of_whole_groups():
    wl = Workload(prompts=4, group_size=4, mb_size=2, tsp_degree=2, steps=2, policy="never")
    plan = search(_model(4, trainers=8), wl, total=12, policies=("never",), keep=None)
    assert plan.rows and {r.trainers % 4 for r in plan.rows} == {0}
    assert {r.trainers for r in search(_model(1, trainers=8), wl, total=12, policies=("never",), keep=None).rows} \
        > {4, 8}


def test_a_profile_keeps_its_sequence_parallel_size():
    model = dataclasses.replace(_model(4), resize=None)
    back, _ = model_from_dict(model_to_dict(model))
    assert back.sequence_parallel == 4
    assert "sequence_parallel" not in model_to_dict(_model(1))
