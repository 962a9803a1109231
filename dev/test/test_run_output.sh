#!/usr/bin/env bash
# Tests a trainer's output for people on a 4-step run of the tiny model: the start-up table, the
# per-step lines (the fields scripts parse, then the time left, estimated from step 2 on), the
# average line and the closing summary (tokens seen, the best of the printed validation losses, the
# last checkpoint), and main.log's train lines. Scratch files go to
# build/test_tmp/run_output_<trainer>.
#
#   bash dev/test/test_run_output.sh                          (the CPU trainer, ./train_gpt2)
#   TRAINER=./train_gpt2cu bash dev/test/test_run_output.sh   (the CUDA trainer, on a GPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${TRAINER:-}" ]; then
  # MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
  MAKEFLAGS= ${MAKE:-make} -s train_gpt2 || exit 1
  TRAINER=./train_gpt2
fi
DIR=build/test_tmp/run_output_$(basename "$TRAINER")
rm -rf "$DIR"
mkdir -p "$DIR"
source "$(dirname "$0")/lib.sh"

# Random tokens in two shards (256 int32 header: magic, version, count; then uint16 tokens).
python3 - "$DIR" <<'PY'
import random, struct, sys
rng = random.Random(1)
for name, count in (("train.bin", 4096), ("val.bin", 1024)):
    tokens = [rng.randrange(50257) for _ in range(count)]
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, count, *[0] * 253) + struct.pack(f"<{count}H", *tokens))
PY
common=(-i "$DIR/train.bin" -j "$DIR/val.bin" -e tiny -b 4 -t 64 -x 4 -m 1 -s 0 -k constant -l 1e-3)

"$TRAINER" "${common[@]}" -v 2 -o "$DIR/run" > "$DIR/run.out" 2>&1
check "a 4-step run succeeds" $? 0
out=$DIR/run.out
check "the start-up table comes before the first step" \
  "$(awk '/^\+-+\+-+\+$/ { print "table"; exit } /^step/ { print "step"; exit }' "$out")" table
step_line='^step +[1-4]/4 \| loss [0-9.]+ \| norm [0-9.]+ \| lr [0-9.e+-]+ \| [0-9.]+ ms \| MFU (n/a|[0-9.]+%) \| [0-9]+ tok/s \| ETA ([0-9]+[dhms]([0-9]{2}[hms])?|after step 2)$'
check "4 step lines with the time left at the end" "$(grep -acE "$step_line" "$out")" 4
check "the first step (warm-up) gives no estimate yet" "$(grep -aE '^step +1/4 \| loss' "$out" | grep -o 'ETA .*')" \
  "ETA after step 2"
check "the last step has no time left" "$(grep -aE '^step +4/4 \| loss' "$out" | grep -o 'ETA .*')" "ETA 0s"
check "the average line" "$(grep -acE '^average [0-9.]+ ms per step, [0-9]+ tok/s$' "$out")" 1
check "summary: wall time" "$(grep -acE '^summary: wall time [0-9]+[dhms]([0-9]{2}[hms])? \([0-9.]+ s\), 4 steps$' "$out")" 1
check "summary: tokens seen" "$(grep -a '^summary: tokens seen' "$out")" "summary: tokens seen 1024 (4 steps of 256)"
best=$(awk '/^step .*\| val loss/ { step = $2; sub("/.*", "", step); if (n++ == 0 || $NF < best) { best = $NF; at = step } }
  END { printf "summary: best val loss %s at step %d", best, at }' "$out")
check "summary: the best of the printed val losses" "$(grep -a '^summary: best val loss' "$out")" "$best"
check "summary: the last checkpoint" "$(grep -a '^summary: last checkpoint' "$out")" \
  "summary: last checkpoint $DIR/run/model_00000004.bin"
check "main.log's train lines keep their keys" \
  "$(grep -cE '^step=[1-4] kind=train loss=[0-9.]+ norm=[0-9.]+ lr=[0-9.e+-]+ ms=[0-9.]+ tok_per_s=[0-9]+$' "$DIR/run/main.log")" 4

"$TRAINER" "${common[@]}" -v 0 > "$DIR/bare.out" 2>&1
check "without -v and -o: no val loss, no checkpoint" \
  "$(grep -a -e '^summary: best' -e '^summary: last' "$DIR/bare.out")" \
  $'summary: best val loss none (no validation)\nsummary: last checkpoint none'

finish test_run_output
