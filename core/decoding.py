"""The decode loop shared by every method: draft, verify, accept, update caches (docs/ARCHITECTURE.md, "Decode loop").

    prefill the prompt                      -> first token (the first root)
    repeat:
        tree   = drafter.draft(root)         tokens hanging off the root
        logits = target([root] + tree)       one pass, tree attention mask
        path, bonus = verify(tree, logits)   greedy or lossless sampling
        keep root + path in the KV cache, drop the rejected branches
        emit path tokens + bonus;  root = bonus

Plain decoding is the drafter that proposes an empty tree. Each pass yields a
`StepEvent`; with `record=True` the events also carry what the app and the
failure analysis need (target probabilities and top-10 at every drafted node).
Steps count target forward passes, the prefill included, so
tau = new tokens / steps (plain decoding: exactly 1.0). The last event says why
generation stopped (`stop_rule`, the one place that decides it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from core.drafters.base import Drafter, Verified, select_rows
from core.kv_cache import KVCache
from core.static_pass import acquire, release, resolve_pass_mode
from core.target import Target
from core.trees.draft_tree import DraftTree
from core.verify import SamplingConfig, sample, target_probs, verify_tree

MAX_NEW_TOKENS_LIMIT = 4096
TOP_K_RECORDED = 10


@dataclass
class StepEvent:
    """One target forward pass and what came of it."""

    step: int  # 0 = the prefill
    new_tokens: list[int]  # tokens appended by this step (accepted drafts, then the bonus)
    accepted: list[int]  # accepted node indices of the tree
    bonus: int
    draft_time: float  # seconds in the drafter (draft + state update)
    verify_time: float  # seconds in the target pass, verification and cache bookkeeping
    tree: DraftTree = field(default_factory=DraftTree.empty)
    position: int = 0  # position of the root token
    # Filled only when recording:
    node_target_prob: list[float] | None = None  # p_target(node token | its parent's context)
    row_entropy: list[float] | None = None  # target entropy at [root, nodes...]
    row_top: list[list[tuple[int, float]]] | None = None  # target top-10 at [root, nodes...]
    extras: dict = field(default_factory=dict)
    stop_reason: str | None = None  # set on the last event: "eos", "max_new_tokens" or "context" (stop_rule)

    @property
    def accepted_len(self) -> int:
        return len(self.accepted)

    def to_dict(self) -> dict:
        d = {
            "step": self.step, "new_tokens": self.new_tokens, "accepted": self.accepted, "bonus": self.bonus,
            "draft_time": round(self.draft_time, 6), "verify_time": round(self.verify_time, 6),
            "position": self.position, "tree": self.tree.to_dict(),
            "depths": self.tree.depths().tolist(),
        }
        if self.node_target_prob is not None:
            d["node_target_prob"] = [_sig(p) for p in self.node_target_prob]
            d["row_entropy"] = [round(e, 4) for e in self.row_entropy]
            d["row_top"] = [[[t, _sig(p)] for t, p in row] for row in self.row_top]
        if self.extras:
            d["extras"] = {k: _jsonable(v) for k, v in self.extras.items()}
        return d


def _sig(x: float) -> float:
    """Four significant digits: small probabilities of rejected drafts stay visible."""
    return float(f"{x:.4g}")


def _jsonable(v):
    if isinstance(v, torch.Tensor):
        return [round(x, 5) for x in v.float().flatten().tolist()] if v.dim() == 0 else \
            torch.round(v.float() * 1e4).div(1e4).tolist()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    steps: int
    wall_time: float
    events: list[StepEvent]
    stop_reason: str

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def mean_accepted(self) -> float:
        return self.new_tokens / max(1, self.steps)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def accept_lengths(self) -> list[int]:
        return [len(e.new_tokens) for e in self.events]

    def summary(self) -> dict:
        return {
            "text": self.text, "token_ids": self.token_ids, "new_tokens": self.new_tokens, "steps": self.steps,
            "mean_accepted": round(self.mean_accepted, 4), "wall_time": round(self.wall_time, 4),
            "tokens_per_s": round(self.tokens_per_s, 3), "stop_reason": self.stop_reason,
            "accept_lengths": self.accept_lengths,
            "draft_time": round(sum(e.draft_time for e in self.events), 4),
            "verify_time": round(sum(e.verify_time for e in self.events), 4),
        }

    def trace(self) -> dict:
        return {**self.summary(), "events": [e.to_dict() for e in self.events]}


def validate_request(target: Target, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: give the model something to answer")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise ValueError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {max_new_tokens}")
    if len(prompt_ids) >= target.max_positions:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens but the model's context holds "
                         f"{target.max_positions}; shorten it")
    bad = [t for t in prompt_ids if not 0 <= int(t) < target.vocab_size]
    if bad:
        raise ValueError(f"token ids out of the vocabulary (size {target.vocab_size}): {bad[:5]}")


def stop_rule(new: list[int], n_out: int, max_new_tokens: int, stop: set[int] | frozenset[int],
              context_full: bool) -> tuple[list[int], str | None]:
    """The stop rules, in order: end of turn, budget, context. Returns the step's tokens cut where generation
    ends, and why it ends ("eos", "max_new_tokens", "context"), or None while it goes on.

    `new`: the tokens this step would append; `n_out`: tokens appended before it; `context_full`: the KV cache
    holds the model's whole context.
    """
    reason = None
    for i, tok in enumerate(new):
        if tok in stop:
            new, reason = new[: i + 1], "eos"
            break
    if n_out + len(new) >= max_new_tokens:
        new, reason = new[: max_new_tokens - n_out], reason or "max_new_tokens"
    if context_full:
        reason = reason or "context"
    return new, reason


def _record(event: StepEvent, logits: torch.Tensor, cfg: SamplingConfig) -> None:
    """Fill the recorded fields from the pass's logits [n+1, V] (only when recording)."""
    probs = torch.softmax(logits.float(), dim=-1) if cfg.greedy else target_probs(logits, cfg)
    tree = event.tree
    rows = tree.parents + 1
    event.node_target_prob = probs[rows, tree.tokens].tolist() if len(tree) else []
    logp = torch.log(probs.clamp_min(1e-30))
    event.row_entropy = (-(probs * logp).sum(-1)).tolist()
    top_p, top_i = probs.topk(TOP_K_RECORDED, dim=-1)
    event.row_top = [list(zip(i.tolist(), p.tolist())) for i, p in zip(top_i, top_p)]


def generate_stream(
    target: Target,
    drafter: Drafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 256,
    sampling: SamplingConfig | None = None,
    record: bool = False,
    hooks: Sequence[Callable[[StepEvent], None]] = (),
    stop_tokens: set[int] | None = None,
) -> Iterator[StepEvent]:
    """Generate with `drafter`, yielding one StepEvent per target forward pass."""
    sampling = sampling or SamplingConfig()
    validate_request(target, prompt_ids, max_new_tokens)
    drafter.check_target(target)
    stop = target.eos_token_ids if stop_tokens is None else stop_tokens
    gen = None
    if not sampling.greedy:
        gen = torch.Generator(device=target.device)
        gen.manual_seed(sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**31, ())))
    needs = drafter.needs
    capacity = len(prompt_ids) + max_new_tokens + 64
    passes = None  # the verify passes on fixed buffers, captured on a GPU (core.static_pass; Target.pass_mode)
    if resolve_pass_mode(target.pass_mode, target.device) != "eager":
        passes = acquire(target, target.pass_mode, capacity)
    cache = passes.cache if passes is not None else target.new_cache(capacity=capacity)

    def verify_pass(ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None):
        if passes is not None:
            return passes(ids, positions, mask, needs.hidden_layers, needs.layer_kv)
        return target.forward(ids, positions, cache, tree_mask=mask, hidden_layers=needs.hidden_layers,
                              return_layer_kv=needs.layer_kv)

    try:
        yield from _cycles(target, drafter, prompt_ids, max_new_tokens, sampling, record, hooks, stop, gen, cache,
                           verify_pass)
    finally:
        if passes is not None:
            release(passes)


def _cycles(target: Target, drafter: Drafter, prompt_ids: Sequence[int], max_new_tokens: int,
            sampling: SamplingConfig, record: bool, hooks: Sequence[Callable[[StepEvent], None]],
            stop: set[int] | frozenset[int], gen: torch.Generator | None, cache: KVCache,
            verify_pass: Callable) -> Iterator[StepEvent]:
    """generate_stream's prefill and cycles, over its cache and its verify pass (eager or on fixed buffers)."""
    needs = drafter.needs
    dev = target.device
    prompt = torch.tensor(list(prompt_ids), dtype=torch.long, device=dev)

    # Prefill: the first token comes from the prompt's last position.
    t0 = time.perf_counter()
    out = target.forward(prompt, cache=cache, hidden_layers=needs.hidden_layers, return_layer_kv=needs.layer_kv)
    first = sample(target_probs(out.logits[0, -1], sampling), gen, sampling.greedy)
    t1 = time.perf_counter()
    hidden, kv = select_rows(out, torch.arange(len(prompt_ids), device=dev))
    drafter.begin(target, Verified(list(prompt_ids), first, 0, hidden, kv))
    t2 = time.perf_counter()
    new, reason = stop_rule([first], 0, max_new_tokens, stop, cache.length >= target.max_positions)
    event = StepEvent(0, new, [], first, t2 - t1, t1 - t0, position=len(prompt_ids) - 1, stop_reason=reason)
    if record:
        _record(event, out.logits[0, -1:], sampling)
    n_out = len(new)
    for h in hooks:
        h(event)
    yield event
    if reason:
        return

    root = first
    step = 0
    observe = getattr(drafter, "observe", None)  # Drafter.observe; duck-typed drafters may lack it
    while True:
        step += 1
        past = cache.length  # position of the root
        t0 = time.perf_counter()
        tree = drafter.draft(root)
        if past + 1 + len(tree) > target.max_positions:
            tree = DraftTree.empty(dev)  # no room for drafts: a plain step
        t1 = time.perf_counter()
        ids = torch.cat([torch.tensor([root], device=dev), tree.tokens.to(dev)])
        positions = past + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths()]).to(dev)
        mask = tree.attention_mask().to(dev) if len(tree) else None
        out = verify_pass(ids, positions, mask)
        logits = out.logits[0]
        accepted, bonus = verify_tree(tree, logits, sampling, gen)
        kept = torch.tensor([0] + [a + 1 for a in accepted], dtype=torch.long, device=dev)
        cache.keep(past, kept)
        t2 = time.perf_counter()
        hidden, kv = select_rows(out, kept)
        toks = [root] + [int(tree.tokens[a]) for a in accepted]
        drafter.accept(Verified(toks, bonus, past, hidden, kv, tree, accepted))
        t3 = time.perf_counter()

        new, reason = stop_rule(toks[1:] + [bonus], n_out, max_new_tokens, stop,
                                cache.length >= target.max_positions)
        n_out += len(new)
        event = StepEvent(step, new, accepted, bonus, (t1 - t0) + (t3 - t2), t2 - t1, tree, past,
                          extras=tree.extras, stop_reason=reason)
        if observe is not None:
            observe(event)  # an auto tree calibrates itself from measured cycles
        if record:
            _record(event, logits, sampling)
        for h in hooks:
            h(event)
        yield event
        if reason:
            return
        root = bonus


def generate(
    target: Target,
    drafter: Drafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 256,
    sampling: SamplingConfig | None = None,
    record: bool = False,
    hooks: Sequence[Callable[[StepEvent], None]] = (),
    stop_tokens: set[int] | None = None,
) -> GenerationResult:
    """Run `generate_stream` to the end and collect the result (the stop reason is the last event's)."""
    events: list[StepEvent] = []
    tokens: list[int] = []
    t0 = time.perf_counter()
    for ev in generate_stream(target, drafter, prompt_ids, max_new_tokens, sampling, record, hooks, stop_tokens):
        events.append(ev)
        tokens.extend(ev.new_tokens)
    wall = time.perf_counter() - t0
    text = target.decode(tokens) if target.tokenizer is not None else ""
    return GenerationResult(tokens, text, len(events), wall, events, events[-1].stop_reason)
