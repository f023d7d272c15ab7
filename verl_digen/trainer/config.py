"""Deprecated alias of ``verl_digen.config.schema``, with ``validate`` and ``ConfigError``: see
``verl_digen.trainer``."""

import warnings

from verl_digen.config.errors import ConfigError  # noqa: F401
from verl_digen.config.schema import *  # noqa: F403
from verl_digen.config.validate import validate  # noqa: F401

warnings.warn("verl_digen.trainer.config moved to verl_digen.config (schema, validate); the old path is "
              "removed in verl-digen 0.3", DeprecationWarning, stacklevel=2)
