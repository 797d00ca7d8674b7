"""`feature_scale` (DrafterConfig): target features enter divided by it, regressed features leave multiplied.

The defining property: a drafter with scale c fed c x the features computes what a drafter with
scale 1 computes on the originals (c is a power of two, so the division is exact). Checked for
every trained drafter's loss, plus: the scale is not a no-op, decoding stays lossless with it,
training and drafting agree under it (an overfitted drafter gets its drafts accepted), and
checkpoints keep it, older ones (without the field) loading as 1.0.
"""

from __future__ import annotations

import json

import pytest
import torch

from core.drafters.amphista import AmphistaDrafter
from core.drafters.checkpoint import TrainBatch
from core.drafters.eagle2 import Eagle2Drafter
from core.drafters.medusa import MedusaDrafter
from core.drafters.moa import MoADrafter
from core.target import Target, tiny_target
from tests.helpers import assert_greedy_lossless, tiny_prompts
from tests.test_eagle2 import quick_train, self_distill_batch

VOCAB = 64
SCALE = 4.0
CLASSES = [Eagle2Drafter, MoADrafter, MedusaDrafter, AmphistaDrafter]


@pytest.fixture(scope="module")
def tiny() -> Target:
    return tiny_target(vocab_size=VOCAB, n_layers=2)


def needs_of(d):
    return getattr(d, "train_needs", None) or d.needs


def scaled(batch: TrainBatch, c: float) -> TrainBatch:
    """The same batch with every residual-stream feature multiplied by c (keys/values untouched)."""
    return TrainBatch(batch.input_ids, batch.loss_mask, batch.attention_mask,
                      {k: v * c for k, v in batch.hidden.items()}, batch.layer_kv, batch.target)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.name)
def test_scaled_features_give_the_same_losses(tiny, cls):
    # MoA from target layers: its reference initialisation predicts states so small that the final norm's epsilon,
    # not the feature scale, decides the distribution term (the scale's units are what this test is about)
    start = {"init_from_target": True} if cls is MoADrafter else {}
    plain = cls.random(tiny, seed=0, **start).eval()
    with_scale = cls.random(tiny, seed=0, feature_scale=SCALE, **start).eval()
    a, b = plain.state_dict(), with_scale.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "same seed, same weights"
    batch = self_distill_batch(tiny, needs_of(plain), tiny_prompts(VOCAB, n=2, length=8, seed=3), n_new=12)
    def loss(drafter, b):  # reseeded: MoA draws its verification periods at random
        torch.manual_seed(0)
        with torch.no_grad():
            return drafter.training_loss(b, 1.0)

    loss_a, ma = loss(plain, batch)
    loss_b, mb = loss(with_scale, scaled(batch, SCALE))
    loss_c, _ = loss(with_scale, batch)
    assert torch.isfinite(loss_a)
    assert torch.allclose(loss_a, loss_b, rtol=1e-4, atol=1e-5), (float(loss_a), float(loss_b))
    for k in ma:
        if k.startswith("acc"):
            assert ma[k] == pytest.approx(mb[k], abs=1e-6), k
    assert not torch.allclose(loss_a, loss_c, rtol=1e-3), "the scale must change what unscaled features give"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.name)
def test_trained_with_a_scale_drafts_what_it_learned_and_stays_lossless(tiny, cls):
    prompts = tiny_prompts(VOCAB, n=3, length=8, seed=1)
    d = cls.random(tiny, seed=0, feature_scale=24.0)
    quick_train(d, self_distill_batch(tiny, needs_of(d), prompts), steps=40)
    taus = assert_greedy_lossless(tiny, lambda: d, prompts, 24, stop_tokens=set())
    assert max(taus) > 1.3, f"training and drafting disagree under feature_scale (tau {taus})"


def test_checkpoint_keeps_the_scale_and_old_configs_load_as_one(tmp_path):
    target = tiny_target(vocab_size=VOCAB, n_layers=2)
    d = Eagle2Drafter.random(target, seed=0, feature_scale=SCALE)
    d.save_pretrained(tmp_path / "new")
    assert Eagle2Drafter.from_pretrained(tmp_path / "new", target).config.feature_scale == SCALE
    d.save_pretrained(tmp_path / "old")
    meta = json.loads((tmp_path / "old" / "config.json").read_text())
    del meta["config"]["feature_scale"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(meta))
    assert Eagle2Drafter.from_pretrained(tmp_path / "old", target).config.feature_scale == 1.0
