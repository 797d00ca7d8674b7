"""Packed oneDNN matmuls (core.layers.linear): the same numbers as F.linear, and never stale after an edit."""

import pytest
import torch
import torch.nn.functional as F

import core.layers as layers_mod
from core.drafters.base import Drafter
from core.kv_cache import KVCache
from core.layers import append_layer_kv, linear, pack_linears, pack_weight, run_layer
from core.target import tiny_target
from core.trees.draft_tree import DraftTree
from tests.helpers import assert_greedy_lossless

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")


def _packs(dtype: torch.dtype) -> bool:
    try:
        pack_weight(torch.ones(8, 8, dtype=dtype))
        return True
    except RuntimeError:  # e.g. oneDNN's bfloat16 reorder needs AVX512 (or AVX-NE-CONVERT)
        return False


needs_bf16_packing = pytest.mark.skipif(not _packs(torch.bfloat16),
                                        reason="this CPU has no oneDNN bfloat16 packed kernel")


@pytest.fixture
def packing(monkeypatch):
    """Packed matmuls forced on (bfloat16, CPU), whatever this machine's timing would choose."""
    monkeypatch.setenv("SPECLENS_PACKED_LINEAR", "1")
    layers_mod.packed_linear_wins.cache_clear()
    yield
    monkeypatch.delenv("SPECLENS_PACKED_LINEAR")
    layers_mod.packed_linear_wins.cache_clear()


@needs_bf16_packing
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


@needs_bf16_packing
def test_a_bfloat16_target_gives_the_same_logits_packed_or_not(packing):
    target = tiny_target(seed=4, dtype=torch.bfloat16)
    assert target.packed_matmuls and target.describe()["packed_matmuls"]
    ids = torch.tensor([5, 9, 13, 2, 40, 7, 7, 1])
    packed = target.forward(ids).logits
    for f in target.fused_layers():
        f.packed = None
    target._lm_packed = None
    torch.testing.assert_close(packed, target.forward(ids).logits, atol=0.05, rtol=0.02)


@needs_bf16_packing
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


@needs_bf16_packing
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


def test_packed_float32_rows_do_not_depend_on_their_batch():
    """What float32 losslessness needs from the kernel: a row's numbers are the same alone or among others
    (checked by packed_linear_wins before float32 packing is used), and close to F.linear's."""
    torch.manual_seed(3)
    w, b = torch.randn(96, 64), torch.randn(96)
    packed = pack_weight(w)
    x = torch.randn(9, 64)
    with torch.no_grad():
        together = linear(x, w, b, packed)
        alone = torch.cat([linear(r[None], w, b, packed) for r in x])
    assert torch.equal(together, alone)
    torch.testing.assert_close(together, F.linear(x, w, b), atol=1e-4, rtol=1e-5)


class _GreedyChain(Drafter):
    """Drafts the target's own greedy chain of 3 (recomputed from scratch) plus a wrong sibling."""

    name = "greedy-chain"

    def draft(self, root):
        ids, chain = self.context + [root], []
        for _ in range(3):
            chain.append(int(self.target.forward(torch.tensor(ids + chain)).logits[0, -1].argmax()))
        return DraftTree(torch.tensor(chain + [(chain[0] + 1) % self.target.vocab_size]),
                         torch.tensor([-1, 0, 1, -1]), torch.tensor([0.9, 0.8, 0.7, 0.1]))


def test_a_packed_float32_target_decodes_speculatively_as_it_decodes_plainly(packing):
    target = tiny_target(seed=4)
    assert target.packed_matmuls and target.dtype == torch.float32
    prompts = [[5, 9, 13, 2, 40, 7, 7, 1], [3, 3, 8, 21, 6]]
    taus = assert_greedy_lossless(target, _GreedyChain, prompts, max_new_tokens=24, stop_tokens=set())
    assert min(taus) > 1  # multi-row verify passes were really exercised


def test_a_model_with_packed_copies_can_be_deep_copied(packing):
    import copy

    target = tiny_target(seed=4)
    lin = torch.nn.Linear(64, 32)
    pack_linears(lin)
    ids = torch.tensor([5, 9, 13, 2])
    before = target.forward(ids).logits
    twin, lin_twin = copy.deepcopy(target), copy.deepcopy(lin)
    assert torch.equal(twin.forward(ids).logits, before)
    x = torch.randn(3, 64)
    with torch.no_grad():
        torch.testing.assert_close(lin_twin(x), lin(x))


def test_small_float32_weights_stay_on_f_linear(monkeypatch):
    """In float32 a packed call's fixed cost outweighs its gain on small matrices (MoA's LSA encoder)."""
    monkeypatch.delenv("SPECLENS_PACKED_LINEAR", raising=False)
    monkeypatch.setattr(layers_mod, "packed_linear_wins", lambda dtype, device_type: True)
    assert layers_mod.maybe_pack(torch.randn(384, 128)) is None
    assert isinstance(layers_mod.maybe_pack(torch.randn(1536, 576)), layers_mod.PackedWeight)
    monkeypatch.setenv("SPECLENS_PACKED_LINEAR", "1")  # forced: everything packs
    assert isinstance(layers_mod.maybe_pack(torch.randn(384, 128)), layers_mod.PackedWeight)


def test_inference_copies_are_made_again_only_after_their_weights_change():
    """fused_copy / StackedHeads.of (core.layers.cached_copy): the same copy while the weights stand still, a new
    one with the new numbers after an in-place edit (a training step) or a change of dtype."""
    from core.drafters.medusa import MedusaDrafter
    from core.drafters.trained import StackedHeads
    from core.layers import fused_copy

    target = tiny_target(seed=5)
    layer = target.hf_model.model.layers[0]
    first = fused_copy(layer)
    assert fused_copy(layer) is first
    with torch.no_grad():
        layer.mlp.down_proj.weight.mul_(2.0)
    second = fused_copy(layer)
    assert second is not first and torch.equal(second.down, layer.mlp.down_proj.weight)
    heads = MedusaDrafter.random(target, seed=1).heads
    stacked = StackedHeads.of(heads)
    assert StackedHeads.of(heads) is stacked
    with torch.no_grad():
        heads[0][0].linear.weight.add_(1.0)
    fresh = StackedHeads.of(heads)
    assert fresh is not stacked and torch.equal(fresh.weight[0][0], heads[0][0].linear.weight.t())
    heads.to(torch.bfloat16)
    assert StackedHeads.of(heads).dtype == torch.bfloat16
