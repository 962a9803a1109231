#!/usr/bin/env bash
# Tests dev/test/compare_runs.sh on made-up logs in the trainer's formats: losses_close_from on a
# run resumed from step 5's checkpoint (its steps 6-10) against the run that went on (steps 1-10),
# as the multi-GPU tests compare a checkpoint resumed on another process count, with spike lines
# that are no step's loss; same_log on main.log lines, missing and empty logs.
# Scratch files go to build/test_tmp/compare_runs.
#
#   bash dev/test/test_compare_runs.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/compare_runs
rm -rf "$DIR"
mkdir -p "$DIR"

source "$(dirname "$0")/lib.sh"
source dev/test/compare_runs.sh

# run_log FIRST LAST [STEP LOSS]: the step lines of steps FIRST..LAST of a 10-step run (loss 10 - step
# / 2, step 7 LOSS where given), with a validation line after step 5 and the lines around them
# that a log also has.
run_log() {
  local step loss
  echo "+-----------------------+"
  for ((step = $1; step <= $2; step++)); do
    loss=$(awk -v s="$step" 'BEGIN { printf "%.6f", 10 - s / 2 }')
    [ "$step" = "${3:-}" ] && loss=$4
    printf "step %4d/10 | loss %s | norm 1.0000 | lr 1.000e-04 | 100.00 ms | MFU 1.0%% | 1000 tok/s\n" "$step" "$loss"
    [ "$step" = 5 ] && printf "step %4d/10 | val loss 7.900000\n" "$step"
  done
  echo "summary: done"
}

run_log 1 10 > "$DIR/went_on.log"
run_log 6 10 > "$DIR/resumed.log"
out=$(losses_close_from "$DIR/went_on.log" "$DIR/resumed.log" 5 0)
check "resumed at step 5 against the run that went on, the same losses: passes" "$?:$out" \
  "0:5 losses, largest difference 0 (tolerance 0)"
out=$(losses_close_from "$DIR/resumed.log" "$DIR/went_on.log" 5 0)
check "the same in the other order" "$?:$out" "0:5 losses, largest difference 0 (tolerance 0)"

run_log 6 10 7 6.600000 > "$DIR/resumed_off.log"
out=$(losses_close_from "$DIR/went_on.log" "$DIR/resumed_off.log" 5 0.05)
check "step 7 0.1 off, tolerance 0.05: fails, naming the difference" "$?:$out" \
  "1:5 losses, largest difference 0.1 (tolerance 0.05)"
out=$(losses_close_from "$DIR/went_on.log" "$DIR/resumed_off.log" 5 0.2)
check "the same within 0.2: passes" "$?" 0

run_log 6 9 > "$DIR/resumed_short.log"
out=$(losses_close_from "$DIR/went_on.log" "$DIR/resumed_short.log" 5 0)
check "only 4 steps after step 5 in both: fails" "$?:$out" "1:4 losses, largest difference 0 (tolerance 0)"

out=$(losses_close_from "$DIR/went_on.log" "$DIR/went_on.log" 5 0)
check "steps up to 5 are not compared (5 of the 10)" "$out" "5 losses, largest difference 0 (tolerance 0)"

{ run_log 6 9; echo "step 9: spike, loss z-score 6.1, grad norm z-score 0.3"; } > "$DIR/resumed_spike.log"
{ cat "$DIR/went_on.log"; echo "step 9: spike, loss z-score 6.1, grad norm z-score 0.3"; } > "$DIR/went_on_spike.log"
out=$(losses_close_from "$DIR/went_on_spike.log" "$DIR/resumed_spike.log" 5 0)
check "a spike line in both is no step's loss: 4 steps, fails" "$?:$out" "1:4 losses, largest difference 0 (tolerance 0)"

# main.log's lines: equal but for ms= and tok_per_s=, or not.
main_log() {  # STEP LOSS MS TOK_PER_S ...: main.log's training lines (llmc/logger.h)
  printf 'step=%d kind=train loss=%.6f norm=1.2345 lr=6.0000e-04 ms=%.2f tok_per_s=%.0f\n' "$@"
}
main_log 1 9.5 100 1000 2 9.0 101 990 > "$DIR/a_main.log"
main_log 1 9.5 120 900 2 9.0 99 1010 > "$DIR/b_main.log"
main_log 1 9.5 100 1000 2 9.1 101 990 > "$DIR/c_main.log"
: > "$DIR/empty_main.log"
out=$(same_log "$DIR/a_main.log" "$DIR/b_main.log")
check "same_log: the same lines but for their timings: passes" "$?:$out" "0:identical: 2 lines"
same_log "$DIR/a_main.log" "$DIR/c_main.log" > /dev/null
check "same_log: a loss apart: fails" "$?" 1
same_log "$DIR/empty_main.log" "$DIR/empty_main.log" > /dev/null
check "same_log: two empty logs: fails" "$?" 1
same_log "$DIR/missing_main.log" "$DIR/missing_main.log" > /dev/null 2>&1
check "same_log: two missing logs: fails" "$?" 1

finish test_compare_runs
