# Each target sets itself up: a .venv at the repo root with the pinned versions of requirements.lock.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_WORKDIR ?= workdirs/demo

.PHONY: demo test analyze install install-gpu install-tpu clean

CUDA ?= 13  # CUDA major version of the GPU jax build; current H100/H200 drivers run CUDA 13.

$(VENV)/.installed: requirements.lock setup.py launch/install.sh
	PYTHON=$(PYTHON) bash launch/install.sh cpu
	touch $@

install: $(VENV)/.installed

# The lock plus the CUDA (or TPU) build of the locked jax version; `make test` stays on CPU.
install-gpu: $(VENV)/.installed
	PYTHON=$(PYTHON) bash launch/install.sh cuda$(strip $(CUDA))

install-tpu: $(VENV)/.installed
	PYTHON=$(PYTHON) bash launch/install.sh tpu

demo: install
	$(PY) launch/train.py --config=configs/demo.py --workdir=$(DEMO_WORKDIR)

analyze: install
	$(PY) launch/analyze.py --workdir=$(DEMO_WORKDIR)

test: install
	$(PY) -m pytest -q -n 2  # two workers: the 2-core machines CI and users have

clean:
	rm -rf $(VENV) workdirs .pytest_cache
