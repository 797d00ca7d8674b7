"""`make gpu-check` (scripts/gpu_check.py): without CUDA it says it skipped and exits 0, running nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_skips_plainly_without_a_gpu(monkeypatch, capsys):
    mod = _module()
    monkeypatch.setattr(mod, "cuda_available", lambda: False)
    monkeypatch.setattr(mod, "lossless", lambda n: pytest.fail("nothing may run without a GPU"))
    assert mod.main([]) == 0
    assert "SKIPPED" in capsys.readouterr().out


def test_make_target_skips_here_when_there_is_no_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the skip path is not what runs here")
    done = subprocess.run([sys.executable, "scripts/gpu_check.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "SKIPPED" in done.stdout


def test_bad_arguments_are_one_line_errors():
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--questions", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--questions 0" in done.stderr


def test_unknown_method_is_a_one_line_error():
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--methods", "ar,eagle3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--methods eagle3" in done.stderr


def test_cpu_dry_run_runs_every_stage_and_writes_the_report(tmp_path):
    """`--device cpu` runs the GPU check's stages here (two methods, a few tokens, no training)."""
    import json
    import os

    env = {**os.environ, "SPECLENS_COST_MODEL": "fixed"}  # no timing of the cost curve in a test
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--methods", "ar,pld",
                           "--questions", "1", "--max-new-tokens", "4", "--lossless-tokens", "8",
                           "--lossless-prompts", "1", "--skip-train", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["lossless"]["ok"] and report["lossless"]["result"]["per_method"]["pld"]["identical"] == 1
    assert report["benchmark"]["ok"] and {r["method"] for r in report["benchmark"]["result"]["table"]} == {"ar", "pld"}
    assert report["train_smoke"]["result"] == "skipped (--skip-train)"
