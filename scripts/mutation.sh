#!/usr/bin/env bash
# Mutation testing of the RL math, the scheduler, the workers, the vLLM-Omni rollout and the models
# (docs/testing.md). Not part of CI: tens of minutes to hours on 2 cores. Usage:
# scripts/mutation.sh [algo|schedule|workers|omni|models|all] [MUTANT_NAME_OR_GLOB...] (default all; names, e.g.
# 'verl_digen.schedule.costs.*', re-test only those mutants, whatever their verdict). Runs on a copy of the
# working tree under $MUTATION_DIR (default /tmp/verl-digen-mutation), so the checkout stays clean;
# prints the score per package and every surviving mutant (`mutmut show <name>` there shows one).
set -euo pipefail
cd "$(dirname "$0")/.."
scope="${1:-all}"
shift || true
work="${MUTATION_DIR:-/tmp/verl-digen-mutation}"
python -m pip install -q "mutmut==3.8.1"
# the fast tests (no Ray, no subprocess benchmarks) that exercise each package
algo_tests="tests/algo/test_algo_exact.py tests/algo/test_advantages_selection_loss.py tests/algo/test_sde.py
  tests/rollout/test_rollout.py tests/algo/test_tsp.py"
schedule_tests="tests/schedule/"
workers_tests="tests/workers/test_optimizer_step.py tests/workers/test_policy.py tests/workers/test_switch.py
  tests/workers/test_sync_registry.py tests/workers/test_weight_transfer.py tests/config/test_reliability.py
  tests/test_export.py tests/workers/test_sync_relay.py tests/workers/test_vllm_rollout.py tests/workers/test_omni_parts.py
  tests/workers/test_checkpoint_units.py tests/workers/test_trainer_units.py tests/workers/test_generator_units.py
  tests/workers/test_sync_loopback.py tests/workers/test_sync_units.py tests/workers/test_sync_store_units.py"
omni_tests="tests/workers/test_vllm_rollout.py tests/workers/test_omni_parts.py"
models_tests="tests/models/ tests/test_registry.py"
# extra pytest arguments per scope, one per line: the models scope leaves out the slow tests and the two-rank
# Ulysses runs (spawned gloo ranks, which a timed-out mutant's test leaves orphaned and running; the rank
# arithmetic has in-process tests, tests/models/test_ulysses.py)
models_args="-m
not slow
--deselect=tests/models/test_ulysses.py::test_two_ranks_equal_one_rank"
args=""
case "$scope" in
  algo|schedule|workers|models) sources="verl_digen/$scope/"; tests_var="${scope}_tests"; tests="${!tests_var}"
    args_var="${scope}_args"; args="${!args_var:-}" ;;
  omni) sources="verl_digen/rollout/omni/"; tests="$omni_tests" ;;
  all) sources="verl_digen/algo/ verl_digen/schedule/"; tests="$algo_tests $schedule_tests" ;;
  *) echo "usage: $0 [algo|schedule|workers|omni|models|all]" >&2; exit 2 ;;
esac
# one per line, as setup.cfg lists them
sources=$(printf '    %s\n' $sources)
tests=$(printf '    %s\n' $tests)
[ -n "$args" ] && args=$(printf 'pytest_add_cli_args=\n%s\n' "$(printf '%s\n' "$args" | sed 's/^/    /')")
# MUTATION_RESUME=1 keeps $work/mutants: mutmut keeps a verdict while the mutated function's source hash is
# unchanged, so a stopped run continues where it was and an edited function is re-tested.
# Its stats (which tests reach which function) are collected afresh: mutmut otherwise adds only new tests' hits,
# so a function an old test reaches only since the earlier run reads "no tests", and a changed test list would
# reset every verdict (mutmut fingerprints it in the stats).
if [ "${MUTATION_RESUME:-0}" = 1 ] && [ -d "$work/mutants" ]; then
  find "$work" -mindepth 1 -maxdepth 1 ! -name mutants -exec rm -rf {} +
  rm -f "$work/mutants/mutmut-stats.json"
else
  rm -rf "$work" && mkdir -p "$work"
fi
git ls-files --cached --others --exclude-standard | grep -E '^(verl_digen|tests|recipes|docs)/|^setup.py$' \
  | tar -cf - -T - | tar -xf - -C "$work"
# Signal guard, in the copy's tests/conftest.py only. os.kill / os.killpg pass signal 0 (a liveness probe
# delivers nothing) and a signal to a child of the calling process (a test's own subprocess); they refuse
# any other signal to a pid of 0 or below and, while a mutant's tests run (MUTANT_UNDER_TEST names one),
# to any process that is not a child. Without it, a mutant of `checkpoint._alive` that turns its probe's
# signal 0 into a real one, or its pid into -1, signals every process of the user. A refused call raises
# (its test fails: the mutant counts as killed) and is logged to $work/guard.log; mutmut's own kills of
# its children pass.
cat >> "$work/tests/conftest.py" <<PY


# -- added by scripts/mutation.sh (not in the repository) --
class MutationGuardError(RuntimeError):
    """A mutant tried to send a real signal."""


def _mutation_guard_child(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def _mutation_guard(real):
    def guarded(pid, sig, *rest):
        mutant = os.environ.get("MUTANT_UNDER_TEST", "")
        probe = isinstance(sig, int) and sig == 0
        if not isinstance(pid, int) or pid <= 0:
            refused = not probe
        else:
            refused = not probe and "__mutmut_" in mutant and not _mutation_guard_child(pid)
        if refused:
            with open("$work/guard.log", "a") as f:
                f.write(f"{mutant} {real.__name__}({pid!r}, {sig!r})\n")
            raise MutationGuardError(f"{real.__name__}({pid!r}, {sig!r}) refused under {mutant!r}")
        return real(pid, sig, *rest)
    return guarded


os.kill = _mutation_guard(os.kill)
os.killpg = _mutation_guard(os.killpg)


# mutmut passes each mutant's tests fastest first and stops at the first failure (-x): keep that order
# (the suite's hook above moves the files with slow tests first, for xdist), so a mutant dies in its
# fastest failing test instead of after the slow gloo and store tests
_suite_modifyitems = pytest_collection_modifyitems


def pytest_collection_modifyitems(items):
    given = {id(item): i for i, item in enumerate(items)}
    _suite_modifyitems(items)
    items.sort(key=lambda item: given[id(item)])
PY
# The fast tests that exercise these packages (no Ray, no subprocess benchmarks). Not mutated (docs/testing.md):
# export.py (trace file writing); presets.py (the published-figure presets and the arithmetic deriving stage
# times from them, held against published step times by the calibration tests, not by exact values); and the
# constant tables marked `# pragma: no mutate block` (calibration's published figures and testbeds).
cat > "$work/setup.cfg" <<CFG
[mutmut]
source_paths=
$sources
also_copy=
    verl_digen/
    recipes/
    docs/
do_not_mutate=
    verl_digen/schedule/export.py
    verl_digen/schedule/presets.py
mutate_only_covered_lines=true
# a mutant whose tests need over 6x their clean CPU time counts as killed (timeout); mutmut's default of
# 30x lets one mutant that blows up the BTS search hold a core for over 10 minutes
timeout_multiplier=3
pytest_add_cli_args_test_selection=
$tests
$args
CFG
cd "$work"
start=$(date +%s)
mutmut run --max-children "${MUTATION_JOBS:-2}" "$@" > mutmut.log 2>&1 || true
echo "mutation run took $(( $(date +%s) - start )) s (log: $work/mutmut.log)"
mutmut results --all true > results.txt 2>/dev/null || mutmut results > results.txt
# A resumed run keeps the old "survived" verdicts; MUTATION_RERUN_SURVIVORS=1 re-tests them against the
# current tests (mutmut re-runs named mutants even when they have a verdict).
if [ "${MUTATION_RERUN_SURVIVORS:-0}" = 1 ]; then
  mapfile -t names < <(sed -nE 's/^\s*(\S+): survived$/\1/p' results.txt)
  if [ "${#names[@]}" -gt 0 ]; then
    printf '%s\n' "${names[@]}" | xargs -n 200 mutmut run --max-children "${MUTATION_JOBS:-2}" >> mutmut.log 2>&1 || true
    mutmut results --all true > results.txt 2>/dev/null || mutmut results > results.txt
  fi
fi
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
