"""Measured acceptance of every dynamic-tree shape: tau for each (depth, total_tokens), from one probe run.

    python -m analysis.tree_acceptance --prompts 16 --out assets/results/tree_acceptance.json

`auto` trees (core.trees.choice.choose_tree) trade expected tau against this machine's cost curve. Until now
the expected tau of a (depth D, N nodes) tree was extrapolated from one reference tree's acceptance by
depth with a width model; the model credited a wider level with more acceptance even where the reference
tree already held all top_k children of the root, and so overstated small deep trees (auto trees chosen that
way reached 0.80-0.85 of the tau they were chosen for). This measures tau for every shape instead.

Why one run covers every shape. An EAGLE-2 dynamic tree (core.drafters.dynamic_tree) expands, level by
level, the top_k candidates of the level by path score, whatever D and N are; the tree kept is the best N
candidates (by path score, then level, then creation order) among levels <= D. So one deep expansion at a
position holds every smaller tree: the (D, N) tree is a prefix of the deep candidate list filtered to levels
<= D. Greedy verification accepts the longest chain of the tree that matches the target's own greedy
continuation. The probe drafts one deep tree at every position of a greedy generation (it hands the decode
loop an empty tree, so every cycle verifies exactly one token and the drafter's state after each accept is the
state the drafter has at that position in any run), and then walks each (D, N): from a position, accept the
matching chain, jump past it and its bonus token, repeat. tau here = 1 + accepted draft tokens per cycle (the
prefill not counted); the benchmark's tau counts the prefill as a pass, so it sits a few percent lower.

Greedy, as every benchmark here. The target's continuation is the plain greedy text of this run; in bfloat16 a
speculative run can drift from it where two logits tie (docs/RESULTS.md), which this does not model.

Prompts: the distillation data's held-out split (analysis.tree_sweep.heldout_prompts), never the evaluation
questions, so choosing trees does not tune on the benchmark that reports them.

The probe also times, on this machine, the drafter's state update per cycle (accept, which for MoA also drafts
the root's children) and one expansion level; core.trees.choice scales both by this machine's one-token pass
against the probe's. Medusa and Amphista draft static trees, sized by core.drafters.static_tree instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from core.drafters.base import TargetNeeds, Verified
from core.methods import shipped_names
from core.trees.draft_tree import DraftTree

DYNAMIC_METHODS = tuple(shipped_names(tree="dynamic"))  # the shipped dynamic-tree drafters (moa-tliN as on disk)
PROBE_DEPTH = 8  # core.trees.cost_curve.MAX_AUTO_DEPTH: the deepest tree `auto` considers
PROBE_TOP_K = 8  # the shipped drafters' top_k
MAX_TOKENS = 64  # core.trees.cost_curve.MAX_AUTO_TOKENS
ALL_CANDIDATES = 100_000  # total_tokens for the probe: keep every candidate


class TreeProbe:
    """Wraps a dynamic-tree drafter: at each root it drafts the deep candidate tree, keeps it, and proposes
    nothing, so the decode loop verifies one token a cycle (plain greedy decoding, drafter in step)."""

    def __init__(self, inner, depth: int = PROBE_DEPTH, top_k: int = PROBE_TOP_K) -> None:
        self.inner = inner
        self.name = f"probe:{inner.name}"
        inner.set_options(depth=depth, top_k=top_k, total_tokens=ALL_CANDIDATES)
        self.trees: list[DraftTree] = []  # one per cycle, in order of the root's position
        self.draft_s: list[float] = []
        self.accept_s: list[float] = []

    @property
    def needs(self) -> TargetNeeds:
        return self.inner.needs

    def check_target(self, target) -> None:
        self.inner.check_target(target)

    def begin(self, target, prefill: Verified) -> None:
        self.trees = []
        self.inner.begin(target, prefill)

    def draft(self, root: int) -> DraftTree:
        t0 = time.perf_counter()
        self.trees.append(self.inner.draft(root))
        self.draft_s.append(time.perf_counter() - t0)
        return DraftTree.empty()

    def accept(self, step: Verified) -> None:
        t0 = time.perf_counter()
        self.inner.accept(step)
        self.accept_s.append(time.perf_counter() - t0)


def ranked_chain(tree: DraftTree, future: list[int]) -> list[tuple[int, list[int]]]:
    """The deep tree's chain that greedy verification would accept, node by node: (level, [rank of the node
    among the candidates of levels <= D, for D = 1..depth]) for each matched node, root's child first.

    A (D, N) tree accepts the chain's first nodes as long as each has level <= D and rank < N (the kept set
    is closed under parents: a child's path score never exceeds its parent's, and ties rank the parent first)."""
    n = len(tree)
    if n == 0 or not future:
        return []
    parents = tree.parents.tolist()
    tokens = tree.tokens.tolist()
    logp = torch.log(tree.draft_probs.double().clamp_min(1e-300)).tolist()
    levels, scores = [0] * n, [0.0] * n
    for i in range(n):  # parents come before children
        p = parents[i]
        levels[i] = 1 if p < 0 else levels[p] + 1
        scores[i] = logp[i] + (0.0 if p < 0 else scores[p])
    order = sorted(range(n), key=lambda i: (-scores[i], levels[i], i))
    depth = max(levels)
    rank_at = [dict() for _ in range(depth + 1)]  # rank_at[D][node] for nodes of level <= D
    for d in range(1, depth + 1):
        r = 0
        for i in order:
            if levels[i] <= d:
                rank_at[d][i] = r
                r += 1
    chain, parent = [], -1
    for tok in future[:depth]:
        nxt = next((i for i in range(n) if parents[i] == parent and tokens[i] == tok), None)
        if nxt is None:
            break
        chain.append((levels[nxt], [rank_at[d].get(nxt, n) for d in range(1, depth + 1)]))
        parent = nxt
    return chain


def accepted(chain: list[tuple[int, list[int]]], depth: int, total: int) -> int:
    """Draft tokens a (depth, total) tree accepts, from `ranked_chain`."""
    a = 0
    for level, ranks in chain:
        if level > depth or ranks[min(depth, len(ranks)) - 1] >= total:
            break
        a += 1
    return a


def walk_tau(chains: list[list], depth: int, total: int) -> tuple[int, int]:
    """(new tokens, cycles) of a (depth, total) tree run along one generation: from each cycle's root,
    accept the chain, then the bonus token; the next root sits past both."""
    pos, tokens, cycles = 0, 0, 0
    while pos < len(chains):
        a = accepted(chains[pos], depth, total)
        tokens += a + 1
        cycles += 1
        pos += a + 1
    return tokens, cycles


def probe_method(target, method: str, prompts: list[list[int]], max_new_tokens: int,
                 progress: bool = True, drafter=None) -> dict:
    """Run the probe for one method over the prompts -> its entry of the table (see `main`).

    drafter: the drafter to probe (default: the method's shipped checkpoint). The entry: "checkpoint" (its
    signature), "positions" probed, "top_k", "accept_ms" and "level_ms" (medians on this machine), "verify_ms_1"
    (the one-token pass of the same run), "grid" rows [depth, total_tokens, tau]."""
    from core.decoding import generate
    from core.methods import build_drafter
    from core.trees.acceptance import checkpoint_signature

    drafter = build_drafter(method, target) if drafter is None else drafter
    probe = TreeProbe(drafter)
    chains_per_prompt, verify_s = [], []
    generate(target, probe, prompts[0], 8)  # warm-up
    probe.draft_s, probe.accept_s = [], []
    for ids in tqdm(prompts, desc=f"probe {method}", disable=not progress):
        result = generate(target, probe, ids, max_new_tokens)
        verify_s += [e.verify_time for e in result.events[1:]]
        out = result.token_ids
        # cycle c's root is out[c]; the target's continuation after it is out[c + 1:]
        chains = [ranked_chain(tree, out[c + 1:]) for c, tree in enumerate(probe.trees)]
        horizon = max(0, len(chains) - PROBE_DEPTH)  # a root this close to the end cannot show a deep match
        chains_per_prompt.append(chains[:horizon])
    grid = []
    for depth in range(1, PROBE_DEPTH + 1):
        for total in range(depth, min(MAX_TOKENS, depth * PROBE_TOP_K) + 1):
            toks = cycles = 0
            for chains in chains_per_prompt:
                t, c = walk_tau(chains, depth, total)
                toks, cycles = toks + t, cycles + c
            grid.append([depth, total, round(toks / max(1, cycles), 4)])
    return {"checkpoint": checkpoint_signature(getattr(drafter, "checkpoint_meta", None)),
            "positions": sum(len(c) for c in chains_per_prompt), "top_k": PROBE_TOP_K,
            "accept_ms": median_ms(probe.accept_s), "level_ms": round(median_ms(probe.draft_s) / (PROBE_DEPTH - 1), 3),
            "verify_ms_1": median_ms(verify_s), "grid": grid}


def median_ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 3)


def main(argv: list[str] | None = None) -> int:
    from core import cli_checks as checks
    from core.target import add_dtype_argument

    p = argparse.ArgumentParser(prog="python -m analysis.tree_acceptance", description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(DYNAMIC_METHODS),
                   help=f"comma-separated dynamic-tree methods (default {','.join(DYNAMIC_METHODS)})")
    p.add_argument("--prompts", type=int, default=16, help="held-out distillation prompts (1..200)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    add_dtype_argument(p)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True, help="the JSON table to write (core.trees.acceptance reads "
                   "assets/results/tree_acceptance.json)")
    args = p.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    try:
        for m in methods:
            if m not in DYNAMIC_METHODS:
                raise ValueError(f"--methods: {m!r} does not draft a dynamic tree; choose from "
                                 f"{', '.join(DYNAMIC_METHODS)}")
        checks.check_int_range(args.prompts, "--prompts", 1, 200)
        checks.check_max_new_tokens(args.max_new_tokens)
        checks.check_device_and_threads("cpu", args.threads)
    except ValueError as err:
        return checks.report(err)
    from analysis.tree_sweep import heldout_prompts

    target = checks.target_for_script(args.dtype, "cpu", args.threads)
    questions, chat_ids = heldout_prompts(args.prompts)
    prompts = [chat_ids([{"role": "user", "content": q["turns"][0]}]) for q in questions]
    table = {"definition": "grid rows [depth, total_tokens, tau]: tau = 1 + draft tokens accepted per cycle "
                           "(greedy; prefill not counted), measured for every tree shape "
                           "(analysis.tree_acceptance module docstring)",
             "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
             "dtype": str(target.dtype).replace("torch.", ""), "target": target.fingerprint,
             "command": "python -m analysis.tree_acceptance " + " ".join(argv if argv is not None else sys.argv[1:]),
             "methods": {}}
    out = Path(args.out)
    if out.exists():  # a partial rerun (--methods) keeps the other methods' rows
        try:
            old = json.loads(out.read_text())
            if old.get("target") == table["target"]:
                table["methods"].update(old.get("methods", {}))
        except (OSError, ValueError):
            pass
    for m in methods:
        table["methods"][m] = probe_method(target, m, prompts, args.max_new_tokens)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(table, indent=1) + "\n")
        best = max(table["methods"][m]["grid"], key=lambda r: r[2])
        print(f"{m}: {table['methods'][m]['positions']} positions; tau d1/n8 "
              f"{next(r[2] for r in table['methods'][m]['grid'] if r[:2] == [1, 8])}, d5/n24 "
              f"{next(r[2] for r in table['methods'][m]['grid'] if r[:2] == [5, 24])}, best {best}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
