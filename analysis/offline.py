"""How much of MoA's offline text does the target confirm? Client-server runs with a dropped link.

    python -m analysis.offline --prompts 8 --preset 4g --drop 1.0:3.0 --out runs/offline
    python -m analysis.offline --drafter runs/x/moa/final --horizon 24 --dtype float32 --check
    python -m analysis.offline --min-confidence 0 0.1 0.2 0.3     # one run per cut-off, same prompts
    python -m analysis.offline --bound-from assets/results/moa/feature_gain/channels-moa.json

For each held-out evaluation question (the first turn of one question per category, in file
order) MoA decodes in the simulated client-server split (core.client_server.sim) on a link that
drops for the given window. While the link is down the client drafts a greedy chain on its own,
at most `horizon` tokens past the last verified one (default: the distance the drafter was
trained for, client.offline_horizon_for), and only while the drafter's own probability for the
whole provisional chain stays at or above --min-confidence (client.offline_confidence_for; several
values give one summary each, on the same prompts); when the link is back the target verifies that chain.
Per drop we count the offline tokens, the confirmed ones (the agreeing prefix), and whether the
first one was confirmed. Beside it, `online_top1` is the same drafter's top-1 accuracy at depth 1
in a plain single-process decode of the same prompt: the rate the first offline token should be
confirmed at, since offline drafting starts from exactly the state an online cycle would.

Timing follows the fixed `CostModel` (not this machine's clock), so a run is reproducible and the
number of offline tokens does not depend on the CPU. With --check the outputs are compared with
plain greedy decoding in the same dtype (equal in float32 by construction).

--bound-from runs no model: from a drafter's teacher-forced top-1 accuracy by distance (the JSON that
analysis.moa_channels writes), it gives the confirmed tokens per drop that accuracy allows, and the accuracy a
drafter would need for a given number per drop. The target confirms the longest agreeing prefix of the chain,
so with p_d the chance that the token at distance d is right when the tokens before it are,

    E[confirmed] = sum over k = 1..horizon of p_1 * p_2 * ... * p_k

and with one accuracy p at every distance that is p (1 - p^h) / (1 - p).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from core import cli_checks as checks
from core.client_server.client import OFFLINE_MIN_CONFIDENCE
from core.client_server.network import PRESETS, parse_window

DEFAULT_QUESTIONS = "assets/prompts/speclens_eval.jsonl"
RESULTS = Path(__file__).resolve().parent.parent / "assets" / "results"
# the shipped moa's memory probe (analysis.moa_channels --probe) and its 16-prompt offline run at cut-offs 0 and 0.1:
# both are redone when a MoA drafter is published (docs/RESULTS.md, "Offline")
SHIPPED_CHANNELS = RESULTS / "moa" / "offline" / "shipped-probe.json"
SHIPPED_OFFLINE = RESULTS / "moa" / "offline" / "offline-shipped.json"
TEACHER_FORCED = RESULTS / "teacher_forced.json"  # every drafter's held-out top-1 (analysis.teacher_forced)


def shipped_horizon() -> int:
    """--bound-from's default horizon: the shipped MoA's trained horizon (its config's period_max), read without
    loading the drafter; the MoA default where no drafter is shipped."""
    from core.drafters.moa_config import MoAConfig
    from core.methods import default_drafter_folder

    try:
        meta = json.loads((default_drafter_folder("moa") / "config.json").read_text())
        return int(meta["config"]["period_max"])
    except (OSError, ValueError, KeyError, TypeError):
        return MoAConfig.period_max


def pick_questions(path: str | Path, n: int) -> list[dict]:
    """The first question of each category in file order, cycling through categories until n."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r)
    out: list[dict] = []
    depth = 0
    while len(out) < n and any(len(v) > depth for v in by_cat.values()):
        for qs in by_cat.values():
            if len(qs) > depth and len(out) < n:
                out.append(qs[depth])
        depth += 1
    return out


def expected_confirmed(top1: Sequence[float], horizon: int) -> float:
    """Expected confirmed prefix of a greedy chain of `horizon` tokens whose token at distance d is right with
    probability top1[d - 1] given a right prefix; distances past the list take the list's mean."""
    if not top1:
        raise ValueError("top1 needs at least one accuracy (distance 1)")
    mean = sum(top1) / len(top1)
    total, run = 0.0, 1.0
    for d in range(horizon):
        run *= top1[d] if d < len(top1) else mean
        total += run
    return total


def accuracy_needed(per_drop: float, horizon: int) -> float:
    """The one top-1 accuracy p (the same at every distance) whose chain of `horizon` tokens is expected to have
    `per_drop` confirmed tokens (bisection on expected_confirmed, which rises with p)."""
    if not 0 < per_drop < horizon:
        raise ValueError(f"per_drop must lie between 0 and the horizon ({horizon}), got {per_drop:g}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_confirmed([mid], horizon) < per_drop else (lo, mid)
    return (lo + hi) / 2


def read_top1_by_distance(channels_json: str | Path, flag: str = "--bound-from") -> list[float]:
    """The teacher-forced top-1 accuracy at distance 1, 2, ... from analysis.moa_channels' JSON
    ({"top1_by_distance": {"normal": {"1": p1, "2": p2, ...}}}); a file of any other kind or shape is a
    one-line ValueError (cli_checks.UsageError) that names it and what was expected."""
    where = f"{flag} {channels_json}"
    want = "give the channels JSON that analysis.moa_channels writes"
    try:
        data = json.loads(Path(channels_json).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise checks.UsageError(f"{where}: not a text file (not UTF-8); {want}") from None
    except json.JSONDecodeError as err:
        raise checks.UsageError(f"{where}: not JSON ({err.msg} at line {err.lineno}); {want}") from None
    except OSError as err:
        raise checks.UsageError(f"{where}: cannot be read ({err.strerror or err}); {want}") from None
    by = data.get("top1_by_distance") if isinstance(data, dict) else None
    top1_by = by.get("normal") if isinstance(by, dict) else None
    if not isinstance(top1_by, dict) or not top1_by:
        held = f"a JSON {type(data).__name__}" if not isinstance(data, dict) else \
            f"keys {', '.join(map(str, list(data)[:6])) or '(none)'}"
        raise checks.UsageError(f"{where}: no top1_by_distance.normal accuracies (the file holds {held}); {want}")
    expected = [str(d) for d in range(1, len(top1_by) + 1)]
    if sorted(top1_by, key=lambda k: (len(k), k)) != expected:
        raise checks.UsageError(f"{where}: top1_by_distance.normal must have the distances 1 to {len(top1_by)} "
                                f"as keys, got {', '.join(list(top1_by)[:8])}; {want}")
    top1 = [top1_by[k] for k in expected]
    for k, v in zip(expected, top1):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise checks.UsageError(f"{where}: top1_by_distance.normal[{k!r}] must be an accuracy in [0, 1], "
                                    f"got {json.dumps(v)[:40]}; {want}")
    return [float(v) for v in top1]


def bound(channels_json: str | Path, horizon: int, per_drop: float) -> dict:
    """What a drafter's teacher-forced top-1 by distance allows offline (analysis.moa_channels output;
    read_top1_by_distance checks it)."""
    top1 = read_top1_by_distance(channels_json)
    return {"channels": str(channels_json), "horizon": horizon, "top1_by_distance": top1,
            "expected_confirmed_per_drop": round(expected_confirmed(top1, horizon), 3),
            "per_drop_asked": per_drop, "top1_needed": round(accuracy_needed(per_drop, horizon), 3)}


def shipped_bound() -> dict | None:
    """The shipped MoA's bound (from its committed probe) beside its committed offline run (horizon only, no
    cut-off); None when either file is missing."""
    if not (SHIPPED_CHANNELS.is_file() and SHIPPED_OFFLINE.is_file()):
        return None
    summaries = json.loads(SHIPPED_OFFLINE.read_text())["summary"]
    run = next(s for s in (summaries if isinstance(summaries, list) else [summaries]) if not s["min_confidence"])
    out = bound(SHIPPED_CHANNELS, run["horizon"], 3.0)  # absolute: the app may run from any directory
    out.update(channels=str(SHIPPED_CHANNELS.relative_to(RESULTS.parent.parent)),
               measured_per_drop=run["confirmed_per_drop"], measured_drops=run["drops"])
    if TEACHER_FORCED.is_file():  # the best drafter's accuracy, with fresh target features at every step
        rows = json.loads(TEACHER_FORCED.read_text())["heldout"]["drafters"]
        held = {m: r["overall"]["acc@1"] for m, r in rows.items()}
        best = max(held, key=held.get)
        out.update(best_drafter=best, best_top1=held[best])
    return out


def bound_figure(facts: dict):
    """Expected confirmed tokens per drop against a drafter's per-token top-1 accuracy (the same at every
    distance), with the shipped MoA's expected and measured figures and the accuracy `per_drop_asked` needs."""
    import plotly.graph_objects as go

    h = facts["horizon"]
    ps = [i / 100 for i in range(1, 96)]
    fig = go.Figure(go.Scatter(x=ps, y=[expected_confirmed([p], h) for p in ps], mode="lines",
                               name=f"expected confirmed per drop ({h}-token horizon)",
                               line={"color": "#495057"}))
    mean_p = accuracy_needed(facts["expected_confirmed_per_drop"], h)  # the one accuracy with MoA's expectation
    fig.add_trace(go.Scatter(x=[mean_p], y=[facts["expected_confirmed_per_drop"]], mode="markers",
                             marker={"size": 12, "color": "#e8590c"},
                             name=f"MoA, from its accuracy by distance: {facts['expected_confirmed_per_drop']:.2f}"))
    if "measured_per_drop" in facts:
        fig.add_trace(go.Scatter(x=[mean_p], y=[facts["measured_per_drop"]], mode="markers",
                                 marker={"size": 12, "symbol": "x", "color": "#c92a2a"},
                                 name=f"MoA, measured ({facts['measured_drops']} drops): "
                                      f"{facts['measured_per_drop']:.2f}"))
    if "best_top1" in facts:
        best = expected_confirmed([facts["best_top1"]], h)
        fig.add_trace(go.Scatter(x=[facts["best_top1"]], y=[best], mode="markers",
                                 marker={"size": 12, "symbol": "square", "color": "#1c7ed6"},
                                 name=f"best drafter here ({facts['best_drafter']}, fresh target features at "
                                      f"every step): {best:.2f}"))
    fig.add_trace(go.Scatter(x=[facts["top1_needed"]], y=[facts["per_drop_asked"]], mode="markers",
                             marker={"size": 12, "symbol": "diamond", "color": "#2b8a3e"},
                             name=f"{facts['per_drop_asked']:g} a drop needs top-1 {facts['top1_needed']:.2f}"))
    fig.update_layout(xaxis_title="drafter's top-1 accuracy per token (given a right prefix)",
                      yaxis_title="confirmed offline tokens per drop", height=380,
                      margin={"l": 60, "r": 20, "t": 30, "b": 50}, legend={"x": 0.01, "y": 0.99})
    return fig


def drop_stats(run, drops: list[tuple[float, float]]) -> list[dict]:
    """Per drop that happened during the run: offline tokens shown, confirmed prefix, first confirmed.

    A drop during which the client wrote nothing (the confidence cut-off stopped it at once) counts as a drop
    with no offline text: leaving it out would flatter the per-drop figures of a cut-off that writes less."""
    final = run.token_ids
    out = []
    snaps = run.trace.snapshots
    starts = sorted(start for start, _ in drops)
    for start, end in drops:
        if run.virtual_time_s <= start:  # the run ended before the link dropped
            continue
        until = next((s for s in starts if s > start), float("inf"))  # the next drop's text is not this one's
        first = next((s for s in snaps if start <= s["t"] < until), None)
        if first is None:  # nothing was shown offline during this drop
            out.append({"start": start, "end": end, "offline": 0, "confirmed": 0, "first_confirmed": False})
            continue
        ver, prov = first["verified"], first["provisional"]
        truth = final[len(ver):len(ver) + len(prov)]
        k = 0
        while k < min(len(prov), len(truth)) and prov[k] == truth[k]:
            k += 1
        out.append({"start": start, "end": end, "offline": len(prov), "confirmed": k,
                    "first_confirmed": bool(prov) and k > 0})
    return out


def online_top1(events) -> tuple[int, int]:
    """(cycles whose most probable depth-1 draft was the target's next token, cycles with a tree)."""
    hit = total = 0
    for e in events[1:]:
        tree = e.tree
        if not len(tree):
            continue
        depth1 = [i for i, p in enumerate(tree.parents.tolist()) if p == -1]
        best = max(depth1, key=lambda i: float(tree.draft_probs[i]))
        total += 1
        hit += int(int(tree.tokens[best]) == e.new_tokens[0])
    return hit, total


def run(args: argparse.Namespace) -> dict:
    import torch
    from tqdm import tqdm

    from core.client_server.client import offline_confidence_for, offline_horizon_for
    from core.client_server.models import make_drafter, make_target
    from core.client_server.network import preset
    from core.client_server.sim import CostModel, simulate
    from core.decoding import generate
    from core.drafters.base import Autoregressive

    torch.set_num_threads(args.threads)
    drops = [parse_window(w) for w in args.drop]
    net = preset(args.preset, drops)
    target = make_target("smollm2", args.dtype)
    drafter, note = make_drafter("moa", target, args.drafter, {})
    horizon = offline_horizon_for(drafter, args.horizon)
    cutoffs = [offline_confidence_for(c) for c in (args.min_confidence or [None])]
    rows_by = {c: [] for c in cutoffs}
    for q in tqdm(pick_questions(args.questions, args.prompts), desc="offline", file=sys.stderr):
        ids = target.chat_ids(q["turns"][0])
        plain = generate(target, drafter, ids, args.max_new_tokens)
        hit, total = online_top1(plain.events)
        ref = generate(target, Autoregressive(), ids, args.max_new_tokens).token_ids if args.check else None
        for c in cutoffs:
            res = simulate(target, "moa", drafter, ids, net, args.max_new_tokens, args.seed, CostModel(),
                           offline_horizon=args.horizon, offline_min_confidence=c)
            row = {"question_id": q["question_id"], "category": q["category"], "new_tokens": len(res.token_ids),
                   "offline_tokens": res.offline_tokens, "confirmed_tokens": res.confirmed_tokens,
                   "drops": drop_stats(res, drops), "online_top1": [hit, total],
                   "offline_stops": [s["reason"] for s in res.offline_stops]}
            if ref is not None:
                row["matches_greedy"] = res.token_ids == ref
            rows_by[c].append(row)
    results = [_summarise(rows_by[c], args, note, horizon, c) for c in cutoffs]
    return results[0] if len(results) == 1 else {"summary": [r["summary"] for r in results], "runs": results}


def _summarise(rows: list[dict], args: argparse.Namespace, note: str, horizon: int, cutoff: float) -> dict:
    drops_seen = [d for r in rows for d in r["drops"]]
    written = [d for d in drops_seen if d["offline"]]  # drops during which the client showed offline text
    offline = sum(r["offline_tokens"] for r in rows)
    confirmed = sum(r["confirmed_tokens"] for r in rows)
    hit = sum(r["online_top1"][0] for r in rows)
    total = sum(r["online_top1"][1] for r in rows)
    summary = {
        "drafter": note or args.drafter, "dtype": args.dtype, "preset": args.preset, "drop": args.drop,
        "horizon": horizon, "min_confidence": cutoff, "prompts": len(rows), "drops": len(drops_seen),
        "offline_tokens": offline, "confirmed_tokens": confirmed,
        "confirmed_per_drop": round(confirmed / max(1, len(drops_seen)), 3),
        "confirmed_share": round(confirmed / max(1, offline), 3),
        "drops_with_text": len(written),
        "first_token_confirmed": round(sum(d["first_confirmed"] for d in written) / max(1, len(written)), 3),
        "online_top1_depth1": round(hit / max(1, total), 3),
    }
    if args.check:
        summary["matches_greedy"] = sum(bool(r.get("matches_greedy")) for r in rows)
    return {"summary": summary, "rows": rows}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m analysis.offline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", default=None, help="MoA checkpoint folder (default: the shipped one)")
    p.add_argument("--questions", default=DEFAULT_QUESTIONS)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--preset", default="4g", choices=list(PRESETS))
    p.add_argument("--drop", action="append", default=None, metavar="START:END",
                   help="link down from START to END virtual seconds (repeatable; default 1.0:3.0)")
    p.add_argument("--horizon", type=int, default=None, help="offline tokens past the last verified one "
                   "(default: the drafter's trained period_max)")
    p.add_argument("--min-confidence", type=float, nargs="+", default=None, metavar="P",
                   help="stop offline where the drafter's probability for the provisional chain falls below P "
                        f"(in [0, 1); default {OFFLINE_MIN_CONFIDENCE:g}; several: one summary each)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--seed", type=str, default=0, metavar="N",
                   help=f"seed of the link model: a whole number from 0 to {checks.SEED_MAX}; default 0")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--check", action="store_true", help="compare each output with plain greedy decoding")
    p.add_argument("--out", default=None, help="write offline.json here (a folder)")
    p.add_argument("--bound-from", default=None, metavar="CHANNELS_JSON",
                   help="no model: the confirmed tokens per drop that this teacher-forced top-1 by distance allows "
                        "(analysis.moa_channels output), and the accuracy --per-drop would need")
    p.add_argument("--per-drop", type=float, default=3.0, help="with --bound-from: confirmed tokens per drop asked")
    args = p.parse_args(argv)
    try:  # every value and --bound-from's file, before any model loads: one line each (exit 2)
        check_args(args)
    except ValueError as err:
        raise SystemExit(checks.report(err)) from None
    return args


def check_args(args: argparse.Namespace) -> None:
    """What the user typed (ValueError: one line naming the bad value); fills in args.drop and args.seed."""
    args.drop = args.drop or ["1.0:3.0"]
    for w in args.drop:
        parse_window(w)
    args.seed = checks.check_seed(args.seed)
    for name, value, low in (("--prompts", args.prompts, 1), ("--max-new-tokens", args.max_new_tokens, 1),
                             ("--threads", args.threads, 1)):
        checks.check_int_range(value, name, low)
    if args.horizon is not None:
        checks.check_int_range(args.horizon, "--horizon", 0)
    for c in args.min_confidence or []:
        checks.check_probability(c, "--min-confidence")
    if not Path(args.questions).is_file():
        raise checks.UsageError(f"--questions {args.questions}: no such file")
    if args.bound_from is not None:
        if not Path(args.bound_from).is_file():
            raise checks.UsageError(f"--bound-from {args.bound_from}: no such file; give the channels JSON that "
                                    f"analysis.moa_channels writes")
        read_top1_by_distance(args.bound_from)
        horizon = args.horizon or shipped_horizon()
        if not (math.isfinite(args.per_drop) and 0 < args.per_drop < horizon):
            raise checks.UsageError(f"--per-drop must lie between 0 and the horizon ({horizon}), "
                                    f"got {args.per_drop:g}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bound_from is not None:
        print(json.dumps(bound(args.bound_from, args.horizon or shipped_horizon(), args.per_drop)))
        return 0
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)  # before the run: never lose its output
    result = run(args)
    print(json.dumps(result["summary"]))
    if args.out:
        (Path(args.out) / "offline.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
