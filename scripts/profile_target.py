"""The target pass against its floor (issue 23): fused pass vs the per-module pass vs bare matmuls, and
plain decoding vs transformers' `generate` on the same weights.

    python scripts/profile_target.py [--dtype bfloat16] [--threads 2] [--repeats 15] [--tokens 64]

Prints, for passes of 1 / 8 / 32 / 64 new tokens over a 200-token KV cache, the median ms of

* `fused`: Target.forward as it runs now (fused QKV and gate/up, static KV cache, per-pass constants once);
* `F.linear`: the same fused pass with F.linear instead of packed oneDNN matmuls (core.layers.linear), shown
  only where the packed kernel was chosen;
* `modules`: the same pass through the HF modules layer by layer (core.layers.decoder_layer, the old path);

all alternating so that drift hits each; then the bare-matmul floor (core.trees.cost_curve.matmul_floor_ms,
not cached here) and plain greedy decoding of --tokens tokens with our loop (and, where packed, our loop on
F.linear) against `hf_model.generate(do_sample=False)` on the same prompt, alternating, tokens/s each. Timing only means
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

    from core.decoding import generate
    from core.drafters.base import Autoregressive
    from core.layers import decoder_layer
    from core.trees import cost_curve

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

    @torch.no_grad()
    def plain_kernel_pass(ids, cache):
        with target.plain_matmuls():
            return target.forward(ids, cache=cache).logits

    packed = target.packed_matmuls
    passes = [("fused", fused_pass)] + ([("F.linear", plain_kernel_pass)] if packed else []) + \
        [("modules", modules_pass)]

    gen = torch.Generator().manual_seed(0)
    context = 200
    ids = torch.randint(2, target.vocab_size, (1, context + 64), generator=gen).to(dev)
    cache = target.new_cache(capacity=context + 80)
    target.forward(ids[:, :context], cache=cache)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"{target.source} {str(target.dtype).replace('torch.', '')} on {dev}, {torch.get_num_threads()} threads")
    print(f"packed oneDNN matmuls: {'yes' if packed else 'no (F.linear is as fast here, or no oneDNN)'}")
    print(f"{'tokens':>6s} " + " ".join(f"{name + ' ms':>13s}" for name, _ in passes) + f" {'fused/modules':>14s}")
    for n in (1, 8, 32, 64):
        new = ids[:, context:context + n]
        times = {name: [] for name, _ in passes}
        for r in range(args.repeats + 1):
            for name, fn in (passes if r % 2 else passes[::-1]):
                t0 = time.perf_counter()
                fn(new, cache)
                sync()
                if r:
                    times[name].append(1000 * (time.perf_counter() - t0))
                cache.crop(context)
        med = {name: statistics.median(v) for name, v in times.items()}
        print(f"{n:6d} " + " ".join(f"{med[name]:13.2f}" for name, _ in passes)
              + f" {med['fused'] / med['modules']:14.2f}")
    floor = cost_curve.matmul_floor_ms(target, repeats=max(5, args.repeats), cache_path=None)
    print(f"bare-matmul floor ({'packed' if packed else 'F.linear'} matmuls): {floor:.2f} ms")
    if packed:
        with target.plain_matmuls():
            print(f"bare-matmul floor (F.linear): "
                  f"{cost_curve.matmul_floor_ms(target, repeats=max(5, args.repeats), cache_path=None):.2f} ms")

    prompt = target.chat_ids(PROMPT)
    inp = torch.tensor([prompt], device=dev)
    ours, ours_plain, theirs = [], [], []
    for r in range(4):
        t0 = time.perf_counter()
        res = generate(target, Autoregressive(), prompt, args.tokens, stop_tokens=set())
        t1 = time.perf_counter()
        with torch.no_grad():
            out = target.hf_model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                           max_new_tokens=args.tokens, min_new_tokens=args.tokens)
        t2 = time.perf_counter()
        if packed:
            with target.plain_matmuls():
                plain_res = generate(target, Autoregressive(), prompt, args.tokens, stop_tokens=set())
        t3 = time.perf_counter()
        if r:  # the first round warms up
            ours.append(res.new_tokens / (t1 - t0))
            theirs.append((out.shape[1] - inp.shape[1]) / (t2 - t1))
            if packed:
                ours_plain.append(plain_res.new_tokens / (t3 - t2))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"plain greedy decoding, {args.tokens} tokens: ours {o:.1f} tok/s, transformers generate {t:.1f} tok/s "
          f"({o / t:.2f}x); ours per token {1000 / o:.1f} ms = {1000 / o / floor:.2f}x the floor")
    if packed:
        op = statistics.median(ours_plain)
        print(f"  ours with F.linear instead of packed matmuls: {op:.1f} tok/s ({op / t:.2f}x generate); "
              f"same tokens: {plain_res.token_ids == res.token_ids}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
