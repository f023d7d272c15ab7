"""Prompt files users have: verl's parquet (a configurable prompt column, plain strings or chat
messages), .jsonl with ``data.prompt_key``, and validation files -- all read and checked before Ray."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_digen.config import ConfigError, compose, validate
from verl_digen.data import PromptDataset, load_prompts


def _parquet(path, **columns):
    pq.write_table(pa.table(columns), path)
    return path


def _cfg(tmp_path, *overrides):
    return compose([f"trainer.trace_dir={tmp_path}/trace", f"trainer.default_local_dir={tmp_path}/ckpt", *overrides])


def test_parquet_prompt_column_strings_and_chat_messages(tmp_path):
    plain = _parquet(tmp_path / "p.parquet", prompt=["a cat", "a dog"], other=[1, 2])
    assert load_prompts(plain) == ["a cat", "a dog"]
    chat = [[{"role": "system", "content": "be nice"}, {"role": "user", "content": "a red car"},
             {"role": "assistant", "content": "ok"}],  # the last *user* message is the prompt
            [{"role": "user", "content": "a lake"}]]
    verl = _parquet(tmp_path / "verl.parquet", data_source=["x", "y"], question=chat)  # not the first column
    assert load_prompts(verl, "question") == ["a red car", "a lake"]
    assert PromptDataset.from_file(verl, "question").batch(1, 2) == ([1, 0], ["a lake", "a red car"])


def test_jsonl_prompt_key(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"caption": "a cat"}\n{"caption": "a dog"}\n')
    assert load_prompts(f, "caption") == ["a cat", "a dog"]
    with pytest.raises(ValueError, match=r"p.jsonl:1: expected an object with a 'prompt' field"):
        load_prompts(f)


@pytest.mark.parametrize("make, part", [
    (lambda t: _parquet(t / "p.parquet", text=["a"]), "no column 'prompt' (columns: text)"),
    (lambda t: _parquet(t / "p.parquet", prompt=["a", None]), "row 1: 'prompt' must be a string, got null"),
    (lambda t: _parquet(t / "p.parquet", prompt=["a", "  "]), "row 1: 'prompt' is empty"),
    (lambda t: _parquet(t / "p.parquet", prompt=pa.array([], pa.string())), "no prompts"),
    (lambda t: (t / "p.parquet").write_bytes(b"a cat\n") and t / "p.parquet", "not a readable parquet file"),
])
def test_bad_parquet_is_refused_before_ray_naming_the_row(tmp_path, make, part):
    path = make(tmp_path)
    with pytest.raises(ConfigError) as err:
        validate(_cfg(tmp_path, f"data.train_files={path}"))
    assert err.value.key == "data.train_files" and part in str(err.value)


def test_parquet_config_runs_through_validate(tmp_path):
    path = _parquet(tmp_path / "train.parquet", caption=[f"prompt {i}" for i in range(8)])
    assert validate(_cfg(tmp_path, f"data.train_files={path}", "data.prompt_key=caption")) == []


def test_val_files_checked_like_train_files(tmp_path):
    val = _parquet(tmp_path / "val.parquet", prompt=["a cat", "a dog"])
    assert validate(_cfg(tmp_path, f"data.val_files={val}", "trainer.test_freq=2")) == []
    assert validate(_cfg(tmp_path, f"data.val_files={val}", "trainer.test_freq=2", "trainer=colocated")) == []
    warnings = validate(_cfg(tmp_path, f"data.val_files={val}"))
    assert any("validation never runs" in w for w in warnings)
    with pytest.raises(ConfigError, match="while data.val_files is null"):  # inert: refused (test_reliability)
        validate(_cfg(tmp_path, "trainer.test_freq=2"))
    bad = _parquet(tmp_path / "bad.parquet", text=["a"])
    for overrides, key, part in [
        ([f"data.val_files={bad}"], "data.val_files", "no column 'prompt'"),
        ([f"data.val_files={tmp_path}/missing.jsonl"], "data.val_files", "no such file"),
        (["data.prompt_key=''"], "data.prompt_key", "non-empty"),
        (["trainer.test_freq=true"], "trainer.test_freq", "Integer"),
    ]:
        with pytest.raises(ConfigError) as err:
            validate(_cfg(tmp_path, *overrides))
        assert err.value.key == key and part in str(err.value), overrides
