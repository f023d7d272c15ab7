"""``python -m verl_digen.main [key=value ...]``: the main training job.

With no overrides it trains the embedded default: a tiny random-weight FLUX-architecture model on a
learnable offline reward, on CPU, in about a minute. Overrides use the dotted ``key=value`` syntax
(``steps=20 sampler.eta=0.5 arch=sd3``).
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig, OmegaConf

from verl_digen.trainer.local import LocalRunConfig, run_local, summarize


def _make_writable(node: DictConfig) -> None:
    """Frozen dataclasses become read-only nodes; overrides must still apply to them."""
    OmegaConf.set_readonly(node, None)
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _make_writable(child)


def parse_config(argv: list[str]) -> LocalRunConfig:
    """Defaults merged with ``key=value`` overrides; unknown keys and bad values name themselves."""
    bad = [a for a in argv if "=" not in a]
    if bad:
        raise SystemExit(f"arguments must be key=value overrides, got {bad}")
    base = OmegaConf.structured(LocalRunConfig)
    _make_writable(base)
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(argv))
    except Exception as err:  # omegaconf names the key and the expected type
        raise SystemExit(f"bad override: {err}") from None
    cfg = OmegaConf.to_object(merged)
    try:
        cfg.validate()
    except ValueError as err:
        raise SystemExit(f"invalid configuration: {err}") from None
    return cfg


def main(argv: list[str] | None = None) -> None:
    import torch

    torch.set_num_threads(1)
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    print(f"verl-digen local run: arch={cfg.arch} steps={cfg.steps} batch="
          f"{cfg.prompts_per_step}x{cfg.group_size} reward={cfg.reward}", flush=True)
    history = run_local(cfg, log=lambda line: print(line, flush=True))
    print()
    print(summarize(history, cfg.prompts_per_step * cfg.group_size))


if __name__ == "__main__":
    main()
