#!/usr/bin/env bash
# FLUX.1-12B, DanceGRPO, 32 GPUs: trainer=colocated on all of them, as `digen plan --recipe flux-12b-32` chooses.
# Usage: recipes/launch/flux-12b-32.sh [digen] [hydra overrides...]
#   digen                  run flux-12b-32-digen instead (trainer=digen, the best disaggregated split)
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=flux-12b-32
if [[ "${1:-}" == digen ]]; then recipe=flux-12b-32-digen; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
