#!/usr/bin/env bash
# Installs the Python packages that cannot be plain entries of pyproject.toml's extras.
# Run after `pip install -e '.[dev,sim]'` (the Makefile does), with the venv's python:
#   bash scripts/install-python-extras.sh [PYTHON]
# Idempotent: packages already present at the wanted version are skipped.
set -euo pipefail

PY="${1:-${PYTHON:-.venv/bin/python}}"
if ! "$PY" -c 'import sys' 2>/dev/null; then
  echo "install-python-extras: no usable python at '$PY'" >&2
  exit 1
fi

installed_version() {
  "$PY" -c 'import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass' "$1"
}

# hf-libero (LIBERO benchmark) declares robomimic, wandb and others as dependencies; through
# robomimic's torchvision they pull a CUDA build of torch. The env adapter needs none of
# them: its real dependencies (robosuite 1.4.0, bddl, ...) are in the `sim` extra.
HF_LIBERO_VERSION=0.1.4
if [ "$(installed_version hf-libero)" != "$HF_LIBERO_VERSION" ]; then
  echo "installing hf-libero ${HF_LIBERO_VERSION} (without its declared dependencies)"
  "$PY" -m pip install --quiet --no-deps "hf-libero==${HF_LIBERO_VERSION}"
fi
