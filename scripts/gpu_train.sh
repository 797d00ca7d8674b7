#!/usr/bin/env bash
# `make gpu-train`: one MoA training burst that fits a 10-minute call on a lent GPU (H100/H200), then its weights
# in files under 16 MB, ready to come back from the device machine ($OUT there) and to be probed and benchmarked here.
#
# The recipe is the reference's (core/drafters/moa.py: full-width LSA, memory norm, MLP after CA, own-row reads,
# N(0, 0.02) init, per-sequence staircase over the first half) plus the memory read (`memory_loss`, which raised the
# memory's R^2 sixfold in 400 CPU steps: docs/RESULTS.md), trained from random weights, or continued from
# GPU_INIT (a checkpoint folder, e.g. one an earlier burst brought back, committed or carried) with its curriculum
# counted over the earlier steps. A stopped burst resumes from its run folder when rerun on the same machine.
#   GPU_DEVICE=cpu GPU_DTYPE=float32 GPU_MIN=1 GPU_BATCH_TOKENS=1024 GPU_EVAL_TOKENS=1024 bash scripts/gpu_train.sh
set -euo pipefail
PY=${PY:-.venv/bin/python}
RUN=${GPU_RUN:-runs/gpu-moa}
MINUTES=${GPU_MIN:-8}               # training + evaluation + export inside one 10-minute call
DEVICE=${GPU_DEVICE:-auto}
BATCH=${GPU_BATCH_TOKENS:-16384}     # tokens per optimiser step: the GPU's parallelism, 16x the CPU runs'
DTYPE=${GPU_DTYPE:-bfloat16}
AUTOCAST=$([ "$DTYPE" = float32 ] && echo off || echo on)
INIT=${GPU_INIT:-}
args=(--drafter moa --data assets/distill_v5/distill.npz --out "$RUN" --steps auto --time-budget-min "$MINUTES"
      --batch-tokens "$BATCH" --max-len 512 --lr 1e-3 --warmup 50 --seed 48 --dtype "$DTYPE" --autocast "$AUTOCAST"
      --eval-every 1000000 --eval-tokens 8192 --final-eval-tokens "${GPU_EVAL_TOKENS:-32768}" --device "$DEVICE"
      --no-progress
      --hyper draft_vocab_size=8192 --hyper feature_scale=24 --hyper ce_weight=1.0 --hyper lsa_mlp_ratio=2
      --hyper memory_loss=1)
[ -n "$INIT" ] && args+=(--init-from "$INIT")
# more trainer options, e.g. GPU_TRAIN_ARGS="--param-lr-mult ca.q_proj=10 --param-lr-mult ca.k_proj=10"
read -r -a extra <<< "${GPU_TRAIN_ARGS:-}"
args+=("${extra[@]}")
"$PY" -m core.training.train "${args[@]}"
# what comes back: the final checkpoint (sharded under 10 MB a file by save_pretrained), its log and the state of
# the run's last evaluation; the optimiser state (train_state.pt) is too large to bring back and stays there
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/gpu-moa"
  cp -r "$RUN/final" "$OUT/gpu-moa/final"
  cp "$RUN/log.jsonl" "$OUT/gpu-moa/"
  find "$OUT" -type f -size +16M -print -delete | sed 's/^/too large to bring back, left out: /'
fi
echo "gpu-train: done ($RUN/final)"
