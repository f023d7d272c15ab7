"""A Hydra search-path plugin that makes verl-digen's packaged configs composable from other entry points.

With it registered, a verl-omni (or verl) Hydra command line can select ``+trainer=digen`` (or
``colocated`` / ``separate``) from ``verl_digen/config/trainer/``. ``register()`` adds it at run time;
the same class also works as a ``hydra_plugins`` namespace-package plugin.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

SEARCH_PATH = "pkg://verl_digen.config"


class DigenSearchPathPlugin(SearchPathPlugin):
    """Appends verl-digen's config package, so the host application's own configs keep priority."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="verl-digen", path=SEARCH_PATH)


def register() -> None:
    """Register the plugin with Hydra's plugin registry (idempotent)."""
    Plugins.instance().register(DigenSearchPathPlugin)
