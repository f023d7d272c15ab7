#!/usr/bin/env bash
# The opt-in vLLM tier (docs/testing.md): installs vllm 0.30.x and vllm-omni 0.30.0 (the `[vllm]` extra's pins,
# verl_digen/compat.py) into a venv of its own, then runs the tests marked `vllm` there: the real `Omni` engine
# on CPU with verl-digen's RL pipelines. About 5 GB of downloads, so not in CI.
# Usage: scripts/vllm_tier.sh [install|test|all] [pytest args...]   (default all)
# The venv (VLLM_TIER_VENV, default /tmp/verl-digen-vllm-venv) sees this Python's site-packages, so torch,
# diffusers and verl-digen's own dependencies are the ones already installed (vllm 0.30 pins the same torch).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VLLM_TIER_VENV:-/tmp/verl-digen-vllm-venv}"
what="${1:-all}"
shift || true
extra=$(python -c 'import ast, pathlib
tree = ast.parse(pathlib.Path("verl_digen/compat.py").read_text())
print(" ".join(next(ast.literal_eval(n.value) for n in tree.body
                    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "VLLM_EXTRA")))')
if [ "$what" = install ] || [ "$what" = all ]; then
  [ -x "$venv/bin/python" ] || python -m venv --system-site-packages "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install -q $extra
  # vllm's torchvision / torchaudio wheels are CUDA builds; beside a CPU torch they fail to import
  # ("operator torchvision::nms does not exist"): take the same versions' CPU builds
  if python -c 'import sys, torch; sys.exit(0 if torch.__version__.endswith("+cpu") else 1)'; then
    pins=$("$venv/bin/python" -m pip list --format=freeze 2>/dev/null | grep -E '^(torchvision|torchaudio)==' | tr '\n' ' ')
    # shellcheck disable=SC2086
    [ -z "$pins" ] || "$venv/bin/python" -m pip install -q --no-deps --force-reinstall $pins \
        --index-url https://download.pytorch.org/whl/cpu \
        || echo "CPU torchvision/torchaudio unavailable: use a venv without --system-site-packages (CUDA torch)" >&2
  fi
  "$venv/bin/python" -m pip install -q -e . --no-deps
  "$venv/bin/python" -c 'import torch, vllm, vllm_omni; print("torch", torch.__version__, "vllm", vllm.__version__, "vllm-omni", vllm_omni.__version__)'
fi
if [ "$what" = test ] || [ "$what" = all ]; then
  "$venv/bin/python" -m pytest -q -n 0 -m vllm -p no:cacheprovider tests/workers "$@"
fi
