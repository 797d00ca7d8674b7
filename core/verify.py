"""Verification of a draft tree against the target's logits (docs/ARCHITECTURE.md, "Decode loop").

Greedy: walk down from the root, at each node follow the child whose token is
the target's argmax; stop when none matches and emit the argmax as the bonus.

Sampling, lossless in both cases:

* Deterministic drafts (q is None: top-k trees, n-gram lookup, static trees).
  The drafted tokens carry no probability mass of their own, so the maximal
  coupling is simply: draw x from the target's distribution p at the node; if
  some child holds x, descend into it, else x is the bonus token. Each emitted
  token is an exact draw from p, so the output distribution is the target's.
* Sampled drafts (q given: each child was drawn i.i.d. from the drafter's q at
  its parent). Recursive rejection sampling over siblings (SpecInfer):
  accept child c with probability min(1, p(c) / q(c)); on rejection replace p
  by norm(max(0, p - q)) and try the next sibling; if all are rejected, sample
  the bonus from the last residual. For a chain this is the classic rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.trees.draft_tree import DraftTree


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature <= 10.0):
            raise ValueError(f"temperature must be between 0 and 10, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution decoding samples from: temperature, then nucleus (top-p) filtering."""
    logits = logits.float()
    if cfg.greedy:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    probs = torch.softmax(logits / cfg.temperature, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = (cum - sorted_p) >= cfg.top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool) -> int:
    if greedy:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_tree(
    tree: DraftTree,
    logits: torch.Tensor,
    cfg: SamplingConfig,
    generator: torch.Generator | None = None,
    one_read: bool = False,
) -> tuple[list[int], int]:
    """Accept a path of `tree` given target logits [n+1, V] over [root, nodes...].

    Returns (accepted node indices from the root down, bonus token). Greedy verification reads the argmax of
    every row in one go on a GPU (or with `one_read`), row by row on a CPU.
    """
    children = tree.children()
    tokens = tree.tokens.tolist()
    path: list[int] = []
    row = 0  # logits row of the current node (0 = root)
    if cfg.greedy and (logits.device.type != "cpu" or one_read):
        # On a GPU each row's argmax read back is a wait for the device: read every row's at once (the same
        # tokens as row by row; on a CPU the row-by-row walk reads fewer rows of a large tree)
        best = logits.float().argmax(-1).tolist()
        while (nxt := next((c for c in children[row] if tokens[c] == best[row]), None)) is not None:
            path.append(nxt)
            row = nxt + 1
        return path, best[row]
    while True:
        p = target_probs(logits[row], cfg)
        kids = children[row]
        if tree.q is None or cfg.greedy:
            x = sample(p, generator, cfg.greedy)
            nxt = next((c for c in kids if tokens[c] == x), None)
            if nxt is None:
                return path, x
        else:
            nxt = None
            for c in kids:
                q = tree.q[c].float().to(p.device)
                tok = tokens[c]
                ratio = p[tok] / q[tok].clamp_min(1e-20)
                u = torch.rand((), generator=generator, device=p.device)
                if u < ratio.clamp(max=1.0):
                    nxt = c
                    break
                residual = (p - q).clamp_min(0.0)
                total = residual.sum()
                # p == q leaves nothing to correct; p stays as it is (no sibling can be rejected then)
                p = residual / total if total > 0 else p
            if nxt is None:
                return path, sample(p, generator, False)
        path.append(nxt)
        row = nxt + 1
