"""What a method is: the one table, and the one parser of method names.

Every method has one row in `METHODS`: its label, what it does, the drafter class that implements it
(trained drafters only) and the checkpoint folder it ships with under assets/drafters. A method *name*
as users type it adds two things to a row, parsed by `parse_method` only:

    moa-tli3+lookup  ->  MethodName(base="moa", tli=3, lookup=True)
                         base: a row of METHODS; -tliN: MoA's Target Layer Inference N (shipped as
                         assets/drafters/moa-tliN); +lookup: a context-lookup branch grafted on the
                         drafter's tree (core.drafters.lookup_branch, not part of any paper)
    moa@h24          ->  MethodName(base="moa", variant="h24"): the same method with another
                         checkpoint, found as <folder>/moa@h24 (benchmarks compare candidates this way)

The CLI (core.generate), the benchmark (analysis.bench), the app (demo.runtime), the client-server
code and the trainer all read this module; none keeps its own list.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.drafters.base import Autoregressive, Drafter
from core.drafters.lookup_branch import SUFFIX as LOOKUP_SUFFIX
from core.drafters.lookup_branch import LookupBranch
from core.drafters.pld import PromptLookupDrafter
from core.target import Target

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DRAFTER_DIR = ASSETS / "drafters"


@dataclass(frozen=True)
class Method:
    """One row of the method table."""

    name: str
    label: str  # what the app and the reports call it
    description: str
    drafter: str = ""  # "module:Class" of a trained drafter; "" for methods without weights
    checkpoint: str = ""  # its shipped folder under assets/drafters ("" = none)

    @property
    def trained(self) -> bool:
        return bool(self.drafter)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "Plain decoding", "plain autoregressive decoding (one target pass per token)"),
    Method("pld", "Prompt lookup", "prompt lookup: copy what followed the last n-gram earlier in the context"),
    Method("eagle2", "EAGLE-2", "EAGLE-2: feature+token fusion, one decoder layer, dynamic draft tree",
           "core.drafters.eagle2:Eagle2Drafter", "eagle2"),
    Method("moa", "Mixture of Attentions",
           "Mixture of Attentions: layer self-attention + self/cross-attention (+ TLI), dynamic tree",
           "core.drafters.moa:MoADrafter", "moa"),
    Method("medusa", "Medusa", "Medusa: K residual heads on the last hidden state, static tree",
           "core.drafters.medusa:MedusaDrafter", "medusa"),
    Method("amphista", "Amphista", "Amphista: staged adaptation + bidirectional auto-embedding block, static tree",
           "core.drafters.amphista:AmphistaDrafter", "amphista"),
)}
TRAINED = tuple(name for name, m in METHODS.items() if m.trained)
DESCRIPTIONS = {name: m.description for name, m in METHODS.items()}  # kept for callers that list them


@dataclass(frozen=True)
class MethodName:
    """A parsed method name: a row of METHODS, MoA's TLI N (None = not given) and the lookup branch."""

    base: str
    tli: int | None = None
    lookup: bool = False
    variant: str = ""

    @property
    def method(self) -> Method:
        return METHODS[self.base]

    @property
    def name(self) -> str:
        """The canonical spelling: 'moa-tli3+lookup'."""
        return self.checkpoint_name + (LOOKUP_SUFFIX if self.lookup else "")

    @property
    def checkpoint_name(self) -> str:
        return self.base + (f"-tli{self.tli}" if self.tli else "") + (f"@{self.variant}" if self.variant else "")

    @property
    def checkpoint(self) -> str:
        """The checkpoint folder name: 'moa-tli3' for MoA with N=3, 'moa@h24' for a variant, else the method's own."""
        if not self.method.trained:
            return ""
        return self.checkpoint_name

    @property
    def label(self) -> str:
        label = self.method.label + (f" (TLI N={self.tli})" if self.tli else "") + \
            (f" [{self.variant}]" if self.variant else "")
        return label + (" + context lookup" if self.lookup else "")


def valid_names() -> str:
    return (f"{', '.join(METHODS)} (moa-tliN for MoA with Target Layer Inference N; METHOD@NAME for another "
            f"checkpoint of a trained method; any of them + '{LOOKUP_SUFFIX}' adds a context-lookup branch)")


def parse_method(name: str) -> MethodName:
    """'moa-tli3+lookup' -> MethodName('moa', 3, True); ValueError (one line) for anything else unknown."""
    if not isinstance(name, str):
        raise ValueError(f"a method name must be text, got {name!r}; choose one of {valid_names()}")
    lookup = name.endswith(LOOKUP_SUFFIX)
    core = name.removesuffix(LOOKUP_SUFFIX)
    core, at, variant = core.partition("@")
    tli = None
    m = re.fullmatch(r"moa-tli(\d+)", core)
    if m:
        core, tli = "moa", int(m.group(1))
    if core not in METHODS or (at and not re.fullmatch(r"[A-Za-z0-9_.-]+", variant)) or \
            (at and not METHODS[core].trained):
        raise ValueError(f"unknown method {name!r}; choose one of {valid_names()}")
    return MethodName(core, tli, lookup, variant)


def method_labels(names: list[str] | None = None) -> dict[str, str]:
    """name -> 'Label (name)' for the app's menus: every method, and each trained one with a lookup branch."""
    names = names or [*METHODS, *(f"{n}{LOOKUP_SUFFIX}" for n in TRAINED)]
    return {n: f"{parse_method(n).label} ({n})" for n in names}


def drafter_class(method: str) -> type:
    """The drafter class of a trained method ('moa-tli3+lookup' -> MoADrafter)."""
    row = parse_method(method).method
    if not row.trained:
        raise ValueError(f"method {row.name!r} has no trained drafter; trained ones: {', '.join(TRAINED)}")
    module, cls = row.drafter.split(":")
    return getattr(importlib.import_module(module), cls)


def available_methods() -> list[str]:
    return list(METHODS)


def default_drafter_folder(name: str) -> Path:
    return DRAFTER_DIR / name


def shipped_tli() -> list[int]:
    """The TLI values (MoA's N) with a shipped checkpoint: moa (N=0), moa-tliN."""
    found = [0] if (DRAFTER_DIR / "moa").is_dir() else []
    for folder in DRAFTER_DIR.glob("moa-tli*") if DRAFTER_DIR.is_dir() else ():
        n = folder.name.removeprefix("moa-tli")
        if n.isdigit() and folder.is_dir():
            found.append(int(n))
    return sorted(set(found))


def check_method(method: str, drafter: str | None = None, **options: Any) -> None:
    """Raise ValueError (one line, naming the valid values) unless `method` can be built with these options.

    Needs no target, so command lines call it before loading the model; build_drafter calls it too.
    """
    parsed = parse_method(method)
    base = parsed.base
    if parsed.tli is not None:
        options = {"tli": parsed.tli, **options}
    if "tli" in options:
        tli = options["tli"]
        if base != "moa":
            raise ValueError(f"tli (--tli {tli}) applies only to method moa; method {method!r} has no target "
                             f"layers to run")
        if isinstance(tli, bool) or not isinstance(tli, int):
            raise ValueError(f"tli must be an integer, got {tli!r}")
        shipped = shipped_tli()
        if drafter is None and shipped and tli not in shipped:
            raise ValueError(f"tli {tli} is not available: the shipped MoA drafters have tli "
                             f"{', '.join(map(str, shipped))} (or pass --drafter random for an untrained one)")
    if drafter not in (None, "random") and parsed.method.trained:
        from core.drafters.published_formats import check_published

        # checked before any model loads; EAGLE / Medusa checkpoints in their published layouts convert on load
        fmt = check_published(drafter, base)
        cfg = drafter_class(base).read_config(resolve_folder(drafter))[1] if fmt == "speclens" else None
        if "tli" in options and options["tli"] != getattr(cfg, "tli", None):
            raise ValueError(f"the moa drafter in {drafter} was trained with tli {getattr(cfg, 'tli', None)}; "
                             f"it cannot run with tli {options['tli']}")
    if base == "ar" and options:
        raise ValueError(f"method ar takes no options, got {', '.join(sorted(options))}")
    if base == "pld":
        valid = [n for n in inspect.signature(PromptLookupDrafter.__init__).parameters if n != "self"]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"method pld has no option {', '.join(unknown)}; its options are {', '.join(valid)}")


def resolve_folder(drafter: str) -> Path:
    """The folder of a --drafter spec (a `FORMAT:` prefix such as `eagle:DIR` removed)."""
    from core.drafters.published_formats import split_spec

    return Path(split_spec(drafter)[1]).expanduser()


def build_drafter(method: str, target: Target, drafter: str | None = None, **options) -> Drafter:
    """Build the drafter for `method`. `drafter` is a checkpoint folder, "random", or None (the shipped one).
    A folder may hold our checkpoint or an EAGLE-1/2 / Medusa one in its published layout, converted on load
    (core.drafters.published_formats; `eagle:DIR` / `medusa:DIR` / `speclens:DIR` force the format).

    `<method>+lookup` wraps that method's drafter in core.drafters.lookup_branch (a context-lookup branch).
    """
    check_method(method, drafter, **options)
    parsed = parse_method(method)
    if parsed.tli is not None:
        options = {"tli": parsed.tli, **options}
    if parsed.lookup:
        return LookupBranch(build_drafter(MethodName(parsed.base, variant=parsed.variant).name, target, drafter,
                                          **options))
    if parsed.base == "ar":
        return Autoregressive()
    if parsed.base == "pld":
        return PromptLookupDrafter(**options)
    cls = drafter_class(parsed.base)
    if drafter == "random":
        return cls.random(target, **options)
    if drafter is not None:
        from core.drafters.published_formats import load_drafter

        model = load_drafter(drafter, target, cls)
    else:
        folder = default_drafter_folder(MethodName(parsed.base, options.get("tli"), variant=parsed.variant).checkpoint)
        if not folder.exists():
            raise FileNotFoundError(f"no trained {parsed.base} drafter is shipped at {folder}; pass --drafter "
                                    f"random for an untrained one, or train it (docs/TRAINING.md)")
        model = cls.from_pretrained(folder, target)
    if options:
        model.set_options(**options)
    return model
