#!/usr/bin/env bash
# Downloads HellaSwag's official validation set and converts it to the eval file the trainer reads
# with -h 1 (dev/data/hellaswag/hellaswag_val.bin). --input FILE converts a local copy instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
url=https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl
out=dev/data/hellaswag
input=""
while [ $# -gt 0 ]; do
  case "$1" in
    --input) input=${2:?--input needs a file}; shift 2 ;;
    *) echo "usage: $0 [--input hellaswag_val.jsonl]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
if [ -z "$input" ]; then
  input=$out/hellaswag_val.jsonl
  if [ ! -f "$input" ]; then
    if command -v curl >/dev/null; then curl -fsSL "$url" -o "$input.tmp"; else wget -qO "$input.tmp" "$url"; fi
    mv "$input.tmp" "$input"
  fi
fi
MAKEFLAGS= make -s build/hellaswag
./build/hellaswag --input "$input" --output "$out/hellaswag_val.bin"
