"""The word lists the training prompts are built from: names, places, topics, sentence pieces in four
languages, coding tasks, writing forms, puzzles... They live in assets/prompts/word_lists.json (one list per
key) so that they can be read and extended without touching code; `load_word_lists` reads them.

JSON has no tuples: an entry that is itself a list (a (singular, plural) pair, a puzzle with its answer) is
read back as a tuple, as the prompt generators expect. The top level of each list, and dict values, stay
lists and dicts.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

WORD_LISTS_FILE = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "word_lists.json"


def _entries_as_tuples(value: Any) -> Any:
    """Lists inside a list (or inside a dict's values, at any depth) become tuples."""
    if isinstance(value, list):
        return tuple(_entries_as_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _entries_as_tuples(v) for k, v in value.items()}
    return value


def _top_level(value: Any) -> Any:
    if isinstance(value, list):
        return [_entries_as_tuples(v) for v in value]
    if isinstance(value, dict):
        return {k: _top_level(v) for k, v in value.items()}
    return value


@functools.cache
def load_word_lists(path: str | Path = WORD_LISTS_FILE) -> SimpleNamespace:
    """Every list of the file as an attribute: `load_word_lists().FIRST_NAMES`."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return SimpleNamespace(**{name: _top_level(value) for name, value in data.items()})
