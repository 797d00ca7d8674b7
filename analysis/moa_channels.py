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
    no_final_feature  (drafters with final_feature only) the projected final feature set to zero:
                 what the feature of the last verified token adds

`--probe` (the memory probe) asks whether the target's state survives on its way into CA: on held-out answers it
fits a ridge-regularised linear read of the target's normed final feature at each answer position from (a) the raw
per-layer keys and values LSA reads there (K+V, every layer), (b) the LSA memory row of that position, (c) CA's values
of that row, and reports R^2 (variance explained on sequences the fit never saw) and the top-1 agreement of the read
feature's LM-head argmax with the target's. (a) is what the target hands over; a row that keeps the state reads
close to it. With it come top-1 by distance with CA on and off, and where CA looks (`ca_attention`).

If CA carried what EAGLE-2's feature carries, accuracy at distance 1 would sit well above
distance 6 and far above `no_ca`. The gap between `normal` and `no_ca` is what the target's
activations add. `ca_attention` says where cross-attention looks: how peaked its weights are, how much
falls on the last verified token, and how far back its peak lies. `stream_spread` says how strongly each part
(SA, the final feature, CA, CA's MLP) writes into the stream: the token-to-token spread of what it adds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

DISTANCES = 8


READ_SPLIT = (0.5, 0.25)  # of the sequences: fit the read, choose its ridge strength; the rest report it
RIDGE = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # ridge strengths tried, in units of the features' mean variance


def load_moa(drafter_path: str | None, dtype: str):
    """(target, MoA drafter, a note naming it): the shipped drafter unless a folder is given."""
    from core.client_server.models import make_drafter, make_target

    target = make_target("smollm2", dtype)
    d, note = make_drafter("moa", target, drafter_path, {})
    d.eval()
    return target, d, note


def heldout_sequences(data: str, sequences: int) -> list:
    from core.training.data import make_sequences
    from core.training.distill_data import load_distill

    return make_sequences(load_distill(data, split="heldout")[:sequences], 512)


def probe(drafter_path: str | None, sequences: int, data: str, seed: int = 0, dtype: str = "float32",
          memory: bool = False) -> dict:
    import dataclasses

    import torch

    target, d, note = load_moa(drafter_path, dtype)
    seqs = heldout_sequences(data, sequences)
    batches = target_batches(d, target, seqs)  # one target pass per batch, read by every variant
    out = {}
    variants = ["normal", "no_ca"]
    if not memory:  # the memory probe keeps to what it reports; the full channel analysis shuffles inputs too
        variants += ["layers_shuffled", "positions_shuffled"]
        if d.config.final_feature:
            variants.append("no_final_feature")
    for variant in variants:
        hits = torch.zeros(DISTANCES + 1)
        counts = torch.zeros(DISTANCES + 1)
        for i in range(0, len(seqs), 4):
            idx = list(range(i, min(i + 4, len(seqs))))
            ids, loss, attn, batch = batches[i // 4]
            with torch.no_grad():
                if variant == "layers_shuffled":
                    perm = torch.randperm(batch.layer_kv.shape[2], generator=torch.Generator().manual_seed(seed + i))
                    batch = dataclasses.replace(batch, layer_kv=batch.layer_kv[:, :, perm])
                if variant == "positions_shuffled":
                    perm = torch.randperm(batch.layer_kv.shape[1], generator=torch.Generator().manual_seed(seed + i))
                    batch = dataclasses.replace(batch, layer_kv=batch.layer_kv[:, perm])
                period = torch.randint(d.config.period_min, d.config.period_max + 1, (len(idx),),
                                       generator=torch.Generator().manual_seed(seed + i))
                last = d.last_verified(batch, period=period)
                switched_off = {"no_ca": d.ca, "no_final_feature": getattr(d.lsa, "feat", None)}.get(variant)
                if switched_off is not None:
                    switched_off.forward = lambda x, *a, **k: torch.zeros_like(x)
                try:
                    _, final = d.train_forward(batch, last, 1.0)
                finally:
                    if switched_off is not None:
                        del switched_off.forward  # back to the class's own forward
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
    result = {"drafter": drafter_path or note, "sequences": len(seqs), "data": data, "dtype": dtype,
              "top1_by_distance": out, **forward_statistics(d, target, seqs)}
    if memory:
        result["memory_reads"] = memory_reads(d, target, seqs, batches)
        result["ca_worth_at_distance_1"] = round(out["normal"][1] - out["no_ca"][1], 4)
    return result


def target_batches(d, target, seqs, batch: int = 4) -> list[tuple]:
    """(ids, loss mask, attention mask, TrainBatch) for every `batch` sequences: the target's pass, done once."""
    import torch

    from core.training.data import collate, target_batch

    out = []
    with torch.no_grad():
        for i in range(0, len(seqs), batch):
            ids, loss, attn = collate(seqs, list(range(i, min(i + batch, len(seqs)))), target.device)
            out.append((ids, loss, attn, target_batch(target, d.train_needs, ids, loss.float(), attn.float())))
    return out


def memory_reads(d, target, seqs, batches: list[tuple] | None = None) -> dict:
    """Linear reads of the target's normed final feature at each answer position from the raw K+V, the LSA
    memory row and CA's values there: R^2 and top-1 on held-out sequences (module docstring). `batches`:
    target_batches' output for these sequences, when already computed."""
    import torch

    sources: dict[str, list] = {"raw_kv": [], "lsa_memory": [], "ca_values": []}
    truth, group = [], []
    h = target.hidden_size
    first = 0
    with torch.no_grad():
        for ids, loss, attn, tb in batches if batches is not None else target_batches(d, target, seqs):
            b, t = ids.shape
            idx = list(range(first, first + b))
            first += b
            keep = (loss.bool() & attn.bool()).reshape(-1)
            kv = tb.layer_kv.reshape(b * t, tb.layer_kv.shape[2], -1)
            final = tb.hidden[d.config.n_target_layers].reshape(b * t, -1) if d.config.final_feature else None
            vec, _ = d.lsa(kv, final=final)
            vec = vec[:, :h].view(b, t, h)
            pos = torch.arange(t)[None].expand(b, t)
            cos, sin = d._rope(pos)
            _, values = d.memory(vec, cos, sin)  # [B, kv_heads, T, D]: values carry no rotation
            values = values.transpose(1, 2).reshape(b * t, -1)
            sources["raw_kv"].append(kv.reshape(b * t, -1)[keep].float())
            sources["lsa_memory"].append(vec.reshape(b * t, -1)[keep].float())
            sources["ca_values"].append(values[keep].float())
            normed = target.final_norm(tb.hidden[d.config.n_target_layers]).reshape(b * t, -1)[keep].float()
            truth.append(normed)
            group.append(torch.tensor(idx).repeat_interleave(t)[keep])
    y, g = torch.cat(truth), torch.cat(group)
    n = len(seqs)
    fit_n = max(1, min(n - 2, round(READ_SPLIT[0] * n)))  # every part keeps at least one sequence
    val_n = max(1, min(n - 1 - fit_n, round(READ_SPLIT[1] * n)))
    parts = (g < fit_n, (g >= fit_n) & (g < fit_n + val_n), g >= fit_n + val_n)
    if not all(bool(p.any()) for p in parts):
        raise ValueError(f"the memory probe needs at least 3 held-out sequences with answers, got {n}")
    w = target.lm_head.weight.float()
    true_top = (y[parts[2]] @ w.T).argmax(-1)
    out = {"positions": {"fit": int(parts[0].sum()), "choose": int(parts[1].sum()), "report": int(parts[2].sum())}}
    for name, chunks in sources.items():
        x = torch.cat(chunks)
        pred, lam = ridge_read(x, y, parts)
        resid = ((pred - y[parts[2]]) ** 2).sum()
        total = ((y[parts[2]] - y[parts[2]].mean(0)) ** 2).sum()
        out[name] = {"r2": round(float(1 - resid / total), 4),
                     "top1": round(float(((pred @ w.T).argmax(-1) == true_top).float().mean()), 4),
                     "width": int(x.shape[1]), "ridge": lam}
    return out


def ridge_read(x, y, parts) -> tuple:
    """Ridge regression y ~ x + b fitted on parts[0], its strength chosen on parts[1] (lowest squared error);
    returns (the prediction on parts[2], the chosen strength in units of the features' mean variance)."""
    import torch

    fit, choose, report = parts
    mu, sd = x[fit].mean(0), x[fit].std(0).clamp_min(1e-6)
    z = (x - mu) / sd
    y_mu = y[fit].mean(0)
    a, target = z[fit].double(), (y[fit] - y_mu).double()
    primal = a.shape[1] <= a.shape[0]  # solve on the smaller side: features x features, or positions x positions
    evals, evecs = torch.linalg.eigh(a.T @ a if primal else a @ a.T)  # once: each strength is then a rescaling
    proj = evecs.T @ (a.T @ target if primal else target)
    best = None
    for lam in RIDGE:
        solved = evecs @ (proj / (evals + lam * len(a))[:, None])
        coef = (solved if primal else a.T @ solved).float()
        err = float(((z[choose] @ coef + y_mu - y[choose]) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, lam, coef)
    _, lam, coef = best
    return z[report] @ coef + y_mu, lam


def forward_statistics(d, target, seqs, n: int = 4, period: int = 8) -> dict:
    """`ca_attention` and `stream_spread` from one teacher-forced forward of the first n sequences."""
    parts = _forward_parts(d, target, seqs, n, period)
    return {"ca_attention": ca_attention(d, target, seqs, n, period, parts),
            "stream_spread": stream_spread(d, target, seqs, n, period, parts)}


def _forward_parts(d, target, seqs, n: int, period: int) -> SimpleNamespace:
    """The teacher-forced pieces both statistics below read, on the first n sequences verified every `period`
    tokens: positions, LSA's memory vectors, the projected final feature each position's stream gets ([B, T, H]
    each; shortcut None without final_feature), SA's output under the causal mask (before the feature joins
    it) and what CA may read (as in training)."""
    import torch

    from core.layers import decoder_layer
    from core.training.data import collate, target_batch

    ids, loss, attn = collate(seqs, list(range(min(n, len(seqs)))), target.device)
    with torch.no_grad():
        batch = target_batch(target, d.train_needs, ids, loss.float(), attn.float())
        b, t = ids.shape
        last = d.last_verified(batch, period=torch.full((b,), period))
        pos = torch.arange(t)[None].expand(b, t)
        cos, sin = d._rope(pos)
        big_l = batch.layer_kv.shape[2]
        final = batch.hidden[big_l].reshape(b * t, -1) if d.config.final_feature else None
        out, _ = d.lsa(batch.layer_kv.reshape(b * t, big_l, -1), final=final)
        h = target.hidden_size
        causal = pos[:, None, :] <= pos[:, :, None]
        sa_out, _ = decoder_layer(d.sa, target.embed_tokens(ids).to(d._dtype), cos, sin, causal[:, None], None, 0,
                                  target.head_dim)
        shortcut = None  # the projected final feature at v(j), which joins position j's stream
        if d.config.final_feature:
            shortcut = out[:, h:].view(b, t, -1).gather(1, last.clamp(min=0)[..., None].expand(b, t, h))
    return SimpleNamespace(ids=ids, loss=loss, attn=attn, last=last, pos=pos, cos=cos, sin=sin,
                           vec=out[:, :h].view(b, t, -1), shortcut=shortcut, sa_out=sa_out,
                           ca_mask=d.ca_read_mask(last))


def ca_attention(d, target, seqs, n: int = 4, period: int = 8, parts: SimpleNamespace | None = None) -> dict:
    """Where cross-attention looks, on the first n sequences verified every `period` tokens: the normalised
    entropy of its weights (0 = one position, 1 = uniform), the weight on the last verified position, and
    how far back from it the most attended position lies (median)."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    f = parts if parts is not None else _forward_parts(d, target, seqs, n, period)
    last, cos, sin, loss, attn = f.last, f.cos, f.sin, f.loss, f.attn
    b, t = f.ids.shape
    with torch.no_grad():
        sa_out = f.sa_out if f.shortcut is None else f.sa_out + f.shortcut
        k, _ = d.memory(f.vec, cos, sin)
        q = d.ca.q_proj(d.ca_norm(sa_out)).view(b, t, d.ca.heads, d.ca.head_dim).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        k = k.repeat_interleave(d.ca.heads // d.ca.kv_heads, dim=1)
        mask = f.ca_mask[:, None]  # the dummy read of rows with no verified past falls outside `ok` below
        logits = (q.float() @ k.float().transpose(-1, -2)) / d.ca.head_dim ** 0.5
        p = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    ok = ((last >= period) & loss.bool() & attn.bool())[:, None, :].expand(b, d.ca.heads, t)
    n_mem = mask.sum(-1).float().expand_as(ok)
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(-1) / torch.log(n_mem.clamp_min(2))
    on_last = p.gather(-1, last.clamp_min(0)[:, None, :, None].expand(b, d.ca.heads, t, 1)).squeeze(-1)
    back = last[:, None, :].expand(b, d.ca.heads, t) - p.argmax(-1)
    return {"normalised_entropy": round(float(entropy[ok].mean()), 4),
            "weight_on_last_verified": round(float(on_last[ok].mean()), 4),
            "uniform_weight": round(float((1 / n_mem)[ok].mean()), 4),
            "peak_distance_back_median": float(back[ok].float().median())}


def stream_spread(d, target, seqs, n: int = 4, period: int = 8, parts: SimpleNamespace | None = None) -> dict:
    """How strongly each part writes into the drafter's stream, on the first n sequences verified every `period`
    tokens: per channel, the standard deviation across answer positions of what the part adds, then the median
    over channels. A part whose spread is small next to SA's moves the prediction little, however informative."""
    import torch

    f = parts if parts is not None else _forward_parts(d, target, seqs, n, period)
    with torch.no_grad():
        parts = {"sa": f.sa_out}
        stream = f.sa_out
        if f.shortcut is not None:
            parts["final_feature"] = f.shortcut
            stream = stream + f.shortcut
        mem_k, mem_v = d.memory(f.vec, f.cos, f.sin)
        parts["ca"] = d.ca(d.ca_norm(stream), f.cos, f.sin, mem_k, mem_v, f.ca_mask[:, None])
        stream = stream + parts["ca"]
        if d.config.ca_mlp:
            parts["ca_mlp"] = d.mlp(d.mlp_norm(stream))
    ok = f.loss.bool() & f.attn.bool() & (f.last >= 0)
    return {name: round(float(x[ok].float().std(0).median()), 3) for name, x in parts.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.moa_channels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", default=None, help="MoA checkpoint folder (default: the shipped one)")
    p.add_argument("--sequences", type=int, default=24, help="held-out sequences (at most)")
    p.add_argument("--data", default="assets/distill_v5/distill.npz")
    p.add_argument("--out", default=None, help="write the result as JSON to this file")
    p.add_argument("--probe", action="store_true",
                   help="the memory probe: linear reads of the target's state from K+V, LSA memory and CA values, "
                        "top-1 by distance with CA on and off, CA's weight on the last verified row")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the target's dtype")
    args = p.parse_args(argv)
    if args.sequences < (3 if args.probe else 1):
        p.error(f"--sequences must be at least {3 if args.probe else 1}, got {args.sequences}")
    if not Path(args.data).exists():
        p.error(f"--data {args.data}: no such file")
    if args.drafter and not (Path(args.drafter) / "config.json").is_file():
        p.error(f"--drafter {args.drafter}: no config.json there")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = probe(args.drafter, args.sequences, args.data, dtype=args.dtype, memory=args.probe)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
