"""The cost model's figures: this machine's verify-pass cost curve, and the expected speedup of every tree shape
with the one `auto` picks."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from core.trees.cost_curve import monotone, pass_ms
from demo.render.style import BONUS_ORANGE, ROOT_BLUE, message_figure


def cost_curve_figure(curve: dict | None, tree_size: float | None = None) -> go.Figure:
    """Verify-pass time against tokens in the pass (this machine), with the GPU cost model's flat line."""
    if not curve:
        return message_figure("The cost curve is measured once the target has loaded.")
    xs, ys = list(curve["sizes"]), list(curve["ms"])
    t1 = ys[0] if xs[0] == 1 else None
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines+markers", name="this machine",
                               hovertemplate="%{x} tokens: %{y:.1f} ms<extra></extra>", line={"color": ROOT_BLUE}))
    if t1 is not None:
        fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[t1, t1], mode="lines", name="GPU cost model (flat)",
                                 line={"dash": "dot", "color": "#888"}, hoverinfo="skip"))
    if tree_size:  # shapes on a log axis take log10 coordinates
        fig.add_vline(x=float(np.log10(1 + tree_size)), line_dash="dash", line_color=BONUS_ORANGE,
                      annotation_text=f"your verify pass ({1 + tree_size:.0f} tokens)")
    title = ("A fixed cost model (no timing: tiny test target or SPECLENS_COST_MODEL=fixed)" if curve.get("fixed")
             else f"One target pass over a {curve.get('context')}-token cache "
                  f"({curve.get('dtype')}, {curve.get('cpu', '')[:40]})")
    fig.update_layout(title=title,
                      xaxis={"title": "tokens in the pass", "type": "log", "tickvals": xs},
                      yaxis={"title": "ms", "rangemode": "tozero"}, height=340,
                      margin={"l": 50, "r": 20, "t": 50, "b": 50}, legend={"orientation": "h", "y": -0.25})
    return fig


def tree_choice_figure(here: dict | None, gpu: dict | None = None, first: dict | None = None) -> go.Figure:
    """Expected speedup over plain decoding of every tree shape on this machine (core.trees.choice.choose_tree's
    grid: a depth x nodes heatmap for dynamic trees, a line for a static tree), with the shape `auto` picks here
    and the one it would pick under the GPU cost model. When `here` is calibrated from decoded cycles, `first`
    is the model's choice before calibration, marked too."""
    if not here or not here.get("grid"):
        return message_figure("No measured acceptance for this method: its checkpoint's tree is kept.")
    one = pass_ms(monotone(here["curve"]), 1.0)
    speed = {(r["depth"], r["total_tokens"]): r["tokens_per_s"] * one / 1000.0 for r in here["grid"]}
    depths = sorted({d for d, _ in speed})
    nodes = sorted({n for _, n in speed})
    cal = here.get("calibration")
    marks = [(here, "auto here, calibrated" if cal else "auto here", BONUS_ORANGE, "star")]
    if first and first.get("depth") and cal:
        marks.append((first, "auto's first guess (the model alone)", "#888", "x"))
    if gpu and gpu.get("depth"):
        marks.append((gpu, "auto under the GPU cost model", "#444", "circle-open"))
    if len(depths) > 1:
        z = [[speed.get((d, n)) for n in nodes] for d in depths]
        fig = go.Figure(go.Heatmap(x=nodes, y=depths, z=z, colorscale="Blues", colorbar={"title": "speedup"},
                                   hovertemplate="depth %{y}, %{x} nodes: %{z:.2f}x<extra></extra>"))
        for choice, name, color, symbol in marks:
            fig.add_trace(go.Scatter(x=[choice["total_tokens"]], y=[choice["depth"]], mode="markers", name=name,
                                     marker={"symbol": symbol, "size": 16, "color": color,
                                             "line": {"width": 2, "color": color}}))
        fig.update_yaxes(title="depth (drafting levels)", dtick=1)
    else:  # a static tree: one line per cost model, each with its own choice
        fig = go.Figure()
        for choice, name, color, symbol in marks:
            rows = sorted(choice["grid"], key=lambda r: r["total_tokens"])
            y_of = {r["total_tokens"]: r["tokens_per_s"] * one / 1000.0 for r in rows}
            line = ("this machine" if choice is here else "the model alone" if choice is first
                    else "GPU cost model")
            fig.add_trace(go.Scatter(x=list(y_of), y=list(y_of.values()), mode="lines", name=line,
                                     line={"color": ROOT_BLUE if choice is here else "#888",
                                           "dash": "solid" if choice is here else "dash" if choice is first
                                           else "dot"},
                                     hovertemplate="%{x} nodes: %{y:.2f}x<extra></extra>"))
            fig.add_trace(go.Scatter(x=[choice["total_tokens"]], y=[y_of.get(choice["total_tokens"])],
                                     mode="markers", name=name, marker={"symbol": symbol, "size": 14, "color": color}))
        fig.update_yaxes(title="expected speedup", rangemode="tozero")
    src = here.get("acceptance_source") or ""
    src = src.rsplit("(", 1)[-1].rstrip(")") if src.endswith(")") else src  # "tau measured for every tree shape"
    title = f"{here['method']}: expected speedup of each tree shape here ({src})"
    if cal:
        title += (f"<br><sub>calibrated from {cal.get('cycles')} decoded cycles: measured / predicted tau gain "
                  f"x{cal['tau']:.2f}, drafting x{cal['draft']:.2f}, verify step {cal['verify_ms']:+.1f} ms</sub>")
    fig.update_layout(title=title,
                      xaxis={"title": "nodes in the tree"}, height=360,
                      margin={"l": 50, "r": 20, "t": 50, "b": 50}, legend={"orientation": "h", "y": -0.25})
    return fig
