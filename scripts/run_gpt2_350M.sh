#!/usr/bin/env bash
# GPT-2 350M (d24) on 10B tokens of FineWeb-style shards, with the GPT-3 paper's hyperparameters
# for GPT-3 Medium (learning rate 3e-4); scripts/lib/run_gpt2.sh has the rest. --help lists the flags.
#
#   scripts/run_gpt2_350M.sh --data DIR --out DIR [--gpus N] [--micro-batch B] [-- trainer flags]
model=d24
run_name=gpt2_350M
learning_rate=3e-4
micro_batch=32
source "$(dirname "$0")/lib/run_gpt2.sh"
run_gpt2 "$@"
