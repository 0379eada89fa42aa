#!/usr/bin/env bash
# The prepared GPU run: every benchmark at GPU settings on one CUDA GPU, in under ~8
# minutes, each writing JSON under one folder.
#
#   scripts/gpu-bench.sh [--dry-run] [--skip STEP[,STEP...]] [OUT]
#
#   OUT        where the JSON (and each step's log) goes; default runs/gpu-bench/<UTC time>
#   --dry-run  the same steps on CPU at tiny sizes, a few seconds each (what CI runs)
#   --skip     leave these steps out (names below)
#
# Steps (each writes OUT/<step>.json and OUT/<step>.log; make-model-<size> builds the
# random-weight models first, with joynexus models make-tiny):
#   group-batching-small  grouped vs serial shared forward, bf16, small size
#   group-batching-3b     the same on a Qwen2.5-VL-3B-shaped model with random weights
#                         (--size 3b, ~3.4B parameters; tiny in a dry run)
#   lora                  mixed-adapter LoRA forward / forward+backward, bf16, small size
#   serving               one shared server vs one single-policy server per tenant (when
#                         `joynexus bench serving` exists; it runs its servers on CPU),
#                         ours with front processes (cores - 1) and without
#   canonicalize          tensor canonicalization (pixels laid out on the GPU) vs the
#                         Hugging Face processor: equality and ms per batch, every arch
#   pi0                   group batching with pi0 (shared PaliGemma prefix, per-tenant action
#                         experts), bf16, small size
# OUT/manifest.json lists every step: status, seconds, JSON file. A failed step does not
# stop the others; the script then exits 1.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

dry=0
out=""
skips=","
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --skip)
      [[ $# -ge 2 ]] || { echo "gpu-bench.sh: --skip needs STEP[,STEP...]" >&2; exit 2; }
      skips="$skips$2,"
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu-bench.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *)
      if [[ -n "$out" ]]; then echo "gpu-bench.sh: one output folder only" >&2; exit 2; fi
      out="$1"
      ;;
  esac
  shift
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$root/.venv/bin/joynexus" ]]; then
  jn="$root/.venv/bin/joynexus"
elif command -v joynexus > /dev/null; then
  jn="$(command -v joynexus)"
else
  echo "gpu-bench.sh: no joynexus (neither .venv/bin/joynexus nor one on PATH)" >&2
  exit 2
fi
out="${out:-runs/gpu-bench/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
models="$out/.models"
trap 'rm -rf "$models"' EXIT # the 3B model's files are large; the JSON is what stays

if [[ $dry -eq 1 ]]; then
  mode="dry-run"
  device="cpu"
  small="tiny"
  large="tiny" # same steps, a tiny model in place of the 3B one
  grid=(--tenants 2 --batch 1 --repeats 1 --warmup 0 --breakdown 2,1)
  large_grid=("${grid[@]}")
  lora=(--tenants 2 --ranks 8 --repeats 1 --warmup 0 --no-peft)
  serving=(--tenants 2 --clients-per-tenant 1 --duration-s 0.5 --requests 3 --size tiny
    --front-procs 1)
  canon=(--arch qwen2_5_vl --tenants 2 --repeats 1)
  pi0_grid=("${grid[@]}")
else
  mode="gpu"
  device="cuda"
  small="small"
  large="3b"
  grid=(--tenants 2,4,8,16 --batch 1,4,8 --repeats 5 --warmup 2 --breakdown 8,4)
  large_grid=(--tenants 2,4,8 --batch 1,4 --repeats 3 --warmup 1 --breakdown 8,4)
  lora=(--tenants 8 --ranks 8,32 --repeats 9 --warmup 3)
  # Ours with front processes (usable cores - 1, serve's default) and without, against
  # one baseline run; tensor canonicalization (the default) on every server.
  fronts=$(($(nproc) > 1 ? $(nproc) - 1 : 1))
  serving=(--tenants 8 --size small --duration-s 20 --front-procs "$fronts" --front-procs 0
    --canonicalizer tensor)
  canon=(--tenants 8 --repeats 20)
  pi0_grid=(--tenants 2,4,8 --batch 1,4 --repeats 5 --warmup 2 --breakdown 8,1)
  py="$(dirname "$jn")/python"
  if [[ -x "$py" ]] && ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-bench.sh: torch sees no CUDA GPU here; use --dry-run on CPU" >&2
    exit 2
  fi
fi

echo "gpu-bench ($mode): $jn, results in $out"
steps=()
failed=0

# step NAME JSON CMD...: run one step, log it, record its status and seconds.
step() {
  local name="$1" json="$2"
  shift 2
  local t0 t1 status
  t0=$(date +%s)
  echo "== $name: $*"
  if "$@" > "$out/$name.log" 2>&1; then status="ok"; else status="failed"; failed=1; fi
  t1=$(date +%s)
  echo "   $status in $((t1 - t0)) s (log: $out/$name.log)"
  if [[ $status == "failed" ]]; then tail -n 20 "$out/$name.log" >&2; fi
  [[ $json == "null" ]] || json="\"$json\""
  steps+=("{\"name\": \"$name\", \"status\": \"$status\", \"seconds\": $((t1 - t0)), \"json\": $json}")
}

want() { [[ $skips != *",$1,"* ]]; }

skip() {
  echo "== $1: skipped ($2)"
  steps+=("{\"name\": \"$1\", \"status\": \"skipped\", \"reason\": \"$2\", \"json\": null}")
}

started=$(date +%s)
# The models are built once, by the same command a user would run, and shared.
for size in $(printf '%s\n' "$small" "$large" | sort -u); do
  if ! want "make-model-$size"; then continue; fi
  step "make-model-$size" null \
    "$jn" models make-tiny --arch qwen2_5_vl --size "$size" --out "$models/qwen2_5_vl-$size"
done
grid_step() { # grid_step NAME SIZE GRID...
  local name="$1" size="$2"
  shift 2
  if ! want "$name"; then skip "$name" "--skip"; return; fi
  if [[ ! -d "$models/qwen2_5_vl-$size" ]]; then
    skip "$name" "the $size model was not built (see make-model-$size.log)"
    return
  fi
  step "$name" "$name.json" \
    "$jn" bench group-batching --device "$device" --size "$size" "$@" \
    --model-dir "$models/qwen2_5_vl-$size" --json "$out/$name.json"
}
grid_step group-batching-small "$small" "${grid[@]}"
grid_step group-batching-3b "$large" "${large_grid[@]}"

if want lora; then
  step lora lora.json \
    "$jn" bench lora --device "$device" --size "$small" "${lora[@]}" --json "$out/lora.json"
else
  skip lora "--skip"
fi

if ! want serving; then
  skip serving "--skip"
elif "$jn" bench serving --help > /dev/null 2>&1; then
  step serving serving.json "$jn" bench serving "${serving[@]}" --json "$out/serving.json"
else
  skip serving "this joynexus has no bench serving"
fi
if want canonicalize; then
  step canonicalize canonicalize.json \
    "$jn" bench canonicalize --device "$device" --size "$small" "${canon[@]}" \
    --json "$out/canonicalize.json"
else
  skip canonicalize "--skip"
fi
if want pi0; then
  # pi0: the PaliGemma prefix shared, each tenant's action expert on its own rows
  # (the model is built by the bench itself: make-tiny --arch pi0).
  step pi0 pi0.json \
    "$jn" bench group-batching --arch pi0 --device "$device" --size "$small" "${pi0_grid[@]}" \
    --json "$out/pi0.json"
else
  skip pi0 "--skip"
fi

finished=$(date +%s)
{
  echo "{"
  echo "  \"mode\": \"$mode\","
  echo "  \"device\": \"$device\","
  echo "  \"started_utc\": \"$(date -u -d "@$started" +%Y-%m-%dT%H:%M:%SZ 2> /dev/null || echo "$started")\","
  echo "  \"seconds\": $((finished - started)),"
  echo "  \"steps\": ["
  for i in "${!steps[@]}"; do
    sep=","
    [[ $i -eq $((${#steps[@]} - 1)) ]] && sep=""
    echo "    ${steps[$i]}$sep"
  done
  echo "  ]"
  echo "}"
} > "$out/manifest.json"
echo "gpu-bench ($mode): $((finished - started)) s; manifest $out/manifest.json"
exit "$failed"
