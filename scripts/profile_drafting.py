"""Drafting cost against the verify pass, per method (issue 23): where a cycle's time goes.

For each method it runs a few held-out prompts (assets/prompts/speclens_eval.jsonl, first turns), the methods
interleaved prompt by prompt after a warm-up, and times every cycle's drafting (draft + state update) and
verify pass (target pass + verification + cache bookkeeping), as the decode loop records them. It prints,
per method: tau, draft ms per cycle, verify ms per cycle, drafting as a share of the verify pass, tokens/s,
and, once: this machine's bare-matmul floor and plain decoding's verify pass against it.

    python scripts/profile_drafting.py                      # every method, 6 prompts, 64 tokens, bfloat16
    python scripts/profile_drafting.py --methods eagle2,moa --prompts 4 --threads 2 --json runs/profile.json
    python scripts/profile_drafting.py --methods moa --cprofile 25       # + the 25 costliest functions of moa
    python scripts/profile_drafting.py --weights                         # + weight bytes read per cycle
    python scripts/profile_drafting.py --ops                             # + PyTorch calls per cycle
    python scripts/profile_drafting.py --methods eagle2,moa --vocab-sizes 8192,2048   # drafting-vocabulary sizes
    python scripts/profile_drafting.py --methods ar,eagle2,moa --trees auto,1/4      # tree shapes, interleaved

--vocab-sizes runs each trained drafter once per size of its drafting vocabulary (core.drafters.draft_vocab,
DRAFTING_SIZE; 0 = every trained token), interleaved with the rest, as rows "method V'=size".

--trees runs each dynamic-tree drafter (EAGLE-2, MoA) once per listed shape, "auto" (sized for this machine,
then calibrated) or "depth/nodes" (fixed), interleaved with the rest, as rows "method tree=shape".

--weights profiles one more generation per method and adds the weight bytes its drafting and the target's
passes read, and the rate each streams them at (analysis.weight_traffic says how and why).

Timing only means something on a machine nobody else is using.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.methods import shipped_names  # noqa: E402  (after the path insert)

DEFAULT_METHODS = ",".join(shipped_names())  # every shipped method (moa-tliN as found under assets/drafters)
QUESTIONS = ROOT / "assets" / "prompts" / "speclens_eval.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from core.target import add_dtype_argument

    p = argparse.ArgumentParser(prog="scripts/profile_drafting.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated (default {DEFAULT_METHODS})")
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts, spread over the categories (1..76)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    add_dtype_argument(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--cprofile", type=int, default=0, metavar="N",
                   help="also profile each method once and print its N costliest functions")
    p.add_argument("--weights", action="store_true",
                   help="also measure the weight bytes each method's drafting and target pass read per cycle")
    p.add_argument("--ops", action="store_true",
                   help="also count the torch calls and operator calls each method's drafting and verify make a cycle")
    p.add_argument("--vocab-sizes", default=None, metavar="N,N",
                   help="also compare these drafting-vocabulary sizes per trained drafter (0 = all trained tokens)")
    p.add_argument("--trees", default=None, metavar="SHAPE,SHAPE",
                   help="also compare these tree shapes per dynamic-tree drafter: auto or depth/nodes (e.g. auto,1/4)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    return p.parse_args(argv)


def pick_prompts(n: int) -> list[str]:
    """n first turns spread over the categories (the file's order within a category)."""
    rows = [json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_cat: dict[str, list[str]] = {}
    for r in rows:
        by_cat.setdefault(r.get("category", ""), []).append(r["turns"][0])
    out, i = [], 0
    while len(out) < n and any(i < len(v) for v in by_cat.values()):
        out += [v[i] for v in by_cat.values() if i < len(v)]
        i += 1
    return out[:n]


def parse_sizes(text: str | None) -> list[int]:
    """--vocab-sizes "8192,2048" -> [8192, 2048]; a one-line error naming the bad value otherwise."""
    if text is None:
        return []
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(n < 0 for n in sizes):
        raise ValueError(f"--vocab-sizes must be comma-separated integers >= 0 (0: every trained token), got {text!r}")
    return sizes


def parse_trees(text: str | None) -> list[str]:
    """--trees "auto,1/4" -> ["auto", "1/4"]; a one-line error naming the bad value otherwise."""
    if text is None:
        return []
    def valid(shape: str) -> bool:
        depth, _, nodes = shape.partition("/")
        return shape == "auto" or (depth.isdigit() and nodes.isdigit() and 1 <= int(depth) <= int(nodes))

    shapes = [t.strip() for t in text.split(",") if t.strip()]
    if not shapes or not all(valid(t) for t in shapes):
        raise ValueError(f"--trees must be comma-separated shapes, each auto or depth/nodes with 1 <= depth <= "
                         f"nodes (e.g. auto,1/4), got {text!r}")
    return shapes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from core import cli_checks as checks
    from core.methods import METHODS, build_drafter, check_method, parse_method

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        for m in methods:
            check_method(m)
        checks.check_int_range(args.prompts, "--prompts", 1, 76)
        checks.check_max_new_tokens(args.max_new_tokens)
        checks.check_device_and_threads(args.device, args.threads)
        sizes = parse_sizes(args.vocab_sizes)
        shapes = parse_trees(args.trees)
    except ValueError as err:
        return checks.report(err)
    import torch

    from core.decoding import generate
    from core.trees import cost_curve

    target = checks.target_for_script(args.dtype, args.device, args.threads)
    built = {}
    for m in methods:
        base = parse_method(m).base
        if not (shapes and METHODS[base].tree == "dynamic"):  # --trees shapes apply to dynamic trees only
            built[m] = build_drafter(m, target)
            continue
        for shape in shapes:  # one drafter per shape: each keeps its own auto choice and calibration
            d = build_drafter(m, target)
            if shape != "auto":
                depth, nodes = (int(x) for x in shape.split("/"))
                d.set_options(depth=depth, total_tokens=nodes)
            built[f"{m} tree={shape}"] = d
    drafters, vocab_size = {}, {}
    for m, d in built.items():
        vocab = getattr(getattr(d, "inner", d), "vocab", None)
        for size in sizes if sizes and vocab is not None and not vocab.full else [None]:
            label = m if size is None else f"{m} V'={size}"
            drafters[label], vocab_size[label] = d, size
    methods = list(drafters)
    prompts = [target.chat_ids(p) for p in pick_prompts(args.prompts)]

    def run(m: str, ids: list[int], n: int):
        if vocab_size[m] is not None:
            getattr(drafters[m], "inner", drafters[m]).vocab.drafting_size = vocab_size[m]
        return generate(target, drafters[m], ids, n)

    for m in methods:  # warm-up (also sizes `auto` trees: the cost curve is measured or read from its cache)
        run(m, prompts[0], 16)
    floor = cost_curve.matmul_floor_ms(target)
    times = {m: {"draft": [], "verify": [], "tokens": 0, "steps": 0, "wall": 0.0} for m in methods}
    for i, ids in enumerate(prompts):
        for m in methods[i % len(methods):] + methods[:i % len(methods)]:
            r = run(m, ids, args.max_new_tokens)
            t = times[m]
            for e in r.events[1:]:
                t["draft"].append(e.draft_time)
                t["verify"].append(e.verify_time)
            t["tokens"] += r.new_tokens
            t["steps"] += r.steps
            t["wall"] += sum(e.draft_time + e.verify_time for e in r.events)
    rows = []
    for m in methods:
        t = times[m]
        draft_ms = 1000 * statistics.fmean(t["draft"]) if t["draft"] else 0.0
        verify_ms = 1000 * statistics.fmean(t["verify"]) if t["verify"] else 0.0
        d = drafters[m]
        inner = getattr(d, "inner", d)
        cfg = getattr(inner, "config", None)
        tree = (f"d{cfg.depth}/n{cfg.total_tokens}" if hasattr(cfg, "total_tokens") else
                f"n{len(inner.tree_paths)}" if getattr(inner, "tree_paths", None) else "-")
        rows.append({"method": m, "tau": t["tokens"] / max(1, t["steps"]), "draft_ms": draft_ms,
                     "verify_ms": verify_ms, "draft_share": draft_ms / verify_ms if verify_ms else None,
                     "tokens_per_s": t["tokens"] / t["wall"] if t["wall"] else 0.0, "tree": tree,
                     "tree_auto": bool(getattr(inner, "tree_auto", False))})
    ar = next((r for r in rows if r["method"] == "ar"), None)
    print(f"target {target.source} {str(target.dtype).replace('torch.', '')} on {target.device}, "
          f"{torch.get_num_threads()} threads, {len(prompts)} prompts x {args.max_new_tokens} tokens")
    print(f"bare-matmul floor (1 token through every weight): {floor:.2f} ms"
          + (f"; plain decoding's pass: {ar['verify_ms']:.2f} ms = {ar['verify_ms'] / floor:.2f}x the floor"
             if ar else ""))
    print(f"{'method':18s} {'tree':9s} {'tau':>5s} {'draft ms':>9s} {'verify ms':>10s} {'draft/verify':>13s} "
          f"{'tok/s':>7s}" + (f" {'speedup':>8s}" if ar else ""))
    for r in rows:
        share = f"{100 * r['draft_share']:.0f}%" if r["draft_share"] is not None else "-"
        speedup = f" {r['tokens_per_s'] / ar['tokens_per_s']:7.3f}x" if ar and ar["tokens_per_s"] else ""
        print(f"{r['method']:18s} {r['tree'] + ('*' if r['tree_auto'] else ''):9s} {r['tau']:5.2f} "
              f"{r['draft_ms']:9.2f} {r['verify_ms']:10.2f} {share:>13s} {r['tokens_per_s']:7.2f}{speedup}")
    print("(* = auto tree, sized for this machine by core.trees.choice.choose_tree)")
    if args.weights:
        from analysis.weight_traffic import measure

        print(f"\nweights read per cycle (one more generation each, under the profiler):\n"
              f"{'method':18s} {'draft MB':>9s} {'verify MB':>10s} {'draft/verify bytes':>19s} {'draft GB/s':>11s} "
              f"{'verify GB/s':>12s}")
        for r in rows:
            r.update(measure(target, drafters[r["method"]], prompts[0], args.max_new_tokens))
            ratio = f"{100 * r['draft_mb'] / r['verify_mb']:.0f}%" if r["verify_mb"] else "-"
            rate = (lambda mb, ms: f"{mb / ms:.1f}" if ms else "-")
            print(f"{r['method']:18s} {r['draft_mb']:9.1f} {r['verify_mb']:10.1f} {ratio:>19s} "
                  f"{rate(r['draft_mb'], r['draft_ms']):>11s} {rate(r['verify_mb'], r['verify_ms']):>12s}")
    if args.ops:
        from analysis.op_count import count

        print(f"\nPyTorch calls per cycle (one more generation each; analysis.op_count says what is counted):\n"
              f"{'method':18s} {'draft torch':>12s} {'draft ops':>10s} {'verify torch':>13s} {'verify ops':>11s}")
        for r in rows:
            r.update(count(target, drafters[r["method"]], prompts[0], args.max_new_tokens))
            print(f"{r['method']:18s} {r['draft_torch_calls']:12.0f} {r['draft_operator_calls']:10.0f} "
                  f"{r['verify_torch_calls']:13.0f} {r['verify_operator_calls']:11.0f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"floor_ms": floor, "rows": rows, "when": time.time()}, indent=1))
    for m in methods if args.cprofile > 0 else ():
        prof = cProfile.Profile()
        prof.enable()
        run(m, prompts[0], args.max_new_tokens)
        prof.disable()
        print(f"\n--- {m}: {args.cprofile} costliest functions (own time) ---")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(args.cprofile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
