"""Shipped lessons: finished generations committed under assets/lessons/, replayable without a model.

A lesson is one recorded generation (every verification cycle: draft tree, the target's probabilities, accepted
path, bonus token; MoA's layer self-attention map per cycle) plus the text of every token it mentions, so the
app can show it, and replay it cycle by cycle, before the target has loaded. The page opens on one.

    python -m demo.lessons --method moa --tli 1 --prompt "Summarise: ..." --out assets/lessons/moa-summary.json

Format ("speclens-lesson/1"): {"format", "title", "prompt", "method", "tli", "label", "note", "target", "dtype",
"greedy", "token_ids", "pieces", "text", "wall_time", "stop_reason", "token_text": {id: text}, "events": [...]}.
Events are `StepEvent.to_dict()` made smaller: the target's top-k kept to 3 per row, `depths` dropped, and
MoA's per-token LSA maps averaged into one map per cycle (3 decimals).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from analysis.traces import token_text_decoder, trace_token_ids
from demo.render import generation_stats, tokens_from_events

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "assets" / "lessons"
FORMAT = "speclens-lesson/1"
TOP_KEPT = 3
DEFAULT_PROMPT = ("Summarise in two sentences: The lighthouse on Skerry Point was built in 1871 to guard ships "
                  "entering the harbour. Its keeper lived in a small stone cottage beside the tower and lit the "
                  "lamp every evening for forty years. In 1962 the light was automated, and the cottage became a "
                  "small museum about the lives of lighthouse keepers.")


def compact_lesson_event(event: dict) -> dict:
    """A recorded event made small enough to commit (see the module docstring)."""
    ev = {k: v for k, v in event.items() if k not in ("extras", "depths", "row_entropy")}
    if "row_top" in ev:
        ev["row_top"] = [row[:TOP_KEPT] for row in ev["row_top"]]
    ex = event.get("extras") or {}
    if ex.get("lsa_attention") is not None:
        a = np.asarray(ex["lsa_attention"], dtype=np.float64)
        if a.ndim == 4:
            a = a.mean(axis=1)
        if a.ndim == 3:
            a = a.mean(axis=0)
        ev["extras"] = {"lsa_attention": np.round(a, 3).tolist(), "lsa_tokens": list(ex.get("lsa_tokens") or [])}
    return ev


def lesson_from_run(run: dict, decode: Callable[[list[int]], str], title: str, prompt: str) -> dict:
    """A lesson dict from a finished app run (demo.runtime.Runtime.stream's record)."""
    events = [compact_lesson_event(e) for e in run["events"]]
    ids = trace_token_ids({"events": events})
    for e in events:
        ids.update(int(t) for t in (e.get("extras") or {}).get("lsa_tokens") or [])
    return {"format": FORMAT, "title": title, "prompt": prompt,
            **{k: run.get(k) for k in ("method", "tli", "label", "note", "target", "dtype", "greedy", "token_ids",
                                       "pieces", "text", "wall_time", "stop_reason")},
            "token_text": {str(t): decode([t]) for t in sorted(ids)}, "events": events}


def as_run(lesson: dict, source: str = "") -> dict:
    """A lesson in the shape of an app run, so every tab can show it (marked `example`)."""
    events = lesson["events"]
    tokens = tokens_from_events(events)
    return {**lesson, "events": events, "tokens": tokens, "pieces": list(lesson["pieces"]),
            "token_ids": list(lesson["token_ids"]), "done": True, "example": True, "source": source,
            "stats": generation_stats(events, float(lesson.get("wall_time") or 0.0)),
            "label": f"{lesson.get('label') or lesson.get('method')} (lesson: {lesson.get('title', '')})"}


def lesson_files(folder: Path = LESSONS) -> list[Path]:
    return sorted(Path(folder).glob("*.json"))


def load_lesson(path: str | Path) -> dict:
    """One lesson file as a run dict; ValueError naming the file when it is not a lesson."""
    path = Path(path)
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a SpecLens lesson (format {FORMAT!r} expected)")
    return as_run(data, source=str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))


def load_lessons(folder: Path = LESSONS) -> list[dict]:
    """Every shipped lesson, as run dicts (sorted by file name)."""
    return [load_lesson(p) for p in lesson_files(folder)]


def decoder(run: dict, fallback: Callable[[list[int]], str] | None = None) -> Callable[[list[int]], str]:
    """Decode with the run's own token_text table (lessons carry one), else `fallback`, else "<id>"."""
    dec = token_text_decoder(run, fallback) if run.get("token_text") is not None else fallback
    return dec or (lambda ids: "".join(f"<{int(i)}>" for i in ids))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Record one generation as a lesson for the app's step-by-step player.")
    p.add_argument("--method", default="moa")
    p.add_argument("--tli", type=int, default=1, choices=(0, 1, 3))
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--title", default="summarising a short text with MoA")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", default=str(LESSONS / "moa-summary.json"))
    args = p.parse_args(argv)
    from demo.runtime import METHOD_LABELS, Runtime, UserError

    if args.method not in METHOD_LABELS:
        print(f"unknown method {args.method!r}; choose one of {', '.join(METHOD_LABELS)}", file=sys.stderr)
        return 2
    if not 1 <= args.max_new_tokens <= 512:
        print(f"--max-new-tokens must be between 1 and 512, got {args.max_new_tokens}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rt = Runtime(reference_tokens=0)
    try:
        ids = rt.prompt_ids(args.prompt)
        run = rt.generate(args.method, ids, args.max_new_tokens, tli=args.tli if args.method == "moa" else None)
    except UserError as err:
        print(str(err), file=sys.stderr)
        return 2
    lesson = lesson_from_run(run, rt.decode, args.title, args.prompt)
    out.write_text(json.dumps(lesson, separators=(",", ":")))
    st = run["stats"]
    print(f"{out}: {st['new_tokens']} tokens in {st['steps']} passes (tau {st['tau']:.2f}), "
          f"{out.stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
