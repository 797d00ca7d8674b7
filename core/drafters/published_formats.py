"""Drafters in their published formats: EAGLE-1/EAGLE-2 checkpoints and Medusa heads, converted on load.

`--drafter DIR` takes a SpecLens checkpoint (config.json with "method" + model.safetensors), an EAGLE-1/EAGLE-2
checkpoint or Medusa heads as their authors' code saves them. The format is detected from the files
(`detect_format`); a `FORMAT:` prefix forces one (`eagle:DIR`, `medusa:DIR`, `speclens:DIR`; core.generate also
takes `--drafter-format`). `load_published` maps the published weights onto our drafters so that they compute
what the published code computes, float32 for float32; the layout differences are config flags of our drafters
(core.drafters.eagle2 and core.drafters.medusa module docstrings), off for our own checkpoints. The method each
published format loads as is a field of the method table (core.method_table, `Method.formats`). What was read
of the published code, and where, and how each format maps onto our drafters: core.drafters.published_convert.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.drafters.checkpoint import (
    WEIGHTS_FILE,
    WEIGHTS_INDEX,
    CorruptCheckpointError,
    DrafterMismatchError,
    TrainedDrafter,
    weight_files,
)
from core.drafters.published_convert import (  # noqa: F401 - EAGLE_WEIGHTS, MEDUSA_WEIGHTS: re-exported
    EAGLE3_KEYS,
    EAGLE_WEIGHTS,
    MEDUSA_WEIGHTS,
    PublishedFormatError,
    first_file,
    first_line,
    load_eagle,
    load_medusa,
    published_config,
    torch_load,
)
from core.method_table import format_methods
from core.target import Target

FORMATS = ("speclens", "eagle", "medusa")
METHOD_OF = format_methods()  # the SpecLens method a published format loads as (Method.formats in the table)
FORMAT_NAMES = {"speclens": "SpecLens", "eagle": "EAGLE", "medusa": "Medusa"}
LAYOUTS = ("SpecLens: config.json + model.safetensors; EAGLE: config.json + pytorch_model.bin; "
           "Medusa: medusa_lm_head.pt or medusa_lm_head.safetensors")
CONVERTERS = {"eagle": load_eagle, "medusa": load_medusa}


class NotADrafterError(FileNotFoundError, PublishedFormatError):
    """A folder in none of the layouts; `missing` lists what our own layout would need."""

    def __init__(self, message: str, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing

    def __str__(self) -> str:
        return str(self.args[0])


# ----- which format ---------------------------------------------------------------------------------
def split_spec(spec: str) -> tuple[str | None, str]:
    """'eagle:DIR' -> ('eagle', 'DIR'); a spec without a known format prefix -> (None, spec)."""
    prefix, sep, rest = str(spec).partition(":")
    if sep and prefix in FORMATS and rest:
        return prefix, rest
    return None, str(spec)


def _read_json(path: Path) -> Any:
    """The JSON in `path`; None when the file is absent or not JSON (the caller's own reader then says why)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _is_speclens_meta(meta: Any) -> bool:
    return isinstance(meta, dict) and "method" in meta and "config" in meta and "model_type" not in meta


def _tensor_keys(path: Path) -> list[str]:
    """The tensor names in a weights file, without reading the tensors (safetensors header, or a memory-mapped
    torch.load with weights_only)."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return list(f.keys())
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
            raise PublishedFormatError(f"{path} cannot be read: {first_line(err)}") from None
    return list(torch_load(path, mmap=True))


def _index_keys(folder: Path) -> list[str]:
    """Tensor names of a sharded Hugging Face model's index (model.safetensors / pytorch_model.bin)."""
    for name in (WEIGHTS_INDEX, "pytorch_model.bin.index.json"):
        index = _read_json(folder / name)
        if isinstance(index, dict) and isinstance(index.get("weight_map"), dict):
            return list(index["weight_map"])
    return []


def detect_format(folder: str | Path) -> str:
    """'speclens', 'eagle' or 'medusa' from the files in `folder`.

    Medusa: medusa_lm_head.pt / .safetensors. SpecLens: a config.json with "method" and "config". EAGLE: a
    Hugging Face-style config.json (hidden_size) beside pytorch_model.bin or model.safetensors holding
    `fc.weight`. A folder with config.json and model.safetensors that is neither is taken as ours, so that our
    reader reports what is wrong with it. Raises NotADrafterError when nothing fits, PublishedFormatError for
    layouts recognised but not supported (EAGLE-3, a Medusa-2 model saved whole).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADrafterError(f"{folder}: no such folder", ["config.json", WEIGHTS_FILE])
    if first_file(folder, MEDUSA_WEIGHTS) is not None:
        return "medusa"
    config = _read_json(folder / "config.json")
    if _is_speclens_meta(config):
        return "speclens"
    eagle = first_file(folder, EAGLE_WEIGHTS)
    if eagle is not None and isinstance(config, dict) and "hidden_size" in config:
        keys = _tensor_keys(eagle)
        if any(EAGLE3_KEYS.match(k) for k in keys):
            raise PublishedFormatError(f"{folder} is an EAGLE-3 checkpoint (midlayer / d2t in {eagle.name}); "
                                       f"SpecLens converts EAGLE-1 and EAGLE-2 checkpoints")
        if "fc.weight" in keys:
            return "eagle"
    has_config = (folder / "config.json").is_file()
    try:
        ours = weight_files(folder)
    except CorruptCheckpointError:
        ours = [folder / WEIGHTS_INDEX]  # our reader reports the broken index
    if has_config and ours:
        return "speclens"
    if any(k.startswith("medusa_head.") for k in _index_keys(folder)) or \
            (isinstance(config, dict) and "medusa_num_heads" in config):
        raise PublishedFormatError(f"{folder} has no medusa_lm_head.pt or medusa_lm_head.safetensors: a Medusa "
                                   f"model saved whole (target and heads in one checkpoint) is not a drafter "
                                   f"folder; give the folder of the heads alone")
    missing = ([] if has_config else ["config.json"]) + ([] if ours else [WEIGHTS_FILE])
    raise NotADrafterError(f"{folder} is not a drafter checkpoint (missing {', '.join(missing)}; the layouts "
                           f"read are {LAYOUTS})", missing)


def resolve(spec: str) -> tuple[str, Path]:
    """(format, folder) of a --drafter spec: `FORMAT:DIR` forces the format (its files must be there), a bare
    folder is detected (`detect_format`)."""
    fmt, path = split_spec(spec)
    folder = Path(path).expanduser()
    if fmt is None:
        return detect_format(folder), folder
    if not folder.is_dir():
        raise NotADrafterError(f"{folder}: no such folder", ["config.json", WEIGHTS_FILE])
    need = {"speclens": [("config.json",), (WEIGHTS_FILE, WEIGHTS_INDEX)], "eagle": [("config.json",), EAGLE_WEIGHTS],
            "medusa": [MEDUSA_WEIGHTS]}[fmt]
    missing = [" or ".join(names) for names in need if first_file(folder, names) is None]
    if missing:
        raise NotADrafterError(f"{folder} is not a {FORMAT_NAMES[fmt]} checkpoint (missing {'; '.join(missing)})",
                               missing)
    return fmt, folder


def checkpoint_method(spec: str) -> str | None:
    """The SpecLens method a --drafter folder loads as (eagle2 for EAGLE, medusa for Medusa, the "method" of
    ours); None when that cannot be told (the loaders then report why)."""
    try:
        fmt, folder = resolve(spec)
    except (ValueError, OSError):
        return None
    if fmt != "speclens":
        return METHOD_OF[fmt]
    meta = _read_json(folder / "config.json")
    return meta["method"] if _is_speclens_meta(meta) and isinstance(meta["method"], str) else None


def check_published(spec: str, method: str) -> str:
    """Target-free checks of a --drafter spec for `method` (command lines call this before loading a model):
    its format; for EAGLE / Medusa, that it loads as `method` and that its config.json is readable. Returns
    the format; a SpecLens folder is left to TrainedDrafter.read_config."""
    fmt, folder = resolve(spec)
    if fmt == "speclens":
        return fmt
    if METHOD_OF[fmt] != method:
        raise DrafterMismatchError(f"{folder} holds an {FORMAT_NAMES[fmt]} checkpoint, which loads as a "
                                   f"{METHOD_OF[fmt]!r} drafter, not {method!r}; pass --method {METHOD_OF[fmt]}")
    published_config(folder, fmt)
    return fmt



# ----- loading --------------------------------------------------------------------------------------
def load_drafter(spec: str, target: Target, cls: type[TrainedDrafter]) -> TrainedDrafter:
    """A --drafter spec loaded for `target` as a `cls` drafter, in whatever format it is (ours:
    `cls.from_pretrained`; EAGLE / Medusa: `load_published`, which must give a `cls`)."""
    fmt, folder = resolve(spec)
    if fmt == "speclens":
        return cls.from_pretrained(folder, target)
    model = load_published(folder, target, fmt)
    if not isinstance(model, cls):
        raise DrafterMismatchError(f"{folder} holds an {FORMAT_NAMES[fmt]} checkpoint, which loads as a "
                                   f"{model.name!r} drafter, not {cls.name!r}")
    return model


def load_published(folder: str | Path, target: Target, fmt: str | None = None) -> TrainedDrafter:
    """An EAGLE-1/2 checkpoint or Medusa heads as our Eagle2Drafter / MedusaDrafter for `target`
    (core.drafters.published_convert). `fmt` None detects it. PublishedFormatError (one line) when a shape or a
    setting does not fit the target, before anything is built."""
    folder = Path(folder)
    if fmt is None:
        fmt = detect_format(folder)
    if fmt not in CONVERTERS:
        raise ValueError(f"load_published reads {', '.join(CONVERTERS)} checkpoints, not {fmt!r}")
    model = CONVERTERS[fmt](folder, target)
    model.published = {"format": fmt, "folder": str(folder)}  # where it came from (checkpoint_meta stays unset)
    return model.to(device=target.device, dtype=target.dtype).eval()


