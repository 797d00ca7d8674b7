"""End-to-end benchmark on a tiny random target: every file written, with the right fields."""

from __future__ import annotations

import json

import pytest
import torch

from analysis import bench, bench_drafters, failures
from analysis.report import readme_table
from analysis.traces import read_traces
from core.drafters.base import Autoregressive, Drafter
from core.drafters.pld import PromptLookupDrafter
from core.target import tiny_target
from core.trees.draft_tree import DraftTree

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["abcabcabc", "again abc"]},
    {"question_id": 2, "category": "qa", "turns": ["hello hello hello"]},
    {"question_id": 3, "category": "qa", "turns": ["xyz xyz"], "reference": ["ignored"]},
]


def chat_ids(messages):
    """Characters -> ids (2..63) for a target without a tokenizer; assistant answers are id strings."""
    ids = []
    for m in messages:
        ids += [2 + ord(c) % 62 for c in m["content"]] + [0]
    return ids


def decode(ids):
    return " ".join(map(str, ids))


class OracleDrafter(Drafter):
    """Drafts the target's own greedy chain of 3 plus a wrong sibling at depth 1: known acceptances."""

    name = "oracle"

    def draft(self, root):
        ids = self.context + [root]
        chain = []
        for _ in range(3):
            chain.append(int(self.target.forward(torch.tensor(ids + chain)).logits[0, -1].argmax()))
        wrong = (chain[0] + 1) % self.target.vocab_size
        return DraftTree(torch.tensor(chain + [wrong]), torch.tensor([-1, 0, 1, -1]),
                         torch.tensor([0.9, 0.8, 0.7, 0.1]))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only add contention on a shared CPU
    try:
        target = tiny_target()
        out = tmp_path_factory.mktemp("bench")
        drafters = {"ar": Autoregressive(), "pld": PromptLookupDrafter(), "oracle": OracleDrafter()}
        summary = bench.run_benchmark(target, drafters, QUESTIONS, out, max_new_tokens=12, chat_ids=chat_ids,
                                      decode=decode, progress=False, meta={"command": "test"})
    finally:
        torch.set_num_threads(threads)
    return out, summary


def test_answer_files(run):
    out, _ = run
    for method in ("ar", "pld", "oracle"):
        lines = [json.loads(x) for x in (out / f"{method}.jsonl").read_text().splitlines()]
        assert [x["question_id"] for x in lines] == [1, 2, 3]
        for q, rec in zip(QUESTIONS, lines):
            assert set(rec) == {"question_id", "category", "answer_id", "model_id", "tstamp", "choices"}
            assert rec["category"] == q["category"] and rec["model_id"].endswith(f"-{method}")
            (c,) = rec["choices"]
            assert set(c) == {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"}
            n = len(q["turns"])
            assert len(c["turns"]) == len(c["decoding_steps"]) == len(c["new_tokens"]) == len(c["wall_time"]) == n
            assert sum(c["accept_lengths"]) == sum(c["new_tokens"])
            assert len(c["accept_lengths"]) == sum(c["decoding_steps"])
            assert all(isinstance(t, str) and t for t in c["turns"])
            if method == "ar":
                assert c["decoding_steps"] == c["new_tokens"]


def test_summary(run):
    out, summary = run
    assert json.loads((out / "summary.json").read_text()) == summary
    assert list(summary["methods"]) == ["ar", "pld", "oracle"]
    assert summary["categories"] == ["writing", "qa"]
    keys = {"tokens_per_s", "speedup", "tau", "acceptance_by_position", "draft_ms_per_cycle",
            "verify_ms_per_cycle", "ideal_speedup", "identical_to_ar"}
    for m in summary["methods"].values():
        assert keys <= set(m["overall"])
        assert set(m["by_category"]) == {"writing", "qa"}
        assert keys <= set(m["by_category"]["qa"])
    ar = summary["methods"]["ar"]["overall"]
    assert ar["tau"] == 1.0 and ar["speedup"] == 1.0 and ar["acceptance_by_position"] == []
    orc = summary["methods"]["oracle"]["overall"]
    # float32 greedy speculative decoding is lossless, and the oracle's chain is mostly right
    assert orc["identical_to_ar"] == 1.0 and summary["methods"]["pld"]["overall"]["identical_to_ar"] == 1.0
    assert orc["tau"] > 1.5
    assert len(orc["acceptance_by_position"]) == 3 and orc["acceptance_by_position"][0] > 0.5
    assert orc["turns"] == 4 and orc["questions"] == 3
    assert summary["config"]["command"] == "test" and summary["config"]["max_new_tokens"] == 12
    assert summary["command"] == "test"
    rows = {(r["method"], r["category"]): r for r in summary["table"]}
    assert len(rows) == 3 * 3 and rows[("oracle", "overall")]["tau"] == orc["tau"]
    assert rows[("pld", "qa")]["speedup"] == summary["methods"]["pld"]["by_category"]["qa"]["speedup"]


def test_traces_and_failure_analysis(run):
    out, _ = run
    recs = list(read_traces(out / "traces" / "oracle.jsonl.gz"))
    assert len(recs) == 4 and {r["turn"] for r in recs} == {0, 1}
    assert all("token_text" in r and "row_top" in r["events"][1] for r in recs)
    res = failures.analyze(recs)
    assert res["tested"] > 0 and res["rejected"] > 0
    assert sum(v["tested"] for v in res["by_kind"].values()) == res["tested"]


def test_report_and_table(run):
    out, summary = run
    page = (out / "report.html").read_text()
    assert "plotly" in page.lower() and "oracle" in page
    table = readme_table(summary)
    assert table.count("\n| ") >= 3 and "| oracle |" in table and "writing" in table


def test_question_loading(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n\n")
    assert [q["question_id"] for q in bench.load_questions(path)] == [1, 2, 3]
    assert [q["question_id"] for q in bench.load_questions(path, limit=2)] == [1, 2]
    assert [q["question_id"] for q in bench.load_questions(path, per_category=1)] == [1, 2]
    assert [q["question_id"] for q in bench.load_questions(path, categories=["qa"])] == [2, 3]
    path.write_text('{"question_id": 1, "turns": "not a list"}\n')
    with pytest.raises(ValueError, match="turns"):
        bench.load_questions(path)


def test_drafter_specs(tmp_path):
    assert bench_drafters.parse_label("moa-tli3") == ("moa", {"tli": 3})
    assert bench_drafters.parse_label("eagle2") == ("eagle2", {})
    specs = bench_drafters.parse_drafter_specs(["random", "moa=/x/moa"])
    assert specs == {"*": "random", "moa": "/x/moa"}
    assert bench_drafters.resolve_drafter("moa", specs, None) == "/x/moa"
    assert bench_drafters.resolve_drafter("moa-tli1", specs, None) == "/x/moa"
    assert bench_drafters.resolve_drafter("eagle2", specs, None) == "random"
    assert bench_drafters.resolve_drafter("pld", specs, None) is None
    (tmp_path / "medusa").mkdir()
    assert bench_drafters.resolve_drafter("medusa", {}, str(tmp_path)) == str(tmp_path / "medusa")
    assert bench_drafters.resolve_drafter("amphista", {}, str(tmp_path)) is None
    with pytest.raises(ValueError):
        bench_drafters.parse_drafter_specs(["moa="])


def test_readme_table_cli(run, capsys):
    out, _ = run
    assert bench.main(["--readme-table", str(out / "summary.json")]) == 0
    assert "| pld |" in capsys.readouterr().out


def test_model_cards_get_the_measured_tau(run, tmp_path):
    from analysis import cards
    from core.training.publish import TAU_PLACEHOLDER

    out, summary = run
    (tmp_path / "oracle").mkdir()
    card = tmp_path / "oracle" / "README.md"
    card.write_text(f"# oracle\n\n{TAU_PLACEHOLDER}\n\n## Hyper-parameters\n")
    (tmp_path / "pld").mkdir()
    (tmp_path / "pld" / "README.md").write_text("# no tau line here\n")
    assert cards.update_cards(out / "summary.json", tmp_path) == ["oracle"]
    orc = summary["methods"]["oracle"]["overall"]
    text = card.read_text()
    assert TAU_PLACEHOLDER not in text and f"**tau {orc['tau']:.2f}**" in text
    assert f"speedup {orc['speedup']:.2f}x" in text and text.endswith("## Hyper-parameters\n")
    assert cards.update_cards(out / "summary.json", tmp_path) == ["oracle"]  # a second run replaces its own line
    assert text == card.read_text()


def test_fixed_trees_keep_the_checkpoint_tree():
    """bench --trees fixed: a drafter (or the one inside a lookup branch) keeps its stored tree."""
    from core.drafters.lookup_branch import LookupBranch
    from core.drafters.moa import MoADrafter

    target = tiny_target()
    d = MoADrafter.random(target, seed=0)
    wrapped = LookupBranch(MoADrafter.random(target, seed=0))
    assert d.tree_auto and wrapped.inner.tree_auto
    bench_drafters.fix_tree(d)
    bench_drafters.fix_tree(wrapped)
    bench_drafters.fix_tree(Autoregressive())  # no tree: nothing to do
    assert not d.tree_auto and not wrapped.inner.tree_auto and d.tree_choice is None


def test_resummarize_reproduces_the_summary_from_traces(run, tmp_path, capsys):
    import shutil

    out, summary = run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    again = bench.resummarize(copy)
    # the same figures (the floor as the config stores it, to 6 decimals)
    a, b = json.loads(json.dumps(again["methods"])), json.loads(json.dumps(summary["methods"]))
    for m in b:
        assert a[m]["overall"].pop("verify_over_floor") == pytest.approx(b[m]["overall"].pop("verify_over_floor"),
                                                                          rel=1e-4)
        for c in b[m]["by_category"]:
            a[m]["by_category"][c].pop("verify_over_floor")
            b[m]["by_category"][c].pop("verify_over_floor")
    assert a == b
    assert again["config"] == json.loads(json.dumps(summary["config"]))
    assert bench.main(["--resummarize", str(copy)]) == 0
    assert "share of ideal" in capsys.readouterr().out
    shutil.rmtree(copy / "traces")
    assert bench.main(["--resummarize", str(copy)]) == 2


def test_a_stopped_run_keeps_its_answers_and_resumes(tmp_path, capsys):
    """A run stopped partway (here: an error at the third question) leaves run.json, the finished answers and
    their traces; --resummarize summarises them and says how many; resume=True answers only the rest, and the
    finished run's figures count every question once."""
    target = tiny_target()
    out = tmp_path / "run"
    calls = []

    class Stopping(PromptLookupDrafter):
        def begin(self, target, prefill):
            calls.append(len(prefill.tokens))
            if len(calls) == 4:  # pld's fourth conversation: question 3 (q1 has two turns), its last answer
                raise KeyboardInterrupt
            super().begin(target, prefill)

    drafters = {"ar": Autoregressive(), "pld": Stopping()}
    kwargs = dict(max_new_tokens=8, chat_ids=chat_ids, decode=decode, progress=False, warmup=False, report=False)
    with pytest.raises(KeyboardInterrupt):
        bench.run_benchmark(target, drafters, QUESTIONS, out, **kwargs)
    assert (out / "run.json").is_file() and not (out / "summary.json").exists()
    partial = bench.resummarize(out)
    assert partial["answers"] == {"found": 5, "planned": 6}  # every answer but pld's to question 3
    assert bench.main(["--resummarize", str(out)]) == 0
    assert "5 of 6 answers" in capsys.readouterr().err
    bench.check_run_folder(out, resume=True, overwrite=False)  # a partial summary does not finish the run
    calls.append("resumed")
    summary = bench.run_benchmark(target, drafters, QUESTIONS, out, resume=True, **kwargs)
    assert summary["methods"]["pld"]["overall"]["questions"] == 3
    assert summary["methods"]["ar"]["overall"]["questions"] == 3 and "answers" not in summary
    for label in ("ar", "pld"):  # one answer line per question, none repeated
        ids = [json.loads(line)["question_id"] for line in open(out / f"{label}.jsonl")]
        assert sorted(ids) == [1, 2, 3]


def test_out_on_a_used_folder_needs_resume_or_overwrite(run, tmp_path):
    from core.cli_checks import UsageError

    out, _ = run
    with pytest.raises(UsageError, match="already holds a run .*--resume.*--overwrite"):
        bench.check_run_folder(out, resume=False, overwrite=False)
    bench.check_run_folder(out, resume=False, overwrite=True)
    with pytest.raises(UsageError, match="finished"):
        bench.check_run_folder(out, resume=True, overwrite=False)
    with pytest.raises(UsageError, match="no run to finish"):
        bench.check_run_folder(tmp_path, resume=True, overwrite=False)
    bench.check_run_folder(tmp_path, resume=False, overwrite=False)
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps([{"question_id": 1, "turns": ["x"]}]) + "\n")
    with pytest.raises(ValueError, match=r"q.jsonl:1: expected one JSON object a line .* got an array"):
        bench.load_questions(q)
