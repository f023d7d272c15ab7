#!/usr/bin/env bash
# HunyuanVideo-13B, DanceGRPO: 8 x 48 GB GPUs generate + 8 x 96 GB GPUs train, as `digen plan --recipe hunyuanvideo-13b-hetero` chooses.
# Usage: recipes/launch/hunyuanvideo-13b-hetero.sh [colocated] [hydra overrides...]
#   colocated              run hunyuanvideo-13b-hetero-colocated instead (trainer=colocated, the twin)
#   trainer.dry_run=true   print the resolved config and the resource plan, start nothing
set -euo pipefail
recipe=hunyuanvideo-13b-hetero
if [[ "${1:-}" == colocated ]]; then recipe=hunyuanvideo-13b-hetero-colocated; shift; fi
exec "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$recipe" "$@"
