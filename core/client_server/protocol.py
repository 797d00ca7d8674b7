"""The wire format between client and server: four binary messages, sized by what each method needs.

    client -> server   PREFILL         the prompt's token ids, the method (and MoA's TLI N)
    server -> client   PREFILL_REPLY   the first token + one payload row per prompt token
    client -> server   VERIFY          a draft tree (tokens + parents) or a chain, off the current root
    server -> client   VERIFY_REPLY    accepted node indices (none for a chain: a count), the target's own
                                       next token (bonus / correction), one payload row per verified token

Every message starts with a 12-byte header: kind (u8), flags (u8), extra (u16: method code
and TLI N in PREFILL), sequence number (u32), root position (u32). Little-endian throughout.

Token ids take 2 bytes (u16) when the vocabulary fits (SmolLM2's 49,152 does), else 4 (u32):
the flag TOK32 says which. Tree parents are u16 (index + 1, 0 = the root); a chain sends none.

Payload rows, one per verified token (the root and the accepted drafts; every prompt token
in the prefill), bfloat16, depend on the method (docs/ARCHITECTURE.md, "Client-server"):
    ar      nothing: plain decoding over an API only needs the next token
    eagle2  the target's last hidden state (the feature EAGLE-2 fuses with the next token): H values
    moa     the projected LSA vector (LSA runs on the server, where the per-layer keys/values are;
            the client never sees the 30 x 384 values per token): H values (2H for a drafter with
            final_feature: its projected final feature too), plus for TLI N > 0 the keys/values of the
            last N target layers (N x 2 x kv_heads x head_dim values)
With SmolLM2 (H = 576) a row is 1,152 bytes for EAGLE-2 and MoA (N = 0).

`encode(msg)` gives the exact bytes sent; traces count len(encode(msg)). The network model
adds per-packet transport headers to the timing only (core.client_server.network).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import torch

from core.methods import METHODS as TABLE
from core.methods import methods_where

PREFILL, PREFILL_REPLY, VERIFY, VERIFY_REPLY = 1, 2, 3, 4
KIND_NAMES = {PREFILL: "prefill", PREFILL_REPLY: "prefill_reply", VERIFY: "verify", VERIFY_REPLY: "verify_reply"}
FLAG_TOK32 = 1
FLAG_CHAIN = 2
HEADER = struct.Struct("<BBHII")  # kind, flags, extra, seq, position
METHODS = tuple(methods_where(client_server=True))  # the methods with a client-server role, in table order
METHOD_CODE = {m: i for i, m in enumerate(METHODS)}  # on the wire: the table's order is the protocol's
MAX_TREE_NODES = 65535


def token_bytes(vocab_size: int) -> int:
    return 2 if vocab_size <= 65536 else 4


def row_width(method: str, hidden_size: int, kv_width: int, tli: int = 0, lsa_width: int | None = None) -> int:
    """Values (bfloat16) per verified token that `method` needs from the server (lsa_width: MoA's LSA output,
    H, or 2H for a drafter with final_feature)."""
    role = TABLE[method].client_server if method in TABLE else ""
    if role == "api":
        return 0
    if role == "features":
        return hidden_size
    if role == "offline":
        return (lsa_width or hidden_size) + tli * kv_width
    raise ValueError(f"no client-server protocol for method {method!r}; choose one of {', '.join(METHODS)}")


@dataclass
class Prefill:
    method: str
    prompt: list[int]
    tli: int = 0
    seq: int = 0


@dataclass
class Verify:
    seq: int
    position: int  # the root's position (the server checks it: a stale or repeated request is refused)
    tokens: list[int]
    parents: list[int] | None = None  # None: a chain (node i's parent is i - 1)


@dataclass
class Reply:
    """PREFILL_REPLY (accepted = [], rows for every prompt token) or VERIFY_REPLY."""

    kind: int
    seq: int
    position: int
    accepted: list[int]
    bonus: int
    rows: torch.Tensor | None = None  # [n, width] bfloat16
    chain: bool = False
    extra: dict = field(default_factory=dict)  # not sent: server-side timing for traces

    @property
    def n_rows(self) -> int:
        return 0 if self.rows is None else int(self.rows.shape[0])


Message = Prefill | Verify | Reply


def _tok_fmt(wide: bool) -> str:
    return "<u4" if wide else "<u2"


def _pack_tokens(tokens: list[int], wide: bool) -> bytes:
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= (2**32 if wide else 2**16)):
        raise ValueError("token id out of range for the wire format")
    return arr.astype(_tok_fmt(wide)).tobytes()


def _unpack(buf: bytes, offset: int, n: int, fmt: str, size: int) -> tuple[list[int], int]:
    end = offset + n * size
    if end > len(buf):
        raise ValueError("truncated message")
    return np.frombuffer(buf[offset:end], dtype=fmt).astype(np.int64).tolist(), end


def rows_to_bytes(rows: torch.Tensor | None) -> bytes:
    if rows is None or rows.numel() == 0:
        return b""
    return rows.detach().to(torch.bfloat16).contiguous().cpu().view(torch.int16).numpy().tobytes()


def rows_from_bytes(buf: bytes, n: int, width: int) -> torch.Tensor | None:
    if n == 0 or width == 0:
        return None
    arr = np.frombuffer(buf, dtype="<i2").copy()
    if arr.size != n * width:
        raise ValueError(f"payload holds {arr.size} values, expected {n} x {width}")
    return torch.from_numpy(arr).view(torch.bfloat16).view(n, width)


def encode(msg: Message, wide: bool = False) -> bytes:
    """The bytes on the wire. `wide`: 4-byte token ids (vocabularies over 65,536)."""
    flags = FLAG_TOK32 if wide else 0
    if isinstance(msg, Prefill):
        extra = METHOD_CODE[msg.method] | (msg.tli << 8)
        return (HEADER.pack(PREFILL, flags, extra, msg.seq, 0) + struct.pack("<I", len(msg.prompt))
                + _pack_tokens(msg.prompt, wide))
    if isinstance(msg, Verify):
        chain = msg.parents is None
        if not chain and len(msg.tokens) > MAX_TREE_NODES:
            raise ValueError(f"a draft tree may have at most {MAX_TREE_NODES} nodes")
        body = struct.pack("<I", len(msg.tokens)) + _pack_tokens(msg.tokens, wide)
        if not chain:
            body += np.asarray([p + 1 for p in msg.parents], dtype="<u2").tobytes()
        return HEADER.pack(VERIFY, flags | (FLAG_CHAIN if chain else 0), 0, msg.seq, msg.position) + body
    if isinstance(msg, Reply):
        flags |= FLAG_CHAIN if msg.chain else 0
        width = 0 if msg.rows is None else int(msg.rows.shape[1])
        body = struct.pack("<I", len(msg.accepted))
        if not msg.chain:
            body += np.asarray(msg.accepted, dtype="<u2").tobytes()
        body += _pack_tokens([msg.bonus], wide) + struct.pack("<IH", msg.n_rows, width) + rows_to_bytes(msg.rows)
        return HEADER.pack(msg.kind, flags, 0, msg.seq, msg.position) + body
    raise TypeError(f"not a protocol message: {type(msg).__name__}")


def decode(buf: bytes) -> Message:
    if len(buf) < HEADER.size:
        raise ValueError("message shorter than its header")
    kind, flags, extra, seq, position = HEADER.unpack_from(buf)
    wide = bool(flags & FLAG_TOK32)
    tsize, tfmt = (4, "<u4") if wide else (2, "<u2")
    off = HEADER.size
    (n,) = struct.unpack_from("<I", buf, off)
    off += 4
    if kind == PREFILL:
        prompt, off = _unpack(buf, off, n, tfmt, tsize)
        method = METHODS[extra & 0xFF]
        return Prefill(method, prompt, extra >> 8, seq)
    if kind == VERIFY:
        tokens, off = _unpack(buf, off, n, tfmt, tsize)
        parents = None
        if not flags & FLAG_CHAIN:
            par, off = _unpack(buf, off, n, "<u2", 2)
            parents = [p - 1 for p in par]
        return Verify(seq, position, tokens, parents)
    if kind in (PREFILL_REPLY, VERIFY_REPLY):
        chain = bool(flags & FLAG_CHAIN)
        if chain:
            accepted = list(range(n))
        else:
            accepted, off = _unpack(buf, off, n, "<u2", 2)
        (bonus,), off = _unpack(buf, off, 1, tfmt, tsize)
        n_rows, width = struct.unpack_from("<IH", buf, off)
        off += 6
        rows = rows_from_bytes(buf[off:], n_rows, width)
        return Reply(kind, seq, position, accepted, bonus, rows, chain)
    raise ValueError(f"unknown message kind {kind}")


def describe(msg: Message) -> dict:
    """What a message carries, for traces (and for tests that recompute its size)."""
    if isinstance(msg, Prefill):
        return {"tokens": len(msg.prompt)}
    if isinstance(msg, Verify):
        return {"nodes": len(msg.tokens), "chain": msg.parents is None}
    width = 0 if msg.rows is None else int(msg.rows.shape[1])
    return {"accepted": len(msg.accepted), "rows": msg.n_rows, "width": width, "chain": msg.chain}


def message_size(msg: Message, wide: bool = False) -> int:
    return len(encode(msg, wide))


def expected_size(kind: int, n: int, tok: int = 2, rows: int = 0, width: int = 0, chain: bool = False) -> int:
    """Size from the layout above, independently of `encode` (tests compare the two).

    n: prompt tokens (PREFILL), tree/chain nodes (VERIFY), accepted nodes (replies).
    """
    head = HEADER.size + 4
    if kind == PREFILL:
        return head + n * tok
    if kind == VERIFY:
        return head + n * tok + (0 if chain else 2 * n)
    return head + (0 if chain else 2 * n) + tok + 6 + 2 * rows * width
