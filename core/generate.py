"""Command line: generate with any method and print the text or a JSON summary.

    python -m core.generate --method pld --prompt "Summarise: ..." --json
    python -m core.generate --target MODEL_DIR --drafter EAGLE_DIR --prompt "..."   # method from the checkpoint

`--drafter` takes our checkpoints and EAGLE-1/2 or Medusa ones in their published layouts (converted on load,
core.drafters.published_formats); the format is detected from the files, `--drafter-format` forces it. Without
`--method`, a drafter folder's own method is used (eagle2 for EAGLE, medusa for Medusa), else ar.
"""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from core import cli_checks as checks
from core.decoding import generate
from core.drafters.published_formats import FORMATS, checkpoint_method, split_spec
from core.methods import available_methods, build_drafter, check_method
from core.static_pass import PASS_MODES
from core.target import add_dtype_argument
from core.verify import SamplingConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m core.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default=None, help=f"one of: {', '.join(available_methods())}; any of them + "
                                                  "'+lookup' adds a context-lookup branch (lookup_branch.py); "
                                                  "default: the --drafter folder's method, else ar")
    p.add_argument("--prompt", required=True, help="the user message (chat template applied)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=str, default=None, metavar="N",
                   help=f"sampling seed: a whole number from 0 to {checks.SEED_MAX} (default: a random one)")
    add_dtype_argument(p)
    p.add_argument("--device", default="auto", help="auto (a CUDA GPU if there is one, else cpu), cpu, cuda, cuda:N")
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--passes", default="auto", choices=PASS_MODES,
                   help="verify passes and drafting levels: auto (CUDA graphs on a GPU, eager on a CPU), eager, "
                        "static (fixed buffers, no capture), captured (CUDA only)")
    p.add_argument("--drafter", default=None, help="drafter checkpoint folder (ours, or an EAGLE-1/2 or Medusa "
                                                   "checkpoint as published), or 'random' (untrained)")
    p.add_argument("--drafter-format", default="auto", choices=("auto", *FORMATS),
                   help="the --drafter folder's format (default: detected from its files)")
    p.add_argument("--tli", type=int, default=None, help="MoA only: target layers the drafter runs (shipped: 0, 1, 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    p.add_argument("--trace", default=None, help="write the full step trace as JSON to this file")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> SamplingConfig:
    """Everything the user typed, checked before the model loads (UsageError / ValueError: one line)."""
    checks.check_prompt(args.prompt)
    checks.check_max_new_tokens(args.max_new_tokens)
    args.seed = checks.check_seed(args.seed)
    sampling = SamplingConfig(args.temperature, args.top_p, args.seed)
    checks.check_device(args.device)
    checks.check_passes(args.passes, args.device)
    checks.check_target(args.target)
    if args.drafter_format != "auto":
        if args.drafter in (None, "random"):
            raise checks.UsageError(f"--drafter-format {args.drafter_format} needs --drafter DIR (a checkpoint folder)")
        if split_spec(args.drafter)[0] is not None:
            raise checks.UsageError(f"--drafter {args.drafter} already names its format; drop --drafter-format")
        args.drafter = f"{args.drafter_format}:{args.drafter}"
    checks.check_drafter_folder(args.drafter)
    if args.method is None:  # a checkpoint folder runs as its own method
        args.method = (checkpoint_method(args.drafter) if args.drafter not in (None, "random") else None) or "ar"
    check_method(args.method, args.drafter, **({} if args.tli is None else {"tli": args.tli}))
    checks.check_output_file(args.trace, "--trace")
    return sampling


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sampling = check_args(args)
        print(f"loading target ({args.dtype})...", file=sys.stderr)
        target = checks.load_target_cleanly(args.target, args.dtype, args.device)
        target.pass_mode = args.passes
        options = {} if args.tli is None else {"tli": args.tli}
        drafter = build_drafter(args.method, target, args.drafter, **options)
        prompt_ids = target.chat_ids(args.prompt)
        with tqdm(total=args.max_new_tokens, desc=args.method, unit="tok", file=sys.stderr) as bar:
            result = generate(target, drafter, prompt_ids, args.max_new_tokens, sampling,
                              record=args.trace is not None, hooks=[lambda ev: bar.update(len(ev.new_tokens))])
    except (ValueError, FileNotFoundError) as err:
        return checks.report(err)
    if args.json:
        print(json.dumps({"method": args.method, "dtype": args.dtype, **result.summary()}))
    else:
        print(result.text)
        print(f"[{args.method}] {result.new_tokens} tokens, {result.steps} target passes, "
              f"tau {result.mean_accepted:.2f}, {result.tokens_per_s:.1f} tokens/s", file=sys.stderr)
    if args.trace:  # after the result is printed: a failure here loses nothing already shown
        try:
            with open(args.trace, "w") as f:
                json.dump({"method": args.method, **result.trace()}, f)
        except OSError as err:
            return checks.report(f"could not write --trace {args.trace}: {err.strerror or err}", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
