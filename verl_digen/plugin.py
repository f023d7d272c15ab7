"""verl's ``verl.plugins`` entry point: runs on every ``import verl`` (driver and Ray workers).

It only registers things and must never fail or import heavy modules: it registers the CPU platform
(selected with ``VERL_PLATFORM=cpu``).
"""

from __future__ import annotations


def register() -> None:
    """Register verl-digen's hooks with verl."""
    from verl_digen.workers import platform_cpu  # noqa: F401  (registers the 'cpu' platform)


register()
