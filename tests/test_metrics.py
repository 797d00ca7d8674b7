"""Benchmark arithmetic on hand-made traces whose right answers are worked out by hand."""

from __future__ import annotations

import pytest

from analysis import metrics


def ev(step, tokens=(), parents=None, accepted=(), bonus=0, draft=0.0, verify=0.01, new=None):
    tokens = list(tokens)
    parents = list(range(-1, len(tokens) - 1)) if parents is None else list(parents)  # default: a chain
    if new is None:
        new = [tokens[a] for a in accepted] + [bonus]
    return {"step": step, "new_tokens": new, "accepted": list(accepted), "bonus": bonus, "draft_time": draft,
            "verify_time": verify, "position": 0,
            "tree": {"tokens": tokens, "parents": parents, "draft_probs": [0.5] * len(tokens)}}


def chain_trace(draft=0.005, verify=0.015):
    """prefill (1 token); chain of 3 accepting 2 (3 tokens); chain of 3 accepting 0 (1); chain of 1 accepting 1 (2)."""
    return {"events": [
        ev(0, bonus=5, draft=draft, verify=verify),
        ev(1, [6, 7, 8], accepted=[0, 1], bonus=9, draft=draft, verify=verify),
        ev(2, [1, 2, 3], accepted=[], bonus=4, draft=draft, verify=verify),
        ev(3, [7], accepted=[0], bonus=2, draft=draft, verify=verify),
    ]}


def ar_trace(n=4, verify=0.01):
    return {"events": [ev(i, bonus=i + 1, verify=verify) for i in range(n)]}


def test_tau_and_counts():
    s = metrics.turn_stats(chain_trace())
    assert s["new_tokens"] == 7 and s["steps"] == 4 and s["cycles"] == 3
    assert metrics.tau(s["new_tokens"], s["steps"]) == pytest.approx(1.75)
    assert s["tree_nodes"] == 7
    assert metrics.turn_stats(ar_trace())["new_tokens"] == 4
    assert metrics.finalize(metrics.turn_stats(ar_trace()))["tau"] == 1.0


def test_per_position_rates_chain():
    s = metrics.turn_stats(chain_trace())
    # depth 1 reached by all 3 cycles, accepted by cycles 1 and 3; depth 2 and 3 reached by cycles 1 and 2.
    assert s["reached"] == [3, 2, 2]
    assert s["accepted"] == [2, 1, 0]
    assert metrics.acceptance_rates(s["reached"], s["accepted"]) == pytest.approx([2 / 3, 1 / 2, 0.0])


def test_per_position_rates_tree_use_tree_depth_not_width():
    # depths [1, 1, 2, 2, 3]; cycle A accepts nodes 0 -> 2 -> 4 (3 deep), cycle B accepts node 1 only.
    parents = [-1, -1, 0, 0, 2]
    events = [ev(1, [10, 11, 12, 13, 14], parents, accepted=[0, 2, 4], bonus=1),
              ev(2, [10, 11, 12, 13, 14], parents, accepted=[1], bonus=1),
              ev(3, [10, 11], [-1, 0], accepted=[], bonus=1)]
    reached, accepted = metrics.position_counts(events)
    assert reached == [3, 3, 2]
    assert accepted == [2, 1, 1]
    # depths given by the trace win over the parents (they agree here)
    events[0]["depths"] = [1, 1, 2, 2, 3]
    assert metrics.position_counts(events) == (reached, accepted)
    assert metrics.acceptance_rates([2, 0], [1, 0]) == [0.5, None]


def test_speedup_and_ideal_speedup():
    spec = metrics.question_stats([metrics.turn_stats(chain_trace(draft=0.005, verify=0.015))])
    ar = metrics.question_stats([metrics.turn_stats(ar_trace(4, verify=0.01))])
    out = metrics.finalize(spec, ar)
    # 7 tokens in 4 x 0.02 s = 87.5 tok/s; ar: 4 tokens in 0.04 s = 100 tok/s
    assert out["tokens_per_s"] == pytest.approx(87.5)
    assert out["speedup"] == pytest.approx(0.875)
    # the decoding phase: 6 tokens in 3 cycles (decode tau 2) at 20 ms; ar: 3 tokens in 3 cycles at 10 ms
    assert out["decode_tau"] == pytest.approx(2.0)
    assert out["decode_speedup"] == pytest.approx((6 / 0.06) / (3 / 0.03))
    # ideal: decode tau 2 x 10 ms / 15 ms; the share is then verify / (draft + verify) = 15 / 20
    assert out["ideal_speedup"] == pytest.approx(2.0 * 10 / 15, abs=1e-4)
    assert out["share_of_ideal"] == pytest.approx(0.75, abs=1e-4)
    assert out["draft_ms_per_cycle"] == pytest.approx(5.0)
    assert out["verify_ms_per_cycle"] == pytest.approx(15.0)
    assert out["prefill_ms_per_turn"] == pytest.approx(20.0)
    assert out["acceptance_by_position"] == pytest.approx([0.6667, 0.5, 0.0])
    base = metrics.finalize(ar, ar)
    assert base["speedup"] == 1.0 and base["ideal_speedup"] == 1.0 and base["tau"] == 1.0
    assert metrics.speedup(50.0, 0.0) is None
    assert metrics.ideal_speedup(2.0, None, 10.0) is None


def test_merge_sums_turns_and_keeps_question_rates():
    a = metrics.question_stats([metrics.turn_stats(chain_trace()), metrics.turn_stats(ar_trace(2))])
    assert a["turns"] == 2 and a["new_tokens"] == 9 and a["steps"] == 6
    assert a["question_tps"] == [pytest.approx(9 / (0.08 + 0.02))]
    b = metrics.question_stats([metrics.turn_stats(ar_trace(4))])
    m = metrics.merge_stats([a, b])
    assert m["new_tokens"] == 13 and m["reached"] == [3, 2, 2] and len(m["question_tps"]) == 2
    out = metrics.finalize(m)
    assert out["tokens_per_s_question_mean"] == pytest.approx((90 + 100) / 2)
    assert out["tokens_per_s"] == pytest.approx(13 / 0.14, abs=1e-3)


def records():
    rows = []
    for qid, cat in ((1, "math"), (2, "math"), (3, "qa")):
        rows.append({"method": "ar", "question_id": qid, "category": cat,
                     "turn_stats": [metrics.turn_stats(ar_trace(4))], "token_ids": [[1, 2, 3, 4]]})
        same = qid != 2  # question 2's answer differs from ar's
        rows.append({"method": "spec", "question_id": qid, "category": cat,
                     "turn_stats": [metrics.turn_stats(chain_trace())],
                     "token_ids": [[1, 2, 3, 4] if same else [1, 2, 3, 9]]})
    return rows


def test_summarize_by_category_and_identical():
    s = metrics.summarize(records())
    assert list(s) == ["ar", "spec"]
    assert set(s["spec"]["by_category"]) == {"math", "qa"}
    assert s["spec"]["overall"]["identical_to_ar"] == pytest.approx(2 / 3, abs=1e-4)
    assert s["spec"]["by_category"]["math"]["identical_to_ar"] == 0.5
    assert s["spec"]["by_category"]["qa"]["identical_to_ar"] == 1.0
    assert s["spec"]["by_category"]["math"]["questions"] == 2
    assert s["spec"]["overall"]["speedup"] == pytest.approx(0.875)
    assert s["ar"]["overall"]["identical_to_ar"] == 1.0
    no_ar = metrics.summarize([r for r in records() if r["method"] == "spec"])
    assert no_ar["spec"]["overall"]["speedup"] is None


def test_answer_record_fields():
    tr = [metrics.turn_result(chain_trace()), metrics.turn_result(ar_trace(2))]
    rec = metrics.answer_record({"question_id": 7, "category": "qa", "turns": ["a", "b"]}, "m-spec", ["x", "y"], tr)
    assert set(rec) == {"question_id", "category", "answer_id", "model_id", "tstamp", "choices"}
    assert rec["question_id"] == 7 and rec["category"] == "qa" and rec["model_id"] == "m-spec"
    (choice,) = rec["choices"]
    assert set(choice) == {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}
    assert choice["index"] == 0 and choice["turns"] == ["x", "y"]
    assert choice["decoding_steps"] == [4, 2]
    assert choice["new_tokens"] == [7, 2]
    assert choice["wall_time"] == pytest.approx([0.08, 0.02])
    assert choice["accept_lengths"] == [1, 3, 1, 2, 1, 1]
    # Spec-Bench's mean accepted length is the mean of accept_lengths: it must equal tau
    assert sum(choice["accept_lengths"]) / len(choice["accept_lengths"]) == pytest.approx(9 / 6)


def test_floor_share_of_ideal_and_draft_share():
    spec = metrics.question_stats([metrics.turn_stats(chain_trace(draft=0.005, verify=0.015))])
    ar = metrics.question_stats([metrics.turn_stats(ar_trace(4, verify=0.01))])
    curve = {"sizes": [1, 3, 5], "ms": [10.0, 12.0, 20.0]}
    out = metrics.finalize(spec, ar, curve=curve, floor_ms=5.0)
    # mean tree nodes 7 / 3 cycles; a pass of 1 + 7/3 = 3.333 tokens lies between 3 and 5: 12 + 8 x 1/6 ms
    ideal = 2.0 * 10.0 / (12.0 + 8.0 * (1 / 3) / 2)
    assert out["ideal_speedup_curve"] == pytest.approx(ideal, abs=1e-4)
    # the share is always against the ideal speedup measured in the same run (decode tau x ar verify / verify)
    assert out["share_of_ideal"] == pytest.approx(1.0 / (2.0 * 10 / 15), abs=1e-4)
    assert out["draft_share"] == pytest.approx(5.0 / 15.0, abs=1e-4)
    assert out["floor_ms"] == 5.0 and out["verify_over_floor"] == pytest.approx(3.0)
    plain = metrics.finalize(spec, ar)
    assert plain["share_of_ideal"] == pytest.approx(1.0 / (2.0 * 10 / 15), abs=1e-4)
    assert plain["floor_ms"] is None and plain["ideal_speedup_curve"] is None
    assert metrics.share(1.0, 0.0) is None and metrics.share(None, 2.0) is None
    s = metrics.summarize(records(), curve=curve, floor_ms=4.0)
    assert s["spec"]["overall"]["floor_ms"] == 4.0 and s["ar"]["overall"]["ideal_speedup_curve"] == 1.0
    assert s["spec"]["overall"]["speedup"] == pytest.approx(0.875)  # the existing keys stay


def test_bench_floor_table_reads_the_summary():
    from analysis.bench import floor_table

    s = metrics.summarize(records(), curve={"sizes": [1, 8], "ms": [10.0, 10.0]}, floor_ms=4.0)
    table = floor_table({"config": {"floor_ms": 4.0, "trees": {"spec": {"depth": 3, "total_tokens": 3,
                                                                         "auto": True}}}, "methods": s})
    assert "4.0 ms" in table and "| spec | d3/n3 auto |" in table
    row = next(line for line in table.splitlines() if line.startswith("| spec"))
    # the ideal speedup of the same run: decode tau 2 x ar's 10 ms / the method's 15 ms = 1.33; the decoding
    # phase's speedup (1.00) is 75% of it; the end-to-end speedup (0.88) comes last
    assert "| 1.33 | 1.00 | 75% | 0.88 |" in row
