"""The code's shape: no Python file in core/, analysis/, demo/, scripts/ or app.py over 500 lines, no import circles
between the project's modules (lazy imports inside functions count too), no drafter importing a sibling drafter
(shared machinery lives in core/drafters/trained.py), and no import upwards from core/drafters into core/training or
from core into analysis/ or demo/. Read from the source with `ast`; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "analysis", "demo")
MAX_LINES = 500
LINE_CHECKED = (*PACKAGES, "scripts")  # and app.py
DRAFTERS = ("pld", "eagle2", "moa", "medusa", "amphista")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages and app.py."""
    mods = {"app": root / "app.py"}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules a file imports, anywhere in it (type-checking-only blocks left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _type_checking_only(block)
            for stmt in block.body for n in ast.walk(stmt)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = project_modules(root)
    return {name: imported_modules(path, name, set(mods)) for name, path in mods.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_file_over_the_line_limit():
    files = [ROOT / "app.py", *(p for folder in LINE_CHECKED for p in (ROOT / folder).rglob("*.py"))]
    long = {str(p.relative_to(ROOT)): n for p in files
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by concern): {long}"


def test_no_import_circles():
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_drafters_do_not_import_each_other(drafter):
    graph = import_graph()
    siblings = {f"core.drafters.{d}" for d in DRAFTERS if d != drafter}
    assert not graph[f"core.drafters.{drafter}"] & siblings


def test_no_import_goes_upwards():
    """Drafters run in the app and the benchmark without the training code (the build-time tools that read
    training data live in core/training, e.g. core.training.draft_vocab_build), and core never reaches into
    the analyses or the app."""
    graph = import_graph()
    upwards = {m: sorted(d for d in deps if d.startswith(("analysis", "demo"))
                         or (m.startswith("core.drafters") and d.startswith("core.training")))
               for m, deps in graph.items() if m.startswith("core")}
    upwards = {m: deps for m, deps in upwards.items() if deps}
    assert not upwards, f"imports from a lower layer into a higher one: {upwards}"


def test_the_checks_see_a_circle_and_the_real_imports(tmp_path):
    """The checks themselves: a planted circle (through a lazy import) is found, and a known edge is seen."""
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from core.b import x\n")
    (pkg / "b.py").write_text("def x():\n    from core import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from core.a import y\n")
    for other in ("analysis", "demo"):
        (tmp_path / other).mkdir()
    (tmp_path / "app.py").write_text("import core.c\n")
    graph = import_graph(tmp_path)
    assert import_cycles(graph) == [["core.a", "core.b"]]
    assert graph["core.c"] == set() and graph["app"] == {"core.c"}
    assert "core.training.trainer" in import_graph()["core.training.train"]


def test_no_tracked_file_is_over_the_hub_limit():
    """A Space refuses a pushed file over 10 MB outside Git LFS: weights are sharded under it."""
    import subprocess

    try:
        tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        paths = [ROOT / p for p in tracked.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file outside the ignored folders
        paths = [p for p in ROOT.rglob("*") if p.is_file() and not {".venv", "runs", "data", ".git"} & set(p.parts)]
    big = {str(p.relative_to(ROOT)): p.stat().st_size for p in paths if p.is_file() and p.stat().st_size > 10_000_000}
    assert not big, f"files over 10 MB (shard them, core.drafters.checkpoint.save_weights): {big}"


def test_the_space_export_holds_what_the_app_imports(tmp_path):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("export_space", ROOT / "scripts" / "export_space.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["export_space"] = mod
    spec.loader.exec_module(mod)
    out = tmp_path / "space"
    n, total, too_big = mod.export(out)
    assert not too_big and total < 200e6 and n > 50
    for must in ("app.py", "requirements.txt", "README.md", "analysis/failures.py", "core/drafters/moa.py",
                 "assets/drafters/moa/config.json"):
        assert (out / must).is_file(), must
    assert not (out / "tests").exists() and not list(out.glob("assets/distill*")) and not (out / "Makefile").exists()
    assert (out / "README.md").read_text(encoding="utf-8").startswith("---\ntitle:")  # the Space's front matter
