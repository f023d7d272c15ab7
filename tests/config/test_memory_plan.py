"""The dry run's memory plan (verl_digen/config/memory.py): printed per pool, exact for the static
parts of a tiny trainer, moved by each knob the way the trainer is built, and a run that cannot fit is
refused before Ray naming the knobs that would make it fit."""

from __future__ import annotations

import pytest
import torch

from verl_digen.algo.tsp import tsp_backward
from verl_digen.config import ConfigError, compose, memory, schema, validate
from verl_digen.main import dry_run
from verl_digen.workers import actor_memory
from verl_digen.workers import policy as P

QWEN_32 = ["model.arch=qwen_image", "model.path=Qwen/Qwen-Image", "digen.profile=qwen-image-20b-32",
           "resources.trainer.workers=16", "resources.generator.workers=16",
           "data.train_batch_size=16", "rollout.n=8", "rollout.micro_batch_size=16", "actor.kl_coef=0.04",
           "rollout.guidance_scale=4", "model.dtype=bfloat16", "actor.master_dtype=float32"]


def test_dry_run_prints_the_memory_plan_per_pool():
    text = dry_run(compose(["trainer.dry_run=true"]))
    assert "memory plan (tiny flux" in text
    assert "generator  per GPU (1 GPU(s))" in text and "trainer    per GPU (1 GPU(s))" in text
    assert text.count("not checked") == 1  # said once, for both pools
    assert " GB" not in text.split("memory plan")[1] and "GiB" in text or "MiB" in text


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
    # the step's weights, kept for later mini-batches' recomputed old log-probs: one more sharded copy of the
    # trained tensors while training (not while TAG generates: TAG stops at the first mini-batch's step)
    mini = plan("actor.ppo_mini_batch_size=8", "actor.recompute_log_prob=true")
    assert mini.parts["step weights"] == pytest.approx(p.parts["grads"]) and mini.train_total > p.train_total
    assert mini.gen_total == pytest.approx(p.gen_total)
    assert "step weights" not in plan("actor.ppo_mini_batch_size=8", "actor.recompute_log_prob=false").parts
    assert "step weights" not in plan("actor.recompute_log_prob=true").parts
    # weights, grads, optimizer and reference are shards: 1/R of the model per GPU
    assert p.parts["weights"] == pytest.approx(20e9 * 4 / 16)
    assert p.parts["reference"] == pytest.approx(20e9 * 2 / 16)
    assert p.parts["optimizer"] == pytest.approx(2 * 20e9 * 4 / 16)


def test_a_run_that_cannot_fit_is_refused_naming_the_knobs():
    cfg = compose(QWEN_32 + ["actor.activation_checkpointing=true", "resources.trainer.gpu_memory_gb=48"])
    with pytest.raises(ConfigError, match="resources.trainer.gpu_memory_gb") as err:
        memory.check_fits(cfg)
    assert "actor.param_offload=true" in str(err.value) and "more trainer GPUs" in str(err.value)
    assert memory.check_fits(compose(QWEN_32 + ["actor.activation_checkpointing=true"])).pools[-1].fits
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


@pytest.mark.slow
def test_cfg_branches_follow_the_adapter_class_not_an_arch_name():
    """Guidance-distilled architectures (declared on the adapter class) train one pass per row at any
    guidance scale; the others two with CFG. The tiny models agree with the declaration."""
    from verl_digen.config.memory import _trainer_rows
    from verl_digen.models.arch import MODEL_REGISTRY

    for arch, cls in MODEL_REGISTRY.items():
        one, four = (_trainer_rows(compose([f"model.arch={arch}", f"rollout.guidance_scale={g}"])) for g in (1, 4))
        assert four == (one if cls.pretrained.guidance_distilled else 2 * one), arch
        assert bool(cls.tiny.transformer_kwargs.get("guidance_embeds", False)) == cls.pretrained.guidance_distilled
    assert MODEL_REGISTRY["hunyuan_video"].pretrained.guidance_distilled


# -- issue 22 item 5: memory that tells the truth by default --------------------------------------------

def _preset_cfg(preset: str, *extra: str):
    """A pretrained run sized by ``preset`` (its model's arch and a hub id), on the preset's pools."""
    from verl_digen.schedule import presets

    spec = presets.SPECS[preset]
    arch = {"FLUX": "flux", "Qwen": "qwen_image", "Wan2": "wan", "Hunyu": "hunyuan_video"}
    arch = next(v for k, v in arch.items() if spec.model.name.startswith(k))
    return compose([f"model.arch={arch}", "model.path=some/hub-id", f"digen.profile={preset}", "model.dtype=bfloat16",
                    f"resources.generator.workers={spec.gen_workers}",
                    f"resources.trainer.workers={spec.train_workers}",
                    "data.train_batch_size=4", f"rollout.n={2 * spec.train_workers}",
                    f"rollout.micro_batch_size={spec.train_workers}", *extra])


@pytest.mark.slow
def test_every_preset_carries_its_gpu_memory_and_a_declaration_overrides_it():
    from verl_digen.schedule import presets

    for name, spec in presets.SPECS.items():
        assert spec.gen.gpu.memory_gb and spec.train.gpu.memory_gb, name
        plan = memory.memory_plan(_preset_cfg(name))
        assert [(p.pool, p.capacity_gb) for p in plan.pools] == \
            [("generator", spec.gen.gpu.memory_gb), ("trainer", spec.train.gpu.memory_gb)], name
        assert "not checked" not in plan.render() and f"preset {name}" in plan.render()
    assert presets.SPECS["hunyuanvideo-13b-hetero"].train.gpu.memory_gb == 96  # the hetero trainer's 96 GB
    plan = memory.memory_plan(_preset_cfg("qwen-image-20b-32", "resources.trainer.gpu_memory_gb=141"))
    assert [(p.capacity_gb, p.capacity_source) for p in plan.pools] == \
        [(80, "preset qwen-image-20b-32"), (141, "resources.trainer.gpu_memory_gb")]
    # colocated spans both pools' GPUs: the smaller one
    twin = memory.memory_plan(_preset_cfg("hunyuanvideo-13b-hetero", "trainer.mode=colocated"))
    assert [(p.pool, p.capacity_gb) for p in twin.pools] == [("colocated", 48)]
    # the dry run of a preset-sized run that cannot fit the preset's GPUs is refused, naming the preset
    with pytest.raises(ConfigError, match="80 GiB from preset qwen-image-20b-32"):
        memory.check_fits(_preset_cfg("qwen-image-20b-32", "rollout.n=64", "data.train_batch_size=16"))


def test_text_encoders_vae_and_reward_model_are_counted_where_they_live():
    gib = 2**30
    with_tag = memory.memory_plan(_preset_cfg("qwen-image-20b-32", "reward.name=ocr"))
    gen, trn = with_tag.pools
    # Qwen-Image's Qwen2.5-VL-7B encoder in bf16 (~15.4 GiB) on the generator and in TAG's copy on the trainer
    assert gen.parts["text encoders"] / gib == pytest.approx(8.29e9 * 2 / gib) == trn.parts["text encoders"] / gib
    assert 15 < gen.parts["text encoders"] / gib < 16 and 0 < gen.parts["VAE"] < gib
    assert gen.parts["reward model"] == 0 and with_tag.notes == []  # OCR: RapidOCR's ONNX models run on the CPU
    no_tag = memory.memory_plan(_preset_cfg("qwen-image-20b-32", "digen.tag.policy=never")).pools[-1]
    assert "text encoders" not in no_tag.parts and "generation copy" not in no_tag.parts
    for reward, params in (("pickscore", 0.986e9), ("hpsv2", 0.986e9)):  # CLIP ViT-H-14 in fp32
        plan = memory.memory_plan(_preset_cfg("flux-12b-32", f"reward.name={reward}"))
        assert plan.pools[0].parts["reward model"] == pytest.approx(params * 4)
        assert "reward model" not in plan.pools[1].parts  # rewards run on the generator pool
    wan = memory.memory_plan(_preset_cfg("wan2.1-14b-32")).pools[0]
    assert 10 < wan.parts["text encoders"] / gib < 11  # umT5-XXL ~11.4 GB
    assert "reward model" in memory.memory_plan(_preset_cfg("flux-12b-32", "trainer.mode=colocated",
                                                            "reward.name=pickscore")).pools[0].parts
    unknown = memory.memory_plan(_preset_cfg("flux-12b-32", "reward.name=vlm_judge"))
    assert any("vlm_judge" in n for n in unknown.notes)


def test_figures_are_labelled_gib():
    assert memory._gb(80 * 2**30) == "80 GiB" and memory._gb(5 * 2**20) == "5 MiB"
    text = memory.memory_plan(_preset_cfg("qwen-image-20b-32")).render()
    assert "of 80 GiB" in text and " GB" not in text


def _refusal(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        memory.check_fits(cfg)
    return str(err.value).split("to fit, try ")[1]


def test_suggestions_follow_the_dominant_term_each_with_its_figure():
    # activations dominate (no checkpointing): checkpointing first, with its figure; not "more GPUs" first
    act = _preset_cfg("wan2.1-14b-32", "rollout.n=64", "data.train_batch_size=8")
    assert memory.memory_plan(act).pools[-1].dominant == "activations"
    tips = _refusal(act).split("; ")
    assert tips[0].startswith("actor.activation_checkpointing=true (") and "GiB" in tips[0]
    assert tips[1].startswith("fewer rows per pass: at most ")
    assert not any("ulysses" in t for t in tips)  # rows per pass fit: fewer of them is the simpler fix
    # model state dominates (few trainer GPUs, checkpointing on): offload and more trainer GPUs first
    state = _preset_cfg("qwen-image-20b-32", "resources.trainer.workers=2", "rollout.n=4", "rollout.micro_batch_size=2",
                        "actor.activation_checkpointing=true", "digen.tsp.degree=1", "digen.tag.policy=never")
    pool = memory.memory_plan(state).pools[-1]
    assert pool.dominant == "model state"
    tips = _refusal(state).split("; ")
    assert tips[0].startswith("actor.optimizer_offload=true (")
    assert not any("ulysses" in t for t in tips)  # an image model has no sequence to cut
    more = next(t for t in tips if t.startswith("more trainer GPUs"))
    r = int(more.split("resources.trainer.workers=")[1].split(" ")[0])
    need = memory.memory_need(state, trainer_workers=r)["trainer"]
    assert need.fits and f"({need.gib:.3g} GiB)" in more  # the figure is the plan's own
    assert not memory.memory_need(state, trainer_workers=r - 1)["trainer"].fits  # and the fewest that fit


def test_full_fine_tune_keeps_fp32_masters_by_default():
    bf16 = compose(["model.dtype=bfloat16"])
    assert schema.master_dtype(bf16) == "float32" and bf16.worker_config().memory.master_dtype == "float32"
    assert bf16.worker_config().memory.compute("bfloat16") == "bfloat16"  # bf16 compute
    assert memory.memory_plan(bf16).master_dtype == "float32"
    assert schema.master_dtype(compose(["model.dtype=float64"])) == "float64"  # exact tests keep their dtype
    assert schema.master_dtype(compose(["model.dtype=bfloat16", "model.lora_rank=4"])) == "bfloat16"
    assert validate(bf16) == [] or not any("master_dtype" in w for w in validate(bf16))
    asked = compose(["model.dtype=bfloat16", "actor.master_dtype=bfloat16"])
    assert asked.worker_config().memory.master_dtype == "bfloat16"
    warns = [w for w in validate(asked) if "actor.master_dtype" in w]
    assert len(warns) == 1 and "rounds away" in warns[0] and "1/256" in warns[0]


def test_memory_need_and_max_rows_per_rank_for_the_planner():
    cfg = _preset_cfg("wan2.1-14b-32", "rollout.n=64", "data.train_batch_size=8")
    plan = memory.memory_plan(cfg)
    need = memory.memory_need(cfg)
    assert {k: v.gib for k, v in need.items()} == {p.pool: p.total / 2**30 for p in plan.pools}
    assert not need["trainer"].fits and need["trainer"].capacity_gib == 80
    size = memory.model_size(cfg)
    for ckpt in (False, True):
        cap = memory.max_rows_per_rank(cfg, activation_checkpointing=ckpt, size=size)
        assert cap >= 1
        assert memory.memory_need(cfg, rows_per_rank=cap, activation_checkpointing=ckpt, size=size)["trainer"].fits
        assert not memory.memory_need(cfg, rows_per_rank=cap + 1, activation_checkpointing=ckpt,
                                      size=size)["trainer"].fits
    assert memory.max_rows_per_rank(cfg, activation_checkpointing=True) > 5 * memory.max_rows_per_rank(cfg)
    # TAG's generation pipeline costs the trainer its text encoders and VAE while training (its bf16 copy
    # of the transformer only while generating, with grads and optimizer switched out)
    on, off = (memory.memory_plan(cfg, tag=t).pools[-1] for t in (True, False))
    assert on.train_total - off.train_total == pytest.approx(on.parts["text encoders"] + on.parts["VAE"])
    assert on.gen_total > on.parts["generation copy"] > 26 * 2**30  # 14B in bf16
    assert memory.memory_need(cfg, tag=True)["trainer"].gib > memory.memory_need(cfg, tag=False)["trainer"].gib
    # more trainer GPUs shrink the shards; unknown memory: no cap
    assert memory.memory_need(cfg, trainer_workers=32)["trainer"].gib < need["trainer"].gib
    assert memory.max_rows_per_rank(compose([])) is None


@pytest.mark.slow
def test_every_recipe_checks_its_memory_and_fits():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from verl_digen import recipes
    from verl_digen.config import load

    for name in recipes.names():
        with initialize_config_dir(str(recipes.RECIPES_DIR), version_base=None):
            cfg = load(hydra_compose(name))
        plan = memory.memory_plan(cfg)
        assert plan is not None and "not checked" not in plan.render(), name
        for pool in plan.pools:
            assert pool.capacity_gb is not None and pool.fits, (name, pool.render())
        assert plan.master_dtype == "float32", name


def test_parameter_counts_read_as_people_say_them():
    from verl_digen.config.memory import parameters

    assert [parameters(n) for n in (12e9, 4.76e9, 350e6, 78_528, 12)] == ["12B", "4.76B", "350M", "78.5k", "12"]


def test_the_vllm_engine_is_in_the_plan_and_refused_naming_its_term():
    """rollout.backend=vllm (issue 43): the generator GPU holds the engine's weights, its text encoders and VAE
    once, the requests in flight (twice with compiled graphs) and its runtime, checked against the engine's share
    of the GPU; the dry run prints the terms and the engine's start-up price, per generator and per restart."""
    gib = 2**30
    diffusers_gen = memory.memory_plan(_preset_cfg("flux-12b-32")).pools[0]
    plan = memory.memory_plan(_preset_cfg("flux-12b-32", "rollout.backend=vllm"))
    gen = plan.pools[0]
    assert gen.parts["engine weights"] == diffusers_gen.parts["weights"] and "weights" not in gen.parts
    assert gen.parts["text encoders"] == diffusers_gen.parts["text encoders"]  # once, not the worker's as well
    assert gen.parts["engine requests in flight"] == diffusers_gen.parts["activations"]
    assert gen.parts["engine runtime"] == memory.ENGINE_RUNTIME_GIB * gib
    assert gen.engine_total == sum(gen.parts[k] for k in gen.ENGINE) <= gen.total  # the reward: the worker's
    compiled = memory.memory_plan(_preset_cfg("flux-12b-32", "rollout.backend=vllm", "rollout.vllm_compile=true"))
    assert compiled.pools[0].parts["engine requests in flight"] == 2 * gen.parts["engine requests in flight"]
    text = plan.render()
    assert "vLLM-Omni engine:" in text and "rollout.vllm_memory_fraction): fits" in text
    g = plan.pools[0].gpus
    assert f"paid once per generator at start ({g} generators:" in text and "again per generator restart" in text
    # a share the engine's terms do not fit in: refused, naming the key, the terms and the largest of them
    with pytest.raises(ConfigError, match="rollout.vllm_memory_fraction") as err:
        memory.check_fits(_preset_cfg("flux-12b-32", "rollout.backend=vllm", "rollout.vllm_memory_fraction=0.5",
                                      "actor.activation_checkpointing=true"))
    assert "largest: engine weights" in str(err.value)
    assert memory.check_fits(_preset_cfg("flux-12b-32", "rollout.backend=vllm",
                                         "actor.activation_checkpointing=true")) is not None


def test_engine_startup_is_priced_once_per_generator_and_per_restart():
    from verl_digen.schedule import presets

    eager = presets.engine_startup(40e9, 25.0, compile=False)
    assert eager.seconds == pytest.approx(presets.ENGINE_START_FIXED_S + 40e9 / 2e9 + 40e9 / 25e9)
    compiled = presets.engine_startup(40e9, 25.0, compile=True)
    assert compiled.seconds == pytest.approx(eager.seconds + presets.ENGINE_COMPILE_S)
    assert eager.price(8) == pytest.approx(8 * eager.seconds)
    assert eager.price(8, restarts=3) == pytest.approx(11 * eager.seconds)
    with pytest.raises(ValueError, match="restarts"):
        eager.price(8, restarts=-1)
