"""A reduced drafting vocabulary: the drafter's output layer over the V' most frequent tokens only.

Why: on a CPU the drafter's cost is dominated by its vocabulary projection (the
target's tied 49,152 x 576 LM head is read once per tree level: about 9 ms of a
55 ms target step). Projecting onto the V' tokens that actually occur in the
self-distilled answers (8,192 cover about 98% of them) cuts that cost by V/V',
for drafting and for training alike. Tokens outside V' can simply never be
drafted; verification is unchanged, so decoding stays lossless. This is a
documented deviation shared by every trained drafter here (EAGLE-3 introduced
the same idea for GPUs); `size = 0` keeps the full vocabulary, as the papers do.

Context tokens (our addition, on by default: `context=True`): every token the
conversation has already shown (prompt, earlier turns, verified output) joins the
drafting vocabulary for that conversation, after the V' frequent ones. Measured on
the committed plain-decoding answers to the evaluation prompts (1,299 tokens), 7.7%
of the target's tokens lie outside the shipped 8,192 frequent tokens, but only 1.5%
lie outside them and the conversation so far: the misses are names, rare words and
foreign text that translation, summarisation and retrieval answers copy from their
prompt. A token
first seen in the context costs one more row of the projection (gathered from the
same frozen LM head). In training, a batch's own tokens play the conversation
(`observe`), a superset of what each position could have seen at inference.

The chosen token ids live in the drafter's state dict (a buffer), so a checkpoint
carries its own vocabulary; the projection rows are gathered from the frozen
target LM head and never stored.

Drafting on fewer rows than training (our choice, measured): a drafter trains over
all V' of its tokens, but drafts over only the `drafting_size` (DRAFTING_SIZE,
2,048) most frequent of them, plus the context tokens as above. On a CPU the
projection rows are read from memory at every tree level, after the target's
pass has pushed them out of the caches, so they cost drafting time in proportion
to their number; the tokens ranked 2,049-8,192 are rarely a drafter's correct
guess, and those a conversation copies join as context tokens anyway. Measured
on 16 held-out prompts, one interleaved run, bfloat16 (docs/RESULTS.md,
"Drafting vocabulary"): tau unchanged within noise for every trained drafter,
drafting 0.2-1.3 ms a cycle cheaper. The ranking is a data file,
assets/drafters/token_ranks.json (`python -m core.training.draft_vocab_build`
writes it from the distillation answers); a drafter's tokens missing from it
rank last. Training, and held-out evaluation, always use all V' tokens:
`clear_context(drafting=False)`, which `observe_batch` calls. Verification is
untouched, so decoding stays lossless.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

from core.layers import PackedWeight, linear, maybe_pack
from core.target import Target

DRAFTING_SIZE = 2048  # drafting uses this many of the drafter's most frequent tokens (module docstring); 0 = all
RANKS_FILE = Path(__file__).resolve().parents[2] / "assets" / "drafters" / "token_ranks.json"


@functools.cache
def token_ranks(path: Path = RANKS_FILE) -> dict[int, int]:
    """token id -> frequency rank (0 = most frequent) from the ranks file, read once per process."""
    try:
        ids = json.loads(Path(path).read_text())["ids_by_frequency"]
    except (OSError, ValueError, KeyError) as err:
        raise RuntimeError(f"cannot read the drafting vocabulary's token ranks from {path}: {err}") from err
    return {int(t): i for i, t in enumerate(ids)}


def most_frequent(ids: torch.Tensor, n: int, ranks: dict[int, int]) -> torch.Tensor:
    """The n of `ids` that rank first in `ranks` (ids absent from it last, lowest id first), sorted ascending."""
    order = sorted(ids.tolist(), key=lambda t: (ranks.get(int(t), len(ranks)), int(t)))
    return torch.tensor(sorted(order[:n]), dtype=torch.long, device=ids.device)


def frequent_tokens(sequences: Iterable[Iterable[int]], size: int, always: Iterable[int] = (),
                    fallback: Iterable[Iterable[int]] = ()) -> torch.Tensor:
    """The `size` most frequent token ids of `sequences` (plus `always`, e.g. end-of-turn), sorted ascending.

    When `sequences` has fewer distinct tokens than `size`, the slots left are filled
    with the most frequent tokens of `fallback` (e.g. the prompts), then by lowest id.
    """
    chosen = set(int(t) for t in always)
    for source in (sequences, fallback):
        counts = Counter()
        for seq in source:
            counts.update(int(t) for t in seq)
        for tok, _ in counts.most_common():
            if len(chosen) >= size:
                break
            chosen.add(tok)
    tok = 0
    while len(chosen) < size:
        chosen.add(tok)
        tok += 1
    return torch.tensor(sorted(chosen), dtype=torch.long)


class DraftVocab(torch.nn.Module):
    """Final norm + LM head restricted to a token subset; maps subset indices back to token ids.

    With no subset (`ids` empty) it is exactly `target.logits`. Indices 0..len(ids)-1 are the frequent
    tokens `ids`; the indices after them are the context tokens seen so far (`observe`), in order of
    first sight, when `context` is on.

    `normed=True`: the features it is given are already final-normed (the published EAGLE-1/2 and Medusa
    layouts regress / transform the target's *post-norm* state, core.drafters.published_formats), so the
    LM head is applied without the final norm.
    """

    def __init__(self, target: Target, size: int, context: bool = True, normed: bool = False) -> None:
        super().__init__()
        self.target_ref = [target]  # a list, so the target is not registered as a submodule
        self.normed = normed
        self.register_buffer("ids", torch.arange(size, dtype=torch.long) if size else torch.zeros(0, dtype=torch.long))
        self.context = context
        self.drafting_size = DRAFTING_SIZE  # 0: draft over every trained token
        self._drafting = False  # this conversation drafts over the `drafting_size` most frequent (clear_context)
        self._subsets: dict[int, torch.Tensor] = {}  # drafting_size -> those ids, made once per ids
        self._weight: torch.Tensor | None = None
        self._packed: PackedWeight | None = None  # the frequent rows packed for inference (core.layers.linear)
        self._weight_for: torch.Tensor | None = None  # the frequent ids `_weight` holds the rows of
        self._frequent: set[int] | None = None
        self.clear_context()

    def frequent_ids(self) -> torch.Tensor:
        """The frequent tokens in use: all trained `ids`, or, while drafting, the `drafting_size` top-ranked."""
        n = self.drafting_size
        if not self._drafting or not n or n >= self.ids.numel():
            return self.ids
        if n not in self._subsets:
            self._subsets[n] = most_frequent(self.ids, n, token_ranks())
        return self._subsets[n]

    @property
    def size(self) -> int:
        return self.frequent_ids().numel() + len(self._extra) if self.ids.numel() else self.target_ref[0].vocab_size

    @property
    def full(self) -> bool:
        return self.ids.numel() == 0

    def set_ids(self, ids: torch.Tensor) -> None:
        if ids.numel() != self.ids.numel():
            raise ValueError(f"vocabulary has {self.ids.numel()} slots, got {ids.numel()} ids")
        self.ids.copy_(ids.to(self.ids.device))
        self._forget_ids()

    # ----- context tokens ---------------------------------------------------------------------
    def _forget_ids(self) -> None:
        self._weight = None
        self._packed = None
        self._frequent = None
        self._subsets = {}
        self.clear_context()

    def clear_context(self, drafting: bool | None = None) -> None:
        """Forget the context tokens (a new conversation, or a new training batch). drafting=True: a conversation
        drafts from here (over the `drafting_size` most frequent tokens); False: training; None: unchanged."""
        if drafting is not None:  # a new conversation or batch: `drafting_size` may have changed since the last
            self._drafting = drafting
            self._frequent = None
        self._extra: list[int] = []
        self._extra_seen: set[int] = set()
        self._extra_weight: torch.Tensor | None = None
        self._extra_packed: PackedWeight | None = None  # packed lazily, once per change of the context rows
        self._table: torch.Tensor | None = None

    def observe(self, token_ids) -> None:
        """Add the tokens of `token_ids` (ints or a tensor) that are not drafted yet to the vocabulary."""
        if self.full or not self.context:
            return
        if self._frequent is None:
            self._frequent = set(self.frequent_ids().tolist())
        ids = token_ids.flatten().tolist() if isinstance(token_ids, torch.Tensor) else token_ids
        new = []
        for t in dict.fromkeys(int(t) for t in ids):
            if t not in self._frequent and t not in self._extra_seen:
                self._extra_seen.add(t)
                new.append(t)
        if not new:
            return
        self._extra.extend(new)
        lm = self.target_ref[0].lm_head.weight
        rows = lm[torch.tensor(new, device=lm.device)].detach()
        self._extra_weight = rows if self._extra_weight is None else torch.cat([self._extra_weight, rows])
        self._extra_packed = None
        self._table = None

    def table(self) -> torch.Tensor | None:
        """Token id of every index on the CPU: [size] long (None for the full vocabulary, index = id)."""
        if self.full:
            return None
        if self._table is None:
            extra = torch.tensor(self._extra, dtype=torch.long)
            self._table = torch.cat([self.frequent_ids().cpu(), extra])
        return self._table

    def weight(self) -> torch.Tensor:
        lm = self.target_ref[0].lm_head.weight
        if self.full:
            return lm
        ids = self.frequent_ids()
        if (self._weight is None or self._weight_for is not ids or self._weight.device != lm.device
                or self._weight.dtype != lm.dtype):
            self._weight = lm[ids.to(lm.device)].detach()
            self._packed = maybe_pack(self._weight)
            self._weight_for = ids
        return self._weight

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """[..., H] pre-norm feature (post-norm when `normed`) -> float32 logits over the drafting vocabulary
        [..., size]."""
        target = self.target_ref[0]
        if self.full:
            if self.normed:
                return torch.nn.functional.linear(feature, target.lm_head.weight.to(feature.dtype)).float()
            return target.logits(feature)
        h = feature if self.normed else target.final_norm(feature)
        w = self.weight()
        packed = self._packed if h.dtype == w.dtype else None
        logits = linear(h, w.to(h.dtype), None, packed)
        extra = self._extra_weight
        if extra is not None:
            packed = None
            if extra.dtype == h.dtype:
                self._extra_packed = packed = self._extra_packed or maybe_pack(extra)
            logits = torch.cat([logits, linear(h, extra.to(h.dtype), None, packed)], dim=-1)
        return logits.float()

    def to_token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Subset indices -> token ids."""
        return index if self.full else self.table().to(index.device)[index]

    def to_index(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> subset indices, -1 where the token is outside the drafting vocabulary."""
        if self.full:
            return token_ids
        table = self.table().to(token_ids.device)
        lookup = torch.full((self.target_ref[0].vocab_size,), -1, dtype=torch.long, device=token_ids.device)
        lookup[table] = torch.arange(table.numel(), device=token_ids.device)
        return lookup[token_ids]

    def _load_from_state_dict(self, *args, **kwargs):  # the cached projection follows the loaded ids
        self._forget_ids()
        return super()._load_from_state_dict(*args, **kwargs)
