#!/usr/bin/env bash
# Tests profile_gpt2cu's command line: a wrong flag or -i fails with one line naming it before the
# GPU is looked for (so the same with or without one), and a good -i gets as far as the GPU
# (without one) or profiles its tokens (with one: the tiny model, one layer). Skipped where
# profile_gpt2cu is not built. Scratch files go to build/test_tmp/profile_flags.
#
#   bash dev/test/test_profile_flags.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/profile_flags
rm -rf "$DIR"
mkdir -p "$DIR"

source "$(dirname "$0")/lib.sh"

if [ ! -x ./profile_gpt2cu ]; then
  echo "skip: ./profile_gpt2cu is not built (make profile_gpt2cu)"
  finish test_profile_flags
fi
require_python numpy test_profile_flags PYTHON

# fails_with NAME PATTERN ARGS...: exit 1 and one line on stderr matching PATTERN.
fails_with() {
  local name=$1 pattern=$2
  shift 2
  local err
  err=$(./profile_gpt2cu "$@" 2>&1 >/dev/null)
  check "$name: exit 1, one line" "$?:$(wc -l <<< "$err")" 1:1
  check "$name: the line names it" "$(grep -c -e "$pattern" <<< "$err")" 1
}

fails_with "an unknown flag" "^error: unknown flag -q: use .*-i SHARDS, -f89 PARTS" -q 1
fails_with "-f89 of an unknown part" "^error: -f89 sm,zz: no part 'zz'; name some of sm, bg, rp, ko, vg, rl, xs, lp," \
  -recipe speedrun -f89 sm,zz
fails_with "-f89 ph without lp and rp" "^error: -f89 ph: the paired heads (ph) need record #89's plan: name lp and rp" \
  -recipe speedrun -f89 ph
fails_with "-f89 ph without rp" "^error: -f89 lp,ph: the paired heads (ph) need record #89's rotary pairs" \
  -recipe speedrun -f89 lp,ph
fails_with "-f89 mg without lp" "^error: -f89 mg: the MUDD gates (mg) need record #89's plan: name lp with mg" \
  -recipe speedrun -f89 mg
fails_with "-f89 without the speedrun" "^error: -f89 rl: record #89's parts are the speedrun's: give -recipe speedrun" \
  -f89 rl
fails_with "-f89 lp without the speedrun" "^error: -f89 lp: record #89's parts are the speedrun's: give -recipe speedrun" \
  -recipe modern -f89 lp
fails_with "-i matching no file" "^error: no files match -i '$DIR/none_\*.bin'" -i "$DIR/none_*.bin"
# A shard of 100 tokens: fewer than B x T + 1 = 8 x 1024 + 1.
"$PY" - "$DIR" <<'PY'
import os, sys
sys.path.insert(0, "dev/test")
from documents_reference import write_shard
write_shard(os.path.join(sys.argv[1], "small_000000.bin"), [i % 50257 for i in range(100)])
write_shard(os.path.join(sys.argv[1], "enough_000000.bin"), [i % 50257 for i in range(4097)])
PY
fails_with "-i with too few tokens" "small_000000.bin: 100 tokens are too few for one batch" -i "$DIR/small_*.bin"

# A good -i: the tiny model's one layer at B x T = 4 x 64 from the 4,097-token shard.
if nvidia-smi -L > /dev/null 2>&1; then
  out=$(./profile_gpt2cu -e tiny -l 1 -b 4 -t 64 -i "$DIR/enough_*.bin" 2>&1)
  check "a good -i with a GPU: exit 0" "$?" 0
  check "... its tokens named" "$(grep -c "B=4 T=64, the first tokens of $DIR/enough_\*.bin:" <<< "$out")" 1
else
  err=$(./profile_gpt2cu -e tiny -l 1 -b 4 -t 64 -i "$DIR/enough_*.bin" 2>&1 >/dev/null)
  check "a good -i without a GPU: fails at the GPU, not at -i" "$?:$(grep -c '^error: no CUDA GPU is visible' <<< "$err")" 1:1
fi

finish test_profile_flags
