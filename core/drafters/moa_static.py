"""MoA's drafting level on fixed buffers (core.static_pass.StaticLevels), for a GPU to replay as one graph.

A level is what `MoADrafter._advance` runs for a batch of tree nodes: SA over its cache, CA over the LSA
memory, the MLP and head, then the target's last N layers (TLI) over their own cache. On static levels the
three caches have fixed capacities (`StaticLevels.cache` for SA, `extra["ca"]` and `extra["tli"]`), keys go to
the level's slots through `IndexWrites`, and what changes between cycles besides the level's inputs reaches
the level through two buffers: the CA memory's length (its mask hides the columns not yet written, and those
before the last `ca_window`) and the final feature's shortcut. `attach` sets these up in `begin`;
`before_levels` fills the buffers in `draft`; `level_on` is the level itself.
"""

from __future__ import annotations

import functools

import torch

from core.layers import run_layer
from core.static_pass import LEVEL_ROOM, IndexWrites, StaticLevels, static_levels_for
from core.target import Target


def attach(d, target: Target, n_prompt: int) -> StaticLevels | None:
    """Give the MoA drafter `d` static levels and their fixed caches, unless the target's passes are eager
    (None: `begin` makes the usual caches)."""
    cfg = d.config
    fused_tli = target.fused_layers()[cfg.n_target_layers - cfg.tli:] if cfg.tli else []
    levels = static_levels_for(d, target, functools.partial(level_on, d), cfg.top_k, cfg.depth, target.hidden_size,
                               d._dtype, (d._sa_fused, d._ca_fused, *fused_tli), n_prompt + LEVEL_ROOM,
                               extra={"ca": (1, d._dtype), "tli": (max(1, cfg.tli), target.dtype)})
    if levels is None:
        return None
    d.sa_cache, d.ca_cache, d.tli_cache = levels.cache, levels.extra["ca"], levels.extra["tli"]
    d._level_memory = torch.zeros(1, dtype=torch.long, device=target.device)  # CA memory's length, for a replay
    d._level_shortcut = torch.zeros(1, 1, target.hidden_size, dtype=d._dtype, device=target.device)
    return levels


def before_levels(d) -> StaticLevels | None:
    """The static levels this tree drafts on (None: eager levels, also when the tree outgrew the buffers),
    with the CA memory's length and the shortcut copied in."""
    cfg, levels = d.config, d.static
    if levels is None or not levels.fits(cfg.top_k, cfg.depth):
        return None
    d._level_memory.fill_(d.ca_cache.length)
    if d._shortcut is not None:
        d._level_shortcut.copy_(d._shortcut)
    return levels


def level_on(d, feats: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor,
             writes: IndexWrites) -> torch.Tensor:
    """`MoADrafter._advance` on the fixed caches: the same arithmetic, the keys written at `writes.index`
    (`feats`, a parent's predicted feature, is EAGLE's input; MoA drafts from tokens alone)."""
    tgt, cfg = d.target, d.config
    tcos, tsin = tgt.rope(positions)
    cos, sin = tcos.to(d._dtype), tsin.to(d._dtype)
    x = tgt.embed_tokens(tokens).to(d._dtype)
    sa_out, _ = run_layer(d._sa_fused, x, cos, sin, bias, writes, 0, tgt.n_heads, tgt.kv_heads, tgt.head_dim)
    if d._shortcut is not None:
        sa_out = sa_out + d._level_shortcut
    columns = torch.arange(d.ca_cache.capacity, device=x.device)
    seen = columns < d._level_memory
    if cfg.ca_window:
        seen &= columns >= d._level_memory - cfg.ca_window
    mem_mask = seen[None, None, None].expand(1, 1, tokens.shape[1], -1)
    state = d._ca_fused.predict(sa_out, cos, sin, d.ca_cache.keys[0], d.ca_cache.values[0], mem_mask)
    if not cfg.tli:
        return state
    x, layers, tli_writes = state.to(tgt.dtype), tgt.fused_layers(), IndexWrites(d.tli_cache, writes.index)
    for i in range(cfg.tli):
        x, _ = run_layer(layers[cfg.n_target_layers - cfg.tli + i], x, tcos, tsin, bias.to(tgt.dtype), tli_writes, i,
                         tgt.n_heads, tgt.kv_heads, tgt.head_dim)
    return x
