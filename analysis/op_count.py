"""Operator calls per decoding cycle: how many PyTorch calls drafting and the verify pass make.

On a small model each PyTorch call costs a few microseconds of Python and dispatch whatever its size, so a
drafter that makes hundreds of them a cycle pays for that before any arithmetic. `count` runs one generation and
counts, per cycle, for drafting (the drafter's `draft` and `accept`, its own prefill `begin` left out) and for
everything else (the target's passes, verification, cache bookkeeping):

    torch calls      calls into the torch API from Python (functions, tensor methods), seen by a TorchFunctionMode;
    operator calls   ATen operators dispatched to a kernel, seen by a TorchDispatchMode (a call can dispatch
                     several: `linear` is one torch call and one or two operators).

The counts are deterministic for a given prompt, drafter and tree, so unlike times they compare across machines
and under load. `scripts/profile_drafting.py --ops` prints them beside the times.
"""

from __future__ import annotations

from collections import Counter

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from analysis.drafter_calls import wrapped_calls
from core.decoding import generate
from core.drafters.base import Drafter
from core.target import Target


class _Tally:
    """Counts calls under the scope `count` sets (prefill, draft or verify)."""

    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts, self.scope = counts, "prefill"


class _TorchCalls(_Tally, TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.counts[self.scope] += 1
        return func(*args, **(kwargs or {}))


class _OperatorCalls(_Tally, TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[self.scope] += 1
        return func(*args, **(kwargs or {}))


def count(target: Target, drafter: Drafter, ids: list[int], max_new_tokens: int) -> dict:
    """{"cycles", "draft_torch_calls", "draft_operator_calls", "verify_torch_calls", "verify_operator_calls"}: per
    cycle, from one generation of `max_new_tokens` after `ids`; the prefill (the target's and the drafter's) is
    left out of both."""
    calls, ops = Counter(), Counter()
    fmode, dmode = _TorchCalls(calls), _OperatorCalls(ops)

    def scoped(name, fn):
        scope = "prefill" if name == "begin" else "draft"

        def run(*a, **k):
            before = fmode.scope
            fmode.scope = dmode.scope = scope
            try:
                return fn(*a, **k)
            finally:  # after begin() every call outside the drafter is the cycle's verify side
                fmode.scope = dmode.scope = "verify" if name == "begin" else before
        return run

    with wrapped_calls(drafter, scoped), fmode, dmode:
        result = generate(target, drafter, ids, max_new_tokens)
    cycles = max(1, result.steps - 1)  # the first step is the prefill's token
    return {"cycles": cycles,
            "draft_torch_calls": calls["draft"] / cycles, "draft_operator_calls": ops["draft"] / cycles,
            "verify_torch_calls": calls["verify"] / cycles, "verify_operator_calls": ops["verify"] / cycles}
