"""The MoA analyses' own logic (analysis.offline, analysis.moa_ablation, analysis.moa_channels), no real model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from analysis import moa_ablation, moa_channels, offline
from core.trees.draft_tree import DraftTree


def test_pick_questions_cycles_through_categories(tmp_path):
    rows = [{"question_id": i, "category": c, "turns": ["q"]} for i, c in enumerate("aabbbc")]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [q["question_id"] for q in offline.pick_questions(path, 5)] == [0, 2, 5, 1, 3]
    assert len(offline.pick_questions(path, 50)) == 6


def test_drop_stats_counts_the_confirmed_prefix():
    trace = SimpleNamespace(snapshots=[{"t": 0.5, "verified": [1], "provisional": [9]},
                                       {"t": 1.2, "verified": [1, 2], "provisional": [3, 4, 7, 8]},
                                       {"t": 5.0, "verified": [1, 2, 3, 4, 5], "provisional": [6]}])
    run = SimpleNamespace(token_ids=[1, 2, 3, 4, 5, 6], trace=trace, virtual_time_s=8.0)
    stats = offline.drop_stats(run, [(1.0, 3.0), (4.0, 6.0), (7.0, 7.5), (9.0, 10.0)])
    # the drop at 7 s happened (the run lasted 8 s) but nothing was shown: it counts, with no text;
    # the drop at 9 s came after the run ended
    assert [(s["offline"], s["confirmed"], s["first_confirmed"]) for s in stats] == [(4, 2, True), (1, 1, True),
                                                                                      (0, 0, False)]


def test_online_top1_reads_the_most_probable_depth1_node():
    tree = DraftTree(torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0]), torch.tensor([0.3, 0.6, 0.9]))
    events = [None, SimpleNamespace(tree=tree, new_tokens=[6, 8]), SimpleNamespace(tree=tree, new_tokens=[5]),
              SimpleNamespace(tree=DraftTree.empty(), new_tokens=[1])]
    assert offline.online_top1(events) == (1, 2)


def test_offline_cli_checks_before_loading():
    for argv in (["--prompts", "0"], ["--horizon", "-2"], ["--drop", "3:1"], ["--preset", "6g"]):
        with pytest.raises(SystemExit) as err:
            offline.parse_args(argv)
        assert err.value.code == 2


def test_ablation_reads_each_checkpoints_architecture():
    folder = Path("assets/drafters/moa")
    cfg = json.loads((folder / "config.json").read_text())["config"]
    arch = moa_ablation.architecture(folder)
    assert arch == {"lsa": "narrow (128)", "ca_mlp": True, "ca_window": cfg["ca_window"] or "all",
                    "final_feature": cfg.get("final_feature", False),
                    "final_feature_gain": cfg.get("final_feature_gain", 1.0), "tli": 0,
                    "period": f"{cfg['period_min']}-{cfg['period_max']}",
                    "staircase": "window"}
    assert moa_ablation.final_feature_cell(arch) == "yes (x32)"  # the shipped drafter: its final feature at gain 32
    assert moa_ablation.final_feature_cell({**arch, "final_feature_gain": 1.0}) == "yes"
    assert moa_ablation.final_feature_cell({**arch, "final_feature": False}) == "no"
    with pytest.raises(SystemExit):
        moa_ablation.main(["--candidates", "no/such/folder", "--out", "x"])


def test_channels_cli_checks_before_loading(tmp_path):
    for argv in (["--sequences", "0"], ["--data", str(tmp_path / "none.npz")], ["--drafter", str(tmp_path)]):
        with pytest.raises(SystemExit) as err:
            moa_channels.main(argv)
        assert err.value.code == 2


def test_stream_spread_measures_what_each_part_writes():
    """stream_spread: one figure per part the drafter has; scaling the final feature's gain scales its spread
    by the same factor and leaves SA's alone."""
    from core.drafters.moa import MoADrafter
    from core.target import tiny_target
    from core.training.data import make_sequences

    tiny = tiny_target(vocab_size=64, n_layers=3)
    g = torch.Generator().manual_seed(3)
    records = [{"prompt_ids": torch.randint(1, 64, (6,), generator=g).tolist(),
                "answer_ids": torch.randint(1, 64, (20,), generator=g).tolist()} for _ in range(4)]
    seqs = make_sequences(records, 64)
    spreads = []
    for gain in (1.0, 3.0):
        d = MoADrafter.random(tiny, seed=2, final_feature=True, final_feature_gain=gain, ca_window=4, ca_mlp=True,
                              lsa_dim=16, lsa_heads=2, init_from_target=True)
        with torch.no_grad():
            for p in d.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
        spreads.append(moa_channels.stream_spread(d, tiny, seqs))
    assert set(spreads[0]) == {"sa", "final_feature", "ca", "ca_mlp"} and all(v > 0 for v in spreads[0].values())
    assert spreads[1]["sa"] == spreads[0]["sa"]
    assert spreads[1]["final_feature"] == pytest.approx(3 * spreads[0]["final_feature"], rel=0.02)
    where = moa_channels.ca_attention(d, tiny, seqs)  # the same forward pieces, read by CA's statistics
    assert 0 <= where["normalised_entropy"] <= 1 and 0 < where["weight_on_last_verified"] <= 1
    assert where["uniform_weight"] == pytest.approx(1 / 4, rel=0.05)  # ca_window 4: four verified positions


def test_the_memory_probe_reads_what_a_source_holds():
    """ridge_read: a source that holds the feature linearly reads it back (R^2 near 1 on unseen rows), noise not."""
    g = torch.Generator().manual_seed(0)
    n, width, hidden = 300, 12, 6
    x = torch.randn(n, width, generator=g)
    y = x[:, :hidden] @ torch.randn(hidden, hidden, generator=g) + 0.01 * torch.randn(n, hidden, generator=g)
    idx = torch.arange(n)
    parts = (idx < 150, (idx >= 150) & (idx < 225), idx >= 225)
    pred, lam = moa_channels.ridge_read(x, y, parts)
    r2 = 1 - ((pred - y[parts[2]]) ** 2).sum() / ((y[parts[2]] - y[parts[2]].mean(0)) ** 2).sum()
    assert r2 > 0.99 and lam in moa_channels.RIDGE
    noise, _ = moa_channels.ridge_read(torch.randn(n, width, generator=g), y, parts)
    r2_noise = 1 - ((noise - y[parts[2]]) ** 2).sum() / ((y[parts[2]] - y[parts[2]].mean(0)) ** 2).sum()
    assert r2_noise < 0.2


def test_memory_reads_on_a_tiny_drafter():
    from core.drafters.moa import MoADrafter
    from core.target import tiny_target
    from core.training.data import make_sequences

    tiny = tiny_target(vocab_size=64, n_layers=3)
    g = torch.Generator().manual_seed(5)
    records = [{"prompt_ids": torch.randint(1, 64, (6,), generator=g).tolist(),
                "answer_ids": torch.randint(1, 64, (24,), generator=g).tolist()} for _ in range(8)]
    d = MoADrafter.random(tiny, seed=1, lsa_dim=16, lsa_heads=2).eval()
    out = moa_channels.memory_reads(d, tiny, make_sequences(records, 64))
    assert set(out) == {"positions", "raw_kv", "lsa_memory", "ca_values"}
    kv_width = 2 * tiny.kv_heads * tiny.head_dim
    assert out["raw_kv"]["width"] == 3 * kv_width and out["lsa_memory"]["width"] == tiny.hidden_size
    assert all(out[k]["r2"] <= 1 and 0 <= out[k]["top1"] <= 1 for k in ("raw_kv", "lsa_memory", "ca_values"))
    assert sum(out["positions"].values()) == 8 * 24
    with pytest.raises(ValueError, match="at least 3"):
        moa_channels.memory_reads(d, tiny, make_sequences(records[:2], 64))


def test_probe_cli_needs_three_sequences(capsys):
    with pytest.raises(SystemExit):
        moa_channels.main(["--probe", "--sequences", "2"])
    assert "--sequences must be at least 3" in capsys.readouterr().err
