"""Runs side by side: where a run's text first differs from plain decoding's, why (the target's top-2 at that token,
a bfloat16 near tie or a sampled draw), and the comparison columns."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from demo.render.stats import CURVE_LINK


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
