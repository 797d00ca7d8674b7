"""The MoA ablation: candidate MoA drafters side by side, online and offline, from one run.

    python -m analysis.moa_ablation --candidates runs/moa-candidates --out runs/moa-ablation

`--candidates` is a folder of MoA checkpoints named by benchmark label (`moa@wide/`,
`moa@h24/`, ...; see core.methods, "METHOD@NAME"). The shipped `moa`, `moa-tli1`, `moa-tli3`
and EAGLE-2 come along as references. One interleaved `analysis.bench --trees fixed` run (every
dynamic tree the same: depth 5, top_k 8, 24 nodes, so tau compares drafters, not trees) measures
every label on the held-out evaluation questions (tau, acceptance by depth, tokens/s, speedup,
drafting time per cycle); then `analysis.offline` runs each N=0 candidate in the simulated
client-server split with a dropped link (confirmed offline tokens per drop). The table names
each row's architecture from its config.json, so that it stands as the evidence for the
shipped choice (docs/RESULTS.md, "What MoA shows").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from analysis import bench, offline
from core.methods import default_drafter_folder, parse_method, shipped_names

REFERENCES = (bench.BASELINE, *shipped_names(tree="dynamic"))  # plain decoding and every shipped dynamic-tree drafter


def architecture(folder: Path) -> dict:
    """What distinguishes a MoA checkpoint: LSA layout, the post-CA MLP, CA's window, whether it reads the final
    feature (and at what gain), TLI N, trained horizon, curriculum."""
    cfg = json.loads((folder / "config.json").read_text())["config"]
    return {"lsa": "full width" if cfg.get("lsa_full_width", False) else f"narrow ({cfg.get('lsa_dim')})",
            "ca_mlp": bool(cfg.get("ca_mlp", True)), "ca_window": cfg.get("ca_window", 0) or "all",
            "final_feature": bool(cfg.get("final_feature", False)),
            "final_feature_gain": float(cfg.get("final_feature_gain", 1.0)), "tli": cfg.get("tli", 0),
            "period": f"{cfg.get('period_min')}-{cfg.get('period_max')}",
            "staircase": cfg.get("staircase", "window")}


def checkpoint_folder(label: str, candidates: Path) -> Path:
    parsed = parse_method(label)
    mine = candidates / parsed.checkpoint
    return mine if mine.is_dir() else default_drafter_folder(parsed.checkpoint)


def final_feature_cell(arch: dict | None) -> str:
    if not arch:
        return "–"
    if not arch["final_feature"]:
        return "no"
    gain = arch["final_feature_gain"]
    return "yes" if gain == 1.0 else f"yes (x{gain:g})"


def table(summary: dict, offline_runs: dict[str, dict], archs: dict[str, dict]) -> str:
    head = ("| label | LSA | CA MLP | CA window | final feature | TLI N | period | tau | acc@1 | acc@2 | acc@3 | "
            "acc@4 | tokens/s | speedup | "
            "draft ms/cycle | draft / verify | offline confirmed per drop | confirmed share | first token |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for label, row in summary["methods"].items():
        o = row["overall"]
        acc = (o.get("acceptance_by_position") or []) + [None] * 4
        arch = archs.get(label)
        off = offline_runs.get(label, {}).get("summary")
        cells = [label,
                 arch["lsa"] if arch else "–", ("yes" if arch["ca_mlp"] else "no") if arch else "–",
                 str(arch["ca_window"]) if arch else "–", final_feature_cell(arch),
                 str(arch["tli"]) if arch else "–", arch["period"] if arch else "–",
                 f"{o['tau']:.2f}", *[f"{a:.2f}" if a is not None else "–" for a in acc[:4]],
                 f"{o['tokens_per_s']:.1f}", f"{o['speedup']:.2f}x",
                 f"{o['draft_ms_per_cycle']:.1f}" if o.get("draft_ms_per_cycle") else "–",
                 f"{o['draft_ms_per_cycle'] / o['verify_ms_per_cycle']:.0%}" if o.get("verify_ms_per_cycle") else "–",
                 f"{off['confirmed_per_drop']:.2f}" if off else "–",
                 f"{off['confirmed_share']:.0%}" if off else "–",
                 f"{off['first_token_confirmed']:.0%} (online top-1 {off['online_top1_depth1']:.0%})" if off else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.moa_ablation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", required=True, help="folder of MoA checkpoints named by label (moa@NAME)")
    p.add_argument("--out", required=True)
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--offline-prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-bench", action="store_true", help="reuse OUT/bench/summary.json")
    args = p.parse_args(argv)
    candidates = Path(args.candidates)
    if not candidates.is_dir():
        p.error(f"--candidates {candidates}: no such folder")
    labels = sorted(d.name for d in candidates.iterdir() if (d / "config.json").is_file() and "@" in d.name)
    if not labels:
        p.error(f"--candidates {candidates}: no moa@NAME/config.json checkpoints there")
    for label in labels:
        parse_method(label)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    methods = [*REFERENCES, *labels]
    if not args.skip_bench:
        rc = bench.main(["--questions", "assets/prompts/speclens_eval.jsonl", "--methods", ",".join(methods),
                         "--drafter-dir", str(candidates), "--max-new-tokens", str(args.max_new_tokens),
                         "--per-category", str(args.per_category), "--threads", str(args.threads),
                         "--trees", "fixed", "--out", str(out / "bench")])
        if rc:
            return rc
    summary = json.loads((out / "bench" / "summary.json").read_text())
    archs = {m: architecture(checkpoint_folder(m, candidates)) for m in methods if parse_method(m).base == "moa"}
    offline_runs = {}
    for label in ["moa", *labels]:
        if archs[label]["tli"]:
            continue
        folder = checkpoint_folder(label, candidates)
        result = offline.run(offline.parse_args(["--drafter", str(folder), "--prompts", str(args.offline_prompts),
                                                 "--threads", str(args.threads)]))
        offline_runs[label] = result
        (out / f"offline-{label}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = table(summary, offline_runs, archs)
    (out / "ablation.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
