"""Figures and tables of a benchmark summary (summary.json from analysis.bench).

The figure builders take the summary dict and return plotly figures, so the app
can show the same plots; `write_report` puts them in one HTML page and
`readme_table` renders the markdown table quoted in the README.

    python -m analysis.report runs/bench            # (re)write runs/bench/report.html, print the table
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path

import plotly.colors
import plotly.graph_objects as go
import plotly.io as pio

BASELINE = "ar"


def _methods(summary: dict) -> list[str]:
    return list(summary["methods"])


def method_colors(summary: dict) -> dict[str, str]:
    """One colour per method, the same in every figure."""
    palette = plotly.colors.qualitative.Plotly
    return {m: palette[i % len(palette)] for i, m in enumerate(_methods(summary))}


def _fmt(x, nd: int = 2, suffix: str = "") -> str:
    return "–" if x is None else f"{x:.{nd}f}{suffix}"


def _by_category(summary: dict, key: str, skip_baseline: bool) -> go.Figure:
    cats = summary.get("categories", [])
    fig = go.Figure()
    colors = method_colors(summary)
    for m in _methods(summary):
        if skip_baseline and m == BASELINE:
            continue
        res = summary["methods"][m]
        xs = cats + ["overall"]
        ys = [res["by_category"].get(c, {}).get(key) for c in cats] + [res["overall"].get(key)]
        fig.add_bar(name=m, x=xs, y=ys, text=[_fmt(y) for y in ys], textposition="outside", marker_color=colors[m])
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey")
    fig.update_layout(barmode="group", legend_title="method", margin=dict(t=50, b=40))
    return fig


def speedup_figure(summary: dict) -> go.Figure:
    fig = _by_category(summary, "speedup", skip_baseline=True)
    fig.update_layout(title="Speedup over plain decoding (tokens/s ratio, same run)", yaxis_title="speedup")
    return fig


def tau_figure(summary: dict) -> go.Figure:
    fig = _by_category(summary, "tau", skip_baseline=False)
    fig.update_layout(title="tau: tokens per target forward pass", yaxis_title="tau")
    return fig


def acceptance_curves_figure(summary: dict) -> go.Figure:
    fig = go.Figure()
    colors = method_colors(summary)
    for m in _methods(summary):
        rates = summary["methods"][m]["overall"].get("acceptance_by_position") or []
        if not rates:
            continue
        reached = summary["methods"][m]["overall"].get("reached_by_position") or []
        fig.add_scatter(name=m, x=list(range(1, len(rates) + 1)), y=rates, mode="lines+markers",
                        line_color=colors[m], customdata=reached,
                        hovertemplate="depth %{x}: %{y:.3f} (of %{customdata} cycles)")
    fig.update_layout(title="Per-position acceptance rate (accepted / cycles whose tree reached the depth)",
                      xaxis_title="draft depth", yaxis_title="acceptance rate", yaxis_range=[0, 1.05])
    return fig


def time_breakdown_figure(summary: dict) -> go.Figure:
    methods = _methods(summary)
    overall = [summary["methods"][m]["overall"] for m in methods]
    fig = go.Figure()
    fig.add_bar(name="draft", x=methods, y=[o.get("draft_ms_per_cycle") for o in overall])
    fig.add_bar(name="verify (target pass)", x=methods, y=[o.get("verify_ms_per_cycle") for o in overall])
    fig.add_scatter(name="tokens per cycle (tau)", x=methods, y=[o.get("tau") for o in overall], yaxis="y2",
                    mode="markers", marker=dict(size=12, symbol="diamond"))
    fig.update_layout(barmode="stack", title="Time per draft-verify cycle", yaxis_title="ms per cycle",
                      yaxis2=dict(title="tau", overlaying="y", side="right", rangemode="tozero", showgrid=False,
                                 tickformat=".1f"))
    return fig


def ideal_speedup_figure(summary: dict) -> go.Figure:
    methods = [m for m in _methods(summary) if m != BASELINE]
    overall = [summary["methods"][m]["overall"] for m in methods]
    fig = go.Figure()
    fig.add_bar(name="measured", x=methods, y=[o.get("decode_speedup") for o in overall])
    fig.add_bar(name="ideal for its tau (free drafting)", x=methods, y=[o.get("ideal_speedup") for o in overall])
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey")
    fig.update_layout(barmode="group", title="Measured vs ideal speedup, decoding phase: the gap is drafting",
                      yaxis_title="speedup (prefill left out)")
    return fig


FIGURES = (speedup_figure, tau_figure, acceptance_curves_figure, time_breakdown_figure, ideal_speedup_figure)


def readme_table(summary: dict, categories: bool = True) -> str:
    """Markdown: one row per method (overall numbers), then speedup (tau) per category."""
    depth_cols = 4  # per-position acceptance at depths 1-4
    head = ["method", "tokens/s", "speedup", "tau", "ideal speedup", "draft ms/cycle", "verify ms/cycle"]
    head += [f"acc@{i}" for i in range(1, depth_cols + 1)] + ["same as ar"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in _methods(summary):
        o = summary["methods"][m]["overall"]
        acc = (o.get("acceptance_by_position") or []) + [None] * depth_cols
        row = [m, _fmt(o.get("tokens_per_s"), 1), _fmt(o.get("speedup"), 2, "x"), _fmt(o.get("tau")),
               _fmt(o.get("ideal_speedup"), 2, "x"), _fmt(o.get("draft_ms_per_cycle"), 1),
               _fmt(o.get("verify_ms_per_cycle"), 1)]
        row += [_fmt(a) for a in acc[:depth_cols]]
        same = o.get("identical_to_ar")
        row.append("–" if same is None else f"{100 * same:.0f}%")
        lines.append("| " + " | ".join(row) + " |")
    cats = summary.get("categories", [])
    if categories and cats:
        lines += ["", "Speedup (tau) by category:", ""]
        lines.append("| method | " + " | ".join(cats) + " |")
        lines.append("|" + "---|" * (len(cats) + 1))
        for m in _methods(summary):
            bc = summary["methods"][m]["by_category"]
            cells = [f"{_fmt(bc.get(c, {}).get('speedup'), 2, 'x')} ({_fmt(bc.get(c, {}).get('tau'))})"
                     for c in cats]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    cfg = summary.get("config", {})
    if cfg.get("command"):
        lines += ["", f"Made by: `{cfg['command']}`"]
    return "\n".join(lines)


def _html_table(markdown: str) -> str:
    rows = [ln for ln in markdown.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    out = []
    for i, ln in enumerate(rows):
        tag = "th" if i == 0 or ln.startswith("| method |") else "td"
        cells = [c.strip() for c in ln.strip("|").split("|")]
        out.append("<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>")
    return "<table>" + "".join(out) + "</table>"


def write_report(summary: dict, path: str | Path, plotlyjs: str = "cdn") -> None:
    """One self-describing HTML page: settings, the table, every figure."""
    cfg = summary.get("config", {})
    parts = []
    for i, build in enumerate(FIGURES):
        fig = build(summary)
        parts.append(pio.to_html(fig, full_html=False, include_plotlyjs=(plotlyjs if i == 0 else False)))
    settings = ", ".join(f"{k}: {html.escape(str(cfg[k]))}" for k in
                         ("model_id", "dtype", "device", "threads", "max_new_tokens", "temperature", "questions",
                          "questions_file") if k in cfg)
    drafters = "".join(f"<li>{html.escape(k)}: {html.escape(str(v))}</li>" for k, v in cfg.get("drafters", {}).items())
    md = readme_table(summary, categories=False)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>SpecLens benchmark</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}</style></head>
<body><h1>SpecLens benchmark</h1>
<p>{settings}</p>
<p>Command: <code>{html.escape(str(cfg.get("command", "")))}</code></p>
<ul>{drafters}</ul>
{_html_table(md)}
<p>Definitions: {"; ".join(html.escape(f"{k}: {v}") for k, v in summary.get("definitions", {}).items())}</p>
{"".join(parts)}
</body></html>"""
    Path(path).write_text(page, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="a benchmark output folder (holding summary.json)")
    p.add_argument("--plotlyjs", choices=["cdn", "inline"], default="cdn")
    args = p.parse_args(argv)
    with open(Path(args.folder) / "summary.json", encoding="utf-8") as f:
        summary = json.load(f)
    write_report(summary, Path(args.folder) / "report.html", args.plotlyjs)
    print(readme_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
