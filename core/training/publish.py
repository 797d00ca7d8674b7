"""Publishing trained drafters: the model card, copying a run's checkpoint into a drafter folder, and
reading a published drafter back to continue training it (`--init-from`).

A published folder holds `config.json` (hyper-parameters, the target's fingerprint and a `training`
record that nests the records of the runs it continued), the weights (sharded under 10 MB a file) and the model card
`README.md` written from them. Training logs and curves stay in the run folder under `runs/`
(git-ignored); the card summarises the training instead.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from core.drafters.checkpoint import TrainedDrafter
from core.methods import parse_method
from core.target import Target
from core.training.distill_data import COMMITTED_RECIPE
from core.training.specs import DrafterSpec

TAU_PLACEHOLDER = "tau on the evaluation prompts: see assets/results"


def model_card(name: str, meta: dict) -> str:
    """README.md for a published drafter, from its config.json (with the `training` record)."""
    tr = meta.get("training", {})
    hw = tr.get("hardware", {})
    data = tr.get("data", {})
    held = tr.get("heldout", {})
    accs = sorted(((int(k.split("@")[1]), v) for k, v in held.items() if re.fullmatch(r"acc@\d+", k)))
    cfg = meta.get("config", {})
    hyper = {k: v for k, v in cfg.items() if k not in ("hidden_size", "vocab_size", "n_target_layers",
                                                       "target_fingerprint", "target_source", "tree_accuracy",
                                                       "tree_paths")}
    secs = tr.get("wall_time_s", 0)
    took = f"{secs / 3600:.2f} h" if secs >= 3600 else f"{secs / 60:.1f} min"
    if hw.get("gpu"):
        where = f"{hw.get('gpu_count', 1)} x {hw['gpu']}"
    else:
        where = f"{hw.get('cpu', '?')} ({hw.get('cpu_count', '?')} cores)"
    lines = [
        f"# {name} drafter for {cfg.get('target_source', 'the target')}",
        "",
        f"Method `{meta.get('method')}`, trained with `python -m core.training.train` (SpecLens).",
        f"Target fingerprint `{cfg.get('target_fingerprint')}`: loading it against another target fails.",
        "",
        "## Training",
        "",
        f"- data: `{data.get('path')}` ({data.get('train_records')} training / {data.get('heldout_records')} "
        f"held-out sequences, {data.get('train_tokens')} training tokens per epoch, max length "
        f"{data.get('max_len')}){'; recipe: `' + data['recipe'] + '`' if data.get('recipe') else ''}"
        f"{' (committed copy: `assets/distill/recipe.json`)' if _names_other_recipe(data.get('recipe')) else ''}"
        + "".join(f"; `{src['path']}`'s training records {src['repeats']}x per epoch" for src in data.get("sources", [])
                  if src["repeats"] > 1),
        f"- steps: {tr.get('steps')} of {tr.get('planned_steps')} planned, {tr.get('tokens')} tokens seen, "
        f"about {tr.get('batch_tokens')} tokens per batch",
        f"- optimiser: AdamW, lr {tr.get('lr')}, {tr.get('warmup')} warm-up steps, cosine to "
        f"{tr.get('min_lr_ratio')} x lr; seed {tr.get('seed')}",
        f"- wall time: {took} on {where}, torch {hw.get('torch')}, target in {tr.get('target_dtype')}",
    ]
    if tr.get("init_from"):
        prior, total = tr["init_from"], cumulative_training(tr)
        at = f" at commit {prior['commit'][:10]}" if prior.get("commit") else ""
        lines.append(f"- continued from `{prior.get('path')}`{at} (an earlier run of {prior.get('steps')} steps, "
                     f"{prior.get('tokens')} tokens, {prior.get('wall_time_s', 0) / 3600:.2f} h; its own recipe is "
                     f"under `training.init_from` in config.json); in all: {total['steps']} steps, "
                     f"{total['tokens']} tokens, {total['wall_time_s'] / 3600:.2f} h")
        for k, (was, now) in prior.get("grown", {}).items():
            lines.append(f"- grown at the start of this run: `{k}` {was} -> {now} (the new layers start as the "
                         "identity, so step 0 computes what the earlier run's drafter did)")
    if tr.get("joint_with"):
        lines.append(f"- trained jointly (same batches, same steps) with: {', '.join(tr['joint_with'])}")
    if not tr.get("complete", True):
        lines.append("- **incomplete**: training stopped before the planned number of steps")
    lines += ["", "## Held-out accuracy", ""]
    if accs:
        lines += ["Top-1 accuracy by draft position (teacher-forced on the held-out split; `acc@k` as the "
                  "method's training_loss defines it):", "",
                  "| position | " + " | ".join(str(k) for k, _ in accs) + " |",
                  "| --- | " + " | ".join("---" for _ in accs) + " |",
                  "| acc | " + " | ".join(f"{v:.3f}" for _, v in accs) + " |", ""]
    if "loss" in held:
        lines += [f"Held-out loss: {held['loss']:.4f}", ""]
    if cfg.get("tree_paths"):
        fitted = "fitted to the measured held-out top-k accuracies" if cfg.get("tree_accuracy") else "the prior tree"
        lines += [f"Static draft tree: {len(cfg['tree_paths'])} nodes, depth "
                  f"{max(len(p) for p in cfg['tree_paths'])}, {fitted} (`tree_paths` in config.json).", ""]
    lines += [TAU_PLACEHOLDER, "", "## Hyper-parameters", "", "```json", json.dumps(hyper, indent=1), "```", "",
              "Files: `config.json` (hyper-parameters, target fingerprint, the `training` record summarised above), "
              "the weights (bfloat16: `model.safetensors`, or shards under 10 MB each with "
              "`model.safetensors.index.json`). The training log and curves stay in the run folder under `runs/` "
              "(`log.jsonl`, `curves.html`).", ""]
    return "\n".join(lines)


def _runs(record: dict):
    """A training record, then each run it continued from (training.init_from.training, recursively)."""
    while record:
        yield record
        record = (record.get("init_from") or {}).get("training") or {}


def cumulative_training(record: dict) -> dict[str, float]:
    """Steps, tokens and wall time of a training record plus every run it continued from."""
    return {k: sum(r.get(k, 0) or 0 for r in _runs(record)) for k in ("steps", "tokens", "wall_time_s")}


def _names_other_recipe(path: str | None) -> bool:
    """Whether a card should also point at the committed recipe (it exists and the data's recipe is not committed)."""
    assets = COMMITTED_RECIPE.parents[1]
    return COMMITTED_RECIPE.exists() and not (path and assets in Path(path).resolve().parents)


def publish(run_folder: str | Path, dest: str | Path, name: str) -> Path:
    """Copy final/ (config.json and its weight files, single or sharded) and a model card into `dest`, replacing
    what was there.

    The run's log.jsonl and curves.html stay in the run folder; logs or curves an older version of this
    function left in `dest` are removed, so a drafter folder holds the weights, the config and the card only."""
    run_folder, dest = Path(run_folder), Path(dest)
    final = run_folder / "final"
    meta = json.loads((final / "config.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    from core.drafters.checkpoint import WEIGHTS_FILE, WEIGHTS_INDEX, weight_files

    for old in [*dest.glob("model-*-of-*.safetensors"), dest / WEIGHTS_INDEX, dest / WEIGHTS_FILE]:
        old.unlink(missing_ok=True)
    index = [final / WEIGHTS_INDEX] if (final / WEIGHTS_INDEX).is_file() else []
    for f in [final / "config.json", *weight_files(final), *index]:
        shutil.copy2(f, dest / f.name)
    for stale in [*dest.glob("log*.jsonl"), *dest.glob("curves*.html")]:
        stale.unlink()
    (dest / "README.md").write_text(model_card(name, meta))
    return dest


def published_folder(root: str | Path, name: str, single: bool) -> Path:
    """<root>/<name> when it holds a checkpoint; <root> itself when training a single drafter."""
    root = Path(root)
    if (root / name / "config.json").is_file():
        return root / name
    try:
        base = parse_method(name).base_checkpoint  # a variant (moa@narrow) continues its base
    except ValueError:  # a drafter class outside the method table has no variants
        base = name
    if base != name and (root / base / "config.json").is_file():
        return root / base
    if single and (root / "config.json").is_file():
        return root
    raise FileNotFoundError(f"--init-from {root}: no published {name} drafter there "
                            f"(expected {root / name}/config.json)")


def init_from_published(spec: DrafterSpec, target: Target, root: str | Path, single: bool) -> TrainedDrafter:
    """A published drafter to continue training: its weights, drafting vocabulary and feature scale.

    The hyper-parameters asked for must be the ones it was built with, except that a drafter's `growable`
    ones may be raised (`TrainedDrafter.grow`: new layers start as the identity, recorded as `grown`);
    `checkpoint.TARGET_FIELDS` are filled from the target either way.
    """
    from core.drafters.checkpoint import TARGET_FIELDS

    folder = published_folder(root, spec.name, single)
    model = spec.cls.from_pretrained(folder, target)
    have = model.config.to_json()
    clash = {k: (v, have.get(k)) for k, v in spec.hyper.items()
             if k not in TARGET_FIELDS and k in have and json.dumps(v) != json.dumps(have[k])}
    grown = {k: [had, asked] for k, (asked, had) in clash.items()
             if k in spec.cls.growable and isinstance(asked, int) and isinstance(had, int) and asked > had}
    if grown:
        model.grow(**{k: new for k, (_, new) in grown.items()})
        clash = {k: v for k, v in clash.items() if k not in grown}
    # training-only settings (e.g. MoA's period range) may change freely; a changed `rebuilt` field
    # rebuilds the parts it shapes from scratch while every other tensor keeps its published value
    changed = {k: list(v[::-1]) for k, v in clash.items() if k in getattr(spec.cls, "training_only", ())}
    rebuilt_fields = getattr(spec.cls, "rebuilt", {})
    rebuilt = {k: list(v[::-1]) for k, v in clash.items() if k in rebuilt_fields}
    clash = {k: v for k, v in clash.items() if k not in changed and k not in rebuilt}
    if clash:
        said = ", ".join(f"{k}={a!r} asked, {b!r} there" for k, (a, b) in clash.items())
        raise ValueError(f"--init-from {folder}: the published {spec.name} drafter was built with other "
                         f"hyper-parameters: {said}")
    if changed or rebuilt:
        meta = model.checkpoint_meta
        hyper = {k: v for k, v in have.items() if k not in TARGET_FIELDS}
        fresh = spec.cls.random(target, seed=0, **{**hyper, **spec.hyper})
        prefixes = tuple(p for k in rebuilt for p in rebuilt_fields[k])
        kept = {k: v for k, v in model.state_dict().items() if not k.startswith(prefixes)}
        missing, unexpected = fresh.load_state_dict(kept, strict=False)
        if unexpected or any(not k.startswith(prefixes) for k in missing):
            raise ValueError(f"--init-from {folder}: cannot carry the published weights over "
                             f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
        fresh.checkpoint_meta = meta
        model = fresh.to(device=target.device, dtype=target.dtype)
        model.fresh_prefixes = prefixes  # the parts built afresh (TrainConfig.new_param_lr_mult)
    prior = model.checkpoint_meta.get("training", {})
    model.init_record = {"path": str(folder), "commit": _last_commit(folder),
                         "steps": prior.get("steps", 0), "tokens": prior.get("tokens", 0),
                         "wall_time_s": prior.get("wall_time_s", 0.0), "training": prior,
                         **({"grown": grown} if grown else {}), **({"changed": changed} if changed else {}),
                         **({"rebuilt": rebuilt} if rebuilt else {})}
    return model


def _last_commit(folder: Path) -> str | None:
    """The git commit that last changed `folder` (None outside a git checkout or with uncommitted changes)."""
    import subprocess

    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], capture_output=True, text=True,
                               cwd=folder, timeout=10)  # "." : a relative `folder` would be read from inside itself
        if dirty.returncode or dirty.stdout.strip():
            return None
        out = subprocess.run(["git", "log", "-1", "--format=%H", "--", "."], capture_output=True, text=True,
                             cwd=folder, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
