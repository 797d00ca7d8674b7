"""Registers the trained drafters with core.methods (imported lazily by it).

`--drafter` semantics for every trained method: None -> the shipped checkpoint
under assets/drafters/<name>; "random" -> a randomly initialised drafter for the
loaded target; anything else -> a checkpoint folder.
"""

from __future__ import annotations

import importlib

from core.methods import default_drafter_folder, register
from core.target import Target

# method name -> (module, class name, default checkpoint folder name, description)
TRAINED = {
    "eagle2": ("core.drafters.eagle2", "Eagle2Drafter", "eagle2",
               "EAGLE-2: feature+token fusion, one decoder layer, dynamic draft tree"),
    "moa": ("core.drafters.moa", "MoADrafter", "moa",
            "Mixture of Attentions: layer self-attention + self/cross-attention (+ TLI), dynamic tree"),
    "medusa": ("core.drafters.medusa", "MedusaDrafter", "medusa",
               "Medusa: K residual heads on the last hidden state, static tree"),
    "amphista": ("core.drafters.amphista", "AmphistaDrafter", "amphista",
                 "Amphista: staged adaptation + bidirectional auto-embedding block, static tree"),
}


def drafter_class(method: str):
    module, cls, _, _ = TRAINED[method]
    return getattr(importlib.import_module(module), cls)


def _builder(method: str):
    def build(target: Target, drafter: str | None, options: dict):
        cls = drafter_class(method)
        if drafter == "random":
            model = cls.random(target, **options)
        else:
            folder = drafter
            if folder is None:
                folder = default_drafter_folder(TRAINED[method][2])
                tli = options.get("tli")
                if method == "moa" and tli:  # shipped MoA variants: moa (N=0), moa-tli1, moa-tli3
                    folder = default_drafter_folder(f"moa-tli{tli}")
                if not folder.exists():
                    raise FileNotFoundError(
                        f"no trained {method} drafter is shipped at {folder}; pass --drafter random "
                        f"for an untrained one, or train it with `make train DRAFTER={method}`")
            model = cls.from_pretrained(folder, target)
            if options:
                model.set_options(**options)
        return model

    return build


for _name, (_m, _c, _f, _desc) in TRAINED.items():
    register(_name, _builder(_name), _desc)
