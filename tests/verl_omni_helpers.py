"""Helpers for the tests against the real verl-omni: snapshot location, GPU import stubs, example scripts.

The snapshots (``verl-omni-a1139ba.tar.gz`` and the verl it pins, ``verl-8a69493.tar.gz``) live outside
the repository, in ``../shared/third_party`` next to the checkout, or wherever ``VERL_DIGEN_THIRD_PARTY``
points. Tests that need them skip with that reason when they are absent (a fresh clone).

vllm and vllm_omni are GPU stacks: verl-omni imports them unconditionally, so the subprocesses get import
stubs (written here) first on ``PYTHONPATH``. Every submodule of a stubbed package imports and every
attribute is a placeholder class; ``importlib.metadata`` reports the versions verl-omni pins, because
verl checks vllm's version on import.

``python tests/verl_omni_helpers.py`` prints the example-script table of docs/migrating-from-verl-omni.md.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
THIRD_PARTY = Path(os.environ.get("VERL_DIGEN_THIRD_PARTY", ROOT.parent / "shared" / "third_party"))
VERL_OMNI_TARBALL = "verl-omni-a1139ba.tar.gz"
VERL_PIN_TARBALL = "verl-8a69493.tar.gz"
SKIP_REASON = (f"the verl-omni / pinned-verl snapshots are not at {THIRD_PARTY} (set VERL_DIGEN_THIRD_PARTY to "
               "the folder holding verl-omni-a1139ba.tar.gz and verl-8a69493.tar.gz)")
STUBBED = {"vllm": "0.27.0", "vllm_omni": "0.27.0rc1"}  # the versions verl-omni 0.2.0rc1 pins

STUB_MODULE = '''"""Import stubs for GPU-only packages (written by tests/verl_omni_helpers.py)."""
import importlib.abc
import importlib.machinery
import sys


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _new(name)

    def __getitem__(cls, item):
        return cls


class _Stub(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator
        return _Stub()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _new(name)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


def _new(name):
    return _Meta(name, (_Stub,), {})


def _attribute(namespace, name):
    if name.startswith("__"):
        raise AttributeError(name)
    value = namespace[name] = _new(name)
    return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    roots = set()

    def find_spec(self, fullname, path, target=None):
        if "." in fullname and fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = lambda name, d=module.__dict__: _attribute(d, name)


def stub_package(name, namespace):
    _Finder.roots.add(name)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    namespace["__getattr__"] = lambda attr: _attribute(namespace, attr)
'''


@dataclass
class Snapshots:
    """Extracted snapshots: verl-omni's source root, the pinned verl's source root, the stub folder."""

    omni: Path
    verl_pin: Path
    stubs: Path

    def env(self, pinned_verl: bool, platform: bool = True, **extra: str) -> dict[str, str]:
        """Environment for a subprocess that runs verl-omni: stubs, then (optionally) the pinned verl first
        on the path, then verl-omni, then this checkout; the verl CPU platform (``platform=False``: none,
        as a verl-omni user's shell has), one thread."""
        path = [str(self.stubs), *([str(self.verl_pin)] if pinned_verl else []), str(self.omni), str(ROOT)]
        drop = ("PYTHONPATH", "VERL_USE_EXTERNAL_PLUGINS", *(() if platform else ("VERL_PLATFORM",)))
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                   HYDRA_FULL_ERROR="1", **({"VERL_PLATFORM": "cpu"} if platform else {}), **extra)
        return env


#: verl-omni's registry dependencies that verl-digen lacks (scripts/install.sh installs them)
OMNI_DEPS = ("transfer_queue", "cachetools", "uvicorn", "fastapi")
DEPS_REASON = "verl-omni's dependencies are missing: pip install TransferQueue==0.1.8 cachetools uvicorn fastapi"


def tarballs_present() -> bool:
    return (THIRD_PARTY / VERL_OMNI_TARBALL).is_file() and (THIRD_PARTY / VERL_PIN_TARBALL).is_file()


def omni_deps_present() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in OMNI_DEPS)


def _extract(tarball: Path, dest: Path) -> Path:
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    (top,) = [p for p in dest.iterdir() if p.is_dir()]
    return top


def snapshot_file(relative: str, dest: Path) -> Path:
    """One file of the verl-omni snapshot (``verl_omni/...``), extracted alone to ``dest`` (its name kept)."""
    with tarfile.open(THIRD_PARTY / VERL_OMNI_TARBALL) as tar:
        data = tar.extractfile(f"verl-omni/{relative}").read()
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / Path(relative).name
    out.write_bytes(data)
    return out


def write_stubs(dest: Path) -> Path:
    """The vllm / vllm_omni import stubs, with dist-info so ``importlib.metadata`` finds their versions."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "_digen_gpu_stub.py").write_text(STUB_MODULE)
    for name, version in STUBBED.items():
        (dest / name).mkdir(exist_ok=True)
        (dest / name / "__init__.py").write_text(
            "import _digen_gpu_stub\n\n_digen_gpu_stub.stub_package(__name__, globals())\n")
        info = dest / f"{name}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    return dest


def extract_snapshots(dest: Path) -> Snapshots:
    """Extract both snapshots under ``dest`` and write the stubs next to them."""
    omni = _extract(THIRD_PARTY / VERL_OMNI_TARBALL, dest / "omni")
    verl_pin = _extract(THIRD_PARTY / VERL_PIN_TARBALL, dest / "verl")
    return Snapshots(omni=omni, verl_pin=verl_pin, stubs=write_stubs(dest / "stubs"))


DIFFUSION_ALGOS = "verl_omni/trainer/diffusion/diffusion_algos.py"


def load_diffusion_algos(dest: Path) -> Any:
    """verl-omni's ``diffusion_algos.py`` (its loss functions), extracted alone under ``dest`` and imported
    unmodified. Only its type-hint import ``verl_omni.workers.config`` is stubbed (and removed again), so the
    package's GPU-stack ``__init__`` never runs; it imports verl, torch and tensordict as installed."""
    import importlib.util
    import types

    with tarfile.open(THIRD_PARTY / VERL_OMNI_TARBALL) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/" + DIFFUSION_ALGOS))
        tar.extractall(dest, members=[member], filter="data")
    stub = types.ModuleType("verl_omni.workers.config")
    stub.DiffusionActorConfig = object  # only a type hint there
    names = ("verl_omni", "verl_omni.workers", "verl_omni.workers.config")
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update({names[0]: types.ModuleType(names[0]), names[1]: types.ModuleType(names[1]), names[2]: stub})
    try:
        spec = importlib.util.spec_from_file_location("verl_omni_diffusion_algos", dest / member.name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return module


# ------------------------------------------------------------------------------------- example scripts
FAKE_COMMANDS = ("python3", "python", "torchrun", "nvidia-smi", "ray", "huggingface-cli", "hf", "pip", "wget", "mkdir")
#: tools of other machines: absent (exit 127, as bash says for a missing command), so a script that probes the
#: device takes its GPU branch, the one a verl-omni user on a CUDA cluster runs
ABSENT_COMMANDS = ("npu-smi",)


def capture_commands(script: Path, repo: Path, scratch: Path) -> list[list[str]]:
    """The argument lists of every ``python3`` / ``python`` call an example script makes, without running them.

    The script runs in bash from verl-omni's repository root (where its README runs it) with those commands
    replaced by shell functions that record their arguments, on a model of a CUDA machine (``nvidia-smi``
    succeeds, ``npu-smi`` is absent, so device probes take the GPU branch); ``HOME``, ``WORKSPACE`` and the paths a few
    scripts require point into ``scratch``.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    record = scratch / "calls"
    record.unlink(missing_ok=True)
    model = scratch / "model"
    for sub in ("FL2VA", "transformer"):
        (model / sub).mkdir(parents=True, exist_ok=True)
    prelude = [f'python3() {{ {{ printf "%s\\0" "$@"; printf "\\036"; }} >> {shlex.quote(str(record))}; }}',
               'python() { python3 "$@"; }']
    prelude += [f"{name}() {{ :; }}" for name in FAKE_COMMANDS if name not in ("python3", "python")]
    prelude += [f"{name}() {{ return 127; }}" for name in ABSENT_COMMANDS]
    prelude.append("export -f " + " ".join(FAKE_COMMANDS + ABSENT_COMMANDS))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch), "WORKSPACE": str(scratch),
           "MODEL_PATH": str(model), "TEACHER_PATH": str(model), "DATA_DIR": str(scratch)}
    subprocess.run(["bash", "-c", "\n".join(prelude) + f"\nbash {shlex.quote(str(script))} </dev/null"],
                   cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    if not record.exists():
        return []
    calls = [c for c in record.read_bytes().split(b"\x1e") if c]
    return [[a.decode() for a in call.split(b"\0")[:-1]] for call in calls]


@dataclass
class ExampleRow:
    """One example script: which entry it uses and what verl-digen makes of it."""

    script: str
    entry: str
    converts: str = ""
    validates: str = ""
    differs: list[str] = field(default_factory=list)


ENTRY_V1 = "verl_omni.trainer.main_diffusion_v1"
ENTRY_V0 = "verl_omni.trainer.main_diffusion"


def training_call(calls: list[list[str]]) -> tuple[str, list[str]] | None:
    """(module, overrides) of the script's training call (``python3 -m <module> ...``), if any."""
    for args in calls:
        if len(args) >= 2 and args[0] == "-m":
            return args[1], args[2:]
    return None


def compose_verl_omni(omni: Path, overrides: list[str]) -> Any:
    """verl-omni's diffusion config with a script's overrides, composed by Hydra as its entry would."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from verl_digen.integrations.verl_omni import register_search_path

    register_search_path()
    name = "diffusion_trainer"
    rest = []
    for arg in overrides:
        if arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
        elif not arg.startswith("--"):
            rest.append(arg)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(omni / "verl_omni" / "trainer" / "config"), version_base=None):
        return compose(name, overrides=rest)


#: what the migration guide tells a user to add to a converted v1 recipe (plus a tiny prompt file)
def guide_additions(prompts: Path) -> list[str]:
    return ["trainer.use_v1=true", "trainer.v1.trainer_mode=digen", "+trainer=digen",
            "+resources.generator.workers=1", "+resources.trainer.workers=1", "algorithm.global_std=False",
            f"data.train_files={prompts}", "+reward.name=ocr"]


def classify_example(script: Path, omni: Path, scratch: Path) -> ExampleRow:
    """Capture, compose, convert and validate one example script (in this process; no verl-omni import)."""
    from unittest import mock

    from omegaconf import OmegaConf

    from verl_digen.config import ConfigError, checks
    from verl_digen.integrations import verl_omni as vo

    rel = script.relative_to(omni / "examples").as_posix()
    if rel in NOT_CAPTURED:
        entry, why = NOT_CAPTURED[rel]
        return ExampleRow(rel, entry, "—", "—", [why])
    call = training_call(capture_commands(script, omni, scratch / script.stem))
    if call is None:
        return ExampleRow(rel, "none", "—", "—", ["not a training script"])
    module, overrides = call
    entry = {ENTRY_V1: "v1", ENTRY_V0: "v0"}.get(module, module)
    row = ExampleRow(rel, entry)
    if module not in (ENTRY_V0, ENTRY_V1):
        row.converts = row.validates = "no"
        row.differs.append(f"`{module}` trains omni-modality LLMs, not a diffusion model")
        return row
    prompts = scratch / "prompts.jsonl"
    prompts.write_text('{"prompt": "a red cube"}\n')
    # the user's switch to the v1 entry; the data overrides replace the script's parquet files (which a user
    # has, and this machine does not)
    replaced = ("data.train_files=", "data.val_files=", "trainer.use_v1=", "trainer.v1.trainer_mode=")
    kept = [a for a in overrides if not a.startswith(replaced)]
    if any(a.startswith("data.val_files=") for a in overrides):
        kept.append(f"data.val_files={prompts}")
    try:
        config = compose_verl_omni(omni, kept + guide_additions(prompts))
    except Exception as err:  # noqa: BLE001 (a script Hydra cannot compose is reported, not raised)
        row.converts = row.validates = "no"
        row.differs.append(f"does not compose: {type(err).__name__}")
        return row
    raw = OmegaConf.to_container(config, resolve=True)
    notes: list[str] = []
    try:
        vo.from_verl_omni_config(raw, notes=notes)
        row.converts = "yes"
    except ConfigError as err:
        row.converts = row.validates = f"refused: `{err.key}`"
        return row
    logged: list[str] = []
    try:  # as on the machine the script is for: its hub model ids are in that machine's Hugging Face cache
        with mock.patch.object(checks, "hub_cached", lambda repo_id: True):
            vo.to_run_config(raw, log=logged.append)
        row.validates = "yes"
    except ConfigError as err:
        row.validates = f"refused: `{err.key}`"
    for line in logged:
        if "is not converted" in line or "at their defaults" in line:
            continue
        key = line.split(": ", 1)[1].split(":")[0].split("=")[0].replace("actor_rollout_ref.", "ARR.")
        if key not in row.differs:
            row.differs.append(key)
    return row


#: scripts that stop before their training call without their real environment: (entry, why)
NOT_CAPTURED = {
    "flowgrpo_trainer/qwen_image/run_qwen_image_ocr_fsdp2_benchmark_nsys.sh": (
        "v0", "runs run_qwen_image_ocr_fsdp2_benchmark.sh under Nsight Systems (needs `nsys`); see that row"),
    "dpo_trainer/qwen3_omni/qwen3_omni/run_qwen3_omni_omni_preference_lora.sh": (
        "verl_omni.trainer.main_omni", "omni-modality LLM DPO (`main_omni`), not a diffusion model"),
}


def example_scripts(omni: Path) -> list[Path]:
    return sorted((omni / "examples").rglob("*.sh"))


#: the examples the tests run for real (tests/integrations/test_verl_omni_real.py) -> the table's "runs tiny" cell
RUN_TINY = {
    "flowgrpo_trainer/sd35/run_sd35_medium_ocr_lora_v1.sh": "yes (2 steps, verl 0.9.1; pinned verl: its "
                                                            "separate_async twin)",
    "diffusionnft_trainer/qwen_image/run_qwen_image_ocr_lora.sh": "yes (2 steps, pinned verl; switched to v1; "
                                                                  "DiffusionNFT)",
    "dancegrpo_trainer/wan22/run_wan22_5b_t2v_hpsv3_auto.sh": "yes (2 steps, pinned verl; switched to v1, "
                                                               "trainer.device=cpu)",
    "flowgrpo_trainer/sd35/run_sd35_medium_ocr_lora_v1_separate_async.sh": "yes (2 steps, pinned verl)",
}


#: scripts run tiny only with their own reward (tests/integrations/test_verl_omni_real.py, OWN_REWARD)
RUN_TINY_OWN_REWARD = {
    "flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh": (
        "yes (2 steps, pinned verl; switched to v1; with its own compute_score_ocr and a stub judge, tensor "
        "parallel 1; step 1 equal to trainer=colocated)"),
    "flowgrpo_trainer/qwen_image/run_qwen_image_ocr_multi_reward.sh": (
        "yes (2 steps, pinned verl; switched to v1; with its own reward: compute_score_ocr and a stub judge, "
        "tensor parallel 1, and its JPEG function)"),
}


def table_row(r: ExampleRow) -> str:
    """One row of the example table in docs/migrating-from-verl-omni.md."""
    runs = RUN_TINY.get(r.script) or RUN_TINY_OWN_REWARD.get(r.script) or ("—" if r.validates != "yes" else "not run")
    differs = list(r.differs)
    if r.entry == "v0":
        differs.insert(0, "v0 entry: refused until switched to `main_diffusion_v1 trainer.use_v1=true`")
    shown = "; ".join(f"`{d}`" if d.startswith(("ARR.", "algorithm.", "trainer.", "data.", "reward.")) else d
                      for d in differs)
    return f"| `{r.script}` | {r.entry} | {r.converts} | {r.validates} | {runs} | {shown} |"


if __name__ == "__main__":  # print the table rows for docs/migrating-from-verl-omni.md
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        snaps = extract_snapshots(Path(tmp))
        for path in example_scripts(snaps.omni):
            print(table_row(classify_example(path, snaps.omni, Path(tmp) / "scratch")), file=sys.stdout)
