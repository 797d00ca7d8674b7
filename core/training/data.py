"""Training data for the trainer: sequences, packing into batches, the held-out subset, loading `--data`.

* Sequences are prompt_ids + answer_ids cut to `--max-len`; loss_mask marks answer tokens.
  When a prompt leaves less than half the window to its answer, the prompt loses tokens
  from its *start* instead (the target's activations are computed on the cut sequence, so
  the training pairs stay exact; only the context is shorter).
* Batches: per epoch a seeded permutation, cut into windows of 512 sequences, each window
  sorted by length and packed greedily (rows x longest row <= batch tokens), then the
  batches shuffled. The order depends only on (seed, epoch): the data cursor is
  (epoch, batch index).
* The held-out subset is the first `--eval-tokens` tokens of a seeded shuffle of the
  `split == "heldout"` records, the same whatever the training seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.drafters.base import TargetNeeds
from core.drafters.checkpoint import TrainBatch
from core.target import Target

PACK_WINDOW = 512
EVAL_SHUFFLE_SEED = 0  # the held-out subset is the same whatever the training seed


@dataclass
class Sequences:
    """Token sequences (prompt + answer, cut to max_len) and where each answer starts."""

    ids: list[np.ndarray]
    answer_start: np.ndarray
    cut_prompts: int = 0  # how many prompts lost tokens from their start

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)


def make_sequences(records: list[dict], max_len: int) -> Sequences:
    """prompt + answer per record; records without answer tokens are skipped (module docstring for the cut)."""
    ids, starts, cut = [], [], 0
    for r in records:
        prompt, answer = list(r["prompt_ids"]), list(r["answer_ids"])
        if not answer:
            continue
        n_ans = min(len(answer), max(max_len - len(prompt), max_len // 2))
        n_prompt = min(len(prompt), max_len - n_ans)
        if n_prompt < len(prompt):
            cut += 1
        seq = prompt[len(prompt) - n_prompt:] + answer[:n_ans]
        ids.append(np.asarray(seq, dtype=np.int64))
        starts.append(n_prompt)
    return Sequences(ids, np.asarray(starts, dtype=np.int64), cut)


def pack(order: np.ndarray, lengths: np.ndarray, batch_tokens: int, window: int = PACK_WINDOW) -> list[list[int]]:
    """Batches of sequence indices: windows of `order` sorted by length, packed while rows x longest <= budget."""
    batches = []
    for s in range(0, len(order), window):
        chunk = sorted(order[s:s + window].tolist(), key=lambda i: (-int(lengths[i]), i))
        cur: list[int] = []
        for i in chunk:
            longest = int(lengths[cur[0]]) if cur else int(lengths[i])
            if cur and (len(cur) + 1) * longest > batch_tokens:
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
    return batches


def epoch_batches(lengths: np.ndarray, seed: int, epoch: int, batch_tokens: int) -> list[list[int]]:
    """The batches of one epoch: a function of (seed, epoch) only."""
    rng = np.random.default_rng([seed, epoch])
    batches = pack(rng.permutation(len(lengths)), lengths, batch_tokens)
    return [batches[i] for i in rng.permutation(len(batches))]


class DataStream:
    """Endless deterministic batches over the training sequences, with a resumable cursor."""

    def __init__(self, seqs: Sequences, seed: int, batch_tokens: int) -> None:
        if len(seqs) == 0:
            raise ValueError("no training sequences (records with split != 'heldout' and a non-empty answer)")
        self.seqs, self.seed, self.batch_tokens = seqs, seed, batch_tokens
        self.lengths = seqs.lengths
        self.epoch, self.index = 0, 0
        self._batches: list[list[int]] | None = None

    def _epoch(self) -> list[list[int]]:
        if self._batches is None:
            self._batches = epoch_batches(self.lengths, self.seed, self.epoch, self.batch_tokens)
        return self._batches

    def next(self) -> list[int]:
        batches = self._epoch()
        if self.index >= len(batches):
            self.epoch, self.index, self._batches = self.epoch + 1, 0, None
            batches = self._epoch()
        out = batches[self.index]
        self.index += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index, self._batches = int(state["epoch"]), int(state["index"]), None


def collate(seqs: Sequences, idx: list[int], device: torch.device, pad_id: int = 0):
    """Right-padded input_ids [B, T], loss_mask [B, T] (answer tokens) and attention_mask [B, T] (bool)."""
    t = max(len(seqs.ids[i]) for i in idx)
    ids = torch.full((len(idx), t), pad_id, dtype=torch.long)
    loss = torch.zeros(len(idx), t, dtype=torch.bool)
    attn = torch.zeros(len(idx), t, dtype=torch.bool)
    for row, i in enumerate(idx):
        s = seqs.ids[i]
        ids[row, :len(s)] = torch.from_numpy(s)
        attn[row, :len(s)] = True
        loss[row, int(seqs.answer_start[i]):len(s)] = True
    return ids.to(device), loss.to(device), attn.to(device)


def target_batch(target: Target, needs: TargetNeeds, ids, loss_mask, attn) -> TrainBatch:
    """Run the frozen target once. Right padding: real tokens never see pads under the causal mask."""
    out = target.forward(ids, hidden_layers=needs.hidden_layers, return_layer_kv=needs.layer_kv,
                         return_logits=False)
    return TrainBatch(input_ids=ids, loss_mask=loss_mask, attention_mask=attn, hidden=out.hidden,
                      layer_kv=out.layer_kv, target=target)


def eval_subset(seqs: Sequences, max_tokens: int, batch_tokens: int) -> list[list[int]]:
    """A fixed held-out subset (seeded shuffle, first `max_tokens` tokens), packed by length."""
    if len(seqs) == 0:
        return []
    order = np.random.default_rng(EVAL_SHUFFLE_SEED).permutation(len(seqs))
    lengths = seqs.lengths
    keep, total = [], 0
    for i in order:
        if keep and total + lengths[i] > max_tokens:
            break
        keep.append(int(i))
        total += int(lengths[i])
    return pack(np.array(keep), lengths, batch_tokens, window=len(keep))


def data_sources(spec: str | Path) -> list[tuple[str, int]]:
    """`--data` as (path, repeats): "A" or "A,B*3" (B's training records three times per epoch)."""
    sources = []
    for part in str(spec).split(","):
        path, _, times = part.strip().partition("*")
        if not path:
            raise ValueError(f"--data {spec!r}: an empty source")
        try:
            repeats = int(times) if times else 1
        except ValueError:
            raise ValueError(f"--data {spec!r}: the repeat count after '*' must be an integer") from None
        if repeats < 1:
            raise ValueError(f"--data {spec!r}: a repeat count must be at least 1")
        sources.append((path, repeats))
    return sources


def load_records(spec: str | Path) -> list[dict]:
    """Records of every `--data` source; a source's training records repeated by its count, held-out once.

    Repeating a source over-samples fresh data against data the drafters have already seen many
    times (the trainer's epochs then cover it that many times as often)."""
    from core.training.distill_data import load_distill

    records = []
    for path, repeats in data_sources(spec):
        found = load_distill(path)
        records += found
        records += [r for r in found if r.get("split") != "heldout"] * (repeats - 1)
    return records
