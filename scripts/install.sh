#!/usr/bin/env bash
# Installs verl-digen and everything its tests need into the current Python environment.
#
# torch: the CPU build of torch 2.13.0, from PyTorch's CPU wheel index (on Linux the default index
# serves the CUDA build, several GB). Where that index cannot be reached, the default index is used
# instead and the script says so (on Linux x86_64 that is the CUDA build; it runs on CPU too). A torch
# 2.13.0 already installed (any build, e.g. your CUDA one on a GPU cluster) is kept as it is.
# DIGEN_TORCH_INDEX=<url> picks another wheel index (e.g. a CUDA one); DIGEN_TORCH_INDEX=default uses
# the default index.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX=${DIGEN_TORCH_INDEX:-$CPU_INDEX}

python -m pip install -q -U pip            # old pip backtracks for minutes on verl's dependencies

installed=$(python -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [ "${installed%%+*}" = "$TORCH_VERSION" ]; then
    echo "torch $installed already installed: kept"
elif [ "$TORCH_INDEX" = "default" ]; then
    python -m pip install -q "torch==$TORCH_VERSION"
elif python - "$TORCH_INDEX" <<'EOF'
import sys
import urllib.request

try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)
except Exception as err:
    print(f"torch wheel index {sys.argv[1]} unreachable ({type(err).__name__})", file=sys.stderr)
    sys.exit(1)
EOF
then
    # the index also serves torch's own dependencies (filelock, sympy, ...)
    python -m pip install -q "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX" \
        || { echo "install from $TORCH_INDEX failed: using the default index" >&2
             python -m pip install -q "torch==$TORCH_VERSION"; }
else
    echo "using the default index for torch (on Linux x86_64 it serves the CUDA build)" >&2
    python -m pip install -q "torch==$TORCH_VERSION"
fi
python - <<'EOF'
import torch

build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
print(f"torch {torch.__version__} ({build} build)")
EOF

python -m pip install -q -e ".[test,judge]"
# verl-omni's own registry dependencies that verl-digen lacks, for tests/integrations/test_verl_omni_real.py
# (verl-omni itself is not on the registry; the tests use the snapshot in ../shared/third_party)
python -m pip install -q "TransferQueue==0.1.8" cachetools uvicorn fastapi
echo "verl-digen installed: $(python -c 'import verl_digen; print(verl_digen.__version__)')"
