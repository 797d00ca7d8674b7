"""One trainer for every drafter: teacher-forced self-distillation on the frozen target (DESIGN.md section 8).

    python -m core.training.train --drafter moa --data data/distill/dataset --out runs/moa \\
        --steps 4000 --batch-tokens 4096 [--time-budget-min 60] [--publish assets/drafters/moa]
    python -m core.training.train --drafters eagle2,moa,medusa --out runs/joint ...   # joint
    accelerate launch -m core.training.train ...                                      # several GPUs

Each step packs about `--batch-tokens` tokens of (prompt + answer) sequences into a
right-padded batch, runs the frozen target over it ONCE (its hidden states / per-layer
keys and values, the union of what the drafters ask for), and hands the same
`TrainBatch` to every drafter's `training_loss`. In joint mode (`--drafters a,b,c`) each
drafter has its own AdamW and schedule, so all of them see the same data for the same
number of optimiser steps while the target pass is paid once. (Measured on the project's
CPU: the pass is ~1.6 ms/token against 2.5-5.7 ms/token per drafter, whose vocabulary-sized
loss terms dominate; joint training of five drafters saves about a quarter of the time.)
Several processes: `accelerate launch` on GPUs; on CPUs, `ACCELERATE_USE_CPU=true torchrun
--nproc_per_node N -m core.training.train ...` (gloo). Each process takes its own batch.

Choices worth naming:

* Sequences are prompt_ids + answer_ids cut to `--max-len`; loss_mask marks answer tokens.
  When a prompt leaves less than half the window to its answer, the prompt loses tokens
  from its *start* instead (the target's activations are computed on the cut sequence, so
  the training pairs stay exact; only the context is shorter).
* Batches: per epoch a seeded permutation, cut into windows of 512 sequences, each window
  sorted by length and packed greedily (rows x longest row <= batch tokens), then the
  batches shuffled. The order depends only on (seed, epoch): the data cursor is
  (epoch, batch index).
* Drafter weights and AdamW states are float32; the target runs in `--dtype` (bfloat16 by
  default). The drafters' forward/backward run under bfloat16 autocast when the target is
  not float32 (`--autocast`; measured ~5% faster and 15% less memory than float32 compute).
* Schedule: linear warm-up over `--warmup` steps, then cosine decay to `--min-lr-ratio` x lr
  at `--steps`. Stopping early (`--time-budget-min`) does not rescale it: a resumed run
  continues the same schedule.
* Held-out evaluation runs `training_loss` in eval mode under a fixed seed on a fixed
  subset of the `split == "heldout"` records (the first `--eval-tokens` tokens of a seeded
  shuffle), so successive evaluations are comparable. Metrics are averaged over batches
  weighted by their answer tokens.
* Resuming: `out/train_state.pt` (weights, optimisers, schedules, RNG states, data cursor,
  step) is written atomically every `--ckpt-every-min` minutes and on exit; a restart with
  the same arguments continues from it and ends with the same weights as an uninterrupted
  run. Evaluation and export run under a forked RNG so that *when* a checkpoint happens
  never changes the result.

Outputs (single drafter: directly in --out; joint: in --out/<name>/ per drafter):
log.jsonl, curves.html, final/ (save_pretrained: bfloat16 safetensors + config.json with a
`training` record). Medusa / Amphista get a static tree fitted to their measured held-out
top-k accuracies (StaticTreeMixin.set_tree_from_metrics) in every export.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.drafters.base import TargetNeeds
from core.drafters.checkpoint import TrainBatch, TrainedDrafter
from core.target import Target, resolve_dtype
from core.training.datagen import COMMITTED_RECIPE, find_recipe

STATE_FILE = "train_state.pt"
STATE_VERSION = 1
PACK_WINDOW = 512
EVAL_SEED = 1234
FIT_AFTER_STEPS = 20  # --steps auto: steps timed before the total is fixed
FIT_SAFETY = 0.92  # --steps auto: share of the time left that the fitted steps may use
AUTO_PLACEHOLDER_STEPS = 10**9  # the total before it is fitted (only warm-up happens by then)
EVAL_SHUFFLE_SEED = 0  # the held-out subset is the same whatever the training seed
TAU_PLACEHOLDER = "tau on the evaluation prompts: see assets/results"


# ------------------------------------------------------------------------------------------
# Drafters by name
# ------------------------------------------------------------------------------------------

@dataclass
class DrafterSpec:
    """A drafter to train: output name, class, and the hyper-parameters passed to `cls.random`."""

    name: str
    cls: type[TrainedDrafter]
    hyper: dict[str, Any] = field(default_factory=dict)


def resolve_spec(name: str, hyper: dict[str, Any] | None = None) -> DrafterSpec:
    """`eagle2`, `moa`, `moa-tliN` (MoA with tli=N), `medusa`, `amphista` -> a DrafterSpec."""
    from core.drafters.registry import TRAINED, drafter_class

    method, extra = name, {}
    m = re.fullmatch(r"moa-tli(\d+)", name)
    if m:
        method, extra = "moa", {"tli": int(m.group(1))}
    if method not in TRAINED:
        raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(TRAINED)} or moa-tliN")
    return DrafterSpec(name, drafter_class(method), {**extra, **(hyper or {})})


def train_needs(model: TrainedDrafter) -> TargetNeeds:
    return getattr(model, "train_needs", None) or model.needs


def union_needs(models: list[TrainedDrafter]) -> TargetNeeds:
    layers = sorted({i for m in models for i in train_needs(m).hidden_layers})
    return TargetNeeds(hidden_layers=tuple(layers), layer_kv=any(train_needs(m).layer_kv for m in models))


# ------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------

@dataclass
class Sequences:
    """Token sequences (prompt + answer, cut to max_len) and where each answer starts."""

    ids: list[np.ndarray]
    answer_start: np.ndarray
    cut_prompts: int = 0  # how many prompts lost tokens from their start

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)


def make_sequences(records: list[dict], max_len: int) -> Sequences:
    """prompt + answer per record; records without answer tokens are skipped (module docstring for the cut)."""
    ids, starts, cut = [], [], 0
    for r in records:
        prompt, answer = list(r["prompt_ids"]), list(r["answer_ids"])
        if not answer:
            continue
        n_ans = min(len(answer), max(max_len - len(prompt), max_len // 2))
        n_prompt = min(len(prompt), max_len - n_ans)
        if n_prompt < len(prompt):
            cut += 1
        seq = prompt[len(prompt) - n_prompt:] + answer[:n_ans]
        ids.append(np.asarray(seq, dtype=np.int64))
        starts.append(n_prompt)
    return Sequences(ids, np.asarray(starts, dtype=np.int64), cut)


def pack(order: np.ndarray, lengths: np.ndarray, batch_tokens: int, window: int = PACK_WINDOW) -> list[list[int]]:
    """Batches of sequence indices: windows of `order` sorted by length, packed while rows x longest <= budget."""
    batches = []
    for s in range(0, len(order), window):
        chunk = sorted(order[s:s + window].tolist(), key=lambda i: (-int(lengths[i]), i))
        cur: list[int] = []
        for i in chunk:
            longest = int(lengths[cur[0]]) if cur else int(lengths[i])
            if cur and (len(cur) + 1) * longest > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    return batches


def epoch_batches(lengths: np.ndarray, seed: int, epoch: int, batch_tokens: int) -> list[list[int]]:
    """The batches of one epoch: a function of (seed, epoch) only."""
    rng = np.random.default_rng([seed, epoch])
    batches = pack(rng.permutation(len(lengths)), lengths, batch_tokens)
    return [batches[i] for i in rng.permutation(len(batches))]


class DataStream:
    """Endless deterministic batches over the training sequences, with a resumable cursor."""

    def __init__(self, seqs: Sequences, seed: int, batch_tokens: int) -> None:
        if len(seqs) == 0:
            raise ValueError("no training sequences (records with split != 'heldout' and a non-empty answer)")
        self.seqs, self.seed, self.batch_tokens = seqs, seed, batch_tokens
        self.lengths = seqs.lengths
        self.epoch, self.index = 0, 0
        self._batches: list[list[int]] | None = None

    def _epoch(self) -> list[list[int]]:
        if self._batches is None:
            self._batches = epoch_batches(self.lengths, self.seed, self.epoch, self.batch_tokens)
        return self._batches

    def next(self) -> list[int]:
        batches = self._epoch()
        if self.index >= len(batches):
            self.epoch, self.index, self._batches = self.epoch + 1, 0, None
            batches = self._epoch()
        out = batches[self.index]
        self.index += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index, self._batches = int(state["epoch"]), int(state["index"]), None


def collate(seqs: Sequences, idx: list[int], device: torch.device, pad_id: int = 0):
    """Right-padded input_ids [B, T], loss_mask [B, T] (answer tokens) and attention_mask [B, T] (bool)."""
    t = max(len(seqs.ids[i]) for i in idx)
    ids = torch.full((len(idx), t), pad_id, dtype=torch.long)
    loss = torch.zeros(len(idx), t, dtype=torch.bool)
    attn = torch.zeros(len(idx), t, dtype=torch.bool)
    for row, i in enumerate(idx):
        s = seqs.ids[i]
        ids[row, :len(s)] = torch.from_numpy(s)
        attn[row, :len(s)] = True
        loss[row, int(seqs.answer_start[i]):len(s)] = True
    return ids.to(device), loss.to(device), attn.to(device)


def target_batch(target: Target, needs: TargetNeeds, ids, loss_mask, attn) -> TrainBatch:
    """Run the frozen target once. Right padding: real tokens never see pads under the causal mask."""
    out = target.forward(ids, hidden_layers=needs.hidden_layers, return_layer_kv=needs.layer_kv,
                         return_logits=False)
    return TrainBatch(input_ids=ids, loss_mask=loss_mask, attention_mask=attn, hidden=out.hidden,
                      layer_kv=out.layer_kv, target=target)


def eval_subset(seqs: Sequences, max_tokens: int, batch_tokens: int) -> list[list[int]]:
    """A fixed held-out subset (seeded shuffle, first `max_tokens` tokens), packed by length."""
    if len(seqs) == 0:
        return []
    order = np.random.default_rng(EVAL_SHUFFLE_SEED).permutation(len(seqs))
    lengths = seqs.lengths
    keep, total = [], 0
    for i in order:
        if keep and total + lengths[i] > max_tokens:
            break
        keep.append(int(i))
        total += int(lengths[i])
    return pack(np.array(keep), lengths, batch_tokens, window=len(keep))


def data_sources(spec: str | Path) -> list[tuple[str, int]]:
    """`--data` as (path, repeats): "A" or "A,B*3" (B's training records three times per epoch)."""
    sources = []
    for part in str(spec).split(","):
        path, _, times = part.strip().partition("*")
        if not path:
            raise ValueError(f"--data {spec!r}: an empty source")
        try:
            repeats = int(times) if times else 1
        except ValueError:
            raise ValueError(f"--data {spec!r}: the repeat count after '*' must be an integer") from None
        if repeats < 1:
            raise ValueError(f"--data {spec!r}: a repeat count must be at least 1")
        sources.append((path, repeats))
    return sources


def load_records(spec: str | Path) -> list[dict]:
    """Records of every `--data` source; a source's training records repeated by its count, held-out once.

    Repeating a source over-samples fresh data against data the drafters have already seen many
    times (the trainer's epochs then cover it that many times as often)."""
    from core.training.datagen import load_distill

    records = []
    for path, repeats in data_sources(spec):
        found = load_distill(path)
        records += found
        records += [r for r in found if r.get("split") != "heldout"] * (repeats - 1)
    return records


# ------------------------------------------------------------------------------------------
# Schedule, RNG, environment
# ------------------------------------------------------------------------------------------

def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the base lr for optimiser step `step` (0-based): linear warm-up, then cosine."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def isolated_rng(seed: int, device: torch.device):
    """Run a block (evaluation, export) without touching the training RNG streams."""
    devices = [device.index or 0] if device.type == "cuda" else []
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def hardware() -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def peak_memory_gb(device: torch.device) -> float:
    """Peak resident memory of this process (CPU) or peak allocated memory (CUDA), in GB."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # ru_maxrss is in KB on Linux


def atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------

@dataclass
class TrainConfig:
    drafters: list[str]
    out: str
    data: str = "data/distill/dataset"
    target: str = "smollm2"
    steps: int = 1000
    batch_tokens: int = 4096
    max_len: int = 512
    lr: float = 3e-4
    lr_overrides: dict[str, float] = field(default_factory=dict)  # drafter name -> lr
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    seed: int = 0
    hyper: dict[str, dict[str, Any]] = field(default_factory=dict)  # drafter name -> hyper-parameters
    dtype: str = "bfloat16"
    autocast: str = "auto"  # auto | on | off
    eval_every: int = 200
    eval_tokens: int = 8192
    final_eval_tokens: int = 32768
    log_every: int = 10
    ckpt_every_min: float = 4.0
    time_budget_min: float | None = None
    stop_at_step: int | None = None  # stop (saving) after this step, as if interrupted: for tests
    publish: str | None = None
    restart: bool = False
    progress_bar: bool = True
    init_from: str | None = None  # continue from published drafters: <folder>/<name> (or <folder> for one)
    fit_steps: bool = False  # --steps auto: fix `steps` after FIT_AFTER_STEPS timed steps to fill the time budget

    # Arguments that change the training result: a resumed run must agree on them.
    RESULT_FIELDS = ("drafters", "target", "steps", "batch_tokens", "max_len", "lr", "lr_overrides", "warmup",
                     "min_lr_ratio", "weight_decay", "betas", "clip", "seed", "hyper", "dtype", "autocast",
                     "init_from")

    def result_args(self) -> dict:
        d = dataclasses.asdict(self)
        return json.loads(json.dumps({k: d[k] for k in self.RESULT_FIELDS}))

    def lr_for(self, name: str) -> float:
        return self.lr_overrides.get(name, self.lr)


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


def published_folder(root: str | Path, name: str, single: bool) -> Path:
    """<root>/<name> when it holds a checkpoint; <root> itself when training a single drafter."""
    root = Path(root)
    if (root / name / "config.json").is_file():
        return root / name
    if single and (root / "config.json").is_file():
        return root
    raise FileNotFoundError(f"--init-from {root}: no published {name} drafter there "
                            f"(expected {root / name}/config.json)")


def init_from_published(spec: DrafterSpec, target: Target, root: str | Path, single: bool) -> TrainedDrafter:
    """A published drafter to continue training: its weights, drafting vocabulary and feature scale.

    The hyper-parameters asked for must be the ones it was built with, except that a drafter's `growable`
    ones may be raised (`TrainedDrafter.grow`: new layers start as the identity, recorded as `grown`);
    `checkpoint.TARGET_FIELDS` are filled from the target either way.
    """
    from core.drafters.checkpoint import TARGET_FIELDS

    folder = published_folder(root, spec.name, single)
    model = spec.cls.from_pretrained(folder, target)
    have = model.config.to_json()
    clash = {k: (v, have.get(k)) for k, v in spec.hyper.items()
             if k not in TARGET_FIELDS and k in have and json.dumps(v) != json.dumps(have[k])}
    grown = {k: [had, asked] for k, (asked, had) in clash.items()
             if k in spec.cls.growable and isinstance(asked, int) and isinstance(had, int) and asked > had}
    if grown:
        model.grow(**{k: new for k, (_, new) in grown.items()})
        clash = {k: v for k, v in clash.items() if k not in grown}
    if clash:
        said = ", ".join(f"{k}={a!r} asked, {b!r} there" for k, (a, b) in clash.items())
        raise ValueError(f"--init-from {folder}: the published {spec.name} drafter was built with other "
                         f"hyper-parameters: {said}")
    prior = model.checkpoint_meta.get("training", {})
    model.init_record = {"path": str(folder), "commit": _last_commit(folder),
                         "steps": prior.get("steps", 0), "tokens": prior.get("tokens", 0),
                         "wall_time_s": prior.get("wall_time_s", 0.0), "training": prior,
                         **({"grown": grown} if grown else {})}
    return model


def _last_commit(folder: Path) -> str | None:
    """The git commit that last changed `folder` (None outside a git checkout or with uncommitted changes)."""
    import subprocess

    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", str(folder)], capture_output=True, text=True,
                               cwd=folder, timeout=10)
        if dirty.returncode or dirty.stdout.strip():
            return None
        out = subprocess.run(["git", "log", "-1", "--format=%H", "--", "."], capture_output=True, text=True,
                             cwd=folder, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class Trainer:
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
            opt = torch.optim.AdamW(params, lr=cfg.lr_for(spec.name), betas=tuple(cfg.betas),
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

    def _choose_draft_vocab(self, model: TrainedDrafter, train: list[dict]) -> None:
        """A reduced drafting vocabulary (core.drafters.draft_vocab) is the most frequent answer tokens."""
        vocab = getattr(model, "vocab", None)
        if vocab is None or vocab.full:
            return
        from core.drafters.draft_vocab import frequent_tokens

        ids = frequent_tokens((r["answer_ids"] for r in train), vocab.ids.numel(), always=self.target.eos_token_ids,
                              fallback=(r["prompt_ids"] for r in train))
        vocab.set_ids(ids)

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
        state = torch.load(self.state_path, map_location="cpu", weights_only=False)  # RNG states must stay on CPU
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
            _truncate_log(m.folder / "log.jsonl", self.step)
        return True

    # ----- pieces --------------------------------------------------------------------------
    def _autocast(self):
        if not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _log(self, member: _Member, row: dict) -> None:
        if not self.main:
            return
        with open(member.folder / "log.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

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
        prior = member.prior_steps
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
                _truncate_log(m.folder / "log.jsonl", -1)
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


def _truncate_log(path: Path, step: int) -> None:
    if not path.exists():
        return
    from core.training.curves import read_log

    rows = [r for r in read_log(path) if r.get("step", 0) <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------
# Publishing
# ------------------------------------------------------------------------------------------

def model_card(name: str, meta: dict) -> str:
    """README.md for a published drafter, from its config.json (with the `training` record)."""
    tr = meta.get("training", {})
    hw = tr.get("hardware", {})
    data = tr.get("data", {})
    held = tr.get("heldout", {})
    accs = sorted(((int(k.split("@")[1]), v) for k, v in held.items() if re.fullmatch(r"acc@\d+", k)))
    cfg = meta.get("config", {})
    hyper = {k: v for k, v in cfg.items() if k not in ("hidden_size", "vocab_size", "n_target_layers",
                                                       "target_fingerprint", "target_source", "tree_accuracy",
                                                       "tree_paths")}
    secs = tr.get("wall_time_s", 0)
    took = f"{secs / 3600:.2f} h" if secs >= 3600 else f"{secs / 60:.1f} min"
    if hw.get("gpu"):
        where = f"{hw.get('gpu_count', 1)} x {hw['gpu']}"
    else:
        where = f"{hw.get('cpu', '?')} ({hw.get('cpu_count', '?')} cores)"
    lines = [
        f"# {name} drafter for {cfg.get('target_source', 'the target')}",
        "",
        f"Method `{meta.get('method')}`, trained with `python -m core.training.train` (SpecLens).",
        f"Target fingerprint `{cfg.get('target_fingerprint')}`: loading it against another target fails.",
        "",
        "## Training",
        "",
        f"- data: `{data.get('path')}` ({data.get('train_records')} training / {data.get('heldout_records')} "
        f"held-out sequences, {data.get('train_tokens')} training tokens per epoch, max length "
        f"{data.get('max_len')}){'; recipe: `' + data['recipe'] + '`' if data.get('recipe') else ''}"
        f"{' (committed copy: `assets/distill/recipe.json`)' if _names_other_recipe(data.get('recipe')) else ''}"
        + "".join(f"; `{src['path']}`'s training records {src['repeats']}x per epoch" for src in data.get("sources", [])
                  if src["repeats"] > 1),
        f"- steps: {tr.get('steps')} of {tr.get('planned_steps')} planned, {tr.get('tokens')} tokens seen, "
        f"about {tr.get('batch_tokens')} tokens per batch",
        f"- optimiser: AdamW, lr {tr.get('lr')}, {tr.get('warmup')} warm-up steps, cosine to "
        f"{tr.get('min_lr_ratio')} x lr; seed {tr.get('seed')}",
        f"- wall time: {took} on {where}, torch {hw.get('torch')}, target in {tr.get('target_dtype')}",
    ]
    if tr.get("init_from"):
        prior, total = tr["init_from"], cumulative_training(tr)
        at = f" at commit {prior['commit'][:10]}" if prior.get("commit") else ""
        lines.append(f"- continued from `{prior.get('path')}`{at} (an earlier run of {prior.get('steps')} steps, "
                     f"{prior.get('tokens')} tokens, {prior.get('wall_time_s', 0) / 3600:.2f} h; its own recipe is "
                     f"under `training.init_from` in config.json); in all: {total['steps']} steps, "
                     f"{total['tokens']} tokens, {total['wall_time_s'] / 3600:.2f} h")
        for k, (was, now) in prior.get("grown", {}).items():
            lines.append(f"- grown at the start of this run: `{k}` {was} -> {now} (the new layers start as the "
                         "identity, so step 0 computes what the earlier run's drafter did)")
    if tr.get("joint_with"):
        lines.append(f"- trained jointly (same batches, same steps) with: {', '.join(tr['joint_with'])}")
    if not tr.get("complete", True):
        lines.append("- **incomplete**: training stopped before the planned number of steps")
    lines += ["", "## Held-out accuracy", ""]
    if accs:
        lines += ["Top-1 accuracy by draft position (teacher-forced on the held-out split; `acc@k` as the "
                  "method's training_loss defines it):", "",
                  "| position | " + " | ".join(str(k) for k, _ in accs) + " |",
                  "| --- | " + " | ".join("---" for _ in accs) + " |",
                  "| acc | " + " | ".join(f"{v:.3f}" for _, v in accs) + " |", ""]
    if "loss" in held:
        lines += [f"Held-out loss: {held['loss']:.4f}", ""]
    if cfg.get("tree_paths"):
        fitted = "fitted to the measured held-out top-k accuracies" if cfg.get("tree_accuracy") else "the prior tree"
        lines += [f"Static draft tree: {len(cfg['tree_paths'])} nodes, depth "
                  f"{max(len(p) for p in cfg['tree_paths'])}, {fitted} (`tree_paths` in config.json).", ""]
    earlier = ""
    if tr.get("init_from"):
        k = _chain_length(tr) - 1
        earlier = (f" The earlier run{'s' if k > 1 else ''}' logs and curves: "
                   + ", ".join(f"`log-run{i}.jsonl` / `curves-run{i}.html`" for i in range(1, k + 1)) + ".")
    lines += [TAU_PLACEHOLDER, "", "## Hyper-parameters", "", "```json", json.dumps(hyper, indent=1), "```", "",
              "Files: `config.json`, `model.safetensors` (bfloat16), `log.jsonl` (training log), "
              f"`curves.html` (loss and accuracy curves).{earlier}", ""]
    return "\n".join(lines)


def _runs(record: dict):
    """A training record, then each run it continued from (training.init_from.training, recursively)."""
    while record:
        yield record
        record = (record.get("init_from") or {}).get("training") or {}


def cumulative_training(record: dict) -> dict[str, float]:
    """Steps, tokens and wall time of a training record plus every run it continued from."""
    return {k: sum(r.get(k, 0) or 0 for r in _runs(record)) for k in ("steps", "tokens", "wall_time_s")}


def _chain_length(record: dict) -> int:
    """How many runs a training record covers: 1, plus one per run it continued from."""
    return max(1, sum(1 for _ in _runs(record)))


def _names_other_recipe(path: str | None) -> bool:
    """Whether a card should also point at the committed recipe (it exists and the data's recipe is not committed)."""
    assets = COMMITTED_RECIPE.parents[1]
    return COMMITTED_RECIPE.exists() and not (path and assets in Path(path).resolve().parents)


def publish(run_folder: str | Path, dest: str | Path, name: str) -> Path:
    """Copy final/ + curves.html + log.jsonl + a model card into `dest` (replacing what was there)."""
    run_folder, dest = Path(run_folder), Path(dest)
    final = run_folder / "final"
    meta = json.loads((final / "config.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    prior = meta.get("training", {}).get("init_from")
    here = dest / "config.json"
    if (prior and Path(prior.get("path", "")).resolve() == dest.resolve() and here.exists()
            and json.loads(here.read_text()).get("training") == prior.get("training")):
        # continuing the drafter published here: its earlier run's log and curves stay, as log-run<k>
        # (publishing the same run twice finds its own record there and rotates nothing)
        k = _chain_length(prior.get("training", {}))
        for f, ext in (("log", "jsonl"), ("curves", "html")):
            if (dest / f"{f}.{ext}").exists():
                (dest / f"{f}.{ext}").replace(dest / f"{f}-run{k}.{ext}")
    for f in ("config.json", "model.safetensors"):
        shutil.copy2(final / f, dest / f)
    for f in ("curves.html", "log.jsonl"):
        if (run_folder / f).exists():
            shutil.copy2(run_folder / f, dest / f)
    (dest / "README.md").write_text(model_card(name, meta))
    return dest


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------

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
        if "=" in part:
            k, v = part.split("=", 1)
            over[k.strip()] = float(v)
        elif part:
            base = float(part)
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
    who.add_argument("--drafter", help="eagle2, moa, moa-tli1, moa-tli2, moa-tli3, medusa or amphista")
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
    p.add_argument("--seed", type=int, default=0)
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
    p.add_argument("--no-progress", action="store_true")
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    names = [args.drafter] if args.drafter else [n.strip() for n in args.drafters.split(",") if n.strip()]
    lr, over = parse_lr(args.lr)
    out = args.out or ("runs/" + (names[0] if len(names) == 1 else "joint-" + "-".join(names)))
    fit_steps = str(args.steps).strip().lower() == "auto"
    if fit_steps and not args.time_budget_min:
        raise SystemExit("--steps auto needs --time-budget-min (the time the fitted steps must fit in)")
    try:
        steps = AUTO_PLACEHOLDER_STEPS if fit_steps else int(args.steps)
    except ValueError:
        raise SystemExit(f"--steps must be a whole number or 'auto', not {args.steps!r}") from None
    if steps < 1:
        raise SystemExit("--steps must be at least 1")
    return TrainConfig(
        drafters=names, out=out, data=args.data, target=args.target, steps=steps, fit_steps=fit_steps,
        batch_tokens=args.batch_tokens,
        max_len=args.max_len, lr=lr, lr_overrides=over, warmup=args.warmup, min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay, clip=args.clip, seed=args.seed, hyper=parse_hyper(args.hyper, names),
        dtype=args.dtype, autocast=args.autocast, eval_every=args.eval_every, eval_tokens=args.eval_tokens,
        final_eval_tokens=args.final_eval_tokens, log_every=args.log_every, ckpt_every_min=args.ckpt_every_min,
        time_budget_min=args.time_budget_min, stop_at_step=args.stop_at_step, publish=args.publish,
        restart=args.restart, progress_bar=not args.no_progress, init_from=args.init_from)


def load_training_target(name: str, dtype: str, device: torch.device) -> Target:
    from core.target import load_target, tiny_target

    if name == "tiny":  # a random tiny Llama: for smoke tests of the command line
        target = tiny_target(dtype=resolve_dtype(dtype))
        target.hf_model.to(device)
        return target
    return load_target(None if name == "smollm2" else name, dtype=dtype, device=device)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    specs = [resolve_spec(n, cfg.hyper.get(n)) for n in cfg.drafters]
    try:  # before the target loads: a wrong --data fails at once, with a message
        records = load_records(cfg.data)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"train: {e}") from None
    from accelerate import Accelerator, DistributedDataParallelKwargs

    acc = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
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
