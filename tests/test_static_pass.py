"""The verify pass on fixed buffers (core.static_pass): the same numbers as the eager pass for every bucket,
a pass that reads only its buffers (what a CUDA graph replays), and float32 decoding that equals plain
decoding for every method and bucket."""

from __future__ import annotations

import pytest
import torch

from core.decoding import generate
from core.drafters.base import Autoregressive
from core.drafters.eagle2 import Eagle2Drafter
from core.static_pass import BUCKETS, StaticPasses, acquire, bucket_for, capacity_for, release, resolve_pass_mode
from core.target import tiny_target


@pytest.fixture(scope="module")
def tiny():
    return tiny_target()


def _tree_mask(t: int) -> torch.Tensor:
    """A causal mask with its second half cut off from its first half but the root (a two-branch tree)."""
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    mask[t // 2:, 1: t // 2] = False
    return mask


def _on_static(target, drafter, prompt, n):
    """One generation with the target's passes (and the drafter's levels) on fixed buffers, run eagerly."""
    target.pass_mode = "static"
    try:
        return generate(target, drafter, prompt, n)
    finally:
        target.pass_mode = "auto"


def _prefilled(tiny, prompt):
    eager, static = tiny.new_cache(64), StaticPasses(tiny, 512)
    tiny.forward(prompt, cache=eager)
    tiny.forward(prompt, cache=static.cache)
    return eager, static


@pytest.mark.parametrize("bucket", BUCKETS)
def test_the_static_pass_gives_the_eager_pass_numbers_for_every_bucket(tiny, bucket):
    torch.manual_seed(bucket)
    prompt = torch.randint(2, 64, (19,))
    for t in sorted({1, bucket // 2 + 1, bucket}):
        eager, static = _prefilled(tiny, prompt)
        ids = torch.randint(2, 64, (t,))
        positions = eager.length + torch.arange(t)
        e = tiny.forward(ids, positions, eager, tree_mask=_tree_mask(t), hidden_layers=(0, 2), return_layer_kv=True)
        s = static(ids, positions, _tree_mask(t), (0, 2), True)
        assert s.logits.shape == e.logits.shape
        torch.testing.assert_close(s.logits, e.logits, atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(s.hidden[2], e.hidden[2], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(s.layer_kv, e.layer_kv, atol=1e-6, rtol=1e-5)
        assert static.cache.length == eager.length == len(prompt) + t
        n = eager.length
        torch.testing.assert_close(static.cache.buffer[..., :n, :], eager.buffer[..., :n, :], atol=1e-6, rtol=1e-5)


def test_the_pass_reads_only_its_buffers(tiny):
    """What a CUDA graph replays: after `fill`, nothing on the Python side (here the cache's length) matters."""
    prompt = torch.randint(2, 64, (11,), generator=torch.Generator().manual_seed(1))
    _, static = _prefilled(tiny, prompt)
    ids, positions = torch.tensor([5, 6, 7]), 11 + torch.tensor([0, 1, 1])
    static.fill(4, ids, positions, _tree_mask(3))
    want = static.run_filled(4, (), False)["logits"].clone()
    static.cache.length = 0  # a value the pass must not read
    got = static.run_filled(4, (), False)["logits"]
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_pass_longer_than_every_bucket_runs_eagerly(tiny):
    prompt = torch.randint(2, 64, (5,), generator=torch.Generator().manual_seed(2))
    eager, static = _prefilled(tiny, prompt)
    t = max(BUCKETS) + 3
    ids = torch.randint(2, 64, (t,), generator=torch.Generator().manual_seed(3))
    e = tiny.forward(ids, None, eager)
    s = static(ids, 5 + torch.arange(t), None)
    torch.testing.assert_close(s.logits, e.logits, atol=2e-6, rtol=1e-5)
    assert bucket_for(t) is None and static.cache.length == 5 + t


def test_buckets_and_capacities():
    assert [bucket_for(t) for t in (1, 2, 4, 5, 25, 65)] == [1, 4, 4, 8, 32, 128]
    assert capacity_for(100, 8192) == 512 and capacity_for(500, 8192) == 1024
    assert capacity_for(10_000, 8192) == 16384  # the model's context and the largest bucket's padding


def test_pass_modes_are_checked_in_one_line():
    assert resolve_pass_mode("auto", "cpu") == "eager"
    assert resolve_pass_mode("static", "cpu") == "static"
    with pytest.raises(ValueError, match="unknown pass mode 'fast'; choose one of auto, eager, static, captured"):
        resolve_pass_mode("fast", "cpu")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_pass_mode("captured", "cpu")


def test_generations_share_buffers_one_at_a_time(tiny):
    a = acquire(tiny, "static", 100)
    b = acquire(tiny, "static", 100)
    assert a is not b and a.capacity == b.capacity == 512
    release(a)
    assert acquire(tiny, "static", 90) is a
    release(a)
    release(b)


@pytest.mark.parametrize("total_tokens", [3, 7, 15, 31, 63, 100])
def test_tiny_static_decoding_equals_plain_decoding(tiny, total_tokens):
    prompt = [3, 9, 4, 17, 8, 2, 30]
    plain = generate(tiny, Autoregressive(), prompt, 40).token_ids
    drafter = Eagle2Drafter.random(tiny, seed=0, depth=6, top_k=8, total_tokens=total_tokens)
    got = _on_static(tiny, drafter, prompt, 40)
    assert got.token_ids == plain
    sizes = {len(e.tree) + 1 for e in got.events[1:]}
    assert bucket_for(max(sizes)) == bucket_for(total_tokens + 1)


REAL_PROMPTS = ["Write a Python function that returns the square of a number.",
                "Explain in two sentences why the sky is blue."]


@pytest.fixture(scope="module")
def target32():
    from core.target import load_target

    return load_target(dtype="float32")


@pytest.mark.real
def test_every_method_decodes_on_static_buffers_as_plain_decoding_in_float32(target32):
    from core.methods import BASELINE, build_drafter, lookup_names, shipped_names

    for prompt in REAL_PROMPTS:
        ids = target32.chat_ids(prompt)
        plain = generate(target32, Autoregressive(), ids, 32).token_ids
        for method in [BASELINE, *shipped_names(), *lookup_names()]:
            got = _on_static(target32, build_drafter(method, target32), ids, 32)
            assert got.token_ids == plain, method


@pytest.mark.real
@pytest.mark.parametrize("total_tokens", [3, 7, 15, 31, 63, 100])
def test_every_bucket_decodes_on_static_buffers_as_plain_decoding_in_float32(target32, total_tokens):
    from core.methods import build_drafter

    ids = target32.chat_ids(REAL_PROMPTS[0])
    plain = generate(target32, Autoregressive(), ids, 24).token_ids
    drafter = build_drafter("eagle2", target32, depth=6, top_k=10, total_tokens=total_tokens)
    got = _on_static(target32, drafter, ids, 24)
    assert got.token_ids == plain
    assert bucket_for(max(len(e.tree) + 1 for e in got.events[1:])) == bucket_for(total_tokens + 1)


def _captured_on_the_cpu(monkeypatch, graph_maker):
    """Decoding as on CUDA with 'captured' passes, a stand-in making the graphs (same buffer protocol)."""
    import core.decoding
    import core.static_pass

    monkeypatch.setattr(core.static_pass, "cuda_graph", graph_maker)
    monkeypatch.setattr(core.static_pass, "resolve_pass_mode", lambda mode, device: "captured")
    monkeypatch.setattr(core.decoding, "resolve_pass_mode", lambda mode, device: "captured")


def test_replayed_passes_decode_as_plain_decoding_and_are_captured_once(monkeypatch):
    from core.static_pass import replaying_stand_in

    tiny = tiny_target(seed=3)
    made = []

    def counting(fn):
        made.append(1)
        return replaying_stand_in(fn)

    prompt = [3, 9, 4, 17, 8, 2, 30]
    plain = generate(tiny, Autoregressive(), prompt, 40).token_ids
    _captured_on_the_cpu(monkeypatch, counting)
    drafter = Eagle2Drafter.random(tiny, seed=0, depth=4, top_k=4, total_tokens=3)
    for total_tokens in (3, 7, 3):  # the second run of 3 replays the first one's graphs
        drafter.set_options(total_tokens=total_tokens)
        got = generate(tiny, drafter, prompt, 40, record=True)
        assert got.token_ids == plain
        assert drafter.static is not None and drafter.static.graph is not None  # its drafting level, captured
    (passes,) = [p for ps in tiny._static_pool.values() for p in ps]
    assert {k[0] for k in passes.graphs} == {4, 8}  # trees of 3 and 7 nodes: passes of 4 and 8 tokens
    assert len(made) == 3  # one capture per pass bucket and one of the drafting level, replayed by later runs


def test_a_capture_that_fails_costs_speed_not_the_answer(monkeypatch):
    def failing(fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    tiny = tiny_target(seed=4)
    prompt = [5, 6, 7, 8, 9]
    plain = generate(tiny, Autoregressive(), prompt, 30).token_ids
    _captured_on_the_cpu(monkeypatch, failing)
    drafter = Eagle2Drafter.random(tiny, seed=0, depth=3, top_k=4, total_tokens=7)
    with pytest.warns(UserWarning, match="capture failed"):
        got = generate(tiny, drafter, prompt, 30)
    assert got.token_ids == plain


def _trees(result):
    return [(e.tree.tokens.tolist(), e.tree.parents.tolist(), e.tree.draft_probs) for e in result.events[1:]]


def _same_trees_eager_and_static(target, drafter, prompt, n=30):
    """Decode eagerly, then on static passes and levels: the same tokens and the same trees, level by level."""
    eager = generate(target, drafter, prompt, n)
    static = _on_static(target, drafter, prompt, n)
    assert drafter.static is not None
    assert static.token_ids == eager.token_ids
    for (t1, p1, q1), (t2, p2, q2) in zip(_trees(eager), _trees(static), strict=True):
        assert (t1, p1) == (t2, p2)
        torch.testing.assert_close(q1, q2, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("total_tokens,depth", [(3, 2), (7, 3), (15, 5), (31, 8)])
def test_static_drafting_levels_draft_the_eager_trees(tiny, total_tokens, depth):
    """Lossless output alone would hide a wrong drafting level: the trees themselves must be the same."""
    drafter = Eagle2Drafter.random(tiny, seed=1, depth=depth, top_k=4, total_tokens=total_tokens)
    _same_trees_eager_and_static(tiny, drafter, [3, 9, 4, 17, 8, 2, 30, 11, 5])
    assert drafter.cache is drafter.static.cache


@pytest.mark.real
@pytest.mark.parametrize("method", ["eagle2", "moa", "moa-tli1", "moa-tli3"])
def test_shipped_tree_drafters_draft_the_same_trees_on_static_levels_in_float32(target32, method):
    from core.methods import build_drafter

    ids = target32.chat_ids(REAL_PROMPTS[1])
    drafter = build_drafter(method, target32, depth=4, top_k=8, total_tokens=15)
    eager = generate(target32, drafter, ids, 24)
    static = _on_static(target32, drafter, ids, 24)
    assert drafter.static is not None
    assert static.token_ids == eager.token_ids
    for (t1, p1, _), (t2, p2, _) in zip(_trees(eager), _trees(static), strict=True):
        assert (t1, p1) == (t2, p2)


@pytest.mark.parametrize("tli,window", [(0, 0), (1, 0), (0, 4), (2, 4)])
@pytest.mark.parametrize("total_tokens,depth", [(3, 2), (7, 3), (15, 5)])
def test_moa_drafts_the_eager_trees_on_static_levels(tiny, tli, window, total_tokens, depth):
    """With TLI layers, a CA window and the final feature's shortcut (the shipped MoA's settings) too."""
    from core.drafters.moa import MoADrafter

    drafter = MoADrafter.random(tiny, seed=2, tli=tli, depth=depth, top_k=4, total_tokens=total_tokens,
                                ca_window=window, final_feature=bool(window))
    _same_trees_eager_and_static(tiny, drafter, [3, 9, 4, 17, 8, 2, 30, 11, 5, 7, 21, 13])
    assert drafter.ca_cache is drafter.static.extra["ca"]


def test_moa_levels_replayed_draft_the_eager_trees(monkeypatch):
    """MoA's level as a replay: its CA memory length and shortcut reach the replay through their buffers."""
    from core.drafters.moa import MoADrafter
    from core.static_pass import replaying_stand_in

    tiny = tiny_target(seed=5)
    prompt = [3, 9, 4, 17, 8, 2, 30, 11, 5, 7, 21, 13]
    drafter = MoADrafter.random(tiny, seed=2, tli=1, depth=3, top_k=4, total_tokens=7, ca_window=4)
    eager = generate(tiny, drafter, prompt, 30)
    _captured_on_the_cpu(monkeypatch, replaying_stand_in)
    replayed = generate(tiny, drafter, prompt, 30)
    assert drafter.static.capture and drafter.static.graph is not None
    assert replayed.token_ids == eager.token_ids
    assert [t[:2] for t in _trees(replayed)] == [t[:2] for t in _trees(eager)]


def test_static_levels_grow_with_a_long_conversation(tiny, monkeypatch):
    import core.drafters.eagle2
    import core.static_pass

    monkeypatch.setattr(core.static_pass, "MIN_CAPACITY", 32)
    monkeypatch.setattr(core.drafters.eagle2, "LEVEL_ROOM", 0)  # buffers sized for the prompt alone
    prompt = [3, 9, 4, 17, 8, 2, 30, 11, 5]
    drafter = Eagle2Drafter.random(tiny, seed=1, depth=3, top_k=4, total_tokens=7)
    eager = generate(tiny, drafter, prompt, 60)
    static = _on_static(tiny, drafter, prompt, 60)
    assert drafter.static.cache.capacity > 64  # started at 64, grew
    assert static.token_ids == eager.token_ids
    assert [t[:2] for t in _trees(static)] == [t[:2] for t in _trees(eager)]
