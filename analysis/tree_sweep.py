"""Draft-tree size sweep on held-out training prompts: which default tree pays on this machine.

A bigger tree raises tau (more candidates per target pass) but costs drafting passes and a wider
verification pass. This runs every shipped drafter at several tree settings, interleaved with
plain decoding (analysis.bench.run_benchmark), on prompts of the distillation data's held-out
split, never on the evaluation prompts, so that choosing defaults here does not tune on the
benchmark that reports them.

    python -m analysis.tree_sweep --prompts 6 --max-new-tokens 64 --out runs/tree_sweep

writes sweep.json and sweep.md (tau, tokens/s, speedup, drafting and verification ms per cycle
for every setting) plus the benchmark files underneath.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from analysis.bench import run_benchmark
from core.drafters.base import Autoregressive, Drafter
from core.methods import methods_where
from core.target import Target, add_dtype_argument

DISTILL = Path(__file__).resolve().parent.parent / "assets" / "distill"
# (method, label suffix, options): dynamic trees as (depth, top_k, total_tokens), static trees by size
GRID: list[tuple[str, str, dict]] = (
    [(m, f"d{d}k{k}n{n}", {"depth": d, "top_k": k, "total_tokens": n}) for m in methods_where(tree="dynamic")
     for d, k, n in ((4, 8, 16), (5, 8, 24), (6, 8, 32), (6, 10, 48), (7, 10, 64))]
    + [(m, f"n{n}", {"tree_size": n}) for m in methods_where(tree="static") for n in (8, 16, 24, 32, 48, 64)])


def heldout_prompts(count: int, seed: int = 0, data: str | Path = DISTILL) -> tuple[list[dict], Callable]:
    """`count` held-out distillation prompts, one category after another, as Spec-Bench questions.

    The prompts are stored as chat-formatted token ids, so the questions carry an index as their
    text and the returned chat_ids(messages) maps it back to those ids.
    """
    from core.training.distill_data import load_distill

    records = load_distill(data, split="heldout")
    order = np.random.default_rng(seed).permutation(len(records))
    by_cat: dict[str, list[dict]] = {}
    for i in order:
        by_cat.setdefault(records[i]["category"], []).append(records[i])
    picked: list[dict] = []
    while len(picked) < min(count, len(records)):
        for cat in sorted(by_cat):
            if by_cat[cat] and len(picked) < count:
                picked.append(by_cat[cat].pop())
    questions = [{"question_id": i, "category": r["category"], "turns": [str(i)]} for i, r in enumerate(picked)]

    def chat_ids(messages: list[dict]) -> list[int]:
        return list(picked[int(messages[-1]["content"])]["prompt_ids"])

    return questions, chat_ids


def sweep(target: Target, questions: list[dict], chat_ids: Callable, out_dir: str | Path,
          max_new_tokens: int = 64, grid: list[tuple[str, str, dict]] = GRID, progress: bool = True,
          decode: Callable[[list[int]], str] | None = None) -> dict:
    """Run the grid: {"rows": one per setting (overall figures), "ar_tokens_per_s"}; writes sweep.json / sweep.md."""
    from core.methods import build_drafter

    drafters: dict[str, Drafter] = {"ar": Autoregressive()}
    settings = {}
    for method, suffix, opts in grid:
        label = f"{method}-{suffix}"
        drafters[label] = build_drafter(method, target, None, **opts)
        settings[label] = (method, opts)
    summary = run_benchmark(target, drafters, questions, out_dir, max_new_tokens=max_new_tokens, chat_ids=chat_ids,
                            decode=decode, record=False, report=False, progress=progress,
                            meta={"command": "python -m analysis.tree_sweep " + " ".join(sys.argv[1:])})
    rows = []
    for label, (method, opts) in settings.items():
        o = summary["methods"][label]["overall"]
        rows.append({"method": method, "options": opts, "tau": o["tau"], "tokens_per_s": o["tokens_per_s"],
                     "speedup": o["speedup"], "mean_tree_nodes": o["mean_tree_nodes"],
                     "draft_ms_per_cycle": o["draft_ms_per_cycle"], "verify_ms_per_cycle": o["verify_ms_per_cycle"]})
    result = {"rows": rows, "ar_tokens_per_s": summary["methods"]["ar"]["overall"]["tokens_per_s"],
              "config": summary["config"]}
    out = Path(out_dir)
    (out / "sweep.json").write_text(json.dumps(result, indent=1))
    (out / "sweep.md").write_text(sweep_markdown(rows, result["ar_tokens_per_s"]) + "\n")
    return result


def sweep_markdown(rows: list[dict], ar_tokens_per_s: float) -> str:
    lines = ["| method | tree | nodes | tau | tokens/s | speedup | draft ms/cycle | verify ms/cycle |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tree = ", ".join(f"{k}={v}" for k, v in r["options"].items())
        nodes = "–" if r["mean_tree_nodes"] is None else f"{r['mean_tree_nodes']:.1f}"
        lines.append(f"| {r['method']} | {tree} | {nodes} | {r['tau']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['draft_ms_per_cycle']:.1f} | "
                     f"{r['verify_ms_per_cycle']:.1f} |")
    lines.append(f"\nPlain decoding (ar): {ar_tokens_per_s:.1f} tokens/s in the same run.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.tree_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts (one category after another)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    add_dtype_argument(p)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--methods", default=None, help="comma-separated: sweep only these methods' settings")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    grid = GRID
    if args.methods:
        wanted = {m.strip() for m in args.methods.split(",") if m.strip()}
        unknown = wanted - {m for m, _, _ in GRID}
        if unknown:
            p.error(f"no sweep settings for {', '.join(sorted(unknown))}; the grid has "
                    f"{', '.join(sorted({m for m, _, _ in GRID}))}")
        grid = [g for g in GRID if g[0] in wanted]
    from core.target import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(None, args.dtype, "cpu")
    questions, chat_ids = heldout_prompts(args.prompts)
    result = sweep(target, questions, chat_ids, args.out, args.max_new_tokens, grid=grid)
    print(sweep_markdown(result["rows"], result["ar_tokens_per_s"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
