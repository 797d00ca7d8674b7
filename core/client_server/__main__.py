"""Command line for client-server speculative decoding.

    python -m core.client_server --method moa --preset 4g --disconnect 1:3 --prompt "Tell me a story" --json
    python -m core.client_server --method all --preset 5g --target tiny --prompt "abc" --json
    python -m core.client_server --method moa --preset 4g --real --prompt "Hi" --json     # two processes

Without --real the run is simulated on a virtual clock (core.client_server.sim: real compute,
modelled network); with --real the target runs in a server process and this process is the
client, over 127.0.0.1 (core.client_server.loopback), and times are wall-clock seconds.
--check also runs plain greedy decoding in this process and reports whether the outputs match.
`python -m core.client_server serve ...` is the loopback server process itself.
"""

from __future__ import annotations

import argparse
import json
import sys

from core import cli_checks as checks
from core.methods import METHODS as TABLE
from core.target import add_dtype_argument

from .client import OFFLINE_MIN_CONFIDENCE
from .network import PRESETS, parse_window, preset
from .protocol import METHODS

DEFAULT_LIMIT_S = 600.0  # simulated runs (virtual seconds)
DEFAULT_REAL_LIMIT_S = 300.0  # --real (wall-clock seconds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m core.client_server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="moa", choices=[*METHODS, "all"])
    p.add_argument("--preset", default="4g", choices=list(PRESETS))
    p.add_argument("--disconnect", action="append", default=[], metavar="START:END",
                   help="link down from START to END seconds after the start (repeatable)")
    p.add_argument("--prompt", required=True, help="the user message (chat template applied)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--real", action="store_true", help="a real server process over 127.0.0.1 (wall-clock time)")
    p.add_argument("--drafter", default=None, help="drafter checkpoint folder or 'random' "
                   "(default: the shipped one under assets/drafters if present, else random)")
    p.add_argument("--drafter-options", default="", help="JSON: hyper-parameters of a random drafter / tree settings")
    p.add_argument("--target", default="smollm2", help="smollm2 (default), tiny, or a checkpoint path")
    add_dtype_argument(p)
    p.add_argument("--seed", type=str, default=0, metavar="N",
                   help=f"seed of the link model (jitter, loss): a whole number from 0 to {checks.SEED_MAX}; default 0")
    p.add_argument("--timing", choices=["measured", "model"], default="measured",
                   help="simulation: measured compute times, or the fixed CostModel (reproducible)")
    p.add_argument("--time-limit", type=float, default=None,
                   help=f"a positive number of seconds (virtual, or wall with --real); default "
                        f"{DEFAULT_LIMIT_S:g} s, {DEFAULT_REAL_LIMIT_S:g} s with --real")
    p.add_argument("--threads", type=int, default=1, help="torch threads in this process (at least 1)")
    p.add_argument("--offline-horizon", type=int, default=None,
                   help="MoA: most tokens drafted past the last verified one while the link is down "
                        "(default: the distance the drafter was trained for; 0 = none)")
    p.add_argument("--offline-min-confidence", type=float, default=None,
                   help="MoA: stop drafting offline where the drafter's probability of the whole provisional "
                        f"chain falls below this (a probability in [0, 1); default {OFFLINE_MIN_CONFIDENCE:g}; "
                        "0 = only the horizon)")
    p.add_argument("--check", action="store_true", help="also compare with plain greedy decoding")
    p.add_argument("--json", action="store_true", help="print JSON (one object, or a list for --method all)")
    p.add_argument("--trace", default=None, help="write the full runs (trace included) as JSON to this file")
    p.add_argument("--figures", default=None, help="write the timeline and tokens-over-time figures to this .html")
    return p.parse_args(argv)


def parse_serve(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m core.client_server serve")
    p.add_argument("--target", default="smollm2")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--method", default="moa", choices=list(METHODS))
    p.add_argument("--drafter", default=None)
    p.add_argument("--drafter-options", default="")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--parent-pid", type=int, default=None)
    p.add_argument("--max-lifetime", type=float, default=900.0)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def check_args(args: argparse.Namespace):
    """Check what the user typed (ValueError: one line naming the bad value); returns the network model."""
    from core.methods import check_method

    from .models import check_options, check_target_spec

    checks.check_prompt(args.prompt)
    checks.check_max_new_tokens(args.max_new_tokens)
    args.seed = checks.check_seed(args.seed)
    checks.check_int_range(args.threads, "--threads", 1)
    if args.offline_horizon is not None:
        checks.check_int_range(args.offline_horizon, "--offline-horizon", 0)
    if args.offline_min_confidence is not None:
        checks.check_probability(args.offline_min_confidence, "--offline-min-confidence")
    checks.check_seconds(args.time_limit, "--time-limit",
                         f"{DEFAULT_LIMIT_S:g} s simulated, {DEFAULT_REAL_LIMIT_S:g} s with --real")
    net = preset(args.preset, [parse_window(w) for w in args.disconnect])
    check_target_spec(args.target)
    checks.check_drafter_folder(args.drafter)
    methods = list(METHODS) if args.method == "all" else [args.method]
    for m in methods:  # a checkpoint folder's config.json, read and checked now
        check_method(m, args.drafter)
    args.options = check_options(methods, args.drafter,
                                 checks.parse_json_object(args.drafter_options, "--drafter-options"))
    checks.check_output_file(args.trace, "--trace")
    checks.check_output_file(args.figures, "--figures")
    return net


def prompt_ids(target, text: str) -> list[int]:
    if target.tokenizer is None:  # the tiny test target: characters -> ids, as the app's tiny mode does
        return [2 + ord(c) % (target.vocab_size - 2) for c in text]
    return target.chat_ids(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        from .loopback import serve

        a = parse_serve(argv[1:])
        serve(a.target, a.dtype, a.method, a.drafter, a.drafter_options, a.port, a.parent_pid, a.max_lifetime,
              a.threads)
        return 0
    args = parse_args(argv)
    try:  # everything the user typed, before any model loads
        net = check_args(args)
    except ValueError as err:
        return checks.report(err)
    import torch

    from core.decoding import generate
    from core.drafters.base import Autoregressive

    from .models import make_drafter, make_target
    from .sim import CostModel, simulate

    torch.set_num_threads(args.threads)
    methods = list(METHODS) if args.method == "all" else [args.method]
    options = args.options
    try:
        print(f"loading target {args.target} ({args.dtype})...", file=sys.stderr)
        try:
            target = make_target(args.target, args.dtype)
        except (OSError, ImportError) as err:
            raise ValueError(f"cannot load --target {args.target}: {checks.one_line(err)}") from None
        ids = prompt_ids(target, args.prompt)
        reference = None
        if args.check:
            reference = generate(target, Autoregressive(), ids, args.max_new_tokens).token_ids
        runs = []
        server = None
        if args.real:
            from .loopback import ServerProcess, run_loopback

            limit = args.time_limit or DEFAULT_REAL_LIMIT_S
            # a server started for the method that keeps drafting offline (MoA: it holds its LSA) serves them all
            serving = next((m for m in methods if TABLE[m].client_server == "offline"), methods[0])
            server = ServerProcess(args.target, serving, args.dtype, args.drafter, options,
                                   max_lifetime=len(methods) * limit + 300.0)
            print("starting the server process...", file=sys.stderr)
            server.__enter__()
        try:
            for m in methods:
                drafter, note = make_drafter(m, target, args.drafter, options)
                print(f"{m}: {note or 'no drafter'}; {'loopback' if args.real else 'virtual clock'}, {net.name}",
                      file=sys.stderr)
                if args.real:
                    run = run_loopback(args.target, m, ids, net, args.max_new_tokens, args.seed, args.dtype,
                                       args.drafter, options, time_limit=limit, target=target,
                                       drafter=None if m == "ar" else drafter, server=server,
                                       offline_horizon=args.offline_horizon,
                                       offline_min_confidence=args.offline_min_confidence)
                    run.note = note
                else:
                    timing = CostModel() if args.timing == "model" else "measured"
                    run = simulate(target, m, None if m == "ar" else drafter, ids, net, args.max_new_tokens,
                                   args.seed, timing, time_limit=args.time_limit or DEFAULT_LIMIT_S, note=note,
                                   offline_horizon=args.offline_horizon,
                                   offline_min_confidence=args.offline_min_confidence)
                runs.append(run)
        finally:
            if server is not None:
                server.stop()
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        return checks.report(err)
    out = []
    for run in runs:
        s = run.summary()
        if reference is not None:
            s["matches_greedy"] = run.token_ids == reference
        out.append(s)
    try:  # the folders were created before the run; a failure now still prints the results below
        if args.trace:
            with open(args.trace, "w") as f:
                json.dump([r.to_dict() for r in runs], f)
        if args.figures:
            from .figures import timeline_figure, tokens_figure

            with open(args.figures, "w") as f:
                f.write(tokens_figure(runs).to_html(include_plotlyjs="cdn", full_html=False))
                for run in runs:
                    f.write(timeline_figure(run).to_html(include_plotlyjs=False, full_html=False))
        status = 0
    except OSError as err:
        status = checks.report(f"could not write {err.filename or 'an output file'}: {err.strerror or err}", 1)
    if args.json:
        print(json.dumps(out[0] if len(out) == 1 else out))
    else:
        for s in out:
            print(f"[{s['method']}] {s['new_tokens']} tokens in {s['virtual_time_s']:.2f} s "
                  f"({s['tokens_per_s']:.1f}/s), "
                  f"{s['server_calls']} server calls, {s['offline_tokens']} offline tokens "
                  f"({s['corrected_tokens']} corrected), {s['bytes_up']} B up / {s['bytes_down']} B down"
                  + (f", matches greedy: {s['matches_greedy']}" if "matches_greedy" in s else ""))
            for stop in s.get("offline_stops") or []:  # where MoA stopped writing while the link was down
                print(f"  offline drafting stopped at {stop['t']:.2f} s after {stop['provisional']} provisional "
                      f"tokens: {stop['reason'].replace('_', ' ')}"
                      + (f" ({s['offline_horizon']} tokens past the last verified one, as far as it was trained)"
                         if stop["reason"] == "horizon" else "")
                      + (f" (its probability for the chain fell below {s['offline_min_confidence']:g})"
                         if stop["reason"] == "confidence" else ""))
            print(s["text"])
    return status


if __name__ == "__main__":
    sys.exit(main())
