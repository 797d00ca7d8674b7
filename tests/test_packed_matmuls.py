"""Packed oneDNN matmuls (core.layers.linear): the same numbers as F.linear, and never stale after an edit."""

import pytest
import torch
import torch.nn.functional as F

import core.layers as layers_mod
from core.kv_cache import KVCache
from core.layers import append_layer_kv, linear, pack_linears, pack_weight, run_layer
from core.target import tiny_target

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")


@pytest.fixture
def packing(monkeypatch):
    """Packed matmuls forced on (bfloat16, CPU), whatever this machine's timing would choose."""
    monkeypatch.setenv("SPECLENS_PACKED_LINEAR", "1")
    layers_mod.packed_linear_wins.cache_clear()
    yield
    monkeypatch.delenv("SPECLENS_PACKED_LINEAR")
    layers_mod.packed_linear_wins.cache_clear()


def test_packed_linear_matches_f_linear_in_bfloat16():
    torch.manual_seed(0)
    w = torch.randn(96, 64, dtype=torch.bfloat16)
    b = torch.randn(96, dtype=torch.bfloat16)
    packed = pack_weight(w)
    with torch.no_grad():
        for rows in (1, 5, 24):
            x = torch.randn(rows, 64, dtype=torch.bfloat16)
            torch.testing.assert_close(linear(x, w, b, packed), F.linear(x, w, b), atol=2e-2, rtol=1e-2)
        x3 = torch.randn(2, 3, 64, dtype=torch.bfloat16)
        assert linear(x3, w, None, packed).shape == (2, 3, 96)


def test_a_bfloat16_target_gives_the_same_logits_packed_or_not(packing):
    target = tiny_target(seed=4, dtype=torch.bfloat16)
    assert target.packed_matmuls and target.describe()["packed_matmuls"]
    ids = torch.tensor([5, 9, 13, 2, 40, 7, 7, 1])
    packed = target.forward(ids).logits
    for f in target.fused_layers():
        f.packed = None
    target._lm_packed = None
    torch.testing.assert_close(packed, target.forward(ids).logits, atol=0.05, rtol=0.02)


def test_packed_copies_follow_an_in_place_edit(packing):
    target = tiny_target(seed=4, dtype=torch.bfloat16)
    ids = torch.tensor([3, 4, 5, 6])
    before = target.forward(ids).logits
    with torch.no_grad():
        target.layers[1].mlp.up_proj.weight.mul_(0.0)  # through the HF module, into the fused storage
        target.lm_head.weight.mul_(2.0)
    after = target.forward(ids).logits
    with torch.no_grad():
        ref = target.hf_model(input_ids=ids[None]).logits[0].float()
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after[0], ref, atol=0.25, rtol=0.05)


def test_pack_linears_serves_inference_and_leaves_training_alone(packing):
    torch.manual_seed(1)
    lin = torch.nn.Linear(64, 32, bias=True).to(torch.bfloat16)
    pack_linears(lin)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=2e-2, rtol=1e-2)
        lin.weight.add_(1.0)  # a training step, in place: the stale packed copy must not be used
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias))
    lin(x).float().sum().backward()  # autograd gets F.linear
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0
    pack_linears(lin)  # repacks the edited weight
    assert lin._speclens_packed[1] == layers_mod.stamp(lin.weight)


def test_append_layer_kv_leaves_what_run_layer_leaves():
    target = tiny_target(seed=2)
    f = target.fused_layers()[0]
    x = torch.randn(1, 5, target.hidden_size)
    positions = torch.arange(5)[None]
    cos, sin = target.rope(positions)
    full = KVCache(1, target.kv_heads, target.head_dim, 8)
    kv_only = KVCache(1, target.kv_heads, target.head_dim, 8)
    with torch.no_grad():
        run_layer(f, x, cos, sin, None, full, 0, target.n_heads, target.kv_heads, target.head_dim)
        append_layer_kv(f, x, cos, sin, kv_only, 0, target.n_heads, target.kv_heads, target.head_dim)
    full.commit(5)
    kv_only.commit(5)
    for a, b in zip(full.layer_view(0), kv_only.layer_view(0), strict=True):
        torch.testing.assert_close(a, b)
