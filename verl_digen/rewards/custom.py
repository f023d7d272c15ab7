"""Rewards users bring as a Python file: verl's ``custom_reward_function.path`` / ``.name``.

The file defines a *batched* function (the exact contract, also in docs/rewards.md)::

    def compute_score(images, prompts, **reward_kwargs) -> list[float]:
        # images: torch.Tensor (N, 3, H, W), float, values in [0, 1], on the generator's device
        #         (video is scored frame by frame: N = samples x frames, averaged per sample)
        # prompts: list[str] of length N (prompts[i] belongs to images[i])
        # reward_kwargs: custom_reward_function.reward_kwargs (empty by default)
        # returns: N finite scores (a list, a numpy array or a tensor)

verl-omni's per-sample contract is taken too, recognised by its ``solution_image`` parameter::

    def compute_score(data_source, solution_image, ground_truth, extra_info, **reward_kwargs) -> float | dict:
        # solution_image: torch.uint8 (3, H, W), or (3, F, H, W) for video, on the CPU
        # data_source, ground_truth (the ``reward_model.ground_truth`` column), extra_info: the sample's
        #   prompt row in data.train_files / data.val_files (verl's dataset layout); None / {} when absent
        # returns: a number, or a dict whose "score" is the number

It runs on the generator pool (where every reward model lives), under ``torch.no_grad``; the scores
become float64 like every other reward's. ``check_function`` loads the file on the driver before Ray
starts (file exists, imports, function found and callable), so a typo in the path or the name costs a
second. Why batched: a judge model scores a micro-batch in one forward, one call per image would not.
"""

from __future__ import annotations

import asyncio
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
#: verl-omni's (verl's) per-sample reward parameters, passed by keyword
PER_SAMPLE_PARAMS = ("data_source", "solution_image", "ground_truth", "extra_info")


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
        except SystemExit as err:  # sys.exit() at import would end the run, with exit code 0 and no line
            raise ValueError(f"{path}: importing it called sys.exit({err.code!r}); a reward module must not "
                             "exit") from None
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


def per_sample(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes verl-omni's per-sample arguments (it has a ``solution_image`` parameter)."""
    try:
        return "solution_image" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature: the batched contract
        return False


def check_function(path: str, name: str, reward_kwargs: dict[str, Any] | None = None) -> Callable[..., Any]:
    """What the driver checks before Ray: loadable, and callable as ``fn(images, prompts, **reward_kwargs)``
    or, per sample, as verl-omni calls it (by its signature; the function is not run). Returns it."""
    fn = load_function(path, name)
    kwargs = dict(reward_kwargs or {})
    one = per_sample(fn)
    try:
        if one:
            inspect.signature(fn).bind(**dict.fromkeys(PER_SAMPLE_PARAMS), **kwargs)
        else:
            inspect.signature(fn).bind(torch.zeros(1, 3, 2, 2), ["p"], **kwargs)
    except TypeError as err:
        call = ", ".join(f"{p}=..." for p in PER_SAMPLE_PARAMS) if one else "images, prompts"
        raise ValueError(f"{path}: {name}{inspect.signature(fn)} cannot be called as {name}({call}"
                         f"{''.join(f', {k}=...' for k in kwargs)}) ({err})") from None
    except ValueError:  # no signature (a builtin or C callable): accepted, checked at the first call
        pass
    return fn


class CustomReward(Reward):
    """A user's batched reward function (see the module docstring for the contract)."""

    name = CUSTOM

    def __init__(self, path: str, function: str = "compute_score", reward_kwargs: dict[str, Any] | None = None,
                 name: str | None = None, data_files: list[str] | tuple[str, ...] = (),
                 prompt_key: str = "prompt") -> None:
        """``data_files``: the prompt files whose rows a per-sample function gets its ``data_source``,
        ``ground_truth`` and ``extra_info`` from (read once, here)."""
        self.path, self.function = path, function
        self.fn = load_function(path, function)
        self.reward_kwargs = dict(reward_kwargs or {})
        if name:
            self.name = name
        self.fields: dict[str, dict[str, Any]] | None = None
        if per_sample(self.fn):
            from verl_digen.data import load_reward_fields

            self.frame_wise = False  # verl-omni hands the function a whole video
            self.fields = {}
            for f in data_files:
                self.fields.update(load_reward_fields(f, prompt_key))

    def _call(self, images: torch.Tensor, prompts: list[str]) -> Any:
        if self.fields is None:
            return self.fn(images, list(prompts), **self.reward_kwargs)
        pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
        out = []
        for pixel, prompt in zip(pixels, prompts):
            row = self.fields.get(prompt, {})
            res = self.fn(data_source=row.get("data_source"), solution_image=pixel,
                          ground_truth=row.get("ground_truth"), extra_info=dict(row.get("extra_info") or {}),
                          **self.reward_kwargs)
            if inspect.isawaitable(res):  # verl-omni's reward functions may be coroutines
                res = asyncio.run(res)
            out.append(res["score"] if isinstance(res, dict) else res)
        return out

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        try:
            out = self._call(images, prompts)
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


def spec_of(cfg: Any, data_files: list[str] | tuple[str, ...] = (), prompt_key: str = "prompt") -> dict[str, Any]:
    """The registry spec of ``custom_reward_function`` (a config section with path, name, reward_kwargs);
    ``data_files`` / ``prompt_key``: where a per-sample function's row fields come from."""
    spec = {"name": CUSTOM, "path": cfg.path, "function": cfg.name, "reward_kwargs": dict(cfg.reward_kwargs or {})}
    if data_files:
        spec.update(data_files=list(data_files), prompt_key=prompt_key)
    return spec


def with_custom_reward(reward: Any, cfg: Any, data_files: list[str] | tuple[str, ...] = (),
                       prompt_key: str = "prompt") -> Any:
    """The worker's reward spec with the custom function in: the whole reward when ``reward.weights`` is
    unset, else the ``custom`` entry of the weights (``reward.weights={custom: 1.0, pickscore: 0.5}``)."""
    if cfg is None or cfg.path is None:
        return reward
    custom = spec_of(cfg, data_files, prompt_key)
    if isinstance(reward, dict) and "name" not in reward:
        if CUSTOM not in reward:
            return reward  # refused by validate: the function would be loaded and never used
        w = reward[CUSTOM]
        extra = dict(w) if isinstance(w, dict) else {"weight": w}
        return {**reward, CUSTOM: {**extra, **custom}}
    return custom
