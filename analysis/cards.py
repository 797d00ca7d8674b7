"""Put a benchmark's measured tau into the shipped drafters' model cards.

    python -m analysis.cards assets/results/summary.json [--drafters assets/drafters]

The trainer writes each card (core.training.publish.model_card) before any benchmark exists, with a
placeholder line for tau on the evaluation prompts. This replaces that line, or the one an earlier
run of this command wrote, with the drafter's overall figures from an `analysis.bench` summary:
tau, per-position acceptance, tokens/s and speedup over plain decoding in the same run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.training.publish import TAU_PLACEHOLDER

MARKER = TAU_PLACEHOLDER.split(":")[0]  # every line this command writes starts like the placeholder


def tau_line(summary: dict, method: str, summary_path: str) -> str:
    """One markdown line with the method's overall benchmark figures."""
    cfg = summary["config"]
    row = summary["methods"][method]["overall"]
    acc = ", ".join(f"{a:.2f}" for a in row["acceptance_by_position"][:4]) or "none"
    return (f"{MARKER} ({cfg['questions']} questions, {row['turns']} turns, {cfg['max_new_tokens']} new tokens, "
            f"greedy, {cfg['dtype']}, default tree): **tau {row['tau']:.2f}**; per-position acceptance {acc}; "
            f"{row['tokens_per_s']:.1f} tokens/s, speedup {row['speedup']:.2f}x over plain decoding in the same "
            f"run (`{summary_path}`).")


def update_card(card: Path, line: str) -> bool:
    """Replace the tau line of one README.md; False if the card has none."""
    lines = card.read_text(encoding="utf-8").split("\n")
    hits = [i for i, text in enumerate(lines) if text.startswith(MARKER)]
    if not hits:
        return False
    lines[hits[0]] = line
    card.write_text("\n".join(lines), encoding="utf-8")
    return True


def update_cards(summary_path: str | Path, drafters_dir: str | Path) -> list[str]:
    """Every method of the summary with a card under drafters_dir gets its line. Returns the methods updated."""
    summary = json.loads(Path(summary_path).read_text(encoding="utf-8"))
    done = []
    for method in summary["methods"]:
        card = Path(drafters_dir) / method / "README.md"
        if card.is_file() and update_card(card, tau_line(summary, method, str(summary_path))):
            done.append(method)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.cards", description=__doc__.split("\n\n")[0])
    p.add_argument("summary", help="summary.json written by analysis.bench")
    p.add_argument("--drafters", default="assets/drafters", help="folder with one drafter folder per method")
    args = p.parse_args(argv)
    done = update_cards(args.summary, args.drafters)
    print(f"updated {len(done)} model cards: {', '.join(done) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
