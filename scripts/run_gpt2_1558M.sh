#!/usr/bin/env bash
# GPT-2 1558M (d48) on 10B tokens of FineWeb-style shards, with the GPT-3 paper's hyperparameters
# for GPT-3 XL (learning rate 2e-4); scripts/lib/run_gpt2.sh has the rest. --help lists the flags.
#
#   scripts/run_gpt2_1558M.sh --data DIR --out DIR [--gpus N] [--micro-batch B] [-- trainer flags]
model=d48
run_name=gpt2_1558M
learning_rate=2e-4
micro_batch=8
source "$(dirname "$0")/lib/run_gpt2.sh"
run_gpt2 "$@"
