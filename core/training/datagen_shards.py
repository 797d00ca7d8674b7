"""A generation run's folder and the choices fixed per prompt (core.training.datagen generates into it): the run's
settings (`GenConfig`), which prompts are sampled and which are held out (hashes of the prompt id), the plan of
shards (plan.json), shard files written atomically, log.txt, and reading the finished shards back as records.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.training.distill_data import record_order, save_dataset

HELDOUT_SHARE = 0.03


@dataclass
class GenConfig:
    """Settings of one generation run (all of them go into plan.json and the recipe)."""

    max_new_tokens: int = 256
    batch_size: int = 24
    shard_size: int = 96
    sample_share: float = 0.25
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0
    eos_ids: list[int] = field(default_factory=lambda: [2])
    pad_id: int = 2
    max_prompt_tokens: int = 640  # longer prompts are dropped (the prompt builder aims for < 600)


# ------------------------------------------------------------------------------------------
# Deterministic choices
# ------------------------------------------------------------------------------------------


def _unit_hash(text: str) -> float:
    """A number in [0, 1) from a string, the same on every machine and run."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:12], 16) / float(1 << 48)


def is_sampled(prompt_id: str, seed: int, share: float) -> bool:
    return _unit_hash(f"sample|{seed}|{prompt_id}") < share


def split_of(prompt_id: str) -> str:
    return "heldout" if _unit_hash(f"heldout|{prompt_id}") < HELDOUT_SHARE else "train"


def plan_shards(items: Sequence[dict], shard_size: int) -> list[list[dict]]:
    """Order items by (sampled?, category, prompt length, id) and cut them into shards of shard_size.

    Grouping by category keeps answers of similar length together (QA answers are short,
    stories long); a batch decodes until its longest answer ends, so this cuts wasted steps.
    """
    order = sorted(items, key=lambda it: (it["temperature"] > 0, it["category"], len(it["prompt_ids"]),
                                          it["prompt_id"]))
    return [order[i:i + shard_size] for i in range(0, len(order), shard_size)]


def _shard_hash(shard: Sequence[dict]) -> str:
    h = hashlib.sha256()
    for it in shard:
        h.update(json.dumps([it["prompt_id"], it["temperature"], it["prompt_ids"]]).encode())
    return h.hexdigest()[:16]


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def shard_path(out_dir: Path, index: int) -> Path:
    return Path(out_dir) / "shards" / f"shard-{index:05d}.jsonl"


def read_shard(path: Path) -> tuple[dict, list[dict]]:
    """(meta, records) of a shard file."""
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or "_meta" not in lines[0]:
        raise ValueError(f"{path} has no _meta line")
    return lines[0]["_meta"], lines[1:]


def _shard_done(path: Path, expected_hash: str) -> bool:
    if not path.exists():
        return False
    try:
        meta, records = read_shard(path)
    except (ValueError, json.JSONDecodeError):
        return False
    return meta.get("items_hash") == expected_hash and meta.get("n") == len(records)


class _Logger:
    def __init__(self, path: Path | None, quiet: bool = False) -> None:
        self.path = path
        self.quiet = quiet

    def __call__(self, msg: str) -> None:
        line = f"{_dt.datetime.now().isoformat(timespec='seconds')} {msg}"
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        if not self.quiet:
            from tqdm import tqdm

            tqdm.write(line, file=sys.stderr)  # does not break a running progress bar


def ensure_plan(target, items: Sequence[dict], out_dir: str | Path, cfg: GenConfig) -> tuple[list[list[dict]], dict]:
    """The shards of this run and its plan; writes plan.json, or checks it against the one on disk."""
    out = Path(out_dir)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    shards = plan_shards(items, cfg.shard_size)
    plan = {"config": asdict(cfg), "n_items": len(items), "shard_hashes": [_shard_hash(s) for s in shards],
            "target": getattr(target, "fingerprint", None)}
    plan_file = out / "plan.json"
    if plan_file.exists():
        old = json.loads(plan_file.read_text())
        if old != plan:
            raise SystemExit(f"{out} holds a run with different settings or prompts ({plan_file}); "
                             f"use another --out or delete that folder")
    else:
        _atomic_write_text(plan_file, json.dumps(plan, indent=1))
    return shards, plan


def finished_prompts(out_dir: str | Path) -> int:
    """How many prompts the finished shard files under out_dir hold (reads only their _meta lines)."""
    total = 0
    for path in sorted((Path(out_dir) / "shards").glob("shard-*.jsonl")):
        try:
            with open(path, encoding="utf-8") as f:
                total += int(json.loads(f.readline())["_meta"]["n"])
        except (ValueError, KeyError, json.JSONDecodeError):
            continue
    return total


# ------------------------------------------------------------------------------------------
# Merging, export, loading
# ------------------------------------------------------------------------------------------


def collect_records(out_dir: str | Path, partial: bool = False) -> tuple[list[dict], list[dict]]:
    """All shard records of a run and the shard metas.

    Every planned shard must exist, unless `partial`: then the finished ones are taken (a run
    stopped by a deadline still yields whole, valid shards).
    """
    out = Path(out_dir)
    if not (out / "plan.json").exists():
        raise FileNotFoundError(f"{out} is not a generation run (no plan.json)")
    plan = json.loads((out / "plan.json").read_text())
    records, metas = [], []
    for i, h in enumerate(plan["shard_hashes"]):
        path = shard_path(out, i)
        if not _shard_done(path, h):
            if partial:
                continue
            raise FileNotFoundError(f"shard {i} is missing or stale: {path}")
        meta, recs = read_shard(path)
        metas.append(meta)
        records += recs
    for r in records:
        r["split"] = split_of(r["prompt_id"])
    records.sort(key=record_order)
    return records, metas


def merge_shards(out_dir: str | Path) -> Path:
    """Merge all shards into a `datasets` Arrow dataset at <out_dir>/dataset (replaced atomically)."""
    records, _ = collect_records(out_dir)
    return save_dataset(records, out_dir)
