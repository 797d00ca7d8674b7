"""Medusa: losslessness, checkpoints, head independence, the training loss and its metrics.

The generic checks (`check_*`) are reused by tests/test_amphista.py.
"""

from __future__ import annotations

import functools

import pytest
import torch

from core.decoding import generate
from core.drafters.base import Verified
from core.drafters.checkpoint import CorruptCheckpointError, DrafterMismatchError, TrainBatch
from core.drafters.medusa import MedusaDrafter
from core.drafters.trained import LOSS_DECAY
from core.target import Target, load_target, tiny_target
from tests.helpers import ALPHA, assert_greedy_lossless, sampling_p_value, tiny_prompts


@functools.cache
def tiny(vocab: int = 64, seed: int = 0, dtype: torch.dtype = torch.float32) -> Target:
    return tiny_target(vocab_size=vocab, seed=seed, dtype=dtype)


@functools.cache
def real_target_f32() -> Target:
    return load_target(None, "float32", "cpu")


def prefill(target: Target, prompt: list[int]) -> Verified:
    out = target.forward(torch.tensor(prompt), hidden_layers=(target.n_layers,))
    first = int(out.logits[0, -1].argmax())
    return Verified(list(prompt), first, 0, {target.n_layers: out.hidden[target.n_layers][0]})


def train_batch(target: Target, batch: int = 2, length: int = 14, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, target.vocab_size, (batch, length), generator=g)
    loss_mask = torch.zeros(batch, length, dtype=torch.bool)  # bool masks, as core.training builds them
    loss_mask[:, 4:] = True
    attn = torch.ones(batch, length, dtype=torch.bool)
    hidden = target.forward(ids, hidden_layers=(target.n_layers,), return_logits=False).hidden
    return TrainBatch(ids, loss_mask, attn, hidden, None, target)


# ----- generic checks, shared with Amphista ------------------------------------------------------
def check_greedy_lossless(cls) -> None:
    target = tiny()
    drafter = cls.random(target, seed=1)
    assert_greedy_lossless(target, lambda: drafter, tiny_prompts(64, n=2), max_new_tokens=24)
    small = cls.random(target, seed=2, tree_size=6, tree_depth=2)
    assert len(small.tree_paths) == 6
    assert_greedy_lossless(target, lambda: small, tiny_prompts(64, n=1, seed=1), max_new_tokens=16)


def check_sampling(cls) -> None:
    target = tiny(16)
    drafter = cls.random(target, seed=0)
    assert max(max(p) for p in drafter.tree_paths) < 16  # the tree fits the vocabulary
    p = sampling_p_value(target, lambda: drafter, [3, 7, 5], n_tokens=2, samples=600)
    assert p > ALPHA


def check_roundtrip(cls, tmp_path) -> None:
    target = tiny(dtype=torch.bfloat16)  # checkpoints store bfloat16: a bf16 drafter round-trips bit-exactly
    drafter = cls.random(target, seed=3)
    drafter.set_options(tree_size=9, tree_depth=3)
    drafter.save_pretrained(tmp_path / "ckpt")
    loaded = cls.from_pretrained(tmp_path / "ckpt", target)
    assert loaded.tree_paths == drafter.tree_paths and len(loaded.tree_paths) == 9
    a, b = drafter.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    pre = prefill(target, [5, 9, 11, 2, 30])
    drafter.begin(target, pre)
    loaded.begin(target, pre)
    t1, t2 = drafter.draft(pre.bonus), loaded.draft(pre.bonus)
    assert torch.equal(t1.tokens, t2.tokens) and torch.equal(t1.parents, t2.parents)
    assert torch.equal(t1.draft_probs, t2.draft_probs)


def check_mismatch_and_corrupt(cls, tmp_path) -> None:
    target = tiny()
    cls.random(target).save_pretrained(tmp_path / "ckpt")
    other = tiny(seed=1)
    with pytest.raises(DrafterMismatchError) as err:
        cls.from_pretrained(tmp_path / "ckpt", other)
    assert target.source in str(err.value) and other.source in str(err.value)
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CorruptCheckpointError):
        cls.from_pretrained(tmp_path / "ckpt", target)


def check_training_loss(cls) -> None:
    target = tiny()
    drafter = cls.random(target, seed=0).train()
    batch = train_batch(target)
    batch.attention_mask[1, -3:] = False  # a right-padded row
    batch.loss_mask[1, -3:] = False
    loss, metrics = drafter.training_loss(batch, 0.0)
    loss.backward()
    k = drafter.config.num_heads
    assert torch.isfinite(loss) and loss.item() > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in drafter.parameters())
    for i in range(1, k + 1):
        tops = [metrics[f"top{j}@{i}"] for j in range(1, 11)]
        assert metrics[f"acc@{i}"] == tops[0]
        assert tops == sorted(tops) and 0 <= tops[0] <= tops[-1] <= 1
    paths = drafter.set_tree_from_metrics(metrics, size=7)
    assert len(paths) == 7 and drafter.config.tree_paths == [list(p) for p in paths]


def subset_drafter(cls, target: Target, ids: torch.Tensor, seed: int = 1, context: bool = True):
    drafter = cls.random(target, seed=seed, draft_vocab_size=ids.numel(), context_vocab=context)
    drafter.vocab.set_ids(ids)
    return drafter


def check_draft_top(drafter, tree) -> None:
    """extras["draft_top"]: one row per [root, nodes...]; a row's list is the top-10 of the head that
    drafts its children (so it starts with those children, in rank order), [] for a leaf."""
    top = tree.extras["draft_top"]
    assert len(top) == 1 + len(tree)
    children = tree.children()
    for row, cands in enumerate(top):
        kids = children[row]
        if not kids:
            assert cands == []
            continue
        assert len(cands) == min(10, drafter.vocab.size)
        probs = [p for _, p in cands]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-4
        assert [cands[k][0] for k in range(len(kids))] == tree.tokens[kids].tolist()
        assert [cands[k][1] for k in range(len(kids))] == pytest.approx(tree.draft_probs[kids].tolist(), abs=1e-4)


def check_subset_vocab(cls, tmp_path) -> None:
    """draft_vocab_size > 0: drafts come only from the subset (and, with context tokens on, from the
    conversation), decoding stays lossless, the ids are saved."""
    target = tiny()
    ids = torch.arange(1, 64, 2)  # 32 of the 64 tokens
    prompt = [5, 9, 11, 2, 30]  # 2 and 30 lie outside the subset
    for context in (False, True):
        drafter = subset_drafter(cls, target, ids, context=context)
        assert drafter.vocab.size == 32 and max(max(p) for p in drafter.tree_paths) < 32
        assert_greedy_lossless(target, lambda d=drafter: d, tiny_prompts(64, n=2), max_new_tokens=24)
        out = generate(target, drafter, prompt, 24, stop_tokens=set())
        allowed = set(ids.tolist()) | (set(prompt) | set(out.token_ids) if context else set())
        drafted = torch.cat([e.tree.tokens for e in out.events[1:]])
        assert drafted.numel() > 0 and set(drafted.tolist()) <= allowed
        assert (not set(drafted.tolist()) <= set(ids.tolist())) == context  # context tokens do get drafted
        for e in out.events[1:]:
            check_draft_top(drafter, e.tree)
            assert all(t in allowed for row in e.extras["draft_top"] for t, _ in row)
    # ids that bfloat16 cannot represent exactly (> 256) must survive save/load
    big = tiny(1024, dtype=torch.bfloat16)
    ids = torch.arange(257, 1024, 23)[:32]
    drafter = subset_drafter(cls, big, ids, seed=2)
    drafter.save_pretrained(tmp_path / "subset")
    loaded = cls.from_pretrained(tmp_path / "subset", big)
    assert loaded.config.draft_vocab_size == 32 and torch.equal(loaded.vocab.ids, ids)
    pre = prefill(big, [5, 9, 300, 2, 700])
    drafter.begin(big, pre)
    loaded.begin(big, pre)
    t1, t2 = drafter.draft(pre.bonus), loaded.draft(pre.bonus)
    context = torch.tensor([5, 9, 300, 2, 700, pre.bonus])
    assert torch.equal(t1.tokens, t2.tokens) and torch.isin(t2.tokens, torch.cat([ids, context])).all()


def check_subset_training_loss(cls) -> None:
    """Labels outside the subset add no loss but count as misses in acc@i / top{k}@i."""
    target = tiny()
    ids = torch.arange(0, 64, 2)
    drafter = subset_drafter(cls, target, ids, seed=0).train()
    batch = train_batch(target, length=16)
    loss, metrics = drafter.training_loss(batch, 0.0)
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in drafter.parameters())
    with torch.no_grad():
        logits = drafter.lm_logits(drafter.train_states(batch))  # [B, T', K, 32]
    total = 0.0
    for i in range(drafter.config.num_heads):
        s = 2 + i
        n = min(logits.shape[1], batch.input_ids.shape[1] - s)
        valid = batch.loss_mask[:, s:s + n] > 0
        lg, y = logits[:, :n, i][valid], batch.greedy_next()[:, s - 1:s - 1 + n][valid]
        idx = drafter.vocab.to_index(y)
        inside = idx >= 0
        assert 0 < inside.sum() < y.numel()  # the batch has labels on both sides
        ce = torch.nn.functional.cross_entropy(lg[inside], idx[inside])
        assert metrics[f"ce@{i + 1}"] == pytest.approx(ce.item(), rel=1e-4)
        pred = drafter.vocab.to_token_ids(lg.argmax(-1))
        assert metrics[f"acc@{i + 1}"] == pytest.approx((pred == y).float().mean().item())
        assert metrics[f"top10@{i + 1}"] <= inside.float().mean().item() + 1e-6  # misses outside the subset
        total += LOSS_DECAY**i * ce.item()
    assert loss.item() == pytest.approx(total, rel=1e-4)


# ----- Medusa ------------------------------------------------------------------------------------
def test_greedy_lossless():
    check_greedy_lossless(MedusaDrafter)


def test_sampling_matches_target_distribution():
    check_sampling(MedusaDrafter)


def test_save_load_roundtrip(tmp_path):
    check_roundtrip(MedusaDrafter, tmp_path)


def test_mismatch_and_corrupt(tmp_path):
    check_mismatch_and_corrupt(MedusaDrafter, tmp_path)


def test_training_loss_and_metrics():
    check_training_loss(MedusaDrafter)


def test_subset_vocab(tmp_path):
    check_subset_vocab(MedusaDrafter, tmp_path)


def test_subset_vocab_training_loss():
    check_subset_training_loss(MedusaDrafter)


def test_draft_top_extras():
    target = tiny()
    drafter = MedusaDrafter.random(target, seed=0)
    pre = prefill(target, [1, 2, 3])
    drafter.begin(target, pre)
    check_draft_top(drafter, drafter.draft(pre.bonus))
    drafter.set_options(tree_paths=[[0], [1], [0, 0]])
    tree = drafter.draft(pre.bonus)
    check_draft_top(drafter, tree)
    top = tree.extras["draft_top"]
    assert [len(r) for r in top] == [10, 10, 0, 0]  # root (head 0), node (0,) (head 1), two leaves
    logits = drafter.head_logits(pre.hidden[target.n_layers][-1])
    assert [t for t, _ in top[1]] == logits[1].topk(10).indices.tolist()


def test_accuracy_metric_is_head_top1_against_the_targets_greedy_tokens():
    """Labels are the target's argmax 2+i tokens ahead given the data before it, not the data's own tokens
    (random tokens here, which the target would rarely choose)."""
    target = tiny()
    drafter = MedusaDrafter.random(target, seed=4)
    batch = train_batch(target, seed=1)
    with torch.no_grad():
        _, metrics = drafter.training_loss(batch, 0.0)
        logits = drafter.head_logits(batch.hidden[target.n_layers])  # [B, T, K, V]
        full = target.forward(batch.input_ids).logits.argmax(-1)  # [B, T]: greedy token after each position
    assert torch.equal(batch.greedy_next(), full)
    assert (full[:, :-1] != batch.input_ids[:, 1:]).float().mean() > 0.5
    for i in range(drafter.config.num_heads):
        s = 2 + i
        pred = logits[:, : -s, i].argmax(-1)
        right = (pred == full[:, s - 1:-1])[batch.loss_mask[:, s:] > 0]
        assert metrics[f"acc@{i + 1}"] == pytest.approx(right.float().mean().item())


def test_fresh_heads_repeat_the_lm_head_and_random_heads_differ():
    target = tiny()
    feature = prefill(target, [4, 8, 15, 16, 23]).hidden[target.n_layers][-1]
    fresh = MedusaDrafter(MedusaDrafter.random(target).config, target)  # zero-initialised W
    top = fresh.head_logits(feature).argmax(-1)
    assert (top == target.logits(feature).argmax(-1)).all()
    rand = MedusaDrafter.random(target, seed=0).head_logits(feature)
    assert all(not torch.allclose(rand[0], rand[i]) for i in range(1, 4))  # the noise separates the heads
    other = MedusaDrafter.random(target, seed=1).head_logits(feature)
    assert not torch.equal(other, MedusaDrafter.random(target, seed=0).head_logits(feature))


def test_heads_are_independent():
    target = tiny()
    drafter = MedusaDrafter.random(target, seed=0)
    feature = torch.randn(3, target.hidden_size)
    with torch.no_grad():
        before = drafter.head_logits(feature)
        drafter.heads[3][0].linear.weight.add_(0.5)
        after = drafter.head_logits(feature)
    assert torch.equal(before[:, :3], after[:, :3])
    assert not torch.allclose(before[:, 3], after[:, 3])


def test_options():
    target = tiny()
    drafter = MedusaDrafter.random(target)
    drafter.set_options(tree_paths=[[0], [1], [0, 0]])
    assert drafter.tree_paths == [(0,), (1,), (0, 0)]
    assert drafter.config.tree_paths == [[0], [1], [0, 0]]
    pre = prefill(target, [1, 2, 3])
    drafter.begin(target, pre)
    tree = drafter.draft(pre.bonus)
    assert tree.parents.tolist() == [-1, -1, 0]
    with pytest.raises(ValueError):
        drafter.set_options(tree_paths=[[0, 0]])  # no parent
    with pytest.raises(ValueError):
        drafter.set_options(beam=3)


@pytest.mark.real
def test_real_target_greedy_lossless():
    target = real_target_f32()
    prompt = target.chat_ids("Name three primary colours.")
    taus = assert_greedy_lossless(target, lambda: MedusaDrafter.random(target, seed=0), [prompt],
                                  max_new_tokens=24)
    assert taus[0] >= 1.0


def test_batched_heads_draft_what_the_modules_compute():
    """draft() runs the heads batched (StackedHeads): the same tree as the modules' head_logits."""
    target = tiny()
    drafter = MedusaDrafter.random(target, seed=2, num_layers_per_head=2)
    pre = prefill(target, [3, 1, 4, 1, 5])
    drafter.begin(target, pre)
    fast = drafter.draft(pre.bonus)
    with torch.no_grad():
        want = drafter.tree_from_logits(drafter.head_logits(drafter.feature))
    assert torch.equal(fast.tokens, want.tokens)
    assert torch.allclose(fast.draft_probs, want.draft_probs, atol=1e-5)
