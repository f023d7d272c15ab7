#!/usr/bin/env bash
# HunyuanVideo-13B, DanceGRPO, 32 GPUs: 8 generate (rollout + reward) + 24 train, as `digen plan --recipe hunyuanvideo-13b-32` chooses.
# Usage: recipes/launch/hunyuanvideo-13b-32.sh [colocated] [hydra overrides...]
#   colocated              run hunyuanvideo-13b-32-colocated instead (trainer=colocated, the twin)
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=hunyuanvideo-13b-32
if [[ "${1:-}" == colocated ]]; then recipe=hunyuanvideo-13b-32-colocated; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
