#!/usr/bin/env bash
# Tests the closing lines of scripts/run_tests.sh where the GPU tests do not run (GPU=0, as on a
# machine without a GPU): every group of GPU tests is named as skipped, and the count line says how
# many, so a CI log shows what did not run.
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

finish test_run_tests
