"""The target's verify pass on fixed-size buffers, so that a GPU can capture it once and replay it.

An eager pass costs what its kernel launches cost on a GPU: a pass of the 135M target is a few hundred small
kernels, so it runs far above its memory floor. A CUDA graph replays them with one launch, but it can only
replay what has fixed shapes and fixed addresses. This module gives the verify pass both:

* the pass length T (root + draft nodes) is padded up to a bucket (`BUCKETS`); the padding rows carry token 0
  at the root's position and see only themselves, so no real row sees them and their outputs are dropped;
* the KV cache has a fixed capacity C, new keys and values are written with `index_copy_` at
  device-side indices past + 0..bucket-1, and attention runs over all C columns under an additive mask that
  is built on the device from four input buffers (token ids, positions, the bucket's tree mask, `past`);
* so the pass function reads nothing from Python that changes between cycles: a cycle writes its inputs into
  the buffers (four small copies), replays, and reads the first T rows of the outputs.

Modes (`Target.pass_mode`, the benchmark's `--passes`):
    eager     Target.forward as it is (the CPU path; growing cache, attention over the valid prefix)
    static    the fixed-buffer pass run eagerly (what a graph replays; tested for equality on the CPU)
    captured  static, with one CUDA graph per (bucket, outputs) captured on first use and replayed (CUDA only)
    auto      captured on CUDA, eager elsewhere

The prefill and any pass longer than the largest bucket run eagerly into the same cache buffer (should one
ever outgrow it, the buffer is reallocated and the graphs captured again). `StaticLevels` does the same for
a dynamic-tree drafter's levels (EAGLE-2; MoA through core.drafters.moa_static): the frontier padded to
top_k, the drafter's own cache fixed, each node's parent feature read from a slot pool, one graph per
drafter. What stays eager: the prefill, each drafter's `accept`, the tree's host-side bookkeeping and one
read of log-probs per level (docs/ARCHITECTURE.md, "Static passes and captured graphs").
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence

import torch

from core.kv_cache import KVCache
from core.layers import _signed_sin, run_layer
from core.target import Target, TargetOutput

BUCKETS = (1, 4, 8, 16, 32, 64, 128)  # pass lengths in tokens, root included
PASS_MODES = ("auto", "eager", "static", "captured")
MIN_CAPACITY = 512


def resolve_pass_mode(mode: str, device: torch.device | str) -> str:
    """The mode a pass runs in: checks the name and the device (a one-line message naming the valid ones)."""
    if mode not in PASS_MODES:
        raise ValueError(f"unknown pass mode {mode!r}; choose one of {', '.join(PASS_MODES)}")
    cuda = torch.device(device).type == "cuda"
    if mode == "auto":
        return "captured" if cuda else "eager"
    if mode == "captured" and not cuda:
        raise ValueError(f"pass mode 'captured' needs a CUDA device (this target is on {device}); "
                         f"use eager or static")
    return mode


def bucket_for(tokens: int, buckets: Sequence[int] = BUCKETS) -> int | None:
    """The smallest bucket holding `tokens`, or None when none does (that pass runs eagerly)."""
    return next((b for b in buckets if b >= tokens), None)


def capacity_for(tokens: int, max_positions: int, buckets: Sequence[int] = BUCKETS) -> int:
    """A cache capacity for a generation that may reach `tokens` positions: a power of two (so that runs of
    similar length share buffers and graphs), with room for the largest bucket's padding past the end."""
    need = min(tokens, max_positions) + max(buckets)
    cap = MIN_CAPACITY
    while cap < need:
        cap *= 2
    return cap


class IndexWrites:
    """`KVCache.append` over the whole fixed buffer: writes at device-side indices, returns every column."""

    def __init__(self, cache: KVCache, index: torch.Tensor) -> None:
        self.cache, self.index = cache, index

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys.index_copy_(2, self.index, k)
        values.index_copy_(2, self.index, v)
        return keys, values


class StaticPasses:
    """The verify passes of one generation at a time over one fixed-capacity cache (see the module docstring).

    `cache` is the generation's KV cache: the decode loop prefills into it, calls `__call__` for each verify
    pass and keeps the accepted path with `cache.keep` as usual.
    """

    def __init__(self, target: Target, capacity: int, capture: bool = False,
                 buckets: Sequence[int] = BUCKETS, graph_maker: Callable | None = None) -> None:
        self.target, self.capture, self.buckets = target, capture, tuple(buckets)
        self.graph_maker = graph_maker or cuda_graph
        dev = target.device
        self.cache = target.new_cache(capacity)
        self.columns = torch.arange(capacity, device=dev)
        self._buffer_at = self.cache.buffer.data_ptr()
        self.n_rep = target.n_heads // target.kv_heads
        self.inputs: dict[int, dict[str, torch.Tensor]] = {}
        for b in self.buckets:
            self.inputs[b] = {
                "ids": torch.zeros(1, b, dtype=torch.long, device=dev),
                "positions": torch.zeros(1, b, dtype=torch.long, device=dev),
                "tree": torch.eye(b, dtype=torch.bool, device=dev),
                "eye": torch.eye(b, dtype=torch.bool, device=dev),
                "causal": torch.ones(b, b, dtype=torch.bool, device=dev).tril(),
                "past": torch.zeros(1, dtype=torch.long, device=dev),
                "steps": torch.arange(b, device=dev),
            }
        self.graphs: dict[tuple, tuple] = {}  # (bucket, hidden layers, layer kv) -> (replay, outputs)
        self.busy = False
        self.prepare()

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def reset(self) -> None:
        self.cache.length = 0

    # ----- one cycle ---------------------------------------------------------------------------
    @torch.no_grad()
    def fill(self, bucket: int, ids: torch.Tensor, positions: torch.Tensor,
             tree_mask: torch.Tensor | None) -> None:
        """Write a pass's inputs into the bucket's buffers (the padding rows: token 0 at the root's position,
        seeing only themselves)."""
        buf, t = self.inputs[bucket], ids.shape[-1]
        past = self.cache.length
        buf["ids"].zero_()
        buf["ids"][0, :t] = ids.reshape(-1)
        buf["positions"].fill_(past)
        buf["positions"][0, :t] = positions.reshape(-1)
        tree = buf["tree"]
        tree.copy_(buf["eye"])  # the padding rows see themselves
        tree[:t, :t] = tree_mask if tree_mask is not None else buf["causal"][:t, :t]
        buf["past"].fill_(past)

    @torch.no_grad()
    def run_filled(self, bucket: int, hidden_layers: tuple[int, ...], layer_kv: bool) -> dict:
        """The pass over the bucket's buffers: replayed from its graph when capturing, else run."""
        if not self.capture:
            return self._pass(bucket, hidden_layers, layer_kv)
        key = (bucket, hidden_layers, layer_kv)
        if key not in self.graphs:
            try:
                self.graphs[key] = self._capture(bucket, hidden_layers, layer_kv)
            except RuntimeError as err:  # the warm-up already wrote this cycle's keys: the eager rerun is exact
                capture_fallback(self, err)
                return self._pass(bucket, hidden_layers, layer_kv)
        replay, outputs = self.graphs[key]
        replay()
        return outputs

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None,
                 hidden_layers: Sequence[int] = (), layer_kv: bool = False) -> TargetOutput:
        """One verify pass of T tokens (ids [T], positions [T], tree_mask bool [T, T] or None for causal),
        appended to `cache` as `Target.forward` would. Returns its outputs for the T real rows."""
        t = ids.shape[-1]
        bucket = bucket_for(t, self.buckets)
        past = self.cache.length
        if bucket is None or past + bucket > self.capacity:  # longer than every bucket: the eager pass
            return self.target.forward(ids, positions, self.cache, tree_mask=tree_mask,
                                       hidden_layers=hidden_layers, return_layer_kv=layer_kv)
        if self.cache.buffer.data_ptr() != self._buffer_at:  # the cache grew (an eager pass): recapture
            self.graphs.clear()
            self._buffer_at = self.cache.buffer.data_ptr()
            self.columns = torch.arange(self.capacity, device=self.columns.device)
        self.fill(bucket, ids, positions, tree_mask)
        out = self.run_filled(bucket, tuple(sorted(hidden_layers)), layer_kv)
        self.cache.length = past + t
        keep = (lambda x: x[:, :t].clone()) if self.capture else (lambda x: x[:, :t])  # replays overwrite
        return TargetOutput(logits=keep(out["logits"]), hidden={i: keep(h) for i, h in out["hidden"].items()},
                            layer_kv=keep(out["layer_kv"]) if out["layer_kv"] is not None else None)

    # ----- the pass itself: reads only the buffers ---------------------------------------------
    def _pass(self, bucket: int, hidden_layers: tuple[int, ...], layer_kv: bool) -> dict:
        tg, buf = self.target, self.inputs[bucket]
        # The mask over all C columns: the prefix (< past) visible, the window past..past+bucket-1 through the
        # tree mask, everything after hidden. Built from device tensors, so a replay sees this cycle's `past`.
        rel = self.columns - buf["past"]
        in_window = (rel >= 0) & (rel < bucket)
        allowed = (rel < 0) | (buf["tree"][:, rel.clamp(0, bucket - 1)] & in_window)
        bias = torch.zeros(allowed.shape, dtype=tg.dtype, device=allowed.device).masked_fill_(~allowed,
                                                                                            float("-inf"))
        bias = bias[None, None].repeat(1, 1, self.n_rep, 1) if self.n_rep > 1 else bias[None, None]
        writes = IndexWrites(self.cache, buf["past"] + buf["steps"])
        cos, sin = tg.rope(buf["positions"])
        cos, sin = cos[:, :, None], _signed_sin(sin[:, :, None])
        x = tg.embed_tokens(buf["ids"])
        hidden, kvs = {}, []
        for i, f in enumerate(self._fused):
            if i in hidden_layers:
                hidden[i] = x
            x, kv = run_layer(f, x, cos, sin, bias, writes, i, tg.n_heads, tg.kv_heads, tg.head_dim, layer_kv,
                              signed_sin=True)
            if layer_kv:
                kvs.append(kv)
        if tg.n_layers in hidden_layers:
            hidden[tg.n_layers] = x
        return {"logits": tg.logits(x), "hidden": hidden,
                "layer_kv": torch.stack(kvs, dim=2) if layer_kv else None}

    def _capture(self, bucket: int, hidden_layers: tuple[int, ...], layer_kv: bool) -> tuple:
        return self.graph_maker(lambda: self._pass(bucket, hidden_layers, layer_kv))

    def prepare(self) -> None:
        """Per generation, before any pass: the fused weights and the rotary table exist (their lazy builds
        must not happen inside a capture). Weights that moved since the graphs were captured void them."""
        fused = self.target.fused_layers()
        if getattr(self, "_fused", None) is not fused:
            self.graphs.clear()
        self._fused = fused
        self.target.rope(torch.zeros(1, 1, dtype=torch.long, device=self.target.device))


class StaticLevels:
    """A dynamic-tree drafter's drafting levels on fixed buffers (the drafter's side of the static cycle).

    A level runs the frontier's m nodes (m <= `width`, padded to it) through the drafter's own layer on top of
    its KV cache: each node reads the output feature of its parent slot, sees the verified prefix and its
    expanded ancestors (core.drafters.dynamic_tree's slots), and its keys go to slot r + first + i. Here the
    cache has a fixed capacity, the slots' outputs live in one `pool` buffer (row 0: the root's feature, row
    1 + s: slot s), and the mask is built on the device from `past` and the level's slot mask, so a level is
    one replay. `layer(feats, tokens, positions, bias, writes) -> output features` is the drafter's own
    arithmetic, the same it runs eagerly (`writes` is an `IndexWrites` over `cache`: its keys go to this level's
    slots; a drafter with more caches, such as MoA's CA memory and TLI layers, keeps them in `extra`, sized
    alike, and reads `writes.index` for its own writes); the projection onto the drafting vocabulary stays
    outside (its width follows the conversation).
    """

    def __init__(self, target: Target, layer: Callable, width: int, max_slots: int, capacity: int, hidden: int,
                 dtype: torch.dtype, capture: bool = False, graph_maker: Callable | None = None,
                 extra: dict[str, tuple[int, torch.dtype]] | None = None) -> None:
        dev = target.device
        self.layer, self.width, self.capture = layer, width, capture
        self.graph_maker = graph_maker or cuda_graph
        self.window = max_slots + width  # slot columns a level may touch (the last level's padding included)
        self.cache = KVCache(1, target.kv_heads, target.head_dim, capacity, dtype=dtype, device=dev)
        self.extra = {name: KVCache(n_layers, target.kv_heads, target.head_dim, capacity, dtype=dt, device=dev)
                      for name, (n_layers, dt) in (extra or {}).items()}
        self.weights: tuple = ()
        self.pool = torch.zeros(1 + self.window, hidden, dtype=dtype, device=dev)
        self.columns = torch.arange(capacity, device=dev)
        self.n_rep = target.n_heads // target.kv_heads
        self.inputs = {"tokens": torch.zeros(1, width, dtype=torch.long, device=dev),
                       "parents": torch.zeros(width, dtype=torch.long, device=dev),  # pool rows to read
                       "positions": torch.zeros(1, width, dtype=torch.long, device=dev),
                       "slots": torch.zeros(width, self.window, dtype=torch.bool, device=dev),
                       "past": torch.zeros(1, dtype=torch.long, device=dev),
                       "first": torch.zeros(1, dtype=torch.long, device=dev),
                       "steps": torch.arange(width, device=dev)}
        self.graph: tuple | None = None
        self._buffer_at = tuple(c.buffer.data_ptr() for c in (self.cache, *self.extra.values()))

    def fits(self, width: int, depth: int) -> bool:
        """Whether a tree of this width and depth drafts within these buffers."""
        return width <= self.width and (depth - 1) * width + self.width <= self.window

    @torch.no_grad()
    def level(self, tokens: torch.Tensor, parent_slots: torch.Tensor, depths: torch.Tensor, mask: torch.Tensor,
              first_slot: int) -> torch.Tensor:
        """Output features [m, H] of one level (the arguments of core.drafters.dynamic_tree.Expansion); the
        verified prefix is `cache.length` entries long and stays so."""
        m, e = tokens.numel(), mask.shape[1]
        if m > self.width or e > self.window:
            raise ValueError(f"a level of {m} nodes over {e} slots does not fit these static levels")
        if self.cache.length + self.window > self.cache.capacity:  # a long conversation: room for its slots
            for cache in (self.cache, *self.extra.values()):
                cache.reserve(self.cache.length + self.window)
        at = tuple(c.buffer.data_ptr() for c in (self.cache, *self.extra.values()))
        if at != self._buffer_at:  # a cache grew (here or in the drafter's eager bookkeeping): recapture
            self.graph, self._buffer_at = None, at
            self.columns = torch.arange(self.cache.capacity, device=self.pool.device)
        buf, dev = self.inputs, self.pool.device
        r = self.cache.length
        buf["tokens"].zero_()
        buf["tokens"][0, :m] = tokens.to(dev)
        buf["parents"].zero_()
        buf["parents"][:m] = parent_slots.to(dev) + 1
        buf["positions"].fill_(r)
        buf["positions"][0, :m] = r + depths.to(dev) - 1
        slots = buf["slots"]
        slots.zero_()
        slots[:m, :e] = mask.to(dev)
        pad = torch.arange(m, self.width, device=dev)
        slots[pad, first_slot + pad] = True  # padding rows see only themselves
        buf["past"].fill_(r)
        buf["first"].fill_(first_slot)
        if not self.capture:
            out = self._level()
        else:
            if self.graph is None:
                try:
                    self.graph = self.graph_maker(self._level)
                except RuntimeError as err:
                    capture_fallback(self, err)
                    return self._level()[:m]
            replay, out = self.graph
            replay()
        return out[:m].clone() if self.capture else out[:m]

    def _level(self) -> torch.Tensor:
        buf = self.inputs
        rel = self.columns - buf["past"]
        in_window = (rel >= 0) & (rel < self.window)
        allowed = (rel < 0) | (buf["slots"][:, rel.clamp(0, self.window - 1)] & in_window)
        bias = torch.zeros(allowed.shape, dtype=self.cache.buffer.dtype,
                           device=allowed.device).masked_fill_(~allowed, float("-inf"))
        bias = bias[None, None].repeat(1, 1, self.n_rep, 1) if self.n_rep > 1 else bias[None, None]
        writes = IndexWrites(self.cache, buf["past"] + buf["first"] + buf["steps"])
        feats = self.pool[buf["parents"]][None]
        out = self.layer(feats, buf["tokens"], buf["positions"], bias, writes)[0]
        self.pool.index_copy_(0, 1 + buf["first"] + buf["steps"], out.to(self.pool.dtype))
        return out


LEVEL_ROOM = 512  # new positions a drafter's static caches hold beyond the prompt before they grow
DEEPEST_LEVEL = 8  # the deepest tree `auto` may choose (core.trees.choice), so a shape trial fits the buffers


def static_levels_for(owner, target: Target, layer: Callable, width: int, depth: int, hidden: int,
                      dtype: torch.dtype, weights: tuple, tokens: int,
                      extra: dict[str, tuple[int, torch.dtype]] | None = None) -> StaticLevels | None:
    """The drafter `owner`'s static levels under the target's pass mode (None when eager), kept on the owner
    with their graph and remade when the tree's width or depth, the dtype, the extra caches or the mode
    changed; `weights` are the drafter's inference copies, whose change (a training step) voids the graph;
    `tokens`: positions the conversation is expected to reach (the capacity is bucketed as the target's).
    Every cache starts empty."""
    mode = resolve_pass_mode(target.pass_mode, target.device)
    if mode == "eager":
        return None
    max_slots = (max(depth, DEEPEST_LEVEL) - 1) * width
    capacity = capacity_for(tokens, target.max_positions, (max_slots + width,))  # grows if a conversation does
    key = (mode, width, max_slots, dtype, capacity, tuple(sorted((extra or {}).items())))
    known = owner.__dict__.get("_static_levels")
    if known is None or known[0] != key:
        known = (key, StaticLevels(target, layer, width, max_slots, capacity, hidden, dtype, mode == "captured",
                                   extra=extra))
        owner.__dict__["_static_levels"] = known
    levels = known[1]
    if len(levels.weights) != len(weights) or any(a is not b for a, b in zip(levels.weights, weights)):
        levels.graph, levels.weights = None, tuple(weights)
    levels.layer = layer
    for cache in (levels.cache, *levels.extra.values()):
        cache.length = 0
    return levels


def cuda_graph(fn: Callable[[], dict]) -> tuple[Callable[[], None], dict]:
    """Capture `fn` (a pass over filled buffers) as one CUDA graph: warmed up on a side stream first, as
    capture requires. The buffers already hold this cycle's inputs, so the warm-up computes this cycle's pass
    and the replay that follows computes it again, identically. Returns (replay, the graph's outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph.replay, outputs


def replaying_stand_in(fn: Callable[[], dict]) -> tuple[Callable[[], None], dict]:
    """What `cuda_graph` promises, on any device (for tests on the CPU): fixed output tensors that each replay
    overwrites with a fresh run of `fn`."""
    outputs = fn()

    def copy_into(dst, src) -> None:
        if isinstance(src, torch.Tensor):
            dst.copy_(src)
        elif isinstance(src, dict):
            for k, v in src.items():
                copy_into(dst[k], v)

    def replay() -> None:
        copy_into(outputs, fn())

    return replay, outputs


_POOL_LOCK = threading.Lock()


def acquire(target: Target, mode: str, tokens: int) -> StaticPasses:
    """A free `StaticPasses` for a generation reaching `tokens` positions, from the target's pool (graphs and
    buffers are kept for the next generation of the same capacity; two generations at once get two).
    Release it with `release`."""
    capture = resolve_pass_mode(mode, target.device) == "captured"
    capacity = capacity_for(tokens, target.max_positions)
    with _POOL_LOCK:
        pool = target.__dict__.setdefault("_static_pool", {})
        for passes in pool.get((capacity, capture), []):
            if not passes.busy:
                break
        else:
            passes = StaticPasses(target, capacity, capture)
            pool.setdefault((capacity, capture), []).append(passes)
        passes.busy = True
    passes.reset()
    passes.prepare()
    return passes


def release(passes: StaticPasses) -> None:
    passes.busy = False


def capture_fallback(passes: StaticPasses | StaticLevels, err: Exception) -> None:
    """A capture that fails (a kernel that cannot be captured on this GPU) costs speed, not the answer: these
    passes or levels stop capturing and say so once."""
    passes.capture = False
    if isinstance(passes, StaticPasses):
        passes.graphs.clear()
    else:
        passes.graph = None
    what = "verify passes" if isinstance(passes, StaticPasses) else "drafting levels"
    warnings.warn(f"CUDA graph capture failed ({type(err).__name__}: {err}); the {what} run on the static "
                  f"buffers without capture", stacklevel=2)
