"""A benchmark run's files: run.json (its settings), summary.json and report.html from the per-question records,
the records again from the step traces (`--resummarize`, `--resume`), and the floor table printed after a run.

analysis.bench runs the methods and calls this; `write_summary` is the one place a run's figures are made.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from analysis import metrics
from core.drafters.base import Drafter
from core.methods import BASELINE

RUN_FILE = "run.json"  # a run's settings, written before its first answer (resume and resummarize read them)


def write_run(out: Path, config: dict, questions: Sequence[dict]) -> None:
    run = {"config": config, "categories": list(dict.fromkeys(q["category"] for q in questions)),
           "question_ids": [q["question_id"] for q in questions],
           "question_turns": [len(q["turns"]) for q in questions]}
    (out / RUN_FILE).write_text(json.dumps(run, indent=1), encoding="utf-8")


def write_summary(out: Path, config: dict, categories: list, records: list[dict], report: bool = True,
                  plotlyjs: str = "cdn", answers: dict | None = None) -> dict:
    """summary.json (and report.html) from the per-question records: the one place a run's figures are made.
    answers: {"found", "planned"} for a run stopped partway (--resume still finishes it)."""
    labels = list(config["methods"])
    per_method = metrics.summarize(records, baseline=BASELINE, curve=config.get("cost_curve"),
                                   floor_ms=config.get("floor_ms"))
    methods = {label: per_method[label] for label in labels if label in per_method}
    summary = {"config": config, "categories": categories, "methods": methods,
               "table": metrics.flat_rows(methods), "definitions": metrics.DEFINITIONS}
    if config.get("command"):
        summary["command"] = config["command"]
    if answers is not None:
        summary["answers"] = answers
    with open(out / "summary.json", "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    if report:
        from analysis.report import write_report

        write_report(summary, out / "report.html", plotlyjs=plotlyjs)
    return summary


def records_from_traces(folder: Path, labels: Sequence[str], turns_of: Mapping | None = None) -> list[dict]:
    """The per-question records (as run_benchmark keeps them) of every question whose turns all have traces
    (turns_of: question id -> its number of turns, where known; a question answered again after a stop keeps its
    last traces)."""
    from analysis.traces import read_traces

    by_turn: dict[tuple[str, object], dict[int, dict]] = {}
    for label in labels:
        path = folder / "traces" / f"{label}.jsonl.gz"
        if path.is_file():
            for tr in read_traces(path):
                by_turn.setdefault((label, tr["question_id"]), {})[tr["turn"]] = tr
    records = []
    for (label, qid), got in by_turn.items():
        trs = [got[t] for t in sorted(got)]
        wanted = (turns_of or {}).get(qid, len(trs))
        if sorted(got) != list(range(wanted)):
            continue  # a question stopped between its turns: --resume answers it again
        records.append({"method": label, "question_id": qid, "category": trs[0]["category"],
                        "turn_stats": [metrics.turn_stats(t) for t in trs],
                        "token_ids": [list(t["token_ids"]) for t in trs]})
    return records


def resummarize(folder: str | Path) -> dict:
    """Recompute a run's summary.json (per-method figures, table, definitions) from its traces/ with the current
    analysis.metrics, so that a changed definition applies to a committed run without decoding again: the timings
    are the ones measured then, the machine's floor and cost curve the ones stored in its config. A run stopped
    partway (no summary.json yet) is summarised from the answers it finished (its run.json gives the settings);
    `summary["answers"]` says how many of how many. Rewrites summary.json and report.html; returns the summary."""
    folder = Path(folder)
    if (folder / RUN_FILE).is_file():
        base = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
        if (folder / "summary.json").is_file():  # the config as the finished run completed it (its trees)
            base["config"] = json.loads((folder / "summary.json").read_text(encoding="utf-8"))["config"]
        planned = len(base["config"]["methods"]) * len(base["question_ids"])
        turns_of = dict(zip(base["question_ids"], base["question_turns"]))
    elif (folder / "summary.json").is_file():  # a run made before run.json existed: finished
        base = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        planned, turns_of = None, None
    else:
        raise FileNotFoundError(f"neither summary.json nor {RUN_FILE} there (not a benchmark run folder)")
    cfg = base.get("config", {})
    labels = list(cfg.get("methods") or base.get("methods", {}))
    if cfg.get("record") is False or not (folder / "traces").is_dir():
        raise FileNotFoundError("no traces/ there (the run was made with --no-record)")
    records = records_from_traces(folder, labels, turns_of)
    answers = None if planned is None or len(records) >= planned else {"found": len(records), "planned": planned}
    return write_summary(folder, cfg, base.get("categories", []), records, answers=answers)


def floor_table(summary: dict) -> str:
    """Markdown: per method the floor, the verify pass against it, the ideal speedup and the share of it
    reached, and drafting against the verify pass (analysis.metrics' definitions)."""
    cfg = summary.get("config", {})
    floor = cfg.get("floor_ms")
    lines = [f"bare-matmul floor on this machine: {floor} ms (one token through every weight matrix)"
             if floor is not None else "bare-matmul floor: not measured",
             "", "| method | tree | verify ms | x floor | draft ms | draft / verify | ideal speedup | "
                 "decoding speedup | share of ideal | speedup |", "|---|---|---|---|---|---|---|---|---|---|"]

    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    for method, res in summary.get("methods", {}).items():
        o = res["overall"]
        tree = (cfg.get("trees") or {}).get(method) or {}
        shape = f"d{tree['depth']}/n{tree['total_tokens']}{' auto' if tree.get('auto') else ''}" if tree else "-"
        ideal = o.get("ideal_speedup")
        lines.append(f"| {method} | {shape} | {f(o.get('verify_ms_per_cycle'))} | {f(o.get('verify_over_floor'))} | "
                     f"{f(o.get('draft_ms_per_cycle'))} | {f(o.get('draft_share'), '{:.0%}')} | {f(ideal)} | "
                     f"{f(o.get('decode_speedup'))} | {f(o.get('share_of_ideal'), '{:.0%}')} | {f(o.get('speedup'))} |")
    return "\n".join(lines)


def tree_of(drafter: Drafter) -> dict | None:
    """The tree a drafter ran with: auto (and the choice) or fixed, depth and size (None without a tree)."""
    inner = getattr(drafter, "inner", drafter)
    cfg = getattr(inner, "config", None)
    if cfg is None:
        return None
    choice = getattr(inner, "tree_choice", None) or {}
    if hasattr(cfg, "total_tokens"):
        depth, size = cfg.depth, cfg.total_tokens
    elif getattr(inner, "tree_paths", None):
        depth, size = max(len(p) for p in inner.tree_paths), len(inner.tree_paths)
    else:
        return None
    return {"auto": bool(getattr(inner, "tree_auto", False)), "depth": depth, "total_tokens": size,
            "expected_tau": choice.get("expected_tau"), "acceptance_source": choice.get("acceptance_source"),
            "calibration": choice.get("calibration"), "trial": choice.get("trial")}
