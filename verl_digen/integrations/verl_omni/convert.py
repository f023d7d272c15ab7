"""verl-omni config -> verl-digen ``RunConfig``: the key mapping, conversion notes, and the verl-omni keys
that are not converted (docs/migrating-from-verl-omni.md has the table).

Imports only the standard library at import time (OmegaConf and verl-digen's config load lazily).
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from verl_digen import dtypes  # standard library only
from verl_digen.archs import ARCHS, guess_arch, known_archs, sequence_parallel_archs  # standard library only

logger = logging.getLogger(__name__)

# verl-omni's rollout.algo.sde_type -> verl-digen's rollout.sde_type (same SDE step, same noise_level role)
SDE_TYPES = {"sde": "flow_grpo", "cps": "cps", "dance_sde": "dance_grpo"}
VAE_SCALE_FACTOR = 8  # verl-omni's default model.vae_scale_factor (pixels per latent cell)
PIPELINE_SIDE = 512  # verl-omni's default rollout.pipeline.height and width (pixels)

ARR = "actor_rollout_ref"
#: verl-omni's multi-reward manager: its names in reward.reward_manager.name, and its placeholder function's module
MULTI_MANAGERS = ("MultiVisualRewardManager", "multi")
MULTI_PLACEHOLDER = "reward_loop.reward_manager.multi"
DEVICES = {"cuda": "cuda", "gpu": "cuda", "cpu": "cpu"}  # verl-omni's trainer.device -> verl-digen's
LOSS_MODES = ("flow_grpo", "dance_grpo", "grpo_guard", "flow_dppo")  # verl-omni loss modes verl-digen implements
ADV_ESTIMATORS = ("flow_grpo", "dance_grpo")  # verl-omni's GRPO group advantages (every loss above takes them)
OLD_MEAN_LOSSES = ("grpo_guard", "flow_dppo")  # carried to algorithm.name (the loss reads the old policy's mean)
MIX_GRPO = "mix_grpo"  # model.algorithm only: FlowGRPO's loss in MixGRPO's sliding window (algorithm.name)
MIX_KEYS = ("sample_strategy", "iters_per_group", "sde_window_seed")  # its window schedule, same names
NFT = "diffusion_nft"  # model.algorithm and loss_mode: DiffusionNFT (algorithm.name), verl-omni's direct_preference
#: DiffusionNFT's options: verl-omni's key under ARR.actor.diffusion_loss or algorithm -> verl-digen's key
NFT_KEYS = {"diffusion_loss.mix_beta": "actor.mix_beta", "diffusion_loss.adv_clip_max": "actor.adv_clip_max",
            "diffusion_loss.adaptive_weight_min": "actor.adaptive_weight_min",
            "diffusion_loss.ref_kl_coef": "actor.kl_coef", "adv_mode": "algorithm.adv_mode",
            "old_policy_decay_schedule": "algorithm.old_policy_decay_schedule",
            "old_policy_decay": "algorithm.old_policy_decay",
            "old_policy_update_interval": "algorithm.old_policy_update_interval"}
DEFAULT_WINDOW_RANGE = (0, 5)  # verl-omni's rollout adapters' sde_window_range when the config leaves it null
# an architecture's model-path hints and its real classifier-free guidance key (guidance_scale, or Qwen-Image's
# true_cfg_scale) are its facts: ArchFacts.verl_omni_hints / verl_omni_cfg_key (verl_digen/archs.py)
# keys that verl-omni's own entry point consumes before the trainer mode runs (they take effect as they are)
ENTRY_KEYS = ("ray_kwargs", "transfer_queue", "trainer.use_v1", "trainer.v1.trainer_mode", "hydra",
              f"{ARR}.rollout.agent.agent_loop_manager_class")
# top-level sections that exist only in verl-digen's schema (verl-omni has none of these names)
DIGEN_ONLY_SECTIONS = ("model", "rollout", "actor", "resources", "digen")
SEPARATE_ASYNC = "trainer.v1.separate_async"  # verl-omni's separate_async trainer's keys
#: same-named keys that the mapping alone decides (verl-omni's placeholder ``val_files`` default is used
#: only when ``test_freq`` > 0, where the mapping carries both)
NOT_CARRIED = frozenset({"data.val_files", "trainer.test_freq", "trainer.log_val_generations"})


def _get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _default_vae_scale(arch: str | None) -> int:
    """Pixels per latent cell when the verl-omni config leaves ``model.vae_scale_factor`` unset: the
    architecture's own VAE compression (Wan2.2's is 16x), else verl-omni's default of 8."""
    if arch is None:
        return VAE_SCALE_FACTOR
    return int(ARCHS[arch].vae_factors[0])


def _guess_arch(path: str | None) -> str | None:
    low = (path or "").lower()
    if "edit" in low:  # image-editing variants (Qwen-Image-Edit) take an input image: no adapter here
        return None
    return guess_arch(low)


def _refuse(key: str, value: Any, expected: str) -> Exception:
    from verl_digen.config.errors import ConfigError

    return ConfigError(key, value, expected)


def _scheduler_config(path: str | None) -> tuple[dict[str, Any] | None, str]:
    """The model's ``scheduler/scheduler_config.json``: from a local pipeline folder, else from the Hugging
    Face cache (never downloaded here). Returns (config or None, where it was looked for)."""
    import json

    if not path:
        return None, "no model path"
    local = os.path.join(os.path.expanduser(path), "scheduler", "scheduler_config.json")
    if os.path.isfile(local):
        with open(local) as handle:
            return json.load(handle), local
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "scheduler/scheduler_config.json")
        if isinstance(cached, str) and os.path.isfile(cached):
            with open(cached) as handle:
                return json.load(handle), cached
    except Exception:  # not a repo id, or huggingface_hub missing
        pass
    return None, f"{local} (and the Hugging Face cache)"


def scheduler_shift(sched: Mapping[str, Any], height: int | None, width: int | None,
                    vae_scale_factor: int = VAE_SCALE_FACTOR, patch: int = 2) -> float:
    """The static sigma shift equivalent to a diffusers flow-match scheduler config at one image size.

    Static: ``shift``. Dynamic (FLUX, Qwen-Image): ``exp(mu)``, with mu interpolated linearly in the image
    token count between (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift), as diffusers'
    pipelines compute it; an exponential time shift with ``exp(mu)`` equals the static shift by that value.
    """
    import math

    if not sched.get("use_dynamic_shifting"):
        return float(sched.get("shift", 1.0))
    h, w = int(height or 512), int(width or 512)
    seq_len = (h // vae_scale_factor // patch) * (w // vae_scale_factor // patch)
    base_len, max_len = float(sched.get("base_image_seq_len", 256)), float(sched.get("max_image_seq_len", 4096))
    base_shift, max_shift = float(sched.get("base_shift", 0.5)), float(sched.get("max_shift", 1.15))
    slope = (max_shift - base_shift) / (max_len - base_len)
    return math.exp(base_shift + slope * (seq_len - base_len))


def _sequence_parallel(get: Callable[[str], Any], put: Callable[..., None], notes: list[str],
                       arch: str | None) -> None:
    """Ulysses: verl-omni sets it in the actor's fsdp_config, verl on the actor itself. verl-digen cuts only the
    video models; for another model the size is left out (it changes memory, not the numbers), with a note."""
    for src in (f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size",
                f"{ARR}.actor.ulysses_sequence_parallel_size"):
        size = get(src)
        if size is None:
            continue
        if int(size) > 1 and arch is not None and arch not in sequence_parallel_archs():
            cut = ", ".join(sequence_parallel_archs())
            notes.append(f"{src}={size}: verl-digen's sequence parallelism cuts only {cut}; "
                         f"{arch} trains without it (the same gradients; the memory plan checks that it fits)")
        else:
            put("actor.ulysses_sequence_parallel_size", int(size), src=src)
        return


def _separate_async_cycle(get: Callable[..., Any], notes: list[str], cfg: Mapping[str, Any]) -> None:
    """verl-omni's separate_async keys, for a script with a standalone rollout pool (the pool itself becomes the
    generator pool in ``to_run_config``).

    ``parameter_sync_step=N``: verl-omni 0.3 trains N PPO mini-batches per outer step against the cycle-start
    policy and syncs the rollout once after them, with ``data.train_batch_size = N x ppo_mini_batch_size``.
    That is verl-digen's global step once ``actor.ppo_mini_batch_size`` is carried: nothing more to set. Any
    other product (verl-omni 0.2 synced every N steps of one mini-batch) is logged: verl-digen syncs after
    every step. ``hybrid_rollout.enable_switch`` (lending the actor's GPUs to generation between steps) is
    verl-digen's TAG, which decides by its own policy. ``rollout.checkpoint_engine.backend`` is replaced by
    verl-digen's own weight sync (``digen.sync.backend``).
    """
    if not _standalone_rollout_gpus(cfg):
        return
    key = f"{SEPARATE_ASYNC}.parameter_sync_step"
    sync_step = get(key)
    batch, mini = _get(cfg, "data.train_batch_size"), _get(cfg, f"{ARR}.actor.ppo_mini_batch_size")
    if sync_step is not None and batch is not None and mini is not None and int(sync_step) * int(mini) != int(batch):
        notes.append(f"{key}={sync_step}: verl-digen syncs the generators' weights once per global step, after its "
                     f"data.train_batch_size / ppo_mini_batch_size = {batch} / {mini} optimizer steps (verl-omni 0.3 "
                     "requires train_batch_size = parameter_sync_step x ppo_mini_batch_size)")
    switch = f"{SEPARATE_ASYNC}.hybrid_rollout"
    if get(f"{switch}.enable_switch"):
        get(switch)  # its thresholds: named in the note
        notes.append(f"{switch}.enable_switch=True: lending the trainer's GPUs to generation is verl-digen's TAG "
                     "(digen.tag.policy with trainer=digen; the colocated and separate baselines do not lend); "
                     f"{switch}.switch_threshold_* and adaptive_switch_threshold are not used (TAG's policy decides)")
    backend = get(f"{ARR}.rollout.checkpoint_engine.backend")
    if backend not in (None, "naive"):
        notes.append(f"{ARR}.rollout.checkpoint_engine.backend={backend!r}: not used; verl-digen sends the trainer's "
                     "weights to the generator pool with its own weight sync (digen.sync.backend)")


def _memory_only_keys(get: Callable[..., Any], notes: list[str]) -> None:
    """verl-omni 0.3's opt-in actor options that change where memory goes or when gradients are communicated,
    not the loss or the gradients: named when on, not converted."""
    if get(f"{ARR}.actor.enable_timestep_staging"):
        notes.append(f"{ARR}.actor.enable_timestep_staging=True: not used (verl-omni keeps the trajectory on the CPU "
                     "and stages it per timestep to save GPU memory); verl-digen's memory plan places its own rows, "
                     "with the same loss and gradients")
    for key in (f"{ARR}.actor.use_no_sync_for_gradient_accumulation",
                f"{ARR}.actor.fsdp_config.use_no_sync_for_gradient_accumulation"):
        if get(key):
            notes.append(f"{key}=True: not used; verl-digen's FSDP2 trainer does not defer gradient synchronization "
                         "across micro-batches (communication and memory only: the same gradients)")


def _nested_lora_rank(get: Callable[..., Any]) -> None:
    """A newer verl's default config puts a nested ``model.lora`` (Megatron's spelling) into verl-omni's. LoRA is
    trained by the flat ``model.lora_rank`` in verl-omni 0.3 and in verl-digen, so a nested rank without it (which
    would train every weight) or disagreeing with it is refused, as verl-omni 0.3 refuses it."""
    flat, nested = get(f"{ARR}.model.lora_rank"), get(f"{ARR}.model.lora.rank")
    if not nested or int(nested) <= 0:
        return
    if not flat or int(flat) <= 0:
        raise _refuse(f"{ARR}.model.lora.rank", nested, f"0 or unset; set {ARR}.model.lora_rank instead (the key "
                      "verl-omni and verl-digen train LoRA by)")
    if int(flat) != int(nested):
        raise _refuse(f"{ARR}.model.lora.rank", nested, f"unset or equal to {ARR}.model.lora_rank={flat} (set only "
                      "one spelling)")


def from_verl_omni_config(cfg: Mapping[str, Any], trainer_workers: int = 1, notes: list[str] | None = None,
                          used: set[str] | None = None, sources: dict[str, str] | None = None) -> dict[str, Any]:
    """Map a (resolved) verl-omni diffusion config onto verl-digen overrides, as ``{dotted key: value}``.

    Only keys whose concept is the same in both are mapped; see docs/migrating-from-verl-omni.md for
    the table. ``trainer_workers`` (verl-digen's trainer pool size) turns verl-omni's per-GPU training
    micro-batch into verl-digen's micro-batch, which the trainer ranks share. Whatever cannot be
    carried over exactly is described, key by key, in ``notes`` (when a list is given); the verl-omni keys
    that were read go into ``used``, and ``sources`` maps each verl-digen key set to the verl-omni key it
    came from (so a refusal of the converted value can name the key the user set). A setting verl-digen
    cannot run at all (another loss, the direct-preference trainer, an unknown dtype) raises
    ``ConfigError`` naming the verl-omni key.
    """
    notes = notes if notes is not None else []
    used = used if used is not None else set()
    sources = sources if sources is not None else {}
    out: dict[str, Any] = {}

    def get(key: str, default: Any = None) -> Any:
        used.add(key)
        return _get(cfg, key, default)

    def put(key: str, value: Any, cast: Callable[[Any], Any] | None = None, src: str | None = None) -> None:
        """``out[key] = value`` unless it is None (unset in verl-omni: verl-digen's default stays)."""
        if value is not None:
            out[key] = cast(value) if cast else value
            if src is not None:
                sources[key] = src

    def take(key: str, src: str, cast: Callable[[Any], Any] | None = None) -> Any:
        """verl-omni's ``src`` carried to ``key`` as it is; returns the value."""
        value = get(src)
        put(key, value, cast, src)
        return value

    # -- what is trained: refuse what verl-digen does not implement, before anything else ---------------
    algorithm = get(f"{ARR}.model.algorithm")
    loss_mode = get(f"{ARR}.actor.diffusion_loss.loss_mode")  # verl-omni's default: model.algorithm
    nft = NFT in (algorithm, loss_mode)
    trainer_type = get("algorithm.trainer_type")
    if trainer_type not in (None, "direct_preference" if nft else "policy_gradient"):
        raise _refuse("algorithm.trainer_type", trainer_type, "direct_preference with loss_mode=diffusion_nft, else "
                      "policy_gradient (verl-digen trains GRPO policy gradients and DiffusionNFT; the direct-"
                      "preference trainer's other losses have no counterpart)")
    if get("algorithm.sample_source") not in (None, "online"):
        raise _refuse("algorithm.sample_source", _get(cfg, "algorithm.sample_source"), "online")
    if nft:
        _diffusion_nft(get, put, out, notes, algorithm, loss_mode)
    for key, value in ((f"{ARR}.model.algorithm", algorithm), (f"{ARR}.actor.diffusion_loss.loss_mode", loss_mode)):
        if nft or value is None:
            continue
        if value not in LOSS_MODES and not (key.endswith(".algorithm") and value == MIX_GRPO):
            raise _refuse(key, value, f"one of {', '.join(LOSS_MODES)} (the losses verl-digen implements; "
                          "see docs/migrating-from-verl-omni.md)")
    mix = algorithm == MIX_GRPO
    if mix and loss_mode not in (None, "flow_grpo"):
        raise _refuse(f"{ARR}.actor.diffusion_loss.loss_mode", loss_mode, "flow_grpo with model.algorithm=mix_grpo "
                      "(MixGRPO trains FlowGRPO's loss, as verl-omni's docs pin it)")
    if mix and get(f"{ARR}.rollout.algo.sde_window_size") is None:
        mix = False
        notes.append(f"{ARR}.model.algorithm=mix_grpo without rollout.algo.sde_window_size: verl-omni's SDE window "
                     "is then the whole trajectory and never slides, which is FlowGRPO; converted as FlowGRPO")
    elif mix:
        put("algorithm.name", MIX_GRPO, src=f"{ARR}.model.algorithm")
    adv = get("algorithm.adv_estimator")
    if adv is not None and adv not in ADV_ESTIMATORS and not (nft and adv == NFT):  # NFT's: its own group map
        raise _refuse("algorithm.adv_estimator", adv, f"one of {', '.join(ADV_ESTIMATORS)} (GRPO group advantages)")
    mode = loss_mode if loss_mode is not None else algorithm
    if mode in OLD_MEAN_LOSSES:
        src = f"{ARR}.actor.diffusion_loss.loss_mode" if loss_mode is not None else f"{ARR}.model.algorithm"
        put("algorithm.name", mode, src=src)
        if get(f"{ARR}.rollout.algo.sde_type") == "cps":
            raise _refuse(f"{ARR}.rollout.algo.sde_type", "cps", f"sde or dance_sde with loss_mode={mode} (verl-"
                          "digen's loss reads the Gaussian density's ratio; verl-omni's CPS log-prob is -(x - mean)^2)")
        if mode == "flow_dppo":
            take("actor.kl_mask_threshold", f"{ARR}.actor.diffusion_loss.kl_mask_threshold", float)
            take("actor.add_kl_coefficient", f"{ARR}.actor.diffusion_loss.add_kl_coefficient", bool)
    for key in (f"{ARR}.actor.use_distill_loss", "distillation.enabled", f"{ARR}.teacher.enabled"):
        if get(key):  # teacher.enabled: verl-omni 0.3's frozen teacher for online policy distillation
            raise _refuse(key, True, "false (distillation has no counterpart in verl-digen)")

    # -- batch and group --------------------------------------------------------------------------
    take("data.train_batch_size", "data.train_batch_size", int)
    take("rollout.n", f"{ARR}.rollout.n", int)
    micro_key = f"{ARR}.actor.ppo_micro_batch_size_per_gpu"
    micro = get(micro_key)
    if micro is not None:
        size, group = int(micro) * int(trainer_workers), out.get("rollout.n")
        if group and size % group and group % size:  # GAP's units: whole groups, or micro-batches that tile one
            notes.append(f"{micro_key}={micro}: verl-digen's micro-batch of {size} samples neither divides nor is a "
                         f"multiple of the group of {group} (GAP trains whole groups); it generates micro-batches "
                         f"of {math.gcd(size, group)} instead (the same loss and gradient: TSP's passes do not "
                         "depend on it)")
            size = math.gcd(size, group)
        put("rollout.micro_batch_size", size, src=micro_key)
    take("actor.ppo_mini_batch_size", f"{ARR}.actor.ppo_mini_batch_size", int)  # prompts per optimizer step
    epochs = get(f"{ARR}.actor.ppo_epochs")
    if epochs not in (None, 1):
        raise _refuse(f"{ARR}.actor.ppo_epochs", epochs, "1 (verl-digen trains each batch once: a second pass "
                      "over a step's trajectories has no counterpart)")
    _separate_async_cycle(get, notes, cfg)

    # -- sampling: steps, noise, SDE, trained window ------------------------------------------------
    steps = take("rollout.num_steps", f"{ARR}.rollout.pipeline.num_inference_steps", int)
    if nft:  # an ODE rollout: no noise, no SDE, no window; K of the T rollout timesteps trained per sample
        _nft_steps(get, out, notes, steps)
    else:
        take("rollout.noise_level", f"{ARR}.rollout.algo.noise_level", float)
    sde = None if nft else get(f"{ARR}.rollout.algo.sde_type")
    if sde is not None:
        if sde not in SDE_TYPES:
            raise _refuse(f"{ARR}.rollout.algo.sde_type", sde, f"one of {', '.join(SDE_TYPES)}")
        put("rollout.sde_type", SDE_TYPES[sde], src=f"{ARR}.rollout.algo.sde_type")
        if sde == "cps":
            out["rollout.cps_log_prob"] = "squared_error"
            notes.append(f"{ARR}.rollout.algo.sde_type=cps: kept verl-omni's CPS log-prob, -(x - mean)^2 without "
                         "the Gaussian 1 / (2 std^2) scale (rollout.cps_log_prob=squared_error), so clip_ratio "
                         "clips the same ratio; verl-digen's default is the Gaussian density")
    window = None if nft else get(f"{ARR}.rollout.algo.sde_window_size")
    lo_hi = None if nft else get(f"{ARR}.rollout.algo.sde_window_range")
    if window is not None:
        window = int(window)
        out.update({"rollout.selection": "window", "rollout.timestep_fraction": None})
        put("rollout.train_steps", window, src=f"{ARR}.rollout.algo.sde_window_size")
        lo, hi = (int(v) for v in (lo_hi if lo_hi is not None else DEFAULT_WINDOW_RANGE))
        if steps is not None:
            hi = min(hi, int(steps))
        if mix:  # the start follows MixGRPO's schedule inside [lo, hi), as verl-omni's mix_grpo adapter places it
            out["rollout.window_range"] = [lo, hi]
            if lo_hi is None:
                notes.append(f"{ARR}.rollout.algo.sde_window_range unset: MixGRPO's window slides in steps {[lo, hi]} "
                             "(verl-omni's mix_grpo adapter's default range)")
            for name in MIX_KEYS:
                take(f"rollout.{name}", f"{ARR}.rollout.algo.{name}", str if name == "sample_strategy" else int)
        elif hi - window == lo:
            out["rollout.window_start"] = lo
        else:
            out["rollout.window_range"] = [lo, hi]
            notes.append(f"{ARR}.rollout.algo.sde_window_range={[lo, hi]}"
                         f"{' (verl-omni default)' if lo_hi is None else ''}: the window start is drawn from "
                         f"[{lo}, {hi - window}] as in verl-omni, but once per global step for every sample "
                         "(verl-omni draws per request)")
        if get(f"{ARR}.rollout.algo.sde_contiguous") is False:
            notes.append(f"{ARR}.rollout.algo.sde_contiguous=False: verl-digen's SDE window is contiguous")
        if not mix and get(f"{ARR}.rollout.algo.sample_strategy") not in (None, "random"):
            notes.append(f"{ARR}.rollout.algo.sample_strategy={_get(cfg, f'{ARR}.rollout.algo.sample_strategy')!r}: "
                         "only verl-omni's mix_grpo adapters read it (model.algorithm=mix_grpo); not carried")
    elif steps is not None and not nft:
        # no window: verl-omni runs the SDE on, and trains, steps 0 .. T-2 (the last step is deterministic)
        out.update({"rollout.selection": "first_k", "rollout.train_steps": max(1, int(steps) - 1),
                    "rollout.timestep_fraction": None})
    fraction = get("algorithm.timestep_fraction")
    if fraction not in (None, 1.0, 1) and not nft:
        notes.append(f"algorithm.timestep_fraction={fraction}: not converted; verl-digen trains every stored step "
                     "(set rollout.timestep_fraction with rollout.selection=first_k)")

    # -- model, guidance, schedule -----------------------------------------------------------------------
    path = take("model.path", f"{ARR}.model.path")
    arch = _guess_arch(path)
    if arch is not None:
        put("model.arch", arch, src=f"{ARR}.model.path")
    elif path is not None:
        notes.append(f"{ARR}.model.path={path!r}: set model.arch (one of {', '.join(known_archs())})")
    cfg_key = ARCHS[arch].verl_omni_cfg_key if arch is not None else "guidance_scale"
    other_key = "guidance_scale" if cfg_key == "true_cfg_scale" else "true_cfg_scale"
    scale, other = get(f"{ARR}.rollout.pipeline.{cfg_key}"), get(f"{ARR}.rollout.pipeline.{other_key}")
    if scale is None and other is not None and float(other) > 1:  # the recipe sets only the other key
        scale, cfg_key, other = other, other_key, None
    if scale is not None:
        put("rollout.guidance_scale", max(1.0, float(scale)), src=f"{ARR}.rollout.pipeline.{cfg_key}")
    if other is not None and float(other) > 1 and float(other) != float(scale if scale is not None else 1.0):
        notes.append(f"{ARR}.rollout.pipeline.{other_key}={other}: not used; for {arch or 'this model'} the guidance "
                     f"scale is {ARR}.rollout.pipeline.{cfg_key}={scale}")
    height, width = get(f"{ARR}.rollout.pipeline.height"), get(f"{ARR}.rollout.pipeline.width")
    vae = int(get(f"{ARR}.model.vae_scale_factor") or _default_vae_scale(arch))
    _image_size(height, width, vae, put, notes)
    _video_frames(get(f"{ARR}.rollout.pipeline.num_frames"), arch, put, notes)
    sched, where = _scheduler_config(path)
    if sched is not None:
        out["rollout.shift"] = scheduler_shift(sched, height, width, vae)
        if sched.get("shift_terminal"):
            notes.append(f"{where}: shift_terminal={sched['shift_terminal']} (the schedule is stretched to end "
                         "there) is not reproduced; verl-digen's schedule ends at sigma 0")
    elif path is not None:
        notes.append(f"{ARR}.model.path={path!r}: no scheduler config found at {where}, so the sigma shift is not "
                     "taken from the model; set +rollout.shift (SD3.5: 3.0)")
    # precision: verl loads the actor in model_dtype and computes in mixed_precision.param_dtype; verl-digen's
    # model.dtype is the compute dtype of every forward, and a full fine-tune keeps fp32 masters (actor.master_dtype
    # null) whatever the compute dtype is
    fsdp = f"{ARR}.actor.fsdp_config"
    compute = _dtype(get(f"{fsdp}.mixed_precision.param_dtype"), f"{fsdp}.mixed_precision.param_dtype")
    put("model.dtype", compute or _dtype(get(f"{fsdp}.model_dtype")),
        src=f"{fsdp}.mixed_precision.param_dtype" if compute else f"{fsdp}.model_dtype")
    reduce = f"{fsdp}.mixed_precision.reduce_dtype"
    put("actor.reduce_dtype", _dtype(get(reduce), reduce), src=reduce)
    buffers = get(f"{fsdp}.mixed_precision.buffer_dtype")
    if buffers is not None and _dtype(buffers, f"{fsdp}.mixed_precision.buffer_dtype") != "float32":
        notes.append(f"{fsdp}.mixed_precision.buffer_dtype={buffers!r}: verl-digen keeps buffers in the model's dtype")
    # memory: offload and activation checkpointing (verl-omni checkpoints activations by default)
    take("actor.activation_checkpointing", f"{ARR}.model.enable_gradient_checkpointing", bool)
    offload = get(f"{fsdp}.param_offload")
    policy = get(f"{fsdp}.offload_policy")
    if offload is not None or policy is not None:
        put("actor.param_offload", bool(offload) or bool(policy), src=f"{fsdp}.param_offload")
    take("actor.optimizer_offload", f"{fsdp}.optimizer_offload", bool)
    _sequence_parallel(get, put, notes, out.get("model.arch"))
    _memory_only_keys(get, notes)
    _nested_lora_rank(get)
    rank = take("model.lora_rank", f"{ARR}.model.lora_rank", int)
    if rank:
        take("model.lora_alpha", f"{ARR}.model.lora_alpha", float)
        targets = get(f"{ARR}.model.target_modules")
        if isinstance(targets, str):
            notes.append(f"{ARR}.model.target_modules={targets!r}: verl-digen takes a module list; its default "
                         "targets (the attention projections of the transformer) are used")
        elif targets is not None:
            put("model.target_modules", list(targets), src=f"{ARR}.model.target_modules")

    # -- loss, advantages, KL -----------------------------------------------------------------------
    if nft:
        ratio = get(f"{ARR}.actor.diffusion_loss.clip_ratio")
        if ratio is not None:
            notes.append(f"{ARR}.actor.diffusion_loss.clip_ratio={ratio}: not used (DiffusionNFT's loss has no ratio)")
    else:
        take("actor.clip_ratio", f"{ARR}.actor.diffusion_loss.clip_ratio", float)
        take("algorithm.adv_clip", f"{ARR}.actor.diffusion_loss.adv_clip_max", float)
    use_kl = get(f"{ARR}.actor.use_kl_loss")
    coef = get(f"{ARR}.actor.kl_loss_coef", 0.0)
    if nft and use_kl:
        notes.append(f"{ARR}.actor.use_kl_loss=True: not used; DiffusionNFT's reference term is "
                     "diffusion_loss.ref_kl_coef (actor.kl_coef)")
    elif use_kl is not None and not nft:
        put("actor.kl_coef", float(coef) if use_kl else 0.0, src=f"{ARR}.actor.kl_loss_coef")
        if use_kl and coef and out.get("rollout.sde_type", "flow_grpo") == "flow_grpo":
            _weight_kl_by_dt(float(coef), out, notes)
    out["algorithm.std_estimator"] = "unbiased"  # verl-omni's torch.std (n - 1), a convention, not a key
    bypass = get("algorithm.rollout_correction.bypass_mode")  # verl-omni's default False: recompute
    if bypass is not None and not nft:  # DiffusionNFT has no log-prob to recompute
        put("actor.recompute_log_prob", "false" if bypass else "true", src="algorithm.rollout_correction.bypass_mode")
    global_std = get("algorithm.global_std")
    if global_std is not None:
        put("algorithm.adv_std", "batch" if global_std else "group", src="algorithm.global_std")
    if get("algorithm.norm_adv_by_std_in_grpo") is False:
        notes.append("algorithm.norm_adv_by_std_in_grpo=False (Dr.GRPO, no std scaling): not supported")

    # -- reward function (verl's custom_reward_function, batched or verl-omni's per-sample signature) -----
    crf = "reward.custom_reward_function"
    for key in ("reward.accelerator_workers.enabled", f"{crf}.use_accelerator"):  # verl-omni 0.3
        if get(key):
            notes.append(f"{key}=True: not used; verl-digen's reward functions run in the generator pool's workers, "
                         "next to the images they score")
    own = [k for k in ("reward.name", "reward.weights", "reward.functions")
           if _get(cfg, k) is not None]  # verl-digen's, written in
    if _multi_reward(get, put, notes, own):
        pass
    elif get(f"{crf}.path") and own:
        notes.append(f"{crf}.path={_get(cfg, f'{crf}.path')!r}: not used; {own[0]} (verl-digen's reward) replaces it")
    elif get(f"{crf}.path"):
        _served_reward(get, put, notes)
        take("custom_reward_function.path", f"{crf}.path", str)
        take("custom_reward_function.name", f"{crf}.name", str)
        kwargs = get(f"{crf}.reward_kwargs")
        if kwargs:
            put("custom_reward_function.reward_kwargs", dict(kwargs), src=f"{crf}.reward_kwargs")

    # -- optimizer ------------------------------------------------------------------------------------
    take("actor.lr", f"{ARR}.actor.optim.lr", float)
    take("actor.weight_decay", f"{ARR}.actor.optim.weight_decay", float)
    clip, legacy = get(f"{ARR}.actor.optim.clip_grad"), get(f"{ARR}.actor.grad_clip")
    if clip is not None:  # what verl-omni's FSDP engine clips with
        put("actor.grad_clip", float(clip), src=f"{ARR}.actor.optim.clip_grad")
        if legacy is not None and float(legacy) != float(clip):
            notes.append(f"{ARR}.actor.grad_clip={legacy}: not used (verl-omni's FSDP engine, and so verl-digen, clip "
                         f"with {ARR}.actor.optim.clip_grad={clip})")
    else:
        put("actor.grad_clip", legacy, float, src=f"{ARR}.actor.grad_clip")

    # -- data -----------------------------------------------------------------------------------------
    files = get("data.train_files")
    if isinstance(files, (list, tuple)):
        files = files[0] if len(files) == 1 else files
    if isinstance(files, str) and files.endswith((".txt", ".jsonl", ".parquet")):
        put("data.train_files", files, src="data.train_files")  # parquet: a string or chat messages per row
        take("data.prompt_key", "data.prompt_key", str)
    elif files is not None:
        notes.append(f"data.train_files={files!r}: verl-digen reads one .txt, .jsonl or .parquet prompt file, "
                     "not a list of them")

    # -- trainer bookkeeping --------------------------------------------------------------------------
    total = take("trainer.total_steps", "trainer.total_training_steps", int)
    if total is None and get("trainer.total_epochs") is not None:
        notes.append(f"trainer.total_training_steps=None: verl-omni derives the steps from trainer.total_epochs="
                     f"{_get(cfg, 'trainer.total_epochs')} and the dataset; verl-digen does not, and runs "
                     "trainer.total_steps (its default unless set)")
    take("trainer.seed", f"{ARR}.rollout.seed", int)
    _validation_and_resume(get, put, take, notes)
    for key in ("project_name", "experiment_name", "save_freq", "default_local_dir"):
        take(f"trainer.{key}", f"trainer.{key}")
    loggers = get("trainer.logger")
    if loggers is not None:
        from verl_digen.config.schema import LOGGERS

        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        put("trainer.logger", [name for name in loggers if name in LOGGERS] or ["console"], src="trainer.logger")
        dropped = [name for name in loggers if name not in LOGGERS]
        if dropped:
            notes.append(f"trainer.logger={loggers}: {', '.join(dropped)} not supported "
                         f"(kept: {out['trainer.logger']})")
    device = get("trainer.device")
    if device in DEVICES:
        put("trainer.device", DEVICES[device], src="trainer.device")
    elif device is not None:
        raise _refuse("trainer.device", device, f"one of {', '.join(DEVICES)} (gpu means cuda)")
    for key in ("trainer.nnodes", "trainer.n_gpus_per_node"):  # the pool split replaces them (resources.*)
        used.add(key)
    return out


def _diffusion_nft(get: Callable[..., Any], put: Callable[..., None], out: dict[str, Any], notes: list[str],
                   algorithm: Any, loss_mode: Any) -> None:
    """verl-omni's DiffusionNFT recipe keys: the algorithm, its two adapters (the trainer's old copy), its loss and
    old-policy options. verl-omni's NFT advantages are not clipped before the optimality map (its clamp is
    ``adv_clip_max``), so ``algorithm.adv_clip`` is turned off."""
    for key, value in ((f"{ARR}.model.algorithm", algorithm), (f"{ARR}.actor.diffusion_loss.loss_mode", loss_mode)):
        if value not in (None, NFT):
            raise _refuse(key, value, f"{NFT} (DiffusionNFT's model.algorithm and loss_mode go together)")
    put("algorithm.name", NFT, src=f"{ARR}.actor.diffusion_loss.loss_mode")
    out["algorithm.adv_clip"] = None
    if get("algorithm.paired_preference"):
        raise _refuse("algorithm.paired_preference", True, "false (DiffusionNFT trains single samples, not pairs)")
    adapters = get(f"{ARR}.model.policy_state_adapters")
    if adapters is not None and "old" not in list(adapters):
        raise _refuse(f"{ARR}.model.policy_state_adapters", list(adapters), "['default', 'old'] (DiffusionNFT's "
                      "old policy; verl-digen keeps it as a copy of the trained parameters on the trainer)")
    rollout_adapter = get(f"{ARR}.rollout.rollout_adapter")
    if rollout_adapter not in (None, "old"):  # verl-omni refuses the same: its rollout samples with the old policy
        raise _refuse(f"{ARR}.rollout.rollout_adapter", rollout_adapter, "old (DiffusionNFT samples with its old "
                      "policy; verl-digen's rollouts take the trainer's old copy)")
    get(f"{ARR}.model.model_type")  # diffusion_nft_model: verl-omni's engine for these rows, which is TSP's here
    if get(f"{ARR}.rollout.calculate_log_probs"):
        notes.append(f"{ARR}.rollout.calculate_log_probs=True: not used (DiffusionNFT's rollout is an ODE with no "
                     "log-prob)")
    prefix = {"diffusion_loss": f"{ARR}.actor.diffusion_loss", "": "algorithm"}
    for src, key in NFT_KEYS.items():
        section, _, name = src.rpartition(".")
        value = get(f"{prefix[section]}.{name}")
        if value is not None:
            put(key, str(value) if isinstance(value, str) else (int(value) if name.endswith("interval") else
                                                                float(value)), src=f"{prefix[section]}.{name}")


def _nft_steps(get: Callable[..., Any], out: dict[str, Any], notes: list[str], steps: Any) -> None:
    """DiffusionNFT's trained timesteps: verl-omni trains max(1, int(T x timestep_fraction)) of the T rollout
    timesteps, a random subset per sample (``random_k``); its SDE keys are not read by its ODE rollout."""
    fraction = float(get("algorithm.timestep_fraction") or 1.0)
    if steps is not None:
        out.update({"rollout.selection": "random_k", "rollout.timestep_fraction": None,
                    "rollout.train_steps": max(1, int(int(steps) * fraction))})
    for key in ("noise_level", "sde_type", "sde_window_size", "sde_window_range"):
        value = get(f"{ARR}.rollout.algo.{key}")
        if value is not None:
            notes.append(f"{ARR}.rollout.algo.{key}={value!r}: not used (DiffusionNFT's rollout is a plain ODE)")


def _served_reward(get: Callable[..., Any], put: Callable[..., None], notes: list[str]) -> None:
    """verl-omni's ``reward.reward_model`` (a judge served with vLLM, called by the reward functions through
    ``reward_router_address``) as ``reward.served``: served on the generator pool. Called only where verl-omni's
    reward functions are carried (a verl-digen reward written in replaces them, and nothing would call it)."""
    rm = "reward.reward_model"
    models = get("reward.models")
    if models:
        _named_served_reward(get, put, notes, dict(models))
        return
    if not get(f"{rm}.enable"):
        return
    path = get(f"{rm}.model_path")
    if not path:
        raise _refuse(f"{rm}.model_path", path, f"the served reward model's checkpoint ({rm}.enable=True)")
    engine = get(f"{rm}.rollout.name")
    if engine not in (None, "vllm"):
        raise _refuse(f"{rm}.rollout.name", engine, "vllm (the engine verl-digen serves a reward model with)")
    put("reward.served.model_path", str(path), src=f"{rm}.model_path")
    put("reward.served.tensor_parallel_size", get(f"{rm}.rollout.tensor_model_parallel_size"), int,
        src=f"{rm}.rollout.tensor_model_parallel_size")
    put("reward.served.gpu_memory_utilization", get(f"{rm}.rollout.gpu_memory_utilization"), float,
        src=f"{rm}.rollout.gpu_memory_utilization")
    _reward_pool(get, put, rm)


def _reward_pool(get: Callable[..., Any], put: Callable[..., None], rm: str) -> None:
    """``reward.reward_model.enable_resource_pool=True`` (the judge on ``nnodes`` x ``n_gpus_per_node`` GPUs of its
    own) as ``resources.reward.workers``; without it the judge shares the generating GPUs, as verl-omni's shares
    the actor's (verl-omni then sets nnodes / n_gpus_per_node to the trainer's, so they are read and dropped)."""
    nodes, per_node = get(f"{rm}.nnodes"), get(f"{rm}.n_gpus_per_node")
    if not get(f"{rm}.enable_resource_pool"):
        return
    for key, value in ((f"{rm}.nnodes", nodes), (f"{rm}.n_gpus_per_node", per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _refuse(key, value, f"a positive integer ({rm}.enable_resource_pool=True sizes the judge's own pool "
                          "with it)")
    put("resources.reward.workers", nodes * per_node, src=f"{rm}.n_gpus_per_node")


def _named_served_reward(get: Callable[..., Any], put: Callable[..., None], notes: list[str],
                         models: dict[str, Any]) -> None:
    """verl-omni 0.3's named reward models (``reward.models.<name>``) as ``reward.served``: one ``engine`` model
    (served with vLLM, called through ``reward_router_address``) is the judge verl-digen serves on the generator
    pool; its own ``model_path`` and ``rollout.*`` override ``reward.reward_model``'s, as in verl-omni. Several
    models, or a ``native`` one (loaded inside verl-omni's reward workers), are refused naming the key."""
    rm = "reward.reward_model"
    if get(f"{rm}.enable"):
        raise _refuse(f"{rm}.enable", True, "False while reward.models is set (verl-omni takes one or the other)")
    if len(models) != 1:
        raise _refuse("reward.models", sorted(models), "one named model (verl-digen serves one judge)")
    name, entry = next(iter(models.items()))
    key = f"reward.models.{name}"
    get(key)  # the whole entry is read here: what is not carried is named below
    entry = dict(entry or {})
    if entry.get("backend") != "engine":
        raise _refuse(f"{key}.backend", entry.get("backend"), "engine (a model served with vLLM; a native reward "
                      "model, loaded inside verl-omni's reward workers, has no counterpart)")
    rollout = dict(entry.get("rollout") or {})

    def pick(leaf: str) -> tuple[Any, str]:
        """The named model's ``rollout.<leaf>``, else reward.reward_model's (the common engine default)."""
        if rollout.get(leaf) is not None:
            return rollout[leaf], f"{key}.rollout.{leaf}"
        return get(f"{rm}.rollout.{leaf}"), f"{rm}.rollout.{leaf}"

    path, src = (entry.get("model_path"), f"{key}.model_path")
    if not path:
        path, src = get(f"{rm}.model_path"), f"{rm}.model_path"
    if not path:
        raise _refuse(f"{key}.model_path", path, "the served reward model's checkpoint")
    engine, engine_key = pick("name")
    if engine not in (None, "vllm"):
        raise _refuse(engine_key, engine, "vllm (the engine verl-digen serves a reward model with)")
    put("reward.served.model_path", str(path), src=src)
    tp, tp_key = pick("tensor_model_parallel_size")
    put("reward.served.tensor_parallel_size", tp, int, src=tp_key)
    share, share_key = pick("gpu_memory_utilization")
    put("reward.served.gpu_memory_utilization", share, float, src=share_key)
    read = {"backend", "model_path", "rollout"}
    other = sorted(k for k in entry if k not in read) + [f"rollout.{k}" for k in sorted(rollout) if k not in (
        "name", "tensor_model_parallel_size", "gpu_memory_utilization")]
    if other:
        notes.append(f"{key}.{{{', '.join(other)}}}: not used; the judge is served with reward.served's settings "
                     "(on the generator pool unless resources.reward.workers gives it its own)")


def _multi_reward(get: Callable[..., Any], put: Callable[..., None], notes: list[str], own: list[str]) -> bool:
    """verl-omni's multi-reward manager (``reward.reward_manager.name=MultiVisualRewardManager``, its placeholder
    ``custom_reward_function``, ``reward.reward_functions``) as ``reward.functions``. Returns whether it is one."""
    crf = "reward.custom_reward_function"
    manager, path = get("reward.reward_manager.name"), get(f"{crf}.path")
    if manager not in MULTI_MANAGERS and not str(path or "").endswith(MULTI_PLACEHOLDER):
        return False
    for key in (f"{crf}.name", "reward.reward_manager.module.path", "reward.reward_manager.source"):
        get(key)  # the placeholder and the manager's module: read, nothing to carry
    functions = get("reward.reward_functions")
    if own:
        notes.append(f"reward.reward_manager.name={manager!r}: not used; {own[0]} (verl-digen's reward) replaces it")
        return True
    if not functions:
        raise _refuse("reward.reward_functions", functions, "one entry or more, {name: {path, name, weight, "
                      f"required}} (reward.reward_manager.name={manager} sums them)")
    aggregation = get("reward.aggregation")
    if aggregation not in (None, "weighted_sum"):
        raise _refuse("reward.aggregation", aggregation, "weighted_sum (what the multi-reward manager computes)")
    put("reward.functions", {str(k): dict(v) for k, v in dict(functions).items()}, src="reward.reward_functions")
    _served_reward(get, put, notes)
    return True


def _image_size(height: Any, width: Any, vae: int, put: Callable[..., None], notes: list[str]) -> None:
    """verl-omni's pixel ``height`` x ``width`` as the latent height (``model.latent_size``) and width
    (``model.latent_width``, set only when it differs). As diffusers' pipelines do, a side that is not a
    multiple of the VAE's compression x 2 (the 2x2 packing) is rounded down to one, with a note."""
    if height is None and width is None:
        return
    sides = {"height": int(height if height is not None else PIPELINE_SIDE),
             "width": int(width if width is not None else PIPELINE_SIDE)}
    latent = {name: 2 * (px // (2 * vae)) for name, px in sides.items()}
    for name, px in sides.items():
        if latent[name] < 2:
            raise _refuse(f"{ARR}.rollout.pipeline.{name}", px, f"at least {2 * vae} px (the VAE's {vae}x compression "
                          "times the 2x2 latent packing)")
        if latent[name] * vae != px:
            notes.append(f"{ARR}.rollout.pipeline.{name}={px}: rounded down to {latent[name] * vae} px (a multiple of "
                         f"{2 * vae}), as diffusers' pipeline does")
    put("model.latent_size", latent["height"], src=f"{ARR}.rollout.pipeline.height")
    if latent["width"] != latent["height"]:
        put("model.latent_width", latent["width"], src=f"{ARR}.rollout.pipeline.width")


def _video_frames(frames: Any, arch: str | None, put: Callable[..., None], notes: list[str]) -> None:
    """verl-omni's ``pipeline.num_frames`` as ``model.num_frames`` for a video model. diffusers' video
    pipelines generate ``4k + 1`` frames (their VAEs compress time 4x causally) and round any other count to
    ``n // 4 * 4 + 1``; verl-digen takes the count the pipeline really generates, with a note."""
    if frames is None:
        return
    key = f"{ARR}.rollout.pipeline.num_frames"
    if arch is None or not ARCHS[arch].video:
        if int(frames) != 1:  # verl-omni's default is 1
            notes.append(f"{key}={frames}: not used by the image model {arch or '(unknown architecture)'}")
        return
    n = int(frames)
    temporal = ARCHS[arch].vae_factors[1]
    generated = n if n % temporal == 1 else n // temporal * temporal + 1
    put("model.num_frames", generated, src=key)
    if generated != n:
        notes.append(f"{key}={n}: diffusers' {arch} pipeline generates {generated} frames ({temporal}k + 1; it rounds "
                     f"{n}), and so does verl-digen (model.num_frames={generated})")


def _validation_and_resume(get: Callable[..., Any], put: Callable[..., None], take: Callable[..., Any],
                           notes: list[str]) -> None:
    """verl-omni's validation (``data.val_files`` every ``trainer.test_freq`` steps) and resume
    (``trainer.resume_mode``: ``auto``, its default, resumes from the latest checkpoint in
    ``default_local_dir``; ``disable``; ``resume_path`` with ``trainer.resume_from_path``)."""
    freq, val = get("trainer.test_freq"), get("data.val_files")
    if isinstance(val, (list, tuple)) and len(val) == 1:
        val = val[0]
    if freq is not None and int(freq) > 0:
        if not (isinstance(val, str) and val.endswith((".txt", ".jsonl", ".parquet"))):
            raise _refuse("data.val_files", val, f"one .txt, .jsonl or .parquet prompt file (trainer.test_freq={freq} "
                          "validates on it)")
        put("data.val_files", val, src="data.val_files")
        put("trainer.test_freq", int(freq), src="trainer.test_freq")
        take("trainer.log_val_generations", "trainer.log_val_generations", int)
        if get(f"{ARR}.rollout.val_kwargs") is not None:
            notes.append(f"{ARR}.rollout.val_kwargs: validation samples with the training sampler "
                         "(rollout.num_steps, rollout.noise_level), on a fixed seed stream")
    if get("trainer.val_before_train") and freq is not None and int(freq) > 0:
        notes.append("trainer.val_before_train=True: verl-digen validates after every trainer.test_freq-th step and "
                     "after the last one, not before the first")
    mode = get("trainer.resume_mode")
    if get("trainer.resume_from") is not None:  # verl-digen's own key, written into the config: it wins
        return
    if mode == "auto":
        put("trainer.resume_from", "auto", src="trainer.resume_mode")
    elif mode == "resume_path":
        path = get("trainer.resume_from_path")
        if not path:
            raise _refuse("trainer.resume_from_path", path, "a checkpoint directory (trainer.resume_mode=resume_path)")
        put("trainer.resume_from", str(path), src="trainer.resume_from_path")
    elif mode not in (None, "disable"):
        raise _refuse("trainer.resume_mode", mode, "one of auto, disable, resume_path")


def _dtype(value: Any, key: str = f"{ARR}.actor.fsdp_config.model_dtype") -> str | None:
    if value is None:
        return None
    try:
        return dtypes.canonical(value)  # verl-omni's fp32 / bf16 / fp16 and the torch names
    except ValueError:
        raise _refuse(key, value, f"one of {', '.join(dtypes.ALIASES)}") from None


def _weight_kl_by_dt(coef: float, out: dict[str, Any], notes: list[str]) -> None:
    """For ``sde`` (Flow-GRPO) verl-omni divides the squared mean gap by ``2 std_t^2`` where the step's real
    std is ``std_t sqrt(|dt|)``; verl-digen divides by the real variance, so verl-omni's KL of a row is
    verl-digen's times that row's ``|dt|``. ``actor.kl_dt_weighted`` applies exactly that per row, so the
    coefficient carries over as it is, for any sigma shift (CPS and DanceGRPO: the same convention in both,
    nothing to weight)."""
    out["actor.kl_dt_weighted"] = True
    notes.append(f"{ARR}.actor.kl_loss_coef={coef}: verl-omni's sde KL divides by std_t^2 without the step's "
                 "|dt|; actor.kl_dt_weighted=true weights each row's KL by its own |dt|, so the loss is "
                 "verl-omni's at any shift")


def verl_omni_defaults() -> dict[str, Any] | None:
    """verl-omni's own defaults, unresolved (``${...}`` strings kept), from the flattened reference config it
    ships (``verl_omni/trainer/config/_generated_diffusion_trainer.yaml``); None when it cannot be read."""
    from omegaconf import OmegaConf

    try:
        spec = importlib.util.find_spec("verl_omni")
        folder = next(iter(spec.submodule_search_locations or []))
        path = os.path.join(folder, "trainer", "config", "_generated_diffusion_trainer.yaml")
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as err:
        logger.debug("verl-omni's default config is unreadable: %r", err)
        return None


def unmapped_keys(raw: Mapping[str, Any], used: set[str], defaults: Mapping[str, Any] | None
                  ) -> tuple[dict[str, Any], list[str]]:
    """The verl-omni keys the conversion does not read: (those the recipe set, those left at defaults).

    A key counts as set when its value differs from verl-omni's default, or verl-omni has no such key. Keys
    whose default (or a parent's) is an interpolation (``${...}``: they mirror another key), verl-digen's own
    keys (``DIGEN_ONLY_SECTIONS`` and schema keys in shared sections) and the keys verl-omni's entry point
    consumes itself (``ENTRY_KEYS``) are not reported.
    """
    changed, at_default, _ = _classify(raw, used, defaults)
    return changed, at_default


def _classify(raw: Mapping[str, Any], used: set[str], defaults: Mapping[str, Any] | None
              ) -> tuple[dict[str, Any], list[str], set[str]]:
    """(changed keys with values, keys at default, every key considered) for ``unmapped_keys``."""
    from dataclasses import fields

    from verl_digen.config import RunConfig

    schema = {f"{section.name}.{field.name}" for section in fields(RunConfig)
              for field in fields(getattr(RunConfig(), section.name))}
    base = _leaves(defaults) if defaults else {}
    interpolated = tuple(key for key, value in base.items() if isinstance(value, str) and "${" in value)

    def covered(key: str, prefixes: Any) -> bool:
        return any(key == p or key.startswith(p + ".") for p in prefixes)

    changed: dict[str, Any] = {}
    at_default: list[str] = []
    considered: set[str] = set()
    for key, value in _leaves(raw).items():
        if key.split(".")[0] in DIGEN_ONLY_SECTIONS or covered(key, ENTRY_KEYS) or covered(key, interpolated):
            continue
        ours = key in schema or any(key.startswith(f + ".") for f in schema)  # reward.served.command too
        if ours and key not in base:  # a verl-digen key written into a shared section
            continue
        considered.add(key)
        if covered(key, used):
            continue
        default = base.get(key, _MISSING)
        if default is _MISSING or default != value:
            changed[key] = value
        else:
            at_default.append(key)
    return changed, at_default, considered


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_leaves(value, dotted + "."))
        else:
            out[dotted] = value
    return out


_MISSING = object()


def collapse_keys(keys: list[str], considered: set[str]) -> list[str]:
    """Shorten a key list for one log line: a subtree whose every considered leaf is listed becomes
    ``prefix.*``."""
    listed = set(keys)
    out: list[str] = []
    for key in sorted(keys):
        parts = key.split(".")
        shown = key
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth]) + "."
            if all(k in listed for k in considered if k.startswith(prefix)):
                shown = prefix + "*"
                break
        if shown not in out:
            out.append(shown)
    return out


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _native_sections(raw: Mapping[str, Any], flat: Mapping[str, Any]) -> dict[str, Any]:
    """verl-digen keys written directly into the verl-omni config (``+rollout.guidance_scale=4.5``, ...).

    verl-omni has no top-level ``model`` / ``rollout`` / ``actor`` / ``digen`` / ``resources``: keys of
    verl-digen's schema there are taken and win over the conversion (``+rollout.shift=3`` replaces the
    shift read from the model). Where a section name is shared (``data``, ``trainer``, ``algorithm``,
    ``reward``), same-named keys mean the same thing, so a key the mapping converted keeps its converted
    value (``trainer.device=gpu`` stays ``cuda``).
    """
    from dataclasses import fields

    from verl_digen.config import RunConfig

    defaults = RunConfig()
    native: dict[str, Any] = {}
    for section in fields(RunConfig):
        value = raw.get(section.name)
        if not isinstance(value, Mapping):
            continue
        if section.name in ("digen", "resources"):
            native[section.name] = dict(value)
            continue
        ours = {f.name for f in fields(getattr(defaults, section.name))}
        shared = section.name not in DIGEN_ONLY_SECTIONS
        keep = {k: v for k, v in value.items() if k in ours and f"{section.name}.{k}" not in NOT_CARRIED
                and not (shared and f"{section.name}.{k}" in flat)}
        if keep:
            native[section.name] = keep
    return native


def _standalone_rollout_gpus(raw: Mapping[str, Any]) -> int:
    """GPUs of verl-omni's standalone rollout pool (``separate_async``: ``rollout.nnodes`` > 0, its default
    0 meaning the rollout shares the actor's GPUs); 0 when there is none."""
    nodes = int(_get(raw, f"{ARR}.rollout.nnodes", 0) or 0)
    return nodes * int(_get(raw, f"{ARR}.rollout.n_gpus_per_node", 1) or 1) if nodes > 0 else 0


def is_dry_run(config: Any) -> bool:
    """Whether the verl-omni config asks for verl-digen's dry run (``+trainer.dry_run=true``)."""
    return bool(_get(_as_dict(config), "trainer.dry_run", False))


def _as_dict(config: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)


def to_run_config(config: Any, log: Callable[[str], Any] = logger.warning) -> Any:
    """verl-omni config (DictConfig or mapping) -> validated ``RunConfig``.

    verl-digen's own keys ride along in the verl-omni config (see ``_native_sections``). ``digen.*`` is
    set by ``+trainer=digen``. ``resources.*`` (the generator / trainer pool split) has no verl-omni
    counterpart and is required. ``trainer.mode`` defaults to ``digen``. Every conversion note, and every
    verl-omni key that is not converted, is passed to ``log`` as one line naming the key.
    """
    from omegaconf import OmegaConf

    from verl_digen.config import ConfigError, load, validate

    raw = _as_dict(config)
    notes: list[str] = []
    used: set[str] = set()
    raw = _pools(raw, notes, used)
    sources: dict[str, str] = {}
    trainer_workers = int(_get(raw, "resources.trainer.workers", 1))
    flat = from_verl_omni_config(raw, trainer_workers=trainer_workers, notes=notes, used=used, sources=sources)
    files = _get(raw, "data.train_files")
    if files is not None and "data.train_files" not in flat:
        raise ConfigError("data.train_files", files, "one .txt, .jsonl or .parquet prompt file (verl-omni's "
                          "parquet layouts are read: a prompt string or chat messages per row)")
    if "wandb" in flat.get("trainer.logger", []):
        from verl_digen.config.checks import wandb_unready

        why = wandb_unready()
        if why:  # verl-omni's scripts log to wandb; on a machine without it the run keeps its other loggers
            flat["trainer.logger"] = [n for n in flat["trainer.logger"] if n != "wandb"] or ["console"]
            notes.append(f"trainer.logger: wandb left out: it {why}")
    native = _native_sections(raw, flat)
    native.setdefault("trainer", {}).setdefault("mode", "digen")
    path = _get(raw, f"{ARR}.model.path")
    if path is not None and "model.arch" not in flat and "arch" not in native.get("model", {}):
        raise ConfigError(f"{ARR}.model.path", path, "a model verl-digen has an adapter for, or "
                          f"+model.arch=<{'|'.join(known_archs())}> if it is one")
    cfg = load(OmegaConf.merge(OmegaConf.create(_nested(flat)), OmegaConf.create(native)))
    for note in notes:
        log(f"verl-omni -> verl-digen: {note}")
    _log_unconverted(raw, used, log)
    try:
        validate(cfg)
    except ConfigError as err:
        raise in_verl_omni_keys(err, raw, sources, native) from None
    return cfg


def _pools(raw: dict, notes: list[str], used: set[str]) -> dict:
    """``raw`` with verl-digen's generator / trainer pool split: taken from ``resources`` (verl-omni has no
    such key), or from a standalone rollout pool (separate_async), which becomes the generator pool."""
    from verl_digen.config import ConfigError

    resources = raw.get("resources")
    standalone = _standalone_rollout_gpus(raw)
    actor_gpus = int(_get(raw, "trainer.nnodes", 1) or 1) * int(_get(raw, "trainer.n_gpus_per_node", 1) or 1)
    pool_keys = f"{ARR}.rollout.nnodes x {ARR}.rollout.n_gpus_per_node"
    if standalone and not isinstance(resources, Mapping):  # separate_async: the standalone rollout generates
        resources = {"generator": {"workers": standalone}, "trainer": {"workers": actor_gpus}}
        raw = {**raw, "resources": resources}
        notes.append(f"{pool_keys}={standalone}: the standalone rollout pool becomes the generator pool "
                     f"(resources.generator.workers={standalone}); trainer.nnodes x trainer.n_gpus_per_node="
                     f"{actor_gpus} the trainer pool (resources.trainer.workers={actor_gpus})")
    elif standalone:
        notes.append(f"{pool_keys}={standalone}: the standalone rollout pool is replaced by resources.generator."
                     f"workers={_get(raw, 'resources.generator.workers')}")
    if standalone:
        used.update({f"{ARR}.rollout.nnodes", f"{ARR}.rollout.n_gpus_per_node"})
    if not isinstance(resources, Mapping) or not {"generator", "trainer"} <= set(resources):
        raise ConfigError("resources", resources, "+resources.generator.workers=G +resources.trainer.workers=R "
                          f"(verl-digen splits verl-omni's {actor_gpus} GPUs into a generator and a trainer pool)")
    return raw


def _log_unconverted(raw: dict, used: set[str], log: Callable[[str], Any]) -> None:
    """Name every verl-omni key set away from its default that verl-digen ignores; count those at their
    defaults (hundreds: named at DEBUG only, so that the notes that change results stay in sight)."""
    changed, at_default, considered = _classify(raw, used, verl_omni_defaults())
    for key, value in changed.items():
        log(f"verl-omni -> verl-digen: {key}={value!r} is not converted (no verl-digen counterpart); ignored")
    if at_default:
        log(f"verl-omni -> verl-digen: {len(at_default)} verl-omni keys at their defaults have no verl-digen "
            f"counterpart and are ignored (hydra.verbose={__name__} names them)")
        logger.debug("verl-omni keys at their defaults with no verl-digen counterpart: %s",
                     ", ".join(collapse_keys(at_default, considered)))


def in_verl_omni_keys(err: Any, raw: Mapping[str, Any], sources: Mapping[str, str], native: Mapping[str, Any]) -> Any:
    """A refusal of a converted value, re-said in the verl-omni key the user set (a key the user wrote in
    verl-digen's own sections, or one verl-omni does not set, keeps its verl-digen name)."""
    from verl_digen.config import ConfigError

    src = sources.get(err.key)
    section, _, leaf = err.key.partition(".")
    parent = next((k for k in sources if err.key.startswith(k + ".")), None)  # reward.functions.<name>.path
    if src is None and parent is not None and leaf.split(".")[0] not in native.get(section, {}):
        return ConfigError(sources[parent] + err.key[len(parent):], err.value, err.expected)
    if src is None or leaf in native.get(section, {}):
        return err
    return ConfigError(src, _get(raw, src), f"{err.expected} (verl-digen's {err.key} = {err.value!r} is converted "
                       "from it)")
