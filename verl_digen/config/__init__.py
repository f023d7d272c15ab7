"""The run config: its schema (``schema.py``), its one check (``validate.py``, with the checks beside
it) and its plan (``plan.py``, ``planning.py``); the Hydra YAML here is generated from the schema
(``generate.py``). What callers use most is re-exported here."""

from verl_digen.config.errors import ConfigError
from verl_digen.config.schema import RunConfig, compose, defaults, load
from verl_digen.config.validate import validate

__all__ = ["ConfigError", "RunConfig", "compose", "defaults", "load", "validate"]
