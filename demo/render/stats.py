"""A run's statistics: tau, tokens/s, speedup and the ideal speedup of this machine's cost curve, as a dict and as
stat cards."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from core.trees.cost_curve import GPU_COST_MODEL, gpu_ideal_speedup, ideal_speedup, verify_cost


def generation_stats(events: Sequence[dict], wall_time: float, plain_tps: float | None = None,
                     curve: dict | None = None) -> dict:
    """tau, tokens/s, speedup and timing split for a (possibly partial) generation (docs/ARCHITECTURE.md, "Metrics").

    With this machine's cost curve (core.trees.cost_curve) it adds the ideal speedup for the measured tau and
    tree size; `gpu_ideal_speedup` is the same tau under the GPU cost model (verify pass = 1-token pass).
    """
    new = sum(len(e.get("new_tokens") or []) for e in events)
    steps = len(events)
    tps = new / wall_time if wall_time > 0 else 0.0
    drafted = [len((e.get("tree") or {}).get("tokens") or []) for e in events if e.get("step", 0) > 0]
    tau = new / steps if steps else 0.0
    mean_drafted = float(np.mean(drafted)) if drafted else 0.0
    return {
        "new_tokens": new,
        "steps": steps,
        "tau": tau,
        "tokens_per_s": tps,
        "wall_time": wall_time,
        "draft_time": sum(float(e.get("draft_time", 0.0)) for e in events),
        "verify_time": sum(float(e.get("verify_time", 0.0)) for e in events),
        "mean_drafted": mean_drafted,
        "speedup": tps / plain_tps if plain_tps and tps > 0 else None,
        "plain_tps": plain_tps,
        "ideal_speedup": ideal_speedup(tau, curve, mean_drafted) if curve and steps else None,
        "verify_cost": verify_cost(curve, mean_drafted) if curve and steps else None,
        "gpu_ideal_speedup": gpu_ideal_speedup(tau) if steps else None,
    }


CURVE_LINK = '<a href="#cost-curve" class="curve-link">this machine\'s cost curve</a>'


def speed_context(stats: dict, link: bool = True) -> str:
    """One sentence beside a speedup: the ideal speedup for this tau here, and on a GPU (named cost model)."""
    tau, ideal, cost = stats.get("tau") or 0.0, stats.get("ideal_speedup"), stats.get("verify_cost")
    if not stats.get("steps"):
        return ""
    where = CURVE_LINK if link else "this machine's cost curve"
    if ideal is None:
        here = f"ideal speedup here: not measured yet ({where} is measured after the target loads)"
    else:
        here = (f"ideal speedup for tau {tau:.2f} here: {ideal:.2f}x (a verify pass of "
                f"{1 + stats.get('mean_drafted', 0.0):.0f} tokens costs {cost:.2f} one-token passes on {where})")
    gpu = stats.get("gpu_ideal_speedup")
    return here + (f"; the same tau would give up to {gpu:.2f}x on a GPU, assuming {GPU_COST_MODEL}"
                   if gpu is not None else "")


def stats_html(stats: dict, plain_source: str = "", running: bool = False) -> str:
    sp = stats.get("speedup")
    ideal = stats.get("ideal_speedup")
    cards = [
        ("tau (tokens / target pass)", f"{stats['tau']:.2f}"),
        ("tokens/s", f"{stats['tokens_per_s']:.1f}"),
        ("speedup vs plain", "n/a" if sp is None else f"{sp:.2f}x"),
        ("ideal speedup at this tau", "n/a" if ideal is None else f"{ideal:.2f}x"),
        ("new tokens", str(stats["new_tokens"])),
        ("target passes", str(stats["steps"])),
        ("drafted / pass", f"{stats['mean_drafted']:.1f}"),
        ("draft time", f"{stats['draft_time']:.2f} s"),
        ("verify time", f"{stats['verify_time']:.2f} s"),
    ]
    body = "".join(f'<div class="stat-card"><div class="v">{v}</div><div class="k">{k}</div></div>'
                   for k, v in cards)
    note = ""
    if stats.get("plain_tps"):
        note = f"plain decoding: {stats['plain_tps']:.1f} tokens/s"
        if plain_source:
            note += f" ({html.escape(plain_source)})"
    elif sp is None:
        note = "speedup: no plain-decoding speed measured yet"
    if running:
        note = "generating... " + note
    context = speed_context(stats)
    if context:
        note += f'<div class="speed-context">{context}</div>'
    return f'<div class="stat-cards">{body}</div><div class="stat-note">{note}</div>'
