"""A context-lookup branch grafted onto any drafter's tree: method label `<method>+lookup`.

Not part of either paper; an opt-in experiment that the copying analysis
(analysis.copying) motivates: on the evaluation prompts about half of all
verification cycles offer a prompt-lookup continuation (PLD's rule, suffix of
2-3 tokens), it is right about 80% of the time, and the trained drafters' own
first token is accepted on only about two thirds of those cycles. Here the lookup's
chain is merged into the drafter's tree each cycle: it follows the drafter's nodes
while their tokens agree and hangs the rest of the chain off the last shared node.

Verification is unchanged and stays lossless: the merged tree is deterministic
(top-k / static tree plus a lookup), which greedy and sampling verification both
handle exactly (core.verify). A drafter that *samples* its tree (tree.q set) gets
no branch, because one tree cannot mix sampled and deterministic siblings.
The inner drafter never sees the extra nodes: every drafter learns what was
accepted from the verified tokens, not from node indices.
"""

from __future__ import annotations

import torch

from core.drafters.base import Drafter, Verified
from core.drafters.pld import PromptLookupDrafter
from core.target import Target
from core.trees.draft_tree import DraftTree

SUFFIX = "+lookup"
LOOKUP_TOKENS = 6  # longest grafted chain: each extra node costs verify time


def merge_chain(tree: DraftTree, chain: list[int]) -> tuple[DraftTree, int]:
    """`tree` with `chain` grafted under the root (shared prefix reused); returns (tree, nodes added)."""
    children = tree.children()
    tokens = tree.tokens.tolist()
    node, i = -1, 0
    while i < len(chain):
        nxt = next((c for c in children[node + 1] if tokens[c] == chain[i]), None)
        if nxt is None:
            break
        node, i = nxt, i + 1
    rest = chain[i:]
    if not rest:
        return tree, 0
    n = len(tree)
    parents = [node] + list(range(n, n + len(rest) - 1))
    extras = dict(tree.extras)
    top = extras.get("draft_top")
    if isinstance(top, list) and len(top) == n + 1:
        extras["draft_top"] = top + [[] for _ in rest]
    extras["lookup_nodes"] = list(range(n, n + len(rest)))
    merged = DraftTree(
        torch.cat([tree.tokens.cpu(), torch.tensor(rest, dtype=torch.long)]),
        torch.cat([tree.parents.cpu(), torch.tensor(parents, dtype=torch.long)]),
        torch.cat([tree.draft_probs.float().cpu(), torch.ones(len(rest))]),
        None, extras)
    return merged, len(rest)


class LookupBranch(Drafter):
    """Wraps a drafter; its trees gain the context lookup's chain."""

    def __init__(self, inner: Drafter, max_tokens: int = LOOKUP_TOKENS, min_ngram: int = 2) -> None:
        self.inner = inner
        self.name = inner.name + SUFFIX
        self.needs = inner.needs
        self.lookup = PromptLookupDrafter(max_ngram=3, min_ngram=min_ngram, num_draft_tokens=max_tokens)

    def begin(self, target: Target, prefill: Verified) -> None:
        super().begin(target, prefill)
        self.inner.begin(target, prefill)

    def accept(self, step: Verified) -> None:
        super().accept(step)
        self.inner.accept(step)

    def check_target(self, target: Target) -> None:
        self.inner.check_target(target)

    def draft(self, root: int) -> DraftTree:
        tree = self.inner.draft(root)
        if tree.q is not None:
            return tree
        self.lookup.context = self.context
        chain = self.lookup.draft(root).tokens.tolist()
        return merge_chain(tree, chain)[0] if chain else tree

    def __getattr__(self, name: str):  # options, configs and instrumentation of the wrapped drafter
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
