"""A 2-rank FSDP2 trainer pool (gloo) against the single-process reference (float64), full fine-tune
and LoRA (+ KL to the adapters-off reference): same accumulated gradient (also from updates whose samples do
not split over the ranks: their rows do), same parameters after one
optimizer step, each rank as its own TAG slot == local generation, and weight sync from the sharded trainer
(only adapter tensors move with LoRA)."""

from dataclasses import replace

import pytest
import ray
import torch
from workers_helpers import assert_state_equal, kill_group, local_batch, make_groups, rows_of, tiny_cfg

from verl_digen.algo.tsp import tsp_backward
from verl_digen.models import disable_adapters, lora_state_dict
from verl_digen.schedule import ledger
from verl_digen.workers import policy as P
from verl_digen.workers.actor import HybridWorker
from verl_digen.workers.generator import GeneratorWorker
from verl_digen.workers.sync import WeightSync

TOL = 1e-10


@pytest.fixture(scope="module", params=[0, 2], ids=["full", "lora"])
def setup(request, ray_session):
    lora = request.param
    cfg = tiny_cfg(lora_rank=lora, kl_coef=0.05 if lora else 0.0, tsp_degree=1)
    trainer, gens = make_groups((HybridWorker, cfg, 2), (GeneratorWorker, cfg, 1))
    yield cfg, trainer, gens
    kill_group(trainer)
    kill_group(gens)


def _reference_step(cfg, traj, scale):
    """driver/local.py's update on one process: TSP backward, clip, AdamW step."""
    model = P.build_policy(cfg)
    model.transformer.train()
    ref = None
    if cfg.loss.kl_coef > 0:
        def ref(x, s, c):
            with disable_adapters(model):
                return model.velocity(x, s, c, cfg.sampler.guidance_scale)
    named = [(n, p) for n, p in model.transformer.named_parameters() if p.requires_grad]
    tsp_backward(model, traj, cfg.sampler.train_config(cfg.loss), scale, degree=cfg.tsp_degree, reference=ref)
    grads = {n: p.grad.detach().clone() for n, p in named}
    norm = torch.nn.utils.clip_grad_norm_([p for _, p in named], cfg.optim.grad_clip)
    opt = torch.optim.AdamW([p for _, p in named], lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=0.0)
    opt.step()
    return model, grads, float(norm), {n: p.detach().clone() for n, p in named}


def _close(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys() and a, what
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=TOL, msg=f"{what} {n}")


def test_two_rank_fsdp2_matches_single_process(setup):
    cfg, trainer, gens = setup
    assert [i["env"]["WORLD_SIZE"] for i in trainer.runtime_info()] == ["2", "2"]
    local = P.build_policy(cfg)
    traj = local_batch(local, cfg, 0, 0, [0, 1], 4)  # 8 samples x 2 trained steps
    scale = 1.0 / (len(traj) * cfg.sampler.selection.k)
    model, ref_grads, ref_norm, ref_params = _reference_step(cfg, traj, scale)

    # two updates of 3 and 5 samples: neither splits evenly over the 2 ranks by samples; their rows do
    first = P.merge_metrics(trainer.update(traj.index([0, 1, 2]), scale))
    metrics = P.merge_metrics(trainer.update(traj.index([3, 4, 5, 6, 7]), scale))
    assert (first.rows, metrics.rows) == (3 * 2, 5 * 2)
    state = trainer.full_state()
    assert state[1] is None
    _close(ref_grads, state[0]["grads"], "accumulated gradient")
    if cfg.policy.lora:
        assert all("lora_" in n for n in state[0]["grads"])

    out = trainer.optimizer_step()
    assert [o["version"] for o in out] == [1, 1]
    assert abs(out[0]["grad_norm"] - ref_norm) < TOL
    _close(ref_params, trainer.full_state()[0]["params"], "parameters after the optimizer step")

    # TAG with both ranks as independent slots (each samples its own micro-batch with the full weights
    # it materialized at the switch) == local generation, and the sharded accumulated gradients /
    # optimizer state survive the context switch bit for bit
    trainer.update(traj, scale)
    before = trainer.full_state()[0]
    trainer.switch_to_gen()
    (rows_a, texts_a), (rows_b, texts_b) = rows_of([2], 2), rows_of([3], 3)
    parts = trainer.tag_generate([1, 1], [1, 1], [rows_a, rows_b], [texts_a, texts_b])
    trainer.switch_to_train()
    assert_state_equal(before, trainer.full_state()[0], exact=True)
    assert [len(p) for p in parts] == [2, 3]
    for part, rows, texts in ((parts[0], rows_a, texts_a), (parts[1], rows_b, texts_b)):
        want = P.generate_rows(model, cfg, 1, 1, rows, texts)
        assert part.prompt_ids.tolist() == want.prompt_ids.tolist() and part.versions.tolist() == [1] * len(rows)
        for name in ("states", "next_states", "log_probs", "final_latents"):
            torch.testing.assert_close(getattr(part, name), getattr(want, name), rtol=0, atol=TOL, msg=name)


@pytest.mark.parametrize("backend", ["object_store", "collective"])
def test_sync_from_sharded_trainer(setup, backend):
    cfg, trainer, gens = setup
    version = trainer.weights_version()[0]
    exported = trainer.export_weights()
    assert exported[1] is None
    local = P.build_policy(cfg)
    expected_keys = lora_state_dict(local).keys() if cfg.policy.lora else local.transformer.state_dict().keys()
    assert exported[0].keys() == expected_keys
    if cfg.policy.lora:
        assert all("lora_" in k for k in exported[0])
    sync = WeightSync(backend)
    sync.setup(trainer, gens)
    seconds = sync.sync(version)
    assert gens.weights_checksum() == [trainer.weights_checksum()[0]]
    assert gens.weights_version() == [version]
    n = sum(t.numel() for t in exported[0].values())
    print(f"\n{backend} sync from 2-rank FSDP2 trainer ({'LoRA' if cfg.policy.lora else 'full'}, "
          f"{len(exported[0])} tensors, {n} values): {seconds * 1e3:.1f} ms")


def _switch_round_trip(trainer) -> tuple[list[dict], list[dict]]:
    return [o["moved"] for o in trainer.switch_to_gen()], [o["moved"] for o in trainer.switch_to_train()]


def _step(cfg, trainer) -> None:
    """One update and optimizer step: a new version, so the next switch must gather it."""
    local = P.build_policy(cfg)
    P.load_policy_weights(local, trainer.export_weights()[0], cfg.policy.lora)
    version = trainer.weights_version()[0]
    traj = local_batch(local, cfg, 3, version, [0], 2)
    trainer.update(traj, 1.0 / (len(traj) * cfg.sampler.selection.k))
    trainer.optimizer_step()


def test_a_resident_generation_copy_is_gathered_once_per_version_and_never_moved(setup):
    """The TAG switch's ledger on a sharded rank: switching to generation gathers the other rank's shards into
    the generation copy (together the two ranks receive the model once: full - own shard each); back to
    training nothing of the copy moves (it stays on the device, no host round trip, nothing freed); with the
    version unchanged the next switch gathers nothing."""
    cfg, trainer, _ = setup
    _step(cfg, trainer)
    model_bytes = sum(t.numel() * t.element_size() for t in P.build_policy(cfg).transformer.state_dict().values())
    to_gen, to_train = _switch_round_trip(trainer)
    assert sum(m[ledger.GATHERED] for m in to_gen) == model_bytes  # (R - 1) x the model over R = 2 ranks
    # what the cost model prices a switch with (per rank, the average of the two uneven shards)
    priced = ledger.switch_ledger(model_bytes, 0, 2, to_gen=True, resident=True, on_gpu=False)
    assert 2 * priced[ledger.GATHERED] == model_bytes
    assert all(ledger.HOST_DEVICE not in m and ledger.FREED not in m for m in to_gen + to_train)
    again, _ = _switch_round_trip(trainer)
    assert all(ledger.GATHERED not in m for m in again)


def _keep_generation_copy(trainer, keep: bool) -> None:
    """Set every rank's ``keep_generation_copy`` in place: the switch back to training reads it each time (nothing
    at start-up does), so the module's pool serves the memory plan's no-room case without a pool of its own."""
    def setting(worker, keep):
        worker.cfg = replace(worker.cfg, keep_generation_copy=keep)

    ray.get([w.__ray_call__.remote(setting, keep) for w in trainer.workers])


def test_a_generation_copy_that_may_not_stay_is_freed_and_gathered_again(setup):
    """keep_generation_copy=False (the memory plan has no room beside the training state): the switch back
    frees the whole copy on every rank, and the next switch gathers it exactly once again, into the same modules
    (no rebuild), which then generate what the trainer's weights generate."""
    cfg, trainer, _ = setup
    _step(cfg, trainer)  # a new version: the first switch below gathers it into the resident copy
    local = P.build_policy(cfg)
    P.load_policy_weights(local, trainer.export_weights()[0], cfg.policy.lora)
    version = trainer.weights_version()[0]
    model_bytes = sum(t.numel() * t.element_size() for t in local.transformer.state_dict().values())
    _keep_generation_copy(trainer, False)
    try:
        first, back = _switch_round_trip(trainer)
        assert [m[ledger.FREED] for m in back] == [model_bytes, model_bytes]
        second = [o["moved"] for o in trainer.switch_to_gen()]
        assert [m[ledger.GATHERED] for m in second] == [m[ledger.GATHERED] for m in first]
        assert sum(m[ledger.GATHERED] for m in second) == model_bytes
        rows, texts = rows_of([1], 2)
        parts = trainer.tag_generate([0, 0], [version, version], [rows, rows], [texts, texts])
        trainer.switch_to_train()
        want = P.generate_rows(local, cfg, 0, version, rows, texts)
        for part in parts:
            torch.testing.assert_close(part.final_latents, want.final_latents, rtol=0, atol=TOL)
    finally:
        _keep_generation_copy(trainer, True)
