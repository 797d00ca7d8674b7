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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch

from core.layers import PackedWeight, linear, maybe_pack
from core.target import Target


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
    """

    def __init__(self, target: Target, size: int, context: bool = True) -> None:
        super().__init__()
        self.target_ref = [target]  # a list, so the target is not registered as a submodule
        self.register_buffer("ids", torch.arange(size, dtype=torch.long) if size else torch.zeros(0, dtype=torch.long))
        self.context = context
        self._weight: torch.Tensor | None = None
        self._packed: PackedWeight | None = None  # the frequent rows packed for inference (core.layers.linear)
        self._frequent: set[int] | None = None
        self.clear_context()

    @property
    def size(self) -> int:
        return self.ids.numel() + len(self._extra) if self.ids.numel() else self.target_ref[0].vocab_size

    @property
    def full(self) -> bool:
        return self.ids.numel() == 0

    def set_ids(self, ids: torch.Tensor) -> None:
        if ids.numel() != self.ids.numel():
            raise ValueError(f"vocabulary has {self.ids.numel()} slots, got {ids.numel()} ids")
        self.ids.copy_(ids.to(self.ids.device))
        self._weight = None
        self._packed = None
        self._frequent = None
        self.clear_context()

    # ----- context tokens ---------------------------------------------------------------------
    def clear_context(self) -> None:
        """Forget the context tokens (a new conversation, or a new training batch)."""
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
            self._frequent = set(self.ids.tolist())
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
            self._table = torch.cat([self.ids.cpu(), extra])
        return self._table

    def weight(self) -> torch.Tensor:
        lm = self.target_ref[0].lm_head.weight
        if self.full:
            return lm
        if self._weight is None or self._weight.device != lm.device or self._weight.dtype != lm.dtype:
            self._weight = lm[self.ids.to(lm.device)].detach()
            self._packed = maybe_pack(self._weight)
        return self._weight

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """[..., H] pre-norm feature -> float32 logits over the drafting vocabulary [..., size]."""
        target = self.target_ref[0]
        if self.full:
            return target.logits(feature)
        h = target.final_norm(feature)
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
        self._weight = None
        self._packed = None
        self._frequent = None
        self.clear_context()
        return super()._load_from_state_dict(*args, **kwargs)
