#!/usr/bin/env bash
# Installs the Debian packages JoyNexus needs (simulator rendering, video codecs).
# As root it runs apt-get itself; otherwise it prints the exact command to run.
# Idempotent: packages already installed are skipped without touching apt.
set -euo pipefail

# One package a line; keep the reason next to each.
PACKAGES=(
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "JoyNexus needs these system packages; please run:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
fi
