"""What a config check and the memory plan read of the weight sync, without ray or torch: the backends'
names (``digen.sync.backend``) and the collective sync's pack size. ``workers/sync.py`` imports both ray and
torch (~1 s of CPU), which a dry run never needs.

``BUILTIN`` lists what ``workers/sync.py`` registers (``tests/workers/test_sync_registry.py`` holds the two
equal). A plugin's backend registers into that module's registry, which it imports: :func:`sync_backend_names`
reads the registry itself whenever it is loaded.
"""

from __future__ import annotations

import sys

#: every name ``workers/sync.py`` registers at import
BUILTIN = ("collective", "object_store")

#: collective sync: tensors smaller than this are packed together into buckets of at most this size, the only
#: buckets a receiver stages (larger tensors land in place); workers/buckets.py, config/memory.py
SYNC_PACK_MB = 64


def sync_backend_names() -> tuple[str, ...]:
    """The registered backend names, sorted: the registry's once ``workers/sync.py`` is imported, else
    ``BUILTIN`` (no backend can have registered without importing it)."""
    sync = sys.modules.get(f"{__package__}.sync")
    return tuple(sorted(sync.SYNC_BACKENDS if sync is not None else BUILTIN))
