"""EAGLE-2 drafter: losslessness, tree masks vs chain evaluation, cache invariants, save/load, training."""

from __future__ import annotations

import functools

import pytest
import torch

from core.decoding import generate
from core.drafters.base import Autoregressive, Verified
from core.drafters.checkpoint import DrafterMismatchError, TrainBatch
from core.drafters.eagle2 import Eagle2Drafter
from core.target import Target, tiny_target
from tests.helpers import ALPHA, assert_greedy_lossless, brute_force_tree_logits, sampling_p_value, tiny_prompts

VOCAB = 64


# ----- helpers shared with tests/test_moa.py -------------------------------------------------------
@functools.lru_cache(maxsize=1)
def real_target_f32() -> Target:
    from core.target import load_target

    return load_target(None, "float32", "cpu")


def self_distill_batch(target: Target, needs, prompts: list[list[int]], n_new: int = 32) -> TrainBatch:
    """The target's own greedy answers to `prompts` (equal lengths), with its activations."""
    seqs = [p + generate(target, Autoregressive(), p, n_new, stop_tokens=set()).token_ids for p in prompts]
    ids = torch.tensor(seqs)
    loss_mask = torch.zeros_like(ids, dtype=torch.float)
    loss_mask[:, len(prompts[0]):] = 1
    out = target.forward(ids, hidden_layers=needs.hidden_layers, return_layer_kv=needs.layer_kv)
    return TrainBatch(ids, loss_mask, torch.ones_like(loss_mask), out.hidden, out.layer_kv, target)


def quick_train(drafter, batch: TrainBatch, steps: int = 30, lr: float = 3e-3) -> dict:
    """Overfit a drafter on a batch so that drafts get accepted (exercises multi-token acceptance)."""
    drafter.train()
    opt = torch.optim.Adam(drafter.parameters(), lr=lr)
    for i in range(steps):
        loss, metrics = drafter.training_loss(batch, i / steps)
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()
    return metrics


def prefill(target: Target, prompt: list[int], needs) -> Verified:
    out = target.forward(torch.tensor(prompt), hidden_layers=needs.hidden_layers, return_layer_kv=needs.layer_kv)
    root = int(out.logits[0, -1].argmax())
    kv = out.layer_kv[0] if out.layer_kv is not None else None
    return Verified(list(prompt), root, 0, {k: v[0] for k, v in out.hidden.items()}, kv)


def check_target_tree_pass(target: Target, prompt: list[int], root: int, tree) -> None:
    """The decode loop's tree pass (mask + positions) equals chain-by-chain evaluation."""
    cache = target.new_cache()
    target.forward(torch.tensor(prompt), cache=cache)
    ids = torch.cat([torch.tensor([root]), tree.tokens])
    positions = len(prompt) + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths()])
    logits = target.forward(ids, positions, cache, tree_mask=tree.attention_mask()).logits[0]
    brute = brute_force_tree_logits(target, prompt, root, tree.tokens.tolist(), tree.parents.tolist())
    assert torch.allclose(logits, brute, atol=1e-4)


def check_draft_top(tree, vocab_ids: set[int] | None = None) -> None:
    """extras["draft_top"]: one row per [root, nodes...]; each node is among its parent's row, same prob."""
    rows = tree.extras["draft_top"]
    assert len(rows) == len(tree) + 1 and len(rows[0]) == 10
    for row in rows:
        probs = [p for _, p in row]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-5
        assert vocab_ids is None or all(t in vocab_ids for t, _ in row)
    for i in range(len(tree)):  # top_k <= 10: every child is in its parent's row
        row = dict((t, p) for t, p in rows[int(tree.parents[i]) + 1])
        assert abs(row[int(tree.tokens[i])] - float(tree.draft_probs[i])) < 1e-5


def check_subset_drafting(target: Target, make_drafter, prompts: list[list[int]], ids: torch.Tensor,
                          n_new: int = 24) -> list[float]:
    """Greedy lossless with a reduced drafting vocabulary, and every drafted token lies in it (in it or in
    the conversation, when the drafter's context tokens are on)."""
    taus = assert_greedy_lossless(target, make_drafter, prompts, n_new, stop_tokens=set())
    allowed = set(ids.tolist())
    drafter = make_drafter()
    res = generate(target, drafter, prompts[0], n_new, stop_tokens=set())
    if drafter.vocab.context:
        allowed |= set(prompts[0]) | set(res.token_ids)
    trees = [e.tree for e in res.events if e.tree is not None and len(e.tree)]
    assert trees
    for tree in trees:
        assert set(tree.tokens.tolist()) <= allowed
        check_draft_top(tree, allowed)
    return taus


def subset_ids(target: Target, prompts: list[list[int]], size: int) -> torch.Tensor:
    """The `size` most frequent tokens of the target's greedy answers to `prompts` (filled up to size)."""
    from core.drafters.draft_vocab import frequent_tokens

    answers = [generate(target, Autoregressive(), p, 32, stop_tokens=set()).token_ids for p in prompts]
    fill = range(target.vocab_size - 1, -1, -1)  # never-seen ids, so the subset has exactly `size`
    return frequent_tokens(answers + [list(fill)], size)


# ----- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> Target:
    return tiny_target(vocab_size=VOCAB, n_layers=2)


@pytest.fixture(scope="module")
def trained(tiny):
    prompts = tiny_prompts(VOCAB, n=3, length=8, seed=1)
    d = Eagle2Drafter.random(tiny, seed=0)
    metrics = quick_train(d, self_distill_batch(tiny, d.train_needs, prompts))
    return d, prompts, metrics


# ----- tests ---------------------------------------------------------------------------------------
def test_greedy_lossless_random_and_trained(tiny, trained):
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=0)
    assert_greedy_lossless(tiny, lambda: Eagle2Drafter.random(tiny, seed=1), prompts, 24, stop_tokens=set())
    d, train_prompts, _ = trained
    taus = assert_greedy_lossless(tiny, lambda: d, train_prompts, 32, stop_tokens=set())
    assert min(taus) > 1.5, f"the overfitted drafter should get drafts accepted (tau {taus})"


def test_sampling_lossless():
    target = tiny_target(vocab_size=16, n_layers=2, seed=3)
    d = Eagle2Drafter.random(target, seed=0, depth=2, top_k=4, total_tokens=8)
    p = sampling_p_value(target, lambda: d, [5, 9, 2, 7], n_tokens=3, samples=300, seed=0)
    assert p > ALPHA


def test_tree_matches_chain_evaluation(tiny, trained):
    d, prompts, _ = trained  # trained, so the tree grows deep (a random drafter's stays at depth 2)
    prompt = prompts[1]
    pre = prefill(tiny, prompt, d.needs)
    d.begin(tiny, pre)
    tree = d.draft(pre.bonus)
    assert len(tree) == d.config.total_tokens and int(tree.depths().max()) >= 4
    assert d.cache.length == len(prompt), "draft() must leave only verified entries in the cache"
    r = len(prompt)
    with torch.no_grad():
        for i in range(len(tree)):
            d.begin(tiny, pre)  # a fresh cache; then run the path one pair at a time, causal mask
            feat = d._root_feat
            for depth, node in enumerate(tree.path_to(i)[:-1]):
                out = d._run(feat[None, None], tree.tokens[node].view(1, 1), torch.tensor([[r + depth]]), None)
                feat = out[0, -1]
            prob = torch.softmax(tiny.logits(feat), dim=-1)[tree.tokens[i]]
            assert torch.allclose(prob, tree.draft_probs[i], rtol=1e-4, atol=1e-6), i
    check_target_tree_pass(tiny, prompt, pre.bonus, tree)


def test_cache_holds_true_features_after_accept(tiny, trained):
    d, prompts, _ = trained
    res = generate(tiny, d, prompts[0], 32, stop_tokens=set())
    assert res.mean_accepted > 1.5
    n = d.cache.length
    assert n == len(d.context)
    keys, values, root_feat = d.cache.keys[0][:, :, :n].clone(), d.cache.values[0][:, :, :n].clone(), d._root_feat
    with torch.no_grad():
        d.begin(tiny, verified_context(tiny, d))
    assert torch.allclose(d.cache.keys[0][:, :, :n], keys, atol=1e-5)
    assert torch.allclose(d.cache.values[0][:, :, :n], values, atol=1e-5)
    assert torch.allclose(d._root_feat, root_feat, atol=1e-5)


def verified_context(target: Target, d) -> Verified:
    """The whole verified context as one prefill, with the bonus the drafter is waiting for."""
    v = prefill(target, d.context, d.needs)
    return Verified(v.tokens, d._root_token, 0, v.hidden, v.layer_kv)


def test_feedback_passes_match_drafting(tiny, trained):
    """acc@2/acc@3 in training use exactly the computation of drafting at depth 2/3."""
    d, prompts, _ = trained
    seq = prompts[0] + generate(tiny, Autoregressive(), prompts[0], 16, stop_tokens=set()).token_ids
    L = tiny.n_layers
    with torch.no_grad():
        hidden = tiny.forward(torch.tensor(seq), hidden_layers=(L,)).hidden[L]
        tokens = torch.tensor(seq)[None, 1:]
        out1, kv1, cos, sin = d.teacher_forced(hidden[:, :-1], tokens)
        out2, out3 = d.feedback_passes(out1, kv1, tokens, cos, sin, 3)
        for t in (3, 9, 14):
            d.begin(tiny, Verified(seq[:t], seq[t], 0, {L: hidden[0, :t]}, None))
            assert torch.allclose(d._root_feat, out1[0, t - 1], atol=1e-5)
            a = d._run(d._root_feat[None, None], torch.tensor([[seq[t + 1]]]), torch.tensor([[t]]), None)[0, 0]
            assert torch.allclose(a, out2[0, t], atol=1e-5)
            b = d._run(a[None, None], torch.tensor([[seq[t + 2]]]), torch.tensor([[t + 1]]), None)[0, 0]
            assert torch.allclose(b, out3[0, t + 1], atol=1e-5)


def test_training_loss(tiny, trained):
    _, prompts, metrics = trained
    assert {"loss", "loss_feat", "loss_ce", "acc@1"} <= set(metrics)
    assert "acc@2" not in metrics  # the feedback passes only measure: skipped while training
    assert metrics["acc@1"] > 0.8  # overfitted
    d = Eagle2Drafter.random(tiny, seed=4)
    batch = self_distill_batch(tiny, d.train_needs, prompts[:2], n_new=12)
    d.eval()  # no input noise: deterministic
    a, eval_metrics = d.training_loss(batch, 0.0)
    assert {"acc@1", "acc@2", "acc@3"} <= set(eval_metrics)
    b, _ = d.training_loss(batch, 0.0)
    assert torch.equal(a, b) and torch.isfinite(a)
    d.train()
    c, _ = d.training_loss(batch, 0.0)
    assert not torch.equal(a, c)  # noise on the input features
    c.backward()
    assert d.fc.weight.grad is not None and d.fc.weight.grad.abs().sum() > 0


def test_save_load_roundtrip_bf16(tmp_path):
    target = tiny_target(vocab_size=VOCAB, n_layers=2, dtype=torch.bfloat16)
    d = Eagle2Drafter.random(target, seed=5)
    d.save_pretrained(tmp_path / "eagle2")
    loaded = Eagle2Drafter.from_pretrained(tmp_path / "eagle2", target)
    sd, sl = d.state_dict(), loaded.state_dict()
    assert sd.keys() == sl.keys() and all(torch.equal(sd[k], sl[k]) for k in sd)
    prompt = tiny_prompts(VOCAB, n=1, length=8, seed=2)[0]
    a = generate(target, d, prompt, 12, stop_tokens=set())
    b = generate(target, loaded, prompt, 12, stop_tokens=set())
    assert a.token_ids == b.token_ids
    for ea, eb in zip(a.events, b.events):
        assert torch.equal(ea.tree.tokens, eb.tree.tokens) and torch.equal(ea.tree.parents, eb.tree.parents)
        assert torch.equal(ea.tree.draft_probs, eb.tree.draft_probs)


def test_draft_top_extras(tiny, trained):
    d, prompts, _ = trained
    res = generate(tiny, d, prompts[0], 16, stop_tokens=set())
    for e in res.events:
        if e.tree is not None and len(e.tree):
            check_draft_top(e.tree)
    d.record_draft_top = False
    try:
        d.begin(tiny, prefill(tiny, prompts[0], d.needs))
        assert "draft_top" not in d.draft(d._root_token).extras
    finally:
        d.record_draft_top = True


def test_subset_vocab_drafting_and_training(tiny):
    """32 of the 64 ids: greedy output unchanged, drafts only from the subset, training runs and learns."""
    prompts = tiny_prompts(VOCAB, n=3, length=8, seed=1)
    ids = subset_ids(tiny, prompts, 32)
    d = Eagle2Drafter.random(tiny, seed=1, draft_vocab_size=32)
    d.vocab.set_ids(ids)
    check_subset_drafting(tiny, lambda: d, prompts[:1], ids)
    metrics = quick_train(d, self_distill_batch(tiny, d.train_needs, prompts))
    assert metrics["acc@1"] > 0.8
    taus = check_subset_drafting(tiny, lambda: d, prompts, ids, 32)
    assert min(taus) > 1.5, taus


def test_subset_vocab_accuracy_counts_outside_tokens_as_misses(tiny):
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=1)
    d = Eagle2Drafter.random(tiny, seed=1, draft_vocab_size=32)
    batch = self_distill_batch(tiny, d.train_needs, prompts, n_new=12)
    answer = set(batch.input_ids[:, 8:].flatten().tolist())
    outside = [t for t in range(VOCAB) if t not in answer][:32]
    d.vocab.set_ids(torch.tensor(sorted(outside)))
    d.eval()
    with torch.no_grad():
        _, metrics = d.training_loss(batch, 0.0)
    assert metrics["acc@1"] == 0.0 and metrics["acc@2"] == 0.0


def test_subset_vocab_save_load(tmp_path):
    target = tiny_target(vocab_size=VOCAB, n_layers=2, dtype=torch.bfloat16)
    d = Eagle2Drafter.random(target, seed=5, draft_vocab_size=32)
    d.vocab.set_ids(torch.arange(1, VOCAB, 2))
    d.save_pretrained(tmp_path / "eagle2")
    loaded = Eagle2Drafter.from_pretrained(tmp_path / "eagle2", target)
    assert loaded.config.draft_vocab_size == 32 and torch.equal(loaded.vocab.ids, d.vocab.ids)
    prompt = tiny_prompts(VOCAB, n=1, length=8, seed=2)[0]
    a = generate(target, d, prompt, 12, stop_tokens=set())
    b = generate(target, loaded, prompt, 12, stop_tokens=set())
    for ea, eb in zip(a.events, b.events):
        assert torch.equal(ea.tree.tokens, eb.tree.tokens) and torch.equal(ea.tree.draft_probs, eb.tree.draft_probs)


def test_subset_vocab_ids_survive_checkpoint_beyond_bf16_precision(tmp_path):
    """Token ids above 256 are not exact in bfloat16: the ids buffer must not be saved as one."""
    target = tiny_target(vocab_size=1024, n_layers=1)
    d = Eagle2Drafter.random(target, draft_vocab_size=4)
    d.vocab.set_ids(torch.tensor([1, 257, 513, 1023]))
    d.save_pretrained(tmp_path / "e")
    assert Eagle2Drafter.from_pretrained(tmp_path / "e", target).vocab.ids.tolist() == [1, 257, 513, 1023]


def test_no_offline_drafting():
    """EAGLE-2 needs fresh target features every cycle: it offers no provisional (offline) API."""
    assert not hasattr(Eagle2Drafter, "extend_unverified")


def test_mismatched_target_raises(tmp_path, tiny):
    Eagle2Drafter.random(tiny).save_pretrained(tmp_path / "e")
    other = tiny_target(vocab_size=VOCAB, n_layers=2, seed=1)
    with pytest.raises(DrafterMismatchError) as err:
        Eagle2Drafter.from_pretrained(tmp_path / "e", other)
    assert tiny.source in str(err.value) and other.source in str(err.value)


def test_options(tiny):
    d = Eagle2Drafter.random(tiny, depth=3, top_k=2, total_tokens=5)
    d.set_options(total_tokens=4)
    assert (d.config.depth, d.config.top_k, d.config.total_tokens) == (3, 2, 4)
    with pytest.raises(ValueError, match="tli"):
        d.set_options(tli=1)
    with pytest.raises(ValueError, match="depth"):
        d.set_options(depth=0)
    with pytest.raises(ValueError, match="tli"):
        Eagle2Drafter.random(tiny, tli=1)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        Eagle2Drafter.random(tiny, draft_vocab_size=VOCAB + 1)


@pytest.mark.real
def test_real_target_greedy_lossless():
    target = real_target_f32()
    prompt = target.chat_ids("Write one sentence about the sea.")
    make = lambda: Eagle2Drafter.random(target, seed=0, depth=4, top_k=4, total_tokens=12)  # small: f32 is slow
    assert_greedy_lossless(target, make, [prompt], 24)
