"""Client-server runs on a virtual clock: real compute, simulated network, one process.

The client (core.client_server.client) and the server (core.client_server.server) are the
real objects with the real target and drafter; every message really is encoded to bytes and
decoded on the other side. Only time is simulated: a `VirtualEnv` advances a clock by

  * compute: each piece of client or server compute takes either its measured wall time
    (timing="measured": time.perf_counter around the real call, i.e. the actual decode's own
    draft and verify times) or the time a `CostModel` gives (timing=CostModel(...): fixed
    costs, so a run is exactly reproducible);
  * network: each message takes the time the link model gives (core.client_server.network),
    including jitter, packet loss and disconnects, all drawn from one seeded generator.

The server is a single worker: a request that arrives while it is busy waits. Because the
client keeps at most one request in flight, the server's reply to a request can be computed
the moment the request is sent (its virtual times lie in the client's future); the client
then runs ahead (offline drafting) or jumps its clock to the reply's arrival.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core.drafters.base import Drafter
from core.target import Target

from .client import Client, RunResult, Trace, client_side
from .network import Link, NetworkModel
from .protocol import Prefill, Reply, Verify, decode, describe, encode, token_bytes
from .server import Server

DEFAULT_TIME_LIMIT = 600.0  # virtual seconds: a run that is still going then stops with stop_reason "time_limit"


@dataclass(frozen=True)
class CostModel:
    """Fixed compute costs in seconds (deterministic runs and tests).

    Defaults follow the bfloat16 CPU table of docs/ARCHITECTURE.md, "Target runtime" for SmolLM2-135M (one pass:
    50 ms for 1 new token, 62 ms for 32, 81 ms for 64, so about 49 ms + 0.5 ms a token) and a
    few milliseconds per drafter level; `from_events` fits them to a real decode instead.
    """

    pass_base_s: float = 0.049  # target forward pass (prefill or verify): base + per token
    pass_per_token_s: float = 0.0005
    draft_level_s: float = 0.006  # one drafter level (a dynamic tree of depth D costs D levels)
    absorb_base_s: float = 0.004  # drafter state update after a verification
    absorb_per_token_s: float = 0.0002

    def cost(self, lane: str, kind: str, method: str, n: int = 0, passes: int = 0) -> float:
        if lane == "server":
            return self.pass_base_s + self.pass_per_token_s * n
        if method == "ar":
            return 0.0
        if kind == "draft":
            return self.draft_level_s * passes
        if kind == "offline":  # a chain of `passes` levels, then re-running it into the drafter's cache
            return self.draft_level_s * (passes + 1)
        return self.absorb_base_s + self.absorb_per_token_s * n

    @staticmethod
    def from_events(events: Sequence[Any], depth: int) -> CostModel:
        """Fit to StepEvents of a real single-process decode (core.decoding): verify time against
        tokens in the pass (least squares), drafting time per cycle split into `depth` levels."""
        xs = [1 + len(e.tree) for e in events[1:]]
        ys = [e.verify_time for e in events[1:]]
        base, slope = CostModel.pass_base_s, CostModel.pass_per_token_s
        if len(set(xs)) > 1:
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs))
            base = max(0.0, my - slope * mx)
        elif ys:  # one tree size only: no slope to fit
            base, slope = sum(ys) / len(ys), 0.0
        draft = sorted(e.draft_time for e in events[1:]) or [0.0]
        level = draft[len(draft) // 2] / max(1, depth + 1)  # + 1: the state update, about one level's work
        return CostModel(base, slope, level, level, 0.0)


class Pending:
    """A request in flight: its reply and when that reply reaches the client."""

    def __init__(self, request: Prefill | Verify, reply: Reply, ready_time: float) -> None:
        self.request, self.reply, self.ready_time = request, reply, ready_time
        self.tree = None


class VirtualEnv:
    """Virtual clock + link model + an in-process server (see the module docstring)."""

    mode = "virtual"

    def __init__(self, server: Server, net: NetworkModel, method: str, wide: bool = False, seed: int = 0,
                 timing: str | CostModel = "measured", time_limit: float = DEFAULT_TIME_LIMIT) -> None:
        if not (timing == "measured" or isinstance(timing, CostModel)):
            raise ValueError("timing is 'measured' or a CostModel")
        self.server, self.net, self.method, self.wide = server, net, method, wide
        self.link = Link(net, seed)
        self.timing = timing
        self.time_limit = time_limit
        self.t = 0.0
        self.server_free = 0.0
        self.trace = Trace()
        self.bytes_up = self.bytes_down = self.calls = self.retransmissions = 0

    def now(self) -> float:
        return self.t

    def link_up(self) -> bool:
        return self.link.is_up(self.t)

    def time_exceeded(self) -> bool:
        return self.t > self.time_limit

    def _timed(self, fn: Callable[[], Any], lane: str, kind: str, n: int, passes: int) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        if isinstance(self.timing, CostModel):
            dt = self.timing.cost(lane, kind, self.method, n, passes)
        return out, dt

    def compute(self, kind: str, fn: Callable[[], Any], n: int = 0, passes: int = 0) -> Any:
        """Client-side compute: run it, advance the clock, record the span."""
        out, dt = self._timed(fn, "client", kind, n, passes)
        self.trace.span("client", kind, self.t, self.t + dt)
        self.t += dt
        return out

    def _transfer(self, data: bytes, t: float, up: bool, seq: int, kind: str, info: dict) -> float:
        attempts = self.link.transfer(t, len(data), up)
        lane = "uplink" if up else "downlink"
        for a in attempts:
            self.trace.span(lane, kind, a.start, a.end, seq=seq, bytes=len(data), lost=a.lost,
                            retransmits=a.retransmits)
            self.retransmissions += a.retransmits + (1 if a.lost else 0)
        self.trace.messages.append({"seq": seq, "kind": kind, "direction": "up" if up else "down",
                                    "bytes": len(data), "sent": round(t, 6), "arrived": round(attempts[-1].end, 6),
                                    "attempts": len(attempts), **info})
        if up:
            self.bytes_up += len(data)
        else:
            self.bytes_down += len(data)
        return attempts[-1].end

    def send(self, msg: Prefill | Verify) -> Pending:
        data = encode(msg, self.wide)
        kind = "prefill" if isinstance(msg, Prefill) else "verify"
        arrive = self._transfer(data, self.t, True, msg.seq, kind, describe(msg))
        self.calls += 1
        start = max(arrive, self.server_free)
        request = decode(data)
        n = len(request.prompt) if isinstance(request, Prefill) else 1 + len(request.tokens)
        reply, dt = self._timed(lambda: self.server.handle(request), "server", kind, n, 0)
        self.server_free = start + dt
        self.trace.span("server", kind, start, start + dt, seq=msg.seq, tokens=n,
                        accepted=len(reply.accepted))
        rdata = encode(reply, self.wide)
        ready = self._transfer(rdata, start + dt, False, msg.seq, kind + "_reply", describe(reply))
        return Pending(request, decode(rdata), ready)

    def ready(self, pending: Pending | None) -> bool:
        return pending is not None and pending.ready_time <= self.t

    def wait(self, pending: Pending | None) -> None:
        """Jump to the reply's arrival or the next change of the link, whichever is first."""
        nxt = min(pending.ready_time if pending is not None else math.inf, self.link.next_change(self.t))
        if nxt == math.inf:  # the link never comes back and nothing is in flight
            self.t = self.time_limit + 1.0
            return
        self.t = max(self.t, nxt)


def finish(result: dict, env, method: str, net: NetworkModel, prompt_ids: list[int], target: Target,
           note: str = "") -> RunResult:
    """Assemble a RunResult from the client's outcome and the env's accounting.

    virtual_time_s is when the last token came, or when the run ended if none came. A run stopped by its time
    limit reports at most the limit: a wait for a link that stays down jumps the clock to the link's return
    (or past the limit), which is not time the run took."""
    ids = result["token_ids"]
    last = max((i["t"] for i in result["token_info"]), default=env.now())
    if result["stop_reason"] == "time_limit":
        last = min(last, env.time_limit)
    text = target.decode(ids) if target.tokenizer is not None else " ".join(f"t{i}" for i in ids)
    return RunResult(
        method=method, mode=env.mode, network=net.to_dict(), prompt_ids=list(prompt_ids), token_ids=ids,
        token_info=result["token_info"], offline_tokens=result["offline_tokens"],
        corrected_tokens=result["corrected_tokens"], confirmed_tokens=result["confirmed_tokens"],
        virtual_time_s=last, server_calls=env.calls, retransmissions=env.retransmissions,
        bytes_up=env.bytes_up, bytes_down=env.bytes_down, stop_reason=result["stop_reason"],
        target_passes=result["target_passes"], trace=env.trace, text=text, note=note,
        unverified=result["unverified"], offline_horizon=result.get("offline_horizon", 0),
        offline_min_confidence=result.get("offline_min_confidence", 0.0), offline_stops=result.get("offline_stops", []))


def simulate(target: Target, method: str, drafter: Drafter | None, prompt_ids: Sequence[int], net: NetworkModel,
             max_new_tokens: int = 48, seed: int = 0, timing: str | CostModel = "measured",
             stop_tokens: set[int] | None = None, time_limit: float = DEFAULT_TIME_LIMIT, tli: int | None = None,
             note: str = "", offline_horizon: int | None = None,
             offline_min_confidence: float | None = None) -> RunResult:
    """One client-server generation on the virtual clock (see the module docstring).

    drafter: the method's drafter (None for "ar"); for MoA its LSA module serves on the server
    for the duration of the run. tli: MoA's TLI N (read from the drafter's config by default).
    offline_horizon: MoA's offline drafting limit in tokens (default: the trained one; client.offline_horizon_for).
    offline_min_confidence: MoA stops drafting offline where its confidence in the chain falls below it
    (default client.OFFLINE_MIN_CONFIDENCE; 0 = only the horizon stops it).
    """
    if tli is None:
        tli = int(getattr(getattr(drafter, "config", None), "tli", 0) or 0) if method == "moa" else 0
    with client_side(method, drafter, target) as (client_drafter, lsa):
        server = Server(target, lsa)
        env = VirtualEnv(server, net, method, token_bytes(target.vocab_size) == 4, seed, timing, time_limit)
        client = Client(method, client_drafter, target, env, list(prompt_ids), max_new_tokens, stop_tokens, tli,
                        offline_horizon, offline_min_confidence)
        out = client.run()
    return finish(out, env, method, net, list(prompt_ids), target, note)
