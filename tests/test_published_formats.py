"""EAGLE-1/2 and Medusa checkpoints in their published layouts (core.drafters.published_formats).

Checkpoints are written here with the key names and shapes the published code saves (random or distilled
weights on the tiny target); each is checked for: greedy float32 output equal to plain decoding, draft logits
equal to a re-implementation of the published forward written from the papers' code, one-line shape errors,
format detection and the override, and `python -m core.generate --drafter DIR` on a tiny target folder.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from core.drafters.eagle2 import Eagle2Drafter
from core.drafters.medusa import MedusaDrafter
from core.drafters.published_formats import (
    NotADrafterError,
    PublishedFormatError,
    detect_format,
    load_drafter,
    load_published,
    resolve,
)
from core.target import Target, tiny_target
from tests.helpers import assert_greedy_lossless, tiny_prompts
from tests.test_eagle2 import prefill, quick_train, self_distill_batch

VOCAB, HIDDEN = 64, 32


@functools.cache
def tiny() -> Target:
    return tiny_target(vocab_size=VOCAB, hidden_size=HIDDEN, n_layers=2, n_heads=4, kv_heads=2)


# ----- writing checkpoints as the published code saves them -------------------------------------------
def eagle_config(target: Target, hidden: int | None = None, bias: bool = True) -> dict:
    """config.json as EAGLE ships it (eagle/train/*_config.json): the base model's config, one layer."""
    cfg = target.config
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": hidden or target.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": target.n_heads, "num_key_value_heads": target.kv_heads,
            "num_hidden_layers": 1, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": 10000.0,
            "max_position_embeddings": 2048, "vocab_size": target.vocab_size, "torch_dtype": "float16",
            "bias": bias}


def random_eagle_state(target: Target, seed: int = 0, hidden: int | None = None, bias: bool = True,
                       scale: float = 0.3) -> dict[str, torch.Tensor]:
    """`Model`'s state dict (eagle/model/cnets1.py): embed_tokens, fc, layers.0 without input_layernorm."""
    g = torch.Generator().manual_seed(seed)
    h = hidden or target.hidden_size
    d = target.head_dim
    q, kv, inter = target.n_heads * d, target.kv_heads * d, target.config.intermediate_size

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale / math.sqrt(shape[-1])

    state = {"embed_tokens.weight": target.embed_tokens.weight.detach().clone()[:, :h] if h == target.hidden_size
             else torch.randn(target.vocab_size, h, generator=g),
             "fc.weight": rnd(h, 2 * h) * 4,
             "layers.0.self_attn.q_proj.weight": rnd(q, h), "layers.0.self_attn.k_proj.weight": rnd(kv, h),
             "layers.0.self_attn.v_proj.weight": rnd(kv, h), "layers.0.self_attn.o_proj.weight": rnd(h, q),
             "layers.0.mlp.gate_proj.weight": rnd(inter, h), "layers.0.mlp.up_proj.weight": rnd(inter, h),
             "layers.0.mlp.down_proj.weight": rnd(h, inter),
             "layers.0.post_attention_layernorm.weight": 1 + 0.1 * torch.randn(h, generator=g),
             # persisted by older transformers; EAGLE's own loader ignores it (strict=False)
             "layers.0.self_attn.rotary_emb.inv_freq": 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)}
    if bias:
        state["fc.bias"] = 0.1 * torch.randn(h, generator=g)
    return state


def eagle_state_from(drafter: Eagle2Drafter) -> dict[str, torch.Tensor]:
    """Our drafter built in the EAGLE layout, saved under EAGLE's key names (the inverse of the converter)."""
    state = {"embed_tokens.weight": drafter.target.embed_tokens.weight.detach().clone()}
    for k, t in drafter.state_dict().items():
        if k.startswith("fc."):
            state[k] = t.detach().clone()
        elif k.startswith("layer."):
            state["layers.0." + k.removeprefix("layer.")] = t.detach().clone()
    return state


def write_eagle(folder: Path, state: dict[str, torch.Tensor], config: dict, safetensors: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if safetensors:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return folder


def random_medusa_state(target: Target, heads: int = 3, layers: int = 1, own_lm_head: bool = True, seed: int = 0,
                        hidden: int | None = None, shared_blocks: bool = False) -> dict[str, torch.Tensor]:
    """`medusa_head`'s state dict (medusa/model/medusa_model.py): `{i}.{j}.linear.*` per block, `{i}.{n}.weight`
    per head's LM head. shared_blocks: a head's blocks are one module repeated, as `[ResBlock(H)] * n` makes them."""
    g = torch.Generator().manual_seed(seed)
    h = hidden or target.hidden_size
    state = {}
    for i in range(heads):
        block = None
        for j in range(layers):
            if block is None or not shared_blocks:
                block = (torch.randn(h, h, generator=g) / math.sqrt(h), 0.1 * torch.randn(h, generator=g))
            state[f"{i}.{j}.linear.weight"], state[f"{i}.{j}.linear.bias"] = block
        if own_lm_head:
            lm = target.lm_head.weight.detach()
            state[f"{i}.{layers}.weight"] = lm + 0.5 * lm.std() * torch.randn(lm.shape, generator=g) \
                if h == target.hidden_size else torch.randn(target.vocab_size, h, generator=g)
    return state


def medusa_state_from(drafter: MedusaDrafter, own_lm_head: bool = True) -> dict[str, torch.Tensor]:
    """A shared-head, normed-input MedusaDrafter saved as Medusa heads: with own_lm_head, each head's LM head is
    a copy of the target's (Medusa-1's own initialisation), which computes the same."""
    state = {k.removeprefix("heads."): t.detach().clone() for k, t in drafter.state_dict().items()
             if k.startswith("heads.")}
    if own_lm_head:
        n = drafter.config.num_layers_per_head
        for i in range(drafter.config.num_heads):
            state[f"{i}.{n}.weight"] = drafter.target.lm_head.weight.detach().clone()
    return state


def write_medusa(folder: Path, state: dict[str, torch.Tensor], heads: int, layers: int,
                 safetensors: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                    "base_model_name_or_path": "tiny-random"}))
    if safetensors:
        from safetensors.torch import save_file

        save_file({k: v.contiguous().clone() for k, v in state.items()}, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(state, folder / "medusa_lm_head.pt")
    return folder


# ----- the published forwards, written from their code (not from ours) ------------------------------------
def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm (cnets1.py:375-389)."""
    return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def base_output(target: Target, hidden: torch.Tensor) -> torch.Tensor:
    """`outputs[0]` of the base model: the last layer's output after the final norm."""
    return rms(hidden, target.norm.weight, target.norm.variance_epsilon)


def eagle_reference_logits(state: dict, config: dict, target: Target, hidden: torch.Tensor,
                           next_tokens: torch.Tensor) -> torch.Tensor:
    """cnets1.Model.forward (fc over [embedding, feature], layer 0 without input_layernorm, causal attention
    with its own RoPE) then `head(out)` with the base LM head, for pairs (hidden[t], next_tokens[t]) at
    positions t = 0..T-1. hidden: [T, H] pre-norm target features. Returns [T, V]."""
    nh = config["num_attention_heads"]
    nkv, d = config.get("num_key_value_heads", nh), config["hidden_size"] // nh
    eps, theta = config.get("rms_norm_eps", 1e-6), config.get("rope_theta", 10000.0)
    t = next_tokens.shape[0]
    x = torch.cat([state["embed_tokens.weight"][next_tokens], base_output(target, hidden)], dim=-1)
    x = F.linear(x, state["fc.weight"], state.get("fc.bias") if config.get("bias", True) else None)

    def heads(w: torch.Tensor, n: int) -> torch.Tensor:
        return F.linear(x, w).view(t, n, d).transpose(0, 1)

    qs = heads(state["layers.0.self_attn.q_proj.weight"], nh)
    ks = heads(state["layers.0.self_attn.k_proj.weight"], nkv)
    vs = heads(state["layers.0.self_attn.v_proj.weight"], nkv)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(t).float(), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(z: torch.Tensor) -> torch.Tensor:
        return torch.cat([-z[..., d // 2:], z[..., : d // 2]], dim=-1)

    qs, ks = qs * cos + rotate_half(qs) * sin, ks * cos + rotate_half(ks) * sin
    ks, vs = ks.repeat_interleave(nh // nkv, 0), vs.repeat_interleave(nh // nkv, 0)
    scores = qs @ ks.transpose(1, 2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    attn = (torch.softmax(scores.float(), dim=-1) @ vs).transpose(0, 1).reshape(t, nh * d)
    x = x + F.linear(attn, state["layers.0.self_attn.o_proj.weight"])
    p = rms(x, state["layers.0.post_attention_layernorm.weight"], eps)
    mlp = F.linear(F.silu(F.linear(p, state["layers.0.mlp.gate_proj.weight"]))
                   * F.linear(p, state["layers.0.mlp.up_proj.weight"]), state["layers.0.mlp.down_proj.weight"])
    return F.linear(x + mlp, target.lm_head.weight)


def medusa_reference_logits(state: dict, target: Target, hidden: torch.Tensor, heads: int, layers: int) -> torch.Tensor:
    """MedusaModel.forward's heads (medusa_model.py:214-218): head i = ResBlock^n then its Linear (or, for
    version-2 heads, the base LM head), on `outputs[0]`. hidden [H] pre-norm -> [K, V]."""
    out = []
    for i in range(heads):
        x = base_output(target, hidden)
        for j in range(layers):
            x = x + F.silu(F.linear(x, state[f"{i}.{j}.linear.weight"], state[f"{i}.{j}.linear.bias"]))
        out.append(F.linear(x, state.get(f"{i}.{layers}.weight", target.lm_head.weight)))
    return torch.stack(out)


def target_hidden(target: Target, ids: list[int]) -> torch.Tensor:
    return target.forward(torch.tensor(ids), hidden_layers=(target.n_layers,)).hidden[target.n_layers][0]


# ----- EAGLE ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias,safetensors", [(True, False), (False, False), (True, True)])
def test_eagle_logits_equal_the_published_forward(tmp_path, bias, safetensors):
    target = tiny()
    state, config = random_eagle_state(target, seed=1, bias=bias), eagle_config(target, bias=bias)
    folder = write_eagle(tmp_path / "eagle", state, config, safetensors)
    assert detect_format(folder) == "eagle"
    d = load_published(folder, target)
    assert isinstance(d, Eagle2Drafter) and d.published["format"] == "eagle"
    assert d.config.normed_features and not d.config.input_layernorm and d.config.fc_bias == bias
    assert d.config.feature_scale == 1.0 and d.vocab.full
    prompt = tiny_prompts(VOCAB, n=1, length=10, seed=4)[0]
    hidden = target_hidden(target, prompt)
    ids = torch.tensor(prompt)
    want = eagle_reference_logits(state, config, target, hidden[:-1], ids[1:])
    with torch.no_grad():  # training's teacher-forced pass
        out = d.teacher_forced(d.input_features(hidden[None, :-1]), ids[None, 1:])[0]
        got = d.vocab.logits(out)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # drafting: the prefill's pairs end with the bonus token; the root distribution is the last pair's
    pre = prefill(target, prompt, d.needs)
    d.begin(target, pre)
    root = eagle_reference_logits(state, config, target, hidden, torch.tensor(prompt[1:] + [pre.bonus]))[-1]
    torch.testing.assert_close(d._logprobs(d._root_feat[None])[0], torch.log_softmax(root, -1), atol=1e-4, rtol=1e-4)


@functools.cache
def distilled_eagle() -> dict[str, torch.Tensor]:
    """An EAGLE-layout drafter overfitted on the tiny target's own answers, as EAGLE's state dict."""
    target = tiny()
    d = Eagle2Drafter.random(target, seed=0, normed_features=True, input_layernorm=False, draft_vocab_size=0)
    quick_train(d, self_distill_batch(target, d.train_needs, tiny_prompts(VOCAB, n=3, length=8, seed=1)))
    return eagle_state_from(d)


def test_eagle_decodes_losslessly(tmp_path):
    target = tiny()
    random_dir = write_eagle(tmp_path / "random", random_eagle_state(target, seed=2), eagle_config(target))
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=0)
    assert_greedy_lossless(target, lambda: load_published(random_dir, target), prompts, 24, stop_tokens=set())
    trained_dir = write_eagle(tmp_path / "trained", distilled_eagle(), eagle_config(target))
    trained = load_drafter(str(trained_dir), target, Eagle2Drafter)
    taus = assert_greedy_lossless(target, lambda: trained, tiny_prompts(VOCAB, n=3, length=8, seed=1), 32,
                                  stop_tokens=set())
    assert min(taus) > 1.5, f"the distilled EAGLE drafter should get drafts accepted through the conversion ({taus})"


def test_eagle_shape_mismatch_is_one_line_naming_both_shapes(tmp_path):
    target = tiny()
    folder = write_eagle(tmp_path / "e64", random_eagle_state(target, hidden=64), eagle_config(target, hidden=64))
    with pytest.raises(PublishedFormatError) as err:
        load_published(folder, target)
    msg = str(err.value)
    assert "\n" not in msg and str(folder) in msg
    assert "fc.weight is [64, 128]" in msg and "needs [32, 64]" in msg


def test_eagle_other_mismatches(tmp_path):
    target = tiny()
    state = random_eagle_state(target)
    cases = [({**eagle_config(target), "num_attention_heads": 8, "num_key_value_heads": 4}, state,
              ["num_attention_heads is 8", "target's is 4"]),
             ({**eagle_config(target), "rope_theta": 500000.0}, state, ["RoPE", "500000"]),
             (eagle_config(target, bias=True), {k: v for k, v in state.items() if k != "fc.bias"}, ["no fc.bias"]),
             (eagle_config(target), {**state, "layers.1.mlp.up_proj.weight": state["layers.0.mlp.up_proj.weight"]},
              ["decoder layers 1"]),
             (eagle_config(target), {**state, "midlayer.hidden_norm.weight": torch.ones(HIDDEN)}, ["EAGLE-3"])]
    for i, (config, st, needles) in enumerate(cases):
        folder = write_eagle(tmp_path / f"c{i}", st, config)
        with pytest.raises(ValueError) as err:
            load_published(folder, target, "eagle")
        assert "\n" not in str(err.value) and all(n in str(err.value) for n in needles), str(err.value)


# ----- Medusa -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("own_lm_head,layers,safetensors,shared_blocks", [
    (True, 1, False, False), (True, 2, False, True), (False, 2, True, False)])
def test_medusa_logits_equal_the_published_forward(tmp_path, own_lm_head, layers, safetensors, shared_blocks):
    target = tiny()
    state = random_medusa_state(target, heads=3, layers=layers, own_lm_head=own_lm_head, seed=3,
                                shared_blocks=shared_blocks)
    folder = write_medusa(tmp_path / "medusa", state, 3, layers, safetensors)
    assert detect_format(folder) == "medusa"
    d = load_published(folder, target)
    assert isinstance(d, MedusaDrafter) and d.config.normed_input and d.config.own_lm_heads == own_lm_head
    assert (d.config.num_heads, d.config.num_layers_per_head) == (3, layers)
    hidden = target_hidden(target, tiny_prompts(VOCAB, n=1, length=9, seed=5)[0])
    want = medusa_reference_logits(state, target, hidden[-1], 3, layers)
    with torch.no_grad():
        torch.testing.assert_close(d.head_logits(hidden[-1]), want, atol=1e-4, rtol=1e-4)
    # drafting (the batched heads): each head's top candidates and their probabilities
    pre = prefill(target, tiny_prompts(VOCAB, n=1, length=9, seed=5)[0], d.needs)
    d.begin(target, pre)
    tree = d.draft(pre.bonus)
    probs = torch.softmax(want, -1)
    top = tree.extras["draft_top"][0]  # the root row: head 0's candidates
    assert [t for t, _ in top] == probs[0].topk(len(top)).indices.tolist()
    assert [p for _, p in top] == pytest.approx(probs[0].topk(len(top)).values.tolist(), abs=1e-4)


@functools.cache
def distilled_medusa() -> dict[str, torch.Tensor]:
    """A normed-input, shared-head MedusaDrafter overfitted on the tiny target's answers, as Medusa-1 heads."""
    target = tiny()
    d = MedusaDrafter.random(target, seed=0, num_heads=3, normed_input=True, draft_vocab_size=0)
    quick_train(d, self_distill_batch(target, d.needs, tiny_prompts(VOCAB, n=3, length=8, seed=1)), steps=60,
                lr=1e-2)
    return medusa_state_from(d)


def test_medusa_decodes_losslessly(tmp_path):
    target = tiny()
    prompts = tiny_prompts(VOCAB, n=2, length=8, seed=0)
    for name, own in (("m1", True), ("m2", False)):
        folder = write_medusa(tmp_path / name, random_medusa_state(target, own_lm_head=own, seed=6), 3, 1)
        assert_greedy_lossless(target, lambda f=folder: load_published(f, target), prompts, 24, stop_tokens=set())
    folder = write_medusa(tmp_path / "trained", distilled_medusa(), 3, 1)
    trained = load_drafter(str(folder), target, MedusaDrafter)
    taus = assert_greedy_lossless(target, lambda: trained, tiny_prompts(VOCAB, n=3, length=8, seed=1), 32,
                                  stop_tokens=set())
    assert max(taus) > 1.2, f"the distilled Medusa heads should get drafts accepted through the conversion ({taus})"


def test_medusa_mismatches_are_one_line(tmp_path):
    target = tiny()
    cases = [(random_medusa_state(target, hidden=64), ["0.0.linear.weight is [64, 64]", "needs [32, 32]"]),
             ({**random_medusa_state(target), "2.1.weight": torch.zeros(VOCAB + 1, HIDDEN)},
              ["2.1.weight is [65, 32]", "needs [64, 32]"]),
             ({k: v for k, v in random_medusa_state(target).items() if k != "1.0.linear.bias"}, ["no 1.0.linear.bias"]),
             ({"lm_head.weight": torch.zeros(2, 2)}, ["Medusa heads"])]
    for i, (state, needles) in enumerate(cases):
        folder = write_medusa(tmp_path / f"c{i}", state, 3, 1)
        with pytest.raises(PublishedFormatError) as err:
            load_published(folder, target)
        assert "\n" not in str(err.value) and all(n in str(err.value) for n in needles), str(err.value)


def test_converted_medusa_with_own_heads_is_not_trained(tmp_path):
    target = tiny()
    d = load_published(write_medusa(tmp_path / "m", random_medusa_state(target), 3, 1), target)
    batch = self_distill_batch(target, d.needs, tiny_prompts(VOCAB, n=1, length=8, seed=1), n_new=4)
    with pytest.raises(ValueError, match="own per-head LM heads"):
        d.training_loss(batch, 0.0)


# ----- detection, the override, and where --drafter is read -------------------------------------------
def test_detection_and_override(tmp_path):
    target = tiny()
    eagle = write_eagle(tmp_path / "eagle", random_eagle_state(target), eagle_config(target))
    medusa = write_medusa(tmp_path / "medusa", random_medusa_state(target), 3, 1)
    ours = tmp_path / "ours"
    Eagle2Drafter.random(target).save_pretrained(ours)
    assert [detect_format(f) for f in (eagle, medusa, ours)] == ["eagle", "medusa", "speclens"]
    assert resolve(f"eagle:{eagle}") == ("eagle", eagle)
    with pytest.raises(NotADrafterError, match="not a Medusa checkpoint"):
        resolve(f"medusa:{eagle}")
    with pytest.raises(NotADrafterError, match="missing config.json, model.safetensors"):
        detect_format(tmp_path)
    assert isinstance(load_drafter(f"speclens:{ours}", target, Eagle2Drafter), Eagle2Drafter)
    from core.drafters.checkpoint import DrafterMismatchError

    with pytest.raises(DrafterMismatchError, match="'eagle2'"):
        load_drafter(str(eagle), target, MedusaDrafter)


def test_methods_and_cli_checks_route_published_folders(tmp_path):
    from core import cli_checks
    from core.drafters.checkpoint import DrafterMismatchError
    from core.methods import build_drafter, check_method

    target = tiny()
    eagle = write_eagle(tmp_path / "eagle", random_eagle_state(target), eagle_config(target))
    medusa = write_medusa(tmp_path / "medusa", random_medusa_state(target), 3, 1)
    for spec in (str(eagle), f"eagle:{eagle}", str(medusa)):
        assert cli_checks.check_drafter_folder(spec) == spec
    check_method("eagle2", str(eagle))
    check_method("medusa+lookup", str(medusa))
    with pytest.raises(DrafterMismatchError, match="--method eagle2"):
        check_method("moa", str(eagle))
    assert isinstance(build_drafter("eagle2", target, str(eagle)), Eagle2Drafter)
    assert isinstance(build_drafter("medusa+lookup", target, f"medusa:{medusa}").inner, MedusaDrafter)
    with pytest.raises(cli_checks.UsageError, match="EAGLE drafter checkpoint, not a target"):
        cli_checks.check_target(str(eagle))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(cli_checks.UsageError, match=r"not a drafter checkpoint \(missing config.json, model"):
        cli_checks.check_drafter_folder(str(empty))


# ----- core.generate on a tiny target folder ---------------------------------------------------------
def save_tiny_folder(target: Target, folder: Path) -> Path:
    """The tiny target saved as a Hugging Face folder, with a character tokenizer built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = "abcdefghijklmnopqrstuvwxyz .,!?'"
    vocab = {"<unk>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>").save_pretrained(folder)
    target.hf_model.save_pretrained(folder)
    return folder


def test_generate_cli_runs_an_eagle_folder_end_to_end(tmp_path, capsys, monkeypatch):
    from core.generate import main

    monkeypatch.setenv("SPECLENS_COST_MODEL", "fixed")
    target = tiny()
    model = save_tiny_folder(target, tmp_path / "target")
    eagle = write_eagle(tmp_path / "eagle", distilled_eagle(), eagle_config(target))
    base = ["--target", str(model), "--prompt", "hello there", "--max-new-tokens", "16", "--dtype", "float32",
            "--device", "cpu", "--json"]

    def run(*extra: str) -> tuple[int, str, str]:
        rc = main([*base, *extra])
        out = capsys.readouterr()
        return rc, out.out, out.err

    rc, out, err = run("--method", "ar")
    assert rc == 0, err
    plain = json.loads(out)
    rc, out, err = run("--drafter", str(eagle))  # the method comes from the checkpoint: eagle2
    assert rc == 0, err
    spec = json.loads(out)
    assert spec["method"] == "eagle2" and spec["token_ids"] == plain["token_ids"] and spec["text"] == plain["text"]
    rc, out, err = run("--drafter", str(eagle), "--drafter-format", "eagle", "--method", "eagle2+lookup")
    assert rc == 0 and json.loads(out)["token_ids"] == plain["token_ids"], err
    # one line, before decoding, naming both shapes
    bad = write_eagle(tmp_path / "e64", random_eagle_state(target, hidden=64), eagle_config(target, hidden=64))
    rc, out, err = run("--drafter", str(bad))
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("loading target")]
    assert rc == 2 and out == "" and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("error: ") and "[64, 128]" in lines[0] and "[32, 64]" in lines[0]
    rc, out, err = run("--drafter", str(eagle), "--drafter-format", "medusa")
    assert rc == 2 and "not a Medusa checkpoint" in err
    rc, out, err = run("--drafter", str(eagle), "--method", "medusa")
    assert rc == 2 and "--method eagle2" in err and "loading target" not in err  # checked before the model loads


def test_app_takes_a_drafter_folder_per_method(tmp_path, monkeypatch):
    from demo.runtime import Runtime, UserError

    target = tiny()  # the app's tiny target is the same model (tiny_target's defaults)
    eagle = write_eagle(tmp_path / "eagle", distilled_eagle(), eagle_config(target))
    monkeypatch.setenv("SPECLENS_DRAFTER_EAGLE2", str(eagle))
    runtime = Runtime(tiny=True, reference_tokens=0)
    assert "untrained" not in dict((m, label) for label, m in runtime.methods())["eagle2"]
    prompt = tiny_prompts(VOCAB, n=1, length=8, seed=1)[0]
    plain = runtime.generate("ar", prompt, 24)
    for method in ("eagle2", "eagle2+lookup"):
        run = runtime.generate(method, prompt, 24)
        assert run["token_ids"] == plain["token_ids"]
        assert "EAGLE checkpoint, converted" in run["note"] and "SPECLENS_DRAFTER_EAGLE2" in run["note"]
    bad = write_medusa(tmp_path / "m64", random_medusa_state(target, hidden=64), 3, 1)
    monkeypatch.setenv("SPECLENS_DRAFTER_MEDUSA", str(bad))
    with pytest.raises(UserError, match=r"SPECLENS_DRAFTER_MEDUSA=.*\[64, 64\].*\[32, 32\]"):
        runtime.generate("medusa", prompt, 8)


def test_converted_drafters_save_and_load_as_ours(tmp_path):
    """A converted drafter saved in our format keeps its layout flags and computes the same (its weights rounded
    to bfloat16 first, as our checkpoints store them)."""
    target = tiny()
    eagle = load_published(write_eagle(tmp_path / "e", random_eagle_state(target, bias=False),
                                       eagle_config(target, bias=False)), target)
    medusa = load_published(write_medusa(tmp_path / "m", random_medusa_state(target), 3, 1), target)
    hidden = target_hidden(target, tiny_prompts(VOCAB, n=1, length=8, seed=2)[0])
    ids = torch.tensor(tiny_prompts(VOCAB, n=1, length=8, seed=2)[0])
    for d, cls in ((eagle, Eagle2Drafter), (medusa, MedusaDrafter)):
        d.to(torch.bfloat16).float().save_pretrained(tmp_path / f"ours-{d.name}")
        again = cls.from_pretrained(tmp_path / f"ours-{d.name}", target)
        assert again.config == d.config
        with torch.no_grad():
            if cls is Eagle2Drafter:
                assert "layer.input_layernorm.weight" not in again.state_dict() and again.fc.bias is None
                a = d.teacher_forced(d.input_features(hidden[None, :-1]), ids[None, 1:])[0]
                b = again.teacher_forced(again.input_features(hidden[None, :-1]), ids[None, 1:])[0]
            else:
                a, b = d.head_logits(hidden[-1]), again.head_logits(hidden[-1])
        torch.testing.assert_close(a, b)
