"""One trainer (HybridWorker, full fine-tune, float64) and two generators on real verl worker groups:
runtime env, version guard, weight sync (both backends), TAG == generator, TAG leaves training state
bit-identical, checkpoint round trip."""

import pytest
import ray
import torch
from workers_helpers import (
    assert_state_equal,
    assert_trajectories_equal,
    kill_group,
    local_batch,
    make_groups,
    rows_of,
    tiny_cfg,
)

from verl_digen.schedule import ledger
from verl_digen.workers import policy as P
from verl_digen.workers.actor import HybridWorker
from verl_digen.workers.generator import GeneratorWorker
from verl_digen.workers.sync import WeightSync

CFG = tiny_cfg()
K = 2


@pytest.fixture(scope="module")
def pools(ray_session):
    trainer, gens = make_groups((HybridWorker, CFG, 1), (GeneratorWorker, CFG, 2))
    yield trainer, gens
    kill_group(trainer)
    kill_group(gens)


@pytest.fixture(scope="module")
def local_model():
    return P.build_policy(CFG)


def _train_step(trainer, local_model, step: int) -> int:
    """One global step on the trainer from a batch generated locally with the trainer's weights."""
    version = trainer.weights_version()[0]
    P.load_policy_weights(local_model, ray.get(trainer.workers[0].export_weights.remote()), lora=False)
    traj = local_batch(local_model, CFG, step, version, [0, 1], 4)
    trainer.update(traj, 1.0 / (len(traj) * K))
    return trainer.optimizer_step()[0]["version"]


def test_runtime_env_reaches_workers(pools):
    trainer, gens = pools
    infos = trainer.runtime_info() + gens.runtime_info()
    for info in infos:
        assert info["device_name"] == "cpu" and info["comm_backend"] == "gloo"
        assert info["env"]["VERL_PLATFORM"] == "cpu" and info["torch_threads"] == 1
    assert [i["env"]["RANK"] for i in gens.runtime_info()] == ["0", "1"]
    assert len({i["pid"] for i in infos}) == 3


def test_generate_with_other_version_raises(pools):
    _, gens = pools
    version = gens.weights_version()[0]
    rows, prompts = rows_of([0], 2)
    with pytest.raises(ray.exceptions.RayTaskError, match="holds policy version .* asked to generate with version"):
        ray.get(gens.workers[0].generate.remote(0, version + 1, rows, prompts))


@pytest.mark.parametrize("backend", ["object_store", "collective"])
def test_weight_sync_gives_generators_the_trainer_weights(pools, local_model, backend):
    trainer, gens = pools
    before = gens.weights_checksum()
    version = _train_step(trainer, local_model, step=0)
    sync = WeightSync(backend)
    sync.setup(trainer, gens)
    seconds = sync.sync(version)
    want = trainer.weights_checksum()[0]
    assert want != before[0], "the optimizer step did not change the weights"
    assert gens.weights_checksum() == [want, want]
    assert gens.weights_version() == [version, version]
    assert seconds > 0
    if backend == "collective":  # the trainer sends the model once; generator 0 relays it to generator 1
        model_bytes = sum(t.numel() * t.element_size() for t in local_model.transformer.state_dict().values())
        assert trainer.sync_counters() == [{"sent": model_bytes, "received": 0}]
        assert gens.sync_counters() == [{"sent": model_bytes, "received": model_bytes},
                                        {"sent": 0, "received": model_bytes}]
    print(f"\n{backend} sync (full fine-tune, {sum(p.numel() for p in local_model.transformer.parameters())} "
          f"params, float64, 2 generators): {seconds * 1e3:.1f} ms")


def test_tag_generation_equals_generator_generation(pools):
    trainer, gens = pools
    version = trainer.weights_version()[0]
    if gens.weights_version()[0] != version:
        sync = WeightSync("object_store")
        sync.setup(trainer, gens)
        sync.sync(version)
    rows, prompts = rows_of([2, 3], 2)
    trainer.switch_to_gen()
    tag = ray.get(trainer.workers[0].tag_generate.remote(5, version, rows, prompts))
    trainer.switch_to_train()
    gen = ray.get(gens.workers[1].generate.remote(5, version, rows, prompts))
    assert_trajectories_equal(tag, gen)
    assert torch.equal(tag.images, gen.images)
    scored_t = ray.get(trainer.workers[0].score.remote(tag))
    scored_g = ray.get(gens.workers[0].score.remote(gen))
    assert scored_t.rewards.dtype == torch.float64 and scored_t.images is None
    assert torch.equal(scored_t.rewards, scored_g.rewards)
    assert scored_g.reward_components.keys() == {"latent_mean"}


def test_tag_between_micro_batch_updates_keeps_training_state(pools, local_model):
    trainer, _ = pools
    _train_step(trainer, local_model, step=1)  # non-empty optimizer state
    version = trainer.weights_version()[0]
    P.load_policy_weights(local_model, ray.get(trainer.workers[0].export_weights.remote()), lora=False)
    traj = local_batch(local_model, CFG, 2, version, [0, 1], 4)
    scale = 1.0 / (len(traj) * K)
    trainer.update(traj.index(list(range(4))), scale)  # micro-batch 1
    before = trainer.full_state()[0]
    assert before["grads"] and all(v for v in before["optim"].values())

    out = trainer.switch_to_gen()[0]
    with pytest.raises(ray.exceptions.RayTaskError, match="switch_to_train"):
        trainer.update(traj.index([4, 5, 6, 7]), scale)
    rows, prompts = rows_of([2], 4)
    ray.get(trainer.workers[0].tag_generate.remote(2, version, rows, prompts))
    back = trainer.switch_to_train()[0]
    after = trainer.full_state()[0]
    assert_state_equal(before, after, exact=True)
    assert out["seconds"] > 0 and back["seconds"] > 0
    # the ledger: a CPU rank copies its gradients and AdamW state into the stash and hands them back as they
    # are; an unsharded rank generates with its own weights, so nothing is gathered, freed or sent to a device
    state_bytes = sum(g.numel() * g.element_size() for g in before["grads"].values()) + sum(
        v.numel() * v.element_size() for s in before["optim"].values() for v in s.values() if torch.is_tensor(v))
    assert out["moved"] == {ledger.HOST_COPIES: state_bytes} and back["moved"] == {}
    print(f"\nTAG context switch (CPU stash, {len(before['grads'])} grads + AdamW state): "
          f"out {out['seconds'] * 1e3:.2f} ms, back {back['seconds'] * 1e3:.2f} ms")

    trainer.update(traj.index([4, 5, 6, 7]), scale)  # micro-batch 2 still accumulates onto micro-batch 1
    grads_2 = trainer.full_state()[0]["grads"]
    assert any(not torch.equal(grads_2[n], before["grads"][n]) for n in grads_2)
    trainer.optimizer_step()


def test_checkpoint_round_trip_reproduces_training(pools, local_model, tmp_path):
    trainer, _ = pools
    _train_step(trainer, local_model, step=3)
    saved = trainer.full_state()[0]
    trainer.save_checkpoint(str(tmp_path / "ckpt"), {"step": 4, "data_pos": 17})
    _train_step(trainer, local_model, step=4)
    continued = trainer.full_state()[0]
    assert not torch.equal(next(iter(continued["params"].values())), next(iter(saved["params"].values())))

    assert trainer.load_checkpoint(str(tmp_path / "ckpt")) == [{"step": 4, "data_pos": 17}]
    assert_state_equal(saved, trainer.full_state()[0], exact=True)
    _train_step(trainer, local_model, step=4)
    assert_state_equal(continued, trainer.full_state()[0], exact=True)

    with pytest.raises(ray.exceptions.RayTaskError, match="no trainer checkpoint at .*does not exist"):
        trainer.load_checkpoint(str(tmp_path / "missing"))
