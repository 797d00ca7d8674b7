"""Checks of what a user types on a command line, shared by every CLI and run before any model loads.

Each check raises `UsageError` (a ValueError) with one plain line that names the bad value and
the valid ones; a CLI prints it with `report` and exits with status 2, as argparse does.
Output paths are checked (their folders created) before generating, so a run's result is
never computed and then lost.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

from core.target import Target, check_text, load_target

EXIT_USAGE = 2
TARGET_NAMES = ("smollm2",)
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes at most an unsigned 64-bit integer


class UsageError(ValueError):
    """A bad command-line value (one plain line)."""


def one_line(err: BaseException | str, limit: int = 400) -> str:
    """The first non-empty line of an error message, shortened to `limit` characters. A first line that ends
    with a colon (a list follows, as in "... from one of:") takes the following lines with it, joined by "; ",
    so the message is never cut off where it says what comes next."""
    text = str(err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__ if not text else text
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:
        line = f"{line} {'; '.join(lines[1:])}"
    return line if len(line) <= limit else line[:limit - 3] + "..."


def report(err: BaseException | str, code: int = EXIT_USAGE) -> int:
    """Print `error: <one line>` on stderr and return the exit status."""
    print(f"error: {one_line(err)}", file=sys.stderr)
    return code


def check_prompt(text: object, flag: str = "--prompt") -> str:
    """A non-empty prompt that is valid UTF-8 text."""
    check_text(text, f"{flag}")
    if not text.strip():
        raise UsageError(f"{flag} is empty: type something for the model to answer")
    return text


def check_int_range(value: int, flag: str, low: int, high: int | None = None) -> int:
    if high is not None and not low <= value <= high:
        raise UsageError(f"{flag} must be between {low} and {high}, got {value}")
    if value < low:
        raise UsageError(f"{flag} must be at least {low}, got {value}")
    return value


def check_max_new_tokens(value: int, flag: str = "--max-new-tokens") -> int:
    from core.decoding import MAX_NEW_TOKENS_LIMIT

    return check_int_range(value, flag, 1, MAX_NEW_TOKENS_LIMIT)


def check_seed(value: str | int | None, flag: str = "--seed", high: int = SEED_MAX) -> int | None:
    """A seed: a whole number from 0 to `high` (default 2**64 - 1, the most torch's generators take); None (no
    seed given) stays None. A CLI declares its seed option `type=str` and converts it here, so "1e23" or "0.5"
    is refused in one line (argparse's own refusal prints its usage first) and a seed too large for a 64-bit
    generator is refused before any model loads, not when the generator is seeded."""
    if value is None:
        return None
    valid = f"give a whole number from 0 to {high}" + (" (2**64 - 1)" if high == SEED_MAX else "")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(f"{flag} {value!r} is not a whole number; {valid}")
    if isinstance(value, str):
        text = value.strip()
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise UsageError(f"{flag} {shown!r} is not a whole number; {valid}")
        if len(text.lstrip("+-").lstrip("0")) > len(str(high)):  # too long to be in range (and to convert)
            raise UsageError(f"{flag} {shown} is out of range; {valid}")
        value = int(text)
    if not 0 <= value <= high:
        raise UsageError(f"{flag} {value} is out of range; {valid}")
    return value


def check_seconds(value: float | None, flag: str, default_note: str = "") -> float | None:
    """A positive, finite number of seconds (None: the tool's default)."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        hint = f"; leave it out for the default ({default_note})" if default_note else ""
        raise UsageError(f"{flag} must be a positive number of seconds, got {value:g}{hint}")
    return value


def check_probability(value: float, flag: str) -> float:
    """A probability in [0, 1) (a cut-off that 1 would make mean 'never')."""
    if not math.isfinite(value) or not 0.0 <= value < 1.0:
        raise UsageError(f"{flag} must be a probability in [0, 1), got {value:g}")
    return value


def check_device(spec: str, flag: str = "--device") -> str:
    """auto, cpu, cuda, cuda:N (a GPU this machine has) or mps (where available)."""
    import torch

    valid = "auto, cpu, cuda or cuda:N"
    if spec in ("auto", "cpu"):
        return spec
    m = re.fullmatch(r"cuda(?::(\d+))?", spec)
    if m:
        if not torch.cuda.is_available():
            raise UsageError(f"{flag} {spec}: this machine has no CUDA GPU that PyTorch can use; "
                             f"use {flag} cpu or {flag} auto")
        n = torch.cuda.device_count()
        if m.group(1) is not None and int(m.group(1)) >= n:
            raise UsageError(f"{flag} {spec}: this machine has {n} CUDA GPU(s): cuda:0 to cuda:{n - 1}")
        return spec
    if spec == "mps":
        if not torch.backends.mps.is_available():
            raise UsageError(f"{flag} mps: Apple's MPS backend is not available here; use {flag} cpu or auto")
        return spec
    raise UsageError(f"{flag} {spec!r} is not a device; choose one of {valid}")


SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")  # what core.target's forward pass runs (load_target checks too)


def check_target(spec: str | None, flag: str = "--target", names: tuple[str, ...] = TARGET_NAMES) -> str | None:
    """A target the loader can open: a name, a checkpoint folder, a .gguf file or a hub id (org/name)."""
    if spec is None or spec in names:
        return spec
    valid = (f"{' or '.join(names)} (the shipped model), a Hugging Face checkpoint folder, a .gguf file, "
             f"or a hub id ORG/NAME")
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{flag} {spec}: this folder has no config.json, so it is not a Hugging Face "
                             f"checkpoint; give {valid}")
        drafter = _drafter_method(path / "config.json")
        if drafter is not None:
            raise UsageError(f"{flag} {spec}: this is a drafter checkpoint (method {drafter!r}), not a target; "
                             f"give it to --drafter, and give {flag} {valid}")
        published = _published_drafter(path)
        if published is not None:
            raise UsageError(f"{flag} {spec}: this is an {published} drafter checkpoint, not a target; give it to "
                             f"--drafter, and give {flag} {valid}")
        kind = _model_type(path / "config.json")
        if kind is not None and kind not in SUPPORTED_MODEL_TYPES:
            raise UsageError(f"{flag} {spec}: a {kind!r} model; SpecLens runs the Llama and Qwen2 families "
                             f"(model_type {', '.join(SUPPORTED_MODEL_TYPES)})")
        return spec
    if path.is_file():
        if not spec.endswith(".gguf"):
            raise UsageError(f"{flag} {spec}: a file target must be a .gguf file; give {valid}")
        return spec
    hub_id = re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", spec) and not spec.endswith(".gguf")
    if not hub_id or spec.startswith((".", "/", "~")):
        raise UsageError(f"{flag} {spec}: no such file or folder; give {valid}")
    return spec  # a hub id: loading it needs the network; a failure there is reported in one line


def _model_type(config: Path) -> str | None:
    """A Hugging Face config.json's model_type (None when it cannot be read: the loader then says why)."""
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    kind = data.get("model_type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def _published_drafter(folder: Path) -> str | None:
    """'EAGLE' or 'Medusa' when `folder` holds a drafter in a published layout (its config.json looks like a
    Hugging Face model's), else None. Reads file names and an EAGLE weights file's tensor names only."""
    from core.drafters.published_formats import FORMAT_NAMES, detect_format

    try:
        fmt = detect_format(folder)
    except (ValueError, OSError):
        return None
    return FORMAT_NAMES[fmt] if fmt != "speclens" else None


def _drafter_method(config: Path) -> str | None:
    """The method named by a drafter checkpoint's config.json ({"method": ..., "config": {...}}, no
    "model_type"); None for anything else (a Hugging Face config, or a file that is not JSON: the loader's
    own message then says what is wrong with it)."""
    try:
        meta = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(meta, dict) and isinstance(meta.get("method"), str) and isinstance(meta.get("config"), dict) \
            and "model_type" not in meta:
        return meta["method"]
    return None


def check_output_file(path: str | None, flag: str) -> Path | None:
    """The file a run will write: not a folder, its folder created now (before any work) and writable."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(f"{flag} {path}: that is a folder; give a file name")
    _writable_folder(p.parent, f"{flag} {path}", f"the folder {p.parent}")
    return p


def _writable_folder(folder: Path, said: str, it: str) -> None:
    """Create `folder` (with its parents) and check it is writable; `said` / `it` word the one-line error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"{said}: cannot create {it}: part of that path is a file") from None
    except OSError as err:
        raise UsageError(f"{said}: cannot create {it} ({err.strerror or err})") from None
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{said}: {it} is not writable")


def check_output_dir(path: str, flag: str) -> Path:
    """A folder a run will write into: created now (before any work) and writable."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {path}: that is a file; give a folder")
    _writable_folder(p, f"{flag} {path}", "it")
    return p


def parse_json_object(text: str, flag: str) -> dict:
    """`text` as a JSON object ("" = {})."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{flag} {text!r} is not JSON ({err.msg}); give an object such as "
                         f"'{{\"depth\": 4}}'") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} {text!r} is a JSON {type(value).__name__}, not an object; give an object "
                         f"such as '{{\"depth\": 4}}'")
    return value


def check_drafter_folder(spec: str | None, flag: str = "--drafter") -> str | None:
    """None (the shipped drafter), 'random', or a checkpoint folder: ours (config.json and model.safetensors, or
    shards with model.safetensors.index.json), or an EAGLE-1/2 or Medusa checkpoint in its published layout
    (core.drafters.published_formats: detected from the files; an `eagle:` / `medusa:` / `speclens:` prefix
    forces the format)."""
    from core.drafters.published_formats import LAYOUTS, NotADrafterError, resolve, split_spec

    if spec is None or spec == "random":
        return spec
    forced, path = split_spec(spec)
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UsageError(f"{flag} {spec}: no such folder; give a drafter checkpoint folder or 'random'")
    try:
        resolve(spec)
    except NotADrafterError as err:
        if forced is not None:
            raise UsageError(f"{flag} {spec}: {one_line(err)}") from None
        raise UsageError(f"{flag} {spec}: not a drafter checkpoint (missing {', '.join(err.missing)}); give a "
                         f"checkpoint folder ({LAYOUTS}) or 'random'") from None
    except ValueError as err:
        raise UsageError(f"{flag} {spec}: {one_line(err)}") from None
    return spec


def check_passes(mode: str, device: str, flag: str = "--passes") -> str:
    """The verify-pass mode (core.static_pass) for this device: the mode it resolves to, or a one-line error."""
    from core.static_pass import resolve_pass_mode
    from core.target import resolve_device

    try:
        return resolve_pass_mode(mode, resolve_device(device))
    except ValueError as err:
        raise UsageError(f"{flag} {mode}: {err}") from None


def check_device_and_threads(device: str, threads: int | None) -> None:
    """The `--device` / `--threads` pair every measuring script takes (checked before any model loads)."""
    check_device(device)
    if threads is not None:
        check_int_range(threads, "--threads", 1)


def target_for_script(dtype: str, device: str, threads: int | None) -> Target:
    """A measuring script's shipped target, after `threads` torch threads are set (None: torch's default)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return load_target_cleanly(None, dtype, device)


def load_target_cleanly(spec: str | None, dtype: str, device: str, flag: str = "--target") -> Target:
    """load_target, with a failure the checks could not foresee (a hub id offline, a broken checkpoint
    folder) raised as one ValueError line."""
    try:
        return load_target(spec, dtype, device)
    except (OSError, ImportError) as err:
        raise UsageError(f"cannot load {flag} {spec or 'smollm2'}: {one_line(err)}") from None
