"""Target Layer Inference sweep: what running N target layers inside the MoA drafter buys and costs.

With TLI N the drafter regresses the residual stream entering the target's last
N layers and runs those layers itself (docs/ARCHITECTURE.md, "MoA"): a better draft
(higher tau) for more drafting time per cycle. This measures tau, drafting and
verification time per cycle and speedup over plain decoding against N, using
the shipped drafters (assets/drafters/moa, moa-tli1, moa-tli3). Where one is
not shipped, an untrained (random) MoA drafter with that N stands in and the
output says so: its times are real, its tau is not.

    python -m analysis.tli --limit 12 --max-new-tokens 64 --out runs/tli
    python -m analysis.tli --from-summary assets/results/summary.json --out assets/results/tli   # no new run

writes tli.json, tli.md (the table) and tli.html (the figure), plus the
underlying benchmark files (answer files, summary.json, report.html).
`live_run` measures one N on one prompt, for the app.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from analysis import metrics
from analysis.bench import load_questions, run_benchmark
from core.decoding import generate
from core.drafters.base import Autoregressive, Drafter
from core.drafters.checkpoint import weight_files
from core.methods import build_drafter, default_drafter_folder, methods_where, tli_of, with_tli
from core.target import Target, add_dtype_argument
from core.verify import SamplingConfig

MOA = methods_where(tli=True)[0]  # the method that takes TLI N
TLI_VALUES = (0, 1, 3)
PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts"
RANDOM_NOTE = "random (untrained stand-in: no shipped checkpoint; times are real, tau is not)"


def shipped_folder(n: int) -> Path | None:
    """The shipped MoA checkpoint trained with TLI N, if any (moa-tliN, or moa when its config says N)."""
    for name in dict.fromkeys((with_tli(MOA, n), MOA)):
        folder = default_drafter_folder(name)
        try:
            meta = json.loads((folder / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if int(meta.get("config", {}).get("tli", 0)) == n and weight_files(folder):
            return folder
    return None


def load_tli_drafter(target: Target, n: int, allow_random: bool = True, seed: int = 0) -> tuple[Drafter, str]:
    """(MoA drafter with TLI N, where it came from): the shipped checkpoint, else a random one if allowed."""
    folder = shipped_folder(n)
    if folder is not None:
        return build_drafter(MOA, target, str(folder)), f"shipped: assets/drafters/{folder.name}"
    if not allow_random:
        raise FileNotFoundError(f"no shipped MoA drafter with TLI N={n} (looked for assets/drafters/"
                                f"{with_tli(MOA, n)})")
    return build_drafter(MOA, target, "random", tli=n, seed=seed), RANDOM_NOTE


def rows_from_summary(summary: dict, labels: dict[int, str], sources: dict[int, str]) -> list[dict]:
    """One table row per N from a benchmark summary whose methods include the labels."""
    rows = []
    for n, label in labels.items():
        o = summary["methods"][label]["overall"]
        rows.append({"tli": n, "label": label, "source": sources[n], "tau": o["tau"],
                     "draft_ms_per_cycle": o["draft_ms_per_cycle"], "verify_ms_per_cycle": o["verify_ms_per_cycle"],
                     "tokens_per_s": o["tokens_per_s"], "speedup": o["speedup"], "ideal_speedup": o["ideal_speedup"],
                     "acceptance_by_position": o["acceptance_by_position"]})
    return rows


def tli_markdown(rows: Sequence[dict], ar_tokens_per_s: float | None = None) -> str:
    def f(x, nd=2, suffix=""):
        return "–" if x is None else f"{x:.{nd}f}{suffix}"

    lines = ["| TLI N | drafter | tau | draft ms/cycle | verify ms/cycle | tokens/s | speedup | ideal speedup |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        source = "random (untrained)" if r["source"] == RANDOM_NOTE else r["source"]
        lines.append(f"| {r['tli']} | {source} | {f(r['tau'])} | {f(r['draft_ms_per_cycle'], 1)} | "
                     f"{f(r['verify_ms_per_cycle'], 1)} | {f(r['tokens_per_s'], 1)} | {f(r['speedup'], 2, 'x')} | "
                     f"{f(r['ideal_speedup'], 2, 'x')} |")
    if ar_tokens_per_s is not None:
        lines.append(f"\nPlain decoding (ar): {ar_tokens_per_s:.1f} tokens/s in the same run.")
    return "\n".join(lines)


def tli_figure(rows: Sequence[dict]) -> go.Figure:
    """tau, drafting time per cycle and speedup against N, side by side."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("tau (tokens per target pass)", "drafting ms per cycle",
                                                        "speedup over plain decoding"))
    xs = [f"N={r['tli']}" + ("*" if r["source"].startswith("random") else "") for r in rows]
    for col, key in ((1, "tau"), (2, "draft_ms_per_cycle"), (3, "speedup")):
        ys = [r[key] for r in rows]
        fig.add_trace(go.Bar(x=xs, y=ys, text=["–" if y is None else f"{y:.2f}" for y in ys],
                             textposition="outside", showlegend=False), row=1, col=col)
    note = " (* untrained stand-in)" if any(r["source"].startswith("random") for r in rows) else ""
    fig.update_layout(title=f"MoA Target Layer Inference: more target layers in the drafter{note}")
    return fig


def sweep(
    target: Target,
    questions: Sequence[dict],
    out_dir: str | Path,
    tli_values: Sequence[int] = TLI_VALUES,
    max_new_tokens: int = 64,
    build: Callable[[int], tuple[Drafter, str]] | None = None,
    allow_random: bool = True,
    sampling: SamplingConfig | None = None,
    chat_ids: Callable[[list[dict]], list[int]] | None = None,
    decode: Callable[[list[int]], str] | None = None,
    progress: bool = True,
    meta: dict | None = None,
) -> dict:
    """Benchmark plain decoding and MoA at each N, interleaved; write tli.json / tli.md / tli.html."""
    out = Path(out_dir)
    build = build or (lambda n: load_tli_drafter(target, n, allow_random))
    drafters: dict[str, Drafter] = {"ar": Autoregressive()}
    labels, sources = {}, {}
    for n in tli_values:
        drafter, source = build(n)
        labels[n] = with_tli(MOA, n)
        sources[n] = source
        drafters[labels[n]] = drafter
    notes = [f"TLI N={n}: {RANDOM_NOTE}" for n in tli_values if sources[n] == RANDOM_NOTE]
    for note in notes:
        print(note, file=sys.stderr)
    summary = run_benchmark(target, drafters, questions, out, max_new_tokens=max_new_tokens, sampling=sampling,
                            chat_ids=chat_ids, decode=decode, record=False, progress=progress,
                            meta={"drafters": {labels[n]: sources[n] for n in tli_values}, **(meta or {})})
    return write_outputs(summary, labels, sources, notes, out)


def from_summary(summary_path: str | Path, out_dir: str | Path) -> dict:
    """The TLI table of an `analysis.bench` run that included moa, moa-tli1, ... (no new measurement)."""
    summary = json.loads(Path(summary_path).read_text(encoding="utf-8"))
    drafters = summary["config"].get("drafters", {})
    labels = {tli_of(label): label for label in summary["methods"] if tli_of(label) is not None}
    if not labels:
        raise ValueError(f"{summary_path} has no {MOA} method (with any TLI N)")
    labels = dict(sorted(labels.items()))
    sources = {n: drafters.get(label, "unknown") for n, label in labels.items()}
    notes = [f"TLI N={n}: {RANDOM_NOTE}" for n, s in sources.items() if s.startswith("random")]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_outputs(summary, labels, sources, notes, out)


def write_outputs(summary: dict, labels: dict[int, str], sources: dict[int, str], notes: list[str],
                  out: Path) -> dict:
    """tli.json, tli.md and tli.html from a benchmark summary."""
    rows = rows_from_summary(summary, labels, sources)
    ar_tps = summary["methods"]["ar"]["overall"]["tokens_per_s"]
    result = {"rows": rows, "ar_tokens_per_s": ar_tps, "notes": notes, "config": summary["config"]}
    (out / "tli.json").write_text(json.dumps(result, indent=1))
    md = tli_markdown(rows, ar_tps)
    if notes:
        md += "\n\n" + "\n".join(f"Note: {n}." for n in notes)
    (out / "tli.md").write_text(md + "\n")
    tli_figure(rows).write_html(out / "tli.html", include_plotlyjs="cdn")
    return result


@torch.no_grad()
def live_run(
    target: Target,
    n: int,
    prompt: str | list[dict] | list[int],
    max_new_tokens: int = 64,
    drafter: Drafter | None = None,
    baseline: bool = True,
    sampling: SamplingConfig | None = None,
    allow_random: bool = True,
) -> dict:
    """Generate once with MoA at TLI N (and, if `baseline`, once plainly) and measure it.

    prompt: text, chat messages or token ids. Pass `drafter` to reuse a loaded one
    (its source is then reported as "given"). Returns tau, draft/verify ms per
    cycle, tokens/s, speedup and ideal speedup (None without baseline), the text,
    and where the drafter came from.
    """
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        ids = list(prompt)
    else:
        ids = target.chat_ids(prompt)
    source = "given"
    if drafter is None:
        drafter, source = load_tli_drafter(target, n, allow_random)
    t0 = time.perf_counter()
    res = generate(target, drafter, ids, max_new_tokens, sampling)
    stats = metrics.question_stats([metrics.turn_stats(res.trace())])
    ar_stats = None
    if baseline:
        plain = generate(target, Autoregressive(), ids, max_new_tokens, sampling)
        ar_stats = metrics.question_stats([metrics.turn_stats(plain.trace())])
    m = metrics.finalize(stats, ar_stats)
    return {"tli": n, "source": source, "tau": m["tau"], "draft_ms_per_cycle": m["draft_ms_per_cycle"],
            "verify_ms_per_cycle": m["verify_ms_per_cycle"], "tokens_per_s": m["tokens_per_s"],
            "ar_tokens_per_s": None if ar_stats is None else metrics.finalize(ar_stats)["tokens_per_s"],
            "speedup": m["speedup"], "ideal_speedup": m["ideal_speedup"],
            "acceptance_by_position": m["acceptance_by_position"], "new_tokens": res.new_tokens,
            "text": res.text, "seconds": round(time.perf_counter() - t0, 3)}


def default_questions() -> Path:
    full = PROMPTS / "speclens_eval.jsonl"
    return full if full.exists() else PROMPTS / "smoke.jsonl"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.tli", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", default=None, help="Spec-Bench question file (default: the project's eval set)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--per-category", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--tli", default=",".join(map(str, TLI_VALUES)), help="comma-separated N values")
    p.add_argument("--no-random", action="store_true", help="fail instead of using untrained stand-ins")
    add_dtype_argument(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--from-summary", metavar="SUMMARY_JSON", default=None,
                   help="no new run: build the table from an analysis.bench summary with moa / moa-tliN methods")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        if args.from_summary:
            result = from_summary(args.from_summary, args.out)
            print(tli_markdown(result["rows"], result["ar_tokens_per_s"]))
            return 0
        from core.target import load_target

        qfile = args.questions or default_questions()
        questions = load_questions(qfile, args.limit, args.per_category)
        values = [int(x) for x in args.tli.split(",") if x.strip()]
        if args.threads:
            torch.set_num_threads(args.threads)
        print(f"loading target ({args.dtype})...", file=sys.stderr)
        target = load_target(None, args.dtype, args.device)
        result = sweep(target, questions, args.out, values, args.max_new_tokens, allow_random=not args.no_random,
                       meta={"questions_file": str(qfile),
                             "command": "python -m analysis.tli " + " ".join(argv or sys.argv[1:])})
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(tli_markdown(result["rows"], result["ar_tokens_per_s"]))
    for note in result["notes"]:
        print(f"Note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
