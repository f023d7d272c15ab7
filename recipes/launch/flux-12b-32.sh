#!/usr/bin/env bash
# FLUX.1-12B, DanceGRPO, 32 GPUs: 16 generate (rollout + reward) + 16 train.
# Usage: recipes/launch/flux-12b-32.sh [colocated] [hydra overrides...]
#   colocated              run the colocated twin (flux-12b-32-colocated) instead
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=flux-12b-32
if [[ "${1:-}" == colocated ]]; then recipe=$recipe-colocated; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
