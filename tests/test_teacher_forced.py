"""analysis.teacher_forced: teacher-forced drafter accuracy on evaluation turns, by category."""

import torch

from analysis.teacher_forced import eval_records, measure, table, tree_width
from core.drafters.eagle2 import Eagle2Drafter
from core.drafters.medusa import MedusaDrafter
from core.target import tiny_target

QUESTIONS = [{"question_id": 1, "category": "writing", "turns": ["ab", "cd"]},
             {"question_id": 2, "category": "translation", "turns": ["ef"]}]
AR_ROWS = [{"question_id": 1, "choices": [{"turns": ["xyzw", "uv"]}]},
           {"question_id": 2, "choices": [{"turns": ["st"]}]}]


def _chat_ids(messages):  # a stand-in chat template over the tiny vocabulary: 2 ids per message + 1
    return [3 + (ord(c) % 50) for m in messages for c in m["content"]] + [2]


def _encode(text):
    return [3 + (ord(c) % 50) for c in text]


def test_eval_records_rebuild_the_history_with_plain_decodings_answers():
    recs = eval_records(QUESTIONS, AR_ROWS, _chat_ids, _encode)
    assert [r["category"] for r in recs] == ["writing", "writing", "translation"]
    # the second turn's prompt holds the first turn and plain decoding's first answer
    assert recs[1]["prompt_ids"] == _chat_ids([{"content": "ab"}, {"content": "xyzw"}, {"content": "cd"}])
    assert recs[0]["answer_ids"] == _encode("xyzw")


def test_measure_weights_by_answer_tokens_and_splits_categories():
    target = tiny_target(vocab_size=64, n_layers=2)
    medusa = MedusaDrafter.random(target, seed=1, tree_size=6, tree_depth=2).eval()
    eagle = Eagle2Drafter.random(target, seed=1).eval()
    recs = eval_records(QUESTIONS, AR_ROWS, _chat_ids, _encode)
    out = measure(target, {"medusa": medusa, "eagle2": eagle}, recs, progress=False)
    for name in ("medusa", "eagle2"):
        overall, cats = out[name]["overall"], out[name]["by_category"]
        assert overall["tokens"] == sum(len(r["answer_ids"]) for r in recs)
        assert set(cats) == {"writing", "translation"}
        assert sum(c["tokens"] for c in cats.values()) == overall["tokens"]
        assert 0.0 <= overall["acc@1"] <= 1.0
        # the overall mean is the token-weighted mean of the categories
        mix = sum(c["acc@1"] * c["tokens"] for c in cats.values()) / overall["tokens"]
        assert abs(mix - overall["acc@1"]) < 1e-3
    m = out["medusa"]["overall"]
    assert m["top1@1"] == m["acc@1"]
    assert all(m[f"top{k}@1"] <= m[f"top{k + 1}@1"] for k in range(1, 10))  # cumulative top-k
    w = tree_width(medusa)
    assert w == sum(1 for p in medusa.config.tree_paths if len(p) == 1) and w is not None
    assert tree_width(eagle) is None
    text = table({"eval": out, "tree_width": {"medusa": w, "eagle2": None},
                  "decoding_acc1": {"medusa": 0.5, "eagle2": None}})
    assert f"({w})" in text and "| eagle2 |" in text


def test_measure_is_deterministic():
    target = tiny_target(vocab_size=64, n_layers=2)
    recs = eval_records(QUESTIONS, AR_ROWS, _chat_ids, _encode)
    torch.manual_seed(0)
    a = measure(target, {"m": MedusaDrafter.random(target, seed=3).eval()}, recs, progress=False)
    b = measure(target, {"m": MedusaDrafter.random(target, seed=3).eval()}, recs, progress=False)
    assert a == b
