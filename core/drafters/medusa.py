"""Medusa-1: K residual heads on the target's last hidden state, verified as a static tree (DESIGN.md section 6).

The target's feature at the last verified position t (hidden[L], before the
final norm) already predicts token t+1 through the LM head: that is the root
of the tree, the bonus token of the last verification. Head i maps the same
feature to a state from which the LM head predicts token t+2+i:

    state_i = ResBlock_i^n(feature),  ResBlock(x) = x + SiLU(W x + b)
    logits_i = LM_head(final_norm(state_i))

Choices and deviations, named as DESIGN.md asks:

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
* Loss: cross-entropy of head i against hard labels 2+i tokens ahead, weighted
  0.8^i, where loss_mask marks answer tokens. The label is the target's own
  argmax for that position given the data's tokens before it
  (`TrainBatch.greedy_next`): exactly what greedy verification accepts. On the
  greedy answers it is the data's token; on the share sampled at temperature
  0.7 it is not always, and a sampled label would teach the heads a token that
  greedy verification rejects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from core.drafters.base import TargetNeeds, Verified
from core.drafters.checkpoint import DrafterConfig, TrainBatch, TrainedDrafter
from core.drafters.static_tree import StaticTreeMixin
from core.target import Target
from core.tree import DraftTree

LOSS_DECAY = 0.8
TOPK_METRICS = 10
LOSS_CHUNK = 1024  # rows per vocabulary-sized logits chunk in training


class ResBlock(torch.nn.Module):
    """x + SiLU(W x + b), W and b zero-initialised: starts as the identity."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


@torch.no_grad()
def perturb(params: list[torch.Tensor], noise: float, seed: int) -> None:
    """Add N(0, (noise / sqrt(fan_in))^2) to each tensor (fan_in = last dim), from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        std = noise / math.sqrt(p.shape[-1])
        p.add_((torch.randn(p.shape, generator=gen) * std).to(device=p.device, dtype=p.dtype))


def deepen_heads(drafter: TrainedDrafter, num_layers_per_head: int | None) -> None:
    """Deepen every head of a Medusa-style drafter (`heads`: K sequences of ResBlocks) to
    `num_layers_per_head` blocks. The new blocks are zero-initialised, so each head still computes what it
    did (x + SiLU(0) = x) and a continued run starts where the drafter was."""
    have = drafter.config.num_layers_per_head
    if num_layers_per_head is None or num_layers_per_head == have:
        return
    if num_layers_per_head < have:
        raise ValueError(f"{drafter.name} can only deepen its heads ({have} -> {num_layers_per_head} asked)")
    like = drafter.heads[0][0].linear.weight
    for blocks in drafter.heads:
        for _ in range(num_layers_per_head - have):
            blocks.append(ResBlock(drafter.config.hidden_size).to(device=like.device, dtype=like.dtype))
    drafter.config.num_layers_per_head = num_layers_per_head


def _ce_chunk(logits_fn, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """y: indices into the logits, -1 for a label outside the drafting vocabulary (no loss, rank = V)."""
    logits = logits_fn(x)
    loss = F.cross_entropy(logits, y, reduction="sum", ignore_index=-1)
    with torch.no_grad():  # rank of the right token: how many tokens score strictly higher
        rank = (logits > logits.gather(1, y.clamp_min(0)[:, None])).sum(1)
        rank = torch.where(y >= 0, rank, logits.shape[-1])
    return loss, rank


def multi_head_loss(
    states: torch.Tensor,
    batch: TrainBatch,
    logits_fn,
    to_index=None,
    decay: float = LOSS_DECAY,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-head cross-entropy of K head states against the target's greedy tokens 2+i ahead, weighted decay^i.

    states: [B, T', K, H], head i's state at positions 0..T'-1 (T' <= T). logits_fn maps
    states to logits over the drafting vocabulary; to_index maps token ids to its indices
    (-1 outside it; None = identity, the full vocabulary). Out-of-vocabulary labels add no
    loss (the CE is the mean over the others) but count as misses in the metrics. Metrics:
    `acc@{i}` (head i's top-1 accuracy, i = 1..K), `top{k}@{i}` (cumulative top-k, k = 1..10),
    `ce@{i}`. Logits are computed in chunks of rows, under activation checkpointing when
    gradients are on, so a vocabulary-sized tensor never exists for the whole batch.
    """
    ids, loss_mask, attn = batch.input_ids, batch.loss_mask, batch.attention_mask
    labels = batch.greedy_next()  # labels[:, j]: the target's greedy token j + 1
    t_total = ids.shape[1]
    n_heads = states.shape[2]
    total = states.new_zeros((), dtype=torch.float32)
    metrics: dict[str, float] = {}
    for i in range(n_heads):
        shift = 2 + i
        n_pos = min(states.shape[1], t_total - shift)
        if n_pos <= 0:
            continue
        valid = (loss_mask[:, shift:shift + n_pos] > 0) & (attn[:, :n_pos] > 0)
        x = states[:, :n_pos, i][valid]
        y = labels[:, shift - 1:shift - 1 + n_pos][valid]
        if to_index is not None:
            y = to_index(y)
        n = y.numel()
        if n == 0:
            continue
        loss_sum = states.new_zeros((), dtype=torch.float32)
        ranks = []
        for s in range(0, n, LOSS_CHUNK):
            xc, yc = x[s:s + LOSS_CHUNK], y[s:s + LOSS_CHUNK]
            if torch.is_grad_enabled() and xc.requires_grad:
                part, rank = checkpoint(_ce_chunk, logits_fn, xc, yc, use_reentrant=False)
            else:
                part, rank = _ce_chunk(logits_fn, xc, yc)
            loss_sum = loss_sum + part
            ranks.append(rank)
        rank = torch.cat(ranks)
        ce = loss_sum / max(1, int((y >= 0).sum()))
        total = total + decay**i * ce
        metrics[f"ce@{i + 1}"] = float(ce.detach())
        metrics[f"acc@{i + 1}"] = float((rank < 1).float().mean())
        for k in range(1, TOPK_METRICS + 1):
            metrics[f"top{k}@{i + 1}"] = float((rank < k).float().mean())
    metrics["loss"] = float(total.detach())
    return total, metrics


@dataclass
class MedusaConfig(DrafterConfig):
    num_heads: int = 4
    num_layers_per_head: int = 1
    draft_vocab_size: int = 0  # heads project onto this many frequent tokens (draft_vocab.py); 0 = all
    context_vocab: bool = True  # the conversation's own tokens join that vocabulary (draft_vocab.py)
    tree_paths: list[list[int]] = field(default_factory=list)  # empty = static_tree.default_tree
    tree_accuracy: list[list[float]] = field(default_factory=list)  # measured per-rank accuracy per head


class MedusaDrafter(StaticTreeMixin, TrainedDrafter):
    name = "medusa"
    config_class = MedusaConfig
    growable = ("num_layers_per_head",)

    def __init__(self, config: MedusaConfig, target: Target) -> None:
        super().__init__(config, target)
        if config.num_heads < 1 or config.num_layers_per_head < 1:
            raise ValueError("medusa needs num_heads >= 1 and num_layers_per_head >= 1")
        h = config.hidden_size
        self.heads = torch.nn.ModuleList(
            torch.nn.Sequential(*[ResBlock(h) for _ in range(config.num_layers_per_head)])
            for _ in range(config.num_heads))
        self.needs = TargetNeeds(hidden_layers=(config.n_target_layers,))
        self._init_vocab_and_tree(target)
        self.feature: torch.Tensor | None = None

    @classmethod
    def random(cls, target: Target, seed: int = 0, noise: float = 0.5, **hyper: Any) -> MedusaDrafter:
        """Random heads: zero-initialised W and b plus N(0, (noise/sqrt(H))^2) noise (module docstring)."""
        tree_opts = {k: hyper.pop(k) for k in ("tree_size", "tree_depth") if k in hyper}
        model = super().random(target, seed, **hyper)
        perturb([p for blocks in model.heads for p in blocks.parameters()], noise, seed)
        if tree_opts:
            model.set_options(**tree_opts)
        return model

    def grow(self, num_layers_per_head: int | None = None) -> None:
        deepen_heads(self, num_layers_per_head)

    def head_states(self, feature: torch.Tensor) -> torch.Tensor:
        """feature [..., H] -> head states [..., K, H] (before the final norm and LM head)."""
        feature = self.to_drafter_units(feature.to(self.heads[0][0].linear.weight.dtype))
        return self.to_target_units(torch.stack([head(feature) for head in self.heads], dim=-2))

    def head_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """feature [..., H] -> float32 logits [..., K, V'] over the drafting vocabulary (`self.vocab`)."""
        return self.lm_logits(self.head_states(feature))

    # ----- decoding ----------------------------------------------------------------------
    def begin(self, target: Target, prefill: Verified) -> None:
        super().begin(target, prefill)
        self.feature = prefill.hidden[self.config.n_target_layers][-1]

    def accept(self, step: Verified) -> None:
        super().accept(step)
        self.feature = step.hidden[self.config.n_target_layers][-1]

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        return self.tree_from_logits(self.head_logits(self.feature))

    # ----- training ----------------------------------------------------------------------
    def train_states(self, batch: TrainBatch) -> torch.Tensor:
        """Head states [B, T, K, H] for a teacher-forced batch (state t, head i predicts token t+2+i)."""
        return self.head_states(batch.hidden[self.config.n_target_layers])

    def training_loss(self, batch: TrainBatch, progress: float) -> tuple[torch.Tensor, dict[str, float]]:
        return multi_head_loss(self.train_states(batch), batch, self.lm_logits, self.vocab.to_index)
