"""The drafting vocabulary: frequent tokens plus the conversation's own tokens (core/drafters/draft_vocab.py)."""

from __future__ import annotations

import pytest
import torch

from core.decoding import generate
from core.drafters.draft_vocab import DraftVocab
from core.drafters.eagle2 import Eagle2Drafter
from core.drafters.medusa import MedusaDrafter
from core.target import tiny_target
from tests.helpers import assert_greedy_lossless, tiny_prompts
from tests.test_medusa import prefill, train_batch

VOCAB = 64


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(vocab_size=VOCAB, n_layers=2)


def test_observed_tokens_follow_the_frequent_ones(tiny):
    vocab = DraftVocab(tiny, 8)
    vocab.set_ids(torch.arange(8))
    vocab.observe([3, 20, 20, 40])
    vocab.observe(torch.tensor([[40, 5], [33, 20]]))
    assert vocab.size == 11 and vocab.table().tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 20, 40, 33]
    assert vocab.to_index(torch.tensor([20, 40, 33, 3, 50])).tolist() == [8, 9, 10, 3, -1]
    assert vocab.to_token_ids(torch.tensor([8, 10, 2])).tolist() == [20, 33, 2]
    feature = torch.randn(4, tiny.hidden_size)
    full = tiny.lm_head(tiny.norm(feature)).float()
    logits = vocab.logits(feature)
    assert logits.shape == (4, 11)
    assert torch.allclose(logits, full[:, vocab.table()], atol=1e-5)  # the same frozen LM head rows
    vocab.clear_context()
    assert vocab.size == 8 and vocab.to_index(torch.tensor([20])).tolist() == [-1]


def test_context_tokens_are_never_saved(tiny):
    vocab = DraftVocab(tiny, 8)
    vocab.observe([30, 31])
    assert vocab.size == 10 and vocab.state_dict()["ids"].numel() == 8
    vocab.load_state_dict(vocab.state_dict())
    assert vocab.size == 8  # loading starts a new conversation


def test_context_off_and_full_vocabulary_ignore_observe(tiny):
    off = DraftVocab(tiny, 8, context=False)
    off.observe([30, 31])
    assert off.size == 8 and off.to_index(torch.tensor([30])).tolist() == [-1]
    full = DraftVocab(tiny, 0)
    full.observe([30, 31])
    assert full.size == VOCAB and full.table() is None


def test_a_new_conversation_forgets_the_last_one(tiny):
    d = MedusaDrafter.random(tiny, seed=1, draft_vocab_size=16)
    d.vocab.set_ids(torch.arange(16))
    d.begin(tiny, prefill(tiny, [5, 40, 41, 9]))
    assert {40, 41} <= set(d.vocab.table().tolist())
    second = prefill(tiny, [5, 50, 9])
    d.begin(tiny, second)
    extras = set(d.vocab.table()[16:].tolist())
    assert 50 in extras and extras <= {50, second.bonus}


def test_verified_tokens_join_during_decoding_and_output_stays_lossless(tiny):
    """EAGLE-2 with 16 frequent tokens: tokens the target emits join the vocabulary as they are verified."""
    d = Eagle2Drafter.random(tiny, seed=2, draft_vocab_size=16)
    d.vocab.set_ids(torch.arange(16))
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=3)
    assert_greedy_lossless(tiny, lambda: d, prompts, 20, stop_tokens=set())
    out = generate(tiny, d, prompts[0], 20, stop_tokens=set())
    expected = set(range(16)) | set(prompts[0]) | set(out.token_ids)
    assert set(d.vocab.table().tolist()) <= expected
    assert set(out.token_ids[:-1]) <= set(d.vocab.table().tolist())  # all but the last bonus were observed


def test_observe_batch_makes_every_label_reachable_in_training(tiny):
    d = MedusaDrafter.random(tiny, seed=0, draft_vocab_size=16)
    d.vocab.set_ids(torch.arange(0, 32, 2))
    batch = train_batch(tiny, length=16)
    assert (d.vocab.to_index(batch.input_ids) < 0).any()
    d.observe_batch(batch.input_ids)
    assert (d.vocab.to_index(batch.input_ids) >= 0).all()
    d.train()
    loss, metrics = d.training_loss(batch, 0.0)
    loss.backward()
    assert torch.isfinite(loss) and metrics["top10@1"] > 0


def test_drafting_uses_the_top_ranked_tokens_and_training_all_of_them(tiny, monkeypatch):
    """A conversation drafts over the `drafting_size` top-ranked trained tokens (+ context); a training batch
    goes back to every trained token; decoding stays lossless on the smaller set."""
    import core.drafters.draft_vocab as dv

    ranks = {t: i for i, t in enumerate([14, 2, 9, 30, 6, 0])}  # 4 and 22 are unranked: last
    monkeypatch.setattr(dv, "token_ranks", lambda path=dv.RANKS_FILE: ranks)
    d = Eagle2Drafter.random(tiny, seed=4, draft_vocab_size=8)
    d.vocab.set_ids(torch.tensor([0, 2, 4, 6, 9, 14, 22, 30]))
    d.vocab.drafting_size = 3
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=5)
    assert_greedy_lossless(tiny, lambda: d, prompts, 16, stop_tokens=set())
    d.begin(tiny, prefill(tiny, [1, 2]))
    table = d.vocab.table().tolist()
    assert table[:3] == [2, 9, 14] and set(table[3:]) <= {1, 2} | {prefill(tiny, [1, 2]).bonus}
    feature = torch.randn(2, tiny.hidden_size)
    full = tiny.lm_head(tiny.norm(feature)).float()
    assert torch.allclose(d.vocab.logits(feature), full[:, d.vocab.table()], atol=1e-5)
    d.observe_batch(torch.tensor([[1, 3]]))  # training: every trained token again
    assert d.vocab.table().tolist()[:8] == [0, 2, 4, 6, 9, 14, 22, 30] and d.vocab.size == 10
    assert d.vocab.logits(feature).shape == (2, 10)
    d.vocab.drafting_size = 0  # 0: draft over every trained token
    d.begin(tiny, prefill(tiny, [1, 2]))
    assert d.vocab.table().tolist()[:8] == [0, 2, 4, 6, 9, 14, 22, 30]
    d.vocab.drafting_size = 3  # changed between conversations: trained tokens outside the top 3 are context again
    d.begin(tiny, prefill(tiny, [0, 2]))
    assert d.vocab.table().tolist()[:3] == [2, 9, 14] and 0 in d.vocab.table().tolist()[3:]


def test_the_committed_token_ranks_come_from_the_distillation_answers(tmp_path):
    """assets/drafters/token_ranks.json is what `python -m core.training.draft_vocab_build` writes from the committed
    data."""
    import json

    from core.drafters.draft_vocab import RANKS_FILE
    from core.training.draft_vocab_build import main

    committed = json.loads(RANKS_FILE.read_text())
    out = tmp_path / "ranks.json"
    assert main(["--distill", committed["source"], "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == committed
    ids = committed["ids_by_frequency"]
    assert len(ids) == len(set(ids)) == 8192 and all(0 <= t < 49152 for t in ids)
    assert main(["--distill", str(tmp_path / "missing.npz"), "--out", str(out)]) == 2


@pytest.mark.parametrize(("option", "bad"), [("--vocab-sizes", ""), ("--vocab-sizes", "2048,abc"),
                                             ("--vocab-sizes", "-1"), ("--trees", "auto,0/3"), ("--trees", "1/x"),
                                             ("--trees", "3/2"), ("--trees", ",")])
def test_profile_drafting_rejects_bad_comparisons_before_loading(option, bad, capsys):
    """scripts/profile_drafting.py --vocab-sizes / --trees: a one-line error naming the value, before any model
    loads."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "profile_drafting.py"
    spec = importlib.util.spec_from_file_location("profile_drafting", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--methods", "eagle2", option, bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and option in err and repr(bad) in err
    assert script.parse_sizes("8192, 2048,0") == [8192, 2048, 0]
    assert script.parse_trees("auto, 1/4,2/7") == ["auto", "1/4", "2/7"] and script.parse_trees(None) == []
