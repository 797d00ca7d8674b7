"""The method table and its one parser (core.methods)."""

from __future__ import annotations

import pytest

from core.drafters.moa import MoADrafter
from core.methods import METHODS, TRAINED, MethodName, drafter_class, method_labels, parse_method


@pytest.mark.parametrize("name, parts, checkpoint", [
    ("ar", ("ar", None, False), ""),
    ("pld", ("pld", None, False), ""),
    ("moa", ("moa", None, False), "moa"),
    ("moa-tli3", ("moa", 3, False), "moa-tli3"),
    ("moa-tli1+lookup", ("moa", 1, True), "moa-tli1"),
    ("eagle2+lookup", ("eagle2", None, True), "eagle2"),
    ("amphista", ("amphista", None, False), "amphista"),
    ("moa@h24", ("moa", None, False, "h24"), "moa@h24"),
    ("moa-tli1@new+lookup", ("moa", 1, True, "new"), "moa-tli1@new"),
])
def test_parse_round_trip(name, parts, checkpoint):
    parsed = parse_method(name)
    assert (parsed.base, parsed.tli, parsed.lookup, parsed.variant)[:len(parts)] == parts
    assert parsed.name == name and parsed.checkpoint == checkpoint


@pytest.mark.parametrize("bad", ["eagle", "moa-tli", "medusa-tli1", "ar+lookup+lookup", "", "MOA", 3, "pld@x",
                                 "moa@", "moa@a b"])
def test_unknown_names_list_the_valid_ones(bad):
    with pytest.raises(ValueError) as err:
        parse_method(bad)
    message = str(err.value)
    assert "\n" not in message and all(m in message for m in METHODS)


def test_table_drives_labels_and_classes():
    assert TRAINED == ("eagle2", "moa", "medusa", "amphista")
    labels = method_labels()
    assert set(labels) == set(METHODS) | {f"{m}+lookup" for m in TRAINED}
    assert labels["moa+lookup"] == "Mixture of Attentions + context lookup (moa+lookup)"
    assert MethodName("moa", 3).label == "Mixture of Attentions (TLI N=3)"
    assert drafter_class("moa-tli3+lookup") is MoADrafter
    with pytest.raises(ValueError, match="no trained drafter"):
        drafter_class("pld")
