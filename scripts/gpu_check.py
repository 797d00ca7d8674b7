"""`make gpu-check`: the GPU path in one command (issue 23).

On a machine with CUDA it runs, in order, and stops at the first failure (non-zero exit):

1. the float32 lossless check for every method: greedy speculative output equals greedy plain decoding
   token for token (shipped drafters, a few held-out prompts);
2. a short benchmark of every method (bfloat16 where the GPU supports it, held-out prompts, one
   interleaved run: analysis.bench, written to --out), whose table it prints;
3. a tiny training smoke test through `accelerate launch` (every drafter jointly, a few steps).

Without CUDA it says plainly that it skipped and exits 0.

    python scripts/gpu_check.py [--out runs/gpu-check] [--questions N] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

METHODS = ["ar", "pld", "eagle2", "moa", "moa-tli1", "moa-tli3", "medusa", "amphista", "eagle2+lookup",
           "moa+lookup", "medusa+lookup", "amphista+lookup"]
QUESTIONS = ROOT / "assets" / "prompts" / "speclens_eval.jsonl"
TRAIN_DATA = ROOT / "assets" / "distill_v5" / "distill.npz"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/gpu-check", help="folder for the benchmark and the training smoke run")
    p.add_argument("--questions", type=int, default=13, help="held-out questions in the benchmark (>= 1)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per answer (1..512)")
    p.add_argument("--lossless-tokens", type=int, default=48, help="new tokens per lossless check (1..512)")
    p.add_argument("--skip-train", action="store_true", help="skip the training smoke test")
    args = p.parse_args(argv)
    for flag, value, hi in (("--questions", args.questions, 10_000), ("--max-new-tokens", args.max_new_tokens, 512),
                            ("--lossless-tokens", args.lossless_tokens, 512)):
        if not 1 <= value <= hi:
            p.error(f"{flag} {value}: give an integer between 1 and {hi}")
    return args


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def lossless(n_tokens: int) -> list[str]:
    """Every method in float32 on CUDA: speculative output == plain output. Returns the failures."""
    from core.decoding import generate
    from core.methods import build_drafter
    from core.target import load_target

    target = load_target(None, "float32", "cuda")
    prompts = [json.loads(line)["turns"][0] for line in QUESTIONS.read_text().splitlines()[:3] if line.strip()]
    failures = []
    for prompt in prompts:
        ids = target.chat_ids(prompt)
        plain = generate(target, build_drafter("ar", target), ids, n_tokens).token_ids
        for method in METHODS[1:]:
            got = generate(target, build_drafter(method, target), ids, n_tokens)
            same = got.token_ids == plain
            print(f"  lossless {method:16s} tau {got.mean_accepted:4.2f}  {'identical' if same else 'DIFFERENT'}",
                  flush=True)
            if not same:
                failures.append(method)
    return failures


def benchmark(out: Path, questions: int, max_new_tokens: int) -> int:
    cmd = [sys.executable, "-m", "analysis.bench", "--questions", str(QUESTIONS), "--methods", ",".join(METHODS),
           "--limit", str(questions), "--max-new-tokens", str(max_new_tokens), "--dtype", "auto", "--device", "cuda",
           "--out", str(out / "bench"), "--no-record"]
    print("  " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def train_smoke(out: Path) -> int:
    beside = Path(sys.executable).parent / "accelerate"  # the venv's own launcher first
    launcher = str(beside) if beside.is_file() else shutil.which("accelerate")
    cmd = ([launcher, "launch", "--num_processes", "1", "-m"] if launcher else [sys.executable, "-m"])
    cmd += ["core.training.train", "--drafters", "eagle2,moa,medusa,amphista", "--data", str(TRAIN_DATA),
            "--out", str(out / "train-smoke"), "--steps", "3", "--batch-tokens", "1024", "--warmup", "1",
            "--eval-every", "0", "--eval-tokens", "512", "--final-eval-tokens", "1024", "--restart",
            "--no-progress"]
    if not launcher:
        print("  (accelerate's launcher is not on PATH: running the trainer directly)", flush=True)
    print("  " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not cuda_available():
        print("gpu-check: SKIPPED - no CUDA GPU on this machine (torch.cuda.is_available() is False); "
              "nothing was run.")
        return 0
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"gpu-check on {torch.cuda.get_device_name(0)} (torch {torch.__version__})", flush=True)
    t0 = time.time()
    print("1/3 float32 lossless check, every method", flush=True)
    failed = lossless(args.lossless_tokens)
    if failed:
        print(f"gpu-check: FAILED - greedy output differs from plain decoding for {', '.join(failed)}")
        return 1
    print("2/3 short benchmark, every method", flush=True)
    if benchmark(out, args.questions, args.max_new_tokens):
        print("gpu-check: FAILED - the benchmark did not finish")
        return 1
    if args.skip_train:
        print("3/3 training smoke test: skipped (--skip-train)")
    else:
        print("3/3 tiny training smoke test (accelerate)", flush=True)
        if train_smoke(out):
            print("gpu-check: FAILED - the training smoke test did not finish")
            return 1
    print(f"gpu-check: PASSED in {time.time() - t0:.0f} s; benchmark in {out / 'bench'}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
