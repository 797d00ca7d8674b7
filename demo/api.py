"""The app's programmatic API (see demo/API.md): `/generate`, callable with gradio_client.

No `from __future__ import annotations` here: Gradio reads the real type hints to
describe the endpoint's inputs and output.
"""

import logging

import gradio as gr

from demo.common import plain_message
from demo.runtime import Runtime, UserError, run_summary

log = logging.getLogger("speclens.app")

# The documented defaults (demo/API.md): an argument left out, or sent as None (null), takes them.
DEFAULT_METHOD = "ar"
DEFAULT_MAX_NEW_TOKENS = 64


def make_generate(runtime: Runtime):
    def generate(prompt: str, method: str = DEFAULT_METHOD, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> dict:
        """Answer `prompt` (one user turn, chat template applied) with a decoding method, greedily.

        Args:
            prompt: the user's message.
            method: ar, pld, eagle2, moa, medusa or amphista, or one of the last four + "+lookup" (untrained
                drafters are used where none is shipped); None: the default, ar.
            max_new_tokens: 1 to 512; None: the default, 64.
        Returns:
            text, token_ids, mean_accepted (tau), tokens_per_s, new_tokens, steps, accept_lengths,
            wall_time, stop_reason, drafter_note, speedup (vs the app's plain-decoding reference, or null),
            ideal_speedup (for this tau on this machine's cost curve, or null before it is measured).
        """
        method = DEFAULT_METHOD if method is None else method
        max_new_tokens = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        try:
            runtime.check_method(method)
            n = runtime.check_max_new_tokens(max_new_tokens)
            if not isinstance(prompt, str):
                raise UserError(f"prompt must be text (a string), got {type(prompt).__name__}.")
            ids = runtime.prompt_ids(prompt)
            return run_summary(runtime.generate(method, ids, n, plain_tps=runtime.plain_tps))
        except gr.Error:
            raise
        except UserError as err:
            raise gr.Error(str(err), print_exception=False) from None
        except Exception as err:
            log.exception("/generate failed")
            raise gr.Error(plain_message(err), print_exception=False) from None

    return generate


def register(runtime: Runtime, concurrency_limit: int | str = "default") -> None:
    """Add the `/generate` endpoint to the Blocks being built."""
    gr.api(make_generate(runtime), api_name="generate", concurrency_limit=concurrency_limit,
           api_description="Generate an answer with a speculative decoding method; returns text and statistics.")
