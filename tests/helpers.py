"""Shared checks for every drafter's tests: losslessness under greedy and sampled decoding."""

from __future__ import annotations

from collections.abc import Callable

import torch
from scipy import stats

from core.decoding import generate
from core.drafters.base import Autoregressive, Drafter
from core.target import Target
from core.verify import SamplingConfig, target_probs

# False-alarm rate of every distribution test: the probability that a correct
# (lossless) decoder fails the test by chance. With the seeds fixed the tests are
# deterministic; this is the rate at which a new seed would fail a correct decoder.
ALPHA = 1e-3


def assert_greedy_lossless(target: Target, make_drafter: Callable[[], Drafter], prompts: list[list[int]],
                           max_new_tokens: int = 24, stop_tokens: set[int] | None = None) -> list[float]:
    """Greedy speculative output equals plain greedy output token for token. Returns tau per prompt."""
    taus = []
    for prompt in prompts:
        plain = generate(target, Autoregressive(), prompt, max_new_tokens, stop_tokens=stop_tokens)
        spec = generate(target, make_drafter(), prompt, max_new_tokens, stop_tokens=stop_tokens)
        assert spec.token_ids == plain.token_ids, (
            f"speculative output differs from plain greedy for prompt {prompt[:8]}...:\n"
            f"  plain {plain.token_ids}\n  spec  {spec.token_ids}")
        assert spec.steps <= plain.steps
        taus.append(spec.mean_accepted)
    return taus


def exact_sequence_distribution(target: Target, prompt: list[int], n_tokens: int,
                                sampling: SamplingConfig) -> dict[tuple[int, ...], float]:
    """P(x_1..x_n | prompt) under the target's sampling distribution, by enumeration (tiny vocab only)."""
    dist: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n_tokens):
        nxt = {}
        for seq, p in dist.items():
            if p < 1e-9:
                continue
            ids = torch.tensor(prompt + list(seq))
            probs = target_probs(target.forward(ids).logits[0, -1], sampling)
            for tok in torch.nonzero(probs > 0).flatten().tolist():
                nxt[seq + (tok,)] = p * float(probs[tok])
        dist = nxt
    return dist


def sampling_p_value(target: Target, make_drafter: Callable[[], Drafter], prompt: list[int],
                     n_tokens: int = 2, samples: int = 2000, temperature: float = 1.0, top_p: float = 1.0,
                     seed: int = 0) -> float:
    """Chi-square goodness-of-fit p-value of sampled n-token continuations against the exact target law.

    Cells with an expected count under 5 are pooled into one cell, as the test requires.
    """
    cfg = SamplingConfig(temperature, top_p)
    exact = exact_sequence_distribution(target, prompt, n_tokens, cfg)
    counts: dict[tuple[int, ...], int] = {}
    for i in range(samples):
        run = SamplingConfig(temperature, top_p, seed=seed * 100003 + i)
        out = generate(target, make_drafter(), prompt, n_tokens, run, stop_tokens=set())
        key = tuple(out.token_ids[:n_tokens])
        counts[key] = counts.get(key, 0) + 1
    observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
    for seq in set(exact) | set(counts):
        e = exact.get(seq, 0.0) * samples
        o = counts.get(seq, 0)
        if e >= 5:
            observed.append(o)
            expected.append(e)
        else:
            pooled_obs += o
            pooled_exp += e
    if pooled_exp > 0 or pooled_obs > 0:
        observed.append(pooled_obs)
        expected.append(max(pooled_exp, 1e-9))
    total_e = sum(expected)
    expected = [e * samples / total_e for e in expected]
    return float(stats.chisquare(observed, expected).pvalue)


def brute_force_tree_logits(target: Target, prefix: list[int], root: int, tokens: list[int],
                            parents: list[int]) -> torch.Tensor:
    """Logits at [root, nodes...] computed one chain at a time (no tree mask): the reference for tree passes."""
    rows = []
    ids = torch.tensor(prefix + [root])
    rows.append(target.forward(ids).logits[0, -1])
    for i in range(len(tokens)):
        path, node = [], i
        while node >= 0:
            path.append(tokens[node])
            node = parents[node]
        ids = torch.tensor(prefix + [root] + path[::-1])
        rows.append(target.forward(ids).logits[0, -1])
    return torch.stack(rows)


def tiny_prompts(vocab: int, n: int = 4, length: int = 6, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (length,), generator=g).tolist() for _ in range(n)]


__all__ = ["ALPHA", "assert_greedy_lossless", "sampling_p_value", "brute_force_tree_logits", "tiny_prompts",
           "exact_sequence_distribution"]
