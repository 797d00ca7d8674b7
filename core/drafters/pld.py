"""Prompt-lookup decoding (PLD): a training-free drafter, Spec-Bench's "PLD" baseline.

The last few tokens of the context (prompt + everything generated + the root)
are looked up earlier in the context; the tokens that followed the most recent
match become a draft chain. It shines when the answer repeats the prompt
(summaries, code edits, retrieval-augmented answers) and proposes nothing otherwise.
Draft probabilities are reported as 1.0: a lookup has no distribution, so the
verifier treats the chain as deterministic (see core.verify).
"""

from __future__ import annotations

import torch

from core.drafters.base import Drafter
from core.trees.draft_tree import DraftTree


class PromptLookupDrafter(Drafter):
    name = "pld"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_draft_tokens: int = 10) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be positive, got {num_draft_tokens}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_draft_tokens = num_draft_tokens

    def draft(self, root: int) -> DraftTree:
        ctx = self.context + [root]
        n_ctx = len(ctx)
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            suffix = ctx[n_ctx - n:]
            # most recent earlier occurrence whose continuation is non-empty
            for start in range(n_ctx - n - 1, -1, -1):
                if ctx[start:start + n] == suffix:
                    follow = ctx[start + n:start + n + self.num_draft_tokens]
                    if follow:
                        return DraftTree.chain(torch.tensor(follow))
        return DraftTree.empty()
