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
    choose_tree("eagle2", target)                   # the tree size/depth with the best expected tokens/s here

A curve is a JSON-able dict: {"key", "cpu", "torch", "dtype", "device", "target", "context", "repeats",
"sizes": [1, 2, 4, ...], "ms": [median ms of one pass of that many new tokens over a KV cache of
`context` tokens], "measured_at"}. Curves are cached in `runs/cost_curve.json` (git-ignored), keyed by
the CPU model (from /proc/cpuinfo), the torch version, the dtype, the device and the target's
fingerprint, so the same machine never measures twice. The tiny random test target never times anything:
it gets `FIXED_CURVE`, a fixed cost model, so tests stay fast and deterministic.

Choosing a tree (`choose_tree`): the model behind `auto` trees, documented here once.

* Measured first. assets/results/tree_acceptance.json (analysis.tree_acceptance) holds, per dynamic-tree method,
  the tau of every (D, N) shape measured on held-out prompts from one deep tree per position, with the drafter's
  per-cycle update time and its time per expansion level. When it was measured on the same target and the same
  checkpoint (and top_k), expected tau = that tau, and drafting = update + (D - 1) x level time, both scaled by
  this machine's 1-token pass / the probe's. The model below is the fallback (a retrained drafter, another
  target) and what Medusa / Amphista's static trees do not use at all.
* Acceptance. `p[d]` = P(a cycle accepts at least d draft tokens), measured for the method at a reference
  tree of depth D0 and N0 nodes (assets/results/summary.json: acceptance_by_position and mean_tree_nodes;
  else the drafter card's teacher-forced acc@1..k, a top-1 chain: N0 = D0). Conditional rates
  c[d] = p[d] / p[d-1]; past the last measured depth the last rate repeats.
* Width. A tree of depth D and N nodes has w = N / D nodes per level; the reference had w0 = N0 / D0.
  A level of width w catches the right token with c(w) = 1 - (1 - c)^(w / w0): more candidates help, with
  diminishing returns (each extra w0-wide slice of candidates is treated as an independent chance).
* Expected tau = 1 + sum over d <= D of prod_{j <= d} c_j(w) (the bonus token counts).
* Cost per cycle = verify pass of 1 + N tokens (this machine's curve) + drafting: a dynamic tree
  (EAGLE-2, MoA) runs the drafter once per level, so D x (draft ms per level); the per-level cost is the
  method's measured draft_ms_per_cycle / D0, scaled by this machine's 1-token pass / the reference run's.
  Static trees (Medusa, Amphista) draft once per cycle whatever the tree; their per-rank accuracies go
  through core.drafters.static_tree.best_size instead.
* The curve is read through its monotone envelope (`monotone`): a spike from a busy machine never makes a
  bigger pass look cheaper than a smaller one.
* Choice: the (D, N) of the grid D = 1..8, N = D..min(64, D x top_k) with the best expected tau / cost
  (tokens/s); a dynamic tree's level never holds more than top_k nodes.
* Calibration from decoded cycles (`CycleLedger`). Everything above is a prediction: tau from held-out
  prompts, drafting scaled from another machine's probe. A drafter with an `auto` tree therefore keeps a
  ledger of every cycle it decodes: the draft tokens accepted, the drafting ms and the verify ms, beside what
  the model predicted for that cycle's tree. Every CALIBRATE_AFTER cycles it chooses again, with tau's gain
  (tau - 1) and drafting scaled by their measured / predicted ratios and the verify pass shifted by its
  measured - predicted offset, for every shape. It moves to another shape only when that one promises
  CALIBRATE_MARGIN more tokens/s. The first GPU run showed why this is needed: there, drafting cost ten
  times the scaled probe, and the trees chosen without it were far too deep (docs/RESULTS.md, "On a GPU").
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from core.layers import linear
from core.target import Target, cpu_flags

ROOT = Path(__file__).resolve().parent.parent
CACHE_FILE = ROOT / "runs" / "cost_curve.json"
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXT = 200
PASS_VERSION = "fused-v4"  # bumped when the target pass or its timing changes (core.target fused layers): re-measure
# The fixed cost model of tiny test targets (ms by tokens in the pass; the shape of a 2-core CPU's bfloat16
# curve, core.drafters.static_tree.CPU_PASS_MS): no timing, so tests are fast and deterministic.
FIXED_CURVE = {"key": "fixed cost model (tiny test target)", "cpu": "none (fixed model)", "torch": "",
               "dtype": "", "device": "cpu", "target": "", "context": 0, "repeats": 0,
               "sizes": [1, 8, 32, 64], "ms": [55.0, 59.0, 70.0, 95.0], "measured_at": "", "fixed": True}
RESULTS = ROOT / "assets" / "results" / "summary.json"
# the shipped MoA's ablation run: every dynamic-tree drafter shipped with it, fixed trees of depth 5 (docs/RESULTS.md,
# "What MoA shows")
DEEP_RESULTS = ROOT / "assets" / "results" / "moa" / "feature_gain" / "bench_summary.json"
# tau of every dynamic-tree shape, measured on held-out prompts (analysis.tree_acceptance); read first
TREE_TABLE = ROOT / "assets" / "results" / "tree_acceptance.json"
MAX_AUTO_DEPTH = 8
MAX_AUTO_TOKENS = 64
STATIC_TREE_METHODS = ("medusa", "amphista")
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
def _time_sizes(target: Target, sizes: Sequence[int], repeats: int, context: int) -> list[float]:
    dev = target.device
    context = max(1, min(context, target.max_positions - max(sizes)))  # stay inside the model's positions
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, target.vocab_size, (context + max(sizes),), generator=gen).to(dev)
    cache = target.new_cache(capacity=context + max(sizes) + 8)
    target.forward(ids[:context], cache=cache)  # the context: a KV cache of `context` tokens
    masks = {n: torch.ones(n, n, dtype=torch.bool, device=dev).tril() for n in sizes}  # chains: the cheapest
    times: dict[int, list[float]] = {n: [] for n in sizes}
    # Rounds over all sizes rather than all repeats of one size, then the next: a shared machine's slow spells
    # then fall on every size alike instead of bending the curve (one size timed 40% high made 1 token dearer
    # than 8). The first round warms up and is not counted.
    for r in range(repeats + 1):
        for n in sizes:
            t0 = time.perf_counter()
            target.forward(ids[context:context + n], cache=cache, tree_mask=masks[n])
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if r:
                times[n].append(time.perf_counter() - t0)
            cache.crop(context)
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
    ms = _time_sizes(target, sizes, repeats, context)
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


# ----- choosing the tree (module docstring, "Choosing a tree") -----------------------------------
def conditional_rates(p_at_least: Sequence[float | None]) -> list[float]:
    """P(accept >= d) by depth -> P(accept depth d | accepted d - 1); stops at the first missing value.

    Measured per-position rates count only cycles whose tree reached depth d, so a deep, rarely reached
    depth can show a higher rate than the one above it; the sequence is made non-increasing first."""
    rates, prev = [], 1.0
    for p in p_at_least:
        if p is None or prev <= 0:
            break
        p = min(float(p), prev)
        rates.append(max(0.0, p / prev))
        prev = p
    return rates


def widened(rate: float, width: float, ref_width: float) -> float:
    """A level's acceptance with `width` candidates, from the rate measured with `ref_width` (c(w) above)."""
    return 1.0 - (1.0 - rate) ** (max(width, 1e-9) / max(ref_width, 1e-9))


def expected_tau(rates: Sequence[float], depth: int, total_tokens: int, ref_depth: int, ref_total: float) -> float:
    """1 + expected accepted draft tokens of a (depth, total_tokens) dynamic tree under the model above."""
    if not rates or depth < 1 or total_tokens < 1:
        return 1.0
    depth = min(depth, total_tokens)
    width, ref_width = total_tokens / depth, max(1.0, ref_total / max(1, ref_depth))
    tau, reach = 1.0, 1.0
    for d in range(depth):
        rate = rates[min(d, len(rates) - 1)]
        reach *= widened(rate, width, ref_width)
        tau += reach
    return tau


def _overall(results: str | Path, method: str) -> tuple[dict, dict] | None:
    """(the method's overall figures, the baseline's) from a benchmark summary; None when absent."""
    try:
        data = json.loads(Path(results).read_text())
        overall = data["methods"][method]["overall"]
        base = data["methods"].get(data.get("config", {}).get("baseline", "ar"), {}).get("overall", {})
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    return overall, base


def _positions(overall: dict) -> list[float]:
    return [x for x in overall.get("acceptance_by_position") or [] if x is not None]


def method_acceptance(method: str, results: str | Path = RESULTS,
                      deep_results: str | Path | None = DEEP_RESULTS) -> dict | None:
    """A method's measured acceptance: {"p": P(accept >= d) list, "ref_depth", "ref_total", "draft_ms",
    "draft_levels", "verify_ms_1", "source"}; None when no summary has the method.

    The acceptance by depth comes from whichever of `results` (the latest run) and `deep_results` (a run with
    deep fixed trees) measured more depths: an `auto` run on a machine with a steep cost curve drafts one level
    and so says nothing about deeper ones. The drafting cost comes from `results` when it has the method (the
    latest drafting code), as draft ms per cycle over the levels drafted there."""
    runs = []  # (figures, path) of each summary that measured the method; the latest first
    for path in (results, deep_results):
        run = _overall(path, method) if path is not None else None
        if run and _positions(run[0]):
            runs.append((run, path))
    if not runs:
        return None
    acc_from, acc_path = max(runs, key=lambda r: len(_positions(r[0][0])))  # a tie keeps the latest
    cost_from = runs[0][0]
    p = _positions(acc_from[0])
    source = f"{Path(acc_path).name}: {method}"
    if cost_from is not acc_from:
        source += f" (drafting cost: {Path(results).name})"
    return {"p": p, "ref_depth": len(p), "ref_total": float(acc_from[0].get("mean_tree_nodes") or len(p)),
            "draft_ms": cost_from[0].get("draft_ms_per_cycle"), "draft_levels": len(_positions(cost_from[0])),
            "verify_ms_1": cost_from[1].get("verify_ms_per_cycle"), "source": source}


def checkpoint_signature(meta: dict | None) -> str | None:
    """A short string that changes whenever a checkpoint is retrained: its name and its training run's steps,
    tokens, seed and wall time (config.json's "training"); None for an untrained drafter."""
    if not isinstance(meta, dict):
        return None
    t = meta.get("training") or {}
    return ":".join(str(x) for x in (meta.get("name"), t.get("steps"), t.get("tokens"), t.get("seed"),
                                     t.get("wall_time_s")))


def shipped_signature(method: str) -> str | None:
    """`checkpoint_signature` of the shipped checkpoint of a method label (assets/drafters/<label>: "moa-tli1")."""
    try:
        return checkpoint_signature(json.loads((ROOT / "assets" / "drafters" / method / "config.json").read_text()))
    except (OSError, ValueError):
        return None


def tree_table(method: str, fingerprint: str | None = None, signature: str | None = None,
               path: str | Path | None = None) -> dict | None:
    """A method's row of the measured tree table (analysis.tree_acceptance) as choose_tree's acceptance:
    {"grid": {(depth, total_tokens): tau}, "accept_ms", "level_ms", "verify_ms_1", "p": [], "source"}; None when
    the table lacks the method, or was measured on another target (`fingerprint`) or checkpoint (`signature`,
    default: the shipped checkpoint's), so a retrained drafter never goes by its predecessor's table."""
    path = TREE_TABLE if path is None else Path(path)
    try:
        data = json.loads(path.read_text())
        row = data["methods"][method]
        grid = {(int(d), int(n)): float(t) for d, n, t in row["grid"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if fingerprint is not None and data.get("target") != fingerprint:
        return None
    if row.get("checkpoint") != (signature if signature is not None else shipped_signature(method)):
        return None
    return {"grid": grid, "accept_ms": row.get("accept_ms"), "level_ms": row.get("level_ms"),
            "verify_ms_1": row.get("verify_ms_1"), "top_k": row.get("top_k"), "p": [], "ref_depth": 0,
            "ref_total": 0, "source": f"{path.name}: {method} (tau measured for every tree shape)"}


def card_acceptance(metrics: dict | None) -> dict | None:
    """Acceptance from a drafter card's held-out acc@1..k (teacher-forced top-1 along a chain: N0 = D0)."""
    if not isinstance(metrics, dict):
        return None
    rates = []
    for d in range(1, MAX_AUTO_DEPTH + 1):
        v = metrics.get(f"acc@{d}")
        if not isinstance(v, (int, float)):
            break
        rates.append(float(v))
    if not rates:
        return None
    p, reach = [], 1.0
    for r in rates:
        reach *= r
        p.append(reach)
    return {"p": p, "ref_depth": len(p), "ref_total": float(len(p)), "draft_ms": None, "verify_ms_1": None,
            "source": "drafter card (held-out acc@k)"}


def choose_tree(method: str, target: Target | None = None, curve: dict | None = None,
                acceptance: dict | None = None, draft_ms_per_level: float | None = None,
                max_depth: int = MAX_AUTO_DEPTH, max_tokens: int = MAX_AUTO_TOKENS, top_k: int | None = 8,
                cache_path: str | Path | None = CACHE_FILE, calibration: dict | None = None) -> dict:
    """The dynamic tree (depth, total_tokens) with the best expected tokens/s on this machine.

    method: a method label of assets/results/summary.json ("eagle2", "moa", "moa-tli1", ...).
    curve: this machine's cost curve (default: curve_for(target)). acceptance: method_acceptance's dict
    (default: read for `method`). draft_ms_per_level: drafting cost of one tree level (default: from the
    summary, scaled to this machine; 4% of a 1-token pass when unknown). top_k: the dynamic tree's frontier
    width, so a level holds at most top_k nodes (N <= D x top_k); None: no cap. calibration: measured /
    predicted {"tau", "draft"} ratios and "verify_ms" offset from decoded cycles (CycleLedger.ratios), None:
    the model alone.
    Returns {"method", "depth", "total_tokens", "expected_tau", "expected_tokens_per_s", "cycle_ms",
    "draft_ms_per_level", "acceptance", "acceptance_source", "curve" (as measured), "calibration", "grid":
    [{depth, total_tokens, tau, ms, tokens_per_s, tau_model, draft_model, pass_model}, ...] (tau and ms
    calibrated, the *_model fields as predicted), "model"}; depth/total_tokens are None when there is no
    acceptance to go by. Medusa / Amphista (static trees) are sized by
    core.drafters.static_tree.static_tree_choice (same keys).
    """
    if curve is None:
        if target is None:
            raise ValueError("choose_tree needs a target or a cost curve")
        curve = curve_for(target, cache_path)
    raw, curve = curve, monotone(curve)
    base = method.removesuffix("+lookup")
    if acceptance is None and base in STATIC_TREE_METHODS:  # sized by core.drafters.static_tree.static_tree_choice
        acceptance = {"p": [], "ref_depth": 0, "ref_total": 0, "source": "static tree: see core.drafters.static_tree"}
    acc = acceptance if acceptance is not None else (tree_table(base) or method_acceptance(base))
    if acc is not None and not acc.get("grid") and not conditional_rates(acc.get("p") or []):
        acc = None  # nothing measured to go by
    one = pass_ms(curve, 1.0)
    if draft_ms_per_level is None:
        draft_ms_per_level = 0.04 * one
        if acc and acc.get("draft_ms") and acc.get("verify_ms_1"):
            draft_ms_per_level = (acc["draft_ms"] / max(1, acc.get("draft_levels") or acc["ref_depth"])
                                  * one / acc["verify_ms_1"])
    grid = acc.get("grid") if acc else None
    if grid:  # measured shapes: the probe's own drafting times, scaled by this machine's 1-token pass / the probe's
        scale = one / acc["verify_ms_1"] if acc.get("verify_ms_1") else 1.0
        fixed_ms = (acc.get("accept_ms") or 0.0) * scale
        draft_ms_per_level = (acc.get("level_ms") or 0.04 * one) * scale
    out = {"method": method, "depth": None, "total_tokens": None, "expected_tau": 1.0,
           "expected_tokens_per_s": 1000.0 / one, "cycle_ms": one, "draft_ms_per_level": round(draft_ms_per_level, 3),
           "acceptance": acc["p"] if acc else [], "acceptance_source": acc["source"] if acc else None,
           "curve": raw, "calibration": calibration, "grid": [],
           "model": "core.cost_curve module docstring, 'Choosing a tree'"}
    if not acc:
        return out
    rates = conditional_rates(acc["p"])
    cal = calibration or {}
    best = None
    for depth in range(1, max_depth + 1):
        for n in range(depth, min(max_tokens, depth * top_k if top_k else max_tokens) + 1):
            if grid:
                if (depth, n) not in grid:
                    continue
                tau, drafting = grid[(depth, n)], fixed_ms + (depth - 1) * draft_ms_per_level
            else:
                tau = expected_tau(rates, depth, n, acc["ref_depth"], acc["ref_total"])
                drafting = depth * draft_ms_per_level
            one_pass = pass_ms(curve, 1.0 + n)
            out["grid"].append(calibrated_row(depth, n, tau, drafting, one_pass, cal))
            tau, ms = scaled(tau, drafting, one_pass, cal)
            tps = 1000.0 * tau / ms
            if best is None or tps > best[0] + 1e-9:
                best = (tps, depth, n, tau, ms)
    tps, depth, n, tau, ms = best
    out.update(depth=depth, total_tokens=n, expected_tau=round(tau, 4), expected_tokens_per_s=round(tps, 3),
               cycle_ms=round(ms, 3))
    return out


# ----- calibration from decoded cycles (module docstring, last point) -----------------------------
CALIBRATE_AFTER = 16  # decoded cycles between two choices
CALIBRATE_MARGIN = 0.03  # another shape must promise 3% more tokens/s: about the noise of one benchmark
RATIO_RANGE = (0.1, 20.0)  # beyond it the ledger is broken, not the model (a GPU measured drafting at 10x)
PRIOR_CYCLES = 16  # the model counts as this many cycles that met it exactly: one odd prompt moves a ratio halfway


def calibrated_row(depth: int, n: int, tau: float, draft_ms: float, pass_ms_: float, cal: dict) -> dict:
    """One shape of a tree choice's grid: the model's tau / drafting / pass, and those calibrated by `cal`
    (`scaled`: tau's gain over plain decoding, tau - 1, and drafting scale; the verify pass gets an offset)."""
    tau_c, ms = scaled(tau, draft_ms, pass_ms_, cal)
    return {"depth": depth, "total_tokens": n, "tau": round(tau_c, 4), "ms": round(ms, 3),
            "tokens_per_s": round(1000.0 * tau_c / ms, 3), "tau_model": round(tau, 4),
            "draft_model": round(draft_ms, 3), "pass_model": round(pass_ms_, 3)}


def scaled(tau: float, draft_ms: float, pass_ms_: float, cal: dict) -> tuple[float, float]:
    """(tau, cycle ms) of one shape under `cal`: tau's gain and drafting scaled by their ratios, the verify
    pass shifted by its offset; without a calibration exactly the model's."""
    if not cal:
        return tau, pass_ms_ + draft_ms
    return (1.0 + cal.get("tau", 1.0) * (tau - 1.0),
            pass_ms_ + cal.get("verify_ms", 0.0) + cal.get("draft", 1.0) * draft_ms)


@dataclass
class CycleLedger:
    """Decoded cycles of one drafter against the cost model's prediction for each cycle's tree: sums of draft
    tokens accepted, drafting ms and verify ms, measured and predicted."""

    cycles: int = 0
    since_choice: int = 0
    accepted: float = 0.0
    accepted_model: float = 0.0
    draft_ms: float = 0.0
    draft_model: float = 0.0
    verify_ms: float = 0.0
    verify_model: float = 0.0

    def add(self, row: dict, accepted: int, draft_ms: float, verify_ms: float) -> None:
        """One cycle decoded with the tree of grid row `row` (calibrated_row's keys)."""
        self.cycles += 1
        self.since_choice += 1
        self.accepted += accepted
        self.accepted_model += row["tau_model"] - 1.0
        self.draft_ms += draft_ms
        self.draft_model += row["draft_model"]
        self.verify_ms += verify_ms
        self.verify_model += row["pass_model"]

    def ratios(self) -> dict | None:
        """{"tau", "draft"}: measured / predicted, shrunk towards 1 by PRIOR_CYCLES and clipped to RATIO_RANGE;
        "verify_ms": measured - predicted verify ms per cycle, shrunk towards 0 the same way; "cycles".
        None before CALIBRATE_AFTER cycles.

        The verify pass gets an offset, not a ratio: what the curve leaves out (verification, cache
        bookkeeping, the decode loop; on a GPU the launches around the pass) costs about the same at any tree
        size. On a 2-core CPU the measured verify step was 10-12 ms above the curve at 1, 3, 5 and 7 tokens
        alike, and a ratio fitted at 2 tokens made every larger tree look too dear."""
        if self.cycles < CALIBRATE_AFTER:
            return None
        lo, hi = RATIO_RANGE

        def ratio(measured: float, model: float) -> float:  # shrunk towards 1 by PRIOR_CYCLES of the model
            if model <= 0:
                return 1.0
            r = (measured + PRIOR_CYCLES * model / self.cycles) / (model + PRIOR_CYCLES * model / self.cycles)
            return round(min(hi, max(lo, r)), 4)

        offset = (self.verify_ms - self.verify_model) / (self.cycles + PRIOR_CYCLES)
        return {"tau": ratio(self.accepted, self.accepted_model), "draft": ratio(self.draft_ms, self.draft_model),
                "verify_ms": round(offset, 3), "cycles": self.cycles}

    def due(self) -> bool:
        return self.since_choice >= CALIBRATE_AFTER

    def book(self, row: dict | None, event) -> dict | None:
        """Add one decoded cycle (a core.decoding.StepEvent) of the tree in grid row `row`; the ratios when a
        new choice is due, else None (also for a cycle without a tree or a shape the grid lacks)."""
        if row is None or not len(event.tree):
            return None
        self.add(row, len(event.accepted), 1000.0 * event.draft_time, 1000.0 * event.verify_time)
        ratios = self.ratios() if self.due() else None
        if ratios is not None:
            self.since_choice = 0
        return ratios


def grid_row(choice: dict | None, depth: int | None, total_tokens: int) -> dict | None:
    """The row of `choice`'s grid for a tree of this shape (depth None: any depth), or None."""
    for row in (choice or {}).get("grid") or ():
        if row["total_tokens"] == total_tokens and (depth is None or row["depth"] == depth) and "tau_model" in row:
            return row
    return None


def keep_or_move(current: dict, candidate: dict, match_depth: bool = True) -> dict:
    """After calibration: `candidate` (a new choice) unless its best shape promises less than CALIBRATE_MARGIN
    more tokens/s than the current shape does under the same calibration; then `candidate` re-pointed at the
    current shape, so the app and the summary show the calibrated figures of the tree that runs. match_depth
    False: a static tree, whose grid rows are keyed by size alone."""
    row = grid_row(candidate, current.get("depth") if match_depth else None, current.get("total_tokens"))
    if row is None or candidate.get("expected_tokens_per_s") is None:
        return candidate
    if candidate["expected_tokens_per_s"] > row["tokens_per_s"] * (1.0 + CALIBRATE_MARGIN):
        return candidate
    return {**candidate, "depth": current["depth"], "total_tokens": current["total_tokens"],
            "expected_tau": row["tau"], "expected_tokens_per_s": row["tokens_per_s"], "cycle_ms": row["ms"]}


def trial_enabled() -> bool:
    """`auto` dynamic trees try their candidate shapes in decoding (core.tree_trial) unless SPECLENS_TREE_TRIAL=0
    (then the cost model, calibrated from decoded cycles, sizes them); only where calibration_enabled."""
    return os.environ.get("SPECLENS_TREE_TRIAL", "1") != "0"


def calibration_enabled(target: Target) -> bool:
    """Calibrate from timings only where the curve is timed too: never on the tiny test target or with the
    fixed cost model (SPECLENS_COST_MODEL=fixed), nor with SPECLENS_CALIBRATE=0."""
    if os.environ.get("SPECLENS_CALIBRATE", "1") == "0":
        return False
    return not (is_tiny(target) or os.environ.get("SPECLENS_COST_MODEL", "").lower() == "fixed")


def calibrate_dynamic_tree(drafter, event) -> None:
    """Book one decoded cycle (a core.decoding.StepEvent) of an `auto` dynamic tree against its predicted
    figures, and every CALIBRATE_AFTER cycles choose the tree again from measured / predicted ratios
    (module docstring, "Calibration from decoded cycles"; trained.resolve_auto_tree opened the ledger).
    Nothing for a fixed tree or a tiny target. TrainedDrafter.observe calls it."""
    choice, ledger = getattr(drafter, "tree_choice", None), getattr(drafter, "tree_ledger", None)
    if ledger is None or not choice or choice.get("depth") is None or not getattr(drafter, "tree_auto", False):
        return
    trial = getattr(drafter, "tree_trial", None)
    if trial is not None:  # the shape is decided by measured tokens/s (core.tree_trial), not by the model
        if len(event.tree):
            trial.book((int(drafter.config.depth), int(drafter.config.total_tokens)), len(event.new_tokens),
                       event.draft_time + event.verify_time)
            drafter.config.depth, drafter.config.total_tokens = trial.next_shape()
            choice["trial"] = trial.record()
            if trial.done:
                choice["depth"], choice["total_tokens"] = trial.winner
        return
    ratios = ledger.book(grid_row(choice, drafter.config.depth, drafter.config.total_tokens), event)
    if ratios is None:
        return
    new = choose_tree(choice["method"], curve=choice["curve"], acceptance=drafter.tree_acceptance_used,
                      top_k=int(drafter.config.top_k), calibration=ratios)
    if new["depth"] is None:
        return
    new = keep_or_move(choice, new)
    drafter.config.depth, drafter.config.total_tokens = int(new["depth"]), int(new["total_tokens"])
    drafter.tree_choice = new


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

