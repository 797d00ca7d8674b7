"""Copy-task prompts around the target's own answers (core.training.passage_prompts)."""

from collections import Counter
from pathlib import Path

import pytest

from core.training.passage_prompts import (
    MAX_WORDS,
    MIN_WORDS,
    NOVEL_COUNTS,
    PASSAGE_COUNTS,
    Passage,
    answer_passages,
    clean_passage,
    passage_prompts,
    perturb_passages,
    word_pool,
)
from core.training.prompts import MAX_PROMPT_CHARS, assert_disjoint, prompt_text

ROOT = Path(__file__).resolve().parents[1]
DISTILL_V3 = ROOT / "assets" / "distill_v3" / "distill.npz"
SENTENCE = "The old lighthouse on the northern cliff was painted white and red by volunteers last spring. "


def _pool(n: int = 40) -> list[Passage]:
    return [Passage(f"writing-{i:05d}", f"Passage number {i} begins here. " + SENTENCE * 5, f"Tell me about {i}.")
            for i in range(n)]


def test_clean_passage_keeps_whole_sentences():
    cut = SENTENCE * 6 + "And then the keeper climbed the"  # cut by the token limit mid-sentence
    text = clean_passage(cut)
    assert text is not None and text.endswith("spring.") and "climbed" not in text
    assert MIN_WORDS <= len(text.split()) <= MAX_WORDS
    assert clean_passage(SENTENCE * 20) is not None and len(clean_passage(SENTENCE * 20).split()) <= MAX_WORDS
    assert clean_passage(SENTENCE) is None  # too short
    assert clean_passage(SENTENCE * 6 + "```python\nprint(1)\n```") is None  # code is not prose


def test_prompts_shape_ids_and_determinism():
    counts = {"summarization": 30, "rag": 30, "extraction": 10, "translation": 10}
    a = passage_prompts(_pool(), seed=3, counts=counts)
    assert Counter(p["category"] for p in a) == counts
    assert len({p["prompt_id"] for p in a}) == len(a)
    assert all("-ans-" in p["prompt_id"] for p in a)  # never collides with core.training.prompts ids
    assert all(p["messages"][-1]["role"] == "user" and len(prompt_text(p)) <= MAX_PROMPT_CHARS for p in a)
    # each prompt carries (part of) a passage, so the target's answer can copy from it
    assert all("lighthouse" in prompt_text(p) for p in a)
    assert a == passage_prompts(_pool(), seed=3, counts=counts)
    assert a != passage_prompts(_pool(), seed=4, counts=counts)


def test_no_passages_is_a_clear_error():
    with pytest.raises(ValueError, match="no usable passages"):
        passage_prompts([], seed=0)


def test_real_passages_are_training_answers_and_disjoint_from_eval():
    """The committed recipe: distill_v3's training-split answers, decoded with the target's tokenizer."""
    import numpy as np
    from transformers import AutoTokenizer

    from core.target_files import smollm2_location

    folder, gguf = smollm2_location()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    passages = answer_passages(str(DISTILL_V3), lambda ids, skip: tok.decode(ids, skip_special_tokens=skip))
    assert len(passages) > 1000
    z = np.load(DISTILL_V3)
    split = dict(zip(z["prompt_id"].tolist(), z["split"].tolist()))
    assert all(split[p.source_id] == "train" for p in passages)  # held-out answers stay unseen
    prompts = passage_prompts(passages, seed=3)
    assert len(prompts) == sum(PASSAGE_COUNTS.values())
    for eval_file in ("speclens_eval.jsonl", "smoke.jsonl"):
        assert_disjoint(prompts, ROOT / "assets" / "prompts" / eval_file)


def _varied_pool() -> list[Passage]:
    words = ["harbor", "lantern", "meadow", "copper", "violin", "glacier", "orchard", "pebble", "saddle", "thimble"]
    return [Passage(f"writing-{i:05d}", f"In {1900 + i} the {words[i % 10]} keeper painted the {words[(i + 3) % 10]} "
                    f"and the {words[(i + 5) % 10]} near the {words[(i + 7) % 10]}. " * 4,
                    f"Tell me about the {words[i % 10]}.") for i in range(30)]


def test_perturbed_passages_are_new_text_with_consistent_swaps():
    pool = _varied_pool()
    new = perturb_passages(pool, 0.5, seed=5)
    assert len(new) == len(pool)
    assert all(n.text != p.text for n, p in zip(new, pool))  # novel: the drafters never saw this text
    assert sum(n.text.split()[:1] == p.text.split()[:1] for n, p in zip(new, pool)) == len(pool)  # "In" is kept
    vocab = set(word_pool(pool))
    for n, p in zip(new, pool):
        assert "~5" in n.source_id and n.source_id.startswith(p.source_id)
        # the same word always becomes the same new word, so the repeated sentence stays repeated
        sentences = [s for s in n.text.split(". ") if s]
        assert len(set(s.rstrip(".").split(" ", 2)[2] for s in sentences)) == 1
        assert all(w.lower() in vocab or not w.isalpha() or len(w) < 4 or w.lower() in ("that", "with")
                   for w in n.text.replace(".", " ").split())
        assert all(not w.isdigit() or len(w) <= 4 for w in n.text.split())
        # the question is swapped with the passage's own mapping: it still names the passage's (new) word
        asked = n.question.rstrip(".").split()[-1]
        assert asked in n.text
    assert new == perturb_passages(pool, 0.5, seed=5)
    assert new != perturb_passages(pool, 0.5, seed=6)
    with pytest.raises(ValueError, match="perturb rate"):
        perturb_passages(pool, 1.5, seed=5)


def test_novel_prompts_use_their_own_ids():
    pool = perturb_passages(_varied_pool(), 0.3, seed=5)
    counts = {k: 5 for k in NOVEL_COUNTS}
    prompts = passage_prompts(pool, seed=5, counts=counts, tag="novel")
    assert all("-novel-" in p["prompt_id"] for p in prompts)
    assert not {p["prompt_id"] for p in prompts} & {p["prompt_id"] for p in passage_prompts(pool, 5, counts)}


@pytest.mark.parametrize("rate,seed", [(None, 5), (0.6, 7)])
def test_real_novel_prompts_are_disjoint_from_eval(rate, seed):
    """The recipes of assets/distill_v5 (distill_v4's training answers perturbed at rate 0.3, seed 5) and of
    `make data-novel7` (rate 0.6, seed 7; a 1,600-prompt subset of these)."""
    from transformers import AutoTokenizer

    from core.target_files import smollm2_location
    from core.training.passage_prompts import NOVEL_RATE

    folder, gguf = smollm2_location()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    passages = answer_passages(str(ROOT / "assets" / "distill_v4" / "distill.npz"),
                               lambda ids, skip: tok.decode(ids, skip_special_tokens=skip))
    novel = perturb_passages(passages, rate or NOVEL_RATE, seed=seed)
    changed = sum(n.text != p.text for n, p in zip(novel, passages)) / len(passages)
    assert changed > 0.95
    prompts = passage_prompts(novel, seed=seed, counts=NOVEL_COUNTS, tag="novel")
    assert len(prompts) == sum(NOVEL_COUNTS.values())
    for eval_file in ("speclens_eval.jsonl", "smoke.jsonl"):
        assert_disjoint(prompts, ROOT / "assets" / "prompts" / eval_file)
