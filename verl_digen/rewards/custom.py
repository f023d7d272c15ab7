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
        #   own row (by its prompt id) in data.train_files, or data.val_files when validating (verl's
        #   dataset layout); None / {} when absent
        # returns: a number, or a dict whose "score" is the number

``reward.functions`` (verl-omni's multi-reward manager, ``reward.reward_functions``) sums several such
functions, weighted; each is called per sample with only the keyword arguments its signature declares (all
of them when it takes ``**kwargs``), and one that is not ``required`` scores 0 for a sample it raises on.

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
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .base import Reward, Rows
from .names import CUSTOM  # its home: names.py, readable without torch

logger = logging.getLogger(__name__)

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
            from .served import JUDGE_EXTRA, JUDGE_PACKAGES

            hint = (f"; install it with `pip install {JUDGE_EXTRA}`" if isinstance(err, ImportError)
                    and (getattr(err, "name", None) or "").split(".")[0] in JUDGE_PACKAGES else "")
            raise ValueError(f"{path}: importing it failed ({type(err).__name__}: {err}){hint}") from None
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


#: verl-omni's convention for where a reward function's own model lives (its HPSv3 reward reads it first, then
#: its ``model_name`` argument)
CHECKPOINT_ENV = "custom_reward_model_path"


def checkpoint_missing(path: str) -> str | None:
    """Why a reward checkpoint (a local file or directory, or a hub id) is not on this machine; None when it
    is. Nothing is downloaded at run time, so a hub id must be in the Hugging Face cache."""
    from .external import _looks_local

    if os.path.exists(os.path.expanduser(path)):
        return None
    if _looks_local(path) or path.count("/") != 1:
        return "does not exist"
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(path, local_files_only=True)
        return None
    except Exception:  # the hub raises several "not cached" types across versions
        return (f"is not in the Hugging Face cache and is not downloaded at run time (fetch it beforehand: "
                f"`huggingface-cli download {path}`)")


def check_checkpoint(fn: Callable[..., Any], path: str, name: str) -> None:
    """A per-sample function that takes ``model_name`` loads a model: the one ``$custom_reward_model_path``
    names (verl-omni's convention), when set, must be on this machine. ``ValueError`` otherwise."""
    try:
        takes = "model_name" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    where = os.environ.get(CHECKPOINT_ENV)
    if not takes or not where:
        return
    why = checkpoint_missing(where)
    if why is not None:
        raise ValueError(f"{path}: {name} loads its model from ${CHECKPOINT_ENV} = {where!r}, which {why}")


def _served_hint(err: Exception, served: bool) -> str:
    """What to do when a function wants a served reward model that the config does not serve."""
    from .served import SERVED_PARAMS

    if served or not any(f"'{p}'" in str(err) for p in SERVED_PARAMS):
        return ""
    return ("; it calls a served reward model: set reward.served.model_path (verl-omni: "
            "reward.reward_model.enable=True with reward.reward_model.model_path)")


def declared(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``kwargs`` that ``fn``'s signature declares (all of them when it takes ``**kwargs``), as verl-omni's
    multi-reward manager passes them."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def check_function(path: str, name: str, reward_kwargs: dict[str, Any] | None = None,
                   filter_kwargs: bool = False, served: bool = False) -> Callable[..., Any]:
    """What the driver checks before Ray: loadable, and callable as ``fn(images, prompts, **reward_kwargs)``
    or, per sample, as verl-omni calls it (by its signature; the function is not run). ``filter_kwargs``:
    called as verl-omni's multi-reward manager calls it (per sample, with the keywords it declares). ``served``:
    a reward model is served, so a per-sample function also gets its address, tokenizer and name. Returns it."""
    from .served import SERVED_PARAMS

    fn = load_function(path, name)
    one = filter_kwargs or per_sample(fn)
    kwargs = {**(dict.fromkeys(SERVED_PARAMS) if served and one else {}), **dict(reward_kwargs or {})}
    if filter_kwargs:
        offered = {**dict.fromkeys(PER_SAMPLE_PARAMS), **kwargs}
        try:
            inspect.signature(fn).bind(**declared(fn, offered))
        except TypeError as err:
            raise ValueError(f"{path}: {name}{inspect.signature(fn)} cannot be called with the keywords it "
                             f"declares among {', '.join(offered)} ({err}){_served_hint(err, served)}") from None
        except ValueError:  # no signature: checked at the first call
            pass
        check_checkpoint(fn, path, name)
        return fn
    try:
        if one:
            inspect.signature(fn).bind(**dict.fromkeys(PER_SAMPLE_PARAMS), **kwargs)
        else:
            inspect.signature(fn).bind(torch.zeros(1, 3, 2, 2), ["p"], **kwargs)
    except TypeError as err:
        call = ", ".join(f"{p}=..." for p in PER_SAMPLE_PARAMS) if one else "images, prompts"
        raise ValueError(f"{path}: {name}{inspect.signature(fn)} cannot be called as {name}({call}"
                         f"{''.join(f', {k}=...' for k in kwargs)}) ({err}){_served_hint(err, served)}") from None
    except ValueError:  # no signature (a builtin or C callable): accepted, checked at the first call
        pass
    if one:
        check_checkpoint(fn, path, name)
    return fn


class CustomReward(Reward):
    """A user's batched reward function (see the module docstring for the contract)."""

    name = CUSTOM

    def __init__(self, path: str, function: str = "compute_score", reward_kwargs: dict[str, Any] | None = None,
                 name: str | None = None, train_file: str | None = None, val_file: str | None = None,
                 prompt_key: str = "prompt", filter_kwargs: bool = False, required: bool = True,
                 served: dict[str, Any] | None = None) -> None:
        """``train_file`` / ``val_file``: the prompt files whose rows a per-sample function gets its
        ``data_source``, ``ground_truth`` and ``extra_info`` from (read once, here; looked up by row).
        ``filter_kwargs`` / ``required``: a ``reward.functions`` entry (see the module docstring). ``served``:
        a ``served.ServedSpec`` as a dict, the reward model this process serves for the function."""
        self.path, self.function = path, function
        self.fn = load_function(path, function)
        self.reward_kwargs = dict(reward_kwargs or {})
        self.filter_kwargs, self.required = filter_kwargs, required
        self.served, self._tokenizer = dict(served) if served else None, None
        if name:
            self.name = name
        self.tables: dict[str, list[dict[str, Any]]] | None = None
        if filter_kwargs or per_sample(self.fn):
            from verl_digen.data import load_reward_rows

            self.frame_wise = False  # verl-omni hands the function a whole video
            self.uses_rows = True
            self.tables = {split: load_reward_rows(f, prompt_key)
                           for split, f in (("train", train_file), ("val", val_file)) if f}

    def _row(self, rows: Rows | None, i: int, prompt: str) -> dict[str, Any]:
        """Sample ``i``'s dataset row (empty fields when the run has no prompt file for its split)."""
        table = self.tables.get(rows.split) if rows is not None else None
        if table is None:
            return {}
        row_id = rows.ids[i]
        if not 0 <= row_id < len(table) or table[row_id]["prompt"] != prompt:
            raise RuntimeError(f"sample {i} (prompt {prompt[:60]!r}) claims {rows.split} row {row_id}, which "
                               f"{'does not exist' if not 0 <= row_id < len(table) else 'has another prompt'}")
        return table[row_id]

    def _call(self, images: torch.Tensor, prompts: list[str], rows: Rows | None = None) -> Any:
        if self.tables is None:
            return self.fn(images, list(prompts), **self.reward_kwargs)
        pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
        served = self._served_kwargs(len(prompts))
        calls = []
        for i, (pixel, prompt) in enumerate(zip(pixels, prompts)):
            row = self._row(rows, i, prompt)
            kwargs = {"data_source": row.get("data_source"), "solution_image": pixel,
                      "ground_truth": row.get("ground_truth"), "extra_info": dict(row.get("extra_info") or {}),
                      **served[i], **self.reward_kwargs}
            calls.append(declared(self.fn, kwargs) if self.filter_kwargs else kwargs)
        if inspect.iscoroutinefunction(self.fn):  # the micro-batch's requests in flight together, as verl-omni's
            return asyncio.run(self._gather(calls))  # reward loop sends them
        return [self._one(kwargs) for kwargs in calls]

    def _served_kwargs(self, n: int) -> list[dict[str, Any]]:
        """What verl-omni's reward loop adds per sample when a reward model is served: the address of the
        replica that scores it (the router's turn; this process's own server starts on first use), the
        judge's tokenizer and its name."""
        if not self.served:
            return [{}] * n
        from . import served

        spec = served.spec_from(self.served)
        if self._tokenizer is None:
            self._tokenizer = (served.tokenizer(spec.model_path),)
        return [{"reward_router_address": address, "reward_model_tokenizer": self._tokenizer[0],
                 "model_name": spec.model_path} for address in served.router(spec).take(n)]

    async def _gather(self, calls: list[dict[str, Any]]) -> list[float]:
        async def one(kwargs: dict[str, Any]) -> float:
            try:
                return self._value(await self.fn(**kwargs))
            except Exception as err:
                return self._failed(err)

        return list(await asyncio.gather(*(one(kwargs) for kwargs in calls)))

    def _one(self, kwargs: dict[str, Any]) -> float:
        try:
            res = self.fn(**kwargs)
            if inspect.isawaitable(res):  # a callable object returning a coroutine
                res = asyncio.run(res)
            return self._value(res)
        except Exception as err:
            return self._failed(err)

    @staticmethod
    def _value(res: Any) -> float:
        return float(res["score"] if isinstance(res, dict) else res)

    def _failed(self, err: Exception) -> float:
        """A function that is not ``required`` scores 0 for a sample it raises on (verl-omni's rule)."""
        if self.required:
            raise err
        logger.error("reward %s (%s in %s) raised %s: %s; it adds 0 for this sample", self.name, self.function,
                     self.path, type(err).__name__, err)
        return 0.0

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None,
              rows: Rows | None = None) -> torch.Tensor:
        try:
            out = self._call(images, prompts, rows)
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


def spec_of(cfg: Any, files: dict[str, str | None] | None = None, prompt_key: str = "prompt") -> dict[str, Any]:
    """The registry spec of ``custom_reward_function`` (a config section with path, name, reward_kwargs);
    ``files`` (``{"train": path, "val": path}``) / ``prompt_key``: where a per-sample function's rows are."""
    spec = {"name": CUSTOM, "path": cfg.path, "function": cfg.name, "reward_kwargs": dict(cfg.reward_kwargs or {})}
    files = {k: v for k, v in (files or {}).items() if v}
    if files:
        spec.update({f"{split}_file": path for split, path in files.items()}, prompt_key=prompt_key)
    return spec


def with_served(reward: Any, cfg: Any, replicas: int = 0) -> Any:
    """The worker's reward spec with ``reward.served`` given to every custom function in it (they share the
    one server, as verl-omni's functions share its reward model's address); ``replicas`` > 0: the judge runs
    apart as that many replicas (``served.spec_of``)."""
    from .served import spec_of

    spec = spec_of(cfg, replicas)
    if spec is None:
        return reward
    served = {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()}
    if isinstance(reward, dict) and reward.get("name") == CUSTOM:
        return {**reward, "served": served}
    if isinstance(reward, dict) and "name" not in reward:
        return {k: ({**v, "served": served} if isinstance(v, dict) and v.get("name") == CUSTOM else v)
                for k, v in reward.items()}
    return reward


def served_specs(reward: Any) -> list[dict[str, Any]]:
    """The ``served`` entries of a worker's reward spec (one judge: they are equal)."""
    if isinstance(reward, dict) and isinstance(reward.get("served"), dict):
        return [reward["served"]]
    if isinstance(reward, dict) and "name" not in reward:
        return [s for v in reward.values() for s in served_specs(v)]
    return []


def with_pool(reward: Any, pool: str) -> Any:
    """The worker's reward spec with the run's judge replicas' name prefix in every ``served`` entry (the
    driver's, once per run: ``served.start_replicas`` names them so)."""
    if isinstance(reward, dict) and isinstance(reward.get("served"), dict):
        return {**reward, "served": {**reward["served"], "pool": pool}}
    if isinstance(reward, dict) and "name" not in reward:
        return {k: with_pool(v, pool) for k, v in reward.items()}
    return reward


def with_custom_reward(reward: Any, cfg: Any, files: dict[str, str | None] | None = None,
                       prompt_key: str = "prompt") -> Any:
    """The worker's reward spec with the custom function in: the whole reward when ``reward.weights`` is
    unset, else the ``custom`` entry of the weights (``reward.weights={custom: 1.0, pickscore: 0.5}``)."""
    if cfg is None or cfg.path is None:
        return reward
    custom = spec_of(cfg, files, prompt_key)
    if isinstance(reward, dict) and "name" not in reward:
        if CUSTOM not in reward:
            return reward  # refused by validate: the function would be loaded and never used
        w = reward[CUSTOM]
        extra = dict(w) if isinstance(w, dict) else {"weight": w}
        return {**reward, CUSTOM: {**extra, **custom}}
    return custom
