"""Amphista: staged adaptation + bidirectional auto-embedding over Medusa heads (docs/ARCHITECTURE.md, "Amphista").

Amphista was published without code; this is our reading of the paper.

    a_t      = fuse([feature_t ; embed(token_{t+1})])           feature_t = target hidden[L] at t
    s1_t     = stage-1 causal decoder layer (own KV cache, RoPE at position t)
    s2_t     = stage-2 causal decoder layer over s1
    u_i      = ResBlock_i(s1_t) for the first `stage1_heads` heads, ResBlock_i(s2_t) for the rest
    z_1..z_K = encoder layer over [u_1 + pos_1, ..., u_K + pos_K]   (bidirectional across heads)
    logits_i = LM_head(final_norm(z_i))                              predicts token t+2+i

* Staged Adaptation Layers: two `LlamaDecoderLayer`s (run with core.layers.decoder_layer)
  over the target's verified positions. Position t pairs the feature at t with
  the token the target produced there (token t+1); for the last verified
  position that token is the bonus, the next tree's root, so after `accept`
  the adaptation cache holds exactly the verified positions and drafting runs
  no causal layer at all.
* Stage split (our choice): heads 0 .. K//2-1 read stage 1, the rest stage 2.
  The near heads predict tokens close to what the target's feature already
  encodes; the far heads need the features moved further from the
  autoregressive setting, so they get the deeper stage.
* Auto-embedding Block: one more `LlamaDecoderLayer`, used as an encoder: a
  full (bidirectional) mask over the K head positions, a learnable position
  embedding added to the head states and no rotary rotation (cos = 1,
  sin = 0). All K positions come out of one pass; the LM head is the target's
  frozen final norm + LM head, shared (as in our Medusa), optionally restricted
  to `draft_vocab_size` frequent tokens (core/drafters/draft_vocab.py).
* Initialisation (our choice): fuse = [I | 0], and every residual branch's
  output projection (o_proj, down_proj, the heads' W and b) zero, so a fresh
  Amphista is exactly a fresh Medusa (every head proposes the root's own
  prediction) and training starts from the LM head. `random()` adds small
  Gaussian noise to all of those tensors so random drafters differ.
* Inference runs begin()'s copies: the three decoder layers fused and packed
  (core.layers.fused_copy), the K heads batched (`trained.StackedHeads`).
* Loss: as Medusa (per-head cross-entropy on the target's greedy tokens 2+i
  ahead, weighted 0.8^i), with the same metrics for the static tree builder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

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
from core.kv_cache import KVCache
from core.layers import FusedLayer, attention_bias, decoder_layer, fused_copy, run_layer
from core.target import Target
from core.trees.draft_tree import DraftTree


@dataclass
class AmphistaConfig(DrafterConfig):
    num_heads: int = 4
    num_layers_per_head: int = 1
    stage1_heads: int = -1  # heads that read stage 1; -1 = num_heads // 2
    draft_vocab_size: int = 0  # heads project onto this many frequent tokens (draft_vocab.py); 0 = all
    context_vocab: bool = True  # the conversation's own tokens join that vocabulary (draft_vocab.py)
    tree_paths: list[list[int]] = field(default_factory=list)  # empty = static_tree.default_tree
    tree_accuracy: list[list[float]] = field(default_factory=list)  # measured per-rank accuracy per head

    RANGES: ClassVar[dict] = {
        **{k: ("an integer >= 1", lambda v: v >= 1) for k in ("num_heads", "num_layers_per_head")},
        "stage1_heads": ("an integer >= -1 (-1: num_heads // 2)", lambda v: v >= -1),
    }


def _llama_layer(target: Target, idx: int) -> torch.nn.Module:
    """A LlamaDecoderLayer shaped like the target's, residual output projections zeroed."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    layer = LlamaDecoderLayer(target.config, idx)
    torch.nn.init.zeros_(layer.self_attn.o_proj.weight)
    torch.nn.init.zeros_(layer.mlp.down_proj.weight)
    return layer


class AmphistaDrafter(StaticTreeMixin, TrainedDrafter):
    name = "amphista"
    config_class = AmphistaConfig
    random_options = ("tree_size", "tree_depth")
    growable = ("num_layers_per_head",)

    def __init__(self, config: AmphistaConfig, target: Target) -> None:
        super().__init__(config, target)
        k = config.num_heads
        if k < 1 or config.num_layers_per_head < 1:
            raise ValueError("amphista needs num_heads >= 1 and num_layers_per_head >= 1")
        self.split = k // 2 if config.stage1_heads < 0 else config.stage1_heads
        if not 0 <= self.split <= k:
            raise ValueError(f"stage1_heads must be between 0 and num_heads ({k}), got {config.stage1_heads}")
        h = config.hidden_size
        self.head_dim = target.head_dim
        self.fuse = torch.nn.Linear(2 * h, h, bias=False)
        with torch.no_grad():
            self.fuse.weight.zero_()
            self.fuse.weight[:, :h] = torch.eye(h)
        self.stage1 = _llama_layer(target, 0)
        self.stage2 = _llama_layer(target, 1)
        self.heads = torch.nn.ModuleList(
            torch.nn.Sequential(*[ResBlock(h) for _ in range(config.num_layers_per_head)]) for _ in range(k))
        self.head_pos = torch.nn.Parameter(torch.zeros(k, h))
        self.auto_embedding = _llama_layer(target, 2)
        self.needs = TargetNeeds(hidden_layers=(config.n_target_layers,))
        self._init_vocab_and_tree(target)
        self.cache: KVCache | None = None
        self.stage_out: tuple[torch.Tensor, torch.Tensor] | None = None
        self._fused: tuple[FusedLayer, FusedLayer, FusedLayer] | None = None  # inference: rebuilt by begin()
        self._stacked: StackedHeads | None = None  # inference: the heads batched, rebuilt by begin()
        self._auto_rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.tree_auto = True  # tree size sized for this machine (StaticTreeMixin.resolve_auto_static_tree)
        self.tree_choice: dict | None = None

    @classmethod
    def random(cls, target: Target, seed: int = 0, noise: float = 0.5, **hyper: Any) -> AmphistaDrafter:
        """Random drafter: the Medusa-equivalent initialisation plus noise on every zero/identity tensor."""
        tree_opts = {k: hyper.pop(k) for k in cls.random_options if k in hyper}
        model = super().random(target, seed, **hyper)
        zeroed = [model.fuse.weight, model.head_pos]
        for layer in (model.stage1, model.stage2, model.auto_embedding):
            zeroed += [layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight]
        zeroed += [p for blocks in model.heads for p in blocks.parameters()]
        perturb(zeroed, noise, seed)
        if tree_opts:
            model.set_options(**tree_opts)
        return model

    @property
    def dtype(self) -> torch.dtype:
        return self.fuse.weight.dtype

    # ----- the network -------------------------------------------------------------------
    def adapt(self, features: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor | None = None, cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Staged adaptation. features [B, T, H], next_tokens [B, T] (token t+1 for feature t),
        positions [B, T]. With a cache, the T rows are appended (causal, prefix visible);
        without one, `mask` [B, 1, T, T] gives the attention pattern. Returns stage-1, stage-2 outputs."""
        emb = self.target.embed_tokens(next_tokens).to(self.dtype)
        x = self.fuse(torch.cat([self.to_drafter_units(features.to(self.dtype)), emb], dim=-1))
        cos, sin = self.target.rope(positions)
        cos, sin = cos.to(self.dtype), sin.to(self.dtype)
        s1, _ = decoder_layer(self.stage1, x, cos, sin, mask, cache, 0, self.head_dim)
        s2, _ = decoder_layer(self.stage2, s1, cos, sin, mask, cache, 1, self.head_dim)
        if cache is not None:
            cache.commit(x.shape[1])
        return s1, s2

    def grow(self, num_layers_per_head: int | None = None) -> None:
        deepen_heads(self, num_layers_per_head)

    def head_states(self, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        """Stage outputs [..., H] -> drafting-head states [..., K, H]."""
        return torch.stack([head(s1 if i < self.split else s2) for i, head in enumerate(self.heads)], dim=-2)

    def auto_embed(self, states: torch.Tensor) -> torch.Tensor:
        """Auto-embedding Block: [..., K, H] -> [..., K, H], bidirectional attention across the K heads."""
        lead, (k, h) = states.shape[:-2], states.shape[-2:]
        x = states.reshape(-1, k, h) + self.head_pos
        cos = torch.ones(1, k, self.head_dim, dtype=x.dtype, device=x.device)  # no rotation: head order
        sin = torch.zeros_like(cos)                                              # comes from head_pos
        full = torch.ones(1, 1, k, k, dtype=torch.bool, device=x.device)
        y, _ = decoder_layer(self.auto_embedding, x, cos, sin, full, None, 0, self.head_dim)
        return self.to_target_units(y.reshape(*lead, k, h))

    # ----- decoding ----------------------------------------------------------------------
    def begin(self, target: Target, prefill: Verified) -> None:
        super().begin(target, prefill)
        self.resolve_auto_static_tree(target)
        # inference copies of the three decoder layers (training in between is picked up here), and the
        # auto-embedding block's constant no-rotation cos/sin and all-visible attention bias
        self._fused = (fused_copy(self.stage1), fused_copy(self.stage2), fused_copy(self.auto_embedding))
        self._stacked = StackedHeads.of(self.heads)
        k = self.config.num_heads
        cos = torch.ones(1, k, self.head_dim, dtype=self.dtype, device=target.device)
        full = torch.ones(1, 1, k, k, dtype=torch.bool, device=cos.device)
        self._auto_rope = (cos, torch.zeros_like(cos), attention_bias(full, target.n_heads // target.kv_heads,
                                                                      self.dtype))
        n = len(prefill.tokens)
        self.cache = KVCache(2, target.kv_heads, self.head_dim, n + 256, 1, self.dtype, target.device)
        self._advance(prefill)

    def accept(self, step: Verified) -> None:
        super().accept(step)
        self._advance(step)

    @torch.no_grad()
    def _advance(self, step: Verified) -> None:
        """Run the adaptation layers over the newly verified positions (each paired with its next token)."""
        if step.start_position != self.cache.length:
            raise RuntimeError(f"amphista's adaptation cache holds {self.cache.length} positions but the "
                               f"verified step starts at {step.start_position}")
        dev = self.target.device
        features = step.hidden[self.config.n_target_layers][None]
        nxt = torch.tensor(list(step.tokens[1:]) + [step.bonus], dtype=torch.long, device=dev)[None]
        pos = torch.arange(step.start_position, step.start_position + nxt.shape[1], device=dev)[None]
        if self._fused is None:
            s1, s2 = self.adapt(features, nxt, pos, cache=self.cache)
        else:  # the same computation as adapt(), on the fused inference copies
            tgt = self.target
            emb = tgt.embed_tokens(nxt).to(self.dtype)
            x = self.fuse(torch.cat([self.to_drafter_units(features.to(self.dtype)), emb], dim=-1))
            cos, sin = tgt.rope(pos)
            if cos.dtype != self.dtype:
                cos, sin = cos.to(self.dtype), sin.to(self.dtype)
            s1, _ = run_layer(self._fused[0], x, cos, sin, None, self.cache, 0, tgt.n_heads, tgt.kv_heads,
                              self.head_dim)
            s2, _ = run_layer(self._fused[1], s1, cos, sin, None, self.cache, 1, tgt.n_heads, tgt.kv_heads,
                              self.head_dim)
            self.cache.commit(x.shape[1])
        self.stage_out = (s1[0, -1], s2[0, -1])

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        if self._fused is None:
            z = self.auto_embed(self.head_states(*self.stage_out))
        else:  # auto_embed() on the fused copy, with its constant cos/sin/mask made once in begin()
            tgt = self.target
            cos, sin, bias = self._auto_rope
            s1, s2 = self.stage_out  # head_states(), the heads batched (StackedHeads)
            k = self.config.num_heads
            states = self._stacked(torch.stack([s1] * self.split + [s2] * (k - self.split)))
            x = states[None] + self.head_pos
            y, _ = run_layer(self._fused[2], x, cos, sin, bias, None, 0, tgt.n_heads, tgt.kv_heads, self.head_dim,
                             signed_sin=True)  # sin = 0: its signed form is itself
            z = self.to_target_units(y.reshape(states.shape))
        return self.tree_from_logits(self.lm_logits(z))

    # ----- training ----------------------------------------------------------------------
    def train_states(self, batch: TrainBatch) -> torch.Tensor:
        """Head states [B, T-1, K, H], teacher-forced: position t (0..T-2) pairs feature t with token t+1;
        causal over real tokens."""
        ids, attn = batch.input_ids, batch.attention_mask
        features = batch.hidden[self.config.n_target_layers][:, :-1]
        t = features.shape[1]
        valid = attn[:, :t] > 0
        positions = (attn[:, :t].long().cumsum(1) - 1).clamp_min(0)
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        eye = torch.eye(t, dtype=torch.bool, device=ids.device)
        mask = (causal & (valid[:, None, :] | eye))[:, None]  # padded queries see themselves only (no NaN rows)
        s1, s2 = self.adapt(features, ids[:, 1:], positions, mask)
        return self.auto_embed(self.head_states(s1, s2))

    def training_loss(self, batch: TrainBatch, progress: float) -> tuple[torch.Tensor, dict[str, float]]:
        return multi_head_loss(self.train_states(batch), batch, self.lm_logits, self.vocab.to_index)
