"""Client-server decoding: the target on a server, the drafter on a client (docs/ARCHITECTURE.md, "Client-server").

    network.py   the link model (latency, jitter, bandwidth, loss, disconnects) and presets 5g, 4g, wifi, offline
    protocol.py  the binary messages and their sizes (token ids, MoA's LSA vectors, EAGLE-2's features)
    server.py    the target side: prefill, verification, KV cache (the decode loop's second half)
    client.py    the drafter side: the protocol loop, MoA's offline drafting and the reconciliation
    sim.py       one-process runs on a virtual clock (real compute, simulated network)
    loopback.py  the real split: a server process and a client process over 127.0.0.1 (HTTP)
    models.py    building the same target and drafter in both processes (specs: tiny, smollm2, folder, random)
    figures.py   timeline and tokens-over-time figures from a run's trace
    __main__.py  the CLI: python -m core.client_server --method moa --preset 4g --disconnect 1:3 --prompt ...

The MoA paper's claim reproduced here: when the link drops, MoA's drafter keeps writing on
its own (provisional text); plain decoding over an API and EAGLE-2 stall. On reconnect the
server verifies the provisional text, so the final output is always the target's greedy text.
"""

from .client import Client, RunResult
from .network import PRESETS, NetworkModel, preset
from .server import Server
from .sim import CostModel, simulate

__all__ = ["PRESETS", "Client", "CostModel", "NetworkModel", "RunResult", "Server", "preset", "simulate"]
