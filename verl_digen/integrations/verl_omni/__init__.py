"""verl-omni integration: ``digen`` as a trainer mode of verl-omni's v1 diffusion trainer.

verl-omni's ``python -m verl_omni.trainer.main_diffusion_v1 trainer.use_v1=true
trainer.v1.trainer_mode=<mode>`` looks ``<mode>`` up in ``DIFFUSION_TRAINER_REGISTRY``
(``verl_omni/trainer/diffusion/v1/trainer_base.py``, filled by ``register_diffusion_trainer(name)``).
Its TaskRunner then calls ``cls(config=config)``, ``.init()``, ``.get_llm_client()``,
``.get_reward_handles()`` and ``.fit(agent_loop_manager)``. ``DigenVerlOmniTrainer`` provides that
surface and runs verl-digen's own runtime on the converted config.

Four modules, one job each:

- ``hook``: registration. ``install()`` (called by ``verl_digen.plugin``) costs one ``find_spec`` when
  verl-omni is absent; when it is present, it registers ``digen`` as soon as verl-omni's
  ``trainer.diffusion.v1`` package has been imported, and adds verl-digen's Hydra configs to the search
  path. ``register()`` does the same eagerly.
- ``entry``: the guard around verl-omni's entry points (v0 refusal, early conversion, dry run).
- ``convert``: verl-omni config -> ``RunConfig`` (``from_verl_omni_config``, ``to_run_config``).
- ``adapter``: ``DigenVerlOmniTrainer``, the trainer mode itself.

Every name is importable from this package, which is the public path; the package imports only the
standard library at import time.
"""

from __future__ import annotations

from .adapter import NULL_AGENT_LOOP_MANAGER, PUBLIC_MODULE, DigenVerlOmniTrainer, NullAgentLoopManager
from .convert import (
    ARR,
    DEFAULT_WINDOW_RANGE,
    DEVICES,
    DIGEN_ONLY_SECTIONS,
    ENTRY_KEYS,
    LOSS_MODES,
    NOT_CARRIED,
    SDE_TYPES,
    VAE_SCALE_FACTOR,
    _classify,
    _get,
    _native_sections,
    _nested,
    collapse_keys,
    from_verl_omni_config,
    is_dry_run,
    scheduler_shift,
    to_run_config,
    unmapped_keys,
    verl_omni_defaults,
)
from .entry import (
    CHECKED_ENV,
    GUARD_FUNCTION,
    GUARD_MODULE,
    TRAINER_MODE,
    V0_ENTRY,
    V1_ENTRY,
    check_entry,
    entry_guard,
    keep_cpu_on_cpu,
    ray_cpu_shortfall,
    wants_digen,
)
from .hook import REGISTRY_MODULE, REGISTRY_PACKAGE, install, is_available, register, register_search_path

__all__ = [
    "ARR", "CHECKED_ENV", "DEFAULT_WINDOW_RANGE", "DEVICES", "DIGEN_ONLY_SECTIONS",
    "DigenVerlOmniTrainer", "ENTRY_KEYS", "GUARD_FUNCTION", "GUARD_MODULE", "LOSS_MODES", "NOT_CARRIED",
    "NULL_AGENT_LOOP_MANAGER", "NullAgentLoopManager", "PUBLIC_MODULE", "REGISTRY_MODULE", "REGISTRY_PACKAGE",
    "SDE_TYPES", "TRAINER_MODE", "V0_ENTRY", "V1_ENTRY", "VAE_SCALE_FACTOR", "_classify", "_get", "_native_sections",
    "_nested", "check_entry", "collapse_keys", "entry_guard", "from_verl_omni_config", "install", "is_available",
    "is_dry_run", "keep_cpu_on_cpu", "ray_cpu_shortfall", "register", "register_search_path", "scheduler_shift",
    "to_run_config", "unmapped_keys", "verl_omni_defaults", "wants_digen",
]
