"""Deprecated alias of ``verl_digen.reporting.run_log``: see ``verl_digen.trainer``."""

from verl_digen.trainer import alias

alias(__name__)
