"""The target's fused pass (core.layers.FusedLayer): same numbers as the HF model, kept in sync with its weights."""

import pytest
import torch

from core.kv_cache import KVCache
from core.target import tiny_target


def _hf_logits(target, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return target.hf_model(input_ids=ids[None]).logits[0].float()


def test_fused_pass_matches_the_hf_model():
    target = tiny_target(seed=3)
    ids = torch.tensor([5, 9, 13, 2, 40, 7, 7, 1])
    out = target.forward(ids, hidden_layers=(0, target.n_layers), return_layer_kv=True)
    torch.testing.assert_close(out.logits[0], _hf_logits(target, ids), atol=1e-5, rtol=1e-5)
    assert out.layer_kv.shape == (1, len(ids), target.n_layers, 2 * target.kv_width)
    # layer 0's pre-RoPE keys: the k_proj of the normed embedding
    layer = target.layers[0]
    k = layer.self_attn.k_proj(layer.input_layernorm(target.embed_tokens(ids)))
    torch.testing.assert_close(out.layer_kv[0, :, 0, :target.kv_width], k)


def test_hf_modules_share_the_fused_storage():
    target = tiny_target(seed=3)
    f = target.fused_layers()[1]
    q = target.layers[1].self_attn.q_proj.weight
    assert q.data_ptr() == f.qkv.data_ptr()
    ids = torch.tensor([3, 4, 5])
    with torch.no_grad():
        target.layers[1].mlp.up_proj.weight.mul_(0.5)  # an in-place edit through the HF module ...
    torch.testing.assert_close(target.forward(ids).logits[0], _hf_logits(target, ids), atol=1e-5, rtol=1e-5)


def test_a_dtype_change_rebuilds_the_fused_weights():
    target = tiny_target(seed=3)
    ids = torch.tensor([3, 4, 5, 6])
    target.hf_model.to(torch.bfloat16)
    out = target.forward(ids).logits[0]
    assert target.fused_layers()[0].qkv.dtype == torch.bfloat16
    torch.testing.assert_close(out, _hf_logits(target, ids), atol=0.1, rtol=0.05)
    target.hf_model.to(torch.float32)
    torch.testing.assert_close(target.forward(ids).logits[0], _hf_logits(target, ids), atol=1e-5, rtol=1e-5)


def test_cache_is_one_buffer_and_keeps_a_chain_in_place():
    c = KVCache(3, 2, 4, capacity=2)
    assert c.keys[2].data_ptr() != c.keys[0].data_ptr() and c.buffer.shape == (3, 2, 1, 2, 2, 4)
    for layer in range(3):
        k = torch.arange(5.0).view(1, 1, 5, 1).expand(1, 2, 5, 4) + 10 * layer
        c.append(layer, k, -k)
    c.commit(5)  # grew: the views follow the new buffer
    assert c.keys[1].data_ptr() == c.buffer[1, 0].data_ptr()
    c.keep(1, torch.tensor([0, 1]))  # a chain accepted from its start: nothing moves
    assert c.length == 3 and c.layer_view(2)[0][0, 0, :, 0].tolist() == [20, 21, 22]
    c.commit(2)
    c.keep(1, [0, 3])
    assert c.layer_view(2)[0][0, 1, :, 0].tolist() == [20, 21, 24]
    assert torch.equal(c.layer_view(0)[1], -c.layer_view(0)[0])


def test_signed_sin_rotation_equals_hf_rotary():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from core.layers import _rotate_signed, _signed_sin

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 3, 5, 8, generator=gen)  # [B, heads, T, D]
    cos, sin = torch.randn(1, 5, 8, generator=gen), torch.randn(1, 5, 8, generator=gen)
    ref, _ = apply_rotary_pos_emb(q, q, cos, sin)
    got = _rotate_signed(q, cos[:, None], _signed_sin(sin)[:, None])
    assert torch.equal(got, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_equals_llama_rmsnorm(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from core.layers import _rms

    gen = torch.Generator().manual_seed(1)
    norm = LlamaRMSNorm(48, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48, generator=gen).to(dtype))
    x = (3 * torch.randn(5, 48, generator=gen)).to(dtype)
    assert torch.equal(_rms(x, norm.weight, 1e-5), norm(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_table_and_final_norm_equal_the_hf_modules(dtype):
    target = tiny_target(seed=4, dtype=dtype)
    positions = torch.tensor([[0, 1, 7, 30, target.max_positions - 1], [3, 3, 2, 9, 11]])
    dummy = torch.empty(0, dtype=target.dtype)
    ref_cos, ref_sin = target.rotary(dummy, positions)
    cos, sin = target.rope(positions)
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    x = (3 * torch.randn(2, 4, target.hidden_size)).to(dtype)
    assert torch.equal(target.final_norm(x), target.norm(x))


def _attention_reference(q, k, v, mask):
    """softmax(q k^T / sqrt(D) + mask) v in float64, each query head h reading key-value head h // n_rep."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(n_rep, dim=1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 3, 8])
def test_grouped_attention_is_grouped_query_attention(dtype, t):
    from core.layers import attention_bias, grouped_attention

    gen = torch.Generator().manual_seed(t)
    s = 40
    q, k, v = (torch.randn(1, h, n, 16, generator=gen).to(dtype) for h, n in ((6, t), (2, s), (2, s)))
    mask = None if t == 1 else torch.rand(1, 1, t, s, generator=gen) > 0.4
    if mask is not None:
        mask[..., torch.arange(t), torch.arange(s - t, s)] = True  # every token sees itself
    got = grouped_attention(q, k, v, mask)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), _attention_reference(q, k, v, mask), atol=tol, rtol=tol)
    if mask is not None:  # the additive form a pass builds once gives the same numbers as the bool mask
        assert torch.equal(grouped_attention(q, k, v, attention_bias(mask, 3, dtype)), got)

