"""The client side: the drafter, the protocol loop, and what to do while the link is down.

The loop (one request in flight at a time), for every method:

    send PREFILL, wait for the first token and the prompt's payload rows, drafter.begin()
    repeat until end of turn / budget:
        reply in?          -> drafter.accept(the verified tokens and their rows); reconcile provisional text
        idle, link up      -> draft a tree (empty for plain decoding) or, if provisional tokens are
                              waiting, send them as a chain; send VERIFY
        link down and MoA  -> draft offline: a greedy chain from the drafter's last state, accepted
                              provisionally (MoADrafter.extend_unverified) and shown to the user
        otherwise          -> wait (plain decoding and EAGLE-2 stall while the link is down)

Offline drafting (MoA only: its drafter reads target activations only at verified positions,
so it can go on without the server; EAGLE-2 needs the target's feature of every new token).
Each offline step drafts a chain of `depth` tokens (the tree drafter with top_k = 1) from
the last provisional token. The chain stops at the trained horizon (offline_horizon_for) or, before
it, where the drafter's own confidence in the whole provisional chain (the product of its
probabilities for each token given the ones before) falls below `offline_min_confidence`
(offline_confidence_for): text the drafter itself expects to be withdrawn is not shown.
When a reply comes in, the drafter rolls back to its verified
state and accepts the server's verdict; the provisional tokens are compared with the verified
ones: the agreeing prefix is confirmed, the first disagreement is replaced by the target's
token (a correction) and every provisional token after it is withdrawn. Provisional tokens
beyond the verified ones are re-applied (extend_unverified) and sent for verification as a
chain as soon as the link is up. The final text is therefore always the target's greedy text.

Timing and transport live in an `env` (core.client_server.sim.VirtualEnv: virtual clock;
core.client_server.loopback.LoopbackEnv: a real server process over 127.0.0.1). The client
only asks it the time, whether the link is up, to run a piece of compute, to send a message
and to wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from core.decoding import stop_rule
from core.drafters.base import Autoregressive, Drafter, Verified
from core.methods import METHODS as TABLE
from core.target import Target
from core.trees.draft_tree import DraftTree

from .protocol import METHODS, Prefill, Reply, Verify, row_width, token_bytes


class ReceivedLSA(nn.Module):
    """Stands in for MoA's LayerSelfAttention on the client: hands back the vectors the server sent.

    MoADrafter.accept() calls `self.lsa(layer_kv, need_weights=True)`; on the client that module
    is this one, loaded with the received rows just before the call, so the rest of the
    drafter (SA, CA memory, TLI caches) updates exactly as in one process. The layer-attention
    weights are not sent (they are for the app's LSA tab only): zeros come back instead.
    """

    def __init__(self, n_layers: int, dtype: torch.dtype, out_width: int) -> None:
        super().__init__()
        self.n_layers, self.dtype, self.out_width = n_layers, dtype, out_width
        self.pending: torch.Tensor | None = None

    def forward(self, kv: torch.Tensor, need_weights: bool = False,
                final: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        vec = self.pending  # the server's vectors (final feature included, where the drafter reads it)
        if vec is None or vec.shape[0] < kv.shape[0]:
            raise RuntimeError("ReceivedLSA: no vectors received for these tokens")
        self.pending = None
        vec = vec[vec.shape[0] - kv.shape[0]:]  # the drafter may ask only for the last ones (its CA window)
        att = torch.zeros(kv.shape[0], self.n_layers, self.n_layers) if need_weights else None
        return vec.to(device=kv.device, dtype=self.dtype), att


@contextmanager
def client_side(method: str, drafter: Drafter | None, target: Target) -> Iterator[tuple[Drafter, nn.Module | None]]:
    """Split a drafter for a client-server run: yields (client drafter, the server's LSA module or None).

    For MoA the drafter's LSA module moves to the server (the caller hands it to `Server`) and a
    ReceivedLSA takes its place; both are put back afterwards, so pooled drafters stay intact.
    """
    if method not in METHODS:
        raise ValueError(f"no client-server protocol for method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "ar":
        yield (drafter or Autoregressive()), None
        return
    if drafter is None:
        raise ValueError(f"method {method} needs a drafter")
    if method != "moa":
        yield drafter, None
        return
    lsa = drafter.lsa
    drafter.lsa = ReceivedLSA(target.n_layers, next(lsa.parameters()).dtype, lsa.out_width)
    try:
        yield drafter, lsa
    finally:
        drafter.lsa = lsa


@contextmanager
def chain_options(drafter: Drafter) -> Iterator[None]:
    """Temporarily make a tree drafter draft a single greedy chain of its usual depth (top_k = 1)."""
    cfg = drafter.config
    saved = (cfg.top_k, cfg.total_tokens)
    drafter.set_options(top_k=1, total_tokens=cfg.depth)
    try:
        yield
    finally:
        drafter.set_options(top_k=saved[0], total_tokens=saved[1])


def greedy_path(tree: DraftTree) -> list[int]:
    """Tokens along the drafter's most probable child at each level, from the root down."""
    return [tok for tok, _ in greedy_chain(tree)]


def greedy_chain(tree: DraftTree) -> list[tuple[int, float]]:
    """(token, the drafter's probability of it given its parent) along the most probable child at each level."""
    kids = tree.children()
    probs = tree.draft_probs.tolist()
    tokens = tree.tokens.tolist()
    out, row = [], 0
    while kids[row]:
        best = max(kids[row], key=lambda c: probs[c])
        out.append((int(tokens[best]), float(probs[best])))
        row = best + 1
    return out


# Default of offline_confidence_for: offline text is shown while the drafter gives the provisional chain at
# least this probability (docs/RESULTS.md, "MoA": the sweep that chose it).
OFFLINE_MIN_CONFIDENCE = 0.1


def offline_confidence_for(asked: float | None = None) -> float:
    """The confidence below which MoA stops drafting offline (a probability in [0, 1); 0 = never stop on it)."""
    if asked is None:
        return OFFLINE_MIN_CONFIDENCE
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not 0.0 <= float(asked) < 1.0:
        raise ValueError(f"offline_min_confidence must be a probability in [0, 1), got {asked!r}")
    return float(asked)


def offline_horizon_for(drafter: Drafter, asked: int | None = None) -> int:
    """How many tokens past the last verified one MoA may draft while the link is down.

    Default: the longest distance it was trained to predict at (`period_max`: in training a
    prediction sees target activations at most that many positions back); beyond it the chain
    is out of distribution and drifts. `asked` overrides it (0 = no offline drafting).
    """
    trained = int(getattr(getattr(drafter, "config", None), "period_max", 0) or 0)
    if asked is None:
        return trained
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 0:
        raise ValueError(f"offline_horizon must be a whole number of tokens >= 0, got {asked!r}")
    return asked


@dataclass
class Trace:
    """Every compute span and message of a run, in seconds from its start."""

    spans: list[dict] = field(default_factory=list)  # lane: client | uplink | server | downlink
    messages: list[dict] = field(default_factory=list)
    progress: list[dict] = field(default_factory=list)  # {t, verified, shown}
    snapshots: list[dict] = field(default_factory=list)  # what the user saw just before a verdict on provisional text

    def span(self, lane: str, kind: str, start: float, end: float, **info: Any) -> None:
        self.spans.append({"lane": lane, "kind": kind, "start": round(start, 6), "end": round(end, 6), **info})

    def to_dict(self) -> dict:
        return {"spans": self.spans, "messages": self.messages, "progress": self.progress,
                "snapshots": self.snapshots}


@dataclass
class RunResult:
    method: str
    mode: str  # virtual | loopback
    network: dict
    prompt_ids: list[int]
    token_ids: list[int]
    token_info: list[dict]  # per final token: status (verified | confirmed | corrected), t, withdrawn
    offline_tokens: int
    corrected_tokens: int
    confirmed_tokens: int
    virtual_time_s: float  # when the last token came (none: when the run ended); never past the time limit
    server_calls: int
    retransmissions: int
    bytes_up: int
    bytes_down: int
    stop_reason: str
    target_passes: int
    trace: Trace
    text: str = ""
    note: str = ""
    unverified: list[int] = field(default_factory=list)  # provisional tokens never verified (time limit)
    offline_horizon: int = 0  # most provisional tokens past the last verified one (MoA; 0 = none)
    offline_min_confidence: float = 0.0  # MoA stops offline where its confidence in the chain falls below this
    offline_stops: list[dict] = field(default_factory=list)  # where offline drafting stopped and why

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.virtual_time_s if self.virtual_time_s > 0 else 0.0

    def summary(self) -> dict:
        return {
            "method": self.method, "mode": self.mode, "network": self.network["name"],
            "disconnects": self.network["disconnects"], "token_ids": self.token_ids, "text": self.text,
            "new_tokens": len(self.token_ids), "offline_tokens": self.offline_tokens,
            "corrected_tokens": self.corrected_tokens, "confirmed_tokens": self.confirmed_tokens,
            "virtual_time_s": round(self.virtual_time_s, 4), "tokens_per_s": round(self.tokens_per_s, 3),
            "server_calls": self.server_calls, "retransmissions": self.retransmissions,
            "bytes_up": self.bytes_up, "bytes_down": self.bytes_down, "stop_reason": self.stop_reason,
            "target_passes": self.target_passes,
            "tau": round(len(self.token_ids) / max(1, self.target_passes), 4), "note": self.note,
            "offline_horizon": self.offline_horizon, "offline_min_confidence": self.offline_min_confidence,
            "offline_stops": self.offline_stops,
        }

    def to_dict(self) -> dict:
        return {**self.summary(), "network_model": self.network, "prompt_ids": self.prompt_ids,
                "token_info": self.token_info, "unverified": self.unverified, "trace": self.trace.to_dict()}


class Client:
    """One generation on the client. `env` provides time, the link and the transport (see module docstring)."""

    def __init__(self, method: str, drafter: Drafter, target: Target, env, prompt_ids: list[int],
                 max_new_tokens: int = 48, stop_tokens: set[int] | None = None, tli: int = 0,
                 offline_horizon: int | None = None, offline_min_confidence: float | None = None) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        self.method, self.drafter, self.target, self.env = method, drafter, target, env
        self.prompt = [int(t) for t in prompt_ids]
        self.max_new = int(max_new_tokens)
        self.stop = target.eos_token_ids if stop_tokens is None else set(stop_tokens)
        self.tli = tli
        self.wide = token_bytes(target.vocab_size) == 4
        self.offline_capable = TABLE[method].client_server == "offline" and hasattr(drafter, "extend_unverified")
        self.horizon = offline_horizon_for(drafter, offline_horizon) if self.offline_capable else 0
        self.min_confidence = offline_confidence_for(offline_min_confidence) if self.offline_capable else 0.0
        self.offline_stops: list[dict] = []
        self._stopped_at: tuple[int, int] | None = None  # (verified, provisional) at the last recorded stop
        self.lsa_width = getattr(getattr(drafter, "lsa", None), "out_width", target.hidden_size)
        self.width = row_width(method, target.hidden_size, 2 * target.kv_heads * target.head_dim, tli, self.lsa_width)
        self.root: int | None = None  # the target's last token, not yet run through it
        self.position = len(self.prompt)  # the root's position
        self.verified: list[int] = []
        self.info: list[dict] = []
        self.provisional: list[int] = []
        self.provisional_p: list[float] = []  # the drafter's probability of each provisional token
        self.unsure = False  # the last offline chain was cut where its confidence fell below min_confidence
        self.offline_tokens = self.corrected = self.confirmed = 0
        self.passes = 0
        self.seq = 0
        self.stop_reason = ""

    # ----- payload rows -> what the drafter's accept() reads ------------------------------------
    def _verified(self, tokens: list[int], bonus: int, start: int, rows: torch.Tensor | None,
                  tree: DraftTree | None = None, accepted: list[int] | None = None) -> Verified:
        t = self.target
        n = len(tokens)
        hidden, kv = {}, None
        if self.method == "eagle2":
            hidden = {t.n_layers: rows.to(t.dtype).to(t.device)}
        elif self.method == "moa":
            h = self.lsa_width
            kvw = 2 * t.kv_heads * t.head_dim
            self.drafter.lsa.pending = rows[:, :h]
            if self.tli:  # the true keys/values of the last N layers; the other layers are never read
                kv = torch.zeros(n, t.n_layers, kvw, dtype=t.dtype, device=t.device)
                kv[:, t.n_layers - self.tli:] = rows[:, h:].reshape(n, self.tli, kvw).to(t.dtype)
            else:
                kv = torch.zeros((), dtype=t.dtype, device=t.device).expand(n, t.n_layers, kvw)
        return Verified(tokens, bonus, start, hidden, kv, tree, accepted or [])

    # ----- the loop ----------------------------------------------------------------------------
    def run(self) -> dict:
        env = self.env
        pending = env.send(Prefill(self.method, self.prompt, self.tli, self._next_seq()))
        while not env.ready(pending):
            if env.time_exceeded():
                return self._finish("time_limit")
            env.wait(pending)
        if env.time_exceeded():  # the first reply came after the limit (a wait can jump straight past it)
            return self._finish("time_limit")
        reply: Reply = pending.reply
        self._check_rows(reply, len(self.prompt))
        self.passes += 1
        env.compute("absorb", lambda: self.drafter.begin(
            self.target, self._verified(self.prompt, reply.bonus, 0, reply.rows)), n=len(self.prompt))
        self.root, self.position = reply.bonus, len(self.prompt)
        if self._commit([reply.bonus], 0):
            return self._finish(self.stop_reason)
        pending = None
        while True:
            if env.time_exceeded():
                return self._finish("time_limit")
            if pending is not None and env.ready(pending):
                if self._apply(pending):
                    return self._finish(self.stop_reason)
                pending = None
                continue
            up = env.link_up()
            if pending is None and up:
                pending = self._request()
                continue
            if not up and self.offline_capable and self._can_draft_offline():
                self._draft_offline()
                continue
            env.wait(pending)

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _check_rows(self, reply: Reply, n: int) -> None:
        width = 0 if reply.rows is None else int(reply.rows.shape[1])
        if reply.n_rows not in (0, n) or (self.width and (reply.n_rows != n or width != self.width)):
            raise RuntimeError(f"the server sent {reply.n_rows} x {width} payload values for {n} tokens; "
                               f"expected {n} x {self.width}")

    def _request(self):
        """Draft (or take the waiting provisional chain) and send it."""
        env = self.env
        if self.provisional:
            chain = list(self.provisional)
            room = self.target.max_positions - self.position - 1
            msg = Verify(self._next_seq(), self.position, chain[:max(0, room)], None)
            tree = DraftTree.chain(msg.tokens)
        else:
            tree = DraftTree.empty()
            if self.method != "ar":
                tree = env.compute("draft", lambda: self.drafter.draft(self.root), passes=self._depth())
            if self.position + 1 + len(tree) > self.target.max_positions:
                tree = DraftTree.empty()
            msg = Verify(self._next_seq(), self.position, tree.tokens.tolist(), tree.parents.tolist())
        pending = env.send(msg)
        pending.tree = tree
        return pending

    def _depth(self) -> int:
        cfg = getattr(self.drafter, "config", None)
        return int(getattr(cfg, "depth", 1)) if cfg is not None else 0

    def _apply(self, pending) -> bool:
        """Take in a VERIFY reply; True when the generation is over."""
        reply: Reply = pending.reply
        tree: DraftTree = pending.tree
        toks = [self.root] + [int(tree.tokens[a]) for a in reply.accepted]
        self._check_rows(reply, len(toks))
        self.passes += 1
        shown_before = list(self.provisional)
        step = self._verified(toks, reply.bonus, self.position, reply.rows, tree, list(reply.accepted))

        def update() -> None:
            if self.offline_capable and self.drafter.n_unverified:
                self.drafter.rollback_unverified()
            self.drafter.accept(step)

        self.env.compute("absorb", update, n=len(toks))
        new = toks[1:] + [reply.bonus]
        if shown_before:
            self.env.trace.snapshots.append({"t": round(self.env.now(), 6), "verified": list(self.verified),
                                             "provisional": shown_before})
        self.root, self.position = reply.bonus, self.position + len(toks)
        done = self._commit(new, reply.seq)
        if self.provisional and not done:
            rest = list(self.provisional)
            self.env.compute("absorb", lambda: self.drafter.extend_unverified(rest), n=len(rest))
        return done

    def _commit(self, new: list[int], seq: int) -> bool:
        """Append verified tokens (cut by core.decoding.stop_rule), reconcile provisional ones; True when done."""
        new, reason = stop_rule(new, len(self.verified), self.max_new, self.stop,
                                self.position >= self.target.max_positions)
        prov = self.provisional
        k = 0
        while k < min(len(prov), len(new)) and prov[k] == new[k]:
            k += 1
        now = self.env.now()
        withdrawn: list[int] = []
        if k < len(prov) and k < len(new):  # the first disagreement: corrected, the rest withdrawn
            withdrawn = prov[k:]
            self.provisional = []
        else:
            self.provisional = prov[len(new):]
        if reason and self.provisional:  # cannot happen (offline drafting stops at a stop token or the budget)
            withdrawn, self.provisional = self.provisional, []
        self.provisional_p = self.provisional_p[len(prov) - len(self.provisional):]
        self.unsure = False  # a new verified state: the chain left is judged afresh
        self.confirmed += k
        self.corrected += len(withdrawn)
        for i in range(len(new)):
            status = "confirmed" if i < k else ("corrected" if i == k and withdrawn else "verified")
            entry = {"status": status, "t": round(now, 6), "seq": seq}
            if status == "corrected":
                entry["withdrawn"] = withdrawn
            self.info.append(entry)
        self.verified += new
        self._progress()
        if reason:
            self.stop_reason = reason
        return bool(reason)

    def _progress(self) -> None:
        n = len(self.verified)
        self.env.trace.progress.append({"t": round(self.env.now(), 6), "verified": n,
                                        "shown": n + len(self.provisional)})

    # ----- offline drafting (MoA) --------------------------------------------------------------
    def _can_draft_offline(self) -> bool:
        reason = ""
        if len(self.provisional) >= self.horizon:
            reason = "horizon"  # as far past the last verified token as the drafter was trained to look
        elif self.unsure:
            reason = "confidence"  # the drafter itself expects what it would write next to be withdrawn
        elif self.provisional and self.provisional[-1] in self.stop:
            reason = "end_of_turn"
        elif len(self.verified) + len(self.provisional) >= self.max_new:
            reason = "max_new_tokens"
        elif self.position + len(self.provisional) + self._depth() + 2 > self.target.max_positions:
            reason = "context"
        where = (len(self.verified), len(self.provisional))
        if reason and self._stopped_at != where and self.horizon:
            self._stopped_at = where
            self.offline_stops.append({"t": round(self.env.now(), 6), "reason": reason,
                                       "provisional": len(self.provisional), "verified": len(self.verified)})
        return not reason

    def _draft_offline(self) -> None:
        root = self.provisional[-1] if self.provisional else self.root
        room = min(self.max_new - len(self.verified), self.horizon) - len(self.provisional)
        drafter = self.drafter

        def step() -> list[tuple[int, float]]:
            with chain_options(drafter):
                drafted = greedy_chain(drafter.draft(root))[:room]
            chain, confidence = [], 1.0
            for p in self.provisional_p:
                confidence *= p
            for tok, p in drafted:
                confidence *= p
                if confidence < self.min_confidence:
                    self.unsure = True
                    break
                chain.append((tok, p))
                if tok in self.stop:
                    break
            if chain:
                drafter.extend_unverified([tok for tok, _ in chain])
            return chain

        drafted = self.env.compute("offline", step, passes=self._depth(), n=self._depth())
        if not drafted:  # too unsure to write even one token; else cannot happen: do not spin
            if not self.unsure:
                self.env.wait(None)
            return
        chain = [tok for tok, _ in drafted]
        self.provisional += chain
        self.provisional_p += [p for _, p in drafted]
        self.offline_tokens += len(chain)
        self._progress()

    # ----- the end -----------------------------------------------------------------------------
    def _finish(self, reason: str) -> dict:
        self.stop_reason = reason
        return {"token_ids": list(self.verified), "token_info": self.info, "offline_tokens": self.offline_tokens,
                "corrected_tokens": self.corrected, "confirmed_tokens": self.confirmed,
                "stop_reason": reason, "target_passes": self.passes, "unverified": list(self.provisional),
                "offline_horizon": self.horizon, "offline_min_confidence": self.min_confidence,
                "offline_stops": self.offline_stops}
