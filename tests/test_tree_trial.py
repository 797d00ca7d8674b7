"""`auto` trees decided by measured tokens/s (core.trees.trial): candidates, turns, the decision, the record."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from core.trees.calibration import CycleLedger, calibrate_dynamic_tree
from core.trees.trial import TRIAL_MARGIN, ShapeTrial, candidates


def grid_choice() -> dict:
    rows = [{"depth": d, "total_tokens": n, "tokens_per_s": tps}
            for d, n, tps in ((1, 3, 40.0), (1, 4, 44.0), (2, 5, 46.0), (2, 6, 45.0), (3, 8, 47.0))]
    return {"method": "eagle2", "depth": 3, "total_tokens": 8, "grid": rows}


def test_candidates_are_the_pick_the_best_one_and_two_level_shapes_and_a_wider_or_narrower_pick():
    assert candidates(grid_choice()) == [(3, 8), (1, 4), (2, 5)]
    assert candidates({**grid_choice(), "depth": 2, "total_tokens": 5}) == [(2, 5), (1, 4)]  # 2/6: one node off
    # two shapes only: a third at the pick's depth, at least NODE_STEP nodes away (the best predicted such)
    wider = {**grid_choice(), "grid": grid_choice()["grid"] + [{"depth": 2, "total_tokens": 7, "tokens_per_s": 44.5},
                                                               {"depth": 2, "total_tokens": 3, "tokens_per_s": 44.0}]}
    assert candidates({**wider, "depth": 2, "total_tokens": 5}) == [(2, 5), (1, 4), (2, 7)]
    assert candidates(wider) == [(3, 8), (1, 4), (2, 5)]  # already three
    assert candidates({"depth": None, "grid": []}) == []


def test_shapes_take_turns_and_the_fastest_measured_wins():
    trial = ShapeTrial([(3, 8), (1, 4), (2, 5)], per_shape=4)
    speed = {(3, 8): 2.0, (1, 4): 1.5, (2, 5): 1.0}  # seconds a cycle: the one-level tree is quickest
    seen = []
    while not trial.done:
        shape = trial.next_shape()
        seen.append(shape)
        trial.book(shape, appended=2, seconds=speed[shape] / 2)
    assert seen[:3] == [(3, 8), (1, 4), (2, 5)] and len(seen) == 12  # round robin, 4 cycles each
    assert trial.winner == (2, 5) and trial.next_shape() == (2, 5)
    rec = trial.record()
    assert rec["winner"] == {"depth": 2, "total_tokens": 5}
    assert rec["gain_over_next"] == pytest.approx(0.5) and rec["gain_over_model_pick"] == pytest.approx(1.0)
    trial.book((2, 5), 100, 0.001)  # after the decision nothing moves
    assert trial.cycles[(2, 5)] == 4


def test_the_model_pick_stays_unless_beaten_by_the_margin():
    trial = ShapeTrial([(2, 6), (1, 4)], per_shape=3)
    for _ in range(3):
        trial.book((2, 6), 10, 1.0)
        trial.book((1, 4), 10, 1.0 / (1 + TRIAL_MARGIN / 2))  # faster, but inside the margin
    assert trial.winner == (2, 6)
    assert ShapeTrial([(1, 4)]).winner == (1, 4)  # one candidate: nothing to try


def test_calibrate_dynamic_tree_runs_the_trial_on_decoded_cycles():
    """The drafter's shape follows the trial cycle by cycle; its tree_choice carries the record and the winner."""
    choice = grid_choice()
    cfg = SimpleNamespace(depth=3, total_tokens=8, top_k=8)
    trial = ShapeTrial(candidates(choice), per_shape=2)
    drafter = SimpleNamespace(config=cfg, tree_choice=choice, tree_ledger=CycleLedger(), tree_auto=True,
                              tree_trial=trial)
    cost = {(3, 8): 0.03, (1, 4): 0.01, (2, 5): 0.02}
    for _ in range(6):
        shape = (cfg.depth, cfg.total_tokens)
        event = SimpleNamespace(tree=[0, 1], new_tokens=[5, 6], draft_time=cost[shape] / 2, verify_time=cost[shape] / 2)
        calibrate_dynamic_tree(drafter, event)
    assert trial.done and trial.winner == (1, 4)
    assert (cfg.depth, cfg.total_tokens) == (1, 4) and (choice["depth"], choice["total_tokens"]) == (1, 4)
    assert choice["trial"]["winner"] == {"depth": 1, "total_tokens": 4}
    prefill = SimpleNamespace(tree=[], new_tokens=[1], draft_time=0.0, verify_time=1.0)
    calibrate_dynamic_tree(drafter, prefill)  # a step without a tree books nothing
    assert sum(trial.cycles.values()) == 6
