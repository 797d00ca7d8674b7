"""Amphista: losslessness, checkpoints, the adaptation cache, the bidirectional auto-embedding block."""

from __future__ import annotations

import pytest
import torch

from core.decoding import generate
from core.drafters.amphista import AmphistaDrafter
from core.drafters.base import Autoregressive, Drafter, Verified
from core.kv_cache import KVCache
from core.trees.draft_tree import DraftTree
from tests.helpers import assert_greedy_lossless
from tests.test_medusa import (
    check_draft_top,
    check_greedy_lossless,
    check_mismatch_and_corrupt,
    check_roundtrip,
    check_sampling,
    check_subset_training_loss,
    check_subset_vocab,
    check_training_loss,
    prefill,
    real_target_f32,
    tiny,
)


def test_greedy_lossless():
    check_greedy_lossless(AmphistaDrafter)


def test_sampling_matches_target_distribution():
    check_sampling(AmphistaDrafter)


def test_save_load_roundtrip(tmp_path):
    check_roundtrip(AmphistaDrafter, tmp_path)


def test_mismatch_and_corrupt(tmp_path):
    check_mismatch_and_corrupt(AmphistaDrafter, tmp_path)


def test_training_loss_and_metrics():
    check_training_loss(AmphistaDrafter)


def test_subset_vocab(tmp_path):
    check_subset_vocab(AmphistaDrafter, tmp_path)


def test_subset_vocab_training_loss():
    check_subset_training_loss(AmphistaDrafter)


def test_draft_top_extras():
    target = tiny()
    drafter = AmphistaDrafter.random(target, seed=0, tree_size=9, tree_depth=3)
    pre = prefill(target, [1, 2, 3])
    drafter.begin(target, pre)
    check_draft_top(drafter, drafter.draft(pre.bonus))


class OracleChains(Drafter):
    """Wraps an Amphista drafter (begin/accept/draft all run) but proposes chains that are right for
    0, 1, 2, 0, ... tokens (cycle by cycle) and then wrong, so every acceptance length occurs."""

    def __init__(self, inner: AmphistaDrafter, greedy: list[int], n_prompt: int) -> None:
        self.inner, self.greedy, self.n_prompt = inner, greedy, n_prompt
        self.needs = inner.needs
        self.bonus = None
        self.cycle = 0

    def begin(self, target, pre: Verified) -> None:
        self.inner.begin(target, pre)
        self.bonus = pre.bonus

    def accept(self, step: Verified) -> None:
        self.inner.accept(step)
        self.bonus = step.bonus

    def draft(self, root: int) -> DraftTree:
        self.inner.draft(root)
        j = len(self.inner.context) - self.n_prompt  # index of the root in the greedy output
        right = self.greedy[j + 1: j + 1 + self.cycle % 3]
        self.cycle += 1
        wrong = (self.greedy[j + 1 + len(right)] + 1) % 64
        return DraftTree.chain(right + [wrong])


def test_adaptation_cache_holds_exactly_the_verified_positions():
    target = tiny()
    prompt = [7, 3, 29, 41, 12, 5]
    greedy = generate(target, Autoregressive(), prompt, 40, stop_tokens=set()).token_ids
    inner = AmphistaDrafter.random(target, seed=5)
    oracle = OracleChains(inner, greedy, len(prompt))
    out = generate(target, oracle, prompt, 16, stop_tokens=set())
    assert out.token_ids == greedy[:16]
    assert sorted({e.accepted_len for e in out.events[1:]}) == [0, 1, 2]  # partial acceptance happened

    context = inner.context  # prompt + every verified token; the last bonus is the next root
    n = len(context)
    assert inner.cache.length == n
    # From scratch: the target over the verified context, then the adaptation layers in one causal pass.
    hidden = target.forward(torch.tensor(context), hidden_layers=(target.n_layers,)).hidden[target.n_layers]
    nxt = torch.tensor(context[1:] + [oracle.bonus])[None]
    pos = torch.arange(n)[None]
    fresh = KVCache(2, target.kv_heads, target.head_dim, n)
    with torch.no_grad():
        s1, s2 = inner.adapt(hidden, nxt, pos, cache=fresh)
        m1, m2 = inner.adapt(hidden, nxt, pos, mask=torch.ones(n, n, dtype=torch.bool).tril()[None, None])
    for layer in range(2):
        torch.testing.assert_close(inner.cache.keys[layer][:, :, :n], fresh.keys[layer][:, :, :n])
        torch.testing.assert_close(inner.cache.values[layer][:, :, :n], fresh.values[layer][:, :, :n])
    torch.testing.assert_close(inner.stage_out[0], s1[0, -1])
    torch.testing.assert_close(inner.stage_out[1], s2[0, -1])
    torch.testing.assert_close(m2, s2)  # the training path (mask, no cache) computes the same states


def test_auto_embedding_is_bidirectional_across_heads():
    target = tiny()
    drafter = AmphistaDrafter.random(target, seed=0)
    states = torch.randn(2, 4, target.hidden_size)
    with torch.no_grad():
        before = drafter.auto_embed(states)
        changed = states.clone()
        changed[:, 3] += 1.0  # a later head's input
        after = drafter.auto_embed(changed)
    assert not torch.allclose(before[:, 0], after[:, 0])  # reaches the earliest head
    # and through the whole drafter: perturbing the last head's weights moves head 0's logits
    pre = prefill(target, [9, 8, 7, 6])
    drafter.begin(target, pre)
    with torch.no_grad():
        z0 = drafter.lm_logits(drafter.auto_embed(drafter.head_states(*drafter.stage_out)))
        drafter.heads[3][0].linear.weight.add_(0.5)
        z1 = drafter.lm_logits(drafter.auto_embed(drafter.head_states(*drafter.stage_out)))
    assert not torch.allclose(z0[0], z1[0])


def test_stage_split_and_fresh_init_equals_lm_head():
    target = tiny()
    drafter = AmphistaDrafter.random(target, seed=0)
    assert drafter.split == 2  # heads 0, 1 read stage 1; heads 2, 3 read stage 2
    fresh = AmphistaDrafter(drafter.config, target)  # no noise: identity fuse, zeroed residual branches
    pre = prefill(target, [9, 8, 7, 6])
    fresh.begin(target, pre)
    with torch.no_grad():
        logits = fresh.lm_logits(fresh.auto_embed(fresh.head_states(*fresh.stage_out)))
    feature = pre.hidden[target.n_layers][-1]
    assert (logits.argmax(-1) == target.logits(feature).argmax(-1)).all()


@pytest.mark.real
def test_real_target_greedy_lossless():
    target = real_target_f32()
    prompt = target.chat_ids("Name three primary colours.")
    taus = assert_greedy_lossless(target, lambda: AmphistaDrafter.random(target, seed=0), [prompt],
                                  max_new_tokens=24)
    assert taus[0] >= 1.0


def test_inference_copies_draft_what_the_modules_compute():
    """draft() runs begin()'s fused layers and batched heads (StackedHeads); its tree equals the one the
    training modules give (head_states + auto_embed)."""
    target = tiny()
    drafter = AmphistaDrafter.random(target, seed=3)
    pre = prefill(target, [9, 8, 7, 6, 5])
    drafter.begin(target, pre)
    fast = drafter.draft(pre.bonus)
    with torch.no_grad():
        want = drafter.tree_from_logits(drafter.lm_logits(drafter.auto_embed(drafter.head_states(*drafter.stage_out))))
    assert torch.equal(fast.tokens, want.tokens)
    assert torch.allclose(fast.draft_probs, want.draft_probs, atol=1e-5)
