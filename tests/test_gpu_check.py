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
