"""Prompt datasets: a deterministic stream of prompt batches with a resumable position."""

from __future__ import annotations

import json
from pathlib import Path

SUFFIXES = (".txt", ".jsonl")


class PromptDataset:
    """An ordered list of prompts, read in batches that wrap around; prompt ids are list positions
    (they name the GRPO group and seed each sample's noise, so they must not depend on placement)."""

    def __init__(self, prompts: list[str]) -> None:
        if not prompts:
            raise ValueError("a prompt dataset needs at least one prompt")
        self.prompts = list(prompts)

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def synthetic(cls, n: int = 64) -> PromptDataset:
        """Built-in prompts for tiny runs (the tiny models embed prompt text deterministically)."""
        subjects = ["a cat", "a red car", "a mountain lake", "a bowl of fruit", "a city at night", "an old robot"]
        styles = ["photo", "watercolor", "pixel art", "oil painting"]
        return cls([f"{styles[i % len(styles)]} of {subjects[i % len(subjects)]}, variant {i}" for i in range(n)])

    @classmethod
    def from_file(cls, path: str | Path) -> PromptDataset:
        """One prompt per line (.txt), or JSON lines with a ``prompt`` field (.jsonl); see ``load_prompts``."""
        return cls(load_prompts(path))

    def batch(self, position: int, size: int) -> tuple[list[int], list[str]]:
        """``size`` prompts starting at stream ``position``; ids are dataset indices."""
        if size < 1:
            raise ValueError(f"batch size must be >= 1, got {size}")
        ids = [(position + i) % len(self.prompts) for i in range(size)]
        return ids, [self.prompts[i] for i in ids]


def load_prompts(path: str | Path) -> list[str]:
    """Read and check a prompt file up front: ``.txt`` (one prompt per non-blank line) or ``.jsonl``
    (an object with a string ``prompt`` per non-blank line). Errors are ``ValueError``s that start
    with ``<file>:<line>:`` (the line in the file, blank lines counted), so a bad line is found at
    once instead of as a raw traceback after the workers started."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{path}: expected a .txt or .jsonl prompt file, not {path.suffix or 'no suffix'!r}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x})") from None
    prompts: list[str] = []
    for no, ln in enumerate(text.splitlines(), 1):
        if not ln.strip():
            continue
        if path.suffix == ".txt":
            prompts.append(ln)
            continue
        try:
            row = json.loads(ln)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{no}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict) or "prompt" not in row:
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{path}:{no}: expected an object with a 'prompt' field (got {keys})")
        prompt = row["prompt"]
        if not isinstance(prompt, str):
            raise ValueError(f"{path}:{no}: 'prompt' must be a string, got {json.dumps(prompt)}")
        if not prompt.strip():
            raise ValueError(f"{path}:{no}: 'prompt' is empty")
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts (the file is empty or has only blank lines)")
    return prompts
