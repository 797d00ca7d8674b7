"""Method names -> drafters. The one place the CLI, the benchmark and the app build drafters from.

Trained drafters register a loader here (`register`), so adding a method never
touches the callers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from core.drafters.base import Autoregressive, Drafter
from core.drafters.pld import PromptLookupDrafter
from core.target import Target

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DRAFTER_DIR = ASSETS / "drafters"

# method -> builder(target, drafter: folder | "random" | None, options) -> Drafter
_BUILDERS: dict[str, Callable[[Target, str | None, dict], Drafter]] = {
    "ar": lambda target, drafter, opts: Autoregressive(),
    "pld": lambda target, drafter, opts: PromptLookupDrafter(**opts),
}
DESCRIPTIONS = {
    "ar": "plain autoregressive decoding (one target pass per token)",
    "pld": "prompt lookup: copy what followed the last n-gram earlier in the context",
}


def register(name: str, builder: Callable[[Target, str | None, dict], Drafter], description: str) -> None:
    _BUILDERS[name] = builder
    DESCRIPTIONS[name] = description


def available_methods() -> list[str]:
    _load_plugins()
    return list(_BUILDERS)


def default_drafter_folder(name: str) -> Path:
    return DRAFTER_DIR / name


def build_drafter(method: str, target: Target, drafter: str | None = None, **options) -> Drafter:
    """Build the drafter for `method`. `drafter` is a checkpoint folder, "random", or None (the shipped one).

    `<method>+lookup` wraps that method's drafter in core.drafters.lookup_branch (a context-lookup branch).
    """
    _load_plugins()
    from core.drafters.lookup_branch import LookupBranch, base_method

    base = base_method(method)
    if base != method and base in _BUILDERS:  # e.g. "eagle2+lookup"
        return LookupBranch(build_drafter(base, target, drafter, **options))
    if method not in _BUILDERS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(_BUILDERS)}")
    return _BUILDERS[method](target, drafter, options)


def _load_plugins() -> None:
    """Import the trained-drafter modules so that they register themselves (kept lazy: torch modules)."""
    import importlib

    for module in ("core.drafters.registry",):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
