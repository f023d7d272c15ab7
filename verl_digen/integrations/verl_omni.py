"""verl-omni integration: ``digen`` as a trainer mode of verl-omni's v1 diffusion trainer.

verl-omni's ``python -m verl_omni.trainer.main_diffusion_v1 trainer.use_v1=true
trainer.v1.trainer_mode=<mode>`` looks ``<mode>`` up in ``DIFFUSION_TRAINER_REGISTRY``
(``verl_omni/trainer/diffusion/v1/trainer_base.py``, filled by ``register_diffusion_trainer(name)``).
Its TaskRunner then calls ``cls(config=config)``, ``.init()``, ``.get_llm_client()``,
``.get_reward_handles()`` and ``.fit(agent_loop_manager)``. ``DigenVerlOmniTrainer`` provides that
surface and runs verl-digen's own runtime on the converted config.

Registration is lazy, because verl loads ``verl.plugins`` entry points on every ``import verl``, in every
Ray worker too, and importing verl-omni is heavy and has side effects. ``install()`` (called by
``verl_digen.plugin``) costs one ``find_spec`` when verl-omni is absent. When it is present, it registers
``digen`` as soon as verl-omni's ``trainer.diffusion.v1`` package has been imported, and it adds
verl-digen's Hydra configs to the search path. ``register()`` does the same eagerly.

This module imports only the standard library at import time.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

TRAINER_MODE = "digen"
# verl-omni's v1 diffusion trainer package; its __init__ re-exports the registry from trainer_base.py.
REGISTRY_PACKAGE = "verl_omni.trainer.diffusion.v1"
REGISTRY_MODULE = "verl_omni.trainer.diffusion.v1.trainer_base"
NULL_AGENT_LOOP_MANAGER = f"{__name__}.NullAgentLoopManager"

# verl-omni's rollout.algo.sde_type -> verl-digen's rollout.sde_type (same SDE step, same noise_level role)
SDE_TYPES = {"sde": "flow_grpo", "cps": "cps", "dance_sde": "dance_grpo"}
VAE_SCALE_FACTOR = 8  # verl-omni's default model.vae_scale_factor (pixels per latent cell)
ARCH_HINTS = (  # substring of the model id/path (lower-case) -> verl-digen model.arch
    ("qwen-image", "qwen_image"), ("qwen_image", "qwen_image"), ("flux", "flux"),
    ("stable-diffusion-3", "sd3"), ("sd3", "sd3"), ("hunyuan", "hunyuan_video"), ("wan", "wan"),
)
LOGGERS = ("console", "tensorboard", "wandb")


# ------------------------------------------------------------------------------------------- registration
def is_available() -> bool:
    """Whether verl-omni is installed, checked without importing it."""
    try:
        return importlib.util.find_spec("verl_omni") is not None
    except (ImportError, ValueError):
        return False


def _register_into(module: ModuleType) -> bool:
    """Put ``digen`` into the registry that ``module`` exposes; True when it is there afterwards."""
    decorator = getattr(module, "register_diffusion_trainer", None)
    registry = getattr(module, "DIFFUSION_TRAINER_REGISTRY", None)
    if decorator is None or registry is None:
        logger.debug("%s has no register_diffusion_trainer / DIFFUSION_TRAINER_REGISTRY", module.__name__)
        return False
    if registry.get(TRAINER_MODE) is not DigenVerlOmniTrainer:
        decorator(TRAINER_MODE)(DigenVerlOmniTrainer)
    return registry.get(TRAINER_MODE) is DigenVerlOmniTrainer


def _initialized(module: ModuleType | None) -> bool:
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def register() -> bool:
    """Import verl-omni's diffusion trainer registry now and add ``digen`` to it.

    Returns True when ``digen`` is registered, False when verl-omni is absent or its registry cannot be
    imported (the reason goes to the debug log). Never raises.
    """
    if not is_available():
        return False
    try:
        register_search_path()
        _after_import(GUARD_MODULE, _install_entry_guard)
        return _register_into(importlib.import_module(REGISTRY_PACKAGE))
    except Exception as err:  # a broken verl-omni install must not break verl-digen or verl
        logger.debug("could not register verl-digen with verl-omni: %r", err)
        return False


class _AfterImport(importlib.abc.MetaPathFinder):
    """One-shot post-import hook: runs ``callback(module)`` right after ``name`` finishes executing."""

    def __init__(self, name: str, callback: Callable[[ModuleType], Any]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, callback = loader.exec_module, self.callback

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                callback(module)
            except Exception as err:
                logger.debug("post-import hook for %s failed: %r", fullname, err)

        loader.exec_module = exec_module  # this module's own loader instance only
        return spec


def install() -> bool:
    """The ``verl.plugins`` hook: make ``digen`` available to verl-omni without importing verl-omni.

    Returns False when verl-omni is not installed (nothing else happens). Otherwise it adds verl-digen's
    configs to Hydra's search path, registers ``digen`` now (registry already imported) or right after
    verl-omni imports its ``trainer.diffusion.v1`` package, and puts ``entry_guard`` in front of verl-omni's
    entry points (v0 refusal, dry run). Never raises.
    """
    try:
        if not is_available():
            return False
        register_search_path()
        _after_import(GUARD_MODULE, _install_entry_guard)
        return _after_import(REGISTRY_PACKAGE, _register_into)
    except Exception as err:
        logger.debug("verl-omni integration not installed: %r", err)
        return False


def _after_import(name: str, callback: Callable[[ModuleType], bool]) -> bool:
    """Run ``callback`` on module ``name`` now if it is imported, else right after it is."""
    module = sys.modules.get(name)
    if _initialized(module):
        return callback(module)
    if not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
    return True


# ------------------------------------------------------------------------------- verl-omni's entry points
# Both verl-omni entry points call this function with the composed config in the driver, before Ray starts;
# wrapping it is where verl-digen sees the command line early enough to refuse a v0 run or do a dry run.
GUARD_MODULE = "verl_omni.utils.diffusion_attention"
GUARD_FUNCTION = "validate_attention_consistency"
V1_ENTRY = "verl_omni.trainer.main_diffusion_v1"
V0_ENTRY = "verl_omni.trainer.main_diffusion"


def wants_digen(config: Any) -> bool:
    """Whether a verl-omni config selects verl-digen (``trainer.v1.trainer_mode=digen`` or ``+trainer=digen``)."""
    from omegaconf import OmegaConf

    select = (lambda key: OmegaConf.select(config, key)) if OmegaConf.is_config(config) else (
        lambda key: _get(config, key))
    return select("trainer.v1.trainer_mode") == TRAINER_MODE or select("digen") is not None


def check_entry(config: Any, main_module: str | None = None) -> str | None:
    """What verl-omni's entry point would do wrong with a digen config, as a message; None when it is fine.

    The v0 entry (``main_diffusion``, or ``main_diffusion_v1`` without ``trainer.use_v1=true``) has no
    trainer registry and would silently run verl-omni's own trainer.
    """
    from omegaconf import OmegaConf

    if not wants_digen(config):
        return None
    main_module = main_module if main_module is not None else _main_module()
    use_v1 = bool(OmegaConf.select(config, "trainer.use_v1") if OmegaConf.is_config(config)
                  else _get(config, "trainer.use_v1"))
    if main_module == V0_ENTRY or not use_v1:
        entry = f"python -m {main_module}" if main_module else "this entry point"
        return (f"{entry} with trainer.use_v1={use_v1} runs verl-omni's v0 trainer, which cannot run "
                f"trainer.v1.trainer_mode={TRAINER_MODE}; run `python -m {V1_ENTRY} trainer.use_v1=true "
                f"trainer.v1.trainer_mode={TRAINER_MODE} +trainer=digen ...` (docs/migrating-from-verl-omni.md)")
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode") if OmegaConf.is_config(config) else _get(
        config, "trainer.v1.trainer_mode")
    if mode != TRAINER_MODE:
        return (f"+trainer=digen is selected but trainer.v1.trainer_mode={mode} runs verl-omni's own trainer; "
                f"set trainer.v1.trainer_mode={TRAINER_MODE}")
    return None


def _main_module() -> str | None:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None)


#: set in verl-omni's driver once the config was converted there; the TaskRunner (a child process, which
#: inherits the environment) then logs the same notes at debug level instead of twice
CHECKED_ENV = "VERL_DIGEN_VERL_OMNI_CHECKED"


def entry_guard(config: Any) -> None:
    """Runs in verl-omni's driver before Ray starts, for digen configs only.

    Refuses the v0 entry (exit 2, message on stderr); converts and validates the config, so conversion
    notes and errors show before any worker starts (exit 2 on an invalid config); refuses a local CPU run
    that would wait forever for Ray CPUs (``ray_cpu_shortfall``); with ``+trainer.dry_run=true`` prints the
    converted config and the resource plan and exits 0.
    """
    if not wants_digen(config):
        return
    problem = check_entry(config)
    if problem is not None:
        print(f"verl-digen: {problem}", file=sys.stderr)
        raise SystemExit(2)
    from verl_digen.trainer.config import ConfigError

    try:
        run_config = to_run_config(config)
    except ConfigError as err:
        print(f"invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    os.environ[CHECKED_ENV] = "1"
    shortfall = ray_cpu_shortfall(config, run_config)
    if shortfall and not run_config.trainer.dry_run:
        print(f"verl-digen: {shortfall}", file=sys.stderr)
        raise SystemExit(2)
    if run_config.trainer.dry_run:
        from verl_digen.main import dry_run

        print(dry_run(run_config))
        raise SystemExit(0)


def ray_cpu_shortfall(config: Any, run_config: Any) -> str | None:
    """Why a local CPU run would wait forever for Ray CPUs, or None.

    verl-omni starts Ray with the machine's core count unless ``ray_kwargs.ray_init.num_cpus`` is set, and its
    TaskRunner, the TransferQueue controller and each storage unit hold one Ray CPU each; verl-digen's CPU
    workers hold one more each. Only checked for ``trainer.device=cpu`` on a local Ray (no address).
    """
    from omegaconf import OmegaConf

    select = (lambda key: OmegaConf.select(config, key)) if OmegaConf.is_config(config) else (
        lambda key: _get(config, key))
    if run_config.trainer.device != "cpu" or os.environ.get("RAY_ADDRESS") or select("ray_kwargs.ray_init.address"):
        return None
    units = int(select("transfer_queue.backend.SimpleStorage.num_data_storage_units") or 0)
    need = 2 + units + run_config.total_workers
    have = select("ray_kwargs.ray_init.num_cpus") or os.cpu_count() or 1
    if have >= need:
        return None
    return (f"Ray will have {have} CPUs, but verl-omni's TaskRunner, TransferQueue ({units} storage units) and "
            f"verl-digen's {run_config.total_workers} workers hold {need}: the run would wait forever. Add "
            "+verl_omni=small (or transfer_queue.backend.SimpleStorage.num_data_storage_units=1 "
            f"ray_kwargs.ray_init.num_cpus={max(need, 8)})")


def _install_entry_guard(module: ModuleType) -> bool:
    original = getattr(module, GUARD_FUNCTION, None)
    if original is None or getattr(original, "__digen_guard__", False):
        return original is not None

    def guarded(config: Any, *args: Any, **kwargs: Any) -> Any:
        entry_guard(config)
        return original(config, *args, **kwargs)

    guarded.__digen_guard__ = True  # type: ignore[attr-defined]
    guarded.__wrapped__ = original  # type: ignore[attr-defined]
    guarded.__doc__ = original.__doc__
    setattr(module, GUARD_FUNCTION, guarded)
    return True


def register_search_path() -> bool:
    """Add ``pkg://verl_digen.config`` to Hydra's search path (so ``+trainer=digen`` composes)."""
    try:
        from verl_digen.integrations import hydra_searchpath

        hydra_searchpath.register()
        return True
    except Exception as err:
        logger.debug("could not register verl-digen's Hydra search path: %r", err)
        return False


# ------------------------------------------------------------------------------------ config conversion
ARR = "actor_rollout_ref"
# verl-omni dtype names (FSDP engine config) -> torch names
DTYPES = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16", "half": "float16",
          "bf16": "bfloat16", "bfloat16": "bfloat16", "fp64": "float64", "float64": "float64"}
DEVICES = {"cuda": "cuda", "gpu": "cuda", "cpu": "cpu"}  # verl-omni's trainer.device -> verl-digen's
LOSS_MODES = ("flow_grpo", "dance_grpo")  # verl-omni loss modes verl-digen implements
DEFAULT_WINDOW_RANGE = (0, 5)  # verl-omni's rollout adapters' sde_window_range when the config leaves it null
# CFG: which verl-omni pipeline key is the real classifier-free guidance scale for an architecture
# (diffusers' Qwen-Image pipelines take true_cfg_scale; SD3, Wan, HunyuanVideo take guidance_scale; FLUX.1-dev
# feeds guidance_scale to its distilled guidance embedding, which is what verl-digen does with it too)
CFG_KEY = {"qwen_image": "true_cfg_scale"}
# keys that verl-omni's own entry point consumes before the trainer mode runs (they take effect as they are)
ENTRY_KEYS = ("ray_kwargs", "transfer_queue", "trainer.use_v1", "trainer.v1.trainer_mode", "hydra",
              f"{ARR}.rollout.agent.agent_loop_manager_class")
# top-level sections that exist only in verl-digen's schema (verl-omni has none of these names)
DIGEN_ONLY_SECTIONS = ("model", "rollout", "actor", "resources", "digen")
#: same-named keys whose verl-omni values do not carry over: its validation set is a parquet dataset of
#: its own layout, scored by its own reward stack (verl-digen has no validation pass yet)
NOT_CARRIED = frozenset({"data.val_files", "trainer.test_freq"})


def _get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _guess_arch(path: str | None) -> str | None:
    low = (path or "").lower()
    if "edit" in low:  # image-editing variants (Qwen-Image-Edit) take an input image: no adapter here
        return None
    return next((arch for hint, arch in ARCH_HINTS if hint in low), None)


def _refuse(key: str, value: Any, expected: str) -> Exception:
    from verl_digen.trainer.config import ConfigError

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


def _shifted_sigmas(num_steps: int, shift: float) -> list[float]:
    """verl-digen's schedule (algo/sigmas.py), in plain Python: T + 1 sigmas from 1 to 0, time-shifted."""
    raw = [1.0 - i / num_steps for i in range(num_steps + 1)]
    return [shift * s / (1 + (shift - 1) * s) for s in raw]


def from_verl_omni_config(cfg: Mapping[str, Any], trainer_workers: int = 1, notes: list[str] | None = None,
                          used: set[str] | None = None) -> dict[str, Any]:
    """Map a (resolved) verl-omni diffusion config onto verl-digen overrides, as ``{dotted key: value}``.

    Only keys whose concept is the same in both are mapped; see docs/migrating-from-verl-omni.md for
    the table. ``trainer_workers`` (verl-digen's trainer pool size) turns verl-omni's per-GPU training
    micro-batch into verl-digen's micro-batch, which the trainer ranks share. Whatever cannot be
    carried over exactly is described, key by key, in ``notes`` (when a list is given); the verl-omni keys
    that were read go into ``used``. A setting verl-digen cannot run at all (another loss, the
    direct-preference trainer, an unknown dtype) raises ``ConfigError`` naming the verl-omni key.
    """
    notes = notes if notes is not None else []
    used = used if used is not None else set()
    out: dict[str, Any] = {}

    def get(key: str, default: Any = None) -> Any:
        used.add(key)
        return _get(cfg, key, default)

    def put(key: str, value: Any, cast: Callable[[Any], Any] | None = None) -> None:
        if value is not None:  # unset in verl-omni: verl-digen's default stays
            out[key] = cast(value) if cast else value

    # -- what is trained: refuse what verl-digen does not implement, before anything else ---------------
    trainer_type = get("algorithm.trainer_type")
    if trainer_type not in (None, "policy_gradient"):
        raise _refuse("algorithm.trainer_type", trainer_type, "policy_gradient (verl-digen trains GRPO policy "
                      "gradients; the direct-preference trainer has no counterpart)")
    if get("algorithm.sample_source") not in (None, "online"):
        raise _refuse("algorithm.sample_source", _get(cfg, "algorithm.sample_source"), "online")
    algorithm = get(f"{ARR}.model.algorithm")
    loss_mode = get(f"{ARR}.actor.diffusion_loss.loss_mode")  # verl-omni's default: model.algorithm
    for key, value in ((f"{ARR}.model.algorithm", algorithm), (f"{ARR}.actor.diffusion_loss.loss_mode", loss_mode)):
        if value is not None and value not in LOSS_MODES:
            raise _refuse(key, value, f"one of {', '.join(LOSS_MODES)} (the losses verl-digen implements; "
                          "see docs/migrating-from-verl-omni.md)")
    adv = get("algorithm.adv_estimator")
    if adv is not None and adv not in LOSS_MODES:
        raise _refuse("algorithm.adv_estimator", adv, f"one of {', '.join(LOSS_MODES)} (GRPO group advantages)")
    for key in (f"{ARR}.actor.use_distill_loss", "distillation.enabled"):
        if get(key):
            raise _refuse(key, True, "false (distillation has no counterpart in verl-digen)")

    # -- batch and group --------------------------------------------------------------------------
    batch = get("data.train_batch_size")
    put("data.train_batch_size", batch, int)
    put("rollout.n", get(f"{ARR}.rollout.n"), int)
    micro = get(f"{ARR}.actor.ppo_micro_batch_size_per_gpu")
    if micro is not None:
        out["rollout.micro_batch_size"] = int(micro) * int(trainer_workers)
    mini = get(f"{ARR}.actor.ppo_mini_batch_size")
    if mini is not None and batch is not None and mini != batch:
        notes.append(f"{ARR}.actor.ppo_mini_batch_size={mini}: verl-digen takes one optimizer step per global "
                     f"step (a mini-batch of the whole data.train_batch_size={batch} prompts)")
    epochs = get(f"{ARR}.actor.ppo_epochs")
    if epochs not in (None, 1):
        notes.append(f"{ARR}.actor.ppo_epochs={epochs}: verl-digen trains each batch once")

    # -- sampling: steps, noise, SDE, trained window ------------------------------------------------
    steps = get(f"{ARR}.rollout.pipeline.num_inference_steps")
    put("rollout.num_steps", steps, int)
    put("rollout.noise_level", get(f"{ARR}.rollout.algo.noise_level"), float)
    sde = get(f"{ARR}.rollout.algo.sde_type")
    if sde is not None:
        if sde not in SDE_TYPES:
            raise _refuse(f"{ARR}.rollout.algo.sde_type", sde, f"one of {', '.join(SDE_TYPES)}")
        out["rollout.sde_type"] = SDE_TYPES[sde]
        if sde == "cps":
            out["rollout.cps_log_prob"] = "squared_error"
            notes.append(f"{ARR}.rollout.algo.sde_type=cps: kept verl-omni's CPS log-prob, -(x - mean)^2 without "
                         "the Gaussian 1 / (2 std^2) scale (rollout.cps_log_prob=squared_error), so clip_ratio "
                         "clips the same ratio; verl-digen's default is the Gaussian density")
    window = get(f"{ARR}.rollout.algo.sde_window_size")
    lo_hi = get(f"{ARR}.rollout.algo.sde_window_range")
    if window is not None:
        window = int(window)
        out.update({"rollout.selection": "window", "rollout.train_steps": window, "rollout.timestep_fraction": None})
        lo, hi = (int(v) for v in (lo_hi if lo_hi is not None else DEFAULT_WINDOW_RANGE))
        if steps is not None:
            hi = min(hi, int(steps))
        if hi - window == lo:
            out["rollout.window_start"] = lo
        else:
            out["rollout.window_range"] = [lo, hi]
            notes.append(f"{ARR}.rollout.algo.sde_window_range={[lo, hi]}"
                         f"{' (verl-omni default)' if lo_hi is None else ''}: the window start is drawn from "
                         f"[{lo}, {hi - window}] as in verl-omni, but once per global step for every sample "
                         "(verl-omni draws per request)")
        if get(f"{ARR}.rollout.algo.sde_contiguous") is False:
            notes.append(f"{ARR}.rollout.algo.sde_contiguous=False: verl-digen's SDE window is contiguous")
        if get(f"{ARR}.rollout.algo.sample_strategy") not in (None, "random"):
            notes.append(f"{ARR}.rollout.algo.sample_strategy={_get(cfg, f'{ARR}.rollout.algo.sample_strategy')!r}: "
                         "verl-digen draws the window start at random (MixGRPO's schedules are not implemented)")
    elif steps is not None:
        # no window: verl-omni runs the SDE on, and trains, steps 0 .. T-2 (the last step is deterministic)
        out.update({"rollout.selection": "first_k", "rollout.train_steps": max(1, int(steps) - 1),
                    "rollout.timestep_fraction": None})
    fraction = get("algorithm.timestep_fraction")
    if fraction not in (None, 1.0, 1):
        notes.append(f"algorithm.timestep_fraction={fraction}: not converted; verl-digen trains every stored step "
                     "(set rollout.timestep_fraction with rollout.selection=first_k)")

    # -- model, guidance, schedule -----------------------------------------------------------------------
    path = get(f"{ARR}.model.path")
    put("model.path", path)
    arch = _guess_arch(path)
    if arch is not None:
        out["model.arch"] = arch
    elif path is not None:
        notes.append(f"{ARR}.model.path={path!r}: set model.arch (one of flux, sd3, qwen_image, wan, hunyuan_video)")
    cfg_key = CFG_KEY.get(arch or "", "guidance_scale")
    other_key = "guidance_scale" if cfg_key == "true_cfg_scale" else "true_cfg_scale"
    scale, other = get(f"{ARR}.rollout.pipeline.{cfg_key}"), get(f"{ARR}.rollout.pipeline.{other_key}")
    if scale is None and other is not None and float(other) > 1:  # the recipe sets only the other key
        scale, cfg_key, other = other, other_key, None
    if scale is not None:
        out["rollout.guidance_scale"] = max(1.0, float(scale))
    if other is not None and float(other) > 1 and float(other) != float(scale if scale is not None else 1.0):
        notes.append(f"{ARR}.rollout.pipeline.{other_key}={other}: not used; for {arch or 'this model'} the guidance "
                     f"scale is {ARR}.rollout.pipeline.{cfg_key}={scale}")
    height, width = get(f"{ARR}.rollout.pipeline.height"), get(f"{ARR}.rollout.pipeline.width")
    vae = int(get(f"{ARR}.model.vae_scale_factor", VAE_SCALE_FACTOR) or VAE_SCALE_FACTOR)
    if height is not None and height == width:
        out["model.latent_size"] = int(height) // vae
    elif height is not None:
        notes.append(f"{ARR}.rollout.pipeline.height/width={height}x{width}: verl-digen uses square latents")
    sched, where = _scheduler_config(path)
    if sched is not None:
        out["rollout.shift"] = scheduler_shift(sched, height, width, vae)
        if sched.get("shift_terminal"):
            notes.append(f"{where}: shift_terminal={sched['shift_terminal']} (the schedule is stretched to end "
                         "there) is not reproduced; verl-digen's schedule ends at sigma 0")
    elif path is not None:
        notes.append(f"{ARR}.model.path={path!r}: no scheduler config found at {where}, so the sigma shift is not "
                     "taken from the model; set +rollout.shift (SD3.5: 3.0)")
    put("model.dtype", _dtype(get(f"{ARR}.actor.fsdp_config.model_dtype")))
    rank = get(f"{ARR}.model.lora_rank")
    put("model.lora_rank", rank, int)
    if rank:
        put("model.lora_alpha", get(f"{ARR}.model.lora_alpha"), float)
        targets = get(f"{ARR}.model.target_modules")
        if isinstance(targets, str):
            notes.append(f"{ARR}.model.target_modules={targets!r}: verl-digen takes a module list; its default "
                         "targets (the attention projections of the transformer) are used")
        elif targets is not None:
            out["model.target_modules"] = list(targets)

    # -- loss, advantages, KL -----------------------------------------------------------------------
    put("actor.clip_ratio", get(f"{ARR}.actor.diffusion_loss.clip_ratio"), float)
    put("algorithm.adv_clip", get(f"{ARR}.actor.diffusion_loss.adv_clip_max"), float)
    use_kl = get(f"{ARR}.actor.use_kl_loss")
    coef = get(f"{ARR}.actor.kl_loss_coef", 0.0)
    if use_kl is not None:
        out["actor.kl_coef"] = _kl_coef(float(coef), out, notes) if use_kl else 0.0
    global_std = get("algorithm.global_std")
    if global_std is not None:
        out["algorithm.adv_std"] = "batch" if global_std else "group"
    if get("algorithm.norm_adv_by_std_in_grpo") is False:
        notes.append("algorithm.norm_adv_by_std_in_grpo=False (Dr.GRPO, no std scaling): not supported")

    # -- optimizer ------------------------------------------------------------------------------------
    put("actor.lr", get(f"{ARR}.actor.optim.lr"), float)
    put("actor.weight_decay", get(f"{ARR}.actor.optim.weight_decay"), float)
    clip, legacy = get(f"{ARR}.actor.optim.clip_grad"), get(f"{ARR}.actor.grad_clip")
    if clip is not None:  # what verl-omni's FSDP engine clips with
        out["actor.grad_clip"] = float(clip)
        if legacy is not None and float(legacy) != float(clip):
            notes.append(f"{ARR}.actor.grad_clip={legacy}: not used (verl-omni's FSDP engine, and so verl-digen, clip "
                         f"with {ARR}.actor.optim.clip_grad={clip})")
    else:
        put("actor.grad_clip", legacy, float)

    # -- data -----------------------------------------------------------------------------------------
    files = get("data.train_files")
    if isinstance(files, (list, tuple)):
        files = files[0] if len(files) == 1 else files
    if isinstance(files, str) and files.endswith((".txt", ".jsonl")):
        out["data.train_files"] = files
    elif files is not None:
        notes.append(f"data.train_files={files!r}: verl-digen reads one .txt or .jsonl prompt file "
                     "(a 'prompt' field per line); convert the parquet prompts")

    # -- trainer bookkeeping --------------------------------------------------------------------------
    total = get("trainer.total_training_steps")
    put("trainer.total_steps", total, int)
    if total is None and get("trainer.total_epochs") is not None:
        notes.append(f"trainer.total_training_steps=None: verl-omni derives the steps from trainer.total_epochs="
                     f"{_get(cfg, 'trainer.total_epochs')} and the dataset; verl-digen does not, and runs "
                     "trainer.total_steps (its default unless set)")
    put("trainer.seed", get(f"{ARR}.rollout.seed"), int)
    for key in ("project_name", "experiment_name", "save_freq", "default_local_dir"):
        put(f"trainer.{key}", get(f"trainer.{key}"))
    loggers = get("trainer.logger")
    if loggers is not None:
        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        out["trainer.logger"] = [name for name in loggers if name in LOGGERS] or ["console"]
        dropped = [name for name in loggers if name not in LOGGERS]
        if dropped:
            notes.append(f"trainer.logger={loggers}: {', '.join(dropped)} not supported "
                         f"(kept: {out['trainer.logger']})")
    device = get("trainer.device")
    if device in DEVICES:
        out["trainer.device"] = DEVICES[device]
    elif device is not None:
        raise _refuse("trainer.device", device, f"one of {', '.join(DEVICES)} (gpu means cuda)")
    for key in ("trainer.nnodes", "trainer.n_gpus_per_node"):  # the pool split replaces them (resources.*)
        used.add(key)
    return out


def _dtype(value: Any) -> str | None:
    if value is None:
        return None
    name = str(value).lower().replace("torch.", "")
    if name not in DTYPES:
        raise _refuse(f"{ARR}.actor.fsdp_config.model_dtype", value, f"one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _kl_coef(coef: float, out: Mapping[str, Any], notes: list[str]) -> float:
    """verl-omni's ``kl_loss_coef`` as verl-digen's ``actor.kl_coef``.

    For ``sde`` (Flow-GRPO) verl-omni divides the squared mean difference by ``2 std_t^2`` where the step's
    real std is ``std_t sqrt(|dt|)``; verl-digen divides by the real variance, so its KL is verl-omni's
    divided by ``|dt|``. The coefficient is therefore multiplied by the mean ``|dt|`` of the trained steps
    (exact when they all have the same ``|dt|``, as without a shift). CPS and DanceGRPO: same convention.
    """
    if not coef or out.get("rollout.sde_type", "flow_grpo") != "flow_grpo":
        return coef
    steps = int(out.get("rollout.num_steps", 10))
    sigmas = _shifted_sigmas(steps, float(out.get("rollout.shift", 1.0)))
    if out.get("rollout.selection") == "window":
        start = out.get("rollout.window_start")
        lo, hi = (start, start + int(out["rollout.train_steps"])) if start is not None else out["rollout.window_range"]
    else:
        lo, hi = 0, int(out.get("rollout.train_steps", steps - 1))
    dts = [sigmas[i] - sigmas[i + 1] for i in range(lo, hi)]
    converted = coef * sum(dts) / len(dts)
    spread = f"; |dt| ranges {min(dts):.4g}..{max(dts):.4g} over those steps" if max(dts) - min(dts) > 1e-12 else ""
    notes.append(f"{ARR}.actor.kl_loss_coef={coef}: converted to actor.kl_coef={converted:.6g} (x mean |dt| = "
                 f"{sum(dts) / len(dts):.4g} of the trained steps {lo}..{hi - 1}): verl-omni's sde KL divides by std "
                 f"without sqrt(dt){spread}")
    return converted


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

    from verl_digen.trainer.config import RunConfig

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
        if key in schema and key not in base:  # a verl-digen key written into a shared section
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

    from verl_digen.trainer.config import RunConfig

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

    from verl_digen.trainer.config import ConfigError, load, validate

    raw = _as_dict(config)
    resources = raw.get("resources")
    if not isinstance(resources, Mapping) or not {"generator", "trainer"} <= set(resources):
        total = _get(raw, "trainer.nnodes", 1) * _get(raw, "trainer.n_gpus_per_node", 1)
        raise ConfigError("resources", resources, "+resources.generator.workers=G +resources.trainer.workers=R "
                          f"(verl-digen splits verl-omni's {total} GPUs into a generator and a trainer pool)")
    notes: list[str] = []
    used: set[str] = set()
    trainer_workers = int(_get(raw, "resources.trainer.workers", 1))
    flat = from_verl_omni_config(raw, trainer_workers=trainer_workers, notes=notes, used=used)
    files = _get(raw, "data.train_files")
    if files is not None and "data.train_files" not in flat:
        raise ConfigError("data.train_files", files, "a .txt or .jsonl prompt file (one 'prompt' per line)")
    native = _native_sections(raw, flat)
    native.setdefault("trainer", {}).setdefault("mode", "digen")
    path = _get(raw, f"{ARR}.model.path")
    if path is not None and "model.arch" not in flat and "arch" not in native.get("model", {}):
        raise ConfigError(f"{ARR}.model.path", path, "a model verl-digen has an adapter for (FLUX, SD3, Qwen-Image, "
                          "Wan, HunyuanVideo), or +model.arch=<flux|sd3|qwen_image|wan|hunyuan_video> if it is one")
    cfg = load(OmegaConf.merge(OmegaConf.create(_nested(flat)), OmegaConf.create(native)))
    for note in notes:
        log(f"verl-omni -> verl-digen: {note}")
    changed, at_default, considered = _classify(raw, used, verl_omni_defaults())
    for key, value in changed.items():
        log(f"verl-omni -> verl-digen: {key}={value!r} is not converted (no verl-digen counterpart); ignored")
    if at_default:
        log(f"verl-omni -> verl-digen: {len(at_default)} verl-omni keys at their defaults have no verl-digen "
            f"counterpart and are ignored: {', '.join(collapse_keys(at_default, considered))}")
    validate(cfg)
    return cfg


# ------------------------------------------------------------------------------------------- the adapter
class NullAgentLoopManager:
    """Stands in for verl-omni's agent-loop manager: verl-digen's generator pool does the rollout."""

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> NullAgentLoopManager:
        return cls()


class DigenVerlOmniTrainer:
    """verl-omni trainer mode ``digen``: runs verl-digen's runtime (``DigenTrainer``) on the converted config.

    It provides the surface verl-omni's ``DiffusionTaskRunnerV1`` calls: ``__init__(config)``, ``init()``,
    ``get_llm_client()``, ``get_reward_handles()`` and ``fit(agent_loop_manager)``. verl-omni's
    rollout servers and agent loop are not started. The generator pool replaces them.
    """

    runtime_cls: Callable[..., Any] | None = None  # default: verl_digen.trainer.runtime.DigenTrainer

    def __init__(self, config: Any) -> None:
        self.config = config
        # fails here, before any worker starts, on a bad config (normally entry_guard already did, in the driver)
        log = logger.debug if os.environ.get(CHECKED_ENV) else logger.warning
        self.run_config = to_run_config(config, log=log)
        self.dry_run = bool(self.run_config.trainer.dry_run)  # normally handled by entry_guard in the driver
        self.trainer: Any = None

    def init(self) -> None:
        """Route verl-omni's agent-loop construction to the null manager and build the runtime."""
        from omegaconf import DictConfig, open_dict

        if isinstance(self.config, DictConfig):
            with open_dict(self.config):
                rollout = self.config.actor_rollout_ref.rollout
                if rollout.get("agent") is None:
                    rollout.agent = {}
                rollout.agent.agent_loop_manager_class = NULL_AGENT_LOOP_MANAGER
        if self.dry_run:
            return
        runtime_cls = self.runtime_cls
        if runtime_cls is None:
            from verl_digen.trainer.runtime import DigenTrainer as runtime_cls
        self.trainer = runtime_cls(self.run_config)

    def get_llm_client(self) -> None:
        return None

    def get_reward_handles(self) -> list[Any]:
        return []

    def fit(self, agent_loop_manager: Any = None) -> Any:
        """Run ``trainer.total_steps`` global steps with verl-digen's scheduler, then release the workers."""
        if self.dry_run:  # print the plan, train nothing
            from verl_digen.main import dry_run

            print(dry_run(self.run_config))
            return None
        if self.trainer is None:
            self.init()
        try:
            return self.trainer.fit()
        finally:
            self.trainer.shutdown()
