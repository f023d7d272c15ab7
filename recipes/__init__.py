"""Hydra recipes for the DigenRL paper's settings, installed as ``verl_digen.recipes``.

The top-level ``recipes/`` folder of the repository is the source; the wheel maps it to this package.
``<name>.yaml`` is a setting's default, the layout ``digen plan --recipe <name>`` finds fastest for its
cluster (``trainer=colocated`` or ``trainer=digen``); its variant in the other mode is ``<name>-digen.yaml``
(the best disaggregated split, where colocated wins) or ``<name>-colocated.yaml`` (the colocated twin, where
digen wins). ``setting/<name>.yaml`` holds the workload they share. Launch with
``python -m verl_digen.main --config-dir <RECIPES_DIR> --config-name <name>`` (or ``run.sh <name>``);
``python -m verl_digen.recipes`` lists them.
"""

from __future__ import annotations

from pathlib import Path

#: the directory holding the recipe YAML files (pass it to ``--config-dir``)
RECIPES_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """Every launchable recipe (each setting's default and its variant)."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


#: the suffixes of a setting's variant in the other mode
VARIANTS = ("-colocated", "-digen")


def settings() -> list[str]:
    """Every setting: the recipes that are a setting's default (not a variant)."""
    return [n for n in names() if not n.endswith(VARIANTS)]


def variant(setting: str) -> str:
    """The recipe running ``setting`` in the mode its default does not."""
    found = [setting + v for v in VARIANTS if (RECIPES_DIR / f"{setting}{v}.yaml").is_file()]
    if len(found) != 1:
        raise ValueError(f"setting {setting!r} has {len(found)} variants ({found}); expected one of "
                         f"{[setting + v for v in VARIANTS]}")
    return found[0]


def path(name: str) -> Path:
    """The YAML file of recipe ``name``; ValueError lists the known ones."""
    if name not in names():
        raise ValueError(f"unknown recipe {name!r}; available: {', '.join(names())}")
    return RECIPES_DIR / f"{name}.yaml"


def launch_command(name: str, *overrides: str) -> list[str]:
    """The command line that launches recipe ``name`` (what ``run.sh`` executes)."""
    path(name)
    return ["python", "-m", "verl_digen.main", "--config-dir", str(RECIPES_DIR), "--config-name", name, *overrides]
