"""Tab 5, Client-server: the target on a server, the drafter on your device, and what a dropped link does.

Runs core.client_server.sim on a virtual clock: the real target and drafters choose every token, in float32
(where a verify pass over many tokens picks exactly what a one-token pass picks), while time is modelled: the
network by a preset plus the disconnect window chosen here, compute by a fixed cost model (sim.CostModel), so
the float32 arithmetic costs no figure and a run is reproducible. The real two-process split over 127.0.0.1,
timed for real, is the CLI's `--real` mode (core/client_server/loopback.py).

The tab opens on a recorded run (EXAMPLE_PATH: the shipped drafters, the default prompt and network), shown
without any model; a new run replaces it. Record it again when the drafters change:

    python scripts/record_client_server.py          # or: make client-server-example
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path

import gradio as gr

from analysis.offline import bound_figure, shipped_bound
from core.client_server.client import OFFLINE_MIN_CONFIDENCE, offline_confidence_for
from core.client_server.figures import METHOD_NAMES, timeline_figure, tokens_figure
from core.client_server.network import PRESETS, NetworkModel, preset
from core.client_server.sim import CostModel, simulate
from core.methods import METHODS, methods_where
from demo.common import RESULTS, ROOT, AppContext, friendly, progress_reporter
from demo.lessons import decoder
from demo.render import first_difference, message_figure, token_pieces
from demo.runtime import UNTRAINED_NOTE, Runtime, UserError

TITLE = "Client-server"
EXACT_DTYPE = "float32"  # the texts this tab shows must equal plain decoding's (bfloat16 can flip near ties)
COMPUTE = CostModel()  # compute time: fixed costs, the same in float32 as in bfloat16 and on any machine
EXPLANATION = f"""\
**What you see.** Here the big *target* model runs on a server and the small *drafter* runs on your device;
they talk over a mobile or Wi-Fi link (the presets are typical published figures, not measurements). Each
round trip costs network time, so methods that get several tokens per trip win. When the link drops (the grey
band), plain decoding over an API and EAGLE-2 simply stop: they need the server for every step. The Mixture of
Attentions (MoA) drafter only needs the server's answers for text it has already checked, so it **keeps writing
on its own** while offline, up to the distance it was trained to predict at (its *horizon*), and only while
it is sure enough: it stops when its own probability for the whole offline chain falls below the cut-off you
set (lower it and it writes more, but more of it gets withdrawn). That text is *provisional* (amber).
When the link returns the server checks it in one pass: the part it agrees with stays, the first wrong token
is replaced (red, with what was withdrawn struck through) and writing goes on. The target and drafters run in
float32 here, so the final text is always exactly what the target writes alone (in bfloat16 a pass over many
tokens rounds differently and can flip a near tie; the Generate tab's compare mode shows it). Time is modelled,
not measured: the network by the preset, compute by fixed costs (a target pass
{1000 * COMPUTE.pass_base_s:.0f} ms + {1000 * COMPUTE.pass_per_token_s:.1f} ms a token, a drafting level
{1000 * COMPUTE.draft_level_s:.0f} ms), so float32 costs no figure and the same settings give the same run. The
timeline shows who is busy when: your device drafting, the uplink, the server verifying, the downlink.
"""
DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
# The controls' defaults, which the recorded example is made with (scripts/record_client_server.py).
DEFAULTS = {"prompt": DEFAULT_PROMPT, "preset": "4g", "drop_start": 1.0, "drop_length": 2.0, "which": "all",
            "max_new_tokens": 48, "min_confidence": OFFLINE_MIN_CONFIDENCE}
EXAMPLE_PATH = RESULTS / "client_server_example.json"
EXAMPLE_FORMAT = "speclens-client-server-example/1"
RECORD_COMMAND = "python scripts/record_client_server.py"
SERVED = methods_where(client_server=True)  # plain decoding over an API, EAGLE-2, MoA (core.methods' table)
OFFLINE_METHOD = methods_where(client_server="offline")[0]  # MoA: it keeps writing while the link is down
METHOD_CHOICES = [("All three", "all")] + [
    (f"{METHODS[m].label}{' over an API' if METHODS[m].client_server == 'api' else ''} ({m})", m) for m in SERVED]
STATUS_STYLE = {
    "verified": ("#d3f9d8", "verified by the server as it arrived"),
    "confirmed": ("#ffe8a1", "written offline (provisional), later confirmed by the server"),
    "corrected": ("#ffc9c9", "the server's correction of a wrong provisional token"),
}
NO_RUN = "Press Run to simulate a generation over the chosen network."
BOUND_ID = "cs-bound-box"  # the accordion the offline sentence links to (app.py's link handler opens it)


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


def run_pieces(run: dict, decode: Callable[[list[int]], str]) -> list[str]:
    """Each final token's text: recorded with the run (decoded in context), else decoded now."""
    ids = run["token_ids"]
    if run.get("pieces") is not None and len(run["pieces"]) == len(ids):
        return list(run["pieces"])
    return token_pieces(ids, decode) if ids else []


def text_html(run: dict, decode: Callable[[list[int]], str], departs: int | None = None) -> str:
    """The final text, each token coloured by its history; withdrawn provisional text struck through.
    `departs`: where the text first differs from plain decoding's (outlined), if it does."""
    spans = []
    for i, (info, piece) in enumerate(zip(run["token_info"], run_pieces(run, decode))):
        colour, what = STATUS_STYLE.get(info["status"], ("#e9ecef", info["status"]))
        title = f"{what}; verified at {info['t']:.2f} s"
        if info.get("withdrawn"):
            gone = decode(info["withdrawn"])
            spans.append(f'<s style="color:#868e96" title="provisional text withdrawn at {info["t"]:.2f} s">'
                         f"{html.escape(gone)}</s>")
            title += f"; replaced the provisional {decode(info['withdrawn'][:1])!r}"
        style = f"background:{colour}"
        if i == departs:
            style += ";outline:2px solid #b54708"
            title += "; the first token that differs from plain decoding"
        shown = piece if piece else "[end]"
        spans.append(f'<span class="tok" style="{style}" title="{html.escape(title, quote=True)}">'
                     f"{html.escape(shown)}</span>")
    if run.get("unverified"):
        spans.append(f'<span class="tok" style="background:#fff3bf;font-style:italic" title="never verified">'
                     f"{html.escape(decode(run['unverified']))}</span>")
    return f'<div class="tok-stream">{"".join(spans)}</div>'


def snapshot_html(run: dict, decode: Callable[[list[int]], str]) -> str:
    """What the user saw just before the server's first verdict on provisional text."""
    snaps = run["trace"]["snapshots"]
    if not snaps:
        return ""
    s = snaps[0]
    # verified text only grows, so what was verified then is the start of the final text
    verified = "".join(run_pieces(run, decode)[:len(s["verified"])])
    return (f'<div class="stat-note">Just before the server checked it (at {s["t"]:.2f} s) the screen showed: '
            f'<span>{html.escape(verified)}</span><span style="background:#ffe8a1">'
            f'{html.escape(decode(s["provisional"]))}</span></div>')


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


STOPPED = {
    "horizon": "at its horizon, {h} tokens past the last verified one (the farthest it was trained to predict)",
    "confidence": "where its own confidence in the chain fell below the cut-off of {c:g}",
    "end_of_turn": "where it drafted the end of its answer",
    "max_new_tokens": "at the answer's length limit",
    "context": "where the context window was full",
}


def _tokens(n: int) -> str:
    return f"{n} token" + ("" if n == 1 else "s")


def offline_sentence(runs: list[dict], facts: dict | None = None) -> str:
    """What MoA wrote while the link was down, how much of it the server kept, and why (one plain paragraph)."""
    moa = next((r for r in runs if r["method"] == "moa"), None)
    if moa is None:
        return "Pick <b>All three</b> or <b>MoA</b> and press Run to see what MoA writes while the link is down."
    if not moa.get("disconnects"):
        return "The link never dropped in this run, so MoA wrote nothing offline: set a drop above and press Run."
    n, kept = moa["offline_tokens"], moa["confirmed_tokens"]
    cut = moa.get("offline_min_confidence", 0.0)
    if n == 0:
        head = "<b>While the link was down MoA wrote nothing on its own</b>"
    else:
        them = "it" if n == 1 else "them"
        confirmed = f"none of {them}" if kept == 0 else them if kept == n == 1 else f"{kept} of {them}"
        head = (f"<b>While the link was down MoA wrote {_tokens(n)} on its own, and the server confirmed "
                f"{confirmed}</b> ({moa['corrected_tokens']} withdrawn)")
    reasons = list(dict.fromkeys(s["reason"] for s in moa.get("offline_stops") or []))
    why = " and ".join(STOPPED.get(r, r).format(h=moa.get("offline_horizon"), c=cut) for r in reasons)
    text = head + (f". It stopped {why}" if why else "")
    if facts:
        top1 = facts["top1_by_distance"]
        accuracy = (f"1 to {len(top1)} tokens past the last verified one its guesses are right only "
                    f"{min(top1):.0%} to {max(top1):.0%} of the time, so a drop can expect about "
                    f"{facts['expected_confirmed_per_drop']:.2f} confirmed tokens "
                    f'(<a href="#{BOUND_ID}">how much offline text can be confirmed at most?</a>)')
        unsure = reasons and set(reasons) <= {"confidence", "horizon"}
        text += f", and with reason: {accuracy}" if unsure else f". {accuracy[0].upper()}{accuracy[1:]}"
    text += ". "
    if cut > 0:
        text += "Lower the cut-off here and rerun MoA: it writes more offline, and you see how much is withdrawn."
    else:
        text += "With the cut-off at 0 only the horizon stops it; raise it to show only text MoA is sure of."
    return text


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
    same = len({tuple(r["token_ids"]) for r in runs}) == 1
    dtype = runs[0].get("dtype") if runs else None
    tail = "\n\n"
    if len(runs) > 1 and same:
        tail += "All methods wrote exactly the same final text" + (f" ({dtype})." if dtype else ".")
    elif len(runs) > 1:
        plain = next((r for r in runs if r["method"] == "ar"), runs[0])
        at = {r["method"]: first_difference(plain["token_ids"], r["token_ids"]) for r in runs if r is not plain}
        differ = [f"{METHOD_NAMES.get(m, m)} from token {i}" for m, i in at.items() if i is not None]
        tail += (f"⚠ The final texts differ from plain decoding's ({', '.join(differ)}, outlined below)"
                 + (": in float32 they should not, please report it with the prompt and settings."
                    if dtype == "float32" else ": a bfloat16 near tie (see the Generate tab's compare mode)."))
    if any(n.startswith(UNTRAINED_NOTE) for n in notes):
        tail += "\n\n⚠ " + "; ".join(n for n in notes if n.startswith(UNTRAINED_NOTE))
    return head + "\n".join(rows) + tail


def run_methods(runtime: Runtime, prompt: str, preset_name: str, start: float, length: float, which: str,
                max_new_tokens, progress=None, min_confidence: float | None = None) -> list[dict]:
    """Simulate the chosen method(s) on the same prompt and network, in float32 with modelled compute time;
    JSON-able run dicts (RunResult.to_dict() plus text, pieces and dtype).
    min_confidence: MoA's offline cut-off (client.offline_confidence_for; None = its default)."""
    report = progress or (lambda f, t: None)
    net = network_for(preset_name, start, length)
    rt = runtime.for_dtype(EXACT_DTYPE)
    n = rt.check_max_new_tokens(max_new_tokens)
    try:
        cutoff = offline_confidence_for(min_confidence)
    except ValueError as err:
        raise UserError(str(err)) from None
    methods = list(SERVED) if which == "all" else [which]
    for m in methods:
        rt.check_method(m)
    rt.load(progress)
    ids = rt.prompt_ids(prompt or DEFAULT_PROMPT)
    target = rt.target
    runs = []
    for i, m in enumerate(methods):
        report(0.1 + 0.85 * i / len(methods), f"{METHOD_NAMES[m]} over {net.name}")
        with rt.drafter(m) as (drafter, note):
            run = simulate(target, m, None if m == "ar" else drafter, ids, net, n, timing=COMPUTE, note=note,
                           offline_min_confidence=cutoff)
        d = run.to_dict()
        d["text"] = rt.decode(run.token_ids)
        d["pieces"] = token_pieces(run.token_ids, rt.decode)
        d["dtype"] = str(target.dtype).replace("torch.", "")
        runs.append(d)
    report(1.0, "done")
    return runs


def texts_html(runs: list[dict], decode: Callable[[list[int]], str]) -> str:
    plain = next((r for r in runs if r["method"] == "ar"), None)
    parts = []
    for r in runs:
        departs = None if plain is None or r is plain else first_difference(plain["token_ids"], r["token_ids"])
        parts.append(f"<h4>{html.escape(METHOD_NAMES.get(r['method'], r['method']))}</h4>"
                     + text_html(r, decode, departs) + snapshot_html(r, decode))
    return legend() + "".join(parts)


# ----- the recorded example ---------------------------------------------------------------------------

def example_token_ids(runs: list[dict]) -> set[int]:
    """Every token id the tab decodes for these runs."""
    ids: set[int] = set()
    for r in runs:
        ids.update(r["token_ids"])
        ids.update(r.get("unverified") or [])
        for info in r["token_info"]:
            ids.update(info.get("withdrawn") or [])
        for s in r["trace"]["snapshots"]:
            ids.update(s["provisional"])
    return {int(i) for i in ids}


def make_example(runs: list[dict], settings: dict, decode: Callable[[list[int]], str], target: str) -> dict:
    """The recorded example: the runs, the settings they were made with and the text of every token they show."""
    return {"format": EXAMPLE_FORMAT, "command": RECORD_COMMAND, "target": target,
            "dtype": runs[0].get("dtype") if runs else None, "settings": dict(settings),
            "drafters": {r["method"]: r.get("note", "") for r in runs if r["method"] != "ar"},
            "token_text": {str(t): decode([t]) for t in sorted(example_token_ids(runs))}, "runs": runs}


def load_example(path: Path = EXAMPLE_PATH) -> dict | None:
    """The recorded example (None when the file is missing); ValueError naming the file when it is not one."""
    path = Path(path)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != EXAMPLE_FORMAT or not data.get("runs"):
        raise ValueError(f"{path} is not a recorded client-server example (format {EXAMPLE_FORMAT!r} expected)")
    data["source"] = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return data


def example_note(example: dict | None) -> str:
    if not example:
        return (f'<div class="example-note">No recorded example yet (<code>{html.escape(RECORD_COMMAND)}</code> '
                "records one); press Run.</div>")
    return (f'<div class="example-note">Recorded example: the shipped drafters on the settings above, in '
            f'{html.escape(str(example.get("dtype")))}, shown without loading any model '
            f'(<code>{html.escape(example["source"])}</code>, made by <code>{html.escape(RECORD_COMMAND)}</code>); '
            "press Run and your own run replaces it.</div>")


def run_note(runs: list[dict], rerun_cutoff: float | None = None) -> str:
    dtype = html.escape(str(runs[0].get("dtype", EXACT_DTYPE) if runs else EXACT_DTYPE))
    if rerun_cutoff is not None:
        return (f'<div class="example-note">MoA rerun at the cut-off {rerun_cutoff:g} ({dtype}) on the same prompt '
                "and network; the other methods' runs are kept.</div>")
    return f'<div class="example-note">Your run: the real target and drafters in {dtype}, modelled time.</div>'


def shown(session: dict | None, example: dict | None) -> dict | None:
    """What the tab shows: the session's last client-server runs, else the recorded example."""
    mine = (session or {}).get("client_server")
    return mine if mine else example


def build(ctx: AppContext) -> None:
    runtime = ctx.runtime
    example = load_example()
    facts = shipped_bound()
    settings = {**DEFAULTS, **(example or {}).get("settings", {})}
    ex_runs = example["runs"] if example else []

    def decode_for(view: dict | None) -> Callable[[list[int]], str]:
        """The example's own token texts (then the tokenizer, once loaded); a new run's tokenizer."""
        if view is not None and view.get("token_text") is not None:
            return decoder(view, runtime.decode if runtime.loaded else None)
        return runtime.for_dtype(EXACT_DTYPE).decode

    def timeline_for(runs: list[dict], method: str | None):
        run = next((r for r in runs if r["method"] == method), runs[-1] if runs else None)
        return timeline_figure(run) if run else message_figure(NO_RUN)

    def focus_of(runs: list[dict]) -> str | None:
        if any(r["method"] == OFFLINE_METHOD for r in runs):
            return OFFLINE_METHOD
        return runs[-1]["method"] if runs else None

    gr.Markdown(EXPLANATION)
    with gr.Row():
        preset_dd = gr.Dropdown([(f"{k} — {v.description.split(':')[0]}", k) for k, v in PRESETS.items()],
                                value=settings["preset"], label="Network preset", elem_id="cs-preset")
        method_radio = gr.Radio(METHOD_CHOICES, value=settings["which"], label="Method", elem_id="cs-method")
    preset_info = gr.Markdown(PRESETS[settings["preset"]].description)
    with gr.Row():
        start = gr.Slider(0, 10, value=settings["drop_start"], step=0.1, label="Link drops at (s)",
                          elem_id="cs-drop-start")
        length = gr.Slider(0, 10, value=settings["drop_length"], step=0.1, label="Drop length (s; 0 = no drop)",
                           elem_id="cs-drop-len")
        max_new = gr.Slider(8, 128, value=settings["max_new_tokens"], step=8, label="Max new tokens",
                            elem_id="cs-max-new")
    prompt = gr.Textbox(settings["prompt"], label="Prompt", max_lines=4, elem_id="cs-prompt")
    run_btn = gr.Button("Run", variant="primary", elem_id="cs-run")
    note = gr.HTML(example_note(example), elem_id="cs-example-note")
    summary = gr.Markdown(summary_markdown(ex_runs) if ex_runs else "", elem_id="cs-summary")
    with gr.Row(equal_height=False):
        offline = gr.HTML(offline_sentence(ex_runs, facts) if ex_runs else "", elem_id="cs-offline", scale=3)
        with gr.Column(scale=1, min_width=260):
            confidence = gr.Slider(0, 0.9, value=settings["min_confidence"], step=0.05, elem_id="cs-confidence",
                                   label="MoA offline: stop when its confidence in the chain falls below")
            rerun_btn = gr.Button("Rerun MoA at this cut-off", size="sm", elem_id="cs-rerun")
    tokens_plot = gr.Plot(tokens_figure(ex_runs) if ex_runs else message_figure(NO_RUN), show_label=False,
                          elem_id="cs-tokens")
    timeline_dd = gr.Dropdown([(METHOD_NAMES[r["method"]], r["method"]) for r in ex_runs], value=focus_of(ex_runs),
                              label="Timeline of", elem_id="cs-timeline-method")
    timeline_plot = gr.Plot(timeline_for(ex_runs, focus_of(ex_runs)), show_label=False, elem_id="cs-timeline")
    texts = gr.HTML(texts_html(ex_runs, decode_for(example)) if ex_runs else "", elem_id="cs-texts")
    if facts is not None:
        with gr.Accordion("How much offline text can be confirmed at most?", open=False, elem_id=BOUND_ID):
            gr.Markdown(bound_markdown(facts))
            gr.Plot(bound_figure(facts), show_label=False, elem_id="cs-bound")

    def outputs_for(view: dict, session: dict, note_html: str) -> tuple:
        runs = view["runs"]
        focus = focus_of(runs)
        choices = [(METHOD_NAMES[r["method"]], r["method"]) for r in runs]
        return (note_html, summary_markdown(runs), offline_sentence(runs, facts), tokens_figure(runs),
                gr.update(choices=choices, value=focus), timeline_for(runs, focus), texts_html(runs, decode_for(view)),
                session)

    @friendly
    def on_run(text, preset_name, which, s, ln, n, cut, session, progress=gr.Progress()):
        runs = run_methods(runtime, text, preset_name, s, ln, which, n, progress_reporter(progress), cut)
        view = {"settings": {"prompt": text or DEFAULT_PROMPT, "preset": preset_name, "drop_start": s,
                             "drop_length": ln, "which": which, "max_new_tokens": n, "min_confidence": cut},
                "runs": runs}
        session = dict(session or {})
        session["client_server"] = view
        return outputs_for(view, session, run_note(runs))

    @friendly
    def on_rerun(cut, session, progress=gr.Progress()):
        """MoA again on the shown run's settings with another cut-off; the other methods' runs stay."""
        view = shown(session, example)
        if view is None:
            raise UserError("Press Run first.")
        st = {**DEFAULTS, **view.get("settings", {}), "min_confidence": cut}
        moa = run_methods(runtime, st["prompt"], st["preset"], st["drop_start"], st["drop_length"], OFFLINE_METHOD,
                          st["max_new_tokens"], progress_reporter(progress), cut)
        runs = [r for r in view["runs"] if r["method"] != OFFLINE_METHOD] + moa
        new = {"settings": st, "runs": runs}
        session = dict(session or {})
        session["client_server"] = new
        return outputs_for(new, session, run_note(moa, float(cut)))

    @friendly
    def on_timeline(method, session):
        view = shown(session, example)
        return timeline_for(view["runs"] if view else [], method)

    outputs = [note, summary, offline, tokens_plot, timeline_dd, timeline_plot, texts, ctx.session]
    preset_dd.change(lambda p: PRESETS[p].description if p in PRESETS else "", [preset_dd], [preset_info],
                     api_visibility="private")
    run_btn.click(on_run, [prompt, preset_dd, method_radio, start, length, max_new, confidence, ctx.session],
                  outputs, api_visibility="private")
    rerun_btn.click(on_rerun, [confidence, ctx.session], outputs, api_visibility="private")
    timeline_dd.input(on_timeline, [timeline_dd, ctx.session], [timeline_plot], api_visibility="private")
