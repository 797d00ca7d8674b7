"""EAGLE-2 drafter: the baseline MoA is compared against (docs/ARCHITECTURE.md, "EAGLE-2").

    pair t = (feature_t, token_{t+1})      feature_t = target's last hidden state (pre-norm) at t
    x      = fc(concat(embed(token_{t+1}), feature_t))
    out    = one Llama decoder layer (own KV cache, target's RoPE)    -> predicted feature_{t+1}
    logits = target final norm + LM head (frozen, shared)            -> token_{t+2}

Pair t sits at position t. After each verification the drafter's cache holds one
entry per verified token, all computed from the target's *true* features: the
verified pairs (true feature of each verified token, the token after it; the last
one pairs with the bonus token) are run in `accept()`, and the tree entries
computed from predicted features during drafting are cropped away. While drafting,
the drafter feeds its own predicted features back: a node at depth d is the pair
(predicted feature of its parent, its token) at position root + d - 1, attending
to the verified entries and to its ancestors under a tree mask. The tree itself is
EAGLE-2's dynamic tree (core.drafters.dynamic_tree).

With `draft_vocab_size` > 0 the drafter's distribution (drafting and training alike)
covers only that many frequent tokens (core.drafters.draft_vocab; the trainer sets
them): the final norm + LM head rows of those tokens. Training's soft target is then
the target's distribution renormalised over the same tokens.

The distillation loss helpers it shares with MoA live in core.drafters.trained.

The published EAGLE-1/EAGLE-2 layout (SafeAILab/EAGLE, converted by core.drafters.published_formats)
differs from ours in three places, each a config flag, all off for our own drafters so that shipped
checkpoints load and compute as before:

    normed_features = True    features are the target's *post-norm* states and the predicted feature goes
                              to the LM head without the final norm (EAGLE feeds `outputs[0]` of the base
                              model, i.e. after its final norm, and drafts with `head(last_hidden)`)
    input_layernorm = False   the decoder layer has no input RMSNorm (EAGLE's layer 0 skips it)
    fc_bias = False           `fc` without a bias (EAGLE's config.json `"bias": false`)

With `normed_features` the feature scale must stay 1.0 (EAGLE's features are not scaled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from core.drafters.base import TargetNeeds, Verified
from core.drafters.draft_vocab import DraftVocab
from core.drafters.dynamic_tree import (
    DEFAULT_DEPTH,
    DEFAULT_TOP_K,
    DEFAULT_TOTAL_TOKENS,
    Expansion,
    build_dynamic_tree,
)
from core.drafters.trained import (
    DrafterConfig,
    TrainBatch,
    TrainedDrafter,
    apply_tree_options,
    check_draft_vocab_size,
    check_hyper,
    distill_terms,
    layer_config,
    resolve_auto_tree,
    rope_kv,
    target_tokens_in_vocab,
    top1,
    weighted_mean,
)
from core.kv_cache import KVCache
from core.layers import FusedLayer, decoder_layer, fused_copy, run_layer
from core.static_pass import LEVEL_ROOM, StaticLevels, static_levels_for
from core.target import Target
from core.trees.draft_tree import DraftTree


# ----- the drafter ------------------------------------------------------------------------------
@dataclass
class Eagle2Config(DrafterConfig):
    depth: int = DEFAULT_DEPTH  # tree settings: see core.drafters.dynamic_tree for why these defaults
    top_k: int = DEFAULT_TOP_K
    total_tokens: int = DEFAULT_TOTAL_TOKENS
    # Training: input features get uniform noise U(-noise, noise) times each token's feature RMS.
    # EAGLE adds absolute U(-0.1, 0.1) noise to LLaMA/Vicuna features; scaling by the RMS is our
    # choice so that the relative perturbation does not depend on the target's feature scale.
    noise: float = 0.1
    ce_weight: float = 0.1  # loss = SmoothL1(features) + ce_weight * CE(target dist, drafter dist)
    eval_depth: int = 3  # training metrics acc@1..eval_depth (deeper ones feed back own features)
    draft_vocab_size: int = 0  # project onto this many frequent tokens (draft_vocab.py); 0 = all
    context_vocab: bool = True  # the conversation's own tokens join that vocabulary (draft_vocab.py)
    # The published EAGLE-1/2 layout (module docstring; set by core.drafters.published_formats):
    normed_features: bool = False  # features are the target's post-norm states; no final norm before the LM head
    input_layernorm: bool = True  # False: the layer has no input RMSNorm (EAGLE's layer 0)
    fc_bias: bool = True  # False: fc has no bias (EAGLE's `"bias": false`)

    RANGES: ClassVar[dict] = {
        **{k: ("an integer >= 1", lambda v: v >= 1) for k in ("depth", "top_k", "total_tokens", "eval_depth")},
        **{k: ("a finite number >= 0", lambda v: v >= 0) for k in ("noise", "ce_weight")},
    }


class Eagle2Drafter(TrainedDrafter):
    name = "eagle2"
    config_class = Eagle2Config

    def __init__(self, config: Eagle2Config, target: Target) -> None:
        super().__init__(config, target)
        check_draft_vocab_size(config.draft_vocab_size, target)
        if config.normed_features and config.feature_scale != 1.0:
            raise ValueError(f"normed_features (the published EAGLE layout) needs feature_scale 1.0, "
                             f"got {config.feature_scale}")
        h = config.hidden_size
        self.vocab = DraftVocab(target, config.draft_vocab_size, config.context_vocab, normed=config.normed_features)
        self.record_draft_top = True  # extras["draft_top"] for the app (costs well under 1 ms a cycle)
        self.fc = nn.Linear(2 * h, h, bias=config.fc_bias)
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        self.layer = LlamaDecoderLayer(layer_config(target), layer_idx=0)
        if not config.input_layernorm:
            self.layer.input_layernorm = nn.Identity()  # core.layers runs the layer without it
        self.needs = TargetNeeds(hidden_layers=(config.n_target_layers,))
        self.train_needs = self.needs
        self.cache: KVCache | None = None
        self._fused: FusedLayer | None = None  # the layer's weights stacked for inference, rebuilt by begin()
        self.tree_auto = True  # depth / total_tokens sized for this machine (trained.resolve_auto_tree)
        self.tree_choice: dict | None = None

    @classmethod
    def random(cls, target: Target, seed: int = 0, **hyper: Any) -> Eagle2Drafter:
        check_hyper(cls.config_class, cls.name, hyper)
        return super().random(target, seed, **hyper)

    def set_options(self, **opts: Any) -> None:
        """Tree settings: depth, top_k, total_tokens ("auto" for depth / total_tokens: sized for this machine)."""
        apply_tree_options(self, opts)

    # ----- compute -----------------------------------------------------------------------------
    @property
    def _dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def input_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's features hidden[L] (pre-norm) as this drafter reads them: final-normed under
        `normed_features` (the published EAGLE layout), else unchanged. Predicted features fed back while
        drafting are already in this space and never pass through here."""
        return self.target.final_norm(hidden) if self.config.normed_features else hidden

    def _fuse(self, feats: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        emb = self.target.embed_tokens(tokens).to(self._dtype)
        return self.fc(torch.cat([emb, self.to_drafter_units(feats.to(self._dtype))], dim=-1))

    def _run(self, feats: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor | None) -> torch.Tensor:
        """Pairs [1, T] through the layer on top of the cache (mask None = causal, whole prefix visible)."""
        out = self._layer_on(feats, tokens, positions, mask, self.cache)
        self.cache.commit(tokens.shape[1])
        return out

    def _layer_on(self, feats: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                  mask: torch.Tensor | None, writes) -> torch.Tensor:
        """The layer's arithmetic, its keys appended through `writes`: this drafter's KV cache when drafting
        eagerly (`_run` commits them), core.static_pass.IndexWrites on static levels (`mask` is then the level's
        additive mask over the whole buffer)."""
        x = self._fuse(feats, tokens)
        cos, sin = self.target.rope(positions)
        if cos.dtype != x.dtype:
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        tgt = self.target
        if self._fused is not None:
            out, _ = run_layer(self._fused, x, cos, sin, mask, writes, 0, tgt.n_heads, tgt.kv_heads, tgt.head_dim)
        else:
            out, _ = decoder_layer(self.layer, x, cos, sin, mask, writes, 0, tgt.head_dim)
        return self.to_target_units(out)

    def _logprobs(self, feats: torch.Tensor) -> torch.Tensor:
        """Log-probs over the drafting vocabulary (indices, not token ids)."""
        return torch.log_softmax(self.vocab.logits(feats.to(self.target.dtype)), dim=-1)

    # ----- the drafting cycle ------------------------------------------------------------------
    @torch.no_grad()
    def begin(self, target: Target, prefill: Verified) -> None:
        super().begin(target, prefill)
        resolve_auto_tree(self, target)
        self._fused = fused_copy(self.layer)  # weights may have changed (training) since the last conversation
        cfg = self.config
        self.static: StaticLevels | None = static_levels_for(  # fixed buffers unless the target's passes are eager
            self, target, self._layer_on, cfg.top_k, cfg.depth, target.hidden_size, self._dtype, (self._fused,),
            len(prefill.tokens) + LEVEL_ROOM)
        self.cache = self.static.cache if self.static is not None else KVCache(
            1, target.kv_heads, target.head_dim, len(prefill.tokens) + 256, dtype=self._dtype, device=target.device)
        self._absorb(prefill)

    @torch.no_grad()
    def accept(self, step: Verified) -> None:
        super().accept(step)
        self._absorb(step)

    def _absorb(self, step: Verified) -> None:
        """Run the verified pairs (true feature of each verified token, the token after it)."""
        self.cache.crop(step.start_position)
        dev = self.target.device
        feats = self.input_features(step.hidden[self.config.n_target_layers].to(dev))[None]
        nxt = torch.tensor(step.tokens[1:] + [step.bonus], dtype=torch.long, device=dev)[None]
        positions = step.start_position + torch.arange(nxt.shape[1], device=dev)[None]
        out = self._run(feats, nxt, positions, None)
        self._root_feat = out[0, -1]  # predicted feature of the bonus token: the next root
        self._root_token = step.bonus

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        if root != self._root_token:
            raise RuntimeError(f"draft() got root {root} but the last verified bonus token was {self._root_token}")
        cfg = self.config
        r = self.cache.length  # the root's position; also the number of verified entries
        dev = self.target.device
        pool = [self._root_feat[None]]  # predicted features: the root's, then one per expanded slot
        static = self.static if self.static is not None and self.static.fits(cfg.top_k, cfg.depth) else None
        if static is not None:
            static.pool[0] = self._root_feat

        def expand(batch: Expansion) -> torch.Tensor:
            if static is not None:  # the same level on fixed buffers (replayed as a CUDA graph on a GPU)
                out = static.level(batch.tokens, batch.parent_slots, batch.depths, batch.mask, batch.first_slot)
                return self._logprobs(out).cpu()
            feats = torch.cat(pool)[batch.parent_slots.to(dev) + 1]
            m = batch.tokens.numel()
            positions = (r + batch.depths - 1).to(dev)[None]
            prefix = torch.ones(m, r, dtype=torch.bool)
            mask = torch.cat([prefix, batch.mask], dim=1).to(dev)[None, None]
            out = self._run(feats[None], batch.tokens.to(dev)[None], positions, mask)[0]
            pool.append(out)
            return self._logprobs(out).cpu()

        root_lp = self._logprobs(self._root_feat[None])[0].cpu()
        ids = self.vocab.table()
        tree = build_dynamic_tree(root_lp, expand, cfg.depth, cfg.top_k, cfg.total_tokens, ids,
                                  self.record_draft_top)
        self.cache.crop(r)
        return tree

    # ----- training ----------------------------------------------------------------------------
    def training_loss(self, batch: TrainBatch, progress: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Teacher-forced on the true features (with noise); acc@2.. feed back predicted features.

        Pair t predicts feature_{t+1}; it counts with weight loss_mask[t+1] * attention_mask[t+1]
        (the regressed feature belongs to the answer). Sequences are assumed right-padded.
        """
        cfg = self.config
        feat = self.input_features(batch.hidden[cfg.n_target_layers].detach())
        ids = batch.input_ids
        b, t, _ = feat.shape
        w = (batch.loss_mask[:, 1:] * batch.attention_mask[:, 1:]).float()
        inp = feat[:, :-1].to(self._dtype)
        if self.training and cfg.noise > 0:
            rms = inp.float().pow(2).mean(-1, keepdim=True).sqrt().to(inp.dtype)
            inp = inp + (torch.rand_like(inp) * 2 - 1) * cfg.noise * rms
        tokens = ids[:, 1:]
        out, kv, cos, sin = self.teacher_forced(inp, tokens)
        sel = w > 0
        wr = w[sel]
        true_next = feat[:, 1:]
        l1 = self.feature_loss_rows(out[sel], true_next[sel])
        ce, d_top, t_top = distill_terms(self.vocab, out[sel], true_next[sel])
        # pair t's distribution is of token t + 2; the last pair's lies past the data (padded with an
        # in-vocabulary token: it is never counted a miss)
        next_ids = torch.cat([ids[:, 2:], self.vocab.to_token_ids(torch.zeros_like(ids[:, :1]))], dim=1)
        t_top = target_tokens_in_vocab(self.vocab, t_top, next_ids[sel])
        loss_feat = weighted_mean(l1, wr)
        loss_ce = weighted_mean(ce, wr)
        loss = loss_feat + cfg.ce_weight * loss_ce
        metrics = {"loss": float(loss.detach()), "loss_feat": float(loss_feat.detach()),
                   "loss_ce": float(loss_ce.detach()), "acc@1": float(weighted_mean((d_top == t_top).float(), wr))}
        if cfg.eval_depth > 1 and not self.training:  # deeper passes only measure: skip them while training
            target_top = torch.full((b, t - 1), -1, dtype=torch.long, device=ids.device)
            target_top[sel] = t_top
            metrics.update(self._deeper_accuracy(out.detach(), kv, tokens, cos, sin, target_top, w))
        return loss, metrics

    def teacher_forced(self, feats: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Pairs (feats[:, t], tokens[:, t]) at positions t = 0.. under a causal mask, no cache.

        Returns (output features, the layer's pre-RoPE keys+values, cos, sin) for feedback_passes.
        """
        b, n = tokens.shape
        positions = torch.arange(n, device=tokens.device)[None].expand(b, -1)
        cos, sin = self.target.rope(positions)
        cos, sin = cos.to(self._dtype), sin.to(self._dtype)
        out, kv = decoder_layer(self.layer, self._fuse(feats, tokens), cos, sin, None, None, 0,
                                self.target.head_dim, return_kv=True)
        return self.to_target_units(out), kv, cos, sin

    @torch.no_grad()
    def feedback_passes(self, out1: torch.Tensor, kv1: torch.Tensor, tokens: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """Outputs of passes 2..depth, each exactly what drafting at that depth computes.

        Pass d at position t takes pass d-1's output at t-1 as its feature. Its keys: pass-1
        (true-feature) entries at positions <= t-d+1, then pass m's entry at t-(d-m) for
        m = 2..d (the predicted ancestors in the draft chain, itself last). Rows t < d-1 are
        meaningless (their chain would start before position 0).
        """
        tgt = self.target
        n = tokens.shape[1]
        pos = torch.arange(n, device=tokens.device)
        rows, cols = pos[:, None], pos[None, :]
        keys = [rope_kv(kv1, cos, sin, tgt.kv_heads, tgt.head_dim)]
        outs = [out1]
        for d in range(2, depth + 1):
            prev = outs[-1]
            feats = torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1)
            blocks = [cols <= rows - (d - 1)] + [cols == rows - (d - m) for m in range(2, d)] + [cols == rows]
            mask = torch.cat(blocks, dim=1)[None, None]
            extra = (torch.cat([k for k, _ in keys], dim=2), torch.cat([v for _, v in keys], dim=2))
            out, kv = decoder_layer(self.layer, self._fuse(feats, tokens), cos, sin, mask, None, 0, tgt.head_dim,
                                    return_kv=True, extra_kv=extra)
            keys.append(rope_kv(kv, cos, sin, tgt.kv_heads, tgt.head_dim))
            outs.append(self.to_target_units(out))
        return outs[1:]

    @torch.no_grad()
    def _deeper_accuracy(self, out1: torch.Tensor, kv1: torch.Tensor, tokens: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, target_top: torch.Tensor, w: torch.Tensor) -> dict[str, float]:
        """acc@d for d = 2..eval_depth: top-1 agreement of the feedback passes with the target."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        metrics = {}
        outs = self.feedback_passes(out1, kv1, tokens, cos, sin, self.config.eval_depth)
        for d, out in enumerate(outs, start=2):
            sel = (w > 0) & (pos[None] >= d - 1)
            agree = (top1(self.vocab, out[sel]) == target_top[sel]).float()
            metrics[f"acc@{d}"] = float(weighted_mean(agree, w[sel]))
        return metrics
