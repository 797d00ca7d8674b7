"""Tab 6, Draft failures: which draft tokens the target rejected, and how well the drafter's confidence is calibrated.

The analysis itself lives in `analysis.failures`; this tab only gathers traces, filters and shows.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import gradio as gr
import pandas as pd

from analysis import failures
from analysis.traces import token_text_decoder
from demo.common import RESULTS, AppContext, friendly, last_runs, progress_reporter, write_json_download
from demo.render import message_figure

TITLE = "Draft failures"
EXPLANATION = """\
**What you see.** Every drafted token that the target checked and threw away, with what the target wanted
instead. Filter them by draft depth (deeper guesses fail more often, since they build on earlier guesses)
and by the kind of token (words, punctuation, numbers, code...). The bar charts show how often each kind
and each depth is accepted; the *calibration curve* asks whether the drafter's confidence means something:
when it says 80 %, is the token accepted about 80 % of the time? The stacked bars beside it show, for each
method and depth, where the target's token sat among the drafter's own guesses: a token at its 2nd-10th guess
was one a bigger tree could have caught; one outside its top 10 was never on the table. Pick a rejection
(click a row) to see the drafter's and the target's ten most likely tokens side by side. Source: your last
generation in this session, or the committed benchmark traces (the tab opens on those, already analysed).
"""
TRACES_DIR = RESULTS / "traces"
COPYING_JSON = RESULTS / "copying.json"  # written by `python -m analysis.copying --out ...`
COPYING_EXPLANATION = """\
**Copying.** A small target repeats its context a lot (summaries repeat the article, answers repeat the
passage). For every verification cycle of the committed benchmark we asked: would a prompt lookup (the last
2-3 tokens found earlier in the context, PLD's rule) have named the target's next token? The bars compare
how often each drafter's first guess is accepted on those *copyable* cycles and on the others. A drafter
below 1.0 on copyable cycles missed tokens that were sitting in its context; `<method>+lookup` rows graft
the lookup onto the drafter's tree (`python -m analysis.copying` for the numbers).
"""
SOURCES = ("Last generation", "Committed benchmark run")
# The committed traces are written by the shipped benchmark (analysis.bench --out assets/results); rerun it when a
# shipped drafter changes. The tab opens on them, analysed once per process (committed_analysis).
REGENERATE = "make bench-shipped"
EXAMPLE_NOTE = (f"*Recorded example:* the committed benchmark traces (`assets/results/traces/`, written by "
                f"`{REGENERATE}`), analysed when the app started; **Analyse** replaces them with the traces you pick.")
ALL = "all"
TABLE_COLUMNS = ["#", "step", "depth", "draft_text", "target_text", "draft_prob", "target_prob_of_draft",
                 "target_entropy", "kind"]
MAX_TRACES = 200  # committed traces read per file, enough for stable curves and a quick tab
MAX_TABLE_ROWS = 2000

_trace_cache: dict[tuple, list[dict]] = {}
_analysis_cache: dict[tuple, dict] = {}


def committed_trace_files(folder: Path = TRACES_DIR) -> list[Path]:
    return sorted(Path(folder).glob("*.jsonl.gz"))


def load_committed_traces(folder: Path = TRACES_DIR, limit: int = MAX_TRACES) -> list[dict]:
    """Traces (one JSON object a line) from assets/results/traces/*.jsonl.gz, at most `limit` per file."""
    out = []
    for path in committed_trace_files(folder):
        key = (str(path), path.stat().st_mtime, limit)
        if key not in _trace_cache:
            traces = []
            with gzip.open(path, "rt") as f:
                for line in f:
                    if len(traces) >= limit:
                        break
                    if line.strip():
                        t = json.loads(line)
                        t.setdefault("source_file", path.name)
                        traces.append(t)
            _trace_cache[key] = traces
        out.extend(_trace_cache[key])
    return out


def committed_analysis(folder: Path = TRACES_DIR, fm: ModuleType = failures) -> dict | None:
    """The committed traces analysed (`analyse`'s dict plus "traces"), once per process and set of files; None
    when there are none. They carry their own token texts, so no model is needed."""
    files = committed_trace_files(folder)
    if not files:
        return None
    key = (tuple((str(p), p.stat().st_mtime) for p in files), fm.__name__)
    if key not in _analysis_cache:
        traces = load_committed_traces(folder)
        _analysis_cache.clear()
        _analysis_cache[key] = {**analyse(traces, None, fm), "traces": traces}
    return _analysis_cache[key]


def trace_decoder(trace: dict, fallback: Callable | None) -> Callable | None:
    """Decode from the trace's own token_text map when it has one (committed traces do), else `fallback`."""
    return token_text_decoder(trace, fallback)


def gather(traces: Sequence[dict], decode: Callable | None, fm) -> tuple[list[dict], list]:
    """All rejection records (numbered) and all tested nodes of the traces."""
    records, nodes = [], []
    for t_i, trace in enumerate(traces):
        dec = trace_decoder(trace, decode)
        for r in fm.rejections(trace, dec):
            records.append({**r, "trace": t_i, "method": trace.get("method")})
        nodes.extend(fm.tested_nodes(trace, dec))
    for i, r in enumerate(records):
        r["#"] = i
    return records, nodes


def filter_records(records: Sequence[dict], depth, kind) -> list[dict]:
    out = []
    for r in records:
        if depth not in (None, ALL, "") and int(r.get("depth", -1)) != int(depth):
            continue
        if kind not in (None, ALL, "") and r.get("kind") != kind:
            continue
        out.append(r)
    return out


def records_table(records: Sequence[dict]) -> pd.DataFrame:
    rows = []
    for r in records[:MAX_TABLE_ROWS]:
        row = {c: r.get(c) for c in TABLE_COLUMNS}
        for c in ("draft_prob", "target_prob_of_draft", "target_entropy"):
            if row[c] is not None:  # 3 significant digits: rejected drafts often have tiny target probabilities
                row[c] = float(f"{float(row[c]):.3g}")
        rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def filter_choices(records: Sequence[dict]) -> tuple[list, list]:
    depths = sorted({int(r["depth"]) for r in records if r.get("depth") is not None})
    kinds = sorted({str(r["kind"]) for r in records if r.get("kind") is not None})
    return [ALL] + [str(d) for d in depths], [ALL] + kinds


def analyse(traces: Sequence[dict], decode: Callable | None, fm: ModuleType = failures) -> dict:
    """Everything the tab shows for a set of traces: records, figures and a one-line summary.

    `fm` is analysis.failures (tests pass a stand-in with the same functions).
    """
    if not traces:
        msg = "No traces to analyse."
        return {"records": [], "summary": msg, "by_kind": message_figure(msg), "by_depth": message_figure(""),
                "calibration": message_figure(""), "ranks": message_figure("")}
    records, nodes = gather(traces, decode, fm)
    if nodes:
        by_kind = fm.acceptance_bar(fm.acceptance_by_kind(nodes), "Acceptance rate by token kind")
        by_depth = fm.acceptance_bar(fm.acceptance_by_depth(nodes), "Acceptance rate by draft depth")
        calib = fm.calibration_figure(fm.calibration(nodes, bins=10))
        by_method: dict[str, list[dict]] = {}
        for trace in traces:
            by_method.setdefault(str(trace.get("method") or "?"), []).append(trace)
        ranks = fm.rank_figure({m: fm.target_rank_by_depth(ts) for m, ts in by_method.items()})
    else:
        by_kind = message_figure("Nothing was drafted in these traces (plain decoding drafts nothing).")
        by_depth = calib = ranks = message_figure("")
    summary = (f"{len(traces)} trace(s): {len(nodes)} drafted tokens were tested by the target, "
               f"{len(records)} of them rejected.")
    return {"records": records, "summary": summary, "by_kind": by_kind, "by_depth": by_depth,
            "calibration": calib, "ranks": ranks}


def topk_view(records: Sequence[dict], index, decode: Callable | None, fm: ModuleType = failures):
    if not records:
        return message_figure("Pick a rejection from the table.")
    try:
        i = int(index)
    except (TypeError, ValueError):
        return message_figure("Pick a rejection from the table.")
    match = [r for r in records if r.get("#") == i]
    if not match:
        return message_figure(f"No rejection #{i}.")
    return fm.topk_comparison_figure(match[0], decode)


def copying_view(path: Path = COPYING_JSON):
    """(markdown table, figure) of the committed copying analysis, or a note when it is missing."""
    if not Path(path).exists():
        return "No copying analysis committed yet (`python -m analysis.copying --out assets/results/copying.json`).", \
            message_figure("")
    from analysis.copying import copying_figure

    result = json.loads(Path(path).read_text())
    rows = ["| method | cycles with a lookup | lookup right | copyable cycles | acc@1 copyable | acc@1 other |",
            "|---|---|---|---|---|---|"]
    for m, r in result["methods"].items():
        o, c, n = r["overall"], r["overall"]["copyable"], r["overall"]["not copyable"]
        rows.append(f"| {m} | {o['lookup_share']:.0%} | {o['lookup_precision']:.0%} | {c['share']:.0%} | "
                    f"{c['acc1']:.2f} | {n['acc1']:.2f} |")
    return COPYING_EXPLANATION + "\n" + "\n".join(rows), copying_figure(result)


def view(res: dict, traces: Sequence[dict], depth, kind, fallback: Callable | None) -> dict:
    """What the tab shows for an analysis (`analyse`'s dict) after the depth and kind filters."""
    recs = res["records"]
    depths, kinds = filter_choices(recs)
    depth = depth if depth in depths else ALL
    kind = kind if kind in kinds else ALL
    shown = filter_records(recs, depth, kind)
    first = shown[0]["#"] if shown else None
    dec = trace_decoder(traces[recs[first]["trace"]], fallback) if shown else fallback
    return {"summary": f"{res['summary']} Showing {len(shown)} after the filters.", "shown": shown,
            "table": records_table(shown), "depths": depths, "depth": depth, "kinds": kinds, "kind": kind,
            "topk": topk_view(recs, first, dec), "first": first}


def build(ctx: AppContext) -> None:
    runtime = ctx.runtime
    committed = committed_analysis()
    first = view(committed, committed["traces"], ALL, ALL, None) if committed else None
    gr.Markdown(EXPLANATION)
    records_state = gr.State(None)  # None: the committed analysis (kept once on the server, not per visitor)
    with gr.Row():
        source = gr.Radio(list(SOURCES), value=SOURCES[1] if committed else SOURCES[0], label="Traces",
                          elem_id="fail-source", scale=2)
        depth = gr.Dropdown(first["depths"] if first else [ALL], value=ALL, label="Draft depth", scale=1)
        kind = gr.Dropdown(first["kinds"] if first else [ALL], value=ALL, label="Token kind", scale=1)
        go_btn = gr.Button("Analyse", variant="primary", elem_id="fail-analyse", scale=1)
    summary = gr.Markdown(f"{EXAMPLE_NOTE}\n\n{first['summary']}" if first else
                          "Choose the traces and press **Analyse**.", elem_id="fail-summary")
    with gr.Column(visible=first is not None) as results:
        table = gr.Dataframe(first["table"] if first else records_table([]), interactive=False, max_height=320,
                             label="Rejected draft tokens (click a row for the top-10 comparison)",
                             elem_id="fail-table")
        with gr.Row():
            pick = gr.Number(first["first"] if first else None, label="Rejection # (or click a row)", precision=0,
                             minimum=0, scale=3)
            with gr.Column(scale=1, min_width=160):
                # written on Analyse (a file for the example would outlive the downloads folder's clean-up)
                download = gr.DownloadButton("Download rejections (JSON)", size="sm", visible=False)
        topk = gr.Plot(first["topk"] if first else None, show_label=False, elem_id="fail-topk")
        with gr.Row():
            by_kind = gr.Plot(committed["by_kind"] if first else None, show_label=False, elem_id="fail-kind")
            by_depth = gr.Plot(committed["by_depth"] if first else None, show_label=False, elem_id="fail-depth")
        with gr.Row():
            calib = gr.Plot(committed["calibration"] if first else None, show_label=False,
                            elem_id="fail-calibration")
            ranks = gr.Plot(committed["ranks"] if first else None, show_label=False, elem_id="fail-ranks")
    with gr.Accordion("Copying: drafts versus a context lookup (committed benchmark)", open=False):
        copy_text, copy_fig = copying_view()
        gr.Markdown(copy_text, elem_id="fail-copying")
        gr.Plot(copy_fig, show_label=False, elem_id="fail-copying-plot")

    def records_of(recs: list[dict] | None) -> list[dict]:
        if recs is not None:
            return recs
        return committed_analysis()["records"] if committed else []

    def traces_of(recs: list[dict] | None, session: dict | None) -> list[dict]:
        if recs is None:
            return committed_analysis()["traces"] if committed else []
        return last_runs(session)

    def nothing(msg: str):
        return ([], msg, gr.update(visible=False), records_table([]), gr.update(), gr.update(), None, None, None,
                None, None, gr.update(value=None, visible=False), gr.update(value=None))

    @friendly
    def on_analyse(src, d, k, session, progress=gr.Progress()):
        if src == SOURCES[1]:
            res = committed_analysis()
            if res is None:
                return nothing("No committed benchmark traces yet (`assets/results/traces/*.jsonl.gz`); "
                               "analyse your last generation instead.")
            traces, state = res["traces"], None
        else:
            traces = last_runs(session)
            if not traces:
                return nothing("Generate something in the Generate tab first (or pick the committed benchmark run).")
            if any("token_text" not in t for t in traces):  # the shipped example carries its own
                runtime.load(progress_reporter(progress))  # token texts need the tokenizer
            res = analyse(traces, runtime.decode if runtime.loaded else None)
            state = res["records"]
        fallback = runtime.decode if runtime.loaded else None
        v = view(res, traces, d, k, fallback)
        path = write_json_download(v["shown"], "speclens-rejections") if v["shown"] else None
        return (state, v["summary"], gr.update(visible=True), v["table"],
                gr.update(choices=v["depths"], value=v["depth"]), gr.update(choices=v["kinds"], value=v["kind"]),
                res["by_kind"], res["by_depth"], res["calibration"], res["ranks"], v["topk"],
                gr.update(value=path, visible=path is not None), gr.update(value=v["first"]))

    outputs = [records_state, summary, results, table, depth, kind, by_kind, by_depth, calib, ranks, topk, download,
               pick]
    go_btn.click(on_analyse, [source, depth, kind, ctx.session], outputs, api_visibility="private")

    @friendly
    def on_filter(recs, d, k):
        recs = records_of(recs)
        shown = filter_records(recs, d, k)
        return records_table(shown), f"Showing {len(shown)} of {len(recs)} rejections after the filters."

    depth.input(on_filter, [records_state, depth, kind], [table, summary], api_visibility="private")
    kind.input(on_filter, [records_state, depth, kind], [table, summary], api_visibility="private")

    @friendly
    def on_pick(recs, i, session):
        traces = traces_of(recs, session)
        recs = records_of(recs)
        if not recs or i is None:
            return gr.update()
        fallback = runtime.decode if runtime.loaded else None
        match = [r for r in recs if r.get("#") == int(i)]
        dec = trace_decoder(traces[match[0]["trace"]], fallback) if match and match[0]["trace"] < len(traces) \
            else fallback
        return topk_view(recs, i, dec)

    def on_select(df: pd.DataFrame, evt: gr.SelectData):
        try:
            return int(df.iloc[evt.index[0]]["#"])
        except (TypeError, ValueError, IndexError, KeyError):
            return gr.update()

    table.select(on_select, [table], [pick], api_visibility="private")
    pick.change(on_pick, [records_state, pick, ctx.session], [topk], api_visibility="private")
