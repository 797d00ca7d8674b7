"""The real split: the target in a server process, the drafter in this (client) process, HTTP over 127.0.0.1.

    server process   python -m core.client_server serve ...   (stdlib http.server, 127.0.0.1 only)
                       POST /rpc       one protocol message in, one out (application/octet-stream);
                                       header X-Compute-S = the server's compute time
                       GET  /health    {"lsa_hash": ...}: the client checks both hold the same LSA weights
                       POST /shutdown
                     Every request must carry the per-run token (header X-SpecLens-Token) that the
                     client made up and handed to the server through the environment
                     (SPECLENS_LOOPBACK_TOKEN), so other local users' processes cannot drive or stop
                     it (403); a body over MAX_BODY_BYTES is refused (413) without being read.
                     A malformed message or one the session cannot take (a token id outside the
                     vocabulary, a stale position) is answered 400 with a one-line reason; any other
                     failure 500; either way the server stays up.
    client process   the same Client as the simulation (core.client_server.client), with a
                     LoopbackEnv: wall-clock time, messages really sent with urllib.

The network is injected on the client: before a request goes out and after its reply comes
back, the sending thread sleeps for the time the preset's link model gives for that many
bytes (latency, jitter, bandwidth, loss: core.client_server.network). The link can be cut and
restored during the run, by the preset's and --disconnect's windows (seconds from the start of
the run) or by calling `LinkControl.cut()` / `restore()`: while it is cut nothing leaves or
arrives; a transfer the cut interrupts starts over when the link is back, a reply the server
finished meanwhile waits for it. Only loopback addresses are used.

Clean-up: the server is started as a child process and always stopped in a `finally` (shutdown
request, then terminate, then kill). It also exits by itself when its parent dies or after
`--max-lifetime` seconds, so no process outlives a run.
"""

from __future__ import annotations

import hmac
import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from core.drafters.base import Drafter
from core.methods import METHODS as TABLE
from core.target import Target

from .client import Client, RunResult, Trace, client_side
from .network import Link, NetworkModel
from .protocol import Prefill, Verify, decode, describe, encode, token_bytes
from .server import ProtocolError, Server, module_hash
from .sim import finish

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.002
STARTUP_TIMEOUT_S = 180.0
TOKEN_ENV = "SPECLENS_LOOPBACK_TOKEN"
TOKEN_HEADER = "X-SpecLens-Token"
# Largest request body the server reads: a verify message of the largest tree (protocol.MAX_TREE_NODES
# nodes) is well under 1 MiB, so 4 MiB leaves room and still bounds what a caller can make it buffer.
MAX_BODY_BYTES = 4 * 2**20


# ----- the server process ------------------------------------------------------------------------
def serve(target_spec: str, dtype: str, method: str, drafter_spec: str | None, drafter_options: str, port: int,
          parent_pid: int | None, max_lifetime: float, threads: int = 1) -> None:
    """Load the target (and for MoA the drafter's LSA), listen on 127.0.0.1:port, print 'READY <port>'.

    The per-run token comes from the environment (TOKEN_ENV); without one the server does not start.
    """
    import torch

    token = os.environ.get(TOKEN_ENV, "")
    if len(token) < 16:
        raise SystemExit(f"error: the loopback server needs a per-run token of at least 16 characters in "
                         f"${TOKEN_ENV} (ServerProcess sets it)")

    from .models import make_drafter, make_target

    torch.set_num_threads(max(1, threads))
    target = make_target(target_spec, dtype)
    # a server for a method that keeps drafting offline (MoA) runs its LSA, and so serves every method
    offline = TABLE[method].client_server == "offline"
    lsa = make_drafter(method, target, drafter_spec, drafter_options)[0].lsa if offline else None
    server = Server(target, lsa)
    lsa_hash = module_hash(lsa)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: the client keeps the trace
            pass

        def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _refuse(self, code: int, text: str) -> None:
            """Answer an error and close the connection (any unread body is dropped with it)."""
            self.close_connection = True
            self._send(code, text.encode(), "text/plain", {"Connection": "close"})

        def _authorized(self) -> bool:
            given = self.headers.get(TOKEN_HEADER, "")
            if hmac.compare_digest(given.encode(), token.encode()):
                return True
            self._refuse(403, "missing or wrong token")
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/health":
                self._send(200, json.dumps({"lsa_hash": lsa_hash}).encode(), "application/json")
            else:
                self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            if not self._authorized():
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if length < 0:
                self._refuse(400, "bad Content-Length")
                return
            if length > MAX_BODY_BYTES:
                self._refuse(413, f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES}")
                return
            body = self.rfile.read(length)
            if self.path == "/shutdown":
                self._send(200, b"bye", "text/plain")
                threading.Thread(target=httpd.shutdown, daemon=True).start()
                return
            if self.path != "/rpc":
                self._send(404, b"not found", "text/plain")
                return
            try:
                msg = decode(body)
            except Exception as err:  # any malformed body is the caller's error, not a server crash
                self._send(400, f"malformed message: {err}".encode(), "text/plain")
                return
            try:
                with lock:
                    t0 = time.perf_counter()
                    reply = server.handle(msg)
                    dt = time.perf_counter() - t0
                wide = token_bytes(target.vocab_size) == 4
                self._send(200, encode(reply, wide), "application/octet-stream", {"X-Compute-S": f"{dt:.6f}"})
            except (ProtocolError, ValueError) as err:
                self._send(400, str(err).encode(), "text/plain")
            except Exception as err:  # a request no check foresaw: an error reply, and the server stays up
                self._send(500, f"the server could not answer: {type(err).__name__}: {err}".encode(), "text/plain")

    httpd = ThreadingHTTPServer((HOST, port), Handler)
    httpd.daemon_threads = True
    started = time.monotonic()

    def watchdog() -> None:
        while True:
            time.sleep(0.5)
            gone = parent_pid is not None and os.getppid() != parent_pid
            if gone or time.monotonic() - started > max_lifetime:
                os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    print(f"READY {httpd.server_address[1]}", flush=True)
    try:
        httpd.serve_forever(poll_interval=0.1)
    finally:
        httpd.server_close()


class ServerProcess:
    """Start the server as a child process; always stop it (context manager)."""

    def __init__(self, target_spec: str, method: str, dtype: str = "bfloat16", drafter_spec: str | None = None,
                 drafter_options: dict | None = None, max_lifetime: float = 900.0,
                 startup_timeout: float = STARTUP_TIMEOUT_S) -> None:
        self.cmd = [sys.executable, "-m", "core.client_server", "serve", "--target", target_spec, "--dtype", dtype,
                    "--method", method,
                    "--drafter-options", json.dumps(drafter_options or {}), "--port", "0",
                    "--parent-pid", str(os.getpid()), "--max-lifetime", str(max_lifetime)]
        if drafter_spec is not None:
            self.cmd += ["--drafter", drafter_spec]
        self.startup_timeout = startup_timeout
        self.token = secrets.token_urlsafe(32)  # per run; the child reads it from its environment
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.lsa_hash = ""

    def __enter__(self) -> ServerProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "OMP_NUM_THREADS": "1", TOKEN_ENV: self.token}
        self.log = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(self.cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                                         stderr=self.log, stdin=subprocess.DEVNULL, text=True)
            lines: queue.Queue = queue.Queue()

            def read(stream) -> None:
                try:
                    for line in stream:
                        lines.put(line)
                except (ValueError, OSError):  # closed by stop()
                    pass

            threading.Thread(target=read, args=(self.proc.stdout,), daemon=True).start()
            deadline = time.monotonic() + self.startup_timeout
            while True:
                try:
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    line = None
                if line and line.startswith("READY "):
                    self.url = f"http://{HOST}:{int(line.split()[1])}"
                    break
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the loopback server did not start: " + self._log_tail())
            with urllib.request.urlopen(self.request("/health"), timeout=10) as r:
                self.lsa_hash = json.loads(r.read())["lsa_hash"]
        except BaseException:
            self.stop()
            raise
        return self

    def request(self, path: str, data: bytes | None = None, **headers: str) -> urllib.request.Request:
        """A request to this server, carrying the run's token."""
        return authorized_request(self.url + path, self.token, data, headers)

    def _log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:] or "(no output)"

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None and self.url:
                try:
                    urllib.request.urlopen(self.request("/shutdown", b""), timeout=2).read()
                except (urllib.error.URLError, OSError):
                    pass
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
            self.log.close()
            self.proc = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


def authorized_request(url: str, token: str, data: bytes | None = None,
                       headers: dict[str, str] | None = None) -> urllib.request.Request:
    """A GET (data None) or POST request carrying the loopback server's per-run token."""
    return urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                  headers={**(headers or {}), TOKEN_HEADER: token})


# ----- the client's environment ------------------------------------------------------------------
class LinkControl:
    """Whether the link is up: the scheduled windows (seconds from `start`) and manual cuts."""

    def __init__(self, windows: Sequence[tuple[float, float]]) -> None:
        self.windows = list(windows)
        self.start = time.perf_counter()
        self._cut = threading.Event()

    def cut(self) -> None:
        self._cut.set()

    def restore(self) -> None:
        self._cut.clear()

    def is_up(self, t: float | None = None) -> bool:
        t = time.perf_counter() - self.start if t is None else t
        return not self._cut.is_set() and not any(a <= t < b for a, b in self.windows)


class LoopbackPending:
    def __init__(self, request: Prefill | Verify) -> None:
        self.request = request
        self.reply = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.tree = None


class LoopbackEnv:
    """Wall-clock time, the link shim and HTTP to the server process (same interface as sim.VirtualEnv)."""

    mode = "loopback"

    def __init__(self, url: str, net: NetworkModel, method: str, wide: bool = False, seed: int = 0,
                 time_limit: float = 120.0, control: LinkControl | None = None, token: str = "") -> None:
        self.url, self.net, self.method, self.wide, self.token = url, net, method, wide, token
        self.link = Link(net, seed)  # only for the per-message durations (one_try); the schedule is `control`'s
        self.control = control or LinkControl(net.disconnects)
        self.control.windows = list(net.disconnects)
        self.time_limit = time_limit
        self.trace = Trace()
        self.bytes_up = self.bytes_down = self.calls = self.retransmissions = 0
        self._lock = threading.Lock()
        self.control.start = time.perf_counter()
        self.t0 = self.control.start

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def link_up(self) -> bool:
        return self.control.is_up(self.now())

    def time_exceeded(self) -> bool:
        return self.now() > self.time_limit

    def compute(self, kind: str, fn, n: int = 0, passes: int = 0):
        start = self.now()
        out = fn()
        self.trace.span("client", kind, start, self.now())
        return out

    def _carry(self, data: bytes, up: bool, seq: int, kind: str, info: dict) -> None:
        """Hold the thread for the link's transfer time; start over if a cut interrupts it."""
        lane = "uplink" if up else "downlink"
        sent = self.now()
        tries = 0
        while True:
            while not self.link_up():
                if self.time_exceeded():
                    raise TimeoutError("time limit reached while the link was down")
                time.sleep(POLL_S)
            start = self.now()
            with self._lock:
                duration, lost = self.link.one_try(len(data), up)
            end = start + duration
            cut = False
            while self.now() < end:
                if not self.link_up():
                    cut = True
                    break
                time.sleep(min(POLL_S, max(0.0, end - self.now())))
            tries += 1
            with self._lock:
                self.trace.span(lane, kind, start, self.now(), seq=seq, bytes=len(data), lost=cut, retransmits=lost)
                self.retransmissions += lost + (1 if cut else 0)
            if not cut:
                break
        with self._lock:
            self.trace.messages.append({"seq": seq, "kind": kind, "direction": "up" if up else "down",
                                        "bytes": len(data), "sent": round(sent, 6), "arrived": round(self.now(), 6),
                                        "attempts": tries, **info})
            if up:
                self.bytes_up += len(data)
            else:
                self.bytes_down += len(data)

    def _deliver(self, pending: LoopbackPending, data: bytes, kind: str) -> None:
        try:
            seq = pending.request.seq
            self._carry(data, True, seq, kind, describe(pending.request))
            req = authorized_request(self.url + "/rpc", self.token, data,
                                     {"Content-Type": "application/octet-stream"})
            try:
                with urllib.request.urlopen(req, timeout=max(5.0, self.time_limit)) as r:
                    rdata = r.read()
                    compute_s = float(r.headers.get("X-Compute-S", "0"))
            except urllib.error.HTTPError as err:
                raise RuntimeError(f"the server refused the request: {err.read().decode(errors='replace')}") from None
            end = self.now()
            with self._lock:
                self.calls += 1
                self.trace.span("server", kind, max(0.0, end - compute_s), end, seq=seq)
            reply = decode(rdata)
            self._carry(rdata, False, seq, kind + "_reply", describe(reply))
            pending.reply = reply
        except BaseException as err:  # handed to the client thread, which re-raises it
            pending.error = err
        finally:
            pending.done.set()

    def send(self, msg: Prefill | Verify) -> LoopbackPending:
        pending = LoopbackPending(msg)
        kind = "prefill" if isinstance(msg, Prefill) else "verify"
        threading.Thread(target=self._deliver, args=(pending, encode(msg, self.wide), kind), daemon=True).start()
        return pending

    def ready(self, pending: LoopbackPending | None) -> bool:
        if pending is None or not pending.done.is_set():
            return False
        if pending.error is not None:
            if isinstance(pending.error, TimeoutError):
                return False  # the time limit ends the run
            raise pending.error
        return True

    def wait(self, pending: LoopbackPending | None) -> None:
        """Sleep until the reply is in, the link changes state, or the time limit."""
        state = self.link_up()
        while not self.time_exceeded() and self.link_up() == state:
            if pending is not None and pending.done.is_set():
                return
            time.sleep(POLL_S)


def run_loopback(target_spec: str, method: str, prompt_ids: Sequence[int], net: NetworkModel,
                 max_new_tokens: int = 48, seed: int = 0, dtype: str = "bfloat16", drafter_spec: str | None = None,
                 drafter_options: dict | None = None, stop_tokens: set[int] | None = None,
                 time_limit: float = 120.0, target: Target | None = None, drafter: Drafter | None = None,
                 control: LinkControl | None = None, server: ServerProcess | None = None,
                 on_start: Callable[[LoopbackEnv], None] | None = None, offline_horizon: int | None = None,
                 offline_min_confidence: float | None = None) -> RunResult:
    """One generation split over two processes (see the module docstring).

    target / drafter: this process's copies (built from the specs when None; they must match the
    server's). control: a LinkControl to cut/restore the link from another thread. server: a
    running ServerProcess to reuse (started with method "moa" it serves every method); when
    None, one is started for this run and stopped at its end. on_start: called with the env just
    before the client starts (e.g. to watch `env.trace.progress` and cut the link after the first token).
    offline_horizon / offline_min_confidence: where MoA stops drafting offline (as in sim.simulate).
    """
    from .models import make_drafter, make_target

    target = target or make_target(target_spec, dtype)
    note = ""
    if drafter is None and method != "ar":
        drafter, note = make_drafter(method, target, drafter_spec, drafter_options)
    tli = int(getattr(getattr(drafter, "config", None), "tli", 0) or 0) if method == "moa" else 0
    own = server is None
    proc = server or ServerProcess(target_spec, method, dtype, drafter_spec, drafter_options,
                                   max_lifetime=time_limit + STARTUP_TIMEOUT_S)
    try:
        if own:
            proc.__enter__()
        with client_side(method, drafter, target) as (client_drafter, lsa):
            if lsa is not None and module_hash(lsa) != proc.lsa_hash:
                raise RuntimeError("the server's MoA LSA weights differ from this process's drafter (or it has "
                                   "none: start it with method moa); give both the same --drafter")
            env = LoopbackEnv(proc.url, net, method, token_bytes(target.vocab_size) == 4, seed, time_limit,
                              control, token=proc.token)
            client = Client(method, client_drafter, target, env, list(prompt_ids), max_new_tokens, stop_tokens,
                            tli, offline_horizon, offline_min_confidence)
            if on_start is not None:
                on_start(env)
            out = client.run()
    finally:
        if own:
            proc.stop()
    return finish(out, env, method, net, list(prompt_ids), target, note)
