"""The Hydra config: composition of the trainer modes, and clear errors before any Ray work."""

import pytest
from hydra.errors import ConfigCompositionException

from verl_digen.config import ConfigError, RunConfig, compose, validate
from verl_digen.config.schema import load


def _compose(*overrides: str) -> RunConfig:
    return compose(list(overrides))


def test_default_config_is_the_tiny_digen_run():
    cfg = _compose()
    validate(cfg)
    assert cfg.trainer.mode == "digen" and cfg.digen.tag.policy == "bts" and cfg.digen.gap.enable
    assert (cfg.resources.generator.workers, cfg.resources.trainer.workers) == (1, 1)
    assert cfg.model.arch == "flux" and cfg.model.path is None and cfg.trainer.device == "cpu"
    sched = cfg.schedule_config()
    assert sched.prompts * sched.group_size == cfg.batch == 16
    assert cfg.worker_config().sampler.selection.k == 4


@pytest.mark.parametrize("mode, policy, degree", [("colocated", "never", 1), ("separate", "never", 1)])
def test_trainer_group_selects_the_baselines(mode, policy, degree):
    cfg = _compose(f"trainer={mode}")
    validate(cfg)
    assert cfg.trainer.mode == mode and cfg.digen.tag.policy == policy and cfg.digen.tsp.degree == degree
    if mode == "separate":
        assert cfg.schedule_config().mode == "separate"


def test_overrides_reach_the_worker_and_schedule_configs():
    cfg = _compose("digen.tsp.degree=2", "digen.tag.policy=static:2", "digen.tcss.staleness=0.5",
                   "model.lora_rank=4", "rollout.noise_level=0.5", "digen.gap.enable=false",
                   "rollout.micro_batch_size=4")
    validate(cfg)
    w, s = cfg.worker_config(), cfg.schedule_config()
    assert w.tsp_degree == 2 and w.policy.lora_rank == 4 and w.sampler.eta == 0.5
    assert s.tsp_degree == 2 and s.policy == "static:2" and s.staleness == 0.5 and s.partition == "batch"


def test_one_loads_values_do_not_reach_the_next():
    """``load`` merges onto a schema built once per process: a merge must leave it as built (a partial config, as a
    Python caller passes, takes every other key from the schema)."""
    default = RunConfig()
    tuned = load({"actor": {"lr": 0.5}, "model": {"lora_rank": 4}})
    assert (tuned.actor.lr, tuned.model.lora_rank) == (0.5, 4)
    again = load({})
    assert (again.actor.lr, again.model.lora_rank) == (default.actor.lr, default.model.lora_rank)


def test_unknown_trainer_mode_is_rejected_by_hydra():
    with pytest.raises(ConfigCompositionException, match="trainer"):
        _compose("trainer=async")


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.micro_batch_size=3", "rollout.micro_batch_size"),
        ("rollout.n=1", "rollout.n"),
        ("resources.generator.workers=0", "resources.generator.workers"),
        ("resources.trainer.workers=0", "resources.trainer.workers"),
        ("digen.tsp.rows_per_pass=0", "digen.tsp.rows_per_pass"),
        ("model.arch=sdxl", "model.arch"),
        ("reward.name=aesthetics", "reward.name"),
        ("digen.tag.policy=greedy", "digen.tag.policy"),
        ("digen.tcss.staleness=1.5", "digen.tcss.staleness"),
        ("digen.tsp.degree=9", "digen.tsp.degree"),
        ("model.lora_rank=-1", "model.lora_rank"),
        ("rollout.sde_type=ddim", "rollout.sde_type"),
        ("rollout.cps_log_prob=l2", "rollout.cps_log_prob"),
        ("rollout.sde_type=cps trainer.device=cuda rollout.backend=vllm model.path=/ckpt rollout.vllm_pipeline=a.B",
         "rollout.cps_log_prob"),  # verl-omni's pipelines record CPS log-probs as squared errors
        ("rollout.train_steps=7", "rollout.train_steps"),
        ("trainer.resume_from=/nonexistent/ckpt", "trainer.resume_from"),
        ("data.train_files=/nonexistent/prompts.txt", "data.train_files"),
        ("model.latent_size=7", "model.latent_size"),
        ("model.num_frames=5", "model.num_frames"),  # frames for an image model
        ("model.arch=wan model.path=Wan-AI/Wan2.1-T2V-14B-Diffusers model.num_frames=24", "model.num_frames"),
        ("model.arch=hunyuan_video model.path=hunyuanvideo-community/HunyuanVideo", "model.num_frames"),
        ("digen.sync.backend=nccl_p2p", "digen.sync.backend"),
        ("algorithm.adv_std=batch", "algorithm.adv_std"),
        ("digen.gap.enable=false", "rollout.micro_batch_size"),  # batch layout needs whole prompts
        ("rollout.guidance_scale=0.5", "rollout.guidance_scale"),
        ("rollout.backend=vllm", "rollout.backend"),  # vLLM-Omni needs trainer.device=cuda
        ("rollout.backend=vllm trainer.device=cuda", "model.path"),  # and a real checkpoint to serve
        ("rollout.backend=vllm trainer.device=cuda model.path=/ckpt data.val_files=/v.txt", "data.val_files"),
        ("rollout.backend=vllm trainer.device=cuda model.path=/ckpt rollout.sde_type=ode", "rollout.sde_type"),
        ("rollout.backend=vllm trainer.device=cuda model.path=/ckpt rollout.vllm_memory_fraction=0",
         "rollout.vllm_memory_fraction"),
        ("rollout.backend=vllm trainer.device=cuda model.path=/ckpt rollout.vllm_memory_fraction=1.5",
         "rollout.vllm_memory_fraction"),
        ("rollout.backend=tensorrt", "rollout.backend"),
        ("rollout.backend=vllm trainer.device=cuda model.path=/ckpt trainer=colocated", "rollout.backend"),  # no engine
        ("reward.weights={latent_mean:1.0} reward.kwargs={target:1.0}", "reward.kwargs"),
        ("digen.profile=no-such-preset", "digen.profile"),
    ],
)
def test_bad_values_name_their_key(override, key):
    cfg = _compose(*override.split())
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key and key in str(err.value)


def test_the_collective_sync_validates_with_the_vllm_backend(tmp_path):
    """Issue 43: a collective pickup lands in the engine (workers/vllm_backend.EngineSink): the pair is valid."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workers"))
    from vllm_engine_helpers import save_tiny_sd3

    ckpt = save_tiny_sd3(tmp_path / "sd3")
    validate(_compose("model.arch=sd3", f"model.path={ckpt}", "rollout.backend=vllm", "trainer.device=cuda",
                      "digen.sync.backend=collective"))


def test_staleness_needs_digen_mode():
    with pytest.raises(ConfigError, match="digen.tcss.staleness"):
        validate(_compose("trainer=separate", "digen.tcss.staleness=0.25"))


def test_colocated_batch_must_split_over_all_workers():
    with pytest.raises(ConfigError, match="data.train_batch_size"):
        validate(_compose("trainer=colocated", "resources.generator.workers=2", "resources.trainer.workers=1"))


def test_unknown_keys_and_wrong_types_name_themselves():
    with pytest.raises(ConfigError, match="rollout.n"):
        _compose("rollout.n=four")
    with pytest.raises(ConfigCompositionException):
        _compose("digen.tag.polcy=bts")  # not in the YAML: Hydra refuses a new key without '+'
    with pytest.raises(ConfigError, match="polcy"):
        _compose("+digen.tag.polcy=bts")  # in the YAML but not in the schema


def test_bad_config_fails_before_ray_starts():
    import ray

    from verl_digen.driver.runtime import DigenRuntime

    cfg = _compose("rollout.micro_batch_size=5")
    was_running = ray.is_initialized()
    with pytest.raises(ConfigError, match="rollout.micro_batch_size"):
        DigenRuntime(cfg)
    assert ray.is_initialized() == was_running


def test_update_units_reach_the_schedule_and_must_divide_the_step():
    cfg = _compose("rollout.n=2", "rollout.micro_batch_size=2", "digen.update_units=2")  # 4 units per step
    validate(cfg)
    assert cfg.schedule_config().update_units == 2 and cfg.schedule_config().update_size(1) == 2
    for bad, expected in (("digen.update_units=3", "a divisor of the step's 4 release unit"),
                          ("digen.update_units=0", "an integer >= 1")):
        with pytest.raises(ConfigError, match=expected) as err:
            validate(_compose("rollout.n=2", "rollout.micro_batch_size=2", bad))
        assert err.value.key == "digen.update_units"
    with pytest.raises(ConfigError, match="digen.update_units"):
        validate(_compose("trainer=separate", "digen.update_units=2"))


def test_any_trainer_pool_size_validates_with_any_update_size():
    """The ranks split an update's (sample x step) rows, not its samples (``schedule.rows``), so an update
    need not divide over the trainer pool: one sample per update over 2 or 3 ranks is a valid run."""
    base = ("rollout.n=2", "rollout.micro_batch_size=1")
    for extra in (("resources.trainer.workers=2", "digen.update=micro_batch"),
                  ("resources.trainer.workers=3", "digen.update=unit"),
                  ("resources.trainer.workers=3", "digen.tsp.rows_per_pass=1")):
        cfg = _compose(*base, *extra)
        validate(cfg)
        assert cfg.worker_config().rows_per_pass == cfg.digen.tsp.rows_per_pass
        assert cfg.schedule_config().rows_per_pass == cfg.digen.tsp.rows_per_pass


@pytest.mark.parametrize("overrides,on", [
    ([], False),  # diffusers on both sides, one dtype: the rollout's log-probs are the trainer's
    (["model.dtype=bfloat16", "actor.param_dtype=float32"], True),  # the trainer computes in another dtype
    (["model.dtype=bfloat16", "actor.param_dtype=float32", "digen.tcss.staleness=1"], False),  # TCSS keeps them
    (["actor.recompute_log_prob=true"], True),
    (["actor.recompute_log_prob=false", "model.dtype=bfloat16", "actor.param_dtype=float32"], False),
])
def test_recompute_log_prob_auto_and_explicit(overrides, on):
    from verl_digen.config.plan import resource_plan
    from verl_digen.config.schema import recompute_log_prob

    cfg = compose(overrides)
    validate(cfg)
    assert recompute_log_prob(cfg)[0] is on and cfg.worker_config().loss.recompute_old_log_prob is on
    plan = resource_plan(cfg).render()
    assert ("old: recomputed by the trainer" in plan) is on and ("old: the rollout's" in plan) is (not on)
    vllm = compose(["rollout.backend=vllm"])  # another engine: on (validated only with trainer.device=cuda)
    assert recompute_log_prob(vllm) == (True, "auto: the rollout engine (vllm) is not the trainer's")
