#!/bin/bash
# Installs this repo into .venv/ at the repo root: the pinned lock, the jax build for the
# hardware (the locked jax version), and the package itself (editable). The one place an
# install is written: `make install` / `make install-gpu` / `make install-tpu` / `make test-next`
# call it, and launch/tpu.py runs it on every TPU worker.
#
#   bash launch/install.sh cpu|tpu|cuda12|cuda13
#
# The lock follows the venv's Python: requirements.lock (3.11, jax 0.10) or, from 3.12,
# requirements-next.lock (jax 0.11, current CUDA images' jax, under which the first lock's flax
# fails to import). VENV= and LOCK= override the venv and the lock.
set -euo pipefail
TARGET=${1:-cpu}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
cd "$(dirname "$0")/.."
case "${TARGET}" in
  cpu|tpu|cuda12|cuda13) ;;
  *) echo "install.sh: unknown target '${TARGET}': expected cpu, tpu, cuda12 or cuda13" >&2
     exit 2 ;;
esac
[ -x "${VENV}/bin/python" ] || "${PYTHON}" -m venv "${VENV}"
LOCK=${LOCK:-$("${VENV}/bin/python" -c 'import sys
print("requirements-next.lock" if sys.version_info >= (3, 12) else "requirements.lock")')}
JAX_VERSION=$(sed -n 's/^jax==//p' "${LOCK}")
case "${TARGET}" in
  cpu) EXTRA=() ;;
  # gcsfs: orbax and grain reach gs:// checkpoint directories through it on TPU VMs.
  tpu) EXTRA=("jax[tpu]==${JAX_VERSION}" gcsfs
              -f https://storage.googleapis.com/jax-releases/libtpu_releases.html) ;;
  cuda12|cuda13) EXTRA=("jax[${TARGET}]==${JAX_VERSION}") ;;
esac
"${VENV}/bin/python" -m pip install --quiet --upgrade pip
"${VENV}/bin/python" -m pip install --quiet -r "${LOCK}" ${EXTRA[@]+"${EXTRA[@]}"}
"${VENV}/bin/python" -m pip install --quiet --no-deps -e .
