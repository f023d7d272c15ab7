"""Deprecated alias of ``verl_digen.driver.ray_backend``: see ``verl_digen.trainer``."""

from verl_digen.trainer import alias

alias(__name__)
