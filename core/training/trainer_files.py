"""What a training run writes and reads back, as methods of `Trainer` (core.training.trainer inherits them):
train_state.pt (weights, optimisers, schedules, RNG states, data cursor, step; written atomically, checked
against the run's arguments when resumed), the log.jsonl lines, and final/ (save_pretrained with the training
record, swapped in atomically) with curves.html. They read the trainer's attributes (cfg, members, step, stream).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from core.training.resume import (
    atomic_torch_save,
    hardware,
    isolated_rng,
    load_training_state,
    rng_state,
    set_rng_state,
    truncate_log,
)

if TYPE_CHECKING:
    from core.training.trainer import _Member

STATE_FILE = "train_state.pt"
STATE_VERSION = 1
EVAL_SEED = 1234


class TrainerFiles:
    """The trainer's state file, logs and exports (mixed into `Trainer`)."""

    # ----- state ---------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.out / STATE_FILE

    def save_state(self) -> None:
        if not self.main:
            return
        state = {
            "version": STATE_VERSION, "step": self.step, "tokens": self.tokens, "final_eval_step": self.final_eval_step,
            "elapsed_s": self.elapsed_prior + (time.time() - self.session_start),
            "cursor": self.stream.state_dict(), "args": self.cfg.result_args(), "rng": rng_state(),
            "drafters": {m.spec.name: {"model": m.model.state_dict(), "optimizer": m.optimizer.state_dict(),
                                       "scheduler": m.scheduler.state_dict(), "last_eval": m.last_eval}
                         for m in self.members},
        }
        atomic_torch_save(state, self.state_path)

    def load_state(self) -> bool:
        if self.cfg.restart or not self.state_path.exists():
            return False
        state = load_training_state(self.state_path)  # weights_only=True: the folder is the user's
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"{self.state_path} has format version {state.get('version')}, expected {STATE_VERSION}")
        if self.cfg.fit_steps:  # a fitted run resumes with the total it fixed
            self.cfg.steps = int(state["args"]["steps"])
        now = self.cfg.result_args()
        if state["args"] != now:
            diff = sorted(k for k in now if state["args"].get(k) != now[k])
            raise ValueError(f"{self.state_path} was written with different arguments ({', '.join(diff)}); "
                             f"rerun with the same ones to resume, or pass --restart / another --out")
        for m in self.members:
            s = state["drafters"][m.spec.name]
            m.model.load_state_dict(s["model"])
            m.optimizer.load_state_dict(s["optimizer"])
            m.scheduler.load_state_dict(s["scheduler"])
            m.last_eval = s.get("last_eval", {})
        self.step, self.tokens, self.elapsed_prior = state["step"], state["tokens"], state["elapsed_s"]
        self.final_eval_step = state.get("final_eval_step", -1)
        self.stream.load_state_dict(state["cursor"])
        set_rng_state(state["rng"])
        if self.world > 1:  # only the main process's RNG is saved; the others restart from a derived seed
            torch.manual_seed(self.cfg.seed * 1_000_003 + self.step * 7919 + self.acc.process_index)
        for m in self.members if self.main else []:  # drop log lines past the checkpoint (an interrupted tail)
            truncate_log(m.folder / "log.jsonl", self.step)
        return True

    def _log(self, member: _Member, row: dict) -> None:
        if not self.main:
            return
        with open(member.folder / "log.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    def training_record(self, member: _Member, complete: bool) -> dict:
        elapsed = self.elapsed_prior + (time.time() - self.session_start)
        cfg = self.cfg
        return {
            "complete": complete, "steps": self.step, "planned_steps": cfg.steps, "tokens": self.tokens,
            "wall_time_s": round(elapsed, 1), "hardware": {**hardware(), "processes": self.world},
            "data": self.data_info, "lr": cfg.lr_for(member.spec.name), "warmup": cfg.warmup,
            "min_lr_ratio": cfg.min_lr_ratio, "batch_tokens": cfg.batch_tokens, "seed": cfg.seed,
            "target_dtype": cfg.dtype, "autocast": self.use_autocast,
            "joint_with": [m.spec.name for m in self.members if m is not member],
            **({"init_from": member.init_record} if member.init_record else {}),
            "heldout": {k: round(v, 5) for k, v in member.last_eval.items()
                        if k == "loss" or k.startswith("acc") or k.startswith("loss")},
        }

    def export(self, complete: bool) -> None:
        """save_pretrained to <folder>/final (swapped in atomically) and redraw curves.html."""
        if not self.main:
            return
        from core.training.curves import write_curves

        for m in self.members:
            with isolated_rng(EVAL_SEED, self.device):
                if hasattr(m.model, "set_tree_from_metrics") and "top1@1" in m.last_eval:
                    m.model.set_tree_from_metrics(m.last_eval)
            final, tmp, old = m.folder / "final", m.folder / "final.tmp", m.folder / "final.old"
            shutil.rmtree(tmp, ignore_errors=True)
            m.model.save_pretrained(tmp, extra={"name": m.spec.name, "training": self.training_record(m, complete)})
            if final.exists():
                shutil.rmtree(old, ignore_errors=True)
                final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
            log = m.folder / "log.jsonl"
            if log.exists():
                write_curves(log, m.folder / "curves.html", title=f"{m.spec.name} training")

    def checkpoint(self, complete: bool = False) -> None:
        t0 = time.time()
        self.save_state()
        self.export(complete)
        self.last_ckpt = time.time()
        self.export_seconds = self.last_ckpt - t0
