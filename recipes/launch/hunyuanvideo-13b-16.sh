#!/usr/bin/env bash
# HunyuanVideo-13B, DanceGRPO, 16 GPUs: 6 generate (rollout + reward) + 10 train, as `digen plan --recipe hunyuanvideo-13b-16` chooses.
# Usage: recipes/launch/hunyuanvideo-13b-16.sh [colocated] [hydra overrides...]
#   colocated              run hunyuanvideo-13b-16-colocated instead (trainer=colocated, the twin)
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=hunyuanvideo-13b-16
if [[ "${1:-}" == colocated ]]; then recipe=hunyuanvideo-13b-16-colocated; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
