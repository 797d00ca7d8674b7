"""The server side: the target, its KV cache, and the verification of whatever the client sends.

One `Server` holds one session (one client, one generation). It answers the protocol's
requests (core.client_server.protocol):

    PREFILL  run the prompt, keep it in the KV cache, reply with the first token and one
             payload row per prompt token
    VERIFY   run [root] + the draft tree (or provisional chain) in one pass under the tree mask,
             verify greedily (core.verify.verify_tree), keep root + the accepted path in the
             cache (KVCache.keep), reply with the accepted nodes, the target's own next token
             and one payload row per verified token

This is the decode loop of core.decoding.generate_stream cut in half at the network: the
same target pass, the same verification and cache bookkeeping, only the drafter is elsewhere.
For MoA the server also runs the drafter's Layer Self-Attention (its weights are part of the
drafter checkpoint), because its input, every target layer's keys and values (30 x 384 values
per token), stays here; only the projected vector travels.

Greedy only: the client-server runs compare against plain greedy decoding token for token.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from core.drafters.base import TargetNeeds, select_rows
from core.target import Target
from core.trees.draft_tree import DraftTree
from core.verify import SamplingConfig, verify_tree

from .protocol import PREFILL_REPLY, VERIFY_REPLY, Prefill, Reply, Verify, row_width


class ProtocolError(ValueError):
    """A request the server cannot serve (no session, stale position, wrong method, a token id outside the
    vocabulary); the loopback server answers it with status 400 and stays up."""


def module_hash(module: nn.Module | None) -> str:
    """A short hash of a module's weights: client and server check they hold the same LSA."""
    if module is None:
        return ""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class Server:
    """Target-side state of one client session. `lsa`: the MoA drafter's LayerSelfAttention module."""

    def __init__(self, target: Target, lsa: nn.Module | None = None) -> None:
        self.target = target
        self.lsa = lsa
        self.method: str | None = None
        self.tli = 0
        self.cache = None
        self.root: int | None = None
        self.calls = 0
        self.greedy = SamplingConfig()

    @property
    def position(self) -> int:
        """Position of the current root = tokens in the KV cache."""
        return self.cache.length if self.cache is not None else 0

    def _needs(self) -> TargetNeeds:
        if self.method == "eagle2":
            return TargetNeeds(hidden_layers=(self.target.n_layers,))
        if self.method == "moa":  # an LSA that reads the final feature (MoAConfig.final_feature) gets it too
            final = (self.target.n_layers,) if getattr(self.lsa, "reads_final", False) else ()
            return TargetNeeds(hidden_layers=final, layer_kv=True)
        return TargetNeeds()

    def _rows(self, hidden: dict[int, torch.Tensor], kv: torch.Tensor | None) -> torch.Tensor | None:
        """One payload row per verified token (see the protocol's docstring)."""
        if self.method == "eagle2":
            return hidden[self.target.n_layers].to(torch.bfloat16)
        if self.method == "moa":
            with torch.no_grad():
                vec, _ = self.lsa(kv, final=hidden.get(self.target.n_layers))
            parts = [vec]
            if self.tli:
                big_l = self.target.n_layers
                parts.append(kv[:, big_l - self.tli:].reshape(kv.shape[0], -1).to(vec.dtype))
            return torch.cat(parts, dim=-1).to(torch.bfloat16)
        return None

    def row_width(self) -> int:
        t = self.target
        return row_width(self.method or "ar", t.hidden_size, 2 * t.kv_heads * t.head_dim, self.tli,
                         getattr(self.lsa, "out_width", None))

    @torch.no_grad()
    def handle(self, msg: Prefill | Verify) -> Reply:
        self.calls += 1
        if isinstance(msg, Prefill):
            return self._prefill(msg)
        if isinstance(msg, Verify):
            return self._verify(msg)
        raise ProtocolError(f"the server does not take {type(msg).__name__} messages")

    def _check_tokens(self, tokens: list[int], what: str) -> None:
        """Every id a token of the target's vocabulary (the wire format itself allows up to 2**16 or 2**32)."""
        vocab = self.target.vocab_size
        bad = next((i for i in tokens if not 0 <= i < vocab), None)
        if bad is not None:
            raise ProtocolError(f"{what} token id {bad} is outside the vocabulary: ids run from 0 to {vocab - 1}")

    def _prefill(self, msg: Prefill) -> Reply:
        t = self.target
        if msg.method == "moa" and self.lsa is None:
            raise ProtocolError("this server has no MoA drafter (LSA) loaded")
        if not msg.prompt:
            raise ProtocolError("empty prompt")
        self._check_tokens(msg.prompt, "prompt")
        if msg.method == "moa" and not 0 <= msg.tli <= t.n_layers:
            raise ProtocolError(f"TLI {msg.tli} is more target layers than the target has ({t.n_layers})")
        if len(msg.prompt) >= t.max_positions:
            raise ProtocolError(f"the prompt has {len(msg.prompt)} tokens; the context holds {t.max_positions}")
        self.method, self.tli = msg.method, msg.tli
        needs = self._needs()
        ids = torch.tensor(msg.prompt, dtype=torch.long, device=t.device)
        self.cache = t.new_cache(capacity=len(msg.prompt) + 256)
        out = t.forward(ids, cache=self.cache, hidden_layers=needs.hidden_layers, return_layer_kv=needs.layer_kv)
        first = int(out.logits[0, -1].argmax())
        hidden, kv = select_rows(out, torch.arange(len(msg.prompt), device=t.device))
        self.root = first
        return Reply(PREFILL_REPLY, msg.seq, 0, [], first, self._rows(hidden, kv))

    def _verify(self, msg: Verify) -> Reply:
        t = self.target
        if self.cache is None:
            raise ProtocolError("verify before prefill: no session")
        past = self.cache.length
        if msg.position != past:
            raise ProtocolError(f"the request drafts from position {msg.position} but the verified root is at {past}")
        if past + 1 + len(msg.tokens) > t.max_positions:
            raise ProtocolError("the draft runs past the model's context")
        self._check_tokens(msg.tokens, "draft")
        n = len(msg.tokens)
        tokens = torch.tensor(msg.tokens, dtype=torch.long)
        parents = torch.arange(n) - 1 if msg.parents is None else torch.tensor(msg.parents, dtype=torch.long)
        tree = DraftTree(tokens, parents, torch.ones(n))
        needs = self._needs()
        dev = t.device
        ids = torch.cat([torch.tensor([self.root]), tree.tokens]).to(dev)
        positions = past + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths()]).to(dev)
        mask = tree.attention_mask().to(dev) if n else None
        out = t.forward(ids, positions, self.cache, tree_mask=mask, hidden_layers=needs.hidden_layers,
                        return_layer_kv=needs.layer_kv)
        accepted, bonus = verify_tree(tree, out.logits[0], self.greedy)
        kept = torch.tensor([0] + [a + 1 for a in accepted], dtype=torch.long, device=dev)
        self.cache.keep(past, kept)
        hidden, kv = select_rows(out, kept)
        self.root = bonus
        return Reply(VERIFY_REPLY, msg.seq, past, accepted, bonus, self._rows(hidden, kv), chain=msg.parents is None)
