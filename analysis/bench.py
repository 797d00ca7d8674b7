"""Spec-Bench-compatible benchmark: every method on the same questions, interleaved, one target load.

    python -m analysis.bench --questions assets/prompts/speclens_eval.jsonl \\
        --methods ar,pld,eagle2,moa,medusa,amphista --max-new-tokens 128 --out runs/bench

Reads any Spec-Bench `question.jsonl` (multi-turn questions are answered turn
by turn; the chat history holds the earlier turns and the model's own answers)
and writes to --out:

    <method>.jsonl             Spec-Bench answer file (docs/ARCHITECTURE.md, "Formats")
    run.json                   the run's settings, written before the first answer
    summary.json               per method, overall and per category (analysis.metrics)
    report.html                plotly figures (analysis.report)
    traces/<method>.jsonl.gz   compact step traces for the failure analysis (analysis.failures)

Methods run question by question in rotating order after a warm-up, so machine
drift and cache warmth hit all alike. `ar` is always included: speedups are
ratios against it in the same run. A method label `moa-tliN` means MoA with
Target Layer Inference N (the shipped `assets/drafters/moa-tliN`).
Drafters: shipped checkpoints by default; `--drafter random` makes every
trained drafter random, `--drafter moa=random` or `--drafter moa=PATH` sets one,
`--drafter-dir DIR` looks for DIR/<method> first.

    python -m analysis.bench --readme-table runs/bench/summary.json   # markdown table for the README
    python -m analysis.bench --resummarize runs/bench   # summary.json again from traces/ (current metrics)

Every answer is written as soon as it is finished, so a run stopped partway (Ctrl-C, a crash) keeps them:
`--resummarize` builds summary.json from what is there, and the same command with `--resume` finishes the run,
skipping finished answers. A folder that holds a run is never written over silently: `--out` on it needs
`--resume` or `--overwrite`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from analysis import metrics
from analysis.bench_drafters import (  # noqa: F401 - checkpoint_label, parse_label: re-exported for callers
    build_drafters,
    checkpoint_label,
    fix_tree,
    parse_drafter_specs,
    parse_label,
    resolve_drafter,
)
from analysis.bench_summary import (
    RUN_FILE,
    floor_table,
    records_from_traces,
    resummarize,
    tree_of,
    write_run,
    write_summary,
)
from analysis.traces import TraceWriter, compact_trace
from core.decoding import generate
from core.drafters.base import Drafter
from core.drafters.checkpoint import json_kind
from core.methods import BASELINE
from core.static_pass import PASS_MODES
from core.target import Target, add_dtype_argument
from core.verify import SamplingConfig

WARMUP_TOKENS = 16


# ----- questions ---------------------------------------------------------------------------------
def load_questions(path: str | Path, limit: int | None = None, per_category: int | None = None,
                   categories: Sequence[str] | None = None) -> list[dict]:
    """Questions of a Spec-Bench file, in file order: optionally some categories, K per category, first K."""
    out: list[dict] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not JSON ({err.msg}); a Spec-Bench question.jsonl has one JSON "
                                 f"object a line") from None
            if not isinstance(q, dict):
                raise ValueError(f"{path}:{n}: expected one JSON object a line (Spec-Bench question.jsonl), got "
                                 f"{json_kind(q)}")
            turns = q.get("turns")
            if "question_id" not in q or not isinstance(turns, list) or not turns or \
                    not all(isinstance(t, str) for t in turns):
                raise ValueError(f"{path}:{n}: a Spec-Bench question needs 'question_id' and 'turns' (a list of "
                                 f"strings)")
            q.setdefault("category", "default")
            if categories and q["category"] not in categories:
                continue
            if per_category is not None and seen.get(q["category"], 0) >= per_category:
                continue
            seen[q["category"]] = seen.get(q["category"], 0) + 1
            out.append(q)
    if limit is not None:
        out = out[:limit]
    if not out:
        raise ValueError(f"no questions selected from {path}")
    return out


# ----- running -----------------------------------------------------------------------------------
def _seed(question_id, turn: int, base: int) -> int:
    return (base * 1_000_003 + zlib.crc32(f"{question_id}:{turn}".encode())) % 2**31


def model_name(target: Target) -> str:
    name = Path(target.source).name
    return name[:-5] if name.endswith(".gguf") else name


@torch.no_grad()
def run_benchmark(
    target: Target,
    drafters: Mapping[str, Drafter],
    questions: Sequence[dict],
    out_dir: str | Path,
    *,
    max_new_tokens: int = 128,
    sampling: SamplingConfig | None = None,
    chat_ids: Callable[[list[dict]], list[int]] | None = None,
    decode: Callable[[list[int]], str] | None = None,
    record: bool = True,
    warmup: bool = True,
    progress: bool = True,
    model_id: str | None = None,
    meta: dict | None = None,
    stop_tokens: set[int] | None = None,
    report: bool = True,
    plotlyjs: str = "cdn",
    floor: bool = True,
    resume: bool = False,
) -> dict:
    """Run every drafter (label -> Drafter, `ar` among them for speedups) on the questions; write the files.

    chat_ids(messages) -> prompt ids and decode(ids) -> text default to the target's
    chat template and tokenizer; tests pass their own for targets without one.
    floor: also report this machine's bare-matmul floor and cost curve (core.trees.cost_curve; both cached per
    machine, the tiny test target uses the fixed cost model) and, per method, the speedup as a share of the
    ideal one (analysis.metrics).
    resume: continue the run in out_dir (its run.json, answer files and traces), skipping the finished
    (method, question) pairs; the machine's floor and cost curve are the ones that run measured.
    Returns the summary dict (also written to out_dir/summary.json).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chat_ids = chat_ids or target.chat_ids
    decode = decode or target.decode
    sampling = sampling or SamplingConfig()
    labels = list(drafters)
    model_id = model_id or model_name(target)
    # Token texts for the failure analysis keep special tokens visible ("<|im_end|>", not "").
    token_decode = decode
    if target.tokenizer is not None and decode == target.decode:
        def token_decode(ids: list[int]) -> str:
            return target.tokenizer.decode(list(ids), skip_special_tokens=False)

    config = {
        "model_id": model_id, "target": target.describe(), "dtype": str(target.dtype).replace("torch.", ""),
        "device": str(target.device), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "max_new_tokens": max_new_tokens, "temperature": sampling.temperature, "top_p": sampling.top_p,
        "questions": len(questions), "methods": labels, "baseline": BASELINE,
        "record": record, "warmup": warmup, "started": time.time(),
        **(meta or {}),
    }
    done: set[tuple[str, object]] = set()
    records: list[dict] = []
    if resume:
        earlier = json.loads((out / RUN_FILE).read_text(encoding="utf-8"))["config"]
        config["started"] = earlier["started"]
        config.update({k: earlier[k] for k in ("floor_ms", "cost_curve", "trees_at_start") if k in earlier})
        records = records_from_traces(out, labels, {q["question_id"]: len(q["turns"]) for q in questions})
        done = {(r["method"], r["question_id"]) for r in records}
    else:
        for stale in [*out.glob("*.jsonl"), *out.glob("traces/*.jsonl.gz"), out / "summary.json", out / "report.html"]:
            stale.unlink(missing_ok=True)  # main() refuses a used folder without --overwrite
    write_run(out, config, questions)

    if warmup:
        first = [{"role": "user", "content": questions[0]["turns"][0]}]
        for label in labels:
            generate(target, drafters[label], chat_ids(first), min(WARMUP_TOKENS, max_new_tokens), sampling,
                     stop_tokens=stop_tokens)

    curve, floor_ms = None, None
    if resume and "cost_curve" in config:
        curve, floor_ms = config["cost_curve"], config["floor_ms"]
    elif floor:  # after the warm-up, before the timed runs
        from core.trees import cost_curve

        curve = cost_curve.curve_for(target)
        floor_ms = cost_curve.matmul_floor_ms(target)
        config["floor_ms"] = round(floor_ms, 6)
        config["cost_curve"] = {k: curve.get(k) for k in ("key", "sizes", "ms", "context")}
    config.setdefault("trees_at_start", {label: tree_of(drafters[label]) for label in labels})
    write_run(out, config, questions)  # auto trees calibrate as they run: their start is kept
    answer_files = {label: open(out / f"{label}.jsonl", "a" if resume else "w", encoding="utf-8")
                    for label in labels}
    traces = TraceWriter(out / "traces", append=resume) if record else None
    total = len(labels) * sum(len(q["turns"]) for q in questions)
    bar = tqdm(total=total, desc="bench", unit="gen", file=sys.stderr, disable=not progress)
    bar.update(sum(len(q["turns"]) for q in questions for label in labels if (label, q["question_id"]) in done))
    try:
        for qi, q in enumerate(questions):
            order = labels[qi % len(labels):] + labels[:qi % len(labels)]
            for label in order:
                if (label, q["question_id"]) in done:
                    continue
                bar.set_postfix_str(f"q{q['question_id']} {label}")
                messages: list[dict] = []
                texts, turn_results, turn_stats, token_ids = [], [], [], []
                for ti, turn in enumerate(q["turns"]):
                    messages.append({"role": "user", "content": turn})
                    cfg = sampling if sampling.greedy else SamplingConfig(
                        sampling.temperature, sampling.top_p, _seed(q["question_id"], ti, sampling.seed or 0))
                    result = generate(target, drafters[label], chat_ids(messages), max_new_tokens, cfg,
                                      record=record, stop_tokens=stop_tokens)
                    text = decode(result.token_ids)
                    messages.append({"role": "assistant", "content": text})
                    trace = result.trace()
                    texts.append(text)
                    turn_results.append(metrics.turn_result(trace))
                    turn_stats.append(metrics.turn_stats(trace))
                    token_ids.append(list(result.token_ids))
                    if traces is not None:
                        trace["text"] = text
                        traces.write(label, {"method": label, "question_id": q["question_id"],
                                             "category": q["category"], "turn": ti,
                                             "wall_time_measured": round(result.wall_time, 6),
                                             **compact_trace(trace, token_decode)})
                    bar.update(1)
                rec = metrics.answer_record(q, f"{model_id}-{label}", texts, turn_results)
                answer_files[label].write(json.dumps(rec, ensure_ascii=False) + "\n")
                answer_files[label].flush()
                records.append({"method": label, "question_id": q["question_id"], "category": q["category"],
                                "turn_stats": turn_stats, "token_ids": token_ids})
    finally:
        bar.close()
        for f in answer_files.values():
            f.close()
        if traces is not None:
            traces.close()

    config["seconds"] = round(time.time() - config["started"], 1)
    config["trees"] = {label: tree_of(drafters[label]) for label in labels}
    categories = list(dict.fromkeys(q["category"] for q in questions))
    return write_summary(out, config, categories, records, report=report, plotlyjs=plotlyjs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m analysis.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", help="Spec-Bench question.jsonl")
    p.add_argument("--methods", default="ar,pld", help="comma-separated method labels (ar is always added)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", default="0", help="base seed of the per-question sampling seeds (a whole number)")
    add_dtype_argument(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--limit", type=int, default=None, help="first K questions only")
    p.add_argument("--per-category", type=int, default=None, help="at most K questions per category")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--drafter", action="append", default=[],
                   help="'random' (every trained drafter untrained), or METHOD=PATH / METHOD=random; repeatable")
    p.add_argument("--drafter-dir", default=None, help="folder holding <method>/ checkpoints (tried first)")
    p.add_argument("--trees", choices=["auto", "fixed"], default="auto",
                   help="auto: each drafter's tree sized for this machine (the default everywhere); fixed: the "
                        "tree stored in each checkpoint, the same for every dynamic-tree method (compare tau)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--passes", choices=PASS_MODES, default="auto",
                   help="how verify passes and drafting levels run (core.static_pass): auto = captured CUDA graphs on a "
                        "GPU, eager on a CPU; eager; static (fixed buffers, no capture); captured (CUDA only)")
    p.add_argument("--no-record", action="store_true", help="skip step traces (no failure analysis)")
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--model-id", default=None, help="model_id prefix in the answer files")
    p.add_argument("--plotlyjs", choices=["cdn", "inline"], default="cdn",
                   help="report.html loads plotly.js from its CDN (small file) or embeds it (works offline)")
    p.add_argument("--out", help="output folder (one that holds a run needs --resume or --overwrite)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="finish the run in --out (same command), skipping the answers it has")
    again.add_argument("--overwrite", action="store_true", help="clear the run in --out first")
    p.add_argument("--readme-table", metavar="SUMMARY_JSON", default=None,
                   help="print a markdown table of an existing summary.json and exit")
    p.add_argument("--resummarize", metavar="FOLDER", default=None,
                   help="recompute FOLDER/summary.json from its traces with the current metrics, print its "
                        "tables and exit (no decoding)")
    args = p.parse_args(argv)
    if args.readme_table is None and args.resummarize is None and (not args.questions or not args.out):
        p.error("--questions and --out are required")
    return args


def check_args(args: argparse.Namespace, labels: Sequence[str], specs: Mapping[str, str]) -> None:
    """What the user typed, checked before the target loads (ValueError: one line naming the bad value)."""
    from core import cli_checks as checks
    from core.methods import check_method

    if not Path(args.questions).is_file():
        raise checks.UsageError(f"--questions {args.questions}: no such file (give a Spec-Bench question.jsonl)")
    checks.check_max_new_tokens(args.max_new_tokens)
    for flag, value in (("--limit", args.limit), ("--per-category", args.per_category), ("--threads", args.threads)):
        if value is not None:
            checks.check_int_range(value, flag, 1)
    checks.check_device(args.device)
    checks.check_passes(args.passes, args.device)
    checks.check_target(args.target)
    if args.drafter_dir is not None and not Path(args.drafter_dir).is_dir():
        raise checks.UsageError(f"--drafter-dir {args.drafter_dir}: no such folder")
    for label in labels:
        spec = resolve_drafter(label, specs, args.drafter_dir)
        checks.check_drafter_folder(spec, f"--drafter (for {label})")
        check_method(label, spec)
    checks.check_output_dir(args.out, "--out")
    check_run_folder(Path(args.out), args.resume, args.overwrite)


def check_run_folder(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to write over a run silently: a folder holding one needs --resume (whose run.json must exist) or
    --overwrite; --resume on a folder without a run is refused too."""
    from core import cli_checks as checks

    answers = list(out.glob("*.jsonl"))
    held = [n for n in (RUN_FILE, "summary.json") if (out / n).is_file()] + ([f"{len(answers)} answer file(s)"]
                                                                             if answers else [])
    if resume:
        if not (out / RUN_FILE).is_file():
            raise checks.UsageError(f"--resume: {out} holds no run to finish (no {RUN_FILE}); drop --resume")
        summary = out / "summary.json"
        if summary.is_file() and "answers" not in json.loads(summary.read_text(encoding="utf-8")):
            raise checks.UsageError(f"--resume: the run in {out} is finished (summary.json); use --overwrite to "
                                    f"run it again")
    elif held and not overwrite:
        raise checks.UsageError(f"--out {out} already holds a run ({', '.join(held)}): add --resume to finish it "
                                f"or --overwrite to replace it, or choose another folder")


def check_context(target: Target, questions: Sequence[dict], max_new_tokens: int, where: str) -> None:
    """Every question fits the target's positions: its user turns through the chat template plus max_new_tokens
    an answer (ValueError naming the question, before any answer is generated)."""
    for q in questions:
        messages = [m for turn in q["turns"] for m in ({"role": "user", "content": turn},
                                                        {"role": "assistant", "content": ""})]
        need = len(target.chat_ids(messages[:-1])) + max_new_tokens * len(q["turns"])
        if need > target.max_positions:
            raise ValueError(f"{where}: question {q['question_id']} needs about {need} positions ({len(q['turns'])} "
                             f"turn(s) + {max_new_tokens} new tokens each), over the target's {target.max_positions};"
                             f" shorten it or lower --max-new-tokens")


def check_resume(out: Path, meta: dict, labels: Sequence[str], questions: Sequence[dict],
                 args: argparse.Namespace) -> None:
    """--resume continues only the same run: the settings that shape its figures must match run.json."""
    earlier = json.loads((out / RUN_FILE).read_text(encoding="utf-8"))
    cfg = earlier["config"]
    now = {"methods": list(labels), "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
           "top_p": args.top_p, "questions_file": str(args.questions), "tree_mode": args.trees,
           "question_ids": [q["question_id"] for q in questions], "record": not args.no_record}
    then = {**{k: cfg.get(k) for k in now}, "question_ids": earlier.get("question_ids")}
    differ = [f"{k} {then[k]!r} then, {now[k]!r} now" for k in now if then[k] != now[k]]
    if differ:
        raise ValueError(f"--resume: the run in {out} was made with other settings: {'; '.join(differ)[:300]}")
    if not now["record"]:
        raise ValueError("--resume needs the run's traces; a --no-record run cannot be resumed (use --overwrite)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.resummarize:
        from analysis.report import readme_table

        try:
            summary = resummarize(args.resummarize)
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            print(f"error: --resummarize {args.resummarize}: {getattr(err, 'strerror', None) or err}",
                  file=sys.stderr)
            return 2
        if "answers" in summary:
            print(f"partial run: summarised {summary['answers']['found']} of {summary['answers']['planned']} "
                  f"answers (finish it with the same command and --resume)", file=sys.stderr)
        print(readme_table(summary))
        print()
        print(floor_table(summary))
        return 0
    if args.readme_table:
        from analysis.report import readme_table

        try:
            with open(args.readme_table, encoding="utf-8") as f:
                summary = json.load(f)
            if not isinstance(summary, dict) or not isinstance(summary.get("methods"), dict):
                raise ValueError(f"not a benchmark summary.json (it holds {json_kind(summary)} without 'methods')")
            table = readme_table(summary)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            print(f"error: --readme-table {args.readme_table}: {getattr(err, 'strerror', None) or err}",
                  file=sys.stderr)
            return 2
        print(table)
        return 0
    from core import cli_checks as checks

    try:
        given = [m.strip() for m in args.methods.split(",") if m.strip()]
        labels = [BASELINE] + [m for m in dict.fromkeys(given) if m != BASELINE]
        args.seed = checks.check_seed(args.seed)
        sampling = SamplingConfig(args.temperature, args.top_p, args.seed)
        specs = parse_drafter_specs(args.drafter)
        check_args(args, labels, specs)
        if BASELINE not in given:
            print(f"adding {BASELINE!r}: speedups are measured against it", file=sys.stderr)
        questions = load_questions(args.questions, args.limit, args.per_category,
                                   args.categories.split(",") if args.categories else None)
        for q in questions:
            for ti, turn in enumerate(q["turns"]):
                checks.check_text(turn, f"{args.questions}: question {q['question_id']} turn {ti + 1}")
        if args.threads:
            torch.set_num_threads(args.threads)
        print(f"loading target ({args.dtype})...", file=sys.stderr)
        target = checks.load_target_cleanly(args.target, args.dtype, args.device)
        target.pass_mode = args.passes
        check_context(target, questions, args.max_new_tokens, args.questions)
        drafters, sources = build_drafters(target, labels, specs, args.drafter_dir)
        if args.trees == "fixed":
            for d in drafters.values():
                fix_tree(d)
    except (ValueError, FileNotFoundError, KeyError) as err:
        return checks.report(err)
    except OSError as err:  # the questions file cannot be read
        return checks.report(f"{err.filename or args.questions}: {err.strerror or err}")
    meta = {"questions_file": str(args.questions), "drafters": sources, "tree_mode": args.trees,
            "passes": checks.check_passes(args.passes, args.device),
            "command": "python -m analysis.bench " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))}
    if args.resume:
        try:
            check_resume(Path(args.out), meta, labels, questions, args)
        except ValueError as err:
            return checks.report(err)
    summary = run_benchmark(target, drafters, questions, args.out, max_new_tokens=args.max_new_tokens,
                            sampling=sampling, record=not args.no_record, warmup=not args.no_warmup,
                            model_id=args.model_id, meta=meta, plotlyjs=args.plotlyjs, resume=args.resume)
    from analysis.report import readme_table

    print(readme_table(summary))
    print()
    print(floor_table(summary))
    print(f"wrote {args.out}/summary.json, report.html and one answer file per method", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
