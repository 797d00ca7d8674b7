"""Copy-task prompts over the target's own earlier answers (docs/ARCHITECTURE.md, "Training data").

Why this exists: on the evaluation prompts the drafters fall furthest behind in the
categories where the target copies from its prompt (summarization, retrieval-augmented
answering, translation), where even prompt lookup (PLD) beats them. The passages of
`core.training.prompts` are standard-library docstrings and templated documents, a small
pool the drafters can partly memorise instead of learning to copy. Here every passage is
a different piece of natural prose: an answer the target itself wrote to a *training*
prompt (held-out answers are never used, so the held-out split stays unseen). Around it
go summarization, question-answering, extraction and translation instructions, so the
target's new answers copy from text the drafters have never seen verbatim.

`passage_prompts(passages, seed)` is deterministic in its inputs; `answer_passages`
reads the passages out of a compact distillation file (`distill.npz`, core.training.distill_data).

`perturb_passages(passages, rate, seed)` makes the passages *novel* (the second copy-task
set, `assets/distill_v5`): the first copy-task set's passages were answers the drafters had already been
trained on, so they could continue a passage's words from memory and never needed to look
back at the prompt. Swapping a share of each passage's words for other words of the pool
(and every number for a new one) keeps the text readable, but where the target copies a
swapped word the drafter's memory names the original word and only its context has the
right one: the loss then rewards reading the prompt, which is what copying is.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from core.training.prompt_text import Messages, user_turn
from core.training.prompts import MAX_PROMPT_CHARS, MAX_PROMPT_WORDS
from core.training.word_lists import load_word_lists

# Categories whose answers are prose worth copying from (code and arithmetic answers are not).
PASSAGE_SOURCES = ("writing", "humanities", "stem", "conversation", "roleplay", "reasoning", "qa", "summarization")
MIN_WORDS, MAX_WORDS = 50, 170
PASSAGE_COUNTS = {"summarization": 900, "rag": 700, "extraction": 300, "translation": 400}
NOVEL_RATE = 0.3  # share of a passage's distinct content words that perturb_passages swaps
NOVEL_COUNTS = {"summarization": 1000, "rag": 800, "extraction": 300, "translation": 500}

SUMMARY_ASKS = [
    "Summarize the following text in two or three sentences.", "Please summarize this passage.",
    "Give me a short summary of the text below.", "Summarize the key points of this text for a newsletter.",
    "Write a one-paragraph summary of the following.", "Condense this text into a few sentences.",
    "Briefly summarize what the passage below says.", "Summarize this in no more than 50 words.",
    "What are the main points of this text?", "Summarize the text below for a reader in a hurry.",
    "Sum up the following in a single sentence.", "Rewrite the following as a short summary with bullet points.",
]
RAG_FORMS = [
    "Use the passage to answer the question.\n\nPassage: {p}\n\nQuestion: {q}",
    "Answer the question using only the information in the context.\n\nContext: {p}\n\nQuestion: {q}",
    "Context: {p}\n\nQuestion: {q}\nAnswer:",
    "Read the text below, then answer the question that follows.\n\n{p}\n\n{q}",
    "Here is a reference text:\n\"\"\"\n{p}\n\"\"\"\nBased only on it: {q}",
]
GENERIC_QUESTIONS = [
    "What is the main idea of the passage?", "What does the text say first?",
    "Which example does the passage give?", "What reason does the text give?",
    "What advice, if any, does the passage offer?", "Who or what is the text about?",
]
EXTRACT_ASKS = [
    "List every name, place and number mentioned in the text below.",
    "Quote the sentence from the text below that best states its main point.",
    "Extract the three most important phrases from this text, quoting them exactly.",
    "Copy the first two sentences of the text below, then explain them in simpler words.",
    "Turn the following text into a list of short facts, one per line.",
    "Find every term in the passage below that a beginner might not know and explain each one.",
    "Write the key facts of this text as a JSON object.",
    "Rewrite the following text in the first person.",
]


@dataclass(frozen=True)
class Passage:
    source_id: str  # prompt_id of the answer it came from
    text: str  # the answer, cut at a sentence end to at most MAX_WORDS words
    question: str  # the user request that produced it (used as a question about the passage)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def clean_passage(answer: str) -> str | None:
    """An answer as a passage: one paragraph of whole sentences, MIN_WORDS..MAX_WORDS words, or None."""
    if "```" in answer:
        return None
    text = " ".join(answer.split())
    out: list[str] = []
    for s in _sentences(text):
        if len(" ".join(out + [s]).split()) > MAX_WORDS:
            break
        out.append(s)
    if out and not re.search(r"[.!?][\"')]?$", out[-1]):
        out.pop()  # the answer was cut by the token limit mid-sentence
    text = " ".join(out)
    return text if len(text.split()) >= MIN_WORDS else None


def _last_user_message(chat_text: str) -> str:
    parts = chat_text.split("<|im_start|>user\n")
    return parts[-1].split("<|im_end|>")[0].strip() if len(parts) > 1 else ""


def answer_passages(distill_path: str, decode: Callable[[Sequence[int], bool], str]) -> list[Passage]:
    """Passages from the training-split answers of a distillation file (distill_data.load_distill), in file order.

    decode(ids, skip_special_tokens) turns token ids into text (the target's tokenizer).
    """
    from core.training.distill_data import load_distill

    out: list[Passage] = []
    seen: set[str] = set()
    for r in load_distill(distill_path, split="train"):
        if r["category"] not in PASSAGE_SOURCES:
            continue
        text = clean_passage(decode(r["answer_ids"], True))
        if text is None or text in seen:
            continue
        question = _last_user_message(decode(r["prompt_ids"], False))
        if not question or len(question.split()) > 60:
            question = ""
        seen.add(text)
        out.append(Passage(r["prompt_id"], text, question))
    return out


_WORD = re.compile(r"[A-Za-z]{4,}")
_NUMBER = re.compile(r"\b\d+\b")
# Function-like words keep the grammar; swapping them would make text the target does not copy.
_KEEP = frozenset("""that this with from have they their there these those which what when where were will would
could should about also into than then them been being very more most some such only other over your just like
each many much must make made does doing here while because after before""".split())


def word_pool(passages: Sequence[Passage]) -> list[str]:
    """Distinct content words (4+ letters, lower case) of the passages, sorted (deterministic)."""
    words = {w.lower() for p in passages for w in _WORD.findall(p.text)}
    return sorted(words - _KEEP)


def perturb_passages(passages: Sequence[Passage], rate: float, seed: int) -> list[Passage]:
    """Each passage with a `rate` share of its distinct content words swapped for pool words (the same
    word always becomes the same new word, so the text stays coherent) and its numbers renewed.

    The question (the request that produced the answer) gets the same swaps, word for word, so it
    still asks about the passage's (new) words. Deterministic in (passages, rate, seed).
    """
    if not 0.0 < rate < 1.0:
        raise ValueError(f"perturb rate must lie in (0, 1), got {rate}")
    pool = word_pool(passages)
    out = []
    for p in passages:
        rng = random.Random(f"perturb-{seed}-{p.source_id}")
        mapping: dict[str, str] = {}

        def word(m: re.Match, rng=rng, mapping=mapping) -> str:
            w = m.group(0)
            key = w.lower()
            if key in _KEEP:
                return w
            if key not in mapping:
                mapping[key] = rng.choice(pool) if rng.random() < rate else key
            new = mapping[key]
            return new.capitalize() if w[0].isupper() else new

        text = _NUMBER.sub(lambda m, rng=rng: str(rng.randint(2, 10 ** max(1, len(m.group(0))) - 1)),
                           _WORD.sub(word, p.text))
        question = _WORD.sub(word, p.question)
        out.append(replace(p, source_id=f"{p.source_id}~{seed}", text=text, question=question))
    return out


def _question(rng: random.Random, p: Passage) -> str:
    if p.question and rng.random() < 0.7:
        return p.question
    return rng.choice(GENERIC_QUESTIONS)


def gen_summarization(rng: random.Random, pool: Sequence[Passage]) -> Messages:
    p = rng.choice(pool)
    ask = rng.choice(SUMMARY_ASKS)
    return user_turn(f"{p.text}\n\n{ask}" if rng.random() < 0.25 else f"{ask}\n\n{p.text}")


def gen_rag(rng: random.Random, pool: Sequence[Passage]) -> Messages:
    p = rng.choice(pool)
    q = _question(rng, p)
    if rng.random() < 0.3:  # several documents, one of which answers
        docs = [p.text] + [rng.choice(pool).text for _ in range(rng.randint(1, 2))]
        rng.shuffle(docs)
        body = "\n".join(f"[{i + 1}] {d}" for i, d in enumerate(docs))
        return user_turn(f"Documents:\n{body}\n\nUsing the documents, answer: {q}")
    return user_turn(rng.choice(RAG_FORMS).format(p=p.text, q=q))


def gen_extraction(rng: random.Random, pool: Sequence[Passage]) -> Messages:
    p = rng.choice(pool)
    return user_turn(f"{rng.choice(EXTRACT_ASKS)}\n\n{p.text}")


def gen_translation(rng: random.Random, pool: Sequence[Passage]) -> Messages:
    sents = _sentences(rng.choice(pool).text)
    start = rng.randrange(len(sents))
    text = " ".join(sents[start:start + rng.randint(1, 3)])
    lang = rng.choice(load_word_lists().LANGUAGES)
    return user_turn(rng.choice([f"Translate into {lang}: {text}",
                                 f"Translate the following text into {lang}:\n\n{text}",
                                 f"{text}\n\nTranslate the text above into {lang}.",
                             f"English: {text}\n{lang}:"]))


GENERATORS = {"summarization": gen_summarization, "rag": gen_rag, "extraction": gen_extraction,
              "translation": gen_translation}


def passage_prompts(passages: Sequence[Passage], seed: int, counts: dict[str, int] | None = None,
                    tag: str = "ans") -> list[dict]:
    """Prompt records {prompt_id, category, messages}; ids are '<category>-<tag>-<n>' (distinct from
    prompts.py's; the novel-passage set uses tag 'novel' so that pooling it with the first set never
    merges ids)."""
    if not passages:
        raise ValueError("no usable passages: the distillation file has no prose answers in its training split")
    counts = PASSAGE_COUNTS if counts is None else counts
    out: list[dict] = []
    for category, n in counts.items():
        rng = random.Random(f"passages-{seed}-{category}")
        seen: set[str] = set()
        made, attempts = 0, 0
        while made < n:
            attempts += 1
            if attempts > 50 * n:
                raise RuntimeError(f"could only make {made} distinct {category} passage prompts (wanted {n})")
            msgs = GENERATORS[category](rng, passages)
            text = msgs[-1]["content"]
            if text in seen or len(text.split()) > MAX_PROMPT_WORDS or len(text) > MAX_PROMPT_CHARS:
                continue
            seen.add(text)
            out.append({"prompt_id": f"{category}-{tag}-{made:05d}", "category": category, "messages": msgs})
            made += 1
    return out
