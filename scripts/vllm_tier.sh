#!/usr/bin/env bash
# The opt-in vLLM tier (docs/testing.md): installs vllm 0.30.x and vllm-omni 0.30.0 (the `[vllm]` extra's pins,
# verl_digen/compat.py) into a venv of its own, then runs the tests marked `vllm` there: the real `Omni` engine
# on CPU with verl-digen's RL pipelines (tests/workers/test_vllm_engine.py). About 5 GB of downloads, so not in CI.
# Usage: scripts/vllm_tier.sh [install|test|all|wheels] [pytest args...]   (default all)
#   wheels: download the wheel set of the venv (torch, vllm, vllm-omni and their dependencies; ~10 GB) and build
#           verl-digen's into VLLM_TIER_WHEELS (default /tmp/verl-digen-vllm-wheels), for a machine without PyPI
#           (bench/gpu_check.py --vllm on a lent GPU): pip install --no-index --find-links <dir> ... there
#
# The venv (VLLM_TIER_VENV, default /tmp/verl-digen-vllm-venv) is isolated (no --system-site-packages): vllm's
# torchvision / torchaudio / torchcodec wheels on PyPI are CUDA builds that fail to load beside a CPU torch
# ("operator torchvision::nms does not exist"), so the venv takes PyPI's own torch 2.13.0 (the CUDA build; it
# runs on CPU without a GPU) and everything else from the same index. `torch===2.13.0` (exact string match)
# keeps pip from taking a local `2.13.0+cpu` wheel (e.g. from a find-links folder). Re-running is cheap: pip
# skips what is installed; a venv made by an older version of this script (with system site-packages) is
# rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VLLM_TIER_VENV:-/tmp/verl-digen-vllm-venv}"
what="${1:-all}"
shift || true
py="$venv/bin/python"
read_const() {  # a literal constant of verl_digen/compat.py, read without importing the package
  python3 - "$1" <<'EOF'
import ast, pathlib, sys
tree = ast.parse(pathlib.Path("verl_digen/compat.py").read_text())
value = next(ast.literal_eval(n.value) for n in tree.body
             if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == sys.argv[1])
print(" ".join(value) if isinstance(value, (tuple, list)) else value)
EOF
}
if [ "$what" = install ] || [ "$what" = all ]; then
  extra=$(read_const VLLM_EXTRA)
  torch_pin=$(python3 -c 'import ast, pathlib
tree = ast.parse(pathlib.Path("verl_digen/compat.py").read_text())
pins = next(ast.literal_eval(n.value) for n in tree.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "VLLM_EXTRA_PINS")
print(pins["torch"])')
  if [ -f "$venv/pyvenv.cfg" ] && grep -q 'include-system-site-packages = true' "$venv/pyvenv.cfg"; then
    echo "rebuilding $venv without system site-packages" >&2
    rm -rf "$venv"
  fi
  [ -x "$py" ] || python3 -m venv "$venv"
  quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }  # pip's notes on absent local indexes
  "$py" -m pip install -q -U pip 2>&1 | quiet
  # 1. one resolve for torch, vllm, vllm-omni and the test runner
  # shellcheck disable=SC2086
  "$py" -m pip install -q "torch===$torch_pin" $extra pytest pytest-xdist 2>&1 | quiet
  # 2. verl and verl-digen without their dependencies: verl 0.9.x pins transformers<5.11 and vllm-omni 0.30.0
  #    transformers>=5.13,<5.15, so no resolve holds both (the modules this tier imports never import verl)
  "$py" -m pip install -q --no-deps "$(read_const VERL_REQUIREMENT)" -e . 2>&1 | quiet
  echo "(a pip error above that verl requires transformers<5.11 is expected: vllm-omni's transformers wins)"
  # 3. their other dependencies, resolved together with step 1's pins (transformers stays vllm-omni's)
  deps=$("$py" - <<'EOF'
import importlib.metadata as md
import re

out = set()
for dist in ("verl", "verl-digen"):
    for req in md.requires(dist) or []:
        if "extra ==" in req:
            continue
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()
        if name not in {"verl", "transformers", "torch"}:
            out.add(req.split(";")[0].replace(" ", ""))
print(" ".join(sorted(out)))
EOF
)
  # shellcheck disable=SC2086
  "$py" -m pip install -q "torch===$torch_pin" $extra $deps pytest pytest-xdist 2>&1 | quiet
  "$py" - <<'EOF'
import importlib.metadata as md

import torch
import vllm_omni  # noqa: F401  (the import that fails beside a CPU torch)

print("vllm tier venv:", ", ".join(f"{p} {md.version(p)}" for p in
      ("torch", "torchvision", "vllm", "vllm-omni", "diffusers", "transformers", "peft", "verl", "verl-digen")),
      f"(torch CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()})")
EOF
fi
if [ "$what" = wheels ]; then
  out="${VLLM_TIER_WHEELS:-/tmp/verl-digen-vllm-wheels}"
  extra=$(read_const VLLM_EXTRA)
  torch_pin=$(python3 -c 'import ast, pathlib
tree = ast.parse(pathlib.Path("verl_digen/compat.py").read_text())
pins = next(ast.literal_eval(n.value) for n in tree.body
            if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "VLLM_EXTRA_PINS")
print(pins["torch"])')
  mkdir -p "$out"
  # shellcheck disable=SC2086
  python3 -m pip download -q -d "$out" "torch===$torch_pin" $extra
  python3 -m pip wheel -q --no-deps -w "$out" . "$(read_const VERL_REQUIREMENT)"
  du -sh "$out"
fi
if [ "$what" = test ] || [ "$what" = all ]; then
  [ -x "$py" ] || { echo "no venv at $venv: run scripts/vllm_tier.sh install" >&2; exit 1; }
  "$py" -m pytest -q -n 0 -m vllm -p no:cacheprovider tests/workers/test_vllm_engine.py "$@"
fi
