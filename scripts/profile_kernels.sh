#!/usr/bin/env bash
# Per-kernel time table of one training step: runs profile_gpt2cu under ncu (one metric, the
# kernel's duration, clocks left as they are), keeps the raw CSV in OUTDIR and prints the kernels
# grouped by name, slowest first, with their share of the step. With --memory ncu also collects
# each kernel's DRAM and L2 bytes and its tensor pipe's activity (replaying every kernel, so the
# profile takes several times longer), and the table shows them: what to set against a kernel's
# floor. Two modes side by side: profile each into its own OUTDIR, then
# dev/cuda/kernel_table.py A/kernels.csv B/kernels.csv --labels A,B.
# With --step N it profiles step N of a training run of train_gpt2cu instead (its flags follow, -x
# among them; the run marks that step with -pk N): a recipe's step as it trains, on its data, in its
# stage (one step of each stage of -recipe record89: three runs, each naming a step of its stage).
# usage: scripts/profile_kernels.sh OUTDIR [--memory] [profile_gpt2cu flags: -b B -t T -e preset
#                                           -l layers -fp8 1|2 -recipe NAME -aw N -fh 0|1 -i SHARDS
#                                           -f89 PARTS]
#        scripts/profile_kernels.sh OUTDIR [--memory] --step N train_gpt2cu flags...
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"
fail() {
  echo "error: $*" >&2
  exit 1
}
[ $# -ge 1 ] && [ "${1:0:1}" != - ] ||
  fail "usage: scripts/profile_kernels.sh OUTDIR [--memory] [-b B] [-t T] [-e preset] [-l layers] [-fp8 1|2] [-recipe NAME] [-aw N] [-fh 0|1] [-i SHARDS] [-f89 PARTS], or OUTDIR [--memory] --step N train_gpt2cu flags"
out=$1
shift
metrics=gpu__time_duration.sum
if [ "${1:-}" = --memory ]; then
  metrics=$("${PYTHON:-python3}" dev/cuda/kernel_table.py --memory-metrics)
  shift
fi
program=(./profile_gpt2cu)
if [ "${1:-}" = --step ]; then
  [[ "${2:-}" =~ ^[0-9]+$ ]] || fail "--step '${2:-}': give the number of the training step to profile (from 0)"
  program=(./train_gpt2cu -pk "$2")
  shift 2
fi
command -v ncu >/dev/null || fail "ncu (Nsight Compute) is not on PATH: install it or add its bin folder to PATH"
[ -x "${program[0]}" ] || fail "${program[0]} is missing: build it with 'make ${program[0]#./}'"
mkdir -p "$out"
ncu --clock-control none --nvtx --nvtx-include "step/" --metrics "$metrics" \
    --csv --page raw --log-file "$out/kernels.csv" "${program[@]}" "$@" | tee "$out/profile.log"
"${PYTHON:-python3}" dev/cuda/kernel_table.py "$out/kernels.csv" | tee "$out/kernel_table.txt"
