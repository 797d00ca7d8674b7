"""What trained drafters share: the base class and config (core.drafters.checkpoint, re-exported here), the
distillation loss terms, the RoPE and layer-shape helpers of drafter-owned decoder layers, hyper-parameter and
tree-option checks, and the Medusa-style head machinery (residual blocks, deepening, the per-head loss).

Each drafter module imports these from here and never from a sibling drafter. docs/ARCHITECTURE.md, "Drafters".
"""

from __future__ import annotations

import copy
import math
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from core.drafters.checkpoint import TARGET_FIELDS, DrafterConfig, TrainBatch, TrainedDrafter, check_hyper
from core.drafters.draft_vocab import DraftVocab
from core.drafters.dynamic_tree import check_tree_settings
from core.layers import cached_copy
from core.target import Target

__all__ = [
    "LOSS_DECAY", "TARGET_FIELDS", "TOPK_METRICS", "TREE_OPTIONS", "DrafterConfig", "ResBlock", "StackedHeads",
    "TrainBatch", "TrainedDrafter", "apply_tree_options", "check_draft_vocab_size", "check_hyper",
    "deepen_heads", "distill_terms", "layer_config", "multi_head_loss", "perturb",
    "resolve_auto_tree", "rope_kv", "target_tokens_in_vocab", "top1", "weighted_mean", "AUTO",
]

# ----- distillation against the target's distribution (EAGLE-2, MoA) ----------------------------
TREE_OPTIONS = ("depth", "top_k", "total_tokens")


def layer_config(target: Target):
    """A one-layer Llama config of the target's shape: the drafter's own decoder layers. A Qwen2 target's config
    becomes a Llama one (the drafters' layers are Llama layers, with no attention bias, whatever the family)."""
    from transformers import LlamaConfig

    if target.config.model_type == "llama":
        cfg = copy.deepcopy(target.config)
    else:
        fields = {k: v for k, v in target.config.to_dict().items() if k not in ("model_type", "architectures")}
        cfg = LlamaConfig(**{**fields, "attention_bias": False, "mlp_bias": False, "head_dim": target.head_dim})
    cfg.num_hidden_layers = 1
    return cfg


def rope_kv(kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_heads: int,
            head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat pre-RoPE keys+values [B, T, 2 * kv_heads * head_dim] -> (roped keys, values), each [B, kv_heads, T, D]."""
    from transformers.models.llama.modeling_llama import rotate_half

    b, t, _ = kv.shape
    width = kv_heads * head_dim
    k = kv[..., :width].reshape(b, t, kv_heads, head_dim).transpose(1, 2)
    v = kv[..., width:].reshape(b, t, kv_heads, head_dim).transpose(1, 2)
    cos, sin = cos.to(k.dtype).unsqueeze(1), sin.to(k.dtype).unsqueeze(1)
    return k * cos + rotate_half(k) * sin, v  # HF's apply_rotary_pos_emb for the keys alone, the same arithmetic


def _ce_rows(pred: torch.Tensor, true: torch.Tensor, vocab: DraftVocab) -> tuple[torch.Tensor, ...]:
    dtype = vocab.target_ref[0].dtype
    with torch.no_grad():
        t_logits = vocab.logits(true.to(dtype))
        p = torch.softmax(t_logits, dim=-1)
        t_top = t_logits.argmax(-1)
    logq = torch.log_softmax(vocab.logits(pred.to(dtype)), dim=-1)
    return -(p * logq).sum(-1), logq.argmax(-1), t_top


def distill_terms(vocab: DraftVocab, pred: torch.Tensor, true: torch.Tensor,
                  chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cross-entropy of the drafter's distribution against the target's, per row, in chunks.

    Both distributions are over the drafting vocabulary (the target's renormalised there).
    pred, true: [M, H] pre-norm features (drafter's and target's). Returns (ce [M] with grad,
    drafter top-1 [M], target top-1 within the drafting vocabulary [M]), the top-1s as token ids.
    Each chunk is checkpointed, so only one chunk's vocabulary-sized tensors are alive at a time,
    in the forward and in the backward pass.
    """
    ces, d_top, t_top = [], [], []
    true = true.detach()
    fn = partial(_ce_rows, vocab=vocab)
    for s in range(0, pred.shape[0], chunk):
        p, t = pred[s: s + chunk], true[s: s + chunk]
        if torch.is_grad_enabled() and p.requires_grad:
            c, d, tt = checkpoint(fn, p, t, use_reentrant=False)
        else:
            c, d, tt = fn(p, t)
        ces.append(c)
        d_top.append(d)
        t_top.append(tt)
    if not ces:
        z = pred.new_zeros(0)
        return z.float(), z.long(), z.long()
    return torch.cat(ces), vocab.to_token_ids(torch.cat(d_top)), vocab.to_token_ids(torch.cat(t_top))


@torch.no_grad()
def top1(vocab: DraftVocab, feats: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Token id of the argmax of the drafting-vocabulary logits per row, in chunks."""
    dtype = vocab.target_ref[0].dtype
    out = [vocab.logits(feats[s: s + chunk].to(dtype)).argmax(-1) for s in range(0, feats.shape[0], chunk)]
    return vocab.to_token_ids(torch.cat(out)) if out else feats.new_zeros(0, dtype=torch.long)


def target_tokens_in_vocab(vocab: DraftVocab, t_top: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
    """The target's top-1 for accuracy metrics, -1 (a certain miss) where it lies outside the drafting vocabulary.

    t_top is the target's top-1 *within* the drafting vocabulary (its full-vocabulary logits are never
    computed, to keep training cheap); next_ids, the data's next tokens, stand in for its full top-1 when
    deciding whether that lies outside: exact on greedy self-distilled answers, where they are the same.
    """
    if vocab.full:
        return t_top
    return torch.where(vocab.to_index(next_ids) >= 0, t_top, torch.full_like(t_top, -1))


def check_draft_vocab_size(size: int, target: Target) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= target.vocab_size:
        raise ValueError(f"draft_vocab_size must be an integer in [0, {target.vocab_size}], got {size!r}")


def weighted_mean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum() / w.sum().clamp_min(1e-6)


AUTO = "auto"  # depth / total_tokens "auto": sized for this machine (core.trees.choice.choose_tree); the default
AUTO_SIZED = ("depth", "total_tokens")


def apply_tree_options(drafter: TrainedDrafter, opts: dict) -> None:
    """Validate and set depth / top_k / total_tokens on a tree drafter's config.

    depth / total_tokens may be "auto" (the default of every dynamic-tree drafter: `resolve_auto_tree` picks
    them for this machine on the first `begin`); an explicit value fixes the tree as given.
    """
    unknown = sorted(set(opts) - set(TREE_OPTIONS))
    if unknown:
        raise ValueError(f"{drafter.name} has no option {', '.join(unknown)}; options: {', '.join(TREE_OPTIONS)}")
    auto = [k for k in AUTO_SIZED if opts.get(k) == AUTO]
    settings = {k: getattr(drafter.config, k) if k in auto else opts.get(k, getattr(drafter.config, k))
                for k in TREE_OPTIONS}
    check_tree_settings(**settings)
    for k, v in settings.items():
        setattr(drafter.config, k, v)
    if any(k in opts and opts[k] != AUTO for k in AUTO_SIZED):
        drafter.tree_auto = False  # the user fixed the tree
        drafter.tree_choice = None
    elif auto:
        drafter.tree_auto = True
        drafter.tree_choice = None  # chosen again on the next begin


def _shipped_summary_label(drafter: TrainedDrafter) -> str:
    tli = getattr(drafter.config, "tli", 0) or 0
    return drafter.name + (f"-tli{tli}" if tli else "")


def tree_acceptance(drafter: TrainedDrafter) -> dict | None:
    """What the drafter's auto tree goes by, best first: the measured tau of every tree shape
    (core.trees.acceptance.tree_table, analysis.tree_acceptance) when it was measured on this very checkpoint and
    target; else the benchmark summary's acceptance by depth of its method when it is the shipped checkpoint for
    the same target; else its card's held-out acc@k. None for an untrained (random) drafter, which keeps its
    configured tree."""
    from core.trees.acceptance import RESULTS, card_acceptance, checkpoint_signature, method_acceptance, tree_table

    meta = getattr(drafter, "checkpoint_meta", None)
    if not isinstance(meta, dict):
        return None
    label = _shipped_summary_label(drafter)
    table = tree_table(label, drafter.config.target_fingerprint, checkpoint_signature(meta))
    if table and table.get("top_k") == drafter.config.top_k:  # measured with this frontier width
        return table
    try:
        import json

        summary = json.loads(RESULTS.read_text())
        same_target = summary["config"]["target"]["fingerprint"] == drafter.config.target_fingerprint
    except (OSError, ValueError, KeyError, TypeError):
        same_target = False
    if same_target and meta.get("name", label) == label:
        acc = method_acceptance(label)
        if acc:
            return acc
    return card_acceptance((meta.get("training") or {}).get("heldout"))


def resolve_auto_tree(drafter: TrainedDrafter, target: Target) -> dict | None:
    """Size a dynamic tree for this machine once (core.trees.choice.choose_tree; the curve is cached per machine,
    the tiny test target uses the fixed cost model). Sets config.depth / total_tokens and returns the choice
    (also kept as `drafter.tree_choice` for the app); None when the tree is fixed or nothing is known."""
    if not getattr(drafter, "tree_auto", False):
        return None
    if getattr(drafter, "tree_choice", None) is not None:
        return drafter.tree_choice
    from core.trees.calibration import CycleLedger, calibration_enabled, trial_enabled
    from core.trees.choice import choose_tree

    acc = tree_acceptance(drafter)
    if acc is None:
        drafter.tree_choice = {"method": _shipped_summary_label(drafter), "depth": None, "total_tokens": None,
                               "acceptance_source": None, "note": "untrained drafter: configured tree kept"}
        return drafter.tree_choice
    choice = choose_tree(_shipped_summary_label(drafter), target, acceptance=acc,
                         top_k=int(drafter.config.top_k))
    if choice["depth"] is not None:
        drafter.config.depth = int(choice["depth"])
        drafter.config.total_tokens = int(choice["total_tokens"])
    drafter.tree_choice = choice
    drafter.tree_acceptance_used = acc
    drafter.tree_ledger = CycleLedger() if calibration_enabled(target) else None
    if drafter.tree_ledger is not None and trial_enabled() and choice["depth"] is not None:
        from core.trees.trial import ShapeTrial, candidates

        drafter.tree_trial = ShapeTrial(candidates(choice))  # decoding decides between the shapes
        drafter.config.depth, drafter.config.total_tokens = drafter.tree_trial.next_shape()
    return choice


# ----- Medusa-style heads (Medusa, Amphista) ------------------------------------------------------
LOSS_DECAY = 0.8
TOPK_METRICS = 10
LOSS_CHUNK = 1024  # rows per vocabulary-sized logits chunk in training


class ResBlock(torch.nn.Module):
    """x + SiLU(W x + b), W and b zero-initialised: starts as the identity."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class StackedHeads:
    """Inference copy of K ResBlock heads of equal depth (Medusa's, Amphista's): per depth, one batched
    matmul for all K heads instead of K calls. Built from the modules at begin(), so training in between is
    picked up; the modules themselves stay what training and saving use."""

    def __init__(self, heads: torch.nn.ModuleList) -> None:
        blocks = [list(head) for head in heads]
        with torch.no_grad():  # per depth: W^T stacked [K, H, H] and b [K, 1, H], for x @ W^T + b
            self.weight = [torch.stack([head[d].linear.weight.detach().t() for head in blocks]).contiguous()
                           for d in range(len(blocks[0]))]
            self.bias = [torch.stack([head[d].linear.bias.detach() for head in blocks])[:, None]
                         for d in range(len(blocks[0]))]

    @classmethod
    def of(cls, heads: torch.nn.ModuleList) -> StackedHeads:
        """StackedHeads(heads), made again only when one of the heads' weights has changed (cached_copy)."""
        return cached_copy(heads, "stacked_heads", heads.parameters(), lambda: cls(heads))

    @property
    def dtype(self) -> torch.dtype:
        return self.weight[0].dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [K, H] (row i: head i's input) -> the heads' outputs [K, H]."""
        x = x[:, None]
        for w, b in zip(self.weight, self.bias):
            x = x + F.silu(torch.baddbmm(b, x, w))
        return x[:, 0]


@torch.no_grad()
def perturb(params: list[torch.Tensor], noise: float, seed: int) -> None:
    """Add N(0, (noise / sqrt(fan_in))^2) to each tensor (fan_in = last dim), from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        std = noise / math.sqrt(p.shape[-1])
        p.add_((torch.randn(p.shape, generator=gen) * std).to(device=p.device, dtype=p.dtype))


def deepen_heads(drafter: TrainedDrafter, num_layers_per_head: int | None) -> None:
    """Deepen every head of a Medusa-style drafter (`heads`: K sequences of ResBlocks) to
    `num_layers_per_head` blocks. The new blocks are zero-initialised, so each head still computes what it
    did (x + SiLU(0) = x) and a continued run starts where the drafter was."""
    have = drafter.config.num_layers_per_head
    if num_layers_per_head is None or num_layers_per_head == have:
        return
    if num_layers_per_head < have:
        raise ValueError(f"{drafter.name} can only deepen its heads ({have} -> {num_layers_per_head} asked)")
    like = drafter.heads[0][0].linear.weight
    for blocks in drafter.heads:
        for _ in range(num_layers_per_head - have):
            blocks.append(ResBlock(drafter.config.hidden_size).to(device=like.device, dtype=like.dtype))
    drafter.config.num_layers_per_head = num_layers_per_head


def _ce_chunk(logits_fn, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """y: indices into the logits, -1 for a label outside the drafting vocabulary (no loss, rank = V)."""
    logits = logits_fn(x)
    loss = F.cross_entropy(logits, y, reduction="sum", ignore_index=-1)
    with torch.no_grad():  # rank of the right token: how many tokens score strictly higher
        rank = (logits > logits.gather(1, y.clamp_min(0)[:, None])).sum(1)
        rank = torch.where(y >= 0, rank, logits.shape[-1])
    return loss, rank


def multi_head_loss(
    states: torch.Tensor,
    batch: TrainBatch,
    logits_fn,
    to_index=None,
    decay: float = LOSS_DECAY,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-head cross-entropy of K head states against the target's greedy tokens 2+i ahead, weighted decay^i.

    states: [B, T', K, H], head i's state at positions 0..T'-1 (T' <= T). logits_fn maps
    states to logits over the drafting vocabulary; to_index maps token ids to its indices
    (-1 outside it; None = identity, the full vocabulary). Out-of-vocabulary labels add no
    loss (the CE is the mean over the others) but count as misses in the metrics. Metrics:
    `acc@{i}` (head i's top-1 accuracy, i = 1..K), `top{k}@{i}` (cumulative top-k, k = 1..10),
    `ce@{i}`. Logits are computed in chunks of rows, under activation checkpointing when
    gradients are on, so a vocabulary-sized tensor never exists for the whole batch.
    """
    ids, loss_mask, attn = batch.input_ids, batch.loss_mask, batch.attention_mask
    labels = batch.greedy_next()  # labels[:, j]: the target's greedy token j + 1
    t_total = ids.shape[1]
    n_heads = states.shape[2]
    total = states.new_zeros((), dtype=torch.float32)
    metrics: dict[str, float] = {}
    for i in range(n_heads):
        shift = 2 + i
        n_pos = min(states.shape[1], t_total - shift)
        if n_pos <= 0:
            continue
        valid = (loss_mask[:, shift:shift + n_pos] > 0) & (attn[:, :n_pos] > 0)
        x = states[:, :n_pos, i][valid]
        y = labels[:, shift - 1:shift - 1 + n_pos][valid]
        if to_index is not None:
            y = to_index(y)
        n = y.numel()
        if n == 0:
            continue
        loss_sum = states.new_zeros((), dtype=torch.float32)
        ranks = []
        for s in range(0, n, LOSS_CHUNK):
            xc, yc = x[s:s + LOSS_CHUNK], y[s:s + LOSS_CHUNK]
            if torch.is_grad_enabled() and xc.requires_grad:
                part, rank = checkpoint(_ce_chunk, logits_fn, xc, yc, use_reentrant=False)
            else:
                part, rank = _ce_chunk(logits_fn, xc, yc)
            loss_sum = loss_sum + part
            ranks.append(rank)
        rank = torch.cat(ranks)
        ce = loss_sum / max(1, int((y >= 0).sum()))
        total = total + decay**i * ce
        metrics[f"ce@{i + 1}"] = float(ce.detach())
        metrics[f"acc@{i + 1}"] = float((rank < 1).float().mean())
        for k in range(1, TOPK_METRICS + 1):
            metrics[f"top{k}@{i + 1}"] = float((rank < k).float().mean())
    metrics["loss"] = float(total.detach())
    return total, metrics
