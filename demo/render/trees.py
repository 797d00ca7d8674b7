"""The draft tree of one step as a figure: every drafted node, the accepted path, the target's bonus token, and
the step picker's choices."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import plotly.graph_objects as go

from demo.render.style import ACCEPTED_GREEN, BONUS_ORANGE, REJECTED_GREY, ROOT_BLUE
from demo.render.tokens import _fmt_p, _prob_of


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
