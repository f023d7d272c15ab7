"""Deprecated alias of ``verl_digen.driver.pools``: see ``verl_digen.trainer``."""

from verl_digen.trainer import alias

alias(__name__)
