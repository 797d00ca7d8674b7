"""EAGLE-2's dynamic draft tree: a hand-made case, random properties against brute force, ties."""

from __future__ import annotations

import math

import pytest
import torch

from core.drafters.dynamic_tree import Expansion, build_dynamic_tree


class FakeDrafter:
    """An `expand` callback driven by a function of the token path; records what it was asked."""

    def __init__(self, logprobs_of_path):
        self.logprobs_of_path = logprobs_of_path
        self.slot_paths: list[tuple[int, ...]] = []
        self.batches: list[Expansion] = []

    def __call__(self, batch: Expansion) -> torch.Tensor:
        assert batch.first_slot == len(self.slot_paths)
        self.batches.append(batch)
        out = []
        for tok, ps in zip(batch.tokens.tolist(), batch.parent_slots.tolist()):
            path = (self.slot_paths[ps] if ps >= 0 else ()) + (tok,)
            self.slot_paths.append(path)
            out.append(self.logprobs_of_path(path))
        return torch.stack(out)


def tree_paths(tree) -> list[tuple[int, ...]]:
    return [tuple(int(tree.tokens[j]) for j in tree.path_to(i)) for i in range(len(tree))]


def log(p):
    return torch.tensor(p, dtype=torch.float64).log().float()


def test_hand_made_case():
    dists = {
        (): [0.5, 0.3, 0.15, 0.05],
        (0,): [0.1, 0.62, 0.18, 0.1],
        (1,): [0.9, 0.05, 0.03, 0.02],
        (0, 1): [0.2, 0.3, 0.4, 0.1],
        (1, 0): [0.7, 0.2, 0.06, 0.04],
    }
    # candidates (cumulative prob): A=0 .5, A1 .31, B=1 .3, B0 .27, B00 .189, A12 .124, A2 .09, A11 .093, B01 .054
    fake = FakeDrafter(lambda path: log(dists[path]))
    tree = build_dynamic_tree(log(dists[()]), fake, depth=3, top_k=2, total_tokens=4)
    assert tree.tokens.tolist() == [0, 1, 1, 0]
    assert tree.parents.tolist() == [-1, -1, 0, 1]
    assert torch.allclose(tree.draft_probs, torch.tensor([0.5, 0.3, 0.62, 0.9]))
    assert tree.q is None
    # the expansions: level 2 expands A, B; level 3 expands the best two of level 2 (A1, B0)
    assert fake.slot_paths == [(0,), (1,), (0, 1), (1, 0)]
    assert fake.batches[0].mask.tolist() == [[True, False], [False, True]]
    assert fake.batches[1].mask.tolist() == [[True, False, True, False], [False, True, False, True]]
    assert fake.batches[1].parent_slots.tolist() == [0, 1]
    assert fake.batches[1].depths.tolist() == [2, 2]

    fake = FakeDrafter(lambda path: log(dists[path]))
    tree = build_dynamic_tree(log(dists[()]), fake, depth=3, top_k=2, total_tokens=6)
    assert tree.tokens.tolist() == [0, 1, 1, 0, 2, 0]
    assert tree.parents.tolist() == [-1, -1, 0, 1, 2, 3]
    assert torch.allclose(tree.draft_probs, torch.tensor([0.5, 0.3, 0.62, 0.9, 0.4, 0.7]))


@pytest.mark.parametrize("depth,top_k,total", [(6, 8, 32), (4, 3, 10), (5, 4, 200), (1, 5, 3), (3, 2, 1)])
def test_random_properties_against_brute_force(depth, top_k, total):
    vocab = 20

    def dist(path):
        g = torch.Generator().manual_seed(hash(path) % (2**31))
        return torch.log_softmax(torch.randn(vocab, generator=g) * 2.5, dim=-1)

    fake = FakeDrafter(dist)
    tree = build_dynamic_tree(dist(()), fake, depth=depth, top_k=top_k, total_tokens=total, prune=False)

    # every candidate the algorithm could have produced: the root's top_k plus each expanded node's top_k
    cands = {}
    for parent in [()] + fake.slot_paths:
        lp, tok = dist(parent).topk(top_k)
        base = sum(float(dist(parent[:i])[parent[i]]) for i in range(len(parent)))
        for v, t in zip(lp.tolist(), tok.tolist()):
            cands[parent + (t,)] = base + v
    n_expected = min(total, top_k + (depth - 1) * top_k * top_k)
    assert len(cands) == top_k + (depth - 1) * top_k * top_k
    assert len(tree) == n_expected
    best = sorted(cands, key=lambda p: -cands[p])[:n_expected]
    assert sorted(tree_paths(tree)) == sorted(best)

    # a tree, parents first, probabilities = drafter's prob at the parent, scores monotone
    depths = tree.depths()
    score = torch.zeros(len(tree), dtype=torch.float64)
    for i, path in enumerate(tree_paths(tree)):
        p = int(tree.parents[i])
        assert p < i
        assert depths[i] == len(path)
        assert math.isclose(float(tree.draft_probs[i]), math.exp(float(dist(path[:-1])[path[-1]])), rel_tol=1e-5)
        score[i] = math.log(float(tree.draft_probs[i])) + (score[p] if p >= 0 else 0.0)
        if p >= 0:
            assert score[i] <= score[p]

    # each level expands the best top_k candidates of the previous level; masks = ancestors + self
    for batch in fake.batches:
        level = int(batch.depths[0])
        level_cands = sorted((p for p in cands if len(p) == level), key=lambda p: -cands[p])[:top_k]
        paths = fake.slot_paths[batch.first_slot: batch.first_slot + len(batch.tokens)]
        assert sorted(paths) == sorted(level_cands)
        for row, path in zip(batch.mask.tolist(), paths):
            seen = [fake.slot_paths[s] for s, ok in enumerate(row) if ok]
            assert sorted(seen) == sorted(path[:i] for i in range(1, len(path) + 1))
    assert len(fake.batches) == depth - 1


@pytest.mark.parametrize("depth,top_k,total", [(2, 8, 6), (2, 8, 4), (2, 8, 1), (3, 4, 5), (3, 8, 3), (5, 8, 24),
                                               (4, 3, 10), (6, 8, 32)])
def test_pruned_last_level_gives_the_same_tree(depth, top_k, total):
    for seed in range(20):
        def dist(path, seed=seed):
            g = torch.Generator().manual_seed(hash((seed,) + path) % (2**31))
            return torch.log_softmax(torch.randn(12, generator=g) * (0.5 + seed % 4), dim=-1)

        full, pruned = FakeDrafter(dist), FakeDrafter(dist)
        a = build_dynamic_tree(dist(()), full, depth=depth, top_k=top_k, total_tokens=total, prune=False)
        b = build_dynamic_tree(dist(()), pruned, depth=depth, top_k=top_k, total_tokens=total)
        assert tree_paths(a) == tree_paths(b)
        assert torch.equal(a.parents, b.parents) and torch.equal(a.draft_probs, b.draft_probs)
        # only the last level is cut, to the nodes that can have a kept child
        before_last = sum(len(x.tokens) for x in full.batches[:-1])
        assert pruned.slot_paths[:before_last] == full.slot_paths[:before_last]
        last = max(0, total - (depth - 1))
        expected_rows = min(top_k, last)
        got_rows = len(pruned.batches[-1].tokens) if len(pruned.batches) == depth - 1 else 0
        assert got_rows == expected_rows


def test_ties_parents_win():
    # every node is certain of one token (log-prob 0): children tie with their parents
    certain = torch.tensor([0.0, -50.0, -50.0, -50.0])
    fake = FakeDrafter(lambda path: certain)
    tree = build_dynamic_tree(certain, fake, depth=4, top_k=2, total_tokens=3)
    assert tree.tokens.tolist() == [0, 0, 0]
    assert tree.parents.tolist() == [-1, 0, 1]
    # uniform everywhere: siblings tie; the result is still a tree of the requested size
    uniform = torch.full((4,), math.log(0.25))
    fake = FakeDrafter(lambda path: uniform)
    tree = build_dynamic_tree(uniform, fake, depth=3, top_k=3, total_tokens=7)
    assert len(tree) == 7
    assert all(int(p) < i for i, p in enumerate(tree.parents))


def test_bad_settings():
    with pytest.raises(ValueError, match="top_k"):
        build_dynamic_tree(torch.zeros(4), lambda b: torch.zeros(len(b.tokens), 4), top_k=0)


def test_reduced_vocabulary_and_draft_top():
    """Log-prob index i means token token_ids[i]; draft_top rows follow [root, nodes...] order."""
    vocab = 20
    token_ids = torch.arange(vocab) * 3 + 1

    def dist(path):  # path of indices
        g = torch.Generator().manual_seed(hash(path) % (2**31))
        return torch.log_softmax(torch.randn(vocab, generator=g) * 2.5, dim=-1)

    plain = build_dynamic_tree(dist(()), FakeDrafter(dist), depth=4, top_k=3, total_tokens=10)
    as_index = lambda path: dist(tuple((t - 1) // 3 for t in path))  # noqa: E731  (the drafter sees token ids)
    fake = FakeDrafter(as_index)
    tree = build_dynamic_tree(dist(()), fake, depth=4, top_k=3, total_tokens=10, token_ids=token_ids,
                              record_top=True)
    assert torch.equal(tree.tokens, token_ids[plain.tokens]) and torch.equal(tree.parents, plain.parents)
    assert torch.equal(tree.draft_probs, plain.draft_probs) and "draft_top" not in plain.extras
    assert all(int(t) % 3 == 1 for b in fake.batches for t in b.tokens)
    rows = tree.extras["draft_top"]
    assert len(rows) == len(tree) + 1
    expanded = set(fake.slot_paths)
    for row, path in zip(rows, [()] + tree_paths(tree)):
        if path and path not in expanded:
            assert row == []
            continue
        lp, idx = as_index(path).topk(10)
        assert [t for t, _ in row] == token_ids[idx].tolist()
        assert torch.allclose(torch.tensor([p for _, p in row]), lp.exp())
    assert any(r == [] for r in rows) and sum(r != [] for r in rows) == 1 + len(expanded & set(tree_paths(tree)))
