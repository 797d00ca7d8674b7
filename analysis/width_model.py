"""How well `auto` trees' fallback model predicts tau from a drafter card alone, against the measured tree table.

    python -m analysis.width_model [--out assets/results/width_model.json]

A retrained drafter has no measured table yet, only its card's held-out acc@1..k (a top-1 chain), and
core.trees.choice widens that chain to every (depth, nodes) shape. This compares the widened prediction with
tau measured for each shape (assets/results/tree_acceptance.json), for each shipped dynamic-tree drafter, with
each extra candidate counted as a fresh chance (alpha = 1) and with the exponent fitted to the table
(core.trees.acceptance.width_exponent).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.trees.acceptance import TREE_TABLE, card_acceptance, shape_grid, shipped_signature, width_exponent
from core.trees.choice import conditional_rates, expected_tau
from core.trees.cost_curve import ROOT


def compare(table_path: Path = TREE_TABLE) -> dict:
    """{"alpha": fitted, "methods": {method: {"alpha=1": errors, "fitted": errors}}}, errors of predicted - measured
    tau over the table's shapes: mean, mean absolute, worst, and both taus at the largest shape."""
    table = json.loads(Path(table_path).read_text())
    alpha = width_exponent(table_path)
    out = {"alpha": round(alpha, 4), "table": str(table_path), "methods": {}}
    for method, row in table["methods"].items():
        if row.get("checkpoint") != shipped_signature(method):
            continue  # the card would describe another checkpoint than the one measured
        meta = json.loads((ROOT / "assets" / "drafters" / method / "config.json").read_text())
        card = card_acceptance((meta.get("training") or {}).get("heldout"))
        if card is None:
            continue
        rates = conditional_rates(card["p"])
        grid = shape_grid(row)
        largest = max(grid, key=lambda s: (s[1], s[0]))
        figures = {}
        for name, a in (("alpha=1", 1.0), ("fitted", alpha)):
            pred = {s: expected_tau(rates, *s, card["ref_depth"], card["ref_total"], alpha=a) for s in grid}
            errs = [pred[s] - grid[s] for s in grid]
            figures[name] = {"mean_error": round(sum(errs) / len(errs), 3),
                             "mean_abs_error": round(sum(map(abs, errs)) / len(errs), 3),
                             "worst_error": round(max(errs, key=abs), 3),
                             "largest_shape": list(largest), "predicted_at_largest": round(pred[largest], 3),
                             "measured_at_largest": grid[largest]}
        out["methods"][method] = figures
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default=str(TREE_TABLE))
    p.add_argument("--out", default=None, help="write the comparison as JSON here")
    args = p.parse_args(argv)
    result = compare(Path(args.table))
    print(f"width exponent fitted to the table: {result['alpha']:.3f}")
    print(f"{'method':<10} {'model':<8} {'mean err':>9} {'mean |err|':>11} {'worst':>7}  largest: predicted / measured")
    for method, figures in result["methods"].items():
        for name, f in figures.items():
            print(f"{method:<10} {name:<8} {f['mean_error']:>9.2f} {f['mean_abs_error']:>11.2f} "
                  f"{f['worst_error']:>7.2f}  {f['predicted_at_largest']:>18.2f} / {f['measured_at_largest']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
