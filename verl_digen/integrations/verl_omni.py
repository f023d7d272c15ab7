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
    configs to Hydra's search path and registers ``digen`` now (registry already imported) or right
    after verl-omni imports its ``trainer.diffusion.v1`` package. Never raises.
    """
    try:
        if not is_available():
            return False
        register_search_path()
        module = sys.modules.get(REGISTRY_PACKAGE)
        if _initialized(module):
            return _register_into(module)
        if not any(isinstance(f, _AfterImport) and f.name == REGISTRY_PACKAGE for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(REGISTRY_PACKAGE, _register_into))
        return True
    except Exception as err:
        logger.debug("verl-omni integration not installed: %r", err)
        return False


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
def _get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _guess_arch(path: str | None) -> str | None:
    low = (path or "").lower()
    return next((arch for hint, arch in ARCH_HINTS if hint in low), None)


def from_verl_omni_config(cfg: Mapping[str, Any], trainer_workers: int = 1,
                          notes: list[str] | None = None) -> dict[str, Any]:
    """Map a (resolved) verl-omni diffusion config onto verl-digen overrides, as ``{dotted key: value}``.

    Only keys whose concept is the same in both are mapped; see docs/migrating-from-verl-omni.md for
    the table. ``trainer_workers`` (verl-digen's trainer pool size) turns verl-omni's per-GPU training
    micro-batch into verl-digen's micro-batch, which the trainer ranks share. Whatever cannot be
    carried over exactly is described, key by key, in ``notes`` (when a list is given).
    """
    notes = notes if notes is not None else []
    out: dict[str, Any] = {}
    arr = "actor_rollout_ref"

    def put(key: str, value: Any, cast: Callable[[Any], Any] | None = None) -> None:
        if value is not None:  # unset in verl-omni: verl-digen's default stays
            out[key] = cast(value) if cast else value

    # -- batch and group --------------------------------------------------------------------------
    batch = _get(cfg, "data.train_batch_size")
    n = _get(cfg, f"{arr}.rollout.n")
    put("data.train_batch_size", batch, int)
    put("rollout.n", n, int)
    micro = _get(cfg, f"{arr}.actor.ppo_micro_batch_size_per_gpu")
    if micro is not None:
        out["rollout.micro_batch_size"] = int(micro) * int(trainer_workers)
    mini = _get(cfg, f"{arr}.actor.ppo_mini_batch_size")
    if mini is not None and batch is not None and mini != batch:
        notes.append(f"{arr}.actor.ppo_mini_batch_size={mini}: verl-digen takes one optimizer step per global "
                     f"step (a mini-batch of the whole data.train_batch_size={batch} prompts)")
    if _get(cfg, f"{arr}.rollout.log_prob_micro_batch_size_per_gpu") is not None:
        notes.append(f"{arr}.rollout.log_prob_micro_batch_size_per_gpu: no counterpart; verl-digen has no "
                     "separate old-log-prob pass (the rollout's log-probs are the old policy's)")

    # -- sampling: steps, noise, SDE, trained window ------------------------------------------------
    steps = _get(cfg, f"{arr}.rollout.pipeline.num_inference_steps")
    put("rollout.num_steps", steps, int)
    put("rollout.noise_level", _get(cfg, f"{arr}.rollout.algo.noise_level"), float)
    sde = _get(cfg, f"{arr}.rollout.algo.sde_type")
    if sde is not None:
        if sde in SDE_TYPES:
            out["rollout.sde_type"] = SDE_TYPES[sde]
        else:
            notes.append(f"{arr}.rollout.algo.sde_type={sde!r}: not supported (known: {', '.join(SDE_TYPES)})")
    window = _get(cfg, f"{arr}.rollout.algo.sde_window_size")
    if window is not None:
        out.update({"rollout.selection": "window", "rollout.train_steps": int(window),
                    "rollout.timestep_fraction": None})
        lo_hi = _get(cfg, f"{arr}.rollout.algo.sde_window_range")
        if lo_hi is not None and int(lo_hi[1]) - int(window) == int(lo_hi[0]):
            out["rollout.window_start"] = int(lo_hi[0])
        elif lo_hi is not None:
            notes.append(f"{arr}.rollout.algo.sde_window_range={list(lo_hi)}: verl-digen draws the window start "
                         f"once per global step from [0, num_steps - {window}], not per request from "
                         f"[{lo_hi[0]}, {int(lo_hi[1]) - int(window)}]; set rollout.window_start to fix it")
    elif steps is not None:
        # no window: verl-omni runs the SDE on, and trains, steps 0 .. T-2 (the last step is deterministic)
        out.update({"rollout.selection": "first_k", "rollout.train_steps": max(1, int(steps) - 1),
                    "rollout.timestep_fraction": None})

    # -- loss, advantages, KL -----------------------------------------------------------------------
    put("actor.clip_ratio", _get(cfg, f"{arr}.actor.diffusion_loss.clip_ratio"), float)
    put("algorithm.adv_clip", _get(cfg, f"{arr}.actor.diffusion_loss.adv_clip_max"), float)
    if _get(cfg, f"{arr}.actor.use_kl_loss") is not None:
        use_kl = bool(_get(cfg, f"{arr}.actor.use_kl_loss"))
        out["actor.kl_coef"] = float(_get(cfg, f"{arr}.actor.kl_loss_coef", 0.0)) if use_kl else 0.0
    global_std = _get(cfg, "algorithm.global_std")
    if global_std is not None:
        out["algorithm.adv_std"] = "batch" if global_std else "group"
    if _get(cfg, "algorithm.norm_adv_by_std_in_grpo") is False:
        notes.append("algorithm.norm_adv_by_std_in_grpo=False (Dr.GRPO, no std scaling): not supported")
    loss_mode = _get(cfg, f"{arr}.model.algorithm")
    if loss_mode is not None and loss_mode not in ("flow_grpo", "dance_grpo"):
        notes.append(f"{arr}.model.algorithm={loss_mode!r}: verl-digen implements flow_grpo / dance_grpo only")

    # -- optimizer ------------------------------------------------------------------------------------
    put("actor.lr", _get(cfg, f"{arr}.actor.optim.lr"), float)
    put("actor.weight_decay", _get(cfg, f"{arr}.actor.optim.weight_decay"), float)
    put("actor.grad_clip", _get(cfg, f"{arr}.actor.grad_clip"), float)

    # -- model and LoRA -------------------------------------------------------------------------------
    path = _get(cfg, f"{arr}.model.path")
    put("model.path", path)
    arch = _guess_arch(path)
    if arch is not None:
        out["model.arch"] = arch
    elif path is not None:
        notes.append(f"{arr}.model.path={path!r}: set model.arch (one of flux, sd3, qwen_image, wan, hunyuan_video)")
    put("model.dtype", _get(cfg, f"{arr}.actor.fsdp_config.model_dtype"))
    rank = _get(cfg, f"{arr}.model.lora_rank")
    put("model.lora_rank", rank, int)
    if rank:
        put("model.lora_alpha", _get(cfg, f"{arr}.model.lora_alpha"), float)
        targets = _get(cfg, f"{arr}.model.target_modules")
        if isinstance(targets, str):
            notes.append(f"{arr}.model.target_modules={targets!r}: verl-digen takes a module list; its default "
                         "targets (the attention projections of the transformer) are used")
        elif targets is not None:
            out["model.target_modules"] = list(targets)
    height, width = _get(cfg, f"{arr}.rollout.pipeline.height"), _get(cfg, f"{arr}.rollout.pipeline.width")
    if height is not None and height == width:
        out["model.latent_size"] = int(height) // VAE_SCALE_FACTOR
    elif height is not None:
        notes.append(f"{arr}.rollout.pipeline.height/width={height}x{width}: verl-digen uses square latents")

    # -- data -----------------------------------------------------------------------------------------
    files = _get(cfg, "data.train_files")
    if isinstance(files, (list, tuple)):
        files = files[0] if len(files) == 1 else files
    if isinstance(files, str) and files.endswith((".txt", ".jsonl")):
        out["data.train_files"] = files
    elif files is not None:
        notes.append(f"data.train_files={files!r}: verl-digen reads one .txt or .jsonl prompt file "
                     "(a 'prompt' field per line); convert the parquet prompts")

    # -- trainer bookkeeping --------------------------------------------------------------------------
    put("trainer.total_steps", _get(cfg, "trainer.total_training_steps"), int)
    put("trainer.seed", _get(cfg, f"{arr}.rollout.seed"), int)
    for key in ("project_name", "experiment_name", "save_freq", "default_local_dir"):
        put(f"trainer.{key}", _get(cfg, f"trainer.{key}"))
    loggers = _get(cfg, "trainer.logger")
    if loggers is not None:
        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        out["trainer.logger"] = [name for name in loggers if name in LOGGERS] or ["console"]
    device = _get(cfg, "trainer.device")
    if device in ("cuda", "cpu"):
        out["trainer.device"] = device
    elif device is not None:
        notes.append(f"trainer.device={device!r}: verl-digen runs on cuda or cpu")
    if _get(cfg, "reward") is not None:
        notes.append("reward.*: verl-omni's reward functions / reward models are not carried over; choose "
                     "verl-digen's reward.name (or reward.weights)")
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

    ``digen`` and ``resources`` are taken whole. From the other sections, only keys of verl-digen's
    schema are taken, and only where the mapping did not already convert the same key. verl-omni has no
    top-level ``model`` / ``rollout`` / ``actor``, and where a section name is shared (``data``,
    ``trainer``, ``algorithm``, ``reward``), same-named keys mean the same thing.
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
        keep = {k: v for k, v in value.items() if k in ours and f"{section.name}.{k}" not in flat}
        if keep:
            native[section.name] = keep
    return native


def to_run_config(config: Any, log: Callable[[str], Any] = logger.warning) -> Any:
    """verl-omni config (DictConfig or mapping) -> validated ``RunConfig``.

    verl-digen's own keys ride along in the verl-omni config (see ``_native_sections``). ``digen.*`` is
    set by ``+trainer=digen``. ``resources.*`` (the generator / trainer pool split) has no verl-omni
    counterpart and is required. ``trainer.mode`` defaults to ``digen``.
    """
    from omegaconf import DictConfig, OmegaConf

    from verl_digen.trainer.config import ConfigError, load, validate

    raw = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)
    resources = raw.get("resources")
    if not isinstance(resources, Mapping) or not {"generator", "trainer"} <= set(resources):
        total = _get(raw, "trainer.nnodes", 1) * _get(raw, "trainer.n_gpus_per_node", 1)
        raise ConfigError("resources", resources, "+resources.generator.workers=G +resources.trainer.workers=R "
                          f"(verl-digen splits verl-omni's {total} GPUs into a generator and a trainer pool)")
    notes: list[str] = []
    trainer_workers = int(_get(raw, "resources.trainer.workers", 1))
    flat = from_verl_omni_config(raw, trainer_workers=trainer_workers, notes=notes)
    files = _get(raw, "data.train_files")
    if files is not None and "data.train_files" not in flat:
        raise ConfigError("data.train_files", files, "a .txt or .jsonl prompt file (one 'prompt' per line)")
    native = _native_sections(raw, flat)
    native.setdefault("trainer", {}).setdefault("mode", "digen")
    cfg = load(OmegaConf.merge(OmegaConf.create(_nested(flat)), OmegaConf.create(native)))
    for note in notes:
        log(f"verl-omni -> verl-digen: {note}")
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
        self.run_config = to_run_config(config)  # fails here, before any worker starts, on a bad config
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
        if self.trainer is None:
            self.init()
        try:
            return self.trainer.fit()
        finally:
            self.trainer.shutdown()
