"""Building the same target and drafter on both sides of a split (two processes must agree exactly).

Target specs: "tiny" (core.target.tiny_target with vocab 64, 4 layers: tests), "tiny:VOCAB:LAYERS:SEED",
"smollm2" (the shipped SmolLM2-135M-Instruct), or a checkpoint folder / .gguf path.
Drafter specs: None (the shipped checkpoint under assets/drafters/<method> if there is one,
else a random drafter, and the note says so), "random", or a checkpoint folder (core.methods.load_method
builds each). A random drafter is seeded, so both processes build identical weights; the server checks the
LSA hash.
"""

from __future__ import annotations

import dataclasses
import json

from core.drafters.base import Drafter
from core.methods import drafter_class, has_shipped, load_method, parse_method
from core.target import Target, load_target, tiny_target

TREE_KEYS = ("depth", "top_k", "total_tokens")


def check_target_spec(spec: str) -> str:
    """ValueError (one line) unless `spec` names a target make_target can build (checked before loading)."""
    from core.cli_checks import UsageError, check_target

    if spec == "tiny" or spec.startswith("tiny:"):
        parts = spec.split(":")[1:]
        if len(parts) > 3 or not all(p.isdigit() for p in parts):
            raise UsageError(f"--target {spec!r}: a tiny target is 'tiny' or 'tiny:VOCAB:LAYERS:SEED' with "
                             f"whole numbers")
        vocab, layers = ([int(p) for p in parts] + [64, 4][len(parts):])[:2]
        if vocab < 3 or layers < 1:
            raise UsageError(f"--target {spec!r}: a tiny target needs VOCAB >= 3 and LAYERS >= 1")
        return spec
    check_target(spec, names=("smollm2",))
    return spec


def option_fields(method: str, spec: str | None) -> dict[str, type]:
    """The --drafter-options keys a drafter for `method` takes, with their declared types: a random
    drafter's hyper-parameters, or a trained one's tree settings."""
    import typing

    from core.drafters.checkpoint import TARGET_FIELDS

    if not parse_method(method).method.trained:
        return {}
    cls = drafter_class(method)
    hints = typing.get_type_hints(cls.config_class)
    if spec is None and not has_shipped(method):
        spec = "random"
    if spec == "random":
        return {f.name: hints[f.name] for f in dataclasses.fields(cls.config_class) if f.name not in TARGET_FIELDS}
    return {k: hints[k] for k in TREE_KEYS if k in hints}


def check_options(methods: list[str], spec: str | None, options: dict) -> dict:
    """ValueError (one line) unless every key of `options` is taken by the drafter of at least one of
    `methods` and has the type that drafter declares; returns `options`."""
    from core.cli_checks import UsageError
    from core.drafters.checkpoint import check_fields

    fields: dict[str, type] = {}
    for m in methods:
        fields.update(option_fields(m, spec))
    unknown = sorted(set(options) - set(fields))
    if unknown:
        valid = ", ".join(sorted(fields)) if fields else "none (method ar has no drafter)"
        raise UsageError(f"--drafter-options: unknown key(s) {', '.join(unknown)} for "
                         f"{'random' if spec == 'random' else 'these'} {'/'.join(methods)} drafter(s); "
                         f"valid keys: {valid}")
    holder = dataclasses.make_dataclass("DrafterOptions", list(fields.items()))
    check_fields(holder, options, "--drafter-options")
    return options


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
    if not parse_method(method).method.trained:
        return load_method(method, target).drafter, ""
    known = {f.name for f in dataclasses.fields(drafter_class(method).config_class)}
    hyper = {k: v for k, v in options.items() if k in known}  # options may name another method's fields
    tree = {k: v for k, v in options.items() if k in TREE_KEYS}
    loaded = load_method(method, target, spec, fallback="missing", options=tree,
                         random_options={"seed": seed, **hyper})
    if loaded.source == "random":
        return loaded.drafter, f"random (untrained) {method} drafter"
    return loaded.drafter, f"trained {method} drafter ({spec if spec is not None else loaded.folder})"
