"""``reward.functions``: verl-omni's multi-reward manager (``reward.reward_functions``) as a weighted sum of
per-sample ``CustomReward`` components, each called with only the keywords its signature declares
(rewards/custom.py), and the checks its entries get before Ray.
"""

from __future__ import annotations

import math
from typing import Any

from .custom import CUSTOM, check_function

#: the keys of a ``reward.functions`` entry that are not the function's own keyword arguments
FUNCTION_KEYS = ("path", "name", "weight", "required")


def functions_spec(functions: dict[str, Any], files: dict[str, str | None] | None = None,
                   prompt_key: str = "prompt") -> dict[str, Any]:
    """``reward.functions`` (``{key: {path, name, weight, required, **kwargs}}``) as a weighted reward spec:
    one per-sample, keyword-filtered ``custom`` component per key."""
    files = {f"{split}_file": path for split, path in (files or {}).items() if path}
    spec = {}
    for key, entry in functions.items():
        entry = dict(entry)
        spec[key] = {"name": CUSTOM, "weight": float(entry.get("weight", 1.0)), "path": entry["path"],
                     "function": entry["name"], "required": parse_required(entry.get("required", False), key),
                     "reward_kwargs": {k: v for k, v in entry.items() if k not in FUNCTION_KEYS},
                     "filter_kwargs": True, **files, **({"prompt_key": prompt_key} if files else {})}
    return spec


def parse_required(value: Any, key: str = "?") -> bool:
    """verl-omni's ``required``: a bool, or the string ``true`` / ``false`` (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"reward.functions.{key}.required = {value!r}: expected true or false")


def check_functions(functions: Any, served: bool = False) -> list[tuple[str, str]]:
    """``reward.functions`` before Ray: every entry names a loadable function that verl-omni's keyword filter
    can call, a finite weight, a boolean ``required``; the weights sum to more than 0. Raises ``ValueError``
    as ``(key, message)`` in its args; returns the (key, path) pairs."""
    if not isinstance(functions, dict) or not functions:
        raise ValueError("reward.functions", "a mapping {name: {path, name, weight, required}} with an entry")
    total, out = 0.0, []
    for key, entry in functions.items():
        where = f"reward.functions.{key}"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ValueError(where, f"a mapping with a path (a .py file) and a name (got {entry!r})")
        name = entry.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{where}.name", f"the name of a function in {entry['path']} (got {name!r})")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"{where}.weight", f"a finite number (got {weight!r})")
        try:
            parse_required(entry.get("required", False), key)
        except ValueError:
            raise ValueError(f"{where}.required", f"true or false (got {entry.get('required')!r})") from None
        total += float(weight)
        kwargs = {k: v for k, v in entry.items() if k not in FUNCTION_KEYS}
        try:
            check_function(entry["path"], name, kwargs, filter_kwargs=True, served=served)
        except ValueError as err:
            raise ValueError(f"{where}.path", f"a loadable reward function ({err})") from None
        out.append((key, entry["path"]))
    if total <= 0:
        raise ValueError("reward.functions", f"weights that sum to more than 0 (they sum to {total})")
    return out
