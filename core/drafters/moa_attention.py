"""MoA's attention blocks (core/drafters/moa.py is the drafter): Layer Self-Attention over one token's
per-layer keys and values, cross-attention from the drafter's stream onto LSA vectors, and the fused inference
copy of what runs per drafted token (CA, its MLP, the head). Split from moa.py by concern: these are the
network's parts, moa.py the drafting cycle and training that use them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from core.drafters.trained import rope_kv
from core.layers import _rms, _rotate_signed, _signed_sin, cached_copy, grouped_attention, linear, maybe_pack


@dataclass
class FusedPredict:
    """Inference copies of what `_predict` runs per drafted token (CA, the CA MLP, the head), stacked and
    packed as core.layers does for decoder layers; rebuilt by begin(), so training in between is picked up."""

    ca_norm: torch.Tensor
    ca_eps: float
    q: torch.Tensor
    o: torch.Tensor
    mlp: tuple | None  # the CA MLP block: (norm weight, eps, gate and up stacked, down, activation)
    out_norm: torch.Tensor
    out_eps: float
    head: torch.Tensor
    packed: tuple  # packed q, o, head, gate_up, down (None each where packed matmuls do not win here)
    kv: torch.Tensor  # CA's k_proj and v_proj stacked [2 kv, H]: the memory in one matmul
    kv_packed: object
    heads: int
    kv_heads: int
    head_dim: int
    scale: float  # the drafter's feature_scale: predicted states back in the target's units
    memory_norm: bool  # MoAConfig.memory_norm: memory rows pass ca_norm before the keys and values

    @classmethod
    @torch.no_grad()
    def from_drafter(cls, d: nn.Module) -> FusedPredict:
        """The copies from a MoA drafter's current weights."""
        q, o, head = (m.weight.detach().clone() for m in (d.ca.q_proj, d.ca.o_proj, d.head))
        mlp, mats = None, [q, o, head]
        if d.config.ca_mlp:
            gate_up = torch.cat([d.mlp.gate_proj.weight.detach(), d.mlp.up_proj.weight.detach()])
            down = d.mlp.down_proj.weight.detach().clone()
            mlp = (d.mlp_norm.weight.detach().clone(), float(d.mlp_norm.variance_epsilon), gate_up, down, d.mlp.act_fn)
            mats += [gate_up, down]
        kv = torch.cat([d.ca.k_proj.weight.detach(), d.ca.v_proj.weight.detach()])
        return cls(ca_norm=d.ca_norm.weight.detach().clone(), ca_eps=float(d.ca_norm.variance_epsilon), q=q, o=o,
                   mlp=mlp, out_norm=d.out_norm.weight.detach().clone(), out_eps=float(d.out_norm.variance_epsilon),
                   head=head, packed=tuple(maybe_pack(w) for w in mats) + (None,) * (5 - len(mats)), kv=kv,
                   kv_packed=maybe_pack(kv), heads=d.ca.heads, kv_heads=d.ca.kv_heads, head_dim=d.ca.head_dim,
                   scale=float(d.config.feature_scale), memory_norm=bool(d.config.memory_norm))

    @classmethod
    def cached(cls, d: nn.Module) -> FusedPredict:
        """`from_drafter(d)`, made again only when a weight it copies has changed (core.layers.cached_copy)."""
        parts = [getattr(d, n) for n in ("ca", "ca_norm", "mlp", "mlp_norm", "out_norm", "head") if hasattr(d, n)]
        return cached_copy(d, f"fused_predict_x{d.config.feature_scale}", [p for m in parts for p in m.parameters()],
                           lambda: cls.from_drafter(d))

    def memory(self, vec: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """MoADrafter.memory on these copies: LSA vectors [B, S, H] -> roped keys, values [B, kv_heads, S, D]."""
        if self.memory_norm:
            vec = _rms(vec, self.ca_norm, self.ca_eps)
        return rope_kv(linear(vec, self.kv, None, self.kv_packed), cos, sin, self.kv_heads, self.head_dim)

    def predict(self, sa_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mem_k: torch.Tensor,
                mem_v: torch.Tensor, mem_mask: torch.Tensor | None = None) -> torch.Tensor:
        """MoADrafter._predict over the whole (verified) memory: the same arithmetic in fewer calls (one RMSNorm
        call each, q rotated once, gate and up in one matmul, packed weights) -> the state in target units.
        mem_mask: bool [1, 1, T, S], the memory columns each row reads (None: all; a fixed-capacity memory
        on static levels hides its unwritten columns this way)."""
        b, t, _ = sa_out.shape
        heads, hd = self.heads, self.head_dim
        p_q, p_o, p_head, p_gate_up, p_down = self.packed
        q = linear(_rms(sa_out, self.ca_norm, self.ca_eps), self.q, None, p_q).view(b, t, heads, hd)
        q = _rotate_signed(q, cos[:, :, None], _signed_sin(sin[:, :, None])).transpose(1, 2)
        a = grouped_attention(q, mem_k, mem_v, mem_mask)
        h = sa_out + linear(a.transpose(1, 2).reshape(b, t, heads * hd), self.o, None, p_o)
        if self.mlp is not None:
            norm, eps, gate_up, down, act = self.mlp
            gate, up = linear(_rms(h, norm, eps), gate_up, None, p_gate_up).chunk(2, dim=-1)
            h = h + linear(act(gate) * up, down, None, p_down)
        out = linear(_rms(h, self.out_norm, self.out_eps), self.head, None, p_head)
        return out if self.scale == 1.0 else out * self.scale


class LayerSelfAttention(nn.Module):
    """One bidirectional encoder layer over the target's L layers of one token's keys+values.

    dim = kv_width (full width, the reference layout): the layers attend to each other over the whole
    K+V of each layer, with no projection before the attention; otherwise K+V is narrowed to `dim` first.
    final_feature (MoAConfig.final_feature, our addition): a second vector per token, its final target
    feature normalised and projected (zero-initialised, so a drafter continued with it starts out computing
    what it did), is returned beside the first ([n, 2 * hidden]). The server computes it with the rest of LSA,
    so the client-server split is unchanged; `out_width` says how wide a row is. `final_gain` multiplies
    that second vector: the stream it joins has a token-to-token spread near 50 per channel (SA starts as
    the target's first layer, which writes large activations), so a unit-scale feature is drowned.
    """

    def __init__(self, n_layers: int, kv_width: int, dim: int, heads: int, hidden: int, mlp_ratio: int = 4,
                 final_feature: bool = False, final_gain: float = 1.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"the LSA width {dim} must be divisible by lsa_heads {heads}")
        self.heads = heads
        self.in_norm = nn.LayerNorm(kv_width)  # keys and values come at the target's own (varied) scales
        self.inp = nn.Identity() if dim == kv_width else nn.Linear(kv_width, dim)
        self.layer_pos = nn.Parameter(torch.randn(n_layers, dim) * 0.02)  # position = the layer index
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))
        self.out_norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, hidden)
        self.reads_final = final_feature
        self.final_gain = float(final_gain)
        self.out_width = 2 * hidden if final_feature else hidden
        if final_feature:
            self.feat_norm = nn.LayerNorm(hidden)  # the final feature has a few channels of very large scale
            self.feat = nn.Linear(hidden, hidden, bias=False)
            nn.init.zeros_(self.feat.weight)

    def forward(self, kv: torch.Tensor, need_weights: bool = False,
                final: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """kv: [n, L, kv_width], final: [n, hidden] (read only with final_feature) -> (vectors [n, out_width],
        attention [n, L, L] averaged over heads, or None)."""
        n, length, _ = kv.shape
        x = self.inp(self.in_norm(kv.to(self.qkv.weight.dtype))) + self.layer_pos
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
        vec = self.out(self.out_norm(x.mean(1)))
        if self.reads_final:
            if final is None:
                raise ValueError("this LSA reads the target's final feature (final_feature=True); none was given")
            vec = torch.cat([vec, self.final_gain * self.feat(self.feat_norm(final.to(vec.dtype)))], dim=-1)
        return vec, weights


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
