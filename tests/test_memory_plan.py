"""The dry run's memory plan (verl_digen/trainer/memory.py): printed per pool, exact for the static
parts of a tiny trainer, moved by each knob the way the trainer is built, and a run that cannot fit is
refused before Ray naming the knobs that would make it fit."""

from __future__ import annotations

import pytest
import torch

from verl_digen.algo.tsp import tsp_backward
from verl_digen.main import dry_run
from verl_digen.trainer import memory
from verl_digen.trainer.config import ConfigError, compose, validate
from verl_digen.workers import actor_memory
from verl_digen.workers import policy as P

QWEN_32 = ["digen.profile=qwen-image-20b-32", "resources.trainer.workers=16", "resources.generator.workers=16",
           "data.train_batch_size=16", "rollout.n=8", "rollout.micro_batch_size=16", "actor.kl_coef=0.04",
           "rollout.guidance_scale=4", "model.dtype=bfloat16", "actor.master_dtype=float32"]


def test_dry_run_prints_the_memory_plan_per_pool():
    text = dry_run(compose(["trainer.dry_run=true"]))
    assert "memory plan (tiny flux" in text
    assert "generator  per GPU (1 GPU(s))" in text and "trainer    per GPU (1 GPU(s))" in text
    assert "not checked" in text


def test_static_parts_equal_the_trainers_tensor_bytes():
    cfg = compose(["actor.kl_coef=0.04", "trainer.mode=separate", "digen.tag.policy=never"])
    parts = memory.memory_plan(cfg).pools[-1].parts
    w = cfg.worker_config()
    model = actor_memory.trainer_policy(w, torch.device("cpu"), 1, sharded=False)
    ref = actor_memory.reference_policy(w, torch.device("cpu"), 1, sharded=False)
    rows = [(0, s) for s in range(4)]
    traj = P.generate_rows(P.build_policy(w), w, 0, 0, rows, ["a red cube"] * 4)
    traj.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    tsp_backward(model, traj, w.sampler.train_config(w.loss), 0.1)
    opt = torch.optim.AdamW(model.transformer.parameters(), lr=1e-4)
    opt.step()
    got = actor_memory.memory_report(model, opt, ref, None)
    for part in ("weights", "grads", "optimizer", "reference"):
        assert parts[part] == pytest.approx(got[part], rel=1e-9), part


def test_knobs_move_the_estimate_as_the_trainer_is_built():
    base = compose(QWEN_32)

    def plan(*extra):
        return memory.memory_plan(compose(QWEN_32 + list(extra))).pools[-1]

    p = plan()
    assert memory.memory_plan(base).pools[0].pool == "generator"
    assert plan("actor.activation_checkpointing=true").parts["activations"] < p.parts["activations"] / 5
    assert plan("digen.tsp.degree=1").parts["activations"] < p.parts["activations"]
    assert "reference" not in plan("model.lora_rank=64").parts  # LoRA: adapters off, no copy
    off = plan("actor.param_offload=true")
    assert "weights" not in off.parts and off.host["weights"] == p.parts["weights"]
    assert "optimizer" not in plan("actor.optimizer_offload=true").parts
    # weights, grads, optimizer and reference are shards: 1/R of the model per GPU
    assert p.parts["weights"] == pytest.approx(20e9 * 4 / 16)
    assert p.parts["reference"] == pytest.approx(20e9 * 2 / 16)
    assert p.parts["optimizer"] == pytest.approx(2 * 20e9 * 4 / 16)


def test_a_run_that_cannot_fit_is_refused_naming_the_knobs():
    cfg = compose(QWEN_32 + ["resources.trainer.gpu_memory_gb=48"])
    with pytest.raises(ConfigError, match="resources.trainer.gpu_memory_gb") as err:
        memory.check_fits(cfg)
    assert "actor.param_offload=true" in str(err.value) and "more trainer GPUs" in str(err.value)
    assert memory.check_fits(compose(QWEN_32 + ["resources.trainer.gpu_memory_gb=80"])).pools[-1].fits
    # through validate, before Ray: a tiny run on a (declared) 1 MB GPU
    with pytest.raises(ConfigError, match="resources.trainer.gpu_memory_gb.*actor.activation_checkpointing"):
        validate(compose(["resources.trainer.gpu_memory_gb=0.0055"]))


@pytest.mark.parametrize("override, key", [
    ("actor.param_dtype=fp8", "actor.param_dtype"),
    ("actor.master_dtype=bfloat16", "actor.master_dtype"),  # narrower than model.dtype=float32
    ("resources.generator.gpu_memory_gb=0", "resources.generator.gpu_memory_gb"),
    ("resources.trainer.gpu_memory_gb=-1", "resources.trainer.gpu_memory_gb"),
])
def test_bad_memory_keys_are_named(override, key):
    with pytest.raises(ConfigError) as err:
        validate(compose([override]))
    assert err.value.key == key


def test_cfg_branches_follow_the_adapter_class_not_an_arch_name():
    """Guidance-distilled architectures (declared on the adapter class) train one pass per row at any
    guidance scale; the others two with CFG. The tiny models agree with the declaration."""
    from verl_digen.models.arch import MODEL_REGISTRY
    from verl_digen.trainer.memory import _trainer_rows

    for arch, cls in MODEL_REGISTRY.items():
        one, four = (_trainer_rows(compose([f"model.arch={arch}", f"rollout.guidance_scale={g}"])) for g in (1, 4))
        assert four == (one if cls.pretrained.guidance_distilled else 2 * one), arch
        assert bool(cls.tiny.transformer_kwargs.get("guidance_embeds", False)) == cls.pretrained.guidance_distilled
    assert MODEL_REGISTRY["hunyuan_video"].pretrained.guidance_distilled
