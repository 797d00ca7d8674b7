"""The drafters of a benchmark run, from what its command line names: method labels (core.methods' names:
`moa-tli3`, `eagle2+lookup`, `moa@h24`), `--drafter` specs (`random`, `METHOD=PATH`, `METHOD=random`) and
`--drafter-dir DIR` (DIR/<label> first). Every drafter is built by core.methods.load_method.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from core.drafters.base import Drafter
from core.methods import MethodName, load_method, parse_method
from core.target import Target


def parse_label(label: str) -> tuple[str, dict]:
    """A label as (name without TLI, {"tli": N}): 'moa-tli1+lookup' -> ('moa+lookup', {'tli': 1}); else (label, {})."""
    parsed = parse_method(label)
    if parsed.tli is None:
        return label, {}
    return MethodName(parsed.base, None, parsed.lookup, parsed.variant).name, {"tli": parsed.tli}


def checkpoint_label(label: str) -> str:
    """The shipped checkpoint a label uses: 'eagle2+lookup' -> 'eagle2'."""
    parsed = parse_method(label)
    return parsed.checkpoint or parsed.base


def parse_drafter_specs(specs: Sequence[str]) -> dict[str, str]:
    """['random', 'moa=PATH'] -> {'*': 'random', 'moa': 'PATH'}."""
    out = {}
    for s in specs:
        key, sep, value = s.partition("=")
        if not sep:
            key, value = "*", s
        if not value:
            raise ValueError(f"--drafter {s!r}: expected METHOD=PATH, METHOD=random or random")
        out[key] = value
    return out


def resolve_drafter(label: str, specs: Mapping[str, str], drafter_dir: str | None) -> str | None:
    """Checkpoint for a method label: an explicit spec, DIR/<label>, the wildcard spec, else None (shipped)."""
    if not parse_method(label).method.trained:
        return None
    base = checkpoint_label(label)
    for key in (label, parse_label(label)[0], base, parse_label(base)[0]):
        if key in specs:
            return specs[key]
    if drafter_dir and (Path(drafter_dir) / base).is_dir():
        return str(Path(drafter_dir) / base)
    return specs.get("*")


def fix_tree(drafter: Drafter) -> None:
    """Keep the tree a checkpoint stores instead of sizing it for this machine (bench --trees fixed)."""
    inner = getattr(drafter, "inner", drafter)
    if hasattr(inner, "tree_auto"):
        inner.tree_auto, inner.tree_choice = False, None


def build_drafters(target: Target, labels: Sequence[str], specs: Mapping[str, str], drafter_dir: str | None
                   ) -> tuple[dict[str, Drafter], dict[str, str]]:
    """label -> drafter, and label -> where it came from ("built-in", "shipped: assets/drafters/NAME" or the
    spec). A missing shipped checkpoint is an error here: a benchmark never stands a random drafter in unasked."""
    drafters, sources = {}, {}
    for label in labels:
        spec = resolve_drafter(label, specs, drafter_dir)
        loaded = load_method(label, target, spec)
        drafters[label] = loaded.drafter
        sources[label] = {"built-in": "built-in", "shipped": f"shipped: assets/drafters/{checkpoint_label(label)}"
                          }.get(loaded.source, spec)
    return drafters, sources
