"""Run a generation with a drafter's per-cycle calls wrapped: the one way the profilers in `analysis` tell the
drafter's work (its prefill `begin`, and `draft` + `accept` each cycle) from the target's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from core.drafters.base import Drafter

CALLS = ("begin", "draft", "accept")


@contextmanager
def wrapped_calls(drafter: Drafter, wrap: Callable[[str, Callable], Callable]) -> Iterator[None]:
    """Inside the block, drafter.<name> is wrap(name, the original) for each of CALLS; restored afterwards."""
    originals = {name: getattr(drafter, name) for name in CALLS}
    for name, fn in originals.items():
        setattr(drafter, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(drafter, name, fn)
