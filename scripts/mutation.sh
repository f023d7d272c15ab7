#!/usr/bin/env bash
# Mutation testing of the RL math and the scheduler (docs/testing.md). Not part of CI: tens of minutes
# on 2 cores. Usage: scripts/mutation.sh [algo|schedule|all] (default all). Runs on a copy of the
# working tree under $MUTATION_DIR (default /tmp/verl-digen-mutation), so the checkout stays clean;
# prints the score per package and every surviving mutant (`mutmut show <name>` there shows one).
set -euo pipefail
cd "$(dirname "$0")/.."
scope="${1:-all}"
work="${MUTATION_DIR:-/tmp/verl-digen-mutation}"
python -m pip install -q "mutmut==3.8.1"
case "$scope" in
  algo) sources="verl_digen/algo/" ;;
  schedule) sources="verl_digen/schedule/" ;;
  all) sources=$'verl_digen/algo/\n    verl_digen/schedule/' ;;
  *) echo "usage: $0 [algo|schedule|all]" >&2; exit 2 ;;
esac
rm -rf "$work" && mkdir -p "$work"
git ls-files --cached --others --exclude-standard | grep -E '^(verl_digen|tests|recipes)/|^setup.py$' \
  | tar -cf - -T - | tar -xf - -C "$work"
# The fast tests that exercise these packages (no Ray, no subprocess benchmarks).
cat > "$work/setup.cfg" <<CFG
[mutmut]
source_paths=
    $sources
also_copy=
    verl_digen/
    recipes/
do_not_mutate=
    verl_digen/schedule/export.py
mutate_only_covered_lines=true
pytest_add_cli_args_test_selection=
    tests/test_algo_exact.py
    tests/test_advantages_selection_loss.py
    tests/test_sde.py
    tests/test_rollout.py
    tests/test_tsp.py
    tests/schedule/
CFG
cd "$work"
start=$(date +%s)
mutmut run --max-children "${MUTATION_JOBS:-2}" > mutmut.log 2>&1 || true
echo "mutation run took $(( $(date +%s) - start )) s (log: $work/mutmut.log)"
mutmut results --all true > results.txt 2>/dev/null || mutmut results > results.txt
python - <<'PY'
import collections, re
counts = collections.defaultdict(collections.Counter)
survivors = []
for line in open("results.txt"):
    m = re.match(r"\s*(verl_digen\.(\w+)\.\S+): (.+)", line)
    if m:
        counts[m.group(2)][m.group(3).strip()] += 1
        if m.group(3).strip() == "survived":
            survivors.append(m.group(1))
for pkg, c in sorted(counts.items()):
    total = sum(c.values())
    killed = c["killed"] + c["timeout"]
    print(f"{pkg}: {killed}/{total} killed ({100 * killed / max(total, 1):.1f}%), {dict(c)}")
print(f"{len(survivors)} survivors:")
for s in survivors:
    print("  " + s)
PY
