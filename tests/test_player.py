"""The step-by-step player, shipped lessons, the cost curve, compare mode's explanation and the load status.

Pure functions on hand-made traces (tests/test_app_render.py's), the committed lesson, and the tiny target.
"""

from __future__ import annotations

import json
import time

import numpy as np
import plotly.graph_objects as go
import pytest

from demo import lessons, tab_player
from demo.render import divergence_html, generation_stats, speed_context, token_row, top2_at
from tests.test_app_render import decode, hand_run, hand_trace

# ----- the player ---------------------------------------------------------------------------------------------


def test_node_verdicts_accepted_rejected_and_not_reached():
    v = tab_player.node_verdicts(hand_trace()[1])  # nodes 0 -> 1 -> 2 and 3 under the root; 0, 1 accepted
    assert [x["verdict"] for x in v] == ["accepted", "accepted", "rejected", "rejected"]
    assert [x["depth"] for x in v] == [1, 2, 3, 1]
    assert v[2]["wanted"] == 11 and v[3]["wanted"] == 7  # the target's top-1 at each parent's row
    assert v[1]["target_prob"] == pytest.approx(0.7) and v[1]["draft_prob"] == pytest.approx(0.6)
    deep = {**hand_trace()[1], "accepted": [3]}  # the root's other child accepted: node 1 is never reached
    assert [x["verdict"] for x in tab_player.node_verdicts(deep)] == ["rejected", "not reached", "not reached",
                                                                      "accepted"]


def test_player_view_tells_one_cycle():
    run = hand_run()
    assert tab_player.cycles(run) == [1, 2]
    view = tab_player.player_view(run, 1, decode)
    story = view["story"]
    assert "Cycle 1 of 2" in story and "proposed 4 tokens" in story and "2 of 4 accepted" in story
    assert "` friend`" in story  # the bonus token
    assert "Kept the root and 2 accepted rows; dropped 2 rejected rows" in story
    assert "4 tokens / 2 passes = 2.00" in story  # running tau after the prefill and this cycle
    assert isinstance(view["tree"], go.Figure) and "2 of 4" in view["tree"].layout.title.text
    assert view["verdicts"].count("<tr") == 5 and "target wanted" in view["verdicts"]
    assert view["text"].count("tok-now") == 3 and view["text"].count("<span") == 4  # prefill token + this cycle
    assert isinstance(view["lsa"], go.Figure)  # MoA: the map of the tokens this cycle verified (event 2's)
    assert "3 tokens verified" in view["lsa"].layout.title.text
    last = tab_player.player_view(run, 2, decode)
    assert "Cycle 2 of 2" in last["story"] and "0 of 1 accepted" in last["story"]
    assert "5 tokens / 3 passes = 1.67" in last["story"]
    assert "no more verified tokens" in last["lsa"].layout.annotations[0].text
    assert tab_player.player_view(run, 99, decode)["step"] == 1  # an unknown step falls back to the first
    assert tab_player.player_view(hand_run(method="eagle2"), 1, decode)["lsa"] is None  # LSA only for MoA
    none = tab_player.player_view(None, None, decode)
    assert none["story"] == tab_player.NO_RUN and none["steps"] == []
    plain = tab_player.player_view(hand_run([hand_trace()[0]], "ar"), None, decode)
    assert "no verification cycles" in plain["story"]


def test_player_sources_list_lessons_then_the_users_runs():
    shipped = [hand_run()]
    shipped[0]["title"] = "demo"
    session = {"runs": [{**hand_run(), "example": True}, hand_run(method="eagle2"),
                        hand_run([hand_trace()[0]], "ar")]}
    choices = tab_player.source_choices(session, shipped)
    assert [c[1] for c in choices] == ["lesson:0", "run:1"]  # the example and a plain run are not listed
    assert tab_player.pick(session, shipped, "run:1")["method"] == "eagle2"
    assert tab_player.pick(session, shipped, "lesson:0") is shipped[0]
    assert tab_player.pick(session, shipped, "run:7") is None and tab_player.pick(session, shipped, None) is None


# ----- lessons ------------------------------------------------------------------------------------------------

def test_lesson_round_trip(tmp_path):
    run = hand_run()
    run.update(tli=1, target="hand", dtype="float32", wall_time=1.0, stop_reason="eos", prompt_ids=[1, 2])
    lesson = lessons.lesson_from_run(run, decode, "hand lesson", "say hello")
    assert lesson["format"] == lessons.FORMAT and lesson["prompt"] == "say hello"
    assert lesson["token_text"]["9"] == " dear" and "12" in lesson["token_text"]
    ev = lesson["events"][1]
    assert all(len(row) <= lessons.TOP_KEPT for row in ev["row_top"]) and "depths" not in ev
    assert len(ev["extras"]["lsa_attention"]) == 3  # one 3x3 map per cycle, averaged over its tokens
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(lesson))
    back = lessons.load_lesson(path)
    assert back["example"] and back["token_ids"] == run["token_ids"] and len(back["tokens"]) == 5
    dec = lessons.decoder(back)
    assert dec([5, 6]) == "Hello world" and dec([999]) == "<999>"
    view = tab_player.player_view(back, 1, dec)
    assert "2 of 4 accepted" in view["story"] and view["lsa"] is not None
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a SpecLens lesson"):
        lessons.load_lesson(tmp_path / "bad.json")


def test_the_shipped_lesson_replays_every_cycle_without_a_model():
    shipped = lessons.load_lessons()
    assert shipped, "assets/lessons/ ships at least one lesson"
    run = shipped[0]
    assert run["method"].startswith("moa") and run["text"].strip()
    dec = lessons.decoder(run)
    steps = tab_player.cycles(run)
    assert len(steps) >= 5
    for s in steps:
        view = tab_player.player_view(run, s, dec)
        assert view["step"] == s and "Running tau" in view["story"]
        assert "<" not in dec(run["events"][s]["tree"]["tokens"])  # every token has its text in the lesson
    assert tab_player.player_view(run, steps[0], dec)["lsa"] is not None
    assert sum(len(e["new_tokens"]) for e in run["events"]) == len(run["token_ids"])
    assert max(len(p.read_bytes()) for p in lessons.lesson_files()) < 400_000  # small enough to commit


# ----- compare mode -------------------------------------------------------------------------------------------

def test_token_row_and_top2():
    events = hand_trace()
    assert token_row(events, 0)[1] == 0  # the prefill's token: the root row
    assert token_row(events, 1)[1] == 0 and token_row(events, 2)[1] == 1  # accepted nodes 0, 1
    assert token_row(events, 3)[1] == 2  # the bonus after node 1
    assert token_row(events, 4)[0]["step"] == 2 and token_row(events, 9) is None
    assert top2_at(hand_run(), 2) == [(8, 0.7), (9, 0.2)]


def _diverging(p_top, q_top, dtype="bfloat16"):
    plain, spec = hand_run(method="ar"), hand_run()
    spec["token_ids"] = list(spec["token_ids"])
    spec["token_ids"][2] = 9  # differs at token 2, predicted at row 1 of step 1
    for run, top in ((plain, p_top), (spec, q_top)):
        run["events"] = json.loads(json.dumps(run["events"]))
        run["events"][1]["row_top"][1] = top
        run["dtype"] = dtype
    return plain, spec


def test_divergence_explains_a_bf16_near_tie_with_numbers():
    plain, spec = _diverging([[8, 0.412], [9, 0.409]], [[9, 0.411], [8, 0.410]])
    out = divergence_html(plain, spec, decode)
    assert "token 2" in out and "' my'" in out and "' dear'" in out
    assert "0.4120" in out and "0.4090" in out and "0.4110" in out
    assert "near tie" in out and "Not a bug" in out and "exact (float32)" in out
    far, spec_far = _diverging([[8, 0.9], [9, 0.05]], [[9, 0.6], [8, 0.3]])
    assert "near tie" not in divergence_html(far, spec_far, decode)
    f32, spec32 = _diverging([[8, 0.412], [9, 0.409]], [[9, 0.411], [8, 0.410]], dtype="float32")
    assert "unexpected" in divergence_html(f32, spec32, decode)
    assert divergence_html(hand_run(), hand_run(), decode) == ""


def test_compare_column_carries_the_explanation():
    from demo import tab_generate

    plain, spec = _diverging([[8, 0.412], [9, 0.409]], [[9, 0.411], [8, 0.410]])
    col = tab_generate.run_column(spec, plain, decode)
    assert not col["ok"] and "near tie" in col["why"]
    assert "why" not in tab_generate.run_column(hand_run(), hand_run(method="ar"), decode)


# ----- cost curve and ideal speedup ---------------------------------------------------------------------------

def test_cost_curve_is_measured_once_per_machine(tmp_path):
    from core.target import tiny_target
    from core.trees import cost_curve

    target = tiny_target()
    path = tmp_path / "curve.json"
    curve = cost_curve.measure_cost_curve(target, sizes=(4, 1, 2), repeats=1, context=8, cache_path=path)
    assert curve["sizes"] == [1, 2, 4] and len(curve["ms"]) == 3 and all(m > 0 for m in curve["ms"])
    assert curve["key"] == cost_curve.machine_key(target) and target.fingerprint in curve["key"]
    stored = json.loads(path.read_text())
    assert stored[curve["key"]] == curve
    stored[curve["key"]]["ms"] = [1.0, 2.0, 4.0]  # a cached curve is read back, not re-measured
    path.write_text(json.dumps(stored))
    again = cost_curve.measure_cost_curve(target, sizes=(1, 2, 4), repeats=1, context=8, cache_path=path)
    assert again["ms"] == [1.0, 2.0, 4.0]
    with pytest.raises(ValueError, match="sizes"):
        cost_curve.measure_cost_curve(target, sizes=(0,), cache_path=None)
    assert cost_curve.cpu_model("model name\t: Test CPU 9000\nflags: x") == "Test CPU 9000"
    assert cost_curve.cpu_isa("flags : fpu avx2 avx512f avx512_bf16") == "avx512_bf16"
    assert cost_curve.cpu_isa("flags : fpu sse2 avx2") == "avx2" and cost_curve.cpu_isa("") == "other"


def test_ideal_speedup_from_a_curve():
    from core.trees import cost_curve

    curve = {"sizes": [1, 2, 4, 8], "ms": [10.0, 10.0, 12.0, 20.0]}
    assert cost_curve.pass_ms(curve, 6) == pytest.approx(16.0)  # linear between measured sizes
    assert cost_curve.pass_ms(curve, 16) == pytest.approx(36.0)  # and beyond the last
    assert cost_curve.ideal_speedup(2.0, curve, tree_size=3) == pytest.approx(2.0 / 1.2)  # pass of 4 tokens
    assert cost_curve.ideal_speedup(1.0, curve, tree_size=0) == pytest.approx(1.0)
    assert cost_curve.gpu_ideal_speedup(2.5) == 2.5
    st = generation_stats(hand_trace(), 0.5, plain_tps=5.0, curve=curve)  # 2.5 nodes a cycle: a 3.5-token pass
    assert st["ideal_speedup"] == pytest.approx((5 / 3) / (11.5 / 10.0))
    text = speed_context(st)
    assert "ideal speedup for tau 1.67 here: 1.45x" in text and 'href="#cost-curve"' in text
    assert "on a GPU" in text and "1.67x" in text
    assert "not measured yet" in speed_context(generation_stats(hand_trace(), 0.5))


# ----- runtime: background load, status, prompt types, address ------------------------------------------------

def test_background_load_reports_status(tmp_path):
    from demo.runtime import Runtime

    rt = Runtime(tiny=True, reference_tokens=2)
    rt.cost_curve_path = str(tmp_path / "curve.json")
    assert rt.status()["state"] == "idle" and not rt.background_started
    rt.start_background_load().join(timeout=120)
    st = rt.status()
    assert st["state"] == "ready" and st["text"].startswith("ready") and rt.loaded
    assert rt.cost_curve and rt.cost_curve["sizes"][0] == 1 and rt.cost_curve.get("fixed")  # tiny: never timed
    run = rt.generate("pld", rt.prompt_ids("hello hello hello"), 8)
    assert run["stats"]["ideal_speedup"] is not None and run["dtype"] == "float32"
    assert rt.for_dtype("float32") is rt


def test_non_string_prompts_are_named():
    from demo.runtime import Runtime, UserError

    rt = Runtime(tiny=True, reference_tokens=0)
    for bad in (123, None, ["hi"], [{"role": "user", "content": 5}]):
        with pytest.raises(UserError, match="must be text"):
            rt.prompt_ids(bad)
    assert not rt.loaded  # checked before any model loads


def test_app_listens_on_localhost_unless_told(monkeypatch):
    import app

    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7999")
    assert app.server_address() == ("127.0.0.1", 7999)
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    assert app.server_address()[0] == "0.0.0.0"


def test_status_line_states():
    import app
    from demo.runtime import Runtime

    rt = Runtime(tiny=True, reference_tokens=0)
    rt._status, rt._status_t0 = ("loading", "loading the target"), time.perf_counter() - 3
    out = app.status_html(rt)
    assert "load-status loading" in out and "3 s so far" in out and "needs no model" in out
    rt._status = ("failed", "no <model>")
    assert "&lt;model&gt;" in app.status_html(rt)


def test_cost_curve_figure_marks_the_verify_pass():
    from demo.render import cost_curve_figure

    curve = {"sizes": [1, 2, 4, 8, 16, 32, 64], "ms": [95, 100, 105, 110, 112, 140, 180], "context": 200,
             "dtype": "bfloat16", "cpu": "Test CPU"}
    fig = cost_curve_figure(curve, tree_size=15)
    assert [t.name for t in fig.data] == ["this machine", "GPU cost model (flat)"]
    assert list(fig.data[1].y) == [95, 95]  # the GPU model: every pass costs the one-token pass
    assert fig.layout.shapes[0].x0 == pytest.approx(np.log10(16))  # a log axis: shapes in log10 units
    assert "measured once the target has loaded" in cost_curve_figure(None).layout.annotations[0].text


def test_tree_choice_figure_marks_the_tree_chosen_here_and_on_a_gpu():
    from core.drafters.static_tree import auto_tree_choice
    from core.trees.choice import choose_tree
    from core.trees.cost_curve import gpu_curve
    from demo.render import tree_choice_figure
    from demo.tab_generate import choice_figure

    curve = {"sizes": [1, 8, 32, 64], "ms": [10.0, 14.0, 30.0, 60.0]}
    acc = {"p": [0.7, 0.4, 0.2], "ref_depth": 3, "ref_total": 12.0, "source": "hand"}
    here = choose_tree("x", curve=curve, acceptance=acc, draft_ms_per_level=0.5)
    gpu = choose_tree("x", curve=gpu_curve(curve), acceptance=acc, draft_ms_per_level=0.5)
    assert gpu_curve(curve)["ms"] == [10.0, 10.0] and gpu["total_tokens"] > here["total_tokens"]
    fig = tree_choice_figure(here, gpu)
    assert [t.type for t in fig.data] == ["heatmap", "scatter", "scatter"]
    assert (fig.data[1].x[0], fig.data[1].y[0]) == (here["total_tokens"], here["depth"])
    assert (fig.data[2].x[0], fig.data[2].y[0]) == (gpu["total_tokens"], gpu["depth"])
    best = max(max(v for v in row if v is not None) for row in fig.data[0].z)  # the heatmap is in speedup units
    assert best == pytest.approx(here["expected_tokens_per_s"] * 10.0 / 1000.0)
    static = tree_choice_figure(auto_tree_choice("medusa", curve), auto_tree_choice("medusa", gpu_curve(curve)))
    assert [t.name for t in static.data] == ["this machine", "auto here", "GPU cost model",
                                              "auto under the GPU cost model"]
    assert max(static.data[2].y) >= max(static.data[0].y)  # a flat pass never makes a tree pay less
    assert "no measured acceptance" in tree_choice_figure(None).layout.annotations[0].text.lower()
    assert "drafts no tree" in choice_figure(curve, "pld", None).layout.annotations[0].text
    assert "moa-tli3" in choice_figure(curve, "moa", 3).layout.title.text
