"""Calibration from decoded cycles (`CycleLedger`): an `auto` tree corrects its predicted choice by decoding.

Everything core.trees.choice predicts is a prediction: tau from held-out prompts, drafting scaled from another
machine's probe. A drafter with an `auto` tree therefore keeps a ledger of every cycle it decodes: the draft
tokens accepted, the drafting ms and the verify ms, beside what the model predicted for that cycle's tree.
Every CALIBRATE_AFTER cycles it chooses again, with tau's gain (tau - 1) and drafting scaled by their measured /
predicted ratios and the verify pass shifted by its measured - predicted offset, for every shape. It moves to
another shape only when that one promises CALIBRATE_MARGIN more tokens/s. The first GPU run showed why this is
needed: there, drafting cost ten times the scaled probe, and the trees chosen without it were far too deep
(docs/RESULTS.md, "On a GPU").

Two ways to decide, chosen by `trial_enabled`: the shape trial (core.trees.trial: candidate shapes take turns and
measured tokens/s decides) or, with SPECLENS_TREE_TRIAL=0, the calibrated model above. `calibrate_dynamic_tree`
books each cycle of a dynamic tree; core.drafters.static_tree does the same for static trees through
`CycleLedger`, `grid_row` and `keep_or_move`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from core.target import Target
from core.trees.choice import choose_tree
from core.trees.cost_curve import is_tiny

CALIBRATE_AFTER = 16  # decoded cycles between two choices
CALIBRATE_MARGIN = 0.03  # another shape must promise 3% more tokens/s: about the noise of one benchmark
RATIO_RANGE = (0.1, 20.0)  # beyond it the ledger is broken, not the model (a GPU measured drafting at 10x)
PRIOR_CYCLES = 16  # the model counts as this many cycles that met it exactly: one odd prompt moves a ratio halfway


@dataclass
class CycleLedger:
    """Decoded cycles of one drafter against the cost model's prediction for each cycle's tree: sums of draft
    tokens accepted, drafting ms and verify ms, measured and predicted."""

    cycles: int = 0
    since_choice: int = 0
    accepted: float = 0.0
    accepted_model: float = 0.0
    draft_ms: float = 0.0
    draft_model: float = 0.0
    verify_ms: float = 0.0
    verify_model: float = 0.0

    def add(self, row: dict, accepted: int, draft_ms: float, verify_ms: float) -> None:
        """One cycle decoded with the tree of grid row `row` (calibrated_row's keys)."""
        self.cycles += 1
        self.since_choice += 1
        self.accepted += accepted
        self.accepted_model += row["tau_model"] - 1.0
        self.draft_ms += draft_ms
        self.draft_model += row["draft_model"]
        self.verify_ms += verify_ms
        self.verify_model += row["pass_model"]

    def ratios(self) -> dict | None:
        """{"tau", "draft"}: measured / predicted, shrunk towards 1 by PRIOR_CYCLES and clipped to RATIO_RANGE;
        "verify_ms": measured - predicted verify ms per cycle, shrunk towards 0 the same way; "cycles".
        None before CALIBRATE_AFTER cycles.

        The verify pass gets an offset, not a ratio: what the curve leaves out (verification, cache
        bookkeeping, the decode loop; on a GPU the launches around the pass) costs about the same at any tree
        size. On a 2-core CPU the measured verify step was 10-12 ms above the curve at 1, 3, 5 and 7 tokens
        alike, and a ratio fitted at 2 tokens made every larger tree look too dear."""
        if self.cycles < CALIBRATE_AFTER:
            return None
        lo, hi = RATIO_RANGE

        def ratio(measured: float, model: float) -> float:  # shrunk towards 1 by PRIOR_CYCLES of the model
            if model <= 0:
                return 1.0
            r = (measured + PRIOR_CYCLES * model / self.cycles) / (model + PRIOR_CYCLES * model / self.cycles)
            return round(min(hi, max(lo, r)), 4)

        offset = (self.verify_ms - self.verify_model) / (self.cycles + PRIOR_CYCLES)
        return {"tau": ratio(self.accepted, self.accepted_model), "draft": ratio(self.draft_ms, self.draft_model),
                "verify_ms": round(offset, 3), "cycles": self.cycles}

    def due(self) -> bool:
        return self.since_choice >= CALIBRATE_AFTER

    def book(self, row: dict | None, event) -> dict | None:
        """Add one decoded cycle (a core.decoding.StepEvent) of the tree in grid row `row`; the ratios when a
        new choice is due, else None (also for a cycle without a tree or a shape the grid lacks)."""
        if row is None or not len(event.tree):
            return None
        self.add(row, len(event.accepted), 1000.0 * event.draft_time, 1000.0 * event.verify_time)
        ratios = self.ratios() if self.due() else None
        if ratios is not None:
            self.since_choice = 0
        return ratios


def grid_row(choice: dict | None, depth: int | None, total_tokens: int) -> dict | None:
    """The row of `choice`'s grid for a tree of this shape (depth None: any depth), or None."""
    for row in (choice or {}).get("grid") or ():
        if row["total_tokens"] == total_tokens and (depth is None or row["depth"] == depth) and "tau_model" in row:
            return row
    return None


def keep_or_move(current: dict, candidate: dict, match_depth: bool = True) -> dict:
    """After calibration: `candidate` (a new choice) unless its best shape promises less than CALIBRATE_MARGIN
    more tokens/s than the current shape does under the same calibration; then `candidate` re-pointed at the
    current shape, so the app and the summary show the calibrated figures of the tree that runs. match_depth
    False: a static tree, whose grid rows are keyed by size alone."""
    row = grid_row(candidate, current.get("depth") if match_depth else None, current.get("total_tokens"))
    if row is None or candidate.get("expected_tokens_per_s") is None:
        return candidate
    if candidate["expected_tokens_per_s"] > row["tokens_per_s"] * (1.0 + CALIBRATE_MARGIN):
        return candidate
    return {**candidate, "depth": current["depth"], "total_tokens": current["total_tokens"],
            "expected_tau": row["tau"], "expected_tokens_per_s": row["tokens_per_s"], "cycle_ms": row["ms"]}


def trial_enabled() -> bool:
    """`auto` dynamic trees try their candidate shapes in decoding (core.trees.trial) unless SPECLENS_TREE_TRIAL=0
    (then the cost model, calibrated from decoded cycles, sizes them); only where calibration_enabled."""
    return os.environ.get("SPECLENS_TREE_TRIAL", "1") != "0"


def calibration_enabled(target: Target) -> bool:
    """Calibrate from timings only where the curve is timed too: never on the tiny test target or with the
    fixed cost model (SPECLENS_COST_MODEL=fixed), nor with SPECLENS_CALIBRATE=0."""
    if os.environ.get("SPECLENS_CALIBRATE", "1") == "0":
        return False
    return not (is_tiny(target) or os.environ.get("SPECLENS_COST_MODEL", "").lower() == "fixed")


def calibrate_dynamic_tree(drafter, event) -> None:
    """Book one decoded cycle (a core.decoding.StepEvent) of an `auto` dynamic tree against its predicted
    figures, and every CALIBRATE_AFTER cycles choose the tree again from measured / predicted ratios
    (module docstring; trained.resolve_auto_tree opened the ledger).
    Nothing for a fixed tree or a tiny target. TrainedDrafter.observe calls it."""
    choice, ledger = getattr(drafter, "tree_choice", None), getattr(drafter, "tree_ledger", None)
    if ledger is None or not choice or choice.get("depth") is None or not getattr(drafter, "tree_auto", False):
        return
    trial = getattr(drafter, "tree_trial", None)
    if trial is not None:  # the shape is decided by measured tokens/s (core.trees.trial), not by the model
        if len(event.tree):
            trial.book((int(drafter.config.depth), int(drafter.config.total_tokens)), len(event.new_tokens),
                       event.draft_time + event.verify_time)
            drafter.config.depth, drafter.config.total_tokens = trial.next_shape()
            choice["trial"] = trial.record()
            if trial.done:
                choice["depth"], choice["total_tokens"] = trial.winner
        return
    ratios = ledger.book(grid_row(choice, drafter.config.depth, drafter.config.total_tokens), event)
    if ratios is None:
        return
    new = choose_tree(choice["method"], curve=choice["curve"], acceptance=drafter.tree_acceptance_used,
                      top_k=int(drafter.config.top_k), calibration=ratios)
    if new["depth"] is None:
        return
    new = keep_or_move(choice, new)
    drafter.config.depth, drafter.config.total_tokens = int(new["depth"]), int(new["total_tokens"])
    drafter.tree_choice = new
