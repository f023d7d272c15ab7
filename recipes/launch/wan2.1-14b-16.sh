#!/usr/bin/env bash
# Wan2.1-14B, FlowGRPO, 16 GPUs: trainer=colocated on all of them, as `digen plan --recipe wan2.1-14b-16` chooses.
# Usage: recipes/launch/wan2.1-14b-16.sh [digen] [hydra overrides...]
#   digen                  run wan2.1-14b-16-digen instead (trainer=digen, the best disaggregated split)
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=wan2.1-14b-16
if [[ "${1:-}" == digen ]]; then recipe=wan2.1-14b-16-digen; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
