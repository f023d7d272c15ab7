"""Reading a config costs no torch: ``import verl_digen.config`` loads neither torch nor diffusers (each takes
seconds of CPU), and a dry run imports neither the driver nor verl (what only a run needs). Each check runs
in a fresh interpreter: this test process has imported everything already."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _loaded(code: str, tmp_path: Path, heavy: tuple[str, ...]) -> list[str]:
    """The packages of ``heavy`` in ``sys.modules`` after ``code`` ran in a new interpreter on this checkout."""
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "PYTHONPATH": str(ROOT)}
    probe = f"{code}\nimport sys\nprint([m for m in {heavy!r} if m in sys.modules])\n"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 (our own print of a list of names)


def test_importing_the_config_loads_neither_torch_nor_diffusers(tmp_path):
    """Nor does sizing a tiny run's step from its config (the batch check that refuses a huge batch before
    anything is built: the tiny latent's channels are a torch-free fact)."""
    code = ("import verl_digen.config\nfrom verl_digen.config import RunConfig, checks\n"
            "assert RunConfig().model.path is None and checks.step_bytes(RunConfig())[1] > 0")
    assert _loaded(code, tmp_path, ("torch", "diffusers", "ray", "verl")) == []


def test_no_module_of_the_config_or_the_reports_imports_torch(tmp_path):
    every = ("import importlib, pkgutil, verl_digen.config, verl_digen.reporting\n"
             "for pkg in (verl_digen.config, verl_digen.reporting):\n"
             "    for m in pkgutil.iter_modules(pkg.__path__):\n"
             "        importlib.import_module(f'{pkg.__name__}.{m.name}')")
    assert _loaded(every, tmp_path, ("torch", "diffusers")) == []


@pytest.mark.slow
def test_a_dry_run_imports_neither_the_driver_nor_verl(tmp_path):
    code = ("import sys\nfrom verl_digen import main\n"
            "sys.argv = ['main', 'trainer.dry_run=true', 'trainer.trace_dir=null']\nmain.main()")
    assert _loaded(code, tmp_path, ("verl", "verl_digen.driver.runtime")) == []


def test_a_recipe_dry_run_imports_neither_torch_nor_ray_nor_a_model_adapter(tmp_path):
    """A pretrained model's dry run (load, validate, the memory plan, the resource plan) reads each
    architecture's facts (``verl_digen/archs.py``), the rewards' and sync backends' names
    (``rewards/names.py``, ``workers/sync_spec.py``) and the trained steps (``algo/sampling.py``), never
    torch (~0.8 s of CPU), diffusers (~1.5 s), ray (~0.3 s) or a model adapter: each recipe, in one interpreter."""
    code = "import sys\nfrom verl_digen import main\n"
    for recipe in ("wan2.1-14b-32", "flux-12b-32", "hunyuanvideo-13b-16"):
        code += (f"sys.argv = ['main', '--config-dir', {str(ROOT / 'recipes')!r}, '--config-name', {recipe!r}, "
                 "'trainer.dry_run=true']\nmain.main()\n")
    heavy = ("torch", "diffusers", "ray", "verl_digen.models.adapter", "verl", "verl_digen.driver.runtime")
    assert _loaded(code, tmp_path, heavy) == []
