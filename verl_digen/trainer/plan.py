"""Deprecated alias of ``verl_digen.config.plan``: see ``verl_digen.trainer``."""

from verl_digen.trainer import alias

alias(__name__)
