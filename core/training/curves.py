"""Training curves: loss and per-position top-1 accuracy against the step, from a run's log.jsonl.

The trainer (core.training.train) writes one JSON object a line: `{"split": "train" | "heldout",
"step": int, "loss": float, "acc@1": float, ...}`. `figure` turns those lines into a plotly
figure (loss on top, per-position accuracy below; held-out solid, train dotted) that the
trainer saves as curves.html and the app can show as is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

ACC_KEY = re.compile(r"^acc@(\d+)$")


def read_log(path: str | Path) -> list[dict]:
    """The JSON lines of a log file (a torn last line, from a kill mid-write, is skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def acc_positions(rows: list[dict]) -> list[int]:
    """Sorted draft positions k that have an `acc@k` metric somewhere in the log."""
    return sorted({int(m.group(1)) for r in rows for key in r if (m := ACC_KEY.match(key))})


def _series(rows: list[dict], split: str, key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if r.get("split") == split and key in r and r[key] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def figure(rows: list[dict], title: str = "") -> go.Figure:
    """Loss (top) and per-position held-out / train top-1 accuracy (bottom) against the optimiser step."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("loss", "top-1 accuracy by draft position (acc@k)"))
    for split, dash in (("train", "dot"), ("heldout", "solid")):
        x, y = _series(rows, split, "loss")
        if x:
            color = "#444" if split == "train" else "#d62728"
            mode = "lines+markers" if split == "heldout" else "lines"
            fig.add_trace(go.Scatter(x=x, y=y, name=f"{split} loss", mode=mode, line={"dash": dash, "color": color}),
                          row=1, col=1)
    palette = qualitative.Plotly
    for i, k in enumerate(acc_positions(rows)):
        color = palette[i % len(palette)]
        for split, dash in (("train", "dot"), ("heldout", "solid")):
            x, y = _series(rows, split, f"acc@{k}")
            if x:
                fig.add_trace(go.Scatter(x=x, y=y, name=f"{split} acc@{k}", legendgroup=f"acc@{k}",
                                         mode="lines+markers" if split == "heldout" else "lines",
                                         line={"dash": dash, "color": color}, opacity=1.0 if split == "heldout"
                                         else 0.5), row=2, col=1)
    fig.update_xaxes(title_text="optimiser step", row=2, col=1)
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_yaxes(title_text="accuracy", range=[0, 1], row=2, col=1)
    fig.update_layout(title=title or None, height=720, template="plotly_white", hovermode="x unified")
    return fig


def write_curves(log_path: str | Path, html_path: str | Path, title: str = "", include_plotlyjs: str | bool = "cdn"):
    """Write `html_path` from the log. include_plotlyjs "cdn" keeps the file small (the page then loads
    plotly.js from the CDN when opened); True embeds it (about 4.5 MB, works offline)."""
    fig = figure(read_log(log_path), title)
    html_path = Path(html_path)
    tmp = html_path.with_suffix(".html.tmp")
    fig.write_html(str(tmp), include_plotlyjs=include_plotlyjs, full_html=True)
    tmp.replace(html_path)
    return fig
