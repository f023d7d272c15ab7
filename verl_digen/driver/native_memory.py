"""Keep the driver's native heap flat over a long run (docs/benchmarks.md, "Soak").

The driver's Python objects stay flat per step; what grew was memory glibc keeps after it is freed: Ray's
core-worker threads each get a malloc arena of their own, and freed chunks in them (and in the main heap)
are kept for reuse rather than returned. Two glibc calls bound that: one arena for every thread (the
driver's threads mostly wait on Ray, so they hardly contend for it), set before Ray starts its threads, and
``malloc_trim`` after every ``TRIM_EVERY`` steps (on a synthetic heap: about 5 ms the first time it is
fragmented, 0.03 ms once it is kept trimmed; the soak's driver busy time per step did not move beyond its
run-to-run spread). Both are no-ops where the C library is not glibc
(macOS, musl), and a ``MALLOC_ARENA_MAX`` the user set wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache

ARENAS = 1
TRIM_EVERY = 1  # steps
_M_ARENA_MAX = -8  # mallopt parameter (glibc's malloc.h)


@cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: raises AttributeError elsewhere
        return libc
    except (OSError, TypeError, AttributeError):
        return None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap this process's malloc arenas (threads made afterwards share them); False when not applied."""
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


def trim(step: int) -> bool:
    """Give freed heap memory back to the system every ``TRIM_EVERY`` steps; True when it trimmed."""
    libc = _glibc()
    if libc is None or step % TRIM_EVERY:
        return False
    libc.malloc_trim(0)
    return True
