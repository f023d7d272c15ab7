"""verl-omni's entry points, guarded: a digen config run through the v0 entry is refused, converted and
validated in verl-omni's driver before Ray starts, and a dry run prints the plan there.

Imports only the standard library at import time.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

from .convert import _get, to_run_config

TRAINER_MODE = "digen"  # verl-omni's trainer.v1.trainer_mode that selects verl-digen
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


def _v1_entry_args(argv: list[str]) -> list[str] | None:
    """The arguments after verl-omni's v1 entry in a whole command line (``sys.orig_argv``: ``sys.argv[0]``
    is still ``-m`` while verl-omni's packages import verl), or None for any other program."""
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv):
            return argv[i + 2:] if argv[i + 1] == V1_ENTRY else None
        if a.replace(os.sep, "/").endswith(V1_ENTRY.replace(".", "/") + ".py"):
            return argv[i + 1:]
    return None


def keep_cpu_on_cpu(argv: list[str], environ: Any) -> bool:
    """A digen run through verl-omni's v1 entry with ``trainer.device=cpu`` on its command line (``argv``:
    the whole one, ``sys.orig_argv``): set ``VERL_PLATFORM=cpu`` (when unset) before verl's
    ``auto_set_device`` runs, which otherwise turns ``cpu`` into ``cuda`` on a machine without GPUs (verl
    then assumes CUDA) and the run later waits for GPU workers that never fit. Called from the
    ``verl.plugins`` hook at ``import verl``, which happens before verl-omni's ``main()``. Returns whether
    it set the platform."""
    rest = _v1_entry_args(argv)
    if environ.get("VERL_PLATFORM") or rest is None:
        return False
    args = {a.lstrip("+") for a in rest}
    if "trainer.device=cpu" not in args or not {f"trainer.v1.trainer_mode={TRAINER_MODE}", "trainer=digen"} & args:
        return False
    environ["VERL_PLATFORM"] = "cpu"
    print("verl-digen: trainer.device=cpu, so VERL_PLATFORM=cpu is set for this run (verl's auto_set_device "
          "would make it cuda)", file=sys.stderr)
    return True


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
    converted config and the resource plan and exits 0; a run whose resumed checkpoint is already at
    ``trainer.total_steps`` says "nothing to do" and exits 0.
    """
    if not wants_digen(config):
        return
    problem = check_entry(config)
    if problem is not None:
        print(f"verl-digen: {problem}", file=sys.stderr)
        raise SystemExit(2)
    from verl_digen.config import ConfigError

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
    from verl_digen.config import checks

    done = checks.finished(run_config)
    if done is not None:  # as verl-digen's own entry says it: before Ray, the TaskRunner and the pools start
        print(done)
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
    if run_config.trainer.device != "cpu" or run_config.ray_address()[0] or select("ray_kwargs.ray_init.address"):
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
