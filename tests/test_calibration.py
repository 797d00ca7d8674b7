"""`auto` trees calibrated from decoded cycles (core.trees.calibration: CycleLedger, calibrate_dynamic_tree,
StaticTreeMixin.observe): measured against predicted tau, drafting and verify time move the tree."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.drafters.static_tree import best_tree, static_tree_choice
from core.trees.calibration import (
    CALIBRATE_AFTER,
    RATIO_RANGE,
    CycleLedger,
    calibrate_dynamic_tree,
    calibration_enabled,
    grid_row,
    keep_or_move,
)
from core.trees.choice import choose_tree

FLAT = {"sizes": [1, 8, 32, 64], "ms": [10.0, 10.0, 10.0, 10.0]}
STEEP = {"sizes": [1, 8, 32, 64], "ms": [10.0, 14.0, 30.0, 60.0]}
ACC = {"p": [0.7, 0.4, 0.2, 0.1], "ref_depth": 4, "ref_total": 16.0, "draft_ms": None, "verify_ms_1": None,
       "source": "hand"}


def _row(**kw):
    return {"tau_model": 2.0, "draft_model": 4.0, "pass_model": 10.0, **kw}


def test_ledger_waits_for_enough_cycles_then_shrinks_its_ratios_towards_one():
    ledger = CycleLedger()
    for _ in range(CALIBRATE_AFTER - 1):
        ledger.add(_row(), accepted=0, draft_ms=8.0, verify_ms=10.0)
    assert ledger.ratios() is None and not ledger.due()
    ledger.add(_row(), accepted=0, draft_ms=8.0, verify_ms=10.0)
    got = ledger.ratios()
    assert ledger.due()
    # 16 measured cycles against a prior of 16 model cycles: halfway between the measured ratio and 1
    assert got["draft"] == pytest.approx((2.0 + 1.0) / 2) and got["verify_ms"] == pytest.approx(0.0)
    assert got["tau"] == pytest.approx((0.0 + 1.0) / 2) and got["cycles"] == 16
    offset = CycleLedger()
    for _ in range(CALIBRATE_AFTER):  # each verify step 20 ms above the curve: an offset, shrunk halfway
        offset.add(_row(), accepted=1, draft_ms=4.0, verify_ms=30.0)
    assert offset.ratios()["verify_ms"] == pytest.approx(10.0) and offset.ratios()["tau"] == pytest.approx(1.0)
    for _ in range(1000):  # far more data: the measured ratio, clipped to the allowed range
        ledger.add(_row(), accepted=0, draft_ms=400.0, verify_ms=10.0)
    assert ledger.ratios()["draft"] == RATIO_RANGE[1]


def test_a_calibration_of_ones_changes_nothing_and_dear_drafting_makes_trees_shallower():
    plain = choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5)
    ones = choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5,
                          calibration={"tau": 1.0, "draft": 1.0, "verify_ms": 0.0})
    assert (ones["depth"], ones["total_tokens"]) == (plain["depth"], plain["total_tokens"])
    assert ones["expected_tokens_per_s"] == pytest.approx(plain["expected_tokens_per_s"], abs=1e-3)
    row = grid_row(plain, plain["depth"], plain["total_tokens"])
    assert row["tau"] == row["tau_model"] and row["ms"] == pytest.approx(row["pass_model"] + row["draft_model"])
    dear = choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5,
                          calibration={"tau": 1.0, "draft": 40.0, "verify_ms": 0.0})
    assert dear["depth"] < plain["depth"] and dear["calibration"]["draft"] == 40.0
    worse = choose_tree("x", curve=STEEP, acceptance=ACC,
                           draft_ms_per_level=0.5, calibration={"tau": 0.3, "draft": 1.0, "verify_ms": 0.0})
    assert worse["total_tokens"] <= plain["total_tokens"] and worse["expected_tau"] < plain["expected_tau"]


def test_keep_or_move_needs_a_clear_gain():
    current = choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5)
    same = keep_or_move(current, choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5,
                                                   calibration={"tau": 1.0, "draft": 1.01, "verify_ms": 0.0}))
    assert (same["depth"], same["total_tokens"]) == (current["depth"], current["total_tokens"])
    moved = keep_or_move(current, choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5,
                                                    calibration={"tau": 1.0, "draft": 40.0, "verify_ms": 0.0}))
    assert moved["depth"] < current["depth"]


def _cycle(nodes: int, accepted: int, draft_ms: float, verify_ms: float):
    return SimpleNamespace(tree=[0] * nodes, accepted=list(range(accepted)), draft_time=draft_ms / 1000,
                           verify_time=verify_ms / 1000)


def test_a_dynamic_tree_drafter_moves_to_a_shallower_tree_when_drafting_costs_more_than_predicted():
    choice = choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5)
    drafter = SimpleNamespace(tree_auto=True, tree_choice=choice, tree_acceptance_used=ACC,
                              tree_ledger=CycleLedger(),
                              config=SimpleNamespace(depth=choice["depth"], total_tokens=choice["total_tokens"],
                                                     top_k=8))
    row = grid_row(choice, choice["depth"], choice["total_tokens"])
    for _ in range(CALIBRATE_AFTER - 1):  # tau as predicted, drafting 30x dearer
        calibrate_dynamic_tree(drafter, _cycle(choice["total_tokens"], round(row["tau_model"] - 1),
                                            30 * row["draft_model"], row["pass_model"]))
    assert drafter.config.depth == choice["depth"]  # not yet: too few cycles
    calibrate_dynamic_tree(drafter, _cycle(choice["total_tokens"], round(row["tau_model"] - 1),
                                        30 * row["draft_model"], row["pass_model"]))
    assert drafter.config.depth < choice["depth"]
    assert drafter.tree_choice["calibration"]["draft"] > 5 and drafter.tree_ledger.since_choice == 0
    assert (drafter.config.depth, drafter.config.total_tokens) == (drafter.tree_choice["depth"],
                                                                   drafter.tree_choice["total_tokens"])
    before = (drafter.config.depth, drafter.config.total_tokens)
    drafter.tree_auto = False  # a tree the user fixed is never moved
    for _ in range(3 * CALIBRATE_AFTER):
        calibrate_dynamic_tree(drafter, _cycle(drafter.config.total_tokens, 0, 1000.0, 1000.0))
    assert (drafter.config.depth, drafter.config.total_tokens) == before


def test_no_calibration_on_the_tiny_target_or_when_switched_off(monkeypatch):
    from core.target import tiny_target

    target = tiny_target()
    assert not calibration_enabled(target)
    real = SimpleNamespace(source="smollm2")
    monkeypatch.delenv("SPECLENS_COST_MODEL", raising=False)
    monkeypatch.setenv("SPECLENS_CALIBRATE", "1")
    assert calibration_enabled(real)
    monkeypatch.setenv("SPECLENS_CALIBRATE", "0")
    assert not calibration_enabled(real)
    monkeypatch.setenv("SPECLENS_CALIBRATE", "1")
    monkeypatch.setenv("SPECLENS_COST_MODEL", "fixed")
    assert not calibration_enabled(real)


def test_a_static_tree_is_resized_from_measured_cycles():
    """Medusa on the tiny target, its ledger switched on by hand (the tiny target never times anything)."""
    from core.decoding import generate
    from core.drafters.medusa import MedusaDrafter
    from core.target import tiny_target

    target = tiny_target()
    drafter = MedusaDrafter.random(target, seed=0, num_heads=3)
    acc = [[0.6, 0.2, 0.1, 0.05], [0.4, 0.2, 0.1, 0.05], [0.3, 0.1, 0.05, 0.02]]
    choice = static_tree_choice("medusa", STEEP, acc, draft_ms=0.5)
    drafter.tree_auto, drafter.tree_choice, drafter.tree_ledger = True, choice, CycleLedger()
    drafter.config.tree_accuracy = acc
    drafter._set_paths(best_tree(acc, choice["total_tokens"], 3))
    n0 = len(drafter.tree_paths)
    row = grid_row(choice, None, n0)
    for _ in range(10 * CALIBRATE_AFTER):  # nothing accepted: the guesses are worth far less than predicted
        row = grid_row(drafter.tree_choice, None, len(drafter.tree_paths))
        drafter.observe(_cycle(len(drafter.tree_paths), 0, row["draft_model"], row["pass_model"]))
    cal = drafter.tree_choice["calibration"]
    assert cal["verify_ms"] == pytest.approx(0.0) and cal["tau"] < 1
    assert len(drafter.tree_paths) == drafter.tree_choice["total_tokens"] < n0
    out = generate(target, drafter, [1, 2, 3], 8)  # the resized tree still decodes
    assert len(out.token_ids) == 8


def test_the_app_figure_shows_the_calibrated_choice_and_the_first_guess():
    from demo.render import tree_choice_figure

    first = choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5)
    now = choose_tree("x", curve=FLAT, acceptance=ACC, draft_ms_per_level=0.5,
                         calibration={"tau": 0.8, "draft": 40.0, "verify_ms": 3.0, "cycles": 48})
    fig = tree_choice_figure(now, None, first)
    names = [t.name for t in fig.data]
    assert "auto here, calibrated" in names and "auto's first guess (the model alone)" in names
    assert "calibrated from 48 decoded cycles" in fig.layout.title.text
    marks = {t.name: (t.x[0], t.y[0]) for t in fig.data if t.name}
    assert marks["auto here, calibrated"] == (now["total_tokens"], now["depth"])
    assert marks["auto's first guess (the model alone)"] == (first["total_tokens"], first["depth"])
    plain = tree_choice_figure(first, None, None)
    assert "auto here" in [t.name for t in plain.data] and "calibrated" not in plain.layout.title.text
