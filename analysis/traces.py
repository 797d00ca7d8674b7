"""Saving step traces compactly (`DIR/traces/<method>.jsonl.gz`) and reading them back.

One line per generated turn: {"method", "question_id", "category", "turn",
"token_ids", "token_text", **trace}, where trace is `GenerationResult.trace()`
made smaller:

* `row_top` (the target's top-10 at every row [root, nodes...]) is kept only
  at the rows the failure analysis reads: the root and the accepted nodes,
  i.e. the parents of every tested draft token. Other rows become [].
* `depths` is dropped (it follows from `parents`).
* Drafter extras are dropped except `draft_top` (rows pruned the same way when
  it has one entry per row); MoA's per-token layer-attention maps, for example,
  would otherwise dominate the file.
* `token_text` maps every token id that appears in a tree, as a bonus or in a
  top-10 list to its decoded text, so the failure analysis runs without
  loading a tokenizer.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path

KEPT_EXTRAS = ("draft_top",)


def _kept_rows(event: dict) -> set[int]:
    return {0} | {a + 1 for a in event["accepted"]}


def compact_event(event: dict) -> dict:
    ev = {k: v for k, v in event.items() if k not in ("extras", "depths")}  # depths follow from parents
    n_rows = len(event["tree"]["tokens"]) + 1
    keep = _kept_rows(event)
    if "row_top" in ev:
        ev["row_top"] = [row if i in keep else [] for i, row in enumerate(ev["row_top"])]
    extras = {k: v for k, v in event.get("extras", {}).items() if k in KEPT_EXTRAS}
    if isinstance(extras.get("draft_top"), list) and len(extras["draft_top"]) == n_rows:
        extras["draft_top"] = [row if i in keep else [] for i, row in enumerate(extras["draft_top"])]
    if extras:
        ev["extras"] = extras
    return ev


def trace_token_ids(trace: dict) -> set[int]:
    """Every token id a failure analysis of this trace may need to show."""
    ids: set[int] = set()
    for ev in trace["events"]:
        ids.update(ev["tree"]["tokens"])
        ids.update(ev["new_tokens"])
        ids.add(ev["bonus"])
        for row in ev.get("row_top") or []:
            ids.update(int(t) for t, _ in row)
    return ids


def compact_trace(trace: dict, decode: Callable[[list[int]], str] | None = None) -> dict:
    """A smaller copy of a trace (see the module docstring); with `decode`, a token_text map is added."""
    out = {k: v for k, v in trace.items() if k != "events"}
    out["events"] = [compact_event(e) for e in trace["events"]]
    if decode is not None:
        out["token_text"] = {str(t): decode([t]) for t in sorted(trace_token_ids(out))}
    return out


class TraceWriter:
    """Appends compact traces to one gzip JSON-lines file per method. Each record is its own gzip member, closed
    as soon as it is written, so a run stopped at any moment leaves every finished trace readable (a benchmark
    rebuilds its summary from them, and `--resume` appends to them). A new writer starts the files afresh
    unless `append`."""

    def __init__(self, folder: str | Path, append: bool = False) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._started: set[str] = set()
        self._append = append

    def write(self, method: str, record: dict) -> None:
        mode = "at" if self._append or method in self._started else "wt"
        with gzip.open(self.folder / f"{method}.jsonl.gz", mode, encoding="utf-8") as f:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._started.add(method)

    def close(self) -> None:
        self._started.clear()


def read_traces(path: str | Path) -> Iterator[dict]:
    """The trace records of a `.jsonl.gz` (or plain `.jsonl` / single `.json` trace) file."""
    path = Path(path)
    if path.suffix == ".json":
        with open(path, encoding="utf-8") as f:
            yield json.load(f)
        return
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        try:
            for line in f:
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError:
                        if line.endswith("\n"):
                            raise
                        return  # the last line of a run stopped while writing it
        except EOFError:
            return  # a gzip member cut off by a stop: every record before it is complete


def token_text_decoder(trace: dict, fallback: Callable[[list[int]], str] | None = None
                       ) -> Callable[[list[int]], str] | None:
    """A decode function backed by the trace's token_text map (then `fallback`), or None if neither exists."""
    table = trace.get("token_text")
    if table is None:
        return fallback

    def decode(ids: list[int]) -> str:
        parts = []
        for t in ids:
            s = table.get(str(int(t)))
            if s is None:
                if fallback is None:
                    s = f"<{int(t)}>"
                else:
                    s = fallback([int(t)])
            parts.append(s)
        return "".join(parts)

    return decode
