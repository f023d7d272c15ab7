"""Rewards users bring as a Python file: verl's ``custom_reward_function.path`` / ``.name``.

The file defines a *batched* function (the exact contract, also in docs/rewards.md)::

    def compute_score(images, prompts, **reward_kwargs) -> list[float]:
        # images: torch.Tensor (N, 3, H, W), float, values in [0, 1], on the generator's device
        #         (video is scored frame by frame: N = samples x frames, averaged per sample)
        # prompts: list[str] of length N (prompts[i] belongs to images[i])
        # reward_kwargs: custom_reward_function.reward_kwargs (empty by default)
        # returns: N finite scores (a list, a numpy array or a tensor)

It runs on the generator pool (where every reward model lives), under ``torch.no_grad``; the scores
become float64 like every other reward's. ``check_function`` loads the file on the driver before Ray
starts (file exists, imports, function found and callable), so a typo in the path or the name costs a
second. Why batched: a judge model scores a micro-batch in one forward, one call per image would not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .base import Reward

CUSTOM = "custom"


def load_function(path: str, name: str) -> Callable[..., Any]:
    """Import ``path`` as a module and return its callable ``name``; ``ValueError`` naming what is wrong."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"{path}: no such file (custom_reward_function.path must be a Python file)")
    if p.suffix != ".py":
        raise ValueError(f"{path}: expected a .py file, not {p.suffix or 'no suffix'!r}")
    # a private module name per file: two custom rewards never share (or clobber) one module
    mod_name = "digen_custom_reward_" + hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:12]
    stamp = (p.stat().st_mtime_ns, p.stat().st_size)
    module = sys.modules.get(mod_name)
    if module is None or getattr(module, "__digen_stamp__", None) != stamp:  # imported once per process and version
        spec = importlib.util.spec_from_file_location(mod_name, p)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            raise ValueError(f"{path}: importing it failed ({type(err).__name__}: {err})") from None
        module.__digen_stamp__ = stamp
        sys.modules[mod_name] = module
    if not hasattr(module, name):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == mod_name)
        raise ValueError(f"{path}: has no function {name!r} (custom_reward_function.name; functions defined "
                         f"there: {', '.join(found) or 'none'})")
    fn = getattr(module, name)
    if not callable(fn):
        raise ValueError(f"{path}: {name!r} is a {type(fn).__name__}, not a function")
    return fn


def check_function(path: str, name: str, reward_kwargs: dict[str, Any] | None = None) -> None:
    """What the driver checks before Ray: loadable, and callable as ``fn(images, prompts, **reward_kwargs)``
    (by its signature; the function is not run)."""
    fn = load_function(path, name)
    try:
        inspect.signature(fn).bind(torch.zeros(1, 3, 2, 2), ["p"], **dict(reward_kwargs or {}))
    except TypeError as err:
        raise ValueError(f"{path}: {name}{inspect.signature(fn)} cannot be called as {name}(images, prompts"
                         f"{''.join(f', {k}=...' for k in (reward_kwargs or {}))}) ({err})") from None
    except ValueError:  # no signature (a builtin or C callable): accepted, checked at the first call
        pass


class CustomReward(Reward):
    """A user's batched reward function (see the module docstring for the contract)."""

    name = CUSTOM

    def __init__(self, path: str, function: str = "compute_score", reward_kwargs: dict[str, Any] | None = None,
                 name: str | None = None) -> None:
        self.path, self.function = path, function
        self.fn = load_function(path, function)
        self.reward_kwargs = dict(reward_kwargs or {})
        if name:
            self.name = name

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        try:
            out = self.fn(images, list(prompts), **self.reward_kwargs)
        except Exception as err:  # name the user's function: through Ray the worker's traceback comes first
            raise RuntimeError(f"custom reward {self.function} in {self.path} raised {type(err).__name__}: "
                               f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}") from err
        try:
            scores = torch.as_tensor(out if torch.is_tensor(out) else list(out), dtype=torch.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"custom reward {self.function} in {self.path} returned {type(out).__name__}; "
                            f"expected {len(prompts)} numbers ({err})") from None
        if scores.ndim != 1 or scores.shape[0] != len(prompts):
            raise RuntimeError(f"custom reward {self.function} in {self.path} returned shape {tuple(scores.shape)} "
                               f"for {len(prompts)} images; expected one score per image")
        return scores

    def __repr__(self) -> str:
        return f"CustomReward({self.path!r}, {self.function!r})"


def spec_of(cfg: Any) -> dict[str, Any]:
    """The registry spec of ``custom_reward_function`` (a config section with path, name, reward_kwargs)."""
    return {"name": CUSTOM, "path": cfg.path, "function": cfg.name, "reward_kwargs": dict(cfg.reward_kwargs or {})}


def with_custom_reward(reward: Any, cfg: Any) -> Any:
    """The worker's reward spec with the custom function in: the whole reward when ``reward.weights`` is
    unset, else the ``custom`` entry of the weights (``reward.weights={custom: 1.0, pickscore: 0.5}``)."""
    if cfg is None or cfg.path is None:
        return reward
    custom = spec_of(cfg)
    if isinstance(reward, dict) and "name" not in reward:
        if CUSTOM not in reward:
            return reward  # refused by validate: the function would be loaded and never used
        w = reward[CUSTOM]
        extra = dict(w) if isinstance(w, dict) else {"weight": w}
        return {**reward, CUSTOM: {**extra, **custom}}
    return custom
