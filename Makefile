# Each target sets itself up: a .venv at the repo root with the pinned versions of requirements.lock.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_WORKDIR ?= workdirs/demo

.PHONY: demo test analyze install clean

$(VENV)/.installed: requirements.lock setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) launch/train.py --config=configs/demo.py --workdir=$(DEMO_WORKDIR)

analyze: install
	$(PY) launch/analyze.py --workdir=$(DEMO_WORKDIR)

test: install
	$(PY) -m pytest -q -n 2  # two workers: the 2-core machines CI and users have

clean:
	rm -rf $(VENV) workdirs .pytest_cache
