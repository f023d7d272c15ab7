"""The upstream patches in ``patches/`` apply to verl 0.9.1 and do what their PR descriptions say.

Each test copies the installed verl package into a temporary directory, applies one patch there, and
runs the patched behaviour in a process of its own whose import path puts the copy first (with
``VERL_USE_EXTERNAL_PLUGINS=none``, so verl-digen's own plugin cannot mask the result). Where it is
cheap, the same check runs against the unpatched package and must fail, proving the test can fail.

Those processes are forked from one server process (``FORK_SERVER``) that has imported verl's heavy
dependencies (torch, transformers, Ray...) but never verl: each check still imports verl afresh, from the
copy it checks, in a process no other check has touched, without paying ~3 s of dependency imports each.
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
    """A pristine copy of the installed verl package under ``dest/verl`` (the patch root is ``dest``). Its
    byte code comes along: Python takes a ``.pyc`` only while its source's size and modification time (kept by
    the copy) match, so what a patch rewrites is compiled again and the rest is not."""
    shutil.copytree(VERL_DIR, dest / "verl")
    return dest


def _apply(patch: Path, root: Path) -> None:
    """Apply a format-patch file to the copy at ``root`` (git apply, or GNU patch where git is absent)."""
    if shutil.which("git"):
        cmd = ["git", "apply", "-p1", "--whitespace=nowarn", str(patch)]
    else:
        cmd = ["patch", "-p1", "--forward", "-i", str(patch)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, f"{patch.name} does not apply to verl 0.9.1:\n{proc.stdout}{proc.stderr}"


#: verl's heavy third-party imports, loaded once by the fork server (never verl itself)
PRELOAD = ("torch", "numpy", "scipy", "pandas", "ray", "tensordict", "transformers", "peft", "accelerate", "datasets",
           "omegaconf", "hydra", "pydantic", "huggingface_hub", "fastapi", "transfer_queue")

#: reads one JSON job a line ({"code", "path", "env", "out", "timeout"}), forks, and runs ``code`` in the child as
#: ``python -c`` would (cwd and the first import path entries: ``path``; stdout and stderr to the file ``out``;
#: killed by SIGALRM after ``timeout`` s); answers each job with one JSON line {"rc": exit code}
FORK_SERVER = """
import importlib, json, os, signal, sys, traceback
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
assert not [m for m in sys.modules if m == "verl" or m.startswith("verl.")], "the fork server imported verl"
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            fd = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            signal.alarm(job["timeout"])
            os.environ.update(job["env"])
            os.chdir(job["path"][0])
            sys.path[:0] = job["path"]
            exec(compile(job["code"], "<check>", "exec"), {"__name__": "__main__"})
            rc = 0
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
os._exit(0)  # no interpreter teardown (torch's takes seconds)
"""


class ForkServer:
    """The module's check processes, each forked from one interpreter with verl's dependencies imported."""

    def __init__(self, scratch: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "PYTHONPATH")}
        env.update({"VERL_USE_EXTERNAL_PLUGINS": "none", "OMP_NUM_THREADS": "1"})
        self.scratch, self.jobs = scratch, 0
        self.proc = subprocess.Popen([sys.executable, "-c", FORK_SERVER, *PRELOAD], env=env, cwd=scratch,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        assert ready and json.loads(ready) == {"ready": True}, f"no fork server (exit {self.proc.poll()})"

    def run(self, code: str, pythonpath: list[Path], timeout: int) -> tuple[int, str]:
        """(exit code, stdout + stderr) of ``code`` in a child with ``pythonpath`` first on its import path."""
        self.jobs += 1
        out = self.scratch / f"check{self.jobs}.log"
        paths = [str(p) for p in pythonpath]
        job = {"code": code, "path": paths, "out": str(out), "timeout": timeout,
               "env": {"PYTHONPATH": os.pathsep.join(paths)}}  # for the processes a check starts (Ray's)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the fork server died (exit {self.proc.poll()})"
        return json.loads(answer)["rc"], out.read_text()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def forks(tmp_path_factory) -> ForkServer:
    server = ForkServer(tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


def _run(forks: ForkServer, code: str, pythonpath: list[Path], timeout: int = 120) -> dict:
    """Run ``code`` in a forked child; it must print one JSON object as its last stdout line."""
    rc, out = forks.run(code, pythonpath, timeout)
    assert rc == 0, f"check failed (exit {rc}):\n{out[-6000:]}"
    return json.loads(out.strip().splitlines()[-1])


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
def test_0001_cpu_platform(tmp_path, pristine, forks):
    import torch

    if torch.cuda.is_available():
        pytest.skip("an accelerator is visible: the CPU fallback is not what verl should pick here")
    root = _copy_verl(tmp_path)
    _apply(_patch("0001"), root)
    out = _run(forks, PLATFORM_CODE, [root])
    assert out["file"].startswith(str(root)), "the check imported the installed verl, not the patched copy"
    assert "cpu" in out["registered"]
    assert (out["explicit"], out["explicit_device"]) == ("cpu", "cpu")  # VERL_PLATFORM=cpu, any torch build
    if out["cpu_only_torch"]:  # the fallback only changes for CPU-only torch builds
        assert (out["device"], out["backend"], out["resource"]) == ("cpu", "gloo", "CPU")

    before = _run(forks, PLATFORM_CODE, [pristine])
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
def test_0002_cpu_resource_pools(tmp_path, pristine, forks):
    import torch

    root = _copy_verl(tmp_path)
    _apply(_patch("0002"), root)
    out = _run(forks, POOL_CODE, [root], timeout=180)
    assert out["file"].startswith(str(root))
    assert out["use_gpu"] is False
    assert "CPUs 2" in out["too_big"] and "3" in out["too_big"]
    if not torch.cuda.is_available():
        assert "Total available GPUs 0" in out["gpu_default"]

    before = _run(forks, UNPATCHED_POOL_CODE, [pristine])
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
def test_0003_trainer_entry_points(tmp_path, pristine, forks):
    root = _copy_verl(tmp_path / "verl_root")
    _apply(_patch("0003"), root)
    dist = _fake_trainer_distribution(tmp_path / "dist")
    out = _run(forks, TRAINER_CODE, [root, dist], timeout=180)
    assert out["file"].startswith(str(root))
    assert out["sync"] == "PPOTrainerSync"  # built-in modes unchanged
    assert out["external"] == "fake_external_trainer.ExternalTrainer"
    assert "external" in out["unknown"] and "sync" in out["unknown"]

    before = _run(forks, TRAINER_CODE, [pristine, dist], timeout=180)
    assert "external" not in before and "Unknown trainer 'external'" in before["external_error"]
