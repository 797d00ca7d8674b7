"""Fixed tree shapes of the same drafters side by side, in one interleaved benchmark run on the evaluation questions.

It answers "does this tree beat that one here?" by measurement: e.g. the trees the extrapolating model chose
against the ones the measured table (analysis.tree_acceptance) chooses, each method once per shape.

    python scripts/compare_trees.py --shape eagle2=2/15,2/6 --shape moa=1/8,2/7 --out runs/trees

Labels are METHOD@dD-N; plain decoding (ar) comes along for the speedups. Prints tau, tokens/s, speedup,
drafting and verify ms per cycle and the share of ideal per label; writes the benchmark files under --out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_shapes(items: list[str]) -> dict[str, list[tuple[int, int]]]:
    """["eagle2=2/15,2/6", ...] -> {"eagle2": [(2, 15), (2, 6)], ...}; a ValueError names a malformed item."""
    shapes: dict[str, list[tuple[int, int]]] = {}
    for item in items:
        method, _, rest = item.partition("=")
        try:
            pairs = [tuple(int(x) for x in s.split("/")) for s in rest.split(",")]
            if not method or any(len(p) != 2 or p[0] < 1 or p[1] < p[0] for p in pairs):
                raise ValueError
        except ValueError:
            raise ValueError(f"--shape {item!r}: expected METHOD=DEPTH/NODES[,DEPTH/NODES...] with "
                             f"1 <= depth <= nodes, e.g. eagle2=2/15,2/6") from None
        shapes.setdefault(method, []).extend(pairs)
    return shapes


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
        for d, n in pairs:
            drafters[f"{m}@d{d}-{n}"] = build_drafter(m, target, None, depth=d, total_tokens=n)
    summary = run_benchmark(target, drafters, questions, args.out, max_new_tokens=args.max_new_tokens,
                            record=False, report=False,
                            meta={"command": "python scripts/compare_trees.py " + " ".join(sys.argv[1:])})
    print("| label | tau | tokens/s | speedup | draft ms/cycle | verify ms/cycle | share of ideal |")
    print("|---|---|---|---|---|---|---|")
    for label, r in summary["methods"].items():
        o = r["overall"]
        share = o.get("share_of_ideal")
        print(f"| {label} | {o['tau']:.2f} | {o['tokens_per_s']:.1f} | {o['speedup']:.2f}x | "
              f"{o['draft_ms_per_cycle']:.2f} | {o['verify_ms_per_cycle']:.2f} | "
              f"{'-' if share is None else f'{100 * share:.0f}%'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
