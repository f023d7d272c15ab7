"""The driver's malloc settings (``driver/native_memory.py``): applied on glibc, skipped elsewhere, and a
user's ``MALLOC_ARENA_MAX`` left alone. The RSS they keep flat is ``bench/soak.py``'s figure."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from verl_digen.driver import native_memory


@pytest.mark.skipif(native_memory._glibc() is None, reason="the C library here is not glibc")
def test_arenas_are_capped_in_a_fresh_process_unless_the_user_set_them():
    code = ("from verl_digen.driver import native_memory as n; import sys; "
            "sys.stdout.write(str(n.limit_arenas()))")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout == "True"
    env["MALLOC_ARENA_MAX"] = "8"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout == "False"


def test_trim_runs_every_trim_every_steps(monkeypatch):
    calls = []

    class FakeLibc:
        def malloc_trim(self, pad: int) -> int:
            calls.append(pad)
            return 1

    monkeypatch.setattr(native_memory, "_glibc", lambda: FakeLibc())
    monkeypatch.setattr(native_memory, "TRIM_EVERY", 3)
    done = [native_memory.trim(step) for step in range(1, 8)]
    assert done == [False, False, True, False, False, True, False] and calls == [0, 0]


def test_without_glibc_both_are_no_ops(monkeypatch):
    monkeypatch.setattr(native_memory, "_glibc", lambda: None)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert native_memory.limit_arenas() is False and native_memory.trim(native_memory.TRIM_EVERY) is False

