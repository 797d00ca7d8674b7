"""Static draft trees: the optimal-tree builder, the path -> DraftTree conversion, tree-pass numerics."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from core.drafters.static_tree import (
    CPU_PASS_MS,
    DEFAULT_TREE_DEPTH,
    DEFAULT_TREE_SIZE,
    accuracies_from_metrics,
    best_size,
    best_tree,
    build_draft_tree,
    check_paths,
    default_tree,
    path_value,
    prior_accuracy,
    rank_accuracies,
)
from core.target import tiny_target
from tests.helpers import brute_force_tree_logits


def is_tree(paths) -> bool:
    s = set(paths)
    return all(len(p) == 1 or p[:-1] in s for p in paths) and len(s) == len(paths)


def brute_force_best(acc, size, max_depth) -> float:
    """Largest expected accepted length over every prefix-closed set of `size` paths."""
    nodes = [p for d in range(1, max_depth + 1) for p in itertools.product(*(range(len(acc[i])) for i in range(d)))]
    best = 0.0
    for subset in itertools.combinations(nodes, size):
        if is_tree(list(subset)):
            best = max(best, sum(path_value(p, acc) for p in subset))
    return best


def test_best_tree_hand_made_optimum():
    acc = [[0.6, 0.2], [0.5, 0.3]]
    # values: (0,)=.6 (1,)=.2 (0,0)=.3 (0,1)=.18 (1,0)=.1 (1,1)=.06
    assert best_tree(acc, 3, 2) == [(0,), (1,), (0, 0)]
    assert best_tree(acc, 4, 2) == [(0,), (1,), (0, 0), (0, 1)]
    assert best_tree(acc, 3, 1) == [(0,), (1,)]  # depth 1 has only two nodes
    # a sharp head 0 and a chain-friendly head 1: the optimum is a chain, not a fan
    assert best_tree([[0.9, 0.05, 0.05], [0.9, 0.05, 0.05], [0.9, 0.1]], 3, 3) == [(0,), (0, 0), (0, 0, 0)]


@pytest.mark.parametrize("seed", range(4))
def test_best_tree_matches_exhaustive_search(seed):
    rng = random.Random(seed)
    acc = [sorted((rng.random() for _ in range(2)), reverse=True) for _ in range(3)]
    for size in (1, 3, 5):
        paths = best_tree(acc, size, 3)
        assert len(paths) == size and is_tree(paths)
        assert sum(path_value(p, acc) for p in paths) == pytest.approx(brute_force_best(acc, size, 3))


def test_best_tree_is_a_tree_of_the_requested_size_and_depth():
    acc = [[0.5, 0.2, 0.1, 0.05] for _ in range(5)]
    for size, depth in [(1, 1), (10, 2), (28, 4), (60, 5)]:
        paths = best_tree(acc, size, depth)
        assert len(paths) == size
        assert is_tree(paths)
        assert max(len(p) for p in paths) <= depth
        assert paths == sorted(paths, key=lambda p: (len(p), p))  # parents first
    assert len(best_tree(acc, 100, 1)) == 4  # only four candidates exist at depth 1
    with pytest.raises(ValueError):
        best_tree([[1.5]], 1, 1)


def test_rank_accuracies_and_metrics():
    assert rank_accuracies([[0.5, 0.7, 0.75]])[0] == pytest.approx([0.5, 0.2, 0.05])
    metrics = {"top1@1": 0.6, "top2@1": 0.8, "top1@2": 0.3, "top2@2": 0.4, "acc@1": 0.6}
    acc = accuracies_from_metrics(metrics, 2, max_k=2)
    assert acc[0] == pytest.approx([0.6, 0.2]) and acc[1] == pytest.approx([0.3, 0.1])
    with pytest.raises(KeyError):
        accuracies_from_metrics(metrics, 3)


def test_default_tree_fits_heads_and_vocab():
    t = default_tree(4, 49152)
    assert len(t) == DEFAULT_TREE_SIZE and max(len(p) for p in t) == 4 and is_tree(t)
    # the default size is the one best_size picks for the prior with this CPU's pass-cost table
    assert best_size(prior_accuracy(4), DEFAULT_TREE_DEPTH, pass_ms=CPU_PASS_MS) == DEFAULT_TREE_SIZE
    small = default_tree(2, 5)
    assert is_tree(small) and max(len(p) for p in small) <= 2 and max(max(p) for p in small) < 5
    assert best_size([[0.6, 0.1], [0.5, 0.1]], 2, pass_ms={1: 10.0, 64: 10.0}) == 6  # free passes: take all
    assert best_size([[0.6, 0.1], [0.5, 0.1]], 2, pass_ms={1: 10.0, 2: 100.0}) == 0  # costly: take none


def test_check_paths_rejects_non_trees():
    assert check_paths([[0, 1], [0]], 2, 10) == [(0,), (0, 1)]
    for bad in ([[0, 1]], [[0], [0]], [[0], [0, 0], [0, 0, 0]], [[12]], [[]]):
        with pytest.raises(ValueError):
            check_paths(bad, 2, 10)


def test_build_draft_tree():
    paths = [(0,), (1,), (0, 0), (0, 2), (1, 0)]
    tokens = torch.tensor([[10, 11, 12], [20, 21, 22]])
    probs = torch.tensor([[0.5, 0.3, 0.1], [0.6, 0.2, 0.1]])
    tree = build_draft_tree(paths, tokens, probs)
    assert tree.tokens.tolist() == [10, 11, 20, 22, 20]
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1]
    assert tree.draft_probs.tolist() == pytest.approx([0.5, 0.3, 0.6, 0.1, 0.6])
    assert tree.q is None
    assert tree.depths().tolist() == [1, 1, 2, 2, 2]


def test_static_tree_pass_matches_brute_force_chains():
    """The decode loop's tree mask and positions give the same logits as running each path as a chain."""
    target = tiny_target(vocab_size=64)
    paths = default_tree(4, 64)
    g = torch.Generator().manual_seed(0)
    cand = torch.stack([torch.randperm(64, generator=g)[:10] for _ in range(4)])
    tree = build_draft_tree(paths, cand, torch.full((4, 10), 0.1))
    prefix, root = [3, 9, 27, 17, 51], 40
    cache = target.new_cache()
    target.forward(torch.tensor(prefix), cache=cache)
    past = cache.length
    ids = torch.cat([torch.tensor([root]), tree.tokens])
    positions = past + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths()])
    got = target.forward(ids, positions, cache, tree_mask=tree.attention_mask()).logits[0]
    want = brute_force_tree_logits(target, prefix, root, tree.tokens.tolist(), tree.parents.tolist())
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
