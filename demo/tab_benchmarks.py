"""Tab 7, Benchmarks: the committed results (assets/results) and the command that reproduces them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go

from demo.common import RESULTS, AppContext, friendly
from demo.render import message_figure

TITLE = "Benchmarks"
EXPLANATION = """\
**What you see.** The committed benchmark: every method answered the same Spec-Bench-style questions
(conversation, translation, summarisation, question answering, maths, retrieval-augmented answers, coding)
with the same target on the same machine. **tau** says how many tokens each target pass produced; the
**speedup** divides a method's tokens per second by plain decoding's, both measured in the same process.
Tables and figures are broken down by question category: drafters shine where text is predictable (code,
summaries that copy the source) and struggle on open-ended writing.
"""
SUMMARY = RESULTS / "summary.json"
REPORT_NAMES = ("report.md", "REPORT.md", "README.md")
DEFAULT_COMMAND = "make bench"
NO_RESULTS = ("**No committed results yet.** The benchmark has not been run and committed: "
              "`assets/results/summary.json` is missing.")
MAX_FIGURES = 12


def load_summary(path: Path = SUMMARY) -> dict | list | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)[:60]
    return "" if v is None else str(v).replace("|", "\\|")


def markdown_table(rows: Sequence[dict], index: str | None = None) -> str:
    """A Markdown table of dict rows (columns in first-seen order)."""
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    if not cols:
        return ""
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "\n".join("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows)


def summary_sections(summary) -> list[tuple[str, list[dict]]]:
    """(title, rows) tables found in a summary: lists of dicts, and dicts of dicts (keys become a column)."""
    out: list[tuple[str, list[dict]]] = []
    if isinstance(summary, list):
        rows = [r for r in summary if isinstance(r, dict)]
        return [("results", rows)] if rows else []
    if not isinstance(summary, dict):
        return out
    scalars = {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}
    if scalars:
        out.append(("run", [scalars]))
    for key, val in summary.items():
        if isinstance(val, list) and val and all(isinstance(r, dict) for r in val):
            out.append((key, val))
        elif isinstance(val, dict) and val and all(isinstance(v, dict) for v in val.values()):
            if all(not isinstance(x, dict) for v in val.values() for x in v.values()):
                out.append((key, [{"name": k, **v} for k, v in val.items()]))
            else:  # one more level: {method: {category: {...}}}
                rows = []
                for k, v in val.items():
                    for k2, v2 in v.items():
                        if isinstance(v2, dict):
                            rows.append({"name": k, "category": k2, **{a: b for a, b in v2.items()
                                                                      if not isinstance(b, (dict, list))}})
                if rows:
                    out.append((key, rows))
        elif isinstance(val, dict) and val:
            out.append((key, [{k: v for k, v in val.items() if not isinstance(v, (dict, list))}]))
    return out


def category_figure(rows: Sequence[dict], metric: str) -> go.Figure | None:
    """Grouped bars of `metric` by category, one bar per method; None if the rows lack those columns."""
    method_key = next((k for k in ("method", "name", "model_id") if rows and k in rows[0]), None)
    if not rows or method_key is None or "category" not in rows[0] or metric not in rows[0]:
        return None
    cats = list(dict.fromkeys(str(r["category"]) for r in rows))
    fig = go.Figure()
    for m in dict.fromkeys(str(r[method_key]) for r in rows):
        by_cat = {str(r["category"]): r.get(metric) for r in rows if str(r[method_key]) == m}
        fig.add_trace(go.Bar(name=m, x=cats, y=[by_cat.get(c) for c in cats]))
    if metric == "speedup":
        fig.add_hline(y=1.0, line_dash="dot", line_color="#888", annotation_text="plain decoding")
    fig.update_layout(barmode="group", title=f"{metric} by category", height=380,
                      margin={"l": 40, "r": 20, "t": 50, "b": 80}, legend={"orientation": "h", "y": -0.3})
    return fig


def figures_for(summary) -> list[go.Figure]:
    figs = []
    for _, rows in summary_sections(summary):
        for metric in ("speedup", "tau"):
            f = category_figure(rows, metric)
            if f is not None:
                figs.append(f)
    return figs


def reproduce_command(summary) -> str:
    if isinstance(summary, dict):
        for k in ("command", "reproduce", "cmd"):
            if isinstance(summary.get(k), str):
                return summary[k]
    return DEFAULT_COMMAND


def report_text(folder: Path = RESULTS) -> str:
    for name in REPORT_NAMES:
        p = Path(folder) / name
        if p.is_file():
            return p.read_text()
    return ""


def image_files(folder: Path = RESULTS) -> list[str]:
    files = [p for ext in ("png", "svg", "jpg") for p in Path(folder).rglob(f"*.{ext}")]
    return [str(p) for p in sorted(files)[:MAX_FIGURES]]


def benchmark_view(folder: Path = RESULTS) -> dict:
    """Markdown, figures and images for the tab (also used by the tests on a temporary folder)."""
    summary = load_summary(Path(folder) / "summary.json")
    cmd = reproduce_command(summary)
    how = (f"**Reproduce:** `{cmd}` (runs every method on the benchmark questions and rewrites "
           "`assets/results/`; see the README for the options).")
    if summary is None:
        return {"markdown": NO_RESULTS + "\n\n" + how, "figures": [], "images": [], "report": "",
                "has_results": False}
    parts = [f"### {title}\n\n{markdown_table(rows)}" for title, rows in summary_sections(summary)]
    return {"markdown": "\n\n".join(parts + [how]), "figures": figures_for(summary), "images": image_files(folder),
            "report": report_text(folder), "has_results": True}


def build(ctx: AppContext) -> None:
    gr.Markdown(EXPLANATION)
    view = benchmark_view()
    refresh = gr.Button("Reload committed results", size="sm")
    md = gr.Markdown(view["markdown"], elem_id="bench-summary")
    figs = view["figures"] + [None] * 2
    plot_a = gr.Plot(figs[0] or message_figure("No per-category speedup table in the summary."),
                     visible=view["has_results"])
    plot_b = gr.Plot(figs[1] or message_figure(""), visible=view["has_results"] and figs[1] is not None)
    gallery = gr.Gallery(view["images"], label="Committed figures", visible=bool(view["images"]), columns=2)
    report = gr.Markdown(view["report"], visible=bool(view["report"]))

    @friendly
    def on_refresh():
        v = benchmark_view()
        f = v["figures"] + [None] * 2
        return (v["markdown"], gr.update(value=f[0] or message_figure("No per-category table."),
                                         visible=v["has_results"]),
                gr.update(value=f[1], visible=f[1] is not None), gr.update(value=v["images"],
                                                                          visible=bool(v["images"])),
                gr.update(value=v["report"], visible=bool(v["report"])))

    refresh.click(on_refresh, None, [md, plot_a, plot_b, gallery, report], api_visibility="private")
