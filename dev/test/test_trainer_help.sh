#!/usr/bin/env bash
# Tests the trainers' --help: each names a quick first run, and every flag line of the CPU
# trainer's (the flags both share, llmc/flags.h: name, help and default) is in the CUDA trainer's
# word for word. The CUDA trainers are checked where they are built (`make test` builds them, and
# --help needs no GPU); a missing one is named as skipped.
#
#   bash dev/test/test_trainer_help.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source "$(dirname "$0")/lib.sh"

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s train_gpt2 || exit 1
cpu_help=$(./train_gpt2 --help)
check "./train_gpt2 --help: exit status" "$?" 0
check "./train_gpt2 -h prints the same" "$(./train_gpt2 -h)" "$cpu_help"
check "./train_gpt2 --help names the quick first run" \
  "$(grep -c '^a quick first run: ./train_gpt2 -e tiny ' <<< "$cpu_help")" 1
shared_lines=$(grep -E '^  -[a-zA-Z]+ ' <<< "$cpu_help")
check "./train_gpt2 --help: one line per shared flag" "$(wc -l <<< "$shared_lines")" 21

for trainer in ./train_gpt2cu ./train_gpt2fp32cu; do
  if [ ! -x "$trainer" ]; then
    echo "skip $trainer: not built (make $(basename "$trainer"))"
    continue
  fi
  cuda_help=$("$trainer" --help)
  check "$trainer --help: exit status" "$?" 0
  check "$trainer -h alone prints the same" "$("$trainer" -h)" "$cuda_help"
  check "$trainer --help names the quick first run" \
    "$(grep -c '^a quick first run: ./train_gpt2cu ' <<< "$cuda_help")" 1
  missing=$(grep -vxF -f <(grep -E '^  -' <<< "$cuda_help") <<< "$shared_lines")
  check "$trainer --help has every shared flag line of ./train_gpt2 --help" "$missing" ""
done

finish test_trainer_help
