"""The real SmolLM2-135M-Instruct target: loading, chat template, and PLD == plain decoding in float32."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from core.decoding import generate
from core.drafters.base import Autoregressive
from core.drafters.pld import PromptLookupDrafter
from core.target import load_target

pytestmark = pytest.mark.real

PROMPTS = [
    "Repeat this sentence twice: the cat sat on the mat near the door.",
    "Summarize in one sentence: Python lists are mutable sequences. Lists can grow and shrink. "
    "Python lists are used everywhere.",
    "Write a Python function that returns the square of a number.",
]


@pytest.fixture(scope="module")
def target32():
    return load_target(dtype="float32")


def test_facts_of_the_default_target(target32):
    t = target32
    assert (t.n_layers, t.hidden_size, t.vocab_size, t.n_heads, t.kv_heads, t.head_dim) == (30, 576, 49152, 9, 3, 64)
    ids = t.chat_ids("Hello")
    assert t.tokenizer.decode(ids).startswith("<|im_start|>")
    assert 2 in t.eos_token_ids  # <|im_end|>
    with pytest.raises(ValueError, match="empty"):
        t.chat_ids("   ")


def test_pld_equals_plain_greedy_in_float32(target32):
    for prompt in PROMPTS:
        ids = target32.chat_ids(prompt)
        plain = generate(target32, Autoregressive(), ids, 40)
        pld = generate(target32, PromptLookupDrafter(), ids, 40)
        assert pld.token_ids == plain.token_ids
        assert pld.steps <= plain.steps
    assert pld.text.strip()


def test_tree_pass_on_the_real_target_matches_hf(target32):
    ids = torch.tensor(target32.chat_ids("Name three colours."))
    cache = target32.new_cache(128)
    out = target32.forward(ids, cache=cache)
    ref = target32.hf_model(ids[None]).logits.float()
    torch.testing.assert_close(out.logits, ref, atol=2e-4, rtol=1e-4)


def test_cli_json_reports_the_fields():
    cmd = [sys.executable, "-m", "core.generate", "--method", "pld", "--dtype", "float32", "--json",
           "--max-new-tokens", "16", "--prompt", PROMPTS[0]]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    for key in ("text", "token_ids", "new_tokens", "steps", "mean_accepted", "wall_time", "tokens_per_s"):
        assert key in out
    assert out["new_tokens"] == len(out["token_ids"]) <= 16
    bad = subprocess.run([sys.executable, "-m", "core.generate", "--method", "nope", "--prompt", "hi"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "unknown method" in bad.stderr


def test_fingerprint_is_dtype_independent_and_shipped_drafters_load(target32):
    from core.methods import DRAFTER_DIR, build_drafter

    bf16 = load_target(dtype="bfloat16")
    assert bf16.fingerprint == target32.fingerprint
    if not (DRAFTER_DIR / "moa").exists():
        pytest.skip("no shipped MoA drafter")
    ids = target32.chat_ids(PROMPTS[2])
    plain = generate(target32, Autoregressive(), ids, 24)
    for method in ("moa", "medusa"):  # trained against the bfloat16 target, run here in float32
        spec = generate(target32, build_drafter(method, target32), ids, 24)
        assert spec.token_ids == plain.token_ids
