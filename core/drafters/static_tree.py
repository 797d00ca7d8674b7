"""Static draft trees shared by Medusa and Amphista (docs/ARCHITECTURE.md, "Draft trees").

A static tree is a fixed set of *index paths*, Medusa style: the path (0, 2, 1)
is the node reached by taking head 0's top-1 candidate, then head 1's 3rd,
then head 2's 2nd. A node at depth d therefore always holds one of head
(d-1)'s candidates, and its parent is the path without its last index. Every
drafting cycle the heads' top-k candidates are dropped into the same shape.

Building the best tree (`best_tree`). Let a[i][k] be the probability that
head i's rank-k candidate (0-based) is the correct token. Assuming heads err
independently, a node is accepted exactly when every index on its path hits,
so P(node accepted) = product of a[depth][rank] along its path, and the
expected number of accepted draft tokens is the sum of that product over the
tree's nodes (Medusa's construction). Maximising the sum over trees of `size`
nodes is easy because the value can only fall along a path (each factor is
<= 1): the `size` best nodes overall already form a tree, so a best-first
search that pops nodes in order of value and pushes a node's children only
once it is popped returns the optimum.

Measured accuracies come from training as *cumulative* top-k accuracies
(metrics `top{k}@{i}`, the token is within head i's top k); `rank_accuracies`
turns them into the per-rank a[i][k] that `best_tree` wants.

The default tree, for drafters whose checkpoint carries no measured tree:
the best 16-node tree of depth 4 under a Medusa-like prior
(`PRIOR_RANK_ACCURACY`). Why that size: on the project's CPU, under light
load, a bfloat16 target pass costs about 55 ms for 1 new token and 60-100 ms
for 32 (`CPU_PASS_MS` takes 70 ms; its 8- and 64-token points are estimated
from the shape of the bfloat16 table in docs/ARCHITECTURE.md, "Target runtime": 50/54/62/81 ms). Up to about 8 tokens
are nearly free; past that each node costs about 0.5-1.5 ms (1-3% of a
step), while the prior tree's 17th to 28th nodes add only about 1.2% each to
tau. For the
prior, the ideal speedup tau x t(1) / t(1 + n) peaks at n = 16 with
t(32) = 70 ms, at n = 8-11 with t(32) = 75-80 ms and at n = 24-31 with
t(32) = 60-65 ms; 16 nodes stays within about 3% of the optimum for
t(32) = 65-80 ms, while the previous default of 28 loses 7-11% at 75-80 ms.
How many nodes really pay off depends on the heads' accuracies and on the
pass-cost table: `best_size` computes that optimum, and
`StaticTreeMixin.set_tree_from_metrics` uses it after training, so a trained
checkpoint carries a tree sized from its own measured accuracies
(config field `tree_paths`). GPU trees (Medusa's ~60 nodes) are larger because
a wide pass is almost free there.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence

import torch

from core.drafters.draft_vocab import DraftVocab
from core.target import Target
from core.trees import cost_curve
from core.trees.acceptance import method_acceptance
from core.trees.calibration import CycleLedger, calibration_enabled, grid_row, keep_or_move
from core.trees.choice import STATIC_TREE_METHODS, calibrated_row, choose_tree
from core.trees.draft_tree import DraftTree

Path = tuple[int, ...]

# A prior for the per-rank accuracy of Medusa heads, shaped after the published
# Medusa-1 head accuracies (head 0 top-1 about 0.55-0.6, falling for later heads
# and lower ranks). Only used until a drafter has measured its own.
_RANK_SHARE = (0.55, 0.15, 0.07, 0.04, 0.03, 0.02, 0.015, 0.012, 0.01, 0.008)
_HEAD_FACTOR = (1.0, 0.72, 0.58, 0.48, 0.42, 0.37)
PRIOR_RANK_ACCURACY: list[list[float]] = [[f * s for s in _RANK_SHARE] for f in _HEAD_FACTOR]

# bfloat16 target pass time (ms) by number of new tokens on the project's CPU: 1 and 32 measured
# (light load; 32 varies 60-100 ms), 8 and 64 estimated from the table's curve (module docstring).
CPU_PASS_MS: dict[int, float] = {1: 55.0, 8: 59.0, 32: 70.0, 64: 95.0}
DEFAULT_TREE_SIZE = 16
DEFAULT_TREE_DEPTH = 4
TOP_EXTRAS = 10  # candidates per tree row reported in DraftTree.extras["draft_top"] (for the app)


def path_value(path: Sequence[int], rank_accuracy: Sequence[Sequence[float]]) -> float:
    """P(all of the path's candidates are right) under the independence assumption."""
    v = 1.0
    for depth, rank in enumerate(path):
        v *= rank_accuracy[depth][rank]
    return v


def best_tree(per_head_topk_accuracy: list[list[float]], size: int, max_depth: int) -> list[Path]:
    """The `size`-node tree of depth <= `max_depth` with the largest expected accepted length.

    per_head_topk_accuracy[i][k]: probability that head i's rank-k candidate (0-based,
    *not* cumulative) is the right token; see `rank_accuracies` to convert cumulative
    top-k accuracies. Returns paths sorted by (depth, path), so parents come first.
    Fewer than `size` paths come back only when the heads have fewer candidates.
    """
    if size < 0 or max_depth < 0:
        raise ValueError(f"size and max_depth must be non-negative, got {size}, {max_depth}")
    acc = [list(map(float, row)) for row in per_head_topk_accuracy]
    if any(not 0.0 <= a <= 1.0 for row in acc for a in row):
        raise ValueError("accuracies must lie in [0, 1]")
    depth_limit = min(max_depth, len(acc))
    chosen: list[Path] = []
    # Heap key: (-value, depth, path); ties go to shallower nodes, then to lower ranks.
    heap: list[tuple[float, int, Path]] = []

    def push_children(parent: Path, value: float) -> None:
        d = len(parent)
        if d >= depth_limit:
            return
        for k, a in enumerate(acc[d]):
            child = parent + (k,)
            heapq.heappush(heap, (-value * a, d + 1, child))

    push_children((), 1.0)
    while heap and len(chosen) < size:
        neg, _, path = heapq.heappop(heap)
        chosen.append(path)
        push_children(path, -neg)
    return sorted(chosen, key=lambda p: (len(p), p))


def rank_accuracies(cumulative: Sequence[Sequence[float]]) -> list[list[float]]:
    """Cumulative top-k accuracies (top-1, top-2, ...) per head -> per-rank accuracies."""
    out = []
    for row in cumulative:
        prev, ranks = 0.0, []
        for c in row:
            ranks.append(max(0.0, float(c) - prev))
            prev = max(prev, float(c))
        out.append(ranks)
    return out


def accuracies_from_metrics(metrics: dict[str, float], num_heads: int, max_k: int = 10) -> list[list[float]]:
    """Per-rank accuracies from training/eval metrics named `top{k}@{i}` (cumulative, i = 1..K)."""
    cumulative = []
    for i in range(1, num_heads + 1):
        row = [metrics[f"top{k}@{i}"] for k in range(1, max_k + 1) if f"top{k}@{i}" in metrics]
        if not row:
            raise KeyError(f"no top-k accuracy of head {i} (metric 'top1@{i}') in the metrics")
        cumulative.append(row)
    return rank_accuracies(cumulative)


def pass_time(n_tokens: int, pass_ms: dict[int, float] = CPU_PASS_MS) -> float:
    """Target pass time for n new tokens, linear between (and beyond) the measured points."""
    xs = sorted(pass_ms)
    if n_tokens <= xs[0]:
        return pass_ms[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if n_tokens <= hi:
            return pass_ms[lo] + (pass_ms[hi] - pass_ms[lo]) * (n_tokens - lo) / (hi - lo)
    lo, hi = xs[-2], xs[-1]
    return pass_ms[hi] + (pass_ms[hi] - pass_ms[lo]) * (n_tokens - hi) / (hi - lo)


def size_table(rank_accuracy: list[list[float]], max_depth: int, max_size: int = 96,
               pass_ms: dict[int, float] = CPU_PASS_MS, draft_ms: float = 0.0) -> list[dict]:
    """Per tree size n = 0..max_size: expected tau, cycle ms (pass of 1 + n tokens + `draft_ms`, the
    heads' fixed drafting cost) and the speedup over plain decoding tau x t(1) / cycle."""
    tree = best_tree(rank_accuracy, max_size, max_depth)  # nested: best tree of n = its n best nodes
    values = sorted((path_value(p, rank_accuracy) for p in tree), reverse=True)
    rows, tau = [], 1.0
    for n in range(len(values) + 1):
        if n:
            tau += values[n - 1]
        ms = pass_time(1 + n, pass_ms) + (draft_ms if n else 0.0)
        rows.append({"total_tokens": n, "tau": tau, "ms": ms, "speedup": tau * pass_time(1, pass_ms) / ms})
    return rows


def best_size(rank_accuracy: list[list[float]], max_depth: int, max_size: int = 96,
              pass_ms: dict[int, float] = CPU_PASS_MS, draft_ms: float = 0.0) -> int:
    """Tree size maximising tau x t(1) / (t(1 + size) + draft_ms) (draft_ms 0: the ideal speedup)."""
    best, best_n = 1.0, 0
    for row in size_table(rank_accuracy, max_depth, max_size, pass_ms, draft_ms)[1:]:
        if row["speedup"] > best:
            best, best_n = row["speedup"], row["total_tokens"]
    return best_n


def default_tree(num_heads: int, vocab_size: int, size: int = DEFAULT_TREE_SIZE,
                 max_depth: int = DEFAULT_TREE_DEPTH) -> list[Path]:
    """The prior-based tree (module docstring), limited to `num_heads` levels and the vocabulary."""
    prior = [row[: max(1, vocab_size)] for row in prior_accuracy(num_heads)]
    return best_tree(prior, size, max_depth)


def prior_accuracy(num_heads: int) -> list[list[float]]:
    """PRIOR_RANK_ACCURACY for any number of heads (later heads reuse the last factor, decayed)."""
    rows = []
    for i in range(num_heads):
        if i < len(_HEAD_FACTOR):
            f = _HEAD_FACTOR[i]
        else:
            f = _HEAD_FACTOR[-1] * 0.9 ** (i - len(_HEAD_FACTOR) + 1)
        rows.append([f * s for s in _RANK_SHARE])
    return rows


def check_paths(paths: Sequence[Sequence[int]], num_heads: int, vocab_size: int) -> list[Path]:
    """Validate a static tree: non-empty paths, depth <= num_heads, ranks inside the vocabulary,
    every path's prefix present (it is a tree), no duplicates. Returns sorted tuples."""
    tree = [tuple(int(k) for k in p) for p in paths]
    seen = set(tree)
    if len(seen) != len(tree):
        raise ValueError("the static tree lists a path twice")
    for p in tree:
        if not p:
            raise ValueError("a static tree path cannot be empty (the root is implicit)")
        if len(p) > num_heads:
            raise ValueError(f"path {p} is deeper than the drafter's {num_heads} heads")
        if min(p) < 0 or max(p) >= vocab_size:
            raise ValueError(f"path {p} uses a rank outside the vocabulary of {vocab_size}")
        if len(p) > 1 and p[:-1] not in seen:
            raise ValueError(f"path {p} has no parent {p[:-1]} in the tree")
    return sorted(tree, key=lambda p: (len(p), p))


def max_ranks(paths: Sequence[Path], num_heads: int) -> list[int]:
    """How many candidates each head must supply for these paths (0 for unused heads)."""
    need = [0] * num_heads
    for p in paths:
        for d, k in enumerate(p):
            need[d] = max(need[d], k + 1)
    return need


def build_draft_tree(paths: Sequence[Path], topk_tokens: torch.Tensor, topk_probs: torch.Tensor) -> DraftTree:
    """Fill a static tree with candidates.

    paths: sorted by (depth, path) as `check_paths` returns them (parents first).
    topk_tokens / topk_probs: [K, k] head i's candidates in rank order and their
    probabilities. Tokens are chosen deterministically, so q is None; draft_probs
    is the head's probability of the token.
    """
    tokens_l = topk_tokens.tolist()
    probs_l = topk_probs.float().tolist()
    index: dict[Path, int] = {}
    tokens, parents, probs = [], [], []
    for p in paths:
        d, k = len(p) - 1, p[-1]
        index[p] = len(tokens)
        tokens.append(tokens_l[d][k])
        parents.append(index[p[:-1]] if d else -1)
        probs.append(probs_l[d][k])
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                     torch.tensor(probs, dtype=torch.float32))


def static_tree_choice(method: str, curve: dict, tree_accuracy: list[list[float]] | None = None,
                       draft_ms: float | None = None, calibration: dict | None = None) -> dict:
    """The static (Medusa / Amphista) tree size with the best expected tokens/s under `curve`, from the
    per-rank accuracies of the shipped checkpoint (assets/drafters/<method>/config.json) unless given; the
    heads draft once per cycle whatever the tree, so drafting is a fixed cost per cycle (the benchmark
    summary's draft_ms_per_cycle, scaled to this machine, unless given). calibration: measured / predicted
    ratios from decoded cycles (core.trees.calibration.CycleLedger). Same keys as choose_tree."""
    raw, curve = curve, cost_curve.monotone(curve)
    one = cost_curve.pass_ms(curve, 1.0)
    out = {"method": method, "depth": None, "total_tokens": None, "expected_tau": 1.0,
           "expected_tokens_per_s": 1000.0 / one, "cycle_ms": one, "draft_ms_per_level": None, "acceptance": [],
           "acceptance_source": None, "curve": raw, "calibration": calibration, "grid": [],
           "model": "core.drafters.static_tree module docstring (best_tree / size_table)"}
    if tree_accuracy is None:
        try:
            cfg = json.loads((cost_curve.ROOT / "assets" / "drafters" / method / "config.json").read_text())["config"]
            tree_accuracy = cfg.get("tree_accuracy") or None
            heads = int(cfg.get("num_heads") or len(tree_accuracy or []))
        except (OSError, ValueError, KeyError, TypeError):
            tree_accuracy = None
        out["acceptance_source"] = f"assets/drafters/{method} tree_accuracy"
    else:
        heads = len(tree_accuracy)
        out["acceptance_source"] = "given tree_accuracy"
    if not tree_accuracy:
        out["acceptance_source"] = None
        return out
    if draft_ms is None:
        measured = method_acceptance(method)
        draft_ms = 0.0
        if measured and measured.get("draft_ms") and measured.get("verify_ms_1"):
            draft_ms = measured["draft_ms"] * one / measured["verify_ms_1"]
    depth = min(heads, len(tree_accuracy))
    passes = cost_curve.curve_pass_table(curve)
    table = size_table(tree_accuracy, depth, cost_curve.MAX_AUTO_TOKENS, passes, draft_ms)
    cal = calibration or {}
    rows = [calibrated_row(depth, r["total_tokens"], r["tau"], draft_ms if r["total_tokens"] else 0.0,
                           pass_time(1 + r["total_tokens"], passes), cal) for r in table]
    if cal:
        best = max(rows[1:], key=lambda r: (r["tokens_per_s"], -r["total_tokens"]))
        best_tau, best_ms = best["tau"], best["ms"]
    else:  # exactly the model's figures
        best = max(table[1:], key=lambda r: (r["speedup"], -r["total_tokens"]))
        best_tau, best_ms = best["tau"], best["ms"]
    paths = best_tree(tree_accuracy, best["total_tokens"], depth)
    out.update(depth=max(len(p) for p in paths), total_tokens=len(paths), expected_tau=round(best_tau, 4),
               expected_tokens_per_s=round(1000.0 * best_tau / best_ms, 3), cycle_ms=round(best_ms, 3),
               draft_ms_per_level=round(draft_ms, 3), grid=rows)
    return out


def auto_tree_choice(method: str, curve: dict) -> dict:
    """What `auto` picks for any method label under `curve`: Medusa / Amphista's static-tree size
    (`static_tree_choice`), else core.trees.choice.choose_tree's dynamic tree."""
    base = method.removesuffix("+lookup")
    if base in STATIC_TREE_METHODS:
        return static_tree_choice(base, curve)
    return choose_tree(base, curve=curve)


class StaticTreeMixin:
    """Static-tree handling for multi-head drafters (Medusa, Amphista) whose config has `num_heads`,
    `draft_vocab_size`, `tree_paths` and `tree_accuracy` (measured per-rank accuracies, empty = the
    prior). Also owns the heads' shared output layer: `self.vocab`, a `DraftVocab` over the target's
    frozen final norm + LM head, restricted to `draft_vocab_size` tokens (0 = the full vocabulary)."""

    def _init_vocab_and_tree(self, target: Target) -> None:
        cfg = self.config
        if not 0 <= cfg.draft_vocab_size <= target.vocab_size:
            raise ValueError(f"draft_vocab_size must lie in [0, {target.vocab_size}], got {cfg.draft_vocab_size}")
        self.vocab = DraftVocab(target, cfg.draft_vocab_size, cfg.context_vocab)
        if not cfg.tree_paths:
            cfg.tree_paths = [list(p) for p in default_tree(cfg.num_heads, self.vocab.size)]
        self._set_paths(cfg.tree_paths)

    def _set_paths(self, paths: Sequence[Sequence[int]]) -> None:
        self.tree_paths = check_paths(paths, self.config.num_heads, self.vocab.size)
        self.config.tree_paths = [list(p) for p in self.tree_paths]
        self._ranks = max_ranks(self.tree_paths, self.config.num_heads)
        # rows of the DraftTree are [root, paths...]; a row has children iff some path extends it
        parents = {p[:-1] for p in self.tree_paths}
        self._row_depth_with_children = [0 if () in parents else None] + [
            len(p) if p in parents else None for p in self.tree_paths]

    def rank_accuracy(self) -> list[list[float]]:
        acc = self.config.tree_accuracy or prior_accuracy(self.config.num_heads)
        return [row[: self.vocab.size] for row in acc]

    def lm_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head over the drafting vocabulary, in the target's dtype (the drafter may
        train in another): float32 logits [..., vocab.size]; index j is token `vocab.to_token_ids(j)`."""
        return self.vocab.logits(x.to(self.target.dtype))

    def resolve_auto_static_tree(self, target: Target) -> dict | None:
        """`auto` tree (the default): resize the tree once for this machine's cost curve (core.trees.cost_curve;
        cached per machine, the fixed model on the tiny test target) from the checkpoint's measured per-rank
        accuracies. Untrained drafters and checkpoints without measured accuracies keep their tree; so does a
        tree the user fixed (set_options). The choice is kept as `tree_choice` for the app."""
        if not getattr(self, "tree_auto", False) or getattr(self, "tree_choice", None) is not None:
            return getattr(self, "tree_choice", None)
        if getattr(self, "checkpoint_meta", None) is None or not self.config.tree_accuracy:
            self.tree_choice = {"method": self.name, "depth": None, "total_tokens": None,
                                "note": "no measured accuracies: configured tree kept"}
            return self.tree_choice
        acc = self.rank_accuracy()
        choice = static_tree_choice(self.name, cost_curve.curve_for(target), acc)
        if choice["total_tokens"] is None:
            return None
        choice["acceptance_source"] = "checkpoint tree_accuracy (per-rank, per head)"
        self._set_paths(best_tree(acc, choice["total_tokens"], min(self.config.num_heads, len(acc))))
        self.tree_choice = choice
        self.tree_ledger = CycleLedger() if calibration_enabled(target) else None
        return self.tree_choice

    def observe(self, event) -> None:
        """Book one decoded cycle of an `auto` tree against its predicted figures; every CALIBRATE_AFTER cycles
        size the tree again from measured / predicted ratios (core.trees.calibration)."""
        choice, ledger = getattr(self, "tree_choice", None), getattr(self, "tree_ledger", None)
        if ledger is None or not choice or choice.get("total_tokens") is None or not self.tree_auto:
            return
        ratios = ledger.book(grid_row(choice, None, len(self.tree_paths)), event)
        if ratios is None:
            return
        acc = self.rank_accuracy()
        new = static_tree_choice(self.name, choice["curve"], acc, calibration=ratios)
        if new["total_tokens"] is None:
            return
        new["acceptance_source"] = choice.get("acceptance_source")
        new = keep_or_move(choice, new, match_depth=False)
        if new["total_tokens"] != len(self.tree_paths):
            self._set_paths(best_tree(acc, new["total_tokens"], min(self.config.num_heads, len(acc))))
        self.tree_choice = new

    def set_options(self, **opts) -> None:
        """Tree options: `tree_paths` (explicit paths), or `tree_size` / `tree_depth` (rebuilt from the
        checkpoint's measured accuracies, or the prior if it has none); `tree_size="auto"`: sized for this
        machine on the next begin (the default). Any explicit option fixes the tree."""
        unknown = set(opts) - {"tree_paths", "tree_size", "tree_depth"}
        if unknown:
            raise ValueError(f"{self.name} has no option(s) {sorted(unknown)}; "
                             f"it takes tree_paths, tree_size, tree_depth")
        if opts.get("tree_size") == "auto" and opts.get("tree_paths") is None and opts.get("tree_depth") is None:
            self.tree_auto, self.tree_choice = True, None
            return
        if any(opts.get(k) is not None for k in ("tree_paths", "tree_size", "tree_depth")):
            self.tree_auto, self.tree_choice = False, None
        if opts.get("tree_paths") is not None:
            self._set_paths(opts["tree_paths"])
        elif opts.get("tree_size") is not None or opts.get("tree_depth") is not None:
            size = opts.get("tree_size") or len(self.tree_paths)
            depth = opts.get("tree_depth") or max(len(p) for p in self.tree_paths)
            if int(size) < 1 or int(depth) < 1:
                raise ValueError(f"tree_size and tree_depth must be positive, got {size}, {depth}")
            self._set_paths(best_tree(self.rank_accuracy(), int(size), int(depth)))

    def set_tree_from_metrics(self, metrics: dict[str, float], size: int | None = None,
                              max_depth: int = DEFAULT_TREE_DEPTH) -> list[Path]:
        """After training: store measured per-rank accuracies and the best tree they give.

        size None picks the size with the best ideal speedup on this CPU (`best_size`).
        """
        acc = accuracies_from_metrics(metrics, self.config.num_heads)
        self.config.tree_accuracy = [[round(a, 6) for a in row] for row in acc]
        acc = self.rank_accuracy()
        if size is None:
            size = max(1, best_size(acc, max_depth))
        self._set_paths(best_tree(acc, size, max_depth))
        return self.tree_paths

    def tree_from_logits(self, head_logits: torch.Tensor) -> DraftTree:
        """Draft tree from the heads' logits [K, V'] over the drafting vocabulary: each head's top
        candidates in the static shape. extras["draft_top"]: per row [root, nodes...], the top
        TOP_EXTRAS [token_id, prob] of the head that drafts the row's children ([] for leaves)."""
        k = max(self._ranks)
        if k == 0:
            tree = DraftTree.empty()
            tree.extras = {"draft_top": [[]]}
            return tree
        probs = torch.softmax(head_logits.float(), dim=-1)
        top_p, top_i = probs.topk(min(max(k, TOP_EXTRAS), probs.shape[-1]), dim=-1)
        top_i = self.vocab.to_token_ids(top_i).cpu()
        top_p = top_p.cpu()
        tree = build_draft_tree(self.tree_paths, top_i[:, :k], top_p[:, :k])
        heads = [list(zip(t, (round(p, 5) for p in q))) for t, q in
                 zip(top_i[:, :TOP_EXTRAS].tolist(), top_p[:, :TOP_EXTRAS].tolist())]
        tree.extras = {"draft_top": [[list(tp) for tp in heads[d]] if d is not None else []
                                     for d in self._row_depth_with_children]}
        return tree
