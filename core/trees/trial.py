"""`auto` dynamic trees decided by decoding itself: a few candidate shapes take turns, cycle by cycle, and the one
with the most tokens per second *measured* wins.

The cost model (core.trees.choice.choose_tree) predicts each shape's tokens/s from held-out tau and a timed cost
curve. On a busy 2-core CPU it misses what decoding shows: one-level trees ran as fast or faster than the
model's two-level pick (docs/RESULTS.md, "Auto trees"), because the verify step grows faster with the tree than
the curve says and the evaluation prompts lose more of the deeper levels' gain. So the model only proposes:

    candidates   the model's pick, and the model's best shape of each depth 1 and 2; when that makes only two,
                 also its best shape at the pick's depth with at least NODE_STEP more or fewer nodes (the
                 verify step can rise within a few nodes, where the timed curve has no point), so 2-3 shapes;
    trial        cycle i drafts with candidate i mod k, for TRIAL_CYCLES_PER_SHAPE cycles each, and books
                 what the cycle appended (accepted drafts + the bonus token) and the seconds it took
                 (drafting + verification, as core.decoding times them);
    choice       then the shape with the highest tokens / seconds runs from there on; a candidate must beat
                 the model's pick by TRIAL_MARGIN to replace it, so noise between equal shapes keeps the pick.

Interleaving cycle by cycle puts every shape on the same prompts, positions and machine state, which is what a
comparison of separate runs cannot do on a shared machine. `TrainedDrafter.observe` calls `book` after each cycle
(through core.trees.calibration.calibrate_dynamic_tree) and the trial's record goes into the drafter's `tree_choice`
("trial"), so the benchmark's summary shows which shape won and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TRIAL_CYCLES_PER_SHAPE = 96  # with 3 shapes, about 300 cycles: a few questions of a benchmark
TRIAL_MARGIN = 0.02  # another shape must measure 2% more tokens/s than the model's pick to replace it
NODE_STEP = 2  # a third candidate differs from the pick by at least this many nodes
MAX_CANDIDATES = 3

Shape = tuple[int, int]  # (depth, total_tokens)


def candidates(choice: dict) -> list[Shape]:
    """The shapes to try: the choice's own, the best predicted shape at depth 1 and at depth 2 of its grid, and,
    if that makes fewer than MAX_CANDIDATES, the best at the pick's depth at least NODE_STEP nodes from it."""
    grid = choice.get("grid") or ()

    def best(rows: list[dict]) -> Shape | None:
        row = max(rows, key=lambda r: r["tokens_per_s"], default=None)
        return None if row is None else (int(row["depth"]), int(row["total_tokens"]))

    pick = None if choice.get("depth") is None else (int(choice["depth"]), int(choice["total_tokens"]))
    out: list[Shape] = []
    for shape in (pick, *(best([r for r in grid if r["depth"] == d]) for d in (1, 2))):
        if shape is not None and shape not in out:
            out.append(shape)
    if out and len(out) < MAX_CANDIDATES:
        d, n = out[0]
        third = best([r for r in grid if r["depth"] == d and abs(r["total_tokens"] - n) >= NODE_STEP])
        if third is not None and third not in out:
            out.append(third)
    return out


@dataclass
class ShapeTrial:
    """The cycle-by-cycle trial of a few tree shapes (module docstring)."""

    shapes: list[Shape]
    per_shape: int = TRIAL_CYCLES_PER_SHAPE
    tokens: dict = field(default_factory=dict)  # shape -> tokens appended
    seconds: dict = field(default_factory=dict)  # shape -> seconds spent
    cycles: dict = field(default_factory=dict)  # shape -> cycles booked
    winner: Shape | None = None

    def __post_init__(self) -> None:
        for s in self.shapes:
            self.tokens.setdefault(s, 0)
            self.seconds.setdefault(s, 0.0)
            self.cycles.setdefault(s, 0)
        if len(self.shapes) < 2:
            self.winner = self.shapes[0] if self.shapes else None

    @property
    def done(self) -> bool:
        return self.winner is not None

    def next_shape(self) -> Shape:
        """The shape the next cycle drafts with: the one with the fewest cycles so far, then the winner."""
        if self.winner is not None:
            return self.winner
        return min(self.shapes, key=lambda s: (self.cycles[s], self.shapes.index(s)))

    def book(self, shape: Shape, appended: int, seconds: float) -> None:
        """One decoded cycle drafted with `shape`; decides once every shape has its cycles."""
        if self.winner is not None or shape not in self.cycles:
            return
        self.cycles[shape] += 1
        self.tokens[shape] += appended
        self.seconds[shape] += seconds
        if min(self.cycles.values()) >= self.per_shape:
            rates = self.rates()
            best = max(self.shapes, key=lambda s: rates[s])
            pick = self.shapes[0]
            self.winner = best if rates[best] > (1.0 + TRIAL_MARGIN) * rates[pick] else pick

    def rates(self) -> dict[Shape, float]:
        """Measured tokens per second of each shape so far."""
        return {s: self.tokens[s] / self.seconds[s] if self.seconds[s] > 0 else 0.0 for s in self.shapes}

    def record(self) -> dict:
        """What the trial measured, for the drafter's tree_choice and the benchmark summary."""
        rates = self.rates()
        rows = [{"depth": s[0], "total_tokens": s[1], "cycles": self.cycles[s], "tokens": self.tokens[s],
                 "seconds": round(self.seconds[s], 4), "tokens_per_s": round(rates[s], 3)} for s in self.shapes]
        out: dict = {"shapes": rows, "cycles_per_shape": self.per_shape, "margin": TRIAL_MARGIN,
                     "winner": None if self.winner is None else {"depth": self.winner[0],
                                                                 "total_tokens": self.winner[1]}}
        if self.winner is not None and len(self.shapes) > 1:
            others = [rates[s] for s in self.shapes if s != self.winner]
            out["gain_over_next"] = round(rates[self.winner] / max(others) - 1.0, 4) if max(others) > 0 else None
            out["gain_over_model_pick"] = (round(rates[self.winner] / rates[self.shapes[0]] - 1.0, 4)
                                           if rates[self.shapes[0]] > 0 else None)
        return out
