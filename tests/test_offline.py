"""MoA's offline drafting: what the client drafts while the link is down, and where it stops."""

from __future__ import annotations

import pytest
import torch

from core.client_server import client as client_module
from core.client_server.client import chain_options, greedy_path, offline_horizon_for
from core.client_server.models import make_drafter, make_target
from core.client_server.network import preset
from core.client_server.sim import CostModel, simulate
from core.decoding import generate
from core.drafters.base import Autoregressive
from core.drafters.moa import MoADrafter
from tests.helpers import tiny_prompts
from tests.test_eagle2 import quick_train, self_distill_batch

VOCAB = 64
MOA_SMALL = {"lsa_heads": 2, "depth": 4, "top_k": 4, "total_tokens": 12}
COST = CostModel()


@pytest.fixture(scope="module")
def tiny():
    return make_target("tiny")


@pytest.fixture(scope="module")
def trained(tiny):
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=1)
    moa = MoADrafter.random(tiny, seed=0, period_max=6, **MOA_SMALL)
    quick_train(moa, self_distill_batch(tiny, moa.train_needs, prompts), steps=30)
    return moa, prompts


def record_offline_starts(monkeypatch) -> list[tuple[list[int], list[int]]]:
    """Patch the client so that each offline step also records the online drafter's greedy path from the
    same state: (what an online cycle would draft first, what the offline step drafted)."""
    seen: list[tuple[list[int], list[int]]] = []
    original = client_module.Client._draft_offline

    def patched(self):
        root = self.provisional[-1] if self.provisional else self.root
        online = greedy_path(self.drafter.draft(root))
        before = len(self.provisional)
        original(self)
        seen.append((online, self.provisional[before:]))

    monkeypatch.setattr(client_module.Client, "_draft_offline", patched)
    return seen


def test_default_horizon_is_the_trained_one(trained):
    moa, _ = trained
    assert offline_horizon_for(moa) == 6
    assert offline_horizon_for(moa, 3) == 3 and offline_horizon_for(moa, 0) == 0
    for bad in (-1, 2.5, True, "7"):
        with pytest.raises(ValueError, match="offline_horizon"):
            offline_horizon_for(moa, bad)


@pytest.mark.parametrize("horizon", [None, 3, 0])
def test_offline_drafting_stops_at_the_horizon(tiny, trained, horizon):
    moa, prompts = trained
    prompt = prompts[0]
    ref = generate(tiny, Autoregressive(), prompt, 40, stop_tokens=set()).token_ids
    run = simulate(tiny, "moa", moa, prompt, preset("4g", [(0.2, 3.2)]), 40, timing=COST, stop_tokens=set(),
                   offline_horizon=horizon, offline_min_confidence=0.0)
    assert run.token_ids == ref  # lossless whatever the horizon
    limit = 6 if horizon is None else horizon
    assert run.offline_horizon == limit
    shown_ahead = max(p["shown"] - p["verified"] for p in run.trace.progress)
    assert shown_ahead == limit, "offline text fills the horizon during a 3 s drop, and never passes it"
    if limit:
        assert [s["reason"] for s in run.offline_stops][:1] == ["horizon"]
        assert all(s["provisional"] <= limit for s in run.offline_stops)
    else:
        assert run.offline_tokens == 0 and run.offline_stops == []


def test_offline_chain_is_the_online_greedy_path(tiny, trained, monkeypatch):
    """Each offline step drafts exactly what the online drafter's tree puts first from the same state."""
    moa, prompts = trained
    seen = record_offline_starts(monkeypatch)
    simulate(tiny, "moa", moa, prompts[1], preset("4g", [(0.2, 1.5)]), 30, timing=COST, stop_tokens=set(),
             offline_min_confidence=0.0)
    assert seen
    for online, offline in seen:  # the tree may keep a shorter top path than the chain drafts: compare both
        n = min(len(online), len(offline))
        assert n and offline[:n] == online[:n]


def test_chain_options_draw_the_tree_top_path(tiny, trained):
    """The chain drafter (top_k = 1) and the full tree agree along the most probable path."""
    moa, prompts = trained
    events = generate(tiny, moa, prompts[0], 6, stop_tokens=set()).events
    root = events[-1].bonus
    full = greedy_path(moa.draft(root))
    with chain_options(moa):
        chain = greedy_path(moa.draft(root))
    assert chain and chain == full[:len(chain)]


@pytest.mark.real
def test_real_target_offline_starts_where_online_would(monkeypatch):
    """On the real target with the shipped MoA drafter: every offline step starts with the online top path."""
    target = make_target("smollm2", "bfloat16")
    moa, _ = make_drafter("moa", target, None, {})
    seen = record_offline_starts(monkeypatch)
    torch.manual_seed(0)
    for text in ("List the planets of the solar system in order.", "Write a Python function for the factorial of n."):
        ids = target.chat_ids(text)
        simulate(target, "moa", moa, ids, preset("4g", [(0.5, 2.0)]), 48, timing=COST, offline_min_confidence=0.0)
    assert seen
    for online, offline in seen:  # the tree may keep a shorter top path than the chain drafts: compare both
        n = min(len(online), len(offline))
        assert n and offline[:n] == online[:n]


def test_cli_offline_horizon(capsys):
    import json

    from core.client_server.__main__ import main

    args = ["--method", "moa", "--preset", "4g", "--disconnect", "0.3:2.3", "--prompt", "hello there",
            "--target", "tiny", "--max-new-tokens", "16", "--timing", "model", "--check", "--json",
            "--drafter", "random", "--drafter-options", json.dumps(MOA_SMALL), "--offline-min-confidence", "0"]
    assert main(args + ["--offline-horizon", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["matches_greedy"] and out["offline_horizon"] == 2
    assert out["offline_stops"] and out["offline_stops"][0]["reason"] == "horizon"
    assert main(args + ["--offline-horizon", "-1"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--offline-horizon" in err and "-1" in err


def test_confidence_cut_off_validation():
    assert client_module.offline_confidence_for() == client_module.OFFLINE_MIN_CONFIDENCE
    assert client_module.offline_confidence_for(0) == 0.0 and client_module.offline_confidence_for(0.5) == 0.5
    for bad in (-0.1, 1.0, 3, True, "0.2"):
        with pytest.raises(ValueError, match="offline_min_confidence"):
            client_module.offline_confidence_for(bad)


def test_offline_text_stops_where_the_drafter_is_unsure(tiny, trained, monkeypatch):
    """Every shown offline chain keeps the drafter's probability for it at or above the cut-off; a cut-off
    no chain reaches shows nothing, and says why; the output is greedy decoding's either way."""
    moa, prompts = trained
    prompt = prompts[0]
    ref = generate(tiny, Autoregressive(), prompt, 40, stop_tokens=set()).token_ids
    net = preset("4g", [(0.2, 3.2)])
    chains: list[float] = []
    original = client_module.Client._draft_offline

    def patched(self):
        original(self)
        confidence = 1.0
        for p in self.provisional_p:
            confidence *= p
        chains.append(confidence)

    monkeypatch.setattr(client_module.Client, "_draft_offline", patched)
    free = simulate(tiny, "moa", moa, prompt, net, 40, timing=COST, stop_tokens=set(), offline_min_confidence=0.0)
    cut = 0.6
    chains.clear()
    sure = simulate(tiny, "moa", moa, prompt, net, 40, timing=COST, stop_tokens=set(), offline_min_confidence=cut)
    assert free.token_ids == ref and sure.token_ids == ref
    assert sure.offline_tokens < free.offline_tokens
    assert all(c >= cut for c in chains if c < 1.0)
    assert "confidence" in [s["reason"] for s in sure.offline_stops] and sure.offline_min_confidence == cut
    never = simulate(tiny, "moa", moa, prompt, net, 40, timing=COST, stop_tokens=set(), offline_min_confidence=0.999)
    assert never.token_ids == ref and never.offline_tokens == 0
    assert [s["reason"] for s in never.offline_stops][:1] == ["confidence"]


def test_cli_rejects_a_bad_confidence(capsys):
    from core.client_server.__main__ import main

    assert main(["--method", "moa", "--prompt", "hi", "--target", "tiny", "--offline-min-confidence", "1.5"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--offline-min-confidence" in err and "1.5" in err


@pytest.mark.real
def test_real_target_online_roots_predict_what_training_computes():
    """scripts/check_moa_roots.py on committed answers: at each online cycle's root, the shipped drafter's online
    top-1 is the token its training forward pass predicts there (all but bfloat16 near-ties)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("check_moa_roots", root / "scripts" / "check_moa_roots.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.compare("moa", root / "assets" / "results", limit=2)
    assert r["answers"] == 2 and r["cycles"] >= 20
    assert r["same_top1"] >= 0.85
    assert abs(r["teacher_forced"] - r["online"]) <= 0.1


def test_confirmed_bound_from_accuracy(tmp_path, capsys):
    import json
    import math

    from analysis import offline

    assert offline.expected_confirmed([1.0], 14) == 14  # a drafter that is always right: the whole chain
    assert offline.expected_confirmed([0.5, 0.2], 2) == pytest.approx(0.5 + 0.1)
    assert offline.expected_confirmed([0.5, 0.3], 3) == pytest.approx(0.5 + 0.15 + 0.15 * 0.4)  # mean past the list
    p = 0.6
    assert offline.expected_confirmed([p], 14) == pytest.approx(p * (1 - p ** 14) / (1 - p))
    need = offline.accuracy_needed(3.0, 14)
    assert 0.7 < need < 0.8 and offline.expected_confirmed([need], 14) == pytest.approx(3.0, abs=1e-6)
    with pytest.raises(ValueError, match="per_drop"):
        offline.accuracy_needed(14, 14)
    probe = tmp_path / "channels.json"
    probe.write_text(json.dumps({"top1_by_distance": {"normal": {"2": 0.5, "1": 0.5}}}))
    assert offline.main(["--bound-from", str(probe), "--horizon", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["expected_confirmed_per_drop"] == pytest.approx(sum(0.5 ** k for k in range(1, 5)), abs=1e-3)
    assert math.isclose(out["top1_needed"], round(offline.accuracy_needed(3.0, 4), 3))
    for bad in (["--bound-from", str(tmp_path / "missing.json")], ["--bound-from", str(probe), "--per-drop", "20"]):
        with pytest.raises(SystemExit):
            offline.main(bad)
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert bad[-1] in err


def test_shipped_bound_agrees_with_the_measured_offline_run():
    from analysis import offline
    from demo.tab_client_server import bound_markdown

    facts = offline.shipped_bound()
    assert facts is not None, "the committed probe or offline run is missing"
    # the independence model behind the bound explains what the client-server runs measured
    assert abs(facts["expected_confirmed_per_drop"] - facts["measured_per_drop"]) < 0.25
    assert facts["best_top1"] < facts["top1_needed"]
    text = bound_markdown(facts)
    for figure in (facts["expected_confirmed_per_drop"], facts["measured_per_drop"], facts["top1_needed"]):
        assert f"{figure:.2f}" in text
    fig = offline.bound_figure(facts)
    assert [len(t.x) for t in fig.data][1:] == [1, 1, 1, 1]
