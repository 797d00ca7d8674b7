"""What every trained drafter shares: a config dataclass, save/load, the target fingerprint check.

A checkpoint is a folder with `config.json` (method, hyper-parameters, the
fingerprint of the target it was trained for) and the drafter's own weights in
bfloat16 (the target's embedding, LM head and layers are reused from the loaded
target and never stored), as the Hugging Face Hub shards them: one
`model.safetensors` when they fit in one file under SHARD_BYTES, otherwise
`model-0000i-of-0000n.safetensors` files with `model.safetensors.index.json`
(a Space refuses any file over 10 MB). Both layouts load.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from core.drafters.base import Drafter
from core.layers import pack_linears
from core.target import Target
from core.trees.calibration import calibrate_dynamic_tree

FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
SHARD_BYTES = 9_500_000  # every weight file stays under the Hub's 10 MB limit for files outside Git LFS


def weight_files(folder: str | Path) -> list[Path]:
    """The weight files of a checkpoint folder (sharded per its index, or the single file); [] if none."""
    folder = Path(folder)
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
            raise CorruptCheckpointError(f"{index} is not a safetensors index ({err})") from None
        return [folder / n for n in names]
    return [folder / WEIGHTS_FILE] if (folder / WEIGHTS_FILE).is_file() else []


def save_weights(state: dict[str, torch.Tensor], folder: Path, metadata: dict[str, str]) -> list[Path]:
    """Write `state` as one file, or as shards of at most SHARD_BYTES each with an index; the other layout's
    files in `folder` are removed, so a folder never holds two sets of weights."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    for old in [*folder.glob("model-*-of-*.safetensors"), folder / WEIGHTS_INDEX, folder / WEIGHTS_FILE]:
        old.unlink(missing_ok=True)
    if len(shards) == 1:
        save_file(shards[0], str(folder / WEIGHTS_FILE), metadata=metadata)
        return [folder / WEIGHTS_FILE]
    names = [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    for name, shard in zip(names, shards):
        save_file(shard, str(folder / name), metadata=metadata)
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total, **metadata},
             "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
    (folder / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [folder / n for n in names]


def load_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder's weights, sharded or single (CorruptCheckpointError if unreadable)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = weight_files(folder)
    if not files:
        raise FileNotFoundError(f"{folder}: no {WEIGHTS_FILE} or {WEIGHTS_INDEX}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as err:
            raise CorruptCheckpointError(f"{f} cannot be read: {err}") from err
    return state


def smooth_l1_rows(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """SmoothL1 (beta 1) per row, averaged over the feature dimension, in float32."""
    return torch.nn.functional.smooth_l1_loss(pred.float(), true.float(), reduction="none").mean(-1)


class DrafterMismatchError(ValueError):
    """The drafter checkpoint was trained for a different target model."""


class CorruptCheckpointError(ValueError):
    """The drafter checkpoint cannot be read."""


@dataclass
class DrafterConfig:
    """Fields every drafter config has; each method subclasses it with its own hyper-parameters."""

    hidden_size: int = 0
    vocab_size: int = 0
    n_target_layers: int = 0
    target_fingerprint: str = ""
    target_source: str = ""
    # Target features enter the drafter divided by this and regressed features leave multiplied by it
    # (feature losses are measured in the divided units). 1.0 = the papers. Why it exists: SmolLM2's
    # residual stream has an RMS near 25 against 0.14 for its token embeddings, so unscaled features
    # drown the token in `fc(embedding, feature)` and keep SmoothL1 in its L1 regime.
    feature_scale: float = 1.0

    # field -> (what is valid, test) beyond its type; an int field not named here must be >= 0 and a float one finite
    RANGES: ClassVar[dict[str, tuple[str, Callable[[Any], bool]]]] = {
        "feature_scale": ("a finite number > 0", lambda v: v > 0)}

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def ranges(cls) -> dict[str, tuple[str, Callable[[Any], bool]]]:
        """RANGES of this class and every config class it extends (the nearer class wins)."""
        out: dict = {}
        for klass in reversed(cls.__mro__):
            out.update(vars(klass).get("RANGES", {}))
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "config.json") -> DrafterConfig:
        """The config from a checkpoint's `config` object, checked against this dataclass: every field
        known and of the declared type, the target's fields (TARGET_FIELDS) present; hyper-parameters
        a checkpoint lacks keep their defaults. CorruptCheckpointError names `where` and the field."""
        if not isinstance(data, dict):
            raise CorruptCheckpointError(f"{where}: 'config' must be a JSON object, got {json_kind(data)}")
        check_fields(cls, data, where, required=TARGET_FIELDS)
        check_ranges(cls, data, where)
        return cls(**data)


def json_kind(value: Any) -> str:
    """How JSON calls the type of `value` ("an array", "a string", ...)."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "true/false", int: "a number",
             float: "a number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _matches(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a dataclass field's type (int is accepted where a float is declared)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value) if args else isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict) and (not args or all(_matches(v, args[1]) for v in value.values()))
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    return True  # a type JSON cannot state: not checked


def check_fields(cls: type, data: dict, where: str, required: Sequence[str] = ()) -> None:
    """Raise CorruptCheckpointError unless `data` (JSON) fits dataclass `cls`: no unknown field, the
    `required` ones present, each value of its declared type."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise CorruptCheckpointError(f"{where}: unknown field(s) {', '.join(unknown)} for {cls.__name__}; "
                                     f"its fields are {', '.join(names)}")
    missing = [n for n in required if n not in data]
    if missing:
        raise CorruptCheckpointError(f"{where}: missing field(s) {', '.join(missing)} that {cls.__name__} needs")
    for name, value in data.items():
        if not _matches(value, hints.get(name, Any)):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise CorruptCheckpointError(f"{where}: field {name!r} must be {_type_name(hints[name])}, "
                                         f"got {shown} ({json_kind(value)})")


def check_ranges(cls: type, data: dict, where: str) -> None:
    """Raise CorruptCheckpointError unless every value in `data` (already of its field's type) is in range:
    the class's RANGES, else ints >= 0 and finite floats."""
    hints, ranges = typing.get_type_hints(cls), cls.ranges()
    for name, value in data.items():
        if name in ranges:
            valid, ok = ranges[name]
            good = ok(value) and (not isinstance(value, float) or math.isfinite(value))
        elif hints.get(name) is int:
            valid, good = "an integer >= 0", value >= 0
        elif hints.get(name) is float:
            valid, good = "a finite number", math.isfinite(value)
        else:
            continue
        if not good:
            raise CorruptCheckpointError(f"{where}: field {name!r} must be {valid}, got {json.dumps(value)}")


def check_hyper(config_class: type[DrafterConfig], method: str, hyper: dict, extra: Sequence[str] = ()) -> None:
    """Raise a one-line ValueError naming an unknown hyper-parameter, or one of the wrong type or out of range
    (the checks a checkpoint's config.json gets). `extra`: options the drafter's `random()` takes besides its
    config's fields (not checked here)."""
    allowed = {f.name for f in dataclasses.fields(config_class)} - set(TARGET_FIELDS)
    unknown = sorted(set(hyper) - allowed - set(extra))
    if unknown:
        raise ValueError(f"{method} has no option {', '.join(unknown)}; options: {', '.join(sorted(allowed))}")
    fields = {k: v for k, v in hyper.items() if k in allowed}
    try:
        check_fields(config_class, fields, f"{method} option")
        check_ranges(config_class, fields, f"{method} option")
    except CorruptCheckpointError as e:
        raise ValueError(str(e)) from None


# DrafterConfig fields filled from the loaded target, never set as hyper-parameters
TARGET_FIELDS = ("hidden_size", "vocab_size", "n_target_layers", "target_fingerprint", "target_source")


def target_fields(target: Target) -> dict:
    return {"hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
            "n_target_layers": target.n_layers, "target_fingerprint": target.fingerprint,
            "target_source": target.source}


class TrainedDrafter(torch.nn.Module, Drafter):
    """A drafter with weights. Subclasses set `name`, `config_class` and build their layers in __init__.

    The target is held as a plain attribute (Target is not an nn.Module), so its
    frozen embedding / LM head / layers are used but never registered as the
    drafter's parameters or saved.
    """

    config_class: ClassVar[type[DrafterConfig]] = DrafterConfig
    # hyper-parameters a continued run may raise: `grow` adds layers that start as the identity
    growable: ClassVar[tuple[str, ...]] = ()
    random_options: ClassVar[tuple[str, ...]] = ()  # options `random()` takes besides the config's fields

    def __init__(self, config: DrafterConfig, target: Target) -> None:
        torch.nn.Module.__init__(self)
        self.config = config
        self.target = target

    # ----- construction --------------------------------------------------------------------
    @classmethod
    def random(cls, target: Target, seed: int = 0, **hyper: Any) -> TrainedDrafter:
        """A randomly initialised drafter for `target` (tau near 1: for tests and teaching)."""
        check_hyper(cls.config_class, cls.name, hyper)
        torch.manual_seed(seed)
        cfg = cls.config_class(**{**hyper, **target_fields(target)})
        model = cls(cfg, target)
        return model.to(device=target.device, dtype=target.dtype).eval()

    def grow(self, **larger: int) -> None:
        """Raise the `growable` hyper-parameters in place without changing what the drafter computes."""
        raise ValueError(f"{self.name} cannot grow {sorted(larger)}: its architecture is fixed once trained")

    # ----- the conversation's tokens join a reduced drafting vocabulary (draft_vocab.py) ----------
    def _observe(self, token_ids, new_conversation: bool = False, drafting: bool | None = None) -> None:
        vocab = getattr(self, "vocab", None)  # drafters with a DraftVocab (all trained ones here)
        if vocab is not None:
            if new_conversation:
                vocab.clear_context(drafting)
            vocab.observe(token_ids)

    def begin(self, target: Target, prefill) -> None:
        super().begin(target, prefill)
        pack_linears(self)  # inference from here: packed matmuls where they win (core.layers.linear)
        self._observe(list(prefill.tokens) + [prefill.bonus], new_conversation=True, drafting=True)

    def accept(self, step) -> None:
        super().accept(step)
        self._observe(list(step.tokens) + [step.bonus])

    def observe(self, event) -> None:
        """A dynamic `auto` tree (EAGLE-2, MoA) calibrates itself from decoded cycles; static trees override."""
        calibrate_dynamic_tree(self, event)

    def observe_batch(self, batch_tokens: torch.Tensor) -> None:
        """Training: a batch's own (distinct) tokens stand in for the conversation, a superset of what
        each position could have seen."""
        self._observe(batch_tokens, new_conversation=True, drafting=False)

    def check_target(self, target: Target) -> None:
        if self.config.target_fingerprint != target.fingerprint:
            raise DrafterMismatchError(
                f"this {self.name} drafter was built for target {self.config.target_source!r} "
                f"(fingerprint {self.config.target_fingerprint}), but the loaded target is {target.source!r} "
                f"(fingerprint {target.fingerprint}); load the matching target or train a drafter for this one")

    def save_pretrained(self, folder: str | Path, extra: dict | None = None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"format_version": FORMAT_VERSION, "method": self.name, "config": self.config.to_json()}
        meta.update(extra or {})
        # weights in bfloat16; integer buffers (a drafting vocabulary's token ids) must stay exact
        state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).contiguous().cpu()
                 for k, v in self.state_dict().items()}
        save_weights(state, folder, metadata={"method": self.name})
        (folder / "config.json").write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def read_config(cls, folder: str | Path) -> tuple[dict, DrafterConfig]:
        """A checkpoint folder's config.json, checked (needs no target: command lines call it before
        loading one): (the whole file, the config). FileNotFoundError / CorruptCheckpointError /
        DrafterMismatchError name the file and what is wrong."""
        folder = Path(folder)
        path = folder / "config.json"
        if not path.is_file() or not weight_files(folder):
            raise FileNotFoundError(f"{folder} is not a drafter checkpoint (needs config.json and "
                                    f"{WEIGHTS_FILE} or {WEIGHTS_INDEX} with its shards)")
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CorruptCheckpointError(f"{path} is not valid JSON: {err}") from err
        if not isinstance(meta, dict):
            raise CorruptCheckpointError(f"{path} must hold a JSON object with 'method' and 'config', "
                                         f"got {json_kind(meta)}")
        missing = [k for k in ("method", "config") if k not in meta]
        if missing:
            raise CorruptCheckpointError(f"{path}: missing field(s) {', '.join(missing)} (a checkpoint's "
                                         f"config.json holds 'format_version', 'method' and 'config')")
        if meta.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
            raise CorruptCheckpointError(f"{path}: format_version {meta['format_version']!r} is not the one "
                                         f"this code reads ({FORMAT_VERSION})")
        if meta["method"] != cls.name:
            raise DrafterMismatchError(f"{folder} holds a {meta['method']!r} drafter, not {cls.name!r}")
        return meta, cls.config_class.from_json(meta["config"], where=f"{path} 'config'")

    @classmethod
    def from_pretrained(cls, folder: str | Path, target: Target) -> TrainedDrafter:
        folder = Path(folder)
        path = folder / "config.json"
        meta, cfg = cls.read_config(folder)
        try:
            model = cls(cfg, target)
        except (ValueError, RuntimeError, TypeError, ZeroDivisionError) as err:  # e.g. a negative or zero size
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CorruptCheckpointError(f"{path}: its config cannot build a {cls.name} drafter ({first})") from None
        model.check_target(target)
        state = load_weights(folder)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise CorruptCheckpointError(
                f"{folder} does not match the {cls.name} architecture: missing {missing[:4]}, "
                f"unexpected {unexpected[:4]}")
        model.checkpoint_meta = meta
        return model.to(device=target.device, dtype=target.dtype).eval()

    # ----- feature units (config.feature_scale) -----------------------------------------------
    def to_drafter_units(self, feature: torch.Tensor) -> torch.Tensor:
        """A target feature as the drafter's layers see it."""
        scale = self.config.feature_scale
        return feature if scale == 1.0 else feature / scale

    def to_target_units(self, feature: torch.Tensor) -> torch.Tensor:
        """A feature the drafter regressed, back in the target's units."""
        scale = self.config.feature_scale
        return feature if scale == 1.0 else feature * scale

    def feature_loss_rows(self, pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
        """SmoothL1 per row between a regressed and a true target feature, in the drafter's units."""
        return smooth_l1_rows(self.to_drafter_units(pred.float()), self.to_drafter_units(true.float()))

    # ----- training interface (used by core.training) ---------------------------------------
    def training_loss(self, batch: TrainBatch, progress: float) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss on a teacher-forced batch and metrics (per-position top-1 accuracy as 'acc@k')."""
        raise NotImplementedError


@dataclass
class TrainBatch:
    """A teacher-forced batch with the frozen target's activations computed for it.

    input_ids / loss_mask: [B, T] (loss_mask 1 where the token is part of an answer).
    hidden: residual index -> [B, T, H] (the drafter's `needs.hidden_layers`).
    layer_kv: [B, T, L, 2 * kv_heads * head_dim] when the drafter asks for it.
    target_logits(feature) is `target.logits`; drafters compute the target's
    distribution from hidden[L] themselves, in chunks, to keep memory small.
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    attention_mask: torch.Tensor
    hidden: dict[int, torch.Tensor]
    layer_kv: torch.Tensor | None
    target: Target
    _greedy_next: torch.Tensor | None = dataclasses.field(default=None, init=False, repr=False)

    @torch.no_grad()
    def greedy_next(self, chunk: int = 512) -> torch.Tensor:
        """[B, T] long: the target's argmax over its full vocabulary after each position, i.e. the token
        greedy verification accepts as token t+1 given the data's tokens 0..t (computed once, shared by
        every drafter of a joint step; needs hidden[L])."""
        if self._greedy_next is None:
            feat = self.hidden[self.target.n_layers]
            rows = feat.reshape(-1, feat.shape[-1])
            top = [self.target.logits(rows[s:s + chunk].to(self.target.dtype)).argmax(-1)
                   for s in range(0, rows.shape[0], chunk)]
            self._greedy_next = torch.cat(top).reshape(feat.shape[:-1])
        return self._greedy_next
