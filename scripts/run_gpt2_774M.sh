#!/usr/bin/env bash
# GPT-2 774M (d36) on 10B tokens of FineWeb-style shards, with the GPT-3 paper's hyperparameters
# for GPT-3 Large (learning rate 2.5e-4); scripts/lib/run_gpt2.sh has the rest. --help lists the flags.
#
#   scripts/run_gpt2_774M.sh --data DIR --out DIR [--gpus N] [--micro-batch B] [-- trainer flags]
model=d36
run_name=gpt2_774M
learning_rate=2.5e-4
micro_batch=16
source "$(dirname "$0")/lib/run_gpt2.sh"
run_gpt2 "$@"
