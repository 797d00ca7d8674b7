"""The trainer (core.training.train) on a tiny random target and synthetic records.

A minimal TrainedDrafter defined here keeps these tests independent of the real drafters;
a parametrised smoke test also runs every real drafter whose module imports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.drafters.base import TargetNeeds
from core.drafters.checkpoint import DrafterConfig, TrainBatch, TrainedDrafter
from core.target import tiny_target
from core.training import data as D
from core.training import publish as P
from core.training import resume as R
from core.training import specs as S
from core.training import train as T
from core.training import trainer as TR
from core.training.curves import read_log


@dataclass
class ToyConfig(DrafterConfig):
    noise: float = 0.05


class ToyDrafter(TrainedDrafter):
    """Predicts token t+2 from the target's feature at t through one linear map + the LM head.

    Feature noise from the global RNG makes resuming depend on the RNG state being restored.
    """

    name = "toy"
    config_class = ToyConfig

    def __init__(self, config: ToyConfig, target) -> None:
        super().__init__(config, target)
        self.proj = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.needs = TargetNeeds(hidden_layers=(config.n_target_layers,))

    def training_loss(self, batch: TrainBatch, progress: float):
        feat = batch.hidden[self.config.n_target_layers][:, :-2].to(self.proj.weight.dtype)
        if self.training:
            feat = feat + self.config.noise * torch.randn_like(feat)
        logits = self.target.logits(self.proj(feat).to(self.target.dtype))
        sel = batch.loss_mask[:, 2:] & batch.attention_mask[:, 2:]
        y = batch.input_ids[:, 2:][sel]
        loss = F.cross_entropy(logits[sel], y)
        acc = (logits[sel].argmax(-1) == y).float().mean()
        return loss, {"acc@1": float(acc), "acc@2": float(acc) / 2}


def records(n_train: int = 12, n_heldout: int = 3, seed: int = 0, vocab: int = 64) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_train + n_heldout):
        p, a = int(rng.integers(3, 9)), int(rng.integers(6, 20))
        out.append({"prompt_id": f"p{i}", "category": "synthetic",
                    "prompt_ids": rng.integers(2, vocab, p).tolist(), "answer_ids": rng.integers(2, vocab, a).tolist(),
                    "temperature": 0.0, "finished": True, "split": "heldout" if i >= n_train else "train"})
    return out


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def cfg(tmp_path: Path, name: str = "run", **kw) -> TR.TrainConfig:
    base = dict(drafters=["toy"], out=str(tmp_path / name), steps=6, batch_tokens=96, max_len=32, lr=3e-3,
                warmup=2, eval_every=3, eval_tokens=200, final_eval_tokens=200, log_every=1, progress_bar=False)
    base.update(kw)
    return TR.TrainConfig(**base)


def toy(name: str = "toy", **hyper) -> S.DrafterSpec:
    return S.DrafterSpec(name, ToyDrafter, hyper)


def run(target, config: TR.TrainConfig, specs=None, recs=None) -> TR.Trainer:
    trainer = TR.Trainer(config, target, recs if recs is not None else records(), specs or [toy()])
    trainer.run()
    return trainer


def test_packing_is_deterministic_and_within_budget():
    lengths = np.array([5, 30, 12, 7, 19, 25, 3, 30, 8, 14])
    a = D.epoch_batches(lengths, seed=1, epoch=0, batch_tokens=40)
    assert a == D.epoch_batches(lengths, seed=1, epoch=0, batch_tokens=40)
    assert a != D.epoch_batches(lengths, seed=1, epoch=1, batch_tokens=40)
    assert sorted(i for b in a for i in b) == list(range(len(lengths)))
    for b in a:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 40


def test_sequences_cut_keeps_half_the_window_for_the_answer():
    recs = [{"prompt_ids": list(range(100, 130)), "answer_ids": list(range(200, 240)), "split": "train"},
            {"prompt_ids": [1, 2, 3], "answer_ids": list(range(50)), "split": "train"},
            {"prompt_ids": [1, 2], "answer_ids": [], "split": "train"}]
    seqs = D.make_sequences(recs, max_len=32)
    assert len(seqs) == 2 and seqs.cut_prompts == 1
    assert seqs.ids[0].tolist() == list(range(114, 130)) + list(range(200, 216)) and seqs.answer_start[0] == 16
    assert seqs.ids[1].tolist() == [1, 2, 3] + list(range(29)) and seqs.answer_start[1] == 3
    ids, loss, attn = D.collate(seqs, [0, 1], torch.device("cpu"))
    assert ids.shape == (2, 32) and int(loss[0].sum()) == 16 and bool(attn.all())


def test_data_sources_repeat_training_records_only(monkeypatch):
    assert D.data_sources("a.npz") == [("a.npz", 1)]
    assert D.data_sources("a.npz, b.npz*3") == [("a.npz", 1), ("b.npz", 3)]
    for bad in ("a.npz,", "a.npz*x", "a.npz*0"):
        with pytest.raises(ValueError, match="--data"):
            D.data_sources(bad)
    old, new = records(4, 1, seed=1), records(3, 2, seed=2)
    from core.training import distill_data
    monkeypatch.setattr(distill_data, "load_distill", lambda path: {"old": old, "new": new}[path])
    got = D.load_records("old,new*3")
    heldout = [r for r in got if r["split"] == "heldout"]
    assert len(got) == 5 + 5 + 2 * 3 and heldout == old[4:] + new[3:]
    assert [r for r in got if r["split"] == "train"] == old[:4] + new[:3] * 3


def test_lr_schedule():
    f = [R.lr_factor(s, 10, 100, 0.1) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and all(a >= b for a, b in zip(f[10:], f[11:]))
    assert R.lr_factor(100, 10, 100, 0.1) == pytest.approx(0.1)


def test_loss_decreases_on_repeated_batch(tmp_path, target):
    recs = records(n_train=3, n_heldout=1)  # three short sequences: one batch, seen every step
    trainer = run(target, cfg(tmp_path, steps=25, lr=2e-2, warmup=0, batch_tokens=512, eval_every=0), recs=recs)
    rows = [r for r in read_log(trainer.out / "log.jsonl") if r["split"] == "train"]
    assert len(rows) == 25 and len({r["batch_rows"] for r in rows}) == 1
    assert rows[-1]["loss"] < 0.8 * rows[0]["loss"]
    assert rows[0]["tok_s"] > 0 and "sec_target" in rows[0] and "peak_mem_gb" in rows[0]


def test_outputs_log_curves_export(tmp_path, target):
    trainer = run(target, cfg(tmp_path))
    out = trainer.out
    rows = read_log(out / "log.jsonl")
    held = [r for r in rows if r["split"] == "heldout"]
    assert [r["step"] for r in held] == [0, 3, 6] and held[-1]["final"]
    assert {"loss", "acc@1", "acc@2"} <= set(held[-1])
    html = (out / "curves.html").read_text()
    assert "plotly" in html and "acc@2" in html
    meta = json.loads((out / "final" / "config.json").read_text())
    tr = meta["training"]
    assert tr["complete"] and tr["steps"] == 6 and tr["tokens"] > 0 and tr["heldout"]["acc@1"] >= 0
    loaded = ToyDrafter.from_pretrained(out / "final", target)
    for k, v in trainer.members[0].model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k].float(), v.to(torch.bfloat16).float())
    assert not (out / "final.tmp").exists() and (out / TR.STATE_FILE).exists()


def test_resume_gives_identical_weights(tmp_path, target):
    straight = run(target, cfg(tmp_path, "a", ckpt_every_min=0.0))  # checkpoints every step: no effect
    first = run(target, cfg(tmp_path, "b", stop_at_step=4))
    assert first.step == 4
    state = torch.load(Path(first.out) / TR.STATE_FILE, weights_only=False)
    assert state["step"] == 4 and not json.loads((first.out / "final" / "config.json").read_text())["training"][
        "complete"]
    resumed = run(target, cfg(tmp_path, "b"))
    assert resumed.step == 6
    a, b = straight.members[0].model.state_dict(), resumed.members[0].model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    opt_a, opt_b = straight.members[0].optimizer.state_dict(), resumed.members[0].optimizer.state_dict()
    for pid in opt_a["state"]:
        assert torch.equal(opt_a["state"][pid]["exp_avg"], opt_b["state"][pid]["exp_avg"])
    steps_a = [(r["split"], r["step"]) for r in read_log(straight.out / "log.jsonl")]
    steps_b = [(r["split"], r["step"]) for r in read_log(resumed.out / "log.jsonl")]
    assert steps_a == steps_b  # the resumed log has no duplicated or missing lines
    held_a = [r for r in read_log(straight.out / "log.jsonl") if r["split"] == "heldout"]
    held_b = [r for r in read_log(resumed.out / "log.jsonl") if r["split"] == "heldout"]
    assert [r["loss"] for r in held_a] == [r["loss"] for r in held_b]


class FlakyDrafter(ToyDrafter):
    """Returns a NaN loss at its third call: that update must be skipped, not applied."""

    calls = 0

    def training_loss(self, batch, progress):
        loss, metrics = super().training_loss(batch, progress)
        FlakyDrafter.calls += 1
        return (loss * float("nan") if FlakyDrafter.calls == 3 else loss), metrics


def test_non_finite_loss_skips_the_update(tmp_path, target):
    FlakyDrafter.calls = 0
    trainer = run(target, cfg(tmp_path, steps=4, eval_every=0), specs=[S.DrafterSpec("toy", FlakyDrafter)])
    rows = [r for r in read_log(trainer.out / "log.jsonl") if r["split"] == "train"]
    assert [r.get("skipped", 0) for r in rows] == [0, 0, 1, 0]
    assert all(torch.isfinite(p).all() for p in trainer.members[0].model.parameters())


def test_resume_refuses_other_arguments(tmp_path, target):
    run(target, cfg(tmp_path, steps=4, stop_at_step=2))
    with pytest.raises(ValueError, match="different arguments.*lr"):
        run(target, cfg(tmp_path, steps=4, lr=1e-2))
    fresh = run(target, cfg(tmp_path, steps=4, lr=1e-2, restart=True, eval_every=0))  # --restart: new logs too
    assert [r["step"] for r in read_log(fresh.out / "log.jsonl") if r["split"] == "train"] == [1, 2, 3, 4]


def test_joint_training_shares_the_target_pass(tmp_path, target, monkeypatch):
    calls = []
    real = target.forward

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(target, "forward", counting)
    trainer = run(target, cfg(tmp_path, steps=4, eval_every=0), specs=[toy("toy-a"), toy("toy-b", noise=0.2)])
    assert len(calls) == 4 + len(trainer.final_eval_batches)  # one target pass per batch, shared
    for name in ("toy-a", "toy-b"):
        folder = trainer.out / name
        assert (folder / "final" / "config.json").exists() and (folder / "curves.html").exists()
        assert [r["step"] for r in read_log(folder / "log.jsonl") if r["split"] == "train"] == [1, 2, 3, 4]
    a, b = (m.model.proj.weight for m in trainer.members)
    assert not torch.equal(a, b)
    assert json.loads((trainer.out / "toy-a" / "final" / "config.json").read_text())["training"]["joint_with"] == [
        "toy-b"]


def test_publish_copies_checkpoint_and_card(tmp_path, target):
    dest = tmp_path / "assets" / "toy"
    run(target, cfg(tmp_path, steps=3, publish=str(dest)))
    assert sorted(f.name for f in dest.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    run_folder = tmp_path / "run"
    assert (run_folder / "log.jsonl").exists() and (run_folder / "curves.html").exists()  # logs stay with the run
    card = (dest / "README.md").read_text()
    assert P.TAU_PLACEHOLDER in card and "acc" in card and "steps: 3" in card
    ToyDrafter.from_pretrained(dest, target)


def test_cli_parsing_and_tiny_run(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "load_records", lambda path: records())
    monkeypatch.setattr(T, "resolve_spec", lambda name, hyper=None: S.DrafterSpec(name, ToyDrafter, hyper or {}))
    out = tmp_path / "cli"
    result = T.main(["--drafter", "toy", "--target", "tiny", "--dtype", "float32", "--out", str(out), "--steps", "2",
                     "--batch-tokens", "64", "--max-len", "32", "--lr", "1e-3,toy=2e-3", "--hyper", "noise=0.1",
                     "--eval-every", "0", "--eval-tokens", "100", "--final-eval-tokens", "100", "--no-progress"])
    assert "acc@1" in result["toy"]
    meta = json.loads((out / "final" / "config.json").read_text())
    assert meta["config"]["noise"] == 0.1 and meta["training"]["lr"] == 2e-3
    with pytest.raises(SystemExit, match="curriculum-restart applies only with --init-from"):
        T.main(["--drafter", "toy", "--target", "tiny", "--out", str(tmp_path / "x"), "--curriculum-restart"])
    assert T.build_parser().parse_args(["--drafter", "moa", "--device", "cpu"]).device == "cpu"


def test_steps_auto_fills_the_time_budget_and_completes(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "load_records", lambda path: records())
    monkeypatch.setattr(T, "resolve_spec", lambda name, hyper=None: S.DrafterSpec(name, ToyDrafter, hyper or {}))
    out = tmp_path / "auto"
    args = ["--drafter", "toy", "--target", "tiny", "--dtype", "float32", "--out", str(out), "--steps", "auto",
            "--time-budget-min", "0.05", "--warmup", "30", "--batch-tokens", "64", "--max-len", "32",
            "--eval-every", "50", "--eval-tokens", "100", "--final-eval-tokens", "100", "--no-progress",
            "--publish", str(tmp_path / "pub")]
    T.main(args)
    meta = json.loads((tmp_path / "pub" / "config.json").read_text())["training"]
    assert meta["complete"] and meta["steps"] == meta["planned_steps"] > TR.FIT_AFTER_STEPS + 2
    assert meta["wall_time_s"] < 0.05 * 60 * 1.5
    state = torch.load(out / TR.STATE_FILE, weights_only=False)
    assert state["args"]["steps"] == meta["steps"], "the fitted total is what a resume must agree on"
    with pytest.raises(SystemExit, match="needs --time-budget-min"):
        T.main([a for a in args if a not in ("--time-budget-min", "0.05")])
    with pytest.raises(SystemExit, match="whole number or 'auto'"):
        T.main(["--drafter", "toy", "--steps", "many", "--out", str(tmp_path / "x")])


def test_names_resolve():
    assert T.parse_lr("3e-4,medusa=1e-3") == (3e-4, {"medusa": 1e-3})
    assert T.parse_hyper(["noise=0.1", "b.depth=4"], ["a", "b"]) == {"a": {"noise": 0.1}, "b": {"noise": 0.1,
                                                                                               "depth": 4}}
    with pytest.raises(ValueError):
        S.resolve_spec("nope")


REAL = ["eagle2", "moa", "moa-tli1", "medusa", "amphista"]


def _spec_or_skip(name: str) -> S.DrafterSpec:
    return S.resolve_spec(name)


@pytest.mark.parametrize("name", REAL)
def test_real_drafter_smoke(tmp_path, target, name):
    spec = _spec_or_skip(name)
    trainer = run(target, cfg(tmp_path, steps=2, eval_every=0, lr=1e-3), specs=[spec])
    meta = json.loads((trainer.out / "final" / "config.json").read_text())
    assert meta["method"] == spec.cls.name and meta["training"]["steps"] == 2
    assert any(k.startswith("acc@") for k in meta["training"]["heldout"])
    loaded = spec.cls.from_pretrained(trainer.out / "final", target)
    if name in ("medusa", "amphista"):  # the static tree comes from the measured held-out accuracies
        assert meta["config"]["tree_accuracy"] and loaded.config.tree_paths == meta["config"]["tree_paths"]


def test_init_from_published_continues_the_weights_and_the_record(tmp_path, target):
    published = tmp_path / "assets"
    run(target, cfg(tmp_path, name="first", steps=4, publish=str(published / "toy")))
    first = ToyDrafter.from_pretrained(published / "toy", target)

    # step 0's held-out evaluation of the continued run sees the published weights, not a fresh init
    cont = TR.Trainer(cfg(tmp_path, name="cont", steps=3, init_from=str(published)), target, records(), [toy()])
    for k, v in first.state_dict().items():
        torch.testing.assert_close(cont.members[0].model.state_dict()[k].float(), v.float())
    fresh = TR.Trainer(cfg(tmp_path, name="fresh", steps=3), target, records(), [toy()])
    assert any(not torch.equal(fresh.members[0].model.state_dict()[k].float(), v.float())
               for k, v in first.state_dict().items())
    cont.run()
    tr = json.loads((cont.out / "final" / "config.json").read_text())["training"]
    assert tr["steps"] == 3 and tr["init_from"]["steps"] == 4 and tr["init_from"]["training"]["steps"] == 4
    assert P.cumulative_training(tr)["steps"] == 7
    (published / "toy" / "log-run1.jsonl").write_text("{}\n")  # what publishing used to leave in the folder
    (published / "toy" / "curves.html").write_text("<html></html>")
    P.publish(cont.out, published / "toy", "toy")
    assert sorted(f.name for f in (published / "toy").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    card = (published / "toy" / "README.md").read_text()
    assert "continued from" in card and "in all: 7 steps" in card and "log-run1.jsonl" not in card


def test_a_continued_run_may_deepen_medusa_heads_without_changing_what_they_compute(tmp_path, target):
    """Medusa's and Amphista's heads may be deepened when training continues (checked on Medusa here; the
    Amphista case is in test_amphista_heads_deepen_without_changing_the_draft)."""
    from dataclasses import replace

    spec = _spec_or_skip("medusa")
    published = tmp_path / "assets"
    run(target, cfg(tmp_path, name="first", steps=2, eval_every=0, lr=1e-3, publish=str(published / "medusa")),
        specs=[spec])
    first = spec.cls.from_pretrained(published / "medusa", target)
    deeper = replace(spec, hyper={**spec.hyper, "num_layers_per_head": 3})
    cont = TR.Trainer(cfg(tmp_path, name="cont", steps=2, eval_every=0, init_from=str(published)), target,
                     records(), [deeper])
    grown = cont.members[0].model
    assert grown.config.num_layers_per_head == 3 and all(len(blocks) == 3 for blocks in grown.heads)
    assert cont.members[0].init_record["grown"] == {"num_layers_per_head": [1, 3]}
    feature = torch.randn(5, target.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(grown.float().head_states(feature.float()), first.float().head_states(feature))
    cont.run()
    assert spec.cls.from_pretrained(cont.out / "final", target).config.num_layers_per_head == 3
    P.publish(cont.out, published / "medusa", "medusa")
    assert "grown at the start of this run: `num_layers_per_head` 1 -> 3" in (
        published / "medusa" / "README.md").read_text()
    with pytest.raises(ValueError, match="num_layers_per_head"):  # heads never shrink
        TR.Trainer(cfg(tmp_path, name="c2", init_from=str(published)), target, records(),
                  [replace(spec, hyper={**spec.hyper, "num_layers_per_head": 2})])


def test_amphista_heads_deepen_without_changing_the_draft(target):
    spec = _spec_or_skip("amphista")
    model = spec.cls.random(target, seed=3).float()
    s1, s2 = torch.randn(4, target.hidden_size), torch.randn(4, target.hidden_size)
    with torch.no_grad():
        before = model.auto_embed(model.head_states(s1, s2))
        model.grow(num_layers_per_head=2)
        after = model.auto_embed(model.head_states(s1, s2))
    assert model.config.num_layers_per_head == 2 and all(len(blocks) == 2 for blocks in model.heads)
    torch.testing.assert_close(after, before)
    with pytest.raises(ValueError, match="deepen"):
        model.grow(num_layers_per_head=1)


def test_progress_counts_the_runs_a_continued_run_continues(tmp_path, target):
    """Curricula (MoA's staircase mask) see the drafter's whole training: a continued run starts late."""
    published = tmp_path / "assets"
    run(target, cfg(tmp_path, name="first", steps=4, publish=str(published / "toy")))
    fresh = TR.Trainer(cfg(tmp_path, name="fresh", steps=6), target, records(), [toy()])
    assert fresh._progress(fresh.members[0]) == 0.0
    cont = TR.Trainer(cfg(tmp_path, name="cont", steps=6, init_from=str(published)), target, records(), [toy()])
    assert cont._progress(cont.members[0]) == pytest.approx(4 / 10)
    cont.step = 3
    assert cont._progress(cont.members[0]) == pytest.approx(7 / 10)
    fitting = TR.Trainer(cfg(tmp_path, name="auto", steps=TR.AUTO_PLACEHOLDER_STEPS, fit_steps=True, time_budget_min=5,
                            init_from=str(published)), target, records(), [toy()])
    assert fitting._progress(fitting.members[0]) == pytest.approx(4 / (4 + TR.FIT_AFTER_STEPS))  # before the fit
    fresh_auto = TR.Trainer(cfg(tmp_path, name="auto2", steps=TR.AUTO_PLACEHOLDER_STEPS, fit_steps=True,
                               time_budget_min=5), target, records(), [toy()])
    assert fresh_auto._progress(fresh_auto.members[0]) == 0.0
    restarted = TR.Trainer(cfg(tmp_path, name="restart", steps=6, init_from=str(published), curriculum_restart=True),
                           target, records(), [toy()])
    restarted.step = 3  # --curriculum-restart: the continued run's own steps only, as a fresh run counts them
    assert restarted._progress(restarted.members[0]) == pytest.approx(3 / 6)
    assert restarted.cfg.result_args()["curriculum_restart"] is True
    assert "curriculum_restart" not in cont.cfg.result_args()  # earlier runs still resume


def test_init_from_refuses_other_hyper_parameters_or_a_missing_drafter(tmp_path, target):
    published = tmp_path / "assets"
    run(target, cfg(tmp_path, name="first", steps=2, eval_every=0, publish=str(published / "toy")))
    with pytest.raises(ValueError, match="noise"):
        TR.Trainer(cfg(tmp_path, name="c", init_from=str(published)), target, records(), [toy(noise=0.3)])
    with pytest.raises(FileNotFoundError, match="other"):
        TR.Trainer(cfg(tmp_path, name="c", init_from=str(published)), target, records(), [toy("other")])


def test_card_points_at_the_committed_recipe_only_for_uncommitted_data():
    assets = P.COMMITTED_RECIPE.parents[1]
    assert not P._names_other_recipe(str(P.COMMITTED_RECIPE))
    assert not P._names_other_recipe(str(assets / "distill_v5" / "recipe.json"))  # committed itself
    assert P._names_other_recipe(str(assets.parent / "data" / "distill" / "recipe.json"))


def test_new_parts_of_a_continued_drafter_can_train_at_their_own_rate(tmp_path, target):
    """--new-param-lr-mult: the parts a continued drafter builds afresh (MoA's final_feature projection) get their
    own AdamW group at lr x the multiplier; every published weight stays in the base group."""
    from core.drafters.moa import MoADrafter

    published = tmp_path / "assets"
    MoADrafter.random(target, seed=0, lsa_heads=2).save_pretrained(published / "moa")
    spec = S.resolve_spec("moa", {"lsa_heads": 2, "final_feature": True})
    cont = TR.Trainer(cfg(tmp_path, name="cont", drafters=["moa"], steps=2, eval_every=0, init_from=str(published),
                          new_param_lr_mult=10.0), target, records(), [spec])
    model, opt = cont.members[0].model, cont.members[0].optimizer
    names = {id(p): n for n, p in model.named_parameters()}
    base, new = opt.param_groups
    assert sorted(names[id(p)] for p in new["params"]) == ["lsa.feat.weight", "lsa.feat_norm.bias",
                                                          "lsa.feat_norm.weight"]
    assert not any(names[id(p)].startswith("lsa.feat") for p in base["params"])
    assert new["lr"] == pytest.approx(10 * base["lr"])
    cont.run()
    assert json.loads((cont.out / "final" / "config.json").read_text())["config"]["final_feature"] is True
    plain = TR.Trainer(cfg(tmp_path, name="plain", drafters=["moa"], steps=2, init_from=str(published)), target,
                       records(), [spec])
    assert len(plain.members[0].optimizer.param_groups) == 1  # multiplier 1: one group, as before
    with pytest.raises(ValueError, match="new-param-lr-mult"):
        T.config_from_args(T.build_parser().parse_args(["--drafter", "moa", "--new-param-lr-mult", "0"]))


def test_chosen_parts_can_train_at_their_own_rate(tmp_path, target):
    """--param-lr-mult PREFIX=X: parameters under PREFIX get their own AdamW group at lr x X (the longest prefix
    wins over a shorter one and over --new-param-lr-mult); a prefix no parameter has, or a bad item, is refused."""
    from core.drafters.moa import MoADrafter

    published = tmp_path / "assets"
    MoADrafter.random(target, seed=0, lsa_heads=2).save_pretrained(published / "moa")
    spec = S.resolve_spec("moa", {"lsa_heads": 2, "final_feature": True})
    run = TR.Trainer(cfg(tmp_path, name="mult", drafters=["moa"], steps=2, eval_every=0, init_from=str(published),
                         new_param_lr_mult=4.0, param_lr_mult={"ca.": 3.0, "ca.o_proj": 10.0}),
                     target, records(), [spec])
    model, opt = run.members[0].model, run.members[0].optimizer
    names = {id(p): n for n, p in model.named_parameters()}
    base_lr = opt.param_groups[0]["lr"]
    by_ratio = {round(g["lr"] / base_lr, 6): sorted(names[id(p)] for p in g["params"]) for g in opt.param_groups}
    assert by_ratio[10.0] == ["ca.o_proj.weight"]
    assert by_ratio[3.0] == ["ca.k_proj.weight", "ca.q_proj.weight", "ca.v_proj.weight"]
    assert by_ratio[4.0] == ["lsa.feat.weight", "lsa.feat_norm.bias", "lsa.feat_norm.weight"]
    assert not any(n.startswith(("ca.", "lsa.feat")) for n in by_ratio[1.0])
    run.run()
    assert (run.out / "final" / "config.json").is_file()
    assert run.cfg.result_args()["param_lr_mult"] == {"ca.": 3.0, "ca.o_proj": 10.0}  # a resumed run must agree
    assert "param_lr_mult" not in TR.TrainConfig(drafters=["moa"], out="x", data="y").result_args()
    with pytest.raises(ValueError, match="ca.nothing"):
        TR.Trainer(cfg(tmp_path, name="bad", drafters=["moa"], steps=2, param_lr_mult={"ca.nothing": 2.0}),
                   target, records(), [spec])
    for item in ("ca.o_proj", "ca.o_proj=0", "=3", "ca.o_proj=x"):
        with pytest.raises(ValueError, match="param-lr-mult"):
            T.config_from_args(T.build_parser().parse_args(["--drafter", "moa", "--param-lr-mult", item]))
    args = T.build_parser().parse_args(["--drafter", "moa", "--param-lr-mult", "ca.o_proj=10"])
    assert T.config_from_args(args).param_lr_mult == {"ca.o_proj": 10.0}


def test_a_continued_drafter_names_its_commit_only_when_the_folder_is_committed(tmp_path, monkeypatch):
    """init_from's provenance: the last commit of a clean drafter folder; None once the folder has uncommitted
    changes, whether the folder is given absolute or relative to the working directory."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    folder = tmp_path / "assets" / "drafters" / "moa"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "weights")
    head = git("rev-parse", "HEAD").strip()
    monkeypatch.chdir(tmp_path)
    for given in (folder, Path("assets/drafters/moa")):
        assert P._last_commit(given) == head
    (folder / "config.json").write_text('{"changed": true}')
    for given in (folder, Path("assets/drafters/moa")):
        assert P._last_commit(given) is None


def test_make_train_for_your_own_target_makes_its_data_first():
    """`make train TARGET=<folder>`: the target answers the training prompts, then the drafter trains for it."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(["make", "-n", "train", "TARGET=/models/my-llama", "DRAFTER=eagle2", "TIME=30"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if "core.training.train" in ln)
    gen, train = line.split("&&")
    assert "core.training.datagen --target /models/my-llama --out data/distill-my-llama" in gen
    assert "--target /models/my-llama" in train and "--data 'data/distill-my-llama/dataset'" in train
    assert "--time-budget-min 30" in train
    plain = subprocess.run(["make", "-n", "train", "DRAFTER=eagle2"], cwd=root, capture_output=True, text=True,
                           check=True).stdout
    assert "datagen" not in plain and "--data 'data/distill/dataset'" in plain
