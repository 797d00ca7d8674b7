"""Decoder-layer kernels shared by the target (core.target) and the drafters' own layers.

`decoder_layer` / `attend`: one pre-norm Llama layer through the HF modules (RMSNorm, projections, MLP), for
training (autograd) and for drafters' layers that train. `FusedLayer` + `run_layer`: the same layer as plain
tensors, q/k/v stacked into one QKV weight and gate/up into one, for inference: the target's pass
(`fuse_layer`, sharing the HF modules' storage) and drafters' inference copies (`fused_copy`).
`append_layer_kv` runs only the cache half of a layer.

Packed matmuls (our choice, measured per process): on a CPU, oneDNN's matmul on a weight reordered once
into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`, the kernel inductor
uses after freezing) reads the weight faster than `F.linear`, which in bfloat16 re-blocks it on every call
and in float32 switches to a slow kernel as soon as a call has two rows. `packed_linear_wins` times both on
one layer-sized matrix the first time a CPU pass of a dtype is built, checks the kernel can be trusted for
lossless decoding, and keeps the packed path only where it is clearly faster (SPECLENS_PACKED_LINEAR=0/1
overrides). The packed weights are copies used only without autograd: the target's fused layers, its LM head,
drafters' fused layers and drafting vocabularies; training always runs `F.linear`.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from core.kv_cache import KVCache


def attend(
    attn: torch.nn.Module,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    cache: KVCache | None,
    layer: int,
    head_dim: int,
    return_kv: bool = False,
    extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Self-attention of an HF Llama attention module over a KV cache.

    x: [B, T, H] (already normed). mask: bool [B|1, 1, T, S] (True = may attend) over
    the S keys = [extra_kv, cache prefix, new tokens]; None means plain causal over
    the new tokens with the whole prefix visible. Returns the output and, if asked,
    the new tokens' pre-RoPE keys and values flattened to [B, T, 2 * kv_heads * D].
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, t, _ = x.shape
    q = attn.q_proj(x).view(b, t, -1, head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(b, t, -1, head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, -1, head_dim).transpose(1, 2)
    kv_flat = None
    if return_kv:
        kv_flat = torch.cat([k.transpose(1, 2).reshape(b, t, -1), v.transpose(1, 2).reshape(b, t, -1)], dim=-1)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        k, v = cache.append(layer, k, v)
    if extra_kv is not None:
        k = torch.cat([extra_kv[0], k], dim=2)
        v = torch.cat([extra_kv[1], v], dim=2)
    if mask is None:
        s = k.shape[2]
        mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(s - t)[None, None]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    out = out.transpose(1, 2).reshape(b, t, -1)
    return attn.o_proj(out), kv_flat


def decoder_layer(
    layer: torch.nn.Module,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    cache: KVCache | None,
    cache_layer: int,
    head_dim: int,
    return_kv: bool = False,
    extra_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One pre-norm Llama decoder layer (an HF `LlamaDecoderLayer`'s weights) over a KV cache."""
    a, kv = attend(layer.self_attn, layer.input_layernorm(x), cos, sin, mask, cache, cache_layer, head_dim,
                   return_kv, extra_kv)
    x = x + a
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x, kv


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated, so `_rotate_signed` needs no negation per layer."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rotate_signed(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [..., D]: HF's `x * cos + rotate_half(x) * sin`, value for value, since
    rotate_half(x) * sin = swap_halves(x) * signed_sin (a negation is exact), in two fewer operations."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin  # roll by half = swap the halves


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic (float32 statistics, the result cast back, then the weight) in one call:
    F.rms_norm computes a bfloat16 input in float32 and rounds once, as LlamaRMSNorm does."""
    return weight * F.rms_norm(x, (x.shape[-1],), eps=eps).to(x.dtype)  # .to: a no-op unless under autocast


def attention_bias(mask: torch.Tensor, n_rep: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive form of a bool mask [B|1, 1, T, S] (True = may attend) for `grouped_attention`: 0 / -inf
    in `dtype`, its rows repeated for the n_rep query heads that share a key-value head ([B|1, 1, n_rep T, S]).
    A pass builds it once and every layer reuses it."""
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return bias.repeat(1, 1, n_rep, 1) if n_rep > 1 else bias


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + mask) v for grouped-query attention: q [B, Hq, T, D], k and v [B, Hkv, S, D],
    Hq = n_rep Hkv, query head h reading key-value head h // n_rep (HF's layout). mask: None (every key
    visible), bool [B|1, 1, T, S], or `attention_bias` of one.

    Our choice: the n_rep query heads of a group go in as n_rep T query rows of one head, so the kernel runs
    Hkv heads, not Hq heads over repeated keys. Each row's arithmetic is unchanged (the same numbers as
    `enable_gqa=True` where that takes the same kernel), and PyTorch's CPU kernel is much faster this way for
    the few query rows of decoding (docs/ARCHITECTURE.md, "Grouped attention", has the measurements).
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    n_rep = hq // hkv
    if mask is not None and mask.dtype == torch.bool:
        mask = attention_bias(mask, n_rep, q.dtype)
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, n_rep * t, d), k, v, attn_mask=mask)
    return out.view(b, hq, t, d)


def _time_ms(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1000.0 * (time.perf_counter() - t0) / repeats


def _packing_override() -> str:
    """SPECLENS_PACKED_LINEAR: "1" packs every weight, "0" none, anything else leaves it to the timing."""
    return os.environ.get("SPECLENS_PACKED_LINEAR", "").strip()


@functools.cache
def packed_linear_wins(dtype: torch.dtype, device_type: str) -> bool:
    """Whether packed oneDNN matmuls beat F.linear here: timed once per process on a 1536 x 576 weight (one
    Llama MLP projection) at 1 and 16 rows, kept only if at least 10% faster. Never on GPUs.

    The kernel must also be trustworthy for lossless decoding. In bfloat16 its one-row result must equal
    F.linear's. In float32 it differs from F.linear in the last bits, so it must instead be batch-invariant:
    each row of a 2-, 5- or 16-row call equals that row computed alone, so a token's numbers do not depend
    on how many tokens share its pass (F.linear's float32 kernels are not: one row and several take
    different paths).
    """
    env = _packing_override()
    if env in ("0", "1"):
        return env == "1" and device_type == "cpu"
    if device_type != "cpu" or dtype not in (torch.bfloat16, torch.float32) or not torch.backends.mkldnn.is_available():
        return False
    try:
        with torch.no_grad():
            w = torch.randn(1536, 576, dtype=dtype)
            packed = pack_weight(w)
            rows = torch.randn(16, 576, dtype=dtype)
            if dtype == torch.bfloat16:
                trusted = torch.equal(linear(rows[:1], w, None, packed), F.linear(rows[:1], w))
            else:
                alone = torch.cat([linear(r[None], w, None, packed) for r in rows])
                trusted = all(torch.equal(linear(rows[:m], w, None, packed), alone[:m]) for m in (2, 5, 16))
            if not trusted:
                return False  # a kernel that breaks these is not worth the doubt
            plain_ms = packed_ms = 0.0
            for x in (rows[:1], rows):
                plain_ms += _time_ms(functools.partial(F.linear, x, w), 20)
                packed_ms += _time_ms(functools.partial(linear, x, w, None, packed), 20)
    except (RuntimeError, AttributeError):  # no oneDNN kernel for this CPU / build
        return False
    return packed_ms <= 0.9 * plain_ms


class PackedWeight:
    """A weight [out, in] reordered for oneDNN's matmul (see `linear`): an opaque tensor, which
    `copy.deepcopy` cannot copy. It is never edited (an edited weight gets a new one), so a deep copy of a
    model shares it; the copy's own weights live elsewhere, and the stamps that guard each packed copy see that."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __deepcopy__(self, memo: dict) -> PackedWeight:
        return self


def pack_weight(weight: torch.Tensor) -> PackedWeight:
    """A packed copy of `weight` [out, in] for `linear`."""
    return PackedWeight(torch.ops.mkldnn._reorder_linear_weight(weight.detach()))


def linear(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
           packed: PackedWeight | None = None) -> torch.Tensor:
    """x @ weight.T + bias, through the packed weight when there is one and autograd is off."""
    if packed is None or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed.tensor, bias, "none", [], "")


# In float32 a packed call carries a fixed cost of some 20-40 us that F.linear's small-matrix kernels do not:
# below about 256k weights (MoA's LSA encoder: 49k-73k) packing made them slower, above it faster.
FLOAT32_PACK_MIN = 256 * 1024


def maybe_pack(weight: torch.Tensor) -> PackedWeight | None:
    """The packed copy of `weight` where packed matmuls win for its dtype, size and device, else None."""
    if weight.dim() != 2 or not packed_linear_wins(weight.dtype, weight.device.type):
        return None
    if weight.dtype == torch.float32 and weight.numel() < FLOAT32_PACK_MIN and _packing_override() != "1":
        return None
    return pack_weight(weight)


def stamp(weight: torch.Tensor) -> tuple:
    """What identifies a weight's current numbers: storage, dtype and in-place version counter."""
    return weight.data_ptr(), weight.dtype, weight._version


def _packed_linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packed, packed_for = module._speclens_packed
    if packed_for != stamp(module.weight) or x.dtype != module.weight.dtype:  # trained or moved since: plain path
        return F.linear(x, module.weight, module.bias)
    return linear(x, module.weight, module.bias, packed)


def pack_linears(module: torch.nn.Module) -> None:
    """Give every nn.Linear in `module` a packed copy of its weight for inference (see `linear`), where packed
    matmuls win here. Idempotent; a weight changed in place since (a training step) is noticed through its
    version counter and served by F.linear until the next call repacks it; autograd always gets F.linear."""
    for m in module.modules():
        if not isinstance(m, torch.nn.Linear):
            continue
        known = getattr(m, "_speclens_packed", None)
        if known is not None and known[1] == stamp(m.weight):
            continue
        packed = maybe_pack(m.weight.detach())
        if packed is None:
            continue
        m._speclens_packed = (packed, stamp(m.weight))
        m.forward = functools.partial(_packed_linear_forward, m)


@dataclass
class FusedLayer:
    """One frozen target layer as plain tensors: what `Target.forward` runs, built once at load.

    `qkv` stacks q_proj, k_proj and v_proj ([q + 2 kv, H]) and `gate_up` stacks gate_proj and up_proj
    ([2 I, H]); the HF modules' own weights are re-pointed at views of these, so both always hold the same
    numbers (an in-place edit of either shows in the other) and nothing is stored twice.
    """

    in_norm: torch.Tensor | None  # None: the layer has no input norm (an EAGLE-1/2 drafter's layer 0)
    in_eps: float
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    post_eps: float
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    act: object
    packed: tuple | None = None  # (qkv, o, gate_up, down) packed for oneDNN (`linear`), or None
    packed_stamp: tuple = ()  # the four matrices' _stamp when packed: an in-place edit since shows here

    def _stamps(self) -> tuple:
        return tuple(stamp(w) for w in (self.qkv, self.o, self.gate_up, self.down))

    def pack(self) -> FusedLayer:
        """Give the layer packed copies of its four matrices where packed matmuls win here (see `linear`)."""
        mats = [maybe_pack(w) for w in (self.qkv, self.o, self.gate_up, self.down)]
        self.packed = tuple(mats) if all(m is not None for m in mats) else None
        self.packed_stamp = self._stamps() if self.packed else ()
        return self

    def repack_if_edited(self) -> None:
        if self.packed is not None and self.packed_stamp != self._stamps():
            self.pack()


def _fuse_linears(mods: Sequence[torch.nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack the weights (and biases) of Linear modules into one tensor; point the modules at views of it."""
    weight = torch.cat([m.weight.detach() for m in mods], dim=0)
    has_bias = any(getattr(m, "bias", None) is not None for m in mods)
    bias = torch.cat([m.bias.detach() if m.bias is not None else weight.new_zeros(m.weight.shape[0])
                      for m in mods]) if has_bias else None
    row = 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[row:row + n], requires_grad=False)
        if m.bias is not None:
            m.bias = torch.nn.Parameter(bias[row:row + n], requires_grad=False)
        row += n
    return weight, bias


def fuse_layer(layer: torch.nn.Module) -> FusedLayer:
    """A `FusedLayer` from an HF Llama decoder layer (whose projections then share the fused storage)."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv, qkv_bias = _fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up, gate_up_bias = _fuse_linears([mlp.gate_proj, mlp.up_proj])
    return FusedLayer(
        in_norm=layer.input_layernorm.weight.detach(), in_eps=float(layer.input_layernorm.variance_epsilon),
        qkv=qkv, qkv_bias=qkv_bias, o=attn.o_proj.weight.detach(),
        o_bias=attn.o_proj.bias.detach() if attn.o_proj.bias is not None else None,
        post_norm=layer.post_attention_layernorm.weight.detach(),
        post_eps=float(layer.post_attention_layernorm.variance_epsilon),
        gate_up=gate_up, gate_up_bias=gate_up_bias, down=mlp.down_proj.weight.detach(),
        down_bias=mlp.down_proj.bias.detach() if mlp.down_proj.bias is not None else None, act=mlp.act_fn)




def fused_copy(layer: torch.nn.Module) -> FusedLayer:
    """A `FusedLayer` holding *copies* of an HF decoder layer's weights, the module left untouched: for a
    drafter's own (trainable) layers, asked for at each `begin`. The copy is made again only when one of the
    layer's weights has changed since the last call (a training step, a load, a move): otherwise the one made
    then is returned, which saves a conversation's prefill the copying and packing."""
    return cached_copy(layer, "fused_copy", layer.parameters(), lambda: _fused_copy(layer))


def cached_copy(owner: torch.nn.Module, name: str, sources: Iterable[torch.Tensor], build: Callable[[], Any]) -> Any:
    """`build()`, an inference copy made from the tensors `sources`, kept on `owner` under `name` and made again
    only when one of those tensors has changed since (its storage, dtype or in-place version: `stamp`)."""
    stamps = tuple(stamp(t) for t in sources)
    key = f"_speclens_copy_{name}"
    known = owner.__dict__.get(key)
    if known is not None and known[0] == stamps:
        return known[1]
    made = build()
    owner.__dict__[key] = (stamps, made)  # beside the module's attributes: not a parameter, not saved
    return made


def _fused_copy(layer: torch.nn.Module) -> FusedLayer:
    with torch.no_grad():
        attn, mlp = layer.self_attn, layer.mlp

        def stack(mods):
            w = torch.cat([m.weight.detach() for m in mods], dim=0)
            if not any(m.bias is not None for m in mods):
                return w, None
            return w, torch.cat([m.bias.detach() if m.bias is not None else w.new_zeros(m.weight.shape[0])
                                 for m in mods])

        qkv, qkv_bias = stack([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up, gate_up_bias = stack([mlp.gate_proj, mlp.up_proj])
        norm = layer.input_layernorm  # an nn.Identity where the layer has no input norm (EAGLE's layer 0)
        return FusedLayer(  # packed too where that wins: it serves inference only
            in_norm=norm.weight.detach().clone() if hasattr(norm, "weight") else None,
            in_eps=float(getattr(norm, "variance_epsilon", 0.0)), qkv=qkv, qkv_bias=qkv_bias,
            o=attn.o_proj.weight.detach().clone(),
            o_bias=attn.o_proj.bias.detach().clone() if attn.o_proj.bias is not None else None,
            post_norm=layer.post_attention_layernorm.weight.detach().clone(),
            post_eps=float(layer.post_attention_layernorm.variance_epsilon), gate_up=gate_up,
            gate_up_bias=gate_up_bias, down=mlp.down_proj.weight.detach().clone(),
            down_bias=mlp.down_proj.bias.detach().clone() if mlp.down_proj.bias is not None else None,
            act=mlp.act_fn).pack()


def run_layer(
    f: FusedLayer,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    cache: KVCache | None,
    cache_layer: int,
    n_heads: int,
    kv_heads: int,
    head_dim: int,
    return_kv: bool = False,
    signed_sin: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One pre-norm Llama decoder layer from a `FusedLayer` (inference only: no autograd use intended).

    The same contract as `decoder_layer`: x [B, T, H] (not normed); cos, sin [B, T, D] or [B, T, 1, D], in
    x's dtype; mask bool [B|1, 1, T, S] over [cache prefix, new tokens] (or its `attention_bias`, made once
    per pass) or None (T = 1: every key visible; T > 1: causal over the new tokens, the prefix visible).
    Returns the output and, if asked, the new tokens' pre-RoPE keys then values [B, T, 2 * kv_heads * D]
    (a view of the fused projection's output).
    `signed_sin=True`: `sin` is already `_signed_sin(sin)` (Target.forward makes it once per pass).
    """
    b, t, _ = x.shape
    if cos.dim() == 3:
        cos, sin = cos[:, :, None], sin[:, :, None]
    if not signed_sin:
        sin = _signed_sin(sin)
    qw, kw = n_heads * head_dim, kv_heads * head_dim
    p_qkv, p_o, p_gate_up, p_down = f.packed or (None,) * 4
    h = x if f.in_norm is None else _rms(x, f.in_norm, f.in_eps)
    qkv = linear(h, f.qkv, f.qkv_bias, p_qkv)  # [B, T, q + k + v]
    kv = qkv[..., qw:] if return_kv else None
    qk = _rotate_signed(qkv[..., :qw + kw].view(b, t, n_heads + kv_heads, head_dim), cos, sin).transpose(1, 2)
    q, k = qk[:, :n_heads], qk[:, n_heads:]
    v = qkv[..., qw + kw:].view(b, t, kv_heads, head_dim).transpose(1, 2)
    if cache is not None:
        k, v = cache.append(cache_layer, k, v)
    if mask is None and t > 1:
        s = k.shape[2]
        mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril(s - t)[None, None]
    a = grouped_attention(q, k, v, mask)
    x = x + linear(a.transpose(1, 2).reshape(b, t, qw), f.o, f.o_bias, p_o)
    h = _rms(x, f.post_norm, f.post_eps)
    gate, up = linear(h, f.gate_up, f.gate_up_bias, p_gate_up).chunk(2, dim=-1)
    x = x + linear(f.act(gate) * up, f.down, f.down_bias, p_down)
    return x, kv


def append_layer_kv(f: FusedLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                    cache_layer: int, n_heads: int, kv_heads: int, head_dim: int) -> None:
    """Only the cache half of `run_layer`: append the roped keys and values of x [B, T, H] (cos, sin
    [B, T, D] in x's dtype) to `cache`, the same numbers `run_layer` would append, without attention or MLP.
    For tokens whose layer output nobody reads (a drafter's verified context); the caller commits."""
    b, t, _ = x.shape
    qw, kw = n_heads * head_dim, kv_heads * head_dim
    h = x if f.in_norm is None else _rms(x, f.in_norm, f.in_eps)
    qkv = linear(h, f.qkv, f.qkv_bias, f.packed[0] if f.packed else None)
    k = _rotate_signed(qkv[..., qw:qw + kw].view(b, t, kv_heads, head_dim), cos[:, :, None],
                       _signed_sin(sin[:, :, None])).transpose(1, 2)
    v = qkv[..., qw + kw:].view(b, t, kv_heads, head_dim).transpose(1, 2)
    cache.append(cache_layer, k, v)
