"""Tab 2, Draft tree: every node the drafter proposed at one step, the accepted path and the target's bonus token."""

from __future__ import annotations

import gradio as gr

from demo.common import AppContext, friendly, last_runs, run_choices, run_decoder
from demo.render import default_step, message_figure, show_token, step_choices, tree_figure

TITLE = "Draft tree"
EXPLANATION = """\
**What you see.** At each step the drafter does not guess just one continuation: tree-based methods
(EAGLE-2, MoA, Medusa, Amphista) propose a whole *tree* of alternatives, and the target checks every branch
in the same forward pass (a special attention mask lets each guess see only its own ancestors). The target
then walks down from the root, following the child that matches what it would have written itself. The
**green** path is what it accepted; **grey** branches were drafted but rejected; the **orange star** is the
token the target adds on its own at the end. Each label shows the token and the drafter's probability for it;
hover a node for the target's probability too. Pick a run from your last generation and a step to inspect.
"""
NO_RUN = "Generate something in the Generate tab first: its draft trees appear here."


def find_event(run: dict, step: int) -> dict | None:
    for e in run.get("events") or []:
        if int(e.get("step", -1)) == int(step):
            return e
    return None


def root_token(run: dict, step: int) -> int | None:
    """The root of step s's tree: the last token of step s - 1."""
    prev = find_event(run, int(step) - 1)
    return int(prev["new_tokens"][-1]) if prev and prev.get("new_tokens") else None


def step_summary(run: dict, step: int, decode) -> str:
    e = find_event(run, step)
    if e is None:
        return ""
    tree = e.get("tree") or {}
    n = len(tree.get("tokens") or [])
    if n == 0:
        return f"Step {step}: the drafter proposed nothing, so this pass produced one token (plain decoding)."
    acc = [show_token(decode([int(tree["tokens"][a])])) for a in e.get("accepted") or []]
    bonus = show_token(decode([int(e["bonus"])]))
    acc_txt = " ".join(f"`{t}`" for t in acc) if acc else "nothing"
    got = len(e.get("new_tokens") or [])
    return (f"Step {step}: {n} drafted tokens checked in one target pass; accepted {acc_txt}, "
            f"then the target added `{bonus}` itself: {got} token{'s' if got != 1 else ''} for one pass.")


def tree_view(run: dict | None, step: int | None, decode) -> tuple:
    """Figure and summary for (run, step); a message figure when there is nothing to draw."""
    if run is None:
        return message_figure(NO_RUN), ""
    if step is None:
        return message_figure(f"{run.get('label')} drafted nothing in this generation (plain decoding has no "
                              "tree): pick a speculative method."), ""
    e = find_event(run, step)
    if e is None:
        return message_figure(f"No step {step} in this run."), ""
    return tree_figure(e, decode, root_token(run, step)), step_summary(run, step, decode)


def build(ctx: AppContext) -> None:
    runtime = ctx.runtime
    gr.Markdown(EXPLANATION)
    with gr.Row():
        run_dd = gr.Dropdown([], label="Run (from your last generation)", elem_id="tree-run")
        step_dd = gr.Dropdown([], label="Step", elem_id="tree-step")
    summary = gr.Markdown()
    plot = gr.Plot(message_figure(NO_RUN), show_label=False, elem_id="tree-plot")

    def pick_run(session, idx):
        runs = last_runs(session)
        run = runs[idx] if idx is not None and 0 <= idx < len(runs) else (runs[-1] if runs else None)
        return run

    @friendly
    def refresh(session):
        runs = last_runs(session)
        choices = run_choices(session)
        idx = len(runs) - 1 if runs else None
        # prefer a run that drafted something
        for i in range(len(runs) - 1, -1, -1):
            if default_step(runs[i]["events"]) is not None:
                idx = i
                break
        run = runs[idx] if idx is not None else None
        steps = step_choices(run["events"]) if run else []
        step = default_step(run["events"]) if run else None
        fig, md = tree_view(run, step, run_decoder(run, runtime))
        return gr.update(choices=choices, value=idx), gr.update(choices=steps, value=step), fig, md

    @friendly
    def on_run(session, idx):
        run = pick_run(session, idx)
        steps = step_choices(run["events"]) if run else []
        step = default_step(run["events"]) if run else None
        fig, md = tree_view(run, step, run_decoder(run, runtime))
        return gr.update(choices=steps, value=step), fig, md

    @friendly
    def on_step(session, idx, step):
        run = pick_run(session, idx)
        return tree_view(run, step, run_decoder(run, runtime))

    if ctx.tab is not None:
        ctx.tab.select(refresh, [ctx.session], [run_dd, step_dd, plot, summary], api_visibility="private")
    run_dd.input(on_run, [ctx.session, run_dd], [step_dd, plot, summary], api_visibility="private")
    step_dd.input(on_step, [ctx.session, run_dd, step_dd], [plot, summary], api_visibility="private")
