"""The recipe of a generation run (recipe.json: counts, token statistics, settings, time, hardware) and pooling the
finished shards of several runs, or earlier data, into one dataset (`combine_runs`, datagen --combine).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from core.training.datagen_shards import HELDOUT_SHARE, GenConfig, _atomic_write_text, collect_records
from core.training.distill_data import export_compact, find_recipe, load_distill, save_dataset


def build_recipe(out_dir: str | Path, cfg: GenConfig, target_info: dict | None = None, dtype: str = "bfloat16",
                 extra: dict | None = None) -> dict:
    records, metas = collect_records(out_dir)
    recipe = {"what": "self-distillation data: SmolLM2-135M-Instruct answering core.training.prompts.training_prompts",
              "date": _dt.date.today().isoformat(), **_record_stats(records),
              "settings": {**asdict(cfg), "dtype": dtype, "decoding": "greedy, or sampled (temperature, top_p, "
                           "top_k off) for a share of prompts chosen by a hash of prompt_id",
                           "heldout_share": HELDOUT_SHARE},
              "time": _shard_times(metas, sum(len(r["answer_ids"]) for r in records)),
              "hardware": _hardware(), "target": target_info}
    if extra:
        recipe.update(extra)
    return recipe


def _record_stats(records: list[dict]) -> dict:
    """The counts and token statistics of a recipe."""
    ans = [len(r["answer_ids"]) for r in records]
    prompt_tokens = [len(r["prompt_ids"]) for r in records]
    sampled = sum(1 for r in records if r["temperature"] > 0)
    return {
        "counts": {
            "prompts": len(records),
            "per_category": dict(sorted(Counter(r["category"] for r in records).items())),
            "sampled": sampled,
            "sampled_share": round(sampled / max(len(records), 1), 4),
            "finished": sum(1 for r in records if r["finished"]),
            "heldout": sum(1 for r in records if r["split"] == "heldout"),
        },
        "tokens": {
            "prompt_total": sum(prompt_tokens),
            "answer_total": sum(ans),
            "answer_mean": round(statistics.mean(ans), 1) if ans else 0,
            "answer_median": statistics.median(ans) if ans else 0,
            "prompt_mean": round(statistics.mean(prompt_tokens), 1) if prompt_tokens else 0,
        },
    }


def _shard_times(metas: list[dict], answer_tokens: int) -> dict:
    """Generation time of a run from its shard metas (wall: first shard start to last shard end)."""
    finished_at = sorted(m["finished_at"] for m in metas)
    starts = [_dt.datetime.fromisoformat(m["finished_at"]) - _dt.timedelta(seconds=m["seconds"]) for m in metas]
    wall = (max(_dt.datetime.fromisoformat(t) for t in finished_at) - min(starts)).total_seconds() if metas else 0.0
    return {
        "generation_seconds": round(sum(m["seconds"] for m in metas), 1),
        "wall_seconds": round(wall, 1),
        "first_shard_finished": finished_at[0] if finished_at else None,
        "last_shard_finished": finished_at[-1] if finished_at else None,
        "answer_tokens_per_second": round(answer_tokens / max(wall, 1e-9), 1),
    }


def _hardware() -> dict:
    import transformers

    return {"cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _first_answers(records: list[dict], seen: set) -> list[dict]:
    """The records whose prompt (token ids) is not in `seen`; adds their prompts to it.

    Prompt seeds can draw the same prompt twice: keeping its first answer means no prompt lands in
    both splits (its copies may have different ids) and greedy answers are not doubled.
    """
    kept = [r for r in records if tuple(r["prompt_ids"]) not in seen]
    seen.update(tuple(r["prompt_ids"]) for r in kept)
    return kept


def write_recipe(recipe: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(Path(path), json.dumps(recipe, indent=2) + "\n")


def combine_runs(run_dirs: Sequence[str | Path], out_dir: str | Path) -> dict:
    """Pool the finished shards of several generation runs (e.g. one per prompt seed) into one dataset.

    An entry may also be earlier data (a distill.npz, an Arrow folder or a folder holding one):
    its records are taken whole and its recipe.json, if one lies beside it, is kept in "runs".

    Writes <out_dir>/dataset (Arrow), <out_dir>/distill.npz and <out_dir>/recipe.json, whose
    "runs" list gives each run's settings, how many of its planned shards were finished and
    its generation time. Returns the recipe. A run cut short by a deadline contributes its
    whole shards only; a run with no finished shard is an error (nothing would say it ran).
    A prompt that an earlier run already answered (same token ids) is dropped.
    """
    out = Path(out_dir)
    records, runs, seen = [], [], set()
    for run in run_dirs:
        if (Path(run) / "plan.json").exists():
            found, metas = collect_records(run, partial=True)
            if not found:
                raise FileNotFoundError(f"{run} has no finished shard")
            plan = json.loads((Path(run) / "plan.json").read_text())
            entry = {"folder": str(run), "settings": plan["config"], "shards_finished": len(metas),
                     "shards_planned": len(plan["shard_hashes"])}
            own = Path(run) / "recipe.json"  # the run's own recipe: how it was generated (dtype, command, CPU)
            if own.exists():
                mine = json.loads(own.read_text())
                entry["settings"] = {**entry["settings"], "dtype": mine.get("settings", {}).get("dtype")}
                entry.update({k: mine[k] for k in ("command", "hardware") if k in mine})
        else:  # earlier pooled or exported data, described by its own recipe
            found, metas = load_distill(run), None
            recipe_file = find_recipe(run)
            entry = {"data": str(run), "recipe": json.loads(recipe_file.read_text()) if recipe_file else None}
        recs = _first_answers(found, seen)
        answer_tokens = sum(len(r["answer_ids"]) for r in recs)
        entry.update(records=len(recs), repeated_prompts_dropped=len(found) - len(recs), answer_tokens=answer_tokens)
        if metas is not None:
            entry["time"] = _shard_times(metas, answer_tokens)
        runs.append(entry)
        records += recs
    npz = export_compact(records, out / "distill.npz")  # first: the trainer needs only this
    save_dataset(records, out)
    recipe = {"what": "self-distillation data: SmolLM2-135M-Instruct answering core.training.prompts.training_prompts "
                      "for several prompt seeds, pooled",
              "date": _dt.date.today().isoformat(), **_record_stats(records),
              "settings": {"heldout_share": HELDOUT_SHARE, "decoding": "per run, see runs[].settings"},
              "runs": runs, "hardware": _hardware(),
              "compact_export": {"file": npz.name, "bytes": npz.stat().st_size}}
    write_recipe(recipe, out / "recipe.json")
    return recipe
