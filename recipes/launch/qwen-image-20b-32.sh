#!/usr/bin/env bash
# Qwen-Image-20B, FlowGRPO, 32 GPUs: trainer=colocated on all of them, as `digen plan --recipe qwen-image-20b-32` chooses.
# Usage: recipes/launch/qwen-image-20b-32.sh [digen] [hydra overrides...]
#   digen                  run qwen-image-20b-32-digen instead (trainer=digen, the best disaggregated split)
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=qwen-image-20b-32
if [[ "${1:-}" == digen ]]; then recipe=qwen-image-20b-32-digen; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
