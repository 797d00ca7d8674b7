"""The core engine on tiny random Llamas: tree passes, cache bookkeeping, losslessness, stopping, bad input."""

from __future__ import annotations

import itertools

import pytest
import torch

from core.decoding import generate, generate_stream, stop_rule
from core.drafters.base import Autoregressive, Drafter
from core.drafters.pld import PromptLookupDrafter
from core.kv_cache import KVCache
from core.target import tiny_target
from core.trees.draft_tree import DraftTree
from core.verify import SamplingConfig, target_probs, verify_tree
from tests.helpers import ALPHA, assert_greedy_lossless, brute_force_tree_logits, sampling_p_value, tiny_prompts


@pytest.fixture(scope="module")
def target():
    return tiny_target(vocab_size=64, seed=1)


class NoisyOracleDrafter(Drafter):
    """Drafts the target's own greedy continuation, corrupting tokens at random; optionally adds siblings.

    It makes partial acceptance common, which is what the bookkeeping tests need.
    """

    name = "noisy-oracle"

    def __init__(self, depth: int = 4, noise: float = 0.35, siblings: int = 0, seed: int = 0) -> None:
        self.depth, self.noise, self.siblings = depth, noise, siblings
        self.gen = torch.Generator().manual_seed(seed)

    def draft(self, root: int) -> DraftTree:
        ctx = list(self.context) + [root]
        tokens, parents = [], []
        parent = -1
        for _ in range(self.depth):
            logits = self.target.forward(torch.tensor(ctx)).logits[0, -1]
            tok = int(logits.argmax())
            if torch.rand((), generator=self.gen) < self.noise:
                tok = int(torch.randint(0, self.target.vocab_size, (), generator=self.gen))
            for _ in range(self.siblings):
                sib = int(torch.randint(0, self.target.vocab_size, (), generator=self.gen))
                if sib != tok and sib not in [t for t, p in zip(tokens, parents) if p == parent]:
                    tokens.append(sib)
                    parents.append(parent)
            tokens.append(tok)
            parents.append(parent)
            parent = len(tokens) - 1
            ctx.append(tok)
        return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.full((len(tokens),), 0.5))


class SampledChainDrafter(Drafter):
    """Samples a chain from a fixed, deliberately wrong distribution q and reports q (rejection path)."""

    name = "sampled-chain"

    instances = itertools.count()

    def __init__(self, vocab: int, depth: int = 3) -> None:
        g = torch.Generator().manual_seed(1234)
        self.q = torch.softmax(torch.randn(vocab, generator=g) * 2, -1)
        self.depth = depth
        # A fresh stream per instance: the drafts of different runs must be independent draws from q,
        # and independent of the decoder's own stream (seeded 0, 1, 2, ... by the test), hence the offset.
        self.gen = torch.Generator().manual_seed(10**9 + 7919 * next(self.instances))

    def draft(self, root: int) -> DraftTree:
        toks = torch.multinomial(self.q, self.depth, replacement=True, generator=self.gen)
        q = self.q[None].expand(self.depth, -1)
        return DraftTree.chain(toks, self.q[toks], q)


class SampledTreeDrafter(SampledChainDrafter):
    """Three i.i.d. siblings from q at the root, each with one sampled child: recursive rejection over siblings."""

    def draft(self, root: int) -> DraftTree:
        first = torch.multinomial(self.q, 3, replacement=True, generator=self.gen)
        second = torch.multinomial(self.q, 3, replacement=True, generator=self.gen)
        toks = torch.cat([first, second])
        parents = torch.tensor([-1, -1, -1, 0, 1, 2])
        return DraftTree(toks, parents, self.q[toks], self.q[None].expand(6, -1))


# ----- KV cache ------------------------------------------------------------------------------
def test_cache_keep_moves_accepted_rows_and_drops_the_rest():
    c = KVCache(2, 1, 2, capacity=4)
    for layer in range(2):
        k = torch.arange(6, dtype=torch.float32).view(1, 1, 6, 1).expand(1, 1, 6, 2) + 10 * layer
        c.append(layer, k, -k)
    c.commit(6)  # grown past the initial capacity
    assert c.length == 6 and c.capacity >= 6
    c.keep(2, [0, 2, 3])  # keep positions 0,1 then 2,4,5
    assert c.length == 5
    k, v = c.layer_view(1)
    assert k[0, 0, :, 0].tolist() == [10, 11, 12, 14, 15]
    assert torch.equal(v, -k)
    with pytest.raises(ValueError):
        c.keep(2, [7])
    c.crop(3)
    assert c.length == 3


# ----- target tree pass -----------------------------------------------------------------------
def test_tree_pass_matches_chain_by_chain_evaluation(target):
    prefix = [5, 9, 13, 2, 40]
    tree = DraftTree(torch.tensor([7, 8, 9, 10, 11, 12]), torch.tensor([-1, -1, 0, 0, 1, 4]), torch.ones(6))
    cache = target.new_cache(16)
    target.forward(torch.tensor(prefix), cache=cache)
    ids = torch.cat([torch.tensor([3]), tree.tokens])
    pos = len(prefix) + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths()])
    out = target.forward(ids, pos, cache, tree_mask=tree.attention_mask())
    ref = brute_force_tree_logits(target, prefix, 3, tree.tokens.tolist(), tree.parents.tolist())
    torch.testing.assert_close(out.logits[0], ref, atol=1e-5, rtol=1e-5)


def test_tree_attention_mask_and_depths():
    tree = DraftTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, -1, 1]), torch.ones(4))
    assert tree.depths().tolist() == [1, 2, 1, 3]
    m = tree.attention_mask()
    assert m[4].tolist() == [True, True, True, False, True]  # node 3 sees root, 0, 1 and itself
    assert m[3].tolist() == [True, False, False, True, False]
    assert tree.children() == [[0, 2], [1], [3], [], []]
    with pytest.raises(ValueError):
        DraftTree(torch.tensor([1, 2]), torch.tensor([1, -1]), torch.ones(2))


def test_hidden_states_and_layer_kv_shapes(target):
    out = target.forward(torch.tensor([4, 5, 6]), hidden_layers=(0, target.n_layers), return_layer_kv=True)
    assert out.hidden[0].shape == (1, 3, target.hidden_size)
    assert out.layer_kv.shape == (1, 3, target.n_layers, 2 * target.kv_heads * target.head_dim)
    torch.testing.assert_close(target.logits(out.hidden[target.n_layers]), out.logits)
    torch.testing.assert_close(out.hidden[0], target.embed_tokens(torch.tensor([[4, 5, 6]])))


def test_cache_after_partial_acceptance_equals_fresh_prefill(target):
    prompt = [5, 9, 13, 2, 40, 33]
    cache = target.new_cache(32)
    target.forward(torch.tensor(prompt), cache=cache)
    root = 17
    tree = DraftTree(torch.tensor([7, 8, 9, 10]), torch.tensor([-1, -1, 1, 2]), torch.ones(4))
    ids = torch.cat([torch.tensor([root]), tree.tokens])
    pos = len(prompt) + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths()])
    target.forward(ids, pos, cache, tree_mask=tree.attention_mask())
    accepted = [1, 2]  # tokens 8, 9 on the second branch
    cache.keep(len(prompt), [0] + [a + 1 for a in accepted])
    fresh = target.new_cache(32)
    target.forward(torch.tensor(prompt + [root, 8, 9]), cache=fresh)
    assert cache.length == fresh.length == len(prompt) + 3
    for layer in range(target.n_layers):
        for a, b in zip(cache.layer_view(layer), fresh.layer_view(layer)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # and the next step continues exactly like plain decoding would
    nxt = target.forward(torch.tensor([21]), cache=cache).logits
    ref = target.forward(torch.tensor(prompt + [root, 8, 9, 21])).logits[:, -1:]
    torch.testing.assert_close(nxt, ref, atol=1e-5, rtol=1e-5)


# ----- greedy losslessness --------------------------------------------------------------------
@pytest.mark.parametrize("siblings", [0, 2])
def test_greedy_speculative_equals_plain(target, siblings):
    taus = assert_greedy_lossless(target, lambda: NoisyOracleDrafter(siblings=siblings, seed=siblings),
                                  tiny_prompts(64, 4), max_new_tokens=30, stop_tokens=set())
    assert max(taus) > 1.5  # drafts really were accepted, partially


def test_greedy_lossless_with_random_and_lookup_drafters(target):
    class RandomTree(Drafter):
        def __init__(self):
            self.g = torch.Generator().manual_seed(3)

        def draft(self, root):
            return DraftTree(torch.randint(0, 64, (5,), generator=self.g), torch.tensor([-1, -1, 0, 2, 1]),
                             torch.ones(5))

    assert_greedy_lossless(target, RandomTree, tiny_prompts(64, 3, seed=5), 20, stop_tokens=set())
    assert_greedy_lossless(target, PromptLookupDrafter, [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4]], 20, stop_tokens=set())


def test_greedy_verification_follows_argmax():
    logits = torch.full((4, 8), -5.0)
    logits[0, 3] = 5  # root -> 3
    logits[2, 6] = 5  # after node 1 (token 3) -> 6
    logits[3, 1] = 5  # after node 2 (token 5) -> 1
    tree = DraftTree(torch.tensor([2, 3, 5]), torch.tensor([-1, -1, 1]), torch.ones(3))
    for one_read in (False, True):  # row by row (the CPU's walk), every row's argmax in one read (a GPU's)
        path, bonus = verify_tree(tree, logits, SamplingConfig(), one_read=one_read)
        assert path == [1] and bonus == 6


def test_one_read_greedy_verification_walks_every_tree_as_the_row_by_row_one():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 12, (), generator=g))
        parents = torch.tensor([int(torch.randint(-1, i, (), generator=g)) for i in range(n)])
        tree = DraftTree(torch.randint(0, 4, (n,), generator=g), parents, torch.ones(n))
        logits = torch.randn(n + 1, 4, generator=g)
        assert verify_tree(tree, logits, SamplingConfig(), one_read=True) == verify_tree(tree, logits, SamplingConfig())


# ----- sampling keeps the target distribution ---------------------------------------------------
# Each test is a chi-square goodness-of-fit test of 2-token continuations against the exact
# target law at false-alarm rate ALPHA (seeds fixed, so the outcome is deterministic).
@pytest.fixture(scope="module")
def small_target():
    return tiny_target(vocab_size=12, hidden_size=16, seed=4)


@pytest.mark.parametrize("make", [
    lambda v: NoisyOracleDrafter(depth=3, noise=0.3, siblings=2, seed=1),
    lambda v: SampledChainDrafter(v, depth=3),
    lambda v: SampledTreeDrafter(v),
], ids=["deterministic-tree", "sampled-chain", "sampled-tree"])
def test_sampling_is_lossless(small_target, make):
    p = sampling_p_value(small_target, lambda: make(12), [3, 5, 7], n_tokens=2, samples=1500, temperature=1.0)
    assert p > ALPHA, f"sampled outputs do not follow the target distribution (p = {p:.2e})"


def test_sampling_with_top_p_is_lossless(small_target):
    p = sampling_p_value(small_target, lambda: NoisyOracleDrafter(depth=2, noise=0.2, siblings=1),
                         [2, 8], n_tokens=2, samples=1200, temperature=0.8, top_p=0.7, seed=1)
    assert p > ALPHA


def test_distribution_test_detects_a_lossy_decoder(small_target):
    """The statistical test has power: a decoder that always accepts drafts fails it."""
    import core.decoding as decoding

    def always_accept(tree, logits, cfg, generator=None):
        path = tree.path_to(len(tree) - 1) if len(tree) else []
        return path, int(torch.multinomial(target_probs(logits[-1], cfg), 1, generator=generator))

    original = decoding.verify_tree
    decoding.verify_tree = always_accept
    try:
        p = sampling_p_value(small_target, lambda: SampledChainDrafter(12, depth=2), [3, 5, 7], 2, 600)
    finally:
        decoding.verify_tree = original
    assert p < ALPHA


def test_top_p_filtering():
    probs = target_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), SamplingConfig(1.0, 0.75))
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))


# ----- stopping rules ------------------------------------------------------------------------
def test_stops_at_end_of_turn_token(target):
    prompt = tiny_prompts(64, 1, seed=9)[0]
    plain = generate(target, Autoregressive(), prompt, 40, stop_tokens=set())
    stop_tok = plain.token_ids[5]
    first = plain.token_ids.index(stop_tok)
    for drafter in (Autoregressive(), NoisyOracleDrafter(noise=0.1)):
        out = generate(target, drafter, prompt, 40, stop_tokens={stop_tok})
        assert out.token_ids == plain.token_ids[: first + 1] and out.stop_reason == "eos"


def test_stops_at_max_new_tokens_exactly(target):
    for n in (1, 2, 7):
        out = generate(target, NoisyOracleDrafter(noise=0.0, depth=5), [4, 5, 6], n, stop_tokens=set())
        assert out.new_tokens == n and out.stop_reason == "max_new_tokens"


def test_stops_at_the_context_limit(target):
    prompt = tiny_prompts(64, 1, length=target.max_positions - 5)[0]
    out = generate(target, NoisyOracleDrafter(noise=0.0), prompt, 100, stop_tokens=set())
    assert out.stop_reason == "context"
    assert len(prompt) + out.new_tokens == target.max_positions + 1  # the last token is never fed back


def test_the_stream_says_why_it_stopped(target):
    """One stop rule: only the last event carries a reason, and generate() reports that one."""
    assert stop_rule([7, 1, 8], 0, 10, {1}, False) == ([7, 1], "eos")
    assert stop_rule([7, 8, 9], 8, 10, {1}, True) == ([7, 8], "max_new_tokens")
    assert stop_rule([7, 8], 0, 10, {1}, True) == ([7, 8], "context")
    assert stop_rule([7, 8], 0, 10, {1}, False) == ([7, 8], None)
    for n in (1, 6):
        events = list(generate_stream(target, NoisyOracleDrafter(noise=0.2), [4, 5, 6], n, stop_tokens=set()))
        assert [e.stop_reason for e in events[:-1]] == [None] * (len(events) - 1)
        assert events[-1].stop_reason == "max_new_tokens"


def test_plain_decoding_tau_is_one(target):
    out = generate(target, Autoregressive(), [4, 5, 6], 12, stop_tokens=set())
    assert out.steps == 12 and out.mean_accepted == 1.0


def test_recorded_events_serialise(target):
    import json

    out = generate(target, NoisyOracleDrafter(siblings=1), [4, 5, 6], 10, record=True, stop_tokens=set())
    trace = json.loads(json.dumps(out.trace()))
    ev = trace["events"][1]
    assert len(ev["node_target_prob"]) == len(ev["tree"]["tokens"])
    assert len(ev["row_top"]) == len(ev["tree"]["tokens"]) + 1 and len(ev["row_top"][0]) == 10
    assert sum(len(e["new_tokens"]) for e in trace["events"]) == out.new_tokens
    seen = []
    generate(target, Autoregressive(), [4, 5, 6], 3, hooks=[seen.append], stop_tokens=set())
    assert [e.step for e in seen] == [0, 1, 2]


# ----- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize("prompt, n, message", [
    ([], 10, "empty"),
    (list(range(2, 60)) * 5, 10, "context"),
    ([3, 4], -1, "between 1 and"),
    ([3, 4], 10**9, "between 1 and"),
    ([3, 4], 2.5, "integer"),
    ([3, 999], 5, "vocabulary"),
])
def test_bad_requests_raise_clear_errors(target, prompt, n, message):
    with pytest.raises(ValueError, match=message):
        generate(target, Autoregressive(), prompt, n)


@pytest.mark.parametrize("kwargs", [{"temperature": -1.0}, {"temperature": 100.0}, {"top_p": 0.0},
                                    {"top_p": 1.5}])
def test_bad_sampling_parameters(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


def test_bad_pld_parameters():
    with pytest.raises(ValueError):
        PromptLookupDrafter(max_ngram=0)
    with pytest.raises(ValueError):
        PromptLookupDrafter(num_draft_tokens=0)
