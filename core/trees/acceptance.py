"""The acceptance an `auto` tree is sized by: what was measured for a method, read from the committed results.

Three sources, in the order core.trees.choice.choose_tree tries them (its module docstring describes the model):

    tree_table(method)          tau of every (depth, total_tokens) shape, measured on held-out prompts
                                (assets/results/tree_acceptance.json, analysis.tree_acceptance); only for the
                                same target and the same checkpoint (`checkpoint_signature`)
    method_acceptance(method)   P(a cycle accepts >= d draft tokens) from the benchmark summaries
                                (assets/results/summary.json and the deep-tree run)
    card_acceptance(metrics)    a drafter card's held-out acc@1..k (a top-1 chain)
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from core.trees.cost_curve import MAX_AUTO_DEPTH, ROOT

RESULTS = ROOT / "assets" / "results" / "summary.json"
# the shipped MoA's ablation run: every dynamic-tree drafter shipped with it, fixed trees of depth 5 (docs/RESULTS.md,
# "What MoA shows")
DEEP_RESULTS = ROOT / "assets" / "results" / "moa" / "feature_gain" / "bench_summary.json"
# tau of every dynamic-tree shape, measured on held-out prompts (analysis.tree_acceptance); read first
TREE_TABLE = ROOT / "assets" / "results" / "tree_acceptance.json"


def _overall(results: str | Path, method: str) -> tuple[dict, dict] | None:
    """(the method's overall figures, the baseline's) from a benchmark summary; None when absent."""
    try:
        data = json.loads(Path(results).read_text())
        overall = data["methods"][method]["overall"]
        base = data["methods"].get(data.get("config", {}).get("baseline", "ar"), {}).get("overall", {})
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    return overall, base


def _positions(overall: dict) -> list[float]:
    return [x for x in overall.get("acceptance_by_position") or [] if x is not None]


def method_acceptance(method: str, results: str | Path = RESULTS,
                      deep_results: str | Path | None = DEEP_RESULTS) -> dict | None:
    """A method's measured acceptance: {"p": P(accept >= d) list, "ref_depth", "ref_total", "draft_ms",
    "draft_levels", "verify_ms_1", "source"}; None when no summary has the method.

    The acceptance by depth comes from whichever of `results` (the latest run) and `deep_results` (a run with
    deep fixed trees) measured more depths: an `auto` run on a machine with a steep cost curve drafts one level
    and so says nothing about deeper ones. The drafting cost comes from `results` when it has the method (the
    latest drafting code), as draft ms per cycle over the levels drafted there."""
    runs = []  # (figures, path) of each summary that measured the method; the latest first
    for path in (results, deep_results):
        run = _overall(path, method) if path is not None else None
        if run and _positions(run[0]):
            runs.append((run, path))
    if not runs:
        return None
    acc_from, acc_path = max(runs, key=lambda r: len(_positions(r[0][0])))  # a tie keeps the latest
    cost_from = runs[0][0]
    p = _positions(acc_from[0])
    source = f"{Path(acc_path).name}: {method}"
    if cost_from is not acc_from:
        source += f" (drafting cost: {Path(results).name})"
    return {"p": p, "ref_depth": len(p), "ref_total": float(acc_from[0].get("mean_tree_nodes") or len(p)),
            "draft_ms": cost_from[0].get("draft_ms_per_cycle"), "draft_levels": len(_positions(cost_from[0])),
            "verify_ms_1": cost_from[1].get("verify_ms_per_cycle"), "source": source}


def checkpoint_signature(meta: dict | None) -> str | None:
    """A short string that changes whenever a checkpoint is retrained: its name and its training run's steps,
    tokens, seed and wall time (config.json's "training"); None for an untrained drafter."""
    if not isinstance(meta, dict):
        return None
    t = meta.get("training") or {}
    return ":".join(str(x) for x in (meta.get("name"), t.get("steps"), t.get("tokens"), t.get("seed"),
                                     t.get("wall_time_s")))


def shipped_signature(method: str) -> str | None:
    """`checkpoint_signature` of the shipped checkpoint of a method label (assets/drafters/<label>: "moa-tli1")."""
    try:
        return checkpoint_signature(json.loads((ROOT / "assets" / "drafters" / method / "config.json").read_text()))
    except (OSError, ValueError):
        return None


def shape_grid(row: dict) -> dict[tuple[int, int], float]:
    """A tree-table row's "grid" ([depth, total_tokens, tau] rows) as {(depth, total_tokens): tau}."""
    return {(int(d), int(n)): float(t) for d, n, t in row["grid"]}


def tree_table(method: str, fingerprint: str | None = None, signature: str | None = None,
               path: str | Path | None = None) -> dict | None:
    """A method's row of the measured tree table (analysis.tree_acceptance) as choose_tree's acceptance:
    {"grid": {(depth, total_tokens): tau}, "accept_ms", "level_ms", "verify_ms_1", "p": [], "source"}; None when
    the table lacks the method, or was measured on another target (`fingerprint`) or checkpoint (`signature`,
    default: the shipped checkpoint's), so a retrained drafter never goes by its predecessor's table."""
    path = TREE_TABLE if path is None else Path(path)
    try:
        data = json.loads(path.read_text())
        row = data["methods"][method]
        grid = shape_grid(row)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if fingerprint is not None and data.get("target") != fingerprint:
        return None
    if row.get("checkpoint") != (signature if signature is not None else shipped_signature(method)):
        return None
    return {"grid": grid, "accept_ms": row.get("accept_ms"), "level_ms": row.get("level_ms"),
            "verify_ms_1": row.get("verify_ms_1"), "top_k": row.get("top_k"), "p": [], "ref_depth": 0,
            "ref_total": 0, "source": f"{path.name}: {method} (tau measured for every tree shape)"}


def card_acceptance(metrics: dict | None) -> dict | None:
    """Acceptance from a drafter card's held-out acc@1..k (teacher-forced top-1 along a chain: N0 = D0)."""
    if not isinstance(metrics, dict):
        return None
    rates = []
    for d in range(1, MAX_AUTO_DEPTH + 1):
        v = metrics.get(f"acc@{d}")
        if not isinstance(v, (int, float)):
            break
        rates.append(float(v))
    if not rates:
        return None
    p, reach = [], 1.0
    for r in rates:
        reach *= r
        p.append(reach)
    return {"p": p, "ref_depth": len(p), "ref_total": float(len(p)), "draft_ms": None, "verify_ms_1": None,
            "source": "drafter card (held-out acc@k)"}


@lru_cache(maxsize=4)
def width_exponent(path: str | Path | None = None) -> float:
    """How much a wider tree level helps, fitted to the measured tree table; 1.0 when there is none.

    choose_tree's fallback model treats a level of w nodes, against a reference width w0, as (w / w0) ** alpha
    independent chances at the rate measured with w0 (core.trees.choice, "Width"). alpha = 1 counts every extra
    w0-wide slice of candidates as a fresh chance; the table says the lower-ranked candidates are much weaker. From
    each method's one-level rows, tau(1, 1) = 1 + c and tau(1, n) = 1 + c_n, the slices the n nodes were worth are
    s_n = ln(1 - c_n) / ln(1 - c), and alpha is the least-squares slope of ln s_n on ln n through the origin."""
    try:
        data = json.loads((TREE_TABLE if path is None else Path(path)).read_text())
        rows = [shape_grid(m) for m in data["methods"].values()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 1.0
    xy = []
    for grid in rows:
        c = grid.get((1, 1), 1.0) - 1.0
        for (d, n), tau in grid.items():
            c_n = tau - 1.0
            if d == 1 and n > 1 and 0.0 < c < 1.0 and c < c_n < 1.0:
                xy.append((math.log(n), math.log(math.log(1.0 - c_n) / math.log(1.0 - c))))
    if not xy:
        return 1.0
    alpha = sum(x * y for x, y in xy) / sum(x * x for x, _ in xy)
    return min(1.0, max(0.05, alpha))
