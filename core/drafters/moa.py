"""Mixture of Attentions (MoA) drafter with Target Layer Inference (DESIGN.md section 5).

Zimmer et al., "Mixture of Attentions for Speculative Decoding" (2024). Three parts on
top of the target's frozen embedding and LM head:

    LSA  per verified token: its keys+values at every target layer ([L, 2*kv_heads*head_dim])
         -> linear to `lsa_dim` + learned layer-index embedding -> one small encoder layer
         with bidirectional attention across the L layers -> mean over layers -> linear to H.
         Runs once per cycle, in accept(), on the newly verified tokens only. Its attention
         (per token, layer x layer, averaged over heads) goes to the next tree's extras.
    SA   one causal Llama decoder layer over the target's token embeddings of prompt,
         accepted and drafted tokens, with its own KV cache. Never sees predicted states.
    CA   queries from the SA output, keys/values from the LSA vectors of verified tokens
         (RoPE on both sides, so a query knows how far it is from the last verified token),
         then an MLP and a linear head -> the predicted state.

Indexing. The prediction at position j (SA query token x_j) estimates the target's state
at j, i.e. the distribution of x_{j+1}. When drafting from the root at position r, CA sees
the LSA vectors of positions <= r - 1: everything the target has verified (the root itself
is the target's own bonus token, not yet run through it). Deeper nodes (position r + d)
see exactly the same memory, so only the CA query changes. The distance j - (last verified
position) is 1 for the root's children and d for a node's children at depth d.

Target Layer Inference (TLI), N = config.tli:
    N = 0: the predicted state is the target's final hidden state (pre-norm) -> target.logits.
    N > 0: the predicted state is the residual entering layer L - N; the frozen target
           layers L-N .. L-1 run on it with their own KV cache: verified positions use the
           target's true keys/values (Verified.layer_kv, RoPE applied at their positions),
           the root and drafted nodes use keys/values computed from predicted states under
           the tree mask. Then the final norm and LM head.

Cache invariants after accept(): SA cache = the verified tokens (the root and accepted
tokens are re-run as a chain; drafted entries are cropped), CA memory = LSA of every
verified token, TLI cache = true keys/values of every verified token.

Offline drafting (client-server, DESIGN.md section 5): when the link to the target drops,
the drafter keeps going on its own. `extend_unverified(tokens)` accepts tokens
provisionally: the current root and all but the last of `tokens` enter the SA cache (and
the TLI cache, from predicted states) exactly as drafted tree nodes would, while CA memory
keeps only the verified tokens; the last of `tokens` becomes the new root, at position
(verified count + n_unverified). `draft(new root)` then drafts from there, seeing what a
drafted node that deep would see. When the server answers, `rollback_unverified()` (or
simply `accept()`, which crops to the verified state itself) and then
`accept(Verified(tokens=[old root] + accepted provisional tokens, bonus=correction, ...))`.
EAGLE-2 cannot do this: every step needs fresh target features.

With `draft_vocab_size` > 0 only the final projection is restricted to the drafting
vocabulary (core.drafters.draft_vocab); TLI layers are unchanged.

Training (`training_loss`), T-step bounded and on-policy: per sequence a period k is drawn
from [period_min, period_max] (the reference code's 6..14); positions divisible by k and
every position with loss_mask 0 (prompt / user turns: the target prefills them) are
"verified". The prediction at j sees, through CA and TLI, target activations only at
positions <= v(j) = the last verified position strictly before j, as at inference
(where v = r - 1 for a root at r). SA starts with a "staircase" mask (only the current
unverified segment v(j) < q <= j) whose window grows linearly to the full causal mask at
progress = staircase_until (0.5: the first half of training, as the reference code does).
`progress` is the fraction of the drafter's whole training: a run continuing a published
drafter counts the earlier runs' steps (core.training.train), so the curriculum runs once.
In each of the N frozen TLI layers, positions <= v(j) contribute the target's true keys and
values and positions in (v(j), j] the predicted path's, under the same mask as inference. The
true keys/values are read from batch.layer_kv: they are exactly the target's k/v projections
of batch.hidden[L-N+i], so training needs no extra hidden layers for them.

What the target must hand over: `needs` (inference) = per-layer keys/values only;
`train_needs` (training) = the same plus hidden[L] (final feature, target distribution) and,
for N > 0, hidden[L-N] (the regressed state). The trainer reads `train_needs` when present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from core.drafters.base import TargetNeeds, Verified
from core.drafters.checkpoint import DrafterConfig, TrainBatch, TrainedDrafter
from core.drafters.draft_vocab import DraftVocab
from core.drafters.dynamic_tree import (
    DEFAULT_DEPTH,
    DEFAULT_TOP_K,
    DEFAULT_TOTAL_TOKENS,
    Expansion,
    build_dynamic_tree,
)
from core.drafters.eagle2 import (
    apply_tree_options,
    check_draft_vocab_size,
    check_hyper,
    distill_terms,
    layer_config,
    rope_kv,
    target_tokens_in_vocab,
    weighted_mean,
)
from core.kv_cache import KVCache
from core.target import Target, decoder_layer
from core.tree import DraftTree

MAX_TLI = 3
ACC_DISTANCES = 6  # training metrics acc@1..6, by distance from the last verified position


@dataclass
class MoAConfig(DrafterConfig):
    tli: int = 0  # N: target layers the drafter runs itself (0..3)
    lsa_dim: int = 128  # width of the layer self-attention encoder
    lsa_heads: int = 4
    depth: int = DEFAULT_DEPTH  # tree settings: see core.drafters.dynamic_tree for why these defaults
    top_k: int = DEFAULT_TOP_K
    total_tokens: int = DEFAULT_TOTAL_TOKENS
    period_min: int = 6  # training: verified every k positions, k uniform in [period_min, period_max]
    period_max: int = 14
    staircase_until: float = 0.5  # training progress at which SA's mask has become fully causal
    ce_weight: float = 0.1
    draft_vocab_size: int = 0  # project onto this many frequent tokens (draft_vocab.py); 0 = all
    context_vocab: bool = True  # the conversation's own tokens join that vocabulary (draft_vocab.py)


class LayerSelfAttention(nn.Module):
    """One bidirectional encoder layer over the target's L layers of one token's keys+values."""

    def __init__(self, n_layers: int, kv_width: int, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"lsa_dim {dim} must be divisible by lsa_heads {heads}")
        self.heads = heads
        self.in_norm = nn.LayerNorm(kv_width)  # keys and values come at the target's own (varied) scales
        self.inp = nn.Linear(kv_width, dim)
        self.layer_pos = nn.Parameter(torch.randn(n_layers, dim) * 0.02)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.out_norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, hidden)

    def forward(self, kv: torch.Tensor, need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """kv: [n, L, kv_width] -> (vectors [n, hidden], attention [n, L, L] averaged over heads, or None)."""
        n, length, _ = kv.shape
        x = self.inp(self.in_norm(kv.to(self.inp.weight.dtype))) + self.layer_pos
        q, k, v = self.qkv(self.norm1(x)).view(n, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        weights = None
        if need_weights:
            att = torch.softmax((q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1]), dim=-1)
            a = att.to(v.dtype) @ v
            weights = att.mean(1)
        else:
            a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(n, length, -1))
        x = x + self.mlp(self.norm2(x))
        return self.out(self.out_norm(x.mean(1))), weights


class CrossAttention(nn.Module):
    """Queries from the drafter's stream, keys/values from LSA vectors (grouped heads, RoPE)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def memory(self, vec: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LSA vectors [B, S, H] at their positions -> roped keys, values [B, kv_heads, S, D]."""
        return rope_kv(torch.cat([self.k_proj(vec), self.v_proj(vec)], dim=-1), cos, sin, self.kv_heads,
                       self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos.to(q.dtype), sin.to(q.dtype))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MoADrafter(TrainedDrafter):
    name = "moa"
    config_class = MoAConfig

    def __init__(self, config: MoAConfig, target: Target) -> None:
        super().__init__(config, target)
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm

        n = config.tli
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= min(MAX_TLI, config.n_target_layers):
            raise ValueError(f"tli must be an integer in 0..{MAX_TLI} (and at most the target's layer count), "
                             f"got {n!r}")
        if not 1 <= config.period_min <= config.period_max:
            raise ValueError(f"need 1 <= period_min <= period_max, got {config.period_min}, {config.period_max}")
        check_draft_vocab_size(config.draft_vocab_size, target)
        self.vocab = DraftVocab(target, config.draft_vocab_size, config.context_vocab)
        self.record_draft_top = True  # extras["draft_top"] for the app (costs well under 1 ms a cycle)
        lcfg = layer_config(target)
        h, eps = config.hidden_size, lcfg.rms_norm_eps
        kv_width = 2 * target.kv_heads * target.head_dim
        self.lsa = LayerSelfAttention(config.n_target_layers, kv_width, config.lsa_dim, config.lsa_heads, h)
        self.sa = LlamaDecoderLayer(lcfg, layer_idx=0)
        self.ca_norm = LlamaRMSNorm(h, eps)
        self.ca = CrossAttention(h, target.n_heads, target.kv_heads, target.head_dim)
        self.mlp_norm = LlamaRMSNorm(h, eps)
        self.mlp = LlamaMLP(lcfg)
        self.out_norm = LlamaRMSNorm(h, eps)
        self.head = nn.Linear(h, h, bias=False)
        big_l = config.n_target_layers
        # Inference needs only the per-layer keys/values; training also regresses hidden states.
        self.needs = TargetNeeds(layer_kv=True)
        self.train_needs = TargetNeeds(hidden_layers=tuple(sorted({big_l - n, big_l})), layer_kv=True)
        self.sa_cache: KVCache | None = None
        self._provisional: list[int] = []

    @classmethod
    def random(cls, target: Target, seed: int = 0, **hyper: Any) -> MoADrafter:
        check_hyper(cls.config_class, cls.name, hyper)
        return super().random(target, seed, **hyper)

    def set_options(self, **opts: Any) -> None:
        """Tree settings (depth, top_k, total_tokens); `tli` may be given but must match the checkpoint."""
        if "tli" in opts:
            tli = opts.pop("tli")
            if tli != self.config.tli:
                raise ValueError(f"this MoA drafter was trained with TLI N={self.config.tli}; it cannot run with "
                                 f"tli={tli} (load the moa-tli{tli} checkpoint, or train one)")
        apply_tree_options(self, opts)

    # ----- building blocks ---------------------------------------------------------------------
    @property
    def _dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.target.rope(positions)
        return cos.to(self._dtype), sin.to(self._dtype)

    def _predict(self, sa_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mem_k: torch.Tensor,
                 mem_v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """CA over the LSA memory, MLP, head: the predicted state (final feature, or entering layer L - N)."""
        h = sa_out + self.ca(self.ca_norm(sa_out), cos, sin, mem_k, mem_v, mask)
        h = h + self.mlp(self.mlp_norm(h))
        return self.to_target_units(self.head(self.out_norm(h)))

    def _tli(self, state: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Run the target's last N layers on predicted states [1, m, H] over the TLI cache."""
        n, big_l = self.config.tli, self.config.n_target_layers
        if n == 0:
            return state
        cos, sin = self.target.rope(positions)
        x = state.to(self.target.dtype)
        for i in range(n):
            x, _ = decoder_layer(self.target.layers[big_l - n + i], x, cos, sin, mask, self.tli_cache, i,
                                 self.target.head_dim)
        self.tli_cache.commit(state.shape[1])
        return x

    def _sa(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        cos, sin = self._rope(positions)
        x = self.target.embed_tokens(tokens).to(self._dtype)
        out, _ = decoder_layer(self.sa, x, cos, sin, mask, self.sa_cache, 0, self.target.head_dim)
        self.sa_cache.commit(tokens.shape[1])
        return out

    def _advance(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Run tokens [1, m] at positions [1, m] under `mask` into the SA/TLI caches -> final features [1, m, H]."""
        sa_out = self._sa(tokens, positions, mask)
        cos, sin = self._rope(positions)
        mem_k, mem_v = self.ca_cache.layer_view(0)
        state = self._predict(sa_out, cos, sin, mem_k, mem_v, None)  # the whole memory is verified
        return self._tli(state, positions, mask)

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Draft tokens [1, m] at positions [1, m] under `mask` -> log-probs [m, V'] over the drafting vocabulary."""
        final = self._advance(tokens, positions, mask)
        return torch.log_softmax(self.vocab.logits(final.to(self.target.dtype))[0], dim=-1)

    # ----- the drafting cycle ------------------------------------------------------------------
    @torch.no_grad()
    def begin(self, target: Target, prefill: Verified) -> None:
        super().begin(target, prefill)
        cap = len(prefill.tokens) + 256
        kvh, hd, dev = target.kv_heads, target.head_dim, target.device
        self.sa_cache = KVCache(1, kvh, hd, cap, dtype=self._dtype, device=dev)
        self.ca_cache = KVCache(1, kvh, hd, cap, dtype=self._dtype, device=dev)
        self.tli_cache = KVCache(max(1, self.config.tli), kvh, hd, cap, dtype=target.dtype, device=dev)
        self._absorb(prefill)

    @torch.no_grad()
    def accept(self, step: Verified) -> None:
        super().accept(step)
        self._absorb(step)

    def _absorb(self, step: Verified) -> None:
        """Bring SA, CA memory and TLI caches up to date with newly verified tokens."""
        if step.layer_kv is None:
            raise ValueError("MoA needs the target's per-layer keys/values (needs.layer_kv)")
        start, dev = step.start_position, self.target.device
        n_new = len(step.tokens)
        positions = start + torch.arange(n_new, device=dev)[None]
        tokens = torch.tensor(step.tokens, dtype=torch.long, device=dev)[None]
        self.sa_cache.crop(start)
        self._sa(tokens, positions, None)
        layer_kv = step.layer_kv.to(dev)
        vec, att = self.lsa(layer_kv, need_weights=True)
        cos, sin = self._rope(positions)
        k, v = self.ca.memory(vec[None], cos, sin)
        self.ca_cache.crop(start)
        self.ca_cache.append(0, k, v)
        self.ca_cache.commit(n_new)
        n, big_l = self.config.tli, self.config.n_target_layers
        if n:
            tcos, tsin = self.target.rope(positions)
            self.tli_cache.crop(start)
            for i in range(n):
                k, v = rope_kv(layer_kv[None, :, big_l - n + i], tcos, tsin, self.target.kv_heads,
                               self.target.head_dim)
                self.tli_cache.append(i, k, v)
            self.tli_cache.commit(n_new)
        self._lsa_attention = att.float().cpu()
        self._lsa_tokens = torch.tensor(step.tokens, dtype=torch.long)
        self._root_token = step.bonus
        self._verified_root = step.bonus
        self._provisional = []

    # ----- offline drafting (client-server) ----------------------------------------------------
    @property
    def n_unverified(self) -> int:
        """Tokens accepted provisionally since the last verified state (the current root among them if > 0)."""
        return len(self._provisional)

    @torch.no_grad()
    def extend_unverified(self, tokens: list[int]) -> None:
        """Accept `tokens` (the continuation of the current root) without the target.

        The current root and tokens[:-1] are run as a chain into the SA and TLI caches, as drafted
        nodes are; CA memory is untouched. tokens[-1] becomes the root for the next `draft()`.
        """
        if not tokens:
            return
        dev = self.target.device
        r = self.sa_cache.length  # the current root's position
        chain = torch.tensor([self._root_token] + list(tokens[:-1]), dtype=torch.long, device=dev)[None]
        positions = r + torch.arange(chain.shape[1], device=dev)[None]
        if self.config.tli:
            self._advance(chain, positions, None)  # TLI needs the predicted states
        else:
            self._sa(chain, positions, None)
        self._provisional += [int(t) for t in tokens]
        self._root_token = int(tokens[-1])

    @torch.no_grad()
    def rollback_unverified(self) -> None:
        """Drop every provisional token: back to the state after the last accept()."""
        verified = self.ca_cache.length  # CA memory only ever holds verified tokens
        self.sa_cache.crop(verified)
        if self.config.tli:
            self.tli_cache.crop(verified)
        self._root_token = self._verified_root
        self._provisional = []

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        if root != self._root_token:
            raise RuntimeError(f"draft() got root {root} but the drafter's root (the last verified bonus token, or "
                               f"the last provisional token) is {self._root_token}")
        cfg = self.config
        r = self.sa_cache.length  # the root's position = number of verified (+ provisional) tokens
        dev = self.target.device
        root_lp = self._step(torch.tensor([[root]], device=dev), torch.tensor([[r]], device=dev), None)[0]

        def expand(batch: Expansion) -> torch.Tensor:
            m = batch.tokens.numel()
            prefix = torch.ones(m, r + 1, dtype=torch.bool)  # verified tokens and the root
            mask = torch.cat([prefix, batch.mask], dim=1).to(dev)[None, None]
            positions = (r + batch.depths).to(dev)[None]
            return self._step(batch.tokens.to(dev)[None], positions, mask).cpu()

        ids = self.vocab.table()
        tree = build_dynamic_tree(root_lp.cpu(), expand, cfg.depth, cfg.top_k, cfg.total_tokens, ids,
                                  self.record_draft_top)
        self.sa_cache.crop(r)
        if cfg.tli:
            self.tli_cache.crop(r)
        tree.extras.update({"lsa_attention": self._lsa_attention, "lsa_tokens": self._lsa_tokens})
        return tree

    # ----- training ----------------------------------------------------------------------------
    def last_verified(self, batch: TrainBatch, period: torch.Tensor | None = None,
                      verified: torch.Tensor | None = None) -> torch.Tensor:
        """v(j) [B, T]: the last verified position strictly before j (-1 if none).

        verified: bool [B, T] overrides the periodic rule; period: [B] overrides the random draw.
        """
        ids = batch.input_ids
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device)[None].expand(b, t)
        if verified is None:
            if period is None:
                period = torch.randint(self.config.period_min, self.config.period_max + 1, (b,), device=ids.device)
            verified = (pos % period.to(ids.device)[:, None] == 0) | (batch.loss_mask == 0)
        upto = torch.where(verified, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # last verified <= j
        return torch.cat([torch.full_like(upto[:, :1], -1), upto[:, :-1]], dim=1)

    def train_forward(self, batch: TrainBatch, last: torch.Tensor,
                      progress: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass mirroring inference. Returns (predicted state, final feature), each [B, T, H]."""
        tgt, cfg = self.target, self.config
        ids = batch.input_ids
        b, t = ids.shape
        big_l, n = cfg.n_target_layers, cfg.tli
        kv = batch.layer_kv
        pos = torch.arange(t, device=ids.device)[None].expand(b, t)
        cos, sin = self._rope(pos)
        rows, cols, lv = pos[:, :, None], pos[:, None, :], last[:, :, None]
        causal = cols <= rows
        # LSA runs on each token on its own, so computing it for every position is exact; CA's mask
        # decides which positions a prediction may read.
        vec, _ = self.lsa(kv.reshape(b * t, big_l, -1))
        vec = vec.view(b, t, -1)
        frac = 1.0 if cfg.staircase_until <= 0 else min(1.0, max(0.0, progress) / cfg.staircase_until)
        window = round(frac * t)
        sa_mask = causal & (cols > lv - window)
        sa_out, _ = decoder_layer(self.sa, tgt.embed_tokens(ids).to(self._dtype), cos, sin, sa_mask[:, None],
                                  None, 0, tgt.head_dim)
        mem_k, mem_v = self.ca.memory(vec, cos, sin)
        # positions with no verified past (only position 0) read position 0: a dummy that keeps the
        # softmax finite; they carry no loss.
        ca_mask = (cols <= lv) | ((lv < 0) & (cols == 0))
        state = self._predict(sa_out, cos, sin, mem_k, mem_v, ca_mask[:, None])
        final = state
        if n:
            tcos, tsin = tgt.rope(pos)
            tli_mask = torch.cat([cols <= lv, causal & (cols > lv)], dim=2)[:, None]  # [true K/V | predicted]
            final = state.to(tgt.dtype)
            for i in range(n):
                k_true, v_true = rope_kv(kv[:, :, big_l - n + i], tcos, tsin, tgt.kv_heads, tgt.head_dim)
                final, _ = decoder_layer(tgt.layers[big_l - n + i], final, tcos, tsin, tli_mask, None, 0,
                                         tgt.head_dim, extra_kv=(k_true, v_true))
        return state, final

    def training_loss(self, batch: TrainBatch, progress: float) -> tuple[torch.Tensor, dict[str, float]]:
        """0.1 * CE(target, drafter) + SmoothL1 on the final feature (0.5/0.5 with the layer L-N state if N > 0).

        The prediction at j counts with weight loss_mask[j] * attention_mask[j] (the query token is
        part of the answer, as every root and drafted token is). Sequences are assumed right-padded.
        """
        cfg = self.config
        big_l, n = cfg.n_target_layers, cfg.tli
        last = self.last_verified(batch)
        state, final = self.train_forward(batch, last, progress)
        t = batch.input_ids.shape[1]
        dist = torch.arange(t, device=last.device)[None] - last
        w = (batch.loss_mask * batch.attention_mask).float() * (last >= 0)
        sel = w > 0
        wr = w[sel]
        f_true = batch.hidden[big_l].detach()
        loss_final = weighted_mean(self.feature_loss_rows(final[sel], f_true[sel]), wr)
        metrics = {}
        if n:
            loss_state = weighted_mean(self.feature_loss_rows(state[sel], batch.hidden[big_l - n].detach()[sel]), wr)
            loss_feat = 0.5 * loss_final + 0.5 * loss_state
            metrics["loss_state"] = float(loss_state.detach())
        else:
            loss_feat = loss_final
        ce, d_top, t_top = distill_terms(self.vocab, final[sel], f_true[sel])
        # the prediction at j is of token j + 1; the last one lies past the data (padded in-vocabulary)
        ids = batch.input_ids
        next_ids = torch.cat([ids[:, 1:], self.vocab.to_token_ids(torch.zeros_like(ids[:, :1]))], dim=1)
        t_top = target_tokens_in_vocab(self.vocab, t_top, next_ids[sel])
        loss_ce = weighted_mean(ce, wr)
        loss = loss_feat + cfg.ce_weight * loss_ce
        agree = (d_top == t_top).float()
        metrics.update({"loss": float(loss.detach()), "loss_feat": float(loss_feat.detach()),
                        "loss_final": float(loss_final.detach()), "loss_ce": float(loss_ce.detach()),
                        "acc": float(weighted_mean(agree, wr))})
        d_sel = dist[sel]
        for d in range(1, ACC_DISTANCES + 1):
            at = d_sel == d
            if bool(at.any()):
                metrics[f"acc@{d}"] = float(weighted_mean(agree[at], wr[at]))
        return loss, metrics
