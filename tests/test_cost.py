"""Hardware-aware trees (core.trees): the expected-tau model, the tree choice, `auto` in the drafters."""

from __future__ import annotations

import pytest
import torch

from core.target import tiny_target
from core.trees import cost_curve
from core.trees.acceptance import card_acceptance, method_acceptance
from core.trees.choice import choose_tree, conditional_rates, expected_tau
from core.trees.cost_curve import curve_for, matmul_floor_ms, monotone

FLAT = {"sizes": [1, 8, 32, 64], "ms": [10.0, 10.0, 10.0, 10.0]}  # a GPU: extra tokens cost nothing
STEEP = {"sizes": [1, 8, 32, 64], "ms": [10.0, 14.0, 30.0, 60.0]}  # a small CPU


def test_conditional_rates_and_expected_tau_by_hand():
    assert conditional_rates([0.8, 0.4, 0.5]) == pytest.approx([0.8, 0.5, 1.0])  # 0.5 > 0.4 clipped to 0.4
    assert conditional_rates([0.5, None, 0.2]) == [0.5]
    # chain (width = reference width): tau = 1 + 0.8 + 0.8 * 0.5
    assert expected_tau([0.8, 0.5], 2, 2, 2, 2) == pytest.approx(2.2)
    # twice the reference width: with alpha = 1 each level's miss rate is squared; with alpha, raised to 2 ** alpha
    assert expected_tau([0.8, 0.5], 2, 4, 2, 2, alpha=1.0) == pytest.approx(1 + 0.96 + 0.96 * 0.75)
    c1, c2 = 1 - 0.2 ** (2 ** 0.5), 1 - 0.5 ** (2 ** 0.5)
    assert expected_tau([0.8, 0.5], 2, 4, 2, 2, alpha=0.5) == pytest.approx(1 + c1 + c1 * c2)
    # deeper than measured: the last rate repeats
    assert expected_tau([0.5], 3, 3, 1, 1) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tau([], 3, 3, 1, 1) == 1.0


def test_trees_are_larger_where_a_wide_pass_is_cheap():
    acc = {"p": [0.7, 0.4, 0.2, 0.1], "ref_depth": 4, "ref_total": 16.0, "draft_ms": None, "verify_ms_1": None,
           "source": "hand"}
    gpu = choose_tree("x", curve=FLAT, acceptance=acc, draft_ms_per_level=0.5)
    cpu = choose_tree("x", curve=STEEP, acceptance=acc, draft_ms_per_level=0.5)
    assert gpu["total_tokens"] > cpu["total_tokens"]
    assert gpu["total_tokens"] <= gpu["depth"] * 8  # a level holds at most top_k nodes
    # the choice is the best point of its own grid, and its figures are that point's
    best = max(cpu["grid"], key=lambda r: r["tokens_per_s"])
    assert (cpu["depth"], cpu["total_tokens"]) == (best["depth"], best["total_tokens"])
    assert cpu["expected_tokens_per_s"] == pytest.approx(best["tokens_per_s"], abs=1e-3)
    # drafting that costs a lot per level makes the tree shallower
    dear = choose_tree("x", curve=FLAT, acceptance=acc, draft_ms_per_level=20.0)
    assert dear["depth"] < gpu["depth"]
    none = choose_tree("x", curve=FLAT, acceptance={"p": [], "ref_depth": 0, "ref_total": 0, "source": "-"})
    assert none["depth"] is None  # nothing to go by
    with pytest.raises(ValueError):
        choose_tree("x")


def test_summary_and_card_acceptance(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{"config": {"baseline": "ar"}, "methods": {"ar": {"overall": {"verify_ms_per_cycle": 30}}, '
                    '"m": {"overall": {"acceptance_by_position": [0.6, 0.3], "mean_tree_nodes": 20, '
                    '"draft_ms_per_cycle": 12}}}}')
    got = method_acceptance("m", path)
    assert got["p"] == [0.6, 0.3] and got["ref_depth"] == 2 and got["ref_total"] == 20.0
    assert got["draft_ms"] == 12 and got["verify_ms_1"] == 30
    assert method_acceptance("other", path) is None
    card = card_acceptance({"acc@1": 0.5, "acc@2": 0.4, "loss": 3.0})
    assert card["p"] == pytest.approx([0.5, 0.2]) and card["ref_total"] == 2.0
    assert card_acceptance(None) is None


def test_tiny_target_uses_the_fixed_model_and_is_never_timed(monkeypatch):
    target = tiny_target()
    monkeypatch.setattr(cost_curve, "time_pass_sizes", lambda *a, **k: pytest.fail("the tiny target must not be timed"))
    assert curve_for(target)["fixed"] is True
    choice = choose_tree("eagle2", target)
    assert choice["curve"]["fixed"] and (choice["depth"] is None or choice["depth"] >= 1)


def test_auto_is_the_default_and_a_user_can_fix_the_tree(tmp_path):
    from core.drafters.eagle2 import Eagle2Drafter
    from core.drafters.trained import resolve_auto_tree

    target = tiny_target()
    d = Eagle2Drafter.random(target)
    assert d.tree_auto
    assert resolve_auto_tree(d, target)["depth"] is None  # untrained: the configured tree stays
    d.save_pretrained(tmp_path / "e", extra={"training": {"heldout": {"acc@1": 0.9, "acc@2": 0.8,
                                                                        "acc@3": 0.7}}})
    loaded = Eagle2Drafter.from_pretrained(tmp_path / "e", target)
    choice = resolve_auto_tree(loaded, target)
    assert choice["acceptance_source"].startswith("drafter card")
    assert (loaded.config.depth, loaded.config.total_tokens) == (choice["depth"], choice["total_tokens"])
    loaded.set_options(depth=2, total_tokens=5)
    assert not loaded.tree_auto and resolve_auto_tree(loaded, target) is None
    assert (loaded.config.depth, loaded.config.total_tokens) == (2, 5)
    loaded.set_options(depth="auto", total_tokens="auto")
    assert loaded.tree_auto and resolve_auto_tree(loaded, target)["depth"] == choice["depth"]
    with pytest.raises(ValueError):
        loaded.set_options(depth="deep")


def test_static_tree_auto_resizes_from_measured_accuracies(tmp_path):
    from core.drafters.medusa import MedusaDrafter

    target = tiny_target()
    d = MedusaDrafter.random(target, num_heads=3)
    d.config.tree_accuracy = [[0.9, 0.05, 0.02], [0.8, 0.1, 0.05], [0.7, 0.1, 0.05]]
    d.save_pretrained(tmp_path / "m")
    loaded = MedusaDrafter.from_pretrained(tmp_path / "m", target)
    choice = loaded.resolve_auto_static_tree(target)
    assert choice["total_tokens"] == len(loaded.tree_paths) >= 1
    assert choice["curve"]["fixed"]
    loaded.set_options(tree_size=3)
    assert not loaded.tree_auto and len(loaded.tree_paths) == 3


def test_floor_is_measured_for_a_real_shape_without_caching_tiny(tmp_path):
    target = tiny_target()
    path = tmp_path / "c.json"
    ms = matmul_floor_ms(target, repeats=2, cache_path=path)
    assert ms > 0 and not path.exists()  # the tiny target's floor is never cached
    assert torch.is_tensor(target.fused_layers()[0].qkv)


def test_choose_tree_covers_every_method_kind():
    from core.drafters.static_tree import static_tree_choice

    medusa = static_tree_choice("medusa", STEEP)
    assert medusa["acceptance_source"].startswith("assets/drafters/medusa") and medusa["total_tokens"] >= 1
    assert choose_tree("medusa+lookup", curve=STEEP)["total_tokens"] is None  # static: not choose_tree's
    flat = static_tree_choice("medusa", FLAT)
    assert flat["total_tokens"] >= medusa["total_tokens"]  # nodes are free on a flat curve
    assert choose_tree("ar", curve=STEEP)["total_tokens"] is None
    given = static_tree_choice("x", STEEP, [[0.9, 0.05], [0.5, 0.1]], draft_ms=1.0)
    assert len(given["grid"]) == 7 and given["total_tokens"] == 2  # 2 + 2 x 2 possible nodes; 2 pay best
    best = max(given["grid"][1:], key=lambda r: r["tokens_per_s"])
    assert given["total_tokens"] == best["total_tokens"]


def test_a_spiky_curve_is_read_through_its_monotone_envelope():
    spiky = {"sizes": [1, 8, 32, 64], "ms": [90.0, 20.0, 30.0, 25.0]}
    assert monotone(spiky)["ms"] == [20.0, 20.0, 25.0, 25.0]
    assert spiky["ms"] == [90.0, 20.0, 30.0, 25.0]  # the stored curve stays as measured
    acc = {"p": [0.7, 0.4], "ref_depth": 2, "ref_total": 8.0, "draft_ms": None, "verify_ms_1": None,
           "source": "hand"}
    assert choose_tree("x", curve=spiky, acceptance=acc)["cycle_ms"] >= 20.0


def test_acceptance_by_depth_comes_from_the_deeper_run_and_cost_from_the_latest(tmp_path):
    import json

    def summary(path, p, draft_ms, nodes):
        path.write_text(json.dumps({"config": {"baseline": "ar"}, "methods": {
            "ar": {"overall": {"verify_ms_per_cycle": 30.0}},
            "moa": {"overall": {"acceptance_by_position": p, "draft_ms_per_cycle": draft_ms,
                                "mean_tree_nodes": nodes}}}}))
        return path

    latest = summary(tmp_path / "latest.json", [0.6], 6.0, 8)  # an auto run that drafted one level
    deep = summary(tmp_path / "deep.json", [0.55, 0.3, 0.1], 30.0, 24)  # fixed trees, older drafting code
    acc = method_acceptance("moa", results=latest, deep_results=deep)
    assert acc["p"] == [0.55, 0.3, 0.1] and acc["ref_depth"] == 3 and acc["ref_total"] == 24.0
    assert acc["draft_ms"] == 6.0 and acc["draft_levels"] == 1 and "latest.json" in acc["source"]
    curve = {"sizes": [1, 64], "ms": [30.0, 30.0]}
    assert choose_tree("moa", curve=curve, acceptance=acc)["draft_ms_per_level"] == pytest.approx(6.0)
    only_latest = method_acceptance("moa", results=latest, deep_results=tmp_path / "missing.json")
    assert only_latest["p"] == [0.6] and only_latest["draft_ms"] == 6.0
    assert method_acceptance("eagle2", results=latest, deep_results=deep) is None


def test_weight_traffic_counts_every_matrix_a_pass_reads():
    """analysis.weight_traffic (scripts/profile_drafting.py --weights): plain decoding reads each layer's matrices
    and the LM head once a pass and drafts nothing; Medusa's drafting reads its heads and its vocabulary
    projection, once a cycle."""
    from analysis.weight_traffic import measure as weight_traffic
    from core.drafters.base import Autoregressive
    from core.drafters.medusa import MedusaDrafter

    target = tiny_target()
    size = 4  # float32
    per_pass = sum(p.numel() for layer in target.layers for name, p in layer.named_parameters()
                   if p.dim() == 2) + target.lm_head.weight.numel()
    ar = weight_traffic(target, Autoregressive(), [1, 2, 3], 6)
    assert ar["draft_mb"] == 0
    assert ar["verify_mb"] == pytest.approx(per_pass * size / 1e6, rel=1e-9)
    medusa = MedusaDrafter.random(target, seed=0)
    heads = sum(p.numel() for p in medusa.heads.parameters() if p.dim() == 2)
    got = weight_traffic(target, medusa, [1, 2, 3], 6)
    assert got["verify_mb"] == pytest.approx(per_pass * size / 1e6, rel=1e-9)
    assert got["draft_mb"] == pytest.approx((heads + target.lm_head.weight.numel()) * size / 1e6, rel=1e-9)


def test_weight_traffic_figure_sets_bytes_beside_time():
    from analysis.weight_traffic import figure

    rows = [{"method": "ar", "draft_mb": 0.0, "verify_mb": 269.0, "draft_ms": 0.0, "verify_ms": 23.0},
            {"method": "moa", "draft_mb": 49.4, "verify_mb": 269.0, "draft_ms": 6.8, "verify_ms": 26.0}]
    fig = figure(rows)
    assert [list(t.x) for t in fig.data] == [["moa"], ["moa"]]  # plain decoding drafts nothing: no bars
    assert fig.data[0].y[0] == pytest.approx(49.4 / 269.0) and fig.data[1].y[0] == pytest.approx(6.8 / 26.0)


def test_op_count_splits_calls_between_drafting_and_verify():
    """analysis.op_count (scripts/profile_drafting.py --ops): plain decoding's drafting (an empty tree) makes a
    handful of calls, a drafter that runs layers many more; the verify side is counted apart; counts repeat."""
    from analysis.op_count import count
    from core.drafters.base import Autoregressive
    from core.drafters.medusa import MedusaDrafter

    target = tiny_target()
    ar = count(target, Autoregressive(), [1, 2, 3], 6)
    assert ar["cycles"] == 5 and ar["draft_operator_calls"] < 10
    assert ar["verify_operator_calls"] > 10 and ar["verify_torch_calls"] > 10
    medusa = MedusaDrafter.random(target, seed=0)
    got = count(target, medusa, [1, 2, 3], 6)
    assert got["draft_operator_calls"] > 3 * ar["draft_operator_calls"] + 10
    assert got["draft_torch_calls"] > 3 * ar["draft_torch_calls"] + 10
    assert count(target, medusa, [1, 2, 3], 6) == got
