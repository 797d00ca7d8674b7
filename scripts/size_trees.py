"""Measure this machine's cost curve and floor once (cached in runs/cost_curve.json) and print the `auto` tree
every method gets here (core.trees.choice.choose_tree), so that neither the app's first request nor a
benchmark has to measure.

    python scripts/size_trees.py [--dtype bfloat16] [--threads 2] [--refresh]

--refresh re-times even when a cached curve exists (do it on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.methods import shipped_names  # noqa: E402  (after the path insert)

METHODS = tuple(shipped_names(trained=True))  # every shipped drafter (moa-tliN as found under assets/drafters)


def main(argv: list[str] | None = None) -> int:
    from core import cli_checks as checks
    from core.target import add_dtype_argument

    p = argparse.ArgumentParser(prog="scripts/size_trees.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dtype_argument(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--refresh", action="store_true", help="time again even if this machine has a cached curve")
    args = p.parse_args(argv)
    try:
        checks.check_device_and_threads(args.device, args.threads)
    except ValueError as err:
        return checks.report(err)

    from core.drafters.static_tree import auto_tree_choice
    from core.trees import cost_curve

    target = checks.target_for_script(args.dtype, args.device, args.threads)
    curve = cost_curve.measure_cost_curve(target, refresh=args.refresh)
    floor = cost_curve.matmul_floor_ms(target, refresh=args.refresh)
    print(f"curve ({curve['key']}):")
    print("  " + "  ".join(f"{s}: {m:.1f} ms" for s, m in zip(curve["sizes"], curve["ms"])))
    print(f"bare-matmul floor: {floor:.2f} ms; 1-token pass = {curve['ms'][0] / floor:.2f}x the floor")
    print(f"{'method':10s} {'depth':>5s} {'nodes':>5s} {'exp. tau':>8s} {'exp. tok/s':>10s}  acceptance from")
    for m in METHODS:
        c = auto_tree_choice(m, curve)
        if c["depth"] is None:
            print(f"{m:10s} {'-':>5s} {'-':>5s}  (no measured acceptance: the checkpoint's tree is kept)")
            continue
        print(f"{m:10s} {c['depth']:5d} {c['total_tokens']:5d} {c['expected_tau']:8.2f} "
              f"{c['expected_tokens_per_s']:10.1f}  {c['acceptance_source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
