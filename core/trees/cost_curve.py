"""This machine's cost curve: the time of one target forward pass against the number of tokens in it.

Speculative decoding trades one cheap pass per token for one bigger *verify* pass per cycle. How much
that bigger pass costs decides the speedup a given tau can reach (docs/ARCHITECTURE.md, "Metrics"):

    ideal speedup = tau x t(1-token pass) / t(verify pass)

On a GPU a pass over a few dozen tokens costs about what a one-token pass costs (decoding is
memory-bound); on a small CPU it costs noticeably more. The public API is small:

    curve = measure_cost_curve(target)              # timed once per machine, then read from runs/
    ideal_speedup(tau, curve, tree_size=24)         # the speedup free drafting would give at this tau
    gpu_ideal_speedup(tau)                          # the same tau under the GPU cost model below
    matmul_floor_ms(target)                         # bare matmuls of one token through every weight: the floor

A curve is a JSON-able dict: {"key", "cpu", "torch", "dtype", "device", "target", "context", "repeats",
"sizes": [1, 2, 4, ...], "ms": [median ms of one pass of that many new tokens over a KV cache of
`context` tokens], "measured_at"}. Curves are cached in `runs/cost_curve.json` (git-ignored), keyed by
the CPU model (from /proc/cpuinfo), the torch version, the dtype, the device and the target's
fingerprint, so the same machine never measures twice. The tiny random test target never times anything:
it gets `FIXED_CURVE`, a fixed cost model, so tests stay fast and deterministic.

What the curve is used for lives beside it: core.trees.choice sizes `auto` trees by it, and
core.trees.calibration corrects that choice from decoded cycles.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from core.layers import linear
from core.static_pass import acquire, release, resolve_pass_mode
from core.target import Target, cpu_flags

ROOT = Path(__file__).resolve().parents[2]
CACHE_FILE = ROOT / "runs" / "cost_curve.json"
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXT = 200
PASS_VERSION = "fused-v4"  # bumped when the target pass or its timing changes (core.target fused layers): re-measure
# The fixed cost model of tiny test targets (ms by tokens in the pass; the shape of a 2-core CPU's bfloat16
# curve, core.drafters.static_tree.CPU_PASS_MS): no timing, so tests are fast and deterministic.
FIXED_CURVE = {"key": "fixed cost model (tiny test target)", "cpu": "none (fixed model)", "torch": "",
               "dtype": "", "device": "cpu", "target": "", "context": 0, "repeats": 0,
               "sizes": [1, 8, 32, 64], "ms": [55.0, 59.0, 70.0, 95.0], "measured_at": "", "fixed": True}
# the largest tree `auto` considers (core.trees.choice); the curve is measured up to MAX_AUTO_TOKENS
MAX_AUTO_DEPTH = 8
MAX_AUTO_TOKENS = 64
GPU_COST_MODEL = ("a verify pass of a few dozen tokens costs about as much as a one-token pass (decoding is "
                  "memory-bound on a GPU)")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo (or the platform's processor string elsewhere)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.lower().startswith("model name") and ":" in line:
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown cpu"


def cpu_isa(cpuinfo: str | None = None) -> str:
    """The widest matrix instructions this CPU has (amx, avx512_bf16, avx512, avx2 or other). Part of the
    cache key: cloud CPUs share model names ("AMD EPYC") across generations with very different kernels."""
    flags = cpu_flags() if cpuinfo is None else frozenset(cpuinfo.split())
    for flag, name in (("amx_bf16", "amx"), ("avx512_bf16", "avx512_bf16"), ("avx512f", "avx512"), ("avx2", "avx2")):
        if flag in flags:
            return name
    return "other"


def machine_key(target: Target) -> str:
    """The cache key of a curve: CPU model and instructions, torch version, dtype, device, target fingerprint."""
    dtype = str(target.dtype).replace("torch.", "")
    packed = " | packed matmuls" if target.packed_matmuls else ""
    mode = resolve_pass_mode(target.pass_mode, target.device)
    packed += f" | {mode} passes" if mode != "eager" else ""  # eager keys stay as they were before the modes
    cpu = f"{cpu_model()} ({cpu_isa()})" if target.device.type == "cpu" else cpu_model()
    return (f"{cpu} | torch {torch.__version__} | {dtype} | {target.device} | {target.fingerprint} | "
            f"{PASS_VERSION}{packed}")


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


@torch.no_grad()
def time_pass_sizes(target: Target, sizes: Sequence[int], repeats: int, context: int) -> list[float]:
    """Median ms of one verify pass of each size (a chain of new tokens over a `context`-token cache), run as
    decoding runs it (`Target.pass_mode`)."""
    dev = target.device
    context = max(1, min(context, target.max_positions - max(sizes)))  # stay inside the model's positions
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, target.vocab_size, (context + max(sizes),), generator=gen).to(dev)
    passes = None  # the verify passes as decoding runs them (Target.pass_mode: eager, or fixed buffers)
    if resolve_pass_mode(target.pass_mode, dev) != "eager":
        passes = acquire(target, target.pass_mode, context + max(sizes) + 8)
    cache = passes.cache if passes is not None else target.new_cache(capacity=context + max(sizes) + 8)
    target.forward(ids[:context], cache=cache)  # the context: a KV cache of `context` tokens
    masks = {n: torch.ones(n, n, dtype=torch.bool, device=dev).tril() for n in sizes}  # chains: the cheapest
    steps = {n: torch.arange(context, context + n, device=dev) for n in sizes}

    def one_pass(n: int) -> None:
        if passes is None:
            target.forward(ids[context:context + n], cache=cache, tree_mask=masks[n])
        else:
            passes(ids[context:context + n], steps[n], masks[n])
    times: dict[int, list[float]] = {n: [] for n in sizes}
    # Rounds over all sizes rather than all repeats of one size, then the next: a shared machine's slow spells
    # then fall on every size alike instead of bending the curve (one size timed 40% high made 1 token dearer
    # than 8). The first round warms up and is not counted.
    for r in range(repeats + 1):
        for n in sizes:
            t0 = time.perf_counter()
            one_pass(n)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if r:
                times[n].append(time.perf_counter() - t0)
            cache.crop(context)
    if passes is not None:
        release(passes)
    return [1000.0 * statistics.median(times[n]) for n in sizes]


def measure_cost_curve(target: Target, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 11,
                       context: int = DEFAULT_CONTEXT, cache_path: str | Path | None = CACHE_FILE,
                       refresh: bool = False) -> dict:
    """Median time of one target forward pass of each size (new tokens over a `context`-token KV cache).

    Read from `cache_path` when this machine (see `machine_key`) measured the same sizes before, unless
    `refresh`; otherwise timed now and written there (`cache_path=None`: never cached).
    """
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"sizes must be positive token counts, got {list(sizes)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    context = max(1, min(int(context), target.max_positions - max(sizes)))  # inside the model's positions
    key = machine_key(target)
    cached = _read_cache(Path(cache_path)) if cache_path is not None else {}
    hit = cached.get(key)
    if not refresh and isinstance(hit, dict) and hit.get("sizes") == sizes and hit.get("context") == context:
        return hit
    ms = time_pass_sizes(target, sizes, repeats, context)
    curve = {"key": key, "cpu": cpu_model(), "torch": torch.__version__,
             "dtype": str(target.dtype).replace("torch.", ""), "device": str(target.device),
             "target": target.fingerprint, "context": context, "repeats": repeats, "sizes": sizes,
             "ms": [round(m, 3) for m in ms], "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    if cache_path is not None:
        cached[key] = curve
        try:
            Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
            Path(cache_path).write_text(json.dumps(cached, indent=1))
        except OSError:  # a read-only checkout still gets its curve, just not cached
            pass
    return curve


def pass_ms(curve: dict, n_tokens: float) -> float:
    """Time of one pass of `n_tokens` new tokens, linear between measured sizes (and beyond the ends)."""
    xs, ys = [float(s) for s in curve["sizes"]], [float(m) for m in curve["ms"]]
    if len(xs) == 1:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and n_tokens > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(1e-9, y0 + (y1 - y0) * (n_tokens - x0) / (x1 - x0))


def monotone(curve: dict) -> dict:
    """The curve with each size's time replaced by the least time of that size or any larger one: a pass of more
    tokens never costs less than one of fewer, so a lower later point shows that an earlier one was a spike (a
    busy machine); the tree choice uses this envelope, the stored curve stays as measured."""
    ms = [float(m) for m in curve["ms"]]
    for i in range(len(ms) - 2, -1, -1):
        ms[i] = min(ms[i], ms[i + 1])
    return {**curve, "ms": ms}


def curve_pass_table(curve: dict) -> dict[int, float]:
    """A curve as the {tokens: ms} table core.drafters.static_tree takes."""
    return {int(s): float(m) for s, m in zip(curve["sizes"], curve["ms"])}


def verify_cost(curve: dict, tree_size: float) -> float:
    """t(verify pass) / t(1-token pass) for a tree of `tree_size` drafted nodes (the pass holds root + tree)."""
    return pass_ms(curve, 1.0 + tree_size) / pass_ms(curve, 1.0)


def ideal_speedup(tau: float, curve: dict, tree_size: float) -> float:
    """tau x t(1-token pass) / t(verify pass of 1 + tree_size tokens): the speedup if drafting cost nothing."""
    return float(tau) / verify_cost(curve, tree_size)


def gpu_ideal_speedup(tau: float) -> float:
    """The ideal speedup of the same tau under the GPU cost model (`GPU_COST_MODEL`): verify pass = 1-token pass."""
    return float(tau)


def gpu_curve(curve: dict) -> dict:
    """The GPU cost model as a curve: every pass costs what `curve`'s 1-token pass costs."""
    one = pass_ms(monotone(curve), 1.0)
    return {**curve, "key": "GPU cost model", "sizes": [1, MAX_AUTO_TOKENS + 1], "ms": [one, one], "fixed": True}


# ----- the floor and the curve of any target ------------------------------------------------------
def is_tiny(target: Target) -> bool:
    """The random tiny test target (core.target.tiny_target): never timed, the fixed cost model instead."""
    return str(getattr(target, "source", "")).startswith("tiny-")


def curve_for(target: Target, cache_path: str | Path | None = CACHE_FILE) -> dict:
    """This machine's curve for `target` (cached, see measure_cost_curve); FIXED_CURVE for the tiny test target,
    and for any target when SPECLENS_COST_MODEL=fixed (no timing at all, e.g. while another job owns the CPU)."""
    if is_tiny(target) or os.environ.get("SPECLENS_COST_MODEL", "").lower() == "fixed":
        return dict(FIXED_CURVE)
    env = os.environ.get("SPECLENS_COST_CURVE")  # the app's setting (demo.runtime): the same cache file
    if cache_path == CACHE_FILE and env:
        cache_path = None if env.lower() == "none" else env
    return measure_cost_curve(target, cache_path=cache_path)


@torch.no_grad()
def _time_floor(target: Target, repeats: int) -> float:
    mats = []  # (weight, its packed copy or None): the floor uses the same matmul kernel as the pass
    for f in target.fused_layers():
        mats += list(zip((f.qkv, f.o, f.gate_up, f.down), f.packed or (None,) * 4, strict=True))
    mats.append((target.lm_head.weight, target._lm_packed))
    x = {m.shape[1]: torch.randn(1, m.shape[1], dtype=target.dtype, device=target.device) for m, _ in mats}
    times = []
    for r in range(repeats + 1):  # the first round warms up
        t0 = time.perf_counter()
        for m, packed in mats:
            linear(x[m.shape[1]], m, None, packed)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        if r:
            times.append(time.perf_counter() - t0)
    return 1000.0 * statistics.median(times)


def matmul_floor_ms(target: Target, repeats: int = 20, cache_path: str | Path | None = CACHE_FILE,
                    refresh: bool = False) -> float:
    """The memory floor of one decoding step here: one token multiplied through every weight matrix of the
    target (fused QKV, output, fused gate/up and down of every layer, then the LM head) with the matmul kernel
    the pass uses (packed where core.layers chose it), no attention, no norms, no Python between layers;
    median of `repeats` rounds, in ms. Cached next to the curve (never for
    the tiny test target, whose figure means nothing)."""
    if is_tiny(target) or os.environ.get("SPECLENS_COST_MODEL", "").lower() == "fixed":
        cache_path = None  # a figure timed while the fixed model is asked for is not worth keeping
    key = machine_key(target) + " | floor"
    cached = _read_cache(Path(cache_path)) if cache_path is not None else {}
    hit = cached.get(key)
    if not refresh and isinstance(hit, dict) and isinstance(hit.get("ms"), (int, float)):
        return float(hit["ms"])
    ms = _time_floor(target, repeats)
    if cache_path is not None:
        cached[key] = {"ms": round(ms, 3), "repeats": repeats, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
            Path(cache_path).write_text(json.dumps(cached, indent=1))
        except OSError:
            pass
    return ms
