"""The app as users get it: `python app.py` with the real target (bfloat16) in a subprocess.

1. a real browser (headless Debian Chromium driven by Playwright) opens the page as the server starts: the
   shipped example (coloured tokens, draft tree, LSA map) is there before the target has loaded, beside a
   load status line, and every one of the 8 tabs shows content from a real run (a table, plot or text) before
   any button is pressed;
2. the `/generate` API through gradio_client (the real target answers);
3. the browser chats once with MoA, checks the coloured tokens, the stats (speedup beside its ideal speedup)
   and the live figures, replays the shipped lesson and the live run in the step-by-step player
   (Next / Previous / Play), opens every tab at 1,400 px (each at most about four screens tall; screenshots
   to docs/screenshots/) and at 390 px (no horizontal scroll; screenshots to screenshots/mobile/), runs the
   Client-server tab (float32, while the app runs bfloat16: the three texts must be equal) and reruns MoA there
   at a lower offline cut-off, and stops a second generation.
All share one server, so the target loads once. Set SPECLENS_TINY=1 to run them against the tiny test model
instead (quicker, no real text).
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "screenshots"
DOC_SHOTS = ROOT / "docs" / "screenshots"  # committed: the desktop views the README shows
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
START_TIMEOUT_S = 180
GENERATE_TIMEOUT_S = 240
CLIENT_SERVER_TIMEOUT_S = 420  # a second target (float32) loads, then three simulated runs
MAX_NEW_TOKENS = 8
METHOD = os.environ.get("SPECLENS_BROWSER_METHOD", "moa")  # the method of the live chat (moa: LSA maps too)
DESKTOP = {"width": 1400, "height": 1000}
PHONE = {"width": 390, "height": 844}
MAX_SCREENS = 4.2  # no tab taller than about four desktop screens
TABS = ["Generate", "Step by step", "Draft tree", "LSA attention", "TLI trade-off", "Client-server",
        "Draft failures", "Benchmarks"]


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


@contextmanager
def serve_app(folder: Path, **env_extra: str) -> Iterator[str]:
    """`python app.py` in its own session on a free port -> its URL while the block runs; the server and all it
    started are stopped afterwards. env_extra: SPECLENS_* settings on top of the browser tests' own."""
    port = _free_port()
    log_path = folder / "app.log"
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1",
           "GRADIO_ANALYTICS_ENABLED": "False", "SPECLENS_DTYPE": "bfloat16", "SPECLENS_REFERENCE_TOKENS": "4",
           "PYTHONPATH": str(ROOT), **env_extra}
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


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    with serve_app(tmp_path_factory.mktemp("app")) as url:
        yield url


def _browser_or_skip():
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; `make test` does it)")
    if _playwright() is None:
        pytest.skip("the playwright Python package is not installed (pip install playwright==1.65.2)")
    return _playwright()


def _open_tab(page, name: str) -> None:
    """Click a tab; on a narrow screen Gradio moves the ones that do not fit into a "More tabs" menu."""
    tab = page.locator("[role=tablist] [role=tab]", has_text=name)
    if tab.count():
        tab.first.click()
    else:
        page.get_by_role("button", name="More tabs").click()
        page.locator(".overflow-dropdown button", has_text=name).first.click()
    page.wait_for_timeout(1500)  # plots render asynchronously


def _pick_option(page, elem_id: str, name: str, tries: int = 8, tab: str | None = None) -> None:
    """Choose a dropdown option whose label starts with `name`. Gradio's dropdown opens its list on focus, and some
    choices arrive with the event that opening a tab fires: when that update lands on a list just opened, the list
    closes while the input keeps the focus (blur, try again); when it lands before the lazily drawn tab is drawn,
    it is lost (open `tab` again, as a user would, to fire the event once more)."""
    box = page.locator(f"#{elem_id} input")
    for attempt in range(tries):
        box.click()
        option = page.get_by_role("option", name=name).first
        try:
            option.wait_for(state="visible", timeout=5_000)
        except Exception:  # playwright's TimeoutError
            box.evaluate("e => e.blur()")
            page.wait_for_timeout(1_000)
            if tab and attempt % 2 == 1:
                other = page.locator("[role=tablist] [role=tab]").first
                other.click()
                page.wait_for_timeout(500)
                _open_tab(page, tab)
            continue
        option.click()
        return
    raise AssertionError(f"#{elem_id} never offered an option named {name!r}")


def _shot_name(i: int, tab: str) -> str:
    return f"{i:02d}_{tab.lower().replace(' ', '_').replace('-', '_')}.png"


def _save_small(page, path: Path) -> None:
    """A full-page screenshot as a 256-colour PNG (about a third of the size: fit to commit)."""
    from PIL import Image

    page.screenshot(path=str(path), full_page=True)
    Image.open(path).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def _set_number(page, elem_id: str, value: float) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def _wait_text(page, selector: str, text: str, timeout_s: float = 30) -> None:
    page.wait_for_function("([s, t]) => { const e = document.querySelector(s); return e && e.innerText.includes(t); }",
                           arg=[selector, text], timeout=timeout_s * 1000)


def _first_look(page, tab: str) -> None:
    """What `tab` shows as it opens: content from a real run (recorded or shipped), no button pressed."""
    if tab == "Step by step":
        _wait_text(page, "#player-story", "Cycle 1 of")
        page.locator("#player-tree .main-svg").first.wait_for(timeout=30_000)
    elif tab == "Draft tree":
        _wait_text(page, "#tree-plot", "draft depth")
    elif tab == "LSA attention":
        _wait_text(page, "#lsa-heatmap", "LSA attention")
    elif tab == "TLI trade-off":
        assert page.locator("#tli-table tr").count() >= 3
        page.locator("#tli-plot .main-svg").first.wait_for(timeout=30_000)
    elif tab == "Client-server":
        _wait_text(page, "#cs-example-note", "Recorded example")
        assert page.locator("#cs-summary tr").count() == 4  # header + plain, EAGLE-2, MoA
        assert "All methods wrote exactly the same final text (float32)" in page.locator("#cs-summary").inner_text()
        assert "While the link was down MoA" in page.locator("#cs-offline").inner_text()
        _wait_text(page, "#cs-tokens", "Tokens over time")
        _wait_text(page, "#cs-timeline", "MoA over 4g")
        assert page.locator("#cs-texts .tok-stream").count() == 3
        assert page.locator("#cs-texts .tok-stream .tok").count() >= 3 * 20
    elif tab == "Draft failures":
        _wait_text(page, "#fail-summary", "Recorded example")
        assert "rejected" in page.locator("#fail-summary").inner_text()
        page.wait_for_function("() => { const g = document.querySelector('#fail-table [role=grid]'); "
                               "return g && Number(g.getAttribute('aria-rowcount')) > 10; }", timeout=30_000)
        assert "target_text" in page.locator("#fail-table").inner_text()
        for plot in ("#fail-kind", "#fail-calibration", "#fail-topk"):
            page.locator(f"{plot} .main-svg").first.wait_for(timeout=30_000)
    elif tab == "Benchmarks":
        page.locator("#bench-headline .main-svg").first.wait_for(timeout=30_000)
        assert page.locator("#bench-table tr").count() >= 3


def _client_server_run(page) -> None:
    """The Client-server tab's own run (float32 while the app runs bfloat16), then MoA at a lower cut-off."""
    _open_tab(page, "Client-server")
    _set_number(page, "cs-max-new", 8)
    _set_number(page, "cs-drop-start", 0.2)
    _set_number(page, "cs-drop-len", 1)
    page.locator("#cs-run").click()
    _wait_text(page, "#cs-example-note", "Your run", CLIENT_SERVER_TIMEOUT_S)  # loads a float32 target first
    assert "float32" in page.locator("#cs-example-note").inner_text()
    summary = page.locator("#cs-summary").inner_text()
    assert "All methods wrote exactly the same final text (float32)" in summary, summary
    assert page.locator("#cs-texts .tok-stream").count() == 3
    assert "While the link was down MoA" in page.locator("#cs-offline").inner_text()
    _set_number(page, "cs-confidence", 0)
    page.locator("#cs-rerun").click()
    _wait_text(page, "#cs-example-note", "MoA rerun at the cut-off 0", CLIENT_SERVER_TIMEOUT_S)
    offline = page.locator("#cs-offline").inner_text()
    assert "cut-off at 0" in offline and "While the link was down MoA wrote" in offline, offline
    assert "All methods wrote exactly the same final text (float32)" in page.locator("#cs-summary").inner_text()


@pytest.mark.real
@pytest.mark.browser
def test_first_look_needs_no_model(app_url):
    """Opened as the server starts: the finished example is on the page while the target loads."""
    pw = _browser_or_skip()
    with pw() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=DESKTOP)
            page.goto(app_url, wait_until="domcontentloaded")
            page.locator("#token-stream .tok-draft").first.wait_for(timeout=60_000)
            assert page.locator("#token-stream .tok").count() >= 10  # the example's coloured answer
            assert "Example" in page.locator("#example-note").inner_text()
            page.locator("#gen-tree .main-svg").first.wait_for(timeout=30_000)
            assert "draft depth" in page.locator("#gen-tree").inner_text()
            page.locator("#gen-lsa .main-svg").first.wait_for(timeout=30_000)
            for tab in TABS[1:]:  # every other tab, opened and looked at, no button pressed
                _open_tab(page, tab)
                _first_look(page, tab)
            _open_tab(page, "Client-server")  # the offline sentence's link opens the bound's accordion
            page.locator("#cs-offline a").first.click()
            page.locator("#cs-bound .main-svg").first.wait_for(timeout=30_000)
            _open_tab(page, TABS[0])
            status = page.locator("#load-status").inner_text()
            assert any(w in status for w in ("loading", "measuring", "ready")), status
            # the status line follows the background load to its end without a reload
            page.wait_for_function("() => document.querySelector('#load-status').innerText.includes('ready')",
                                   timeout=START_TIMEOUT_S * 1000)
        finally:
            browser.close()


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
    pw = _browser_or_skip()
    DOC_SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "mobile").mkdir(parents=True, exist_ok=True)
    with pw() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=DESKTOP)
            page.goto(app_url, wait_until="domcontentloaded")
            page.locator("#prompt-box textarea").wait_for(timeout=60_000)

            # pick the method and a short answer
            page.locator("#method-picker input").click()
            from demo.runtime import METHOD_LABELS

            page.get_by_role("option", name=METHOD_LABELS[METHOD]).first.click()
            if METHOD == "moa":
                page.locator("#tli-picker").get_by_text("0", exact=True).click()  # N = 0: the quickest drafter
            _set_number(page, "max-new", MAX_NEW_TOKENS)
            page.locator("#prompt-box textarea").fill("Name three primary colours.")
            page.locator("#send-btn").click()

            # tokens stream in as coloured spans; the stats appear; the run finishes
            page.locator("#token-stream .tok").first.wait_for(timeout=GENERATE_TIMEOUT_S * 1000)
            page.wait_for_function(  # the example's note goes with the first answer
                "() => { const s = document.querySelector('#live-stats'); "
                "const e = document.querySelector('#example-note'); "
                "return s && !s.innerText.includes('generating') && s.innerText.includes('tau') && "
                "e && !e.innerText.trim(); }",
                timeout=GENERATE_TIMEOUT_S * 1000)
            spans = page.locator("#token-stream span.tok")
            assert spans.count() >= 2
            assert page.locator("#token-stream span.tok-bonus").count() >= 1
            title = spans.first.get_attribute("title")
            assert title and "step" in title and "target p" in title
            stats = page.locator("#live-stats").inner_text()
            assert "tokens/s" in stats and "speedup" in stats and "ideal speedup" in stats
            assert "GPU" in stats and page.locator("#live-stats a[href='#cost-curve']").count() == 1
            tau = float(page.locator("#live-stats .stat-card .v").first.inner_text())
            assert tau >= 1.0
            if METHOD not in ("ar", "pld"):
                note = page.locator("#drafter-note").inner_text()
                assert "untrained" in note or "trained" in note
            assert page.locator("#chatbot").inner_text().strip()
            page.locator("#cost-curve").get_by_text("cost curve").first.click()  # the accordion opens
            page.locator("#cost-curve-plot .main-svg").first.wait_for(timeout=60_000)
            page.locator("#tree-choice-plot .main-svg").first.wait_for(timeout=60_000)

            # the step-by-step player: the shipped lesson, then the live run
            _open_tab(page, "Step by step")
            story = page.locator("#player-story")
            page.wait_for_function("() => document.querySelector('#player-story').innerText.includes('Cycle 1 of')",
                                   timeout=30_000)
            assert page.locator("#player-tree .main-svg").count() >= 1
            assert "accepted" in page.locator("#player-verdicts").inner_text()
            for n in (2, 3):
                page.locator("#player-next").click()
                page.wait_for_function("(n) => document.querySelector('#player-story').innerText"
                                       ".includes(`Cycle ${n} of`)", arg=n, timeout=30_000)
            page.locator("#player-prev").click()
            page.wait_for_function("() => document.querySelector('#player-story').innerText.includes('Cycle 2 of')",
                                   timeout=30_000)
            assert "Running tau" in story.inner_text() and page.locator("#player-text .tok-now").count() >= 1
            page.locator("#player-lsa .main-svg").first.wait_for(timeout=30_000)  # MoA: the cycle's LSA map
            page.locator("#player-play").click()
            page.wait_for_function("() => /Cycle [4-9]|Cycle [1-9][0-9]/.test("
                                   "document.querySelector('#player-story').innerText)", timeout=30_000)
            page.locator("#player-play").click()  # pause
            _pick_option(page, "player-source", "Your run")
            page.wait_for_function("() => /Cycle 1 of|no verification cycles/.test("
                                   "document.querySelector('#player-story').innerText)", timeout=30_000)
            page.locator("#player-source input").click()  # back to the lesson, for the screenshot
            page.get_by_role("option", name="Lesson:").first.click()
            page.wait_for_function("() => document.querySelector('#player-story').innerText.includes('Cycle 1 of')",
                                   timeout=30_000)

            # every tab at 1,400 px: at most about four screens, screenshots for the README
            for i, tab in enumerate(TABS, start=1):
                _open_tab(page, tab)
                if tab == "Draft tree":
                    page.locator("#tree-plot .main-svg").first.wait_for(timeout=30_000)
                    assert "draft depth" in page.locator("#tree-plot").inner_text()
                if tab == "LSA attention":
                    want = "LSA attention" if METHOD.startswith("moa") else "did not use MoA"
                    page.wait_for_function("(w) => document.querySelector('#lsa-heatmap') && "
                                           "document.querySelector('#lsa-heatmap').innerText.includes(w)",
                                           arg=want, timeout=30_000)
                if tab in ("Client-server", "Draft failures"):  # still their recorded examples
                    _first_look(page, tab)
                if tab == "Benchmarks":
                    page.locator("#bench-headline .main-svg").first.wait_for(timeout=30_000)
                    assert page.locator("#bench-table tr").count() >= 3
                    top = page.locator("#bench-table").bounding_box()["y"]
                    assert top < DESKTOP["height"], "the compact table starts on the first screen"
                    page.wait_for_timeout(1500)
                height = page.evaluate("document.documentElement.scrollHeight")
                assert height <= MAX_SCREENS * DESKTOP["height"], f"{tab} is {height} px tall"
                _save_small(page, DOC_SHOTS / _shot_name(i, tab))
            assert page.locator("text=Traceback").count() == 0

            # every tab at 390 px: no horizontal scroll of the page, figures within the screen
            phone = browser.new_page(viewport=PHONE)
            phone.goto(app_url, wait_until="domcontentloaded")
            phone.locator("#prompt-box textarea").wait_for(timeout=60_000)
            for i, tab in enumerate(TABS, start=1):
                _open_tab(phone, tab)
                width = phone.evaluate("document.documentElement.scrollWidth")
                assert width <= PHONE["width"] + 1, f"{tab} scrolls sideways at 390 px ({width} px wide)"
                too_wide = phone.evaluate(
                    "() => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e.offsetParent)"
                    ".map(e => e.getBoundingClientRect().right).filter(r => r > innerWidth + 1).length")
                assert too_wide == 0, f"{tab}: a figure is wider than the screen"
                phone.screenshot(path=str(SHOTS / "mobile" / _shot_name(i, tab)), full_page=True)
            phone.close()

            _client_server_run(page)
            _open_tab(page, "Generate")

            # a long plain generation, stopped (the tiny model finishes too fast to be caught running)
            if os.environ.get("SPECLENS_TINY", "0") in ("", "0", "false"):
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
