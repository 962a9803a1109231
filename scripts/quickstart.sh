#!/usr/bin/env bash
# From a fresh clone: install the dependencies (apt-get), prepare tiny shakespeare, build the
# trainer and train on it, printing validation losses and samples. With a GPU it trains GPT-2
# 124M (d12) for 300 steps with the CUDA trainer, its log and checkpoint in log_quickstart/;
# without one it installs the CPU dependencies only and trains the tiny model (minutes on a few
# cores) with the CPU reference trainer, its log and checkpoint in log_cpu/. Either log plots with
# python3 dev/plot_log.py LOG_DIR -o LOG_DIR/plot.png.
#
# usage: scripts/quickstart.sh [--input FILE] [--dry-run] [TRAINER FLAGS...]
#   --input FILE    a local copy of tiny shakespeare's input.txt (default: download it)
#   --dry-run       print the commands it would run, one a line, and run none
#   -h, --help      this help
# The other arguments go to the trainer (./train_gpt2cu --help, ./train_gpt2 --help list them).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"
input=()
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --input)
      [ $# -ge 2 ] || { echo "error: --input needs a file: tiny shakespeare's input.txt" >&2; exit 1; }
      [ -r "$2" ] || { echo "error: --input $2: no such readable file" >&2; exit 1; }
      input=(--input "$2")
      shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    *) break ;;
  esac
done

step() {  # step COMMAND...: runs it, or with --dry-run prints it
  if [ $dry_run -eq 1 ]; then
    printf '%q' "$1"
    printf ' %q' "${@:2}"
    echo
  else
    "$@"
  fi
}

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  step bash scripts/install_deps.sh
  step bash dev/data/tinyshakespeare.sh ${input[@]+"${input[@]}"}
  step make train_gpt2cu
  step ./train_gpt2cu -e d12 -b 16 -t 256 -x 300 -v 50 -s 100 -l 6e-4 -u 20 -o log_quickstart "$@"
else
  echo "no GPU found: training the tiny model with the CPU reference trainer instead"
  step bash scripts/install_deps.sh --cpu-only
  step bash dev/data/tinyshakespeare.sh ${input[@]+"${input[@]}"}
  step make train_gpt2
  step ./train_gpt2 -e tiny -b 8 -t 64 -x 100 -v 25 -s 50 -o log_cpu "$@"
fi
