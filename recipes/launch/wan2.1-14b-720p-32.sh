#!/usr/bin/env bash
# Wan2.1-14B, FlowGRPO, 1280x720x81 video, 32 GPUs: 4 generate (rollout + reward) + 28 train.
# Usage: recipes/launch/wan2.1-14b-720p-32.sh [colocated] [hydra overrides...]
#   colocated              run the colocated twin (wan2.1-14b-720p-32-colocated) instead
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=wan2.1-14b-720p-32
if [[ "${1:-}" == colocated ]]; then recipe=$recipe-colocated; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
