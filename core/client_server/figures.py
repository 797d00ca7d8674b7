"""Figures of client-server runs (plotly): a timeline of one run, and tokens over time for several.

Both read only `RunResult.to_dict()`-shaped data (or the RunResult itself), so they also work
on traces saved by the CLI (--trace).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from core.methods import METHODS, methods_where

LANES = ["client", "uplink", "server", "downlink"]  # top to bottom
SPAN_STYLE = {  # (lane, kind) -> (legend label, colour)
    ("client", "draft"): ("client drafting", "#3b5bdb"),
    ("client", "absorb"): ("client state update", "#91a7ff"),
    ("client", "offline"): ("client drafting offline (provisional)", "#f59f00"),
    ("uplink", "prefill"): ("uplink: prompt or draft", "#9c36b5"),
    ("uplink", "verify"): ("uplink: prompt or draft", "#9c36b5"),
    ("server", "prefill"): ("server reading the prompt", "#1b4332"),
    ("server", "verify"): ("server verifying", "#2b8a3e"),
    ("downlink", "prefill_reply"): ("downlink: verdict + payload", "#cc5de8"),
    ("downlink", "verify_reply"): ("downlink: verdict + payload", "#cc5de8"),
}
LOST_COLOUR = "#e03131"
SERVED = methods_where(client_server=True)
METHOD_COLOURS = {m: METHODS[m].colour for m in SERVED}
METHOD_NAMES = {m: METHODS[m].short + (" (API)" if METHODS[m].client_server == "api" else "") for m in SERVED}


def _as_dict(run) -> dict:
    return run if isinstance(run, dict) else run.to_dict()


def _shade_disconnects(fig: go.Figure, windows: Sequence[Sequence[float]], t_max: float) -> None:
    for a, b in windows:
        if a >= t_max:
            continue
        fig.add_vrect(x0=a, x1=min(b, t_max), fillcolor="#adb5bd", opacity=0.25, line_width=0, layer="below",
                      annotation_text="link down", annotation_position="top left",
                      annotation_font={"size": 11, "color": "#495057"})


def timeline_figure(run, title: str | None = None) -> go.Figure:
    """Client drafting, uplink, server verifying, downlink on one time axis; disconnects shaded."""
    d = _as_dict(run)
    spans = d["trace"]["spans"]
    groups: dict[str, dict] = {}
    for s in spans:
        label, colour = SPAN_STYLE.get((s["lane"], s["kind"]), (f"{s['lane']} {s['kind']}", "#868e96"))
        if s.get("lost"):
            label, colour = "transfer cut by the drop (sent again)", LOST_COLOUR
        g = groups.setdefault(label, {"colour": colour, "x": [], "base": [], "y": [], "text": []})
        dur = max(s["end"] - s["start"], 1e-4)
        g["x"].append(dur)
        g["base"].append(s["start"])
        g["y"].append(s["lane"])
        bits = [f"{s['lane']} · {s['kind']}", f"{s['start']:.3f}-{s['end']:.3f} s ({1000 * dur:.1f} ms)"]
        if "bytes" in s:
            bits.append(f"{s['bytes']} bytes")
        if "tokens" in s:
            bits.append(f"{s['tokens']} tokens in the pass, {s.get('accepted', 0)} drafts accepted")
        if s.get("retransmits"):
            bits.append(f"{s['retransmits']} lost packet(s) retransmitted")
        g["text"].append("<br>".join(bits))
    fig = go.Figure()
    for label, g in groups.items():
        fig.add_trace(go.Bar(x=g["x"], base=g["base"], y=g["y"], orientation="h", name=label,
                             marker={"color": g["colour"], "line": {"width": 0}}, hovertext=g["text"],
                             hoverinfo="text", width=0.6))
    t_max = max([s["end"] for s in spans] + [d["virtual_time_s"], 0.1])
    _shade_disconnects(fig, d["disconnects"], t_max)
    name = METHOD_NAMES.get(d["method"], d["method"])
    fig.update_layout(
        title=title or f"{name} over {d['network']}: {d['new_tokens']} tokens in {d['virtual_time_s']:.2f} s "
                       f"({d['mode']} time)",
        barmode="overlay", height=330, margin={"l": 70, "r": 20, "t": 50, "b": 40},
        xaxis={"title": "time (s)", "range": [0, t_max * 1.02]},
        yaxis={"categoryorder": "array", "categoryarray": LANES[::-1]},
        legend={"orientation": "h", "y": -0.25}, plot_bgcolor="white")
    return fig


def tokens_figure(runs: Sequence) -> go.Figure:
    """Verified tokens over time per method; for runs with provisional text, what the user saw (dashed)."""
    fig = go.Figure()
    t_max = 0.1
    windows: list = []
    for run in runs:
        d = _as_dict(run)
        prog = d["trace"]["progress"]
        if not prog:
            continue
        colour = METHOD_COLOURS.get(d["method"], "#495057")
        name = METHOD_NAMES.get(d["method"], d["method"])
        ts = [0.0] + [p["t"] for p in prog]
        fig.add_trace(go.Scatter(x=ts, y=[0] + [p["verified"] for p in prog], mode="lines", line_shape="hv",
                                 name=f"{name}: verified", line={"color": colour, "width": 2.5}))
        if any(p["shown"] != p["verified"] for p in prog):
            fig.add_trace(go.Scatter(x=ts, y=[0] + [p["shown"] for p in prog], mode="lines", line_shape="hv",
                                     name=f"{name}: shown (incl. provisional)",
                                     line={"color": colour, "width": 1.5, "dash": "dash"}))
        t_max = max(t_max, ts[-1])
        windows = windows or d["disconnects"]
    _shade_disconnects(fig, windows, t_max)
    fig.update_layout(title="Tokens over time", height=340, margin={"l": 50, "r": 20, "t": 50, "b": 40},
                      xaxis={"title": "time (s)", "range": [0, t_max * 1.02]}, yaxis={"title": "tokens"},
                      legend={"orientation": "h", "y": -0.25}, plot_bgcolor="white")
    return fig
