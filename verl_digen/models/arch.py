"""The adapter class of each architecture, found from its facts: ``archs.ARCHS`` (torch-free) names every
architecture and its adapter (``ArchFacts.adapter``); ``MODEL_REGISTRY`` imports an adapter module the first time
its class is asked for and checks that the class points back to those facts. Adding a model is one adapter file
plus its ``register_arch(ArchFacts(...))`` in ``verl_digen/archs.py`` (see docs/architecture.md, "Adding a
model")."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from verl_digen.archs import (  # noqa: F401  (re-exported: the names every model module used from here)
    ARCH_ALIASES,
    ARCHS,
    ArchFacts,
    arch_facts,
    canonical_arch,
    register_arch,
    unregister_arch,
)
from verl_digen.models.adapter import DiffusersAdapter

#: what every adapter class must declare besides ``facts`` (``DiffusersAdapter`` documents each)
REQUIRED_ATTRIBUTES: tuple[str, ...] = ("facts", "tiny", "packed", "text_dim_key", "pooled_dim_key")


def _check(cls: type[DiffusersAdapter], facts: ArchFacts) -> type[DiffusersAdapter]:
    """Refuse a class that misses a declaration, leaves a hook abstract, or points to other facts."""
    missing = [a for a in REQUIRED_ATTRIBUTES if not hasattr(cls, a)]
    if missing:
        raise TypeError(f"{cls.__name__} does not declare {missing} (see DiffusersAdapter)")
    for abstract in ("_forward", "_decode_latents"):
        if getattr(getattr(cls, abstract), "__isabstractmethod__", False):
            raise TypeError(f"{cls.__name__} does not implement {abstract}")
    if cls.facts is not facts:
        raise TypeError(f"{cls.__name__}.facts is not the registered facts of {facts.name!r} (declare "
                        f"facts = archs.<its ArchFacts>)")
    return cls


class _Adapters(Mapping[str, type[DiffusersAdapter]]):
    """Canonical arch name -> adapter class, over every registered ``ArchFacts``; a class is imported once."""

    def __init__(self) -> None:
        self._classes: dict[str, type[DiffusersAdapter]] = {}

    def __getitem__(self, arch: str) -> type[DiffusersAdapter]:
        facts = ARCHS[arch]  # KeyError for an unknown canonical name, as a dict
        cls = self._classes.get(arch)
        if cls is None or cls.facts is not facts:
            module, _, name = facts.adapter.rpartition(".")
            cls = self._classes[arch] = _check(getattr(importlib.import_module(module), name), facts)
        return cls

    def __iter__(self) -> Iterator[str]:
        return iter(ARCHS)

    def __len__(self) -> int:
        return len(ARCHS)


#: canonical arch name -> adapter class (built from ``archs.ARCHS``)
MODEL_REGISTRY = _Adapters()


def register(cls: type[DiffusersAdapter]) -> type[DiffusersAdapter]:
    """Register ``cls`` and its facts in one call (an adapter declared outside the tree, e.g. in a test):
    refuses a class that misses a declaration and a name or alias already taken."""
    facts = getattr(cls, "facts", None)
    if not isinstance(facts, ArchFacts):
        raise TypeError(f"{cls.__name__} does not declare ['facts'] (an archs.ArchFacts)")
    _check(cls, facts)
    register_arch(facts)
    MODEL_REGISTRY._classes[facts.name] = cls
    return cls


def unregister(arch: str) -> None:
    """Remove ``arch``, its aliases and its adapter (tests that register a throwaway architecture)."""
    MODEL_REGISTRY._classes.pop(arch, None)
    unregister_arch(arch)
