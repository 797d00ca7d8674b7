"""One trainer for every drafter: teacher-forced self-distillation on the frozen target (docs/TRAINING.md).

    python -m core.training.train --drafter moa --data data/distill/dataset --out runs/moa \\
        --steps 4000 --batch-tokens 4096 [--time-budget-min 60] [--publish assets/drafters/moa]
    python -m core.training.train --drafters eagle2,moa,medusa --out runs/joint ...   # joint
    accelerate launch -m core.training.train ...                                      # several GPUs

This module is the command line. The pieces: core.training.data (sequences, packing, loading
`--data`), core.training.trainer (the Trainer and its choices), core.training.resume (schedule,
RNG, atomic saves), core.training.publish (`--publish`, model cards, `--init-from`).
How the shipped drafters were trained: docs/TRAINING.md.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any

import torch

from core.target import Target, resolve_dtype
from core.training.data import load_records
from core.training.specs import resolve_spec
from core.training.train_config import AUTO_PLACEHOLDER_STEPS, TrainConfig
from core.training.trainer import Trainer


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_lr(text: str) -> tuple[float, dict[str, float]]:
    """"3e-4" or "3e-4,medusa=1e-3": the base lr and per-drafter overrides."""
    base, over = None, {}
    for part in text.split(","):
        part = part.strip()
        k, sep, v = part.rpartition("=")
        try:
            value = float(v)
        except ValueError:
            raise ValueError(f"--lr {text!r}: {v!r} is not a number (expected e.g. 3e-4 or 3e-4,medusa=1e-3)") from None
        if sep:
            over[k.strip()] = value
        elif part:
            base = value
    if base is None:
        raise ValueError(f"--lr {text!r} has no base learning rate")
    return base, over


def parse_hyper(items: list[str], names: list[str]) -> dict[str, dict[str, Any]]:
    """`key=value` (every drafter) or `name.key=value` (one drafter); values parsed as JSON when they can be."""
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--hyper {item!r}: expected key=value or drafter.key=value")
        key, value = item.split("=", 1)
        if "." in key:
            name, key = key.split(".", 1)
            if name not in out:
                raise ValueError(f"--hyper {item!r}: {name!r} is not one of the drafters being trained")
            out[name][key] = _parse_value(value)
        else:
            for n in names:
                out[n][key] = _parse_value(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m core.training.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--drafter", help="eagle2, moa, moa-tliN (N = 1, 2, 3), medusa or amphista; METHOD@NAME for "
                                       "a variant with its own --hyper NAME.key=value (core.methods' names)")
    who.add_argument("--drafters", help="comma-separated: train these jointly on the same batches")
    p.add_argument("--data", default="data/distill/dataset",
                   help="distillation data (Arrow folder or .npz); several comma-separated, each optionally "
                        "'*K' to repeat its training records K times (e.g. old.npz,new.npz*3)")
    p.add_argument("--out", default=None, help="run folder (default runs/<name>, or runs/joint-<names>)")
    p.add_argument("--target", default="smollm2", help="target model ('smollm2', a folder, or 'tiny' for tests)")
    p.add_argument("--steps", default="1000",
                   help="optimiser steps, or 'auto' (needs --time-budget-min): timed after a few steps, then "
                        "fixed so that training, evaluations and export end inside the budget")
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--lr", default="3e-4", help="learning rate, optionally with overrides: 3e-4,medusa=1e-3")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clipping")
    p.add_argument("--seed", default="0", help="a whole number: batch order, initialisation, the curricula's draws")
    p.add_argument("--hyper", action="append", default=[], help="key=value or drafter.key=value (repeatable)")
    p.add_argument("--dtype", default="bfloat16", help="target dtype (bfloat16, float32)")
    p.add_argument("--autocast", choices=["auto", "on", "off"], default="auto",
                   help="bfloat16 autocast for the drafters (auto: on unless the target is float32)")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-tokens", type=int, default=8192, help="held-out tokens per periodic evaluation")
    p.add_argument("--final-eval-tokens", type=int, default=32768, help="held-out tokens for the final evaluation")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-every-min", type=float, default=4.0)
    p.add_argument("--time-budget-min", type=float, default=None, help="stop cleanly (saving) after this long")
    p.add_argument("--stop-at-step", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--publish", default=None,
                   help="copy the result to this folder (joint runs: one subfolder per drafter)")
    p.add_argument("--restart", action="store_true", help="ignore an existing train_state.pt")
    p.add_argument("--init-from", default=None,
                   help="continue training published drafters: a folder with one subfolder per drafter name")
    p.add_argument("--new-param-lr-mult", type=float, default=1.0,
                   help="with --init-from: parts the continued drafter builds afresh train at lr x this")
    p.add_argument("--param-lr-mult", action="append", default=[], metavar="PREFIX=X",
                   help="parameters whose name starts with PREFIX (e.g. ca.o_proj) train at lr x X; repeatable")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: CUDA when there is one, else the CPU; cpu: a dry run of a GPU recipe")
    p.add_argument("--curriculum-restart", action="store_true",
                   help="with --init-from: run curricula (MoA's staircase) over this run's steps, as a fresh run does")
    p.add_argument("--no-progress", action="store_true")
    return p


def parse_param_lr_mult(items: list[str]) -> dict[str, float]:
    """["ca.o_proj=10", ...] -> {"ca.o_proj": 10.0}; a one-line ValueError naming a bad item."""
    out = {}
    for item in items:
        prefix, sep, value = item.partition("=")
        try:
            mult = float(value)
        except ValueError:
            mult = float("nan")
        if not sep or not prefix.strip() or not mult > 0:
            raise ValueError(f"--param-lr-mult {item!r}: expected PREFIX=X with a parameter-name prefix and X > 0, "
                             f"e.g. ca.o_proj=10")
        out[prefix.strip()] = mult
    return out


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    names = [args.drafter] if args.drafter else [n.strip() for n in args.drafters.split(",") if n.strip()]
    from core.cli_checks import check_seed

    args.seed = check_seed(args.seed, high=2**63 - 1)  # torch.manual_seed takes a signed 64-bit seed
    lr, over = parse_lr(args.lr)
    unknown = sorted(set(over) - set(names))
    if unknown:
        raise ValueError(f"--lr {args.lr!r}: {', '.join(unknown)} is not a drafter being trained "
                         f"({', '.join(names)})")
    for label, value in (("--lr", lr), *((f"--lr {k}=", v) for k, v in over.items())):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be a finite number > 0, got {value}")
    if args.time_budget_min is not None and not (math.isfinite(args.time_budget_min) and args.time_budget_min > 0):
        raise ValueError(f"--time-budget-min must be a number of minutes > 0, got {args.time_budget_min}")
    for flag, value, low in (("--batch-tokens", args.batch_tokens, 1), ("--max-len", args.max_len, 2),
                             ("--warmup", args.warmup, 0), ("--eval-every", args.eval_every, 0),
                             ("--eval-tokens", args.eval_tokens, 1), ("--final-eval-tokens", args.final_eval_tokens, 1),
                             ("--log-every", args.log_every, 1)):
        if value < low:
            raise ValueError(f"{flag} must be at least {low}, got {value}")
    for flag, value in (("--min-lr-ratio", args.min_lr_ratio), ("--weight-decay", args.weight_decay),
                        ("--clip", args.clip), ("--ckpt-every-min", args.ckpt_every_min)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{flag} must be a finite number >= 0, got {value}")
    out = args.out or ("runs/" + (names[0] if len(names) == 1 else "joint-" + "-".join(names)))
    fit_steps = str(args.steps).strip().lower() == "auto"
    if fit_steps and not args.time_budget_min:
        raise ValueError("--steps auto needs --time-budget-min (the time the fitted steps must fit in)")
    try:
        steps = AUTO_PLACEHOLDER_STEPS if fit_steps else int(args.steps)
    except ValueError:
        raise ValueError(f"--steps must be a whole number or 'auto', not {args.steps!r}") from None
    if steps < 1:
        raise ValueError("--steps must be at least 1")
    if not args.new_param_lr_mult > 0:
        raise ValueError(f"--new-param-lr-mult must be above 0, not {args.new_param_lr_mult}")
    if args.curriculum_restart and not args.init_from:
        raise ValueError("--curriculum-restart applies only with --init-from (a fresh run's curricula start at step 0)")
    if args.new_param_lr_mult != 1.0 and not args.init_from:
        raise ValueError("--new-param-lr-mult applies only with --init-from (the parts a continued drafter builds "
                         "afresh); a fresh run trains every part at --lr")
    return TrainConfig(
        drafters=names, out=out, data=args.data, target=args.target, steps=steps, fit_steps=fit_steps,
        batch_tokens=args.batch_tokens,
        max_len=args.max_len, lr=lr, lr_overrides=over, warmup=args.warmup, min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay, clip=args.clip, seed=args.seed, hyper=parse_hyper(args.hyper, names),
        dtype=args.dtype, autocast=args.autocast, eval_every=args.eval_every, eval_tokens=args.eval_tokens,
        final_eval_tokens=args.final_eval_tokens, log_every=args.log_every, ckpt_every_min=args.ckpt_every_min,
        time_budget_min=args.time_budget_min, stop_at_step=args.stop_at_step, publish=args.publish,
        new_param_lr_mult=args.new_param_lr_mult, param_lr_mult=parse_param_lr_mult(args.param_lr_mult),
        restart=args.restart, progress_bar=not args.no_progress, init_from=args.init_from,
        curriculum_restart=args.curriculum_restart)


def load_training_target(name: str, dtype: str, device: torch.device) -> Target:
    from core.target import load_target, tiny_target

    if name == "tiny":  # a random tiny Llama: for smoke tests of the command line
        target = tiny_target(dtype=resolve_dtype(dtype))
        target.hf_model.to(device)
        return target
    return load_target(None if name == "smollm2" else name, dtype=dtype, device=device)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    try:  # every option checked before the target loads or a step runs: one line each, no traceback
        cfg = config_from_args(args)
        specs = [resolve_spec(n, cfg.hyper.get(n)) for n in cfg.drafters]
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    try:  # before the target loads: a wrong --data fails at once, with a message
        records = load_records(cfg.data)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    from accelerate import Accelerator, DistributedDataParallelKwargs

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device here; use --device auto or cpu")
    acc = Accelerator(cpu=args.device == "cpu",
                      kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    target = load_training_target(cfg.target, cfg.dtype, acc.device)
    trainer = Trainer(cfg, target, records, specs, accelerator=acc)
    del records  # the trainer keeps compact token arrays only
    result = trainer.run()
    if acc.is_main_process:
        brief = {name: {k: round(v, 4) for k, v in m.items() if k == "loss" or re.fullmatch(r"acc@\d+", k)}
                 for name, m in result.items()}
        print(json.dumps({"out": cfg.out, "step": trainer.step, "tokens": trainer.tokens, "heldout": brief}))
    return result


if __name__ == "__main__":
    main()
