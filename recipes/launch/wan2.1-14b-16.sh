#!/usr/bin/env bash
# Wan2.1-14B, FlowGRPO, 16 GPUs: 8 generate (rollout + reward) + 8 train.
# Usage: recipes/launch/wan2.1-14b-16.sh [colocated] [hydra overrides...]
#   colocated              run the colocated twin (wan2.1-14b-16-colocated) instead
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=wan2.1-14b-16
if [[ "${1:-}" == colocated ]]; then recipe=$recipe-colocated; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
