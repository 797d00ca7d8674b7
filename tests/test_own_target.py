"""Bring your own model: a tiny random Llama and a tiny random Qwen2 folder (saved with `save_pretrained`, a
character tokenizer built offline) go through what a user would run on their own target: the target answers
training prompts (core.training.datagen --target), a drafter trains on those answers (core.training.train
--target), and core.generate --target answers with ar, pld and that drafter, float32 output equal to plain
greedy decoding."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CHARS = "abcdefghijklmnopqrstuvwxyz .,!?'"
PROMPTS = ["what is the capital of france?", "tell me a story."]


def save_target(folder: Path, family: str, seed: int = 1) -> Path:
    """A tiny random `family` ("llama" or "qwen2") causal LM and its character tokenizer, saved to `folder`.
    Untied embeddings: a tied random model only repeats its last input token, which no test can learn from."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {"<unk>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>").save_pretrained(folder)
    torch.manual_seed(seed)
    shape = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, eos_token_id=1,
                 bos_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(LlamaConfig(**shape)) if family == "llama" else Qwen2ForCausalLM(Qwen2Config(**shape))
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # sharper logits: fewer near-ties in greedy decoding
    model.save_pretrained(folder)
    return folder


def run(module: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "SPECLENS_COST_MODEL": "fixed"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def train_for(folder: Path, family: str, drafter: str) -> tuple[Path, Path]:
    """A tiny `family` target in folder/family, its own answers to 32 prompts, and `drafter` trained on them for
    60 steps -> (target folder, drafter checkpoint folder)."""
    target = save_target(folder / family, family)
    data = folder / "data"
    run("core.training.datagen", "--target", str(target), "--out", str(data), "--limit", "32",
        "--max-new-tokens", "32", "--dtype", "float32", "--batch-size", "16", "--shard-size", "16", "--no-progress")
    out = folder / "run"
    run("core.training.train", "--drafter", drafter, "--target", str(target), "--data", str(data / "dataset"),
        "--out", str(out), "--steps", "60", "--batch-tokens", "512", "--max-len", "128", "--lr", "3e-3",
        "--dtype", "float32", "--autocast", "off", "--no-progress", "--eval-every", "1000")
    return target, out / "final"


@pytest.mark.parametrize("family,drafter", [("llama", "eagle2"), ("qwen2", "eagle2"), ("qwen2", "moa")])
def test_a_drafter_trained_for_your_own_target_decodes_losslessly(tmp_path, family, drafter):
    target, trained = train_for(tmp_path, family, drafter)
    card = json.loads((trained / "config.json").read_text())
    assert card["method"] == drafter and card["config"]["target_source"].endswith(family)
    for prompt in PROMPTS:
        base = ["--target", str(target), "--prompt", prompt, "--max-new-tokens", "32", "--dtype", "float32",
                "--device", "cpu", "--json"]
        plain = json.loads(run("core.generate", *base, "--method", "ar"))
        assert len(set(plain["token_ids"])) > 2  # a target that says something, not one token over and over
        for extra in (["--method", "pld"], ["--drafter", str(trained)]):
            spec = json.loads(run("core.generate", *base, *extra))
            assert spec["token_ids"] == plain["token_ids"] and spec["text"] == plain["text"], (extra, prompt)
        assert spec["method"] == drafter


@pytest.mark.browser
def test_the_app_serves_your_own_target_and_drafter(tmp_path):
    """`SPECLENS_TARGET=<dir> SPECLENS_DRAFTER_EAGLE2=<dir> make app`: the header names both, a chat with EAGLE-2
    runs on them, and the Step-by-step player and the Draft failures tab work on that run."""
    import tests.test_browser as tb

    pw = tb._browser_or_skip()
    target, trained = train_for(tmp_path, "qwen2", "eagle2")
    env = {"SPECLENS_TARGET": str(target), "SPECLENS_DRAFTER_EAGLE2": str(trained), "SPECLENS_DTYPE": "float32"}
    with tb.serve_app(tmp_path, **env) as url, pw() as p:
        browser = p.chromium.launch(executable_path=tb.CHROMIUM, headless=True, args=tb.CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=tb.DESKTOP)
            page.goto(url, wait_until="domcontentloaded")
            tb._wait_text(page, "#load-status", "ready", timeout_s=180)
            header = page.locator("body").inner_text()
            assert str(target) in header and f"eagle2 from {trained} (SPECLENS_DRAFTER_EAGLE2)" in header
            page.locator("#method-picker input").click()
            from demo.runtime import METHOD_LABELS

            page.get_by_role("option", name=METHOD_LABELS["eagle2"]).first.click()
            tb._set_number(page, "max-new", 24)
            page.locator("#prompt-box textarea").fill("what is the capital of france?")
            page.locator("#send-btn").click()
            # The stats panel reads "tau" before the click lands too (the empty run's cards): wait for tokens as well,
            # which appear only once the model has loaded and the run streams.
            page.wait_for_function(
                "() => { const s = document.querySelector('#live-stats'); "
                "return s && !s.innerText.includes('generating') && s.innerText.includes('tau') && "
                "document.querySelectorAll('#token-stream span.tok').length >= 2; }", timeout=240_000)
            assert str(trained) in page.locator("#drafter-note").inner_text()

            tb._open_tab(page, "Step by step")
            tb._pick_option(page, "player-source", "Your run", tab="Step by step")
            tb._wait_text(page, "#player-story", "Cycle 1 of")
            page.locator("#player-next").click()
            tb._wait_text(page, "#player-story", "Cycle 2 of")
            page.locator("#player-tree .main-svg").first.wait_for(timeout=30_000)

            tb._open_tab(page, "Draft failures")
            page.locator("#fail-source").get_by_role("radio", name="Last generation").check()
            page.locator("#fail-analyse").click()
            page.wait_for_function("() => { const e = document.querySelector('#fail-summary'); return e && "
                                   "/rejected|No draft was rejected/.test(e.innerText) && "
                                   "!e.innerText.includes('Recorded example'); }", timeout=60_000)
            assert page.locator("text=Traceback").count() == 0
        finally:
            browser.close()
