"""The interface every drafter implements, and what the decode loop tells it.

A drafting cycle (docs/ARCHITECTURE.md, "Decode loop"):

1. `begin(target, prompt_ids, prefill)` once, after the target has read the prompt.
2. `draft(root_token)` proposes a `DraftTree` hanging off the root (the last
   token the target produced, not yet run through the target).
3. The target verifies the tree; `accept(step)` then tells the drafter which
   nodes were accepted, the bonus token, and the target's hidden states /
   per-layer keys and values at the verified positions (root + accepted nodes).

`needs` says which target tensors the drafter wants from each verify pass, so
drafters that need none (plain decoding, prompt lookup) cost nothing extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from core.target import Target, TargetOutput
from core.trees.draft_tree import DraftTree


@dataclass(frozen=True)
class TargetNeeds:
    hidden_layers: tuple[int, ...] = ()  # residual indices (see core.target); L = last feature
    layer_kv: bool = False


@dataclass
class Verified:
    """What the target established in one pass, restricted to the verified rows.

    For the prefill, `tokens` is the whole prompt; for a cycle it is the root
    followed by the accepted draft tokens. `hidden` / `layer_kv` hold one row per
    entry of `tokens`, at positions start_position, start_position + 1, ...
    `bonus` is the target's next token: the root of the next tree.
    """

    tokens: list[int]
    bonus: int
    start_position: int
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # residual index -> [len(tokens), H]
    layer_kv: torch.Tensor | None = None  # [len(tokens), L, 2 * kv_heads * head_dim]
    tree: DraftTree | None = None  # the tree that was verified (None for the prefill)
    accepted: list[int] = field(default_factory=list)  # accepted node indices, root's child first


def select_rows(out: TargetOutput, rows: torch.Tensor) -> tuple[dict[int, torch.Tensor], torch.Tensor | None]:
    """Keep only the given rows (positions in the pass) of hidden states / layer KV, batch 1."""
    hidden = {k: v[0, rows] for k, v in out.hidden.items()}
    kv = out.layer_kv[0, rows] if out.layer_kv is not None else None
    return hidden, kv


class Drafter:
    """Base class: the do-nothing drafter, i.e. plain autoregressive decoding.

    Subclasses keep whatever state they need; `context` (every verified token so
    far, prompt included) is kept here because most drafters want it.
    """

    name = "ar"
    needs = TargetNeeds()

    def begin(self, target: Target, prefill: Verified) -> None:
        self.target = target
        self.context: list[int] = list(prefill.tokens)

    def draft(self, root: int) -> DraftTree:
        return DraftTree.empty()

    def accept(self, step: Verified) -> None:
        self.context.extend(step.tokens)

    def observe(self, event) -> None:
        """One decoded cycle with its timings (a core.decoding.StepEvent), after `accept`: drafters with an
        `auto` tree calibrate it from these (core.trees.calibration.CycleLedger); the rest ignore it."""

    def check_target(self, target: Target) -> None:
        """Raise if this drafter was built for another target (trained drafters override)."""


class Autoregressive(Drafter):
    """Plain decoding: an empty tree every cycle, so each target pass yields one token."""
