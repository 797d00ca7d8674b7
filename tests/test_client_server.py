"""Client-server speculative decoding: lossless under every network and drop, MoA's offline text, bytes, loopback."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from contextlib import redirect_stdout

import pytest
import torch

from core.client_server import CostModel, preset, simulate
from core.client_server.client import Client, Trace
from core.client_server.figures import timeline_figure, tokens_figure
from core.client_server.loopback import LinkControl, ServerProcess, run_loopback
from core.client_server.models import make_drafter, make_target
from core.client_server.network import MSS, Link, NetworkModel, parse_window
from core.client_server.protocol import (
    PREFILL,
    PREFILL_REPLY,
    VERIFY,
    VERIFY_REPLY,
    Prefill,
    Reply,
    Verify,
    decode,
    encode,
    expected_size,
    row_width,
)
from core.decoding import generate
from core.drafters.base import Autoregressive
from core.drafters.eagle2 import Eagle2Drafter
from core.drafters.moa import MoADrafter
from tests.helpers import tiny_prompts
from tests.test_eagle2 import quick_train, self_distill_batch

VOCAB = 64
TREE = {"depth": 4, "top_k": 4, "total_tokens": 12}
MOA_SMALL = {"lsa_dim": 16, "lsa_heads": 2, **TREE}
COST = CostModel()
MAX_NEW = 24


@pytest.fixture(scope="module")
def tiny():
    return make_target("tiny")  # tiny_target(vocab 64, 4 layers)


@pytest.fixture(scope="module")
def prompts():
    return tiny_prompts(VOCAB, n=2, length=8, seed=1)


@pytest.fixture(scope="module")
def drafters(tiny, prompts):
    """method -> drafter: trained (overfitted on the target's answers, so drafts get accepted) and random."""
    moa = MoADrafter.random(tiny, seed=0, **MOA_SMALL)
    quick_train(moa, self_distill_batch(tiny, moa.train_needs, prompts), steps=30)
    eagle = Eagle2Drafter.random(tiny, seed=0, **TREE)
    quick_train(eagle, self_distill_batch(tiny, eagle.train_needs, prompts), steps=30)
    final = MoADrafter.random(tiny, seed=5, final_feature=True, **MOA_SMALL)  # the server sends LSA + feature
    with torch.no_grad():
        final.lsa.feat.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))
    return {"ar": None, "eagle2": eagle, "moa": moa, "moa-random": MoADrafter.random(tiny, seed=3, **MOA_SMALL),
            "eagle2-random": Eagle2Drafter.random(tiny, seed=3, **TREE),
            "moa-tli1": MoADrafter.random(tiny, seed=4, tli=1, **MOA_SMALL), "moa-final": final}


def greedy(target, prompt, n=MAX_NEW, stop=None):
    return generate(target, Autoregressive(), prompt, n, stop_tokens=stop).token_ids


def method_of(name: str) -> str:
    return name.split("-")[0]


# ----- lossless everywhere -----------------------------------------------------------------------
SCHEDULES = [(), ((0.2, 1.2),), ((0.1, 0.35), (0.6, 2.0))]


@pytest.mark.parametrize("net_name", ["5g", "4g", "wifi", "offline"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=["none", "one-drop", "two-drops"])
def test_final_output_is_greedy(tiny, prompts, drafters, net_name, schedule):
    net = preset(net_name, schedule)
    for i, prompt in enumerate(prompts):
        stop = set() if i == 0 else None  # the second prompt also exercises end-of-turn stops
        ref = greedy(tiny, prompt, stop=stop)
        for name, d in drafters.items():
            run = simulate(tiny, method_of(name), d, prompt, net, MAX_NEW, seed=i, timing=COST, stop_tokens=stop)
            assert run.token_ids == ref, f"{name} over {net_name} {schedule}: {run.token_ids} != {ref}"
            assert run.stop_reason in ("eos", "max_new_tokens")
            assert len(run.token_info) == len(ref)


def test_drop_in_the_middle_of_a_verification(tiny, prompts, drafters):
    prompt = prompts[0]
    ref = greedy(tiny, prompt, stop=set())
    for name in ("ar", "eagle2", "moa"):
        base = simulate(tiny, name, drafters[name], prompt, preset("5g"), MAX_NEW, timing=COST, stop_tokens=set())
        verify = [s for s in base.trace.spans if s["lane"] == "server" and s["kind"] == "verify"][2]
        mid = (verify["start"] + verify["end"]) / 2
        run = simulate(tiny, name, drafters[name], prompt, preset("5g", [(mid, mid + 1.0)]), MAX_NEW, timing=COST,
                       stop_tokens=set())
        assert run.token_ids == ref
        hit = [s for s in run.trace.spans if s["lane"] == "server" and s["start"] < mid < s["end"]]
        assert len(hit) == 1, "the drop should start while the server verifies"
        down = [s for s in run.trace.spans if s["lane"] == "downlink" and s["seq"] == hit[0]["seq"]]
        assert min(s["start"] for s in down) >= mid + 1.0 - 1e-5, "the verdict can only leave once the link is back"
        assert run.virtual_time_s > base.virtual_time_s


# ----- who writes while the link is down ---------------------------------------------------------
def test_only_moa_writes_offline(tiny, prompts, drafters):
    prompt = prompts[0]
    net = preset("4g", [(0.3, 2.3)])
    runs = {n: simulate(tiny, method_of(n), d, prompt, net, MAX_NEW, timing=COST, stop_tokens=set(),
                        offline_min_confidence=0.0)  # the random drafter is never sure: write anyway
            for n, d in drafters.items()}
    for name, run in runs.items():
        offline_spans = [s for s in run.trace.spans if s["kind"] == "offline"]
        if method_of(name) == "moa":
            assert run.offline_tokens > 0 and offline_spans
            assert all(0.3 <= s["start"] < 2.3 for s in offline_spans), "offline drafting only while the link is down"
            assert any(p["shown"] > p["verified"] for p in run.trace.progress)
            assert run.offline_tokens == run.confirmed_tokens + run.corrected_tokens
        else:
            assert run.offline_tokens == 0 and not offline_spans and run.corrected_tokens == 0
            assert all(p["shown"] == p["verified"] for p in run.trace.progress)
    # the trained MoA drafter's offline text is right: it is confirmed, and MoA finishes first
    assert runs["moa"].confirmed_tokens > 0
    assert runs["moa"].virtual_time_s < runs["eagle2"].virtual_time_s < runs["ar"].virtual_time_s
    assert runs["moa"].server_calls < runs["eagle2"].server_calls
    # a random MoA drafter guesses wrong: its provisional tokens are corrected, the output is still greedy
    assert runs["moa-random"].corrected_tokens > 0
    statuses = {i["status"] for i in runs["moa-random"].token_info}
    assert "corrected" in statuses


class _FakeEnv:
    def __init__(self) -> None:
        self.trace = Trace()

    def now(self) -> float:
        return 1.0


def test_reconciliation_keeps_the_agreeing_prefix(tiny):
    client = Client("moa", None, tiny, _FakeEnv(), [5, 6, 7], max_new_tokens=50, stop_tokens=set())
    client.provisional = [10, 11, 12, 13]
    assert not client._commit([10, 11, 20], seq=3)  # two agree, the third is corrected, one more withdrawn
    assert client.verified == [10, 11, 20] and client.provisional == []
    assert (client.confirmed, client.corrected) == (2, 2)
    assert [i["status"] for i in client.info] == ["confirmed", "confirmed", "corrected"]
    assert client.info[2]["withdrawn"] == [12, 13]
    client.provisional = [30, 31, 32]
    client._commit([30], seq=4)  # all agree; the rest stays provisional (sent as a chain next)
    assert client.provisional == [31, 32] and client.confirmed == 3
    client._commit([31, 32, 33], seq=5)  # all confirmed, plus the target's next token
    assert client.provisional == [] and client.confirmed == 5 and client.info[-1]["status"] == "verified"


# ----- messages and bytes ------------------------------------------------------------------------
def test_messages_round_trip_with_exact_sizes():
    rows = torch.randn(3, 576)
    msgs = [Prefill("moa", [1, 2, 40000], tli=1, seq=1), Verify(2, 17, [5, 6, 7], [-1, 0, 0]),
            Verify(3, 20, [8, 9], None), Reply(VERIFY_REPLY, 2, 17, [0, 2], 99, rows),
            Reply(VERIFY_REPLY, 3, 20, [0, 1], 9, rows, chain=True), Reply(PREFILL_REPLY, 1, 0, [], 4, None)]
    for wide in (False, True):
        tok = 4 if wide else 2
        sizes = [expected_size(PREFILL, 3, tok), expected_size(VERIFY, 3, tok),
                 expected_size(VERIFY, 2, tok, chain=True), expected_size(VERIFY_REPLY, 2, tok, 3, 576),
                 expected_size(VERIFY_REPLY, 2, tok, 3, 576, chain=True),
                 expected_size(PREFILL_REPLY, 0, tok)]
        for msg, size in zip(msgs, sizes):
            data = encode(msg, wide)
            assert len(data) == size
            back = decode(data)
            assert type(back) is type(msg)
            if isinstance(msg, Reply):
                assert (back.accepted, back.bonus) == (msg.accepted, msg.bonus)
                if msg.rows is not None:
                    assert torch.equal(back.rows, msg.rows.to(torch.bfloat16))
            elif isinstance(msg, Verify):
                assert (back.tokens, back.parents, back.position) == (msg.tokens, msg.parents, msg.position)
            else:
                assert (back.prompt, back.method, back.tli) == (msg.prompt, msg.method, msg.tli)
    # SmolLM2: 2-byte token ids, and one bfloat16 row of 576 values (1,152 bytes) per verified token
    assert row_width("moa", 576, 384) * 2 == 1152 and row_width("eagle2", 576, 384) * 2 == 1152
    assert row_width("moa", 576, 384, tli=1) * 2 == 1152 + 768 and row_width("ar", 576, 384) == 0
    assert row_width("moa", 576, 384, lsa_width=1152) * 2 == 2304  # final_feature: the projected feature too
    assert len(encode(Reply(VERIFY_REPLY, 1, 0, [0, 1, 2], 7, torch.zeros(4, 576)))) == 12 + 4 + 6 + 2 + 6 + 4 * 1152


@pytest.mark.parametrize("name", ["ar", "eagle2", "moa", "moa-tli1", "moa-final"])
def test_byte_counts_match_message_sizes(tiny, prompts, drafters, name):
    prompt = prompts[0]
    method = method_of(name)
    run = simulate(tiny, method, drafters[name], prompt, preset("4g", [(0.3, 1.0)]), MAX_NEW, timing=COST,
                   stop_tokens=set())
    tli = 1 if name == "moa-tli1" else 0
    lsa_width = 2 * tiny.hidden_size if name == "moa-final" else None
    width = row_width(method, tiny.hidden_size, 2 * tiny.kv_heads * tiny.head_dim, tli, lsa_width)
    # tiny: H = 32, K+V = 32 a layer
    assert width == {"ar": 0, "eagle2": 32, "moa": 32, "moa-tli1": 64, "moa-final": 64}[name]
    up = down = 0
    for m in run.trace.messages:
        if m["kind"] == "prefill":
            assert m["bytes"] == expected_size(PREFILL, len(prompt)) and m["tokens"] == len(prompt)
        elif m["kind"] == "verify":
            assert m["bytes"] == expected_size(VERIFY, m["nodes"], chain=m["chain"])
        else:
            rows = len(prompt) if m["kind"] == "prefill_reply" else m["accepted"] + 1
            assert m["rows"] == (rows if width else 0) and m["width"] == width
            assert m["bytes"] == expected_size(VERIFY_REPLY, m["accepted"], rows=m["rows"], width=width,
                                               chain=m["chain"])
        up += m["bytes"] if m["direction"] == "up" else 0
        down += m["bytes"] if m["direction"] == "down" else 0
    assert (run.bytes_up, run.bytes_down) == (up, down)
    assert run.server_calls == len([m for m in run.trace.messages if m["direction"] == "up"])
    if name == "ar":  # one round trip per token, no payload: each reply is a bare 24-byte verdict
        assert run.server_calls == 1 + (MAX_NEW - 1)
        assert all(m["bytes"] == 16 for m in run.trace.messages if m["kind"] == "verify")


# ----- the network model ---------------------------------------------------------------------------
def test_link_model():
    net = NetworkModel("t", rtt=0.04, jitter=0.0, up_mbps=8.0, down_mbps=80.0, loss=0.0, disconnects=((1.0, 2.0),))
    link = Link(net)
    (a,) = link.transfer(0.0, 10_000, up=True)
    assert a.end == pytest.approx(0.02 + 8 * (10_000 + 8 * 52) / 8e6)  # half the RTT + serialisation (8 packets)
    (b,) = link.transfer(0.0, 10_000, up=False)
    assert b.end < a.end  # the downlink is faster
    tries = link.transfer(0.99, 100, up=True)  # cut by the drop: sent again when the link is back
    assert [t.lost for t in tries] == [True, False] and tries[1].start == 2.0
    assert link.transfer(1.5, 100, up=True)[0].start == 2.0  # sent while down: waits
    assert not link.is_up(1.5) and link.next_change(0.5) == 1.0 and link.next_change(1.5) == 2.0
    lossy = Link(NetworkModel("l", 0.04, 0.0, 8.0, 80.0, loss=0.5), seed=1)
    slow = [lossy.transfer(0.0, 20 * MSS, True)[0] for _ in range(5)]
    assert all(t.retransmits > 0 for t in slow) and min(t.end for t in slow) > 0.2  # at least one RTO each
    assert parse_window("1.5:3") == (1.5, 3.0)
    with pytest.raises(ValueError):
        parse_window("3:1")
    with pytest.raises(ValueError):
        preset("3g")


def test_deterministic_for_a_seed(tiny, prompts, drafters):
    net = preset("4g", [(0.3, 1.0)])
    runs = [simulate(tiny, "moa", drafters["moa"], prompts[0], net, MAX_NEW, seed=s, timing=COST, stop_tokens=set())
            for s in (7, 7, 8)]
    assert runs[0].to_dict() == runs[1].to_dict()
    assert runs[0].trace.spans != runs[2].trace.spans  # jitter differs
    assert runs[0].token_ids == runs[2].token_ids


def test_measured_timing_and_figures(tiny, prompts, drafters):
    runs = [simulate(tiny, m, drafters[m], prompts[0], preset("5g", [(0.05, 0.3)]), 12, stop_tokens=set())
            for m in ("ar", "eagle2", "moa")]
    for run in runs:
        assert run.token_ids == greedy(tiny, prompts[0], 12, set())
        assert all(s["end"] >= s["start"] for s in run.trace.spans)
        fig = timeline_figure(run)
        lanes = {y for tr in fig.data for y in tr.y}
        assert {"client", "uplink", "server", "downlink"} <= lanes or run.method == "ar"
        assert any(sh.type == "rect" for sh in fig.layout.shapes)  # the disconnect window
        json.dumps(run.to_dict())
    fig = tokens_figure(runs)
    assert len(fig.data) >= 3


def test_cost_model_from_events(tiny, prompts, drafters):
    res = generate(tiny, drafters["eagle2"], prompts[0], 12, stop_tokens=set())
    cm = CostModel.from_events(res.events, TREE["depth"])
    assert cm.pass_base_s >= 0 and cm.pass_per_token_s >= 0 and cm.draft_level_s > 0


def test_cli_json(capsys):
    from core.client_server.__main__ import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["--method", "moa", "--preset", "4g", "--disconnect", "0.3:1.3", "--prompt", "hello",
                   "--target", "tiny", "--max-new-tokens", "12", "--timing", "model", "--check", "--json",
                   "--drafter", "random", "--drafter-options", json.dumps(MOA_SMALL),
                   "--offline-min-confidence", "0"])
    assert rc == 0
    out = json.loads(buf.getvalue())
    for key in ("token_ids", "offline_tokens", "corrected_tokens", "virtual_time_s", "server_calls", "bytes_up",
                "bytes_down"):
        assert key in out
    assert out["matches_greedy"] and out["offline_tokens"] > 0 and len(out["token_ids"]) <= 12


# ----- the real split over loopback ----------------------------------------------------------------
def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_loopback_split(tiny, prompts):
    prompt = prompts[0]
    n = 16
    ref = greedy(tiny, prompt, n, set())
    opts = dict(MOA_SMALL)
    cut_s = 0.6

    def cut_after_first_token(env):  # cut the link by hand once the first token is in, restore it later
        def run():
            while not env.trace.progress:
                time.sleep(0.002)
            env.control.cut()
            time.sleep(cut_s)
            env.control.restore()

        threading.Thread(target=run, daemon=True).start()

    with ServerProcess("tiny", "moa", "float32", "random", opts, max_lifetime=120) as server:
        pid = server.pid
        runs = {}
        for method in ("ar", "eagle2", "moa"):
            drafter, _ = make_drafter(method, tiny, "random", opts)
            net = preset("5g", [(0.05, 0.3)] if method == "ar" else [])  # ar: a scheduled drop instead
            runs[method] = run_loopback("tiny", method, prompt, net, n, dtype="float32", drafter_spec="random",
                                        drafter_options=opts, stop_tokens=set(), time_limit=60, target=tiny,
                                        drafter=drafter if method != "ar" else None, server=server,
                                        control=LinkControl(()), offline_min_confidence=0.0,
                                        on_start=None if method == "ar" else cut_after_first_token)
    assert _gone(pid), "the server process must be gone"
    for method, run in runs.items():
        assert run.mode == "loopback" and run.token_ids == ref, method
        assert run.bytes_up == sum(m["bytes"] for m in run.trace.messages if m["direction"] == "up")
        assert run.bytes_down == sum(m["bytes"] for m in run.trace.messages if m["direction"] == "down")
        for m in run.trace.messages:
            if m["kind"] == "verify":
                assert m["bytes"] == expected_size(VERIFY, m["nodes"], chain=m["chain"])
    assert runs["moa"].offline_tokens > 0
    assert runs["ar"].offline_tokens == 0 and runs["eagle2"].offline_tokens == 0
    assert runs["eagle2"].virtual_time_s > cut_s and runs["ar"].virtual_time_s > 0.3  # they stalled


def test_loopback_cleans_up_after_a_failure(tiny, prompts):
    pids = []
    with pytest.raises(RuntimeError, match="LSA"):
        _failing_run(tiny, prompts[0], pids)
    assert pids and _gone(pids[0])


def _failing_run(tiny, prompt, pids):
    """A client whose drafter differs from the server's: the LSA check fails; the child must still go."""
    real_init = ServerProcess.__enter__

    def spy(self):
        out = real_init(self)
        pids.append(self.pid)
        return out

    ServerProcess.__enter__ = spy
    try:
        run_loopback("tiny", "moa", prompt, preset("5g"), 4, dtype="float32", drafter_spec="random",
                     drafter_options={**MOA_SMALL, "lsa_mlp_ratio": 2}, target=tiny,
                     drafter=MoADrafter.random(tiny, seed=0, **MOA_SMALL), time_limit=30)
    finally:
        ServerProcess.__enter__ = real_init


# ----- the real target ----------------------------------------------------------------------------
@pytest.mark.real
def test_real_target_lossless_with_a_drop():
    target = make_target("smollm2", "float32")
    ids = target.chat_ids("Name three colours.")
    ref = generate(target, Autoregressive(), ids, 10).token_ids
    net = preset("4g", [(0.4, 1.4)])
    for method in ("ar", "eagle2", "moa"):
        drafter, _ = make_drafter(method, target, "random", {"depth": 3, "top_k": 4, "total_tokens": 8})
        run = simulate(target, method, None if method == "ar" else drafter, ids, net, 10, timing=COST,
                       offline_min_confidence=0.0)
        assert run.token_ids == ref, method
        if method == "moa":
            assert run.offline_tokens > 0
            rows = [m for m in run.trace.messages if m["kind"] == "verify_reply"]
            assert all(m["bytes"] == expected_size(VERIFY_REPLY, m["accepted"], rows=m["accepted"] + 1, width=576,
                                                   chain=m["chain"]) for m in rows)


# ----- the app tab ----------------------------------------------------------------------------------
def test_app_tab_runs_all_three():
    import gradio as gr

    from demo import tab_client_server as tab
    from demo.common import AppContext, new_session
    from demo.runtime import Runtime, UserError

    runtime = Runtime(tiny=True, reference_tokens=0)
    runs = tab.run_methods(runtime, "hello there", "4g", 0.2, 1.5, "all", 16, min_confidence=0.0)
    assert [r["method"] for r in runs] == ["ar", "eagle2", "moa"]
    assert len({tuple(r["token_ids"]) for r in runs}) == 1
    assert runs[2]["offline_tokens"] > 0
    page = tab.texts_html(runs, runtime.decode)
    assert page.count('class="tok-stream"') == 3 and "#ffc9c9" in page  # a random drafter gets corrected
    assert "All methods wrote exactly the same final text" in tab.summary_markdown(runs)
    json.dumps(runs)
    with pytest.raises(UserError):
        tab.network_for("3g", 0, 0)
    assert tab.network_for("5g", 1.0, 0).disconnects == ()
    with gr.Blocks():
        tab.build(AppContext(runtime=runtime, session=gr.State(new_session())))
