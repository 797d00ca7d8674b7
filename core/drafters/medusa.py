"""Medusa-1: K residual heads on the target's last feature, verified as a static tree (docs/ARCHITECTURE.md, "Medusa").

The target's feature at the last verified position t (hidden[L], before the
final norm) already predicts token t+1 through the LM head: that is the root
of the tree, the bonus token of the last verification. Head i maps the same
feature to a state from which the LM head predicts token t+2+i:

    state_i = ResBlock_i^n(feature),  ResBlock(x) = x + SiLU(W x + b)
    logits_i = LM_head(final_norm(state_i))

Choices and deviations (docs/ARCHITECTURE.md, "Medusa"):

* The vocabulary projection is the target's frozen final norm + LM head,
  shared by every head. Medusa-1 gives each head its own (trainable) copy of
  the LM head; sharing keeps checkpoints at K x n x (H^2 + H) parameters.
  With `draft_vocab_size` > 0 the heads project onto only that many frequent
  tokens (core/drafters/draft_vocab.py: on the CPU the K vocabulary
  projections dominate drafting and training time); labels outside that set
  add no loss but count as misses in the accuracy metrics.
* W and b are zero-initialised (Medusa's choice; Medusa keeps a default bias,
  we zero it too), so a freshly built Medusa is the LM head itself and every
  head proposes the root's own prediction. `random()` therefore perturbs the
  zero-initialised weights with small Gaussian noise (std `noise / sqrt(fan_in)`),
  so that "random" drafters have heads that disagree and seeds that differ.
* At inference the K heads run batched (`trained.StackedHeads`, built at begin()): one
  matmul per ResBlock depth for all heads instead of K, the same arithmetic.
* The published Medusa layout (FasterDecoding/Medusa, converted by core.drafters.published_formats) is
  covered by two config flags, both off for our own drafters so that shipped checkpoints are unchanged:
  `normed_input` (the heads read the target's *post-norm* state, as Medusa's `outputs[0]`, and their
  states go to the vocabulary projection without another norm: logits_i = P_i(ResBlock_i^n(norm(feature))))
  and `own_lm_heads` (Medusa-1: each head has its own Linear(H, V, bias=False) as P_i, in `lm_heads`;
  without it P_i is the target's frozen LM head, Medusa's "version 2" heads). Heads with their own LM
  heads draft over the full vocabulary and are not trained here.
* Loss: cross-entropy of head i against hard labels 2+i tokens ahead, weighted
  0.8^i, where loss_mask marks answer tokens. The label is the target's own
  argmax for that position given the data's tokens before it
  (`TrainBatch.greedy_next`): exactly what greedy verification accepts. On the
  greedy answers it is the data's token; on the share sampled at temperature
  0.7 it is not always, and a sampled label would teach the heads a token that
  greedy verification rejects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from core.drafters.base import TargetNeeds, Verified
from core.drafters.static_tree import StaticTreeMixin
from core.drafters.trained import (
    DrafterConfig,
    ResBlock,
    StackedHeads,
    TrainBatch,
    TrainedDrafter,
    deepen_heads,
    multi_head_loss,
    perturb,
)
from core.target import Target
from core.trees.draft_tree import DraftTree


@dataclass
class MedusaConfig(DrafterConfig):
    num_heads: int = 4
    num_layers_per_head: int = 1
    draft_vocab_size: int = 0  # heads project onto this many frequent tokens (draft_vocab.py); 0 = all
    context_vocab: bool = True  # the conversation's own tokens join that vocabulary (draft_vocab.py)
    tree_paths: list[list[int]] = field(default_factory=list)  # empty = static_tree.default_tree
    tree_accuracy: list[list[float]] = field(default_factory=list)  # measured per-rank accuracy per head
    # The published Medusa layout (module docstring; set by core.drafters.published_formats):
    normed_input: bool = False  # heads read the target's post-norm state; no final norm after them
    own_lm_heads: bool = False  # Medusa-1: a Linear(H, V, bias=False) per head instead of the target's LM head

    RANGES: ClassVar[dict] = {
        **{k: ("an integer >= 1", lambda v: v >= 1) for k in ("num_heads", "num_layers_per_head")},
    }


class MedusaDrafter(StaticTreeMixin, TrainedDrafter):
    name = "medusa"
    config_class = MedusaConfig
    random_options = ("tree_size", "tree_depth")
    growable = ("num_layers_per_head",)

    def __init__(self, config: MedusaConfig, target: Target) -> None:
        super().__init__(config, target)
        if config.num_heads < 1 or config.num_layers_per_head < 1:
            raise ValueError("medusa needs num_heads >= 1 and num_layers_per_head >= 1")
        h = config.hidden_size
        self.heads = torch.nn.ModuleList(
            torch.nn.Sequential(*[ResBlock(h) for _ in range(config.num_layers_per_head)])
            for _ in range(config.num_heads))
        self.lm_heads: torch.nn.ModuleList | None = None
        if config.own_lm_heads:
            if config.draft_vocab_size:
                raise ValueError("own_lm_heads (per-head LM heads, the published Medusa-1 layout) drafts over the "
                                 f"full vocabulary: draft_vocab_size must be 0, got {config.draft_vocab_size}")
            self.lm_heads = torch.nn.ModuleList(torch.nn.Linear(h, config.vocab_size, bias=False)
                                                for _ in range(config.num_heads))
        self.needs = TargetNeeds(hidden_layers=(config.n_target_layers,))
        self._init_vocab_and_tree(target)
        if config.normed_input:
            self.vocab.normed = True  # the heads' states are in post-norm units: no final norm before the LM head
        self.feature: torch.Tensor | None = None
        self._stacked: StackedHeads | None = None
        self.tree_auto = True  # tree sized for this machine (StaticTreeMixin.resolve_auto_static_tree)
        self.tree_choice: dict | None = None

    @classmethod
    def random(cls, target: Target, seed: int = 0, noise: float = 0.5, **hyper: Any) -> MedusaDrafter:
        """Random heads: zero-initialised W and b plus N(0, (noise/sqrt(H))^2) noise (module docstring)."""
        tree_opts = {k: hyper.pop(k) for k in cls.random_options if k in hyper}
        model = super().random(target, seed, **hyper)
        perturb([p for blocks in model.heads for p in blocks.parameters()], noise, seed)
        if tree_opts:
            model.set_options(**tree_opts)
        return model

    def grow(self, num_layers_per_head: int | None = None) -> None:
        deepen_heads(self, num_layers_per_head)

    def input_feature(self, feature: torch.Tensor) -> torch.Tensor:
        """The target's feature hidden[L] (pre-norm) as the heads read it: final-normed under `normed_input`."""
        return self.target.final_norm(feature) if self.config.normed_input else feature

    def head_states(self, feature: torch.Tensor) -> torch.Tensor:
        """feature [..., H] (the target's, pre-norm) -> head states [..., K, H] (before the vocabulary
        projection: the final norm and LM head, or the heads' own LM heads)."""
        feature = self.to_drafter_units(self.input_feature(feature).to(self.heads[0][0].linear.weight.dtype))
        return self.to_target_units(torch.stack([head(feature) for head in self.heads], dim=-2))

    def head_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """feature [..., H] -> float32 logits [..., K, V'] over the drafting vocabulary (`self.vocab`)."""
        return self.lm_logits(self.head_states(feature))

    def lm_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Head states [..., K, H] -> float32 logits [..., K, V']: the shared projection (StaticTreeMixin), or
        under `own_lm_heads` head i's own LM head on row i (the full vocabulary)."""
        if self.lm_heads is None:
            return super().lm_logits(x)
        dtype = self.lm_heads[0].weight.dtype
        return torch.stack([F.linear(x[..., i, :].to(dtype), head.weight) for i, head in enumerate(self.lm_heads)],
                           dim=-2).float()

    # ----- decoding ----------------------------------------------------------------------
    def begin(self, target: Target, prefill: Verified) -> None:
        super().begin(target, prefill)
        self.resolve_auto_static_tree(target)
        self._stacked = StackedHeads.of(self.heads)  # inference: the heads batched (weights may have changed)
        self.feature = prefill.hidden[self.config.n_target_layers][-1]

    def accept(self, step: Verified) -> None:
        super().accept(step)
        self.feature = step.hidden[self.config.n_target_layers][-1]

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        """head_logits(feature), with the heads run batched (`StackedHeads`)."""
        feature = self.to_drafter_units(self.input_feature(self.feature).to(self._stacked.dtype))
        states = self.to_target_units(self._stacked(feature.expand(self.config.num_heads, -1)))
        return self.tree_from_logits(self.lm_logits(states))

    # ----- training ----------------------------------------------------------------------
    def train_states(self, batch: TrainBatch) -> torch.Tensor:
        """Head states [B, T, K, H] for a teacher-forced batch (state t, head i predicts token t+2+i)."""
        return self.head_states(batch.hidden[self.config.n_target_layers])

    def training_loss(self, batch: TrainBatch, progress: float) -> tuple[torch.Tensor, dict[str, float]]:
        if self.lm_heads is not None:
            raise ValueError("this medusa drafter has its own per-head LM heads (a converted Medusa-1 checkpoint); "
                             "training here covers heads that share the target's LM head")
        return multi_head_loss(self.train_states(batch), batch, self.lm_logits, self.vocab.to_index)
