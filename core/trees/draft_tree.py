"""Draft trees: the structure every drafter hands to the verifier (docs/ARCHITECTURE.md, "Decode loop").

A tree hangs off the *root*, the last token the target produced and that has
not yet been through a target forward pass. Node i has a token, a parent
(-1 = the root; parents always come before their children), and the drafter's
probability of that token at its parent. A chain is a tree where node i's
parent is i - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [n] long
    parents: torch.Tensor  # [n] long, -1 for children of the root
    draft_probs: torch.Tensor  # [n] float: drafter's probability of the token at its parent
    # Drafter distribution each node was *sampled* from ([n, V]); None when the tokens were
    # chosen deterministically (top-k, n-gram lookup, static trees). Verification math differs.
    q: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)  # drafter tensors for instrumentation

    def __post_init__(self) -> None:
        n = self.tokens.numel()
        if self.parents.numel() != n or self.draft_probs.numel() != n:
            raise ValueError("tokens, parents and draft_probs must have one entry per node")
        if n and bool((self.parents >= torch.arange(n)).any()):
            raise ValueError("every parent must come before its child")

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> DraftTree:
        z = torch.zeros(0, dtype=torch.long, device=device)
        return DraftTree(z, z.clone(), torch.zeros(0, device=device))

    @staticmethod
    def chain(tokens: torch.Tensor | list[int], probs: torch.Tensor | None = None,
              q: torch.Tensor | None = None) -> DraftTree:
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        n = tokens.numel()
        parents = torch.arange(n, dtype=torch.long) - 1
        probs = torch.ones(n) if probs is None else probs.float()
        return DraftTree(tokens, parents, probs, q)

    def __len__(self) -> int:
        return self.tokens.numel()

    def depths(self) -> torch.Tensor:
        """Depth of each node: 1 for children of the root."""
        d = torch.zeros(len(self), dtype=torch.long)
        par = self.parents.tolist()
        for i, p in enumerate(par):
            d[i] = 1 if p < 0 else d[p] + 1
        return d

    def attention_mask(self) -> torch.Tensor:
        """bool [n+1, n+1] over [root, nodes...]: each sees itself, its ancestors and the root."""
        n = len(self)
        m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        m[:, 0] = True
        m[0, 0] = True
        par = self.parents.tolist()
        for i, p in enumerate(par):
            row = i + 1
            if p >= 0:
                m[row] = m[p + 1]
            m[row, row] = True
        return m

    def children(self) -> list[list[int]]:
        """children()[0] are the root's children; children()[i + 1] are node i's (node indices)."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents.tolist()):
            kids[p + 1].append(i)
        return kids

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        par = self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = par[node]
        return path[::-1]

    def to_dict(self) -> dict:
        return {"tokens": self.tokens.tolist(), "parents": self.parents.tolist(),
                "draft_probs": [round(float(p), 5) for p in self.draft_probs]}
