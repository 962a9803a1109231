#!/usr/bin/env bash
# From a fresh clone: install the dependencies, download and tokenize tiny shakespeare, build the
# trainer and train GPT-2 (124M) from scratch on it, printing validation losses and samples.
# Without a GPU: the CPU dependencies only, and a tiny model with the CPU reference trainer.
# Extra arguments are passed to the trainer (./train_gpt2cu --help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  bash scripts/install_deps.sh
  bash dev/data/tinyshakespeare.sh
  make train_gpt2cu
  ./train_gpt2cu -e d12 -b 16 -t 256 -x 300 -v 50 -s 100 -l 6e-4 -u 20 -o log_quickstart "$@"
else
  echo "no GPU found: training a tiny model with the CPU reference trainer instead"
  bash scripts/install_deps.sh --cpu-only
  bash dev/data/tinyshakespeare.sh
  make train_gpt2
  ./train_gpt2 -e tiny -b 8 -t 64 -x 100 -v 25 -s 50 "$@"
fi
