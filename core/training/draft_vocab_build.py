"""Build the drafting vocabulary's token ranks: `python -m core.training.draft_vocab_build` ranks the answer tokens
of a distillation set's training split into assets/drafters/token_ranks.json, the file core.drafters.draft_vocab
reads to choose which of a drafter's tokens it drafts over (its module docstring, "Drafting on fewer rows").

It reads training data, so it lives here rather than beside the vocabulary: core.drafters never imports
core.training.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from core.drafters.draft_vocab import RANKS_FILE
from core.training.distill_data import load_distill


def write_token_ranks(distill: str, out: Path = RANKS_FILE, size: int = 8192) -> list[int]:
    """Rank the `size` most frequent answer tokens of a distillation set's training split into `out`."""
    counts = Counter()
    for r in load_distill(distill, split="train"):
        counts.update(int(t) for t in r["answer_ids"])
    ids = [t for t, _ in counts.most_common(size)]
    Path(out).write_text(json.dumps({"source": distill, "what": "answer tokens of the training split, most "
                                     "frequent first", "ids_by_frequency": ids}, separators=(",", ":")) + "\n")
    return ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m core.training.draft_vocab_build",
                                description="Write the token ranks a drafting vocabulary keeps its top of.")
    p.add_argument("--distill", default="assets/distill_v5/distill.npz", help="distillation data (answers ranked)")
    p.add_argument("--out", default=str(RANKS_FILE))
    args = p.parse_args(argv)
    if not Path(args.distill).exists():
        print(f"error: --distill {args.distill!r} does not exist (a distill.npz or its folder)", file=sys.stderr)
        return 2
    ids = write_token_ranks(args.distill, Path(args.out))
    print(f"{len(ids)} tokens ranked -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
