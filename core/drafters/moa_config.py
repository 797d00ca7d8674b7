"""MoA's configuration: every hyper-parameter of core/drafters/moa.py (MoAConfig), with why each exists and where
the reference code has it, and what checkpoints written before a field existed were built with (LEGACY)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from core.drafters.dynamic_tree import DEFAULT_DEPTH, DEFAULT_TOP_K, DEFAULT_TOTAL_TOKENS
from core.drafters.trained import DrafterConfig

MAX_TLI = 3


@dataclass
class MoAConfig(DrafterConfig):
    tli: int = 0  # N: target layers the drafter runs itself (0..3)
    # LSA width. lsa_full_width (the reference code's layout): the encoder attends across layers at the
    # full width of each layer's K+V (2 * kv_heads * head_dim) and projects to H only after the mean;
    # lsa_dim is then unused. False: K+V is first narrowed to lsa_dim (the layout of the drafters we
    # shipped before; kept so that their checkpoints load).
    lsa_full_width: bool = True
    lsa_dim: int = 128
    lsa_heads: int = 0  # 0: one head per target head's K or V (2 * kv_heads, so 6 heads of 64 on SmolLM2)
    lsa_mlp_ratio: int = 4  # the LSA encoder's MLP width / its model width
    # An MLP block after cross-attention (our earlier layout, not the reference's). It runs for every
    # drafted token, so it costs drafting time; the LSA encoder runs once per verified token instead.
    ca_mlp: bool = True
    # Cross-attention reads only the `ca_window` most recent verified positions (0: all of them). Our addition:
    # with the whole memory, CA learned an attention sink on early prompt positions and ignored where its
    # memory came from (docs/RESULTS.md, "MoA"); a window makes the recent verified states the only ones to read.
    ca_window: int = 0
    # Each verified position's LSA vector also gets the target's final feature there (normalised, projected;
    # our addition, see the module docstring). EAGLE-2 drafts from that feature; MoA's vector otherwise
    # carries only the per-layer keys and values, which stop one layer short of it.
    final_feature: bool = False
    # The projected final feature is multiplied by this before it joins the stream (module docstring).
    final_feature_gain: float = 1.0
    # A fresh drafter starts SA as a copy of the target's first layer (both read token embeddings) and
    # CA's projections as copies of the target's last layer's attention (LSA vectors regress deep
    # states); our choice, where the reference code starts from random weights. Only `random()` reads it.
    init_from_target: bool = False
    # Every weight of LSA, SA, CA and the head, RMSNorm and LayerNorm gains included, drawn from N(0, 0.02), so each
    # block starts near silent (the reference's `_init_weights`, moa_spec/models/train/moa_spec.py:77-91). LSA's
    # input LayerNorm keeps gain 1: it stands for the raw K+V that the reference's LSA residual carries (line 146).
    # Only `random()` reads it.
    reference_init: bool = True
    # Training only: a verified row (every prompt row, and the answer row that closes each period) reads its own
    # memory row in CA, at distance 0, as the reference's CA mask `idx_j <= start(i)` does (moa_spec.py:210, with
    # start(i) the last verified position <= i, line 162); under the staircase SA then sees only that row itself
    # (line 177). False: every row reads strictly earlier rows. Held-out evaluation always runs as inference does.
    own_row_reads: bool = True
    # Memory rows pass CA's input RMSNorm (the one the query stream passes) before CA's keys and values, as the
    # reference's cross-attention layer normalises both inputs with one norm (cross_attention.py:172-173).
    memory_norm: bool = True
    depth: int = DEFAULT_DEPTH  # tree settings: see core.drafters.dynamic_tree for why these defaults
    top_k: int = DEFAULT_TOP_K
    total_tokens: int = DEFAULT_TOTAL_TOKENS
    period_min: int = 6  # training: verified every k positions, k uniform in [period_min, period_max]
    period_max: int = 14
    staircase_until: float = 0.5  # training progress at which SA's mask has become fully causal
    # "random" (the reference code): per sequence, the staircase mask with probability
    # 1 - progress / staircase_until, else the causal one. "window": one mask whose window over the
    # earlier segments grows linearly (the layout of the drafters we shipped before).
    staircase: str = "random"
    ce_weight: float = 0.1
    # Training only (our addition; 0, the reference layout, is the default): per sequence, with this probability,
    # SA's attention and MLP outputs are dropped and the stream keeps only the token's embedding, so the
    # prediction must come from the target's channels (CA and the final feature). Inference always runs SA.
    sa_drop: float = 0.0
    # Training only (our addition; 0 is the reference layout): weight of an auxiliary loss asking a linear readout of
    # each position's LSA memory row to recover the target's normed final feature there. The loss is 1 - R^2 of that
    # read on the batch (analysis.moa_channels probes the same read on held-out data). Why: the probe found LSA
    # keeping almost none of the verified state, and nothing in the next-token losses asks it to. The readout
    # (`memory_readout`) is not used at inference.
    memory_loss: float = 0.0
    draft_vocab_size: int = 0  # project onto this many frequent tokens (draft_vocab.py); 0 = all
    context_vocab: bool = True  # the conversation's own tokens join that vocabulary (draft_vocab.py)

    RANGES: ClassVar[dict] = {
        "tli": (f"an integer in 0..{MAX_TLI}", lambda v: 0 <= v <= MAX_TLI),
        **{k: ("an integer >= 1", lambda v: v >= 1) for k in ("depth", "top_k", "total_tokens", "lsa_dim",
                                                              "lsa_mlp_ratio", "period_min", "period_max")},
        "staircase_until": ("a number in [0, 1]", lambda v: 0 <= v <= 1),
        "sa_drop": ("a number in [0, 1)", lambda v: 0 <= v < 1),
        "final_feature_gain": ("a finite number > 0", lambda v: v > 0),
        "ce_weight": ("a finite number >= 0", lambda v: v >= 0),
        "memory_loss": ("a finite number >= 0", lambda v: v >= 0),
        "staircase": ("'random' or 'window'", lambda v: v in ("random", "window")),
    }

    @classmethod
    def from_json(cls, data: Any, where: str = "config.json") -> MoAConfig:
        """As DrafterConfig.from_json, except that a checkpoint written before a reference-training field existed
        gets the value it was trained and runs with (LEGACY), not the new-run default."""
        if isinstance(data, dict):
            data = {**LEGACY, **data}
        return super().from_json(data, where)


# What a MoA checkpoint that lacks these fields was built with: no memory norm, target-layer initialisation,
# strictly earlier CA reads, and no MLP after CA (checkpoints from before `ca_mlp` existed had none).
LEGACY = {"memory_norm": False, "reference_init": False, "own_row_reads": False, "init_from_target": True,
          "ca_mlp": False}


def check_config(config: MoAConfig) -> None:
    """What a MoA drafter checks of its config before it builds (ValueError: one line naming the value)."""
    n = config.tli
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= min(MAX_TLI, config.n_target_layers):
        raise ValueError(f"tli must be an integer in 0..{MAX_TLI} (and at most the target's layer count), "
                         f"got {n!r}")
    if isinstance(config.ca_window, bool) or not isinstance(config.ca_window, int) or config.ca_window < 0:
        raise ValueError(f"ca_window must be an integer >= 0 (0: every verified position), "
                         f"got {config.ca_window!r}")
    gain = config.final_feature_gain
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not gain > 0:
        raise ValueError(f"final_feature_gain must be a number > 0, got {gain!r}")
    drop = config.sa_drop
    if isinstance(drop, bool) or not isinstance(drop, (int, float)) or not 0 <= drop < 1:
        raise ValueError(f"sa_drop must be a number in [0, 1) (0: SA always runs in training), got {drop!r}")
    if config.reference_init and config.init_from_target:
        raise ValueError("reference_init and init_from_target exclude each other: pick one initialisation")
    if not 1 <= config.period_min <= config.period_max:
        raise ValueError(f"need 1 <= period_min <= period_max, got {config.period_min}, {config.period_max}")
    if config.staircase not in ("random", "window"):
        raise ValueError(f"staircase must be 'random' or 'window', got {config.staircase!r}")
