"""Measured tree acceptance (analysis.tree_acceptance) and `auto` trees that go by it (core.trees.choice)."""

from __future__ import annotations

import json

import pytest
import torch

from analysis import tree_acceptance as ta
from core.target import tiny_target
from core.trees.acceptance import TREE_TABLE, card_acceptance, shipped_signature, tree_table, width_exponent
from core.trees.choice import choose_tree
from core.trees.cost_curve import monotone, pass_ms
from core.trees.draft_tree import DraftTree

STEEP = {"sizes": [1, 8, 32, 64], "ms": [10.0, 14.0, 30.0, 60.0]}
FLAT = {"sizes": [1, 8, 32, 64], "ms": [10.0, 10.0, 10.0, 10.0]}


def hand_tree() -> DraftTree:
    # root -> 5 (0.7), 7 (0.2); 5 -> 9 (0.6), 4 (0.3); 7 -> 2 (0.9); 9 -> 3 (0.4)
    # path scores: 5 .7, 9 .42, 4 .21, 7 .2, 2 .18, 3 .168
    return DraftTree(tokens=torch.tensor([5, 7, 9, 4, 2, 3]), parents=torch.tensor([-1, -1, 0, 0, 1, 2]),
                     draft_probs=torch.tensor([0.7, 0.2, 0.6, 0.3, 0.9, 0.4]), q=None)


def test_a_small_tree_is_a_prefix_of_the_deep_one():
    chain = ta.ranked_chain(hand_tree(), [5, 9, 3, 8])
    assert [level for level, _ in chain] == [1, 2, 3]
    # (depth, total_tokens) -> draft tokens accepted
    expected = {(1, 1): 1, (1, 8): 1, (2, 1): 1, (2, 2): 2, (3, 2): 2, (3, 5): 2, (3, 6): 3, (2, 64): 2}
    assert {k: ta.accepted(chain, *k) for k in expected} == expected
    assert ta.ranked_chain(hand_tree(), [7, 2]) and ta.accepted(ta.ranked_chain(hand_tree(), [7, 2]), 2, 4) == 1
    assert ta.accepted(ta.ranked_chain(hand_tree(), [7, 2]), 2, 5) == 2
    assert ta.ranked_chain(hand_tree(), [6]) == [] and ta.ranked_chain(DraftTree.empty(), [5]) == []


def test_the_walk_jumps_past_each_accepted_chain_and_its_bonus():
    three = ta.ranked_chain(hand_tree(), [5, 9, 3])
    chains = [three, [], [], [], []]
    assert ta.walk_tau(chains, 3, 6) == (5, 2)  # 3 drafts + bonus, then one plain step
    assert ta.walk_tau(chains, 1, 1) == (5, 4)  # 1 + bonus, then positions 2, 3, 4 one by one


def test_probe_on_the_tiny_target_agrees_with_real_fixed_trees():
    import copy

    from core.decoding import generate
    from core.drafters.eagle2 import Eagle2Drafter
    from tests.helpers import tiny_prompts
    from tests.test_eagle2 import VOCAB, quick_train, self_distill_batch

    target = tiny_target(vocab_size=VOCAB, n_layers=2)
    prompts = tiny_prompts(VOCAB, n=3, length=8, seed=1)
    drafter = Eagle2Drafter.random(target, seed=0)
    quick_train(drafter, self_distill_batch(target, drafter.train_needs, prompts))  # so that drafts get accepted
    row = ta.probe_method(target, "eagle2", prompts, 24, progress=False, drafter=copy.deepcopy(drafter))
    grid = {(d, n): tau for d, n, tau in row["grid"]}
    assert len(grid) == sum(min(ta.MAX_TOKENS, d * ta.PROBE_TOP_K) - d + 1 for d in range(1, ta.PROBE_DEPTH + 1))
    assert all(tau >= 1.0 for tau in grid.values()) and row["positions"] > 0
    assert row["checkpoint"] is None  # a drafter that was never saved has no training run
    assert grid[(3, 12)] > grid[(1, 1)] > 1.0
    # every real cycle of a fixed tree accepts what the probe's chain at that position says
    probe = ta.TreeProbe(copy.deepcopy(drafter))
    accepted_total = 0
    for depth, total in ((1, 3), (2, 6), (4, 10)):
        real = copy.deepcopy(drafter)
        real.set_options(depth=depth, total_tokens=total)
        for ids in prompts:
            out = generate(target, probe, ids, 24, stop_tokens=set()).token_ids
            chains = [ta.ranked_chain(tree, out[c + 1:]) for c, tree in enumerate(probe.trees)]
            run = generate(target, real, ids, 24, stop_tokens=set())
            assert run.token_ids == out  # both greedy, float32
            pos = 0
            for e in run.events[1:]:
                if len(e.new_tokens) == len(e.accepted) + 1:  # not cut short by the token budget
                    assert len(e.accepted) == ta.accepted(chains[pos], depth, total)
                    accepted_total += len(e.accepted)
                pos += len(e.new_tokens)
    assert accepted_total > 20  # the comparison covered multi-token acceptance


def write_table(path, grid, fingerprint="fp", checkpoint="sig") -> None:
    path.write_text(json.dumps({"target": fingerprint, "methods": {"m": {
        "checkpoint": checkpoint, "top_k": 8, "accept_ms": 2.0, "level_ms": 1.0, "verify_ms_1": 10.0,
        "grid": grid}}}))


def test_auto_trees_go_by_the_measured_table(tmp_path):
    path = tmp_path / "t.json"
    grid = [[d, n, 1.0 + 0.3 * d + 0.01 * n] for d in range(1, 9) for n in range(d, min(64, 8 * d) + 1)]
    write_table(path, grid)
    assert tree_table("m", "other", "sig", path) is None  # another target
    assert tree_table("m", "fp", "retrained", path) is None  # another checkpoint
    assert tree_table("x", "fp", "sig", path) is None
    table = tree_table("m", "fp", "sig", path)
    assert table["grid"][(2, 5)] == pytest.approx(1.65) and table["top_k"] == 8
    cpu = choose_tree("m", curve=STEEP, acceptance=table)
    gpu = choose_tree("m", curve=FLAT, acceptance=table)
    for choice in (cpu, gpu):
        best = max(choice["grid"], key=lambda r: r["tokens_per_s"])
        assert (choice["depth"], choice["total_tokens"]) == (best["depth"], best["total_tokens"])
        assert choice["expected_tau"] == pytest.approx(table["grid"][(best["depth"], best["total_tokens"])])
        assert choice["acceptance_source"].endswith("(tau measured for every tree shape)")
    assert gpu["total_tokens"] >= cpu["total_tokens"]
    # drafting = update + (depth - 1) x level, both as measured (this curve's 1-token pass = the probe's)
    row = next(r for r in cpu["grid"] if (r["depth"], r["total_tokens"]) == (3, 10))
    assert row["ms"] == pytest.approx(pass_ms(monotone(STEEP), 11.0) + 2.0 + 2 * 1.0, abs=1e-3)


def test_the_width_exponent_is_fitted_to_the_one_level_rows(tmp_path):
    """n candidates at one level worth n ** 0.5 top-1 chances: the fit finds 0.5; no table, the old model (1.0)."""
    c, path = 0.4, tmp_path / "t.json"
    write_table(path, [[1, n, 2.0 - (1.0 - c) ** (n ** 0.5)] for n in (1, 2, 4, 8)] + [[2, 4, 1.9]])
    assert width_exponent(path) == pytest.approx(0.5, abs=1e-6)
    assert width_exponent(tmp_path / "none.json") == 1.0


def test_a_card_top1_chain_no_longer_looks_near_certain_at_one_wide_level():
    """A retrained drafter has only its card's acc@k, a top-1 chain (w0 = 1). Counting each extra candidate as a
    fresh chance (alpha = 1), eight at 43% looked 99% sure, and auto trees grew deep and wide; the exponent fitted
    to the shipped table counts them as far fewer chances."""
    from core.trees.choice import expected_tau

    assert width_exponent() < 0.7  # the shipped table: lower-ranked candidates are worth much less than the top one
    naive, fitted = expected_tau([0.43], 1, 8, 1, 1.0, alpha=1.0), expected_tau([0.43], 1, 8, 1, 1.0)
    assert naive == pytest.approx(2.0 - 0.57 ** 8) and fitted < 1.8
    # the largest tree (8 deep, 64 nodes): the shipped drafters measure tau 3.0-3.6 there (tree_acceptance.json)
    card = card_acceptance({f"acc@{k}": 0.43 for k in range(1, 7)})
    assert expected_tau([0.43] * 6, 8, 64, card["ref_depth"], card["ref_total"], alpha=1.0) > 6.0
    assert choose_tree("m", curve=FLAT, acceptance=card, draft_ms_per_level=0.5)["expected_tau"] < 4.5


def test_the_width_model_check_compares_each_shipped_card_with_its_table(tmp_path):
    """analysis.width_model: the fitted exponent predicts the measured taus far better than alpha = 1 does."""
    from analysis import width_model

    result = width_model.compare(TREE_TABLE)
    assert "eagle2" in result["methods"]
    for figures in result["methods"].values():
        assert figures["fitted"]["mean_abs_error"] < figures["alpha=1"]["mean_abs_error"]
    width_model.main(["--out", str(tmp_path / "w.json")])
    assert json.loads((tmp_path / "w.json").read_text())["alpha"] == result["alpha"]


def test_the_shipped_table_matches_the_shipped_checkpoints():
    data = json.loads(TREE_TABLE.read_text())
    assert set(data["methods"]) == set(ta.DYNAMIC_METHODS)
    for method, row in data["methods"].items():
        assert row["checkpoint"] == shipped_signature(method), f"re-run analysis.tree_acceptance for {method}"
        assert all(1.0 <= tau <= 1.0 + d for d, n, tau in row["grid"])


def test_compare_trees_reads_shapes_and_refuses_bad_ones(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "compare_trees.py"
    spec = importlib.util.spec_from_file_location("compare_trees", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.parse_shapes(["eagle2=2/15,2/6", "moa=auto,1/8", "eagle2=3/9"]) == {
        "eagle2": [(2, 15), (2, 6), (3, 9)], "moa": ["auto", (1, 8)]}
    for bad in ("eagle2", "eagle2=2", "eagle2=3/2", "=1/8", "moa=0/4", "moa=a/b", "moa=Auto"):
        with pytest.raises(ValueError, match="METHOD=SHAPE"):
            mod.parse_shapes([bad])
    assert mod.main(["--shape", "medusa=2/6", "--out", "unused"]) == 2  # before any model loads
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'medusa' does not draft a dynamic tree" in err
    # auto against the fastest fixed shape of the same run, and the shape auto's trial kept
    from types import SimpleNamespace

    rates = {"moa@auto": 50.0, "moa@d1-4": 52.0, "moa@d2-6": 48.0, "eagle2@d1-4": 60.0}
    summary = {"methods": {k: {"overall": {"tokens_per_s": v}} for k, v in rates.items()}}
    trial = {"winner": {"depth": 1, "total_tokens": 4}}
    drafters = {"moa@auto": SimpleNamespace(tree_choice={"trial": trial})}
    got = mod.auto_against_fixed({"moa": ["auto", (1, 4), (2, 6)], "eagle2": [(1, 4)]}, summary, drafters)
    assert list(got) == ["moa"] and got["moa"]["fastest_fixed"] == "moa@d1-4"
    assert got["moa"]["auto_over_fastest"] == pytest.approx(50 / 52) and got["moa"]["trial"] == trial
