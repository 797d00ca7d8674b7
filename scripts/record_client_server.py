"""Record the example the Client-server tab opens on: the shipped drafters, the tab's default settings, float32.

Runs plain decoding, EAGLE-2 and MoA over the default network with its drop (demo.tab_client_server.DEFAULTS)
exactly as the tab's Run button does, and writes their runs, with the text of every token they show, to
assets/results/client_server_example.json, which the app shows without loading any model. Run it again
whenever a shipped drafter changes (a few minutes on a CPU: the 135M target runs in float32).

    python scripts/record_client_server.py [--out FILE] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.runtime import Runtime, UserError  # noqa: E402  (after the path insert, like the other scripts)
from demo.tab_client_server import (  # noqa: E402
    DEFAULTS,
    EXACT_DTYPE,
    EXAMPLE_PATH,
    load_example,
    make_example,
    run_methods,
)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Record the Client-server tab's example run (float32, default settings).")
    p.add_argument("--out", default=str(EXAMPLE_PATH), help="where to write it (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="the tiny random test target (tests only: no real text)")
    args = p.parse_args(argv)
    out = Path(args.out)
    rt = Runtime(tiny=args.tiny or None, dtype=EXACT_DTYPE, reference_tokens=0)
    st = dict(DEFAULTS)

    def report(fraction: float, text: str) -> None:
        print(f"[{fraction:4.0%}] {text}", file=sys.stderr, flush=True)

    try:
        runs = run_methods(rt, st["prompt"], st["preset"], st["drop_start"], st["drop_length"], st["which"],
                           st["max_new_tokens"], report, st["min_confidence"])
    except UserError as err:
        print(str(err), file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(make_example(runs, st, rt.decode, rt.describe()), separators=(",", ":")))
    load_example(out)  # it reads back as the tab reads it
    for r in runs:
        print(f"{r['method']}: {len(r['token_ids'])} tokens in {r['virtual_time_s']:.2f} s (virtual), "
              f"{r['offline_tokens']} offline, {r['confirmed_tokens']} confirmed; {r['text'][:60]!r}")
    same = len({tuple(r["token_ids"]) for r in runs}) == 1
    print(f"{out}: {out.stat().st_size / 1024:.0f} KB, {runs[0]['dtype']}, "
          f"{'the same final text for every method' if same else 'THE FINAL TEXTS DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
