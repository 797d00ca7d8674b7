"""The `/generate` API through gradio_client on the tiny model: answers, error messages, two concurrent clients.

The same API on the real target is tested in tests/test_browser.py, which shares its server
(`python app.py` in a subprocess) with the browser test so that the target loads once.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")

KEYS = {"text", "token_ids", "mean_accepted", "tokens_per_s", "new_tokens", "steps", "accept_lengths"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(runtime):
    import app

    demo = app.build_app(runtime)
    port = _free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **app.launch_kwargs())
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def tiny_app():
    from demo.runtime import Runtime

    demo, url = _serve(Runtime(tiny=True, reference_tokens=4))
    try:
        yield url
    finally:
        demo.close()


def test_generate_endpoint_returns_a_json_object(tiny_app):
    from gradio_client import Client

    client = Client(tiny_app, verbose=False)
    out = client.predict("hello there", "pld", 10, api_name="/generate")
    assert isinstance(out, dict) and KEYS <= set(out)
    assert 1 <= len(out["token_ids"]) <= 10 and out["new_tokens"] == len(out["token_ids"])
    assert out["mean_accepted"] >= 1.0 and out["tokens_per_s"] > 0
    assert out["text"] == " ".join(f"t{t}" for t in out["token_ids"])  # the tiny model's stand-in tokenizer
    info = client.view_api(return_format="dict", print_info=False)
    params = [p["parameter_name"] for p in info["named_endpoints"]["/generate"]["parameters"]]
    assert params == ["prompt", "method", "max_new_tokens"]


def test_generate_endpoint_explains_bad_requests(tiny_app):
    from gradio_client import Client

    client = Client(tiny_app, verbose=False)
    for args, msg in [(("hi", "nope", 8), "Unknown method"), (("hi", "ar", 100000), "between 1 and"),
                      (("   ", "ar", 8), "empty"), ((123, "ar", 8), "must be text")]:
        with pytest.raises(Exception, match=msg) as info:
            client.predict(*args, api_name="/generate")
        assert "Traceback" not in str(info.value)


def test_two_concurrent_clients(tiny_app):
    from gradio_client import Client

    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def call(i: int, method: str) -> None:
        try:
            results[i] = Client(tiny_app, verbose=False).predict("same prompt", method, 12, api_name="/generate")
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=call, args=(i, m)) for i, m in enumerate(["ar", "pld"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert set(results) == {0, 1}
    # greedy decoding is lossless: both methods write the same tokens, even when served side by side
    assert results[0]["token_ids"] == results[1]["token_ids"]
    assert results[0]["mean_accepted"] == 1.0
