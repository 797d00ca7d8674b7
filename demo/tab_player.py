"""Tab: Step by step: replay one generation a verification cycle at a time (Previous / Next / Play).

Each cycle tells the story of speculative decoding once: the drafter proposes a tree, the target scores every
node in one pass, the accepted path lights up, the target adds its bonus token, and the KV cache keeps only the
accepted path. The source is a shipped lesson (assets/lessons/, see demo/lessons.py) or a run of this session.
`player_view(run, step, decode)` builds everything shown, so it is tested without Gradio or a model.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import gradio as gr
import numpy as np

from demo import lessons
from demo.common import AppContext, friendly, last_runs
from demo.render import lsa_heatmap, message_figure, show_token, token_span, tree_figure

TITLE = "Step by step"
EXPLANATION = """\
**What you see.** One generation replayed one *verification cycle* at a time. In each cycle the drafter
proposes a tree of guesses; the target scores every node in **one** forward pass; the longest path it agrees
with is accepted (green), the rest rejected (grey); the target then adds one token of its own (the *bonus*,
orange star); and the KV cache keeps only the accepted path. The table gives the target's verdict on every
node, the text below grows by this cycle's tokens (outlined), and for MoA the heatmap shows which target layers
its Layer Self-Attention read for the tokens this cycle verified. Press **Next** or **Play**.
"""
NO_RUN = "Nothing to replay yet: pick a lesson, or generate something in the Generate tab."
PLAY_EVERY_S = 1.8
LESSON_PREFIX = "lesson:"
RUN_PREFIX = "run:"


def cycles(run: dict | None) -> list[int]:
    """The steps of a run that are verification cycles (the prefill, step 0, is not one)."""
    return [int(e["step"]) for e in (run or {}).get("events") or [] if int(e.get("step", 0)) > 0]


def _event(run: dict, step: int) -> dict | None:
    for e in run.get("events") or []:
        if int(e.get("step", -1)) == int(step):
            return e
    return None


def node_verdicts(event: dict) -> list[dict]:
    """Per drafted node: depth, token, draft and target probabilities and the verdict.

    verdict: "accepted"; "rejected" (the target checked it: its parent was the root or accepted, and the
    target preferred `wanted`); "not reached" (a rejected ancestor: the target's verdict there does not count).
    """
    tree = event.get("tree") or {}
    toks, parents = tree.get("tokens") or [], tree.get("parents") or []
    dprobs = tree.get("draft_probs") or [None] * len(toks)
    tprobs = event.get("node_target_prob") or [None] * len(toks)
    rows = event.get("row_top") or []
    acc = [int(a) for a in event.get("accepted") or []]
    on_path = {-1, *acc}
    depth: list[int] = []
    out = []
    for i, (t, p) in enumerate(zip(toks, parents)):
        depth.append(1 if p < 0 else depth[p] + 1)
        if i in acc:
            verdict = "accepted"
        elif p in on_path:
            verdict = "rejected"
        else:
            verdict = "not reached"
        row = rows[p + 1] if p + 1 < len(rows) else []
        wanted = int(row[0][0]) if row else None
        out.append({"node": i, "parent": int(p), "depth": depth[-1], "token": int(t),
                    "draft_prob": None if dprobs[i] is None else float(dprobs[i]),
                    "target_prob": None if tprobs[i] is None else float(tprobs[i]),
                    "verdict": verdict, "wanted": wanted})
    return out


def _p(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def verdict_html(verdicts: list[dict], decode: Callable[[list[int]], str]) -> str:
    if not verdicts:
        return '<div class="stat-note">The drafter proposed nothing this cycle: one plain target step.</div>'
    order = sorted(verdicts, key=lambda v: ({"accepted": 0, "rejected": 1}.get(v["verdict"], 2), v["depth"],
                                            v["node"]))
    cls = {"accepted": "v-acc", "rejected": "v-rej", "not reached": "v-skip"}
    rows = []
    for v in order:
        what = v["verdict"]
        if what == "rejected" and v["wanted"] is not None:
            what += f": target wanted {html.escape(repr(show_token(decode([v['wanted']]))))}"
        elif what == "not reached":
            what += " (an ancestor was rejected)"
        rows.append(f'<tr class="{cls[v["verdict"]]}"><td>{v["node"]}</td><td>{v["depth"]}</td>'
                    f'<td>{html.escape(show_token(decode([v["token"]])))}</td><td>{_p(v["draft_prob"])}</td>'
                    f'<td>{_p(v["target_prob"])}</td><td>{what}</td></tr>')
    head = ("<tr><th>node</th><th>depth</th><th>token</th><th>draft p</th><th>target p</th>"
            "<th>target's verdict</th></tr>")
    return f'<div class="verdict-wrap"><table class="verdict-table">{head}{"".join(rows)}</table></div>'


def text_so_far_html(run: dict, step: int) -> str:
    """The answer up to this cycle, this cycle's tokens outlined."""
    spans = []
    for info, piece in zip(run.get("tokens") or [], run.get("pieces") or []):
        if info["step"] > step:
            break
        span = token_span(info, piece)
        if info["step"] == step:
            span = span.replace('class="tok ', 'class="tok tok-now ', 1)
        spans.append(span)
    return f'<div class="tok-stream">{"".join(spans)}</div>'


def cycle_lsa(run: dict, step: int) -> tuple[np.ndarray | None, list[int]]:
    """MoA's LSA map (averaged over tokens) of the tokens verified in cycle `step`, and those tokens.

    The drafter reads them when it drafts the next tree, so they are recorded with event `step + 1`.
    """
    nxt = _event(run, step + 1)
    ex = (nxt or {}).get("extras") or {}
    if ex.get("lsa_attention") is None:
        return None, []
    a = np.asarray(ex["lsa_attention"], dtype=np.float64)
    if a.ndim == 4:
        a = a.mean(axis=1)
    if a.ndim == 3:
        a = a.mean(axis=0)
    return a, [int(t) for t in ex.get("lsa_tokens") or []]


def is_moa(run: dict) -> bool:
    return str(run.get("method", "")).startswith("moa")


def player_view(run: dict | None, step: int | None, decode: Callable[[list[int]], str]) -> dict:
    """Everything the player shows for one cycle: story (markdown), tree, verdicts, text so far, LSA map."""
    steps = cycles(run)
    if run is None or not steps:
        msg = NO_RUN if run is None else f"{run.get('label')} has no verification cycles (plain decoding)."
        return {"story": msg, "tree": message_figure(msg), "verdicts": "", "text": "", "lsa": None,
                "step": None, "steps": steps}
    step = int(step) if step is not None and int(step) in steps else steps[0]
    e = _event(run, step)
    prev = _event(run, step - 1)
    root = int(prev["new_tokens"][-1]) if prev and prev.get("new_tokens") else None
    verdicts = node_verdicts(e)
    n = len(verdicts)
    acc = [v for v in verdicts if v["verdict"] == "accepted"]
    acc.sort(key=lambda v: v["depth"])
    done = [x for x in run["events"] if int(x["step"]) <= step]
    made = sum(len(x.get("new_tokens") or []) for x in done)
    got = len(e.get("new_tokens") or [])
    bonus = int(e["bonus"])
    tops = e.get("row_top") or []
    brow = (acc[-1]["node"] + 1) if acc else 0
    bonus_p = next((float(p) for t, p in (tops[brow] if brow < len(tops) else []) if int(t) == bonus), None)

    def q(t: int) -> str:
        return "`" + show_token(decode([int(t)])).replace("`", "'") + "`"

    depth = max((v["depth"] for v in verdicts), default=0)
    lines = [f"**Cycle {steps.index(step) + 1} of {len(steps)}** (target pass {step + 1}; pass 1 read the prompt)",
             f"1. **Draft.** From the root {q(root) if root is not None else 'token'}, the drafter proposed "
             f"{n} token{'s' if n != 1 else ''}" + (f" in a tree {depth} deep." if n else ": nothing."),
             f"2. **Verify.** The target scored all {n + 1} positions (root + tree) in one forward pass.",
             "3. **Accept.** " + (f"Path {' '.join(q(v['token']) for v in acc)}: {len(acc)} of {n} accepted."
                                  if acc else f"No drafted token matched: 0 of {n} accepted."),
             f"4. **Bonus.** The target added its own next token {q(bonus)}"
             + (f" (p {bonus_p:.3f})." if bonus_p is not None else "."),
             f"5. **KV cache.** Kept the root and {len(acc)} accepted row{'s' if len(acc) != 1 else ''}; dropped "
             f"{n - len(acc)} rejected row{'s' if n - len(acc) != 1 else ''}.",
             f"**This cycle: {got} token{'s' if got != 1 else ''} for one pass. Running tau: {made} tokens / "
             f"{len(done)} passes = {made / len(done):.2f}.**"]
    if got < len(acc) + 1:
        lines.append("(The answer ended inside this cycle: end of turn or the token budget.)")
    lsa = None
    if is_moa(run):
        mat, toks = cycle_lsa(run, step)
        if mat is not None:
            shown = " ".join(show_token(decode([t])) for t in toks[:8]) + (" ..." if len(toks) > 8 else "")
            lsa = lsa_heatmap(mat, f"LSA map of the {len(toks)} tokens verified this cycle: {shown}"[:90])
            lsa.update_layout(height=380)
        else:
            lsa = message_figure("Last cycle: the drafter read no more verified tokens after it.")
    return {"story": "\n".join(lines), "tree": tree_figure(e, decode, root), "verdicts": verdict_html(verdicts, decode),
            "text": text_so_far_html(run, step), "lsa": lsa, "step": step, "steps": steps}


def source_choices(session: dict | None, shipped: list[dict]) -> list[tuple[str, str]]:
    out = [(f"Lesson: {r.get('title')} ({r.get('method')})", f"{LESSON_PREFIX}{i}") for i, r in enumerate(shipped)]
    for i, r in enumerate(last_runs(session)):
        if r.get("example") or not cycles(r):
            continue
        out.append((f"Your run: {r.get('label')} ({len(r.get('token_ids') or [])} tokens)", f"{RUN_PREFIX}{i}"))
    return out


def pick(session: dict | None, shipped: list[dict], key: str | None) -> dict | None:
    if not key:
        return None
    kind, _, idx = str(key).partition(":")
    pool = shipped if kind + ":" == LESSON_PREFIX else last_runs(session)
    try:
        return pool[int(idx)]
    except (ValueError, IndexError):
        return None


def build(ctx: AppContext) -> None:
    runtime = ctx.runtime
    shipped = lessons.load_lessons()
    gr.Markdown(EXPLANATION)
    first = shipped[0] if shipped else None
    view = player_view(first, None, lessons.decoder(first)) if first else player_view(None, None, str)
    steps = view["steps"] or [1]
    with gr.Row():
        source = gr.Dropdown(source_choices(None, shipped), value=f"{LESSON_PREFIX}0" if shipped else None,
                             label="Generation to replay", elem_id="player-source", scale=3)
        step = gr.Slider(1, max(steps[-1], 2), value=view["step"] or 1, step=1, label="Target pass (cycle)",
                         elem_id="player-step", scale=2)
    with gr.Row():
        prev_b = gr.Button("◀ Previous", elem_id="player-prev", size="sm")
        play_b = gr.Button("▶ Play", elem_id="player-play", size="sm", variant="primary")
        next_b = gr.Button("Next ▶", elem_id="player-next", size="sm")
    timer = gr.Timer(PLAY_EVERY_S, active=False)
    playing = gr.State(False)
    with gr.Row():
        with gr.Column(scale=2, min_width=300):
            story = gr.Markdown(view["story"], elem_id="player-story")
            text = gr.HTML(view["text"], elem_id="player-text")
        with gr.Column(scale=3, min_width=300):
            tree = gr.Plot(view["tree"], show_label=False, elem_id="player-tree")
    with gr.Row():
        with gr.Column(scale=3, min_width=300):
            verdicts = gr.HTML(view["verdicts"], elem_id="player-verdicts")
        with gr.Column(scale=2, min_width=300):
            lsa = gr.Plot(view["lsa"] or message_figure(""), show_label=False, elem_id="player-lsa",
                          visible=view["lsa"] is not None)

    def decode_for(run):
        return lessons.decoder(run, runtime.decode if runtime.loaded else None)

    def show(run, s):
        v = player_view(run, s, decode_for(run) if run else str)
        return (v["story"], v["tree"], v["verdicts"], v["text"],
                gr.update(value=v["lsa"], visible=v["lsa"] is not None), v)

    @friendly
    def on_source(session, key):
        run = pick(session, shipped, key)
        *out, v = show(run, None)
        st = v["steps"] or [1]
        return (gr.update(minimum=1, maximum=max(st[-1], 2), value=v["step"] or 1), *out)

    @friendly
    def on_step(session, key, s):
        *out, _ = show(pick(session, shipped, key), s)
        return tuple(out)

    def move(session, key, s, delta):
        run = pick(session, shipped, key)
        st = cycles(run)
        if not st:
            return gr.update(), *on_step(session, key, s)
        cur = int(s) if s is not None else st[0]
        nxt = min(st[-1], max(st[0], cur + delta))
        *out, _ = show(run, nxt)
        return (nxt, *out)

    outs = [story, tree, verdicts, text, lsa]

    @friendly
    def on_prev(session, key, s):
        return move(session, key, s, -1)

    @friendly
    def on_next(session, key, s):
        return move(session, key, s, +1)

    @friendly
    def on_play(session, key, s, is_playing):
        if is_playing:
            return False, gr.Timer(active=False), gr.update(value="▶ Play"), gr.update()
        st = cycles(pick(session, shipped, key))
        restart = st and s is not None and int(s) >= st[-1]
        return True, gr.Timer(active=True), gr.update(value="⏸ Pause"), (st[0] if restart else gr.update())

    @friendly
    def on_tick(session, key, s):
        st = cycles(pick(session, shipped, key))
        if not st or s is None or int(s) >= st[-1]:
            return False, gr.Timer(active=False), gr.update(value="▶ Play"), gr.update(), *[gr.update()] * 5
        return True, gr.update(), gr.update(), *move(session, key, s, +1)

    @friendly
    def on_open(session, key):
        return gr.update(choices=source_choices(session, shipped), value=key)

    source.input(on_source, [ctx.session, source], [step, *outs], api_visibility="private")
    step.release(on_step, [ctx.session, source, step], outs, api_visibility="private")
    prev_b.click(on_prev, [ctx.session, source, step], [step, *outs], api_visibility="private")
    next_b.click(on_next, [ctx.session, source, step], [step, *outs], api_visibility="private")
    play_b.click(on_play, [ctx.session, source, step, playing], [playing, timer, play_b, step],
                 api_visibility="private")
    timer.tick(on_tick, [ctx.session, source, step], [playing, timer, play_b, step, *outs],
               api_visibility="private")
    if ctx.tab is not None:
        ctx.tab.select(on_open, [ctx.session, source], [source], api_visibility="private")
