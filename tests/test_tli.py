"""TLI sweep plumbing on a tiny target with stand-in drafters (the real MoA drafters are tested elsewhere)."""

from __future__ import annotations

import json

import pytest
import torch

from analysis import tli
from core.drafters.pld import PromptLookupDrafter
from core.target import tiny_target
from tests.test_bench import QUESTIONS, OracleDrafter, chat_ids, decode


@pytest.fixture(scope="module")
def target():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_target()
    torch.set_num_threads(threads)


def test_sweep_writes_table_and_figure(target, tmp_path):
    def build(n):
        return (OracleDrafter(), "shipped: test") if n == 1 else (PromptLookupDrafter(), tli.RANDOM_NOTE)

    res = tli.sweep(target, QUESTIONS[1:], tmp_path, tli_values=(0, 1), max_new_tokens=8, build=build,
                    chat_ids=chat_ids, decode=decode, progress=False)
    assert [r["tli"] for r in res["rows"]] == [0, 1]
    assert res["notes"] == [f"TLI N=0: {tli.RANDOM_NOTE}"]
    for r in res["rows"]:
        assert {"tau", "draft_ms_per_cycle", "speedup", "ideal_speedup", "source"} <= set(r)
    assert res["rows"][1]["tau"] > 1.0
    saved = json.loads((tmp_path / "tli.json").read_text())
    assert saved["rows"] == res["rows"]
    md = (tmp_path / "tli.md").read_text()
    assert md.startswith("| TLI N |") and "Note: TLI N=0" in md
    assert (tmp_path / "tli.html").exists() and (tmp_path / "summary.json").exists()
    assert len(tli.tli_figure(res["rows"]).data) == 3
    again = tli.from_summary(tmp_path / "summary.json", tmp_path / "derived")  # the table without a new run
    assert again["rows"] == res["rows"] and again["notes"] == res["notes"]
    assert (tmp_path / "derived" / "tli.md").read_text() == md


def test_live_run(target):
    out = tli.live_run(target, 1, [5, 6, 7, 5, 6], max_new_tokens=8, drafter=OracleDrafter())
    assert out["source"] == "given" and out["tli"] == 1 and out["new_tokens"] == 8
    assert out["tau"] > 1.0 and out["speedup"] is not None and out["ar_tokens_per_s"] > 0
    solo = tli.live_run(target, 1, [5, 6, 7], max_new_tokens=4, drafter=PromptLookupDrafter(), baseline=False)
    assert solo["speedup"] is None


def test_random_stand_in_when_nothing_is_shipped(monkeypatch, target):
    monkeypatch.setattr(tli, "shipped_folder", lambda n: None)
    with pytest.raises(FileNotFoundError):
        tli.load_tli_drafter(target, 1, allow_random=False)
    drafter, source = tli.load_tli_drafter(target, 1)
    assert source == tli.RANDOM_NOTE and drafter.config.tli == 1
