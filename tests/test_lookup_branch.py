"""The context-lookup branch (core.drafters.lookup_branch): tree merging and losslessness for every drafter."""

from __future__ import annotations

import functools

import pytest
import torch

from analysis.bench import checkpoint_label, parse_label
from core.decoding import generate
from core.drafters.lookup_branch import LookupBranch, merge_chain
from core.methods import build_drafter
from core.target import Target, tiny_target
from core.trees.draft_tree import DraftTree
from tests.helpers import ALPHA, assert_greedy_lossless, sampling_p_value

TRAINED = ("eagle2", "moa", "medusa", "amphista")
# Repetitive prompts, so that the lookup has something to offer.
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 4, 10, 3, 4, 10, 3, 4, 11, 3, 4]]


@functools.cache
def tiny(vocab: int = 64, dtype: torch.dtype = torch.float32) -> Target:
    return tiny_target(vocab_size=vocab, seed=0, dtype=dtype)


def _tree(tokens, parents):
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.full((len(tokens),), 0.5))


def test_merge_reuses_the_shared_prefix_and_hangs_the_rest():
    tree = _tree([7, 8, 9, 4], [-1, -1, 0, 2])  # root -> 7 -> 9 -> 4, root -> 8
    merged, added = merge_chain(tree, [7, 9, 5, 6])
    assert added == 2
    assert merged.tokens.tolist() == [7, 8, 9, 4, 5, 6] and merged.parents.tolist() == [-1, -1, 0, 2, 2, 4]
    assert merged.draft_probs.tolist()[-2:] == [1.0, 1.0] and merged.extras["lookup_nodes"] == [4, 5]
    assert merged.q is None
    same, added = merge_chain(tree, [7, 9])  # already in the tree: nothing to add
    assert added == 0 and same is tree
    fresh, added = merge_chain(DraftTree.empty(), [3, 4])
    assert fresh.tokens.tolist() == [3, 4] and fresh.parents.tolist() == [-1, 0]


def test_merge_keeps_draft_top_rows_aligned():
    tree = _tree([7], [-1])
    tree.extras["draft_top"] = [[[7, 0.5]], [[2, 0.1]]]  # root row + one node row
    merged, _ = merge_chain(tree, [8, 9])
    assert len(merged.extras["draft_top"]) == len(merged) + 1


@pytest.mark.parametrize("method", TRAINED)
def test_greedy_lossless_with_a_lookup_branch(method):
    target = tiny()
    drafter = build_drafter(f"{method}+lookup", target, "random")
    assert isinstance(drafter, LookupBranch) and drafter.name == f"{method}+lookup"
    assert_greedy_lossless(target, lambda: drafter, PROMPTS, max_new_tokens=24)


def test_the_branch_is_used_on_a_loop():
    """Plain decoding plus the branch is prompt lookup: on a target that repeats itself tau rises above 1."""
    target = tiny()
    prompt = PROMPTS[0]
    plain = generate(target, build_drafter("ar", target), prompt, 40)
    merged = generate(target, build_drafter("ar+lookup", target), prompt, 40, record=True)
    assert merged.token_ids == plain.token_ids
    assert merged.mean_accepted > 1.5 and plain.mean_accepted == 1.0
    assert any(ev.tree is not None and ev.tree.extras.get("lookup_nodes") for ev in merged.events)


@pytest.mark.parametrize("method", ("eagle2", "medusa"))
def test_sampling_stays_lossless_with_a_lookup_branch(method):
    target = tiny(16)
    drafter = build_drafter(f"{method}+lookup", target, "random")
    p = sampling_p_value(target, lambda: drafter, [3, 7, 3, 7, 3], n_tokens=2, samples=600)
    assert p > ALPHA


def test_labels_and_errors():
    assert parse_label("moa-tli3+lookup") == ("moa+lookup", {"tli": 3})
    assert checkpoint_label("moa-tli3+lookup") == "moa-tli3"
    with pytest.raises(ValueError, match="unknown method"):
        build_drafter("nonsense+lookup", tiny())
