"""The cost model against published figures, side by side (docs/calibration.md).

Two hardware constants are fit to two verl-omni hardware figures; every other row is a held-out
prediction. Prints one line per figure, then the held-out median |error| and the rows above 30%.

    python bench/calibration.py            # table
    python bench/calibration.py --json     # table, then one JSON list on the last line
Rows: figure, published, model, error (model / published - 1), role (fit | held_out), note.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from verl_digen.schedule import calibration


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = calibration.rows(progress=lambda m: print(f"  simulating {m}", file=sys.stderr))
    print(f"{'figure':<72s} {'published':>9s} {'model':>9s} {'error':>7s}  role")
    for r in rows:
        print(f"{r['figure'][:72]:<72s} {r['published']:9.2f} {r['model']:9.2f} {100 * r['error']:6.1f}%  {r['role']}")
    held = [r for r in rows if r["role"] == calibration.HELD_OUT]
    print(f"held out: {len(held)} of {len(rows)} rows; median |error| "
          f"{100 * statistics.median(abs(r['error']) for r in held):.1f}% (target <= 15%)")
    for r in held:
        if abs(r["error"]) > 0.30:
            print(f"  > 30%: {r['figure']}: {100 * r['error']:+.0f}%" + (f"  ({r['note']})" if r["note"] else ""))
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
