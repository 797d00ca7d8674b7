"""Self-distillation data: the target answers every training prompt in its own chat format.

    python -m core.training.datagen --out data/distill [--limit N] [--batch-size 24]
        [--max-new-tokens 256] [--sample-share 0.25] [--seed 0] [--workers 2] [--threads 1]

CPU notes (2-core machine shared with other work): one torch thread per process is the
default, because with two threads the OpenMP workers spin-wait whenever the other is
descheduled (measured: 4x the CPU time for the same decode steps under load). To use both
cores, `--workers 2` starts two one-thread worker processes that split the shards
(index % 2) and the parent merges when both are done.

Decoding: greedy for most prompts; a seeded share (default 25%, chosen by a hash of the
prompt id, so the choice does not depend on --limit) is sampled at temperature 0.7,
top-p 0.95 (top-k off). Batches are left-padded (pad id = the end-of-turn id 2) with an
attention mask and run through `hf_model.generate` in bfloat16; within a run the prompts
are sorted by (sampled?, length) so that a batch holds prompts of similar length and one
decoding mode.

Layout under --out:

    plan.json            what this run generates (config + per-shard content hashes)
    shards/shard-00000.jsonl ...  one finished shard each (a `_meta` line, then one record a line),
                         written to a temp file and renamed, so a kill never leaves half a shard
    log.txt              one progress line per finished shard (appended)
    dataset/             the merged `datasets` Arrow dataset (save_to_disk), once every shard exists
    distill.npz          the same data as compact token arrays (see `export_compact`)
    recipe.json          counts, token statistics, settings, hardware, date

A restart with the same settings skips every shard whose file exists and matches the plan;
a restart with different settings refuses to mix the two (use another --out). Without
--limit the recipe is also written to assets/distill/recipe.json (the committed copy).

Records: prompt_id (str), category (str), prompt_ids (list[int], the chat-formatted prompt),
answer_ids (list[int], ending with the end-of-turn id when `finished`), temperature
(float, 0.0 for greedy), finished (bool), split ("train" or "heldout": a fixed 3% by a
hash of prompt_id, independent of the seed).

The generation core (`run_generation`) takes already-tokenized items and a Target, so it
runs on a tokenizer-less tiny model in tests; `prepare_items` is the tokenizer-dependent part.
The run folder (settings, plan, shard files, reading records back) is core.training.datagen_shards;
the recipe and --combine are core.training.datagen_recipe.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from core.training.datagen_recipe import build_recipe, combine_runs, write_recipe
from core.training.datagen_shards import (
    GenConfig,
    _atomic_write_text,
    _Logger,
    _shard_done,
    ensure_plan,
    finished_prompts,
    is_sampled,
    merge_shards,
    shard_path,
)
from core.training.distill_data import COMMITTED_RECIPE, export_compact, load_distill

# ------------------------------------------------------------------------------------------
# Items and shards
# ------------------------------------------------------------------------------------------


def prepare_items(target, prompts: Sequence[dict], cfg: GenConfig, log=None) -> list[dict]:
    """Tokenize prompt records with the target's chat template and pick each one's temperature.

    Returns items {prompt_id, category, prompt_ids, temperature}; prompts longer than
    cfg.max_prompt_tokens are dropped (and reported through `log`).
    """
    items, dropped = [], []
    for p in prompts:
        ids = target.chat_ids(p["messages"])
        if len(ids) > cfg.max_prompt_tokens:
            dropped.append(p["prompt_id"])
            continue
        temp = cfg.temperature if is_sampled(p["prompt_id"], cfg.seed, cfg.sample_share) else 0.0
        items.append({"prompt_id": p["prompt_id"], "category": p["category"], "prompt_ids": ids, "temperature": temp})
    if dropped and log is not None:
        log(f"dropped {len(dropped)} prompts over {cfg.max_prompt_tokens} tokens: {dropped[:10]}")
    return items


def drop_answered(items: Sequence[dict], npz: str | Path, log=None) -> list[dict]:
    """Items whose prompt token ids no record of `npz` has; the order is kept (the plan stays reproducible)."""
    answered = {tuple(r["prompt_ids"]) for r in load_distill(npz)}
    kept = [it for it in items if tuple(it["prompt_ids"]) not in answered]
    if log is not None:
        log(f"--skip-answered {npz}: left out {len(items) - len(kept)} of {len(items)} prompts answered there")
    return kept


def _batches(shard: Sequence[dict], batch_size: int) -> list[list[dict]]:
    """Split a shard into batches that share one temperature."""
    out: list[list[dict]] = []
    for temp in sorted({it["temperature"] for it in shard}):
        group = [it for it in shard if it["temperature"] == temp]
        out += [group[i:i + batch_size] for i in range(0, len(group), batch_size)]
    return out


# ------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------


@torch.no_grad()
def generate_batch(target, prompts: Sequence[Sequence[int]], temperature: float, cfg: GenConfig,
                   seed: int) -> list[tuple[list[int], bool]]:
    """Answer a batch of tokenized prompts with `hf_model.generate` (left padding).

    Returns (answer_ids, finished) per prompt; a finished answer ends with its stop token,
    an unfinished one has exactly cfg.max_new_tokens tokens.
    """
    width = max(len(p) for p in prompts)
    dev = target.device
    input_ids = torch.full((len(prompts), width), cfg.pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        attention[i, width - len(p):] = 1
    kwargs = {"max_new_tokens": cfg.max_new_tokens, "eos_token_id": list(cfg.eos_ids), "pad_token_id": cfg.pad_id}
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_p=cfg.top_p, top_k=0)
    else:
        kwargs.update(do_sample=False)
    torch.manual_seed(seed)
    out = target.hf_model.generate(input_ids=input_ids.to(dev), attention_mask=attention.to(dev), **kwargs)
    stops = set(cfg.eos_ids)
    results = []
    for row in out[:, width:].tolist():
        for j, tok in enumerate(row):
            if tok in stops:
                results.append((row[:j + 1], True))
                break
        else:
            results.append((row, False))
    return results


def run_generation(target, items: Sequence[dict], out_dir: str | Path, cfg: GenConfig,
                   progress: bool = True, log=None, worker: tuple[int, int] = (0, 1)) -> dict:
    """Generate every shard of `items` that is not already on disk. Tokenizer-free.

    Writes plan.json (refusing to continue a run with a different plan), then each missing
    shard atomically. worker=(k, n): only shards whose index % n == k (for n parallel
    processes sharing one folder). Returns {"shards", "generated_shards", "skipped_shards",
    "new_tokens", "seconds"}.
    """
    out = Path(out_dir)
    log = log or _Logger(out / "log.txt")
    shards, plan = ensure_plan(target, items, out, cfg)
    k, n_workers = worker
    mine = [i for i in range(len(shards)) if i % n_workers == k]
    todo = [i for i in mine if not _shard_done(shard_path(out, i), plan["shard_hashes"][i])]
    done_items = sum(len(shards[i]) for i in mine) - sum(len(shards[i]) for i in todo)
    who = f"worker {k}/{n_workers}: " if n_workers > 1 else ""
    log(f"{who}plan: {len(items)} prompts in {len(shards)} shards; {len(mine) - len(todo)} of {len(mine)} "
        f"already done, {len(todo)} to generate (batch {cfg.batch_size}, max_new_tokens {cfg.max_new_tokens}, "
        f"{torch.get_num_threads()} threads)")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(shards[i]) for i in mine), initial=done_items, unit="prompt", file=sys.stderr,
                   dynamic_ncols=True)
    total_new, t_run = 0, time.time()
    for n_done, index in enumerate(todo):
        shard = shards[index]
        t0 = time.time()
        records, new_tokens = [], 0
        for b, batch in enumerate(_batches(shard, cfg.batch_size)):
            seed = cfg.seed * 1_000_003 + index * 1009 + b
            answers = generate_batch(target, [it["prompt_ids"] for it in batch], batch[0]["temperature"], cfg, seed)
            for it, (ans, finished) in zip(batch, answers):
                records.append({**it, "answer_ids": ans, "finished": finished})
                new_tokens += len(ans)
            if bar is not None:
                bar.update(len(batch))
                bar.set_postfix(tok_s=f"{(total_new + new_tokens) / max(time.time() - t_run, 1e-9):.0f}")
        seconds = time.time() - t0
        meta = {"shard": index, "n": len(records), "items_hash": plan["shard_hashes"][index],
                "new_tokens": new_tokens, "seconds": round(seconds, 2),
                "finished_at": _dt.datetime.now().isoformat(timespec="seconds")}
        text = "\n".join(json.dumps(r) for r in [{"_meta": meta}] + records) + "\n"
        _atomic_write_text(shard_path(out, index), text)
        total_new += new_tokens
        elapsed = time.time() - t_run
        left = len(todo) - n_done - 1
        eta = elapsed / (n_done + 1) * left
        log(f"{who}shard {index + 1}/{len(shards)}: {len(records)} prompts, {new_tokens} new tokens in {seconds:.0f} s "
            f"({new_tokens / max(seconds, 1e-9):.0f} tok/s); {left} shards left, ETA {eta / 60:.0f} min")
    if bar is not None:
        bar.close()
    return {"shards": len(shards), "generated_shards": len(todo), "skipped_shards": len(mine) - len(todo),
            "new_tokens": total_new, "seconds": time.time() - t_run}


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------


def select_prompts(prompts: Sequence[dict], limit: int | None, seed: int) -> list[dict]:
    """All prompts, or a seeded subset of `limit` of them mixed across categories."""
    if limit is None or limit >= len(prompts):
        return list(prompts)
    import random

    idx = sorted(random.Random(f"limit-{seed}").sample(range(len(prompts)), limit))
    return [prompts[i] for i in idx]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: have a worker receive SIGTERM when the coordinating process dies."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _run_workers(argv: list[str], n: int, out: Path, total: int, log, progress: bool) -> None:
    """Start n worker processes (each takes every n-th shard), show progress, wait for all."""
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "core.training.datagen", *argv, "--worker", str(k),
                               "--no-progress"], env=env, preexec_fn=_die_with_parent) for k in range(n)]
    log(f"started {n} workers: pids {[p.pid for p in procs]}")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=finished_prompts(out), unit="prompt", file=sys.stderr, dynamic_ncols=True)
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(5)
            if bar is not None:
                bar.n = finished_prompts(out)
                bar.refresh()
    except BaseException:
        for p in procs:
            p.terminate()
        raise
    finally:
        if bar is not None:
            bar.close()
    codes = [p.returncode for p in procs]
    if any(codes):
        raise SystemExit(f"a worker failed (exit codes {codes}); rerun the same command to resume")


def main(argv: Iterable[str] | None = None) -> None:
    argv = list(argv) if argv is not None else sys.argv[1:]
    ap = argparse.ArgumentParser(description="Generate self-distillation data with the target model.")
    ap.add_argument("--out", default="data/distill")
    ap.add_argument("--limit", type=int, default=None, help="only this many prompts (a seeded subset)")
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--shard-size", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--sample-share", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default=None, help="target model (default: the shipped SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per process (default 1: on a busy 2-core machine two threads spin-wait "
                         "and ran 4x slower; use --workers to use more cores)")
    ap.add_argument("--workers", type=int, default=1, help="parallel worker processes, each taking every n-th shard")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)  # set for the worker processes
    ap.add_argument("--recipe", default=None,
                    help="where to copy recipe.json (default: assets/distill/recipe.json for a full run, "
                         "nowhere with --limit; 'none' to skip)")
    ap.add_argument("--passages", default=None, metavar="NPZ",
                    help="instead of core.training.prompts, use copy-task prompts built around the training-split "
                         "answers of this distill.npz (core.training.passage_prompts)")
    ap.add_argument("--perturb", type=float, default=None, metavar="RATE",
                    help="with --passages: make the passages novel first, swapping this share of their distinct "
                         "content words (passage_prompts.perturb_passages; 0.3 for assets/distill_v5)")
    ap.add_argument("--skip-answered", default=None, metavar="NPZ",
                    help="leave out prompts whose token ids this earlier distill.npz already answered (a new prompt "
                         "seed repeats some of the earlier seeds' template draws)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--combine", nargs="+", default=None, metavar="RUN",
                    help="pool the finished shards of these run folders into --out (dataset, distill.npz, "
                         "recipe.json) instead of generating")
    args = ap.parse_args(argv)
    if args.perturb is not None and not args.passages:
        ap.error("--perturb needs --passages")
    if args.combine:
        try:
            recipe = combine_runs(args.combine, args.out)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"datagen --combine: {e}") from None
        if args.recipe and args.recipe != "none":
            write_recipe(recipe, args.recipe)
        print(f"combined {len(args.combine)} runs into {args.out}: {recipe['counts']['prompts']} records, "
              f"{recipe['tokens']['answer_total']} answer tokens")
        return

    from core.target import load_target
    from core.training.prompts import training_prompts

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = _Logger(out / "log.txt")
    t_start = time.time()
    target = load_target(args.target, dtype=args.dtype, device=args.device)
    cfg = GenConfig(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, shard_size=args.shard_size,
                    sample_share=args.sample_share, seed=args.seed, eos_ids=sorted(target.eos_token_ids),
                    pad_id=2 if 2 in target.eos_token_ids else min(target.eos_token_ids))
    if args.passages:
        from core.training.passage_prompts import answer_passages, passage_prompts

        def decode(ids, skip):
            return target.tokenizer.decode(ids, skip_special_tokens=skip)

        passages = answer_passages(args.passages, decode)
        if args.perturb:
            from core.training.passage_prompts import NOVEL_COUNTS, perturb_passages

            prompts = passage_prompts(perturb_passages(passages, args.perturb, args.seed), args.seed,
                                      NOVEL_COUNTS, tag="novel")
        else:
            prompts = passage_prompts(passages, args.seed)
    else:
        prompts = training_prompts(args.seed)
    prompts = select_prompts(prompts, args.limit, args.seed)
    items = prepare_items(target, prompts, cfg, log=log if args.worker is None else None)
    if args.skip_answered:
        items = drop_answered(items, args.skip_answered, log=log if args.worker is None else None)
    if args.worker is not None:  # one of several worker processes: generate its shards and stop
        run_generation(target, items, out, cfg, progress=False, log=log, worker=(args.worker, args.workers))
        return
    if args.workers > 1:
        ensure_plan(target, items, out, cfg)
        _run_workers(argv, args.workers, out, len(items), log, progress=not args.no_progress)
    else:
        run_generation(target, items, out, cfg, progress=not args.no_progress, log=log)
    ds_dir = merge_shards(out)
    npz = export_compact(ds_dir, out / "distill.npz")
    recipe = build_recipe(out, cfg, target.describe(), args.dtype, extra={
        "command": "python -m core.training.datagen " + " ".join(argv),
        "limit": args.limit,
        "processes": {"workers": args.workers, "torch_threads_per_worker": args.threads},
        "compact_export": {"file": npz.name, "bytes": npz.stat().st_size},
    })
    _atomic_write_text(out / "recipe.json", json.dumps(recipe, indent=2) + "\n")
    recipe_to = args.recipe if args.recipe is not None else (None if args.limit else str(COMMITTED_RECIPE))
    if recipe_to and recipe_to != "none":
        write_recipe(recipe, recipe_to)
    log(f"done: {recipe['counts']['prompts']} records, {recipe['tokens']['answer_total']} answer tokens "
        f"(mean {recipe['tokens']['answer_mean']}), this invocation took {time.time() - t_start:.0f} s; "
        f"dataset at {ds_dir}, compact copy {npz} ({npz.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
