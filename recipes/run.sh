#!/usr/bin/env bash
# Launch a verl-digen recipe: recipes/run.sh <recipe> [hydra overrides...]
# <recipe> is the name of a YAML file beside this script (without .yaml), e.g. flux-12b-32 or
# flux-12b-32-digen or hunyuanvideo-13b-16-colocated. Add trainer.dry_run=true to print the resolved config and the resource plan
# (pools, micro-batches, predicted step time) without starting Ray. PYTHON picks the interpreter.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ $# -lt 1 ]]; then
  echo "usage: $0 <recipe> [hydra overrides...]; recipes:" >&2
  for f in "$here"/*.yaml; do basename "$f" .yaml; done >&2
  exit 2
fi
recipe="${1%.yaml}"
shift
if [[ ! -f "$here/$recipe.yaml" ]]; then
  echo "no recipe '$recipe' in $here" >&2
  exit 2
fi
exec "${PYTHON:-python}" -m verl_digen.main --config-dir "$here" --config-name "$recipe" "$@"
