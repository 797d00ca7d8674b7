"""Benchmark arithmetic on step traces (docs/ARCHITECTURE.md, "Metrics"), as pure functions on plain dicts.

Input is the `GenerationResult.trace()` dict of one generation (its "events"
are `StepEvent.to_dict()` dicts; step 0 is the prefill). Everything is built
in three stages so that it can be summed over turns, questions and categories:

    turn_stats(trace)            additive counts of one generation
    merge_stats([...])           sum of several (a question, a category, a method)
    finalize(stats, ar_stats)    the reported numbers

Definitions (the same everywhere in the project):

* tau = new tokens / target forward passes, the prefill counted as a pass, so
  plain decoding has tau = 1.0 exactly.
* per-position acceptance rate at depth i = cycles whose accepted path reached
  depth i / cycles whose draft tree had a node at depth i (vLLM's definition;
  for a chain "had a node at depth i" means the chain was at least i long).
* tokens/s = all new tokens / all generation time (ratio of sums). Spec-Bench's
  own script averages per-question rates instead; that number is reported too,
  as `tokens_per_s_question_mean`.
* speedup = tokens/s of the method / tokens/s of `ar` over the same questions
  in the same run.
* per-cycle times exclude the prefill (a cycle = one draft + one verify pass).
* decoding phase: the cycles only. Each turn's prefill and the token it gives are left out; they are the
  same work for every method. `decode_tau` = tokens from cycles / cycles, and `decode_speedup` = tokens/s
  over the cycles / `ar`'s over its cycles.
* ideal speedup = decode_tau x t(1-token pass) / t(verify pass), with t(1-token pass) = `ar`'s verify time
  per cycle and t(verify pass) = the method's: the decoding phase's speedup if drafting cost nothing.
* `share_of_ideal` = decode_speedup / ideal_speedup: how much of what this tau could give the method keeps
  once drafting is paid. Both are taken over the decoding phase, and both passes are timed in the same run,
  so the app, the report and the README agree. It equals verify / (draft + verify) per cycle, up to the
  decode loop's own time. The prefill stays out of both because it costs several one-token passes: counted
  as one pass in the ideal and in full in the speedup, it would charge every method for work that is not
  drafting.
* With this machine's cost curve (core.trees.cost_curve) also `ideal_speedup_curve` = decode_tau x t(1) / t(1 + mean
  tree nodes), both from the curve (bare target passes, no verification bookkeeping): the same limit
  from separately timed passes, for comparison.
* `draft_share` = draft ms / verify ms per cycle; `floor_ms` = the bare-matmul floor (one token through
  every weight matrix of the target, core.trees.cost_curve.matmul_floor_ms) and `verify_over_floor` = the
  method's verify ms per cycle / floor_ms (plain decoding's is how far a target pass is from the floor).

Generation time is the sum of the events' draft and verify times (prefill
included). That is the end-to-end wall time less the cost of recording the
trace (top-10 and entropies at every node, done outside the timed sections),
so recorded and unrecorded runs time alike; without recording the two agree
to about a millisecond per generation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence

from core.trees.cost_curve import pass_ms

DEFINITIONS = {
    "tau": "new tokens / target forward passes (prefill counted; plain decoding = 1.0)",
    "acceptance_by_position": "index i-1: cycles that accepted >= i draft tokens / cycles whose tree reached depth i",
    "tokens_per_s": "all new tokens / all generation time (draft + verify, prefill included)",
    "speedup": "tokens_per_s / tokens_per_s of ar on the same questions in the same run",
    "decode_tau": "tokens from cycles / cycles (each turn's prefill and its token left out)",
    "decode_speedup": "tokens/s over the cycles / ar's tokens/s over its cycles (prefill left out)",
    "ideal_speedup": "decode_tau x ar verify_ms_per_cycle / this method's verify_ms_per_cycle",
    "identical_to_ar": "fraction of questions whose token ids (every turn) equal ar's",
    "per_cycle": "a cycle = one draft + one verify pass; the prefill is not a cycle",
    "ideal_speedup_curve": "decode_tau x t(1-token pass) / t(pass of 1 + mean_tree_nodes tokens), both from this "
                           "machine's cost curve (core.trees.cost_curve)",
    "share_of_ideal": "decode_speedup / ideal_speedup (both over the decoding phase of this run)",
    "draft_share": "draft_ms_per_cycle / verify_ms_per_cycle",
    "floor_ms": "bare matmuls of one token through every weight matrix of the target (no attention, no Python "
                "between them): the memory floor of one decoding step on this machine",
    "verify_over_floor": "verify_ms_per_cycle / floor_ms",
}

ADDITIVE = ("turns", "new_tokens", "steps", "cycles", "tree_nodes", "wall_time", "draft_time", "verify_time",
            "prefill_time")


def event_depths(event: dict) -> list[int]:
    """Depth of every tree node of an event dict (1 = child of the root)."""
    if "depths" in event:
        return list(event["depths"])
    depths: list[int] = []
    for p in event["tree"]["parents"]:
        depths.append(1 if p < 0 else depths[p] + 1)
    return depths


def position_counts(events: Iterable[dict]) -> tuple[list[int], list[int]]:
    """(reached, accepted): reached[i-1] = cycles whose tree has depth >= i; accepted[i-1] = those accepting >= i."""
    reached: list[int] = []
    accepted: list[int] = []
    for ev in events:
        depths = event_depths(ev)
        max_depth = max(depths, default=0)
        if max_depth > len(reached):
            reached.extend([0] * (max_depth - len(reached)))
            accepted.extend([0] * (max_depth - len(accepted)))
        n_acc = len(ev["accepted"])
        for i in range(max_depth):
            reached[i] += 1
            if n_acc > i:
                accepted[i] += 1
    return reached, accepted


def acceptance_rates(reached: Sequence[int], accepted: Sequence[int]) -> list[float | None]:
    """Per-position acceptance rate, index 0 = depth 1; None where no cycle reached that depth."""
    return [a / r if r else None for r, a in zip(reached, accepted)]


def turn_stats(trace: dict) -> dict:
    """Additive statistics of one generation (one turn of one question)."""
    events = trace["events"]
    cycles = [e for e in events if e["step"] > 0]
    prefill = [e for e in events if e["step"] == 0]
    reached, accepted = position_counts(cycles)
    wall = sum(e["draft_time"] + e["verify_time"] for e in events)
    return {
        "turns": 1,
        "new_tokens": sum(len(e["new_tokens"]) for e in events),
        "steps": len(events),
        "cycles": len(cycles),
        "tree_nodes": sum(len(e["tree"]["tokens"]) for e in cycles),
        "wall_time": wall,
        "draft_time": sum(e["draft_time"] for e in cycles),
        "verify_time": sum(e["verify_time"] for e in cycles),
        "prefill_time": sum(e["draft_time"] + e["verify_time"] for e in prefill),
        "reached": reached,
        "accepted": accepted,
        "question_tps": [],
    }


def _add_lists(a: Sequence[int], b: Sequence[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def merge_stats(parts: Iterable[dict]) -> dict:
    """Sum additive statistics (counts, times, per-depth lists; per-question rates are concatenated)."""
    out = {k: 0 for k in ADDITIVE}
    out.update(reached=[], accepted=[], question_tps=[])
    for s in parts:
        for k in ADDITIVE:
            out[k] += s[k]
        out["reached"] = _add_lists(out["reached"], s["reached"])
        out["accepted"] = _add_lists(out["accepted"], s["accepted"])
        out["question_tps"] = out["question_tps"] + list(s["question_tps"])
    return out


def question_stats(turns: Sequence[dict]) -> dict:
    """Merge the turns of one question and note its tokens/s (Spec-Bench averages these)."""
    s = merge_stats(turns)
    s["question_tps"] = [s["new_tokens"] / s["wall_time"]] if s["wall_time"] > 0 else []
    return s


def tau(new_tokens: int, steps: int) -> float:
    """Mean accepted length: tokens appended per target pass (bonus token included)."""
    return new_tokens / steps if steps else 0.0


def speedup(tokens_per_s: float, ar_tokens_per_s: float) -> float | None:
    return tokens_per_s / ar_tokens_per_s if ar_tokens_per_s else None


def ideal_speedup(tau_value: float, t_single: float | None, t_verify: float | None) -> float | None:
    """tau x t(1-token pass) / t(verify pass): the speedup if drafting cost nothing."""
    if not t_single or not t_verify:
        return None
    return tau_value * t_single / t_verify


def ideal_speedup_from_curve(tau_value: float, curve: dict | None, mean_tree_nodes: float | None) -> float | None:
    """tau x t(1-token pass) / t(pass of 1 + mean_tree_nodes tokens), both read off the cost curve."""
    if not curve or mean_tree_nodes is None:
        return None
    return tau_value * pass_ms(curve, 1.0) / pass_ms(curve, 1.0 + mean_tree_nodes)


def share(x: float | None, of: float | None) -> float | None:
    """x / of, None when either is missing or `of` is 0."""
    return x / of if x is not None and of else None


def _per_cycle_ms(total: float, cycles: int) -> float | None:
    return 1000.0 * total / cycles if cycles else None


def _decode_tau(stats: dict) -> float:
    """Tokens per cycle: each turn's prefill gives exactly one token, which is left out."""
    return (stats["new_tokens"] - stats["turns"]) / stats["cycles"] if stats["cycles"] else 0.0


def _decode_tps(stats: dict) -> float:
    """Tokens/s over the cycles only (the prefill's time and token left out)."""
    wall = stats["wall_time"] - stats["prefill_time"]
    return (stats["new_tokens"] - stats["turns"]) / wall if wall > 0 else 0.0


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def finalize(stats: dict, ar: dict | None = None, identical: float | None = None, questions: int | None = None,
             curve: dict | None = None, floor_ms: float | None = None) -> dict:
    """The reported metrics of merged `stats`, with `ar`'s merged stats (same questions) as the baseline;
    `curve` (a core.trees.cost_curve curve) and `floor_ms` add the floor and share-of-ideal figures."""
    tps = stats["new_tokens"] / stats["wall_time"] if stats["wall_time"] > 0 else 0.0
    qtps = stats["question_tps"]
    t = tau(stats["new_tokens"], stats["steps"])
    dtau = _decode_tau(stats)
    verify_ms = _per_cycle_ms(stats["verify_time"], stats["cycles"])
    out = {
        "questions": questions if questions is not None else len(qtps),
        "turns": stats["turns"],
        "new_tokens": stats["new_tokens"],
        "steps": stats["steps"],
        "cycles": stats["cycles"],
        "wall_time": _r(stats["wall_time"]),
        "tokens_per_s": _r(tps, 3),
        "tokens_per_s_question_mean": _r(sum(qtps) / len(qtps), 3) if qtps else None,
        "tau": _r(t),
        "mean_tree_nodes": _r(stats["tree_nodes"] / stats["cycles"], 2) if stats["cycles"] else None,
        "acceptance_by_position": [_r(x) for x in acceptance_rates(stats["reached"], stats["accepted"])],
        "reached_by_position": list(stats["reached"]),
        "draft_ms_per_cycle": _r(_per_cycle_ms(stats["draft_time"], stats["cycles"]), 3),
        "verify_ms_per_cycle": _r(verify_ms, 3),
        "prefill_ms_per_turn": _r(1000.0 * stats["prefill_time"] / stats["turns"], 3) if stats["turns"] else None,
        "decode_tau": _r(dtau),
        "speedup": None,
        "decode_speedup": None,
        "ideal_speedup": None,
        "share_of_ideal": None,
        "identical_to_ar": _r(identical),
    }
    if ar is not None:
        ar_tps = ar["new_tokens"] / ar["wall_time"] if ar["wall_time"] > 0 else 0.0
        out["speedup"] = _r(speedup(tps, ar_tps))
        dspd = speedup(_decode_tps(stats), _decode_tps(ar))
        ideal = ideal_speedup(dtau, _per_cycle_ms(ar["verify_time"], ar["cycles"]), verify_ms)
        out["decode_speedup"], out["ideal_speedup"] = _r(dspd), _r(ideal)
        out["share_of_ideal"] = _r(share(dspd, ideal))
    nodes = stats["tree_nodes"] / stats["cycles"] if stats["cycles"] else None
    out["ideal_speedup_curve"] = _r(ideal_speedup_from_curve(dtau, curve, nodes))
    out["draft_share"] = _r(share(_per_cycle_ms(stats["draft_time"], stats["cycles"]), verify_ms))
    out["floor_ms"] = _r(floor_ms, 3)
    out["verify_over_floor"] = _r(share(verify_ms, floor_ms), 3)
    return out


def identical_fraction(answers: dict, reference: dict) -> float | None:
    """Fraction of questions whose answer (token ids of every turn) equals the reference's.

    Both map question_id -> list of per-turn token id lists; only shared questions count.
    """
    shared = [q for q in answers if q in reference]
    if not shared:
        return None
    return sum(answers[q] == reference[q] for q in shared) / len(shared)


def summarize(records: Sequence[dict], baseline: str = "ar", curve: dict | None = None,
              floor_ms: float | None = None) -> dict:
    """Per method, overall and per category (`curve`, `floor_ms`: see finalize).

    records: one per (method, question) with "method", "question_id", "category",
    "turn_stats" (list of turn_stats dicts) and "token_ids" (list of per-turn id lists).
    """
    methods = list(dict.fromkeys(r["method"] for r in records))
    categories = list(dict.fromkeys(r["category"] for r in records))
    by = {(r["method"], r["question_id"]): r for r in records}

    def scope(method: str, category: str | None) -> list[dict]:
        return [r for r in records if r["method"] == method and (category is None or r["category"] == category)]

    def metrics(method: str, category: str | None) -> dict:
        rs = scope(method, category)
        stats = merge_stats(question_stats(r["turn_stats"]) for r in rs)
        ar_stats = None
        identical = None
        if baseline in methods:
            ar_rs = [by[(baseline, r["question_id"])] for r in rs if (baseline, r["question_id"]) in by]
            ar_stats = merge_stats(question_stats(r["turn_stats"]) for r in ar_rs) if ar_rs else None
            identical = identical_fraction({r["question_id"]: r["token_ids"] for r in rs},
                                           {r["question_id"]: r["token_ids"] for r in ar_rs})
        return finalize(stats, ar_stats, identical, questions=len(rs), curve=curve, floor_ms=floor_ms)

    out = {}
    for m in methods:
        out[m] = {"overall": metrics(m, None),
                  "by_category": {c: metrics(m, c) for c in categories if scope(m, c)}}
    return out


def flat_rows(per_method: dict) -> list[dict]:
    """summarize()'s output as flat rows {"method", "category", scalar metrics...}, "overall" rows included."""
    rows = []
    for method, res in per_method.items():
        for category, m in [("overall", res["overall"]), *res["by_category"].items()]:
            rows.append({"method": method, "category": category,
                         **{k: v for k, v in m.items() if not isinstance(v, (list, dict))}})
    return rows


def answer_record(question: dict, model_id: str, turn_texts: Sequence[str], turn_results: Sequence[dict]) -> dict:
    """One line of a Spec-Bench answer file (docs/ARCHITECTURE.md, "Formats").

    turn_results: per turn, a dict with "steps", "new_tokens", "wall_time" and
    "accept_lengths" (tokens appended by each target pass, the prefill's 1 included,
    so their mean is tau); the accept lengths of all turns are concatenated, as
    Spec-Bench does.
    """
    accept: list[int] = []
    for t in turn_results:
        accept.extend(int(a) for a in t["accept_lengths"])
    return {
        "question_id": question["question_id"],
        "category": question.get("category", ""),
        "answer_id": uuid.uuid4().hex[:22],
        "model_id": model_id,
        "tstamp": time.time(),
        "choices": [{
            "index": 0,
            "turns": list(turn_texts),
            "decoding_steps": [int(t["steps"]) for t in turn_results],
            "new_tokens": [int(t["new_tokens"]) for t in turn_results],
            "wall_time": [float(t["wall_time"]) for t in turn_results],
            "accept_lengths": accept,
        }],
    }


def turn_result(trace: dict) -> dict:
    """The per-turn numbers an answer record needs, from a trace (wall time as defined above)."""
    events = trace["events"]
    return {"steps": len(events), "new_tokens": sum(len(e["new_tokens"]) for e in events),
            "wall_time": round(sum(e["draft_time"] + e["verify_time"] for e in events), 6),
            "accept_lengths": [len(e["new_tokens"]) for e in events]}
