"""The distillation data formats, read and written: a `datasets` Arrow folder, the compact `.npz` export that
assets/<set>/ commits, and the `recipe.json` beside them. docs/ARCHITECTURE.md, "Formats".

A record is a dict with the keys in COLUMNS: prompt_id, category, prompt_ids, answer_ids (token ids),
temperature (0 = greedy), finished (the answer ended by itself) and split ("train" or "heldout").
core.training.datagen generates the data; the trainer and the analyses read it with `load_distill`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMITTED_RECIPE = REPO_ROOT / "assets" / "distill" / "recipe.json"
COMPACT_VERSION = 1
COLUMNS = ("prompt_id", "category", "prompt_ids", "answer_ids", "temperature", "finished", "split")


def record_order(r: dict) -> tuple:
    """Sort key of a record: its category, then its number (prompt ids are '<category>-<number>')."""
    cat, _, num = r["prompt_id"].rpartition("-")
    return (cat, int(num)) if num.isdigit() else (r["prompt_id"], 0)


def _features():
    from datasets import Features, List, Value

    return Features({"prompt_id": Value("string"), "category": Value("string"),
                     "prompt_ids": List(Value("int32")), "answer_ids": List(Value("int32")),
                     "temperature": Value("float64"), "finished": Value("bool"), "split": Value("string")})


def save_dataset(records: list[dict], out_dir: str | Path) -> Path:
    """Write records as a `datasets` Arrow dataset at <out_dir>/dataset (replaced atomically)."""
    from datasets import Dataset

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ds = Dataset.from_dict({c: [r[c] for r in records] for c in COLUMNS}, features=_features())
    tmp = out / "dataset.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    ds.save_to_disk(str(tmp))
    final = out / "dataset"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def export_compact(source: str | Path | list[dict], out_path: str | Path) -> Path:
    """Write every record (of a dataset folder, or a list) as compressed arrays in one .npz (a few MB).

    Arrays: tokens (uint16, prompt then answer of each record, concatenated), offsets
    (int64, n+1 record boundaries into tokens), prompt_lens (int32), prompt_id / category /
    split (unicode), temperature (float64), finished (bool), meta (a JSON string).
    """
    records = source if isinstance(source, list) else load_distill(source)
    seqs = [r["prompt_ids"] + r["answer_ids"] for r in records]
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    tokens = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(lengths.sum()))
    if tokens.size and (tokens.min() < 0 or tokens.max() >= 1 << 16):
        raise ValueError("token ids do not fit in uint16")
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    meta = {"format": "speclens-distill-compact", "version": COMPACT_VERSION, "records": len(records),
            "tokens": int(tokens.size)}
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp.npz")
    np.savez_compressed(
        tmp, tokens=tokens.astype(np.uint16), offsets=offsets,
        prompt_lens=np.array([len(r["prompt_ids"]) for r in records], dtype=np.int32),
        prompt_id=np.array([r["prompt_id"] for r in records], dtype=str),
        category=np.array([r["category"] for r in records], dtype=str),
        split=np.array([r["split"] for r in records], dtype=str),
        temperature=np.array([r["temperature"] for r in records], dtype=np.float64),
        finished=np.array([r["finished"] for r in records], dtype=bool),
        meta=np.array(json.dumps(meta)))
    os.replace(tmp, out_path)
    return out_path


def _load_npz(path: Path) -> list[dict]:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        if meta.get("format") != "speclens-distill-compact":
            raise ValueError(f"{path} is not a SpecLens distillation export")
        # read every array once: indexing z[...] re-reads (and decompresses) the array each time
        tokens, offsets, plens = z["tokens"].astype(np.int64), z["offsets"].tolist(), z["prompt_lens"].tolist()
        ids, cats, temps = z["prompt_id"].tolist(), z["category"].tolist(), z["temperature"].tolist()
        finished, splits = z["finished"].tolist(), z["split"].tolist()
    out = []
    for i in range(len(plens)):
        seq = tokens[offsets[i]:offsets[i + 1]].tolist()
        out.append({"prompt_id": str(ids[i]), "category": str(cats[i]),
                    "prompt_ids": seq[:plens[i]], "answer_ids": seq[plens[i]:],
                    "temperature": float(temps[i]), "finished": bool(finished[i]), "split": str(splits[i])})
    return out


def load_distill(path_or_dir: str | Path, split: str | None = None) -> list[dict]:
    """Distillation records from an Arrow dataset folder, a run folder, or a compact .npz.

    Each record has the keys in COLUMNS with plain Python values. split: keep only
    "train" or "heldout" records.
    """
    p = Path(path_or_dir)
    if p.is_dir():
        if (p / "dataset").is_dir():
            p = p / "dataset"
        elif not (p / "state.json").exists() and (p / "distill.npz").exists():
            p = p / "distill.npz"
    if p.is_file():
        records = _load_npz(p)
    elif p.is_dir():
        from datasets import load_from_disk

        ds = load_from_disk(str(p))
        records = [{c: row[c] for c in COLUMNS} for row in ds]
    else:
        raise FileNotFoundError(f"no distillation data at {path_or_dir}")
    if split is not None:
        records = [r for r in records if r["split"] == split]
    return records


def find_recipe(data: str | Path) -> Path | None:
    """The recipe.json written next to generated data (in its folder, or beside the .npz / dataset)."""
    p = Path(data)
    for cand in (p / "recipe.json", p.parent / "recipe.json"):
        if cand.is_file():
            return cand
    return None
