"""SpecLens: watch, compare and debug speculative decoding in the browser.

    python app.py            # http://127.0.0.1:7860 (GRADIO_SERVER_PORT, GRADIO_SERVER_NAME to change them)

Tabs are modules under demo/, listed in TABS; each exposes `TITLE` and `build(ctx)` (see demo/common.py).
The page opens on a finished example (a shipped lesson, demo/lessons.py) while the target loads in a
background thread started with the server; a status line says how far the load got. Every tab opens on content
from a real run without any model: the lesson, the committed results, the Client-server tab's recorded run
(scripts/record_client_server.py) and the committed benchmark traces, analysed once at start (Draft failures).
Environment: see demo/runtime.py (SPECLENS_TINY=1 for a tiny test model) and SPECLENS_CONCURRENCY (default 2).
The app listens on 127.0.0.1 unless GRADIO_SERVER_NAME says otherwise (a Space sets it). The `/generate` API is
documented in demo/API.md.
"""

from __future__ import annotations

import html
import json
import logging
import os
from types import ModuleType

import gradio as gr

from demo import (
    api,
    lessons,
    tab_benchmarks,
    tab_client_server,
    tab_failures,
    tab_generate,
    tab_lsa,
    tab_player,
    tab_tli,
    tab_tree,
)
from demo.common import AppContext, new_session
from demo.render import CSS
from demo.runtime import Runtime

log = logging.getLogger("speclens.app")

TABS: tuple[ModuleType, ...] = (tab_generate, tab_player, tab_tree, tab_lsa, tab_tli, tab_client_server,
                                tab_failures, tab_benchmarks)
HEADER = """\
# SpecLens: speculative decoding, step by step
A small drafter guesses, the target model checks all guesses at once. Below is a finished example; ask your own
question in **Generate**, replay a generation cycle by cycle in **Step by step**. Target: {target}.
"""
DEFAULT_HOST = "127.0.0.1"
STATUS_EVERY_S = 1.0


def concurrency_limit() -> int:
    return max(1, int(os.environ.get("SPECLENS_CONCURRENCY", "2")))


def status_html(runtime: Runtime) -> str:
    """The load status line: loading (with seconds so far), ready or failed."""
    st = runtime.status()
    text = html.escape(st["text"])
    if st["state"] == "loading":
        text = f"⏳ {text} ({st['seconds']:.0f} s so far); the example below needs no model"
    elif st["state"] == "ready":
        text = f"✓ {text}"
    elif st["state"] == "failed":
        text = f"⚠ {text}"
    return f'<div class="load-status {st["state"]}" id="load-status-line">{text}</div>'


def build_app(runtime: Runtime | None = None) -> gr.Blocks:
    runtime = runtime or Runtime()
    shipped = lessons.load_lessons()
    with gr.Blocks(title="SpecLens: speculative decoding") as demo:
        gr.Markdown(HEADER.format(target=runtime.describe()))
        status = gr.HTML(status_html(runtime), elem_id="load-status")
        timer = gr.Timer(STATUS_EVERY_S, active=runtime.status()["state"] != "ready")
        session = gr.State(new_session(shipped[0] if shipped else None))
        with gr.Tabs():
            for mod in TABS:
                with gr.Tab(mod.TITLE, id=mod.__name__.rsplit(".", 1)[-1]) as tab:
                    mod.build(AppContext(runtime=runtime, session=session, tab=tab))
        api.register(runtime)

        def on_tick():
            state = runtime.status()["state"]
            return status_html(runtime), gr.Timer(active=state in ("loading", "idle") and runtime.background_started)

        timer.tick(on_tick, None, [status, timer], queue=False, api_visibility="private")
        demo.load(on_tick, None, [status, timer], queue=False, api_visibility="private")
    demo.queue(default_concurrency_limit=concurrency_limit(), max_size=64)
    return demo


# Links to an accordion ("#cost-curve", "#cs-bound-box") open it and scroll to it; "#cost-curve" works from any tab
# (it opens the Generate tab first).
LINK_TABS = {"cost-curve": "Generate", "cs-bound-box": "Client-server"}
ACCORDION_LINKS_JS = """
<script>
document.addEventListener("click", (ev) => {
  const a = ev.target.closest ? ev.target.closest('a[href^="#"]') : null;
  const id = a ? a.getAttribute("href").slice(1) : "";
  const tabs = LINK_TABS;
  if (!(id in tabs)) return;
  ev.preventDefault();
  const tab = [...document.querySelectorAll("[role=tab]")].find((b) => b.innerText.trim() === tabs[id]);
  if (tab && tab.getAttribute("aria-selected") !== "true") tab.click();
  setTimeout(() => {
    const box = document.getElementById(id);
    if (!box) return;
    const head = box.querySelector(".label-wrap");
    if (head && !head.classList.contains("open")) head.click();
    box.scrollIntoView({behavior: "smooth", block: "start"});
  }, 400);
});
</script>
""".replace("LINK_TABS;", json.dumps(LINK_TABS) + ";")


def launch_kwargs() -> dict:
    """Arguments for `launch` that belong to the look of the app (Gradio 6 takes them there)."""
    return {"css": CSS, "theme": gr.themes.Soft(), "footer_links": ["api", "gradio"], "head": ACCORDION_LINKS_JS}


def server_address() -> tuple[str, int]:
    """(host, port): 127.0.0.1 unless GRADIO_SERVER_NAME says otherwise; port from GRADIO_SERVER_PORT."""
    port = int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    return os.environ.get("GRADIO_SERVER_NAME") or DEFAULT_HOST, port


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host, port = server_address()
    runtime = Runtime()
    runtime.start_background_load()  # the page is served at once; the target loads meanwhile
    build_app(runtime).launch(server_name=host, server_port=port, show_error=False, **launch_kwargs())


if __name__ == "__main__":
    main()
