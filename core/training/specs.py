"""The drafters a training run names -> class and hyper-parameters, and what each needs from the target's pass
over a batch.

Names follow core.methods' grammar (`parse_method`): `eagle2`, `moa`, `moa-tliN` (MoA with tli=N), `medusa`,
`amphista`, and `METHOD@NAME` for a variant trained with other hyper-parameters (`--drafters moa,moa@h24 --hyper
moa@h24.period_max=24`), written to <out>/<name> so that `analysis.bench --drafter-dir` finds it under its label.
"""

from __future__ import annotations

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
    """A trained method's name (core.methods.parse_method: `moa-tli3`, `moa@h24`) -> its class and hyper-parameters
    (a -tliN name sets tli=N; `hyper` adds the rest)."""
    from core.methods import drafter_class, parse_method, valid_trained_names

    try:
        parsed = parse_method(name)
    except ValueError:
        parsed = None
    if parsed is None or not parsed.method.trained or parsed.lookup or "." in parsed.variant:
        # a "." would split `--hyper NAME.key=value` in the wrong place
        raise ValueError(f"unknown drafter {name!r}; choose from {valid_trained_names()}")
    cls = drafter_class(parsed.base)
    hyper = {**({"tli": parsed.tli} if parsed.tli is not None else {}), **(hyper or {})}
    check_hyper(cls.config_class, name, hyper, cls.random_options)  # before any model loads: one line, no traceback
    return DrafterSpec(name, cls, hyper)


def train_needs(model: TrainedDrafter) -> TargetNeeds:
    return getattr(model, "train_needs", None) or model.needs


def union_needs(models: list[TrainedDrafter]) -> TargetNeeds:
    layers = sorted({i for m in models for i in train_needs(m).hidden_layers})
    return TargetNeeds(hidden_layers=tuple(layers), layer_kv=any(train_needs(m).layer_kv for m in models))
