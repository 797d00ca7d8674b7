"""EAGLE-2's dynamic draft tree (docs/ARCHITECTURE.md, "Draft trees"), shared by the EAGLE-2 and MoA drafters.

The tree grows level by level from the root, guided by the drafter's own
confidence, measured as the cumulative log-probability of a node's path:

    level 1:   the root's top_k tokens                    -> candidates, and the first frontier
    level d:   each frontier node is run through the drafter ("expanded") and proposes its
               top_k tokens -> top_k * top_k candidates; the best top_k of them become the
               next frontier
    finally:   rerank every candidate of every level and keep the best total_tokens
               (so the last level expands only the frontier nodes that can have a kept child)

A child's score is its parent's score plus a log-probability (<= 0), so it never
beats its parent; ties are broken by depth, so parents always rank first and the
kept set is a tree.

The drafter provides one callback, `expand(Expansion) -> log-probs [m, V']`, that
runs it one level deeper for a batch of frontier nodes. V' may be a reduced drafting
vocabulary (core.drafters.draft_vocab): `token_ids` maps its indices to token ids.
Each expanded node gets a *slot*: slots are numbered in expansion order, which is the order in which the
drafter appends the nodes to its own KV cache after its verified prefix (and, for
drafters that put the root there too, after the root). `Expansion.mask` says which
slots each new node may attend to (its expanded ancestors and itself), so the
drafter builds its tree attention mask without tracking the tree itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.trees.draft_tree import DraftTree

# Defaults, sized for this CPU (2 shared cores, bf16 SmolLM2-135M target): one target pass costs
# ~55 ms for 1 new token and ~60-100 ms for 32 (measured under the shared load), so every verified
# node has a price, and each tree level costs the drafter one pass (its vocabulary projection
# dominates: ~9 ms per level over the full 49,152 tokens). Accepted lengths rarely pass 4-5 for a
# small drafter, so a 6th level and nodes 25-32 mostly buy verify and drafting time that is never
# repaid. The published GPU settings (60 nodes, depth 5-7, top_k 8-10) pay for a wider tree only
# where a verify pass is nearly free.
DEFAULT_DEPTH = 5  # deepest drafted node; the drafter runs `depth` passes per cycle (root + depth - 1 levels)
DEFAULT_TOP_K = 8  # branching at each expansion and the frontier width, as in EAGLE-2's smaller setting
DEFAULT_TOTAL_TOKENS = 24  # nodes sent to the target
DRAFT_TOP = 10  # entries per row of extras["draft_top"]


@dataclass
class Expansion:
    """A batch of frontier nodes the drafter must run one level deeper (m nodes, E slots after this batch)."""

    tokens: torch.Tensor  # [m] long: the nodes' tokens
    depths: torch.Tensor  # [m] long: 1 for children of the root
    parent_slots: torch.Tensor  # [m] long: slot of each node's parent, -1 for the root
    mask: torch.Tensor  # bool [m, E]: slots each node may attend to (ancestors + itself); this batch is last
    first_slot: int  # slot of the batch's first node (the batch fills first_slot .. E - 1)


ExpandFn = Callable[[Expansion], torch.Tensor]


def check_tree_settings(depth: int, top_k: int, total_tokens: int) -> None:
    for name, value in (("depth", depth), ("top_k", top_k), ("total_tokens", total_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"tree setting {name} must be a positive integer, got {value!r}")


def build_dynamic_tree(
    root_logprobs: torch.Tensor,
    expand: ExpandFn,
    depth: int = DEFAULT_DEPTH,
    top_k: int = DEFAULT_TOP_K,
    total_tokens: int = DEFAULT_TOTAL_TOKENS,
    token_ids: torch.Tensor | None = None,
    record_top: bool = False,
    prune: bool = True,
) -> DraftTree:
    """Grow an EAGLE-2 dynamic tree from the drafter's log-probs at the root.

    root_logprobs: [V'], the drafter's log-distribution of the token after the root.
    expand: runs the drafter on a batch of frontier nodes, returns their children's log-probs [m, V'].
    depth: deepest level drafted (so `expand` is called depth - 1 times).
    top_k: children per expanded node and frontier width.
    total_tokens: nodes kept after the final rerank (fewer if fewer candidates exist).
    token_ids: [V'] long, the token id of each log-prob index (None: index = token id).
    record_top: also return, in extras["draft_top"], one list per tree row [root, nodes...] of the
        drafter's DRAFT_TOP most likely [token_id, prob] pairs there (empty for rows never expanded).
    prune: at the last level, expand only the frontier nodes that can have a kept child (the same tree,
        fewer drafter rows: a 6-node tree of depth 2 expands 5 nodes instead of top_k); False expands the
        whole frontier, as EAGLE-2's reference code does.
    Returns a DraftTree with parents before children, draft_probs = the drafter's probability
    of each token at its parent, q = None (tokens are chosen deterministically).
    """
    check_tree_settings(depth, top_k, total_tokens)
    k = min(top_k, root_logprobs.numel())
    # Candidate table (python lists: a few hundred entries at most).
    tokens: list[int] = []
    parents: list[int] = []  # candidate index, -1 = root
    logps: list[float] = []  # log-prob at the parent
    scores: list[float] = []  # cumulative log-prob of the path
    levels: list[int] = []
    slot_of: dict[int, int] = {}  # expanded candidate -> slot
    slot_rows: list[list[bool]] = []  # per slot: which earlier slots (and itself) it sees

    tops: dict[int, list] = {}  # candidate (-1 = root) -> its children's distribution's top entries

    def ids(index: torch.Tensor) -> torch.Tensor:
        return index if token_ids is None else token_ids[index]

    def top_rows(v: torch.Tensor, i: torch.Tensor) -> list[list[list]]:  # sorted top log-probs, indices [m, n]
        v, i = v[:, :DRAFT_TOP], i[:, :DRAFT_TOP]
        return [[[t, p] for t, p in zip(tr, pr)] for tr, pr in zip(ids(i).tolist(), v.exp().tolist())]

    def add(toks: list[int], lps: list[float], parent: int, base: float, level: int) -> list[int]:
        start = len(tokens)
        for t, v in zip(toks, lps):
            tokens.append(t)
            parents.append(parent)
            logps.append(v)
            scores.append(base + v)
            levels.append(level)
        return list(range(start, len(tokens)))

    n_top = max(top_k, DRAFT_TOP) if record_top else top_k  # one topk serves the tree and draft_top
    top_lp, top_tok = root_logprobs.float().topk(min(n_top, root_logprobs.numel()))
    if record_top:
        tops[-1] = top_rows(top_lp[None], top_tok[None])[0]
    top_lp, top_tok = top_lp[:k], top_tok[:k]
    frontier = add(ids(top_tok).tolist(), top_lp.double().tolist(), -1, 0.0, 1)
    for level in range(2, depth + 1):
        if prune and level == depth:
            # The last expansion. Whatever ranks above a parent ranks above its children, so keeping a child
            # of the frontier's i-th node (best first) needs the i - 1 better frontier nodes, the parent's
            # level - 2 ancestors, the parent and itself: i + level - 1 <= total_tokens. Nodes past that would be run
            # for children the rerank always drops; skipping them leaves the tree exactly as it was.
            frontier = frontier[:max(0, total_tokens - (level - 1))]
            if not frontier:
                break
        first = len(slot_rows)
        for c in frontier:
            par = parents[c]
            row = list(slot_rows[slot_of[par]]) if par >= 0 else []  # the parent's ancestors and itself
            row += [False] * (len(slot_rows) - len(row))
            slot_of[c] = len(slot_rows)
            slot_rows.append(row + [True])
        n_slots = len(slot_rows)
        mask = torch.tensor([slot_rows[slot_of[c]] + [False] * (n_slots - len(slot_rows[slot_of[c]]))
                             for c in frontier], dtype=torch.bool)  # one tensor per level, not one per node
        batch = Expansion(
            tokens=torch.tensor([tokens[c] for c in frontier], dtype=torch.long),
            depths=torch.tensor([levels[c] for c in frontier], dtype=torch.long),
            parent_slots=torch.tensor([slot_of.get(parents[c], -1) for c in frontier], dtype=torch.long),
            mask=mask,
            first_slot=first,
        )
        child_lp = expand(batch).float()
        kk = min(top_k, child_lp.shape[-1])
        lp, tok = child_lp.topk(min(n_top, child_lp.shape[-1]), dim=-1)
        if record_top:
            tops.update(zip(frontier, top_rows(lp, tok)))
        lp, tok = lp[:, :kk], tok[:, :kk]  # [m, kk]
        tok_rows, lp_rows = ids(tok).tolist(), lp.double().tolist()  # two conversions per level, not per node
        new: list[int] = []
        for i, c in enumerate(frontier):
            new += add(tok_rows[i], lp_rows[i], c, scores[c], level)
        # next frontier: the best top_k new candidates (ties: earlier candidate first)
        new.sort(key=lambda c: (-scores[c], c))
        frontier = new[:top_k]
    return _rerank(tokens, parents, logps, scores, levels, total_tokens, tops if record_top else None)


def _rerank(tokens: list[int], parents: list[int], logps: list[float], scores: list[float], levels: list[int],
            total_tokens: int, tops: dict[int, list] | None = None) -> DraftTree:
    """Keep the best `total_tokens` candidates (parents win ties) and re-index them parents-first."""
    order = sorted(range(len(tokens)), key=lambda c: (-scores[c], levels[c], c))
    kept = sorted(c for c in order[:total_tokens] if scores[c] > float("-inf"))
    index = {c: i for i, c in enumerate(kept)}  # candidates were created parents-first, so this order is too
    new_parents = []
    for c in kept:
        p = parents[c]
        if p >= 0 and p not in index:  # cannot happen: a child never outscores its parent
            raise RuntimeError("dynamic tree rerank dropped a parent of a kept node")
        new_parents.append(index[p] if p >= 0 else -1)
    tree = DraftTree(
        tokens=torch.tensor([tokens[c] for c in kept], dtype=torch.long),
        parents=torch.tensor(new_parents, dtype=torch.long),
        draft_probs=torch.tensor([logps[c] for c in kept], dtype=torch.float64).exp().float(),
        q=None,
    )
    if tops is not None:
        tree.extras["draft_top"] = [tops.get(c, []) for c in [-1] + kept]
    return tree
