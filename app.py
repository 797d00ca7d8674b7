"""SpecLens: watch, compare and debug speculative decoding in the browser.

    python app.py            # http://localhost:7860 (port from GRADIO_SERVER_PORT)

Tabs are modules under demo/, listed in TAB_MODULES; a module that does not
exist (yet) is skipped, so tabs can land one at a time. A tab module exposes
`TITLE` and `build(ctx)` (see demo/common.py). The model is loaded lazily on the
first request, so the page comes up at once. Environment: see demo/runtime.py
(SPECLENS_TINY=1 for a tiny test model) and SPECLENS_CONCURRENCY (default 2).
The `/generate` API is documented in demo/API.md.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

import gradio as gr

from demo import api
from demo.common import AppContext, new_session
from demo.render import CSS
from demo.runtime import Runtime

log = logging.getLogger("speclens.app")

TAB_MODULES = (
    "demo.tab_generate",
    "demo.tab_tree",
    "demo.tab_lsa",
    "demo.tab_tli",
    "demo.tab_client_server",
    "demo.tab_failures",
    "demo.tab_benchmarks",
)
HEADER = """\
# SpecLens: speculative decoding, step by step
A small drafter guesses, the target model checks all guesses at once. Start in **Generate**; the other tabs
explain the last generation. Target: {target} (loaded on first use).
"""


def tab_modules(names: tuple[str, ...] = TAB_MODULES) -> list[ModuleType]:
    """Import the tab modules that exist; skip missing ones (a broken one is logged and skipped too)."""
    mods = []
    for name in names:
        try:
            mods.append(importlib.import_module(name))
        except ModuleNotFoundError as err:
            if err.name != name:
                log.exception("tab %s needs a module that is missing; skipped", name)
        except Exception:
            log.exception("tab %s failed to import; skipped", name)
    return mods


def concurrency_limit() -> int:
    return max(1, int(os.environ.get("SPECLENS_CONCURRENCY", "2")))


def build_app(runtime: Runtime | None = None, names: tuple[str, ...] = TAB_MODULES) -> gr.Blocks:
    runtime = runtime or Runtime()
    with gr.Blocks(title="SpecLens: speculative decoding") as demo:
        gr.Markdown(HEADER.format(target=runtime.describe()))
        session = gr.State(new_session())
        with gr.Tabs():
            for mod in tab_modules(names):
                with gr.Tab(mod.TITLE, id=mod.__name__.rsplit(".", 1)[-1]) as tab:
                    try:
                        mod.build(AppContext(runtime=runtime, session=session, tab=tab))
                    except Exception:
                        log.exception("tab %s failed to build", mod.__name__)
                        gr.Markdown(f"This tab could not be built ({mod.__name__}); see the server log.")
        api.register(runtime)
    demo.queue(default_concurrency_limit=concurrency_limit(), max_size=64)
    return demo


def launch_kwargs() -> dict:
    """Arguments for `launch` that belong to the look of the app (Gradio 6 takes them there)."""
    return {"css": CSS, "theme": gr.themes.Soft(), "footer_links": ["api", "gradio"]}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    port = int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    host = os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0")
    build_app().launch(server_name=host, server_port=port, show_error=False, **launch_kwargs())


if __name__ == "__main__":
    main()
