"""The app as users get it: `python app.py` with the real target (bfloat16) in a subprocess.

1. the `/generate` API through gradio_client (the real target answers);
2. a real browser: headless Debian Chromium driven by Playwright chats once with MoA
   (an untrained drafter when none is shipped), checks the coloured tokens and the live
   figures, stops a second generation, opens every tab and saves a screenshot of each
   under screenshots/.
Both share one server, so the target loads once. Set SPECLENS_TINY=1 to run them against
the tiny test model instead (quicker, no real text).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
START_TIMEOUT_S = 180
GENERATE_TIMEOUT_S = 240
MAX_NEW_TOKENS = 8



def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("app") / "app.log"
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1",
           "GRADIO_ANALYTICS_ENABLED": "False", "SPECLENS_DTYPE": "bfloat16", "SPECLENS_REFERENCE_TOKENS": "4",
           "PYTHONPATH": str(ROOT)}
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the app exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"the app did not answer within {START_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and anything it started, nothing else
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def _set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


@pytest.mark.real
def test_generate_api_on_the_real_target(app_url):
    from gradio_client import Client

    out = Client(app_url, verbose=False).predict("Name one primary colour.", "pld", 8, api_name="/generate")
    assert {"text", "token_ids", "mean_accepted", "tokens_per_s"} <= set(out)
    assert 1 <= len(out["token_ids"]) <= 8 and out["text"].strip()
    assert out["mean_accepted"] >= 1.0 and out["tokens_per_s"] > 0


@pytest.mark.real
@pytest.mark.browser
def test_generate_and_every_tab(app_url):
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; `make test` does it)")
    if _playwright() is None:
        pytest.skip("the playwright Python package is not installed (pip install playwright==1.65.2)")
    from demo.runtime import method_available

    method = "moa" if method_available("moa") else "pld"
    SHOTS.mkdir(exist_ok=True)
    with _playwright()() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(app_url, wait_until="domcontentloaded")
            page.locator("#prompt-box textarea").wait_for(timeout=60_000)

            # pick the method and a short answer
            page.locator("#method-picker input").click()
            label = {"moa": "Mixture of Attentions", "pld": "Prompt lookup"}[method]
            page.get_by_role("option", name=label).first.click()
            if method == "moa":
                page.locator("#tli-picker").get_by_text("0", exact=True).click()  # N = 0: the quickest drafter
            _set_number(page, "max-new", MAX_NEW_TOKENS)
            page.locator("#prompt-box textarea").fill("Name three primary colours.")
            page.locator("#send-btn").click()

            # tokens stream in as coloured spans; the stats appear; the run finishes
            page.locator("#token-stream .tok").first.wait_for(timeout=GENERATE_TIMEOUT_S * 1000)
            page.wait_for_function(
                "() => { const s = document.querySelector('#live-stats'); "
                "return s && !s.innerText.includes('generating') && s.innerText.includes('tau'); }",
                timeout=GENERATE_TIMEOUT_S * 1000)
            spans = page.locator("#token-stream span.tok")
            assert spans.count() >= 2
            assert page.locator("#token-stream span.tok-bonus").count() >= 1
            title = spans.first.get_attribute("title")
            assert title and "step" in title and "target p" in title
            stats = page.locator("#live-stats").inner_text()
            assert "tokens/s" in stats and "speedup" in stats
            tau = float(page.locator("#live-stats .stat-card .v").first.inner_text())
            assert tau >= 1.0
            if method == "moa":
                note = page.locator("#drafter-note").inner_text()
                assert "untrained" in note or "trained" in note
            assert page.locator("#chatbot").inner_text().strip()
            page.screenshot(path=str(SHOTS / "01_generate.png"), full_page=True)

            for i, (tab, wait_for) in enumerate([
                ("Draft tree", "#tree-plot"), ("LSA attention", "#lsa-heatmap"), ("TLI trade-off", "#tli-plot"),
                ("Client-server", None), ("Draft failures", "#fail-source"), ("Benchmarks", "#bench-summary"),
            ], start=2):
                button = page.get_by_role("tab", name=tab)
                if button.count() == 0:
                    assert tab == "Client-server", f"tab {tab!r} is missing"
                    continue
                button.first.click()
                if wait_for:
                    page.locator(wait_for).first.wait_for(state="visible", timeout=30_000)
                if tab == "Draft tree":
                    page.locator("#tree-plot .main-svg").first.wait_for(timeout=30_000)
                    assert "draft depth" in page.locator("#tree-plot").inner_text()
                if tab == "LSA attention" and method == "moa":
                    page.wait_for_function("() => document.querySelector('#lsa-heatmap') && "
                                           "document.querySelector('#lsa-heatmap').innerText.includes('LSA attention')",
                                           timeout=30_000)
                if tab == "Draft failures":
                    page.locator("#fail-analyse").click()
                    page.wait_for_function(
                        "() => { const s = document.querySelector('#fail-summary'); "
                        "return s && /trace|build yet/.test(s.innerText); }",
                        timeout=60_000)
                page.wait_for_timeout(1500)  # plots render asynchronously
                name = tab.lower().replace(" ", "_").replace("-", "_")
                page.screenshot(path=str(SHOTS / f"{i:02d}_{name}.png"), full_page=True)
            assert page.locator("text=Traceback").count() == 0

            page.get_by_role("tab", name="Generate").first.click()
            # a long plain generation, stopped: the stream stops growing and the app stays usable
            page.locator("#method-picker input").click()
            page.get_by_role("option", name="Plain decoding").first.click()
            _set_number(page, "max-new", 400)
            page.locator("#prompt-box textarea").fill("Tell me a long story about a lighthouse.")
            page.locator("#send-btn").click()
            page.wait_for_function("() => document.querySelector('#live-stats').innerText.includes('generating')",
                                   timeout=GENERATE_TIMEOUT_S * 1000)
            page.locator("#stop-btn").click()
            page.wait_for_timeout(2000)
            n_stopped = page.locator("#token-stream .tok").count()
            page.wait_for_timeout(2000)
            assert page.locator("#token-stream .tok").count() == n_stopped < 400
        finally:
            browser.close()
