#!/usr/bin/env bash
# Installs verl-digen and everything its tests need into the current Python environment.
# torch is installed first as the CPU build (2.13.0); on a GPU cluster install your CUDA torch first
# and run `pip install -e .` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -U pip            # old pip backtracks for minutes on verl's dependencies
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"
# verl-omni's own registry dependencies that verl-digen lacks, for tests/test_verl_omni_real.py (verl-omni
# itself is not on the registry; the tests use the snapshot in ../shared/third_party)
python -m pip install -q "TransferQueue==0.1.8" cachetools uvicorn fastapi
echo "verl-digen installed: $(python -c 'import verl_digen; print(verl_digen.__version__)')"
