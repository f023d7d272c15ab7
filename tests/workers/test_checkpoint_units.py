"""The checkpoint module's pieces one by one, without Ray (workers/checkpoint.py): the run lock that keeps two
live runs out of one directory (and takes over a dead run's), the reader's payload shape, the RNG round trip,
retention and the non-finite guard. The save / verify / resume paths are in tests/config/test_reliability.py."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from verl_digen.workers import checkpoint as ckpt


def _lock(root: Path, **info) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ckpt.LOCK_FILE).write_text(json.dumps(info))
    return root / ckpt.LOCK_FILE


# -- the run lock ----------------------------------------------------------------------------------------------
def test_the_lock_names_its_run_process_and_host_and_is_made_with_its_parents(tmp_path):
    root = tmp_path / "a" / "b"  # parents that do not exist yet
    before = time.time()
    lock = ckpt.acquire_lock(root, "run-x")
    try:
        info = json.loads(lock.read_text())
        assert lock == root / ckpt.LOCK_FILE
        assert info["run_id"] == "run-x" and info["pid"] == os.getpid() and info["host"] == socket.gethostname()
        assert before <= info["started"] <= time.time()
        assert set(info) == {"run_id", "pid", "host", "started"}
        assert lock.stat().st_mode & 0o777 == 0o644 & ~_umask()  # readable by whoever looks for the holder
    finally:
        ckpt.release_lock(root, "run-x")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_second_run_of_this_process_is_refused_until_the_first_releases(tmp_path):
    root = tmp_path / "ckpt"
    ckpt.acquire_lock(root, "run-a")
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.acquire_lock(root, "run-b")
    msg = str(err.value)  # the user is told who holds it and which file to remove if that run is gone
    assert "in use by run run-a" in msg and f"pid {os.getpid()}" in msg and socket.gethostname() in msg
    assert f"trainer.default_local_dir={str(root)!r}" in msg and str(root / ckpt.LOCK_FILE) in msg
    ckpt.release_lock(root, "run-b")  # not the holder: nothing is removed
    assert json.loads((root / ckpt.LOCK_FILE).read_text())["run_id"] == "run-a"
    ckpt.release_lock(root, "run-a")
    assert not (root / ckpt.LOCK_FILE).exists()
    ckpt.acquire_lock(root, "run-b")  # free again
    ckpt.release_lock(root, "run-b")


def test_a_lock_of_this_pid_whose_run_this_process_does_not_hold_is_stale(tmp_path):
    """A pid is reused: a lock naming this process but a run it never took (or released) is a dead run's."""
    root = tmp_path / "ckpt"
    _lock(root, run_id="earlier", pid=os.getpid(), host=socket.gethostname())
    ckpt.acquire_lock(root, "run-c")
    assert json.loads((root / ckpt.LOCK_FILE).read_text())["run_id"] == "run-c"
    ckpt.release_lock(root, "run-c")


def test_a_released_run_no_longer_counts_as_held_by_this_process(tmp_path):
    root = tmp_path / "ckpt"
    ckpt.acquire_lock(root, "run-h")
    ckpt.release_lock(root, "run-h")
    _lock(root, run_id="run-h", pid=os.getpid(), host=socket.gethostname())  # e.g. restored from a backup
    ckpt.acquire_lock(root, "run-i")
    ckpt.release_lock(root, "run-i")


def test_a_lock_without_a_pid_is_honoured(tmp_path, monkeypatch):
    """Nothing says its process is gone: the user removes it. The liveness probe is recorded, never sent: a
    probe of a pid-less lock addresses pid -1 (every process), so a mutant that sent a real signal would send it
    to every process of the user."""
    probes = []
    monkeypatch.setattr(ckpt.os, "kill", lambda pid, sig: probes.append(sig))
    root = tmp_path / "ckpt"
    _lock(root, run_id="no-pid", host=socket.gethostname())
    with pytest.raises(ckpt.CheckpointError, match="in use by run no-pid"):
        ckpt.acquire_lock(root, "run-j")
    assert probes and set(probes) == {0}  # signal 0: a probe, not a signal


def test_a_lock_from_another_host_is_honoured(tmp_path):
    root = tmp_path / "ckpt"
    _lock(root, run_id="remote", pid=2**22 + 12345, host=socket.gethostname() + "-elsewhere")
    with pytest.raises(ckpt.CheckpointError, match="in use by run remote"):
        ckpt.acquire_lock(root, "run-d")


def test_a_live_process_holding_the_lock_is_honoured_and_not_signalled(tmp_path):
    root = tmp_path / "ckpt"
    # the child takes SIGHUP's default action even under nohup, so a mutant's signal 1 would end it
    proc = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        _lock(root, run_id="other", pid=proc.pid, host=socket.gethostname())
        with pytest.raises(ckpt.CheckpointError, match="in use by run other"):
            ckpt.acquire_lock(root, "run-e")
        time.sleep(0.05)
        assert proc.poll() is None  # the liveness probe is signal 0: the other run is left alone
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_cannot_be_signalled_counts_as_alive(tmp_path, monkeypatch):
    def denied(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(ckpt.os, "kill", denied)
    assert ckpt._alive({"run_id": "x", "pid": 2**22 + 1, "host": socket.gethostname()})


def test_an_unreadable_lock_is_taken_over(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / ckpt.LOCK_FILE).write_text("{not json")  # a lock torn by a crash while it was written
    ckpt.acquire_lock(root, "run-f")
    assert json.loads((root / ckpt.LOCK_FILE).read_text())["run_id"] == "run-f"
    ckpt.release_lock(root, "run-f")


def test_a_lock_that_keeps_coming_back_is_an_error_after_two_tries(tmp_path, monkeypatch):
    """Another process re-creating the lock between our tries: two attempts, then a clear error, no loop."""
    root = tmp_path / "ckpt"
    root.mkdir()
    tries = []
    real_open = os.open

    def exists(path, flags, mode=0o777):
        if str(path).endswith(ckpt.LOCK_FILE):
            tries.append(flags)
            raise FileExistsError(path)  # the file vanished again before we could read it
        return real_open(path, flags, mode)

    monkeypatch.setattr(ckpt.os, "open", exists)
    with pytest.raises(ckpt.CheckpointError, match="could not take the checkpoint lock"):
        ckpt.acquire_lock(root, "run-g")
    assert tries == [os.O_CREAT | os.O_EXCL | os.O_WRONLY] * 2


# -- reading a checkpoint --------------------------------------------------------------------------------------
def test_read_returns_the_payload_in_saves_shape(tmp_path):
    params = {"w": torch.arange(3.0, dtype=torch.float64), "v": torch.ones(2, dtype=torch.float64)}
    payload = {"params": params,
               "optim": {"w": {"step": 7, "exp_avg": torch.full((3,), 0.5, dtype=torch.float64)},
                         "v": {"exp_avg": torch.zeros(2, dtype=torch.float64)}},
               "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.99), "eps": 1e-8}, {"lr": 2e-3}],
               "version": 5, "lora": True, "ema": {"w": torch.full((3,), 2.0, dtype=torch.float64)}}
    path = ckpt.step_dir(tmp_path, 5)
    ckpt.save(path, 0, payload, {"step": 5}, barrier=lambda: None)
    got, rng = ckpt.read(path, 0)
    assert set(got) >= {"params", "optim", "param_groups", "version", "lora", "ema", "nft_old", "extra"}
    assert "optim_scalars" not in got
    assert all(torch.equal(got["params"][k], v) for k, v in params.items())
    # tensors and the Python scalars (the step count) are merged back per parameter
    assert set(got["optim"]) == {"w", "v"} and got["optim"]["w"]["step"] == 7
    assert torch.equal(got["optim"]["w"]["exp_avg"], payload["optim"]["w"]["exp_avg"])
    assert list(got["optim"]["v"]) == ["exp_avg"]
    assert got["param_groups"] == [{"lr": 1e-3, "betas": (0.9, 0.99), "eps": 1e-8}, {"lr": 2e-3}]
    assert isinstance(got["param_groups"][0]["betas"], tuple)  # AdamW's own type, as saved
    assert torch.equal(got["ema"]["w"], payload["ema"]["w"]) and got["nft_old"] is None
    assert got["version"] == 5 and got["lora"] is True and got["extra"] == {"step": 5}
    assert set(rng) == set(ckpt.rng_state())
    assert ckpt.read(path, 1)[1] is None  # a rank the saving pool did not have: no RNG state


def test_read_refuses_a_trainer_file_that_is_not_a_payload(tmp_path):
    path = ckpt.step_dir(tmp_path, 1)
    ckpt.save(path, 0, {"params": {"w": torch.zeros(1)}, "optim": {}}, {}, barrier=lambda: None)
    for bad in ([torch.zeros(1)], {"params": [torch.zeros(1)]}):
        torch.save(bad, path / ckpt.TRAINER_FILE)
        meta = json.loads((path / ckpt.META_FILE).read_text())
        meta["files"][ckpt.TRAINER_FILE] = (path / ckpt.TRAINER_FILE).stat().st_size
        (path / ckpt.META_FILE).write_text(json.dumps(meta))
        with pytest.raises(ckpt.CheckpointError, match="is not a verl-digen trainer file"):
            ckpt.read(path, 0)


def test_a_checkpoint_without_optimizer_tensors_or_groups_reads(tmp_path):
    path = ckpt.step_dir(tmp_path, 2)
    ckpt.save(path, 0, {"params": {"w": torch.zeros(1)}, "optim": {"w": {"step": 3}}}, {}, barrier=lambda: None)
    tensors = torch.load(path / ckpt.TRAINER_FILE, weights_only=True)
    del tensors["optim"]  # a trainer file of a run that had not stepped
    torch.save(tensors, path / ckpt.TRAINER_FILE)
    meta = json.loads((path / ckpt.META_FILE).read_text())
    meta["files"][ckpt.TRAINER_FILE] = (path / ckpt.TRAINER_FILE).stat().st_size
    (path / ckpt.META_FILE).write_text(json.dumps(meta))
    got, _ = ckpt.read(path, 0)
    assert got["optim"] == {"w": {"step": 3}} and got["param_groups"] == []


def test_rng_state_restores_every_stream_exactly():
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    np.random.standard_normal()  # numpy's cached Gaussian (has_gauss) is part of its state
    state = ckpt.rng_state()
    want = (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(), torch.rand(2).tolist())
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    ckpt.set_rng_state(state)
    assert (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(), torch.rand(2).tolist()) == want


# -- retention and the non-finite guard ------------------------------------------------------------------------
def test_prune_keeps_the_newest_and_leaves_fewer_alone(tmp_path):
    for step in (1, 2, 3):
        ckpt.save(ckpt.step_dir(tmp_path, step), 0, {"params": {"w": torch.zeros(1)}, "optim": {}}, {},
                  barrier=lambda: None)
    assert ckpt.prune(tmp_path, 3) == [] and ckpt.prune(tmp_path, 5) == []
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [1, 2, 3]
    assert ckpt.prune(tmp_path, 1) == [ckpt.step_dir(tmp_path, 1), ckpt.step_dir(tmp_path, 2)]
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [3]
    assert not ckpt.step_dir(tmp_path, 1).exists() and not ckpt.step_dir(tmp_path, 2).exists()


def test_non_finite_names_the_first_bad_tensor_with_its_path():
    ok = torch.ones(2)
    assert ckpt.non_finite({"a": ok, "b": {"c": ok}, "n": torch.tensor([1, 2]), "s": 3}) is None
    assert ckpt.non_finite({"a": ok, "b": {"c": ok, "d": torch.tensor([1.0, float("nan")])}}) == "b.d"
    assert ckpt.non_finite({"e": {"f": torch.tensor([float("inf")])}}, "optim.") == "optim.e.f"
    assert ckpt.non_finite({"a": {"x": ok}, "b": torch.tensor([float("-inf")])}) == "b"


# -- a re-save's replaced copy, the verification cache, messages that name the file ----------------------------
def _save(path: Path, value: float = 0.0) -> Path:
    ckpt.save(path, 0, {"params": {"w": torch.full((4,), value)}, "optim": {}}, {"step": 1}, barrier=lambda: None)
    return path


def test_a_replaced_copy_counts_only_while_its_step_has_no_new_checkpoint(tmp_path):
    import shutil

    new = _save(ckpt.step_dir(tmp_path, 2))
    old = tmp_path / f"{ckpt.REPLACED_PREFIX}global_step_2"  # a kill between a re-save's two renames
    shutil.copytree(new, old)
    assert ckpt.complete_checkpoints(tmp_path) == [(2, new)]
    shutil.rmtree(new)
    assert ckpt.complete_checkpoints(tmp_path) == [(2, old)]


def test_a_corrupted_copy_of_a_verified_checkpoint_is_verified_on_its_own(tmp_path):
    """``verify`` remembers what it checked per checkpoint path: a copy with the same names, sizes and mtimes but
    a flipped byte is still refused."""
    import shutil

    a = _save(tmp_path / "a" / "global_step_1")
    past = time.time() - 60
    for f in a.iterdir():
        os.utime(f, (past, past))
    assert ckpt.verify(a)  # remembered: every file older than the mtime tick
    b = tmp_path / "b" / "global_step_1"
    shutil.copytree(a, b)  # copy2: the same mtimes
    data = bytearray((b / ckpt.TRAINER_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (b / ckpt.TRAINER_FILE).write_bytes(bytes(data))
    os.utime(b / ckpt.TRAINER_FILE, (past, past))
    with pytest.raises(ckpt.CheckpointError, match="is corrupt"):
        ckpt.verify(b)


def test_a_missing_digest_and_an_unloadable_file_are_named(tmp_path):
    path = _save(ckpt.step_dir(tmp_path, 3))
    (path / (ckpt.META_FILE + ckpt.CHECKSUM_SUFFIX)).unlink()
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.verify(path)
    assert str(path / ckpt.META_FILE) in str(err.value) and "is missing" in str(err.value)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.safe_load(bad)
    assert repr(str(bad)) in str(err.value)


def test_a_checkpoint_written_within_the_mtime_tick_is_read_again_at_the_next_verify(tmp_path):
    """A file can change within one mtime tick without its mtime moving: a checkpoint verified in the two seconds
    after it was written is not remembered, so a byte flipped then (size and mtime kept) is still found."""
    path = _save(ckpt.step_dir(tmp_path, 4))
    assert ckpt.verify(path)
    f = path / ckpt.TRAINER_FILE
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ckpt.CheckpointError, match="is corrupt"):
        ckpt.verify(path)


def test_only_step_folders_have_a_step():
    assert ckpt.step_of("/out/global_step_12") == 12 and ckpt.step_of("/out/.replaced-global_step_3") == 3
    for name in ("global_step_x", "global_step_", "global_step_-1", "other_12", "12"):
        assert ckpt.step_of(f"/out/{name}") is None, name


def test_a_save_keeps_the_newest_checkpoints_down_to_one_and_refuses_another_format(tmp_path):
    def save(step: int, keep: int | None = None) -> Path:
        path = ckpt.step_dir(tmp_path, step)
        ckpt.save(path, 0, {"params": {"w": torch.zeros(1)}, "optim": {}}, {}, barrier=lambda: None, keep=keep)
        return path

    save(1), save(2)
    assert ckpt.problem(save(3, keep=1)) is None
    assert [ckpt.step_of(p) for _, p in ckpt.complete_checkpoints(tmp_path)] == [3]
    meta_file = ckpt.step_dir(tmp_path, 3) / ckpt.META_FILE
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "format": "another"}))  # complete, but not this format
    assert ckpt.problem(ckpt.step_dir(tmp_path, 3)) is not None


def test_a_save_writes_the_runs_config_beside_its_tensors(tmp_path):
    path = ckpt.step_dir(tmp_path, 1)
    ckpt.save(path, 0, {"params": {"w": torch.zeros(1)}, "optim": {}}, {ckpt.CONFIG_YAML_KEY: "trainer:\n  seed: 1\n"},
              barrier=lambda: None)
    assert (path / ckpt.CONFIG_FILE).read_text() == "trainer:\n  seed: 1\n" and ckpt.problem(path) is None
    (path / ckpt.CONFIG_FILE).unlink()
    assert ckpt.problem(path) == f"{ckpt.CONFIG_FILE} is missing"


def test_one_element_tensors_in_the_metadata_are_written_as_numbers(tmp_path):
    path = ckpt.step_dir(tmp_path, 1)
    payload = {"params": {"w": torch.zeros(1)}, "optim": {}}
    ckpt.save(path, 0, payload, {"loss": torch.tensor(0.5)}, barrier=lambda: None)
    assert ckpt.read_meta(path)["extra"]["loss"] == 0.5


def test_metadata_that_is_not_json_is_refused_naming_its_type():
    """A tuple is written as a list and a one-element tensor as its number; anything else is a TypeError
    naming it (json.dumps then says which key), not another error from looking inside it."""
    assert ckpt._json_default((1, 2)) == [1, 2] and ckpt._json_default(torch.tensor([3])) == 3
    for value, name in (({1}, "set"), (torch.zeros(2), "Tensor"), (object(), "object")):
        with pytest.raises(TypeError, match=f"checkpoint metadata holds a {name}, which is not JSON"):
            ckpt._json_default(value)
