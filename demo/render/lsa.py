"""MoA's Layer Self-Attention maps from a run's events: stacked per token, as a heatmap and as attention received
per target layer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from demo.render.style import ROOT_BLUE


def lsa_matrices(events: Sequence[dict]) -> tuple[np.ndarray | None, list[dict]]:
    """All LSA attention maps of a run stacked: ([n_tokens, L, L], one {step, token} per map)."""
    mats, meta = [], []
    for e in events:
        ex = e.get("extras") or {}
        att = ex.get("lsa_attention")
        if att is None:
            continue
        a = np.asarray(att, dtype=np.float64)
        if a.ndim == 2:
            a = a[None]
        if a.ndim == 4:  # [n, heads, L, L]: average the heads
            a = a.mean(axis=1)
        if a.ndim != 3 or a.shape[1] != a.shape[2]:
            continue
        toks = list(ex.get("lsa_tokens") or [None] * a.shape[0])
        for j in range(a.shape[0]):
            mats.append(a[j])
            meta.append({"step": int(e.get("step", 0)), "token": toks[j] if j < len(toks) else None})
    if not mats:
        return None, []
    return np.stack(mats), meta


def lsa_received(matrix: np.ndarray) -> np.ndarray:
    """Attention each key layer receives, averaged over query layers (rows sum to 1)."""
    return np.asarray(matrix).mean(axis=0)


def lsa_heatmap(matrix: np.ndarray, title: str) -> go.Figure:
    m = np.asarray(matrix)
    n = m.shape[0]
    # an absolute scale from 0: a near-uniform map looks uniform instead of exaggerating tiny differences
    fig = go.Figure(go.Heatmap(
        z=m, x=list(range(n)), y=list(range(n)), colorscale="Viridis", colorbar={"title": "weight"},
        zmin=0.0, zmax=float(max(m.max(), 2.0 / max(1, n))),
        hovertemplate="query layer %{y}<br>key layer %{x}<br>weight %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, height=460, margin={"l": 50, "r": 20, "t": 50, "b": 50},
                      xaxis={"title": "key: target layer attended to", "dtick": 5},
                      yaxis={"title": "query: target layer", "autorange": "reversed", "dtick": 5})
    return fig


def lsa_bar(received: np.ndarray, title: str = "Attention received per target layer") -> go.Figure:
    r = np.asarray(received)
    fig = go.Figure(go.Bar(x=list(range(len(r))), y=r, marker_color=ROOT_BLUE,
                           hovertemplate="layer %{x}<br>mean weight %{y:.3f}<extra></extra>"))
    fig.add_hline(y=1.0 / max(1, len(r)), line_dash="dot", line_color="#888",
                  annotation_text="uniform", annotation_position="top right")
    fig.update_layout(title=title, height=320, margin={"l": 50, "r": 20, "t": 50, "b": 50},
                      xaxis={"title": "target layer", "dtick": 5}, yaxis={"title": "mean attention weight"})
    return fig
