"""The method table and its one parser (core.methods)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from core.drafters.moa import MoADrafter
from core.methods import METHODS, TRAINED, Method, MethodName, drafter_class, method_labels, parse_method


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


# ----- the table's fields and the lists derived from them ----------------------------------------------------
def test_fields_derive_every_list():
    from core.client_server import protocol
    from core.drafters.published_formats import METHOD_OF
    from core.methods import lookup_names, methods_where, shipped_names, shipped_tli, static_tree_methods

    assert methods_where(trained=False) == ["ar", "pld"]
    assert methods_where(tree="dynamic") == ["eagle2", "moa"] and static_tree_methods() == ("medusa", "amphista")
    assert methods_where(tli=True) == ["moa"]
    assert protocol.METHODS == ("ar", "eagle2", "moa")  # the wire codes follow the table's order: keep it
    assert {m: METHODS[m].client_server for m in protocol.METHODS} == {"ar": "api", "eagle2": "features",
                                                                       "moa": "offline"}
    assert METHOD_OF == {"eagle": "eagle2", "medusa": "medusa"}
    assert lookup_names() == [f"{m}+lookup" for m in TRAINED]
    tli = [f"moa-tli{n}" for n in shipped_tli() if n]  # as found under assets/drafters (moa-tli1, moa-tli3)
    assert shipped_names() == ["ar", "pld", "eagle2", "moa", *tli, "medusa", "amphista"]
    assert shipped_names(tree="dynamic") == ["eagle2", "moa", *tli]
    with pytest.raises(ValueError, match="tree 'bushy'; choose one of none, chain, dynamic, static"):
        Method("x", "X", "a method with an unknown draft shape", tree="bushy")
    with pytest.raises(ValueError, match="no field colour_of.*tree"):
        methods_where(colour_of="red")


def test_tli_names_are_built_and_read_here():
    from core.methods import tli_of, with_tli

    assert with_tli("moa", 3) == "moa-tli3" and with_tli("moa+lookup", 1) == "moa-tli1+lookup"
    assert with_tli("moa-tli3", 0) == "moa" and with_tli("moa", None) == "moa"
    assert [tli_of(n) for n in ("moa", "moa-tli3", "moa-tli1+lookup", "moa@h24", "eagle2", "oracle")] == \
        [0, 3, None, None, None, None]
    with pytest.raises(ValueError, match="takes no TLI N.*moa"):
        with_tli("medusa", 1)
    assert MethodName("moa", 3, True, "h24").base_checkpoint == "moa-tli3"


def test_load_method_fallbacks(tmp_path, monkeypatch):
    """The one builder of "the shipped drafter, else a random one": each caller picks its fallback, and a folder
    the caller names fails with its own error, never a random stand-in."""
    from core import methods
    from core.drafters.base import Autoregressive
    from core.target import tiny_target

    target = tiny_target()
    assert isinstance(methods.load_method("ar", target).drafter, Autoregressive)
    assert methods.load_method("pld", target).source == "built-in"
    seeded = methods.load_method("moa-tli1", target, "random", random_options={"seed": 3})
    assert seeded.source == "random" and seeded.drafter.config.tli == 1 and not seeded.fallback
    with pytest.raises(FileNotFoundError):
        methods.load_method("eagle2", target, str(tmp_path / "nothing"), fallback="unloadable")
    # the shipped checkpoints are made for SmolLM2: on the tiny target they fail to load
    broken = methods.load_method("medusa", target, fallback="unloadable")
    assert broken.source == "random" and "could not be loaded" in broken.fallback and broken.error is not None
    with pytest.raises(ValueError):
        methods.load_method("medusa", target, fallback="missing")
    monkeypatch.setattr(methods, "DRAFTER_DIR", tmp_path)  # nothing shipped
    missing = methods.load_method("eagle2+lookup", target, fallback="missing")
    assert missing.source == "random" and missing.fallback == "no trained checkpoint at assets/drafters/eagle2"
    assert missing.drafter.inner is not None  # the lookup branch wraps the random drafter
    with pytest.raises(FileNotFoundError, match="no trained eagle2 drafter is shipped"):
        methods.load_method("eagle2", target)
    with pytest.raises(ValueError, match="fallback 'always'"):
        methods.load_method("eagle2", target, fallback="always")


# ----- no other file keeps a list of methods or builds / parses their names ----------------------------------
ROOT = Path(__file__).resolve().parents[1]
HOME = {"core/methods.py", "core/method_table.py"}  # where the table and the one parser live


def name_violations(path: Path, names: set[str], prefixes: list[str]) -> list[str]:
    """Lines of `path` with two or more string literals that are method names (a list kept by hand), and code
    that builds or parses TLI names itself: 'moa-tli' in an f-string, in a regex, or alone (to slice a name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT)
    in_fstring = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    per_line: dict[int, list[str]] = {}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if any(p in text for p in prefixes):
                out.append(f"{rel}:{node.lineno}: builds a TLI name in an f-string (use core.methods.with_tli)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstring:
            if node.value in names:
                per_line.setdefault(node.lineno, []).append(node.value)
            if any(node.value == p or re.search(re.escape(p) + r"[(\[\\{]", node.value) for p in prefixes):
                out.append(f"{rel}:{node.lineno}: parses a TLI name itself (use core.methods.parse_method / tli_of)")
    out += [f"{rel}:{line}: a list of methods kept by hand {found} (derive it from core.methods)"
            for line, found in sorted(per_line.items()) if len(found) >= 2]
    return out


def project_files() -> list[Path]:
    files = [ROOT / "app.py"] + [p for d in ("core", "analysis", "demo", "scripts") for p in (ROOT / d).rglob("*.py")]
    return [p for p in files if str(p.relative_to(ROOT)) not in HOME]


def test_one_place_knows_each_method():
    from core.methods import lookup_names, methods_where, shipped_names

    names = {*METHODS, *shipped_names(), *lookup_names()}
    prefixes = [f"{m}-tli" for m in methods_where(tli=True)]
    found = [v for p in project_files() for v in name_violations(p, names, prefixes)]
    assert not found, "\n".join(found)


def test_the_name_check_sees_what_it_should(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    bad = tmp_path / "bad.py"
    bad.write_text('UNTRAINED = ("ar", "pld")\nlabel = f"moa-tli{n}"\nn = int(label[len("moa-tli"):])\n'
                   'm = re.fullmatch(r"moa-tli(\\d+)", x)\n'
                   '"""Docstrings may name moa-tli1 and "moa", "eagle2"."""\nif method == "moa":\n    pass\n')
    found = name_violations(bad, {"ar", "pld", "moa", "eagle2"}, ["moa-tli"])
    assert sorted(int(f.split(":")[1]) for f in found) == [1, 2, 3, 4], found
