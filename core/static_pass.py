"""The target's verify pass on fixed-size buffers, so that a GPU can capture it once and replay it.

An eager pass costs what its kernel launches cost on a GPU: a pass of the 135M target is a few hundred small
kernels, so it runs far above its memory floor. A CUDA graph replays them with one launch, but it can only
replay what has fixed shapes and fixed addresses. This module gives the verify pass both:

* the pass length T (root + draft nodes) is padded up to a bucket (`BUCKETS`); the padding rows carry token 0
  at the root's position and see only themselves, so no real row sees them and their outputs are dropped;
* the KV cache has a fixed capacity C (no growth), new keys and values are written with `index_copy_` at
  device-side indices past + 0..bucket-1, and attention runs over all C columns under an additive mask that
  is built on the device from four input buffers (token ids, positions, the bucket's tree mask, `past`);
* so the pass function reads nothing from Python that changes between cycles: a cycle writes its inputs into
  the buffers (four small copies), replays, and reads the first T rows of the outputs.

Modes (`Target.pass_mode`, the benchmark's `--passes`):
    eager     Target.forward as it is (the CPU path; growing cache, attention over the valid prefix)
    static    the fixed-buffer pass run eagerly (what a graph replays; tested for equality on the CPU)
    captured  static, with one CUDA graph per (bucket, outputs) captured on first use and replayed (CUDA only)
    auto      captured on CUDA, eager elsewhere

The prefill and any pass longer than the largest bucket run eagerly into the same cache buffer. Drafters'
own drafting levels are not captured here.
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


class _Writes:
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
        self.n_rep = target.n_heads // target.kv_heads
        self.inputs: dict[int, dict[str, torch.Tensor]] = {}
        for b in self.buckets:
            self.inputs[b] = {
                "ids": torch.zeros(1, b, dtype=torch.long, device=dev),
                "positions": torch.zeros(1, b, dtype=torch.long, device=dev),
                "tree": torch.eye(b, dtype=torch.bool, device=dev),
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
        tree.copy_(torch.eye(bucket, dtype=torch.bool, device=tree.device))
        if tree_mask is not None:
            tree[:t, :t] = tree_mask
        else:
            tree[:t, :t] = torch.ones(t, t, dtype=torch.bool, device=tree.device).tril()
        buf["past"].fill_(past)

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
        writes = _Writes(self.cache, buf["past"] + buf["steps"])
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

    def replay() -> None:
        fresh = fn()
        outputs["logits"].copy_(fresh["logits"])
        for i, h in fresh["hidden"].items():
            outputs["hidden"][i].copy_(h)
        if fresh["layer_kv"] is not None:
            outputs["layer_kv"].copy_(fresh["layer_kv"])

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


def capture_fallback(passes: StaticPasses, err: Exception) -> None:
    """A capture that fails (a kernel that cannot be captured on this GPU) costs speed, not the answer: the
    pool entry stops capturing and says so once."""
    passes.capture = False
    passes.graphs.clear()
    warnings.warn(f"CUDA graph capture failed ({type(err).__name__}: {err}); the verify passes run on the static "
                  f"buffers without capture", stacklevel=2)
