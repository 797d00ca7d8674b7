"""The coloured token stream: each output token's text, how it came to be (an accepted draft at some depth, or the
target's own token) and its HTML span with a hover title."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from demo.render.style import MAX_DEPTH_CLASS


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
