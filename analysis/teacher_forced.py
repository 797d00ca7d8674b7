"""Teacher-forced accuracy on the evaluation conversations: where the held-out-to-benchmark gap comes from.

A drafter's model card gives its top-1 accuracy on the *held-out split of the training
data*; the benchmark measures acceptance on the *evaluation prompts*. When the two
disagree, is the drafter weaker on those prompts, or does decoding itself lose
something? This analysis separates the two. It rebuilds every evaluation turn with the
answer plain greedy decoding gave (`ar.jsonl` of a benchmark folder, so the text is
exactly what greedy speculative decoding must reproduce), runs each drafter's
`training_loss` on it teacher-forced, as the trainer's held-out evaluation does, and
reports, per drafter and per category:

* `acc@1`: top-1 accuracy of the first draft position, on every answer token;
* `top{w}@1` (Medusa, Amphista): the first position's top-w accuracy, w = the number of
  depth-1 nodes of the drafter's static tree: the chance the tree's first level holds
  the target's token;
* the same on the held-out split (`--heldout`), and the benchmark's decoding-time
  acceptance at depth 1 (`acceptance_by_position[0]` of summary.json).

Teacher-forced accuracy counts every token once; decoding acceptance counts each
verification cycle once, and easy stretches (long accepts) hold few cycles while hard
ones hold many, so the decoding figure sits below the teacher-forced one even for the
same text. The held-out-to-evaluation gap, by category, is the distribution shift.

    python -m analysis.teacher_forced --results assets/results --out assets/results/teacher_forced.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from core.methods import shipped_names
from core.target import add_dtype_argument
from core.training.data import collate, make_sequences, target_batch
from core.training.prompts import read_questions
from core.training.specs import resolve_spec, union_needs

DEFAULT_DRAFTERS = tuple(shipped_names(trained=True))  # every shipped drafter (moa-tliN as found on disk)
MAX_LEN = 512


def eval_records(questions: Sequence[dict], ar_rows: Sequence[dict], chat_ids: Callable[[list[dict]], list[int]],
                 encode: Callable[[str], list[int]]) -> list[dict]:
    """One record per evaluation turn: {prompt_ids, answer_ids, category}; the history holds the earlier
    turns and plain decoding's answers to them, as analysis.bench built it."""
    by_id = {q["question_id"]: q for q in questions}
    out = []
    for row in ar_rows:
        q = by_id.get(row["question_id"])
        if q is None:
            raise ValueError(f"question {row['question_id']} of the results is not in the questions file")
        messages: list[dict] = []
        for turn, answer in zip(q["turns"], row["choices"][0]["turns"]):
            messages.append({"role": "user", "content": turn})
            out.append({"prompt_ids": chat_ids(messages), "answer_ids": encode(answer), "category": q["category"]})
            messages.append({"role": "assistant", "content": answer})
    return out


def tree_width(model) -> int | None:
    """Depth-1 nodes of a static tree (None for dynamic-tree drafters)."""
    paths = getattr(model.config, "tree_paths", None)
    return sum(1 for p in paths if len(p) == 1) if paths else None


@torch.no_grad()
def measure(target, models: dict[str, torch.nn.Module], records: Sequence[dict],
            progress: bool = True) -> dict[str, dict]:
    """Per drafter: {"overall": metrics, "by_category": {category: metrics}}, each metric a mean over
    answer tokens, plus "tokens". A bfloat16 target runs the drafters under bfloat16 autocast, as training did."""
    seqs = make_sequences(list(records), MAX_LEN)
    kept = [r for r in records if r["answer_ids"]]  # make_sequences skips empty answers, in order
    needs = union_needs(list(models.values()))
    sums: dict[str, dict[str, defaultdict]] = {n: {} for n in models}
    use_autocast = target.dtype == torch.bfloat16
    for i in tqdm(range(len(seqs)), desc="teacher-forced", disable=not progress):
        ids, loss_mask, attn = collate(seqs, [i], target.device)
        batch = target_batch(target, needs, ids, loss_mask, attn)
        weight = float(loss_mask.sum())
        for name, model in models.items():
            model.observe_batch(ids.unique())
            with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=use_autocast):
                _, metrics = model.training_loss(batch, 1.0)
            for group in ("overall", kept[i]["category"]):
                acc = sums[name].setdefault(group, defaultdict(float))
                acc["tokens"] += weight
                for k, v in metrics.items():
                    if k.startswith(("acc@", "top")):
                        acc[k] += v * weight
    out = {}
    for name, groups in sums.items():
        def means(acc: dict) -> dict:
            return {"tokens": int(acc["tokens"]),
                    **{k: round(v / acc["tokens"], 4) for k, v in sorted(acc.items()) if k != "tokens"}}
        out[name] = {"overall": means(groups.get("overall", {"tokens": 0.0})),
                     "by_category": {c: means(a) for c, a in sorted(groups.items()) if c != "overall"}}
    return out


def _first_position(metrics: dict, width: int | None) -> tuple[float | None, float | None]:
    top = metrics.get(f"top{width}@1") if width else None
    return metrics.get("acc@1"), top


def analyze(results: str | Path, drafters: Sequence[str], heldout: str | None, heldout_records: int,
            folder: str | Path | None = None, progress: bool = True, dtype: str | None = None) -> dict:
    """dtype: the target's (default: the benchmark's own, from its summary.json)."""
    from core.target import load_target
    from core.training.data import load_records

    results = Path(results)
    for needed in ("summary.json", "ar.jsonl"):
        if not (results / needed).exists():
            raise FileNotFoundError(f"{results} is not a benchmark folder with plain decoding in it (no {needed}); "
                                    "run analysis.bench with the ar method first")
    summary = json.loads((results / "summary.json").read_text())
    questions = read_questions(summary["config"]["questions_file"])
    ar_rows = [json.loads(line) for line in (results / "ar.jsonl").read_text().splitlines() if line.strip()]
    target = load_target(dtype=dtype or summary["config"].get("dtype", "bfloat16"))
    root = Path(folder) if folder else Path(__file__).resolve().parents[1] / "assets" / "drafters"
    models = {}
    for name in drafters:
        path = root / name
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"no drafter checkpoint at {path}")
        models[name] = resolve_spec(name).cls.from_pretrained(path, target).eval()
    records = eval_records(questions, ar_rows, target.chat_ids, target.encode)
    if heldout == "auto":  # the data the (first) drafter was trained on, as its card reports
        heldout = json.loads((root / drafters[0] / "config.json").read_text())["training"]["data"]["path"]
    result = {"results": str(results), "drafters_folder": str(root),
              "dtype": str(target.dtype).replace("torch.", ""), "eval": measure(target, models, records, progress)}
    if heldout:
        held = [r for r in load_records(heldout) if r["split"] == "heldout"][:heldout_records]
        result["heldout"] = {"data": heldout, "records": len(held), "drafters": measure(target, models, held, progress)}
    result["decoding_acc1"] = {n: (summary["methods"].get(n, {}).get("overall", {}).get("acceptance_by_position")
                                   or [None])[0] for n in drafters}
    result["tree_width"] = {n: tree_width(m) for n, m in models.items()}
    return result


def table(result: dict) -> str:
    rows = ["| drafter | held-out acc@1 | eval acc@1 | held-out top-w@1 | eval top-w@1 (w) | decoding acc@1 |",
            "|---|---|---|---|---|---|"]

    def f(x):
        return "–" if x is None else f"{x:.3f}"

    for name, ev in result["eval"].items():
        w = result["tree_width"].get(name)
        e1, ew = _first_position(ev["overall"], w)
        h1 = hw = None
        if "heldout" in result:
            h1, hw = _first_position(result["heldout"]["drafters"][name]["overall"], w)
        rows.append(f"| {name} | {f(h1)} | {f(e1)} | {f(hw)} | {f(ew)}{f' ({w})' if w else ''} | "
                    f"{f(result['decoding_acc1'].get(name))} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.teacher_forced", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="assets/results", help="a benchmark folder (summary.json, ar.jsonl)")
    p.add_argument("--drafters", default=",".join(DEFAULT_DRAFTERS))
    p.add_argument("--folder", default=None, help="where the drafter checkpoints are (default assets/drafters)")
    p.add_argument("--heldout", default="auto", help="distillation data whose held-out split to measure too "
                   "(auto: the data the drafters were trained on, from their config.json; '' to skip)")
    p.add_argument("--heldout-records", type=int, default=120)
    p.add_argument("--threads", type=int, default=2)
    add_dtype_argument(p, default=None, help="target dtype (default: the benchmark's)")
    p.add_argument("--out", default=None, help="write the result as JSON here (and a .md table beside it)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        result = analyze(args.results, args.drafters.split(","), args.heldout or None, args.heldout_records,
                         args.folder, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis.teacher_forced: {e}", file=sys.stderr)
        return 2
    text = table(result)
    print(text)
    for name, ev in result["eval"].items():
        w = result["tree_width"].get(name)
        key = f"top{w}@1" if w else "acc@1"
        cats = ", ".join(f"{c} {m[key]:.2f}" for c, m in ev["by_category"].items())
        print(f"{name} by category ({'top-' + str(w) if w else 'acc'}@1): {cats}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
