"""Pure rendering for the app: coloured token HTML, statistics, draft-tree and LSA figures.

Everything here takes plain data (the JSON form of `core.decoding.StepEvent`,
i.e. `StepEvent.to_dict()`) and returns HTML strings, dicts or plotly figures,
so it can be tested on hand-made traces without Gradio or a model.

Vocabulary used below: an event is one target forward pass. Its `new_tokens`
are the accepted draft tokens (node indices in `accepted`, depth 1, 2, ...)
followed by the target's own token (the "bonus" or correction token). Step 0
is the prefill, whose only token is the target's own.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go

from core.cost_curve import GPU_COST_MODEL, gpu_ideal_speedup, ideal_speedup, monotone, pass_ms, verify_cost

MAX_DEPTH_CLASS = 8  # depth classes d1..d8; deeper drafts share d8

# Greens darken with draft depth; the target's own tokens are peach. Text stays readable in dark mode.
DEPTH_COLOURS = ["#cdeedb", "#b3e5c6", "#9edcb6", "#7acb9b", "#56b981", "#3a9d68", "#2a7f53", "#1d6141"]
BONUS_COLOUR = "#fdd9b5"
ACCEPTED_GREEN = "#2a9d5c"
REJECTED_GREY = "#b8bcc4"
BONUS_ORANGE = "#f08a24"
ROOT_BLUE = "#3b5bdb"

CSS = "\n".join(
    [
        ".tok-stream { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 14px;"
        " line-height: 1.9; white-space: pre-wrap; word-break: break-word; padding: 8px;"
        " border: 1px solid #d0d4da; border-radius: 8px; min-height: 48px; background: #ffffff; color: #111; }",
        ".tok { border-radius: 3px; padding: 1px 0; margin-right: 1px; color: #111; cursor: help; }",
        f".tok-bonus {{ background: {BONUS_COLOUR}; box-shadow: inset 0 -2px 0 {BONUS_ORANGE}; }}",
        ".tok-special { font-size: 11px; opacity: 0.75; }",
        *[f".tok-draft.d{i + 1} {{ background: {c};{' color: #fff;' if i >= 5 else ''} }}"
          for i, c in enumerate(DEPTH_COLOURS)],
        ".tok-legend { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; font-size: 12px;"
        " margin: 4px 0 6px 0; color: inherit; }",
        ".tok-legend .tok { padding: 1px 6px; }",
        ".stat-cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(110px, 1fr)); gap: 6px; }",
        ".stat-card { border: 1px solid #d0d4da; border-radius: 8px; padding: 6px 8px; background: #f7f8fa;"
        " color: #111; }",
        ".stat-card .v { font-size: 20px; font-weight: 600; }",
        ".stat-card .k { font-size: 11px; opacity: 0.8; }",
        ".stat-note { font-size: 12px; margin-top: 4px; }",
        ".cmp-grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap: 10px; }",
        ".cmp-col h4 { margin: 4px 0; }",
        ".cmp-ok { color: #1d7a46; font-weight: 600; }",
        ".cmp-diff { color: #b54708; font-weight: 600; }",
        ".untrained-note { background: #fff4e5; color: #7a4100; border: 1px solid #f5c27a; border-radius: 6px;"
        " padding: 4px 8px; font-size: 13px; }",
        ".tok-now { outline: 2px solid #f08a24; outline-offset: 0; }",
        ".cmp-why { border-left: 3px solid #b54708; padding: 4px 8px; margin: 6px 0; font-size: 13px; }",
        ".load-status { font-size: 13px; padding: 4px 8px; border-radius: 6px; background: #eef2ff; color: #1e2a5a; }",
        ".load-status.ready { background: #e6f6ec; color: #14532d; }",
        ".load-status.failed { background: #fdecea; color: #7a1c1c; }",
        ".example-note { font-size: 13px; opacity: 0.85; margin: 2px 0 4px 0; }",
        ".verdict-table { border-collapse: collapse; font-size: 12px; width: 100%; }",
        ".verdict-table td, .verdict-table th { border-bottom: 1px solid #e3e6ea; padding: 2px 6px;"
        " text-align: left; }",
        ".verdict-wrap { max-height: 300px; overflow: auto; }",
        ".v-acc { color: #1d7a46; font-weight: 600; } .v-rej { color: #9a3412; } .v-skip { opacity: 0.6; }",
        ".bench-table { overflow-x: auto; } .bench-table table { font-size: 12px; margin: 0; }",
        ".bench-table td, .bench-table th { padding: 3px 6px !important; }",
        # phones: no horizontal page scroll; plots, tables and rows shrink to the screen. (Gradio scopes these
        # rules under the app's root element, so they name inner classes only.)
        ".js-plotly-plot, .plot-container, .svg-container { max-width: 100% !important; }",
        "@media (max-width: 640px) {"
        " .row, .form { flex-wrap: wrap !important; }"
        " .row > *, .row > .form > * { min-width: 100% !important; flex: 1 1 100% !important; }"
        " .stat-cards { grid-template-columns: repeat(auto-fill, minmax(92px, 1fr)); }"
        " .stat-card .v { font-size: 16px; }"
        " .cmp-grid { grid-template-columns: 1fr; }"
        " .prose table, .bench-table table { display: block; overflow-x: auto; }"
        " }",
    ]
)


# ----- tokens ---------------------------------------------------------------------------------------

def token_pieces(ids: Sequence[int], decode: Callable[[list[int]], str], start: int = 0,
                 window: int = 8) -> list[str]:
    """Text of each token ids[start:], decoded in context.

    Tokenizers merge bytes and spaces across tokens, so a token's text is the
    difference between decoding a few tokens with and without it.
    """
    ids = [int(i) for i in ids]
    pieces = []
    for i in range(start, len(ids)):
        lo = max(0, i - window)
        before = decode(ids[lo:i]) if i > lo else ""
        after = decode(ids[lo:i + 1])
        pieces.append(after[len(before):] if after.startswith(before) else after)
    return pieces


def _prob_of(row_top: list | None, row: int, token: int) -> float | None:
    if not row_top or row >= len(row_top):
        return None
    for tok, p in row_top[row]:
        if int(tok) == int(token):
            return float(p)
    return None


def event_tokens(event: dict) -> list[dict]:
    """How each token of one event came to be: draft (with depth) or the target's own."""
    tree = event.get("tree") or {}
    probs = tree.get("draft_probs") or []
    node_tp = event.get("node_target_prob")
    row_top = event.get("row_top")
    accepted = list(event.get("accepted") or [])
    out = []
    for i, tok in enumerate(event.get("new_tokens") or []):
        info = {"token": int(tok), "step": int(event.get("step", 0))}
        if i < len(accepted):
            node = accepted[i]
            info.update(kind="draft", depth=i + 1, node=node,
                        draft_prob=float(probs[node]) if node < len(probs) else None,
                        target_prob=float(node_tp[node]) if node_tp and node < len(node_tp) else None)
        else:
            row = accepted[-1] + 1 if accepted else 0  # the row that predicted the bonus token
            info.update(kind="bonus", depth=0, node=None, draft_prob=None,
                        target_prob=_prob_of(row_top, row, tok))
        out.append(info)
    return out


def tokens_from_events(events: Sequence[dict]) -> list[dict]:
    return [t for ev in events for t in event_tokens(ev)]


def _fmt_p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.3f}"


def token_title(info: dict) -> str:
    if info["kind"] == "draft":
        return (f"step {info['step']} · accepted draft, depth {info['depth']} · "
                f"draft p {_fmt_p(info.get('draft_prob'))} · target p {_fmt_p(info.get('target_prob'))}")
    what = "first token (prefill)" if info["step"] == 0 else "target's own token (bonus/correction)"
    return f"step {info['step']} · {what} · target p {_fmt_p(info.get('target_prob'))}"


def token_span(info: dict, text: str) -> str:
    if info["kind"] == "draft":
        cls = f"tok tok-draft d{min(info['depth'], MAX_DEPTH_CLASS)}"
    else:
        cls = "tok tok-bonus"
    shown = text
    if text == "":
        cls += " tok-special"
        shown = "[end]"
    return (f'<span class="{cls}" data-step="{info["step"]}" data-depth="{info["depth"]}" '
            f'title="{html.escape(token_title(info), quote=True)}">{html.escape(shown)}</span>')


def tokens_html(infos: Sequence[dict], pieces: Sequence[str], empty: str = "") -> str:
    """The coloured token stream. `pieces` holds each token's text (same length as `infos`)."""
    spans = "".join(token_span(i, p) for i, p in zip(infos, pieces))
    if not spans and empty:
        spans = f'<span style="opacity:0.6">{html.escape(empty)}</span>'
    return f'<div class="tok-stream">{spans}</div>'


def legend_html(max_depth: int = MAX_DEPTH_CLASS) -> str:
    items = ['<span class="tok tok-bonus" title="a token the target produced itself">target\'s own token</span>']
    for d in range(1, max_depth + 1):
        label = f"draft d{d}" + ("+" if d == MAX_DEPTH_CLASS else "")
        items.append(f'<span class="tok tok-draft d{d}" title="accepted draft token at depth {d}">{label}</span>')
    return ('<div class="tok-legend"><b>Legend:</b>' + "".join(items)
            + '<span style="opacity:0.75">(hover a token for its step, depth and probabilities)</span></div>')


# ----- statistics -----------------------------------------------------------------------------------

def generation_stats(events: Sequence[dict], wall_time: float, plain_tps: float | None = None,
                     curve: dict | None = None) -> dict:
    """tau, tokens/s, speedup and timing split for a (possibly partial) generation (docs/ARCHITECTURE.md, "Metrics").

    With this machine's cost curve (core.cost_curve) it adds the ideal speedup for the measured tau and
    tree size; `gpu_ideal_speedup` is the same tau under the GPU cost model (verify pass = 1-token pass).
    """
    new = sum(len(e.get("new_tokens") or []) for e in events)
    steps = len(events)
    tps = new / wall_time if wall_time > 0 else 0.0
    drafted = [len((e.get("tree") or {}).get("tokens") or []) for e in events if e.get("step", 0) > 0]
    tau = new / steps if steps else 0.0
    mean_drafted = float(np.mean(drafted)) if drafted else 0.0
    return {
        "new_tokens": new,
        "steps": steps,
        "tau": tau,
        "tokens_per_s": tps,
        "wall_time": wall_time,
        "draft_time": sum(float(e.get("draft_time", 0.0)) for e in events),
        "verify_time": sum(float(e.get("verify_time", 0.0)) for e in events),
        "mean_drafted": mean_drafted,
        "speedup": tps / plain_tps if plain_tps and tps > 0 else None,
        "plain_tps": plain_tps,
        "ideal_speedup": ideal_speedup(tau, curve, mean_drafted) if curve and steps else None,
        "verify_cost": verify_cost(curve, mean_drafted) if curve and steps else None,
        "gpu_ideal_speedup": gpu_ideal_speedup(tau) if steps else None,
    }


CURVE_LINK = '<a href="#cost-curve" class="curve-link">this machine\'s cost curve</a>'


def speed_context(stats: dict, link: bool = True) -> str:
    """One sentence beside a speedup: the ideal speedup for this tau here, and on a GPU (named cost model)."""
    tau, ideal, cost = stats.get("tau") or 0.0, stats.get("ideal_speedup"), stats.get("verify_cost")
    if not stats.get("steps"):
        return ""
    where = CURVE_LINK if link else "this machine's cost curve"
    if ideal is None:
        here = f"ideal speedup here: not measured yet ({where} is measured after the target loads)"
    else:
        here = (f"ideal speedup for tau {tau:.2f} here: {ideal:.2f}x (a verify pass of "
                f"{1 + stats.get('mean_drafted', 0.0):.0f} tokens costs {cost:.2f} one-token passes on {where})")
    gpu = stats.get("gpu_ideal_speedup")
    return here + (f"; the same tau would give up to {gpu:.2f}x on a GPU, assuming {GPU_COST_MODEL}"
                   if gpu is not None else "")


def stats_html(stats: dict, plain_source: str = "", running: bool = False) -> str:
    sp = stats.get("speedup")
    ideal = stats.get("ideal_speedup")
    cards = [
        ("tau (tokens / target pass)", f"{stats['tau']:.2f}"),
        ("tokens/s", f"{stats['tokens_per_s']:.1f}"),
        ("speedup vs plain", "n/a" if sp is None else f"{sp:.2f}x"),
        ("ideal speedup at this tau", "n/a" if ideal is None else f"{ideal:.2f}x"),
        ("new tokens", str(stats["new_tokens"])),
        ("target passes", str(stats["steps"])),
        ("drafted / pass", f"{stats['mean_drafted']:.1f}"),
        ("draft time", f"{stats['draft_time']:.2f} s"),
        ("verify time", f"{stats['verify_time']:.2f} s"),
    ]
    body = "".join(f'<div class="stat-card"><div class="v">{v}</div><div class="k">{k}</div></div>'
                   for k, v in cards)
    note = ""
    if stats.get("plain_tps"):
        note = f"plain decoding: {stats['plain_tps']:.1f} tokens/s"
        if plain_source:
            note += f" ({html.escape(plain_source)})"
    elif sp is None:
        note = "speedup: no plain-decoding speed measured yet"
    if running:
        note = "generating... " + note
    context = speed_context(stats)
    if context:
        note += f'<div class="speed-context">{context}</div>'
    return f'<div class="stat-cards">{body}</div><div class="stat-note">{note}</div>'


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, None if identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def lossless_note(plain_ids: Sequence[int], ids: Sequence[int], greedy: bool) -> tuple[bool, str]:
    diff = first_difference(plain_ids, ids)
    if diff is None:
        return True, "✓ identical to plain decoding (lossless)"
    if greedy:
        return False, (f"≠ differs from plain decoding from token {diff}: in bfloat16 a multi-token pass can flip "
                       "the target's argmax on a near tie (float32 matches exactly)")
    return False, (f"≠ differs from plain decoding from token {diff}: at temperature > 0 each run is a random draw "
                   "from the same distribution, so outputs differ by design")


def token_row(events: Sequence[dict], index: int) -> tuple[dict, int] | None:
    """(event, row) that produced output token `index`: row 0 is the root, row k + 1 is tree node k.

    The j-th token of an event was predicted at the row of the (j - 1)-th accepted node (the root for j = 0).
    """
    k = 0
    for e in events:
        n = len(e.get("new_tokens") or [])
        if index < k + n:
            j = index - k
            acc = list(e.get("accepted") or [])
            return e, (0 if j == 0 else int(acc[j - 1]) + 1)
        k += n
    return None


def top2_at(run: dict, index: int) -> list[tuple[int, float]]:
    """The target's two most likely tokens (id, probability) where the run wrote output token `index`."""
    found = token_row(run.get("events") or [], index)
    if found is None:
        return []
    e, row = found
    rows = e.get("row_top") or []
    if row >= len(rows):
        return []
    return [(int(t), float(p)) for t, p in rows[row][:2]]


NEAR_TIE = 0.05  # a probability gap below this between the top two tokens counts as a near tie


def divergence_html(plain: dict, run: dict, decode: Callable[[list[int]], str]) -> str:
    """Why two greedy runs' texts differ: the first divergent token and the target's top-2 there, in both runs."""
    a, b = plain.get("token_ids") or [], run.get("token_ids") or []
    i = first_difference(a, b)
    if i is None:
        return ""
    if i >= len(a) or i >= len(b):
        return (f"The texts agree for {i} tokens; one run stopped there (end of turn or budget) and the other "
                "went on.")

    def tok(t: int) -> str:
        return html.escape(repr(decode([int(t)])), quote=False)

    def top2(r: dict) -> tuple[str, float | None]:
        top = top2_at(r, i)
        if not top:
            return "not recorded", None
        text = ", ".join(f"{tok(t)} {p:.4f}" for t, p in top)
        return text, (top[0][1] - top[1][1]) if len(top) > 1 else None

    pa, ga = top2(plain)
    pb, gb = top2(run)
    head = (f"<b>First difference at token {i}</b>: plain decoding wrote {tok(a[i])}, {html.escape(run['label'])} "
            f"wrote {tok(b[i])}. The target's top-2 there: plain run {pa}; this run {pb}.")
    if not run.get("greedy", True):
        return head + " At temperature &gt; 0 each run is a random draw from the same distribution."
    gaps = [g for g in (ga, gb) if g is not None]
    if (run.get("dtype") or plain.get("dtype")) == "float32":
        return head + (" Both runs are float32, where greedy speculative decoding matches plain decoding token "
                       "for token: this is unexpected, please report it with the downloaded traces.")
    if gaps and max(gaps) < NEAR_TIE:
        apart = (f"{ga:.4f} apart in the plain run and {gb:.4f} in this one" if len(gaps) == 2 else
                 f"only {gaps[0]:.4f} apart")
        verdict = (f" The two candidates are {apart}: a bfloat16 near tie. The verify pass "
                   "scores several tokens at once, which rounds differently from a one-token pass, and that is "
                   "enough to flip the argmax. Not a bug: both texts are the target's greedy choice within "
                   "rounding. Tick <i>exact (float32)</i> to see identical texts.")
    else:
        verdict = (" In bfloat16 a multi-token verify pass rounds differently from a one-token pass; tick "
                   "<i>exact (float32)</i>, where the texts must be identical.")
    return head + verdict


def compare_html(columns: Sequence[dict]) -> str:
    """Side-by-side runs. Each column: title, html (tokens), stats (dict), note, ok (bool | None)."""
    cells = []
    for col in columns:
        ok = col.get("ok")
        cls = "cmp-ok" if ok else "cmp-diff"
        note = f'<div class="{cls}">{html.escape(col["note"])}</div>' if col.get("note") else ""
        st = col.get("stats")
        stat_line = ""
        if st:
            sp = st.get("speedup")
            ideal = st.get("ideal_speedup")
            stat_line = (f"<div>tau {st['tau']:.2f} · {st['tokens_per_s']:.1f} tokens/s"
                         + ("" if sp is None else f" · speedup {sp:.2f}x")
                         + ("" if ideal is None or not st.get("mean_drafted") else
                            f" (ideal {ideal:.2f}x at this tau on {CURVE_LINK})") + "</div>")
        why = f'<div class="cmp-why">{col["why"]}</div>' if col.get("why") else ""
        cells.append(f'<div class="cmp-col"><h4>{html.escape(col["title"])}</h4>{stat_line}{note}{why}'
                     f'{col.get("html", "")}</div>')
    return f'<div class="cmp-grid">{"".join(cells)}</div>'


# ----- draft tree -----------------------------------------------------------------------------------

def show_token(text: str) -> str:
    """A token's text made visible in a figure label."""
    if text == "":
        return "∅"
    t = text.replace("\n", "↵").replace("\t", "⇥")
    return t if t.strip() else t.replace(" ", "␣")


def tree_layout(parents: Sequence[int]) -> tuple[list[int], list[float]]:
    """x = depth, y = vertical slot, for nodes [root, 0, 1, ...]: leaves in depth-first order, parents centred."""
    n = len(parents)
    kids: list[list[int]] = [[] for _ in range(n + 1)]  # index 0 = root, node i -> i + 1
    for i, p in enumerate(parents):
        kids[int(p) + 1].append(i + 1)
    x = [0] * (n + 1)
    y = [0.0] * (n + 1)
    counter = [0]

    def place(v: int, depth: int) -> None:  # iterative would be longer; trees are at most ~100 deep
        x[v] = depth
        if not kids[v]:
            y[v] = float(counter[0])
            counter[0] += 1
            return
        for c in kids[v]:
            place(c, depth + 1)
        y[v] = (y[kids[v][0]] + y[kids[v][-1]]) / 2

    place(0, 0)
    return x, y


def tree_figure(event: dict, decode: Callable[[list[int]], str] | None = None,
                root_token: int | None = None) -> go.Figure:
    """Every drafted node of one step: accepted path green, rejected grey, the target's bonus token orange."""
    tree = event.get("tree") or {}
    tokens = [int(t) for t in tree.get("tokens") or []]
    parents = [int(p) for p in tree.get("parents") or []]
    dprobs = tree.get("draft_probs") or [None] * len(tokens)
    tprobs = event.get("node_target_prob") or [None] * len(tokens)
    accepted = list(event.get("accepted") or [])
    acc_set = set(accepted)
    bonus = event.get("bonus")
    dec = decode or (lambda ids: " ".join(str(i) for i in ids))
    x, y = tree_layout(parents)
    n = len(tokens)

    def label(tok: int) -> str:
        return show_token(dec([tok]))

    fig = go.Figure()
    # edges: grey first so the accepted path draws on top
    for accepted_edges in (False, True):
        ex, ey = [], []
        for i, p in enumerate(parents):
            if (i in acc_set) == accepted_edges:
                ex += [x[p + 1], x[i + 1], None]
                ey += [y[p + 1], y[i + 1], None]
        if ex:
            fig.add_trace(go.Scatter(
                x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
                line={"color": ACCEPTED_GREEN if accepted_edges else REJECTED_GREY,
                      "width": 3.5 if accepted_edges else 1}))
    # bonus token: below everything, hanging off the last accepted node (or the root)
    b_parent = accepted[-1] + 1 if accepted else 0
    b_x, b_y = x[b_parent] + 1, (min(y) - 1.2) if n else 0.0
    if bonus is not None:
        fig.add_trace(go.Scatter(x=[x[b_parent], b_x], y=[y[b_parent], b_y], mode="lines", hoverinfo="skip",
                                 showlegend=False, line={"color": BONUS_ORANGE, "width": 2, "dash": "dot"}))

    groups = {
        "rejected draft": ([i for i in range(n) if i not in acc_set], REJECTED_GREY, "circle", 10),
        "accepted draft": (accepted, ACCEPTED_GREEN, "circle", 14),
    }
    for name, (nodes, colour, symbol, size) in groups.items():
        if not nodes:
            continue
        hover = [f"node {i} · depth {x[i + 1]}<br>token {label(tokens[i])!r}<br>draft p {_fmt_p(_f(dprobs[i]))}"
                 f"<br>target p {_fmt_p(_f(tprobs[i]))}<br>{name}" for i in nodes]
        text = [f"{label(tokens[i])} {_short_p(dprobs[i])}" for i in nodes]
        fig.add_trace(go.Scatter(
            x=[x[i + 1] for i in nodes], y=[y[i + 1] for i in nodes], mode="markers+text", name=name,
            marker={"color": colour, "size": size, "symbol": symbol, "line": {"width": 1, "color": "#555"}},
            text=text, textposition="top center", textfont={"size": 10, "color": "#888" if name.startswith("rej")
                                                              else "#111"},
            hovertext=hover, hoverinfo="text"))
    root_label = label(root_token) if root_token is not None else "root"
    fig.add_trace(go.Scatter(x=[0], y=[y[0]], mode="markers+text", name="root (last verified token)",
                             marker={"color": ROOT_BLUE, "size": 16, "symbol": "square"},
                             text=[root_label], textposition="middle left", hovertext=["root: the token the "
                             "target produced last step"], hoverinfo="text"))
    if bonus is not None:
        b_text = label(int(bonus))
        b_p = _prob_of(event.get("row_top"), b_parent, int(bonus))
        fig.add_trace(go.Scatter(x=[b_x], y=[b_y], mode="markers+text", name="target's bonus token",
                                 marker={"color": BONUS_ORANGE, "size": 18, "symbol": "star",
                                         "line": {"width": 1, "color": "#7a4100"}},
                                 text=[b_text], textposition="middle right",
                                 hovertext=[f"bonus {b_text!r}: the target's own token<br>target p {_fmt_p(b_p)}"],
                                 hoverinfo="text"))
    n_leaves = max(1, sum(1 for i in range(n) if i not in set(parents)))
    title = (f"Step {event.get('step', '?')}: {len(accepted)} of {n} drafted tokens accepted, "
             f"+1 target token")
    fig.update_layout(
        title=title, height=max(360, min(1600, 30 * n_leaves + 140)), margin={"l": 30, "r": 30, "t": 50, "b": 80},
        xaxis={"title": "draft depth", "dtick": 1, "zeroline": False, "range": [-0.5, max(x + [b_x]) + 0.9]},
        yaxis={"visible": False}, plot_bgcolor="white",
        legend={"orientation": "h", "y": 0.01, "yanchor": "bottom", "yref": "container"},
        hoverlabel={"align": "left"})
    return fig


def _f(v) -> float | None:
    return None if v is None else float(v)


def _short_p(v) -> str:
    return "" if v is None else f"{float(v):.2f}"


def default_step(events: Sequence[dict]) -> int | None:
    """The step with the longest accepted path (ties: the earliest); None if no step drafted anything."""
    best, best_len = None, -1
    for e in events:
        n = len((e.get("tree") or {}).get("tokens") or [])
        if n and len(e.get("accepted") or []) > best_len:
            best, best_len = int(e["step"]), len(e.get("accepted") or [])
    return best


def step_choices(events: Sequence[dict]) -> list[tuple[str, int]]:
    out = []
    for e in events:
        n = len((e.get("tree") or {}).get("tokens") or [])
        if e.get("step", 0) == 0:
            continue
        out.append((f"step {e['step']}: {len(e.get('accepted') or [])}/{n} accepted", int(e["step"])))
    return out


# ----- MoA layer self-attention ---------------------------------------------------------------------

def lsa_matrices(events: Sequence[dict]) -> tuple[np.ndarray | None, list[dict]]:
    """All LSA attention maps of a run stacked: ([n_tokens, L, L], one {step, token} per map)."""
    mats, meta = [], []
    for e in events:
        ex = e.get("extras") or {}
        att = ex.get("lsa_attention")
        if att is None:
            continue
        a = np.asarray(att, dtype=np.float64)
        if a.ndim == 2:
            a = a[None]
        if a.ndim == 4:  # [n, heads, L, L]: average the heads
            a = a.mean(axis=1)
        if a.ndim != 3 or a.shape[1] != a.shape[2]:
            continue
        toks = list(ex.get("lsa_tokens") or [None] * a.shape[0])
        for j in range(a.shape[0]):
            mats.append(a[j])
            meta.append({"step": int(e.get("step", 0)), "token": toks[j] if j < len(toks) else None})
    if not mats:
        return None, []
    return np.stack(mats), meta


def lsa_received(matrix: np.ndarray) -> np.ndarray:
    """Attention each key layer receives, averaged over query layers (rows sum to 1)."""
    return np.asarray(matrix).mean(axis=0)


def lsa_heatmap(matrix: np.ndarray, title: str) -> go.Figure:
    m = np.asarray(matrix)
    n = m.shape[0]
    # an absolute scale from 0: a near-uniform map looks uniform instead of exaggerating tiny differences
    fig = go.Figure(go.Heatmap(
        z=m, x=list(range(n)), y=list(range(n)), colorscale="Viridis", colorbar={"title": "weight"},
        zmin=0.0, zmax=float(max(m.max(), 2.0 / max(1, n))),
        hovertemplate="query layer %{y}<br>key layer %{x}<br>weight %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, height=460, margin={"l": 50, "r": 20, "t": 50, "b": 50},
                      xaxis={"title": "key: target layer attended to", "dtick": 5},
                      yaxis={"title": "query: target layer", "autorange": "reversed", "dtick": 5})
    return fig


def lsa_bar(received: np.ndarray, title: str = "Attention received per target layer") -> go.Figure:
    r = np.asarray(received)
    fig = go.Figure(go.Bar(x=list(range(len(r))), y=r, marker_color=ROOT_BLUE,
                           hovertemplate="layer %{x}<br>mean weight %{y:.3f}<extra></extra>"))
    fig.add_hline(y=1.0 / max(1, len(r)), line_dash="dot", line_color="#888",
                  annotation_text="uniform", annotation_position="top right")
    fig.update_layout(title=title, height=320, margin={"l": 50, "r": 20, "t": 50, "b": 50},
                      xaxis={"title": "target layer", "dtick": 5}, yaxis={"title": "mean attention weight"})
    return fig


# ----- cost curve ---------------------------------------------------------------------------------------

def cost_curve_figure(curve: dict | None, tree_size: float | None = None) -> go.Figure:
    """Verify-pass time against tokens in the pass (this machine), with the GPU cost model's flat line."""
    if not curve:
        return message_figure("The cost curve is measured once the target has loaded.")
    xs, ys = list(curve["sizes"]), list(curve["ms"])
    t1 = ys[0] if xs[0] == 1 else None
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines+markers", name="this machine",
                               hovertemplate="%{x} tokens: %{y:.1f} ms<extra></extra>", line={"color": ROOT_BLUE}))
    if t1 is not None:
        fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[t1, t1], mode="lines", name="GPU cost model (flat)",
                                 line={"dash": "dot", "color": "#888"}, hoverinfo="skip"))
    if tree_size:  # shapes on a log axis take log10 coordinates
        fig.add_vline(x=float(np.log10(1 + tree_size)), line_dash="dash", line_color=BONUS_ORANGE,
                      annotation_text=f"your verify pass ({1 + tree_size:.0f} tokens)")
    title = ("A fixed cost model (no timing: tiny test target or SPECLENS_COST_MODEL=fixed)" if curve.get("fixed")
             else f"One target pass over a {curve.get('context')}-token cache "
                  f"({curve.get('dtype')}, {curve.get('cpu', '')[:40]})")
    fig.update_layout(title=title,
                      xaxis={"title": "tokens in the pass", "type": "log", "tickvals": xs},
                      yaxis={"title": "ms", "rangemode": "tozero"}, height=340,
                      margin={"l": 50, "r": 20, "t": 50, "b": 50}, legend={"orientation": "h", "y": -0.25})
    return fig


def tree_choice_figure(here: dict | None, gpu: dict | None = None, first: dict | None = None) -> go.Figure:
    """Expected speedup over plain decoding of every tree shape on this machine (core.cost_curve.choose_tree's
    grid: a depth x nodes heatmap for dynamic trees, a line for a static tree), with the shape `auto` picks here
    and the one it would pick under the GPU cost model. When `here` is calibrated from decoded cycles, `first`
    is the model's choice before calibration, marked too."""
    if not here or not here.get("grid"):
        return message_figure("No measured acceptance for this method: its checkpoint's tree is kept.")
    one = pass_ms(monotone(here["curve"]), 1.0)
    speed = {(r["depth"], r["total_tokens"]): r["tokens_per_s"] * one / 1000.0 for r in here["grid"]}
    depths = sorted({d for d, _ in speed})
    nodes = sorted({n for _, n in speed})
    cal = here.get("calibration")
    marks = [(here, "auto here, calibrated" if cal else "auto here", BONUS_ORANGE, "star")]
    if first and first.get("depth") and cal:
        marks.append((first, "auto's first guess (the model alone)", "#888", "x"))
    if gpu and gpu.get("depth"):
        marks.append((gpu, "auto under the GPU cost model", "#444", "circle-open"))
    if len(depths) > 1:
        z = [[speed.get((d, n)) for n in nodes] for d in depths]
        fig = go.Figure(go.Heatmap(x=nodes, y=depths, z=z, colorscale="Blues", colorbar={"title": "speedup"},
                                   hovertemplate="depth %{y}, %{x} nodes: %{z:.2f}x<extra></extra>"))
        for choice, name, color, symbol in marks:
            fig.add_trace(go.Scatter(x=[choice["total_tokens"]], y=[choice["depth"]], mode="markers", name=name,
                                     marker={"symbol": symbol, "size": 16, "color": color,
                                             "line": {"width": 2, "color": color}}))
        fig.update_yaxes(title="depth (drafting levels)", dtick=1)
    else:  # a static tree: one line per cost model, each with its own choice
        fig = go.Figure()
        for choice, name, color, symbol in marks:
            rows = sorted(choice["grid"], key=lambda r: r["total_tokens"])
            y_of = {r["total_tokens"]: r["tokens_per_s"] * one / 1000.0 for r in rows}
            line = ("this machine" if choice is here else "the model alone" if choice is first
                    else "GPU cost model")
            fig.add_trace(go.Scatter(x=list(y_of), y=list(y_of.values()), mode="lines", name=line,
                                     line={"color": ROOT_BLUE if choice is here else "#888",
                                           "dash": "solid" if choice is here else "dash" if choice is first
                                           else "dot"},
                                     hovertemplate="%{x} nodes: %{y:.2f}x<extra></extra>"))
            fig.add_trace(go.Scatter(x=[choice["total_tokens"]], y=[y_of.get(choice["total_tokens"])],
                                     mode="markers", name=name, marker={"symbol": symbol, "size": 14, "color": color}))
        fig.update_yaxes(title="expected speedup", rangemode="tozero")
    src = here.get("acceptance_source") or ""
    src = src.rsplit("(", 1)[-1].rstrip(")") if src.endswith(")") else src  # "tau measured for every tree shape"
    title = f"{here['method']}: expected speedup of each tree shape here ({src})"
    if cal:
        title += (f"<br><sub>calibrated from {cal.get('cycles')} decoded cycles: measured / predicted tau gain "
                  f"x{cal['tau']:.2f}, drafting x{cal['draft']:.2f}, verify step {cal['verify_ms']:+.1f} ms</sub>")
    fig.update_layout(title=title,
                      xaxis={"title": "nodes in the tree"}, height=360,
                      margin={"l": 50, "r": 20, "t": 50, "b": 50}, legend={"orientation": "h", "y": -0.25})
    return fig


# ----- small figure helpers -------------------------------------------------------------------------

def message_figure(text: str) -> go.Figure:
    """An empty figure that says why there is nothing to plot."""
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 14, "color": "#666"})
    fig.update_layout(height=260, xaxis={"visible": False}, yaxis={"visible": False}, plot_bgcolor="white",
                      margin={"l": 10, "r": 10, "t": 10, "b": 10})
    return fig
