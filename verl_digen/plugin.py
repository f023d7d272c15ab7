"""verl's ``verl.plugins`` entry point: runs on every ``import verl`` (driver and Ray workers).

It only registers things and must never fail or import heavy modules: the CPU platform (selected with
``VERL_PLATFORM=cpu``), the lazy aliases for modules that moved between the supported verl versions
(``verl_digen.compat``), and, when verl-omni is installed, the ``digen`` trainer mode and this package's
Hydra configs (lazily, once verl-omni's trainer package is imported).
"""

from __future__ import annotations


def register() -> None:
    """Register verl-digen's hooks with verl."""
    from verl_digen.workers import platform_cpu  # noqa: F401  (registers the 'cpu' platform)

    try:  # modules moved between the supported verl versions (verl-omni imports the old paths)
        from verl_digen.compat import install_module_aliases

        install_module_aliases()
    except Exception:
        pass

    try:  # verl-omni users: trainer mode 'digen' + Hydra configs; a no-op without verl-omni, never raises
        from verl_digen.integrations.verl_omni import install

        install()
    except Exception:
        pass


register()
