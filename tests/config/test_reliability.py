"""Reliability without Ray: safe checkpoint loading, atomic and owned checkpoints, the weight-sync store's
bind address, and every class of bad input refused by ``validate`` (the table in docs/config.md, one
case per row, checked against the table)."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from verl_digen.config import ConfigError, checks, compose, validate
from verl_digen.data import load_prompts
from verl_digen.workers import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------ helpers
def fake_checkpoint(root: Path, step: int, cfg=None, run_id: str = "old-run") -> Path:
    """A complete checkpoint written by the real ``checkpoint.save`` (one rank, a two-weight payload)."""
    path = ckpt.step_dir(root, step)
    payload = {"params": {"w": torch.arange(2.0)}, "optim": {"w": {"step": torch.tensor(3.0),
                                                                    "exp_avg": torch.ones(2)}},
               "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999)}], "version": step, "lora": False}
    extra = {"step": step, "run_id": run_id, "config": checks.fingerprint(cfg or compose([]))}
    ckpt.save(path, 0, payload, extra, barrier=lambda: None)
    return path


def forge_sizes(path: Path) -> None:
    """Record the files' current sizes in meta.json, as an attacker who controls the directory would."""
    meta = json.loads((path / ckpt.META_FILE).read_text())
    meta["files"] = {f.name: f.stat().st_size for f in path.iterdir() if f.name != ckpt.META_FILE}
    (path / ckpt.META_FILE).write_text(json.dumps(meta))


class _Touch:
    """Unpickling this calls ``Path.touch(marker)``: a stand-in for any code a crafted file could run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


# ------------------------------------------------------------------------------------ (1) safe loading
def test_a_crafted_pickle_in_a_checkpoint_cannot_run_code(tmp_path):
    path = fake_checkpoint(tmp_path / "ckpt", 1)
    marker = tmp_path / "pwned"
    torch.save({"params": {"w": torch.zeros(2)}, "optim": {}, "evil": _Touch(str(marker))}, path / ckpt.TRAINER_FILE)
    # the file really is live: the unsafe loader this module used to call runs the payload
    torch.load(path / ckpt.TRAINER_FILE, weights_only=False)
    assert marker.exists()
    marker.unlink()
    forge_sizes(path)
    with pytest.raises(ckpt.CheckpointError, match="refused without running them"):
        ckpt.read(path, 0)
    assert not marker.exists()
    # the same for a crafted RNG file
    torch.save({"torch": torch.get_rng_state(), "evil": _Touch(str(marker))}, path / ckpt.rng_file(0))
    fake_trainer = {"params": {"w": torch.zeros(2)}, "optim": {}}
    torch.save(fake_trainer, path / ckpt.TRAINER_FILE)
    forge_sizes(path)
    with pytest.raises(ckpt.CheckpointError, match="refused without running them"):
        ckpt.read(path, 0)
    assert not marker.exists()


def test_a_truncated_checkpoint_file_is_a_clear_error(tmp_path):
    path = fake_checkpoint(tmp_path / "ckpt", 1)
    data = (path / ckpt.TRAINER_FILE).read_bytes()
    (path / ckpt.TRAINER_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ckpt.CheckpointError, match=f"trainer.pt is {len(data) // 2} bytes, but {len(data)} were"):
        ckpt.read(path, 0)  # found from the sizes meta.json recorded, without unpickling
    forge_sizes(path)
    with pytest.raises(ckpt.CheckpointError, match="corrupt, truncated"):
        ckpt.read(path, 0)  # and the loader itself refuses the torn file


def flip_byte(file: Path, at: int | None = None, mask: int = 0xFF) -> None:
    """Flip the ``mask`` bits of one byte of ``file`` (the middle one unless ``at``): its size is unchanged."""
    data = bytearray(file.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= mask
    file.write_bytes(bytes(data))


def strip_checksums(path: Path) -> None:
    """Make ``path`` look like a checkpoint saved before the digests: no ``*.xxh3`` files, no ``checksum``."""
    for f in path.glob(f"*{ckpt.CHECKSUM_SUFFIX}"):
        f.unlink()
    meta = json.loads((path / ckpt.META_FILE).read_text())
    meta.pop("checksum")
    meta["files"] = {k: v for k, v in meta["files"].items() if not k.endswith(ckpt.CHECKSUM_SUFFIX)}
    (path / ckpt.META_FILE).write_text(json.dumps(meta))


@pytest.mark.parametrize("name", [ckpt.TRAINER_FILE, ckpt.rng_file(0), ckpt.CONFIG_FILE, ckpt.META_FILE])
def test_a_flipped_byte_in_any_checkpoint_file_is_refused_naming_it(tmp_path, name):
    path = ckpt.step_dir(tmp_path / "ckpt", 1)
    payload = {"params": {"w": torch.arange(4.0)}, "optim": {}, "param_groups": [], "version": 1, "lora": False}
    extra = {"step": 1, "run_id": "r", "config": checks.fingerprint(compose([])), ckpt.CONFIG_YAML_KEY: "a: 1\n"}
    ckpt.save(path, 0, payload, extra, barrier=lambda: None)
    assert ckpt.verify(path) is True
    size = (path / name).stat().st_size
    if name == ckpt.META_FILE:  # a digit of the saved time into another digit: it still parses, sizes still match
        flip_byte(path / name, (path / name).read_text().index('"saved_at": ') + 13, mask=0x01)
    else:
        flip_byte(path / name)
    assert (path / name).stat().st_size == size and ckpt.problem(path) is None  # the size check cannot see it
    with pytest.raises(ckpt.CheckpointError, match=rf"{name}' is corrupt: its xxh3_64 is [0-9a-f]+, but"):
        ckpt.verify(path)


def test_a_checkpoint_is_read_once_per_process_until_a_file_changes(tmp_path, monkeypatch):
    """The command line and the runtime both validate a resume: the second verify reads nothing while the
    files' sizes and mtimes are those it verified; a changed file is read (and refused) again."""
    path = fake_checkpoint(tmp_path / "ckpt", 1)
    old = 1_000_000_000
    for f in path.iterdir():  # saved long ago: only files that settled are remembered
        os.utime(f, (old, old))
    reads: list[str] = []
    digest_of = ckpt._digest_of
    monkeypatch.setattr(ckpt, "_digest_of", lambda f: reads.append(f.name) or digest_of(f))
    assert ckpt.verify(path) and ckpt.verify(path)
    assert sorted(reads) == sorted([ckpt.META_FILE, ckpt.TRAINER_FILE, ckpt.rng_file(0)])
    flip_byte(path / ckpt.TRAINER_FILE)
    with pytest.raises(ckpt.CheckpointError, match="trainer.pt' is corrupt"):
        ckpt.verify(path)


def test_a_checkpoint_without_checksums_loads_unverified(tmp_path):
    path = fake_checkpoint(tmp_path / "ckpt", 1)
    strip_checksums(path)
    assert ckpt.verify(path) is False
    warnings = validate(compose([f"trainer.resume_from={path}", f"trainer.trace_dir={tmp_path}/trace"]))
    assert [w for w in warnings if "unverified" in w and str(path) in w], warnings
    ckpt.read(path, 0)
    # a checkpoint that records digests but lost its meta.json.xxh3 is not taken for an old one
    path = fake_checkpoint(tmp_path / "ckpt2", 1)
    ckpt.checksum_file(path / ckpt.META_FILE).unlink()
    with pytest.raises(ckpt.CheckpointError, match="meta.json.xxh3 is missing"):
        ckpt.verify(path)


def test_rng_state_round_trips_through_tensors_and_json(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    torch.save(ckpt.rng_state(), tmp_path / "rng.pt")
    want = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    ckpt.set_rng_state(ckpt.safe_load(tmp_path / "rng.pt"))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == want


def test_checkpoint_round_trip_keeps_tensors_and_metadata(tmp_path):
    path = fake_checkpoint(tmp_path / "ckpt", 4)
    payload, rng = ckpt.read(path, 0)
    assert torch.equal(payload["params"]["w"], torch.arange(2.0))
    assert payload["optim"]["w"]["step"] == torch.tensor(3.0)
    assert payload["param_groups"][0]["betas"] == (0.9, 0.999) and payload["version"] == 4
    assert payload["extra"]["run_id"] == "old-run" and rng is not None


# ------------------------------------------------------------------------------------ (3) atomic, owned checkpoints
def test_partial_and_old_format_dirs_are_never_taken_for_checkpoints(tmp_path):
    root = tmp_path / "ckpt"
    fake_checkpoint(root, 2)
    (root / ".partial-global_step_5").mkdir()  # a save killed mid-way
    torch.save({"x": torch.zeros(1)}, root / ".partial-global_step_5" / ckpt.rng_file(0))
    (root / "global_step_7").mkdir()  # old format / torn: no meta.json
    torch.save({"x": torch.zeros(1)}, root / "global_step_7" / ckpt.TRAINER_FILE)
    assert ckpt.latest(root) == root / "global_step_2"
    assert "no meta.json" in ckpt.problem(root / "global_step_7")
    assert "partial" in ckpt.problem(root / ".partial-global_step_5")


def test_a_save_killed_before_its_rename_leaves_no_checkpoint(tmp_path, monkeypatch):
    root = tmp_path / "ckpt"

    def killed(*_a, **_k):
        raise KeyboardInterrupt  # stands in for SIGKILL between writing the files and the rename

    monkeypatch.setattr(Path, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        fake_checkpoint(root, 3)
    assert not (root / "global_step_3").exists() and (root / ".partial-global_step_3").is_dir()
    assert ckpt.latest(root) is None


def test_retention_keeps_the_newest_complete_checkpoints(tmp_path):
    root = tmp_path / "ckpt"
    for step in (1, 2, 3, 10):
        fake_checkpoint(root, step)
    gone = ckpt.prune(root, 2)
    assert sorted(p.name for p in gone) == ["global_step_1", "global_step_2"]
    assert [s for s, _ in ckpt.complete_checkpoints(root)] == [3, 10]  # numeric, not lexical order


def test_a_second_live_run_cannot_take_the_checkpoint_directory(tmp_path):
    from verl_digen.driver.runtime import DigenRuntime

    root = tmp_path / "ckpt"
    ckpt.acquire_lock(root, "run-a")
    try:
        cfg = compose(["trainer.save_freq=1", f"trainer.default_local_dir={root}", f"trainer.trace_dir={tmp_path}/t",
                       "trainer.logger=[]"])
        trainer = DigenRuntime(cfg, log=lambda _: None)
        with pytest.raises(ConfigError, match="in use by run run-a"):
            trainer.init_workers()  # refused before Ray or any worker starts
        assert trainer.trn_wg is None
    finally:
        ckpt.release_lock(root, "run-a")
    assert not (root / ckpt.LOCK_FILE).exists()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    dead = 2**22 + 12345  # above the default pid_max: no such process
    (root / ckpt.LOCK_FILE).write_text(json.dumps({"run_id": "gone", "pid": dead, "host": socket.gethostname()}))
    ckpt.acquire_lock(root, "run-b")
    assert json.loads((root / ckpt.LOCK_FILE).read_text())["run_id"] == "run-b"
    ckpt.release_lock(root, "run-b")


def test_resume_auto_picks_the_latest_complete_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    fake_checkpoint(root, 2)
    fake_checkpoint(root, 4)
    (root / "global_step_6").mkdir()  # incomplete
    cfg = compose(["trainer.resume_from=auto", f"trainer.default_local_dir={root}"])
    assert checks.resolve_resume(cfg) == str(root / "global_step_4")
    assert checks.resolve_resume(compose(["trainer.resume_from=auto", f"trainer.default_local_dir={tmp_path}/x"])) \
        is None


def test_an_allowed_resume_change_is_a_warning(tmp_path):
    path = fake_checkpoint(tmp_path / "ckpt", 1)
    cfg = compose([f"trainer.resume_from={path}", "actor.lr=0.001", "trainer.resume_allow_changes=[actor.lr]"])
    warnings = validate(cfg)
    assert any("actor.lr" in w and "allowed" in w for w in warnings)


# ------------------------------------------------------------------------------------ (1) weight-sync store bind
def test_the_weight_sync_group_listens_on_the_pool_address_only():
    import psutil

    from verl_digen.workers.sync import SyncGroup, new_secret

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = {c.laddr for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    got = {}

    secret = new_secret()

    def receiver() -> None:
        got["group"] = SyncGroup("127.0.0.1", port, 2, 1, timeout_s=60, secret=secret)
        got["w"] = got["group"].recv(5, {"w": torch.zeros(3)})["w"]

    peer = threading.Thread(target=receiver)
    peer.start()
    source = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=60, secret=secret)  # kept alive: sockets stay open
    source.send(1, 5, {"w": torch.arange(3.0)})
    peer.join(60)
    assert torch.equal(got["w"], torch.arange(3.0))
    new = {c.laddr for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN} - before
    assert source.store_server.listening is False  # every member joined: the store stopped listening
    assert all(a.port != port for a in new), new
    assert all(a.ip == "127.0.0.1" for a in new), f"weight sync listens beyond the pool address: {new}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("knows_group_id", [False, True])
def test_a_stranger_on_the_sync_port_cannot_make_a_generator_load_its_tensors(knows_group_id):
    """Behind the store (which refuses a stranger: tests/workers/test_sync_store.py), the transfer's own
    handshake holds on its own: a member that got into the group without the key the transfers are MACed with
    (here it holds the store's secret, its MAC key swapped) is refused at the handshake, before any tensor
    moves: for another run's group id, or, if it copied the group id from the wire, for its
    challenge-response. Nothing is returned to install, and the error says why (the run's failure line
    carries it)."""
    from verl_digen.workers.sync import SyncGroup, group_id, new_secret

    port, run_secret = _free_port(), new_secret()
    got = {}

    def generator() -> None:
        group = SyncGroup("127.0.0.1", port, 2, 1, timeout_s=60, secret=run_secret)
        try:
            got["w"] = group.recv(5, {"w": torch.zeros(3)})
        except RuntimeError as err:
            got["error"] = str(err)

    peer = threading.Thread(target=generator)
    peer.start()
    stranger = SyncGroup("127.0.0.1", port, 2, 0, timeout_s=60, secret=run_secret)
    other = new_secret()
    stranger._key = bytes.fromhex(other)
    stranger.group_id = group_id(run_secret if knows_group_id else other)  # copied from the wire: not secret
    with pytest.raises(RuntimeError, match="refused by sync rank 1 .*nothing was sent"):
        stranger.send(1, 5, {"w": torch.full((3,), 7.0)})
    peer.join(60)
    assert "w" not in got and stranger.counters["sent"] == 0
    why = "its handshake does not verify" if knows_group_id else "the sender is not of this run"
    assert f"weight sync of version 5 refused: {why}" in got["error"] and "nothing was loaded" in got["error"]


# ------------------------------------------------------------------------------------ (5) bad input before Ray
def _file(tmp_path: Path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _not_a_dir(tmp_path: Path) -> str:
    (tmp_path / "afile").write_text("x")
    return str(tmp_path / "afile" / "ckpt")


def _ckpt_missing_meta(tmp_path: Path) -> str:
    path = fake_checkpoint(tmp_path / "c", 1)
    (path / ckpt.META_FILE).unlink()
    return str(path)


def _ckpt_bad_meta(tmp_path: Path) -> str:
    path = fake_checkpoint(tmp_path / "c", 1)
    (path / ckpt.META_FILE).write_text("{not json")
    return str(path)


def _ckpt_truncated(tmp_path: Path) -> str:
    path = fake_checkpoint(tmp_path / "c", 1)
    data = (path / ckpt.TRAINER_FILE).read_bytes()
    (path / ckpt.TRAINER_FILE).write_bytes(data[:100])
    return str(path)


def _ckpt_flipped(tmp_path: Path) -> str:
    path = fake_checkpoint(tmp_path / "c", 1)
    flip_byte(path / ckpt.TRAINER_FILE)
    return str(path)


def _ckpt_partial(tmp_path: Path) -> str:
    path = fake_checkpoint(tmp_path / "c", 1)
    return str(path.rename(path.parent / ".partial-global_step_1"))


def _foreign_checkpoint(tmp_path: Path) -> str:
    """A checkpoint directory another trainer wrote (verl-omni's layout: actor/ and a step marker)."""
    step = tmp_path / "omni" / "global_step_3"
    (step / "actor").mkdir(parents=True)
    (step / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"weights")
    (tmp_path / "omni" / "latest_checkpointed_iteration.txt").write_text("3")
    return str(tmp_path / "omni")


def _reward(tmp_path: Path, name: str, head: str) -> str:
    """A reward file whose module-level code runs ``head`` before defining a valid ``compute_score``."""
    return _file(tmp_path, name, (head + "\ndef compute_score(images, prompts):\n"
                                  "    return [0.0] * len(images)\n").encode())


def _ckpt(tmp_path: Path, *overrides: str) -> str:
    return str(fake_checkpoint(tmp_path / "c", 1, compose(list(overrides))))


SAVE = ["trainer.save_freq=1"]
_EXIT = "import sys; sys.exit(0)"
#: class id (the first column of docs/config.md's "Bad input" table) -> (overrides of tmp_path, key, message part)
BAD_INPUT = {
    "lr-nan": (lambda t: ["actor.lr=nan"], "actor.lr", "a finite number > 0"),
    "lr-inf": (lambda t: ["actor.lr=inf"], "actor.lr", "a finite number > 0"),
    "lr-zero": (lambda t: ["actor.lr=0"], "actor.lr", "a finite number > 0"),
    "weight-decay-negative": (lambda t: ["actor.weight_decay=-0.1"], "actor.weight_decay", ">= 0"),
    "grad-clip-negative": (lambda t: ["actor.grad_clip=-1"], "actor.grad_clip", "0 turns clipping off"),
    "grad-clip-nan": (lambda t: ["actor.grad_clip=nan"], "actor.grad_clip", "a finite number >= 0"),
    "kl-coef-nan": (lambda t: ["actor.kl_coef=nan"], "actor.kl_coef", "a finite number >= 0"),
    "clip-ratio-zero": (lambda t: ["actor.clip_ratio=0"], "actor.clip_ratio", "a finite number > 0"),
    "adv-eps-negative": (lambda t: ["algorithm.adv_eps=-1"], "algorithm.adv_eps", "divides by zero"),
    "adv-clip-zero": (lambda t: ["algorithm.adv_clip=0"], "algorithm.adv_clip", "null or a finite number > 0"),
    "algorithm-unknown": (lambda t: ["algorithm.name=ppo"], "algorithm.name", "null or one of flow_grpo"),
    "nft-beta-zero": (lambda t: ["algorithm.name=diffusion_nft", "actor.mix_beta=0"], "actor.mix_beta",
                      "a finite number > 0"),
    "nft-schedule-unknown": (lambda t: ["algorithm.name=diffusion_nft", "algorithm.old_policy_decay_schedule=ema"],
                             "algorithm.old_policy_decay_schedule", "one of copy, linear_to_0_5"),
    "nft-decay-above-one": (lambda t: ["algorithm.name=diffusion_nft", "algorithm.old_policy_decay=1.5"],
                            "algorithm.old_policy_decay", "a number in [0, 1]"),
    "nft-interval-zero": (lambda t: ["algorithm.name=diffusion_nft", "algorithm.old_policy_update_interval=0"],
                          "algorithm.old_policy_update_interval", "an integer >= 1"),
    "nft-adv-mode-unknown": (lambda t: ["algorithm.name=diffusion_nft", "algorithm.adv_mode=ranked"],
                             "algorithm.adv_mode", "one of continuous"),
    "nft-keys-without-nft": (lambda t: ["actor.mix_beta=0.1"], "actor.mix_beta", "only DiffusionNFT reads it"),
    "nft-sde-type": (lambda t: ["algorithm.name=diffusion_nft", "rollout.sde_type=cps"], "rollout.sde_type",
                     "there is no SDE"),
    "nft-recompute": (lambda t: ["algorithm.name=diffusion_nft", "actor.recompute_log_prob=true"],
                      "actor.recompute_log_prob", "with no log-prob"),
    "nft-shared-noise": (lambda t: ["algorithm.name=diffusion_nft", "rollout.shared_group_noise=true"],
                         "rollout.shared_group_noise", "identical samples"),
    "nft-window": (lambda t: ["algorithm.name=diffusion_nft", "rollout.selection=window"], "rollout.selection",
                   "no SDE window"),
    "mix-window-too-large": (lambda t: ["algorithm.name=mix_grpo", "rollout.train_steps=7"], "rollout.train_steps",
                             "an integer in [1, 6]: MixGRPO's window size"),
    "mix-strategy-unknown": (lambda t: ["algorithm.name=mix_grpo", "rollout.sample_strategy=linear"],
                             "rollout.sample_strategy", "one of random, progressive"),
    "mix-iters-zero": (lambda t: ["algorithm.name=mix_grpo", "rollout.iters_per_group=0"], "rollout.iters_per_group",
                       "an integer >= 1"),
    "mix-fixed-window": (lambda t: ["algorithm.name=mix_grpo", "rollout.window_start=1"], "rollout.window_start",
                         "null with algorithm.name=mix_grpo"),
    "mix-keys-without-mix": (lambda t: ["rollout.sample_strategy=progressive"], "rollout.sample_strategy",
                             "only MixGRPO slides its SDE window"),
    "algorithm-sde-conflict": (lambda t: ["algorithm.name=dance_grpo", "rollout.sde_type=cps"], "rollout.sde_type",
                               "the SDE of algorithm.name=dance_grpo"),
    "guard-squared-error": (lambda t: ["algorithm.name=grpo_guard", "rollout.sde_type=cps",
                                       "rollout.cps_log_prob=squared_error"], "rollout.cps_log_prob",
                            "gaussian with algorithm.name=grpo_guard"),
    "kl-mask-negative": (lambda t: ["algorithm.name=flow_dppo", "actor.kl_mask_threshold=-1"],
                         "actor.kl_mask_threshold", "a finite number >= 0"),
    "shift-zero": (lambda t: ["rollout.shift=0"], "rollout.shift", "time shift"),
    "noise-inf": (lambda t: ["rollout.noise_level=inf"], "rollout.noise_level", "stochastic"),
    "timestep-fraction": (lambda t: ["rollout.timestep_fraction=1.5"], "rollout.timestep_fraction", "(0, 1]"),
    "lora-alpha-negative": (lambda t: ["model.lora_rank=4", "model.lora_alpha=-8"], "model.lora_alpha", "> 0"),
    "target-modules-empty": (lambda t: ["model.lora_rank=4", "model.target_modules=[]"], "model.target_modules",
                             "non-empty list"),
    "lora-target-unknown": (lambda t: ["model.lora_rank=4", "model.target_modules=[to_q,to_qq]"],
                            "model.target_modules", "['to_qq'] match no module"),
    "model-path-missing": (lambda t: [f"model.path={t}/no-such-model"], "model.path",
                           "an existing local diffusers pipeline directory"),
    "reward-weight-zero": (lambda t: ["reward.weights={latent_mean: 1.0, brightness: 0.0}"],
                           "reward.weights.brightness", "non-zero"),
    "pool-too-large": (lambda t: ["resources.generator.workers=1000", "rollout.micro_batch_size=2"],
                       "resources.generator.workers", "workers in all on this machine"),
    "pool-absurd": (lambda t: ["resources.trainer.workers=100000"], "resources.trainer.workers", "per pool"),
    "ray-address-malformed": (lambda t: ["ray.address=http://head"], "ray.address", "host:port"),
    "max-checkpoints-zero": (lambda t: ["trainer.max_checkpoints=0"], "trainer.max_checkpoints", ">= 1"),
    "on-nonfinite-unknown": (lambda t: ["trainer.on_nonfinite=ignore"], "trainer.on_nonfinite", "skip, stop"),
    "max-nonfinite-zero": (lambda t: ["trainer.max_nonfinite_steps=0"], "trainer.max_nonfinite_steps", ">= 1"),
    "stall-timeout-zero": (lambda t: ["trainer.stall_timeout_s=0"], "trainer.stall_timeout_s", "null waits forever"),
    "restarts-negative": (lambda t: ["trainer.generator_max_restarts=-1"], "trainer.generator_max_restarts", ">= 0"),
    "action-timeout-factor-small": (lambda t: ["trainer.action_timeout_factor=0.5"], "trainer.action_timeout_factor",
                                    ">= 1"),
    "action-timeout-min-zero": (lambda t: ["trainer.action_timeout_min_s=0"], "trainer.action_timeout_min_s", "> 0"),
    "allow-structural-change": (lambda t: ["trainer.resume_allow_changes=[model.arch]"],
                                "trainer.resume_allow_changes", "cannot be allowed"),
    "trace-dir-unwritable": (lambda t: ["trainer.trace_dir=/proc/digen_trace"], "trainer.trace_dir",
                             "a writable directory"),
    "ckpt-dir-unwritable": (lambda t: [*SAVE, "trainer.default_local_dir=/proc/digen_ckpt"],
                            "trainer.default_local_dir", "a writable directory"),
    "ckpt-dir-under-a-file": (lambda t: [*SAVE, f"trainer.default_local_dir={_not_a_dir(t)}"],
                              "trainer.default_local_dir", "is not a directory"),
    "foreign-checkpoints": (lambda t: [*SAVE, f"trainer.default_local_dir={Path(_ckpt(t)).parent}"],
                            "trainer.default_local_dir", "another run's checkpoints"),
    "resume-missing": (lambda t: ["trainer.resume_from=/nonexistent/ckpt"], "trainer.resume_from",
                       "an existing checkpoint directory"),
    "resume-no-meta": (lambda t: [f"trainer.resume_from={_ckpt_missing_meta(t)}"], "trainer.resume_from",
                       "has no meta.json"),
    "resume-bad-meta": (lambda t: [f"trainer.resume_from={_ckpt_bad_meta(t)}"], "trainer.resume_from",
                        "unreadable"),
    "resume-truncated": (lambda t: [f"trainer.resume_from={_ckpt_truncated(t)}"], "trainer.resume_from",
                         "trainer.pt is 100 bytes, but"),
    "resume-corrupt": (lambda t: [f"trainer.resume_from={_ckpt_flipped(t)}"], "trainer.resume_from",
                       "trainer.pt' is corrupt: its xxh3_64 is"),
    "resume-partial": (lambda t: [f"trainer.resume_from={_ckpt_partial(t)}"], "trainer.resume_from",
                       "partial checkpoint"),
    "resume-changed-key": (lambda t: [f"trainer.resume_from={_ckpt(t)}", "actor.lr=0.001"], "actor.lr",
                           "trainer.resume_allow_changes=[actor.lr]"),
    "resume-changed-batch": (lambda t: [f"trainer.resume_from={_ckpt(t)}", "data.train_batch_size=8"],
                             "data.train_batch_size", "as in the checkpoint"),
    "resume-changed-structure": (lambda t: [f"trainer.resume_from={_ckpt(t, 'model.lora_rank=4')}"],
                                 "model.lora_rank", "cannot be resumed across"),
    "prompts-empty": (lambda t: [f"data.train_files={_file(t, 'p.txt', b'')}"], "data.train_files", "no prompts"),
    "prompts-blank": (lambda t: [f"data.train_files={_file(t, 'p.txt', b'  ' + bytes([10]) * 3)}"],
                      "data.train_files", "no prompts"),
    "prompts-not-utf8": (lambda t: [f"data.train_files={_file(t, 'p.txt', b'a cat' + bytes([10, 0xFF, 10]))}"],
                         "data.train_files", "p.txt:2: not UTF-8"),
    "prompts-bad-json": (lambda t: [f"data.train_files={_file(t, 'p.jsonl', _J)}"],
                         "data.train_files", "p.jsonl:3: not valid JSON"),
    "prompts-no-field": (lambda t: [f"data.train_files={_file(t, 'p.jsonl', _NO_FIELD)}"],
                         "data.train_files", "p.jsonl:1: expected an object with a 'prompt' field"),
    "prompts-null": (lambda t: [f"data.train_files={_file(t, 'p.jsonl', _NULL)}"],
                     "data.train_files", "p.jsonl:1: 'prompt' must be a string, got null"),
    "prompts-suffix": (lambda t: [f"data.train_files={_file(t, 'p.csv', b'a cat')}"], "data.train_files",
                       "expected a .txt, .jsonl or .parquet"),
    "batch-huge": (lambda t: ["data.train_batch_size=100000000"], "data.train_batch_size", "GiB of bookkeeping"),
    "batch-trajectories": (lambda t: ["data.train_batch_size=100000", "model.latent_size=128"], "data.train_batch_size",
                           "GiB of latents"),
    "group-huge": (lambda t: ["rollout.n=100000"], "rollout.n", "a group size in [2, 1024]"),
    "sampling-steps-huge": (lambda t: ["rollout.num_steps=1000000"], "rollout.num_steps", "at most 1000 sampling"),
    "latent-huge": (lambda t: ["model.latent_size=1000000"], "model.latent_size", "an even number in [2, 512]"),
    "latent-width-odd": (lambda t: ["model.latent_width=5"], "model.latent_width", "a positive even number"),
    "latent-width-without-height": (lambda t: ["model.latent_size=null", "model.latent_width=8"], "model.latent_width",
                                    "null unless model.latent_size"),
    "lr-huge": (lambda t: ["actor.lr=1e30"], "actor.lr", "a number in (0, 1]"),
    "log-format-unknown": (lambda t: ["trainer.log_format=lines"], "trainer.log_format", "one of auto, block, line"),
    "ema-decay-one": (lambda t: ["actor.ema_decay=1.0"], "actor.ema_decay", "null or a number in (0, 1)"),
    "val-with-ema-without-ema": (lambda t: ["trainer.val_with_ema=true"], "trainer.val_with_ema",
                                 "false while actor.ema_decay is null"),
    "export-on-save-without-saves": (lambda t: ["trainer.export_on_save=true"], "trainer.export_on_save",
                                     "false while trainer.save_freq=-1"),
    "vllm-backend": (lambda t: ["rollout.backend=vllm", "trainer.device=cuda"], "model.path",
                     "a local diffusers checkpoint with rollout.backend=vllm"),
    "recompute-unknown": (lambda t: ["actor.recompute_log_prob=maybe"], "actor.recompute_log_prob",
                          "one of auto, true, false"),
    "recompute-under-tcss": (lambda t: ["actor.recompute_log_prob=true", "digen.tcss.staleness=1"],
                             "actor.recompute_log_prob", "auto or false while digen.tcss.staleness=1.0"),
    "kl-weight-without-kl": (lambda t: ["actor.kl_dt_weighted=true"], "actor.kl_dt_weighted",
                             "false while actor.kl_coef=0"),
    "other-trainers-checkpoints": (lambda t: [*SAVE, f"trainer.default_local_dir={_foreign_checkpoint(t)}"],
                                   "trainer.default_local_dir", "global_step_3 is not one"),
    "lora-alpha-without-lora": (lambda t: ["model.lora_alpha=8"], "model.lora_alpha", "null while model.lora_rank=0"),
    "target-modules-without-lora": (lambda t: ["model.target_modules=[to_q]"], "model.target_modules",
                                    "null while model.lora_rank=0"),
    "test-freq-without-val-files": (lambda t: ["trainer.test_freq=2"], "trainer.test_freq",
                                    "while data.val_files is null"),
    "ulysses-image-model": (lambda t: ["actor.ulysses_sequence_parallel_size=2", "resources.trainer.workers=2"],
                            "actor.ulysses_sequence_parallel_size", "1 for model.arch=flux"),
    "ulysses-not-a-divisor-of-ranks": (lambda t: ["model.arch=wan", "actor.ulysses_sequence_parallel_size=2",
                                                  "resources.trainer.workers=3"],
                                       "actor.ulysses_sequence_parallel_size", "a divisor of the 3 trainer GPUs"),
    "ulysses-splits-heads": (lambda t: ["model.arch=wan", "actor.ulysses_sequence_parallel_size=4",
                                        "resources.trainer.workers=4"],
                             "actor.ulysses_sequence_parallel_size", "a divisor of the wan transformer's 2 attention"),
    "ulysses-splits-tokens": (lambda t: ["model.arch=hunyuan_video", "model.latent_size=6", "model.num_frames=1",
                                         "actor.ulysses_sequence_parallel_size=2", "resources.trainer.workers=2"],
                              "actor.ulysses_sequence_parallel_size", "a divisor of the 9 video tokens per sample"),
    "mini-batch-not-a-divisor": (lambda t: ["data.train_batch_size=4", "actor.ppo_mini_batch_size=3"],
                                 "actor.ppo_mini_batch_size", "null or a divisor of data.train_batch_size=4"),
    "mini-batch-splits-micro-batches": (lambda t: ["data.train_batch_size=4", "rollout.n=4",
                                                   "rollout.micro_batch_size=8", "actor.ppo_mini_batch_size=1"],
                                        "actor.ppo_mini_batch_size", "mini-batches of whole micro-batches"),
    "mini-batch-splits-updates": (lambda t: ["data.train_batch_size=4", "rollout.n=4", "rollout.micro_batch_size=2",
                                             "actor.ppo_mini_batch_size=2", "digen.update_units=4"],
                                  "actor.ppo_mini_batch_size", "mini-batches of whole updates"),
    "lora-rank-huge": (lambda t: ["model.lora_rank=100000"], "model.lora_rank",
                       "at most 32, the smaller side of the smallest layer it adapts"),
    "window-range-reversed": (lambda t: ["rollout.window_range=[5,2]"], "rollout.window_range",
                              "[lo, hi] with 0 <= lo < hi <= 6"),
    "staleness-inf": (lambda t: ["digen.tcss.staleness=inf"], "digen.tcss.staleness", "a fraction in [0, 1], finite"),
    "staleness-nan": (lambda t: ["digen.tcss.staleness=nan"], "digen.tcss.staleness", "a fraction in [0, 1], finite"),
    "ckpt-dir-name-too-long": (lambda t: [*SAVE, f"trainer.default_local_dir={t}/{'c' * 300}"],
                               "trainer.default_local_dir", "a path whose every name is at most"),
    "trace-dir-name-too-long": (lambda t: [f"trainer.trace_dir={t}/{'t' * 300}"], "trainer.trace_dir",
                                "a path whose every name is at most"),
    "trace-dir-path-too-long": (lambda t: [f"trainer.trace_dir={t}/{'/'.join(['d' * 200] * 25)}"],
                                "trainer.trace_dir", "the file system's limit, less 64"),
    "seed-huge": (lambda t: [f"trainer.seed={2**64}"], "trainer.seed", "an integer in [0, 2^64 - 1]"),
    "model-seed-huge": (lambda t: [f"model.seed={2**65}"], "model.seed", "an integer in [0, 2^64 - 1]"),
    "keep-extremes-negative": (lambda t: ["algorithm.keep_extremes=-1"], "algorithm.keep_extremes",
                               "null or an even integer >= 2"),
    "experiment-name-not-ascii": (lambda t: ["trainer.experiment_name='r\u00e9sum\u00e9-\u5b9e\u9a8c'",
                                             "trainer.logger=[console,tensorboard]"],
                                  "trainer.experiment_name", "printable ASCII name without '/' with trainer.logger"),
    "resume-other-arch": (lambda t: [f"trainer.resume_from={_ckpt(t, 'model.arch=wan')}"], "model.arch",
                          "'wan' as in the checkpoint being resumed"),
    "model-hub-id-not-cached": (lambda t: ["model.path=nobody-digen/no-such-pipeline"], "model.path",
                                "a hub id whose pipeline is in the Hugging Face cache"),
    "model-hub-id-not-cached-gpu": (lambda t: ["trainer.device=cuda", "model.path=nobody-digen/no-such-pipeline"],
                                    "model.path", "a hub id whose pipeline is in the Hugging Face cache"),
    "reward-exits-at-import": (lambda t: [f"custom_reward_function.path={_reward(t, 'r.py', _EXIT)}"],
                               "custom_reward_function.path", "r.py: importing it called sys.exit(0)"),
    "reward-raises-at-import": (lambda t: [f"custom_reward_function.path={_reward(t, 'r.py', 'raise KeyError(1)')}"],
                                "custom_reward_function.path", "r.py: importing it failed (KeyError: 1)"),
}
#: line 1 valid, line 2 blank, line 3 malformed: the error must say line 3
_J = b'{"prompt": "a cat"}\n\n{"prompt": "a dog"\n'
_NO_FIELD = b'{"text": "a"}\n'
_NULL = b'{"prompt": null}\n'


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_refused_before_ray_naming_the_key(case, tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    make, key, part = BAD_INPUT[case]
    cfg = compose([f"trainer.trace_dir={tmp_path}/trace", f"trainer.default_local_dir={tmp_path}/ckpt",
                   *make(tmp_path)])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key, str(err.value)
    assert part in str(err.value) and repr(key)[1:-1] in str(err.value)


def test_wandb_without_credentials_is_refused_before_ray(tmp_path, monkeypatch):
    """verl's Tracking would start wandb after Ray and the workers, and stop the run there (no key, no TTY
    to ask for one); validate says so first. Offline mode, a key or a `wandb login` entry let it through."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    cfg = compose([f"trainer.trace_dir={tmp_path}/trace", "trainer.logger=[console,wandb]"])
    with pytest.raises(ConfigError, match=r"trainer.logger.*wandb has no credentials for api.wandb.ai.*WANDB_MODE"):
        validate(cfg)
    monkeypatch.setenv("WANDB_MODE", "offline")
    validate(cfg)
    monkeypatch.delenv("WANDB_MODE")
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    netrc.chmod(0o600)
    validate(cfg)


def test_another_trainers_step_folder_is_refused_only_where_this_run_saves(tmp_path):
    """verl-omni's global_step_3 blocks a run that may save step 3 (a save would replace the folder), not
    one that ends before it (its steps never reach that name)."""
    root = _foreign_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="global_step_3 is not one"):
        validate(compose([*SAVE, f"trainer.default_local_dir={root}", "trainer.total_steps=3"]))
    validate(compose([*SAVE, f"trainer.default_local_dir={root}", "trainer.total_steps=2",
                      f"trainer.trace_dir={tmp_path}/trace"]))


def test_config_md_table_lists_exactly_the_tested_classes():
    text = (ROOT / "docs" / "config.md").read_text()
    section = text[text.index("## Bad input"):]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M)
    assert len(rows) >= 25
    assert sorted(rows) == sorted(BAD_INPUT), "docs/config.md's bad-input table and BAD_INPUT differ"


def test_a_huge_batch_is_refused_without_allocating_it(tmp_path):
    """``data.train_batch_size=100000000`` once grew ``validate()`` to 21.7 GB until the kernel killed it.
    Refused from the config alone: the whole command, interpreter and imports included, stays under 1 GB
    (its own peak, ``VmHWM``: ``ru_maxrss`` survives exec, so a child of a large test process reports the
    parent's size)."""
    code = ("from pathlib import Path\n"
            "from verl_digen.config import ConfigError, compose, validate\n"
            "try:\n    validate(compose(['data.train_batch_size=100000000']))\nexcept ConfigError as e:\n"
            "    print(e)\n    print(next(ln for ln in Path('/proc/self/status').read_text().splitlines()\n"
            "               if ln.startswith('VmHWM')))\n    raise SystemExit(2)\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "data.train_batch_size" in proc.stdout and "bookkeeping" in proc.stdout, proc
    peak_kib = int(proc.stdout.split("VmHWM:")[1].split()[0])
    assert peak_kib * 1024 < 2**30, peak_kib


def test_a_finished_run_says_so_before_ray(tmp_path, monkeypatch, capsys):
    """Resuming a checkpoint already at ``trainer.total_steps`` used to start Ray and both pools (~90 s) first."""
    from verl_digen import main as main_mod

    ck = fake_checkpoint(tmp_path / "ckpt", 2)
    cfg = compose([f"trainer.resume_from={ck}", "trainer.total_steps=2", f"trainer.trace_dir={tmp_path}/t"])
    assert checks.finished(cfg) == (f"nothing to do: the checkpoint resumed ({ck}) is at step 2, and "
                                    "trainer.total_steps=2; raise trainer.total_steps to train further")
    assert checks.finished(compose([f"trainer.resume_from={ck}", "trainer.total_steps=3"])) is None
    assert checks.finished(compose(["trainer.total_steps=1"])) is None  # a fresh start
    monkeypatch.setattr(main_mod, "run", lambda cfg: pytest.fail("the run started"))
    monkeypatch.setattr(sys, "argv", ["digen", f"trainer.resume_from={ck}", "trainer.total_steps=2",
                                      f"trainer.trace_dir={tmp_path}/t"])
    main_mod.main()
    assert "nothing to do" in capsys.readouterr().out


def test_fewer_prompts_than_the_batch_is_a_warning(tmp_path):
    files = _file(tmp_path, "p.txt", b"a cat\na dog\n")
    warnings = validate(compose([f"data.train_files={files}", "data.train_batch_size=4",
                                 f"trainer.trace_dir={tmp_path}/t"]))
    assert any("only 2 prompt(s) for data.train_batch_size = 4" in w for w in warnings)


def test_prompt_files_load_skipping_blank_lines(tmp_path):
    assert load_prompts(_file(tmp_path, "q.jsonl", b'{"prompt": "a"}\n\n{"prompt": "b"}\n')) == ["a", "b"]
    assert load_prompts(_file(tmp_path, "q.txt", b"a cat\n\n  \na dog\n")) == ["a cat", "a dog"]


def test_validate_leaves_no_probe_files(tmp_path):
    validate(compose([f"trainer.trace_dir={tmp_path}/trace", "trainer.save_freq=1",
                      f"trainer.default_local_dir={tmp_path}/ckpt"]))
    assert os.listdir(tmp_path) == []  # probed in the nearest existing ancestor, nothing created


def test_main_prints_one_line_with_the_resume_command():
    from verl_digen.main import _stopped_line

    line = _stopped_line("stopped by SIGTERM after step 3", "out/ckpt/global_step_3")
    assert "\n" not in line and line.endswith("trainer.resume_from=out/ckpt/global_step_3")


def test_failure_line_carries_the_errors_message_not_only_its_type(tmp_path):
    """A failed call (a custom reward that raised, a worker's error) used to end with only
    ``the run failed: RuntimeError``: the line now says what the error said (its first line)."""
    from verl_digen.main import failure_line

    cfg = compose([f"trainer.default_local_dir={tmp_path}/ckpt"])
    err = RuntimeError("ray::gen0.score() (pid=12, ip=127.0.0.1): my_reward returned 3 scores for 4 samples\n  tb")
    assert failure_line(err, cfg, argv=[]) == (
        "the run failed: RuntimeError: ray::gen0.score() (pid=12, ip=127.0.0.1): my_reward returned 3 scores for 4 "
        "samples; no checkpoint to resume from (trainer.save_freq > 0 writes them)")
    assert failure_line(ValueError(), cfg, argv=[]).startswith("the run failed: ValueError; ")
    # a worker's own error as Ray raises it: the cause first, then the call and its process (colours dropped)
    import ray.exceptions as rex

    head = "\x1b[36mray::GeneratorWorker.score_rows()\x1b[39m (pid=4242, ip=10.0.0.1, actor_id=ab, repr=<x>)"
    task = rex.RayTaskError("GeneratorWorker.score_rows", head + "\n  File ...\nKeyError: 'x'", KeyError("x"),
                            proctitle="ray::GeneratorWorker.score_rows()", pid=4242, ip="10.0.0.1")
    assert failure_line(task.as_instanceof_cause(), cfg, argv=[]).startswith(
        "the run failed: KeyError: 'x' (in ray::GeneratorWorker.score_rows() on pid 4242); ")


def test_failure_line_names_the_dead_worker_not_the_call_that_noticed_and_drops_colours(tmp_path):
    """A trainer rank killed mid-step surfaced as a generator's failed ``score_rows`` with Ray's colour codes;
    the driver finds the dead workers (``faults.note_dead_workers``) and the line names them instead."""
    import ray.exceptions as rex

    from verl_digen.driver import faults
    from verl_digen.main import failure_line

    cfg = compose([f"trainer.default_local_dir={tmp_path}/ckpt"])
    head = "\x1b[36mray::GeneratorWorker.score_rows()\x1b[39m (pid=77, ip=10.0.0.1, actor_id=ab, repr=<x>)"
    task = rex.RayTaskError("GeneratorWorker.score_rows", head + "\n  File ...\nRuntimeError: \x1b[31mboom\x1b[0m",
                            RuntimeError("\x1b[31mpeer gone\x1b[0m"), proctitle="ray::GeneratorWorker.score_rows()",
                            pid=77, ip="10.0.0.1").as_instanceof_cause()
    plain = failure_line(task, cfg, argv=[])
    assert "GeneratorWorker.score_rows() on pid 77" in plain and "\x1b" not in plain, plain
    task.__notes__ = [faults.DEAD_NOTE + "trainer rank 1 (pid 4242 on 10.0.0.2)"]
    line = failure_line(task, cfg, argv=[])
    assert line.startswith("the run failed: trainer rank 1 (pid 4242 on 10.0.0.2) died (noticed as "), line
    assert "\x1b" not in line and "[36m" not in line
    died = rex.ActorDiedError()
    died.__notes__ = [faults.DEAD_NOTE + "generator rank 0 (pid 9 on 10.0.0.3)"]
    assert failure_line(died, cfg, argv=[]).startswith(
        "the run failed: generator rank 0 (pid 9 on 10.0.0.3) died (ActorDiedError: ")
    # Ray's death message carries the process: pid and ip lines
    assert faults._process(RuntimeError("The actor died\n\tclass_name: X\n\tpid: 123\n\tip: 10.1.2.3")) == \
        " (pid 123 on 10.1.2.3)"
    seen: list[str] = []
    faults.plain_log(seen.append)("\x1b[33mwarning\x1b[0m: x")
    assert seen == ["warning: x"]


def test_a_run_starts_its_own_ray_head_unless_told_and_says_which_cluster(monkeypatch, capsys):
    """Told neither ray.address nor RAY_ADDRESS (the key wins, as ray.init's argument does) a run (CPU or
    GPU) starts a head of its own (never someone else's ``ray start`` cluster on the machine) and says so;
    told, it joins and says where and from which setting. (Ray's calls are recorded, not made: a second Ray
    in the suite's process is not possible; tests/runtime/test_cluster_stop_runtime.py starts real ones.)"""
    import ray

    from verl_digen.driver import pools

    calls, started = [], []

    class FakeHead:
        address, pid = "127.0.0.1:6399", 4242

        @classmethod
        def start(cls, num_cpus):
            started.append(num_cpus)
            return cls()

    monkeypatch.setattr(pools, "OwnHead", FakeHead)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda address=None, **kw: calls.append((address, kw)))
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"gcs_address": "10.0.0.5:6379"})())
    monkeypatch.setattr(ray, "nodes", lambda: [{}, {}])
    for device, env, key, address, line in [
            ("cpu", None, None, "127.0.0.1:6399", "started a Ray cluster of its own at 127.0.0.1:6399 (head pid 4242"),
            ("cuda", None, None, "127.0.0.1:6399", "started a Ray cluster of its own"),
            ("cuda", "10.0.0.5:6379", None, "10.0.0.5:6379", "joined the Ray cluster at 10.0.0.5:6379 (2 node(s)), "
                                                             "from RAY_ADDRESS"),
            ("cuda", None, "10.0.0.5:6379", "10.0.0.5:6379", "from ray.address"),
            ("cuda", "10.0.0.9:6379", "ray://10.0.0.5:10001", "ray://10.0.0.5:10001", "from ray.address")]:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        if env:
            monkeypatch.setenv("RAY_ADDRESS", env)
        calls.clear()
        pools.ensure_ray(compose([f"trainer.device={device}", *([f"ray.address={key}"] if key else [])]))
        (got, kw), = calls
        assert got == address and kw["include_dashboard"] is False, (device, env, key)
        assert line in capsys.readouterr().out, (device, env, key)
        pools._own_head = None
    assert started[0] >= 2 and started[1] is None and len(started) == 2  # CPU: the cores; GPU: Ray counts them


def test_the_stop_signal_handler_covers_ray_start_up(monkeypatch):
    """A SIGTERM while ``ray.init`` runs reaches the run's handler (its line, its exit code), not Ray's
    (``sys.exit(15)``, no line): signals are held while Ray connects and its handler is replaced. The
    signal lands on another thread (Ray's and pytest-xdist's exist in real runs), where a mask on the main
    thread held nothing: Python then ran Ray's handler (CI failed so)."""
    import signal

    import ray

    from verl_digen.driver import pools
    from verl_digen.driver.stopping import StopSignals

    def init_like_ray(address=None, **kw):
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(15))  # what ray.init does
        other = threading.Thread(target=time.sleep, args=(0.5,))
        other.start()
        signal.pthread_kill(other.ident, signal.SIGTERM)  # the process-directed signal, taken by that thread
        other.join()
        time.sleep(0.01)  # the main thread runs the Python handler at its next instruction

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init_like_ray)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("C", (), {"gcs_address": "x"})())
    monkeypatch.setattr(ray, "nodes", lambda: [{}])
    with StopSignals(lambda _: None, decide=lambda: (True, "fits")) as sig:
        pools.ensure_ray(compose(["trainer.device=cpu"]))
        assert sig.requested == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == sig._handle


def test_a_resave_keeps_a_complete_checkpoint_of_the_step_at_every_moment(tmp_path, monkeypatch):
    """Saving a step again (a resumed run) renames the old copy away before the new one moves in; a
    kill between the two renames used to leave no complete copy (with max_checkpoints=1, none at all).
    The replaced copy counts as the step's checkpoint until the new one is in place."""
    root = tmp_path / "ckpt"
    first = fake_checkpoint(root, 1)
    renames, real_rename = [], Path.rename

    def killed_after_the_first_rename(self, target):
        renames.append(Path(target).name)
        if len(renames) == 2:
            raise KeyboardInterrupt  # the driver killed between the two renames
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", killed_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        fake_checkpoint(root, 1, run_id="resumed")
    monkeypatch.setattr(Path, "rename", real_rename)
    assert renames == [f"{ckpt.REPLACED_PREFIX}global_step_1", "global_step_1"] and not first.exists()
    found = ckpt.latest(root)
    assert found is not None and ckpt.step_of(found) == 1 and ckpt.problem(found) is None
    assert ckpt.read_meta(found)["extra"]["run_id"] == "old-run"  # the old copy, whole
    again = fake_checkpoint(root, 1, run_id="resumed")  # the next save of the step puts the new one in place
    assert ckpt.latest(root) == again and sorted(p.name for p in root.iterdir()) == ["global_step_1"]
    assert ckpt.read_meta(again)["extra"]["run_id"] == "resumed"


def test_a_run_directory_given_as_a_checkpoint_points_at_its_latest_one(tmp_path):
    """``digen export <dir>`` or ``trainer.resume_from=<dir>`` with a run's checkpoint directory used to say
    "no meta.json (a checkpoint of an older verl-digen...)"; it now names the checkpoint to pass."""
    root = tmp_path / "ckpt"
    fake_checkpoint(root, 1)
    latest = fake_checkpoint(root, 2)
    assert ckpt.problem(root) == f"it holds checkpoints but is not one: pass one of them, e.g. {latest} (the latest)"
    with pytest.raises(ckpt.CheckpointError, match="global_step_2 \\(the latest\\)"):
        ckpt.read_meta(root)
    assert "older verl-digen" in ckpt.problem(tmp_path)  # an empty directory: the old hint stays


def test_a_dry_run_plans_a_hub_model_this_machine_does_not_hold():
    """A dry run plans a job on any machine (a laptop without the weights); the run itself is refused here."""
    over = ["model.path=nobody-digen/no-such-pipeline", "model.arch=sd3"]
    validate(compose([*over, "trainer.dry_run=true"]))
    with pytest.raises(ConfigError, match="Hugging Face cache"):
        validate(compose(over))


def test_a_steps_trajectory_bytes_count_the_models_own_latent_channels():
    """The trajectories a step holds are priced with the latent channels the model's adapter declares: Wan2.2's
    VAE has 48 (the others 16), the tiny models 4."""
    from verl_digen.config import checks
    from verl_digen.models.spec import TINY_LATENT_CHANNELS

    wan = ["model.arch=wan", "model.path=x/y", "model.latent_size=16", "model.num_frames=9"]
    wan22 = compose([*wan, "model.arch=wan2_2"])
    assert (checks.latent_channels(wan22), checks.latent_channels(compose(wan))) == (48, 16)
    assert checks.latent_channels(compose([])) == TINY_LATENT_CHANNELS
    assert checks.step_bytes(wan22)[1] == 3 * checks.step_bytes(compose(wan))[1]
