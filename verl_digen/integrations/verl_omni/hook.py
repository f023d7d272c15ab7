"""The import hook: registers ``digen`` in verl-omni's trainer registry without importing verl-omni.

verl loads ``verl.plugins`` entry points on every ``import verl``, in every Ray worker too, and importing
verl-omni is heavy and has side effects, so ``install()`` costs one ``find_spec`` when verl-omni is absent
and otherwise registers ``digen`` right after verl-omni imports its ``trainer.diffusion.v1`` package.

Imports only the standard library at import time.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .adapter import DigenVerlOmniTrainer
from .entry import GUARD_MODULE, TRAINER_MODE, _install_entry_guard, keep_cpu_on_cpu

logger = logging.getLogger(__name__)

# verl-omni's v1 diffusion trainer package; its __init__ re-exports the registry from trainer_base.py.
REGISTRY_PACKAGE = "verl_omni.trainer.diffusion.v1"
REGISTRY_MODULE = "verl_omni.trainer.diffusion.v1.trainer_base"


def is_available() -> bool:
    """Whether verl-omni is installed, checked without importing it."""
    try:
        return importlib.util.find_spec("verl_omni") is not None
    except (ImportError, ValueError):
        return False


def _register_into(module: ModuleType) -> bool:
    """Put ``digen`` into the registry that ``module`` exposes; True when it is there afterwards.

    The package re-exports the registry of ``trainer_base.py`` (read at verl-omni 0.2.0rc1; its 0.3 entry still
    imports ``get_diffusion_trainer_cls`` from the package); should a newer package stop re-exporting the
    registry, the already imported ``trainer_base`` module that defines it is used."""
    base = sys.modules.get(REGISTRY_MODULE)
    if not hasattr(module, "DIFFUSION_TRAINER_REGISTRY") and base is not None:
        module = base
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
        # before verl-omni's main() calls verl's auto_set_device
        keep_cpu_on_cpu(getattr(sys, "orig_argv", sys.argv), os.environ)
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



def register_search_path() -> bool:
    """Add ``pkg://verl_digen.config`` to Hydra's search path (so ``+trainer=digen`` composes)."""
    try:
        from verl_digen.integrations import hydra_searchpath

        hydra_searchpath.register()
        return True
    except Exception as err:
        logger.debug("could not register verl-digen's Hydra search path: %r", err)
        return False
