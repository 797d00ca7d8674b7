"""MoA drafter: losslessness, what CA/TLI may see (inference and training), TLI exactness, caches, save/load."""

from __future__ import annotations

import json
import math

import pytest
import torch

from core.decoding import generate
from core.drafters.base import Autoregressive, Verified
from core.drafters.checkpoint import DrafterMismatchError, TrainBatch
from core.drafters.moa import MoADrafter
from core.layers import decoder_layer
from core.target import Target, tiny_target
from tests.helpers import ALPHA, assert_greedy_lossless, sampling_p_value, tiny_prompts
from tests.test_eagle2 import (
    check_draft_top,
    check_subset_drafting,
    check_target_tree_pass,
    prefill,
    quick_train,
    real_target_f32,
    self_distill_batch,
    subset_ids,
    verified_context,
)

VOCAB = 64
N_LAYERS = 4
# LSA width for the tiny target; SA and CA start as target layers (outputs large enough to compare)
SMALL = {"lsa_dim": 16, "lsa_heads": 2, "init_from_target": True}


@pytest.fixture(scope="module")
def tiny() -> Target:
    return tiny_target(vocab_size=VOCAB, n_layers=N_LAYERS)


@pytest.fixture(scope="module")
def trained(tiny):
    """tli -> (a drafter overfitted on the target's answers to `prompts`, prompts, last metrics)."""
    cache = {}
    prompts = tiny_prompts(VOCAB, n=3, length=8, seed=1)

    def get(tli: int):
        if tli not in cache:
            d = MoADrafter.random(tiny, seed=0, tli=tli, **SMALL)
            metrics = quick_train(d, self_distill_batch(tiny, d.train_needs, prompts), steps=30)
            cache[tli] = (d, prompts, metrics)
        return cache[tli]

    return get


def batch_for(d: MoADrafter, target: Target, tokens: list[int], start_answer: int) -> TrainBatch:
    ids = torch.tensor(tokens)[None]
    out = target.forward(ids, hidden_layers=d.train_needs.hidden_layers, return_layer_kv=True)
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, start_answer:] = 1
    return TrainBatch(ids, loss_mask, torch.ones(ids.shape), out.hidden, out.layer_kv, target)


# ----- losslessness --------------------------------------------------------------------------------
@pytest.mark.parametrize("tli", [0, 1, 3])
def test_greedy_lossless(tiny, trained, tli):
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=0)
    assert_greedy_lossless(tiny, lambda: MoADrafter.random(tiny, seed=1, tli=tli, **SMALL), prompts, 24,
                           stop_tokens=set())
    d, train_prompts, _ = trained(tli)
    taus = assert_greedy_lossless(tiny, lambda: d, train_prompts, 32, stop_tokens=set())
    assert min(taus) > 1.5, f"the overfitted drafter should get drafts accepted (tau {taus})"


@pytest.mark.parametrize("tli", [0, 1, 3])
def test_sampling_lossless(tli):
    target = tiny_target(vocab_size=16, n_layers=N_LAYERS, seed=3)
    d = MoADrafter.random(target, seed=0, tli=tli, depth=2, top_k=4, total_tokens=8, **SMALL)
    p = sampling_p_value(target, lambda: d, [5, 9, 2, 7], n_tokens=3, samples=200, seed=tli)
    assert p > ALPHA


# ----- what the drafter may see ----------------------------------------------------------------------
@pytest.mark.parametrize("tli", [0, 1, 3])
def test_tree_matches_training_view(tiny, trained, tli):
    """Every node's draft probability equals the training forward on the chain prompt+root+path, with the
    target's activations at the root and beyond replaced by noise: inference reads only verified
    positions, training reads exactly what inference reads, and tree masks/positions equal chains."""
    d, prompts, _ = trained(tli)
    prompt = prompts[2]
    r = len(prompt)
    pre = prefill(tiny, prompt, d.needs)
    d.begin(tiny, pre)
    tree = d.draft(pre.bonus)
    assert len(tree) == d.config.total_tokens and int(tree.depths().max()) >= 4
    assert d.sa_cache.length == r and (tli == 0 or d.tli_cache.length == r)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in range(len(tree)):
            path = tree.path_to(i)[:-1]
            batch = batch_for(d, tiny, prompt + [pre.bonus] + tree.tokens[path].tolist(), r)
            batch.layer_kv[:, r:] = torch.randn(batch.layer_kv[:, r:].shape, generator=g) * 5
            verified = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
            verified[:, :r] = True
            _, final = d.train_forward(batch, d.last_verified(batch, verified=verified), progress=1.0)
            prob = torch.softmax(tiny.logits(final[0, -1]), dim=-1)[tree.tokens[i]]
            assert torch.allclose(prob, tree.draft_probs[i], rtol=1e-4, atol=1e-6), (i, len(path))
    check_target_tree_pass(tiny, prompt, pre.bonus, tree)


def test_training_never_reads_past_the_last_verified_position(tiny):
    d = MoADrafter.random(tiny, seed=2, tli=3, **SMALL)
    tokens = tiny_prompts(VOCAB, n=1, length=30, seed=3)[0]
    batch = batch_for(d, tiny, tokens, 4)
    last = d.last_verified(batch, period=torch.tensor([5]))
    assert last[0, :17].tolist() == [-1, 0, 1, 2, 3, 3, 5, 5, 5, 5, 5, 10, 10, 10, 10, 10, 15]
    v = 10
    with torch.no_grad():
        state, final = d.train_forward(batch, last, progress=1.0)
        batch.layer_kv[:, v + 1:] += torch.randn(batch.layer_kv[:, v + 1:].shape) * 5
        state2, final2 = d.train_forward(batch, last, progress=1.0)
    safe = last[0] <= v  # predictions whose view ends at or before v
    assert safe[: v + 6].all() and not safe[v + 6:].any()
    assert torch.allclose(final[0, safe], final2[0, safe], atol=1e-6)
    assert torch.allclose(state[0, safe], state2[0, safe], atol=1e-6)
    assert not torch.allclose(final[0, ~safe], final2[0, ~safe], atol=1e-3)  # the perturbation does matter


def test_staircase_mask(tiny):
    """At progress 0, SA reads only the current unverified segment; from staircase_until on, everything."""
    d = MoADrafter.random(tiny, seed=2, tli=0, **SMALL)
    tokens = tiny_prompts(VOCAB, n=1, length=24, seed=4)[0]
    batch = batch_for(d, tiny, tokens, 2)
    last = d.last_verified(batch, period=torch.tensor([8]))
    j = 20  # segment (16, 20]: tokens at positions <= 16 are outside it
    changed = TrainBatch(batch.input_ids.clone(), batch.loss_mask, batch.attention_mask, batch.hidden,
                         batch.layer_kv, tiny)
    changed.input_ids[0, :17] = (changed.input_ids[0, :17] + 1) % VOCAB
    with torch.no_grad():
        for progress, same in ((0.0, True), (0.5, False), (1.0, False)):
            a, _ = d.train_forward(batch, last, progress)
            b, _ = d.train_forward(changed, last, progress)
            assert torch.allclose(a[0, j], b[0, j], atol=1e-6) == same, progress


@pytest.mark.parametrize("tli", [1, 3])
def test_tli_equals_running_the_target_layers(tiny, trained, tli):
    """Each drafted node's final feature = the target's last N layers run directly on
    [true states of the verified tokens, predicted states of the root and the node's ancestors, its own]."""
    d, prompts, _ = trained(tli)
    prompt = prompts[0]
    r, big_l = len(prompt), tiny.n_layers
    pre = prefill(tiny, prompt, d.needs)
    calls = []
    run_tli = d._tli

    def record(state, positions, mask):
        out = run_tli(state, positions, mask)
        calls.append((state[0], positions[0], mask, out[0]))
        return out

    d._tli = record
    try:
        d.begin(tiny, pre)  # begin() (like accept()) drafts the root; draft() the rest of the tree
        d.draft(pre.bonus)
    finally:
        del d._tli
    true_states = tiny.forward(torch.tensor(prompt), hidden_layers=(big_l - tli,)).hidden[big_l - tli][0]
    region_states = torch.cat([c[0] for c in calls])
    region_pos = torch.cat([c[1] for c in calls])
    offset = 0
    with torch.no_grad():
        for state, _pos, mask, out in calls:
            for row in range(state.shape[0]):
                seen = [0] if mask is None else mask[0, 0, row, r:].nonzero().flatten().tolist()
                assert seen[-1] == offset + row
                x = torch.cat([true_states, region_states[seen]])[None]
                pos = torch.cat([torch.arange(r), region_pos[seen]])[None]
                cos, sin = tiny.rope(pos)
                for layer in tiny.layers[big_l - tli:]:
                    x, _ = decoder_layer(layer, x, cos, sin, None, None, 0, tiny.head_dim)
                assert torch.allclose(x[0, -1], out[row], atol=1e-4)
            offset += state.shape[0]
    assert offset == 1 + (d.config.depth - 1) * d.config.top_k


def test_caches_hold_exactly_the_verified_tokens(tiny, trained):
    d, prompts, _ = trained(3)
    res = generate(tiny, d, prompts[1], 32, stop_tokens=set())
    assert res.mean_accepted > 1.5
    n = len(d.context)
    caches = {"sa": d.sa_cache, "ca": d.ca_cache, "tli": d.tli_cache}
    assert all(c.length == n for c in caches.values())
    before = {k: ([t[:, :, :n].clone() for t in c.keys], [t[:, :, :n].clone() for t in c.values])
              for k, c in caches.items()}
    with torch.no_grad():
        d.begin(tiny, verified_context(tiny, d))
    after = {"sa": d.sa_cache, "ca": d.ca_cache, "tli": d.tli_cache}
    for k, (keys, values) in before.items():
        for i in range(len(keys)):
            assert torch.allclose(after[k].keys[i][:, :, :n], keys[i], atol=1e-5), k
            assert torch.allclose(after[k].values[i][:, :, :n], values[i], atol=1e-5), k


def test_lsa_attention_extras(tiny):
    d = MoADrafter.random(tiny, seed=0, tli=1, **SMALL)
    prompt = tiny_prompts(VOCAB, n=1, length=7, seed=6)[0]
    plain = generate(tiny, d, prompt, 8, stop_tokens=set())  # off by default: the fused attention, no maps
    assert all("lsa_attention" not in ev.extras for ev in plain.events)
    d.record_lsa_attention = True
    res = generate(tiny, d, prompt, 8, stop_tokens=set())
    assert res.token_ids == plain.token_ids  # the explicit softmax and the fused attention draft alike
    assert [ev.tree.tokens.tolist() for ev in res.events[1:]] == [ev.tree.tokens.tolist() for ev in plain.events[1:]]
    first = res.events[1].tree.extras
    assert first["lsa_attention"].shape == (7, N_LAYERS, N_LAYERS)
    assert first["lsa_tokens"].tolist() == prompt
    assert torch.allclose(first["lsa_attention"].sum(-1), torch.ones(7, N_LAYERS), atol=1e-5)
    ev = res.events
    for s in range(1, len(ev) - 1):  # step s verified its root (step s-1's bonus) and its accepted nodes
        verified = [ev[s - 1].bonus] + [int(ev[s].tree.tokens[a]) for a in ev[s].accepted]
        assert ev[s + 1].extras["lsa_tokens"].tolist() == verified
        assert ev[s + 1].extras["lsa_attention"].shape == (len(verified), N_LAYERS, N_LAYERS)
    assert "lsa_attention" in res.events[1].to_dict()["extras"]


# ----- offline drafting (client-server) ----------------------------------------------------------
def greedy_chain(tree) -> list[int]:
    """The tree path that always follows the most probable child."""
    chain, node, kids = [], -1, tree.children()
    while kids[node + 1]:
        node = max(kids[node + 1], key=lambda c: float(tree.draft_probs[c]))
        chain.append(int(tree.tokens[node]))
    return chain


@pytest.mark.parametrize("tli", [0, 1])
def test_offline_drafting_matches_training_view(tiny, trained, tli):
    """After extend_unverified, each node's probability equals the training forward on prompt + root +
    provisional tokens + path with only the prompt verified; rollback restores the verified state."""
    d, prompts, _ = trained(tli)
    prompt = prompts[2]
    r = len(prompt)
    pre = prefill(tiny, prompt, d.needs)
    d.begin(tiny, pre)
    fresh = d.draft(pre.bonus)
    prov = tiny_prompts(VOCAB, n=1, length=3, seed=7)[0]
    d.extend_unverified(prov[:2])
    d.extend_unverified(prov[2:])
    assert d.n_unverified == 3 and d.sa_cache.length == r + 3 and d.ca_cache.length == r
    assert tli == 0 or d.tli_cache.length == r + 3
    with pytest.raises(RuntimeError, match="root"):
        d.draft(pre.bonus)
    tree = d.draft(prov[-1])
    assert d.sa_cache.length == r + 3
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in range(0, len(tree), 3):
            path = tree.path_to(i)[:-1]
            batch = batch_for(d, tiny, prompt + [pre.bonus] + prov + tree.tokens[path].tolist(), r)
            batch.layer_kv[:, r:] = torch.randn(batch.layer_kv[:, r:].shape, generator=g) * 5
            verified = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
            verified[:, :r] = True
            _, final = d.train_forward(batch, d.last_verified(batch, verified=verified), progress=1.0)
            prob = torch.softmax(tiny.logits(final[0, -1]), dim=-1)[tree.tokens[i]]
            assert torch.allclose(prob, tree.draft_probs[i], rtol=1e-4, atol=1e-6), (i, len(path))
    d.rollback_unverified()
    assert d.n_unverified == 0 and d.sa_cache.length == r and (tli == 0 or d.tli_cache.length == r)
    again = d.draft(pre.bonus)
    assert torch.equal(again.tokens, fresh.tokens) and torch.allclose(again.draft_probs, fresh.draft_probs)


@pytest.mark.parametrize("tli", [0, 3])
def test_offline_phases_reconciled_equal_plain_greedy(tiny, trained, tli):
    """Greedy decoding where every cycle drafts offline (two provisional chains), then the 'server'
    verifies them: the output equals plain greedy, and the drafter ends in the same state as one that
    never went offline. Odd cycles roll back explicitly; even ones let accept() discard the provisional state."""
    d, prompts, _ = trained(tli)
    prompt = prompts[1]
    plain = generate(tiny, Autoregressive(), prompt, 48, stop_tokens=set()).token_ids
    pre = prefill(tiny, prompt, d.needs)
    d.begin(tiny, pre)
    context, root, n_accepted = list(prompt), pre.bonus, 0
    for cycle in range(40):
        if len(context) - len(prompt) + 1 >= 40:
            break
        prov, cur = [], root
        for _ in range(2):
            chain = greedy_chain(d.draft(cur))
            d.extend_unverified(chain)
            prov, cur = prov + chain, chain[-1]
        assert d.n_unverified == len(prov)
        r = len(context)
        with torch.no_grad():
            out = tiny.forward(torch.tensor(context + [root] + prov), return_layer_kv=True)
        greedy = out.logits[0, r:].argmax(-1).tolist()  # the target's token after root, after each of prov
        k = 0
        while k < len(prov) and prov[k] == greedy[k]:
            k += 1
        n_accepted += k
        if cycle % 2:
            d.rollback_unverified()
            assert d.n_unverified == 0
        d.accept(Verified([root] + prov[:k], greedy[k], r, {}, out.layer_kv[0, r: r + k + 1]))
        assert d.n_unverified == 0
        context += [root] + prov[:k]
        root = greedy[k]
    generated = context[len(prompt):] + [root]
    assert generated == plain[: len(generated)] and len(generated) >= 40
    assert n_accepted >= 10, "the overfitted drafter's offline tokens should often be accepted"
    n = len(context)
    names = ("sa_cache", "ca_cache", "tli_cache") if tli else ("sa_cache", "ca_cache")
    assert all(getattr(d, k).length == n for k in names)
    state = {k: [t[:, :, :n].clone() for t in getattr(d, k).keys + getattr(d, k).values] for k in names}
    tree = d.draft(root)
    with torch.no_grad():
        d.begin(tiny, verified_context(tiny, d))
    for k in names:
        c = getattr(d, k)
        for before, after in zip(state[k], c.keys + c.values):
            assert torch.allclose(after[:, :, :n], before, atol=1e-5), k
    never_offline = d.draft(root)
    assert torch.equal(tree.tokens, never_offline.tokens)
    assert torch.allclose(tree.draft_probs, never_offline.draft_probs, atol=1e-5)


# ----- reduced drafting vocabulary ----------------------------------------------------------------
@pytest.mark.parametrize("tli", [0, 1])
def test_subset_vocab_drafting_and_training(tiny, tli):
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=1)
    ids = subset_ids(tiny, prompts, 32)
    d = MoADrafter.random(tiny, seed=1, tli=tli, draft_vocab_size=32, **SMALL)
    d.vocab.set_ids(ids)
    check_subset_drafting(tiny, lambda: d, prompts[:1], ids)
    batch = self_distill_batch(tiny, d.train_needs, prompts, n_new=12)
    torch.manual_seed(0)
    loss, metrics = d.training_loss(batch, 0.3)
    assert torch.isfinite(loss) and "acc@1" in metrics
    loss.backward()
    assert d.head.weight.grad.abs().sum() > 0
    d.vocab.set_ids(torch.tensor([t for t in range(VOCAB) if t not in set(batch.input_ids[:, 8:].flatten().tolist())]
                                 [:32]))
    with torch.no_grad():
        _, metrics = d.training_loss(batch, 0.3)
    assert metrics["acc"] == 0.0  # every target token lies outside the drafting vocabulary: all misses


def test_subset_vocab_save_load(tmp_path):
    target = tiny_target(vocab_size=VOCAB, n_layers=N_LAYERS, dtype=torch.bfloat16)
    d = MoADrafter.random(target, seed=5, tli=1, draft_vocab_size=32, **SMALL)
    d.vocab.set_ids(torch.arange(1, VOCAB, 2))
    d.save_pretrained(tmp_path / "moa")
    loaded = MoADrafter.from_pretrained(tmp_path / "moa", target)
    assert loaded.config.draft_vocab_size == 32 and torch.equal(loaded.vocab.ids, d.vocab.ids)
    prompt = tiny_prompts(VOCAB, n=1, length=8, seed=2)[0]
    a = generate(target, d, prompt, 12, stop_tokens=set())
    b = generate(target, loaded, prompt, 12, stop_tokens=set())
    for ea, eb in zip(a.events, b.events):
        assert torch.equal(ea.tree.tokens, eb.tree.tokens) and torch.equal(ea.tree.draft_probs, eb.tree.draft_probs)
        if len(ea.tree):
            check_draft_top(ea.tree, set(range(1, VOCAB, 2)) | set(prompt) | set(a.token_ids))


# ----- training, options, checkpoints ------------------------------------------------------------
@pytest.mark.parametrize("tli", [0, 3])
def test_training_loss(tiny, trained, tli):
    _, prompts, metrics = trained(tli)
    assert {"loss", "loss_feat", "loss_ce", *(f"acc@{k}" for k in range(1, 7))} <= set(metrics)
    assert ("loss_state" in metrics) == (tli > 0)
    d = MoADrafter.random(tiny, seed=4, tli=tli, **SMALL)
    batch = self_distill_batch(tiny, d.train_needs, prompts[:2], n_new=12)
    torch.manual_seed(0)
    loss, _ = d.training_loss(batch, 0.3)
    assert torch.isfinite(loss)
    loss.backward()
    for module in (d.lsa, d.sa, d.ca, d.head):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    assert d.train_needs.layer_kv and d.train_needs.hidden_layers == tuple(sorted({N_LAYERS - tli, N_LAYERS}))
    assert d.needs.hidden_layers == () and d.needs.layer_kv


def test_options(tiny):
    d = MoADrafter.random(tiny, tli=1, **SMALL)
    d.set_options(tli=1, depth=4, top_k=3, total_tokens=9)
    assert (d.config.depth, d.config.top_k, d.config.total_tokens) == (4, 3, 9)
    with pytest.raises(ValueError, match="N=1"):
        d.set_options(tli=3)
    with pytest.raises(ValueError, match="tli"):
        MoADrafter.random(tiny, tli=4)
    with pytest.raises(ValueError, match="total_tokens"):
        d.set_options(total_tokens=0)


def test_save_load_roundtrip_bf16(tmp_path):
    target = tiny_target(vocab_size=VOCAB, n_layers=N_LAYERS, dtype=torch.bfloat16)
    d = MoADrafter.random(target, seed=5, tli=1, **SMALL)
    d.save_pretrained(tmp_path / "moa")
    loaded = MoADrafter.from_pretrained(tmp_path / "moa", target)
    assert loaded.config == d.config
    sd, sl = d.state_dict(), loaded.state_dict()
    assert sd.keys() == sl.keys() and all(torch.equal(sd[k], sl[k]) for k in sd)
    assert not any(k.startswith("target") for k in sd)
    prompt = tiny_prompts(VOCAB, n=1, length=8, seed=2)[0]
    a = generate(target, d, prompt, 12, stop_tokens=set())
    b = generate(target, loaded, prompt, 12, stop_tokens=set())
    assert a.token_ids == b.token_ids
    for ea, eb in zip(a.events, b.events):
        assert torch.equal(ea.tree.tokens, eb.tree.tokens) and torch.equal(ea.tree.parents, eb.tree.parents)
        assert torch.equal(ea.tree.draft_probs, eb.tree.draft_probs)


def test_mismatched_target_raises(tmp_path, tiny):
    MoADrafter.random(tiny, **SMALL).save_pretrained(tmp_path / "m")
    other = tiny_target(vocab_size=VOCAB, n_layers=N_LAYERS, seed=1)
    with pytest.raises(DrafterMismatchError) as err:
        MoADrafter.from_pretrained(tmp_path / "m", other)
    assert tiny.source in str(err.value) and other.source in str(err.value)


@pytest.mark.real
@pytest.mark.parametrize("tli", [0, 3])
def test_real_target_greedy_lossless(tli):
    target = real_target_f32()
    prompt = target.chat_ids("Write one sentence about the sea.")
    make = lambda: MoADrafter.random(target, seed=0, tli=tli, depth=4, top_k=4, total_tokens=12)  # f32 is slow
    assert_greedy_lossless(target, make, [prompt], 24)


def test_needs_layer_kv():
    target = tiny_target(vocab_size=VOCAB, n_layers=N_LAYERS)
    d = MoADrafter.random(target, **SMALL)
    with pytest.raises(ValueError, match="layer_kv"):
        d.begin(target, Verified([3, 4], 5, 0, {}, None))


# ----- LSA layouts, the staircase draw, rebuilding parts of a published drafter ---------------------
def test_lsa_layouts(tiny):
    """Full width (the reference layout): the layers attend over each layer's whole K+V, no projection first."""
    kv_width = 2 * tiny.kv_heads * tiny.head_dim
    wide = MoADrafter.random(tiny, seed=0, ca_mlp=False)
    narrow = MoADrafter.random(tiny, seed=0, lsa_full_width=False, lsa_dim=16, lsa_heads=2, ca_mlp=True)
    assert isinstance(wide.lsa.inp, torch.nn.Identity) and wide.lsa.qkv.in_features == kv_width
    assert wide.lsa.heads == 2 * tiny.kv_heads and not hasattr(wide, "mlp")
    assert narrow.lsa.inp.out_features == 16 and narrow.lsa.qkv.in_features == 16 and hasattr(narrow, "mlp")
    kv = torch.randn(3, N_LAYERS, kv_width)
    for d in (wide, narrow):
        vec, att = d.lsa(kv, need_weights=True)
        assert vec.shape == (3, tiny.hidden_size) and att.shape == (3, N_LAYERS, N_LAYERS)
        assert torch.allclose(att.sum(-1), torch.ones(3, N_LAYERS), atol=1e-5)
        fused, none = d.lsa(kv)  # the drafting path: fused attention, no map
        assert none is None and torch.allclose(fused, vec, atol=1e-5)
    with pytest.raises(ValueError, match="staircase"):
        MoADrafter.random(tiny, staircase="sometimes")


def test_random_staircase_mixes_both_masks_mid_curriculum(tiny):
    """staircase='random': each sequence draws the staircase with probability 1 - progress / staircase_until."""
    d = MoADrafter.random(tiny, seed=2, **SMALL)
    tokens = tiny_prompts(VOCAB, n=1, length=24, seed=4)[0]
    one = batch_for(d, tiny, tokens, 2)
    n = 32
    batch = TrainBatch(one.input_ids.repeat(n, 1), one.loss_mask.repeat(n, 1), one.attention_mask.repeat(n, 1),
                       {k: v.repeat(n, 1, 1) for k, v in one.hidden.items()}, one.layer_kv.repeat(n, 1, 1, 1), tiny)
    changed = TrainBatch(batch.input_ids.clone(), batch.loss_mask, batch.attention_mask, batch.hidden,
                         batch.layer_kv, tiny)
    changed.input_ids[:, :17] = (changed.input_ids[:, :17] + 1) % VOCAB
    last = d.last_verified(batch, period=torch.full((n,), 8))
    torch.manual_seed(0)
    with torch.no_grad():
        a, _ = d.train_forward(batch, last, 0.25)
        torch.manual_seed(0)
        b, _ = d.train_forward(changed, last, 0.25)
    stair = torch.isclose(a[:, 20], b[:, 20], atol=1e-6).all(-1)  # position 20 unaffected = staircase mask
    assert 0 < int(stair.sum()) < n


def test_rebuilding_the_lsa_keeps_every_other_published_weight(tmp_path, tiny):
    """--init-from with another LSA layout: SA, CA and head keep their published values, LSA starts fresh."""
    from core.training.publish import init_from_published
    from core.training.specs import resolve_spec

    old = MoADrafter.random(tiny, seed=5, lsa_full_width=False, lsa_dim=16, lsa_heads=2, ca_mlp=True)
    old.save_pretrained(tmp_path / "moa")
    spec = resolve_spec("moa@h24", {"period_max": 24, "lsa_full_width": True, "ca_mlp": False, "staircase": "random"})
    new = init_from_published(spec, tiny, tmp_path, single=False)
    assert new.config.lsa_full_width and new.config.period_max == 24 and not new.config.ca_mlp
    old_state, new_state = old.state_dict(), new.state_dict()
    for name, value in new_state.items():
        if not name.startswith("lsa."):
            assert torch.equal(value, old_state[name].to(torch.bfloat16).to(value.dtype)), name  # saved in bf16
    assert not any(k.startswith(("mlp.", "mlp_norm.")) for k in new_state)
    assert set(new.init_record["rebuilt"]) == {"lsa_full_width", "ca_mlp"}
    assert new.init_record["changed"]["period_max"] == [14, 24]
    with pytest.raises(ValueError, match="tli"):  # an architectural field outside `rebuilt` still refuses
        init_from_published(resolve_spec("moa", {"tli": 1}), tiny, tmp_path, single=False)


def test_a_fresh_drafter_starts_from_target_layers(tiny):
    """init_from_target: SA = the target's first layer, CA = its last layer's attention (where shapes match)."""
    d = MoADrafter.random(tiny, seed=0, init_from_target=True)
    first, last = tiny.layers[0], tiny.layers[-1]
    for mine, theirs in ((d.sa, first), (d.ca, last.self_attn), (d.ca_norm, last.input_layernorm)):
        for name, value in theirs.state_dict().items():
            assert torch.equal(mine.state_dict()[name], value.to(mine.state_dict()[name].dtype)), name
    plain = MoADrafter.random(tiny, seed=0, init_from_target=False)
    assert not torch.equal(plain.sa.self_attn.q_proj.weight, first.self_attn.q_proj.weight)


@pytest.mark.parametrize("ca_mlp,memory_norm", [(False, False), (True, False), (True, True)])
def test_fused_prediction_equals_the_modules(tiny, ca_mlp, memory_norm):
    """Inference's fused CA / CA MLP / head (begin()'s copies) compute what the training modules compute."""
    d = MoADrafter.random(tiny, seed=4, ca_mlp=ca_mlp, memory_norm=memory_norm, **SMALL)
    perturb(d)
    prompt = tiny_prompts(VOCAB, n=1, length=9, seed=8)[0]
    d.begin(tiny, prefill(tiny, prompt, d.needs))
    x = torch.randn(1, 3, tiny.hidden_size)
    positions = torch.tensor([[9, 10, 11]])
    cos, sin = d._rope(positions)
    mem_k, mem_v = d.ca_cache.layer_view(0)
    with torch.no_grad():
        want = d._predict(x, cos, sin, mem_k, mem_v, None)
        got = d._predict_inference(x, cos, sin, mem_k, mem_v)
    assert want.abs().max() > 0.1
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    vec = torch.randn(1, 4, tiny.hidden_size)
    cos, sin = d._rope(torch.arange(4)[None])
    with torch.no_grad():  # CA's memory from one stacked k/v matmul equals the two projections
        for got, want in zip(d._ca_fused.memory(vec, cos, sin), d.memory(vec, cos, sin)):
            assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_prefill_runs_lsa_only_over_the_ca_window(tiny):
    """With ca_window=w, begin() runs LSA on the prompt's last w tokens only: those CA memory rows equal the ones
    from running LSA on every token (the app's path), the earlier rows are zero and never read, and the trees
    are the same."""
    prompt = tiny_prompts(VOCAB, n=1, length=11, seed=3)[0]
    caches, trees, calls = [], [], []
    for everything in (False, True):
        d = MoADrafter.random(tiny, seed=6, ca_window=3, **SMALL)
        perturb(d)
        d.record_lsa_attention = everything
        d.lsa.forward = (lambda kv, *a, _run=d.lsa.forward, **k: calls.append(kv.shape[0]) or _run(kv, *a, **k))
        pre = prefill(tiny, prompt, d.needs)
        d.begin(tiny, pre)
        caches.append([t[:, :, : len(prompt)].clone() for t in d.ca_cache.layer_view(0)])
        trees.append(d.draft(pre.bonus))
    assert calls == [3, len(prompt)]
    for windowed, full in zip(*caches):
        assert torch.equal(windowed[:, :, :-3], torch.zeros_like(windowed[:, :, :-3]))
        assert torch.allclose(windowed[:, :, -3:], full[:, :, -3:], atol=1e-5, rtol=1e-5)
    assert trees[0].tokens.tolist() == trees[1].tokens.tolist()
    assert torch.allclose(trees[0].draft_probs, trees[1].draft_probs, atol=1e-5)


def perturb(d: MoADrafter) -> None:
    """Nudge every weight: zero-initialised parts (out projections) would hide what a test is looking for."""
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)


def assert_tree_matches_training(d: MoADrafter, target: Target, prompt: list[int], bonus: int, tree,
                                 edit=None) -> None:
    """Every other node's draft probability equals the training forward over prompt + bonus + its path, with
    the prompt verified (`edit(batch)` may change the batch first)."""
    r = len(prompt)
    with torch.no_grad():
        for i in range(0, len(tree), 2):
            path = tree.path_to(i)[:-1]
            batch = batch_for(d, target, prompt + [bonus] + tree.tokens[path].tolist(), r)
            if edit is not None:
                edit(batch)
            verified = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
            verified[:, :r] = True
            _, final = d.train_forward(batch, d.last_verified(batch, verified=verified), progress=1.0)
            prob = torch.softmax(target.logits(final[0, -1]), dim=-1)[tree.tokens[i]]
            assert torch.allclose(prob, tree.draft_probs[i], rtol=1e-4, atol=1e-6), (i, len(path))


def test_ca_window_reads_only_the_recent_verified_positions(tiny):
    """With ca_window=w a drafted node's probability equals the training forward (same window in CA's mask),
    and changing the LSA input of any verified position before the window leaves the tree unchanged."""
    d = MoADrafter.random(tiny, seed=5, ca_window=3, **SMALL)
    perturb(d)
    prompt = tiny_prompts(VOCAB, n=1, length=10, seed=9)[0]
    r = len(prompt)
    pre = prefill(tiny, prompt, d.needs)
    d.begin(tiny, pre)
    g = torch.Generator().manual_seed(1)

    def scramble_before_window(batch):
        batch.layer_kv[:, : r - 3] = torch.randn(batch.layer_kv[:, : r - 3].shape, generator=g) * 5

    assert_tree_matches_training(d, tiny, prompt, pre.bonus, d.draft(pre.bonus), scramble_before_window)
    with pytest.raises(ValueError, match="ca_window"):
        MoADrafter.random(tiny, seed=0, ca_window=-1, **SMALL)


def test_final_feature_feeds_the_drafted_positions(tiny):
    """final_feature: inference asks the target for its final feature, a drafted node's probability equals the
    training forward (the last verified feature joins every drafted position), and the feature matters."""
    d = MoADrafter.random(tiny, seed=6, final_feature=True, ca_window=4, **SMALL)
    big_l = tiny.n_layers
    assert d.needs.hidden_layers == (big_l,) and torch.count_nonzero(d.lsa.feat.weight) == 0  # starts as a no-op
    perturb(d)
    prompt = tiny_prompts(VOCAB, n=1, length=10, seed=10)[0]
    pre = prefill(tiny, prompt, d.needs)
    d.begin(tiny, pre)
    tree = d.draft(pre.bonus)
    assert_tree_matches_training(d, tiny, prompt, pre.bonus, tree)
    pre.hidden[big_l] = pre.hidden[big_l] * -3.0
    d.begin(tiny, pre)
    assert not torch.allclose(d.draft(pre.bonus).draft_probs, tree.draft_probs)
    pre.hidden.pop(big_l)
    with pytest.raises(ValueError, match="final feature"):
        d.begin(tiny, pre)


def test_final_feature_gain_scales_the_feature_and_rebuilds_its_projection(tmp_path, tiny):
    """final_feature_gain multiplies the projected feature (the second half of an LSA row); continuing a drafter
    with another gain rebuilds that projection (zero again: the continued drafter starts computing what it did)
    and keeps every other weight; a gain <= 0 is refused."""
    from core.training.publish import init_from_published
    from core.training.specs import resolve_spec

    one = MoADrafter.random(tiny, seed=7, final_feature=True, **SMALL)
    perturb(one)
    four = MoADrafter.random(tiny, seed=7, final_feature=True, final_feature_gain=4.0, **SMALL)
    four.load_state_dict(one.state_dict())
    kv = torch.randn(3, tiny.n_layers, 2 * tiny.kv_heads * tiny.head_dim)
    final = torch.randn(3, tiny.hidden_size)
    h = tiny.hidden_size
    with torch.no_grad():
        a, b = one.lsa(kv, final=final)[0], four.lsa(kv, final=final)[0]
    assert torch.allclose(b[:, :h], a[:, :h]) and a[:, h:].abs().max() > 0.01
    assert torch.allclose(b[:, h:], 4.0 * a[:, h:], atol=1e-5, rtol=1e-5)

    one.save_pretrained(tmp_path / "moa")
    spec = resolve_spec("moa", {**SMALL, "final_feature": True, "final_feature_gain": 32.0})
    cont = init_from_published(spec, tiny, tmp_path, single=False)
    assert cont.config.final_feature_gain == 32.0 and set(cont.init_record["rebuilt"]) == {"final_feature_gain"}
    assert torch.count_nonzero(cont.lsa.feat.weight) == 0
    saved = one.state_dict()
    for name, value in cont.state_dict().items():
        if not name.startswith("lsa.feat"):
            assert torch.equal(value, saved[name].to(torch.bfloat16).to(value.dtype)), name
    for bad in (0, -1.0, True, "2"):
        with pytest.raises(ValueError, match="final_feature_gain"):
            MoADrafter.random(tiny, seed=0, final_feature=True, final_feature_gain=bad, **SMALL)


def test_sa_drop_leaves_the_token_embedding_in_training_only(tiny):
    """sa_drop: a dropped sequence's stream is its token embedding (as if SA's attention and MLP wrote nothing);
    evaluation mode and inference never drop."""
    import copy

    d = MoADrafter.random(tiny, seed=2, **SMALL)
    tokens = tiny_prompts(VOCAB, n=1, length=24, seed=4)[0]
    batch = batch_for(d, tiny, tokens, 2)
    last = d.last_verified(batch, period=torch.full((1,), 8))
    silent = copy.deepcopy(d)
    with torch.no_grad():
        silent.sa.self_attn.o_proj.weight.zero_()
        silent.sa.mlp.down_proj.weight.zero_()
        want, _ = silent.train_forward(batch, last, 1.0)
        full, _ = d.train_forward(batch, last, 1.0)
        d.config.sa_drop = 0.999999
        d.train()
        got, _ = d.train_forward(batch, last, 1.0)
        d.eval()
        kept, _ = d.train_forward(batch, last, 1.0)
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, full, atol=1e-3)
    assert torch.equal(kept, full)  # evaluation mode: SA always runs
    for bad in (1.0, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="sa_drop"):
            MoADrafter.random(tiny, seed=2, **{**SMALL, "sa_drop": bad})


# ----- the reference's training signal ----------------------------------------------------------
def test_own_row_reads_in_training_only(tiny):
    """own_row_reads: in training a verified row reads its own memory row (the reference's idx_j <= start(i));
    in eval mode (held-out evaluation) and at inference every row reads strictly earlier rows."""
    d = MoADrafter.random(tiny, seed=3, lsa_dim=16, lsa_heads=2)
    assert d.config.own_row_reads and d.config.memory_norm and d.config.ca_mlp and d.config.reference_init
    tokens = tiny_prompts(VOCAB, n=1, length=20, seed=5)[0]
    batch = batch_for(d, tiny, tokens, 2)
    verified = d.verified_positions(batch, period=torch.tensor([5]))
    last = d.last_verified(batch, verified=verified)
    reads = d.reads_with_own_row(verified, last)
    pos = torch.arange(20)
    assert torch.equal(reads[0, verified[0]], pos[verified[0]])  # verified rows: their own row
    assert torch.equal(reads[0, ~verified[0]], last[0, ~verified[0]])  # the others: the last verified one
    assert bool((last[0] < pos).all())
    mask = d.ca_read_mask(reads)[0]
    j = int(pos[verified[0] & (pos > 5)][0])  # a verified answer row
    assert bool(mask[j, j]) and not bool(d.ca_read_mask(last)[0][j, j])
    # the rows' predictions change only where the reads do (verified rows), and only in training
    d.train()
    torch.manual_seed(0)
    own, _ = d.train_forward(batch, last, 1.0, reads)
    plain, _ = d.train_forward(batch, last, 1.0)
    differs = (own - plain).abs().amax(-1)[0] > 1e-6
    assert bool(differs[verified[0] & (pos > 0)].any()) and not bool(differs[~verified[0]].any())
    d.eval()
    d.config.staircase_until = 0.0  # no staircase draw: the loss is deterministic
    loss_eval, metrics_eval = d.training_loss(batch, 1.0)
    assert "acc@0" not in metrics_eval  # evaluation never reads a row's own memory
    d.train()
    _, metrics_train = d.training_loss(batch, 1.0)
    assert "acc@0" in metrics_train


def test_reference_staircase_keeps_a_verified_row_to_itself(tiny):
    """Under the staircase (progress 0: every sequence draws it) SA at a verified row sees only that row, as
    the reference's mask does; elsewhere the current segment. Checked through what changes SA's output."""
    d = MoADrafter.random(tiny, seed=3, lsa_dim=16, lsa_heads=2, init_from_target=True)
    tokens = tiny_prompts(VOCAB, n=1, length=16, seed=6)[0]
    batch = batch_for(d, tiny, tokens, 1)
    verified = d.verified_positions(batch, period=torch.tensor([4]))
    last = d.last_verified(batch, verified=verified)
    reads = d.reads_with_own_row(verified, last)
    d.train()
    base, _ = d.train_forward(batch, last, 0.0, reads)
    changed = batch.input_ids.clone()
    changed[0, 7] = (changed[0, 7] + 1) % VOCAB  # a token just before the verified position 8
    other = batch_for(d, tiny, changed[0].tolist(), 1)
    other.layer_kv, other.hidden = batch.layer_kv, batch.hidden  # the same target activations: SA alone differs
    moved, _ = d.train_forward(other, last, 0.0, reads)
    diff = (moved - base).abs().amax(-1)[0] > 1e-6
    assert not bool(diff[8])  # verified row 8 sees only itself under the staircase
    assert bool(diff[7])  # the changed token's own row
    assert not bool(diff[9:12].any())  # rows after 8 see only their own segment (9..j), not 7


def test_reference_init_starts_every_block_near_silent(tiny):
    d = MoADrafter.random(tiny, seed=1, lsa_dim=16, lsa_heads=2, final_feature=True)
    for name, p in d.named_parameters():
        if name.startswith("lsa.in_norm"):
            assert torch.equal(p, torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)), name
        elif name.startswith("lsa.feat."):
            assert not p.any(), name  # the final feature's projection starts at zero
        elif name.endswith("bias"):
            assert not p.any(), name
        else:
            assert p.float().std() < 0.03 and p.float().abs().mean() < 0.03, name
    with pytest.raises(ValueError, match="exclude each other"):
        MoADrafter.random(tiny, seed=1, init_from_target=True, reference_init=True, lsa_dim=16, lsa_heads=2)


def test_checkpoints_without_the_reference_fields_load_as_they_were_built(tmp_path, tiny):
    """A checkpoint written before memory_norm / reference_init / own_row_reads existed runs as it was trained."""
    d = MoADrafter.random(tiny, seed=2, **SMALL, memory_norm=False, own_row_reads=False, reference_init=False)
    d.save_pretrained(tmp_path / "old")
    path = tmp_path / "old" / "config.json"
    meta = json.loads(path.read_text())
    for k in ("memory_norm", "reference_init", "own_row_reads"):
        del meta["config"][k]
    path.write_text(json.dumps(meta))
    back = MoADrafter.from_pretrained(tmp_path / "old", tiny)
    assert (back.config.memory_norm, back.config.own_row_reads, back.config.reference_init) == (False, False, False)


def test_sharded_weights_load_like_a_single_file(tmp_path, tiny, monkeypatch):
    """Weights over SHARD_BYTES are saved as Hub-style shards with an index; both layouts load the same."""
    from core.drafters import checkpoint

    d = MoADrafter.random(tiny, seed=2, lsa_dim=16, lsa_heads=2)
    d.save_pretrained(tmp_path / "one")
    assert checkpoint.weight_files(tmp_path / "one") == [tmp_path / "one" / "model.safetensors"]
    monkeypatch.setattr(checkpoint, "SHARD_BYTES", 2000)
    d.save_pretrained(tmp_path / "one")  # the same folder: the single file is replaced by shards
    files = checkpoint.weight_files(tmp_path / "one")
    assert len(files) > 2 and not (tmp_path / "one" / "model.safetensors").exists()
    from safetensors import safe_open

    for f in files:  # tensors fill a shard up to the budget; a tensor larger than it gets a shard of its own
        with safe_open(str(f), "pt") as g:
            sizes = [g.get_slice(k).get_shape() for k in g.keys()]
        assert len(sizes) == 1 or sum(2 * math.prod(s) for s in sizes) <= 2000
    a = MoADrafter.from_pretrained(tmp_path / "one", tiny).state_dict()
    saved = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in d.state_dict().items()}
    assert all(torch.equal(a[k], v.to(a[k].dtype)) for k, v in saved.items())  # weights are stored in bfloat16


def test_memory_loss_trains_a_readout_of_the_final_feature_that_inference_never_runs(tiny):
    """memory_loss: a linear readout of each LSA memory row must recover the target's normed final feature; the
    loss is ~1 - R^2 of that read on the batch, it reaches the LSA, and drafting never reads the readout."""
    assert not hasattr(MoADrafter.random(tiny, seed=4, lsa_dim=16, lsa_heads=2), "memory_readout")
    d = MoADrafter.random(tiny, seed=4, lsa_dim=16, lsa_heads=2, memory_loss=1.0)
    tokens = tiny_prompts(VOCAB, n=1, length=24, seed=7)[0]
    batch = batch_for(d, tiny, tokens, 2)
    d.train()
    d.config.staircase_until = 0.0
    loss, metrics = d.training_loss(batch, 1.0)
    assert metrics["loss_memory"] > 0.9  # a near-silent readout explains nothing yet
    loss.backward()
    assert d.memory_readout.weight.grad.abs().sum() > 0 and d.lsa.out.weight.grad.abs().sum() > 0
    opt = torch.optim.Adam([*d.memory_readout.parameters(), *d.lsa.parameters()], lr=1e-2)
    for _ in range(60):
        opt.zero_grad()
        kept: dict = {}
        d.train_forward(batch, d.last_verified(batch), 1.0, keep=kept)
        d.memory_read_loss(kept["memory"], batch).backward()
        opt.step()
    assert float(d.memory_read_loss(kept["memory"], batch).detach()) < 0.5 * metrics["loss_memory"]
    d.eval()
    with torch.no_grad():
        d.memory_readout.weight.fill_(float("nan"))  # drafting that read it would turn NaN
    assert_greedy_lossless(tiny, lambda: d, tiny_prompts(VOCAB, n=2, seed=8), 12)
    with pytest.raises(ValueError, match="memory_loss"):
        MoADrafter.random(tiny, seed=4, lsa_dim=16, lsa_heads=2, memory_loss=-1.0)
