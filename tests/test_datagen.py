"""Self-distillation data generation (core.training.datagen) end to end on a tiny random Llama."""

import json
import random

import numpy as np
import pytest
import torch

from core.target import tiny_target
from core.training.datagen import drop_answered, generate_batch, prepare_items, run_generation
from core.training.datagen_recipe import build_recipe, combine_runs
from core.training.datagen_shards import (
    GenConfig,
    is_sampled,
    merge_shards,
    plan_shards,
    read_shard,
    shard_path,
    split_of,
)
from core.training.distill_data import COLUMNS, export_compact, load_distill

EOS = 1


@pytest.fixture(scope="module")
def target():
    return tiny_target(eos_token_id=EOS)


def make_items(n=10, seed=0):
    """Tokenized items; every third prompt ends with the stop id so its answer finishes at once."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        ids = [rng.randrange(2, 64) for _ in range(rng.randint(3, 12))]
        if i % 3 == 0:
            ids.append(EOS)  # the tiny model tends to repeat its last input token
        items.append({"prompt_id": f"toy-{i:05d}", "category": "even" if i % 2 == 0 else "odd", "prompt_ids": ids,
                      "temperature": 0.7 if i % 4 == 1 else 0.0})
    return items


def config(**kw):
    base = dict(max_new_tokens=6, batch_size=3, shard_size=5, eos_ids=[EOS], pad_id=EOS)
    base.update(kw)
    return GenConfig(**base)


def test_left_padded_batch_matches_single_prompts(target):
    cfg = config(max_new_tokens=5)
    prompts = [[5, 9, 17, 33, 40, 41, 7], [12, 4], [60, 61, 62, 2]]
    batched = generate_batch(target, prompts, 0.0, cfg, seed=0)
    for p, got in zip(prompts, batched):
        assert generate_batch(target, [p], 0.0, cfg, seed=0) == [got]


def test_answers_end_at_stop_token(target):
    cfg = config()
    out = generate_batch(target, [[3, 4, EOS], [3, 4, 5]], 0.0, cfg, seed=0)
    for ans, finished in out:
        assert EOS not in ans[:-1]
        assert finished == (ans[-1] == EOS)
        assert finished or len(ans) == cfg.max_new_tokens
    assert out[0] == ([EOS], True)


def test_generation_resume_merge_and_compact(target, tmp_path):
    out = tmp_path / "distill"
    items = make_items(10)
    cfg = config()
    stats = run_generation(target, items, out, cfg, progress=False)
    assert stats["shards"] == 2 and stats["generated_shards"] == 2 and stats["skipped_shards"] == 0
    first = {i: shard_path(out, i).read_text() for i in range(2)}
    mtime0 = shard_path(out, 0).stat().st_mtime_ns
    assert (out / "log.txt").read_text().count("shard ") >= 2

    # A kill mid-shard leaves at most a temp file; a finished shard is deleted: only it is regenerated.
    shard_path(out, 1).unlink()
    (out / "shards" / "shard-00001.jsonl.tmp999").write_text('{"_meta": {"shard"')
    stats = run_generation(target, items, out, cfg, progress=False)
    assert stats["generated_shards"] == 1 and stats["skipped_shards"] == 1
    assert shard_path(out, 0).stat().st_mtime_ns == mtime0
    assert shard_path(out, 1).read_text().split("\n", 1)[1] == first[1].split("\n", 1)[1], "regeneration is seeded"

    # A truncated shard file is not trusted.
    shard_path(out, 0).write_text(first[0][: len(first[0]) // 2])
    stats = run_generation(target, items, out, cfg, progress=False)
    assert stats["generated_shards"] == 1
    assert shard_path(out, 0).read_text().split("\n", 1)[1] == first[0].split("\n", 1)[1]

    # Nothing left to do.
    assert run_generation(target, items, out, cfg, progress=False)["generated_shards"] == 0
    # A different plan in the same folder is refused.
    with pytest.raises(SystemExit):
        run_generation(target, items, out, config(max_new_tokens=7), progress=False)

    meta, recs = read_shard(shard_path(out, 0))
    assert meta["n"] == len(recs) == 5 and meta["new_tokens"] == sum(len(r["answer_ids"]) for r in recs)

    ds_dir = merge_shards(out)
    from datasets import load_from_disk

    ds = load_from_disk(str(ds_dir))
    assert ds.column_names == list(COLUMNS)
    assert len(ds) == len(items)
    assert ds.features["prompt_ids"].feature.dtype == "int32"
    assert ds.features["temperature"].dtype == "float64" and ds.features["finished"].dtype == "bool"
    rows = list(ds)
    assert [r["prompt_id"] for r in rows] == [it["prompt_id"] for it in items]
    by_id = {it["prompt_id"]: it for it in items}
    for r in rows:
        it = by_id[r["prompt_id"]]
        assert r["prompt_ids"] == it["prompt_ids"] and r["category"] == it["category"]
        assert r["temperature"] == it["temperature"]
        assert r["finished"] == (r["answer_ids"][-1:] == [EOS])
        assert 1 <= len(r["answer_ids"]) <= cfg.max_new_tokens
        assert r["split"] == split_of(r["prompt_id"])
    assert any(r["finished"] for r in rows) and not all(r["finished"] for r in rows)

    npz = export_compact(ds_dir, out / "distill.npz")
    from_npz, from_arrow, from_run = load_distill(npz), load_distill(ds_dir), load_distill(out)
    assert from_npz == from_arrow == from_run
    with np.load(npz) as z:
        assert z["tokens"].dtype == np.uint16
        assert int(z["offsets"][-1]) == sum(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)
    assert load_distill(npz, split="train") == [r for r in from_npz if r["split"] == "train"]

    recipe = build_recipe(out, cfg, {"source": "tiny"}, "float32")
    assert recipe["counts"]["prompts"] == len(items)
    assert recipe["tokens"]["answer_total"] == sum(len(r["answer_ids"]) for r in rows)
    assert recipe["settings"]["max_new_tokens"] == cfg.max_new_tokens
    json.dumps(recipe)


def test_combine_pools_finished_shards_of_several_runs(target, tmp_path):
    """Runs stopped by a deadline contribute their whole shards; the pooled data keeps every record."""
    full, cut = tmp_path / "seed0", tmp_path / "seed1"
    run_generation(target, make_items(10, seed=0), full, config(), progress=False)
    run_generation(target, make_items(10, seed=1), cut, config(seed=1), progress=False)
    shard_path(cut, 1).unlink()  # as if the deadline struck during the second shard
    (cut / "shards" / "shard-00001.jsonl.tmp7").write_text('{"_meta"')
    recipe = combine_runs([full, cut], tmp_path / "pooled")
    _, kept = read_shard(shard_path(cut, 0))
    assert recipe["counts"]["prompts"] == 10 + len(kept) == 15
    assert [(r["shards_finished"], r["shards_planned"]) for r in recipe["runs"]] == [(2, 2), (1, 2)]
    assert recipe["runs"][1]["settings"]["seed"] == 1
    # a run's own recipe (its dtype, command and hardware) travels into the pooled one
    (full / "recipe.json").write_text(json.dumps({"settings": {"dtype": "float32"}, "command": "datagen --x",
                                                  "hardware": {"cpu_count": 2}}))
    described = combine_runs([full], tmp_path / "described")["runs"][0]
    assert described["settings"]["dtype"] == "float32" and described["settings"]["seed"] == 0
    assert described["command"] == "datagen --x" and described["hardware"] == {"cpu_count": 2}
    (full / "recipe.json").unlink()
    grown = combine_runs([tmp_path / "pooled" / "distill.npz", full], tmp_path / "grown")  # earlier data + a run
    assert grown["counts"]["prompts"] == 15 and grown["runs"][0]["recipe"]["counts"]["prompts"] == 15
    assert grown["runs"][1]["repeated_prompts_dropped"] == 10
    again = combine_runs([full, full], tmp_path / "twice")
    assert again["counts"]["prompts"] == 10 and again["runs"][1]["repeated_prompts_dropped"] == 10
    pooled = load_distill(tmp_path / "pooled")
    assert pooled == load_distill(tmp_path / "pooled" / "distill.npz")
    assert sum(len(r["answer_ids"]) for r in pooled) == recipe["tokens"]["answer_total"]
    assert json.loads((tmp_path / "pooled" / "recipe.json").read_text()) == recipe
    empty = tmp_path / "empty"
    run_generation(target, make_items(3, seed=2), empty, config(shard_size=5), progress=False)
    shard_path(empty, 0).unlink()
    with pytest.raises(FileNotFoundError, match="no finished shard"):
        combine_runs([full, empty], tmp_path / "bad")


def test_skip_answered_leaves_out_prompts_an_earlier_dataset_has(target, tmp_path):
    earlier = make_items(6, seed=0)
    run_generation(target, earlier, tmp_path / "earlier", config(), progress=False)
    npz = export_compact(merge_shards(tmp_path / "earlier"), tmp_path / "earlier.npz")
    fresh = [dict(it, prompt_id=f"new-{i}", prompt_ids=it["prompt_ids"] + [5, 6]) for i, it in enumerate(earlier)]
    mixed = [fresh[0], earlier[2], fresh[1], earlier[4], fresh[2]]
    kept = drop_answered(mixed, npz)
    assert kept == [fresh[0], fresh[1], fresh[2]]  # same prompt ids = answered, whatever the prompt_id label
    assert drop_answered(fresh, npz) == fresh


def test_plan_groups_by_mode_category_and_length():
    items = make_items(23, seed=3)
    shards = plan_shards(items, 5)
    assert [len(s) for s in shards] == [5, 5, 5, 5, 3]
    flat = [it for s in shards for it in s]
    assert sorted(it["prompt_id"] for it in flat) == sorted(it["prompt_id"] for it in items)
    keys = [(it["temperature"] > 0, it["category"], len(it["prompt_ids"])) for it in flat]
    assert keys == sorted(keys)


class _StubTarget:
    """Just enough of a Target for the tokenizer-dependent step."""

    def chat_ids(self, messages):
        text = " ".join(m["content"] for m in messages)
        return [3 + (ord(c) % 50) for c in text]


def test_prepare_items_and_sampled_share():
    prompts = [{"prompt_id": f"qa-{i:05d}", "category": "qa",
                "messages": [{"role": "user", "content": "x" * (i % 9 + 1)}]} for i in range(2000)]
    cfg = config(max_prompt_tokens=8, sample_share=0.25)
    items = prepare_items(_StubTarget(), prompts, cfg)
    assert len(items) == sum(1 for i in range(2000) if i % 9 + 1 <= 8)
    share = sum(it["temperature"] > 0 for it in items) / len(items)
    assert 0.21 < share < 0.29
    assert all(it["temperature"] in (0.0, cfg.temperature) for it in items)
    assert is_sampled("qa-00001", 0, 0.25) == is_sampled("qa-00001", 0, 0.25)
    heldout = sum(split_of(p["prompt_id"]) == "heldout" for p in prompts) / len(prompts)
    assert 0.015 < heldout < 0.05


def test_sampled_batches_are_seeded(target):
    cfg = config(max_new_tokens=8)
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    a = generate_batch(target, prompts, 0.7, cfg, seed=11)
    b = generate_batch(target, prompts, 0.7, cfg, seed=11)
    assert a == b
    torch.manual_seed(0)  # leave global RNG state predictable for other tests


def test_workers_split_shards(target, tmp_path):
    items = make_items(12, seed=5)
    cfg = config(shard_size=4)
    a = run_generation(target, items, tmp_path / "w", cfg, progress=False, worker=(0, 2))
    assert a["generated_shards"] == 2 and not shard_path(tmp_path / "w", 1).exists()
    b = run_generation(target, items, tmp_path / "w", cfg, progress=False, worker=(1, 2))
    assert b["generated_shards"] == 1
    single = tmp_path / "single"
    run_generation(target, items, single, cfg, progress=False)
    assert load_distill(merge_shards(tmp_path / "w")) == load_distill(merge_shards(single))
