"""Tree sweep plumbing: held-out prompts as questions, one row per setting (tiny target, PLD settings)."""

from __future__ import annotations

import json

import torch

from analysis import tree_sweep
from core.target import tiny_target
from core.training.distill_data import load_distill
from tests.test_bench import QUESTIONS, chat_ids, decode


def test_heldout_prompts_cover_categories_and_map_back_to_their_ids():
    questions, to_ids = tree_sweep.heldout_prompts(8)
    heldout = {tuple(r["prompt_ids"]) for r in load_distill(tree_sweep.DISTILL, split="heldout")}
    assert len(questions) == 8 and len({q["category"] for q in questions}) >= 6
    for q in questions:
        ids = to_ids([{"role": "user", "content": q["turns"][0]}])
        assert tuple(ids) in heldout


def test_sweep_rows_and_files(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        grid = [("pld", "k2", {"num_draft_tokens": 2}), ("pld", "k6", {"num_draft_tokens": 6})]
        res = tree_sweep.sweep(tiny_target(), QUESTIONS[1:], chat_ids, tmp_path, max_new_tokens=8, grid=grid,
                               progress=False, decode=decode)
    finally:
        torch.set_num_threads(threads)
    assert [r["options"] for r in res["rows"]] == [{"num_draft_tokens": 2}, {"num_draft_tokens": 6}]
    assert all(r["tau"] >= 1.0 and r["speedup"] > 0 for r in res["rows"])
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"] == res["rows"]
    md = (tmp_path / "sweep.md").read_text()
    assert md.startswith("| method | tree |") and "num_draft_tokens=6" in md and "Plain decoding" in md


def test_methods_filter_refuses_unknown_names(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        tree_sweep.main(["--methods", "medusa,nope", "--out", str(tmp_path)])
    assert "no sweep settings for nope" in capsys.readouterr().err
    assert {m for m, _, _ in tree_sweep.GRID} == {"eagle2", "moa", "medusa", "amphista"}
