"""Learning smoke test per algorithm: the tiny CPU run through ``python -m verl_digen.main`` for every name in
``algo/algorithms.py``'s ``ALGORITHMS`` and several seeds, one subprocess after another.

Each run is the documented command, ``python -m verl_digen.main algorithm.name=<name> trainer.total_steps=N
trainer.seed=S`` (the default tiny ``trainer=digen`` run, nothing else changed; ``mix_grpo`` adds
``rollout.train_steps=2``, a window of 2 of the 6 sampling steps), so its exit code is the entry point's. Per run
it records the exit code, the wall time, the per-step mean reward parsed from the ``step i/N reward=...`` lines
and the first- and last-quarter means (``quarter = max(1, N // 4)`` steps, as the run's summary table takes
them), and whether the last quarter is above the first.

    python bench/algo_curves.py --json                                  # all 7 algorithms x seeds 0 1 2
    python bench/algo_curves.py --algos cps --seeds 0 --curves r.jsonl   # append each run as it ends
    python bench/algo_curves.py --from r.jsonl --json                    # table from recorded runs, no runs

The last line of ``--json`` is one JSON object: ``{"runs": [...], "algorithms": {name: {...}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from verl_digen.algo.algorithms import ALGORITHMS  # noqa: E402  (torch-free)

#: per-algorithm overrides on top of the default run
EXTRA: dict[str, list[str]] = {"mix_grpo": ["rollout.train_steps=2"]}
STEP_LINE = re.compile(r"^step (\d+)/(\d+)\s+reward=(\S+?)\+-")


def quarters(curve: list[float]) -> tuple[float, float]:
    """First- and last-quarter mean reward, the quarters the run's summary table uses."""
    q = max(1, len(curve) // 4)
    return statistics.fmean(curve[:q]), statistics.fmean(curve[-q:])


def parse_curve(stdout: str) -> list[float]:
    """Per-step mean reward from the run's ``step i/N reward=mean+-std`` lines (the last line of each step)."""
    by_step: dict[int, float] = {}
    for line in stdout.splitlines():
        m = STEP_LINE.match(line.strip())
        if m:
            by_step[int(m.group(1))] = float(m.group(3))
    return [by_step[k] for k in sorted(by_step)]


def run_one(name: str, seed: int, steps: int, extra: list[str], timeout_s: float) -> dict:
    """One ``python -m verl_digen.main`` run in a scratch directory (its Hydra outputs and trace stay there)."""
    cmd = [sys.executable, "-m", "verl_digen.main", f"algorithm.name={name}", f"trainer.total_steps={steps}",
           f"trainer.seed={seed}", *EXTRA.get(name, []), *extra]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout_s)
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = None, exc.stdout or "", exc.stderr or ""
            out = out.decode() if isinstance(out, bytes) else out
            err = err.decode() if isinstance(err, bytes) else err
    curve = parse_curve(out)
    row = {"algorithm": name, "seed": seed, "steps": steps, "rc": rc, "run_s": round(time.perf_counter() - t0, 1),
           "command": "python -m verl_digen.main " + " ".join(cmd[3:]), "curve": curve,
           "first_quarter": None, "last_quarter": None, "rises": None}
    if len(curve) == steps:
        first, last = quarters(curve)
        row.update(first_quarter=first, last_quarter=last, rises=last > first)
    if rc != 0:
        row["stderr_tail"] = err[-2000:]
    return row


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per algorithm: seeds run, exits 0, seeds whose reward rose, and the mean rise over the complete runs."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["algorithm"] for r in runs):
        rs = [r for r in runs if r["algorithm"] == name]
        done = [r for r in rs if r["first_quarter"] is not None]
        gains = [r["last_quarter"] - r["first_quarter"] for r in done]
        out[name] = {"seeds": [r["seed"] for r in rs], "exit_0": sum(r["rc"] == 0 for r in rs),
                     "rises": sum(bool(r["rises"]) for r in rs),
                     "mean_gain": statistics.fmean(gains) if gains else None,
                     "min_gain": min(gains) if gains else None}
    return out


def markdown(runs: list[dict]) -> str:
    """The per-run table of docs/benchmarks.md."""
    lines = ["| algorithm | seed | exit | first quarter | last quarter | gain | run s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        f, la = r["first_quarter"], r["last_quarter"]
        cells = ("-", "-", "-") if f is None else (f"{f:+.3f}", f"{la:+.3f}", f"{la - f:+.3f}")
        lines.append(f"| {r['algorithm']} | {r['seed']} | {r['rc']} | {' | '.join(cells)} | {r['run_s']:.0f} |")
    return "\n".join(lines)


def curve_table(runs: list[dict]) -> str:
    """Mean reward per step over each algorithm's complete runs (one column per algorithm)."""
    names = [n for n in dict.fromkeys(r["algorithm"] for r in runs)
             if any(r["algorithm"] == n and r["first_quarter"] is not None for r in runs)]
    curves = {n: [r["curve"] for r in runs if r["algorithm"] == n and r["first_quarter"] is not None] for n in names}
    steps = min((len(c) for cs in curves.values() for c in cs), default=0)
    lines = ["| step | " + " | ".join(names) + " |", "| ---: |" + " ---: |" * len(names)]
    for i in range(steps):
        cells = [f"{statistics.fmean(c[i] for c in curves[n]):+.3f}" for n in names]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", nargs="*", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=10, help="trainer.total_steps")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--curves", default=None, help="append each finished run to this JSON-lines file")
    ap.add_argument("--from", dest="source", default=None, help="read runs from a --curves file; run nothing")
    ap.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every run (key=value)")
    args = ap.parse_args()
    if args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    if args.source:
        with open(args.source) as f:
            runs = [json.loads(line) for line in f if line.strip()]
    else:
        runs = []
        for name in args.algos:
            for seed in args.seeds:
                row = run_one(name, seed, args.steps, args.overrides, args.timeout)
                runs.append(row)
                if args.curves:
                    with open(args.curves, "a") as f:
                        f.write(json.dumps(row) + "\n")
                print(f"  {name:<14} seed {seed} rc {row['rc']} first {row['first_quarter']} last "
                      f"{row['last_quarter']} {row['run_s']:.0f}s", file=sys.stderr, flush=True)
    print(markdown(runs))
    print()
    print(curve_table(runs))
    if args.json:
        print(json.dumps({"runs": runs, "algorithms": summarize(runs)}))


if __name__ == "__main__":
    main()
