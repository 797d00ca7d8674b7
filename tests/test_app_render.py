"""The app's pure functions on hand-made traces: token HTML, stats, tree / LSA / TLI / benchmark / failure views.

No model and no server: every tab's logic is a function of JSON-able trace dicts
(the `StepEvent.to_dict()` form). The last tests build the Blocks and run the
tiny runtime (SPECLENS_TINY's target) once.
"""

from __future__ import annotations

import gzip
import json
import re
import types

import numpy as np
import plotly.graph_objects as go
import pytest

from demo import render
from demo.render import (
    compare_html,
    default_step,
    event_tokens,
    first_difference,
    generation_stats,
    legend_html,
    lossless_note,
    lsa_bar,
    lsa_heatmap,
    lsa_matrices,
    lsa_received,
    stats_html,
    step_choices,
    token_pieces,
    tokens_from_events,
    tokens_html,
    tree_figure,
    tree_layout,
)

VOCAB = {5: "Hello", 6: " world", 7: ",", 8: " my", 9: " dear", 10: "!", 11: " friend", 12: "<b>", 13: "\n"}


def decode(ids):
    return "".join(VOCAB.get(int(i), f"<{int(i)}>") for i in ids)


def lsa(n_tokens: int, layers: int = 3, hot: int = 2) -> list:
    """Attention maps whose rows sum to 1, with every query favouring layer `hot`."""
    m = np.full((n_tokens, layers, layers), 0.1)
    m[:, :, hot] = 1.0
    m = m / m.sum(-1, keepdims=True)
    return m.round(4).tolist()


def hand_trace() -> list[dict]:
    """Three passes: the prefill, a tree step (2 of 4 accepted + bonus), a plain step."""
    e0 = {"step": 0, "new_tokens": [5], "accepted": [], "bonus": 5, "draft_time": 0.01, "verify_time": 0.2,
          "position": 9, "tree": {"tokens": [], "parents": [], "draft_probs": []}, "depths": [],
          "node_target_prob": [], "row_entropy": [0.4], "row_top": [[[5, 0.9], [6, 0.05]]]}
    e1 = {"step": 1, "new_tokens": [7, 8, 11], "accepted": [0, 1], "bonus": 11, "draft_time": 0.05,
          "verify_time": 0.1, "position": 10,
          "tree": {"tokens": [7, 8, 9, 10], "parents": [-1, 0, 1, -1], "draft_probs": [0.8, 0.6, 0.3, 0.1]},
          "depths": [1, 2, 3, 1], "node_target_prob": [0.9, 0.7, 0.1, 0.05], "row_entropy": [0.5, 0.6, 1.2, 2.0, 2.1],
          "row_top": [[[7, 0.9], [10, 0.05]], [[8, 0.7], [9, 0.2]], [[11, 0.6], [9, 0.1]], [], []],
          "extras": {"lsa_attention": lsa(2), "lsa_tokens": [5, 7]}}
    e2 = {"step": 2, "new_tokens": [12], "accepted": [], "bonus": 12, "draft_time": 0.02, "verify_time": 0.1,
          "position": 13, "tree": {"tokens": [13], "parents": [-1], "draft_probs": [0.4]}, "depths": [1],
          "node_target_prob": [0.2], "row_entropy": [1.0, 1.5], "row_top": [[[12, 0.5], [13, 0.2]], []],
          "extras": {"lsa_attention": lsa(3), "lsa_tokens": [8, 11, 12]}}
    return [e0, e1, e2]


def hand_run(events=None, method="moa") -> dict:
    events = events or hand_trace()
    ids = [t for e in events for t in e["new_tokens"]]
    return {"method": method, "label": f"{method} run", "note": "", "greedy": True, "events": events,
            "token_ids": ids, "tokens": tokens_from_events(events), "pieces": token_pieces(ids, decode),
            "stats": generation_stats(events, 1.0), "done": True, "text": decode(ids), "wall_time": 1.0,
            "stop_reason": "eos", "prompt_ids": [1, 2]}


# ----- tokens -----------------------------------------------------------------------------------------

def test_event_tokens_classify_drafts_and_bonus():
    infos = tokens_from_events(hand_trace())
    assert [i["kind"] for i in infos] == ["bonus", "draft", "draft", "bonus", "bonus"]
    assert [i["depth"] for i in infos] == [0, 1, 2, 0, 0]
    assert [i["step"] for i in infos] == [0, 1, 1, 1, 2]
    d2 = infos[2]
    assert d2["draft_prob"] == pytest.approx(0.6) and d2["target_prob"] == pytest.approx(0.7)
    assert infos[3]["target_prob"] == pytest.approx(0.6)  # bonus read from the last accepted node's row
    assert infos[0]["target_prob"] == pytest.approx(0.9)


def test_event_tokens_truncated_by_stop_rule():
    ev = hand_trace()[1]
    ev = {**ev, "new_tokens": [7]}  # budget ran out after the first accepted token
    infos = event_tokens(ev)
    assert len(infos) == 1 and infos[0]["kind"] == "draft" and infos[0]["depth"] == 1


def test_tokens_html_spans_classes_and_titles():
    run = hand_run()
    out = tokens_html(run["tokens"], run["pieces"])
    spans = re.findall(r'<span class="([^"]+)"[^>]*title="([^"]+)">([^<]*)</span>', out)
    assert len(spans) == 5
    classes = [s[0] for s in spans]
    assert classes == ["tok tok-bonus", "tok tok-draft d1", "tok tok-draft d2", "tok tok-bonus", "tok tok-bonus"]
    title = spans[2][1]
    assert "step 1" in title and "depth 2" in title and "draft p 0.600" in title and "target p 0.700" in title
    assert "bonus" in spans[3][1]
    assert spans[4][2] == "&lt;b&gt;"  # token text is escaped, never injected
    assert "".join(s[2] for s in spans[:4]) == "Hello, my friend"


def test_deep_drafts_share_the_last_depth_class():
    info = {"kind": "draft", "depth": 11, "step": 3, "draft_prob": 0.5, "target_prob": 0.5}
    assert 'class="tok tok-draft d8"' in render.token_span(info, "x")
    assert "tok-special" in render.token_span({**info, "kind": "bonus", "depth": 0}, "")  # end-of-turn token


def test_legend_lists_every_class():
    out = legend_html()
    assert "tok-bonus" in out and all(f"tok-draft d{d}" in out for d in range(1, 9))
    for d in range(1, 9):
        assert f".tok-draft.d{d}" in render.CSS


def test_token_pieces_decode_in_context():
    merged = {1: "a", 2: "b", 3: "c"}

    def dec(ids):  # a tokenizer that drops a leading space at the start of a text, like SentencePiece
        return "".join(merged[i] for i in ids)

    assert token_pieces([1, 2, 3], dec) == ["a", "b", "c"]
    assert token_pieces([1, 2, 3], dec, start=2) == ["c"]
    assert "".join(token_pieces([5, 6, 7, 8], decode)) == decode([5, 6, 7, 8])


# ----- stats --------------------------------------------------------------------------------------------

def test_generation_stats_and_html():
    st = generation_stats(hand_trace(), wall_time=0.5, plain_tps=5.0)
    assert st["new_tokens"] == 5 and st["steps"] == 3
    assert st["tau"] == pytest.approx(5 / 3)
    assert st["tokens_per_s"] == pytest.approx(10.0) and st["speedup"] == pytest.approx(2.0)
    assert st["mean_drafted"] == pytest.approx(2.5)
    assert st["draft_time"] == pytest.approx(0.08)
    out = stats_html(st, "reference run")
    assert "1.67" in out and "2.00x" in out and "reference run" in out
    assert "n/a" in stats_html(generation_stats(hand_trace(), 0.5))  # no plain speed: no speedup
    assert "generating" in stats_html(st, running=True)


def test_lossless_notes_and_compare_columns():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    ok, note = lossless_note([1, 2], [1, 2], greedy=True)
    assert ok and "✓" in note
    ok, note = lossless_note([1, 2], [1, 3], greedy=True)
    assert not ok and "token 1" in note and "bfloat16" in note
    ok, note = lossless_note([1, 2], [1, 3], greedy=False)
    assert not ok and "random" in note
    out = compare_html([{"title": "plain", "html": "<div>x</div>", "stats": generation_stats(hand_trace(), 1.0),
                         "note": note, "ok": False}, {"title": "moa", "note": "✓ same", "ok": True}])
    assert out.count('class="cmp-col"') == 2 and "cmp-diff" in out and "cmp-ok" in out


# ----- draft tree ---------------------------------------------------------------------------------------

def test_tree_layout_depths_and_leaf_order():
    x, y = tree_layout([-1, 0, 1, -1])
    assert x == [0, 1, 2, 3, 1]
    assert y[3] == 0.0 and y[4] == 1.0  # two leaves in depth-first order
    assert y[0] == pytest.approx(0.5)  # the root sits between its subtrees


def _trace_by_name(fig: go.Figure, name: str):
    return [t for t in fig.data if t.name == name]


def test_tree_figure_marks_accepted_rejected_and_bonus():
    fig = tree_figure(hand_trace()[1], decode, root_token=5)
    acc = _trace_by_name(fig, "accepted draft")[0]
    rej = _trace_by_name(fig, "rejected draft")[0]
    bonus = _trace_by_name(fig, "target's bonus token")[0]
    root = _trace_by_name(fig, "root (last verified token)")[0]
    assert len(acc.x) == 2 and list(acc.x) == [1, 2]
    assert len(rej.x) == 2 and rej.marker.color == render.REJECTED_GREY
    assert acc.marker.color == render.ACCEPTED_GREEN
    assert bonus.marker.symbol == "star"
    assert "friend" in bonus.text[0] and bonus.x[0] == 3  # hangs off the last accepted node (depth 2)
    assert root.text[0] == "Hello"
    assert "target p 0.700" in acc.hovertext[1] and "draft p 0.600" in acc.hovertext[1]
    assert "2 of 4" in fig.layout.title.text
    green_edges = [t for t in fig.data if t.mode == "lines" and t.line.color == render.ACCEPTED_GREEN]
    assert len(green_edges) == 1 and len([v for v in green_edges[0].x if v is not None]) == 4  # two edges


def test_tree_figure_of_an_empty_tree_and_step_helpers():
    fig = tree_figure(hand_trace()[0], decode)
    assert _trace_by_name(fig, "target's bonus token") and not _trace_by_name(fig, "accepted draft")
    assert default_step(hand_trace()) == 1
    assert default_step([hand_trace()[0]]) is None
    assert step_choices(hand_trace()) == [("step 1: 2/4 accepted", 1), ("step 2: 0/1 accepted", 2)]
    assert render.show_token("\n") == "↵" and render.show_token(" ") == "␣" and render.show_token("") == "∅"


def test_tree_tab_view_and_summary():
    from demo import tab_tree

    run = hand_run()
    assert tab_tree.root_token(run, 1) == 5 and tab_tree.root_token(run, 2) == 11
    fig, md = tab_tree.tree_view(run, 1, decode)
    assert _trace_by_name(fig, "accepted draft")
    assert "`,` ` my`" in md and "friend" in md and "3 tokens" in md
    fig, md = tab_tree.tree_view(None, None, decode)
    assert "Generate" in fig.layout.annotations[0].text and md == ""
    fig, _ = tab_tree.tree_view(hand_run([hand_trace()[0]], "ar"), None, decode)
    assert "drafted nothing" in fig.layout.annotations[0].text


# ----- LSA ----------------------------------------------------------------------------------------------

def test_lsa_matrices_heatmap_and_bar():
    mats, meta = lsa_matrices(hand_trace())
    assert mats.shape == (5, 3, 3)
    assert [m["step"] for m in meta] == [1, 1, 2, 2, 2] and meta[1]["token"] == 7
    np.testing.assert_allclose(mats.sum(-1), 1.0, atol=1e-3)
    recv = lsa_received(mats.mean(0))
    assert recv.argmax() == 2 and recv.sum() == pytest.approx(1.0, abs=1e-3)
    heat = lsa_heatmap(mats[0], "t")
    assert isinstance(heat.data[0], go.Heatmap) and np.asarray(heat.data[0].z).shape == (3, 3)
    bar = lsa_bar(recv)
    assert isinstance(bar.data[0], go.Bar) and len(bar.data[0].y) == 3
    assert lsa_matrices(hand_trace()[:1]) == (None, [])


def test_lsa_matrices_average_heads():
    ev = {"step": 1, "extras": {"lsa_attention": np.ones((2, 4, 3, 3)).tolist(), "lsa_tokens": [1, 2]}}
    mats, _ = lsa_matrices([ev])
    assert mats.shape == (2, 3, 3)


def test_lsa_tab_view():
    from demo import tab_lsa

    run = hand_run()
    assert tab_lsa.has_lsa(run) and not tab_lsa.has_lsa(hand_run([hand_trace()[0]]))
    heat, bar, caption = tab_lsa.lsa_view(run, tab_lsa.AVERAGE, decode)
    assert "averaged over 5" in heat.layout.title.text and "layer 2" in caption
    heat, _, _ = tab_lsa.lsa_view(run, 1, decode)
    assert "','" in heat.layout.title.text and "step 1" in heat.layout.title.text
    choices = tab_lsa.lsa_token_choices(lsa_matrices(run["events"])[1], decode)
    assert choices[0][1] == tab_lsa.AVERAGE and len(choices) == 6
    heat, _, _ = tab_lsa.lsa_view(None, None, decode)
    assert "moa" in heat.layout.annotations[0].text


# ----- TLI ----------------------------------------------------------------------------------------------

def test_tli_table_layouts_and_figure(tmp_path):
    from demo import tab_tli

    assert tab_tli.load_tli_table(tmp_path) == []
    (tmp_path / "a.json").write_text(json.dumps({"rows": [{"tli": 3, "tau": 2.1, "draft_ms": 9.0, "speedup": 1.1},
                                                          {"tli": 0, "mean_accepted": 1.5, "speedup": 1.2}]}))
    (tmp_path / "b.json").write_text(json.dumps([{"N": 1, "tau": 1.9, "draft_time": 0.5, "steps": 100}]))
    (tmp_path / "bad.json").write_text("{not json")
    rows = tab_tli.load_tli_table(tmp_path)
    assert [r["N"] for r in rows] == [0, 1, 3]
    assert rows[0]["tau"] == 1.5 and rows[1]["draft_ms_per_step"] == pytest.approx(5.0)
    fig = tab_tli.tli_figure(rows, [{"N": 1, "tau": 1.0, "draft_ms_per_step": 3.0, "speedup": 0.8}])
    names = {t.name for t in fig.data}
    assert names == {"committed benchmark", "live runs (this machine)"}
    assert len(fig.data) == 6
    assert "| N |" in tab_tli.table_markdown(rows)
    empty = tab_tli.tli_figure([], [])
    assert "live" in empty.layout.annotations[0].text
    plain, moa = hand_run(method="ar"), hand_run()
    plain["stats"] = {**plain["stats"], "tokens_per_s": 5.0}
    moa["stats"] = {**moa["stats"], "tokens_per_s": 10.0}
    row = tab_tli.live_row(plain, moa, 1)
    assert row["speedup"] == 2.0 and row["N"] == 1 and row["draft_ms_per_step"] == pytest.approx(40.0)


# ----- benchmarks ---------------------------------------------------------------------------------------

def test_benchmarks_without_results(tmp_path):
    from demo import tab_benchmarks

    view = tab_benchmarks.benchmark_view(tmp_path)
    assert not view["has_results"] and "No committed results yet" in view["intro"]
    assert "make bench" in view["intro"] and view["summary_path"] is None


def _summary() -> dict:
    def res(tau, tps, sp, ideal, acc, cats):
        return {"overall": {"tau": tau, "tokens_per_s": tps, "speedup": sp, "ideal_speedup": ideal,
                            "acceptance_by_position": acc, "mean_tree_nodes": 24.0 if acc else 0.0},
                "by_category": {c: {"tau": t} for c, t in cats.items()}}

    return {"config": {"dtype": "bfloat16", "threads": 2, "started": 1796182935.8, "methods": ["ar", "moa"],
                       "command": "python -m analysis.bench --methods ar,moa"},
            "categories": ["coding", "writing"],
            "methods": {"ar": res(1.0, 20.0, 1.0, 1.0, [], {"coding": 1.0, "writing": 1.0}),
                        "moa": res(2.4, 30.0, 1.5, 2.0, [0.7, 0.4, 0.2, 0.1], {"coding": 2.8, "writing": 1.9})}}


def test_benchmarks_at_a_glance(tmp_path):
    from demo import tab_benchmarks

    (tmp_path / "summary.json").write_text(json.dumps(_summary()))
    view = tab_benchmarks.benchmark_view(tmp_path)
    assert view["has_results"] and view["summary_path"].endswith("summary.json")
    rows = tab_benchmarks.compact_rows(_summary())
    moa = rows[1]
    assert (moa["method"], moa["tau"], moa["acc@1"], moa["acc@3"], moa["tokens/s"], moa["speedup"]) == \
        ("moa", 2.4, 0.7, 0.2, 30.0, 1.5)
    assert moa["share of ideal"] == pytest.approx(0.75) and rows[0]["acc@1"] is None  # computed: an old summary
    own = _summary()
    own["methods"]["moa"]["overall"]["share_of_ideal"] = 0.8  # the decoding phase's, written by analysis.metrics
    assert tab_benchmarks.compact_rows(own)[1]["share of ideal"] == 0.8
    table = view["table"]
    assert table.count("<tr>") == 3 and "<td>75%</td>" in table and "2.00x" in table and "–" in table
    head = view["headline"]
    names = [t.name for t in head.data]
    assert "ideal, GPU cost model (= tau)" in names and "plain decoding (1.0x)" in names and "moa" in names
    hollow = [t for t in head.data if t.mode == "markers" and t.marker.color == "white"]
    assert len(hollow) == 1 and list(hollow[0].y) == [2.0] and list(hollow[0].x) == [2.4]  # ar has no ideal marker
    heat = view["heatmap"].data[0]
    assert list(heat.y) == ["moa"] and list(heat.x) == ["coding", "writing"] and heat.z[0] == [2.8, 1.9]
    assert "python -m analysis.bench --methods ar,moa" in view["config"]
    assert "started" not in view["config"] and "| dtype | bfloat16 |" in view["config"]  # no epoch timestamps
    assert "No committed TLI" in view["tli"].layout.annotations[0].text  # the folder has no tli.json
    assert "No committed weight-traffic" in view["weights"].layout.annotations[0].text


def test_benchmarks_without_pass_timings_say_so(tmp_path):
    from demo import tab_benchmarks

    summary = _summary()
    for res in summary["methods"].values():
        res["overall"]["ideal_speedup"] = None
    out = tab_benchmarks.table_html(tab_benchmarks.compact_rows(summary))
    assert "no per-pass timings" in out and "–x" in out


def test_the_committed_benchmark_renders():
    from demo import tab_benchmarks

    view = tab_benchmarks.benchmark_view()
    assert view["has_results"] and "tau" in view["intro"]
    assert view["table"].count("<tr>") >= 3
    assert isinstance(view["tli"].data[0], go.Bar) and view["copying"].data
    assert "moa" in list(view["weights"].data[0].x)  # the committed weight-traffic profile


# ----- draft failures (against a stand-in for analysis.failures with the agreed API) --------------------

def fake_failures_module():
    m = types.ModuleType("analysis.failures")

    def token_kind(text):
        return "punct" if text.strip() in {",", "!"} else "word"

    def tested_nodes(trace, decode=None):
        out = []
        for e in trace["events"]:
            parents = e["tree"]["parents"]
            ok_rows = {-1} | set(e["accepted"])
            for i, p in enumerate(parents):
                if p in ok_rows:
                    out.append({"step": e["step"], "node": i, "depth": e["depths"][i], "accepted": i in e["accepted"],
                                "draft_prob": e["tree"]["draft_probs"][i], "token": e["tree"]["tokens"][i],
                                "kind": token_kind(decode([e["tree"]["tokens"][i]])) if decode else None})
        return out

    def rejections(trace, decode):
        recs = []
        for n in tested_nodes(trace):
            if n["accepted"]:
                continue
            e = trace["events"][n["step"]]
            parent = e["tree"]["parents"][n["node"]]
            top = e["row_top"][parent + 1]
            recs.append({"step": n["step"], "depth": n["depth"], "node": n["node"], "draft_token": n["token"],
                         "draft_text": decode([n["token"]]), "target_token": top[0][0],
                         "target_text": decode([top[0][0]]), "draft_prob": n["draft_prob"],
                         "target_prob_of_draft": e["node_target_prob"][n["node"]],
                         "target_entropy": e["row_entropy"][parent + 1], "kind": token_kind(decode([n["token"]])),
                         "target_top": top, "draft_top": []})
        return recs

    def acceptance_by_kind(nodes):
        assert all(n["kind"] for n in nodes)  # kinds need the decoder passed to tested_nodes
        return {"word": 0.5}

    def acceptance_by_depth(nodes):
        return {1: 0.5}

    def calibration(nodes, bins=10):
        return {"bins": bins, "n": len(nodes)}

    def figure(title):
        f = go.Figure()
        f.update_layout(title=title)
        return f

    m.token_kind = token_kind
    m.tested_nodes = tested_nodes
    m.rejections = rejections
    m.acceptance_by_kind = acceptance_by_kind
    m.acceptance_by_depth = acceptance_by_depth
    m.calibration = calibration
    m.calibration_figure = lambda calib: figure(f"calibration n={calib['n']}")
    m.acceptance_bar = lambda data, title: figure(title)
    m.topk_comparison_figure = lambda record, decode: figure(f"top-k {record['draft_text']} vs "
                                                             f"{record['target_text']}")
    m.target_rank_by_depth = lambda traces: {1: {"positions": len(traces)}}
    m.rank_figure = lambda by_method: figure(f"ranks {sorted(by_method)} {list(by_method.values())}")
    return m


def test_failures_analysis_filters_and_topk(tmp_path):
    from demo import tab_failures

    fm = fake_failures_module()
    traces = [hand_run(), hand_run()]
    res = tab_failures.analyse(traces, decode, fm)
    recs = res["records"]
    # step 1: nodes 0, 1 accepted; 2 (child of accepted 1) and 3 (root child) rejected; step 2: node 0 rejected
    assert len(recs) == 6 and [r["#"] for r in recs] == list(range(6))
    assert {r["trace"] for r in recs} == {0, 1}
    assert "10 drafted tokens" in res["summary"] and "6 of them rejected" in res["summary"]
    assert res["by_kind"].layout.title.text == "Acceptance rate by token kind"
    assert res["calibration"].layout.title.text == "calibration n=10"
    assert res["ranks"].layout.title.text == "ranks ['moa'] [{1: {'positions': 2}}]"  # one group per method
    deep = tab_failures.filter_records(recs, "3", tab_failures.ALL)
    assert len(deep) == 2 and all(r["depth"] == 3 for r in deep)
    punct = tab_failures.filter_records(recs, tab_failures.ALL, "punct")
    assert [r["draft_text"] for r in punct] == ["!", "!"]
    depths, kinds = tab_failures.filter_choices(recs)
    assert depths == ["all", "1", "3"] and kinds == ["all", "punct", "word"]
    table = tab_failures.records_table(recs)
    assert list(table.columns) == tab_failures.TABLE_COLUMNS and len(table) == 6
    fig = tab_failures.topk_view(recs, 0, decode, fm)
    assert fig.layout.title.text == "top-k  dear vs  friend"
    assert "No rejection" in tab_failures.topk_view(recs, 99, decode, fm).layout.annotations[0].text


def test_failures_without_traces():
    from demo import tab_failures

    res = tab_failures.analyse([], decode, fake_failures_module())
    assert "No traces" in res["summary"] and res["records"] == []


def test_committed_traces_are_read_with_their_token_text(tmp_path):
    from demo import tab_failures

    run = hand_run()
    line = {"method": "moa", "question_id": 1, "events": run["events"], "token_text": {"9": " DEAR"}}
    with gzip.open(tmp_path / "moa.jsonl.gz", "wt") as f:
        f.write(json.dumps(line) + "\n" + json.dumps(line) + "\n")
    traces = tab_failures.load_committed_traces(tmp_path, limit=1)
    assert len(traces) == 1 and traces[0]["source_file"] == "moa.jsonl.gz"
    recs, _ = tab_failures.gather(traces, None, fake_failures_module())
    assert recs[0]["draft_text"] == " DEAR"  # decoded from the trace's own table, no tokenizer needed


# ----- generate tab helpers, the runtime and the Blocks (tiny target) -----------------------------------

@pytest.fixture(scope="module")
def tiny_runtime():
    from demo.runtime import Runtime

    return Runtime(tiny=True, reference_tokens=4)


def test_generate_tab_helpers(tiny_runtime):
    from demo import tab_generate
    from demo.runtime import UserError

    conv = [{"role": "user", "content": "hi"}]
    assert tab_generate.chat_view(conv, "") == conv + [{"role": "assistant", "content": "…"}]
    with pytest.raises(UserError, match="Type a message"):
        tab_generate.check_message("   ")
    with pytest.raises(UserError, match="limit"):
        tab_generate.check_message("x" * (tab_generate.MAX_MESSAGE_CHARS + 1))
    name = tab_generate.method_name(tiny_runtime, "moa", 1)  # the picker and the TLI radio make one name
    assert name == "moa-tli1" and tab_generate.method_name(tiny_runtime, "eagle2+lookup", 3) == "eagle2+lookup"
    assert "untrained drafter: tau near 1" in tab_generate.note_html(tiny_runtime, name)
    assert tab_generate.note_html(tiny_runtime, "ar") == ""
    with pytest.raises(UserError, match="Unknown method"):
        tab_generate.method_name(tiny_runtime, "moa", 2)  # no shipped moa-tli2
    plain, spec = hand_run(method="ar"), hand_run()
    col = tab_generate.run_column(spec, plain)
    assert col["ok"] and "identical" in col["note"] and "tok-draft d2" in col["html"]


def test_runtime_streams_runs_and_checks_limits(tiny_runtime):
    from demo.runtime import UNTRAINED_NOTE, UserError, run_summary, trace_for_download

    ids = tiny_runtime.prompt_ids("hello")
    assert tiny_runtime.plain_tps and tiny_runtime.plain_tps > 0  # the reference run happened on load
    done_flags, sizes = [], []
    for run in tiny_runtime.stream("pld", ids, 12):  # one dict, updated in place after every target pass
        done_flags.append(run["done"])
        sizes.append(len(run["token_ids"]))
    assert done_flags[-1] and not any(done_flags[:-1]) and sizes == sorted(sizes) and sizes[-1] <= 12
    assert len(run["tokens"]) == len(run["pieces"]) == len(run["token_ids"])
    assert run["stats"]["new_tokens"] == len(run["token_ids"])
    html_out = tokens_html(run["tokens"], run["pieces"])
    assert html_out.count("<span") == len(run["token_ids"])
    sampled = tiny_runtime.generate("pld", ids, 6, temperature=0.8)
    assert not sampled["greedy"] and 1 <= len(sampled["token_ids"]) <= 6
    summary = run_summary(run)
    assert {"text", "token_ids", "mean_accepted", "tokens_per_s"} <= set(summary)
    json.dumps(trace_for_download(run))
    moa = tiny_runtime.generate("moa", ids, 6, tli=1)
    assert moa["note"].startswith(UNTRAINED_NOTE) and moa["tli"] == 1 and moa["method"] == "moa-tli1"
    assert moa["label"].endswith(", N=1") and tiny_runtime.generate("moa-tli1", ids, 6)["tli"] == 1  # one name
    assert any("lsa_attention" in (e.get("extras") or {}) for e in moa["events"])
    from demo.runtime import LOOKUP_NOTE

    looked = tiny_runtime.generate("medusa+lookup", ids, 8)  # the drafter plus a context-lookup branch
    assert LOOKUP_NOTE in looked["note"] and looked["token_ids"] == tiny_runtime.generate("ar", ids, 8)["token_ids"]
    assert ("Medusa + context lookup (medusa+lookup) · untrained", "medusa+lookup") in tiny_runtime.methods()
    for bad, msg in [(0, "between 1 and"), (10**6, "between 1 and"), ("x", "whole number"), (2.5, "whole number"),
                     (True, "whole number")]:
        with pytest.raises(UserError, match=msg):
            list(tiny_runtime.stream("ar", ids, bad))
    with pytest.raises(UserError, match="Unknown method"):
        list(tiny_runtime.stream("nope", ids, 4))
    with pytest.raises(UserError, match="empty"):
        tiny_runtime.prompt_ids("  ")
    with pytest.raises(UserError, match="Clear the chat"):
        tiny_runtime.prompt_ids("x" * 5000)


def test_friendly_errors_hide_tracebacks():
    import gradio as gr

    from demo.common import friendly
    from demo.runtime import UserError

    @friendly
    def user_problem():
        raise UserError("Type a message first.")

    @friendly
    def bug():
        raise KeyError("oops")

    @friendly
    def gen_bug():
        yield 1
        raise RuntimeError("deep\ninside")

    with pytest.raises(gr.Error, match="Type a message first"):
        user_problem()
    with pytest.raises(gr.Error) as info:
        bug()
    assert "KeyError" in str(info.value) and "Traceback" not in str(info.value)
    g = gen_bug()
    assert next(g) == 1
    with pytest.raises(gr.Error, match="RuntimeError: deep") as info:
        next(g)
    assert "inside" not in str(info.value)


def test_app_builds_every_tab(tiny_runtime):
    import app

    demo = app.build_app(tiny_runtime)
    labels = [b.label for b in demo.blocks.values() if b.get_block_name() == "tabitem"]
    assert labels == [mod.TITLE for mod in app.TABS]
    assert labels[:2] == ["Generate", "Step by step"] and labels[-1] == "Benchmarks"
    api_names = [d.api_name for d in demo.fns.values() if d.api_visibility == "public"]
    assert api_names == ["generate"]
    for mod in app.TABS:
        assert mod.TITLE and callable(mod.build)
        if mod.__name__ != "demo.tab_client_server":
            assert len(getattr(mod, "EXPLANATION", "")) > 200  # every tab explains itself


def test_generate_tab_handlers_name_their_updates(tiny_runtime):
    """The Generate tab's handlers return {component: update} (Gradio leaves the rest as it is), run through
    Gradio's own processing: one method name (MoA with the TLI radio's N), the session and the download."""
    import asyncio

    from gradio.state_holder import SessionState

    import app
    from demo.common import new_session

    demo = app.build_app(tiny_runtime)
    fns = {getattr(fn.fn, "__name__", None): fn for fn in demo.fns.values() if fn.fn is not None}

    async def run(name: str, inputs: list) -> tuple[SessionState, list[list]]:
        state, outs, it = SessionState(demo), [], None
        while True:
            out = await demo.process_api(block_fn=fns[name], inputs=inputs, state=state, iterator=it, request=None)
            outs.append(out["data"])
            it = out.get("iterator")
            if it is None or not out.get("is_generating"):
                return state, outs

    state, outs = asyncio.run(run("on_send", ["hello there", "moa", 1, 0.0, 8, new_session()]))
    ids = [o.elem_id for o in fns["on_send"].outputs]
    first, last = dict(zip(ids, outs[0])), dict(zip(ids, outs[-2]))  # the last data is the end of iteration
    assert first["prompt-box"] == "" and "waiting for the first token" in first["token-stream"]
    assert "untrained" in outs[1][ids.index("drafter-note")]
    assert last["download-trace"]["value"]["path"].endswith(".json") and last["gen-lsa"]["visible"]
    session = state[fns["on_send"].outputs[-1]._id]
    assert session["runs"][0]["method"] == "moa-tli1" and session["conversation"][-1]["role"] == "assistant"
    _, outs = asyncio.run(run("on_method", ["eagle2", 1]))
    assert outs[0][0]["visible"] is False and "untrained" in outs[0][1]


def test_the_page_opens_on_the_shipped_example(tiny_runtime):
    import app
    from demo import lessons

    shipped = lessons.load_lessons()
    demo = app.build_app(tiny_runtime)
    html_values = [b.value for b in demo.blocks.values() if b.get_block_name() == "html" and b.value]
    stream = [v for v in html_values if 'class="tok-stream"' in v and "tok-draft" in v]
    assert stream, "the Generate tab shows the example's coloured tokens"
    plots = {b.elem_id: b for b in demo.blocks.values() if b.get_block_name() == "plot"}
    assert plots["gen-tree"].value and plots["gen-lsa"].visible  # the example's draft tree and LSA map
    states = [b for b in demo.blocks.values() if b.get_block_name() == "state" and isinstance(b.value, dict)
              and "runs" in b.value]
    assert states[0].value["runs"][0]["text"] == shipped[0]["text"]
    assert not tiny_runtime.loaded or tiny_runtime.tiny  # nothing above needed the target


def test_failures_tab_with_the_real_analysis_module():
    fm = pytest.importorskip("analysis.failures")
    from demo import tab_failures

    res = tab_failures.analyse([hand_run()], decode, fm)
    recs = res["records"]
    assert [(r["step"], r["depth"], r["draft_text"]) for r in recs] == [(1, 3, " dear"), (1, 1, "!"), (2, 1, "\n")]
    assert recs[0]["target_text"] == " friend"
    assert all(isinstance(f, go.Figure) for f in (res["by_kind"], res["by_depth"], res["calibration"], res["ranks"]))
    kinds = [str(x) for x in res["by_kind"].data[0].x]
    assert "None" not in kinds  # token kinds were labelled with the decoder
    assert isinstance(tab_failures.topk_view(recs, 0, decode, fm), go.Figure)


# ----- every tab opens on a recorded example: Client-server and Draft failures ------------------------------

def _blocks(demo, name: str) -> dict:
    return {b.elem_id: b for b in demo.blocks.values() if b.get_block_name() == name and b.elem_id}


def cs_run(method: str, ids: list[int], offline: int = 0, confirmed: int = 0, stops=(), cut: float = 0.1,
           drop=((1.0, 3.0),)) -> dict:
    """A hand-made client-server run (RunResult.to_dict()'s fields the tab reads)."""
    info = [{"status": "verified", "t": 0.1 * i, "seq": i} for i in range(len(ids))]
    if offline:
        info[1] = {"status": "confirmed", "t": 3.1, "seq": 2}
        info[2] = {"status": "corrected", "t": 3.1, "seq": 2, "withdrawn": [9, 10]}
    snaps = [{"t": 3.0, "verified": ids[:1], "provisional": [ids[1], 9, 10]}] if offline else []
    return {"method": method, "token_ids": list(ids), "token_info": info, "offline_tokens": offline,
            "confirmed_tokens": confirmed, "corrected_tokens": offline - confirmed,
            "disconnects": [list(w) for w in drop], "offline_horizon": 14, "offline_min_confidence": cut,
            "offline_stops": list(stops), "unverified": [], "trace": {"snapshots": snaps},
            "tokens_per_s": 10.0, "virtual_time_s": 1.0, "server_calls": 5, "bytes_up": 100, "bytes_down": 200,
            "tau": 1.5, "note": "", "dtype": "float32"}


def test_client_server_offline_sentence_says_what_moa_wrote_and_why():
    from demo import tab_client_server as tab

    facts = {"top1_by_distance": [0.43, 0.30, 0.52], "expected_confirmed_per_drop": 0.78}
    stop = {"t": 1.2, "reason": "confidence", "provisional": 3, "verified": 4}
    moa = cs_run("moa", [5, 6, 7, 8], offline=3, confirmed=1, stops=[stop])
    text = tab.offline_sentence([cs_run("ar", [5, 6, 7, 8]), moa], facts)
    assert "MoA wrote 3 tokens on its own, and the server confirmed 1 of them</b> (2 withdrawn)" in text
    assert "cut-off of 0.1" in text and "30% to 52%" in text and "0.78" in text
    assert f'href="#{tab.BOUND_ID}"' in text and "Lower the cut-off" in text
    horizon = cs_run("moa", [5, 6, 7, 8], offline=3, confirmed=0, cut=0.0,
                     stops=[{**stop, "reason": "horizon"}])
    text = tab.offline_sentence([horizon])
    assert "14 tokens past the last verified one" in text and "cut-off at 0" in text and "href" not in text
    one = cs_run("moa", [5, 6, 7, 8], offline=1, confirmed=0, stops=[stop])
    assert "wrote 1 token on its own, and the server confirmed none of it</b> (1 withdrawn)" in \
        tab.offline_sentence([one])
    assert "nothing offline" in tab.offline_sentence([cs_run("moa", [5, 6], drop=())])
    assert "Pick <b>All three</b>" in tab.offline_sentence([cs_run("ar", [5, 6])])


def test_client_server_texts_mark_where_a_text_departs_from_plain_decoding():
    from demo import tab_client_server as tab

    same = [cs_run("ar", [5, 6, 7, 8]), cs_run("moa", [5, 6, 7, 8], offline=3, confirmed=1)]
    assert "All methods wrote exactly the same final text (float32)." in tab.summary_markdown(same)
    page = tab.texts_html(same, decode)
    assert page.count('class="tok-stream"') == 2 and "outline" not in page
    assert '#868e96" title="provisional text withdrawn at 3.10 s"> dear!</s>' in page  # struck through
    differ = [cs_run("ar", [5, 6, 7, 8]), cs_run("eagle2", [5, 6, 9, 8])]
    md = tab.summary_markdown(differ)
    assert "⚠" in md and "EAGLE-2 from token 2" in md and "please report it" in md
    page = tab.texts_html(differ, decode)
    assert page.count("outline:2px") == 1 and "first token that differs" in page


def test_the_recorded_client_server_example():
    from demo import tab_client_server as tab
    from demo.runtime import UNTRAINED_NOTE

    ex = tab.load_example()
    assert ex is not None, f"record it: {tab.RECORD_COMMAND}"
    assert ex["dtype"] == tab.EXACT_DTYPE == "float32" and ex["settings"] == tab.DEFAULTS
    runs = ex["runs"]
    assert [r["method"] for r in runs] == ["ar", "eagle2", "moa"]
    assert len({tuple(r["token_ids"]) for r in runs}) == 1  # float32: the tab's sentence about the texts holds
    assert not any(n.startswith(UNTRAINED_NOTE) for n in ex["drafters"].values())  # the shipped drafters
    assert runs[2]["disconnects"] == [[1.0, 3.0]] and runs[2]["offline_stops"]
    assert {str(t) for t in tab.example_token_ids(runs)} <= set(ex["token_text"])
    assert all(len(r["pieces"]) == len(r["token_ids"]) for r in runs)
    assert "session" not in ex["source"] and "phase" not in ex["source"]


def test_the_record_command_writes_an_example_the_tab_reads(tmp_path):
    import importlib.util

    from demo import tab_client_server as tab

    spec = importlib.util.spec_from_file_location("record_client_server",
                                                  tab.ROOT / "scripts" / "record_client_server.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "example.json"
    assert script.main(["--tiny", "--out", str(out)]) == 0
    ex = tab.load_example(out)
    assert [r["method"] for r in ex["runs"]] == ["ar", "eagle2", "moa"] and ex["dtype"] == "float32"
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="bad.json"):
        tab.load_example(tmp_path / "bad.json")
    assert tab.load_example(tmp_path / "missing.json") is None


def test_client_server_and_failures_tabs_open_on_recorded_examples(tiny_runtime):
    import app

    demo = app.build_app(tiny_runtime)
    plots, htmls, mds = _blocks(demo, "plot"), _blocks(demo, "html"), _blocks(demo, "markdown")
    # Client-server: the recorded run's table, both plots and the three texts, marked as a recorded example
    assert "Recorded example" in htmls["cs-example-note"].value
    assert "All methods wrote exactly the same final text (float32)." in mds["cs-summary"].value
    assert "While the link was down MoA" in htmls["cs-offline"].value
    assert htmls["cs-texts"].value.count('class="tok-stream"') == 3
    for key in ("cs-tokens", "cs-timeline"):
        assert plots[key].value and "Press Run" not in json.dumps(plots[key].value)
    assert _blocks(demo, "dropdown")["cs-timeline-method"].value == "moa"
    # Draft failures: the committed traces, analysed
    assert "Recorded example" in mds["fail-summary"].value and "trace(s)" in mds["fail-summary"].value
    table = _blocks(demo, "dataframe")["fail-table"].value
    assert len(table["data"]) > 100
    for key in ("fail-kind", "fail-depth", "fail-calibration", "fail-ranks", "fail-topk"):
        assert plots[key].value, key
    assert not tiny_runtime.loaded or tiny_runtime.tiny  # nothing above needed the target


def test_the_header_says_where_the_drafters_come_from(monkeypatch):
    from demo.runtime import Runtime

    rt = Runtime(tiny=True)
    assert "drafters: random (tiny mode)" in rt.describe()
    monkeypatch.setenv("SPECLENS_DRAFTER_EAGLE2", "/my/eagle")
    assert "eagle2 from /my/eagle (SPECLENS_DRAFTER_EAGLE2)" in rt.describe()
