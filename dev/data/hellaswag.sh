#!/usr/bin/env bash
# Downloads HellaSwag's official validation set and converts it to the eval file the trainer reads
# with -h 1 (dev/data/hellaswag/hellaswag_val.bin). --input FILE converts a local copy instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
url=https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl
out=dev/data/hellaswag
usage="usage: dev/data/hellaswag.sh [--input hellaswag_val.jsonl]"
input=""
while [ $# -gt 0 ]; do
  case "$1" in
    --input)
      [ $# -ge 2 ] || { echo "error: --input needs a file: HellaSwag's hellaswag_val.jsonl" >&2; exit 1; }
      input=$2
      shift 2 ;;
    -h|--help)
      echo "$usage"
      echo "Downloads HellaSwag's validation set into $out/ (--input FILE: a local copy"
      echo "instead) and converts it to $out/hellaswag_val.bin, which the CUDA trainer reads"
      echo "with -h 1."
      exit 0 ;;
    *) echo "error: unknown argument '$1': $usage" >&2; exit 1 ;;
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
