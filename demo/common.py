"""What every tab shares: the app context handed to `build(ctx)`, the per-user session, friendly errors.

A tab module exposes `TITLE` (the tab's label) and `build(ctx: AppContext) -> None`, which
creates its components inside the `gr.Tab` that app.py has opened (`ctx.tab`). It reads
the user's last generation from `ctx.session` (a `gr.State`, one per browser tab) and
calls the shared `ctx.runtime` (demo.runtime.Runtime) for anything that needs a model.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from demo.runtime import Runtime, UserError

log = logging.getLogger("speclens.app")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "assets" / "results"


def new_session(example: dict | None = None) -> dict:
    """One user's state: the chat, the runs of their last action, their own plain-decoding speed.

    `example` (a shipped lesson as a run, demo.lessons) fills the runs until the user generates, so every tab
    has something to show before the target has loaded.
    """
    return {"conversation": [], "runs": [example] if example else [], "plain_tps": None, "tli_live": []}


def run_decoder(run: dict | None, runtime: Runtime):
    """Decode token ids for `run`: its own token_text table (lessons), else the target's tokenizer."""
    from demo.lessons import decoder

    if run is not None and run.get("token_text") is not None:
        return decoder(run, runtime.decode if runtime.loaded else None)
    return runtime.decode


@dataclass
class AppContext:
    runtime: Runtime
    session: gr.State  # value: new_session()
    tab: gr.Tab | None = None  # the tab being built; `ctx.tab.select` refreshes it when opened


def plain_message(err: BaseException) -> str:
    """One line a user can read, for errors that are not UserError."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"Something went wrong ({type(err).__name__}: {text[:200]}). The details are in the server log."


def friendly(fn):
    """Turn exceptions into gr.Error messages: a user never sees a traceback."""

    def convert(err: Exception) -> gr.Error:
        if isinstance(err, gr.Error):
            return err
        if isinstance(err, UserError):
            return gr.Error(str(err), print_exception=False)
        log.exception("error in %s", fn.__name__)
        return gr.Error(plain_message(err), print_exception=False)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as err:
                raise convert(err) from None
        return gen

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            raise convert(err) from None
    return call


def progress_reporter(progress: gr.Progress | None):
    if progress is None:
        return None
    return lambda fraction, text: progress(fraction, desc=text)


_DOWNLOADS = Path(tempfile.gettempdir()) / "speclens-downloads"


def write_json_download(payload: dict | list, stem: str) -> str:
    """Write a JSON file for a gr.DownloadButton / gr.File and return its path."""
    _DOWNLOADS.mkdir(parents=True, exist_ok=True)
    _prune(_DOWNLOADS, max_age_s=3600)
    path = _DOWNLOADS / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.perf_counter_ns() % 10**6}.json"
    path.write_text(json.dumps(payload))
    return str(path)


def _prune(folder: Path, max_age_s: float) -> None:
    now = time.time()
    for p in folder.glob("*.json"):
        try:
            if now - p.stat().st_mtime > max_age_s:
                p.unlink()
        except OSError:
            pass


def last_runs(session: dict | None) -> list[dict]:
    return list((session or {}).get("runs") or [])


def run_choices(session: dict | None, predicate=None) -> list[tuple[str, int]]:
    out = []
    for i, run in enumerate(last_runs(session)):
        if predicate is None or predicate(run):
            n = len(run.get("token_ids") or [])
            out.append((f"{i + 1}. {run.get('label', run.get('method'))} ({n} tokens)", i))
    return out
