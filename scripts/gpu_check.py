"""`make gpu-check`: the GPU path in one command (issue 23).

On a machine with CUDA it runs three stages. Each stage runs even when an earlier one failed, so one short
lease on a GPU machine yields every figure it can; the exit status is non-zero when any stage failed.

1. the float32 lossless check for every method: greedy speculative output equals greedy plain decoding
   token for token (shipped drafters, a few held-out prompts);
2. a short benchmark of every method (bfloat16 where the GPU supports it, held-out prompts, one
   interleaved run, trees sized by the GPU's own measured cost curve: analysis.bench, written to
   --out/bench), whose tables it prints;
3. a tiny training smoke test through `accelerate launch` (every drafter jointly, a few steps).

Every figure also goes to --out/gpu_check.json. Without CUDA it says plainly that it skipped and exits 0.
`--device cpu` runs the same stages on the CPU: a dry run of the script itself, not a GPU figure.

    python scripts/gpu_check.py [--out runs/gpu-check] [--questions N] [--max-new-tokens 64]
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

from core.methods import BASELINE, lookup_names, shipped_names  # noqa: E402  (after the path insert)

METHODS = [*shipped_names(), *lookup_names()]  # every shipped method, and each trained one with a lookup branch
QUESTIONS = ROOT / "assets" / "prompts" / "speclens_eval.jsonl"
TRAIN_DATA = ROOT / "assets" / "distill_v5" / "distill.npz"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/gpu-check", help="folder for the benchmark and the training smoke run")
    p.add_argument("--questions", type=int, default=3,
                   help="held-out questions in the benchmark (>= 1; the default fits a 15-minute GPU lease)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per answer (1..512)")
    p.add_argument("--lossless-tokens", type=int, default=48, help="new tokens per lossless check (1..512)")
    p.add_argument("--lossless-prompts", type=int, default=3, help="held-out prompts in the lossless check (>= 1)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated methods (default: every method; ar is always included)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (the check); cpu runs the same stages here as a dry run of the script")
    p.add_argument("--skip-train", action="store_true", help="skip the training smoke test")
    args = p.parse_args(argv)
    for flag, value, hi in (("--questions", args.questions, 10_000), ("--max-new-tokens", args.max_new_tokens, 512),
                            ("--lossless-tokens", args.lossless_tokens, 512),
                            ("--lossless-prompts", args.lossless_prompts, 80)):
        if not 1 <= value <= hi:
            p.error(f"{flag} {value}: give an integer between 1 and {hi}")
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


def lossless(n_tokens: int, methods: list[str] | None = None, device: str = "cuda", prompts: int = 3) -> dict:
    """Every method in float32: speculative output == plain output, per method and prompt."""
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
        plain = generate(target, build_drafter(BASELINE, target), ids, n_tokens).token_ids
        for method in methods[1:]:
            got = generate(target, build_drafter(method, target), ids, n_tokens)
            same = got.token_ids == plain
            row = results.setdefault(method, {"identical": 0, "prompts": 0, "tau": []})
            row["identical"] += int(same)
            row["prompts"] += 1
            row["tau"].append(round(got.mean_accepted, 3))
            print(f"  lossless {method:16s} tau {got.mean_accepted:4.2f}  {'identical' if same else 'DIFFERENT'}",
                  flush=True)
    return results


def benchmark(out: Path, questions: int, max_new_tokens: int, methods: list[str] | None = None,
              device: str = "cuda") -> int:
    cmd = [sys.executable, "-m", "analysis.bench", "--questions", str(QUESTIONS),
           "--methods", ",".join(methods or METHODS), "--limit", str(questions), "--max-new-tokens",
           str(max_new_tokens), "--dtype", "auto", "--device", device, "--out", str(out / "bench"), "--no-record"]
    print("  " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


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

    def stage_lossless():
        rows = lossless(args.lossless_tokens, args.methods, args.device, args.lossless_prompts)
        different = [m for m, r in rows.items() if r["identical"] != r["prompts"]]
        return not different, {"per_method": rows, "different": different}

    def stage_bench():
        rc = benchmark(out, args.questions, args.max_new_tokens, args.methods, args.device)
        path = out / "bench" / "summary.json"
        if rc or not path.is_file():
            return False, f"analysis.bench exited with {rc}"
        from analysis.bench import floor_table
        from analysis.report import readme_table

        summary = json.loads(path.read_text())
        print(readme_table(summary), flush=True)
        print(floor_table(summary), flush=True)
        cfg = summary.get("config", {})
        return True, {"floor_ms": cfg.get("floor_ms"), "cost_curve": cfg.get("cost_curve"),
                      "trees": cfg.get("trees"), "table": summary.get("table")}

    def stage_train():
        if args.skip_train:
            return True, "skipped (--skip-train)"
        rc = train_smoke(out, args.device)
        return rc == 0, f"trainer exited with {rc}"

    print("1/3 float32 lossless check, every method", flush=True)
    ok = _stage("lossless", report, stage_lossless, report_path)
    print("2/3 short benchmark, every method", flush=True)
    ok &= _stage("benchmark", report, stage_bench, report_path)
    print("3/3 tiny training smoke test (accelerate)", flush=True)
    ok &= _stage("train_smoke", report, stage_train, report_path)
    report["seconds"] = round(time.time() - t0, 1)
    report_path.write_text(json.dumps(report, indent=1))
    failed = [k for k in ("lossless", "benchmark", "train_smoke") if not report[k]["ok"]]
    if failed:
        print(f"gpu-check: FAILED - {', '.join(failed)} (details above and in {out / 'gpu_check.json'})")
        return 1
    print(f"gpu-check: PASSED in {report['seconds']:.0f} s; figures in {out / 'gpu_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
