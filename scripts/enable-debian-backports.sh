#!/usr/bin/env bash
# Enables Debian's <codename>-backports suite, using the mirror this machine's own Debian apt
# source already names (so no mirror host is written into the project).
#
# Why: ManiSkill3 renders through Vulkan; on a machine without a GPU that is Mesa's software
# Vulkan driver (lavapipe), which works with SAPIEN only from Mesa 24.3 on. Debian bookworm ships
# Mesa 22.3; bookworm-backports ships a recent one.
#
# Usage: enable-debian-backports.sh         (as root: writes the source file, runs apt-get update)
#        enable-debian-backports.sh --print (prints what it would write, changes nothing)
# Idempotent: does nothing when a backports suite is already configured.
# Prints the suite name (e.g. "bookworm-backports") on stdout as its last line when enabled.
set -euo pipefail

print_only=0
if [ "${1:-}" = "--print" ]; then
  print_only=1
fi

if [ ! -r /etc/os-release ]; then
  echo "enable-debian-backports: /etc/os-release not found; not a Debian system" >&2
  exit 1
fi
# shellcheck disable=SC1091
. /etc/os-release
if [ "${ID:-}" != "debian" ] || [ -z "${VERSION_CODENAME:-}" ]; then
  echo "enable-debian-backports: this helper supports Debian only (found ID=${ID:-unknown})" >&2
  exit 1
fi
suite="${VERSION_CODENAME}-backports"

source_files=()
[ -f /etc/apt/sources.list ] && source_files+=(/etc/apt/sources.list)
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && source_files+=("$f")
done
if [ ${#source_files[@]} -eq 0 ]; then
  echo "enable-debian-backports: no apt source files found under /etc/apt" >&2
  exit 1
fi

# Already enabled (by us or by the machine's owner)?
if grep -Eq "(^|[[:space:]])${suite}([[:space:]]|$)" "${source_files[@]}" 2>/dev/null; then
  echo "$suite"
  exit 0
fi

# Find the mirror URI and keyring of the main Debian archive: the source whose suite list holds
# the bare codename. deb822 (.sources) stanzas and one-line (.list) entries are both read.
find_mirror() {
  awk -v codename="$VERSION_CODENAME" '
    function flush() {
      if (uris != "" && (" " suites " ") ~ (" " codename " ") && types ~ /(^| )deb( |$)/) {
        split(uris, u, " ")
        print u[1] "\t" signed
        found = 1
        exit
      }
      uris = ""; suites = ""; signed = ""; types = ""
    }
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[[:space:]]*$/) { flush(); next }
      if ($0 ~ /^[[:space:]]*#/) next
      line = $0
      key = line; sub(/:.*/, "", key)
      val = line; sub(/^[^:]*:[[:space:]]*/, "", val)
      if (key == "Types") types = val
      else if (key == "URIs") uris = val
      else if (key == "Suites") suites = val
      else if (key == "Signed-By") signed = val
      next
    }
    FNR == 1 { flush() }
    /^[[:space:]]*deb[[:space:]]/ {
      n = split($0, f, /[[:space:]]+/)
      i = 2
      opts = ""
      if (f[i] ~ /^\[/) {
        while (i <= n && f[i] !~ /\]$/) { opts = opts " " f[i]; i++ }
        opts = opts " " f[i]; i++
      }
      if (f[i + 1] == codename) {
        s = ""
        if (match(opts, /signed-by=[^] ]+/)) s = substr(opts, RSTART + 10, RLENGTH - 10)
        print f[i] "\t" s
        found = 1
        exit
      }
    }
    END { if (!found) flush() }
  ' "$@"
}

mirror_line="$(find_mirror "${source_files[@]}" | head -n 1)"
if [ -z "$mirror_line" ]; then
  echo "enable-debian-backports: no apt source for suite '$VERSION_CODENAME' found in" \
    "${source_files[*]}; add ${suite} to your Debian source by hand" >&2
  exit 1
fi
mirror="${mirror_line%%$'\t'*}"
signed_by="${mirror_line#*$'\t'}"

target=/etc/apt/sources.list.d/joynexus-backports.sources
content="Types: deb
URIs: ${mirror}
Suites: ${suite}
Components: main"
if [ -n "$signed_by" ]; then
  content="${content}
Signed-By: ${signed_by}"
fi

if [ "$print_only" -eq 1 ] || [ "$(id -u)" -ne 0 ]; then
  echo "To enable ${suite}, run as root:" >&2
  echo "  cat > ${target} <<'EOF'" >&2
  echo "${content}" >&2
  echo "EOF" >&2
  echo "  apt-get update" >&2
  exit 0
fi

printf '%s\n' "$content" > "$target"
DEBIAN_FRONTEND=noninteractive apt-get update -qq
echo "$suite"
