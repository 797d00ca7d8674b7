"""Draft-failure analysis: which draft tokens the target rejects, and does the drafter know?

Works on recorded step traces (`GenerationResult.trace()` with record=True, or
the compact traces analysis.bench saves). A draft node was *tested* when the
verifier looked at it: its parent is the root or an accepted node. Every
tested node that was not accepted is a rejection. (With sampled trees, siblings
after an accepted one count as tested too: the definition is the same for
every method.) Aggregates: acceptance by token kind, by depth, and by the
drafter's own probability (a calibration curve: a drafter that knows when it
is wrong has acceptance close to its probability in every bin), and where the token the target emitted
sat in the drafter's own top-10 at each depth (a guess the tree had no room for, or one the drafter did
not have at all). The figures of these aggregates are in analysis.failure_figures (exported here too).

    python -m analysis.failures --traces runs/bench/traces/moa.jsonl.gz [--out failures.json]

The drafter's own top-10 at a rejection comes from the event extras
"draft_top" when a drafter attaches it: a list with one entry per row
[root, nodes...] (like the trace's row_top), each a list of [token, prob];
a list with one entry per node is read as the top-10 at that node's position;
{"tokens": [...], "probs": [...]} rows are accepted too.

Every --traces file is read and checked before anything is computed (load_trace_file): a file that is
missing, not text, not JSON or not step traces, and --bins outside 1..MAX_BINS, end in one `error:` line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import unicodedata
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from analysis.failure_figures import (
    RANK_GROUPS,
    acceptance_bar,
    calibration_figure,
    rank_figure,
    topk_comparison_figure,
)
from analysis.traces import read_traces, token_text_decoder
from core import cli_checks as checks

# The figures live in analysis.failure_figures; they are part of this module's API too (demo.tab_failures uses them).
__all__ = ["CODE_CHARS", "CODE_COMBOS", "EVENT_KEYS", "KINDS", "MAX_BINS", "RANK_GROUPS", "SPECIAL", "TRACE_FILES",
           "TREE_KEYS", "acceptance_bar", "acceptance_by_depth", "acceptance_by_kind", "analyze", "calibration",
           "calibration_error", "calibration_figure", "confusions", "load_trace_file", "main", "rank_figure",
           "rejections", "target_rank_by_depth", "tested_nodes", "token_kind", "topk_comparison_figure"]

KINDS = ("word_start", "word_piece", "punctuation", "number", "whitespace", "code_symbol")

# Characters that mark code (or markup) rather than prose punctuation.
CODE_CHARS = set("{}[]<>=+/\\|&^$@~`_")
CODE_COMBOS = {"()", "):", ");", "();", "::", "#!"}
SPECIAL = re.compile(r"<\|[^|]*\|>|</?s>")


def token_kind(text: str) -> str:
    """Kind of the decoded text of one token.

    Rules, in order:
    * empty or only whitespace -> "whitespace" (special tokens decoded with
      skip_special_tokens come out empty and land here);
    * a special token written out ("<|im_end|>", "<s>") -> "punctuation": it ends a turn;
    * starts (after leading spaces) with a digit -> "number";
    * starts with a letter -> a word: "word_start" if the token carries its
      leading space (SmolLM2's 'Ġ', a real space once decoded) or begins with a
      capital letter (a word at the start of a line has no space before it),
      else "word_piece" (the continuation of a word: "ing", "'s", "n't");
    * otherwise symbols. Runs of "*" or "#" alone (markdown emphasis and
      headings) are "punctuation"; "code_symbol" if any of { } [ ] < > = + / \\ | & ^ $
      @ ~ ` _ appears or it is a code-only cluster such as "()" or "):"; tokens made
      only of other punctuation and symbols (. , ; : ! ? ' " ( ) - % and the rest
      of Unicode's P* and S* classes) are "punctuation"; a symbol followed by
      letters (".append", ".com") is "code_symbol".
    """
    if not text or text.isspace():
        return "whitespace"
    s = text.strip()
    if SPECIAL.fullmatch(s):
        return "punctuation"
    first = s[0]
    if first.isdigit():
        return "number"
    if first.isalpha():
        return "word_start" if text[0].isspace() or first.isupper() else "word_piece"
    if first in "'’" and len(s) > 1 and s[1].isalpha():
        return "word_piece"  # contractions and possessives: 's, 're, n't split as 't
    if set(s) <= {"*"} or set(s) <= {"#"}:
        return "punctuation"
    if any(c in CODE_CHARS for c in s) or s in CODE_COMBOS:
        return "code_symbol"
    if all(unicodedata.category(c).startswith(("P", "S")) for c in s):
        return "punctuation"
    return "code_symbol"


# ----- per-node records --------------------------------------------------------------------------
def _tested_in_event(ev: dict) -> list[tuple[int, int, bool]]:
    """(node, parent, accepted) for every tested node of one event."""
    accepted = ev["accepted"]
    acc = set(accepted)
    open_parents = {-1} | acc
    return [(i, p, i in acc) for i, p in enumerate(ev["tree"]["parents"]) if p in open_parents]


def _depths(ev: dict) -> list[int]:
    if "depths" in ev:
        return ev["depths"]
    d: list[int] = []
    for p in ev["tree"]["parents"]:
        d.append(1 if p < 0 else d[p] + 1)
    return d


def _top_list(row) -> list[list] | None:
    if row is None:
        return None
    if isinstance(row, dict):
        return [[int(t), float(p)] for t, p in zip(row.get("tokens", []), row.get("probs", []))]
    return [[int(t), float(p)] for t, p in row]


def _draft_top(ev: dict, node: int | None, parent: int) -> list[list] | None:
    """The drafter's top list at the position after `parent` (-1: the root), where `node` (None: the position
    past the tree, e.g. the bonus token's) is drafted; None where the event does not carry it."""
    table = (ev.get("extras") or {}).get("draft_top")
    if table is None:
        return None
    if isinstance(table, dict) and "tokens" in table:  # {"tokens": rows, "probs": rows}
        table = [{"tokens": t, "probs": p} for t, p in zip(table["tokens"], table["probs"])]
    n = len(ev["tree"]["tokens"])
    if len(table) == n + 1:
        return _top_list(table[parent + 1])
    if len(table) == n and node is not None:
        return _top_list(table[node])
    return None


def _resolve_decode(trace: dict, decode: Callable[[list[int]], str] | None):
    return token_text_decoder(trace, decode)


def tested_nodes(trace: dict, decode: Callable[[list[int]], str] | None = None) -> list[dict]:
    """Every tested draft node of a trace: step, node, depth, draft_token, draft_prob, accepted, kind,
    target_prob_of_draft (None if the trace was not recorded).

    The kind needs token text: from `decode`, else the trace's "token_text" map
    (saved traces carry one); without either it is None.
    """
    decode = _resolve_decode(trace, decode)
    out = []
    for ev in trace["events"]:
        depths = _depths(ev)
        tokens = ev["tree"]["tokens"]
        probs = ev["tree"]["draft_probs"]
        ntp = ev.get("node_target_prob")
        for node, _parent, acc in _tested_in_event(ev):
            tok = int(tokens[node])
            out.append({"step": ev["step"], "node": node, "depth": depths[node], "draft_token": tok,
                        "draft_prob": float(probs[node]), "accepted": acc,
                        "target_prob_of_draft": None if ntp is None else float(ntp[node]),
                        "kind": token_kind(decode([tok])) if decode else None})
    return out


def rejections(trace: dict, decode: Callable[[list[int]], str] | None) -> list[dict]:
    """Every tested draft token the target rejected, with what the target wanted instead.

    target_token is the token the target emitted at that position: the accepted
    sibling's token if the path went on through a sibling, else the bonus token.
    """
    decode = _resolve_decode(trace, decode) or (lambda ids: "".join(f"<{t}>" for t in ids))
    out = []
    extra = {k: trace[k] for k in ("method", "question_id", "category", "turn") if k in trace}
    for ev in trace["events"]:
        tokens = ev["tree"]["tokens"]
        if not tokens:
            continue
        depths = _depths(ev)
        emitted = [int(tokens[a]) for a in ev["accepted"]] + [int(ev["bonus"])]
        ntp, ent, top = ev.get("node_target_prob"), ev.get("row_entropy"), ev.get("row_top")
        for node, parent, acc in _tested_in_event(ev):
            if acc:
                continue
            d = depths[node]
            draft_tok = int(tokens[node])
            target_tok = emitted[d - 1]
            draft_text = decode([draft_tok])
            out.append({
                **extra,
                "step": ev["step"], "depth": d, "node": node,
                "draft_token": draft_tok, "draft_text": draft_text,
                "target_token": target_tok, "target_text": decode([target_tok]),
                "draft_prob": float(ev["tree"]["draft_probs"][node]),
                "target_prob_of_draft": None if ntp is None else float(ntp[node]),
                "target_entropy": None if ent is None else float(ent[parent + 1]),
                "kind": token_kind(draft_text),
                "target_top": None if top is None else _top_list(top[parent + 1]) or None,
                "draft_top": _draft_top(ev, node, parent),
            })
    return out


# ----- aggregates --------------------------------------------------------------------------------
def _rates(groups: dict) -> dict:
    return {k: {"tested": t, "accepted": a, "rate": a / t if t else None} for k, (t, a) in groups.items()}


def acceptance_by_kind(nodes: Iterable[dict]) -> dict[str, dict]:
    """kind -> {"tested", "accepted", "rate"} (kinds in KINDS order, only those seen)."""
    counts: dict[str, list[int]] = {}
    for n in nodes:
        c = counts.setdefault(n["kind"], [0, 0])
        c[0] += 1
        c[1] += int(bool(n["accepted"]))
    order = sorted(counts, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS))
    return _rates({k: counts[k] for k in order})


def acceptance_by_depth(nodes: Iterable[dict]) -> dict[int, dict]:
    """depth -> {"tested", "accepted", "rate"}: of the tested nodes at a depth, the share accepted.

    (Per-node, unlike the per-cycle position rate of analysis.metrics: a tree
    tests several siblings at a depth and accepts at most one.)
    """
    counts: dict[int, list[int]] = {}
    for n in nodes:
        c = counts.setdefault(int(n["depth"]), [0, 0])
        c[0] += 1
        c[1] += int(bool(n["accepted"]))
    return _rates({k: counts[k] for k in sorted(counts)})


def target_rank_by_depth(traces: Iterable[dict], max_rank: int = 10) -> dict[int, dict]:
    """Where the target's token sat in the drafter's own ranking, by depth along the path it took.

    For each cycle and each depth d the target reached through the tree (the root's children at d = 1; at
    d > 1 the accepted node at d - 1, when the drafter expanded it), the drafter's top-`max_rank` list at
    that position (event extras "draft_top", a row per [root, nodes...]) gives the rank of the token the
    target emitted there. depth -> {"positions", "rank_shares": [share at rank 1..max_rank],
    "missed": share outside the list}. A token at rank 2-8 that was still rejected was a guess the tree
    had no room for; one outside the list was a guess the drafter did not have.
    Traces without draft_top rows give {}.
    """
    counts: dict[int, list[int]] = {}
    for tr in traces:
        for ev in tr["events"]:
            tokens = ev["tree"]["tokens"]
            path = list(ev["accepted"])
            emitted = [int(tokens[a]) for a in path] + [int(ev["bonus"])]
            # at depth d the target emitted emitted[d - 1], after parent path[d - 2] (the root at d = 1)
            for d, tok in enumerate(emitted, start=1):
                top = _draft_top(ev, path[d - 1] if d <= len(path) else None, path[d - 2] if d > 1 else -1)
                if not top:
                    break
                c = counts.setdefault(d, [0] * (max_rank + 2))  # positions, ranks 1..max_rank, missed
                c[0] += 1
                rank = next((i for i, (t, _p) in enumerate(top[:max_rank], start=1) if t == tok), None)
                c[rank if rank is not None else max_rank + 1] += 1
    return {d: {"positions": c[0], "rank_shares": [x / c[0] for x in c[1:max_rank + 1]],
                "missed": c[max_rank + 1] / c[0]} for d, c in sorted(counts.items())}


def calibration(nodes: Iterable[dict], bins: int = 10) -> list[dict]:
    """Equal-width bins of the drafter's probability: the mean probability vs the acceptance rate in each.

    A calibrated drafter has acceptance == mean_draft_prob in every bin. Empty bins
    have count 0 and None for the means. The last bin includes 1.0.
    """
    if bins < 1:
        raise ValueError(f"bins must be positive, got {bins}")
    sums = [[0, 0.0, 0] for _ in range(bins)]  # count, sum of probs, accepted
    for n in nodes:
        p = min(max(float(n["draft_prob"]), 0.0), 1.0)
        b = min(int(p * bins), bins - 1)
        sums[b][0] += 1
        sums[b][1] += p
        sums[b][2] += int(bool(n["accepted"]))
    return [{"bin_lo": i / bins, "bin_hi": (i + 1) / bins,
             "mean_draft_prob": s / c if c else None, "acceptance": a / c if c else None, "count": c}
            for i, (c, s, a) in enumerate(sums)]


def calibration_error(calib: Sequence[dict]) -> float | None:
    """Expected calibration error: count-weighted mean |acceptance - mean_draft_prob| over the bins."""
    total = sum(b["count"] for b in calib)
    if not total:
        return None
    return sum(b["count"] * abs(b["acceptance"] - b["mean_draft_prob"]) for b in calib if b["count"]) / total


def confusions(records: Iterable[dict], top: int = 20) -> list[dict]:
    """Most frequent (draft text -> target text) rejections."""
    c = Counter((r["draft_text"], r["target_text"]) for r in records)
    return [{"draft_text": d, "target_text": t, "count": n} for (d, t), n in c.most_common(top)]


def analyze(traces: Iterable[dict], decode: Callable[[list[int]], str] | None = None, bins: int = 10) -> dict:
    """All aggregates over several traces (the CLI's output)."""
    nodes, rejected = [], []
    traces = list(traces)
    for tr in traces:
        nodes.extend(tested_nodes(tr, decode))
        rejected.extend(rejections(tr, decode))
    calib = calibration(nodes, bins)
    ent = [r["target_entropy"] for r in rejected if r["target_entropy"] is not None]
    pt = [r["target_prob_of_draft"] for r in rejected if r["target_prob_of_draft"] is not None]
    return {
        "tested": len(nodes), "accepted": sum(bool(n["accepted"]) for n in nodes), "rejected": len(rejected),
        "by_kind": acceptance_by_kind(nodes), "by_depth": acceptance_by_depth(nodes),
        "target_rank_by_depth": target_rank_by_depth(traces),
        "calibration": calib, "calibration_error": calibration_error(calib),
        "rejected_by_kind": dict(Counter(r["kind"] for r in rejected).most_common()),
        "mean_target_entropy_at_rejections": sum(ent) / len(ent) if ent else None,
        "mean_target_prob_of_rejected": sum(pt) / len(pt) if pt else None,
        "top_confusions": confusions(rejected),
    }


# ----- command line ------------------------------------------------------------------------------
TRACE_FILES = "a .jsonl.gz from analysis.bench (its traces/ folder) or a .json from core.generate --trace"
MAX_BINS = 1000
EVENT_KEYS = ("step", "accepted", "bonus", "tree")
TREE_KEYS = ("tokens", "parents", "draft_probs")


def _trace_problem(trace: object) -> str | None:
    """What keeps one record from being a step trace (None: it is one). Checks the fields the analysis reads,
    so that a file of another kind is refused in one line instead of failing halfway through."""
    if not isinstance(trace, dict):
        return f"is a JSON {type(trace).__name__}, not an object with 'events'"
    events = trace.get("events")
    if not isinstance(events, list):
        keys = ", ".join(map(str, list(trace)[:6])) or "none"
        return f"has no 'events' list (its keys: {keys})"
    for i, ev in enumerate(events):
        missing = [k for k in EVENT_KEYS if k not in ev] if isinstance(ev, dict) else list(EVENT_KEYS)
        tree = ev.get("tree") if isinstance(ev, dict) else None
        if not missing and isinstance(tree, dict):
            missing = [f"tree.{k}" for k in TREE_KEYS if not isinstance(tree.get(k), list)]
        elif not missing:
            missing = ["tree"]
        if missing:
            return f"event {i} lacks {', '.join(missing)}"
    return None


def load_trace_file(path: str, flag: str = "--traces") -> list[dict]:
    """Every trace in `path`, checked: a file that is missing, not text, not JSON, or not step traces is a
    one-line ValueError (cli_checks.UsageError) naming the file, the record and what is expected."""
    where = f"{flag} {path}"
    p = Path(path)
    if p.is_dir():
        raise checks.UsageError(f"{where}: that is a folder; give {TRACE_FILES}")
    if not p.is_file():
        raise checks.UsageError(f"{where}: no such file; give {TRACE_FILES}")
    traces: list[dict] = []
    try:
        for record in read_traces(p):
            traces.append(record)
    except UnicodeDecodeError:
        raise checks.UsageError(f"{where}: not a text file (not UTF-8, or not gzip); give {TRACE_FILES}") from None
    except json.JSONDecodeError as err:
        raise checks.UsageError(f"{where}: not a trace file: record {len(traces) + 1} is not JSON ({err.msg}); "
                                f"give {TRACE_FILES}") from None
    except (gzip.BadGzipFile, zlib.error, EOFError) as err:
        raise checks.UsageError(f"{where}: not a gzip file ({checks.one_line(err)}); give {TRACE_FILES}") from None
    except OSError as err:
        raise checks.UsageError(f"{where}: cannot be read ({err.strerror or err})") from None
    if not traces:
        raise checks.UsageError(f"{where}: holds no complete trace record (one JSON object with 'events' a line); "
                                f"give {TRACE_FILES}")
    for i, trace in enumerate(traces, 1):
        problem = _trace_problem(trace)
        if problem:
            raise checks.UsageError(f"{where}: not a trace file: record {i} {problem}; give {TRACE_FILES}")
    return traces


def _load_tokenizer_decode() -> Callable[[list[int]], str] | None:
    try:
        from transformers import AutoTokenizer

        from core.target_files import smollm2_location

        folder, gguf = smollm2_location()
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        return lambda ids: tok.decode(list(ids), skip_special_tokens=False)
    except (FileNotFoundError, OSError, ImportError):
        return None


def _print_table(title: str, rows: dict) -> None:
    print(f"\n{title}")
    for k, v in rows.items():
        rate = "–" if v["rate"] is None else f"{v['rate']:.3f}"
        print(f"  {str(k):>12}  tested {v['tested']:>7}  accepted {v['accepted']:>7}  rate {rate}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.failures", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", required=True, nargs="+", help="trace files (.jsonl.gz from analysis.bench, "
                                                                  "or a .json from core.generate --trace)")
    p.add_argument("--bins", type=int, default=10, help=f"calibration bins: 1 to {MAX_BINS} (default 10)")
    p.add_argument("--out", default=None, help="write the aggregates (and every rejection) as JSON here")
    args = p.parse_args(argv)
    try:  # every value and every file, before the tokenizer loads or anything is computed
        checks.check_int_range(args.bins, "--bins", 1, MAX_BINS)
        checks.check_output_file(args.out, "--out")
        traces = [t for path in args.traces for t in load_trace_file(path)]
    except ValueError as err:
        return checks.report(err)
    decode = None
    if any("token_text" not in t for t in traces):
        decode = _load_tokenizer_decode()
    try:  # the fields were checked; values of the wrong kind inside them (a bonus that is not a token id, an
        # accepted node past the tree) still end in one line
        result = analyze(traces, decode, args.bins)
        rejected = [r for t in traces for r in rejections(t, decode)] if args.out else []
    except (KeyError, IndexError, TypeError, ValueError) as err:
        return checks.report(f"--traces: a trace does not have the expected fields and values "
                             f"({type(err).__name__}: {checks.one_line(err, 120)}); give {TRACE_FILES}")
    print(f"{len(traces)} traces: {result['tested']} tested draft tokens, {result['accepted']} accepted, "
          f"{result['rejected']} rejected")
    _print_table("acceptance by token kind", result["by_kind"])
    _print_table("acceptance by depth (per tested node)", result["by_depth"])
    if result["target_rank_by_depth"]:
        print("\nthe target's token in the drafter's own ranking, by depth (share at rank 1, 2, 3, 4-10, outside)")
        for d, r in result["target_rank_by_depth"].items():
            sh = r["rank_shares"]
            print(f"  depth {d}  positions {r['positions']:>6}  rank 1 {sh[0]:.3f}  2 {sh[1]:.3f}  3 {sh[2]:.3f}  "
                  f"4-10 {sum(sh[3:]):.3f}  outside {r['missed']:.3f}")
    print("\ncalibration (drafter probability bin -> acceptance)")
    for b in result["calibration"]:
        if b["count"]:
            print(f"  [{b['bin_lo']:.1f}, {b['bin_hi']:.1f})  mean p {b['mean_draft_prob']:.3f}  "
                  f"acceptance {b['acceptance']:.3f}  n {b['count']}")
    ece = result["calibration_error"]
    print(f"  expected calibration error: {'–' if ece is None else f'{ece:.3f}'}")
    print("\nmost frequent rejections (drafted -> target)")
    for c in result["top_confusions"][:10]:
        print(f"  {c['draft_text']!r:>16} -> {c['target_text']!r:<16} x{c['count']}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({**result, "rejections": rejected}, f, ensure_ascii=False)
        print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
