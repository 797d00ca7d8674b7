"""Does MoA draft online what it was trained to predict? Teacher-forced against online, at the same positions.

For every answer of the committed benchmark that a MoA drafter decoded exactly as plain decoding did (turn 0),
this runs the drafter's training forward pass (core.drafters.moa, `train_forward`) over prompt + answer with every
position verified, so that each prediction sits at distance 1 from the last verified token. It then compares,
at exactly the positions where an online cycle started (its root), the teacher-forced top-1 with the online
drafter's top-1 (the traces' `draft_top` rows), both against the token the target emitted. Equal rates mean
the inference path computes what training taught; a gap would point at a defect in state, positions or roots.
It also prints the teacher-forced rate over every answer position, which is higher: a cycle's root follows a
rejected guess, so roots are harder positions than average.

    python scripts/check_moa_roots.py [moa | moa-tli1 | moa-tli3] [--results assets/results]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.traces import read_traces  # noqa: E402  (after the path insert, like the other scripts)
from core.methods import shipped_folder, shipped_names  # noqa: E402


def load_traces(folder: Path, method: str) -> dict[tuple, dict]:
    """(question_id, turn) -> the benchmark's trace of that answer."""
    return {(t["question_id"], t["turn"]): t for t in read_traces(folder / "traces" / f"{method}.jsonl.gz")}


def compare(method: str, folder: Path, limit: int | None = None) -> dict:
    """The comparison on the answers of `folder` (an analysis.bench output) that `method` decoded exactly as
    plain decoding did (turn 0; the first `limit` of them). Returns cycles, the teacher-forced and online top-1
    rates at their roots, how often the two top-1 tokens are the same token, and the teacher-forced rate over
    every answer position."""
    import torch

    from analysis.bench import load_questions
    from core.client_server.models import make_drafter, make_target
    from core.training.data import target_batch

    target = make_target("smollm2", "bfloat16")
    drafter, _ = make_drafter(method, target, str(shipped_folder(method)), {})
    questions = {q["question_id"]: q for q in load_questions(ROOT / "assets" / "prompts" / "speclens_eval.jsonl")}
    plain, drafted = load_traces(folder, "ar"), load_traces(folder, method)
    keys = [k for k, t in drafted.items() if k[1] == 0 and k in plain and t["token_ids"] == plain[k]["token_ids"]]
    counts = {"cycles": 0, "teacher_forced": 0, "online": 0, "same_top1": 0, "positions": 0, "right": 0}
    for key in keys[:limit]:
        trace = drafted[key]
        prompt = list(target.chat_ids(questions[key[0]]["turns"][0]))
        ids = torch.tensor([prompt + trace["token_ids"]])
        answer = torch.zeros(ids.shape, dtype=torch.float)
        answer[:, len(prompt):-1] = 1  # the last prediction lies past the answer
        with torch.no_grad():
            batch = target_batch(target, drafter.train_needs, ids, answer, torch.ones_like(answer))
            last = drafter.last_verified(batch, period=torch.ones(1, dtype=torch.long))  # all verified: distance 1
            _, final = drafter.train_forward(batch, last, 1.0)
            predicted = drafter.vocab.to_token_ids(drafter.vocab.logits(final.to(target.dtype)).argmax(-1))[0]
            emitted = batch.greedy_next()[0]
        right = predicted == emitted
        counts["right"] += int(right[answer[0].bool()].sum())
        counts["positions"] += int(answer.sum())
        previous_bonus = None
        for event in trace["events"]:
            rows = (event.get("extras") or {}).get("draft_top")
            root = event["position"]
            if rows and rows[0] and previous_bonus is not None and root < ids.shape[1] - 1:
                if int(ids[0, root]) != previous_bonus:
                    raise RuntimeError(f"question {key[0]}: the trace's root at {root} is not the previous bonus token")
                online_top = rows[0][0][0]
                counts["cycles"] += 1
                counts["online"] += online_top == event["new_tokens"][0]
                counts["teacher_forced"] += bool(right[root])
                counts["same_top1"] += online_top == int(predicted[root])
            previous_bonus = event["bonus"]
    n = max(1, counts["cycles"])
    return {"answers": len(keys[:limit]), "cycles": counts["cycles"], "teacher_forced": counts["teacher_forced"] / n,
            "online": counts["online"] / n, "same_top1": counts["same_top1"] / n,
            "teacher_forced_everywhere": counts["right"] / max(1, counts["positions"]),
            "positions": counts["positions"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/check_moa_roots.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("method", nargs="?", default=shipped_names(tli=True)[0], choices=shipped_names(tli=True))
    p.add_argument("--results", default=str(ROOT / "assets" / "results"), help="a benchmark folder with traces/")
    args = p.parse_args(argv)
    folder = Path(args.results)
    if not (folder / "traces" / f"{args.method}.jsonl.gz").exists() or not (folder / "traces" / "ar.jsonl.gz").exists():
        print(f"error: --results {folder} has no traces/{args.method}.jsonl.gz and traces/ar.jsonl.gz "
              f"(an analysis.bench output folder with both methods)", file=sys.stderr)
        return 2
    r = compare(args.method, folder)
    if not r["cycles"]:
        print("no answer was decoded exactly as plain decoding did; nothing to compare")
        return 1
    print(f"{args.method}: {r['cycles']} cycles of {r['answers']} answers identical to plain decoding; top-1 at "
          f"their roots: teacher-forced {r['teacher_forced']:.3f}, online {r['online']:.3f}, the same token "
          f"{r['same_top1']:.3f}; teacher-forced over every answer position: {r['teacher_forced_everywhere']:.3f} "
          f"({r['positions']} positions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
