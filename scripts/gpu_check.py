"""`make gpu-check`: the GPU benchmark in one command (issues 23 and 50).

On a machine with CUDA it runs these stages, captured passes (core.static_pass) beside eager ones. Each stage
runs even when an earlier one failed, and the report (--out/gpu_check.json) is rewritten after every stage, so
one short lease on a GPU machine yields every figure it can; the exit status is non-zero when any stage failed.

1. passes: the target pass of 1-64 tokens against the bare-matmul floor, and plain decoding's step against
   its 1-token pass, for eager and captured passes alike (bfloat16 where the GPU supports it);
2. the float32 lossless check for every method, on captured passes: greedy speculative output equals greedy
   plain decoding token for token (shipped drafters, a few held-out prompts);
3. a benchmark of every method on captured passes (held-out questions, one interleaved run, trees sized by
   the GPU's own measured cost curve: analysis.bench, written to --out/bench-captured), then
4. a profile of EAGLE-2's and MoA's cycles on captured passes: drafting and verify ms, operator calls, host-device
   syncs and the operators that take the most host and device time (torch.profiler);
5. the same benchmark on eager passes (--out/bench-eager);
6. a tiny training smoke test through `accelerate launch` (every drafter jointly, a few steps).

A stage that would start after --budget-s seconds is skipped and says so, and the benchmarks stop at the
budget, so the whole check fits one call. Without CUDA it says plainly that it skipped and exits 0.
`--device cpu` runs the same stages on the CPU, with fixed-buffer passes run eagerly ("static") standing in
for captured ones: a dry run of the script itself, not a GPU figure.

    python scripts/gpu_check.py [--out runs/gpu-check] [--questions 6] [--max-new-tokens 64] [--budget-s 560]

A session lent a device commits the folder as assets/results/gpu_<kind>/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.methods import BASELINE, lookup_names, shipped_names, tli_of  # noqa: E402  (after the path insert)

METHODS = [*shipped_names(), *lookup_names()]  # every shipped method, and each trained one with a lookup branch
QUESTIONS = ROOT / "assets" / "prompts" / "speclens_eval.jsonl"
PASS_SIZES = (1, 2, 4, 8, 16, 32, 64)
FLAGSHIPS = [m for m in shipped_names(tree="dynamic") if not tli_of(m)]  # EAGLE-2 and MoA N=0: the 1.5x bar
BARS = {"pass_over_floor": 3.0, "step_over_pass": 1.2, "speedup_eagle2_moa": 1.5}  # issue 50's GPU bars

TRAIN_DATA = ROOT / "assets" / "distill_v5" / "distill.npz"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/gpu-check", help="folder for the benchmark and the training smoke run")
    p.add_argument("--questions", type=int, default=6,
                   help="held-out questions in each benchmark (>= 1; the default fits one 10-minute call)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per answer (1..512)")
    p.add_argument("--lossless-tokens", type=int, default=32, help="new tokens per lossless check (1..512)")
    p.add_argument("--lossless-prompts", type=int, default=2, help="held-out prompts in the lossless check (>= 1)")
    p.add_argument("--pass-repeats", type=int, default=15, help="timed rounds per pass size (1..100)")
    p.add_argument("--budget-s", type=int, default=560,
                   help="seconds the whole check may take: later stages are skipped, benchmarks cut (60..3600)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated methods (default: every method; ar is always included)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (the check); cpu runs the same stages here as a dry run of the script")
    p.add_argument("--skip-train", action="store_true", help="skip the training smoke test")
    args = p.parse_args(argv)
    for flag, value, hi in (("--questions", args.questions, 10_000), ("--max-new-tokens", args.max_new_tokens, 512),
                            ("--lossless-tokens", args.lossless_tokens, 512),
                            ("--lossless-prompts", args.lossless_prompts, 80),
                            ("--pass-repeats", args.pass_repeats, 100)):
        if not 1 <= value <= hi:
            p.error(f"{flag} {value}: give an integer between 1 and {hi}")
    if not 60 <= args.budget_s <= 3600:
        p.error(f"--budget-s {args.budget_s}: give a number of seconds between 60 and 3600")
    from core.methods import check_method

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for label in methods:
        try:
            check_method(label)
        except (ValueError, KeyError) as err:
            p.error(f"--methods {label}: {err}")
    args.methods = [BASELINE] + [m for m in dict.fromkeys(methods) if m != BASELINE]
    return args


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def lossless(n_tokens: int, methods: list[str] | None = None, device: str = "cuda", prompts: int = 3,
             passes: str = "auto") -> dict:
    """Every method in float32 on `passes` passes: speculative output == plain output (on eager passes), per
    method and prompt."""
    from core.decoding import generate
    from core.methods import build_drafter
    from core.target import load_target

    methods = methods or METHODS
    target = load_target(None, "float32", device)
    lines = [line for line in QUESTIONS.read_text().splitlines() if line.strip()]
    texts = [json.loads(line)["turns"][0] for line in lines[:prompts]]
    results: dict[str, dict] = {}
    for prompt in texts:
        ids = target.chat_ids(prompt)
        target.pass_mode = "eager"
        plain = generate(target, build_drafter(BASELINE, target), ids, n_tokens).token_ids
        target.pass_mode = passes
        for method in methods:  # ar too: plain decoding on these passes against plain decoding on eager ones
            got = generate(target, build_drafter(method, target), ids, n_tokens)
            same = got.token_ids == plain
            row = results.setdefault(method, {"identical": 0, "prompts": 0, "tau": []})
            row["identical"] += int(same)
            row["prompts"] += 1
            row["tau"].append(round(got.mean_accepted, 3))
            print(f"  lossless {method:16s} tau {got.mean_accepted:4.2f}  {'identical' if same else 'DIFFERENT'}",
                  flush=True)
    return results


def benchmark(folder: Path, questions: int, max_new_tokens: int, methods: list[str] | None = None,
              device: str = "cuda", passes: str = "auto", timeout: float | None = None) -> int:
    """analysis.bench on `passes` passes into `folder` (a fresh run each time); 124 when cut at `timeout`."""
    cmd = [sys.executable, "-m", "analysis.bench", "--questions", str(QUESTIONS),
           "--methods", ",".join(methods or METHODS), "--limit", str(questions), "--max-new-tokens",
           str(max_new_tokens), "--dtype", "auto", "--device", device, "--passes", passes, "--out", str(folder),
           "--no-record", "--overwrite"]
    print("  " + " ".join(cmd), flush=True)
    try:
        return subprocess.call(cmd, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124


def pass_times(device: str, modes: list[str], sizes: tuple[int, ...] = PASS_SIZES, repeats: int = 15,
               plain_tokens: int = 48) -> dict:
    """Per pass mode: the target pass of each size over a 200-token cache (median ms, as the cost curve times
    it), as a multiple of the bare-matmul floor; and plain decoding's step (wall time / steps of a greedy
    answer) against the 1-token pass. bfloat16 where the device multiplies it natively."""
    import statistics

    from core.decoding import generate
    from core.drafters.base import Autoregressive
    from core.target import load_target
    from core.trees.cost_curve import matmul_floor_ms, time_pass_sizes

    target = load_target(None, "auto", device)
    floor = matmul_floor_ms(target, cache_path=None)
    ids = target.chat_ids(json.loads(QUESTIONS.read_text().splitlines()[0])["turns"][0])
    rows: dict = {"dtype": str(target.dtype).replace("torch.", ""), "floor_ms": round(floor, 4), "modes": {}}
    for mode in modes:
        target.pass_mode = mode
        ms = time_pass_sizes(target, list(sizes), repeats, 200)
        generate(target, Autoregressive(), ids, 8)  # warm-up (captures the 1-token graph)
        steps = [generate(target, Autoregressive(), ids, plain_tokens) for _ in range(3)]
        step_ms = statistics.median(1000.0 * r.wall_time / r.steps for r in steps)
        row = {"pass_ms": dict(zip(map(str, sizes), (round(m, 3) for m in ms))),
               "pass_over_floor": dict(zip(map(str, sizes), (round(m / floor, 2) for m in ms))),
               "plain_step_ms": round(step_ms, 3), "plain_tokens_per_s": round(1000.0 / step_ms, 1),
               "step_over_pass": round(step_ms / ms[0], 2)}
        rows["modes"][mode] = row
        print(f"  {mode:8s} pass ms " + "  ".join(f"{n}:{m:.2f}" for n, m in zip(sizes, ms))
              + f"  | floor {floor:.2f} ms, 1-token pass {ms[0] / floor:.1f}x floor | plain step {step_ms:.2f} ms"
              f" = {step_ms / ms[0]:.2f}x its pass", flush=True)
    return rows


def _device_us(e) -> float:
    """An operator's own device time in a profile (the field's name changed across torch versions)."""
    return float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0))


def _top_ops(events, key, cycles: int, top: int) -> list[dict]:
    """The `top` operators of a profile by `key`, per cycle."""
    return [{"op": e.key, "calls_per_cycle": round(e.count / cycles, 1),
             "host_ms_per_cycle": round(e.self_cpu_time_total / 1000 / cycles, 3),
             "device_ms_per_cycle": round(_device_us(e) / 1000 / cycles, 3)}
            for e in sorted(events, key=key, reverse=True)[:top]]


def profile_cycles(device: str, passes: str, methods: list[str], tokens: int = 32, top: int = 12) -> dict:
    """Where a drafting cycle's time goes on this device, for the methods given: per cycle, drafting and verify
    ms and the operator calls each side makes (analysis.op_count), then one generation under torch.profiler
    with the operators that took the most host time and the most device time, and the reads to the host per
    cycle (scalar reads and device-to-host copies: the points where the host waits for a GPU). bfloat16 where
    supported."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from analysis.op_count import count
    from core.decoding import generate
    from core.methods import build_drafter
    from core.target import load_target

    target = load_target(None, "auto", device)
    target.pass_mode = passes
    ids = target.chat_ids(json.loads(QUESTIONS.read_text().splitlines()[1])["turns"][0])
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    rows: dict = {}
    for method in methods:
        drafter = build_drafter(method, target)
        generate(target, drafter, ids, 8)  # warm-up: graphs captured, tree sized
        calls = count(target, drafter, ids, tokens)
        with profile(activities=activities) as prof:
            result = generate(target, drafter, ids, tokens)
        cycles = max(1, result.steps - 1)
        events = prof.key_averages()

        top_host = _top_ops(events, lambda e: e.self_cpu_time_total, cycles, top)
        top_device = _top_ops(events, _device_us, cycles, top) if device == "cuda" else []
        # one-element reads to the host (.item(), int(), a scalar .tolist()) and device-to-host copies: each
        # makes the host wait for the device when its tensor lives there (on a CPU they only count the reads)
        reads = sum(e.count for e in events if e.key in ("aten::_local_scalar_dense", "cudaStreamSynchronize")
                    or "DtoH" in e.key)
        rows[method] = {
            "cycles": cycles, "tau": round(result.mean_accepted, 3),
            "draft_ms_per_cycle": round(1000 * sum(e.draft_time for e in result.events[1:]) / cycles, 3),
            "verify_ms_per_cycle": round(1000 * sum(e.verify_time for e in result.events[1:]) / cycles, 3),
            "operator_calls": {k: round(v, 1) for k, v in calls.items() if k != "cycles"},
            "host_reads_per_cycle": round(reads / cycles, 1),
            "top_host": top_host, "top_device": top_device,
        }
        r = rows[method]
        print(f"  {method:10s} draft {r['draft_ms_per_cycle']:.2f} ms, verify {r['verify_ms_per_cycle']:.2f} ms a "
              f"cycle; drafting {r['operator_calls']['draft_operator_calls']:.0f} operator calls, "
              f"{r['host_reads_per_cycle']} reads to the host a cycle; most host time: "
              + ", ".join(f"{x['op']} {x['host_ms_per_cycle']:.2f}" for x in r["top_host"][:4]), flush=True)
        del drafter
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def train_smoke(out: Path, device: str = "cuda") -> int:
    beside = Path(sys.executable).parent / "accelerate"  # the venv's own launcher first
    launcher = str(beside) if beside.is_file() else shutil.which("accelerate")
    cmd = ([launcher, "launch", "--num_processes", "1", "-m"] if launcher else [sys.executable, "-m"])
    if launcher and device == "cpu":
        cmd[2:2] = ["--cpu"]
    cmd += ["core.training.train", "--drafters", "eagle2,moa,medusa,amphista", "--data", str(TRAIN_DATA),
            "--out", str(out / "train-smoke"), "--steps", "3", "--batch-tokens", "1024", "--warmup", "1",
            "--eval-every", "0", "--eval-tokens", "512", "--final-eval-tokens", "1024", "--restart",
            "--no-progress"]
    if not launcher:
        print("  (accelerate's launcher is not on PATH: running the trainer directly)", flush=True)
    print("  " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def _stage(name: str, report: dict, fn, path: Path) -> bool:
    """Run one stage; a crash is reported with its traceback and the next stage still runs. The report is
    written after every stage, so a run cut short still leaves what it measured."""
    t0 = time.time()
    try:
        ok, value = fn()
    except Exception as err:  # noqa: BLE001 - one stage's crash must not cost the other stages' figures
        traceback.print_exc()
        ok, value = False, f"{type(err).__name__}: {err}"
    report[name] = {"ok": ok, "seconds": round(time.time() - t0, 1), "result": value}
    path.write_text(json.dumps(report, indent=1))
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not cuda_available():
        print("gpu-check: SKIPPED - no CUDA GPU on this machine (torch.cuda.is_available() is False); "
              "nothing was run.")
        return 0
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU dry run ({os.cpu_count()} cores)"
    print(f"gpu-check on {name} (torch {torch.__version__})", flush=True)
    report: dict = {"device": name, "torch": torch.__version__, "methods": args.methods}
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except ImportError:
        pass
    report_path = out / "gpu_check.json"
    t0 = time.time()

    fast = "captured" if args.device == "cuda" else "static"  # on the CPU the fixed buffers stand in
    report["passes_compared"] = ["eager", fast]

    def left() -> float:
        return args.budget_s - (time.time() - t0)

    def stage_passes():
        rows = pass_times(args.device, ["eager", fast], repeats=args.pass_repeats, plain_tokens=args.max_new_tokens)
        return True, rows

    def stage_lossless():
        rows = lossless(args.lossless_tokens, args.methods, args.device, args.lossless_prompts, fast)
        different = [m for m, r in rows.items() if r["identical"] != r["prompts"]]
        return not different, {"passes": fast, "per_method": rows, "different": different}

    def stage_bench(mode: str):
        folder = out / f"bench-{mode}"
        rc = benchmark(folder, args.questions, args.max_new_tokens, args.methods, args.device, mode,
                       timeout=max(1.0, left()))
        path = folder / "summary.json"
        if rc or not path.is_file():
            return False, ("stopped at --budget-s" if rc == 124 else f"analysis.bench exited with {rc}")
        from analysis.bench import floor_table
        from analysis.report import readme_table

        summary = json.loads(path.read_text())
        print(readme_table(summary), flush=True)
        print(floor_table(summary), flush=True)
        cfg = summary.get("config", {})
        speedups = {m: round(r["overall"]["speedup"], 3) for m, r in summary["methods"].items()}
        return True, {"passes": mode, "floor_ms": cfg.get("floor_ms"), "cost_curve": cfg.get("cost_curve"),
                      "trees": cfg.get("trees"), "speedup": speedups, "table": summary.get("table")}

    def stage_profile():
        return True, profile_cycles(args.device, fast, FLAGSHIPS, tokens=min(32, args.max_new_tokens))

    def stage_train():
        if args.skip_train:
            return True, "skipped (--skip-train)"
        rc = train_smoke(out, args.device)
        return rc == 0, f"trainer exited with {rc}"

    stages = [("passes", f"target pass against its floor, plain step against its pass (eager, {fast})",
               stage_passes),
              ("lossless", f"float32 lossless check, every method on {fast} passes", stage_lossless),
              (f"benchmark_{fast}", f"benchmark, every method, {fast} passes", lambda: stage_bench(fast)),
              ("profile", f"where a drafting cycle's time goes ({', '.join(FLAGSHIPS)}, {fast} passes)",
               stage_profile),
              ("benchmark_eager", "benchmark, every method, eager passes", lambda: stage_bench("eager")),
              ("train_smoke", "tiny training smoke test (accelerate)", stage_train)]
    ok = True
    for i, (key, title, fn) in enumerate(stages, 1):
        if left() < 15:
            print(f"{i}/{len(stages)} {title}: SKIPPED, --budget-s {args.budget_s} is spent", flush=True)
            report[key] = {"ok": False, "seconds": 0, "result": f"skipped: --budget-s {args.budget_s} spent"}
            ok = False
            continue
        print(f"{i}/{len(stages)} {title}", flush=True)
        ok &= _stage(key, report, fn, report_path)
        report["bars"] = bars(report, fast)
        report_path.write_text(json.dumps(report, indent=1))
    report["seconds"] = round(time.time() - t0, 1)
    report_path.write_text(json.dumps(report, indent=1))
    for name, bar in report["bars"].items():
        print(f"  bar {name}: {bar}", flush=True)
    failed = [key for key, _, _ in stages if not report[key]["ok"]]
    if failed:
        print(f"gpu-check: FAILED - {', '.join(failed)} (details above and in {report_path})")
        return 1
    print(f"gpu-check: PASSED in {report['seconds']:.0f} s; figures in {report_path}")
    return 0


def bars(report: dict, fast: str) -> dict:
    """Issue 50's GPU bars, from what the report holds so far (a bar whose figures are missing says so)."""
    out: dict = {}
    passes = report.get("passes", {}).get("result")
    row = passes.get("modes", {}).get(fast) if isinstance(passes, dict) else None
    if row:
        x = row["pass_over_floor"]["1"]
        out["pass <= 3x floor"] = f"{'met' if x <= BARS['pass_over_floor'] else 'not met'}: {x}x ({fast})"
        y = row["step_over_pass"]
        out["plain step <= 1.2x pass"] = f"{'met' if y <= BARS['step_over_pass'] else 'not met'}: {y}x ({fast})"
    bench = report.get(f"benchmark_{fast}", {}).get("result")
    if isinstance(bench, dict):
        sp = {m: v for m, v in bench["speedup"].items() if m != BASELINE}
        slow = [m for m, v in sp.items() if v <= 1.0]
        out["every method faster than plain"] = "met" if not slow else f"not met: {', '.join(slow)}"
        key = [m for m in FLAGSHIPS if m in sp]
        low = [f"{m} {sp[m]}x" for m in key if sp[m] < BARS["speedup_eagle2_moa"]]
        out["eagle2 and moa >= 1.5x"] = ("met: " if not low else "not met: ") + ", ".join(
            f"{m} {sp[m]}x" for m in key)
    return out


if __name__ == "__main__":
    sys.exit(main())
