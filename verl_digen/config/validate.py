"""``validate``: the one check of a run config before anything starts. Every error is a ``ConfigError``
naming the key, the bad value and what is allowed, so a typo costs a second instead of a cluster
start-up. The checks that look past a value's type live beside it: ``checks.py`` (numbers, sizes, files,
resume), ``memory.py`` (the step's memory against the GPUs) and ``user_inputs.py`` (prompts, custom
rewards, the VLM judge). Whether the pools fit the Ray cluster is checked once Ray is up
(``driver/pools.py``).
"""

from __future__ import annotations

import os
from typing import Any

from verl_digen.algo.algorithms import ADV_MODES, ALGORITHMS, OLD_POLICY_SCHEDULES, loss_mode
from verl_digen.algo.mix_grpo import STRATEGIES
from verl_digen.archs import arch_facts, canonical_arch, known_archs
from verl_digen.config import checks, memory, user_inputs
from verl_digen.config.errors import ConfigError
from verl_digen.config.schema import (
    DEVICES,
    LOG_FORMAT_CHOICES,
    LOGGERS,
    RECOMPUTE_CHOICES,
    ROLLOUT_BACKENDS,
    ActorConfig,
    AlgorithmConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    checked_schedule_config,
)
from verl_digen.defaults import LOG_PROB_KINDS, SDE_KINDS, SELECTION_KINDS, STD_ESTIMATORS, STD_SCOPES
from verl_digen.dtypes import PRECISIONS
from verl_digen.schedule.config import COLOCATED, DIGEN, MODES
from verl_digen.schedule.tag_policy import UnknownTagPolicy, parse_policy, tag_policy_usage

MAX_BUCKET_MB = 65536  # a 64 GiB bucket: more than any model verl-digen runs, so larger is a typo


def _positive(key: str, value: Any, allow_zero: bool = False) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value >= 1)
    if not ok:
        raise ConfigError(key, value, "an integer >= 0" if allow_zero else "an integer >= 1")


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, f"one of {', '.join(allowed)}")


def _check_sequence_parallel(cfg: RunConfig) -> None:
    key, size = "actor.ulysses_sequence_parallel_size", cfg.actor.ulysses_sequence_parallel_size
    _positive(key, size)
    problem = checks.sequence_parallel_problem(cfg, size)
    if problem:
        raise ConfigError(key, size, problem)


def _check_frames(m: ModelConfig) -> None:
    """Frames must fit the architecture: none for image models; for a pretrained video model, pixel
    frames of the form 4k + 1 (Wan's and HunyuanVideo's VAEs compress time 4x causally: 25 -> 7)."""
    arch = canonical_arch(m.arch)
    video = arch_facts(arch).video
    if not video and m.num_frames is not None:
        raise ConfigError("model.num_frames", m.num_frames, f"null for the image model '{arch}'")
    if video and m.path is not None:
        nf = m.num_frames
        if not (isinstance(nf, int) and not isinstance(nf, bool) and nf >= 1 and (nf - 1) % 4 == 0):
            raise ConfigError("model.num_frames", nf, f"pixel frames 4k + 1 (e.g. 25 -> 7 latent frames) for "
                              f"the pretrained video model '{arch}'")
    elif m.num_frames is not None:
        _positive("model.num_frames", m.num_frames)


def _check_vllm(cfg: RunConfig) -> None:
    """``rollout.backend=vllm``: what the vLLM-Omni rollout (workers/vllm_backend.py) cannot serve."""
    from verl_digen.rollout.omni.request import VERL_OMNI_SDE_TYPES

    r = cfg.rollout
    f = r.vllm_memory_fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
        raise ConfigError("rollout.vllm_memory_fraction", f, "a fraction of the GPU in (0, 1]")
    if cfg.trainer.device != "cuda":
        raise ConfigError("rollout.backend", r.backend, "'diffusers' unless trainer.device=cuda (vLLM-Omni needs GPUs)")
    if cfg.trainer.mode == COLOCATED:  # the ranks would generate through their own weights and never start it
        raise ConfigError("rollout.backend", r.backend, "'diffusers' with trainer=colocated (its ranks generate "
                          "through their own weights; the vLLM-Omni engine runs on a generator pool: trainer=digen "
                          "or separate, e.g. a recipe's -digen variant)")
    if cfg.model.path is None:
        raise ConfigError("model.path", cfg.model.path, "a local diffusers checkpoint with rollout.backend=vllm "
                          "(the engine serves real weights)")
    if cfg.sde_type() not in VERL_OMNI_SDE_TYPES:
        raise ConfigError("rollout.sde_type", cfg.sde_type(), f"one of {', '.join(VERL_OMNI_SDE_TYPES)} with rollout."
                          "backend=vllm")
    if r.vllm_pipeline is not None and cfg.sde_type() == "cps" and r.cps_log_prob != "squared_error":
        raise ConfigError("rollout.cps_log_prob", r.cps_log_prob, "squared_error with rollout.vllm_pipeline (verl-"
                          "omni's pipelines record CPS log-probs in that form)")
    if cfg.data.val_files is not None:
        raise ConfigError("data.val_files", cfg.data.val_files, "null with rollout.backend=vllm (the validation "
                          "pass runs on the diffusers rollout, which the generator does not build then)")


def _check_algorithm(cfg: RunConfig) -> None:
    """``algorithm.name``: a known algorithm, and the keys its loss reads."""
    name = cfg.algorithm.name
    if name is not None and name not in ALGORITHMS:
        raise ConfigError("algorithm.name", name, f"null or one of {', '.join(ALGORITHMS)}")
    fixed = None if name is None else ALGORITHMS[name].sde
    if fixed is not None and cfg.rollout.sde_type not in (RolloutConfig.sde_type, fixed):
        raise ConfigError("rollout.sde_type", cfg.rollout.sde_type,
                          f"{fixed} (the SDE of algorithm.name={name}) or the default; or set algorithm.name to null "
                          f"or to {cfg.rollout.sde_type}")
    if loss_mode(name) in ("flow_grpo", "diffusion_nft"):  # DiffusionNFT's keys: _check_nft
        return
    if cfg.sde_type() == "cps" and cfg.rollout.cps_log_prob != "gaussian":
        raise ConfigError("rollout.cps_log_prob", cfg.rollout.cps_log_prob,
                          f"gaussian with algorithm.name={name} (its loss reads the Gaussian density's ratio)")
    t = cfg.actor.kl_mask_threshold
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
        raise ConfigError("actor.kl_mask_threshold", t, "a finite number >= 0 (the per-element KL(new || old))")


#: DiffusionNFT's own keys, read only with algorithm.name=diffusion_nft
NFT_KEYS = ("actor.mix_beta", "actor.adv_clip_max", "actor.adaptive_weight_min", "algorithm.adv_mode",
            "algorithm.old_policy_decay_schedule", "algorithm.old_policy_decay", "algorithm.old_policy_update_interval")


def _check_nft(cfg: RunConfig) -> None:
    """DiffusionNFT: its keys only with ``algorithm.name=diffusion_nft``; with it, their ranges, and the keys of
    an SDE rollout or a ratio loss that would mean nothing (an ODE rollout, no log-prob, no ratio) refused."""
    defaults = {"actor": ActorConfig(), "algorithm": AlgorithmConfig(), "rollout": RolloutConfig()}

    def value(key: str) -> Any:
        section, name = key.split(".")
        return getattr(getattr(cfg, section), name), getattr(defaults[section], name)

    if cfg.algorithm.name != "diffusion_nft":
        for key in NFT_KEYS:
            got, default = value(key)
            if got != default:
                raise ConfigError(key, got, f"{default} (the default) unless algorithm.name=diffusion_nft: only "
                                  "DiffusionNFT reads it")
        return
    a, g = cfg.actor, cfg.algorithm
    checks._finite("actor.mix_beta", a.mix_beta, 0, True, " (beta of DiffusionNFT's implicit policies)")
    checks._finite("actor.adv_clip_max", a.adv_clip_max, 0, True,
                   " (the advantage clamp of the optimality probability)")
    checks._finite("actor.adaptive_weight_min", a.adaptive_weight_min, 0, False)
    _choice("algorithm.adv_mode", g.adv_mode, ADV_MODES)
    _choice("algorithm.old_policy_decay_schedule", g.old_policy_decay_schedule, tuple(OLD_POLICY_SCHEDULES))
    d = g.old_policy_decay
    if d is not None and not (checks._real(d) and 0 <= d <= 1):
        raise ConfigError("algorithm.old_policy_decay", d, "null (the schedule's) or a number in [0, 1]")
    _positive("algorithm.old_policy_update_interval", g.old_policy_update_interval)
    why = "DiffusionNFT's rollout is a plain ODE that keeps only clean samples"
    for key, meaning in (("rollout.sde_type", "there is no SDE"), ("rollout.noise_level", "there is no noise"),
                         ("actor.clip_ratio", "its loss has no ratio to clip"),
                         ("actor.kl_dt_weighted", "its reference term is a velocity MSE (actor.kl_coef)")):
        got, default = value(key)
        if got != default:
            raise ConfigError(key, got, f"{default} (the default) with algorithm.name=diffusion_nft: {meaning}")
    if str(a.recompute_log_prob).lower() == "true":
        raise ConfigError("actor.recompute_log_prob", a.recompute_log_prob,
                          f"auto or false with algorithm.name=diffusion_nft: {why}, with no log-prob")
    if cfg.rollout.selection not in ("first_k", "random_k"):
        raise ConfigError("rollout.selection", cfg.rollout.selection, "random_k (or the default, which means it) or "
                          f"first_k with algorithm.name=diffusion_nft: {why}, with no SDE window")
    if cfg.rollout.shared_group_noise:
        raise ConfigError("rollout.shared_group_noise", True, "false with algorithm.name=diffusion_nft: an ODE "
                          "rollout from one initial noise gives a group identical samples (zero advantages)")
    if cfg.rollout.backend != "diffusers":
        raise ConfigError("rollout.backend", cfg.rollout.backend, "diffusers with algorithm.name=diffusion_nft "
                          "(verl-digen's vLLM-Omni pipelines record SDE transitions, not clean-only samples)")


def _check_mix_grpo(cfg: RunConfig) -> None:
    """MixGRPO's window keys: read only with ``algorithm.name=mix_grpo``, and a window that fits and slides."""
    r, default = cfg.rollout, RolloutConfig()
    keys = ("sample_strategy", "iters_per_group", "sde_window_seed")
    if cfg.algorithm.name != "mix_grpo":
        for key in keys:
            if getattr(r, key) != getattr(default, key):
                raise ConfigError(f"rollout.{key}", getattr(r, key), f"{getattr(default, key)} (the default) unless "
                                  "algorithm.name=mix_grpo: only MixGRPO slides its SDE window")
        return
    _choice("rollout.sample_strategy", r.sample_strategy, STRATEGIES)
    _positive("rollout.iters_per_group", r.iters_per_group)
    _positive("rollout.sde_window_seed", r.sde_window_seed, allow_zero=True)
    if r.selection not in (default.selection, "window"):
        raise ConfigError("rollout.selection", r.selection, "window (or the default) with algorithm.name=mix_grpo: "
                          "its trained steps are the sliding SDE window")
    if r.window_start is not None:
        raise ConfigError("rollout.window_start", r.window_start, "null with algorithm.name=mix_grpo: the window "
                          "slides (bound it with rollout.window_range)")
    lo, hi = r.window_range if r.window_range is not None else (0, r.num_steps)
    if r.timestep_fraction is None and not (isinstance(r.train_steps, int) and 1 <= r.train_steps <= hi - lo):
        raise ConfigError("rollout.train_steps", r.train_steps, f"an integer in [1, {hi - lo}]: MixGRPO's window "
                          f"size (verl-omni's sde_window_size) within steps [{lo}, {hi}) (rollout.window_range, "
                          "else [0, rollout.num_steps])")


def _check_reward_names(cfg: RunConfig) -> None:
    """``reward.name`` / ``reward.weights`` name registered rewards, read without torch (``rewards/names.py``):
    a dry run builds no reward."""
    from verl_digen.rewards.names import reward_names

    known = reward_names()
    for name in list(cfg.reward.weights) if cfg.reward.weights else [cfg.reward.name]:
        if name not in known:
            raise ConfigError("reward.name" if not cfg.reward.weights else "reward.weights", name,
                              f"one of {', '.join(known)}")


def validate(cfg: RunConfig) -> list[str]:
    """Check every setting the runtime reads; raise ``ConfigError`` on the first bad one, and return
    warnings (e.g. fewer prompts than a step's batch) for the caller to print. Files are probed here
    (prompt files read, output dirs written to, checkpoints' metadata read), so nothing fails after Ray
    starts. (Whether the pools fit the Ray cluster is checked once Ray is up: ``pools.check_cluster_fits``.)"""
    t, r, d = cfg.trainer, cfg.rollout, cfg.digen
    checks.numbers(cfg)  # NaN / Inf / sign of every float first: later checks compute with them
    _choice("trainer.mode", t.mode, MODES)
    _choice("trainer.device", t.device, DEVICES)
    _positive("trainer.total_steps", t.total_steps)
    for name in t.logger:
        _choice("trainer.logger", name, LOGGERS)
    _choice("trainer.log_format", t.log_format, LOG_FORMAT_CHOICES)
    if "tensorboard" in t.logger:  # its event directory is named after the run
        for key, name in (("trainer.project_name", t.project_name), ("trainer.experiment_name", t.experiment_name)):
            if not (isinstance(name, str) and name.isascii() and name.isprintable() and name.strip()
                    and "/" not in name):
                raise ConfigError(key, name, "a non-empty printable ASCII name without '/' with "
                                  "trainer.logger=[tensorboard] (it names the event directory)")
    if "wandb" in t.logger and (why := checks.wandb_unready()):
        raise ConfigError("trainer.logger", list(t.logger), f"loggers that can start here: wandb {why}")
    checks.ray_address(cfg.ray.address)
    if t.resume_from is not None and t.resume_from != "auto" and not os.path.isdir(t.resume_from):
        raise ConfigError("trainer.resume_from", t.resume_from, "an existing checkpoint directory, or auto")
    try:
        canonical_arch(cfg.model.arch)
    except ValueError:
        raise ConfigError("model.arch", cfg.model.arch, f"one of {', '.join(known_archs())}") from None
    _choice("model.dtype", cfg.model.dtype, PRECISIONS)
    _positive("model.lora_rank", cfg.model.lora_rank, allow_zero=True)
    for key, side in (("model.latent_size", cfg.model.latent_size), ("model.latent_width", cfg.model.latent_width)):
        if side is not None and (isinstance(side, bool) or side < 2 or side % 2):
            raise ConfigError(key, side, "a positive even number (latents are 2x2-packed)")
    if cfg.model.latent_width is not None and cfg.model.latent_size is None:
        raise ConfigError("model.latent_width", cfg.model.latent_width, "null unless model.latent_size (the latent "
                          "height) is set too: a null latent_size means the architecture's default square")
    _check_frames(cfg.model)
    _check_reward_names(cfg)
    _positive("data.train_batch_size", cfg.data.train_batch_size)
    if cfg.data.train_files is not None and not os.path.isfile(cfg.data.train_files):
        raise ConfigError("data.train_files", cfg.data.train_files, "an existing .txt, .jsonl or .parquet prompt file")
    _positive("rollout.n", r.n)
    if r.n < 2:
        raise ConfigError("rollout.n", r.n, "a group size >= 2 (GRPO advantages compare samples of a prompt)")
    _positive("rollout.micro_batch_size", r.micro_batch_size)
    _choice("rollout.sde_type", r.sde_type, SDE_KINDS)
    _check_algorithm(cfg)
    _choice("rollout.cps_log_prob", r.cps_log_prob, LOG_PROB_KINDS)
    _choice("rollout.selection", r.selection, SELECTION_KINDS)
    _positive("rollout.num_steps", r.num_steps)
    _choice("rollout.backend", r.backend, ROLLOUT_BACKENDS)
    if r.backend == "vllm":
        _check_vllm(cfg)
    if cfg.reward.weights and cfg.reward.kwargs:
        raise ConfigError("reward.kwargs", dict(cfg.reward.kwargs), "null when reward.weights names several rewards")
    wr = r.window_range
    if wr is not None and not (len(wr) == 2 and all(isinstance(v, int) for v in wr)):
        raise ConfigError("rollout.window_range", r.window_range, "null or [lo, hi] (two step indices)")
    if wr is not None and not 0 <= wr[0] < wr[1] <= r.num_steps:
        raise ConfigError("rollout.window_range", list(wr), f"null or [lo, hi] with 0 <= lo < hi <= {r.num_steps} "
                          "(rollout.num_steps): the SDE window lies in steps [lo, hi)")
    _check_mix_grpo(cfg)
    _check_nft(cfg)
    try:
        k = cfg.trained_steps()
    except ValueError as err:
        raise ConfigError("rollout.train_steps", r.train_steps, str(err)) from None
    if d.tsp.degree is not None and not (isinstance(d.tsp.degree, int) and 1 <= d.tsp.degree <= k):
        raise ConfigError("digen.tsp.degree", d.tsp.degree, f"null or an integer in [1, {k}] (the trained steps)")
    try:
        parse_policy(d.tag.policy)
    except UnknownTagPolicy:
        raise ConfigError("digen.tag.policy", d.tag.policy, f"a registered TAG policy: {tag_policy_usage()}") from None
    except ValueError as err:
        raise ConfigError("digen.tag.policy", d.tag.policy, f"one of {tag_policy_usage()} ({err})") from None
    from verl_digen.workers.sync_spec import sync_backend_names  # no ray, no torch

    _choice("digen.sync.backend", d.sync.backend, sync_backend_names())
    if not (isinstance(d.sync.bucket_mb, int) and not isinstance(d.sync.bucket_mb, bool)
            and 1 <= d.sync.bucket_mb <= MAX_BUCKET_MB):
        raise ConfigError("digen.sync.bucket_mb", d.sync.bucket_mb,
                          f"an integer number of MiB in [1, {MAX_BUCKET_MB}] (the collective sync's bucket size)")
    _choice("algorithm.adv_std", cfg.algorithm.adv_std, STD_SCOPES)
    _choice("algorithm.std_estimator", cfg.algorithm.std_estimator, STD_ESTIMATORS)
    if cfg.algorithm.adv_std == "batch" and t.mode == DIGEN:
        raise ConfigError("algorithm.adv_std", "batch",
                          "'group' with trainer=digen (batch-wide std needs the whole batch before any update)")
    mini = cfg.actor.ppo_mini_batch_size
    if mini is not None and (isinstance(mini, bool) or not 1 <= mini <= cfg.data.train_batch_size
                             or cfg.data.train_batch_size % mini):
        raise ConfigError("actor.ppo_mini_batch_size", mini, f"null or a divisor of data.train_batch_size="
                          f"{cfg.data.train_batch_size} (prompts per optimizer step)")
    recompute = str(cfg.actor.recompute_log_prob).lower()
    if recompute not in RECOMPUTE_CHOICES:
        raise ConfigError("actor.recompute_log_prob", cfg.actor.recompute_log_prob, "one of auto, true, false")
    if recompute == "true" and d.tcss.staleness > 0:
        raise ConfigError("actor.recompute_log_prob", cfg.actor.recompute_log_prob,
                          f"auto or false while digen.tcss.staleness={d.tcss.staleness} (a stale row's ratio "
                          "against its rollout log-prob is its importance correction; the trainer's own would "
                          "drop it)")
    gen, trn = cfg.resources.generator.workers, cfg.resources.trainer.workers
    _positive("resources.generator.workers", gen)
    _positive("resources.trainer.workers", trn)
    _check_sequence_parallel(cfg)
    # every data-parallel split must be even: FSDP forwards and backwards are collective
    if t.mode == COLOCATED:
        if cfg.batch % cfg.total_workers:
            raise ConfigError("data.train_batch_size", cfg.data.train_batch_size,
                              f"a batch ({cfg.batch} samples) divisible by all {cfg.total_workers} colocated workers")
    if d.profile is not None:
        from verl_digen.schedule.presets import names, resolve

        try:
            resolve(d.profile)
        except ValueError as err:
            raise ConfigError("digen.profile", d.profile,
                              f"a profile file or a preset name ({', '.join(names())})") from err
    if d.plan is not None and d.plan != "auto":
        raise ConfigError("digen.plan", d.plan, "null or 'auto' (the planner's configuration, resolved at start)")
    if d.plan == "auto" and not d.profile:
        raise ConfigError("digen.plan", d.plan, "null unless digen.profile names the costs to plan with "
                          "(a profile file or a preset)")
    checks.sizes(cfg)  # upper bounds and the step's memory, before anything is sized by the batch
    checks.inert_keys(cfg)
    checked_schedule_config(cfg)  # the scheduler's own checks: layout, staleness, update, policy
    warnings = memory.check_keys(cfg)  # and a warning for 16-bit master weights of a full fine-tune
    memory.check_fits(cfg)  # the memory plan against each pool's GPU memory (declared, else the preset's hardware)
    warnings += checks.files_and_resume(cfg)  # writable dirs, prompt files, checkpoint ownership and resume
    return warnings + _preset_model(cfg) + user_inputs.check(cfg)  # validation prompts, custom reward, VLM judge


def _preset_model(cfg: RunConfig) -> list[str]:
    """A preset prices its own model: say so when the run trains the tiny random-weight one instead."""
    from verl_digen.schedule import presets

    name = cfg.digen.profile
    if cfg.model.path is not None or not name or name not in presets.names():
        return []
    spec = presets.get(name).spec
    if spec is None:
        return []
    return [f"digen.profile={name} prices {spec.model.name} ({spec.model.params_b:g}B parameters) on the preset's "
            f"GPUs, not this run's tiny random-weight {cfg.model.arch} (model.path=null): the predicted step "
            "times are that model's; measure this run's own profile for its numbers (docs/metrics.md)"]
