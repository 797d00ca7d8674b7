"""Training prompts (core.training.prompts) and the hand-written evaluation question files."""

import json
from collections import Counter
from pathlib import Path

import pytest

from core.training.prompts import (
    CATEGORY_COUNTS,
    MAX_PROMPT_CHARS,
    SPEC_BENCH_KINDS,
    assert_disjoint,
    prompt_text,
    stdlib_passages,
    training_prompts,
)

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "assets" / "prompts" / "speclens_eval.jsonl"
SMOKE = ROOT / "assets" / "prompts" / "smoke.jsonl"
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
EVAL_KINDS = ("translation", "summarization", "qa", "math_reasoning", "rag")


@pytest.fixture(scope="module")
def prompts():
    return training_prompts(seed=0)


def test_count_and_shape(prompts):
    assert len(prompts) >= 3000
    assert len({p["prompt_id"] for p in prompts}) == len(prompts)
    for p in prompts:
        assert set(p) == {"prompt_id", "category", "messages"}
        msgs = p["messages"]
        assert msgs and msgs[-1]["role"] == "user"
        assert all(m["role"] in ("user", "assistant") and m["content"].strip() for m in msgs)
        assert all(a["role"] != b["role"] for a, b in zip(msgs, msgs[1:])), "turns must alternate"
        assert len(prompt_text(p)) <= MAX_PROMPT_CHARS


def test_categories_and_shares(prompts):
    counts = Counter(p["category"] for p in prompts)
    for kind in SPEC_BENCH_KINDS + ("coding", "writing", "roleplay", "stem", "humanities", "extraction"):
        assert counts[kind] / len(prompts) >= 0.03, kind
    for kind in SPEC_BENCH_KINDS + ("coding",):
        assert counts[kind] / len(prompts) >= 0.08, kind
    assert counts == Counter(CATEGORY_COUNTS)
    conv = [p for p in prompts if p["category"] == "conversation"]
    assert all(len(p["messages"]) >= 3 for p in conv), "conversation prompts are multi-turn"


def test_variety(prompts):
    texts = [prompt_text(p) for p in prompts]
    assert len(set(texts)) == len(texts)
    # no category is dominated by a handful of openings
    for cat in CATEGORY_COUNTS:
        firsts = Counter(" ".join(prompt_text(p).split()[:3]) for p in prompts if p["category"] == cat)
        assert firsts.most_common(1)[0][1] <= 0.5 * sum(firsts.values()), cat
    assert len(stdlib_passages()) >= 200
    for _, text in stdlib_passages():
        assert 80 <= len(text.split()) <= 250


def test_deterministic(prompts):
    again = training_prompts(seed=0)
    assert again == prompts
    other = training_prompts(seed=1)
    assert len(other) == len(prompts)
    assert sum(a["messages"] != b["messages"] for a, b in zip(other, prompts)) > 0.9 * len(prompts)


def _check_questions(path):
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        assert isinstance(r["question_id"], int) and not isinstance(r["question_id"], bool)
        assert isinstance(r["category"], str)
        assert isinstance(r["turns"], list) and r["turns"]
        assert all(isinstance(t, str) and t.strip() for t in r["turns"])
        assert set(r) <= {"question_id", "category", "turns", "reference"}
    assert len({r["question_id"] for r in rows}) == len(rows)
    return rows


def test_eval_file_format():
    rows = _check_questions(EVAL)
    cats = Counter(r["category"] for r in rows)
    assert set(cats) <= MT_BENCH | set(EVAL_KINDS)
    assert sum(cats[c] for c in MT_BENCH) >= 12
    assert len([c for c in MT_BENCH if cats[c]]) == 8, "every MT-Bench category is represented"
    assert all(len(r["turns"]) == 2 for r in rows if r["category"] in MT_BENCH)
    for kind in EVAL_KINDS:
        assert cats[kind] >= 12, kind
    smoke = _check_questions(SMOKE)
    assert len(smoke) == 6
    kinds = {"mt_bench" if r["category"] in MT_BENCH else r["category"] for r in smoke}
    assert kinds == {"mt_bench", *EVAL_KINDS}


def test_eval_disjoint_from_training(prompts):
    assert_disjoint(prompts, EVAL)
    assert_disjoint(prompts, SMOKE)
    # seed 1: `make data-v2`'s run; seed 2: assets/distill_v3's third; seed 6: `make data-s6`
    for seed in (1, 2, 6):
        more = training_prompts(seed=seed)
        assert_disjoint(more, EVAL)
        assert_disjoint(more, SMOKE)


def test_disjoint_check_catches_overlap(prompts, tmp_path):
    bad = tmp_path / "bad.jsonl"
    long_one = next(p for p in prompts if p["category"] == "summarization")
    words = prompt_text(long_one).split()
    rows = [{"question_id": 1, "category": "qa", "turns": [prompt_text(prompts[0])]},
            {"question_id": 2, "category": "summarization", "turns": ["Please look: " + " ".join(words[5:20])]}]
    bad.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(AssertionError) as err:
        assert_disjoint(prompts, bad)
    assert "question 1" in str(err.value) and "question 2" in str(err.value)
