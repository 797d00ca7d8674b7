"""`make gpu-train` (scripts/gpu_train.sh) as a CPU dry run: the burst a lent GPU would run, at toy size, trains
MoA from random weights with the recipe the script names and leaves what comes back under $OUT: a checkpoint in
files under 16 MB that loads as a drafter, and the run's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.real
def test_cpu_dry_run_brings_back_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "GPU_DEVICE": "cpu", "GPU_DTYPE": "float32", "GPU_MIN": "0.4",
           "GPU_BATCH_TOKENS": "512", "GPU_EVAL_TOKENS": "512", "GPU_RUN": str(tmp_path / "run"), "OUT": str(out)}
    proc = subprocess.run(["bash", "scripts/gpu_train.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = out / "gpu-moa" / "final"
    shards = sorted(final.glob("*.safetensors"))
    assert shards and all(f.stat().st_size < 16 * 2**20 for f in shards)
    assert (out / "gpu-moa" / "log.jsonl").is_file()
    card = json.loads((final / "config.json").read_text())["config"]
    # the recipe the script's header names: the reference's switches plus the memory read
    assert card["memory_loss"] == 1 and card["own_row_reads"] and card["memory_norm"] and card["ca_mlp"]
    assert card["reference_init"] and not card["init_from_target"] and card["staircase"] == "random"

    from core.methods import build_drafter
    from core.target import load_target

    drafter = build_drafter("moa", load_target(dtype="float32", device="cpu"), str(final))
    assert type(drafter).__name__ == "MoADrafter" and drafter.config.memory_loss == 1
