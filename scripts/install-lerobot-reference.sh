#!/usr/bin/env bash
# Builds the LeRobot reference environment: today's lerobot (0.6.1, Python >= 3.12) in a
# minimal Debian trixie root, the one the interop tests compare JoyNexus against.
#   bash scripts/install-lerobot-reference.sh
# The project's machines run Python 3.11 and the registries serve no newer CPython
# build for it; Debian trixie's python3.13 is a registry package, so the environment is
# a debootstrapped trixie root with a venv inside, entered with chroot in a private
# mount namespace (joynexus.interop.reference runs scripts in it).
#
# Idempotent and cached: the root lives outside the checkout, in
# $JOYNEXUS_LEROBOT_REFERENCE (default ~/.cache/joynexus/lerobot-reference), and a
# second run whose recipe is unchanged does nothing. Needs root (CI runs as root);
# otherwise it says so and leaves the tests to fail with that reason.
#
# Mounts: /proc, /dev and the CA bundle are mounted into the root ONLY inside
# `unshare -m` (a private mount namespace that ends with the command), never on the
# machine: a bind mount of /dev left in a folder that is later deleted would delete the
# machine's device nodes.
set -euo pipefail

LEROBOT_VERSION=0.6.1
SUITE=trixie
PYTHON=python3.13
VENV=/opt/lerobot
# What lerobot's SmolVLA / pi0 / pi05 need (transformers 5.x, scipy, accelerate...), and
# its datasets (LeRobotDataset: datasets, pandas, pyarrow, PyAV).
REQUIREMENT="lerobot[smolvla,pi,dataset]==${LEROBOT_VERSION}"
# Bump when the recipe changes: a root built by another recipe is rebuilt (one of the
# same base whose requirement alone changed is updated in place, below).
BASE="1 ${SUITE} ${PYTHON}"
RECIPE="${BASE} ${REQUIREMENT}"

ROOT="${JOYNEXUS_LEROBOT_REFERENCE:-${HOME:-/root}/.cache/joynexus/lerobot-reference}"
STAMP="$ROOT/.joynexus-reference"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$RECIPE" ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-lerobot-reference: building $ROOT needs root (debootstrap, chroot);" \
    "run 'sudo bash scripts/install-lerobot-reference.sh'" >&2
  exit 1
fi

# The Debian mirror this machine's apt sources already name (deb822 'URIs:' or one-line
# 'deb URI suite'), the first that serves the main archive (not -security).
debian_mirror() {
  local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list)
  local f
  for f in "${files[@]}"; do
    [ -f "$f" ] || continue
    awk '
      /^[[:space:]]*#/ { next }
      /^URIs:/ { for (i = 2; i <= NF; i++) print $i; next }
      /^deb[[:space:]]/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { print $i; break } }
    ' "$f"
  done | grep -E '/debian/?$' | grep -v -- '-security' | head -n 1
}

# No mount under $1 may outlive a command; refuse to delete a folder that holds one.
safe_remove() {
  local dir="$1"
  [ -e "$dir" ] || return 0
  if awk -v d="$(realpath "$dir")/" '{ if (index($2 "/", d) == 1) found = 1 } END { exit !found }' \
      /proc/self/mounts; then
    echo "install-lerobot-reference: $dir has something mounted under it; not deleting it" >&2
    exit 1
  fi
  rm -rf "$dir"
}

# Runs "$@" chrooted into $1 with /proc, /dev (only null, zero, random, urandom, a
# tmpfs shm) and the CA bundle mounted in a private mount namespace.
in_root() {
  local root="$1"
  shift
  unshare -m --propagation private --fork bash -euc '
    root="$1"; shift
    mount -t proc proc "$root/proc"
    mount -t tmpfs -o mode=755 tmpfs "$root/dev"
    for node in null zero random urandom; do
      touch "$root/dev/$node"
      mount --bind "/dev/$node" "$root/dev/$node"
    done
    mkdir -p "$root/dev/shm"
    mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
    exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin \
      LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/joynexus-host-ca.crt \
      SSL_CERT_FILE=/etc/ssl/certs/joynexus-host-ca.crt \
      REQUESTS_CA_BUNDLE=/etc/ssl/certs/joynexus-host-ca.crt \
      PIP_DEFAULT_TIMEOUT=180 PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
  ' in_root "$root" "$@"
}

# A root of the same Debian and Python whose lerobot requirement changed (an extra
# added) is updated in place by pip, not rebuilt; its stamp changes last, so an
# interrupted update is retried.
if [ -f "$STAMP" ] && [ "$(cut -d' ' -f1-3 "$STAMP")" = "$BASE" ]; then
  start=$(date +%s)
  echo "updating the LeRobot reference environment ${ROOT} to ${REQUIREMENT}"
  in_root "$ROOT" "$VENV/bin/python" -m pip install --quiet "$REQUIREMENT"
  rm -rf "$ROOT/root/.cache/pip"
  in_root "$ROOT" "$VENV/bin/python" -c 'import lerobot.datasets.lerobot_dataset'
  echo "$RECIPE" >"$STAMP"
  echo "LeRobot reference environment updated in $(($(date +%s) - start)) s: ${ROOT}"
  exit 0
fi

start=$(date +%s)
echo "building the LeRobot reference environment ${ROOT} (${REQUIREMENT}, Debian ${SUITE})"
if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
mirror="$(debian_mirror)"
if [ -z "$mirror" ]; then
  echo "install-lerobot-reference: no Debian mirror found in /etc/apt/sources*" >&2
  exit 1
fi

# Built beside its final place and renamed at the end: an interrupted build never
# leaves a root that looks ready.
partial="${ROOT}.partial"
safe_remove "$partial"
mkdir -p "$(dirname "$ROOT")"
# In its own mount namespace too: debootstrap mounts /proc (and, in a container, binds
# /dev nodes) into the target while it works; none of that may reach the machine.
unshare -m --propagation private --fork \
  debootstrap --variant=minbase --include="${PYTHON},${PYTHON}-venv,python3-pip,ca-certificates" \
  "$SUITE" "$partial" "$mirror" >"${partial}.log" 2>&1 || {
  tail -n 20 "${partial}.log" >&2
  echo "install-lerobot-reference: debootstrap of ${SUITE} from the machine's mirror failed" >&2
  exit 1
}
rm -f "${partial}.log"
# The machine's CA bundle and resolver: pip inside reaches the registry as pip here does.
ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
cp "$ca" "$partial/etc/ssl/certs/joynexus-host-ca.crt"
cp -L /etc/resolv.conf "$partial/etc/resolv.conf" 2>/dev/null || true
in_root "$partial" "/usr/bin/${PYTHON}" -m venv "$VENV"
in_root "$partial" "$VENV/bin/python" -m pip install --quiet --upgrade pip
in_root "$partial" "$VENV/bin/python" -m pip install --quiet "$REQUIREMENT"
# Nothing is fetched at run time: apt's and pip's downloads are not kept.
rm -rf "$partial/var/cache/apt/archives/"*.deb "$partial/root/.cache/pip"
in_root "$partial" "$VENV/bin/python" -c \
  'import lerobot.policies.smolvla.modeling_smolvla, lerobot.policies.pi05.modeling_pi05
import lerobot.datasets.lerobot_dataset'
echo "$RECIPE" >"$partial/.joynexus-reference"
safe_remove "$ROOT"
mv "$partial" "$ROOT"
echo "LeRobot reference environment ready in $(($(date +%s) - start)) s: ${ROOT}" \
  "($(du -sh "$ROOT" | cut -f1))"
