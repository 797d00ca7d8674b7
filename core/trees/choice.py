"""Choosing a tree (`choose_tree`): the model behind `auto` trees, documented here once. It weighs a method's
measured acceptance (core.trees.acceptance) against this machine's cost curve (core.trees.cost_curve).

* Measured first. assets/results/tree_acceptance.json (analysis.tree_acceptance) holds, per dynamic-tree method,
  the tau of every (D, N) shape measured on held-out prompts from one deep tree per position, with the drafter's
  per-cycle update time and its time per expansion level. When it was measured on the same target and the same
  checkpoint (and top_k), expected tau = that tau, and drafting = update + (D - 1) x level time, both scaled by
  this machine's 1-token pass / the probe's. The model below is the fallback (a retrained drafter, another
  target) and what Medusa / Amphista's static trees do not use at all.
* Acceptance. `p[d]` = P(a cycle accepts at least d draft tokens), measured for the method at a reference
  tree of depth D0 and N0 nodes (assets/results/summary.json: acceptance_by_position and mean_tree_nodes;
  else the drafter card's teacher-forced acc@1..k, a top-1 chain: N0 = D0). Conditional rates
  c[d] = p[d] / p[d-1]; past the last measured depth the last rate repeats.
* Width. A tree of depth D and N nodes has w = N / D nodes per level; the reference had w0 = N0 / D0.
  A level of width w catches the right token with c(w) = 1 - (1 - c)^((w / w0)^alpha): more candidates help,
  with diminishing returns. alpha = 1 would count each extra w0-wide slice of candidates as an independent
  chance; the measured table says lower-ranked candidates are worth far less, and alpha is fitted to its
  one-level rows (acceptance.width_exponent: about 0.45, so 8 candidates count as 2.6 top-1 chances, not 8).
  Without this, a drafter judged by its card's top-1 chain (w0 = 1) looked near-certain at one wide level.
* Expected tau = 1 + sum over d <= D of prod_{j <= d} c_j(w) (the bonus token counts).
* Cost per cycle = verify pass of 1 + N tokens (this machine's curve) + drafting: a dynamic tree
  (EAGLE-2, MoA) runs the drafter once per level, so D x (draft ms per level); the per-level cost is the
  method's measured draft_ms_per_cycle / D0, scaled by this machine's 1-token pass / the reference run's.
  Static trees (Medusa, Amphista) draft once per cycle whatever the tree; their per-rank accuracies go
  through core.drafters.static_tree.best_size instead.
* The curve is read through its monotone envelope (`monotone`): a spike from a busy machine never makes a
  bigger pass look cheaper than a smaller one.
* Choice: the (D, N) of the grid D = 1..8, N = D..min(64, D x top_k) with the best expected tau / cost
  (tokens/s); a dynamic tree's level never holds more than top_k nodes.

Calibrating the choice from decoded cycles is core.trees.calibration's; `scaled` and `calibrated_row` here
apply a calibration's ratios to one shape's predicted figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.method_table import static_tree_methods
from core.target import Target
from core.trees.acceptance import method_acceptance, tree_table, width_exponent
from core.trees.cost_curve import CACHE_FILE, MAX_AUTO_DEPTH, MAX_AUTO_TOKENS, curve_for, monotone, pass_ms

STATIC_TREE_METHODS = static_tree_methods()


def conditional_rates(p_at_least: Sequence[float | None]) -> list[float]:
    """P(accept >= d) by depth -> P(accept depth d | accepted d - 1); stops at the first missing value.

    Measured per-position rates count only cycles whose tree reached depth d, so a deep, rarely reached
    depth can show a higher rate than the one above it; the sequence is made non-increasing first."""
    rates, prev = [], 1.0
    for p in p_at_least:
        if p is None or prev <= 0:
            break
        p = min(float(p), prev)
        rates.append(max(0.0, p / prev))
        prev = p
    return rates


def widened(rate: float, width: float, ref_width: float, alpha: float = 1.0) -> float:
    """A level's acceptance with `width` candidates, from the rate measured with `ref_width` (c(w) above)."""
    return 1.0 - (1.0 - rate) ** ((max(width, 1e-9) / max(ref_width, 1e-9)) ** alpha)


def expected_tau(rates: Sequence[float], depth: int, total_tokens: int, ref_depth: int, ref_total: float,
                 alpha: float | None = None) -> float:
    """1 + expected accepted draft tokens of a (depth, total_tokens) dynamic tree under the model above
    (alpha: the width exponent; default fitted to the measured table)."""
    if not rates or depth < 1 or total_tokens < 1:
        return 1.0
    alpha = width_exponent() if alpha is None else alpha
    depth = min(depth, total_tokens)
    width, ref_width = total_tokens / depth, max(1.0, ref_total / max(1, ref_depth))
    tau, reach = 1.0, 1.0
    for d in range(depth):
        rate = rates[min(d, len(rates) - 1)]
        reach *= widened(rate, width, ref_width, alpha)
        tau += reach
    return tau


def choose_tree(method: str, target: Target | None = None, curve: dict | None = None,
                acceptance: dict | None = None, draft_ms_per_level: float | None = None,
                max_depth: int = MAX_AUTO_DEPTH, max_tokens: int = MAX_AUTO_TOKENS, top_k: int | None = 8,
                cache_path: str | Path | None = CACHE_FILE, calibration: dict | None = None) -> dict:
    """The dynamic tree (depth, total_tokens) with the best expected tokens/s on this machine.

    method: a method label of assets/results/summary.json ("eagle2", "moa", "moa-tli1", ...).
    curve: this machine's cost curve (default: curve_for(target)). acceptance: method_acceptance's dict
    (default: read for `method`). draft_ms_per_level: drafting cost of one tree level (default: from the
    summary, scaled to this machine; 4% of a 1-token pass when unknown). top_k: the dynamic tree's frontier
    width, so a level holds at most top_k nodes (N <= D x top_k); None: no cap. calibration: measured /
    predicted {"tau", "draft"} ratios and "verify_ms" offset from decoded cycles (calibration.CycleLedger.ratios), None:
    the model alone.
    Returns {"method", "depth", "total_tokens", "expected_tau", "expected_tokens_per_s", "cycle_ms",
    "draft_ms_per_level", "acceptance", "acceptance_source", "curve" (as measured), "calibration", "grid":
    [{depth, total_tokens, tau, ms, tokens_per_s, tau_model, draft_model, pass_model}, ...] (tau and ms
    calibrated, the *_model fields as predicted), "model"}; depth/total_tokens are None when there is no
    acceptance to go by. Medusa / Amphista (static trees) are sized by
    core.drafters.static_tree.static_tree_choice (same keys).
    """
    if curve is None:
        if target is None:
            raise ValueError("choose_tree needs a target or a cost curve")
        curve = curve_for(target, cache_path)
    raw, curve = curve, monotone(curve)
    base = method.removesuffix("+lookup")
    if acceptance is None and base in STATIC_TREE_METHODS:  # sized by core.drafters.static_tree.static_tree_choice
        acceptance = {"p": [], "ref_depth": 0, "ref_total": 0, "source": "static tree: see core.drafters.static_tree"}
    acc = acceptance if acceptance is not None else (tree_table(base) or method_acceptance(base))
    if acc is not None and not acc.get("grid") and not conditional_rates(acc.get("p") or []):
        acc = None  # nothing measured to go by
    one = pass_ms(curve, 1.0)
    if draft_ms_per_level is None:
        draft_ms_per_level = 0.04 * one
        if acc and acc.get("draft_ms") and acc.get("verify_ms_1"):
            draft_ms_per_level = (acc["draft_ms"] / max(1, acc.get("draft_levels") or acc["ref_depth"])
                                  * one / acc["verify_ms_1"])
    grid = acc.get("grid") if acc else None
    if grid:  # measured shapes: the probe's own drafting times, scaled by this machine's 1-token pass / the probe's
        scale = one / acc["verify_ms_1"] if acc.get("verify_ms_1") else 1.0
        fixed_ms = (acc.get("accept_ms") or 0.0) * scale
        draft_ms_per_level = (acc.get("level_ms") or 0.04 * one) * scale
    out = {"method": method, "depth": None, "total_tokens": None, "expected_tau": 1.0,
           "expected_tokens_per_s": 1000.0 / one, "cycle_ms": one, "draft_ms_per_level": round(draft_ms_per_level, 3),
           "acceptance": acc["p"] if acc else [], "acceptance_source": acc["source"] if acc else None,
           "curve": raw, "calibration": calibration, "grid": [],
           "model": "core.trees.choice module docstring"}
    if not acc:
        return out
    rates = conditional_rates(acc["p"])
    cal = calibration or {}
    best = None
    for depth in range(1, max_depth + 1):
        for n in range(depth, min(max_tokens, depth * top_k if top_k else max_tokens) + 1):
            if grid:
                if (depth, n) not in grid:
                    continue
                tau, drafting = grid[(depth, n)], fixed_ms + (depth - 1) * draft_ms_per_level
            else:
                tau = expected_tau(rates, depth, n, acc["ref_depth"], acc["ref_total"])
                drafting = depth * draft_ms_per_level
            one_pass = pass_ms(curve, 1.0 + n)
            out["grid"].append(calibrated_row(depth, n, tau, drafting, one_pass, cal))
            tau, ms = scaled(tau, drafting, one_pass, cal)
            tps = 1000.0 * tau / ms
            if best is None or tps > best[0] + 1e-9:
                best = (tps, depth, n, tau, ms)
    tps, depth, n, tau, ms = best
    out.update(depth=depth, total_tokens=n, expected_tau=round(tau, 4), expected_tokens_per_s=round(tps, 3),
               cycle_ms=round(ms, 3))
    return out


def calibrated_row(depth: int, n: int, tau: float, draft_ms: float, pass_ms_: float, cal: dict) -> dict:
    """One shape of a tree choice's grid: the model's tau / drafting / pass, and those calibrated by `cal`
    (`scaled`: tau's gain over plain decoding, tau - 1, and drafting scale; the verify pass gets an offset)."""
    tau_c, ms = scaled(tau, draft_ms, pass_ms_, cal)
    return {"depth": depth, "total_tokens": n, "tau": round(tau_c, 4), "ms": round(ms, 3),
            "tokens_per_s": round(1000.0 * tau_c / ms, 3), "tau_model": round(tau, 4),
            "draft_model": round(draft_ms, 3), "pass_model": round(pass_ms_, 3)}


def scaled(tau: float, draft_ms: float, pass_ms_: float, cal: dict) -> tuple[float, float]:
    """(tau, cycle ms) of one shape under `cal`: tau's gain and drafting scaled by their ratios, the verify
    pass shifted by its offset; without a calibration exactly the model's."""
    if not cal:
        return tau, pass_ms_ + draft_ms
    return (1.0 + cal.get("tau", 1.0) * (tau - 1.0),
            pass_ms_ + cal.get("verify_ms", 0.0) + cal.get("draft", 1.0) * draft_ms)
