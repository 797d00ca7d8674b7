"""The target pass against its floor (issue 23): fused pass vs the per-module pass vs bare matmuls, and
plain decoding vs transformers' `generate` on the same weights.

    python scripts/profile_target.py [--dtype bfloat16] [--threads 2] [--repeats 15] [--tokens 64]

Prints, for passes of 1 / 8 / 32 / 64 new tokens over a 200-token KV cache, the median ms of

* `fused`: Target.forward as it runs now (fused QKV and gate/up, static KV cache, per-pass constants once);
* `modules`: the same pass through the HF modules layer by layer (core.target.decoder_layer, the old path);

the two alternating so that drift hits both; then the bare-matmul floor (core.cost_curve.matmul_floor_ms,
not cached here) and plain greedy decoding of --tokens tokens with our loop against
`hf_model.generate(do_sample=False)` on the same prompt, alternating, tokens/s each. Timing only means
something on a machine nobody else is using.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "Explain in a few sentences why the sky is blue, for a curious ten-year-old."


def main(argv: list[str] | None = None) -> int:
    from core import cli_checks as checks
    from core.target import add_dtype_argument

    p = argparse.ArgumentParser(prog="scripts/profile_target.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_dtype_argument(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--tokens", type=int, default=64, help="new tokens in the decoding comparison")
    args = p.parse_args(argv)
    try:
        checks.check_int_range(args.repeats, "--repeats", 1, 1000)
        checks.check_int_range(args.tokens, "--tokens", 1, 1024)
        checks.check_device_and_threads(args.device, args.threads)
    except ValueError as err:
        return checks.report(err)
    import torch

    from core import cost_curve
    from core.decoding import generate
    from core.drafters.base import Autoregressive
    from core.target import decoder_layer

    target = checks.target_for_script(args.dtype, args.device, args.threads)
    dev = target.device

    @torch.no_grad()
    def modules_pass(ids, cache):  # the per-module path: HF norms, projections and MLPs layer by layer
        past = cache.length
        t = ids.shape[1]
        pos = torch.arange(past, past + t, device=dev)[None]
        cos, sin = target.rope(pos)
        x = target.embed_tokens(ids)
        for i, layer in enumerate(target.layers):
            x, _ = decoder_layer(layer, x, cos, sin, None, cache, i, target.head_dim)
        cache.commit(t)
        return target.logits(x)

    @torch.no_grad()
    def fused_pass(ids, cache):
        return target.forward(ids, cache=cache).logits

    gen = torch.Generator().manual_seed(0)
    context = 200
    ids = torch.randint(2, target.vocab_size, (1, context + 64), generator=gen).to(dev)
    cache = target.new_cache(capacity=context + 80)
    target.forward(ids[:, :context], cache=cache)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"{target.source} {str(target.dtype).replace('torch.', '')} on {dev}, {torch.get_num_threads()} threads")
    print(f"{'tokens':>6s} {'fused ms':>9s} {'modules ms':>11s} {'fused/modules':>14s}")
    for n in (1, 8, 32, 64):
        new = ids[:, context:context + n]
        times = {"fused": [], "modules": []}
        for r in range(args.repeats + 1):
            for name, fn in (("fused", fused_pass), ("modules", modules_pass)) if r % 2 else \
                    (("modules", modules_pass), ("fused", fused_pass)):
                t0 = time.perf_counter()
                fn(new, cache)
                sync()
                if r:
                    times[name].append(1000 * (time.perf_counter() - t0))
                cache.crop(context)
        f, m = statistics.median(times["fused"]), statistics.median(times["modules"])
        print(f"{n:6d} {f:9.2f} {m:11.2f} {f / m:14.2f}")
    floor = cost_curve.matmul_floor_ms(target, repeats=max(5, args.repeats), cache_path=None)
    print(f"bare-matmul floor: {floor:.2f} ms")

    prompt = target.chat_ids(PROMPT)
    inp = torch.tensor([prompt], device=dev)
    ours, theirs = [], []
    for r in range(4):
        t0 = time.perf_counter()
        res = generate(target, Autoregressive(), prompt, args.tokens, stop_tokens=set())
        t1 = time.perf_counter()
        with torch.no_grad():
            out = target.hf_model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                           max_new_tokens=args.tokens, min_new_tokens=args.tokens)
        t2 = time.perf_counter()
        if r:  # the first round warms up
            ours.append(res.new_tokens / (t1 - t0))
            theirs.append((out.shape[1] - inp.shape[1]) / (t2 - t1))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"plain greedy decoding, {args.tokens} tokens: ours {o:.1f} tok/s, transformers generate {t:.1f} tok/s "
          f"({o / t:.2f}x); ours per token {1000 / o:.1f} ms = {1000 / o / floor:.2f}x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
