"""The method table: one `Method` row per method, everything the rest of the code knows about it.

Read it through core.methods, which re-exports `Method` and `METHODS` with the one parser of method names and
the helpers that derive every list (`methods_where`, `shipped_names`, ...). The table sits in this leaf module,
importing nothing of the project, so that low-level modules such as core.drafters.published_formats and
core.trees.choice can read it (and `methods_where`, `static_tree_methods`, `format_methods`) without an import circle:
core.methods itself imports them.

Adding a method: one row here and one drafter file (docs/ARCHITECTURE.md, "Adding a method").
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

TREES = ("none", "chain", "dynamic", "static")
CLIENT_SERVER_ROLES = {  # Method.client_server: what the method does in core.client_server's split
    "api": "plain decoding over an API: the server sends back the next token and nothing else",
    "features": "a drafter on the client that needs the target's fresh features from the server every cycle",
    "offline": "a drafter on the client that keeps drafting while the link is down (the server runs its layer "
               "self-attention and sends the result)",
}


@dataclass(frozen=True)
class Method:
    """One row of the method table."""

    name: str
    label: str  # what the app and the reports call it
    description: str
    drafter: str = ""  # "module:Class" of a trained drafter; "" for methods without weights
    checkpoint: str = ""  # its shipped folder under assets/drafters ("" = none)
    # The draft it proposes each cycle: "none" (plain decoding), "chain" (one line of tokens), "dynamic" (a tree
    # grown by the drafter's confidence: depth / top_k / total_tokens), "static" (a fixed tree shape, sized by
    # core.drafters.static_tree: tree_size).
    tree: str = "none"
    tli: bool = False  # takes MoA's Target Layer Inference N: the names <name>-tliN, shipped as <checkpoint>-tliN
    client_server: str = ""  # its role in core.client_server (a key of CLIENT_SERVER_ROLES; "" = not served)
    short: str = ""  # a short name for figure legends
    colour: str = ""  # its colour where figures tell methods apart ("" = the figure's neutral colour)
    formats: tuple[str, ...] = ()  # published checkpoint formats that load as this method (published_formats)

    def __post_init__(self) -> None:
        if self.tree not in TREES:
            raise ValueError(f"method {self.name!r}: tree {self.tree!r}; choose one of {', '.join(TREES)}")
        if self.client_server and self.client_server not in CLIENT_SERVER_ROLES:
            raise ValueError(f"method {self.name!r}: client_server {self.client_server!r}; choose one of "
                             f"{', '.join(CLIENT_SERVER_ROLES)} or leave it empty")

    @property
    def trained(self) -> bool:
        return bool(self.drafter)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "Plain decoding", "plain autoregressive decoding (one target pass per token)",
           client_server="api", short="plain decoding", colour="#868e96"),
    Method("pld", "Prompt lookup", "prompt lookup: copy what followed the last n-gram earlier in the context",
           tree="chain", short="prompt lookup"),
    Method("eagle2", "EAGLE-2", "EAGLE-2: feature+token fusion, one decoder layer, dynamic draft tree",
           "core.drafters.eagle2:Eagle2Drafter", "eagle2", tree="dynamic", client_server="features",
           short="EAGLE-2", colour="#1c7ed6", formats=("eagle",)),
    Method("moa", "Mixture of Attentions",
           "Mixture of Attentions: layer self-attention + self/cross-attention (+ TLI), dynamic tree",
           "core.drafters.moa:MoADrafter", "moa", tree="dynamic", tli=True, client_server="offline", short="MoA",
           colour="#e8590c"),
    Method("medusa", "Medusa", "Medusa: K residual heads on the last hidden state, static tree",
           "core.drafters.medusa:MedusaDrafter", "medusa", tree="static", short="Medusa", formats=("medusa",)),
    Method("amphista", "Amphista", "Amphista: staged adaptation + bidirectional auto-embedding block, static tree",
           "core.drafters.amphista:AmphistaDrafter", "amphista", tree="static", short="Amphista"),
)}


def methods_where(**conditions: Any) -> list[str]:
    """Names of the table's rows (in table order) whose fields match every condition: `tree="static"`,
    `trained=False`, `tli=True`; True / False for a text field means set / empty (`client_server=True`: every
    method the client-server split serves)."""
    known = [f.name for f in fields(Method)] + ["trained"]
    unknown = sorted(set(conditions) - set(known))
    if unknown:
        raise ValueError(f"methods_where: no field {', '.join(unknown)}; the fields are {', '.join(known)}")

    def match(row: Method, key: str, want: Any) -> bool:
        value = getattr(row, key)
        if isinstance(want, bool) and not isinstance(value, bool):
            return bool(value) == want
        return value == want

    return [name for name, row in METHODS.items() if all(match(row, k, v) for k, v in conditions.items())]


def static_tree_methods() -> tuple[str, ...]:
    """The methods that draft a fixed tree shape (sized by core.drafters.static_tree): ('medusa', 'amphista')."""
    return tuple(methods_where(tree="static"))


def format_methods() -> dict[str, str]:
    """Published format -> the method it loads as ({"eagle": "eagle2", "medusa": "medusa"})."""
    return {fmt: m.name for m in METHODS.values() for fmt in m.formats}
