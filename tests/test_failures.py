"""Draft-failure analysis on a hand-made recorded trace."""

from __future__ import annotations

import pytest

from analysis import failures
from analysis.failures import token_kind
from analysis.traces import compact_trace

TEXT = {10: " the", 11: "ing", 12: ".", 13: " 42", 14: " cat", 20: "\n", 21: " (", 22: " {", 30: " a", 31: "=",
        5: "The"}


def decode(ids):
    return "".join(TEXT.get(int(t), f"<{int(t)}>") for t in ids)


def top(*pairs):
    return [[t, p] for t, p in pairs]


def make_trace():
    # step 1: root children 0 (' the', accepted) and 1 ('ing'); node 0's children 2 ('.') and 3 (' 42');
    # node 4 (' cat') hangs off rejected node 1, so it was never tested. Bonus '\n' after node 0.
    step1 = {
        "step": 1, "new_tokens": [10, 20], "accepted": [0], "bonus": 20, "draft_time": 0.001, "verify_time": 0.01,
        "position": 5,
        "tree": {"tokens": [10, 11, 12, 13, 14], "parents": [-1, -1, 0, 0, 1],
                 "draft_probs": [0.9, 0.05, 0.3, 0.25, 0.5]},
        "depths": [1, 1, 2, 2, 2],
        "node_target_prob": [0.8, 0.01, 0.02, 0.03, 0.4],
        "row_entropy": [1.5, 0.7, 2.0, 2.1, 2.2, 2.3],
        "row_top": [top((10, 0.8), (11, 0.01)), top((20, 0.6), (12, 0.02)), [], [], [], []],
        "extras": {"draft_top": [top((10, 0.9), (11, 0.05)), top((12, 0.3), (13, 0.25)), [], [], [], []],
                   "lsa_attention": [[0.1] * 4]},
    }
    # step 2: a chain ' (' -> ' {' both rejected at the first node; bonus ' a'.
    step2 = {
        "step": 2, "new_tokens": [30], "accepted": [], "bonus": 30, "draft_time": 0.001, "verify_time": 0.01,
        "position": 7,
        "tree": {"tokens": [21, 22], "parents": [-1, 0], "draft_probs": [0.95, 0.6]},
        "depths": [1, 2], "node_target_prob": [0.1, 0.2], "row_entropy": [3.0, 1.0, 1.0],
        "row_top": [top((30, 0.5), (21, 0.1)), top((1, 1.0)), top((1, 1.0))],
    }
    prefill = {"step": 0, "new_tokens": [5], "accepted": [], "bonus": 5, "draft_time": 0.0, "verify_time": 0.02,
               "position": 4, "tree": {"tokens": [], "parents": [], "draft_probs": []}, "depths": [],
               "node_target_prob": [], "row_entropy": [0.5], "row_top": [top((5, 0.9))]}
    return {"method": "moa", "question_id": 3, "events": [prefill, step1, step2]}


def test_token_kinds():
    cases = {" the": "word_start", "The": "word_start", "ing": "word_piece", "'s": "word_piece",
             ".": "punctuation", ",": "punctuation", " (": "punctuation", "**": "punctuation",
             " 42": "number", "7": "number", "\n": "whitespace", "  ": "whitespace", "": "whitespace",
             " {": "code_symbol", "==": "code_symbol", "_": "code_symbol", "()": "code_symbol",
             " ->": "code_symbol", ".append": "code_symbol", "<|im_end|>": "punctuation"}
    for text, kind in cases.items():
        assert token_kind(text) == kind, text
    assert set(cases.values()) == set(failures.KINDS)


def test_rejections_records():
    recs = failures.rejections(make_trace(), decode)
    assert [(r["step"], r["node"]) for r in recs] == [(1, 1), (1, 2), (1, 3), (2, 0)]
    r1, r2, r3, r4 = recs
    # node 1: depth 1, the target's token there is the accepted sibling ' the'
    assert (r1["depth"], r1["draft_token"], r1["target_token"]) == (1, 11, 10)
    assert r1["draft_text"] == "ing" and r1["target_text"] == " the" and r1["kind"] == "word_piece"
    assert r1["draft_prob"] == 0.05 and r1["target_prob_of_draft"] == 0.01
    assert r1["target_entropy"] == 1.5  # root row
    assert r1["target_top"] == [[10, 0.8], [11, 0.01]]
    assert r1["draft_top"] == [[10, 0.9], [11, 0.05]]
    # nodes 2 and 3: depth 2 under accepted node 0, so the target's token is the bonus '\n'
    assert (r2["depth"], r2["target_token"], r2["kind"], r2["target_entropy"]) == (2, 20, "punctuation", 0.7)
    assert r2["target_top"] == [[20, 0.6], [12, 0.02]] and r2["draft_top"] == [[12, 0.3], [13, 0.25]]
    assert (r3["kind"], r3["target_prob_of_draft"]) == ("number", 0.03)
    # step 2: only the chain's first node was tested; no draft_top attached
    assert (r4["draft_token"], r4["target_token"], r4["kind"], r4["draft_top"]) == (21, 30, "punctuation", None)
    assert r4["method"] == "moa" and r4["question_id"] == 3


def test_tested_nodes_and_aggregates():
    nodes = failures.tested_nodes(make_trace(), decode)
    assert [(n["step"], n["node"], n["accepted"]) for n in nodes] == \
        [(1, 0, True), (1, 1, False), (1, 2, False), (1, 3, False), (2, 0, False)]
    by_kind = failures.acceptance_by_kind(nodes)
    assert list(by_kind) == ["word_start", "word_piece", "punctuation", "number"]
    assert by_kind["word_start"] == {"tested": 1, "accepted": 1, "rate": 1.0}
    assert by_kind["punctuation"] == {"tested": 2, "accepted": 0, "rate": 0.0}
    by_depth = failures.acceptance_by_depth(nodes)
    assert by_depth == {1: {"tested": 3, "accepted": 1, "rate": pytest.approx(1 / 3)},
                        2: {"tested": 2, "accepted": 0, "rate": 0.0}}


def test_calibration_bins():
    nodes = failures.tested_nodes(make_trace(), decode)  # probs .9 (acc), .05, .3, .25, .95
    cal = failures.calibration(nodes, bins=10)
    assert len(cal) == 10 and cal[0]["bin_lo"] == 0.0 and cal[-1]["bin_hi"] == 1.0
    counts = [b["count"] for b in cal]
    assert counts == [1, 0, 1, 1, 0, 0, 0, 0, 0, 2]
    assert cal[9]["mean_draft_prob"] == pytest.approx(0.925) and cal[9]["acceptance"] == 0.5
    assert cal[1]["acceptance"] is None and cal[1]["mean_draft_prob"] is None
    one = failures.calibration([{"draft_prob": 1.0, "accepted": True}], bins=4)
    assert one[3]["count"] == 1  # 1.0 falls in the last bin
    err = failures.calibration_error(cal)
    assert err == pytest.approx((0.05 + 0.3 + 0.25 + 2 * abs(0.5 - 0.925)) / 5)
    with pytest.raises(ValueError):
        failures.calibration(nodes, bins=0)


def test_compact_trace_keeps_what_the_analysis_needs():
    tr = make_trace()
    small = compact_trace(tr, decode)
    ev1 = small["events"][1]
    assert "lsa_attention" not in ev1["extras"]
    assert ev1["row_top"][0] and ev1["row_top"][1] and ev1["row_top"][2] == []
    assert small["token_text"]["11"] == "ing"
    # the token_text map stands in for the tokenizer
    assert failures.rejections(small, None) == failures.rejections(tr, decode)
    assert failures.tested_nodes(small) == failures.tested_nodes(tr, decode)


def test_analyze_and_figures():
    out = failures.analyze([make_trace()], decode)
    assert out["tested"] == 5 and out["accepted"] == 1 and out["rejected"] == 4
    assert out["top_confusions"][0]["count"] == 1
    assert out["mean_target_entropy_at_rejections"] == pytest.approx((1.5 + 0.7 + 0.7 + 3.0) / 4)
    recs = failures.rejections(make_trace(), decode)
    figs = [failures.calibration_figure(out["calibration"]),
            failures.acceptance_bar(out["by_kind"], "by kind"), failures.acceptance_bar(out["by_depth"], "by depth"),
            failures.topk_comparison_figure(recs[0], decode), failures.topk_comparison_figure(recs[3], decode)]
    assert all(len(f.data) >= 1 for f in figs)
    assert len(figs[3].data[0].x) == 2 and len(figs[4].data[0].x) == 0  # drafter side empty without draft_top


def test_cli(tmp_path, capsys):
    import gzip
    import json

    path = tmp_path / "moa.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(compact_trace(make_trace(), decode)) + "\n")
    assert failures.main(["--traces", str(path), "--out", str(tmp_path / "f.json")]) == 0
    printed = capsys.readouterr().out
    assert "acceptance by token kind" in printed and "word_piece" in printed
    saved = json.loads((tmp_path / "f.json").read_text())
    assert saved["rejected"] == 4 and len(saved["rejections"]) == 4


def test_target_rank_by_depth():
    trace = make_trace()
    # step 1: the target took ' the' (the drafter's rank 1 at the root), then '\n', not in node 0's list
    ranks = failures.target_rank_by_depth([trace])
    assert ranks == {1: {"positions": 1, "rank_shares": [1.0] + [0.0] * 9, "missed": 0.0},
                     2: {"positions": 1, "rank_shares": [0.0] * 10, "missed": 1.0}}
    # step 2 with the drafter's root list: the target's ' a' is its second guess; no deeper row was expanded
    trace["events"][2]["extras"] = {"draft_top": [top((21, 0.6), (30, 0.3)), [], []]}
    ranks = failures.target_rank_by_depth([trace])
    assert ranks[1] == {"positions": 2, "rank_shares": [0.5, 0.5] + [0.0] * 8, "missed": 0.0}
    assert ranks[2]["positions"] == 1
    assert failures.analyze([trace], decode)["target_rank_by_depth"] == ranks
    del trace["events"][1]["extras"]["draft_top"], trace["events"][2]["extras"]
    assert failures.target_rank_by_depth([trace]) == {}


def test_rank_figure_stacks_to_one_per_method_and_depth():
    trace = make_trace()
    by_method = {"moa": failures.target_rank_by_depth([trace]), "none": {}}
    fig = failures.rank_figure(by_method)
    assert [bar.name for bar in fig.data] == [g[0] for g in failures.RANK_GROUPS] + ["not in its top 10"]
    assert [list(level) for level in fig.data[0].x] == [["moa", "moa"], ["depth 1", "depth 2"]]
    totals = [sum(bar.y[i] for bar in fig.data) for i in range(2)]
    assert totals == pytest.approx([1.0, 1.0])
    assert fig.data[0].y[0] == 1.0 and fig.data[-1].y[1] == 1.0  # first guess at depth 1; outside at depth 2
    assert "no drafter top-10" in failures.rank_figure({}).layout.annotations[0].text
