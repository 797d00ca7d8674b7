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
                           "--lossless-prompts", "1", "--pass-repeats", "1", "--skip-train", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["passes_compared"] == ["eager", "static"]  # fixed buffers stand in for captured passes
    for mode in ("eager", "static"):
        row = report["passes"]["result"]["modes"][mode]
        assert set(row["pass_ms"]) == {"1", "2", "4", "8", "16", "32", "64"} and row["step_over_pass"] > 0
    lossless = report["lossless"]["result"]
    assert report["lossless"]["ok"] and lossless["passes"] == "static"
    assert lossless["per_method"]["pld"]["identical"] == lossless["per_method"]["ar"]["identical"] == 1
    for mode in ("static", "eager"):
        bench = report[f"benchmark_{mode}"]
        assert bench["ok"] and bench["result"]["passes"] == mode
        assert {r["method"] for r in bench["result"]["table"]} == {"ar", "pld"}
    assert set(report["bars"]) == {"pass <= 3x floor", "plain step <= 1.2x pass", "every method faster than plain",
                                   "eagle2 and moa >= 1.5x"}
    assert report["train_smoke"]["result"] == "skipped (--skip-train)"


def test_a_spent_budget_skips_the_later_stages_and_says_so(tmp_path, monkeypatch, capsys):
    mod = _module()
    monkeypatch.setattr(mod, "cuda_available", lambda: True)
    calls = []
    monkeypatch.setattr(mod, "pass_times", lambda *a, **k: calls.append("passes") or {"modes": {}})
    monkeypatch.setattr(mod, "lossless", lambda *a, **k: pytest.fail("over budget: must not run"))
    clock = iter([0.0, 0.0, 0.0, 10_000.0] + [10_000.0] * 50)
    monkeypatch.setattr(mod.time, "time", lambda: next(clock))
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i=0: "a test GPU")
    assert mod.main(["--out", str(tmp_path), "--budget-s", "60", "--skip-train"]) == 1
    report = __import__("json").loads((tmp_path / "gpu_check.json").read_text())
    assert calls == ["passes"] and report["lossless"]["result"] == "skipped: --budget-s 60 spent"
    assert "SKIPPED, --budget-s 60 is spent" in capsys.readouterr().out
