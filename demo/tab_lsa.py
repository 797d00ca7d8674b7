"""Tab 3, LSA attention: which target layers MoA's Layer Self-Attention listens to (docs/ARCHITECTURE.md, "MoA")."""

from __future__ import annotations

import gradio as gr
import numpy as np

from demo.common import AppContext, friendly, last_runs, run_choices, run_decoder
from demo.render import lsa_bar, lsa_heatmap, lsa_matrices, lsa_received, message_figure, show_token

TITLE = "LSA attention"
EXPLANATION = """\
**What you see.** The Mixture-of-Attentions drafter does not read only the target's last layer. For every
token the target has just verified, it collects that token's keys and values from **all** target layers and
lets the layers attend to each other (Layer Self-Attention, LSA): each row of the heatmap is one target layer
asking "which layers should I listen to?", and each column is a layer being listened to (brighter = more
attention; every row sums to 1). The bar chart averages the rows: which target layers the drafter relies on
most. With an untrained drafter the pattern is close to uniform; a trained one develops clear preferences.
"""
NO_RUN = "Generate with Mixture of Attentions (method moa) in the Generate tab: its LSA weights appear here."
AVERAGE = -1


def has_lsa(run: dict) -> bool:
    return any("lsa_attention" in (e.get("extras") or {}) for e in run.get("events") or [])


def lsa_token_choices(meta: list[dict], decode) -> list[tuple[str, int]]:
    out = [(f"average over all {len(meta)} verified tokens", AVERAGE)]
    for i, m in enumerate(meta):
        tok = m.get("token")
        txt = show_token(decode([int(tok)])) if tok is not None else "?"
        out.append((f"step {m['step']} · token {i}: {txt}", i))
    return out


def lsa_view(run: dict | None, choice: int | None, decode) -> tuple:
    """(heatmap, bar, caption) for one verified token or the average over the run."""
    if run is None:
        return message_figure(NO_RUN), message_figure(""), ""
    mats, meta = lsa_matrices(run.get("events") or [])
    if mats is None:
        return (message_figure("This run has no LSA weights: the MoA drafter did not record them."),
                message_figure(""), "")
    if choice is None or choice == AVERAGE or not 0 <= int(choice) < len(meta):
        m = mats.mean(axis=0)
        title = f"LSA attention averaged over {len(meta)} verified tokens"
    else:
        m = mats[int(choice)]
        tok = meta[int(choice)].get("token")
        txt = show_token(decode([int(tok)])) if tok is not None else "?"
        title = f"LSA attention for {txt!r} (verified at step {meta[int(choice)]['step']})"
    recv = lsa_received(m)
    top = np.argsort(recv)[::-1][:3]
    caption = ("Most attended target layers: " + ", ".join(f"layer {int(i)} ({recv[i]:.3f})" for i in top)
               + f"; uniform would be {1 / len(recv):.3f} each.")
    return lsa_heatmap(m, title), lsa_bar(recv), caption


def build(ctx: AppContext) -> None:
    runtime = ctx.runtime
    gr.Markdown(EXPLANATION)
    with gr.Row():
        run_dd = gr.Dropdown([], label="MoA run (from your last generation)", elem_id="lsa-run")
        tok_dd = gr.Dropdown([], label="Verified token", elem_id="lsa-token")
    caption = gr.Markdown()
    with gr.Row():
        heat = gr.Plot(message_figure(NO_RUN), show_label=False, elem_id="lsa-heatmap")
        bar = gr.Plot(message_figure(""), show_label=False, elem_id="lsa-bar")

    def get_run(session, idx):
        runs = last_runs(session)
        return runs[idx] if idx is not None and 0 <= idx < len(runs) else None

    @friendly
    def refresh(session):
        choices = run_choices(session, has_lsa)
        idx = choices[-1][1] if choices else None
        run = get_run(session, idx)
        toks = lsa_token_choices(lsa_matrices(run["events"])[1], run_decoder(run, runtime)) if run else []
        h, b, c = lsa_view(run, AVERAGE, run_decoder(run, runtime))
        if run is None and last_runs(session):
            h = message_figure("Your last generation did not use MoA. " + NO_RUN)
        return gr.update(choices=choices, value=idx), gr.update(choices=toks, value=AVERAGE if run else None), \
            h, b, c

    @friendly
    def on_run(session, idx):
        run = get_run(session, idx)
        toks = lsa_token_choices(lsa_matrices(run["events"])[1], run_decoder(run, runtime)) if run else []
        h, b, c = lsa_view(run, AVERAGE, run_decoder(run, runtime))
        return gr.update(choices=toks, value=AVERAGE), h, b, c

    @friendly
    def on_token(session, idx, choice):
        run = get_run(session, idx)
        return lsa_view(run, choice, run_decoder(run, runtime))

    if ctx.tab is not None:
        ctx.tab.select(refresh, [ctx.session], [run_dd, tok_dd, heat, bar, caption], api_visibility="private")
    run_dd.input(on_run, [ctx.session, run_dd], [tok_dd, heat, bar, caption], api_visibility="private")
    tok_dd.input(on_token, [ctx.session, run_dd, tok_dd], [heat, bar, caption], api_visibility="private")
