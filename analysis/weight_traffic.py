"""Weight traffic: how many megabytes of weight matrices drafting reads per cycle, against a target pass.

On a CPU a pass of this model is bound by memory traffic: each matmul streams its weight matrix for a handful
of rows. `measure` profiles one generation and adds up the matrix each matmul reads (packed or plain linear,
mm, bmm: the weight operand, once per call; attention over the KV cache is not a weight), split between
drafting (the drafter's `draft` and `accept`) and everything else (the target's passes); the drafter's own
prefill (`begin`) counts in neither. Divided by the measured time of each, it gives the rate each streams at:
drafting's share of a verify pass is its share of the bytes divided by how fast it streams relative to the
pass (docs/RESULTS.md, "Where drafting's time goes").

`scripts/profile_drafting.py --weights` runs it for every method and writes the rows the app's Benchmarks tab
plots (`figure`); the committed ones are in assets/results/weight_traffic/.
"""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from analysis.drafter_calls import wrapped_calls
from core.decoding import generate
from core.drafters.base import Drafter
from core.target import Target

# matmul kernels and the argument that holds the weight matrix they stream (leaves only: aten::linear and
# aten::matmul call these, and would be counted twice)
WEIGHT_ARG = {"mkldnn::_linear_pointwise": 1, "aten::mm": 1, "aten::addmm": 2, "aten::bmm": 1, "aten::baddbmm": 2}
DRAFT_SCOPE, BEGIN_SCOPE = "speclens.drafting", "speclens.drafter_prefill"


def measure(target: Target, drafter: Drafter, ids: list[int], max_new_tokens: int) -> dict:
    """Megabytes of matrices read per cycle by drafting (draft + accept) and per target pass (everything else),
    from one profiled generation: each matmul's weight operand counted once per call; begin() is left out."""
    def scoped(name, fn):  # begin (the drafter's own prefill) is counted in neither
        def run(*a, **k):
            with record_function(BEGIN_SCOPE if name == "begin" else DRAFT_SCOPE):
                return fn(*a, **k)
        return run

    with wrapped_calls(drafter, scoped), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        result = generate(target, drafter, ids, max_new_tokens)
    size = torch.empty(0, dtype=target.dtype).element_size()
    totals = {"draft": 0, "verify": 0}
    for e in prof.events():
        arg = WEIGHT_ARG.get(e.name)
        if arg is None or len(e.input_shapes) <= arg or len(e.input_shapes[arg]) < 2:
            continue
        numel = 1
        for d in e.input_shapes[arg]:
            numel *= d
        parent, scope = e.cpu_parent, None
        while parent is not None and scope is None:
            scope = parent.name if parent.name in (DRAFT_SCOPE, BEGIN_SCOPE) else None
            parent = parent.cpu_parent
        if scope != BEGIN_SCOPE:
            totals["draft" if scope == DRAFT_SCOPE else "verify"] += numel * size
    passes = len(result.events)  # the prefill, then one a cycle (drafting starts from the second)
    return {"draft_mb": totals["draft"] / max(1, passes - 1) / 1e6, "verify_mb": totals["verify"] / passes / 1e6}


def figure(rows: list[dict]) -> go.Figure:
    """Per drafting method: drafting's share of a verify pass in bytes read and in time, side by side."""
    rows = [r for r in rows if r.get("draft_mb") and r.get("verify_mb") and r.get("verify_ms")]
    methods = [r["method"] for r in rows]
    by_bytes = [r["draft_mb"] / r["verify_mb"] for r in rows]
    by_time = [r["draft_ms"] / r["verify_ms"] for r in rows]
    hover = [f"drafting reads {r['draft_mb']:.1f} MB a cycle in {r['draft_ms']:.1f} ms; a target pass "
             f"{r['verify_mb']:.0f} MB in {r['verify_ms']:.1f} ms" for r in rows]
    fig = go.Figure()
    fig.add_bar(name="weights read (share of a pass's)", x=methods, y=by_bytes, hovertext=hover,
                text=[f"{v:.0%}" for v in by_bytes])
    fig.add_bar(name="time (share of a verify pass)", x=methods, y=by_time, hovertext=hover,
                text=[f"{v:.0%}" for v in by_time])
    fig.update_layout(barmode="group", yaxis_tickformat=".0%", template="plotly_white",
                      yaxis_title="drafting / target pass",
                      title="Drafting is bound by the weights it reads: the time bar cannot go below the bytes bar "
                            "unless drafting streams faster than the target pass")
    return fig
