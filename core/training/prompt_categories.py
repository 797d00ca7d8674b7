"""One prompt generator per training category: each takes a seeded `random.Random` and returns one message
list (the last message a user turn). Templates are written here; the words that fill them come from
assets/prompts/word_lists.json (core.training.word_lists) and core.training.prompt_text.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import random
import textwrap
import warnings
from collections.abc import Callable

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

LANGS_CODE = ["Python"] * 6 + ["JavaScript", "JavaScript", "TypeScript", "Java", "C++", "C", "Go", "Rust", "C#",
                                "Ruby", "Kotlin"]


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


def _money(x: float) -> str:
    return f"${x:,.2f}" if x != int(x) else f"${int(x):,}"




def _math_problem(rng: random.Random) -> str:
    a, b = first_name(rng), first_name(rng)
    item, items = rng.choice(W.ITEMS)
    n1, n2, n3 = rng.randint(3, 40), rng.randint(2, 25), rng.randint(2, 12)
    price = rng.choice([0.5, 0.75, 1.25, 2, 3, 4.5, 6, 12])
    pct = rng.choice([10, 15, 20, 25, 30, 40, 50])
    templates = [
        f"{a} has {n1} {items}. {b} gives {a} {n2} more, and then {a} gives away {n3}. How many {items} does {a} "
        f"have now?",
        f"A store sells {items} for {_money(price)} each. {a} buys {n1} {items} and pays with a "
        f"${min(bill for bill in (10, 20, 50, 100, 200, 500) if bill > n1 * price)} bill. "
        f"How much change does {a} get?",
        f"{a} reads {n2} pages every day. The book has {n2 * n1 + n3} pages. How many days does it take to finish "
        f"the book?",
        f"A train travels at {rng.randint(40, 140)} km/h for {n3} hours and then at {rng.randint(40, 140)} km/h for "
        f"{rng.randint(1, 6)} more hours. How far does it travel in total?",
        f"A jacket costs {_money(rng.randint(30, 250))}. It is on sale for {pct}% off. What is the sale price?",
        f"{a} is {n2} years old. {b} is {n3} years older than twice {a}'s age. How old is {b}?",
        f"There are {n1 + n2} students in a class. {pct}% of them walk to school and the rest take the bus. "
        f"How many take the bus?",
        f"A rectangle is {n1} cm long and {n2} cm wide. What are its area and its perimeter?",
        f"{a} saves {_money(rng.randint(5, 60))} each week. How many weeks will it take to save "
        f"{_money(rng.randint(200, 1500))}?",
        f"A recipe needs {n3} eggs for {rng.randint(2, 6)} people. How many eggs are needed for "
        f"{rng.randint(7, 30)} people?",
        f"{a} worked {n3} hours on Monday, {rng.randint(2, 10)} hours on Tuesday and {rng.randint(2, 10)} hours on "
        f"Wednesday, earning {_money(rng.randint(12, 45))} per hour. How much did {a} earn?",
        f"The average of four numbers is {n1}. Three of them are {n2}, {n3} and {n1 + n3}. What is the fourth number?",
        f"A tank holds {rng.randint(100, 900)} liters. It is filled at {rng.randint(5, 40)} liters per minute. "
        f"How long "
        f"does it take to fill the tank from empty?",
        f"Solve for x: {rng.randint(2, 12)}x + {rng.randint(1, 50)} = {rng.randint(51, 200)}.",
        f"Solve the system of equations: x + y = {n1 + n2}, x - y = {n1 - n2}.",
        f"What is {rng.randint(12, 99)} multiplied by {rng.randint(12, 99)}?",
        f"What is {pct}% of {rng.randint(40, 2000)}?",
        f"{a} invests {_money(rng.randint(1, 20) * 500)} at {rng.randint(2, 9)}% annual interest, compounded yearly. "
        f"How much is the investment worth after {n3} years?",
        f"A bag has {n2} red marbles and {n3} blue marbles. If you pick one marble at random, what is the probability "
        f"that it is blue?",
        f"{a} and {b} share {n1 * 6} {items} in the ratio {rng.randint(1, 5)}:{rng.randint(1, 5)}. How many does "
        f"each get?",
        f"A car uses {rng.randint(4, 12)} liters of fuel per 100 km. Fuel costs {_money(rng.choice([1.5, 1.8, 2.1]))} "
        f"per liter. How much does a {rng.randint(50, 900)} km trip cost?",
        f"What is the sum of all integers from 1 to {rng.randint(20, 500)}?",
        f"A shop sold {n1} {items} on Monday and {pct}% more on Tuesday. How many {items} did it sell over the "
        f"two days?",
        f"{a} runs {rng.randint(3, 15)} km in {rng.randint(18, 95)} minutes. What is {a}'s average speed in km/h?",
        f"A pizza is cut into {rng.choice([6, 8, 10, 12])} slices. {a} eats {rng.randint(2, 3)} slices and {b} eats "
        f"{rng.randint(1, 3)}. What fraction of the pizza is left?",
        f"If {n3} workers can build a wall in {n2} days, how long would it take {n3 + rng.randint(1, 8)} workers "
        f"working "
        f"at the same rate?",
        f"What is the least common multiple of {n1} and {n2 + 2}?",
        f"Convert {rng.randint(1, 20) * 1000 + rng.randint(0, 999)} seconds into hours, minutes and seconds.",
        f"A phone plan costs {_money(rng.randint(10, 40))} per month plus {_money(rng.choice([0.05, 0.1, 0.25]))} per "
        f"text message. {a} sends {rng.randint(20, 400)} messages in a month. What is the bill?",
        f"The sides of a right triangle are {n2} and {n3 + 3}. How long is the hypotenuse?",
        f"{a} buys {n3} {items} at {_money(price)} each and {n2} more at {_money(price * 2)} each. What is the "
        f"total cost?",
    ]
    return rng.choice(templates)


def gen_math_reasoning(rng: random.Random) -> Messages:
    q = _math_problem(rng)
    if rng.random() < 0.1:
        q = f"{q} Also check that your answer makes sense."
    return user_turn(q + rng.choice(W.MATH_SUFFIXES))




def gen_reasoning(rng: random.Random) -> Messages:
    t = rng.choice(W.LOGIC_PUZZLES)
    a, b, c, d = rng.sample(W.FIRST_NAMES, 4)
    start, step = rng.randint(1, 20), rng.randint(2, 9)
    seq_kind = rng.random()
    if seq_kind < 0.4:
        seq = [start + step * i for i in range(5)]
    elif seq_kind < 0.7:
        seq = [start * (step // 3 + 2) ** i for i in range(5)]
    else:
        seq = [start + i * i for i in range(5)]
    cows = rng.randint(2, 20)
    hens = rng.randint(2, 20)
    xs, ys, zs = rng.choice(W.CLASSES)
    n = rng.randint(3, 9)
    text = t.format(a=a, b=b, c=c, d=d, s=rng.choice(W.SURNAMES), xs=xs, ys=ys, zs=zs,
                    weekday=rng.choice(W.WEEKDAYS), n=n,
                    m=n * rng.randint(2, 20), seq=", ".join(map(str, seq)) + ", ...", heads=cows + hens,
                    legs=4 * cows + 2 * hens, hour=rng.randint(1, 12), minute=rng.choice([0, 15, 20, 30, 45, 50]))
    return user_turn(text + rng.choice(["", "", " Think it through carefully.", " Explain step by step."]))


@functools.lru_cache(maxsize=1)
def _stdlib_functions() -> tuple[tuple[str, str], ...]:
    """(qualified name, source) of small pure-Python standard-library functions."""
    out = []
    for mod_name in ("textwrap", "string", "bisect", "heapq", "statistics", "shlex", "fnmatch", "posixpath", "glob",
                     "calendar", "colorsys", "difflib", "functools", "random", "base64", "json.encoder", "csv",
                     "ipaddress", "fractions", "html", "urllib.parse", "copy", "pprint", "quopri", "uu"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except Exception:
            continue
        for name in sorted(vars(mod)):
            obj = getattr(mod, name)
            if name.startswith("__") or not inspect.isfunction(obj) or obj.__module__ != mod.__name__:
                continue
            try:
                src = textwrap.dedent(inspect.getsource(obj))
            except (OSError, TypeError):
                continue
            n_lines = src.count("\n")
            if 4 <= n_lines <= 30 and len(src) < 1400:
                out.append((f"{mod_name}.{name}", src))
    return tuple(out)


def _strip_docstring(src: str) -> str:
    import ast

    tree = ast.parse(src)
    fn = tree.body[0]
    if (fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
            and isinstance(fn.body[0].value.value, str)):
        fn.body = fn.body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def gen_coding(rng: random.Random) -> Messages:
    r = rng.random()
    name, desc = rng.choice(W.FUNCTION_SPECS)
    lang = rng.choice(LANGS_CODE)
    if r < 0.42:
        return user_turn(rng.choice([
            f"Write a {lang} function `{name}` that {desc}.",
            f"Implement a function in {lang} that {desc}. Include a short explanation.",
            f"Write a {lang} function that {desc}, and add a few test cases.",
            f"How would I write code that {desc} in {lang}?",
            f"Can you write an efficient {lang} solution for this: a function that {desc}? State its time complexity.",
            f"I need a {lang} helper that {desc}. Keep it short and readable.",
        ]))
    if r < 0.62:
        fn_name, src = rng.choice(_stdlib_functions())
        short = fn_name.rsplit(".", 1)[-1]
        if rng.random() < 0.3:
            src = _strip_docstring(src)
            return user_turn(rng.choice([
                f"Add a docstring and type hints to this Python function:\n\n```python\n{src}```",
                f"Write unit tests with pytest for this function:\n\n```python\n{src}```"]))
        return user_turn(rng.choice([
            f"Explain what the following Python function does:\n\n```python\n{src}```",
            f"Walk me through this code line by line:\n\n```python\n{src}```",
            f"What is `{short}` doing here, and can you suggest any improvements?\n\n```python\n{src}```",
            f"Rewrite this Python function in {rng.choice(LANGS_CODE[6:])}:\n\n```python\n{src}```",
        ]))
    if r < 0.72:
        snippet, expect = rng.choice(W.BUGGY_SNIPPETS)
        return user_turn(rng.choice([f"This code has a bug. {expect} Find and fix it.\n\n```\n{snippet}```",
                                 f"Why doesn't this work? {expect}\n\n```\n{snippet}```",
                                 f"Review this code and point out any problems:\n\n```\n{snippet}```"]))
    if r < 0.82:
        return user_turn(rng.choice([f"Write an SQL query that {rng.choice(W.SQL_TASKS)}.",
                                 f"Given tables customers, orders and products, write SQL that "
                                 f"{rng.choice(W.SQL_TASKS)}."]))
    if r < 0.9:
        return user_turn(rng.choice([f"Write a regular expression that matches {rng.choice(W.REGEX_TARGETS)}.",
                                 f"How do I {rng.choice(W.SHELL_TASKS)} on Linux?",
                                 f"Give me a shell one-liner to {rng.choice(W.SHELL_TASKS)}."]))
    topic = rng.choice([
        "the difference between a list and a generator in Python", "what a race condition is",
        "when to use a hash map instead of a list", "how garbage collection works", "what Big-O notation means",
        "the difference between processes and threads", "what a REST API is", "how git branches work",
        "why immutability helps in concurrent code", "what dependency injection is",
        "how a hash table handles collisions",
        "what unit tests and integration tests are", "how HTTPS keeps data private", "what a closure is in JavaScript",
        "the difference between SQL and NoSQL databases", "what recursion depth limits are",
    ])
    return user_turn(rng.choice([f"Explain {topic}.", f"Can you explain {topic} with a short code example?",
                             f"In simple terms, {topic}?".replace("In simple terms, the",
                             "In simple terms, what is the")]))


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


def gen_stem(rng: random.Random) -> Messages:
    concept, _ = rng.choice(W.CONCEPTS)
    r = rng.random()
    if r < 0.6:
        return user_turn(rng.choice([
            f"Explain {concept} in simple terms.", f"Explain {concept} to {rng.choice(W.AUDIENCES)}.",
            f"What are the main applications of {concept}?", f"Describe how {concept} works, step by step.",
            f"What are common misconceptions about {concept}?", f"Write a short lesson plan to teach {concept}.",
            f"How would you explain {concept} using an everyday analogy?",
            f"What experiments or evidence support our understanding of {concept}?",
        ]))
    m, v, t = rng.randint(1, 90), rng.randint(2, 40), rng.randint(2, 20)
    compounds = ["water (H2O)", "carbon dioxide (CO2)", "glucose (C6H12O6)", "sodium chloride (NaCl)", "ammonia (NH3)",
                 "sulfuric acid (H2SO4)", "methane (CH4)", "calcium carbonate (CaCO3)", "ethanol (C2H5OH)"]
    return user_turn(rng.choice([
        f"A ball is dropped from a height of {m} meters. Ignoring air resistance, how long does it take to hit the "
        f"ground, and how fast is it moving?",
        f"A car accelerates from rest to {v} m/s in {t} seconds. What is its acceleration and how far does it travel?",
        f"A resistor of {m} ohms is connected to a {v} volt battery. What current flows, and how much power is used?",
        f"What is the molar mass of {rng.choice(compounds)}? Show the calculation.",
        f"An object of mass {m} kg moves at {v} m/s. What is its kinetic energy?",
        f"How much energy is needed to heat {t} liters of water from {v} degrees C to boiling?",
        f"A wave has a frequency of {m * 10} Hz and a wavelength of {t / 10} m. What is its speed?",
        f"Find the derivative of f(x) = {t}x^3 - {v}x^2 + {m}x and explain each step.",
        f"Compute the integral of {t}x^2 + {v} from 0 to {rng.randint(1, 6)}.",
        f"A population of bacteria doubles every {t} minutes. Starting from {m} cells, how many are there after "
        f"{t * rng.randint(2, 6)} minutes?",
    ]))


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
