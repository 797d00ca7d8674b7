"""One prompt generator per training category: each takes a seeded `random.Random` and returns one message
list (the last message a user turn). Templates are written here; the words that fill them come from
assets/prompts/word_lists.json (core.training.word_lists) and core.training.prompt_text. The problem-solving
categories (math_reasoning, reasoning, coding, stem) are in core.training.prompt_problems; GENERATORS below lists
every category.

The templates stay code, not data: most draw random numbers and words inside the template text (the draws, in
order, are part of what makes a seed's prompts reproducible), so they cannot be plain strings in a data file.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from core.training.prompt_problems import gen_coding, gen_math_reasoning, gen_reasoning, gen_stem
from core.training.prompt_text import (
    SYNTH_DOCS,
    Messages,
    capitalize,
    doc_sentence,
    english_sentence,
    fill_slots,
    first_name,
    full_name,
    german_text,
    romance_text,
    stdlib_passages,
    synth_question,
    trim_words,
    user_turn,
)
from core.training.word_lists import load_word_lists

W = load_word_lists()


# ------------------------------------------------------------------------------------------
# Category generators: each returns one message list for a random draw
# ------------------------------------------------------------------------------------------

def gen_translation(rng: random.Random) -> Messages:
    r = rng.random()
    lang = rng.choice(W.LANGUAGES)
    if r < 0.35:
        de = german_text(rng)
        return user_turn(rng.choice([f"Translate German to English: {de}",
                                 f"Translate this German text into English:\n\n{de}",
                                 f"What does this mean in English? \"{de}\"", f"German: {de}\nEnglish:"]))
    if r < 0.5:
        src_lang, src = romance_text(rng)
        return user_turn(rng.choice([f"Translate {src_lang} to English: {src}",
                                 f"Please translate this {src_lang} sentence into English: \"{src}\"",
                                 f"Translate into German: {src}"]))
    if r < 0.65:
        text = " ".join(english_sentence(rng) for _ in range(rng.randint(2, 3)))
        return user_turn(rng.choice([f"Translate the following text into {lang}:\n\n{text}",
                                 f"Translate into {lang}, keeping a {rng.choice(['formal', 'casual'])} "
                                 f"tone:\n\n{text}"]))
    if r < 0.8:
        s = doc_sentence(rng)
        return user_turn(rng.choice([f"Translate this technical sentence into {lang}: {s}",
                                 f"Translate to {lang} and keep code names unchanged:\n{s}"]))
    s = english_sentence(rng)
    return user_turn(rng.choice([f"Translate the following sentence into {lang}: {s}",
                                 f"How do you say \"{s}\" in {lang}?",
                             f"Translate English to {lang}: {s}", f"{s}\n\nTranslate the sentence above into {lang}.",
                             f"Give me the {lang} translation of: {s}"]))


def _passage(rng: random.Random, stdlib_share: float) -> tuple[str, str, str, dict]:
    """(source kind, title, text, facts). stdlib passages have no facts."""
    if rng.random() < stdlib_share:
        title, text = rng.choice(stdlib_passages())
        return "stdlib", title, text, {}
    fn = rng.choice(SYNTH_DOCS)
    title, text, facts = fn(rng)
    return fn.__name__, title, text, facts


def gen_summarization(rng: random.Random) -> Messages:
    kind, title, text, _ = _passage(rng, 0.6)
    instr = rng.choice(W.SUMMARY_INSTRUCTIONS)
    if rng.random() < 0.2:
        return user_turn(f"{text}\n\n{instr.rstrip(':')}")
    if rng.random() < 0.2 and kind == "stdlib":
        where = title.removeprefix("functions of ")
        return user_turn(f"Here is part of the documentation of {where}.\n\n{text}\n\n{instr}")
    return user_turn(f"{instr}\n\n{text}")


def _stdlib_question(rng: random.Random, title: str) -> str:
    """A question about a docstring passage; titles are 'the X module', 'functions of the X module' or 'X.name'."""
    if title.endswith(" module"):
        name = title.split(" ")[-2]
        return rng.choice([f"What is the {name} module used for?", "Which functions does the passage mention?",
                           "What is the main idea of this documentation?", f"Name two things you can do with {name}."])
    name = f"`{title}`" if title != "the Zen of Python" else title
    return rng.choice([f"What does {name} do?", f"According to the documentation, what does {name} return?",
                       f"What arguments does {name} accept?", f"When would you use {name}?",
                       f"What happens if {name} is given invalid input, according to the text?",
                       f"Describe {name} in one sentence."])


def gen_rag(rng: random.Random) -> Messages:
    kind, title, text, facts = _passage(rng, 0.5)
    q = _stdlib_question(rng, title) if kind == "stdlib" else synth_question(rng, kind, facts)
    r = rng.random()
    if r < 0.35:
        others = [_passage(rng, 0.5) for _ in range(rng.randint(1, 2))]
        docs = [(title, trim_words(text, 170))] + [(o[1], trim_words(o[2], 100)) for o in others]
        rng.shuffle(docs)
        body = "\n".join(f"Document [{i + 1}] (Title: {t}) {d}" for i, (t, d) in enumerate(docs))
        return user_turn(f"Answer the question based on the documents below.\n\n{body}\n\nQuestion: {q}\nAnswer:")
    return user_turn(rng.choice([
        f"Use the following passage to answer the question.\n\nPassage: {text}\n\nQuestion: {q}",
        f"Context:\n{text}\n\nBased on the context above, answer: {q}",
        f"{text}\n\nQ: {q}\nA:",
        f"Read the text and answer the question using only information from it.\n\nText: {text}\n\nQuestion: {q}",
        f"Here is some reference material:\n\"\"\"\n{text}\n\"\"\"\n{q} If the material does not say, reply that you "
        f"don't know.",
    ]))


def gen_qa(rng: random.Random) -> Messages:
    r = rng.random()
    if r < 0.12:
        q = f"What is {rng.choice(W.CONCEPTS)[0]}?"
    elif r < 0.22:
        q = rng.choice([f"Who was {rng.choice(W.PEOPLE)}?", f"What is {rng.choice(W.PEOPLE)} best known for?"])
    elif r < 0.32:
        q = rng.choice([f"When did {rng.choice(W.EVENTS)} happen?", f"What caused {rng.choice(W.EVENTS)}?",
                        f"Why was {rng.choice(W.EVENTS)} important?"])
    elif r < 0.42:
        c = rng.choice(W.COUNTRIES)
        q = rng.choice([f"What is the capital of {c}?", f"What languages are spoken in {c}?",
                        f"What currency is used in {c}?", f"What is {c} famous for?",
                        f"What is the climate like in {c}?"])
    elif r < 0.5:
        q = rng.choice(W.WHY_QUESTIONS)
    elif r < 0.58:
        q = rng.choice(W.TRIVIA)
    elif r < 0.68:
        q = f"How do I {rng.choice(W.HOWTO_TASKS)}?"
    elif r < 0.78:
        a, b = rng.choice(W.QA_PAIRS)
        q = rng.choice([f"What is the difference between {a} and {b}?", f"How can I tell {a} from {b}?"])
    elif r < 0.84:
        small, big = rng.choice(W.UNIT_PAIRS)
        q = rng.choice([f"What does {rng.choice(W.ABBREVIATIONS)} stand for?", f"How many {small} are in a {big}?"])
    elif r < 0.92:
        lm = rng.choice(W.LANDMARKS)
        q = rng.choice([f"Where is {lm} located?", f"Who built {lm}?", f"Why is {lm} famous?"])
    else:
        q = f"Who invented {rng.choice(W.INVENTIONS)}?"
    style = rng.random()
    if style < 0.25:  # Natural-Questions style: lower case, no question mark
        q = q.rstrip("?").lower()
    elif style < 0.35:
        q = f"{q} Answer briefly."
    elif style < 0.42:
        q = f"Quick question: {q[0].lower()}{q[1:]}"
    return user_turn(q)


def gen_writing(rng: random.Random) -> Messages:
    if rng.random() < 0.55:
        form = rng.choice(W.WRITING_FORMS)
        text = f"Write {form} about {rng.choice(W.TOPICS)}."
        extra = fill_slots(rng, rng.choice(W.WRITING_CONSTRAINTS))
        return user_turn(f"{text} {extra}".strip())
    return user_turn(fill_slots(rng, rng.choice(W.WRITING_TASKS)))


def gen_roleplay(rng: random.Random) -> Messages:
    persona = fill_slots(rng, rng.choice(W.PERSONAS))
    task = fill_slots(rng, rng.choice(W.ROLE_TASKS))
    return user_turn(rng.choice([f"Pretend you are {persona}. {task}", f"You are {persona}. Stay in character. {task}",
                             f"Act as {persona}. {task}", f"Role-play as {persona}. {task}"]))


def gen_humanities(rng: random.Random) -> Messages:
    r = rng.random()
    if r < 0.25:
        p1, p2 = rng.sample(W.PHILOSOPHERS, 2)
        theme = rng.choice(W.PHIL_THEMES)
        return user_turn(rng.choice([f"Compare the views of {p1} and {p2} on {theme}.",
                                 f"What did {p1} believe about {theme}?",
                                 f"Summarize {p1}'s main ideas for a beginner."]))
    if r < 0.5:
        w, theme = rng.choice(W.WORKS), rng.choice(W.WORK_THEMES)
        return user_turn(rng.choice([f"Discuss the theme of {theme} in {w}.", f"Why is {w} still read today?",
                                 f"Write a short essay plan on {theme} in {w}."]))
    if r < 0.7:
        e = rng.choice(W.EVENTS)
        return user_turn(rng.choice([f"What were the main causes and consequences of {e}?",
                                 f"How did {e} change everyday life for ordinary people?",
                                 f"Write a short explanation of {e} for a history class."]))
    if r < 0.85:
        a = rng.choice(W.ART_MOVEMENTS)
        return user_turn(rng.choice([f"What are the defining features of {a}?",
                                     f"Name three important artists of {a} and "
                                 f"describe their styles.", f"How did {a} influence later art?"]))
    t = rng.choice(W.ECON_TOPICS)
    return user_turn(rng.choice([f"What are the arguments for and against {t}?", f"Explain the economics of {t}.",
                             f"How might {t} affect small businesses?"]))


def _records_paragraph(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["people", "books", "products"])
    if kind == "people":
        rows = [(full_name(rng), rng.choice(W.JOBS), rng.randint(22, 65), rng.choice(W.CITIES))
                for _ in range(rng.randint(3, 5))]
        text = " ".join(f"{n} is a {rng.choice(['', 'senior ', 'part-time '])}{j} aged {a} who lives in {c}."
                        for n, j, a, c in rows)
        return text, "name, job, age and city"
    if kind == "books":
        rows = [(f"The {rng.choice(['Silent', 'Last', 'Hidden', 'Golden', 'Broken', 'Endless'])} "
                 f"{rng.choice(['River', 'Garden', 'Letter', 'Winter', 'Map', 'Orchard'])}", full_name(rng),
                 rng.randint(1950, 2023)) for _ in range(rng.randint(3, 5))]
        text = " ".join(f"\"{t}\" was written by {a} and published in {y}." for t, a, y in rows)
        return text, "title, author and year"
    rows = [(rng.choice(W.GADGETS), rng.randint(19, 899), rng.randint(1, 5)) for _ in range(rng.randint(3, 5))]
    text = " ".join(f"The {g} costs ${p} and customers rate it {s} out of 5." for g, p, s in rows)
    return text, "product, price and rating"


def gen_extraction(rng: random.Random) -> Messages:
    r = rng.random()
    if r < 0.4:
        fn = rng.choice(SYNTH_DOCS)
        _, text, facts = fn(rng)
        keys = rng.sample(sorted(facts), min(4, len(facts)))
        return user_turn(rng.choice([
            f"Extract the following fields from the text as JSON: {', '.join(keys)}.\n\n{text}",
            f"List every number in this text and say what it refers to.\n\n{text}",
            f"Extract all names of people and places from the text below.\n\n{text}",
            f"{text}\n\nFrom the text above, extract the key facts as a bulleted list.",
        ]))
    if r < 0.75:
        text, fields = _records_paragraph(rng)
        return user_turn(rng.choice([f"Extract the {fields} from this text and return a JSON list.\n\n{text}",
                                 f"Turn this text into a Markdown table with columns for {fields}:\n\n{text}",
                                 f"Convert the following into CSV ({fields}):\n{text}"]))
    title, text = rng.choice(stdlib_passages())
    return user_turn(rng.choice([f"List all the function or class names mentioned in the following text.\n\n{text}",
                             f"Extract every parameter or argument name mentioned in this documentation:\n\n{text}",
                             f"From the documentation below, extract a list of what the code can do, one item per "
                             f"line.\n\n{text}"]))


def gen_conversation(rng: random.Random) -> Messages:
    r = rng.random()
    if r < 0.35:
        concept, desc = rng.choice(W.CONCEPTS)
        opener = rng.choice([f"What is {concept}?", f"Can you explain {concept}?", f"I keep hearing about {concept}. "
                             f"What is it?", f"Tell me about {concept}."])
        reply = rng.choice([
            f"The term \"{concept}\" refers to {desc}. Would you like me to go into more detail on any part of it?",
            f"In short, {concept} describes {desc}. It comes up in many fields, so it is worth understanding well.",
            f"Sure! When people talk about {concept}, they mean {desc}. Let me know if you want an example.",
        ])
        msgs = [{"role": "user", "content": opener}, {"role": "assistant", "content": reply}]
        follow = rng.choice(W.FOLLOW_UPS)
        if concept in W.OTHER_CONCEPT and rng.random() < 0.4:
            follow = f"How is it different from {W.OTHER_CONCEPT[concept]}?"
        if rng.random() < 0.3:
            msgs += [{"role": "user", "content": follow},
                     {"role": "assistant", "content": rng.choice([
                         f"Good question. The key idea to hold on to is {desc}; the details build on that.",
                         f"Think of it this way: {concept} is about {desc}. Everything else follows from that."])}]
            follow = rng.choice([f for f in W.FOLLOW_UPS if f != follow])
        return msgs + [{"role": "user", "content": follow}]
    if r < 0.6:
        goal = rng.choice(sorted(W.GOALS))
        tips = W.GOALS[goal]
        chosen = rng.sample(tips, 3)
        opener = rng.choice([f"I want to {goal}. Any advice?", f"Give me three tips to {goal}.",
                             f"How can I {goal}?"])
        if rng.random() < 0.5:
            reply = "Here are three ideas:\n" + "\n".join(f"{i + 1}. {capitalize(t)}." for i, t in enumerate(chosen))
            follow = fill_slots(rng, rng.choice(W.LIST_FOLLOW_UPS))
        else:
            reply = (f"That's a great goal! A few things help: {chosen[0]}, {chosen[1]} and {chosen[2]}. "
                     f"What does your situation look like right now?")
            follow = f"{fill_slots(rng, rng.choice(W.SITUATIONS))}. What should I do first?"
        return [{"role": "user", "content": opener}, {"role": "assistant", "content": reply},
                {"role": "user", "content": follow}]
    if r < 0.75:
        a = first_name(rng)
        qty, unit_price = rng.randint(3, 30), rng.choice([2, 3, 4, 5, 8, 12, 15])
        item, items = rng.choice(W.ITEMS)
        total = qty * unit_price
        opener = f"{a} buys {qty} {items} at ${unit_price} each. How much does {a} spend?"
        reply = f"Each {item} costs ${unit_price}, so {qty} {items} cost {qty} x {unit_price} = ${total}."
        pct = rng.choice([10, 20, 25, 50])
        follow = rng.choice([f"What if there is a {pct}% discount on the whole purchase?",
                             f"And if {a} pays with a ${(total // 50 + 1) * 50} bill, what is the change?",
                             f"How many more {items} could {a} buy with another ${unit_price * rng.randint(2, 9)}?",
                             "Can you explain that to a child using a picture or story?"])
        return [{"role": "user", "content": opener}, {"role": "assistant", "content": reply},
                {"role": "user", "content": follow}]
    if r < 0.88:
        city = rng.choice(W.CITIES)
        days = rng.randint(2, 7)
        interest = rng.choice(["food", "museums", "hiking", "history", "nightlife", "architecture", "markets",
                               "beaches"])
        msgs = [{"role": "user", "content": rng.choice([f"I'm planning a trip to {city}.", f"I'm going to {city} soon!",
                                                        f"Help me plan a visit to {city}."])},
                {"role": "assistant", "content": rng.choice([
                    f"How exciting! {city} has a lot to offer. How many days will you stay, and what do you enjoy?",
                    f"Great choice. To suggest a plan, could you tell me how long you'll be in {city} and your "
                    f"interests?"])},
                {"role": "user", "content": f"{days} days, and I really like {interest}. "
                                            + rng.choice(["What should I do?", "Can you make a day-by-day plan?",
                                                          "What would you recommend?"])}]
        return msgs
    topic = rng.choice(W.TOPICS)
    form = rng.choice(["a short poem", "a two-sentence story", "a slogan", "a title for a blog post"])
    reply = rng.choice([f"Here's an attempt: \"{capitalize(topic)}, quiet and near, / a small bright thing that brings "
                        f"us here.\"",
                        f"How about this: \"Everyone remembers {topic}, but nobody remembers how it began.\"",
                        f"Here is one: \"{capitalize(topic)}: more than it seems.\""])
    follow = rng.choice(["Make it funnier.", "Now make it longer and more detailed.", "Rewrite it for children.",
                         "Can you give me three alternative versions?", "Make it rhyme better.",
                         f"Now write it in the style of a "
                         f"{rng.choice(['news report', 'fairy tale', 'sports commentary'])}."])
    return [{"role": "user", "content": f"Write {form} about {topic}."}, {"role": "assistant", "content": reply},
            {"role": "user", "content": follow}]


GENERATORS: dict[str, Callable[[random.Random], Messages]] = {
    "conversation": gen_conversation,
    "translation": gen_translation,
    "summarization": gen_summarization,
    "qa": gen_qa,
    "math_reasoning": gen_math_reasoning,
    "rag": gen_rag,
    "coding": gen_coding,
    "writing": gen_writing,
    "roleplay": gen_roleplay,
    "stem": gen_stem,
    "humanities": gen_humanities,
    "extraction": gen_extraction,
    "reasoning": gen_reasoning,
}
