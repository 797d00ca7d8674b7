"""The draft-failure figures (plotly), drawn from analysis.failures' aggregates: the calibration diagram, acceptance
bars by kind or depth, where the target's token sat in the drafter's ranking, and one rejection's top-10 lists side
by side. analysis.failures exports them too, so `failures.calibration_figure` works as before."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def calibration_figure(calib: Sequence[dict]) -> go.Figure:
    """Reliability diagram: acceptance vs the drafter's mean probability per bin, with the diagonal."""
    full = [b for b in calib if b["count"]]
    fig = go.Figure()
    fig.add_scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated", line=dict(dash="dash", color="grey"))
    fig.add_scatter(x=[b["mean_draft_prob"] for b in full], y=[b["acceptance"] for b in full],
                    mode="lines+markers", name="drafter",
                    marker=dict(size=[6 + 14 * (b["count"] / max(c["count"] for c in full)) ** 0.5 for b in full]),
                    customdata=[[b["count"], b["bin_lo"], b["bin_hi"]] for b in full],
                    hovertemplate="p in [%{customdata[1]:.1f}, %{customdata[2]:.1f}): "
                                  "acceptance %{y:.2f}, %{customdata[0]} tokens<extra></extra>")
    fig.update_layout(title="Does the drafter know when it is wrong? (calibration of draft probabilities)",
                      xaxis_title="drafter's probability of its token", yaxis_title="acceptance rate",
                      xaxis_range=[0, 1], yaxis_range=[0, 1.05])
    return fig


def acceptance_bar(by_kind_or_depth: dict, title: str) -> go.Figure:
    """Bar chart of acceptance rates from acceptance_by_kind or acceptance_by_depth."""
    keys = [str(k) for k in by_kind_or_depth]
    vals = list(by_kind_or_depth.values())
    fig = go.Figure(go.Bar(x=keys, y=[v["rate"] for v in vals], text=[f"{v['tested']}" for v in vals],
                           textposition="outside",
                           hovertemplate="%{x}: %{y:.3f} of %{text} tested<extra></extra>"))
    fig.update_layout(title=title, yaxis_title="acceptance rate", yaxis_range=[0, 1.1])
    return fig


RANK_GROUPS = (("its first guess", 0, 1, "#2ca02c"), ("its 2nd-3rd", 1, 3, "#98df8a"),
               ("its 4th-10th", 3, 10, "#ffbb78"))


def rank_figure(by_method: dict[str, dict[int, dict]], max_depth: int = 2) -> go.Figure:
    """Stacked bars, one per method and depth (up to `max_depth`), from `target_rank_by_depth` per method:
    the share of cycles where the target's token was the drafter's first guess, its 2nd-3rd, its 4th-10th,
    or not in its top 10 at all."""
    methods, depths, rows = [], [], []
    for method, ranks in by_method.items():
        for d, r in ranks.items():
            if d <= max_depth:
                methods.append(method)
                depths.append(f"depth {d}")
                rows.append(r)
    x = [methods, depths]  # a two-level axis: methods, and their depths under each
    fig = go.Figure()
    for name, lo, hi, color in RANK_GROUPS:
        fig.add_bar(x=x, y=[sum(r["rank_shares"][lo:hi]) for r in rows], name=name, marker_color=color,
                    customdata=[r["positions"] for r in rows],
                    hovertemplate="%{y:.2f} of %{customdata} cycles<extra>" + name + "</extra>")
    fig.add_bar(x=x, y=[r["missed"] for r in rows], name="not in its top 10", marker_color="#d62728",
                customdata=[r["positions"] for r in rows],
                hovertemplate="%{y:.2f} of %{customdata} cycles<extra>not in its top 10</extra>")
    fig.update_layout(barmode="stack", title="The target's token among the drafter's guesses",
                      yaxis_title="share of cycles", yaxis_range=[0, 1], legend_traceorder="normal",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    if not rows:
        fig.add_annotation(text="These traces carry no drafter top-10 lists.", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def topk_comparison_figure(record: dict, decode: Callable[[list[int]], str]) -> go.Figure:
    """The drafter's and the target's top-10 at one rejection, side by side (drafter side empty if unknown)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("drafter top-10", "target top-10"), horizontal_spacing=0.15)
    for col, top in ((1, record.get("draft_top")), (2, record.get("target_top"))):
        top = (top or [])[:10]
        labels = [f"{repr(decode([int(t)]))} #{int(t)}" for t, _ in top]
        colors = ["#d62728" if int(t) == record["draft_token"] else
                  "#2ca02c" if int(t) == record["target_token"] else "#9ab" for t, _ in top]
        fig.add_trace(go.Bar(x=[float(p) for _, p in top][::-1], y=labels[::-1], orientation="h",
                             marker_color=colors[::-1], showlegend=False), row=1, col=col)
    fig.update_layout(title=f"step {record['step']}, depth {record['depth']}: drafted "
                            f"{record['draft_text']!r} (red), target wanted {record['target_text']!r} (green)")
    fig.update_xaxes(title_text="probability", range=[0, 1])
    return fig
