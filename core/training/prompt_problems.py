"""Prompt generators for the problem-solving categories: math word problems with random numbers (math_reasoning),
logic puzzles (reasoning), coding tasks around small functions of the standard library (coding), and science
exercises (stem). Like every generator in core.training.prompt_categories (whose GENERATORS table lists these),
each takes a seeded `random.Random` and returns one message list.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import random
import textwrap
import warnings

from core.training.prompt_text import Messages, first_name, user_turn
from core.training.word_lists import load_word_lists

W = load_word_lists()

LANGS_CODE = ["Python"] * 6 + ["JavaScript", "JavaScript", "TypeScript", "Java", "C++", "C", "Go", "Rust", "C#",
                                "Ruby", "Kotlin"]


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
