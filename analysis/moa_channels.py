"""Which of MoA's inputs carries its predictions? A teacher-forced probe on held-out answers.

    python -m analysis.moa_channels --drafter assets/drafters/moa --sequences 24

MoA predicts from two channels: SA reads the tokens, CA reads the target's activations at
verified positions (through LSA). On held-out distillation answers, with verification every k
tokens (k drawn as in training), this measures the drafter's top-1 agreement with the target's
greedy token by distance from the last verified position, three ways:

    normal       the drafter as it is
    no_ca        cross-attention switched off: what SA alone knows
    layers_shuffled  the layers fed to LSA in a random order: does LSA use which layer is which?
    positions_shuffled  each position's activations swapped with another position's: does CA
                 use *where* in the text an activation comes from (the recent past)?

If CA carried what EAGLE-2's feature carries, accuracy at distance 1 would sit well above
distance 6 and far above `no_ca`. The gap between `normal` and `no_ca` is what the target's
activations add.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DISTANCES = 8


def probe(drafter_path: str | None, sequences: int, data: str, seed: int = 0) -> dict:
    import torch

    from core.client_server.models import make_drafter, make_target
    from core.training.data import collate, make_sequences, target_batch
    from core.training.distill_data import load_distill

    target = make_target("smollm2", "bfloat16")
    d, note = make_drafter("moa", target, drafter_path, {})
    held = load_distill(data, split="heldout")[:sequences]
    seqs = make_sequences(held, 512)
    out = {}
    for variant in ("normal", "no_ca", "layers_shuffled", "positions_shuffled"):
        hits = torch.zeros(DISTANCES + 1)
        counts = torch.zeros(DISTANCES + 1)
        for i in range(0, len(seqs), 4):
            idx = list(range(i, min(i + 4, len(seqs))))
            ids, loss, attn = collate(seqs, idx, target.device)
            with torch.no_grad():
                batch = target_batch(target, d.train_needs, ids, loss.float(), attn.float())
                if variant == "layers_shuffled":
                    perm = torch.randperm(batch.layer_kv.shape[2], generator=torch.Generator().manual_seed(seed + i))
                    batch.layer_kv = batch.layer_kv[:, :, perm]
                if variant == "positions_shuffled":
                    perm = torch.randperm(batch.layer_kv.shape[1], generator=torch.Generator().manual_seed(seed + i))
                    batch.layer_kv = batch.layer_kv[:, perm]
                period = torch.randint(d.config.period_min, d.config.period_max + 1, (len(idx),),
                                       generator=torch.Generator().manual_seed(seed + i))
                last = d.last_verified(batch, period=period)
                saved = d.ca.forward
                if variant == "no_ca":
                    d.ca.forward = lambda x, *a, **k: torch.zeros_like(x)
                try:
                    _, final = d.train_forward(batch, last, 1.0)
                finally:
                    d.ca.forward = saved
                pred = d.vocab.to_token_ids(d.vocab.logits(final.to(target.dtype)).argmax(-1))
                truth = batch.greedy_next()
            dist = torch.arange(ids.shape[1])[None] - last
            ok = loss.bool() & attn.bool() & (last >= 0)
            for k in range(1, DISTANCES + 1):
                m = ok & (dist == k)
                hits[k] += (pred == truth)[m].sum()
                counts[k] += m.sum()
        out[variant] = {k: round(float(hits[k] / counts[k]), 4) if counts[k] else None
                        for k in range(1, DISTANCES + 1)}
    return {"drafter": drafter_path or note, "sequences": len(seqs), "data": data,
            "top1_by_distance": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.moa_channels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", default=None, help="MoA checkpoint folder (default: the shipped one)")
    p.add_argument("--sequences", type=int, default=24, help="held-out sequences (at most)")
    p.add_argument("--data", default="assets/distill_v5/distill.npz")
    p.add_argument("--out", default=None, help="write the result as JSON to this file")
    args = p.parse_args(argv)
    if args.sequences < 1:
        p.error(f"--sequences must be at least 1, got {args.sequences}")
    if not Path(args.data).exists():
        p.error(f"--data {args.data}: no such file")
    if args.drafter and not (Path(args.drafter) / "config.json").is_file():
        p.error(f"--drafter {args.drafter}: no config.json there")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = probe(args.drafter, args.sequences, args.data)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
