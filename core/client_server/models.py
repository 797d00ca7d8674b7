"""Building the same target and drafter on both sides of a split (two processes must agree exactly).

Target specs: "tiny" (core.target.tiny_target with vocab 64, 4 layers: tests), "tiny:VOCAB:LAYERS:SEED",
"smollm2" (the shipped SmolLM2-135M-Instruct), or a checkpoint folder / .gguf path.
Drafter specs: None (the shipped checkpoint under assets/drafters/<method> if there is one,
else a random drafter, and the note says so), "random", or a checkpoint folder. A random
drafter is seeded, so both processes build identical weights; the server checks the LSA hash.
"""

from __future__ import annotations

import dataclasses
import json

from core.drafters.base import Autoregressive, Drafter
from core.methods import build_drafter, default_drafter_folder
from core.target import Target, load_target, tiny_target

TREE_KEYS = ("depth", "top_k", "total_tokens")


def make_target(spec: str = "smollm2", dtype: str = "bfloat16") -> Target:
    if spec == "tiny" or spec.startswith("tiny:"):
        parts = [int(x) for x in spec.split(":")[1:]] if ":" in spec else []
        vocab, layers, seed = (parts + [64, 4, 0][len(parts):])[:3]
        return tiny_target(vocab_size=vocab, n_layers=layers, seed=seed)
    return load_target(None if spec == "smollm2" else spec, dtype, "cpu")


def make_drafter(method: str, target: Target, spec: str | None = None, options: dict | str | None = None,
                 seed: int = 0) -> tuple[Drafter | None, str]:
    """(drafter, a note saying which one). options: hyper-parameters for a random drafter, or tree settings."""
    if isinstance(options, str):
        options = json.loads(options) if options else {}
    options = dict(options or {})
    if method == "ar":
        return Autoregressive(), ""
    if spec is None:
        folder = default_drafter_folder(method)
        if (folder / "config.json").is_file():
            spec = str(folder)
        else:
            spec = "random"
    if spec == "random":
        from core.drafters.registry import drafter_class

        cls = drafter_class(method)
        known = {f.name for f in dataclasses.fields(cls.config_class)}
        hyper = {k: v for k, v in options.items() if k in known}  # options may name another method's fields
        return cls.random(target, seed=seed, **hyper), f"random (untrained) {method} drafter"
    drafter = build_drafter(method, target, spec)
    tree = {k: v for k, v in options.items() if k in TREE_KEYS}
    if tree:
        drafter.set_options(**tree)
    return drafter, f"trained {method} drafter ({spec})"
