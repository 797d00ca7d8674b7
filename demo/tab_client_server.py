"""Tab 5, Client-server: the target on a server, the drafter on your device, and what a dropped link does.

Runs core.client_server.sim on a virtual clock: the real target and drafters compute (their
measured times), the network (a preset plus the disconnect window chosen here) is modelled.
The real two-process split over 127.0.0.1 is the CLI's `--real` mode (core/client_server/loopback.py).
"""

from __future__ import annotations

import html

import gradio as gr

from analysis.offline import bound_figure, shipped_bound
from core.client_server.client import OFFLINE_MIN_CONFIDENCE, offline_confidence_for
from core.client_server.figures import METHOD_NAMES, timeline_figure, tokens_figure
from core.client_server.network import PRESETS, NetworkModel, preset
from core.client_server.sim import simulate
from demo.common import AppContext, friendly, progress_reporter
from demo.render import message_figure, token_pieces
from demo.runtime import UNTRAINED_NOTE, Runtime, UserError

TITLE = "Client-server"
EXPLANATION = """\
**What you see.** Here the big *target* model runs on a server and the small *drafter* runs on your device;
they talk over a mobile or Wi-Fi link (the presets are typical published figures, not measurements). Each
round trip costs network time, so methods that get several tokens per trip win. When the link drops (the grey
band), plain decoding over an API and EAGLE-2 simply stop: they need the server for every step. The Mixture of
Attentions (MoA) drafter only needs the server's answers for text it has already checked, so it **keeps writing
on its own** while offline, up to the distance it was trained to predict at (its *horizon*), and only while
it is sure enough: it stops when its own probability for the whole offline chain falls below the cut-off you
set (lower it and it writes more, but more of it gets withdrawn). That text is *provisional* (amber).
When the link returns the server checks it in one pass: the part it agrees with stays, the first wrong token
is replaced (red, with what was withdrawn struck through) and writing goes on. The final text is always exactly
what the target writes alone. The timeline shows who is busy when: your device drafting, the uplink, the server
verifying, the downlink.
"""
DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
METHOD_CHOICES = [("All three", "all"), ("Plain decoding over an API (ar)", "ar"), ("EAGLE-2 (eagle2)", "eagle2"),
                  ("Mixture of Attentions (moa)", "moa")]
STATUS_STYLE = {
    "verified": ("#d3f9d8", "verified by the server as it arrived"),
    "confirmed": ("#ffe8a1", "written offline (provisional), later confirmed by the server"),
    "corrected": ("#ffc9c9", "the server's correction of a wrong provisional token"),
}
NO_RUN = "Press Run to simulate a generation over the chosen network."


def network_for(preset_name: str, start: float, length: float) -> NetworkModel:
    if preset_name not in PRESETS:
        raise UserError(f"Unknown network preset {preset_name!r}.")
    start, length = float(start or 0), float(length or 0)
    if start < 0 or length < 0:
        raise UserError("The disconnect window needs a start and a length of at least 0 seconds.")
    return preset(preset_name, [(start, start + length)] if length > 0 else [])


def legend() -> str:
    items = [f'<span class="tok" style="background:{c};padding:1px 6px" title="{html.escape(t)}">{k}</span>'
             for k, (c, t) in STATUS_STYLE.items()]
    items.append('<span class="tok" style="padding:1px 6px;color:#868e96"><s>withdrawn</s></span>')
    return '<div class="tok-legend"><b>Legend:</b>' + "".join(items) + "</div>"


def text_html(run: dict, decode) -> str:
    """The final text, each token coloured by its history; withdrawn provisional text struck through."""
    ids = run["token_ids"]
    pieces = token_pieces(ids, decode) if ids else []
    spans = []
    for info, piece in zip(run["token_info"], pieces):
        colour, what = STATUS_STYLE.get(info["status"], ("#e9ecef", info["status"]))
        title = f"{what}; verified at {info['t']:.2f} s"
        if info.get("withdrawn"):
            gone = decode(info["withdrawn"])
            spans.append(f'<s style="color:#868e96" title="provisional text withdrawn at {info["t"]:.2f} s">'
                         f"{html.escape(gone)}</s>")
            title += f"; replaced the provisional {decode(info['withdrawn'][:1])!r}"
        shown = piece if piece else "[end]"
        spans.append(f'<span class="tok" style="background:{colour}" title="{html.escape(title, quote=True)}">'
                     f"{html.escape(shown)}</span>")
    if run.get("unverified"):
        spans.append(f'<span class="tok" style="background:#fff3bf;font-style:italic" title="never verified">'
                     f"{html.escape(decode(run['unverified']))}</span>")
    return f'<div class="tok-stream">{"".join(spans)}</div>'


def snapshot_html(run: dict, decode) -> str:
    """What the user saw just before the server's first verdict on provisional text."""
    snaps = run["trace"]["snapshots"]
    if not snaps:
        return ""
    s = snaps[0]
    return (f'<div class="stat-note">Just before the server checked it (at {s["t"]:.2f} s) the screen showed: '
            f'<span>{html.escape(decode(s["verified"]))}</span><span style="background:#ffe8a1">'
            f'{html.escape(decode(s["provisional"]))}</span></div>')


STOP_REASONS = {
    "horizon": "it reached its horizon: {h} tokens past the last verified one, the farthest it was trained to "
               "predict (beyond it the text drifts)",
    "confidence": "its own probability for the chain it had written fell below {c:g}, so more text would most "
                  "likely be withdrawn",
    "end_of_turn": "it drafted the end of its answer",
    "max_new_tokens": "the answer reached its length limit",
    "context": "the context window is full",
}


def bound_markdown(facts: dict) -> str:
    """Why so little offline text is confirmed, in the shipped drafter's own committed figures."""
    top1 = facts["top1_by_distance"]
    text = (f"**How much offline text can be confirmed at most.** The server keeps the offline chain up to its first "
            f"wrong token. If each token is right with probability p once the tokens before it are right, a chain of "
            f"{facts['horizon']} tokens keeps p + p² + p³ + … of them on average. MoA's top-1 accuracy 1 to "
            f"{len(top1)} tokens past the last verified one is {min(top1):.2f} to {max(top1):.2f} on held-out answers "
            f"(`python -m analysis.moa_channels`), so it can expect {facts['expected_confirmed_per_drop']:.2f} "
            f"confirmed tokens a drop")
    if "measured_per_drop" in facts:
        text += f"; the committed offline run measured {facts['measured_per_drop']:.2f}"
    text += (f". {facts['per_drop_asked']:g} a drop would need a top-1 accuracy of {facts['top1_needed']:.2f} at "
             f"every distance")
    if "best_drafter" in facts:
        text += (f": no drafter here comes close; the best, `{facts['best_drafter']}`, is at {facts['best_top1']:.2f} "
                 f"(held-out, `python -m analysis.teacher_forced`), with the target's fresh features at every step, "
                 f"which offline it would not have")
    return text + ". Longer offline text is not more confirmed text; that is why MoA stops where it is unsure."


def offline_stops_markdown(run: dict) -> str:
    """Where MoA stopped writing offline, and why (client.Client records each stop)."""
    parts = []
    for stop in run["offline_stops"]:
        why = STOP_REASONS.get(stop["reason"], stop["reason"]).format(h=run.get("offline_horizon"),
                                                                        c=run.get("offline_min_confidence", 0.0))
        parts.append(f"at {stop['t']:.2f} s, after {stop['provisional']} provisional tokens: {why}")
    return "**Where MoA stopped writing offline:** " + "; ".join(parts) + "."


def summary_markdown(runs: list[dict]) -> str:
    head = ("| method | tokens/s (virtual) | time (s) | server calls | offline tokens | confirmed | corrected | "
            "bytes up | bytes down | tau |\n|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for r in runs:
        rows.append(f"| {METHOD_NAMES.get(r['method'], r['method'])} | {r['tokens_per_s']:.1f} | "
                    f"{r['virtual_time_s']:.2f} | {r['server_calls']} | {r['offline_tokens']} | "
                    f"{r['confirmed_tokens']} | {r['corrected_tokens']} | {r['bytes_up']:,} | {r['bytes_down']:,} | "
                    f"{r['tau']:.2f} |")
    notes = sorted({r["note"] for r in runs if r.get("note")})
    stops = [offline_stops_markdown(r) for r in runs if r.get("offline_stops")]
    same = len({tuple(r["token_ids"]) for r in runs}) == 1
    tail = "\n\n" + ("All methods wrote exactly the same final text." if len(runs) > 1 and same else "")
    tail += "".join("\n\n" + s for s in stops)
    if any(n.startswith(UNTRAINED_NOTE) for n in notes):
        tail += "\n\n⚠ " + "; ".join(n for n in notes if n.startswith(UNTRAINED_NOTE))
    return head + "\n".join(rows) + tail


def run_methods(runtime: Runtime, prompt: str, preset_name: str, start: float, length: float, which: str,
                max_new_tokens, progress=None, min_confidence: float | None = None) -> list[dict]:
    """Simulate the chosen method(s) on the same prompt and network; JSON-able run dicts.
    min_confidence: MoA's offline cut-off (client.offline_confidence_for; None = its default)."""
    report = progress or (lambda f, t: None)
    net = network_for(preset_name, start, length)
    n = runtime.check_max_new_tokens(max_new_tokens)
    cutoff = offline_confidence_for(min_confidence)
    methods = ["ar", "eagle2", "moa"] if which == "all" else [which]
    for m in methods:
        runtime.check_method(m)
    runtime.load(progress)
    ids = runtime.prompt_ids(prompt or DEFAULT_PROMPT)
    target = runtime.target
    runs = []
    for i, m in enumerate(methods):
        report(0.1 + 0.85 * i / len(methods), f"{METHOD_NAMES[m]} over {net.name}")
        with runtime.drafter(m) as (drafter, note):
            run = simulate(target, m, None if m == "ar" else drafter, ids, net, n, note=note,
                           offline_min_confidence=cutoff)
        d = run.to_dict()
        d["text"] = runtime.decode(run.token_ids)
        runs.append(d)
    report(1.0, "done")
    return runs


def texts_html(runs: list[dict], decode) -> str:
    parts = []
    for r in runs:
        parts.append(f"<h4>{html.escape(METHOD_NAMES.get(r['method'], r['method']))}</h4>"
                     + text_html(r, decode) + snapshot_html(r, decode))
    return legend() + "".join(parts)


def build(ctx: AppContext) -> None:
    runtime = ctx.runtime
    gr.Markdown(EXPLANATION)
    with gr.Row():
        preset_dd = gr.Dropdown([(f"{k} — {v.description.split(':')[0]}", k) for k, v in PRESETS.items()],
                                value="4g", label="Network preset", elem_id="cs-preset")
        method_radio = gr.Radio(METHOD_CHOICES, value="all", label="Method", elem_id="cs-method")
    preset_info = gr.Markdown(PRESETS["4g"].description)
    with gr.Row():
        start = gr.Slider(0, 10, value=1.0, step=0.1, label="Link drops at (s)", elem_id="cs-drop-start")
        length = gr.Slider(0, 10, value=2.0, step=0.1, label="Drop length (s; 0 = no drop)", elem_id="cs-drop-len")
        max_new = gr.Slider(8, 128, value=48, step=8, label="Max new tokens")
        confidence = gr.Slider(0, 0.9, value=OFFLINE_MIN_CONFIDENCE, step=0.05, elem_id="cs-confidence",
                               label="MoA offline: stop when its confidence in the chain falls below")
    prompt = gr.Textbox(DEFAULT_PROMPT, label="Prompt", max_lines=4)
    run_btn = gr.Button("Run", variant="primary", elem_id="cs-run")
    summary = gr.Markdown(elem_id="cs-summary")
    tokens_plot = gr.Plot(message_figure(NO_RUN), show_label=False, elem_id="cs-tokens")
    timeline_dd = gr.Dropdown([], label="Timeline of", elem_id="cs-timeline-method")
    timeline_plot = gr.Plot(message_figure(NO_RUN), show_label=False, elem_id="cs-timeline")
    texts = gr.HTML(elem_id="cs-texts")
    facts = shipped_bound()
    if facts is not None:
        with gr.Accordion("How much offline text can be confirmed at most?", open=False):
            gr.Markdown(bound_markdown(facts))
            gr.Plot(bound_figure(facts), show_label=False, elem_id="cs-bound")

    def timeline_for(runs: list[dict], method: str | None):
        run = next((r for r in runs if r["method"] == method), runs[-1] if runs else None)
        return timeline_figure(run) if run else message_figure(NO_RUN)

    @friendly
    def on_run(text, preset_name, which, s, ln, n, cut, session, progress=gr.Progress()):
        runs = run_methods(runtime, text, preset_name, s, ln, which, n, progress_reporter(progress), cut)
        session = dict(session or {})
        session["client_server"] = runs
        focus = "moa" if any(r["method"] == "moa" for r in runs) else runs[-1]["method"]
        choices = [(METHOD_NAMES[r["method"]], r["method"]) for r in runs]
        return (summary_markdown(runs), tokens_figure(runs), gr.update(choices=choices, value=focus),
                timeline_for(runs, focus), texts_html(runs, runtime.decode), session)

    @friendly
    def on_timeline(method, session):
        return timeline_for((session or {}).get("client_server") or [], method)

    preset_dd.change(lambda p: PRESETS[p].description if p in PRESETS else "", [preset_dd], [preset_info],
                     api_visibility="private")
    run_btn.click(on_run, [prompt, preset_dd, method_radio, start, length, max_new, confidence, ctx.session],
                  [summary, tokens_plot, timeline_dd, timeline_plot, texts, ctx.session], api_visibility="private")
    timeline_dd.input(on_timeline, [timeline_dd, ctx.session], [timeline_plot], api_visibility="private")
