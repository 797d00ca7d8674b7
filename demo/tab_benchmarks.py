"""Tab: Benchmarks: the committed results (assets/results) at a glance, the raw data one click away.

Top to bottom: the headline chart (speedup against tau per method, with the ideal-speedup line and plain
decoding), one compact table, a tau heatmap by method and category, the TLI and copying figures, what drafting
reads against what it costs (analysis.weight_traffic), and a closed section with the run's config, command
and a download of summary.json. Every number is read from the summary
that analysis.bench wrote (tau, tokens/s, speedup, ideal speedup and share of ideal come from
analysis.metrics.finalize); summaries older than the share's field get it computed here.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go

from analysis.copying import copying_figure
from analysis.report import method_colors
from analysis.tli import tli_figure
from analysis.weight_traffic import figure as weight_traffic_figure
from core.trees.cost_curve import GPU_COST_MODEL
from demo.common import RESULTS, AppContext
from demo.render import message_figure

TITLE = "Benchmarks"
EXPLANATION = """\
**The committed benchmark.** Every method answered the same Spec-Bench-style questions with the same target on
one machine. **tau** = tokens per target pass; **speedup** = tokens/s over plain decoding's, same run. A point on
the dashed line would be a drafter that costs nothing *and* a verify pass as cheap as a one-token pass (the GPU
cost model); hollow markers are the ideal for each method's tau on the benchmark machine, where a verify pass
of {tree} tokens costs more. The gap from a filled to a hollow marker is drafting overhead, plus the prefill that
every method pays alike (the table's share of ideal leaves the prefill out).
"""
SUMMARY = RESULTS / "summary.json"
TLI_JSON = RESULTS / "tli" / "tli.json"
COPYING_JSON = RESULTS / "copying.json"
WEIGHTS_JSON = RESULTS / "weight_traffic" / "weight_traffic.json"
DEFAULT_COMMAND = "make bench"
NO_RESULTS = ("**No committed results yet.** The benchmark has not been run and committed: "
              "`assets/results/summary.json` is missing.")
NO_TIMINGS = ("n/a: the summary has no per-pass timings (verify_ms_per_cycle), so the ideal speedup cannot be "
              "derived; rerun the benchmark")
BASELINE = "ar"
CONFIG_KEYS = ("model_id", "dtype", "device", "torch", "threads", "max_new_tokens", "temperature", "questions",
               "questions_file", "seconds", "baseline")


def load_json(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def overall(summary: dict) -> dict[str, dict]:
    """{method: overall metrics} in the summary's order (analysis.metrics.summarize's shape)."""
    return {m: res.get("overall") or {} for m, res in (summary.get("methods") or {}).items()}


def share_of_ideal(o: dict) -> float | None:
    """The summary's own figure (analysis.metrics: decoding phase); summaries written before it existed
    give the end-to-end speedup over the ideal."""
    if o.get("share_of_ideal") is not None:
        return o["share_of_ideal"]
    sp, ideal = o.get("speedup"), o.get("ideal_speedup")
    return sp / ideal if sp is not None and ideal else None


def compact_rows(summary: dict) -> list[dict]:
    """One row per method: tau, acc@1-3, tokens/s, speedup, ideal speedup and share of ideal."""
    rows = []
    for m, o in overall(summary).items():
        acc = list(o.get("acceptance_by_position") or []) + [None] * 3
        rows.append({"method": m, "tau": o.get("tau"), "acc@1": acc[0], "acc@2": acc[1], "acc@3": acc[2],
                     "tokens/s": o.get("tokens_per_s"), "speedup": o.get("speedup"),
                     "ideal": o.get("ideal_speedup"), "share of ideal": share_of_ideal(o)})
    return rows


def _cell(v, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def table_html(rows: list[dict]) -> str:
    """The compact table (HTML: it scrolls inside its box on a phone instead of widening the page)."""
    if not rows:
        return ""
    missing = all(r["ideal"] is None for r in rows)
    head = ("<tr><th>method</th><th>tau</th><th>acc@1</th><th>acc@2</th><th>acc@3</th><th>tok/s</th>"
            "<th>speedup</th><th>ideal</th><th>share of ideal</th></tr>")
    body = []
    for r in rows:
        body.append(
            f"<tr><td><b>{html.escape(r['method'])}</b></td><td>{_cell(r['tau'], '.2f')}</td>"
            f"<td>{_cell(r['acc@1'], '.2f')}</td><td>{_cell(r['acc@2'], '.2f')}</td>"
            f"<td>{_cell(r['acc@3'], '.2f')}</td><td>{_cell(r['tokens/s'], '.1f')}</td>"
            f"<td>{_cell(r['speedup'], '.2f')}x</td><td>{_cell(r['ideal'], '.2f')}x</td>"
            f"<td>{_cell(r['share of ideal'], '.0%')}</td></tr>")
    note = (f'<div class="stat-note">ideal: {NO_TIMINGS}.</div>' if missing else
            '<div class="stat-note">acc@i: share of cycles whose tree reached depth i that accepted i tokens. '
            "ideal = tau x t(1-token pass) / t(verify pass), both measured per cycle in the same run "
            "(analysis.metrics), for the method's own tokens per cycle; share of ideal = the decoding phase's "
            "speedup (prefill left out) / ideal, what drafting overhead leaves. "
            '<a href="#cost-curve">This machine\'s cost curve</a> is in the Generate tab.</div>')
    return f'<div class="bench-table"><table>{head}{"".join(body)}</table></div>{note}'


def headline_figure(summary: dict) -> go.Figure:
    """Speedup against tau per method: measured (filled), ideal here (hollow), y = tau and plain decoding lines."""
    rows = overall(summary)
    if not rows:
        return message_figure("No methods in the summary.")
    colors = method_colors(summary)
    fig = go.Figure()
    taus = [o.get("tau") for o in rows.values() if o.get("tau") is not None]
    hi = max(taus + [1.0]) * 1.08
    fig.add_trace(go.Scatter(x=[1.0, hi], y=[1.0, hi], mode="lines", name="ideal, GPU cost model (= tau)",
                             line={"dash": "dash", "color": "#888"}, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[1.0, hi], y=[1.0, 1.0], mode="lines", name="plain decoding (1.0x)",
                             line={"dash": "dot", "color": "#444"}, hoverinfo="skip"))
    for m, o in rows.items():
        t, sp, ideal = o.get("tau"), o.get("speedup"), o.get("ideal_speedup")
        if t is None or sp is None:
            continue
        if ideal is not None and m != BASELINE:
            fig.add_trace(go.Scatter(x=[t, t], y=[sp, ideal], mode="lines", showlegend=False, hoverinfo="skip",
                                     line={"color": colors[m], "width": 1}, legendgroup=m))
            fig.add_trace(go.Scatter(x=[t], y=[ideal], mode="markers", showlegend=False, legendgroup=m,
                                     marker={"color": "white", "size": 10, "line": {"color": colors[m], "width": 2}},
                                     hovertemplate=f"{m}<br>ideal at tau %{{x:.2f}}: %{{y:.2f}}x<extra></extra>"))
        fig.add_trace(go.Scatter(x=[t], y=[sp], mode="markers+text", name=m, legendgroup=m, text=[m],
                                 textposition="top center", textfont={"size": 10},
                                 marker={"color": colors[m], "size": 11},
                                 hovertemplate=f"{m}<br>tau %{{x:.2f}}<br>speedup %{{y:.2f}}x<extra></extra>"))
    fig.update_layout(title="Speedup vs tau (filled: measured, hollow: ideal)",
                      xaxis={"title": "tau (tokens per target pass)"}, yaxis={"title": "speedup over plain decoding"},
                      height=460, margin={"l": 50, "r": 20, "t": 50, "b": 40}, showlegend=False,
                      plot_bgcolor="white")
    fig.update_xaxes(gridcolor="#eee")
    fig.update_yaxes(gridcolor="#eee")
    return fig


def tau_heatmap(summary: dict) -> go.Figure:
    """tau by method (rows) and category (columns), from the summary's by_category results."""
    methods = [m for m in summary.get("methods") or {} if m != BASELINE]
    cats = list(summary.get("categories") or [])
    if not methods or not cats:
        return message_figure("The summary has no per-category results.")
    z = [[(summary["methods"][m].get("by_category") or {}).get(c, {}).get("tau") for c in cats] for m in methods]
    fig = go.Figure(go.Heatmap(z=z, x=cats, y=methods, colorscale="Greens", colorbar={"title": "tau"},
                               text=[["" if v is None else f"{v:.1f}" for v in row] for row in z],
                               texttemplate="%{text}", textfont={"size": 10},
                               hovertemplate="%{y} · %{x}: tau %{z:.2f}<extra></extra>"))
    fig.update_layout(title="tau by method and question category", height=420,
                      margin={"l": 110, "r": 20, "t": 50, "b": 90}, yaxis={"autorange": "reversed"})
    return fig


def tli_view(path: Path = TLI_JSON) -> go.Figure:
    data = load_json(path)
    if not data or not data.get("rows"):
        return message_figure("No committed TLI sweep (assets/results/tli/tli.json).")
    fig = tli_figure(data["rows"])
    fig.update_layout(height=360, margin={"l": 40, "r": 20, "t": 70, "b": 40}, title_font_size=13)
    fig.update_annotations(font_size=11)
    return fig


def copying_view(path: Path = COPYING_JSON) -> go.Figure:
    data = load_json(path)
    if not data or not data.get("methods"):
        return message_figure("No committed copying analysis (assets/results/copying.json).")
    fig = copying_figure(data)
    fig.update_layout(height=360, margin={"l": 40, "r": 20, "t": 70, "b": 40}, title_font_size=13,
                      legend={"orientation": "h", "y": -0.3})
    return fig


def weights_view(path: Path = WEIGHTS_JSON) -> go.Figure:
    data = load_json(path)
    if not data or not data.get("rows"):
        return message_figure("No committed weight-traffic profile (assets/results/weight_traffic/).")
    fig = weight_traffic_figure(data["rows"])
    fig.update_layout(height=380, margin={"l": 40, "r": 20, "t": 70, "b": 40}, title_font_size=13,
                      legend={"orientation": "h", "y": -0.2})
    return fig


def config_markdown(summary: dict) -> str:
    cfg = summary.get("config") or {}
    lines = ["| setting | value |", "|---|---|"]
    for k in CONFIG_KEYS:
        if k in cfg:
            lines.append(f"| {k} | {str(cfg[k]).replace('|', '/')} |")
    if cfg.get("methods"):
        lines.append(f"| methods | {', '.join(cfg['methods'])} |")
    return "\n".join(lines)


def reproduce_command(summary: dict | None) -> str:
    if isinstance(summary, dict):
        for src in (summary, summary.get("config") or {}):
            if isinstance(src.get("command"), str):
                return src["command"]
    return DEFAULT_COMMAND


def benchmark_view(folder: Path = RESULTS) -> dict:
    """Everything the tab shows (also used by the tests on a temporary folder)."""
    folder = Path(folder)
    summary = load_json(folder / "summary.json")
    cmd = reproduce_command(summary)
    how = f"**Reproduce:** `{cmd}` (see the README and the Makefile's `drafters` target for the shipped recipe)."
    if summary is None or not summary.get("methods"):
        return {"has_results": False, "intro": NO_RESULTS + "\n\n" + how, "headline": message_figure(""),
                "table": "", "heatmap": message_figure(""), "tli": message_figure(""),
                "copying": message_figure(""), "weights": message_figure(""), "config": how, "summary_path": None}
    nodes = [o.get("mean_tree_nodes") for m, o in overall(summary).items() if m != BASELINE]
    nodes = [n for n in nodes if n]
    tree = f"{1 + min(nodes):.0f}-{1 + max(nodes):.0f}" if nodes else "several"
    return {"has_results": True, "intro": EXPLANATION.format(tree=tree), "headline": headline_figure(summary),
            "table": table_html(compact_rows(summary)), "heatmap": tau_heatmap(summary),
            "tli": tli_view(folder / "tli" / "tli.json"), "copying": copying_view(folder / "copying.json"),
            "weights": weights_view(folder / "weight_traffic" / "weight_traffic.json"),
            "config": f"{how}\n\nGPU cost model used for the dashed line: {GPU_COST_MODEL}.\n\n"
                      f"{config_markdown(summary)}",
            "summary_path": str(folder / "summary.json")}


def build(ctx: AppContext) -> None:
    view = benchmark_view()
    gr.Markdown(view["intro"], elem_id="bench-summary")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=320):
            gr.Plot(view["headline"], show_label=False, elem_id="bench-headline", visible=view["has_results"])
        with gr.Column(scale=1, min_width=320):
            gr.HTML(view["table"], elem_id="bench-table")
    gr.Plot(view["heatmap"], show_label=False, elem_id="bench-heatmap", visible=view["has_results"])
    with gr.Row():
        gr.Plot(view["tli"], show_label=False, elem_id="bench-tli", visible=view["has_results"])
        gr.Plot(view["copying"], show_label=False, elem_id="bench-copying", visible=view["has_results"])
    gr.Plot(view["weights"], show_label=False, elem_id="bench-weights", visible=view["has_results"])
    with gr.Accordion("Raw results: config, command, summary.json", open=False, elem_id="bench-raw"):
        gr.Markdown(view["config"])
        if view["summary_path"]:
            gr.DownloadButton("Download summary.json", value=view["summary_path"], size="sm",
                              elem_id="bench-download")
