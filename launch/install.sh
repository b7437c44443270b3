#!/bin/bash
# Installs this repo into .venv/ at the repo root: the pinned requirements.lock, the jax build
# for the hardware (the locked jax version), and the package itself (editable). The one place
# an install is written: `make install` / `make install-gpu` / `make install-tpu` call it, and
# launch/tpu.py runs it on every TPU worker.
#
#   bash launch/install.sh cpu|tpu|cuda12|cuda13
set -euo pipefail
TARGET=${1:-cpu}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."
JAX_VERSION=$(sed -n 's/^jax==//p' requirements.lock)
case "${TARGET}" in
  cpu) EXTRA=() ;;
  # gcsfs: orbax and grain reach gs:// checkpoint directories through it on TPU VMs.
  tpu) EXTRA=("jax[tpu]==${JAX_VERSION}" gcsfs
              -f https://storage.googleapis.com/jax-releases/libtpu_releases.html) ;;
  cuda12|cuda13) EXTRA=("jax[${TARGET}]==${JAX_VERSION}") ;;
  *) echo "install.sh: unknown target '${TARGET}': expected cpu, tpu, cuda12 or cuda13" >&2
     exit 2 ;;
esac
[ -x .venv/bin/python ] || "${PYTHON}" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r requirements.lock ${EXTRA[@]+"${EXTRA[@]}"}
.venv/bin/python -m pip install --quiet --no-deps -e .
