"""Fixed tree shapes of the same drafters side by side, in one interleaved benchmark run on the evaluation questions.

It answers "does this tree beat that one here?" by measurement: e.g. the trees the extrapolating model chose
against the ones the measured table (analysis.tree_acceptance) chooses, each method once per shape.

    python scripts/compare_trees.py --shape eagle2=2/15,2/6 --shape moa=1/8,2/7 --out runs/trees
    python scripts/compare_trees.py --shape moa=auto,1/4,2/6 --out runs/trees     # auto against fixed shapes

Labels are METHOD@dD-N, or METHOD@auto for the `auto` tree (sized for this machine, then decided by the shape
trial, core.trees.trial); plain decoding (ar) comes along for the speedups. Prints tau, tokens/s, speedup,
drafting and verify ms per cycle and the share of ideal per label, then, for each method run with `auto`, the
shape its trial kept and auto's tokens/s against the fastest fixed shape of the same run; writes the benchmark
files under --out (the auto comparison as auto_vs_fixed.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


AUTO = "auto"
Shape = tuple[int, int] | str  # (depth, nodes), or AUTO


def parse_shapes(items: list[str]) -> dict[str, list[Shape]]:
    """["eagle2=auto,2/15,2/6", ...] -> {"eagle2": ["auto", (2, 15), (2, 6)], ...}; a ValueError names a malformed
    item."""
    shapes: dict[str, list[Shape]] = {}
    for item in items:
        method, _, rest = item.partition("=")
        try:
            pairs = [s if s == AUTO else tuple(int(x) for x in s.split("/")) for s in rest.split(",")]
            if not method or any(p != AUTO and (len(p) != 2 or p[0] < 1 or p[1] < p[0]) for p in pairs):
                raise ValueError
        except ValueError:
            raise ValueError(f"--shape {item!r}: expected METHOD=SHAPE[,SHAPE...], each SHAPE 'auto' or "
                             f"DEPTH/NODES with 1 <= depth <= nodes, e.g. eagle2=auto,2/15,2/6") from None
        shapes.setdefault(method, []).extend(pairs)
    return shapes


def label(method: str, shape: Shape) -> str:
    return f"{method}@{AUTO}" if shape == AUTO else f"{method}@d{shape[0]}-{shape[1]}"


def auto_against_fixed(shapes: dict[str, list[Shape]], summary: dict, drafters: dict) -> dict[str, dict]:
    """Per method run with `auto` and at least one fixed shape: auto's tokens/s, the fastest fixed shape's, the
    ratio, and auto's trial (core.trees.trial.ShapeTrial.record: its shapes, the model's pick first, and the one it
    kept)."""
    out: dict[str, dict] = {}
    for m, pairs in shapes.items():
        fixed = [label(m, p) for p in pairs if p != AUTO]
        if AUTO not in pairs or not fixed:
            continue
        rate = {lab: summary["methods"][lab]["overall"]["tokens_per_s"] for lab in [label(m, AUTO), *fixed]}
        best = max(fixed, key=lambda lab: rate[lab])
        choice = getattr(drafters[label(m, AUTO)], "tree_choice", None) or {}
        out[m] = {"auto_tokens_per_s": rate[label(m, AUTO)], "fastest_fixed": best,
                  "fastest_fixed_tokens_per_s": rate[best], "auto_over_fastest": rate[label(m, AUTO)] / rate[best],
                  "trial": choice.get("trial")}
    return out


def main(argv: list[str] | None = None) -> int:
    from core import cli_checks as checks
    from core.target import add_dtype_argument

    p = argparse.ArgumentParser(prog="scripts/compare_trees.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", required=True, metavar="METHOD=D/N,D/N",
                   help="a dynamic-tree method and the shapes to run it with (repeatable)")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    add_dtype_argument(p)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from analysis.tree_acceptance import DYNAMIC_METHODS

    try:
        shapes = parse_shapes(args.shape)
        for m in shapes:
            if m not in DYNAMIC_METHODS:
                raise ValueError(f"--shape: {m!r} does not draft a dynamic tree; choose from "
                                 f"{', '.join(DYNAMIC_METHODS)}")
        checks.check_int_range(args.per_category, "--per-category", 1)
        checks.check_max_new_tokens(args.max_new_tokens)
        checks.check_device_and_threads("cpu", args.threads)
    except ValueError as err:
        return checks.report(err)
    from analysis.bench import load_questions, run_benchmark
    from core.drafters.base import Autoregressive
    from core.methods import build_drafter

    target = checks.target_for_script(args.dtype, "cpu", args.threads)
    questions = load_questions(ROOT / "assets" / "prompts" / "speclens_eval.jsonl", None, args.per_category)
    drafters = {"ar": Autoregressive()}
    for m, pairs in shapes.items():
        for shape in pairs:
            opts = {} if shape == AUTO else {"depth": shape[0], "total_tokens": shape[1]}
            drafters[label(m, shape)] = build_drafter(m, target, None, **opts)
    summary = run_benchmark(target, drafters, questions, args.out, max_new_tokens=args.max_new_tokens,
                            record=False, report=False,
                            meta={"command": "python scripts/compare_trees.py " + " ".join(sys.argv[1:])})
    print("| label | tau | tokens/s | speedup | draft ms/cycle | verify ms/cycle | share of ideal |")
    print("|---|---|---|---|---|---|---|")
    for lab, r in summary["methods"].items():
        o = r["overall"]
        share = o.get("share_of_ideal")
        print(f"| {lab} | {o['tau']:.2f} | {o['tokens_per_s']:.1f} | {o['speedup']:.2f}x | "
              f"{o['draft_ms_per_cycle']:.2f} | {o['verify_ms_per_cycle']:.2f} | "
              f"{'-' if share is None else f'{100 * share:.0f}%'} |")
    compared = auto_against_fixed(shapes, summary, drafters)
    if compared:
        print("\n| method | auto tokens/s | fastest fixed | its tokens/s | auto / fastest | trial kept |")
        print("|---|---|---|---|---|---|")
        for m, c in compared.items():
            won = (c["trial"] or {}).get("winner") or {}
            kept = f"{won['depth']}/{won['total_tokens']}" if won else "-"
            print(f"| {m} | {c['auto_tokens_per_s']:.1f} | {c['fastest_fixed']} | "
                  f"{c['fastest_fixed_tokens_per_s']:.1f} | {c['auto_over_fastest']:.3f} | {kept} |")
        Path(args.out, "auto_vs_fixed.json").write_text(json.dumps(compared, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
