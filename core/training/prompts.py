"""Training prompts for self-distillation: deterministic, seeded, varied.

`training_prompts(seed)` returns a list of prompt records

    {"prompt_id": "qa-00017", "category": "qa", "messages": [{"role": "user", "content": "..."}, ...]}

whose last message is always a user turn. The categories cover the Spec-Bench task kinds
(multi-turn `conversation`, `translation`, `summarization`, `qa`, `math_reasoning`, `rag`)
plus `coding`, `writing`, `roleplay`, `stem`, `humanities`, `extraction` and `reasoning`.

Where the text comes from (docs/ARCHITECTURE.md, "Training data"): templates (core.training.prompt_categories)
filled from word lists written for this project (assets/prompts/word_lists.json, core.training.word_lists),
word problems with random numbers, small synthetic documents (news items, biographies, town guides) whose
facts are known so that RAG and extraction questions can ask about them, and passages cut from the
docstrings of the Python standard library (plus the Zen of Python from the `this` module); the last two
come from core.training.prompt_text. Passages are trimmed to 80-250
words so every prompt stays well under ~600 tokens.

Determinism: every category draws from its own `random.Random(f"{seed}-{category}")`;
string seeds are hashed with SHA-512 by `random`, so results do not depend on
PYTHONHASHSEED. Docstrings are read from a fixed module list in sorted order, so the
prompts are stable for a given Python version.

`assert_disjoint(train, eval_path)` checks that no evaluation turn appears in, or shares a
12-word shingle with, any training prompt. `python -m core.training.prompts --stats`
prints counts per category and a few samples.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from core.training.prompt_categories import GENERATORS
from core.training.prompt_text import Messages, stdlib_passages

__all__ = ["CATEGORY_COUNTS", "MAX_PROMPT_CHARS", "MAX_PROMPT_WORDS", "SHINGLE", "SPEC_BENCH_KINDS", "Messages",
           "assert_disjoint", "prompt_text", "read_questions", "stdlib_passages", "training_prompts"]

# How many prompts each category gets (3,520 in all).
CATEGORY_COUNTS: dict[str, int] = {
    "conversation": 400,
    "translation": 340,
    "summarization": 330,
    "qa": 380,
    "math_reasoning": 380,
    "rag": 330,
    "coding": 380,
    "writing": 200,
    "roleplay": 140,
    "stem": 200,
    "humanities": 160,
    "extraction": 160,
    "reasoning": 120,
}
SPEC_BENCH_KINDS = ("conversation", "translation", "summarization", "qa", "math_reasoning", "rag")
MAX_PROMPT_WORDS = 420  # rough guards for the ~600-token budget (English runs ~4 characters a token)
MAX_PROMPT_CHARS = 2300
SHINGLE = 12


# ------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------

def prompt_text(record: dict) -> str:
    """All message contents of a prompt joined by newlines (for length checks and overlap tests)."""
    return "\n".join(m["content"] for m in record["messages"])


def _category_prompts(category: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(f"{seed}-{category}")
    gen = GENERATORS[category]
    seen: set[str] = set()
    out: list[dict] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * n:
            raise RuntimeError(f"could only make {len(out)} distinct {category} prompts (wanted {n})")
        msgs = gen(rng)
        key = json.dumps(msgs, sort_keys=True)
        text = prompt_text({"messages": msgs})
        if key in seen or len(text.split()) > MAX_PROMPT_WORDS or len(text) > MAX_PROMPT_CHARS:
            continue
        seen.add(key)
        out.append({"prompt_id": f"{category}-{len(out):05d}", "category": category, "messages": msgs})
    return out


def training_prompts(seed: int = 0, counts: dict[str, int] | None = None) -> list[dict]:
    """The training prompts for one seed, grouped by category in a fixed order."""
    counts = CATEGORY_COUNTS if counts is None else counts
    out: list[dict] = []
    for category, n in counts.items():
        out.extend(_category_prompts(category, n, seed))
    return out


# ------------------------------------------------------------------------------------------
# Evaluation questions: disjointness from the training prompts
# ------------------------------------------------------------------------------------------

def _norm_words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9äöüßéèàçñ']+", text.lower())


def _shingles(words: list[str], k: int = SHINGLE) -> set[int]:
    return {hash(" ".join(words[i:i + k])) for i in range(len(words) - k + 1)}


def read_questions(path: str | Path) -> list[dict]:
    """Spec-Bench questions, one JSON object per line (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_disjoint(train_prompts: Iterable[dict], eval_path: str | Path, k: int = SHINGLE) -> None:
    """Raise AssertionError if an eval turn appears in, or shares a k-word shingle with, a training prompt.

    Texts are compared after lower-casing and keeping only word characters, so punctuation and
    spacing differences do not hide a copy.
    """
    train_texts = [" ".join(_norm_words(prompt_text(p))) for p in train_prompts]
    train_shingles: set[int] = set()
    for t in train_texts:
        train_shingles |= _shingles(t.split(), k)
    corpus = " " + " ".join(train_texts) + " "
    problems = []
    for q in read_questions(eval_path):
        for i, turn in enumerate(q["turns"]):
            words = _norm_words(turn)
            norm = " ".join(words)
            if len(words) >= 4 and f" {norm} " in corpus:
                problems.append(f"question {q['question_id']} turn {i}: text appears in a training prompt")
            elif _shingles(words, k) & train_shingles:
                problems.append(f"question {q['question_id']} turn {i}: shares a {k}-word shingle with training")
    assert not problems, "eval prompts overlap the training prompts:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stats", action="store_true", help="print counts per category and a few samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=1, help="samples shown per category with --stats")
    ap.add_argument("--tokens", action="store_true", help="also count prompt tokens with the target's tokenizer")
    ap.add_argument("--check-eval", default=None, help="path of an eval question file to check for overlap")
    args = ap.parse_args(argv)
    prompts = training_prompts(args.seed)
    counts = Counter(p["category"] for p in prompts)
    words = [len(prompt_text(p).split()) for p in prompts]
    print(f"{len(prompts)} prompts, {len(stdlib_passages())} stdlib passages, "
          f"words per prompt: mean {statistics.mean(words):.0f}, max {max(words)}")
    for cat, n in counts.items():
        multi = sum(1 for p in prompts if p["category"] == cat and len(p["messages"]) > 1)
        print(f"  {cat:15s} {n:5d}  ({100 * n / len(prompts):4.1f}%){'  multi-turn: ' + str(multi) if multi else ''}")
    if args.tokens:
        from transformers import AutoTokenizer

        from core.target import smollm2_location

        folder, gguf = smollm2_location()
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        lens = [len(tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)["input_ids"])
                for p in prompts]
        print(f"chat tokens per prompt: mean {statistics.mean(lens):.0f}, median {statistics.median(lens):.0f}, "
              f"max {max(lens)}, over 600: {sum(1 for x in lens if x > 600)}, total {sum(lens)}")
    if args.stats:
        rng = random.Random(args.seed)
        for cat in counts:
            pool = [p for p in prompts if p["category"] == cat]
            for p in rng.sample(pool, min(args.samples, len(pool))):
                print(f"\n--- {p['prompt_id']}")
                for m in p["messages"]:
                    print(f"[{m['role']}] {m['content'][:600]}")
    if args.check_eval:
        assert_disjoint(prompts, args.check_eval)
        print(f"{args.check_eval}: disjoint from the training prompts")


if __name__ == "__main__":
    main()
