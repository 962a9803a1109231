#!/usr/bin/env bash
# GPT-2 124M (d12) on 10B tokens of FineWeb-style shards, with the GPT-3 paper's hyperparameters
# for GPT-3 Small (learning rate 6e-4); scripts/lib/run_gpt2.sh has the rest. --help lists the flags.
#
#   scripts/run_gpt2_124M.sh --data DIR --out DIR [--gpus N] [--micro-batch B] [-- trainer flags]
model=d12
run_name=gpt2_124M
learning_rate=6e-4
micro_batch=64
source "$(dirname "$0")/lib/run_gpt2.sh"
run_gpt2 "$@"
