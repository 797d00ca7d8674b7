"""A reduced drafting vocabulary: the drafter's output layer over the V' most frequent tokens only.

Why: on a CPU the drafter's cost is dominated by its vocabulary projection (the
target's tied 49,152 x 576 LM head is read once per tree level: about 9 ms of a
55 ms target step). Projecting onto the V' tokens that actually occur in the
self-distilled answers (8,192 cover about 98% of them) cuts that cost by V/V',
for drafting and for training alike. Tokens outside V' can simply never be
drafted; verification is unchanged, so decoding stays lossless. This is a
documented deviation shared by every trained drafter here (EAGLE-3 introduced
the same idea for GPUs); `size = 0` keeps the full vocabulary, as the papers do.

The chosen token ids live in the drafter's state dict (a buffer), so a checkpoint
carries its own vocabulary; the projection rows are gathered from the frozen
target LM head and never stored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch

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

    With no subset (`ids` empty) it is exactly `target.logits`.
    """

    def __init__(self, target: Target, size: int) -> None:
        super().__init__()
        self.target_ref = [target]  # a list, so the target is not registered as a submodule
        self.register_buffer("ids", torch.arange(size, dtype=torch.long) if size else torch.zeros(0, dtype=torch.long))
        self._weight: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.ids.numel() or self.target_ref[0].vocab_size

    @property
    def full(self) -> bool:
        return self.ids.numel() == 0

    def set_ids(self, ids: torch.Tensor) -> None:
        if ids.numel() != self.ids.numel():
            raise ValueError(f"vocabulary has {self.ids.numel()} slots, got {ids.numel()} ids")
        self.ids.copy_(ids.to(self.ids.device))
        self._weight = None

    def weight(self) -> torch.Tensor:
        lm = self.target_ref[0].lm_head.weight
        if self.full:
            return lm
        if self._weight is None or self._weight.device != lm.device or self._weight.dtype != lm.dtype:
            self._weight = lm[self.ids.to(lm.device)].detach()
        return self._weight

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """[..., H] pre-norm feature -> float32 logits over the drafting vocabulary [..., size]."""
        target = self.target_ref[0]
        h = target.norm(feature)
        return torch.nn.functional.linear(h, self.weight().to(h.dtype)).float()

    def to_token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Subset indices -> token ids."""
        return index if self.full else self.ids.to(index.device)[index]

    def to_index(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token ids -> subset indices, -1 where the token is outside the drafting vocabulary."""
        if self.full:
            return token_ids
        lookup = torch.full((self.target_ref[0].vocab_size,), -1, dtype=torch.long, device=token_ids.device)
        lookup[self.ids.to(token_ids.device)] = torch.arange(self.ids.numel(), device=token_ids.device)
        return lookup[token_ids]

    def _load_from_state_dict(self, *args, **kwargs):  # the cached projection follows the loaded ids
        self._weight = None
        return super()._load_from_state_dict(*args, **kwargs)
