"""Copying analysis (analysis.copying): cycles split by whether a context lookup knew the next token."""

import json
from pathlib import Path

from analysis.copying import analyze_results, copying_figure, cycle_records, lookup_next, summarize
from core.drafters.pld import PromptLookupDrafter

ROOT = Path(__file__).resolve().parents[1]


def _trace(events, category="summarization", qid=1, turn=0, text="x"):
    return {"question_id": qid, "turn": turn, "category": category, "text": text,
            "events": [{"new_tokens": new, "accepted": acc} for new, acc in events]}


def test_lookup_next_needs_a_two_token_match():
    lookup = PromptLookupDrafter(min_ngram=2)
    assert lookup_next([5, 6, 7, 8, 5, 6], lookup) == 7  # "5 6" seen before, followed by 7
    assert lookup_next([5, 6, 7, 8, 9, 6], lookup) is None  # only a 1-token match
    assert lookup_next([1, 2, 3, 9, 1, 2, 4, 9, 1, 2], lookup) == 4  # the most recent occurrence wins


def test_cycle_records_split_copyable_cycles():
    prompt = [10, 11, 12, 13, 14]
    # prefill -> 10; cycle 1 (context ends "14 10"): no 2-token match, no lookup;
    # cycle 2 (ends "10 11"): the prompt's "10 11" is followed by 12, and the target produced 12 -> copyable;
    # cycle 3 (ends "11 12 13"): the lookup offers 14, the target produced 99.
    trace = _trace([([10], []), ([11], []), ([12, 13], [0]), ([99], [])])
    recs = cycle_records(trace, prompt)
    assert [r["copyable"] for r in recs] == [False, True, False]
    assert [r["lookup"] for r in recs] == [False, True, True]  # "12 13" -> 14 offered, target said 99
    assert [r["accepted"] for r in recs] == [0, 1, 0] and [r["appended"] for r in recs] == [1, 2, 1]
    s = summarize(recs)
    assert s["copyable"] == {"cycles": 1, "share": 0.3333, "acc1": 1.0, "tau": 2.0}
    assert s["not copyable"]["acc1"] == 0.0 and s["lookup_precision"] == 0.5


def test_analyze_results_rebuilds_multi_turn_prompts(tmp_path):
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["a b c", "again"]}) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"config": {"questions_file": str(qfile),
                                                                  "methods": ["ar", "pld"]}}))
    (tmp_path / "traces").mkdir()
    import gzip

    t0 = _trace([([1], []), ([2], [])], "writing", 1, 0, text="first answer")
    t1 = _trace([([3], []), ([4], [])], "writing", 1, 1, text="second")
    with gzip.open(tmp_path / "traces" / "pld.jsonl.gz", "wt") as f:
        f.write(json.dumps(t0) + "\n" + json.dumps(t1) + "\n")
    seen = []

    def chat_ids(messages):
        seen.append(messages)
        return [7, 8]

    result = analyze_results(tmp_path, chat_ids)
    assert list(result["methods"]) == ["pld"]  # ar has no drafts
    assert seen[1] == [{"role": "user", "content": "a b c"}, {"role": "assistant", "content": "first answer"},
                       {"role": "user", "content": "again"}]
    assert result["methods"]["pld"]["overall"]["copyable"]["cycles"] == 0
    assert copying_figure(result).data  # a figure with bars


def test_committed_benchmark_pld_is_always_right_on_copyable_cycles():
    """On the committed run PLD's first token is accepted exactly when the cycle is copyable (its own rule)."""
    from analysis.copying import _tokenizer_chat_ids

    result = analyze_results(ROOT / "assets" / "results", _tokenizer_chat_ids(), ["pld"])
    overall = result["methods"]["pld"]["overall"]
    assert overall["copyable"]["cycles"] > 50 and overall["copyable"]["acc1"] == 1.0


def test_failures_tab_shows_the_copying_analysis(tmp_path):
    from demo.tab_failures import copying_view

    text, _ = copying_view(tmp_path / "missing.json")
    assert "No copying analysis" in text
    stats = {"cycles": 4, "share": 0.5, "acc1": 0.5, "tau": 1.5}
    result = {"methods": {"eagle2": {"overall": {"lookup_share": 0.6, "lookup_precision": 0.8, "copyable": stats,
                                                 "not copyable": stats}}}}
    (tmp_path / "c.json").write_text(json.dumps(result))
    text, fig = copying_view(tmp_path / "c.json")
    assert "| eagle2 | 60% | 80% | 50% | 0.50 | 0.50 |" in text and fig.data
