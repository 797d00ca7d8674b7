"""Write a history-free tree that can be pushed to a Hugging Face Space as it is (`make space OUT=dir`).

    python scripts/export_space.py --out /tmp/speclens-space

What goes in: app.py, the `core` and `demo` packages whole (drafters are imported by name from the method table),
the `analysis` modules they import (followed through `import` statements anywhere in a file, so lazy imports count
too), the assets it reads at run time (the drafters, results, lessons and prompts),
requirements.txt and the README with its Space front matter. What stays out: tests, training data, experiment
scripts, the Makefile, docs. Refuses (exit 1) when any file is over the Hub's 10 MB limit for files outside
Git LFS, and prints the tree's size.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "demo", "analysis")
WHOLE = ("core", "demo")  # copied whole; the other packages as far as imports reach
FILES = ("app.py", "requirements.txt", "README.md", "demo/API.md", "LICENSE")
# assets read at run time; training data (assets/distill*) stays out
ASSETS = ("assets/drafters", "assets/results", "assets/lessons", "assets/prompts")
MAX_FILE_BYTES = 10_000_000


def module_file(name: str) -> Path | None:
    """The file of a project module (a package's __init__.py), or None for anything outside the project."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    """Every module name a file imports, at top level or inside functions (`from a import b` yields a and a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def import_closure(starts: list[Path]) -> list[Path]:
    """The project files reachable from `starts` through imports (the starts included), with the __init__.py of each
    package on the way."""
    seen: set[Path] = set()
    todo = list(starts)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # the packages on the way are imported too
                f = module_file(".".join(parts[:i]))
                if f is not None and f not in seen:
                    todo.append(f)
    return sorted(seen)


def export(out: Path) -> tuple[int, int, list[str]]:
    """Write the tree into `out` (emptied first); returns (files, bytes, files over the limit)."""
    if out.exists():
        if out.resolve() == ROOT or ROOT in out.resolve().parents:
            raise SystemExit(f"error: --out {out} lies inside the repository; choose a folder outside it")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = [ROOT / f for f in FILES if (ROOT / f).is_file()]
    whole = sorted(p for pkg in WHOLE for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)
    files += import_closure([ROOT / "app.py", *whole])
    for folder in ASSETS:
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file())
    total, too_big = 0, []
    for src in dict.fromkeys(files):
        rel = src.relative_to(ROOT)
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)
        size = src.stat().st_size
        total += size
        if size > MAX_FILE_BYTES:
            too_big.append(f"{rel} ({size / 1e6:.1f} MB)")
    return len(dict.fromkeys(files)), total, too_big


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/export_space.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the folder to write (replaced; outside the repository)")
    args = p.parse_args(argv)
    n, total, too_big = export(Path(args.out))
    print(f"space tree: {n} files, {total / 1e6:.1f} MB in {args.out}")
    if too_big:
        print(f"error: over the Hub's 10 MB limit for a file: {', '.join(too_big)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
