#!/usr/bin/env bash
# Installs the Debian packages JoyNexus needs (simulator rendering, video codecs).
# As root it runs apt-get itself; otherwise it prints the exact command to run.
# Idempotent: packages already installed are skipped without touching apt.
set -euo pipefail

# One package a line; keep the reason next to each.
PACKAGES=(
  libegl1          # MuJoCo (MetaWorld) headless rendering: MUJOCO_GL=egl
  libegl-mesa0     # Mesa's EGL driver behind libegl1 (software rendering without a GPU)
  libopengl0       # libOpenGL: the GL entry points PyOpenGL loads on the EGL platform
  libgl1-mesa-dri  # Mesa's software rasterizer (llvmpipe)
  chromium         # dashboard browser test (playwright drives /usr/bin/chromium, headless)
)

# --- Mesa >= 24.3 for ManiSkill3 ----------------------------------------------------------
# SAPIEN (ManiSkill3's renderer) draws through Vulkan; without a GPU that is Mesa's software
# driver, which SAPIEN can use only from Mesa 24.3 on. Debian bookworm ships 22.3, so there
# the packages come from bookworm-backports, enabled on the machine's own Debian mirror by
# scripts/enable-debian-backports.sh. The GL/EGL packages move with it (one Mesa version).
MESA_MIN_VERSION=24.3
MESA_PACKAGES=(mesa-vulkan-drivers libegl-mesa0 libgl1-mesa-dri libglx-mesa0 libgbm1 libvulkan1)
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

mesa_installed_ok() {
  local v
  v="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
  [ -n "$v" ] && dpkg --compare-versions "$v" ge "$MESA_MIN_VERSION"
}

if command -v dpkg-query >/dev/null 2>&1 && ! mesa_installed_ok; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    candidate="$(apt-cache policy mesa-vulkan-drivers | awk '/Candidate:/ {print $2}')"
    target=()
    if [ -z "$candidate" ] || [ "$candidate" = "(none)" ] ||
      ! dpkg --compare-versions "$candidate" ge "$MESA_MIN_VERSION"; then
      suite="$(bash "$script_dir/enable-debian-backports.sh" | tail -n 1)"
      target=(-t "$suite")
    fi
    echo "installing Mesa >= ${MESA_MIN_VERSION} ${target[*]}: ${MESA_PACKAGES[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${target[@]}" "${MESA_PACKAGES[@]}"
  else
    echo "ManiSkill3 rendering needs Mesa >= ${MESA_MIN_VERSION} (mesa-vulkan-drivers)." >&2
    bash "$script_dir/enable-debian-backports.sh" --print || true
    echo "  sudo apt-get install -y -t <codename>-backports ${MESA_PACKAGES[*]}" >&2
  fi
fi

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
