"""What exact resuming needs: the learning-rate schedule, RNG states, atomic saves, log truncation,
and the hardware record a checkpoint carries."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the base lr for optimiser step `step` (0-based): linear warm-up, then cosine."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def rng_state() -> dict:
    """Every RNG stream's state, as tensors and plain Python values (numpy's key array as a list), so
    that the training state loads with torch.load(weights_only=True) (load_training_state)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(gauss)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# What numpy arrays unpickle through: state files written before rng_state stored numpy's state as
# a list hold one array (numpy's RNG keys). Nothing else beyond tensors and plain values is allowed.
_NUMPY_ARRAY_GLOBALS = [getattr(np, "_core", None) and np._core.multiarray._reconstruct, np.ndarray, np.dtype,
                        type(np.dtype(np.uint32))]


def load_training_state(path: Path) -> dict:
    """A training state file, read with torch.load(weights_only=True): tensors and plain values only,
    never code named by the file (it sits in a user-chosen folder). On CPU: RNG states must stay there."""
    import pickle

    allowed = [g for g in _NUMPY_ARRAY_GLOBALS if g]
    try:
        with torch.serialization.safe_globals(allowed):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "unsupported content"
        raise ValueError(f"{path} holds more than tensors and plain values, so it is not read ({first}); "
                         f"pass --restart or another --out") from None
    except (RuntimeError, EOFError) as err:  # truncated or not a torch file
        raise ValueError(f"{path} cannot be read as a training state ({err}); pass --restart or another "
                         f"--out") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a training state (a dict); pass --restart or another --out")
    return state


@contextlib.contextmanager
def isolated_rng(seed: int, device: torch.device):
    """Run a block (evaluation, export) without touching the training RNG streams."""
    devices = [device.index or 0] if device.type == "cuda" else []
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def hardware() -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def peak_memory_gb(device: torch.device) -> float:
    """Peak resident memory of this process (CPU) or peak allocated memory (CUDA), in GB."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # ru_maxrss is in KB on Linux


def atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def truncate_log(path: Path, step: int) -> None:
    """Drop the log lines past `step` (all of them for step -1): a resumed run rewrites its tail."""
    if not path.exists():
        return
    from core.training.curves import read_log

    rows = [r for r in read_log(path) if r.get("step", 0) <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)
