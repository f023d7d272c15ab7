"""Prompt datasets: a deterministic stream of prompt batches with a resumable position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIXES = (".txt", ".jsonl", ".parquet")
#: verl's default prompt column (``data.prompt_key``)
DEFAULT_PROMPT_KEY = "prompt"


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
    def from_file(cls, path: str | Path, prompt_key: str = DEFAULT_PROMPT_KEY) -> PromptDataset:
        """One prompt per line (.txt), JSON lines or a parquet table with a ``prompt_key`` field
        (.jsonl, .parquet); see ``load_prompts``."""
        return cls(load_prompts(path, prompt_key))

    def batch(self, position: int, size: int) -> tuple[list[int], list[str]]:
        """``size`` prompts starting at stream ``position``; ids are dataset indices."""
        if size < 1:
            raise ValueError(f"batch size must be >= 1, got {size}")
        ids = [(position + i) % len(self.prompts) for i in range(size)]
        return ids, [self.prompts[i] for i in ids]


def prompt_text(value: Any) -> str | None:
    """The prompt of one ``prompt_key`` value: a string, or verl's chat form (a list of
    ``{"role", "content"}`` messages: the last user message's content); None when neither."""
    if isinstance(value, str):
        return value
    if hasattr(value, "tolist"):  # a numpy array of messages (pandas / pyarrow list columns)
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        users = [m for m in value if m.get("role", "user") == "user"]
        content = users[-1].get("content") if users else None
        return content if isinstance(content, str) else None
    return None


def _row_prompt(where: str, row: Any, key: str) -> str:
    """Check one record (a JSON line or a parquet row) and return its prompt."""
    if not isinstance(row, dict) or key not in row:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise ValueError(f"{where}: expected an object with a {key!r} field (got {keys}; set data.prompt_key "
                         "to the prompt's field)")
    prompt = prompt_text(row[key])
    if prompt is None:
        raise ValueError(f"{where}: {key!r} must be a string, got {json.dumps(row[key], default=str)[:200]} "
                         "(or verl's chat form: a list of messages with a string 'content')")
    if not prompt.strip():
        raise ValueError(f"{where}: {key!r} is empty")
    return prompt


def _parquet_prompts(path: Path, key: str) -> list[str]:
    """The ``key`` column of a parquet file (verl's dataset format); errors name the row (0-based)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow comes with verl
        raise ValueError(f"{path}: reading .parquet prompt files needs pyarrow (pip install pyarrow)") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # ArrowInvalid for a file that is not parquet
        raise ValueError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from None
    columns = pf.schema_arrow.names
    if key not in columns:
        raise ValueError(f"{path}: no column {key!r} (columns: {', '.join(columns)}); set data.prompt_key "
                         "to the prompt column")
    values = pf.read(columns=[key]).column(key).to_pylist()
    return [_row_prompt(f"{path}: row {i}", {key: v}, key) for i, v in enumerate(values)]


def load_prompts(path: str | Path, prompt_key: str = DEFAULT_PROMPT_KEY) -> list[str]:
    """Read and check a prompt file up front: ``.txt`` (one prompt per non-blank line), ``.jsonl``
    (an object per non-blank line whose ``prompt_key`` field is the prompt) or ``.parquet`` (verl's
    format: the ``prompt_key`` column, a string or verl's chat-message list per row). Errors are
    ``ValueError``s that start with ``<file>:<line>:`` (the line in the file, blank lines counted)
    or ``<file>: row <i>:`` for parquet, so a bad record is found at once instead of as a raw
    traceback after the workers started."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{path}: expected a .txt, .jsonl or .parquet prompt file, not "
                         f"{path.suffix or 'no suffix'!r}")
    if not isinstance(prompt_key, str) or not prompt_key:
        raise ValueError(f"data.prompt_key must be a non-empty column name, got {prompt_key!r}")
    if path.suffix == ".parquet":
        prompts = _parquet_prompts(path, prompt_key)
        if not prompts:
            raise ValueError(f"{path}: no prompts (the table has no rows)")
        return prompts
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
        prompts.append(_row_prompt(f"{path}:{no}", row, prompt_key))
    if not prompts:
        raise ValueError(f"{path}: no prompts (the file is empty or has only blank lines)")
    return prompts


#: the per-row columns of verl's dataset layout that verl-omni's reward functions take
REWARD_FIELDS = ("data_source", "reward_model", "extra_info")


def load_reward_rows(path: str | Path, prompt_key: str = DEFAULT_PROMPT_KEY) -> list[dict[str, Any]]:
    """Per row, in ``load_prompts``' order (a sample's prompt id indexes it), what verl's dataset layout gives
    a reward function besides the image: ``data_source``, ``ground_truth`` (from the ``reward_model``
    column) and ``extra_info``, plus the row's ``prompt``. Read from a ``.parquet`` or ``.jsonl`` file; a
    ``.txt`` file's rows have only their prompt. Two rows may share a prompt text and differ in the rest."""
    path = Path(path)
    if path.suffix == ".txt":
        return [{"prompt": p, "data_source": None, "ground_truth": None, "extra_info": {}}
                for p in load_prompts(path, prompt_key)]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        cols = [c for c in (prompt_key, *REWARD_FIELDS) if c in table.column_names]
        rows = table.select(cols).to_pylist()
        where = [f"{path}: row {i}" for i in range(len(rows))]
    else:
        rows, where = [], []
        for no, ln in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ln.strip():
                rows.append(json.loads(ln))
                where.append(f"{path}:{no}")
    out: list[dict[str, Any]] = []
    for at, row in zip(where, rows):
        reward_model = row.get("reward_model") or {}
        out.append({"prompt": _row_prompt(at, row, prompt_key), "data_source": row.get("data_source"),
                    "ground_truth": reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
                    "extra_info": dict(row.get("extra_info") or {})})
    return out
