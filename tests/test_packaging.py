"""``python -m build --wheel`` makes a wheel that carries the Hydra configs, the recipes, the license
and both entry points. Built offline from a copy of the source tree (``--no-isolation``: nothing is
installed, and the checkout gets no build/ folder); only the wheel's contents are checked."""

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import verl_digen
from verl_digen import recipes

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", "outputs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                              ".ruff_cache", "runs", "*.png")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    pytest.importorskip("build")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=SKIP)
    out = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist")],
                         cwd=src, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (path,) = (tmp / "dist").glob("*.whl")
    assert path.name == f"verl_digen-{verl_digen.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(path) as zf:
        yield zf


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    return wheel.read(f"verl_digen-{verl_digen.__version__}.dist-info/{name}").decode()


def test_wheel_carries_the_hydra_configs(wheel):
    names = set(wheel.namelist())
    source = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "verl_digen" / "config").rglob("*.yaml"))
    assert {"verl_digen/config/digen.yaml", "verl_digen/config/trainer/digen.yaml",
            "verl_digen/config/trainer/colocated.yaml", "verl_digen/config/trainer/separate.yaml"} <= set(source)
    missing = set(source) - names
    assert not missing, f"configs missing from the wheel: {sorted(missing)}"
    assert "verl_digen/__init__.py" in names and "verl_digen/main.py" in names


def test_wheel_carries_the_recipes_as_a_package(wheel):
    names = set(wheel.namelist())
    top = recipes.RECIPES_DIR
    source = sorted(p.relative_to(top).as_posix() for p in top.rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts)
    assert {"__init__.py", "run.sh", "README.md", "flux-12b-32.yaml", "setting/flux-12b-32.yaml",
            "launch/flux-12b-32.sh"} <= set(source)
    missing = {f"verl_digen/recipes/{p}" for p in source} - names
    assert not missing, f"recipe files missing from the wheel: {sorted(missing)}"
    for name in recipes.names():
        assert f"verl_digen/recipes/{name}.yaml" in names
    assert not any(n.startswith(("recipes/", "tests/", "bench/")) for n in names)  # nothing at top level


def test_wheel_metadata_license_and_entry_points(wheel):
    names = set(wheel.namelist())
    assert f"verl_digen-{verl_digen.__version__}.dist-info/licenses/LICENSE" in names
    meta = Parser().parsestr(_dist_info(wheel, "METADATA"))
    assert meta["Name"] == "verl-digen" and meta["Version"] == verl_digen.__version__
    assert meta["Requires-Python"] == ">=3.10"
    requires = meta.get_all("Requires-Dist")
    from packaging.requirements import Requirement

    from verl_digen.compat import VERL_REQUIREMENT

    verl_req = [Requirement(r) for r in requires if Requirement(r).name == "verl"]
    assert [str(r.specifier) for r in verl_req] == [str(Requirement(VERL_REQUIREMENT).specifier)]
    assert {"0.9.0.dev0", "0.9.1"} <= set(verl_req[0].specifier.filter(["0.9.0.dev0", "0.9.1", "0.9.2"],
                                                                        prereleases=True))
    assert any(r.startswith("build") and 'extra == "test"' in r for r in requires)
    # the vllm extra: pinned, and what those pins require still satisfies verl-digen's own requirements
    from verl_digen.compat import VLLM_EXTRA, VLLM_EXTRA_PINS

    vllm = sorted(str(Requirement(r).name) + str(Requirement(r).specifier) for r in requires if 'extra == "vllm"' in r)
    assert vllm == sorted(str(Requirement(r)) for r in VLLM_EXTRA)
    ours = {Requirement(r).name: Requirement(r).specifier for r in requires if "extra ==" not in r}
    for name in ("torch", "diffusers"):
        assert VLLM_EXTRA_PINS[name] in ours[name], f"vllm's {name}=={VLLM_EXTRA_PINS[name]} leaves {ours[name]}"
    entry = _dist_info(wheel, "entry_points.txt")
    assert "[console_scripts]\ndigen = verl_digen.cli:main" in entry
    assert "[verl.plugins]\ndigen = verl_digen.plugin" in entry


def test_editable_install_maps_the_recipes_package():
    """In this checkout (editable install) ``verl_digen.recipes`` is the top-level recipes/ folder."""
    if Path(verl_digen.__file__).resolve().parent != ROOT / "verl_digen":
        pytest.skip("verl_digen is not imported from this checkout")
    assert recipes.RECIPES_DIR == ROOT / "recipes"
    assert "flux-12b-32" in recipes.names()
    out = subprocess.run([sys.executable, "-m", "verl_digen.recipes"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "hunyuanvideo-13b-hetero" in out.stdout and "--config-dir" in out.stdout


@pytest.mark.slow
def test_installed_console_script_runs_the_cli():
    """The ``digen`` command a user types (the docs test calls the CLI's entry point in-process)."""
    digen = Path(sys.executable).parent / "digen"
    if not digen.exists():
        pytest.skip(f"no digen console script next to {sys.executable} (verl-digen not installed here)")
    out = subprocess.run([str(digen), "simulate", "--preset", "wan2.1-14b-16", "--only", "digen"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "configuration" in out.stdout and "\ndigen " in out.stdout
    bad = subprocess.run([str(digen), "simulate", "--preset", "no-such-preset"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "no-such-preset" in bad.stderr
