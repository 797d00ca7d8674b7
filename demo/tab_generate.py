"""Tab 1, Generate: chat with the target through any method and watch tokens arrive, coloured by how they came."""

from __future__ import annotations

import html
import time

import gradio as gr

from core.drafters.static_tree import auto_tree_choice
from core.methods import METHODS, parse_method, takes_tli, with_tli
from core.trees.cost_curve import GPU_COST_MODEL, gpu_curve
from demo.common import AppContext, friendly, last_runs, progress_reporter, run_decoder, write_json_download
from demo.render import (
    compare_html,
    cost_curve_figure,
    default_step,
    divergence_html,
    generation_stats,
    legend_html,
    lossless_note,
    lsa_heatmap,
    lsa_matrices,
    message_figure,
    stats_html,
    tokens_html,
    tree_choice_figure,
    tree_figure,
)
from demo.runtime import TLI_CHOICES, UNTRAINED_NOTE, Runtime, UserError, trace_for_download

TITLE = "Generate"
EXPLANATION = """\
**What you see.** Speculative decoding lets a small, cheap *drafter* guess several next tokens; the big
*target* model then checks all guesses in **one** forward pass and keeps the longest run it agrees with, plus
one token of its own (the *bonus* or correction token). Every kept token is the target's own greedy choice: in
float32 the text is token for token what plain decoding writes; in bfloat16 (what `auto` picks where the
hardware multiplies it natively; the status line above says which one runs here) a multi-token pass rounds a
little differently, so on a near tie the text can take another, equally likely, turn. Every token is coloured
by how it came: **green** tokens were guessed by the drafter and accepted (darker = deeper in the guess),
**peach** tokens the target produced itself. **tau** is the number of tokens gained per target pass (plain
decoding: 1.0); the speedup compares tokens per second with plain decoding on this machine, beside the ideal
speedup that tau allows here. *Compare mode* runs plain decoding and two methods on the same prompt and
explains any difference.
"""
EXAMPLES = [
    ["Write a Python function that returns the n-th Fibonacci number, with a docstring."],  # code
    ["A train travels 180 km in 2 hours and then 120 km in 1.5 hours. What is its average speed?"],  # maths
    ["Summarise in two sentences: Bees collect nectar from flowers and turn it into honey, which they store in "
     "wax cells. A strong hive can hold tens of thousands of bees and make more honey than it needs."],  # summary
    ["Translate into French: The museum opens at nine and closes at six, except on Mondays."],  # translation
    ["Hi! Can you suggest three fun things to do on a rainy afternoon?"],  # chat
]
EXAMPLE_KINDS = ("code", "maths", "summary", "translation", "chat")
COST_CURVE_TEXT = """\
**Why is the speedup below tau?** Each cycle pays for one *verify pass* over the root and every drafted node,
plus the drafter's own time. The ideal speedup, tau x t(1-token pass) / t(verify pass), is what a drafter that
cost nothing would reach at this tau. On this machine a verify pass costs more than a one-token pass (the curve
below). Under the GPU cost model, where {model}, the ideal speedup equals tau.

**Why the tree is this size.** `auto` trees weigh, for every shape (depth x nodes), the tau the drafter
reaches with it (measured on held-out prompts) against what its verify pass and drafting cost on this machine.
The second plot shows that expected speedup for the method you picked: the star is the tree chosen here, the
circle the one the same drafter would get where a wide pass costs what a one-token pass does (a GPU). On a
small CPU the pass grows with the tree, so the best tree is small; on a GPU it is large.
"""
MAX_MESSAGE_CHARS = 6000
STREAM_EVERY_S = 0.08  # at most ~12 UI updates a second while streaming
DEFAULT_METHOD = "moa"  # the picker opens on MoA, the project's subject (the fallback when it is missing below)
FALLBACK_METHOD = "pld"  # also compare mode's method A: no drafter to load


def shows_tli(method: str) -> bool:
    """Whether the TLI picker applies to a menu entry: a method that takes TLI N, without a lookup branch."""
    return method in METHODS and METHODS[method].tli


def chat_view(conversation: list[dict], partial: str | None = None) -> list[dict]:
    """Messages for gr.Chatbot; `partial` is the assistant answer being written."""
    msgs = [{"role": m["role"], "content": m["content"]} for m in conversation]
    if partial is not None:
        msgs.append({"role": "assistant", "content": partial or "…"})
    return msgs


def method_name(runtime: Runtime, method: str, tli) -> str:
    """The one name the picker and the TLI radio make ('moa' and N=3 -> 'moa-tli3'), composed by core.methods."""
    return runtime.method_name(method, int(tli) if shows_tli(method) and tli is not None else None)


def note_html(runtime: Runtime, name: str, note: str | None = None) -> str:
    """The drafter note shown next to the method picker (untrained drafters say so plainly)."""
    text = note if note is not None else runtime.note_for(name)
    if not text:
        return ""
    if text.startswith(UNTRAINED_NOTE):
        return f'<div class="untrained-note">⚠ {html.escape(text)}</div>'
    return f'<div class="stat-note">{html.escape(text)}</div>'


def choice_figure(curve: dict | None, name: str, tli: int | None = None, calibrated: dict | None = None):
    """The expected speedup of every tree shape for the method `name` on this machine and under the GPU cost
    model; with `calibrated` (the running drafter's choice after measured cycles), that belief and the first guess.
    tli: MoA's N for a name given without it (core.methods composes 'moa', 3 -> 'moa-tli3')."""
    if tli and takes_tli(name):
        name = with_tli(name, int(tli))
    if not curve:
        return message_figure("The cost curve is measured once the target has loaded.")
    if not parse_method(name).method.trained:
        return message_figure(f"{name} drafts no tree: pick a drafter to see which tree pays here.")
    first = auto_tree_choice(name, curve)
    return tree_choice_figure(calibrated or first, auto_tree_choice(name, gpu_curve(curve)),
                              first=first if calibrated else None)


def plain_speed(session: dict, runtime: Runtime) -> tuple[float | None, str]:
    if session.get("plain_tps"):
        return session["plain_tps"], "your last plain run in this session"
    return runtime.plain_tps, runtime.plain_source


def check_message(message: str | None) -> str:
    message = (message or "").strip()
    if not message:
        raise UserError("Type a message first.")
    if len(message) > MAX_MESSAGE_CHARS:
        raise UserError(f"The message is {len(message)} characters long; the limit is {MAX_MESSAGE_CHARS}.")
    return message


def run_column(run: dict, plain: dict | None = None, decode=None) -> dict:
    untrained = (run.get("note") or "").startswith(UNTRAINED_NOTE)
    col = {"title": run["label"] + (" · untrained drafter" if untrained else ""),
           "html": tokens_html(run["tokens"], run["pieces"], empty="…"), "stats": run["stats"]}
    if plain is not None and run.get("done") and plain.get("done"):
        col["ok"], col["note"] = lossless_note(plain["token_ids"], run["token_ids"], run["greedy"])
        if not col["ok"] and decode is not None:
            col["why"] = divergence_html(plain, run, decode)
    return col


def example_figures(run: dict | None, decode) -> tuple:
    """(tree figure of the run's longest accepted step, LSA map averaged over the run or None)."""
    if run is None:
        return message_figure("No example shipped (assets/lessons/)."), None
    step = default_step(run.get("events") or [])
    events = {int(e["step"]): e for e in run.get("events") or []}
    if step is None:
        tree = message_figure(f"{run.get('label')} drafted nothing (plain decoding has no tree).")
    else:
        prev = events.get(step - 1)
        root = int(prev["new_tokens"][-1]) if prev and prev.get("new_tokens") else None
        tree = tree_figure(events[step], decode, root)
        tree.update_layout(height=380)
    mats, _ = lsa_matrices(run.get("events") or [])
    lsa = None
    if mats is not None:
        lsa = lsa_heatmap(mats.mean(axis=0), "MoA's layer self-attention, averaged over the answer")
        lsa.update_layout(height=380)
    return tree, lsa


def example_note(run: dict | None) -> str:
    if not run or not run.get("example"):
        return ""
    return (f'<div class="example-note">Example: a finished {html.escape(str(run.get("label")))} run, shipped in '
            f'<code>{html.escape(str(run.get("source", "")))}</code> and shown without loading any model. Ask your '
            "own question below, or replay this one cycle by cycle in <b>Step by step</b>.</div>")


def build(ctx: AppContext) -> None:
    runtime = ctx.runtime
    methods = runtime.methods()
    values = [m for _, m in methods]
    default = DEFAULT_METHOD if DEFAULT_METHOD in values else FALLBACK_METHOD
    first = (ctx.session.value or {}).get("runs") or []
    example = first[0] if first and first[0].get("example") else None
    ex_decode = run_decoder(example, runtime) if example else None
    ex_tree, ex_lsa = example_figures(example, ex_decode)
    gr.Markdown(EXPLANATION)
    with gr.Row():
        with gr.Column(scale=3):
            chatbot = gr.Chatbot(
                chat_view([{"role": "user", "content": example["prompt"]},
                           {"role": "assistant", "content": example["text"]}]) if example else None,
                label="Conversation (the model's chat template, multi-turn)", height=280,
                show_label=False, elem_id="chatbot",
                placeholder="Chat with the target model: each answer continues the conversation.")
            with gr.Row():
                msg = gr.Textbox(placeholder="Ask something, then press Enter or Generate", show_label=False,
                                 scale=5, max_lines=6, elem_id="prompt-box")
                send = gr.Button("Generate", variant="primary", scale=1, min_width=90, elem_id="send-btn")
                stop = gr.Button("Stop", variant="stop", scale=1, min_width=70, elem_id="stop-btn")
            gr.Examples(EXAMPLES, [msg], label="Example prompts: " + ", ".join(EXAMPLE_KINDS),
                        example_labels=[f"{k}: {e[0][:38]}…" for k, e in zip(EXAMPLE_KINDS, EXAMPLES)])
            gr.HTML(legend_html(), elem_id="token-legend")
            ex_note = gr.HTML(example_note(example), elem_id="example-note")
            tokens = gr.HTML(tokens_html(example["tokens"], example["pieces"]) if example else
                             tokens_html([], [], empty="Tokens appear here as the target accepts them."),
                             elem_id="token-stream")
        with gr.Column(scale=2):
            method = gr.Dropdown(methods, value=default, label="Method", elem_id="method-picker")
            tli = gr.Radio(list(TLI_CHOICES), value=1, label="MoA: target layers the drafter runs (TLI N)",
                           visible=shows_tli(default), elem_id="tli-picker")
            temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            max_new = gr.Slider(1, runtime.max_new_tokens, value=96, step=1, label="Max new tokens",
                                elem_id="max-new")
            note = gr.HTML(note_html(runtime, method_name(runtime, default, 1)), elem_id="drafter-note")
            stats = gr.HTML(stats_html(example["stats"]) if example else stats_html(generation_stats([], 0.0)),
                            elem_id="live-stats")
            with gr.Row():
                clear = gr.Button("Clear chat", size="sm")
                download = gr.DownloadButton("Download trace (JSON)", size="sm", elem_id="download-trace")
    with gr.Row():
        tree_plot = gr.Plot(ex_tree, show_label=False, elem_id="gen-tree")
        lsa_plot = gr.Plot(ex_lsa or message_figure(""), show_label=False, elem_id="gen-lsa",
                           visible=ex_lsa is not None)
    with gr.Accordion("Compare mode: plain decoding vs two methods on the same prompt", open=False):
        with gr.Row():
            cmp_a = gr.Dropdown(methods, value=FALLBACK_METHOD, label="Method A")
            cmp_b = gr.Dropdown(methods, value=default, label="Method B")
            exact = gr.Checkbox(False, label="exact (float32): texts must then be identical", elem_id="cmp-exact")
            cmp_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn")
        cmp_out = gr.HTML(elem_id="compare-out")
    with gr.Accordion("This machine's cost curve: why the speedup is below tau", open=False,
                      elem_id="cost-curve") as curve_box:
        gr.Markdown(COST_CURVE_TEXT.format(model=GPU_COST_MODEL))
        curve_plot = gr.Plot(cost_curve_figure(runtime.cost_curve), show_label=False, elem_id="cost-curve-plot")
        choice_plot = gr.Plot(message_figure("Open this panel after the model has loaded."), show_label=False,
                              elem_id="tree-choice-plot")

    def on_method(m, n):
        return {tli: gr.update(visible=shows_tli(m)), note: note_html(runtime, method_name(runtime, m, n))}

    method.change(on_method, [method, tli], [tli, note], queue=False, api_visibility="private")
    tli.change(on_method, [method, tli], [tli, note], queue=False, api_visibility="private")

    def run_figures(run) -> dict:
        tree, lsa = example_figures(run, run_decoder(run, runtime))
        return {tree_plot: tree, lsa_plot: gr.update(value=lsa, visible=lsa is not None)}

    # The handlers return {component: update}: Gradio leaves the outputs they do not name unchanged.
    @friendly
    def on_send(message, m, n, temp, max_tokens, session, progress=gr.Progress()):
        message = check_message(message)
        name = method_name(runtime, m, n)
        max_tokens = runtime.check_max_new_tokens(max_tokens)
        runtime.load(progress_reporter(progress))
        conversation = list(session["conversation"]) + [{"role": "user", "content": message}]
        ids = runtime.prompt_ids(conversation)
        plain_tps, source = plain_speed(session, runtime)
        yield {chatbot: chat_view(conversation, ""), msg: "",
               tokens: tokens_html([], [], empty="waiting for the first token…"),
               stats: stats_html(generation_stats([], 0.0), running=True), ex_note: "", ctx.session: session}
        last, run = 0.0, None
        try:
            for run in runtime.stream(name, ids, max_tokens, float(temp), plain_tps=plain_tps):
                if run["done"] or time.perf_counter() - last > STREAM_EVERY_S:
                    last = time.perf_counter()
                    partial = "".join(run["pieces"])
                    session["runs"] = [run]
                    yield {chatbot: chat_view(conversation, partial), tokens: tokens_html(run["tokens"], run["pieces"]),
                           stats: stats_html(run["stats"], source, running=True),
                           note: note_html(runtime, name, run["note"]), ctx.session: session}
        finally:  # also runs when the user presses Stop: keep what was written so far
            if run is not None:
                text = run["text"] if run["done"] else "".join(run["pieces"])
                session["conversation"] = conversation + [{"role": "assistant", "content": text}]
                if not run["done"]:
                    run["stop_reason"] = "stopped"
                    run["text"] = text
        if name == "ar" and run["stats"]["new_tokens"] >= 8:
            session["plain_tps"] = run["stats"]["tokens_per_s"]
        path = write_json_download(trace_for_download(run), f"speclens-trace-{m}")
        # "generating" leaves the stats only here, with the trace, the figures and the session the other tabs read
        yield {chatbot: chat_view(session["conversation"]), download: gr.update(value=path), **run_figures(run),
               stats: stats_html(run["stats"], source), ctx.session: session}

    gen_outputs = [chatbot, msg, tokens, stats, note, download, ex_note, tree_plot, lsa_plot, ctx.session]
    send_event = send.click(
        on_send, [msg, method, tli, temperature, max_new, ctx.session], gen_outputs, api_visibility="private")
    submit_event = msg.submit(
        on_send, [msg, method, tli, temperature, max_new, ctx.session], gen_outputs, api_visibility="private")

    def on_clear(session):
        session["conversation"] = []
        return [], tokens_html([], [], empty="Tokens appear here as the target accepts them."), "", session

    clear.click(on_clear, [ctx.session], [chatbot, tokens, ex_note, ctx.session], queue=False,
                api_visibility="private")

    @friendly
    def on_compare(message, a, b, n, temp, max_tokens, exact_f32, session, progress=gr.Progress()):
        message = check_message(message)
        names = ["ar", method_name(runtime, a, n), method_name(runtime, b, n)]
        max_tokens = runtime.check_max_new_tokens(max_tokens)
        rt = runtime.for_dtype("float32") if exact_f32 else runtime
        rt.load(progress_reporter(progress))
        conversation = [m for m in session["conversation"]] + [{"role": "user", "content": message}]
        ids = rt.prompt_ids(conversation)
        runs: list[dict] = []
        columns: list[dict] = []
        plain = None
        for name in names:
            last = 0.0
            for run in rt.stream(name, ids, max_tokens, float(temp),
                                 plain_tps=plain["stats"]["tokens_per_s"] if plain else None):
                if run["done"] or time.perf_counter() - last > STREAM_EVERY_S:
                    last = time.perf_counter()
                    cols = columns + [run_column(run, plain)]
                    yield {cmp_out: compare_html(cols), ctx.session: session}
            if plain is None:
                plain = run
                if not exact_f32:
                    session["plain_tps"] = run["stats"]["tokens_per_s"]
            runs.append(run)
            columns.append(run_column(run, plain if len(runs) > 1 else None, rt.decode))
        columns[0]["note"] = (f"reference: plain decoding (one target pass per token), "
                              f"{plain.get('dtype', '')}")
        columns[0]["ok"] = True
        session["runs"] = runs
        path = write_json_download([trace_for_download(r) for r in runs], "speclens-compare")
        yield {cmp_out: compare_html(columns), download: gr.update(value=path), ctx.session: session}

    cmp_event = cmp_btn.click(on_compare, [msg, cmp_a, cmp_b, tli, temperature, max_new, exact, ctx.session],
                              [cmp_out, download, ctx.session], api_visibility="private")
    stop.click(None, None, None, cancels=[send_event, submit_event, cmp_event], queue=False,
               api_visibility="private")

    def on_curve(session, m, n):
        runs = [r for r in last_runs(session) if not r.get("example")]
        size = runs[-1]["stats"].get("mean_drafted") if runs else None
        curve = runtime.measure_cost_curve() if runtime.loaded else runtime.cost_curve
        name = method_name(runtime, m, n)
        return cost_curve_figure(curve, size), choice_figure(curve, name, calibrated=runtime.calibrated_choice(name))

    curve_box.expand(friendly(on_curve), [ctx.session, method, tli], [curve_plot, choice_plot],
                     api_visibility="private")

    def on_method_choice(m, n):  # an open panel follows the method picker (nothing is measured here)
        name = method_name(runtime, m, n)
        return choice_figure(runtime.cost_curve, name, calibrated=runtime.calibrated_choice(name))

    for picker in (method, tli):
        picker.change(friendly(on_method_choice), [method, tli], [choice_plot], api_visibility="private")
