"""The trainer: teacher-forced self-distillation of any set of drafters on the frozen target.

Each step packs about `batch_tokens` tokens of (prompt + answer) sequences into a
right-padded batch (core.training.data), runs the frozen target over it ONCE (its hidden
states / per-layer keys and values, the union of what the drafters ask for), and hands the
same `TrainBatch` to every drafter's `training_loss`. In joint mode each drafter has its own
AdamW and schedule, so all of them see the same data for the same number of optimiser steps
while the target pass is paid once. (Measured on the project's CPU: the pass is ~1.6 ms/token
against 2.5-5.7 ms/token per drafter, whose vocabulary-sized loss terms dominate; joint
training of five drafters saves about a quarter of the time.) Several processes: `accelerate
launch` on GPUs; on CPUs, `ACCELERATE_USE_CPU=true torchrun --nproc_per_node N`. Each
process takes its own batch. The command line is core.training.train.

Choices worth naming:

* Drafter weights and AdamW states are float32; the target runs in `--dtype` (bfloat16 by
  default). The drafters' forward/backward run under bfloat16 autocast when the target is
  not float32 (`--autocast`; measured ~5% faster and 15% less memory than float32 compute).
* Schedule: linear warm-up over `--warmup` steps, then cosine decay to `--min-lr-ratio` x lr
  at `--steps`. Stopping early (`--time-budget-min`) does not rescale it: a resumed run
  continues the same schedule.
* Held-out evaluation runs `training_loss` in eval mode under a fixed seed on a fixed
  subset of the held-out records, so successive evaluations are comparable. Metrics are
  averaged over batches weighted by their answer tokens.
* Resuming: `out/train_state.pt` (weights, optimisers, schedules, RNG states, data cursor,
  step) is written atomically every `--ckpt-every-min` minutes and on exit; a restart with
  the same arguments continues from it and ends with the same weights as an uninterrupted
  run. Evaluation and export run under a forked RNG so that *when* a checkpoint happens
  never changes the result.

Outputs (single drafter: directly in the run folder; joint: one subfolder per drafter):
log.jsonl, curves.html, final/ (save_pretrained: bfloat16 safetensors + config.json with a
`training` record). Medusa / Amphista get a static tree fitted to their measured held-out
top-k accuracies (StaticTreeMixin.set_tree_from_metrics) in every export. `--publish` copies
final/ and a model card (core.training.publish); logs and curves stay in the run folder.
docs/TRAINING.md tells how the shipped drafters were trained.

The settings are core.training.train_config's `TrainConfig`; saving, resuming and exporting are the methods
`Trainer` inherits from core.training.trainer_files.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from core.drafters.checkpoint import TrainBatch, TrainedDrafter
from core.target import Target
from core.training.data import DataStream, collate, data_sources, eval_subset, make_sequences, target_batch
from core.training.distill_data import find_recipe
from core.training.publish import cumulative_training, init_from_published, publish
from core.training.resume import isolated_rng, lr_factor, peak_memory_gb, truncate_log
from core.training.specs import DrafterSpec, union_needs
from core.training.train_config import AUTO_PLACEHOLDER_STEPS, TrainConfig
from core.training.trainer_files import EVAL_SEED, STATE_FILE, STATE_VERSION, TrainerFiles

# The settings and the files a run writes live in core.training.train_config and core.training.trainer_files; their
# names are part of this module's API too.
__all__ = ["AUTO_PLACEHOLDER_STEPS", "EVAL_SEED", "FIT_AFTER_STEPS", "FIT_SAFETY", "STATE_FILE", "STATE_VERSION",
           "TrainConfig", "Trainer", "threading_main"]

FIT_AFTER_STEPS = 20  # --steps auto: steps timed before the total is fixed
FIT_SAFETY = 0.92  # --steps auto: share of the time left that the fitted steps may use


# ------------------------------------------------------------------------------------------
# The trainer
# ------------------------------------------------------------------------------------------

class _LossModule(torch.nn.Module):
    """forward = drafter.training_loss, so that DistributedDataParallel (accelerate) can wrap it."""

    def __init__(self, drafter: TrainedDrafter) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(self, batch: TrainBatch, progress: float):
        return self.drafter.training_loss(batch, progress)


class _Window:
    """Running sums of train metrics between two log lines."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.skipped = 0  # updates skipped for a non-finite loss or gradient

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for k, v in metrics.items():
            if v is None or not math.isfinite(v):
                continue
            self.sums[k] = self.sums.get(k, 0.0) + v * weight
            self.weights[k] = self.weights.get(k, 0.0) + weight

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}


@dataclass
class _Member:
    spec: DrafterSpec
    model: TrainedDrafter
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    folder: Path
    window: _Window = field(default_factory=_Window)
    last_eval: dict[str, float] = field(default_factory=dict)
    init_record: dict | None = None  # where a continued run started: the published drafter's training record

    @functools.cached_property
    def prior_steps(self) -> int:
        """Optimiser steps of the runs this one continues (0 for a fresh run)."""
        return int(cumulative_training(self.init_record["training"])["steps"]) if self.init_record else 0


class Trainer(TrainerFiles):
    def __init__(self, cfg: TrainConfig, target: Target, records: list[dict], specs: list[DrafterSpec],
                 accelerator=None) -> None:
        from accelerate import Accelerator, DistributedDataParallelKwargs

        self.cfg = cfg
        self.acc = accelerator or Accelerator(
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
        self.device = self.acc.device
        self.main = self.acc.is_main_process
        self.world = self.acc.num_processes
        self.target = target
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        if len({s.name for s in specs}) != len(specs):
            raise ValueError("each drafter may appear once in a joint run")

        train = [r for r in records if r.get("split") != "heldout"]
        heldout = [r for r in records if r.get("split") == "heldout"]
        self.train_seqs = make_sequences(train, cfg.max_len)
        self.heldout_seqs = make_sequences(heldout, cfg.max_len)
        self.stream = DataStream(self.train_seqs, cfg.seed, cfg.batch_tokens)
        self.eval_batches = eval_subset(self.heldout_seqs, cfg.eval_tokens, cfg.batch_tokens)
        self.final_eval_batches = eval_subset(self.heldout_seqs, max(cfg.final_eval_tokens, cfg.eval_tokens),
                                              cfg.batch_tokens)
        self.data_info = {
            "path": str(cfg.data), "train_records": len(self.train_seqs), "heldout_records": len(self.heldout_seqs),
            "train_tokens": int(self.train_seqs.lengths.sum()) if len(self.train_seqs) else 0,
            "train_answer_tokens": int((self.train_seqs.lengths - self.train_seqs.answer_start).sum())
            if len(self.train_seqs) else 0,
            "max_len": cfg.max_len, "prompts_cut": self.train_seqs.cut_prompts + self.heldout_seqs.cut_prompts,
        }
        sources = data_sources(cfg.data)
        if len(sources) > 1:
            self.data_info["sources"] = [{"path": path, "repeats": n, "recipe": str(find_recipe(path) or "")}
                                         for path, n in sources]
        recipe = find_recipe(sources[0][0])
        if recipe:
            self.data_info["recipe"] = str(recipe)
            with contextlib.suppress(ValueError, OSError):
                meta = json.loads(recipe.read_text())
                self.data_info["recipe_counts"] = {**meta.get("counts", {}), **meta.get("tokens", {})}

        use_autocast = {"on": True, "off": False, "auto": target.dtype != torch.float32}[cfg.autocast]
        self.autocast_dtype = target.dtype if target.dtype != torch.float32 else torch.bfloat16
        self.use_autocast = use_autocast

        target_ids = {id(p) for p in target.hf_model.parameters()}
        self.members: list[_Member] = []
        for spec in specs:
            if cfg.init_from:
                model = init_from_published(spec, target, cfg.init_from, single=len(specs) == 1)
            else:
                model = spec.cls.random(target, seed=cfg.seed, **spec.hyper)
                self._choose_draft_vocab(model, train)
            own = [p for p in model.parameters() if id(p) not in target_ids]
            with torch.no_grad():
                for p in own:  # float32 master weights; the target's own modules stay as they are
                    p.data = p.data.to(device=self.device, dtype=torch.float32)
            model.train()
            params = [p for p in own if p.requires_grad]
            if not params:
                raise ValueError(f"drafter {spec.name} has no trainable parameters")
            wrapped = self.acc.prepare_model(_LossModule(model)) if self.world > 1 else _LossModule(model)
            opt = torch.optim.AdamW(self._param_groups(model, params, cfg.lr_for(spec.name)),
                                    lr=cfg.lr_for(spec.name), betas=tuple(cfg.betas),
                                    weight_decay=cfg.weight_decay)
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: lr_factor(s, cfg.warmup, cfg.steps, cfg.min_lr_ratio))
            folder = self.out if len(specs) == 1 else self.out / spec.name
            folder.mkdir(parents=True, exist_ok=True)
            self.members.append(_Member(spec, model, wrapped, opt, sched, folder,
                                        init_record=getattr(model, "init_record", None)))
        self.needs = union_needs([m.model for m in self.members])
        torch.manual_seed(cfg.seed * 1_000_003 + self.acc.process_index)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)

        self.step = 0
        self.tokens = 0
        self.elapsed_prior = 0.0  # wall seconds of earlier sessions of this run
        self.final_eval_step = -1  # step at which the final evaluation ran (a rerun after the end skips it)
        self.stop_requested = False

    def _param_groups(self, model: TrainedDrafter, params: list, lr: float) -> list[dict]:
        """AdamW groups: the base group first (logged as the run's lr), then one per other multiplier. The parts a
        continued drafter builds afresh get new_param_lr_mult; param_lr_mult's longest matching prefix wins."""
        cfg = self.cfg
        fresh = tuple(getattr(model, "fresh_prefixes", ()))
        wanted = {id(p) for p in params}
        by_mult: dict[float, list] = {1.0: []}
        for name, p in model.named_parameters():
            if id(p) not in wanted:
                continue
            mult = cfg.new_param_lr_mult if fresh and name.startswith(fresh) else 1.0
            matches = [k for k in cfg.param_lr_mult if name.startswith(k)]
            if matches:
                mult = cfg.param_lr_mult[max(matches, key=len)]
            by_mult.setdefault(mult, []).append(p)
        unused = [k for k in cfg.param_lr_mult if not any(n.startswith(k) for n, _ in model.named_parameters())]
        if unused:
            raise ValueError(f"--param-lr-mult {unused[0]!r}: no parameter of {type(model).__name__} starts with it "
                             f"(they start with: {sorted({n.split('.')[0] for n, _ in model.named_parameters()})})")
        return [{"params": by_mult[1.0]}] + [{"params": ps, "lr": lr * m} for m, ps in by_mult.items() if m != 1.0]

    def _choose_draft_vocab(self, model: TrainedDrafter, train: list[dict]) -> None:
        """A reduced drafting vocabulary (core.drafters.draft_vocab) is the most frequent answer tokens."""
        vocab = getattr(model, "vocab", None)
        if vocab is None or vocab.full:
            return
        from core.drafters.draft_vocab import frequent_tokens

        ids = frequent_tokens((r["answer_ids"] for r in train), vocab.ids.numel(), always=self.target.eos_token_ids,
                              fallback=(r["prompt_ids"] for r in train))
        vocab.set_ids(ids)

    # ----- pieces --------------------------------------------------------------------------
    def _autocast(self):
        if not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _batch_indices(self) -> list[int]:
        """This process's batch for the step: the step takes `world` consecutive batches of the stream."""
        mine = None
        for r in range(self.world):
            b = self.stream.next()
            if r == self.acc.process_index:
                mine = b
        return mine

    @torch.no_grad()
    def evaluate(self, batches: list[list[int]]) -> dict[str, dict[str, float]]:
        """Held-out metrics per drafter (main process only), under a fixed seed."""
        if not batches:
            return {}
        sums = {m.spec.name: _Window() for m in self.members}
        with isolated_rng(EVAL_SEED, self.device):
            for m in self.members:
                m.model.eval()
            try:
                for idx in batches:
                    ids, lm, attn = collate(self.heldout_seqs, idx, self.device)
                    batch = target_batch(self.target, self.needs, ids, lm, attn)
                    weight = float(lm.sum())
                    batch_tokens = ids.unique()
                    for m in self.members:
                        m.model.observe_batch(batch_tokens)
                        with self._autocast():
                            loss, metrics = m.model.training_loss(batch, self._progress(m))
                        sums[m.spec.name].add({**metrics, "loss": float(loss)}, weight)
            finally:
                for m in self.members:
                    m.model.train()
        return {name: w.means() for name, w in sums.items()}

    def _fit_steps(self, timed_steps: int, timed_s: float) -> None:
        """--steps auto: fix the total so that training, evaluations and the final export fit the budget.

        Until then the total is AUTO_PLACEHOLDER_STEPS, over which the cosine decay is flat, so the
        steps taken before the fit follow warm-up or the full learning rate.
        """
        cfg = self.cfg
        per_step = timed_s / max(1, timed_steps)
        eval_s = self.eval_seconds or 0.0
        final_eval_s = eval_s * max(1.0, cfg.final_eval_tokens / max(1, cfg.eval_tokens))
        left = 60 * cfg.time_budget_min - (time.time() - self.session_start)
        usable = FIT_SAFETY * left - final_eval_s - 2 * self.export_seconds
        per_step_all = per_step + (eval_s / cfg.eval_every if cfg.eval_every > 0 else 0.0)
        more = max(1, int(usable / per_step_all))
        fitted = torch.tensor([self.step + more], device=self.device)
        if self.world > 1:
            from accelerate.utils import broadcast

            fitted = broadcast(fitted, from_process=0)
        cfg.steps = int(fitted.item())  # may end inside warm-up: the budget wins
        if self.main:
            print(f"\n[train] --steps auto: {per_step * 1000:.0f} ms/step, eval {eval_s:.1f} s; "
                  f"training runs to step {cfg.steps}", file=sys.stderr)

    def _progress(self, member: _Member) -> float:
        """The fraction of the drafter's whole training done: a continued run (--init-from) counts the
        steps of the runs it continues, so curricula such as MoA's staircase mask run once, not per phase."""
        prior = 0 if self.cfg.curriculum_restart else member.prior_steps
        steps = self.cfg.steps
        if steps == AUTO_PLACEHOLDER_STEPS and prior:  # --steps auto, not fitted yet: the run's own length is
            steps = max(self.step, FIT_AFTER_STEPS)      # unknown, so only the earlier runs count
        return min(1.0, (prior + self.step) / max(1, prior + steps))

    def _run_eval(self, final: bool = False) -> None:
        if not self.main:
            return
        batches = self.final_eval_batches if final else self.eval_batches
        if not batches:
            return
        t0 = time.time()
        results = self.evaluate(batches)
        if not final:
            self.eval_seconds = time.time() - t0
        n_tok = sum(len(self.heldout_seqs.ids[i]) for b in batches for i in b)
        for m in self.members:
            m.last_eval = results[m.spec.name]
            self._log(m, {"split": "heldout", "step": self.step, "tokens": self.tokens, "final": final,
                          "eval_tokens": n_tok, "eval_s": round(time.time() - t0, 2), **m.last_eval})

    # ----- the loop ------------------------------------------------------------------------
    def _flags(self, ckpt: bool, stop: bool) -> tuple[bool, bool]:
        """The main process decides when to checkpoint / stop; the others follow (no deadlock)."""
        if self.world == 1:
            return ckpt, stop
        from accelerate.utils import broadcast

        t = broadcast(torch.tensor([int(ckpt), int(stop)], device=self.device), from_process=0)
        return bool(t[0]), bool(t[1])

    def train_step(self) -> None:
        idx = self._batch_indices()
        ids, lm, attn = collate(self.train_seqs, idx, self.device)
        n_tok = int(attn.sum()) * self.world
        t0 = time.time()
        batch = target_batch(self.target, self.needs, ids, lm, attn)
        t_target = time.time() - t0
        weight = float(lm.sum())
        batch_tokens = ids.unique()
        for m in self.members:
            t1 = time.time()
            m.model.observe_batch(batch_tokens)
            with self._autocast():
                loss, metrics = m.wrapped(batch, self._progress(m))
            m.optimizer.zero_grad(set_to_none=True)
            if loss.requires_grad:  # a batch without a single scored token gives a constant loss
                self.acc.backward(loss)
            gnorm = torch.nn.utils.clip_grad_norm_(
                [p for g in m.optimizer.param_groups for p in g["params"]], self.cfg.clip)
            lr = m.optimizer.param_groups[0]["lr"]
            finite = bool(torch.isfinite(loss.detach())) and bool(torch.isfinite(gnorm))
            if finite:
                m.optimizer.step()
            else:  # skip the update (the schedule still advances, so steps stay aligned across drafters)
                m.optimizer.zero_grad(set_to_none=True)
            m.scheduler.step()
            if finite:
                m.window.add({**metrics, "loss": float(loss.detach()), "grad_norm": float(gnorm), "lr": lr}, weight)
            else:
                m.window.skipped += 1
            m.window.add({"sec_drafter": time.time() - t1}, 1.0)
        for m in self.members:
            m.window.add({"sec_target": t_target, "batch_rows": float(len(idx)), "batch_len": float(ids.shape[1])},
                         1.0)
        self.step += 1
        self.tokens += n_tok

    def run(self) -> dict[str, dict[str, float]]:
        cfg = self.cfg
        self.session_start = time.time()
        resumed = self.load_state()
        self.last_ckpt = time.time()
        if self.main:
            print(f"[train] {'resumed at step ' + str(self.step) if resumed else 'starting'}: "
                  f"{', '.join(m.spec.name for m in self.members)} | {len(self.train_seqs)} train / "
                  f"{len(self.heldout_seqs)} held-out sequences | target needs {self.needs} | "
                  f"autocast {self.use_autocast} | device {self.device} x{self.world}", file=sys.stderr)
        old_handlers = {}
        if threading_main():
            def _on_signal(signum, frame):
                # First SIGTERM / Ctrl-C: finish the step, save, exit. A second Ctrl-C interrupts at once.
                self.stop_requested = True
                signal.signal(signal.SIGINT, signal.default_int_handler)
            for sig in (signal.SIGTERM, signal.SIGINT):
                old_handlers[sig] = signal.signal(sig, _on_signal)
        if not resumed and self.main:  # a fresh run (or --restart) starts fresh logs
            for m in self.members:
                truncate_log(m.folder / "log.jsonl", -1)
        bar = None
        if self.main and cfg.progress_bar:
            from tqdm import tqdm

            total = None if cfg.steps == AUTO_PLACEHOLDER_STEPS else cfg.steps
            bar = tqdm(total=total, initial=self.step, desc="train", file=sys.stderr, dynamic_ncols=True)
        window_start, window_tokens = time.time(), 0
        self.eval_seconds, self.export_seconds = None, 5.0
        try:
            if self.step == 0 and cfg.eval_every > 0 and self.step < cfg.steps:
                self._run_eval()
            fitting = cfg.steps == AUTO_PLACEHOLDER_STEPS  # --steps auto, not fitted yet (or resumed before it)
            fit_from, fit_t0 = self.step + 2, None  # skip two steps of one-off start-up cost
            while self.step < cfg.steps:
                if fitting and self.step == fit_from:
                    fit_t0 = time.time()
                tok_before = self.tokens
                self.train_step()
                if fitting and fit_t0 is not None and self.step == fit_from + FIT_AFTER_STEPS:
                    self._fit_steps(FIT_AFTER_STEPS, time.time() - fit_t0)
                    fitting = False
                    if bar is not None:
                        bar.total = cfg.steps
                        bar.refresh()
                window_tokens += self.tokens - tok_before
                if bar is not None:
                    bar.update(1)
                if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                    dt = time.time() - window_start
                    for i, m in enumerate(self.members):
                        means = m.window.means()
                        if i == 0 and bar is not None:
                            bar.set_postfix(tok_s=f"{window_tokens / max(dt, 1e-9):.0f}",
                                            loss=f"{means.get('loss', float('nan')):.3f}")
                        self._log(m, {"split": "train", "step": self.step, "tokens": self.tokens,
                                      "tok_s": round(window_tokens / max(dt, 1e-9), 1),
                                      "peak_mem_gb": peak_memory_gb(self.device),
                                      **({"skipped": m.window.skipped} if m.window.skipped else {}),
                                      "elapsed_s": round(self.elapsed_prior + time.time() - self.session_start, 1),
                                      **means})
                        m.window = _Window()
                    window_start, window_tokens = time.time(), 0
                if cfg.eval_every > 0 and self.step % cfg.eval_every == 0 and self.step < cfg.steps:
                    self._run_eval()
                session = time.time() - self.session_start
                stop = (self.stop_requested or (cfg.time_budget_min is not None and session >= 60 * cfg.time_budget_min)
                        or (cfg.stop_at_step is not None and self.step >= cfg.stop_at_step))
                ckpt = time.time() - self.last_ckpt >= 60 * cfg.ckpt_every_min
                ckpt, stop = self._flags(ckpt, stop)
                if stop and self.step < cfg.steps:
                    if self.main:
                        print(f"\n[train] stopping at step {self.step} (time budget / signal / stop-at-step); "
                              f"rerun the same command to resume", file=sys.stderr)
                    self.checkpoint(complete=False)
                    return {m.spec.name: m.last_eval for m in self.members}
                if ckpt:
                    self.checkpoint(complete=False)
            if self.final_eval_step != self.step:
                self._run_eval(final=True)
                self.final_eval_step = self.step
            self.acc.wait_for_everyone()
            self.checkpoint(complete=True)
            if cfg.publish and self.main:
                for m in self.members:
                    dest = Path(cfg.publish) if len(self.members) == 1 else Path(cfg.publish) / m.spec.name
                    publish(m.folder, dest, m.spec.name)
                    print(f"[train] published {m.spec.name} to {dest}", file=sys.stderr)
        finally:
            if bar is not None:
                bar.close()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        return {m.spec.name: m.last_eval for m in self.members}


def threading_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
