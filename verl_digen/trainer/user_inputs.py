"""Deprecated alias of ``verl_digen.config.user_inputs``: see ``verl_digen.trainer``."""

from verl_digen.trainer import alias

alias(__name__)
