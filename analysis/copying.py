"""Copying: how each drafter does where the target's next token can be looked up in the context.

A small target copies a lot: summaries repeat the article, answers repeat the passage,
"translations" echo the source. At such a position prompt lookup (PLD) already knows
the next token; a trained drafter has to have learned to copy. This analysis replays
every verification cycle of the benchmark traces and splits them in two:

* **copyable**: the target's next token (the first token after the cycle's root) is what
  a PLD lookup over the context so far (prompt, earlier turns, answer) proposes: the
  continuation of the most recent earlier occurrence of the longest matching suffix,
  2 or 3 tokens long (core.drafters.pld's rule, without its 1-token matches, which
  fire on almost any common token);
* **not copyable**: every other cycle.

For each method and each kind it reports the share of cycles, acceptance of the first
draft token (acc@1) and the mean tokens appended per cycle (tau). A drafter whose acc@1
on copyable cycles lags PLD's has not learned to copy.

    python -m analysis.copying --results assets/results [--out assets/results/copying.json]

The prompts are rebuilt from the benchmark's question file (the summary's config says
which) with the target's chat template, exactly as analysis.bench built them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import plotly.graph_objects as go

from analysis.traces import read_traces
from core.drafters.pld import PromptLookupDrafter
from core.training.prompts import read_questions

KINDS = ("copyable", "not copyable")


def lookup_next(context: Sequence[int], lookup: PromptLookupDrafter) -> int | None:
    """PLD's first proposed token after `context` (its last token is the root), or None."""
    lookup.context = list(context[:-1])
    tree = lookup.draft(int(context[-1]))
    return int(tree.tokens[0]) if len(tree.tokens) else None


MIN_MATCH = 2  # shortest suffix match that counts as copying


def cycle_records(trace: dict, prompt_ids: Sequence[int], min_match: int = MIN_MATCH) -> list[dict]:
    """One record per verification cycle (the prefill excluded): copyable, accepted drafts, tokens appended."""
    lookup = PromptLookupDrafter(min_ngram=min_match)
    out: list[dict] = []
    answer: list[int] = []
    for ev in trace["events"]:
        new = [int(t) for t in ev["new_tokens"]]
        if answer and new:  # event 0 is the prefill: it only produces the first token
            proposal = lookup_next(list(prompt_ids) + answer, lookup)
            out.append({"copyable": proposal == new[0], "lookup": proposal is not None,
                        "accepted": len(ev["accepted"]), "appended": len(new), "category": trace.get("category")})
        answer.extend(new)
    return out


def summarize(records: Iterable[dict]) -> dict:
    """kind -> {cycles, share, acc1, tau} over cycle records, and how often a lookup was offered and right."""
    records = list(records)
    offered = sum(r["lookup"] for r in records)
    out: dict = {"lookup_share": round(offered / len(records), 4) if records else None,
                 "lookup_precision": round(sum(r["copyable"] for r in records) / offered, 4) if offered else None}
    for kind in KINDS:
        rs = [r for r in records if r["copyable"] == (kind == "copyable")]
        n = len(rs)
        out[kind] = {"cycles": n, "share": round(n / len(records), 4) if records else None,
                     "acc1": round(sum(r["accepted"] >= 1 for r in rs) / n, 4) if n else None,
                     "tau": round(sum(r["appended"] for r in rs) / n, 3) if n else None}
    return out


def prompts_for(questions: dict[int, dict], chat_ids: Callable[[list[dict]], list[int]],
                trace_by_turn: dict[tuple[int, int], dict]) -> Callable[[dict], list[int]]:
    """prompt_ids(trace): the chat the benchmark sent for that question and turn (earlier answers included)."""
    def prompt_ids(trace: dict) -> list[int]:
        q = questions[trace["question_id"]]
        messages: list[dict] = []
        for t in range(trace["turn"] + 1):
            messages.append({"role": "user", "content": q["turns"][t]})
            if t < trace["turn"]:
                messages.append({"role": "assistant", "content": trace_by_turn[(trace["question_id"], t)]["text"]})
        return chat_ids(messages)

    return prompt_ids


def analyze_results(results: str | Path, chat_ids: Callable[[list[dict]], list[int]],
                    methods: Sequence[str] | None = None) -> dict:
    """Per method: overall copyable / not-copyable figures and the same per category."""
    results = Path(results)
    summary = json.loads((results / "summary.json").read_text())
    questions = {q["question_id"]: q for q in read_questions(summary["config"]["questions_file"])}
    methods = [m for m in (methods or summary["config"]["methods"]) if m != "ar"]
    out: dict = {"questions_file": summary["config"]["questions_file"], "methods": {}}
    for m in methods:
        traces = list(read_traces(results / "traces" / f"{m}.jsonl.gz"))
        by_turn = {(t["question_id"], t["turn"]): t for t in traces}
        prompt_ids = prompts_for(questions, chat_ids, by_turn)
        records = [r for t in traces for r in cycle_records(t, prompt_ids(t))]
        cats = sorted({r["category"] for r in records})
        out["methods"][m] = {"overall": summarize(records),
                             "by_category": {c: summarize(r for r in records if r["category"] == c) for c in cats}}
    return out


def copying_figure(result: dict) -> go.Figure:
    """Grouped bars: acc@1 on copyable vs other cycles, per method."""
    methods = list(result["methods"])
    fig = go.Figure()
    for kind in KINDS:
        vals = [result["methods"][m]["overall"][kind]["acc1"] for m in methods]
        fig.add_bar(name=kind, x=methods, y=vals, text=[f"{v:.2f}" if v is not None else "" for v in vals])
    fig.update_layout(barmode="group", yaxis_title="first draft token accepted (acc@1)", yaxis_range=[0, 1],
                      title="Cycles where a context lookup knew the target's next token (copyable) and the rest",
                      template="plotly_white")
    return fig


def _tokenizer_chat_ids() -> Callable[[list[dict]], list[int]]:
    from transformers import AutoTokenizer

    from core.target import chat_template_ids, smollm2_location

    folder, gguf = smollm2_location()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)

    def chat_ids(messages: list[dict]) -> list[int]:
        return chat_template_ids(tok, messages)  # message text stays text, as in every entry point

    return chat_ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.copying", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="assets/results", help="a benchmark folder (summary.json, traces/)")
    p.add_argument("--methods", default=None, help="comma-separated (default: every method but ar)")
    p.add_argument("--out", default=None, help="write the figures as JSON here (and a .html figure beside it)")
    args = p.parse_args(argv)
    methods = args.methods.split(",") if args.methods else None
    try:
        result = analyze_results(args.results, _tokenizer_chat_ids(), methods)
    except FileNotFoundError as e:
        print(f"analysis.copying: {e}", file=sys.stderr)
        return 2
    print(f"{'method':<16} {'lookup':>7} {'right':>6} {'copyable':>9} {'acc@1 copy':>11} {'acc@1 other':>12} "
          f"{'tau copy':>9} {'tau other':>10}")
    for m, r in result["methods"].items():
        c, o = r["overall"]["copyable"], r["overall"]["not copyable"]
        print(f"{m:<16} {r['overall']['lookup_share']:>7.1%} {r['overall']['lookup_precision']:>6.1%} "
              f"{c['share']:>9.1%} {c['acc1'] or 0:>11.3f} {o['acc1'] or 0:>12.3f} {c['tau'] or 0:>9.2f} "
              f"{o['tau'] or 0:>10.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        copying_figure(result).write_html(Path(args.out).with_suffix(".html"), include_plotlyjs="cdn")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
