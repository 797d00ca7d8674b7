"""Converting published drafters onto ours: EAGLE-1/EAGLE-2 checkpoints and Medusa heads, float32 for float32.

core.drafters.published_formats tells the formats apart and loads a --drafter spec; this module reads the
published files and maps their weights onto Eagle2Drafter / MedusaDrafter so that they compute what the published
code computes. Every tensor's shape is checked against the target before anything is built; a mismatch is one
line naming both shapes.

What was read, and where (the files at the commits named; "file:line"):

EAGLE-1 / EAGLE-2, SafeAILab/EAGLE @ cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b (EAGLE-2 drafts with the
EAGLE-1 drafter model, `Model` in eagle/model/cnets1.py; eagle/model/cnets.py is EAGLE-3):

* Files: `config.json` + `pytorch_model.bin` read with torch.load (eagle/model/ea_model.py:120-129), else
  `model.safetensors` (ea_model.py:131-135); the state dict goes into the drafter with
  `load_state_dict(..., strict=False)` (ea_model.py:76). `"bias"` in config.json sets fc's bias, default true
  (ea_model.py:51-54); every other field is an `EConfig` (eagle/model/configs.py:77-124): rms_norm_eps
  default 1e-6 (configs.py:88), num_key_value_heads default num_attention_heads (configs.py:106-107).
  The published configs have `num_hidden_layers: 1` (eagle/train/vicuna_7B_config.json,
  eagle/train/EAGLE-LLaMA3-Instruct-8B, the latter with `"bias": false`).
* Keys, as `Model`'s state dict names them: `embed_tokens.weight` (cnets1.py:480, loaded from the base model
  and frozen, cnets1.py:481-512, 527-528), `fc.weight` / `fc.bias` (`nn.Linear(2 * hidden, hidden,
  bias=bias)`, cnets1.py:524), `layers.0.self_attn.{q,k,v,o}_proj.weight` (q/k/v biased only when the config
  has `qkv_bias`, o never, cnets1.py:209-217), `layers.0.mlp.{gate,up,down}_proj.weight` (no bias,
  cnets1.py:347-349), `layers.0.post_attention_layernorm.weight` (cnets1.py:401). Layer 0 has *no*
  input_layernorm: it is created and applied only for index != 0 (cnets1.py:399-400, 428-429). Rotary
  buffers are not persistent (cnets1.py:118, 132-133); older saves may hold `...rotary_emb.inv_freq`, ignored.
* Forward: `fc(cat((inputs_embeds, hidden_states), -1))`, embedding first, no activation (cnets1.py:623; the
  activated variant is commented out, cnets1.py:621), then the layer(s). Attention head_dim = hidden /
  num_attention_heads (cnets1.py:199); RoPE from the drafter's config: rope_theta if present, else base
  10000, rope_scaling linear / dynamic (cnets1.py:220-241).
* Features: `outputs[0]` of the base model (ea_model.py:191), i.e. after its final norm
  (eagle/model/modeling_llama_kv.py:1179), and the drafter's output goes straight to the base LM head:
  `head(last_hidden)` (cnets1.py:702, 732). Pairs: the features of tokens 0..n-1 with tokens 1..n
  (`input_ids[:, 1:]`, cnets1.py:686), positions from 0, tree nodes of depth d at n + d - 1
  (cnets1.py:719, 723): what core.drafters.eagle2 does.
* EAGLE-3 checkpoints (`midlayer.*`, `d2t` / `t2d`, an fc over 3 features: cnets.py:530-541) are refused.

Mapping onto Eagle2Drafter: `fc.*` -> `fc.*`, `layers.0.X` -> `layer.X`; config flags `normed_features=True`
(our drafter final-norms the target's features on entry and applies the LM head without the norm),
`input_layernorm=False` (an input_layernorm.weight in the file is ignored, as EAGLE's strict=False load
ignores it), `fc_bias` = config "bias"; `feature_scale` 1.0, the full vocabulary. The embedding is the
target's (EAGLE's is the base model's, frozen); a stored `embed_tokens.weight` that differs from it gets a
warning. Checked against the target, one line each: every tensor's shape, num_attention_heads,
num_key_value_heads, head_dim, hidden_act, rms_norm_eps and RoPE (our layer runs with the target's).
Our tree settings stay ours (EAGLE-2's defaults are for GPUs: depth 7, 60 tokens, top-k 10, ea_model.py:94-96).

Medusa, FasterDecoding/Medusa @ e2a5d20c048a9b0a4092e6933c34313687422518:

* Files: `medusa_lm_head.pt` read with torch.load (medusa/model/medusa_model.py:151-157), or
  `medusa_lm_head.safetensors` as the trainer writes it (medusa/train/train_legacy.py:409, 416-419), beside a
  config.json with `medusa_num_heads` / `medusa_num_layers` (medusa_model.py:20-41; defaults 5 and 1,
  medusa_model.py:33-34). The uploaded configs can give the wrong head count (the loader forces 5:
  medusa_model.py:143), so the number of heads and blocks is read from the keys.
* Heads: `medusa_head = ModuleList(Sequential(*[ResBlock(H)] * medusa_num_layers, Linear(H, vocab,
  bias=False)))` (medusa_model.py:111-119); ResBlock = `x + SiLU(linear(x))`, `linear = nn.Linear(H, H)`
  with its bias (medusa_model.py:56-60, 72). Keys of the saved `medusa_head` state dict: `{i}.{j}.linear.weight`,
  `{i}.{j}.linear.bias` for block j of head i, `{i}.{n}.weight` for head i's LM head (n blocks). The n blocks
  of a head are one module repeated (`[ResBlock(H)] * n`): equal weights, which map onto our n blocks as they are.
* Forward: every head reads `outputs[0]` of the base model (medusa_model.py:214, 218), after its final norm
  (medusa/model/modeling_llama_kv.py:948): logits_i = LMhead_i(ResBlock_i^n(norm(h))).
* "Version 2" heads (commit 2b8020f, medusa/model/medusa_model_legacy.py:102-108, 204-205) drop the per-head
  Linear and project with the base model's LM head: no `{i}.{n}.weight` keys.

Mapping onto MedusaDrafter: `{i}.{j}.linear.*` -> `heads.{i}.{j}.linear.*`, `{i}.{n}.weight` ->
`lm_heads.{i}.weight`; config flags `normed_input=True` and `own_lm_heads` (True when the file has the per-head
LM heads); full vocabulary, our static tree. A Medusa-2 model saved whole (target and heads in one checkpoint)
is not a drafter folder and is refused.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch

from core.drafters.checkpoint import CorruptCheckpointError, TrainedDrafter, json_kind, target_fields
from core.target import Target

EAGLE_WEIGHTS = ("pytorch_model.bin", "model.safetensors")  # the order EAGLE's loader tries them
MEDUSA_WEIGHTS = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")  # safetensors first: no pickle
EAGLE3_KEYS = re.compile(r"^(midlayer\.|d2t$|t2d$)")


class PublishedFormatError(CorruptCheckpointError):
    """A published checkpoint that cannot be converted for this target (one line, naming the file or shapes)."""


# ----- reading the files ----------------------------------------------------------------------------
def first_file(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def torch_load(path: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    """A pickled state dict, read with weights_only=True (no code runs); one-line errors."""
    try:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError:
            if not mmap:
                raise
            state = torch.load(str(path), map_location="cpu", weights_only=True)  # the legacy (non-zip) format
    except Exception as err:  # noqa: BLE001 - unpickling errors come in many types
        raise PublishedFormatError(f"{path} cannot be read as a state dict (torch.load, weights_only=True): "
                                   f"{first_line(err)}") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise PublishedFormatError(f"{path} does not hold a state dict (names -> tensors), got {type(state).__name__}")
    return state


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:  # noqa: BLE001
            raise PublishedFormatError(f"{path} cannot be read: {first_line(err)}") from None
    return torch_load(path)


def published_config(folder: Path, fmt: str) -> dict:
    """A published checkpoint's config.json as a dict ({} for Medusa heads without one)."""
    path = folder / "config.json"
    if not path.is_file():
        if fmt == "eagle":
            raise PublishedFormatError(f"EAGLE checkpoint {folder}: no config.json")
        return {}  # Medusa's config only repeats what the keys say
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PublishedFormatError(f"{path} is not valid JSON: {first_line(err)}") from None
    if not isinstance(config, dict):
        raise PublishedFormatError(f"{path} must hold a JSON object, got {json_kind(config)}")
    return config



# ----- converting -----------------------------------------------------------------------------------
def _shape(t: torch.Tensor | tuple) -> str:
    return "[" + ", ".join(str(int(d)) for d in (t.shape if isinstance(t, torch.Tensor) else t)) + "]"


def _check_shapes(what: str, state: dict[str, torch.Tensor], want: dict[str, tuple[tuple[int, ...], str]],
                  source: str) -> None:
    """Every key of `want` present in `state` with its shape; `want[key] = (shape, how it follows from the
    target)`. One line naming both shapes at the first mismatch."""
    for key, (shape, how) in want.items():
        if key not in state:
            raise PublishedFormatError(f"{what}: {source} has no {key}")
        if tuple(state[key].shape) != tuple(shape):
            raise PublishedFormatError(f"{what}: {key} is {_shape(state[key])} but this target needs "
                                       f"{_shape(shape)} ({how}); the checkpoint was made for another target")


def _rope_of_target(target: Target) -> tuple[float | None, str]:
    cfg = target.config
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    kind = params.get("rope_type") or (getattr(cfg, "rope_scaling", None) or {}).get("rope_type") or "default"
    return (None if theta is None else float(theta)), str(kind)


def _check_eagle_config(what: str, config: dict, target: Target) -> None:
    """The settings our layer takes from the target, compared with EAGLE's config.json (defaults as EConfig's)."""
    cfg = target.config
    for name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "rms_norm_eps",
                 "rope_theta"):
        value = config.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise PublishedFormatError(f"{what}: config.json {name} must be a number, got {json.dumps(value)}")
    heads = config.get("num_attention_heads", 32)
    checks = [
        ("num_attention_heads", heads, target.n_heads),
        ("num_key_value_heads", config.get("num_key_value_heads") or heads, target.kv_heads),
        ("head_dim (hidden_size / num_attention_heads)",
         config.get("hidden_size", 0) // heads if isinstance(heads, int) and heads > 0 else heads, target.head_dim),
        ("hidden_act", config.get("hidden_act", "silu"), getattr(cfg, "hidden_act", "silu")),
        ("rms_norm_eps", float(config.get("rms_norm_eps") or 1e-6), float(getattr(cfg, "rms_norm_eps", 1e-6))),
    ]
    for name, theirs, ours in checks:
        if theirs != ours:
            raise PublishedFormatError(f"{what}: config.json {name} is {theirs!r} but this target's is {ours!r}; "
                                       f"the drafter's layer runs with the target's")
    if config.get("num_hidden_layers", 1) != 1:
        raise PublishedFormatError(f"{what}: config.json num_hidden_layers is {config.get('num_hidden_layers')!r}; "
                                   f"SpecLens's EAGLE drafter has one decoder layer (as the published ones)")
    theta, kind = _rope_of_target(target)
    their_theta = float(config.get("rope_theta") or 10000.0)
    scaling = config.get("rope_scaling")
    if scaling is not None or kind != "default" or (theta is not None and their_theta != theta):
        raise PublishedFormatError(f"{what}: its RoPE (theta {their_theta:g}, scaling {scaling!r}) is not this "
                                   f"target's (theta {theta!r}, type {kind!r}); the drafter uses the target's RoPE")


EAGLE_IGNORED = re.compile(r"^layers\.0\.(self_attn\.rotary_emb\.inv_freq|input_layernorm\.weight)$")


def load_eagle(folder: Path, target: Target) -> TrainedDrafter:
    from core.drafters.eagle2 import Eagle2Config, Eagle2Drafter

    what = f"EAGLE checkpoint {folder}"
    config = published_config(folder, "eagle")
    weights = first_file(folder, EAGLE_WEIGHTS)
    if weights is None:
        raise PublishedFormatError(f"{what}: no {' or '.join(EAGLE_WEIGHTS)}")
    state = read_tensors(weights)
    if any(EAGLE3_KEYS.match(k) for k in state):
        raise PublishedFormatError(f"{what} is an EAGLE-3 checkpoint (midlayer / d2t); SpecLens converts EAGLE-1 "
                                   f"and EAGLE-2 checkpoints")
    h, v = target.hidden_size, target.vocab_size
    q, kv = target.n_heads * target.head_dim, target.kv_heads * target.head_dim
    inter = int(target.config.intermediate_size)
    fc_bias = bool(config.get("bias", True))
    qkv_bias = bool(config.get("qkv_bias", False))
    hq, hkv = f"{target.n_heads} heads x {target.head_dim}", f"{target.kv_heads} key-value heads x {target.head_dim}"
    want: dict[str, tuple[tuple[int, ...], str]] = {
        "fc.weight": ((h, 2 * h), f"[H, 2H], hidden size H = {h}")}
    if fc_bias:
        want["fc.bias"] = ((h,), f"[H], H = {h}")
    layer = {
        "self_attn.q_proj.weight": ((q, h), f"[{hq}, H]"), "self_attn.k_proj.weight": ((kv, h), f"[{hkv}, H]"),
        "self_attn.v_proj.weight": ((kv, h), f"[{hkv}, H]"), "self_attn.o_proj.weight": ((h, q), f"[H, {hq}]"),
        "mlp.gate_proj.weight": ((inter, h), f"[intermediate {inter}, H]"),
        "mlp.up_proj.weight": ((inter, h), f"[intermediate {inter}, H]"),
        "mlp.down_proj.weight": ((h, inter), f"[H, intermediate {inter}]"),
        "post_attention_layernorm.weight": ((h,), "[H]")}
    if qkv_bias:
        layer.update({"self_attn.q_proj.bias": ((q,), f"[{hq}]"), "self_attn.k_proj.bias": ((kv,), f"[{hkv}]"),
                      "self_attn.v_proj.bias": ((kv,), f"[{hkv}]")})
    want.update({f"layers.0.{k}": s for k, s in layer.items()})
    _check_shapes(what, state, want, weights.name)  # shapes first: a checkpoint for another target says so
    if "embed_tokens.weight" in state:
        _check_shapes(what, state, {"embed_tokens.weight": ((v, h), f"[vocabulary {v}, H]")}, weights.name)
    extra_layers = sorted({k.split(".")[1] for k in state if k.startswith("layers.") and not k.startswith("layers.0.")})
    if extra_layers:
        raise PublishedFormatError(f"{what}: {weights.name} has decoder layers {', '.join(extra_layers)} beyond "
                                   f"layer 0; SpecLens's EAGLE drafter has one decoder layer (as the published ones)")
    known = set(want) | {"embed_tokens.weight", "fc.bias"}
    unknown = sorted(k for k in state if k not in known and not EAGLE_IGNORED.match(k)
                     and not (k.startswith("layers.0.self_attn.") and k.endswith("_proj.bias") and not qkv_bias))
    if unknown:
        raise PublishedFormatError(f"{what}: {weights.name} holds tensors an EAGLE-1/2 drafter does not have: "
                                   f"{', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''}")
    _check_eagle_config(what, config, target)

    cfg = Eagle2Config(**target_fields(target), normed_features=True, input_layernorm=False, fc_bias=fc_bias,
                       draft_vocab_size=0, feature_scale=1.0)
    model = Eagle2Drafter(cfg, target)
    if (model.layer.self_attn.q_proj.bias is not None) != qkv_bias:
        raise PublishedFormatError(f"{what}: its q/k/v projections {'have' if qkv_bias else 'have no'} bias "
                                   f"(config.json qkv_bias) but this target's layers "
                                   f"{'have none' if qkv_bias else 'have one'}")
    mapped = {"fc.weight": state["fc.weight"]}
    if fc_bias:
        mapped["fc.bias"] = state["fc.bias"]
    mapped.update({f"layer.{k}": state[f"layers.0.{k}"] for k in layer})
    _load_exactly(model, mapped, what)
    if "embed_tokens.weight" in state:
        ours = target.embed_tokens.weight.detach().float().cpu()
        if not torch.allclose(state["embed_tokens.weight"].float(), ours, rtol=1e-2, atol=1e-3):
            warnings.warn(f"{what}: its embed_tokens.weight differs from the target's embedding, which the drafter "
                          f"uses (EAGLE trains with the base model's, frozen): was it made for another target?",
                          stacklevel=3)
    return model


def _load_exactly(model: TrainedDrafter, mapped: dict[str, torch.Tensor], what: str) -> None:
    """Load `mapped` into `model`; every parameter must come from the file (the vocabulary buffer excepted)."""
    own = model.state_dict()
    state = {k: t.to(own[k].dtype) if k in own else t for k, t in mapped.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("vocab.")]
    if missing or unexpected:  # a bug in the mapping, not the user's mistake
        raise PublishedFormatError(f"{what}: converted weights do not fit the drafter: missing {missing[:4]}, "
                                   f"unexpected {unexpected[:4]}")


MEDUSA_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def load_medusa(folder: Path, target: Target) -> TrainedDrafter:
    from core.drafters.medusa import MedusaConfig, MedusaDrafter

    what = f"Medusa checkpoint {folder}"
    weights = first_file(folder, MEDUSA_WEIGHTS)
    if weights is None:
        raise PublishedFormatError(f"{what}: no {' or '.join(MEDUSA_WEIGHTS)}")
    config = published_config(folder, "medusa")
    state = read_tensors(weights)
    if state and all(k.startswith("medusa_head.") for k in state):  # saved from the whole model's state dict
        state = {k.removeprefix("medusa_head."): t for k, t in state.items()}
    parsed: dict[tuple[int, int], set[str]] = {}
    unknown = []
    for key in state:
        m = MEDUSA_KEY.match(key)
        if m is None:
            unknown.append(key)
        else:
            parsed.setdefault((int(m.group(1)), int(m.group(2))), set()).add(m.group(3))
    if unknown or not parsed:
        raise PublishedFormatError(f"{what}: {weights.name} does not hold Medusa heads (keys such as "
                                   f"0.0.linear.weight); found {', '.join(sorted(unknown)[:4]) or 'nothing'}")
    n_heads = max(i for i, _ in parsed) + 1
    blocks = sorted(j for (i, j), names in parsed.items() if i == 0 and "linear.weight" in names)
    n_layers = len(blocks)
    own_head = (0, n_layers) in parsed and "weight" in parsed[(0, n_layers)]
    if n_layers == 0 or blocks != list(range(n_layers)):
        raise PublishedFormatError(f"{what}: head 0's residual blocks are numbered {blocks}; expected 0..n-1")
    declared = config.get("medusa_num_layers")
    if declared is not None and declared != n_layers:
        raise PublishedFormatError(f"{what}: config.json medusa_num_layers is {declared!r} but {weights.name} has "
                                   f"{n_layers} residual block(s) per head")
    h, v = target.hidden_size, target.vocab_size
    want: dict[str, tuple[tuple[int, ...], str]] = {}
    for i in range(n_heads):
        for j in range(n_layers):
            want[f"{i}.{j}.linear.weight"] = ((h, h), f"[H, H], hidden size H = {h}")
            want[f"{i}.{j}.linear.bias"] = ((h,), f"[H], H = {h}")
        if own_head:
            want[f"{i}.{n_layers}.weight"] = ((v, h), f"[vocabulary {v}, H = {h}]")
    _check_shapes(what, state, want, weights.name)
    extra = sorted(set(state) - set(want))
    if extra:
        raise PublishedFormatError(f"{what}: {weights.name} holds tensors outside {n_heads} head(s) of {n_layers} "
                                   f"block(s){' and an LM head' if own_head else ''}: {', '.join(extra[:4])}")

    cfg = MedusaConfig(**target_fields(target), num_heads=n_heads, num_layers_per_head=n_layers,
                       normed_input=True, own_lm_heads=own_head, draft_vocab_size=0, feature_scale=1.0)
    model = MedusaDrafter(cfg, target)
    mapped = {}
    for i in range(n_heads):
        for j in range(n_layers):
            for p in ("weight", "bias"):
                mapped[f"heads.{i}.{j}.linear.{p}"] = state[f"{i}.{j}.linear.{p}"]
        if own_head:
            mapped[f"lm_heads.{i}.weight"] = state[f"{i}.{n_layers}.weight"]
    _load_exactly(model, mapped, what)
    return model
