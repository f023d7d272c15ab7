"""One registry for every pluggable part: model adapters, rewards, TAG policies, weight-sync backends.

Each is a :class:`Registry`: entries are added with ``@REGISTRY.register("name")`` (or a plain call),
a second, different entry under a taken name raises unless ``overwrite=True`` (re-importing the module
that registered it does not), and :meth:`Registry.lookup` refuses an unknown name by listing the
registered ones. Standard library only: the scheduling core registers its TAG policies here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def qualname(obj: Any) -> str:
    """``module.Qualname`` of a class or function (what tells two registrations apart)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Mapping[str, T], Generic[T]):
    """Named entries of one kind (``kind`` names it in errors: "reward", "TAG policy", ...).

    ``identity(entry)`` is what makes two registrations the same one (default: the entry's qualified
    name); a read-only ``Mapping`` otherwise (``name in registry``, ``sorted(registry)``)."""

    def __init__(self, kind: str, identity: Callable[[T], str] = qualname) -> None:
        self.kind, self.identity = kind, identity
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None, *, overwrite: bool = False) -> Any:
        """Add ``entry`` under ``name``; without ``entry``, a decorator that adds what it decorates."""

        def add(e: T) -> T:
            old = self._entries.get(name)
            if old is not None and not overwrite and self.identity(old) != self.identity(e):
                raise ValueError(f"{self.kind} {name!r} is already registered by {self.identity(old)}; pass "
                                 "overwrite=True to replace it")
            self._entries[name] = e
            return e

        return add if entry is None else add(entry)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests, plugins that replace an entry); absent names are ignored."""
        self._entries.pop(name, None)

    def lookup(self, name: str) -> T:
        """The entry of ``name``; ``ValueError`` listing the registered names otherwise."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self._entries))}")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
