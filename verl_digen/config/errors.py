"""``ConfigError``: what every check of a run's config raises, in a module of its own so that the
checks (``checks``, ``memory``, ``user_inputs``) and the schema need not import each other."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key, the value and what is allowed."""

    def __init__(self, key: str, value: Any, expected: str) -> None:
        super().__init__(f"config key '{key}' = {value!r} is invalid: expected {expected}")
        self.key, self.value, self.expected = key, value, expected
