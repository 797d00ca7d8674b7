"""The app's model holder: loads the target once (lazily), lends drafters, streams generations as JSON-able runs.

No Gradio here: the tabs and the API call this, and tests can drive it directly.

Configuration (environment variables, read when a `Runtime` is built):
  SPECLENS_TINY=1           a tiny random target and a trivial tokenizer (fast tests; text is "t12 t7 ...")
  SPECLENS_TARGET           target checkpoint (default: the shipped SmolLM2-135M-Instruct GGUF)
  SPECLENS_DTYPE            auto (default: bfloat16 where the CPU/GPU multiplies it natively, else
                             float32), bfloat16 or float32
  SPECLENS_DEVICE           auto (default), cpu or cuda
  SPECLENS_REFERENCE_TOKENS tokens of the plain-decoding reference run made after loading (default 16, 0 = none)
  SPECLENS_COST_CURVE       where this machine's cost curve is cached (default runs/cost_curve.json; "none":
                             measure without caching)
  SPECLENS_DRAFTER_<METHOD> a drafter folder for that method (EAGLE2, MEDUSA, MOA, AMPHISTA; tiny mode too):
                             ours, or an EAGLE-1/2 or Medusa checkpoint in its published layout
                             (core.drafters.published_formats; `eagle:DIR` / `medusa:DIR` force the format)

`Runtime.start_background_load()` (app.py calls it at server start) loads the target in a thread, runs the
plain-decoding reference and measures the cost curve (core.trees.cost_curve), with `status()` telling the page
how far it got; a request that arrives meanwhile waits for the same load.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from core.cli_checks import one_line as cli_one_line
from core.decoding import generate_stream
from core.drafters.base import Drafter
from core.drafters.lookup_branch import LookupBranch
from core.drafters.published_formats import FORMAT_NAMES
from core.methods import (
    MethodName,
    build_drafter,
    has_shipped,
    load_method,
    method_labels,
    parse_method,
    shipped_folder,
    shipped_tli,
    takes_tli,
    tli_of,
    with_tli,
)
from core.target import Target, load_target, resolve_device, resolve_dtype, tiny_target
from core.trees import cost_curve
from core.verify import SamplingConfig
from demo.render import generation_stats, token_pieces, tokens_from_events

log = logging.getLogger("speclens.app")

# Every method, and each trained one with a context-lookup branch (not from the papers: the drafter's
# tree plus a lookup chain, core.drafters.lookup_branch); labels come from core.methods' table.
METHOD_LABELS = method_labels()
LOOKUP_NOTE = "with a context-lookup branch grafted on its tree (not part of the paper)"
TLI_CHOICES = tuple(shipped_tli()) or (0,)  # MoA's N with a shipped checkpoint (0, 1, 3), found on disk
MAX_NEW_TOKENS = 512
MAX_PROMPT_TOKENS = 2048
REFERENCE_PROMPT = "Explain in two sentences why the sky is blue."
UNTRAINED_NOTE = "untrained drafter: tau near 1"


class UserError(ValueError):
    """A problem the user can fix; its message is shown as is."""


def drafter_env(method: str) -> tuple[str, str] | None:
    """(variable, spec) when SPECLENS_DRAFTER_<METHOD> names a drafter folder for this method's drafter."""
    parsed = parse_method(method)
    if not parsed.method.trained:
        return None
    name = "SPECLENS_DRAFTER_" + parsed.base.upper().replace("-", "_")
    spec = os.environ.get(name, "").strip()
    return (name, spec) if spec else None


class _TinyText:
    """Stands in for a tokenizer with the tiny test target: characters -> ids, ids -> "t<id>"."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        return [2 + ord(c) % (self.vocab - 2) for c in text]

    @staticmethod
    def decode(ids: Sequence[int]) -> str:
        return " ".join(f"t{int(i)}" for i in ids)


class Runtime:
    """One target and a pool of drafters, shared by every user of the app (they are read-only once loaded)."""

    def __init__(self, tiny: bool | None = None, target: str | None = None, dtype: str | None = None,
                 device: str | None = None, reference_tokens: int | None = None) -> None:
        env = os.environ
        self.tiny = env.get("SPECLENS_TINY", "0") not in ("", "0", "false") if tiny is None else tiny
        self.target_name = target or env.get("SPECLENS_TARGET") or None
        self.dtype = dtype or env.get("SPECLENS_DTYPE", "auto")  # core.target.fast_dtype
        self.device = device or env.get("SPECLENS_DEVICE", "auto")
        self.reference_tokens = int(env.get("SPECLENS_REFERENCE_TOKENS", "16")) if reference_tokens is None \
            else reference_tokens
        self.max_new_tokens = MAX_NEW_TOKENS
        self.max_prompt_tokens = MAX_PROMPT_TOKENS
        self._target: Target | None = None
        self._tiny_text: _TinyText | None = None
        self._load_lock = threading.Lock()
        self._pool_lock = threading.Lock()
        self._pool: dict[tuple, list[tuple[Drafter, str]]] = {}
        self.plain_tps: float | None = None  # reference plain-decoding speed on this machine
        self.plain_source = ""
        path = env.get("SPECLENS_COST_CURVE", str(cost_curve.CACHE_FILE))
        self.cost_curve_path: str | None = None if path.lower() == "none" else path
        self.cost_curve: dict | None = None  # core.trees.cost_curve.measure_cost_curve, once measured
        self._status = ("idle", "the target loads on first use")
        self._status_t0 = time.perf_counter()
        self._thread: threading.Thread | None = None
        self._variants: dict[str, Runtime] = {}

    # ----- loading ------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._target is not None

    def describe(self) -> str:
        """The header's line: which target, in which dtype on which device, and where the drafters come from."""
        own = [f"{var.removeprefix('SPECLENS_DRAFTER_').lower()} from {spec} ({var})"
               for var, spec in sorted(os.environ.items()) if var.startswith("SPECLENS_DRAFTER_") and spec.strip()]
        drafters = "; drafters: " + ("; ".join(own) + ", the others " if own else "") + (
            "random (tiny mode)" if self.tiny else "shipped (assets/drafters)")
        if self.tiny:
            return "tiny random test target (no real text)" + drafters
        name = self.target_name or "SmolLM2-135M-Instruct"
        device = resolve_device(self.device)
        dtype = str(resolve_dtype(self.dtype, device)).replace("torch.", "")
        return f"{name}, {dtype}{' (auto)' if self.dtype == 'auto' else ''}, {self.device}{drafters}"

    @property
    def background_started(self) -> bool:
        return self._thread is not None

    def status(self) -> dict:
        """{"state": idle | loading | ready | failed, "text": one line for the page, "seconds": since it began}."""
        state, text = self._status
        return {"state": state, "text": text, "seconds": time.perf_counter() - self._status_t0}

    def start_background_load(self) -> threading.Thread:
        """Load the target (and measure the reference speed and the cost curve) in a daemon thread."""
        if self._thread is None:
            def work() -> None:
                try:
                    self.load()
                    self.measure_cost_curve()
                except Exception as err:  # shown in the status line; a request will retry and say why
                    log.exception("background load failed")
                    self._status = ("failed", f"loading the target failed: {str(err).splitlines()[0][:200]}")

            self._status = ("loading", "loading the target model in the background")
            self._status_t0 = time.perf_counter()
            self._thread = threading.Thread(target=work, name="speclens-load", daemon=True)
            self._thread.start()
        return self._thread

    def measure_cost_curve(self) -> dict | None:
        """This machine's cost curve (core.trees.cost_curve), measured once; None if it cannot be measured."""
        if self.cost_curve is None:
            target = self.load()
            state = self._status
            self._status = ("loading", "measuring this machine's cost curve (verify-pass time vs tokens)")
            try:
                # measured once per machine; the tiny test target (and SPECLENS_COST_MODEL=fixed) get the fixed model
                self.cost_curve = cost_curve.curve_for(target, cache_path=self.cost_curve_path)
            except Exception:  # the curve only explains the speedup: never block the app on it
                log.exception("cost curve measurement failed")
            self._status = state
        return self.cost_curve

    def for_dtype(self, dtype: str) -> Runtime:
        """This runtime if it already runs in `dtype`, else a second runtime (own target) in that dtype."""
        if self.tiny:  # the tiny test target is always float32
            return self
        mine = resolve_dtype(self.dtype, resolve_device(self.device))
        if resolve_dtype(dtype, resolve_device(self.device)) == mine:
            return self
        with self._pool_lock:
            if dtype not in self._variants:
                rt = Runtime(tiny=self.tiny, target=self.target_name, dtype=dtype, device=self.device,
                             reference_tokens=0)
                rt.cost_curve_path = self.cost_curve_path
                self._variants[dtype] = rt
            return self._variants[dtype]

    def load(self, progress: Callable[[float, str], None] | None = None) -> Target:
        """Load the target once; later calls return it at once. `progress(fraction, text)` reports steps."""
        if self._target is not None:
            return self._target
        user_report = progress or (lambda f, t: None)

        def report(fraction: float, text: str) -> None:
            self._status = ("ready" if fraction >= 1.0 else "loading", text)
            user_report(fraction, text)

        with self._load_lock:
            if self._target is not None:
                return self._target
            self._status_t0 = t0 = time.perf_counter()
            if self.tiny:
                report(0.2, "building the tiny test target")
                target = tiny_target()
                self._tiny_text = _TinyText(target.vocab_size)
            else:
                report(0.05, "loading the target model (first use only; about 20-40 s on a CPU)")
                try:
                    target = load_target(self.target_name, self.dtype, self.device)
                except FileNotFoundError as err:
                    self._status = ("failed", str(err))
                    raise UserError(str(err)) from err
            log.info("target loaded in %.1f s: %s", time.perf_counter() - t0, self.describe())
            self._target = target
            if self.reference_tokens > 0:
                report(0.85, "measuring plain decoding speed (reference for the speedup figure)")
                self._reference_run(target)
            report(1.0, f"ready: {self.describe()} (loaded in {time.perf_counter() - t0:.0f} s)")
            return target

    def _reference_run(self, target: Target) -> None:
        try:
            ids = self.prompt_ids(REFERENCE_PROMPT)
            list(generate_stream(target, build_drafter("ar", target), ids, 2))  # warm-up
            t0 = time.perf_counter()
            n = sum(len(e.new_tokens) for e in generate_stream(target, build_drafter("ar", target), ids,
                                                                self.reference_tokens, stop_tokens=set()))
            self.plain_tps = n / (time.perf_counter() - t0)
            self.plain_source = f"reference run of {n} tokens when the app loaded"
        except Exception:  # a failed measurement only hides the speedup figure
            log.exception("reference plain-decoding run failed")

    @property
    def target(self) -> Target:
        return self.load()

    # ----- text ---------------------------------------------------------------------------------
    def prompt_ids(self, messages: str | Sequence[dict]) -> list[int]:
        """Token ids of a chat prompt, with the limits checked (plain messages on failure)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            got = type(messages).__name__ if not isinstance(messages, (list, tuple)) else "a list with non-text items"
            raise UserError(f"The prompt must be text (a string), got {got}.")
        target = self.load()
        if not messages or not any(str(m.get("content", "")).strip() for m in messages):
            raise UserError("The prompt is empty: type a message for the model to answer.")
        if self._tiny_text is not None:
            ids = self._tiny_text.encode("\n".join(str(m["content"]) for m in messages))
        else:
            ids = target.chat_ids(list(messages))
        limit = min(self.max_prompt_tokens, target.max_positions - 64)
        if len(ids) > limit:
            raise UserError(f"The prompt (with the conversation so far) is {len(ids)} tokens long; the limit is "
                            f"{limit}. Clear the chat or shorten the message.")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        if self._tiny_text is not None or self.tiny:
            return _TinyText.decode(ids)
        return self.load().decode(list(ids))

    # ----- methods and drafters -----------------------------------------------------------------
    def methods(self) -> list[tuple[str, str]]:
        """(label, method) for every method this build can run; untrained ones say so."""
        out = []
        for m, label in METHOD_LABELS.items():
            if parse_method(m).method.trained and drafter_env(m) is None and (self.tiny or not has_shipped(m)):
                label += " · untrained"
            out.append((label, m))
        return out

    def check_method(self, method: str) -> None:
        """UserError unless `method` is a name the app runs: a menu entry, MoA with a shipped TLI N among them."""
        try:
            parsed = parse_method(method)
        except ValueError:
            parsed = None
        if parsed is None or parsed.variant or MethodName(parsed.base, lookup=parsed.lookup).name not in \
                METHOD_LABELS or (parsed.tli is not None and parsed.tli not in TLI_CHOICES):
            raise UserError(f"Unknown method {method!r}; choose one of {', '.join(METHOD_LABELS)}.")

    def method_name(self, method: str, tli: int | None = None) -> str:
        """The one name of `method` run with MoA's TLI N ('moa', 3 -> 'moa-tli3'); N is ignored by methods that
        take none. UserError for an unknown method."""
        self.check_method(method)
        name = with_tli(method, int(tli)) if tli is not None and takes_tli(method) else method
        self.check_method(name)
        return name

    def _build(self, name: str) -> tuple[Drafter, str]:
        parsed = parse_method(name)
        if parsed.lookup:
            inner, note = self._build(MethodName(parsed.base, parsed.tli).name)
            return LookupBranch(inner), f"{note}; {LOOKUP_NOTE}" if note else LOOKUP_NOTE
        target = self.load()
        if not parsed.method.trained:
            return load_method(name, target).drafter, ""
        env = drafter_env(name)
        if env is not None:  # the user's folder: a failure is theirs to fix, never a silent random stand-in
            var, spec = env
            try:
                loaded = load_method(name, target, spec)
            except (ValueError, OSError) as err:
                raise UserError(f"{var}={spec}: {cli_one_line(err)}") from err
            kind = f"{FORMAT_NAMES[loaded.published['format']]} checkpoint, converted" if loaded.published \
                else "trained"
            return loaded.drafter, f"{parsed.base} drafter from {spec} ({kind}; {var})"
        # a missing or broken shipped checkpoint: say so, fall back to random (tiny mode never reads them: they
        # are made for the real target)
        loaded = load_method(name, target, "random" if self.tiny else None, fallback="unloadable")
        if loaded.source == "shipped":
            return loaded.drafter, f"trained {parsed.base} drafter ({loaded.folder.name})"
        if loaded.error is not None:
            log.warning("could not load the trained %s drafter: %s", name, loaded.error)
        reason = loaded.fallback or f"no trained checkpoint at assets/drafters/{shipped_folder(name).name}"
        return loaded.drafter, f"{UNTRAINED_NOTE} ({reason}; using a randomly initialised {parsed.base} drafter)"

    @contextmanager
    def drafter(self, name: str) -> Iterator[tuple[Drafter, str]]:
        """Borrow the drafter of a method name such as 'moa-tli3' (drafters keep per-generation state, so one
        generation uses one at a time)."""
        self.check_method(name)
        with self._pool_lock:
            idle = self._pool.setdefault(name, [])
            item = idle.pop() if idle else None
        if item is None:
            try:
                item = self._build(name)
            except UserError:
                raise
            except FileNotFoundError as err:
                raise UserError(str(err)) from err
            inner = getattr(item[0], "inner", item[0])  # a "+lookup" method wraps its drafter
            if hasattr(inner, "record_lsa_attention"):
                inner.record_lsa_attention = True  # the LSA tab's maps (the benchmark and CLI skip them)
        try:
            yield item
        finally:
            with self._pool_lock:
                self._pool[name].append(item)

    def calibrated_choice(self, name: str) -> dict | None:
        """The tree choice of a drafter this app has already run, once it has calibrated itself from measured
        cycles (core.trees.calibration.CycleLedger); None before that, and for methods without an auto tree."""
        with self._pool_lock:
            items = list(self._pool.get(name, []))
        for drafter, _ in items:
            choice = getattr(getattr(drafter, "inner", drafter), "tree_choice", None)
            if choice and choice.get("calibration"):
                return choice
        return None

    def note_for(self, name: str) -> str:
        """The drafter note of a method name without building anything (for labels before a run)."""
        if not parse_method(name).method.trained:
            return ""
        env = drafter_env(name)
        if env is not None:
            return f"from {env[1]} ({env[0]})"
        if self.tiny or not has_shipped(name):
            return UNTRAINED_NOTE
        return "trained"

    # ----- generation ---------------------------------------------------------------------------
    def check_max_new_tokens(self, max_new_tokens) -> int:
        bad = UserError(f"max_new_tokens must be a whole number, got {max_new_tokens!r}.")
        if isinstance(max_new_tokens, bool):
            raise bad
        try:
            n = int(max_new_tokens)
            if float(max_new_tokens) != n:
                raise bad
        except (TypeError, ValueError, OverflowError):
            raise bad from None
        if not 1 <= n <= self.max_new_tokens:
            raise UserError(f"max_new_tokens must be between 1 and {self.max_new_tokens}, got {n}.")
        return n

    def stream(self, method: str, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
               tli: int | None = None, plain_tps: float | None = None) -> Iterator[dict]:
        """Generate with a method name such as 'moa-tli3', yielding the run record (a JSON-able dict, updated in
        place) after every target pass. `tli` N composes the name for callers that hold MoA's N apart."""
        name = self.method_name(method, tli)
        max_new_tokens = self.check_max_new_tokens(max_new_tokens)
        try:
            sampling = SamplingConfig(float(temperature))
        except ValueError as err:
            raise UserError(str(err)) from err
        target = self.load()
        parsed = parse_method(name)
        menu = MethodName(parsed.base, lookup=parsed.lookup).name  # the menu entry: the name without its TLI N
        with self.drafter(name) as (drafter, note):
            run = {
                "method": name, "label": METHOD_LABELS.get(menu, menu),
                "tli": parsed.tli if parsed.lookup else tli_of(name), "note": note,
                "temperature": float(temperature),
                "greedy": sampling.greedy, "prompt_ids": list(prompt_ids), "token_ids": [], "pieces": [],
                "tokens": [], "events": [], "wall_time": 0.0, "stop_reason": None, "text": "", "done": False,
                "stats": generation_stats([], 0.0, plain_tps), "target": self.describe(),
                "dtype": str(target.dtype).replace("torch.", ""),
            }
            if run["tli"] is not None:
                run["label"] += f", N={run['tli']}"
            t0 = time.perf_counter()
            reason = None  # core.decoding.stop_rule's, on the last event
            for ev in generate_stream(target, drafter, list(prompt_ids), max_new_tokens, sampling, record=True):
                reason = ev.stop_reason
                d = ev.to_dict()
                run["events"].append(d)
                start = len(run["token_ids"])
                run["token_ids"].extend(int(t) for t in ev.new_tokens)
                run["tokens"].extend(tokens_from_events([d]))
                # re-decode the last token too: its text may change once the next bytes arrive
                redo = max(0, start - 1)
                run["pieces"][redo:] = token_pieces(run["token_ids"], self.decode, start=redo)
                run["wall_time"] = time.perf_counter() - t0
                run["stats"] = generation_stats(run["events"], run["wall_time"], plain_tps, self.cost_curve)
                yield run
            ids = run["token_ids"]
            run["stop_reason"] = reason
            run["text"] = self.decode(ids)
            run["done"] = True
            if name == "ar" and len(ids) >= 8:
                self.plain_tps = run["stats"]["tokens_per_s"]
                self.plain_source = "latest plain run on this machine"
            yield run

    def generate(self, method: str, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                 tli: int | None = None, plain_tps: float | None = None) -> dict:
        *_, run = self.stream(method, prompt_ids, max_new_tokens, temperature, tli, plain_tps)
        return run


def run_summary(run: dict) -> dict:
    """The public, compact form of a finished run (what the /generate API returns)."""
    st = run["stats"]
    return {
        "text": run["text"], "token_ids": run["token_ids"], "method": run["method"],
        "new_tokens": st["new_tokens"], "steps": st["steps"], "mean_accepted": round(st["tau"], 4),
        "tokens_per_s": round(st["tokens_per_s"], 3), "wall_time": round(run["wall_time"], 4),
        "accept_lengths": [len(e["new_tokens"]) for e in run["events"]], "stop_reason": run["stop_reason"],
        "drafter_note": run["note"], "speedup": None if st["speedup"] is None else round(st["speedup"], 3),
        "ideal_speedup": None if st.get("ideal_speedup") is None else round(st["ideal_speedup"], 3),
    }


def trace_for_download(run: dict) -> dict:
    """A run as a self-describing trace (the same shape as `GenerationResult.trace()`, plus the app's fields)."""
    keep = ("method", "label", "tli", "note", "temperature", "prompt_ids", "token_ids", "text", "stop_reason",
            "wall_time", "target", "dtype")
    return {**{k: run.get(k) for k in keep}, "summary": run_summary(run), "tokens": [
        {**t, "text": p} for t, p in zip(run["tokens"], run["pieces"])], "events": run["events"]}
