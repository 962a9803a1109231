#!/usr/bin/env bash
# Tests the closing lines of scripts/run_tests.sh where the GPU tests do not run (GPU=0, as on a
# machine without a GPU): every group of GPU tests is named as skipped, and the count line says how
# many, so a CI log shows what did not run; --gpu-only with group names keeps only those, and an
# unknown group or argument is one error line.
#
#   bash dev/test/test_run_tests.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source "$(dirname "$0")/lib.sh"

out=$(GPU=0 bash scripts/run_tests.sh --gpu-only)
check "run_tests.sh --gpu-only with GPU=0: exit status" "$?" 0
echo "$out" | sed 's/^/     | /'
skipped_line=$(grep '^skipped (GPU=0): ' <<< "$out")
groups=$(sed 's/^skipped (GPU=0): //' <<< "$skipped_line" | wc -w)
check "the skipped GPU groups are named" "$([ "$groups" -gt 0 ] && echo named)" named
check "the last line counts them" "$(tail -n 1 <<< "$out")" "0 passed, 0 failed, $groups skipped"

out=$(GPU=0 bash scripts/run_tests.sh --gpu-only gpu_resume gpu_training)
check "--gpu-only with two groups: only those, in that order" "$(grep '^skipped' <<< "$out")" \
  "skipped (GPU=0): gpu_resume gpu_training"
check "... counted" "$(tail -n 1 <<< "$out")" "0 passed, 0 failed, 2 skipped"
out=$(GPU=0 bash scripts/run_tests.sh --gpu-only gpu_resume gpu_nothing 2>&1)
check "an unknown group: exit status 1" "$?" 1
check "... one line naming it and the groups" \
  "$(wc -l <<< "$out"):$(grep -c '^error: --gpu-only gpu_nothing: not a group of GPU tests; the groups are gpu_against_pytorch ' <<< "$out")" "1:1"
out=$(bash scripts/run_tests.sh --all 2>&1)
check "an unknown argument: exit status 1, one line" "$?:$out" \
  "1:error: unknown argument '--all': give no arguments, or --gpu-only [GROUP...]"

# Where a GPU is visible, --gpu-only starts nothing when programs are missing: one line names
# them (here a copy of the scripts without any build, and an nvidia-smi that lists a GPU).
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/scripts/lib" "$tree/dev/test" "$tree/bin"
cp scripts/run_tests.sh "$tree/scripts/"
cp scripts/lib/help.sh "$tree/scripts/lib/"
cp dev/test/compare_runs.sh dev/test/record89_args.sh "$tree/dev/test/"
printf '#!/bin/sh\necho "GPU 0: a stand-in"\n' > "$tree/bin/nvidia-smi"
chmod +x "$tree/bin/nvidia-smi"
out=$(GPU=1 PATH="$tree/bin:$PATH" bash "$tree/scripts/run_tests.sh" --gpu-only gpu_resume 2>&1)
check "--gpu-only on a GPU without the programs: exit status 1, one line naming them" "$?:$out" \
  "1:error: --gpu-only: not built: ./train_gpt2cu ./train_gpt2fp32cu ./test_gpt2cu ./test_gpt2fp32cu build/prepare_shards build/hellaswag build/test_kernels build/test_kernels_fp32 build/test_attention_mma_sync: run make cpu cuda first"
check "... and started nothing" "$(ls "$tree/build" 2>/dev/null | tr '\n' ' ')" "ref test_logs "

finish test_run_tests
