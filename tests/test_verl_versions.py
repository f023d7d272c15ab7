"""The supported verl range: what setup.py declares, the compat aliases, and pip keeping verl-omni's verl.

The pip check installs verl-omni's pinned verl (the 8a69493 snapshot, reports 0.9.0.dev0) into a virtual
environment that sees the test interpreter's packages, then asks pip what installing verl-digen would change
(``--dry-run --report``): verl must stay. Skipped when the snapshot is absent.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from verl_omni_helpers import SKIP_REASON, tarballs_present

from verl_digen import compat

ROOT = Path(__file__).resolve().parents[1]


def test_tested_range_holds_both_verls_and_nothing_newer():
    spec = Requirement(compat.VERL_REQUIREMENT).specifier
    assert list(spec.filter(["0.9.0.dev0", "0.9.1", "0.9.2", "0.10.0", "0.8.0"], prereleases=True)) == [
        "0.9.0.dev0", "0.9.1"]
    assert compat.is_tested_verl("0.9.0.dev") and compat.is_tested_verl("0.9.1")
    assert not compat.is_tested_verl("0.9.2") and not compat.is_tested_verl("0.8.5")
    assert compat.is_tested_verl()  # the verl installed here


def venv_site_packages(python: str) -> Path:
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _package(tmp: Path, name: str, files: dict[str, str]) -> None:
    pkg = tmp / name
    pkg.mkdir()
    for rel, text in {"__init__.py": "", **files}.items():
        (pkg / rel).write_text(text)


@pytest.fixture
def alias_finder(tmp_path, monkeypatch):
    """A private alias finder over packages in tmp_path (the plugin's own finder stays untouched)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    finders = []

    def install(aliases: dict[str, str]) -> None:
        finder = compat._AliasFinder(aliases)
        sys.meta_path.append(finder)
        finders.append(finder)

    yield install
    for finder in finders:
        sys.meta_path.remove(finder)
    for name in [m for m in sys.modules if m.startswith(("moved_pkg", "kept_pkg"))]:
        del sys.modules[name]


def test_alias_serves_a_moved_module_only_where_it_is_missing(tmp_path, alias_finder):
    _package(tmp_path, "moved_pkg", {"new.py": "WHERE = 'new'\n"})  # like verl 0.9.1: only the new path
    _package(tmp_path, "kept_pkg", {"new.py": "WHERE = 'new'\n", "old.py": "WHERE = 'old'\n"})  # like the pin
    alias_finder({"moved_pkg.old": "moved_pkg.new", "kept_pkg.old": "kept_pkg.new"})
    import kept_pkg.old
    import moved_pkg.old

    assert moved_pkg.old.WHERE == "new" and moved_pkg.old is sys.modules["moved_pkg.new"]
    assert kept_pkg.old.WHERE == "old"  # the real module wins: the finder is last on sys.meta_path
    assert isinstance(sys.modules["moved_pkg.old"], types.ModuleType)


@pytest.mark.slow
def test_plugin_installs_the_chat_template_alias_lazily():
    code = ("import json, sys, verl; from verl_digen import compat; "
            "print(json.dumps({'finder': any(isinstance(f, compat._AliasFinder) for f in sys.meta_path), "
            "'imported': 'verl.utils.tokenizer.chat_template' in sys.modules}))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VERL_USE_EXTERNAL_PLUGINS")}
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "VERL_PLATFORM": "cpu"}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"finder": True, "imported": False}


@pytest.mark.slow
@pytest.mark.skipif(not tarballs_present(), reason=SKIP_REASON)
def test_pip_keeps_verl_omnis_pinned_verl(verl_omni_snapshots, tmp_path):
    """A venv holding verl-omni's verl (seeing this machine's other packages): installing verl-digen changes
    nothing but verl-digen."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # the new venv sees this interpreter's packages (a .pth file), not the base interpreter's: with
    # --system-site-packages a venv made from inside a venv would see the base's, where setuptools may lack
    see_these = venv_site_packages(py) / "test_env.pth"
    see_these.write_text("\n".join(site.getsitepackages() + [sysconfig.get_paths()["purelib"]]) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", py, "--disable-pip-version-check"]
    install = subprocess.run([*pip, "install", "-q", "--no-deps", "--no-build-isolation",
                              str(verl_omni_snapshots.verl_pin)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    version = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('verl'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == "0.9.0.dev0"
    report = tmp_path / "report.json"
    dry = subprocess.run([*pip, "install", "-q", "--dry-run", "--no-build-isolation", "--report", str(report),
                          str(ROOT)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    items = json.loads(report.read_text())["install"]
    planned = {item["metadata"]["name"]: item["metadata"]["version"] for item in items}
    assert "verl" not in planned, f"pip would replace verl-omni's verl 0.9.0.dev0 with {planned.get('verl')}"
    assert planned == {"verl-digen": planned["verl-digen"]}
