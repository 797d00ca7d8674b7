"""The network between the client (drafter) and the server (target): a small, documented link model.

A message of `nbytes` application bytes sent at time t over a link that is up takes

    one-way delay      rtt / 2 + N(0, jitter), clipped at 0
  + serialisation      (nbytes + packets * PACKET_OVERHEAD) * 8 / bandwidth   (up or down)
  + loss penalty       one retransmission timeout per lost packet

with packets = ceil(nbytes / MSS) and each packet lost independently with probability
`loss`. The retransmission timeout follows RFC 6298 (SRTT + 4 RTTVAR, here rtt + 4 jitter)
with Linux's 200 ms floor (TCP_RTO_MIN): our messages are one or a few packets, so a lost
packet is usually a tail loss that only the timer recovers, not fast retransmit.

Disconnects are intervals [start, end) in seconds (virtual time from the start of the run)
when the link carries nothing. A message sent while the link is down waits for it to come
back; a message whose transfer overlaps the start of a disconnect is lost and sent again,
whole, when the link is back (the session survives the drop: we assume the client sees
its radio come back at once and resends, rather than waiting for TCP's backed-off timer).
Both ends know at once whether the link is up (it is the client's own radio).

Every random draw comes from one `random.Random(seed)`, so a run is deterministic for a
seed as long as the calls happen in the same order.

The presets are assumptions, not measurements: round figures in the range that public
speed-test reports give for each access technology (sources in each docstring line). They
set the scale of the effect, not a claim about any particular network.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

MSS = 1400  # application bytes per packet (1500-byte Ethernet/LTE MTU minus IP/TCP headers and options)
PACKET_OVERHEAD = 52  # IPv4 (20) + TCP with timestamps (32) per packet; counts for timing, not in bytes_up/down
RTO_MIN = 0.2  # seconds: Linux TCP_RTO_MIN


@dataclass(frozen=True)
class NetworkModel:
    """Link parameters. Times in seconds, bandwidths in Mbit/s, loss as a per-packet probability."""

    name: str
    rtt: float  # round-trip time of an empty packet
    jitter: float  # standard deviation of each one-way delay
    up_mbps: float  # client -> server
    down_mbps: float  # server -> client
    loss: float  # per-packet loss probability
    disconnects: tuple[tuple[float, float], ...] = ()
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.rtt < 0 or self.jitter < 0:
            raise ValueError("rtt and jitter must be >= 0")
        if self.up_mbps <= 0 or self.down_mbps <= 0:
            raise ValueError("bandwidths must be > 0 Mbit/s")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")
        for start, end in self.disconnects:
            if not 0 <= start < end:
                raise ValueError(f"a disconnect must satisfy 0 <= start < end, got {start}:{end}")

    def with_disconnects(self, windows: Sequence[tuple[float, float]]) -> NetworkModel:
        """The same link with extra disconnect windows (merged with the preset's own, sorted)."""
        return replace(self, disconnects=merge_windows(list(self.disconnects) + list(windows)))

    @property
    def rto(self) -> float:
        return max(RTO_MIN, self.rtt + 4 * self.jitter)

    def serialisation(self, nbytes: int, up: bool) -> float:
        packets = max(1, math.ceil(nbytes / MSS))
        bits = 8 * (nbytes + packets * PACKET_OVERHEAD)
        return bits / ((self.up_mbps if up else self.down_mbps) * 1e6)

    def to_dict(self) -> dict:
        return {"name": self.name, "rtt_ms": round(1000 * self.rtt, 3), "jitter_ms": round(1000 * self.jitter, 3),
                "up_mbps": self.up_mbps, "down_mbps": self.down_mbps, "loss": self.loss,
                "disconnects": [list(w) for w in self.disconnects], "description": self.description}


def merge_windows(windows: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    out: list[list[float]] = []
    for start, end in sorted((float(a), float(b)) for a, b in windows):
        if not 0 <= start < end:
            raise ValueError(f"a disconnect must satisfy 0 <= start < end, got {start}:{end}")
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((a, b) for a, b in out)


def parse_window(text: str) -> tuple[float, float]:
    """'START:END' in seconds -> (start, end)."""
    try:
        a, b = text.split(":")
        start, end = float(a), float(b)
    except ValueError:
        raise ValueError(f"a disconnect window is START:END in seconds (e.g. 1.5:3.5), got {text!r}") from None
    if not 0 <= start < end:
        raise ValueError(f"a disconnect window needs 0 <= START < END, got {text!r}")
    return start, end


PRESETS: dict[str, NetworkModel] = {
    "5g": NetworkModel(
        "5g", rtt=0.025, jitter=0.005, up_mbps=25.0, down_mbps=150.0, loss=0.001,
        description="5G mid-band (assumed): ~25 ms RTT, 150/25 Mbit/s down/up, 0.1% loss. Round figures in "
                    "the range of published 5G medians (Ookla Speedtest Intelligence and Opensignal 5G "
                    "experience reports, 2022-2024: ~100-200 Mbit/s down, ~15-30 up, ~20-30 ms latency)."),
    "4g": NetworkModel(
        "4g", rtt=0.050, jitter=0.012, up_mbps=8.0, down_mbps=30.0, loss=0.005,
        description="4G LTE (assumed): ~50 ms RTT, 30/8 Mbit/s, 0.5% loss. Round figures in the range of "
                    "published LTE medians (Opensignal/Ookla: ~20-40 Mbit/s down, ~5-10 up, 40-60 ms)."),
    "wifi": NetworkModel(
        "wifi", rtt=0.015, jitter=0.003, up_mbps=40.0, down_mbps=100.0, loss=0.002,
        description="Home Wi-Fi on fixed broadband to a nearby cloud region (assumed): ~15 ms RTT, 100/40 "
                    "Mbit/s, 0.2% loss (FCC Measuring Broadband America: idle latency ~10-30 ms on cable/fibre)."),
    "offline": NetworkModel(
        "offline", rtt=0.050, jitter=0.012, up_mbps=8.0, down_mbps=30.0, loss=0.005, disconnects=((0.5, 10.5),),
        description="The 4G link, gone from 0.5 s to 10.5 s (a tunnel, a lift, flight mode): long enough that "
                    "the whole answer must come from the client alone or wait. Our choice, not a measurement."),
}


def preset(name: str, disconnects: Sequence[tuple[float, float]] = ()) -> NetworkModel:
    if name not in PRESETS:
        raise ValueError(f"unknown network preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name].with_disconnects(disconnects)


@dataclass
class Attempt:
    """One try at sending a message: [start, end), lost if a disconnect cut it."""

    start: float
    end: float
    lost: bool
    retransmits: int = 0  # packet-loss retransmissions inside this try


class Link:
    """The link's state over time and the time each message takes (virtual clock)."""

    def __init__(self, net: NetworkModel, seed: int = 0) -> None:
        self.net = net
        self.rng = random.Random(seed)

    def is_up(self, t: float) -> bool:
        return not any(a <= t < b for a, b in self.net.disconnects)

    def up_at(self, t: float) -> float:
        """The first time >= t when the link is up."""
        for a, b in self.net.disconnects:
            if a <= t < b:
                t = b
        return t

    def next_change(self, t: float) -> float:
        """The next time after t when the link goes down or comes back (inf if never)."""
        times = [x for w in self.net.disconnects for x in w if x > t]
        return min(times) if times else math.inf

    def one_try(self, nbytes: int, up: bool) -> tuple[float, int]:
        """Duration of one transfer on an up link, and the packet retransmissions in it."""
        net = self.net
        delay = max(0.0, net.rtt / 2 + self.rng.gauss(0.0, net.jitter))
        packets = max(1, math.ceil(nbytes / MSS))
        lost = sum(1 for _ in range(packets) if self.rng.random() < net.loss)
        return delay + net.serialisation(nbytes, up) + lost * net.rto, lost

    def transfer(self, t: float, nbytes: int, up: bool) -> list[Attempt]:
        """Send at t; the last attempt's end is the arrival time."""
        attempts = []
        while True:
            t = self.up_at(t)
            duration, lost = self.one_try(nbytes, up)
            end = t + duration
            cut = next((a for a, _ in self.net.disconnects if t < a < end), None)
            if cut is None:
                attempts.append(Attempt(t, end, False, lost))
                return attempts
            attempts.append(Attempt(t, cut, True, lost))
            t = cut
