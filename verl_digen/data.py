"""Prompt datasets: a deterministic stream of prompt batches with a resumable position."""

from __future__ import annotations

import json
from pathlib import Path


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
        """One prompt per line (.txt), or JSON lines with a ``prompt`` field (.jsonl)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
        if path.suffix == ".jsonl":
            prompts = []
            for no, ln in enumerate(lines, 1):
                row = json.loads(ln)
                if "prompt" not in row:
                    raise ValueError(f"{path}:{no}: JSON line has no 'prompt' field (keys: {sorted(row)})")
                prompts.append(str(row["prompt"]))
            return cls(prompts)
        return cls(lines)

    def batch(self, position: int, size: int) -> tuple[list[int], list[str]]:
        """``size`` prompts starting at stream ``position``; ids are dataset indices."""
        if size < 1:
            raise ValueError(f"batch size must be >= 1, got {size}")
        ids = [(position + i) % len(self.prompts) for i in range(size)]
        return ids, [self.prompts[i] for i in ids]
