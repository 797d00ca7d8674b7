"""Where the training prompts' text comes from, apart from the templates of each category.

* helpers that fill a template's named slots from the word lists (core.training.word_lists, loaded from
  assets/prompts/word_lists.json) and trim text;
* passages cut from the docstrings of a fixed list of Python standard library modules (and the Zen of
  Python), read in sorted order so the prompts are stable for a given Python version;
* small synthetic documents (news items, biographies, town guides) whose facts are known, so that
  retrieval and extraction questions can ask about them;
* sentence generators for translation prompts (English, German, French, Spanish).

core.training.prompt_categories builds each category's prompts from these; core.training.prompts is the API.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import random
import re
import warnings
from collections.abc import Callable

from core.training.word_lists import load_word_lists

W = load_word_lists()

Messages = list[dict]


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------

def user_turn(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def first_name(rng: random.Random) -> str:
    return rng.choice(W.FIRST_NAMES)


def full_name(rng: random.Random) -> str:
    return f"{rng.choice(W.FIRST_NAMES)} {rng.choice(W.SURNAMES)}"


def capitalize(s: str) -> str:
    return s[:1].upper() + s[1:]


def fill_slots(rng: random.Random, template: str) -> str:
    """Fill the named slots that appear in a template from the shared banks."""
    weekday, weekday2 = rng.sample(W.WEEKDAYS, 2)
    slots = {
        "n": rng.randint(2, 12), "k": rng.randint(1, 3), "age": rng.randint(19, 71), "hour": rng.randint(1, 11),
        "city": rng.choice(W.CITIES), "weekday": weekday, "weekday2": weekday2, "name": first_name(rng),
        "tone": rng.choice(W.TONES), "audience": rng.choice(W.AUDIENCES), "word": rng.choice(W.WORDS),
        "place_noun": rng.choice(W.PLACE_NOUNS), "room": rng.choice(W.ROOMS), "relative": rng.choice(W.RELATIVES),
        "period": rng.choice(W.PERIODS), "chore": rng.choice(W.CHORES), "food": rng.choice(W.FOODS),
        "language": rng.choice(W.LANGUAGES), "job": rng.choice(W.JOBS), "business": rng.choice(W.BUSINESSES),
        "gadget": rng.choice(W.GADGETS), "event_kind": rng.choice(W.EVENT_KINDS), "topic": rng.choice(W.TOPICS),
        "howto": rng.choice(W.HOWTO_TASKS), "concept": rng.choice(W.CONCEPTS)[0], "worry": rng.choice(W.WORRIES),
        "sentence": english_sentence(rng),
    }
    names = {m for m in re.findall(r"{(\w+)}", template)}
    return template.format(**{k: slots[k] for k in names})


def _words(text: str) -> list[str]:
    return text.split()


def trim_words(text: str, max_words: int) -> str:
    """Cut text to at most max_words words, preferring to end at a sentence boundary."""
    words = text.split()
    if len(words) <= max_words:
        return text
    cut = " ".join(words[:max_words])
    end = max(cut.rfind(". "), cut.rfind("? "), cut.rfind("! "))
    if end > len(cut) // 2:
        return cut[: end + 1]
    return cut.rstrip(",;:") + "..."


# ------------------------------------------------------------------------------------------
# Passages from the standard library's docstrings
# ------------------------------------------------------------------------------------------



def _clean_doc(doc: str) -> list[str]:
    """Prose paragraphs of a docstring: drops doctest examples, code blocks, tables and headers."""
    paras = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        lines = [ln.strip() for ln in block.strip().splitlines() if ln.strip()]
        if not lines:
            continue
        if any(ln.startswith((">>>", "...", "$", "%", "|", "+-", "==", "--")) for ln in lines):
            continue
        if sum(1 for ln in lines if re.match(r"^[\w.]+\(.*\)\s*(->.*)?$", ln)) > len(lines) / 2:
            continue  # signature lines
        text = " ".join(lines)
        words = text.split()
        if len(words) < 6:
            continue
        alpha = sum(1 for w in words if re.fullmatch(r"[A-Za-z][A-Za-z'-]*[.,;:]?", w))
        if alpha < 0.6 * len(words):
            continue
        paras.append(text)
    return paras


def _zen_of_python() -> str:
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # noqa: F401  (prints the Zen when first imported)
    return "".join(this.d.get(c, c) for c in this.s)


@functools.lru_cache(maxsize=1)
def stdlib_passages() -> tuple[tuple[str, str], ...]:
    """(title, text) passages of 80-250 words from standard-library docstrings, in a fixed order."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(title: str, paras: list[str]) -> None:
        text = trim_words(" ".join(" ".join(paras).split()), 250)
        if len(text.split()) >= 80 and text not in seen:
            seen.add(text)
            out.append((title, text))

    for mod_name in W.STDLIB_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except Exception:  # a module missing from this build of Python: skip it
            continue
        if mod.__doc__:
            add(f"the {mod_name} module", _clean_doc(mod.__doc__))
        small: list[str] = []
        for name in sorted(vars(mod)):
            if name.startswith("_"):
                continue
            with warnings.catch_warnings():  # e.g. typing.io warns when touched
                warnings.simplefilter("ignore")
                obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            owner = getattr(obj, "__module__", "") or ""
            if owner != mod_name and not owner.startswith("_" + mod_name.split(".")[-1]):
                continue
            units = [(f"{mod_name}.{name}", obj.__doc__)]
            if inspect.isclass(obj):
                for meth in sorted(vars(obj)):
                    member = vars(obj)[meth]
                    if not meth.startswith("_") and inspect.isroutine(member):
                        units.append((f"{mod_name}.{name}.{meth}", getattr(member, "__doc__", None)))
            for title, doc in units:
                if not isinstance(doc, str):
                    continue
                paras = _clean_doc(doc)
                n = len(" ".join(paras).split())
                if n >= 80:
                    add(title, paras)
                elif n >= 15:
                    small.append(f"{title.split('.', 1)[1] if '.' in title else title}: {' '.join(paras)}")
        # Group the short entries of one module into reference-style passages.
        group: list[str] = []
        for entry in small:
            group.append(entry)
            if len(" ".join(group).split()) >= 110:
                add(f"functions of the {mod_name} module", group)
                group = []
    add("the Zen of Python", [_zen_of_python().replace("\n", " ")])
    return tuple(out)


# ------------------------------------------------------------------------------------------
# Synthetic documents with known facts
# ------------------------------------------------------------------------------------------

def _news_doc(rng: random.Random) -> tuple[str, str, dict]:
    city = rng.choice(W.CITIES)
    project, short = rng.choice(W.PROJECTS)
    org = rng.choice(W.ORG_KINDS)
    person = full_name(rng)
    role = rng.choice(W.ROLES)
    cost = rng.choice([rng.randint(2, 95), round(rng.uniform(1.2, 9.9), 1)])
    months = rng.randint(6, 40)
    people = rng.randint(3, 90) * 1000
    weekday = rng.choice(W.WEEKDAYS)
    concern = rng.choice(W.CONCERNS)
    meeting = f"{rng.choice(W.MONTHS)} {rng.randint(1, 28)}"
    share = rng.randint(15, 70)
    facts = {"city": city, "project": project, "short": short, "org": org, "person": person, "role": role,
             "cost": f"{cost} million euros", "months": months, "people": people, "weekday": weekday,
             "concern": concern, "meeting": meeting, "share": share}
    opening = rng.choice([
        f"The {org} of {city} announced on {weekday} that it will build {project}.",
        f"{city}'s {org} has approved plans for {project}, officials said on {weekday}.",
        f"After two years of debate, the {org} in {city} voted on {weekday} to go ahead with {project}.",
    ])
    body = [
        rng.choice([f"The project is expected to cost about {cost} million euros and to take {months} months to "
                    f"complete.",
                    f"Construction will take roughly {months} months, with a budget of {cost} million euros."]),
        rng.choice([f"According to the {org}, the {short} will serve around {people:,} residents.",
                    f"Officials estimate that about {people:,} people will benefit from the {short}."]),
        rng.choice([f"\"This is an investment in the next generation,\" said {person}, the {role} in charge.",
                    f"{person}, who serves as {role}, called the decision \"a long overdue step for {city}\"."]),
        rng.choice([f"Not everyone is convinced: some residents worry about {concern}.",
                    f"Critics have raised concerns about {concern}, and a local petition has gathered signatures."]),
        f"About {share} percent of the funding will come from national grants, with the rest paid from the city "
        f"budget.",
        rng.choice([f"A public meeting to present the detailed plans is scheduled for {meeting}.",
                    f"Residents can comment on the plans until {meeting}, when a final design will be chosen."]),
    ]
    middle = body[:4]
    rng.shuffle(middle)
    text = " ".join([opening] + middle + body[4:])
    return f"{capitalize(short)} planned in {city}", text, facts


def _bio_doc(rng: random.Random) -> tuple[str, str, dict]:
    name = full_name(rng)
    first = name.split()[0]
    born = rng.randint(1931, 1992)
    town = rng.choice(W.TOWN_PREFIX) + rng.choice(W.TOWN_SUFFIX)
    field = rng.choice(W.FIELDS)
    city = rng.choice(W.CITIES)
    achievement = rng.choice(W.ACHIEVEMENTS)
    founded = born + rng.randint(26, 40)
    award = rng.choice(W.AWARDS)
    award_year = founded + rng.randint(3, 15)
    org = f"the {rng.choice(W.TOWN_PREFIX)}{rng.choice(['light', 'field', 'stone', 'wave'])} Institute"
    facts = {"name": name, "born": born, "town": town, "field": field, "city": city, "achievement": achievement,
             "founded": founded, "award": award, "award_year": award_year, "org": org}
    sentences = [
        f"{name} (born {born}) is a researcher in {field}, best known for {achievement}.",
        f"{first} grew up in the small town of {town}, where {rng.choice(['her', 'his'])} parents ran "
        f"{rng.choice(['a bakery', 'a hardware store', 'a farm', 'a bookshop', 'a repair workshop'])}.",
        f"After studying {field} at a university in {city}, {first} worked for several years as a teacher "
        f"before returning to research.",
        f"In {founded}, {first} founded {org}, which today employs about {rng.randint(12, 300)} people.",
        f"The work on {achievement} began as a side project and took almost {rng.randint(3, 12)} years.",
        f"{first} received {award} in {award_year}.",
        f"Colleagues describe {first} as {rng.choice(['patient and precise', 'curious and stubborn', 'generous'])}, "
        f"and {first} still gives free public lectures every {rng.choice(W.MONTHS)}.",
    ]
    return f"{name}", " ".join(sentences), facts


def _town_doc(rng: random.Random) -> tuple[str, str, dict]:
    town = rng.choice(W.TOWN_PREFIX) + rng.choice(W.TOWN_SUFFIX)
    kind = rng.choice(W.TOWN_KINDS)
    country = rng.choice(W.COUNTRIES)
    population = rng.randint(2, 60) * 500
    founded = rng.randint(1150, 1890)
    feature = rng.choice(W.TOWN_FEATURES)
    industry = rng.choice(W.INDUSTRIES)
    festival = rng.choice(W.FESTIVALS)
    month = rng.choice(W.MONTHS)
    distance = rng.randint(15, 240)
    city = rng.choice(W.TOWN_PREFIX) + rng.choice(W.TOWN_SUFFIX)
    facts = {"town": town, "kind": kind, "country": country, "population": population, "founded": founded,
             "feature": feature, "industry": industry, "festival": festival, "month": month,
             "distance": distance, "city": city}
    text = " ".join([
        f"{town} is a small {kind} town in {country} with a population of about {population:,}.",
        f"It was founded in {founded} and is known above all for {feature}.",
        f"Most people in {town} work in {industry}, although many young residents commute to larger cities.",
        f"Every year in {month}, the town hosts {festival}, which attracts visitors from all over the region.",
        f"The nearest large city is {city}, about {distance} kilometers away, and a regional train connects "
        f"the two {rng.randint(2, 14)} times a day.",
        rng.choice([f"Visitors are advised to book accommodation early during {month}.",
                    "The old town center is closed to cars, so most visitors explore it on foot.",
                    "A small museum near the station tells the story of the town's founding families."]),
    ])
    return f"{town}", text, facts


SYNTH_DOCS: list[Callable[[random.Random], tuple[str, str, dict]]] = [_news_doc, _bio_doc, _town_doc]


def synth_question(rng: random.Random, kind: str, f: dict) -> str:
    if kind == "_news_doc":
        return rng.choice([
            f"How much is the {f['short']} expected to cost?", f"Who is {f['person']}?",
            f"How long will it take to build the {f['short']}?", "What are residents worried about?",
            f"How many people will the {f['short']} serve?", "When is the public meeting about the plans?",
            "Where does the money for the project come from?", f"What did the {f['org']} announce?",
        ])
    if kind == "_bio_doc":
        first = f["name"].split()[0]
        return rng.choice([
            f"When was {f['name']} born?", f"What is {first} best known for?", f"What did {first} study?",
            f"Which organization did {first} found, and when?", f"Which award did {first} receive?",
            f"Where did {first} grow up?",
        ])
    return rng.choice([
        f"What is {f['town']} known for?", f"How many people live in {f['town']}?", f"When was {f['town']} founded?",
        f"What festival takes place in {f['town']}, and when?", f"How far is {f['town']} from {f['city']}?",
        f"What do most people in {f['town']} do for work?",
    ])


# ------------------------------------------------------------------------------------------
# Sentence generators for translation
# ------------------------------------------------------------------------------------------

def english_sentence(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return (f"{rng.choice(W.EN_SUBJECTS)} {rng.choice(W.EN_VERBS)} {rng.choice(W.EN_OBJECTS)} "
                f"{rng.choice(W.EN_PLACES)} {rng.choice(W.EN_TIMES)}.")
    weekday, weekday2 = rng.sample(W.WEEKDAYS, 2)
    return rng.choice(W.EN_PHRASES).format(
        place_noun=rng.choice(W.PLACE_NOUNS), room=rng.choice(W.ROOMS), n=rng.randint(2, 9), weekday=weekday,
        weekday2=weekday2, hour=rng.randint(1, 11), relative=rng.choice(W.RELATIVES), city=rng.choice(W.CITIES),
        period=rng.choice(W.PERIODS), chore=rng.choice(W.CHORES), language=rng.choice(W.LANGUAGES),
        food=rng.choice(W.FOODS))


def german_text(rng: random.Random) -> str:
    if rng.random() < 0.45:
        return (f"{rng.choice(W.DE_SUBJECTS)} {rng.choice(W.DE_VERBS)} {rng.choice(W.DE_ADVERBIALS)} "
                f"{rng.choice(W.DE_OBJECTS)}.")
    first = (f"{rng.choice(W.DE_ACTORS)} hat {rng.choice(W.DE_TIMES)} {rng.choice(W.DE_NEWS_OBJECTS)} "
             f"{rng.choice(W.DE_PARTICIPLES)}.")
    extra = [s.format(n=rng.randint(2, 400)) for s in rng.sample(W.DE_EXTRA, rng.randint(0, 2))]
    return " ".join([first] + extra)


def romance_text(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        return "French", (f"{rng.choice(W.FR_SUBJECTS)} {rng.choice(W.FR_VERBS)} {rng.choice(W.FR_OBJECTS)} "
                          f"{rng.choice(W.FR_ADVERBIALS)}.")
    return "Spanish", (f"{rng.choice(W.ES_SUBJECTS)} {rng.choice(W.ES_VERBS)} {rng.choice(W.ES_OBJECTS)} "
                       f"{rng.choice(W.ES_ADVERBIALS)}.")


def doc_sentence(rng: random.Random) -> str:
    title, text = rng.choice(stdlib_passages())
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if 8 <= len(s.split()) <= 35]
    return rng.choice(sentences) if sentences else english_sentence(rng)
