"""Hydra recipes for the DigenRL paper's settings, installed as ``verl_digen.recipes``.

The top-level ``recipes/`` folder of the repository is the source; the wheel maps it to this package.
``<name>.yaml`` runs ``trainer=digen``, ``<name>-colocated.yaml`` is its colocated twin, and
``setting/<name>.yaml`` holds the workload both share. Launch with
``python -m verl_digen.main --config-dir <RECIPES_DIR> --config-name <name>`` (or ``run.sh <name>``);
``python -m verl_digen.recipes`` lists them.
"""

from __future__ import annotations

from pathlib import Path

#: the directory holding the recipe YAML files (pass it to ``--config-dir``)
RECIPES_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """Every launchable recipe (digen recipes and their colocated twins)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def path(name: str) -> Path:
    """The YAML file of recipe ``name``; ValueError lists the known ones."""
    if name not in names():
        raise ValueError(f"unknown recipe {name!r}; available: {', '.join(names())}")
    return RECIPES_DIR / f"{name}.yaml"


def launch_command(name: str, *overrides: str) -> list[str]:
    """The command line that launches recipe ``name`` (what ``run.sh`` executes)."""
    path(name)
    return ["python", "-m", "verl_digen.main", "--config-dir", str(RECIPES_DIR), "--config-name", name, *overrides]
