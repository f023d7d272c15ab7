"""``validate``'s checks of what users bring: validation prompts (``data.val_files`` with
``data.prompt_key``, ``trainer.test_freq``), their own reward function (``custom_reward_function``),
and the VLM judge's options.

Why before Ray: a parquet file without the prompt column, a reward file with a typo in the function
name or a judge checkpoint that is not on disk each used to surface inside a worker, minutes into the
run. Every error is a ``ConfigError`` naming the key, the value and what is allowed (docs/config.md).
"""

from __future__ import annotations

import os
from typing import Any

from verl_digen.config.errors import ConfigError
from verl_digen.defaults import DEFAULT_LEARNABLE_REWARD


def data(cfg: Any) -> list[str]:
    """``data.prompt_key``, ``data.val_files`` (read and checked like the training prompts) and
    ``trainer.test_freq``; returns warnings."""
    from verl_digen.data import load_prompts

    d, t = cfg.data, cfg.trainer
    if not isinstance(d.prompt_key, str) or not d.prompt_key.strip():
        raise ConfigError("data.prompt_key", d.prompt_key, "the non-empty name of the prompt field / column")
    if isinstance(t.test_freq, bool) or not isinstance(t.test_freq, int):
        raise ConfigError("trainer.test_freq", t.test_freq, "an integer (<= 0 never validates)")
    n = t.log_val_generations
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError("trainer.log_val_generations", n, "an integer >= 0 (validation samples drawn as images)")
    warnings: list[str] = []
    if d.val_files is None:
        if t.test_freq > 0:  # inert: refused rather than ignored
            raise ConfigError("trainer.test_freq", t.test_freq, "<= 0 while data.val_files is null (validation scores "
                              "those prompts: set data.val_files, or leave trainer.test_freq at -1)")
        return warnings
    try:
        load_prompts(d.val_files, d.prompt_key)
    except ValueError as err:
        raise ConfigError("data.val_files", d.val_files,
                          f"a readable .txt, .jsonl or .parquet prompt file ({err})") from None
    if t.test_freq <= 0:
        warnings.append(f"data.val_files is set but trainer.test_freq={t.test_freq}: validation never runs "
                        "(set trainer.test_freq=N to validate every N steps and after the last one)")
    return warnings


def custom_rows(cfg: Any) -> None:
    """A per-sample function reads each sample's row: the prompt files' extra columns must be readable."""
    from verl_digen.data import load_reward_rows

    for key, path in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        try:
            if path:
                load_reward_rows(path, cfg.data.prompt_key)
        except (ValueError, TypeError) as err:
            raise ConfigError(key, path, f"prompt rows a per-sample reward function can read ({err})") from None


def custom_reward(cfg: Any) -> None:
    """``custom_reward_function``: the file loads and defines the function, and the reward config uses it."""
    from verl_digen.rewards.names import CUSTOM

    c, r = cfg.custom_reward_function, cfg.reward
    names = list(r.weights) if r.weights else [r.name]
    if c.path is None:
        if CUSTOM in names:
            key = "reward.weights" if r.weights else "reward.name"
            raise ConfigError("custom_reward_function.path", None, f"a Python file defining the reward function when "
                              f"{key} names '{CUSTOM}'")
        return
    if not isinstance(c.name, str) or not c.name.isidentifier():
        raise ConfigError("custom_reward_function.name", c.name,
                          "the name of a function in custom_reward_function.path")
    from verl_digen.rewards.custom import check_function, per_sample  # torch: only with a custom function

    try:
        fn = check_function(c.path, c.name, c.reward_kwargs, served=bool(r.served.model_path))
    except ValueError as err:
        key = "custom_reward_function.name" if "has no function" in str(err) else "custom_reward_function.path"
        raise ConfigError(key, c.name if key.endswith("name") else c.path,
                          f"a loadable reward function ({err})") from None
    if per_sample(fn):  # it reads each sample's row: the files' extra columns must be readable
        custom_rows(cfg)
    if r.weights:
        if CUSTOM not in r.weights:
            raise ConfigError("reward.weights", dict(r.weights), f"an entry '{CUSTOM}' (the custom function's weight, "
                              f"e.g. reward.weights={{{CUSTOM}: 1.0, ...}}) when custom_reward_function.path is set")
        return
    if r.name not in (CUSTOM, DEFAULT_LEARNABLE_REWARD):  # the default is replaced by the custom function
        raise ConfigError("reward.name", r.name,
                          f"'{CUSTOM}' (or left at its default) when custom_reward_function.path "
                          f"is set; combine rewards with reward.weights={{{CUSTOM}: 1.0, {r.name}: w}}")
    if r.kwargs:
        raise ConfigError("reward.kwargs", dict(r.kwargs),
                          "null with custom_reward_function (pass the function's options "
                          "as custom_reward_function.reward_kwargs)")


def reward_functions(cfg: Any) -> None:
    """``reward.functions`` (verl-omni's multi-reward manager): the whole reward, so alone; each entry's
    function loads and takes the keywords it declares."""
    r = cfg.reward
    if r.functions is None:
        return
    from verl_digen.rewards.functions import check_functions  # torch: only where functions are configured

    others = [(k, v) for k, v in (("reward.weights", r.weights), ("reward.kwargs", r.kwargs),
                                  ("custom_reward_function.path", cfg.custom_reward_function.path)) if v]
    if others:
        key, value = others[0]
        raise ConfigError(key, dict(value) if isinstance(value, dict) else value,
                          "null when reward.functions is set (reward.functions is the whole reward)")
    try:
        check_functions(dict(r.functions), served=bool(r.served.model_path))
    except ValueError as err:
        key, expected = err.args
        raise ConfigError(key, _at(r.functions, key), expected) from None
    if r.name != DEFAULT_LEARNABLE_REWARD:
        raise ConfigError("reward.name", r.name, "left at its default when reward.functions is set")
    custom_rows(cfg)


def _at(functions: Any, key: str) -> Any:
    node: Any = {"reward": {"functions": functions}}
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) or hasattr(node, "get") else None
    return dict(node) if hasattr(node, "items") else node


def served_reward(cfg: Any) -> None:
    """``reward.served``: a model on this machine, settings in range, a function that calls it, and what
    serving it needs installed (vLLM unless ``command`` replaces it)."""
    from verl_digen.config import judge

    s = cfg.reward.served
    judge.check(cfg)  # resources.reward and the judge's replicas x tensor parallel size
    if not s.model_path:
        return
    from verl_digen.rewards.custom import checkpoint_missing  # torch: only where a judge is served

    if not (cfg.custom_reward_function.path or cfg.reward.functions):
        raise ConfigError("reward.served.model_path", s.model_path, "null unless a reward function calls it "
                          "(custom_reward_function.path or reward.functions)")
    why = checkpoint_missing(str(s.model_path))
    if why is not None:
        raise ConfigError("reward.served.model_path", s.model_path, f"a checkpoint on this machine (it {why})")
    if not (0 < s.gpu_memory_utilization <= 1):
        raise ConfigError("reward.served.gpu_memory_utilization", s.gpu_memory_utilization, "a fraction in (0, 1]")
    if not s.startup_timeout_s > 0:
        raise ConfigError("reward.served.startup_timeout_s", s.startup_timeout_s, "a number of seconds > 0")
    if s.command is not None and not (s.command and all(isinstance(c, str) for c in s.command)
                                      and any("{port}" in c for c in s.command)):
        raise ConfigError("reward.served.command", s.command, "null (vLLM's server) or a command line as a list "
                          "of strings, one of them holding {port}")
    import importlib.util

    if s.command is None and importlib.util.find_spec("vllm") is None:
        raise ConfigError("reward.served.model_path", s.model_path, "vLLM installed to serve it "
                          "(pip install verl-digen[vllm]), or reward.served.command naming another server")


def vlm_judge(cfg: Any) -> None:
    """``reward.name=vlm_judge``: a model path, a local directory that exists, and transformers."""
    r = cfg.reward
    if r.weights or r.name != "vlm_judge":
        return
    kw = dict(r.kwargs or {})
    path = kw.get("model_path")
    if not isinstance(path, str) or not path:
        raise ConfigError("reward.kwargs", kw or None, "a model_path for reward.name=vlm_judge (a Qwen2-VL-style "
                          "checkpoint directory or hub id in the local cache; docs/rewards.md)")
    from verl_digen.rewards.external import _looks_local

    if _looks_local(path) and not os.path.isdir(os.path.expanduser(path)):
        raise ConfigError("reward.kwargs.model_path", path, "an existing checkpoint directory")
    import inspect

    from verl_digen.rewards.vlm_judge import VLMJudge

    allowed = set(inspect.signature(VLMJudge.__init__).parameters) - {"self"}
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise ConfigError("reward.kwargs", kw, f"options among {', '.join(sorted(allowed))} (unknown: {unknown})")
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("reward.name", r.name, "a reward whose packages are installed (vlm_judge needs transformers: "
                          "pip install verl-digen[rewards])") from None


def check(cfg: Any) -> list[str]:
    """All of the above; returns warnings."""
    warnings = data(cfg)
    custom_reward(cfg)
    reward_functions(cfg)
    served_reward(cfg)
    vlm_judge(cfg)
    return warnings
