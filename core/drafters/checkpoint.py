"""What every trained drafter shares: a config dataclass, save/load, the target fingerprint check.

A checkpoint is a folder with `config.json` (method, hyper-parameters, the
fingerprint of the target it was trained for) and `model.safetensors` (the
drafter's own weights in bfloat16; the target's embedding, LM head and layers
are reused from the loaded target and never stored).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from core.drafters.base import Drafter
from core.target import Target

FORMAT_VERSION = 1


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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> DrafterConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise CorruptCheckpointError(f"config.json has fields {sorted(unknown)} that {cls.__name__} lacks")
        return cls(**data)


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

    def __init__(self, config: DrafterConfig, target: Target) -> None:
        torch.nn.Module.__init__(self)
        self.config = config
        self.target = target

    # ----- construction --------------------------------------------------------------------
    @classmethod
    def random(cls, target: Target, seed: int = 0, **hyper: Any) -> TrainedDrafter:
        """A randomly initialised drafter for `target` (tau near 1: for tests and teaching)."""
        torch.manual_seed(seed)
        cfg = cls.config_class(**{**hyper, **target_fields(target)})
        model = cls(cfg, target)
        return model.to(device=target.device, dtype=target.dtype).eval()

    def grow(self, **larger: int) -> None:
        """Raise the `growable` hyper-parameters in place without changing what the drafter computes."""
        raise ValueError(f"{self.name} cannot grow {sorted(larger)}: its architecture is fixed once trained")

    # ----- the conversation's tokens join a reduced drafting vocabulary (draft_vocab.py) ----------
    def _observe(self, token_ids, new_conversation: bool = False) -> None:
        vocab = getattr(self, "vocab", None)  # drafters with a DraftVocab (all trained ones here)
        if vocab is not None:
            if new_conversation:
                vocab.clear_context()
            vocab.observe(token_ids)

    def begin(self, target: Target, prefill) -> None:
        super().begin(target, prefill)
        self._observe(list(prefill.tokens) + [prefill.bonus], new_conversation=True)

    def accept(self, step) -> None:
        super().accept(step)
        self._observe(list(step.tokens) + [step.bonus])

    def observe_batch(self, batch_tokens: torch.Tensor) -> None:
        """Training: a batch's own (distinct) tokens stand in for the conversation, a superset of what
        each position could have seen."""
        self._observe(batch_tokens, new_conversation=True)

    def check_target(self, target: Target) -> None:
        if self.config.target_fingerprint != target.fingerprint:
            raise DrafterMismatchError(
                f"this {self.name} drafter was built for target {self.config.target_source!r} "
                f"(fingerprint {self.config.target_fingerprint}), but the loaded target is {target.source!r} "
                f"(fingerprint {target.fingerprint}); load the matching target or train a drafter for this one")

    def save_pretrained(self, folder: str | Path, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"format_version": FORMAT_VERSION, "method": self.name, "config": self.config.to_json()}
        meta.update(extra or {})
        # weights in bfloat16; integer buffers (a drafting vocabulary's token ids) must stay exact
        state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).contiguous().cpu()
                 for k, v in self.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"), metadata={"method": self.name})
        (folder / "config.json").write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, folder: str | Path, target: Target) -> TrainedDrafter:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = Path(folder)
        if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
            raise FileNotFoundError(f"{folder} is not a drafter checkpoint (needs config.json and model.safetensors)")
        try:
            meta = json.loads((folder / "config.json").read_text())
        except json.JSONDecodeError as err:
            raise CorruptCheckpointError(f"{folder / 'config.json'} is not valid JSON: {err}") from err
        if meta.get("method") != cls.name:
            raise DrafterMismatchError(f"{folder} holds a {meta.get('method')!r} drafter, not {cls.name!r}")
        cfg = cls.config_class.from_json(meta["config"])
        model = cls(cfg, target)
        model.check_target(target)
        try:
            state = load_file(str(folder / "model.safetensors"))
        except (SafetensorError, OSError, ValueError) as err:
            raise CorruptCheckpointError(f"{folder / 'model.safetensors'} cannot be read: {err}") from err
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
