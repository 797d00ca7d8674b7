"""What a method is: the one table, and the one parser of method names.

Every method has one row in `METHODS` (kept in core.method_table, re-exported here): its label, what it does,
the drafter class that implements it (trained drafters only), the checkpoint folder it ships with under
assets/drafters, the kind of draft it proposes (`tree`), whether it takes TLI, its role in the client-server
split, its colour in figures and the published checkpoint formats that load as it. Every list of methods
elsewhere is derived from the table: `methods_where(tree="static")`, `shipped_names()`, `lookup_names()` ...

A method *name* as users type it adds two things to a row, parsed by `parse_method` only:

    moa-tli3+lookup  ->  MethodName(base="moa", tli=3, lookup=True)
                         base: a row of METHODS; -tliN: MoA's Target Layer Inference N (shipped as
                         assets/drafters/moa-tliN); +lookup: a context-lookup branch grafted on the
                         drafter's tree (core.drafters.lookup_branch, not part of any paper)
    moa@h24          ->  MethodName(base="moa", variant="h24"): the same method with another
                         checkpoint, found as <folder>/moa@h24 (benchmarks compare candidates this way)

and names are built by `MethodName(...).name` or `with_tli(name, n)`, never by formatting strings elsewhere.
`load_method` is the one builder of "the shipped drafter, else a random one" (the app, the client-server code
and the benchmark call it, each with its own fallback). The CLI (core.generate), the benchmark (analysis.bench),
the app (demo.runtime), the client-server code and the trainer all read this module; none keeps its own list.
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
from core.method_table import (  # noqa: F401 - re-exported: core.methods is the table's public face
    CLIENT_SERVER_ROLES,
    METHODS,
    TREES,
    Method,
    format_methods,
    methods_where,
    static_tree_methods,
)
from core.target import Target

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DRAFTER_DIR = ASSETS / "drafters"
TLI_INFIX = "-tli"  # <name>-tliN: a method that takes TLI, with N target layers in the drafter
BASELINE = "ar"  # plain decoding: the reference every speedup is a ratio against, and the lossless checks' truth

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
        return self.base_checkpoint + (f"@{self.variant}" if self.variant else "")

    @property
    def base_checkpoint(self) -> str:
        """The name without a variant or the lookup branch: 'moa-tli3' for 'moa-tli3@h24+lookup' (a variant
        continues this checkpoint when training starts from the published ones)."""
        return self.base + (f"{TLI_INFIX}{self.tli}" if self.tli else "")

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


def _tli_rows() -> list[str]:
    return [name for name, m in METHODS.items() if m.tli]


def valid_names() -> str:
    tli = " / ".join(f"{m}{TLI_INFIX}N" for m in _tli_rows())
    return (f"{', '.join(METHODS)} ({tli} for MoA with Target Layer Inference N; METHOD@NAME for another "
            f"checkpoint of a trained method; any of them + '{LOOKUP_SUFFIX}' adds a context-lookup branch)")


def valid_trained_names() -> str:
    """The names a trained drafter goes by (the trainer's --drafter), for one-line errors."""
    tli = " / ".join(f"{m}{TLI_INFIX}N" for m in _tli_rows())
    return f"{', '.join(TRAINED)} ({tli} for MoA with Target Layer Inference N; METHOD@NAME for another checkpoint)"


def parse_method(name: str) -> MethodName:
    """'moa-tli3+lookup' -> MethodName('moa', 3, True); ValueError (one line) for anything else unknown."""
    if not isinstance(name, str):
        raise ValueError(f"a method name must be text, got {name!r}; choose one of {valid_names()}")
    lookup = name.endswith(LOOKUP_SUFFIX)
    core = name.removesuffix(LOOKUP_SUFFIX)
    core, at, variant = core.partition("@")
    tli = None
    m = re.fullmatch(rf"(.+){re.escape(TLI_INFIX)}(\d+)", core)
    if m and m.group(1) in METHODS and METHODS[m.group(1)].tli:
        core, tli = m.group(1), int(m.group(2))
    if core not in METHODS or (at and not re.fullmatch(r"[A-Za-z0-9_.-]+", variant)) or \
            (at and not METHODS[core].trained):
        raise ValueError(f"unknown method {name!r}; choose one of {valid_names()}")
    return MethodName(core, tli, lookup, variant)


def with_tli(name: str, n: int | None) -> str:
    """`name` with TLI N: with_tli('moa', 3) -> 'moa-tli3', with_tli('moa+lookup', 1) -> 'moa-tli1+lookup';
    N 0 or None gives the name without TLI. ValueError for a method that takes no TLI."""
    parsed = parse_method(name)
    if not parsed.method.tli:
        raise ValueError(f"method {name!r} takes no TLI N; the methods that do: {', '.join(_tli_rows())}")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"TLI N must be a whole number >= 0, got {n!r}")
    return MethodName(parsed.base, n or None, parsed.lookup, parsed.variant).name


def tli_of(name: str) -> int | None:
    """N of a plain name of a method that takes TLI ('moa' -> 0, 'moa-tli3' -> 3); None for any other name
    (a lookup branch, a variant, another method, a label that is no method name at all)."""
    try:
        parsed = parse_method(name)
    except ValueError:
        return None
    if not parsed.method.tli or parsed.lookup or parsed.variant:
        return None
    return parsed.tli or 0


def takes_tli(name: str) -> bool:
    """Whether the method `name` names takes TLI N (its row's `tli`)."""
    return parse_method(name).method.tli


def shipped_tli(method: str | None = None) -> list[int]:
    """The TLI values with a shipped checkpoint of `method` (default: every method that takes TLI, i.e. MoA):
    0 for its own folder, N for each <checkpoint>-tliN folder found under assets/drafters."""
    rows = [parse_method(method).method] if method else [METHODS[m] for m in _tli_rows()]
    found: set[int] = set()
    for row in rows:
        if not row.tli or not DRAFTER_DIR.is_dir():
            continue
        if (DRAFTER_DIR / row.checkpoint).is_dir():
            found.add(0)
        for folder in DRAFTER_DIR.glob(f"{row.checkpoint}{TLI_INFIX}*"):
            n = folder.name.removeprefix(f"{row.checkpoint}{TLI_INFIX}")
            if n.isdigit() and folder.is_dir():
                found.add(int(n))
    return sorted(found)


def shipped_names(**conditions: Any) -> list[str]:
    """Every name that runs out of the box, in table order, of the rows that match (`methods_where`): each row's
    own name, and after a row that takes TLI one name per shipped TLI checkpoint ('moa-tli1', 'moa-tli3', as
    found under assets/drafters). shipped_names(tree="dynamic") -> ['eagle2', 'moa', 'moa-tli1', 'moa-tli3']."""
    out = []
    for name in methods_where(**conditions):
        out.append(name)
        if METHODS[name].tli:
            out += [with_tli(name, n) for n in shipped_tli(name) if n]
    return out


def lookup_names() -> list[str]:
    """Each trained method with a context-lookup branch: 'eagle2+lookup', 'moa+lookup', ..."""
    return [f"{n}{LOOKUP_SUFFIX}" for n in TRAINED]


def method_labels(names: list[str] | None = None) -> dict[str, str]:
    """name -> 'Label (name)' for the app's menus: every method, and each trained one with a lookup branch."""
    names = names or [*METHODS, *lookup_names()]
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


def shipped_folder(name: str) -> Path | None:
    """Where the shipped checkpoint of a method name lives (assets/drafters/moa-tli3 for 'moa-tli3+lookup'),
    whether or not it is there; None for a method without weights."""
    checkpoint = parse_method(name).checkpoint
    return default_drafter_folder(checkpoint) if checkpoint else None


def has_shipped(name: str) -> bool:
    """Whether the shipped checkpoint of `name` is there (its config.json)."""
    folder = shipped_folder(name)
    return folder is not None and (folder / "config.json").is_file()


def check_method(method: str, drafter: str | None = None, **options: Any) -> None:
    """Raise ValueError (one line, naming the valid values) unless `method` can be built with these options.

    Needs no target, so command lines call it before loading the model; build_drafter calls it too.
    """
    parsed = parse_method(method)
    row = parsed.method
    if parsed.tli is not None:
        options = {"tli": parsed.tli, **options}
    if "tli" in options:
        tli = options["tli"]
        if not row.tli:
            raise ValueError(f"tli (--tli {tli}) applies only to method {' / '.join(_tli_rows())}; method "
                             f"{method!r} has no target layers to run")
        if isinstance(tli, bool) or not isinstance(tli, int):
            raise ValueError(f"tli must be an integer, got {tli!r}")
        shipped = shipped_tli(row.name)
        if drafter is None and shipped and tli not in shipped:
            raise ValueError(f"tli {tli} is not available: the shipped MoA drafters have tli "
                             f"{', '.join(map(str, shipped))} (or pass --drafter random for an untrained one)")
    if drafter not in (None, "random") and row.trained:
        from core.drafters.published_formats import check_published

        # checked before any model loads; EAGLE / Medusa checkpoints in their published layouts convert on load
        fmt = check_published(drafter, row.name)
        cfg = drafter_class(row.name).read_config(resolve_folder(drafter))[1] if fmt == "speclens" else None
        if "tli" in options and options["tli"] != getattr(cfg, "tli", None):
            raise ValueError(f"the {row.name} drafter in {drafter} was trained with tli {getattr(cfg, 'tli', None)}; "
                             f"it cannot run with tli {options['tli']}")
    if row.name == "ar" and options:
        raise ValueError(f"method ar takes no options, got {', '.join(sorted(options))}")
    if row.name == "pld":
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


FALLBACKS = ("none", "missing", "unloadable")


@dataclass(frozen=True)
class LoadedDrafter:
    """What `load_method` built, and from where."""

    drafter: Drafter
    source: str  # "built-in" (no weights), "shipped" (assets/drafters), "given" (the caller's folder), "random"
    folder: Path | None = None  # the checkpoint read ("shipped" / "given"), or the shipped one a random one replaces
    fallback: str = ""  # why a random drafter stands in for the shipped one ("" when none does)
    error: BaseException | None = None  # the shipped checkpoint's loading error, when that is the reason

    @property
    def published(self) -> dict | None:
        """{"format", "folder"} when the checkpoint was a published (EAGLE / Medusa) one, converted on load."""
        return getattr(getattr(self.drafter, "inner", self.drafter), "published", None)


def load_method(name: str, target: Target, checkpoint: str | None = None, *, fallback: str = "none",
                options: dict | None = None, random_options: dict | None = None) -> LoadedDrafter:
    """The drafter of a method name: built in (ar, pld), a checkpoint, or a random one.

    checkpoint: None (the shipped one, assets/drafters/<name's checkpoint>), "random", or a folder (ours or a
    published EAGLE / Medusa one): a folder the caller gives fails with its own error, never a random stand-in.
    fallback, for the shipped checkpoint only: "none" (missing -> FileNotFoundError), "missing" (a random drafter
    when it is not there), "unloadable" (a random drafter when it is not there or fails to load); `fallback` on
    the result says why. options: set on a checkpoint's drafter (`set_options`: tree settings); random_options:
    a random drafter's hyper-parameters (and `seed`).
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback {fallback!r}: choose one of {', '.join(FALLBACKS)}")
    parsed = parse_method(name)
    options = dict(options or {})
    if not parsed.method.trained:
        return LoadedDrafter(build_drafter(name, target, **options), "built-in")

    def random(reason: str = "", error: BaseException | None = None) -> LoadedDrafter:
        return LoadedDrafter(build_drafter(name, target, "random", **(random_options or {})), "random",
                             shipped_folder(name) if reason else None, reason, error)

    if checkpoint == "random":
        return random()
    if checkpoint is not None:
        return LoadedDrafter(build_drafter(name, target, checkpoint, **options), "given", resolve_folder(checkpoint))
    folder = shipped_folder(name)
    if fallback == "none":
        return LoadedDrafter(build_drafter(name, target, None, **options), "shipped", folder)
    if not has_shipped(name):
        return random(f"no trained checkpoint at assets/drafters/{folder.name}")
    try:
        return LoadedDrafter(build_drafter(name, target, str(folder), **options), "shipped", folder)
    except Exception as err:  # noqa: BLE001 - a mismatched or broken checkpoint: the caller chose a random stand-in
        if fallback != "unloadable":
            raise
        return random(f"the trained checkpoint could not be loaded ({err})", err)
