"""The upstream patches in ``patches/`` apply to verl 0.9.1 and do what their PR descriptions say.

Each test copies the installed verl package into a temporary directory, applies one patch there, and
runs the patched behaviour in a fresh interpreter whose ``PYTHONPATH`` puts the copy first (with
``VERL_USE_EXTERNAL_PLUGINS=none``, so verl-digen's own plugin cannot mask the result). Where it is
cheap, the same check runs against the unpatched package and must fail, proving the test can fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parents[1]
PATCHES = sorted((ROOT / "patches").glob("000*.patch"))
VERL_DIR = Path(verl.__file__).resolve().parent


def _patch(prefix: str) -> Path:
    found = [p for p in PATCHES if p.name.startswith(prefix)]
    assert len(found) == 1, f"expected one patch {prefix}-*.patch in patches/, found {found}"
    return found[0]


def _copy_verl(dest: Path) -> Path:
    """A pristine copy of the installed verl package under ``dest/verl`` (the patch root is ``dest``)."""
    shutil.copytree(VERL_DIR, dest / "verl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _apply(patch: Path, root: Path) -> None:
    """Apply a format-patch file to the copy at ``root`` (git apply, or GNU patch where git is absent)."""
    if shutil.which("git"):
        cmd = ["git", "apply", "-p1", "--whitespace=nowarn", str(patch)]
    else:
        cmd = ["patch", "-p1", "--forward", "-i", str(patch)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, f"{patch.name} does not apply to verl 0.9.1:\n{proc.stdout}{proc.stderr}"


def _run(code: str, pythonpath: list[Path], env: dict[str, str] | None = None, timeout: int = 120) -> dict:
    """Run ``code`` in a fresh interpreter; it must print one JSON object as its last stdout line."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "PYTHONPATH")}
    full_env.update({"VERL_USE_EXTERNAL_PLUGINS": "none", "OMP_NUM_THREADS": "1",
                     "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)})
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=pythonpath[0] if pythonpath else None)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """An unpatched copy, importable in place of the installed verl (shared by the 'must fail' checks)."""
    return _copy_verl(tmp_path_factory.mktemp("verl_pristine"))


def test_patches_are_format_patch_pr_descriptions():
    assert len(PATCHES) >= 3
    for patch in PATCHES:
        text = patch.read_text()
        assert text.startswith("From "), f"{patch.name} is not `git format-patch` output"
        assert re.search(r"^Subject: \[PATCH( \d+/\d+)?\] ", text, re.M), patch.name
        message = text.split("\n---\n", 1)[0]
        for section in ("What does this PR do?", "Changes", "Test", "Backward compatibility"):
            assert f"### {section}" in message, f"{patch.name}: PR description lacks '### {section}'"
        assert "diff --git a/verl/" in text, f"{patch.name} does not modify the verl package"


def test_patches_apply_in_series(tmp_path):
    root = _copy_verl(tmp_path)
    for patch in PATCHES:
        _apply(patch, root)


# ------------------------------------------------------------------------------------- 0001: CPU platform
PLATFORM_CODE = """
import json, os, torch, verl
from verl.utils.device import get_device_name, get_nccl_backend, get_resource_name
from verl.plugin.platform import platform_manager
out = {"file": verl.__file__, "cpu_only_torch": torch.version.cuda is None and torch.version.hip is None,
       "device": get_device_name(), "backend": get_nccl_backend(), "resource": get_resource_name(),
       "registered": list(platform_manager.PlatformRegistry.registered_names())}
if "cpu" in out["registered"]:
    os.environ["VERL_PLATFORM"] = "cpu"
    out["explicit"] = platform_manager._detect_platform_name()
    out["explicit_device"] = platform_manager._create_platform(out["explicit"]).device_name
print(json.dumps(out))
"""


@pytest.mark.slow
def test_0001_cpu_platform(tmp_path, pristine):
    import torch

    if torch.cuda.is_available():
        pytest.skip("an accelerator is visible: the CPU fallback is not what verl should pick here")
    root = _copy_verl(tmp_path)
    _apply(_patch("0001"), root)
    out = _run(PLATFORM_CODE, [root])
    assert out["file"].startswith(str(root)), "the subprocess imported the installed verl, not the patched copy"
    assert "cpu" in out["registered"]
    assert (out["explicit"], out["explicit_device"]) == ("cpu", "cpu")  # VERL_PLATFORM=cpu, any torch build
    if out["cpu_only_torch"]:  # the fallback only changes for CPU-only torch builds
        assert (out["device"], out["backend"], out["resource"]) == ("cpu", "gloo", "CPU")

    before = _run(PLATFORM_CODE, [pristine])
    assert "cpu" not in before["registered"]
    if before["cpu_only_torch"]:
        assert (before["device"], before["backend"]) == ("cuda", "nccl")  # verl 0.9.1's 'nvidia' fallback


# ------------------------------------------------------------------------- 0002: CPU-only resource pools
POOL_CODE = """
import json, ray, verl
from verl.single_controller.ray.base import ResourcePoolManager
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
out = {"file": verl.__file__}
try:
    mgr = ResourcePoolManager(resource_pool_spec={"p": [1]}, mapping={0: "p"}, max_colocate_count=1, use_gpu=False)
    mgr.create_resource_pool()
    out["use_gpu"] = mgr.get_resource_pool(0).use_gpu
    too_big = ResourcePoolManager(resource_pool_spec={"p": [3]}, mapping={0: "p"}, max_colocate_count=1,
                                  use_gpu=False)
    try:
        too_big.create_resource_pool()
    except ValueError as err:
        out["too_big"] = str(err)
    try:  # default pools still need GPUs (backward compatible)
        ResourcePoolManager(resource_pool_spec={"p": [1]}, mapping={0: "p"}).create_resource_pool()
    except ValueError as err:
        out["gpu_default"] = str(err)
finally:
    ray.shutdown()
print(json.dumps(out))
"""

UNPATCHED_POOL_CODE = """
import json
from verl.single_controller.ray.base import ResourcePoolManager
try:
    ResourcePoolManager(resource_pool_spec={"p": [1]}, mapping={0: "p"}, max_colocate_count=1, use_gpu=False)
    print(json.dumps({"error": None}))
except TypeError as err:
    print(json.dumps({"error": str(err)}))
"""


@pytest.mark.slow
def test_0002_cpu_resource_pools(tmp_path, pristine):
    import torch

    root = _copy_verl(tmp_path)
    _apply(_patch("0002"), root)
    out = _run(POOL_CODE, [root], timeout=180)
    assert out["file"].startswith(str(root))
    assert out["use_gpu"] is False
    assert "CPUs 2" in out["too_big"] and "3" in out["too_big"]
    if not torch.cuda.is_available():
        assert "Total available GPUs 0" in out["gpu_default"]

    before = _run(UNPATCHED_POOL_CODE, [pristine])
    assert before["error"] and "use_gpu" in before["error"]  # verl 0.9.1 cannot express a CPU-only pool


# ------------------------------------------------------------------ 0003: trainer modes from entry points
# verl's trainer_base imports its `verl-core` extra (TransferQueue, cachetools, uvicorn, fastapi), which
# verl-digen does not depend on. Where one is missing, an inert stand-in is importable so the registry
# code itself can run; installed packages always win (the finder is consulted last).
TRAINER_CODE = """
import importlib.abc, importlib.machinery, json, sys, types

class _Anything(type):
    def __getattr__(cls, name):
        return _Anything(name, (object,), {})

class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    ROOTS = {"transfer_queue", "cachetools", "uvicorn", "fastapi"}
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name: _Anything(name, (object,), {})
        return module
    def exec_module(self, module):
        pass

sys.meta_path.append(_StandIns())
import verl
from verl.trainer.ppo.v1 import get_trainer_cls
out = {"file": verl.__file__, "sync": get_trainer_cls("sync").__name__}
try:
    cls = get_trainer_cls("external")
    out["external"] = f"{cls.__module__}.{cls.__qualname__}"
except ValueError as err:
    out["external_error"] = str(err)
try:
    get_trainer_cls("no_such_mode")
except ValueError as err:
    out["unknown"] = str(err)
print(json.dumps(out))
"""


def _fake_trainer_distribution(dest: Path) -> Path:
    """A throw-away installed distribution declaring ``[verl.trainers] external = ...``."""
    dest.mkdir()
    (dest / "fake_external_trainer.py").write_text(
        "from verl.trainer.ppo.v1.trainer_base import PPOTrainer\n\n\n"
        "class ExternalTrainer(PPOTrainer):\n    pass\n"
    )
    info = dest / "fake_external_trainer-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-external-trainer\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[verl.trainers]\nexternal = fake_external_trainer:ExternalTrainer\n")
    return dest


@pytest.mark.slow
def test_0003_trainer_entry_points(tmp_path, pristine):
    root = _copy_verl(tmp_path / "verl_root")
    _apply(_patch("0003"), root)
    dist = _fake_trainer_distribution(tmp_path / "dist")
    out = _run(TRAINER_CODE, [root, dist], timeout=180)
    assert out["file"].startswith(str(root))
    assert out["sync"] == "PPOTrainerSync"  # built-in modes unchanged
    assert out["external"] == "fake_external_trainer.ExternalTrainer"
    assert "external" in out["unknown"] and "sync" in out["unknown"]

    before = _run(TRAINER_CODE, [pristine, dist], timeout=180)
    assert "external" not in before and "Unknown trainer 'external'" in before["external_error"]
