"""Tab 4, TLI trade-off: how many target layers MoA's drafter runs (N) against tau, drafting time and speedup."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from demo.common import RESULTS, AppContext, friendly, progress_reporter
from demo.render import message_figure
from demo.runtime import TLI_CHOICES

TITLE = "TLI trade-off"
EXPLANATION = """\
**What you see.** MoA's drafter can end with the target's own last **N** layers (Target Layer Inference, TLI).
With N = 0 it predicts the target's final hidden state directly; with N = 1 or 3 it predicts an earlier state
and lets real target layers finish the job. More layers make the guesses better (higher **tau**, more tokens
per target pass) but each guess costs more to make (longer **drafting time**). The **speedup** is what is
left after paying for drafting: the paper found N = 1 best and N = 3 slightly worse. The measured table comes
from the committed benchmark; the live run below measures one prompt on this machine right now.
"""
TLI_DIR = RESULTS / "tli"
NO_TABLE = ("No committed TLI measurements yet (`assets/results/tli/*.json`). They are produced by the TLI "
            "benchmark (`analysis/tli.py`); until then, use the live run below.")
DEFAULT_PROMPT = "Summarise in three sentences why regular exercise is good for health."
COLUMNS = ["N", "tau", "draft_ms_per_step", "speedup", "ideal_speedup", "tokens_per_s", "source"]
IDEAL_NOTE = ("ideal_speedup: tau x t(1-token pass) / t(verify pass), the speedup if drafting cost nothing "
              "(committed rows: the benchmark's decoding phase, tau over draft-verify cycles and their per-cycle "
              "times; live rows: "
              "[this machine's cost curve](#cost-curve) in the Generate tab).")

_KEYS = {
    "N": ("N", "tli", "n", "tli_n", "n_layers"),
    "tau": ("tau", "mean_accepted", "mean_accepted_length"),
    "draft_ms_per_step": ("draft_ms_per_step", "draft_ms", "draft_time_ms", "drafting_ms", "draft_ms_per_cycle"),
    "speedup": ("speedup",),
    "ideal_speedup": ("ideal_speedup",),
    "tokens_per_s": ("tokens_per_s", "tokens_per_second", "tps"),
}


def _pick(row: dict, names: Sequence[str]):
    for k in names:
        if k in row and row[k] is not None:
            return row[k]
    return None


def normalise_row(row: dict, source: str) -> dict | None:
    """A TLI table row in our column names, or None if it has no N."""
    out = {k: _pick(row, names) for k, names in _KEYS.items()}
    if out["draft_ms_per_step"] is None:  # seconds per step under another name
        s = _pick(row, ("draft_s_per_step", "draft_time_per_step", "draft_time"))
        if s is not None and "steps" in row and row.get("steps"):
            out["draft_ms_per_step"] = 1000.0 * float(s) / float(row["steps"])
        elif s is not None:
            out["draft_ms_per_step"] = 1000.0 * float(s)
    if out["N"] is None:
        return None
    for k in ("tau", "draft_ms_per_step", "speedup", "ideal_speedup", "tokens_per_s"):
        if out[k] is not None:
            out[k] = float(out[k])
    out["N"] = int(out["N"])
    out["source"] = source
    return out


def _rows_in(data) -> list[dict]:
    if isinstance(data, list):
        return [r for r in data if isinstance(r, dict)]
    if isinstance(data, dict):
        for key in ("rows", "results", "table", "tli"):
            if isinstance(data.get(key), list):
                return [r for r in data[key] if isinstance(r, dict)]
        if all(isinstance(v, dict) for v in data.values()) and data:  # {"0": {...}, "1": {...}}
            return [{"N": k, **v} for k, v in data.items()]
        return [data]
    return []


def load_tli_table(folder: Path = TLI_DIR) -> list[dict]:
    """Rows from assets/results/tli/*.json (any of a few layouts), sorted by N; [] when absent."""
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for r in _rows_in(data):
            row = normalise_row(r, path.name)
            if row is not None:
                rows.append(row)
    return sorted(rows, key=lambda r: r["N"])


def tli_figure(committed: Sequence[dict], live: Sequence[dict] = ()) -> go.Figure:
    """tau, drafting time and speedup against N: committed table as lines, live runs as crosses."""
    if not committed and not live:
        return message_figure("No TLI measurements yet: run one live below.")
    fig = make_subplots(rows=1, cols=3, subplot_titles=("tau (tokens / target pass)", "drafting time per step (ms)",
                                                        "speedup vs plain"))
    metrics = ("tau", "draft_ms_per_step", "speedup")
    for col, key in enumerate(metrics, start=1):
        pts = [(r["N"], r[key]) for r in committed if r.get(key) is not None]
        if pts:
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers",
                                     name="committed benchmark", legendgroup="c", showlegend=col == 1,
                                     line={"color": "#3b5bdb"}), row=1, col=col)
        lp = [(r["N"], r[key]) for r in live if r.get(key) is not None]
        if lp:
            fig.add_trace(go.Scatter(x=[p[0] for p in lp], y=[p[1] for p in lp], mode="markers",
                                     name="live runs (this machine)", legendgroup="l", showlegend=col == 1,
                                     marker={"symbol": "x", "size": 11, "color": "#f08a24"}), row=1, col=col)
        fig.update_xaxes(title_text="N (target layers in the drafter)", tickvals=list(TLI_CHOICES), row=1, col=col)
    fig.update_layout(height=360, margin={"l": 40, "r": 20, "t": 60, "b": 40}, legend={"orientation": "h", "y": -0.25})
    return fig


def table_markdown(rows: Sequence[dict]) -> str:
    if not rows:
        return ""
    def fmt(v):
        return "" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "\n".join("| " + " | ".join(fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows)


def live_row(plain: dict, moa: dict, n: int) -> dict:
    steps = max(1, moa["stats"]["steps"] - 1)  # the prefill drafts nothing
    tps = moa["stats"]["tokens_per_s"]
    p_tps = plain["stats"]["tokens_per_s"]
    return {"N": int(n), "tau": round(moa["stats"]["tau"], 3),
            "draft_ms_per_step": round(1000.0 * moa["stats"]["draft_time"] / steps, 2),
            "speedup": round(tps / p_tps, 3) if p_tps > 0 else None,
            "ideal_speedup": None if moa["stats"].get("ideal_speedup") is None else
            round(moa["stats"]["ideal_speedup"], 3), "tokens_per_s": round(tps, 2),
            "source": "live" + (" (untrained)" if "untrained" in (moa.get("note") or "") else "")}


def build(ctx: AppContext) -> None:
    runtime = ctx.runtime
    gr.Markdown(EXPLANATION)
    committed = load_tli_table()
    gr.Markdown(table_markdown(committed) + "\n\n" + IDEAL_NOTE if committed else NO_TABLE, elem_id="tli-table")
    plot = gr.Plot(tli_figure(committed), show_label=False, elem_id="tli-plot")
    with gr.Row():
        n_radio = gr.Radio(list(TLI_CHOICES), value=1, label="N for the live run")
        max_new = gr.Slider(8, 256, value=48, step=8, label="Max new tokens")
    prompt = gr.Textbox(DEFAULT_PROMPT, label="Prompt for the live run", max_lines=4)
    run_btn = gr.Button("Run live: plain, then MoA with this N", variant="primary", elem_id="tli-run")
    live_md = gr.Markdown(elem_id="tli-live")

    @friendly
    def on_run(text, n, max_tokens, session, progress=gr.Progress()):
        runtime.load(progress_reporter(progress))
        ids = runtime.prompt_ids(text or DEFAULT_PROMPT)
        progress(0.3, desc="plain decoding (the reference)")
        plain = runtime.generate("ar", ids, int(max_tokens))
        progress(0.65, desc=f"MoA with N = {int(n)}")
        moa = runtime.generate("moa", ids, int(max_tokens), tli=int(n), plain_tps=plain["stats"]["tokens_per_s"])
        session["runs"] = [plain, moa]
        session["plain_tps"] = plain["stats"]["tokens_per_s"]
        session["tli_live"] = list(session.get("tli_live") or []) + [live_row(plain, moa, int(n))]
        note = f"\n\n⚠ {moa['note']}" if "untrained" in (moa.get("note") or "") else ""
        md = "**Your live runs (this session):**\n\n" + table_markdown(session["tli_live"]) + note + \
            "\n\n" + IDEAL_NOTE
        return tli_figure(load_tli_table(), session["tli_live"]), md, session

    run_btn.click(on_run, [prompt, n_radio, max_new, ctx.session], [plot, live_md, ctx.session],
                  api_visibility="private")
