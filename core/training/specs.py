"""The drafters a training run names: `eagle2`, `moa`, `moa-tliN`, `medusa`, `amphista` -> class and
hyper-parameters, and what each needs from the target's pass over a batch."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from core.drafters.base import TargetNeeds
from core.drafters.checkpoint import TrainedDrafter, check_hyper


@dataclass
class DrafterSpec:
    """A drafter to train: output name, class, and the hyper-parameters passed to `cls.random`."""

    name: str
    cls: type[TrainedDrafter]
    hyper: dict[str, Any] = field(default_factory=dict)


def resolve_spec(name: str, hyper: dict[str, Any] | None = None) -> DrafterSpec:
    """`eagle2`, `moa`, `moa-tliN` (MoA with tli=N), `moa[-tliN]-hH` (period_max=H), `medusa`, `amphista`."""
    from core.methods import TRAINED, drafter_class

    method, extra = name, {}
    # moa-h24: trained up to 24 tokens past a verify; -mlp: with the MLP block after cross-attention;
    # -narrow: the narrowed LSA layout (lsa_full_width=False)
    m = re.fullmatch(r"moa(?:-tli(\d+))?(?:-h(\d+))?(-mlp)?(-narrow)?", name)
    if m:
        method = "moa"
        extra = {**({"tli": int(m.group(1))} if m.group(1) else {}),
                 **({"period_max": int(m.group(2))} if m.group(2) else {}),
                 **({"ca_mlp": True} if m.group(3) else {}),
                 **({"lsa_full_width": False} if m.group(4) else {})}
    if method not in TRAINED:
        raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(TRAINED)}, moa-tliN or "
                         f"moa[-tliN][-hH][-mlp][-narrow]")
    cls = drafter_class(method)
    hyper = {**extra, **(hyper or {})}
    check_hyper(cls.config_class, name, hyper, cls.random_options)  # before any model loads: one line, no traceback
    return DrafterSpec(name, cls, hyper)


def train_needs(model: TrainedDrafter) -> TargetNeeds:
    return getattr(model, "train_needs", None) or model.needs


def union_needs(models: list[TrainedDrafter]) -> TargetNeeds:
    layers = sorted({i for m in models for i in train_needs(m).hidden_layers})
    return TargetNeeds(hidden_layers=tuple(layers), layer_kv=any(train_needs(m).layer_kv for m in models))
