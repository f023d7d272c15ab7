"""Every difference between the verl versions verl-digen supports, in one place.

verl-digen is tested with two verls: 0.9.1 (the release) and commit 8a69493 (reports ``0.9.0.dev``),
the verl that verl-omni 0.2.0rc1 pins. The verl APIs verl-digen itself calls (single controller, worker
groups, FSDP2 helpers, the platform registry, ``verl.plugins`` entry points, tracking) have the same
signatures in both, so verl-digen needs no branches of its own. The one difference that matters is for
verl-omni running next to verl 0.9.1: verl 0.9.0 moved ``verl.utils.chat_template`` to
``verl.utils.tokenizer.chat_template``, and verl-omni imports the old path. ``install_module_aliases()``
(called by ``verl_digen.plugin`` on every ``import verl``) resolves such moved modules lazily, and only
when the old path does not exist in the installed verl.

``VERL_REQUIREMENT`` is the range ``setup.py`` declares; widen it only together with the tests that run
both ends (see docs/architecture.md, "Layout").

Checked against what (2026-12-06). Run: verl 0.9.1 and 8a69493 (the pin of verl-omni 0.2.0rc1, a1139ba), by the
test suite. Read, not run: verl-omni 0.3 moved its pin (``.github/verl_pin.txt``) to c4b389a, which reports
``0.10.0.dev``, outside the range, and later to fefb080. At c4b389a (verl's git history, read with ``git show``)
every interface verl-digen uses is there with the signature it has at 8a69493: the ``verl.plugins`` entry-point
loop in ``verl/__init__.py``; ``RayResourcePool``, ``RayClassWithInitArgs``, ``RayWorkerGroup`` and
``sort_placement_group_by_node_ip`` (``verl.single_controller.ray.base``); ``Worker``, ``register`` and
``Dispatch.ONE_TO_ALL`` / ``DP_COMPUTE``; ``gather_outputs_and_unpad``, ``gather_heads_scatter_seq``,
``gather_seq_scatter_heads``; ``Tracking``; ``get_fsdp_full_state_dict``; ``get_device_name``,
``get_nccl_backend``; ``PlatformRegistry.register`` and ``PlatformBase``; ``verl.utils.chat_template`` is
gone there too, so the alias below serves it. verl-omni 0.3's side (read from its newer files): its v1 entry
still looks the trainer up with ``get_diffusion_trainer_cls`` from ``verl_omni.trainer.diffusion.v1`` (whose
``trainer_base`` still defines ``register_diffusion_trainer`` and ``DIFFUSION_TRAINER_REGISTRY``; the hook
registers there when the package does not re-export them), builds the manager named by
``rollout.agent.agent_loop_manager_class`` with ``.create(config=, llm_client=, reward_loop_worker_handles=)``,
and calls ``verl_omni.utils.diffusion_attention.validate_attention_consistency`` before Ray (after its own
``verl_omni.utils.config.validate_config``). fefb080 is in no snapshot available here and was not read. No
verl 0.10 can be installed in this project's tests, so the range stays where the tests run it.

This module imports only the standard library.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from types import ModuleType
from typing import Any

#: the pip requirement setup.py declares: both tested verls, nothing newer
VERL_REQUIREMENT = "verl>=0.9.0.dev0,<=0.9.1"
#: the ``[vllm]`` extra: vllm-omni 0.30.0 imports cleanly only against vllm 0.30.x (0.33 / 0.34 lack modules
#: it imports and ``LoRARequest.tensorizer_config_dict``)
VLLM_EXTRA = ("vllm==0.30.*", "vllm-omni==0.30.0")
#: what those releases require of packages verl-digen also depends on (their PyPI metadata, read 2026-12-04):
#: installing the extra keeps torch 2.13.0, moves diffusers to 0.40.0 and transformers to 5.13-5.14
VLLM_EXTRA_PINS = {"torch": "2.13.0", "diffusers": "0.40.0", "transformers": ">=5.13.0,<5.15"}
#: old module path -> where the installed verl has it (moved between the tested versions)
MODULE_ALIASES = {"verl.utils.chat_template": "verl.utils.tokenizer.chat_template"}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("dev")[0])[:3])


def verl_version() -> str | None:
    """The version string of the verl that ``import verl`` finds (not the pip metadata, which may be
    another copy's), without importing verl; None when verl is absent."""
    module = sys.modules.get("verl")
    if module is not None and getattr(module, "__version__", None):
        return str(module.__version__)
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            with open(f"{folder}/version/version") as handle:
                return handle.read().strip()
        except OSError:
            continue
    return None


def is_tested_verl(version: str | None = None) -> bool:
    """Whether ``version`` (default: the importable verl) lies in the tested range 0.9.0.dev .. 0.9.1."""
    version = version if version is not None else verl_version()
    if not version:
        return False
    release = _release(version)
    return (0, 9, 0) <= release <= (0, 9, 1)


class _AliasLoader(importlib.abc.Loader):
    """Loads an old module path as the module now living at ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        return None


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: asked only when no regular finder found the old path."""

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = dict(aliases)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = self.aliases.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install_module_aliases(aliases: dict[str, str] | None = None) -> bool:
    """Make each old module path importable as its new one, when (and only when) verl lacks the old path.

    The finder goes last on ``sys.meta_path``, so a verl that still has the module (the pinned commit)
    imports its own file and nothing is aliased. Nothing is imported here. Idempotent; returns True when
    the finder is installed.
    """
    if any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        return True
    sys.meta_path.append(_AliasFinder(aliases if aliases is not None else MODULE_ALIASES))
    return True
