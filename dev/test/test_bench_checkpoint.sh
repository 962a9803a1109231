#!/usr/bin/env bash
# Tests dev/bench_checkpoint.py without a GPU: the stall arithmetic on made-up step times (exact),
# and with a stand-in trainer the runs it makes (each way of writing, then a fresh start and a
# resume), the checkpoint's bytes, and the failures. Scratch files go to build/test_tmp/bench_checkpoint.
#
#   bash dev/test/test_bench_checkpoint.sh     (BENCH_PYTHON=... to pick the python with numpy)
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/bench_checkpoint
rm -rf "$DIR"
mkdir -p "$DIR"

source "$(dirname "$0")/lib.sh"

require_python numpy test_bench_checkpoint BENCH_PYTHON

# Lines 1..10, one a second, a checkpoint every 3: the intervals ending at lines 4, 7 and 10 hold
# checkpoints 3, 6 and 9 (0.5, 0.25 and 0.75 s more); line 1 comes after 5 s of setup and line 2
# after a slow first step, neither counted.
stalls=$("$PY" - <<'EOF'
import sys
sys.path.insert(0, "dev")
from bench_checkpoint import checkpoint_stalls
extra = {4: 0.5, 7: 0.25, 10: 0.75}
times, t = {1: 5.0}, 5.0
for line in range(2, 11):
    t += (3.0 if line == 2 else 1.0) + extra.get(line, 0.0)
    times[line] = t
step, stalls = checkpoint_stalls(times, 3)
print(step, " ".join(f"{s:.2f}" for s in stalls))
print(checkpoint_stalls({1: 1.0, 2: 2.0, 3: 3.0}, 3))
EOF
)
check "the step's median and each checkpoint's stall" "$(echo "$stalls" | head -1)" "1.0 0.50 0.25 0.75"
check "no checkpoint among the timed lines: nothing to say" "$(echo "$stalls" | tail -1)" "(None, [])"

# A checkpoint's bytes: its model file and every rank's state file, not another step's files nor
# a temporary file.
mkdir -p "$DIR/sizes"
printf 1234 > "$DIR/sizes/model_00000010.bin"
printf 12 > "$DIR/sizes/state_00000010_00000.bin"
printf 123 > "$DIR/sizes/state_00000010_00001.bin"
printf 1234567 > "$DIR/sizes/model_00000009.bin"
printf 12345 > "$DIR/sizes/state_00000010_00000.bin.tmp"
check "the bytes of a checkpoint" \
  "$("$PY" -c 'import sys; sys.path.insert(0, "dev"); from bench_checkpoint import checkpoint_bytes; print(checkpoint_bytes(sys.argv[1], 10))' "$DIR/sizes")" 9

# The stand-in prints a step line for each step up to -x (from -x alone with -y 1), writes a
# 4-byte model file and a 2-byte state file for its last step in -o, and logs its flags.
# FAIL_AC=N makes it fail with -ac N.
cat > "$DIR/trainer" <<EOF
#!/bin/sh
echo "\$*" >> "$DIR/calls.txt"
x=2; o=; y=0; ac=1
while [ \$# -gt 0 ]; do
  case "\$1" in -x) x=\$2;; -o) o=\$2;; -y) y=\$2;; -ac) ac=\$2;; esac
  shift
done
[ "\$ac" = "\${FAIL_AC:-none}" ] && { echo "error: write failed"; exit 1; }
i=1; [ "\$y" = 1 ] && i=\$x
[ "\$y" = 1 ] && echo "resumed from the checkpoint of step \$((x - 1)) in \$o (the model loaded in 0.3 s, the state in 0.5 s, 0.7 s since the start)"
while [ \$i -le \$x ]; do echo "step \$i/\$x | loss 1.0 | norm 1.0 | lr 1e-4 | 1.00 ms"; i=\$((i + 1)); done
if [ -n "\$o" ]; then
  mkdir -p "\$o"
  printf abcd > "\$o/\$(printf model_%08d.bin \$x)"
  printf ef > "\$o/\$(printf state_%08d_00000.bin \$x)"
fi
EOF
chmod +x "$DIR/trainer"
bench() { "$PY" dev/bench_checkpoint.py "$DIR/out" --trainer "$DIR/trainer" --configs d12:4 "$@"; }

out=$(bench --steps 10 --every 3 2>&1)
status=$?
echo "$out"
check "bench_checkpoint.py exits 0" "$status" 0
check "a row for each way of writing, in order" \
  "$(echo "$out" | grep -oE '^ +d12:4 +-ac [0-9]' | tr -s ' ' | sed 's/^ //' | tr '\n' ,)" \
  "d12:4 -ac 0,d12:4 -ac 2,d12:4 -ac 1,"
check "the resume's row, with the trainer's split" "$(echo "$out" | grep -cE '^ +d12:4 resume: [0-9.]+ s to the first step line \(the model loaded in 0.3 s, the state in 0.5 s, 0.7 s to the resumed line\), [0-9.]+ s for a fresh start$')" 1
calls=$(cat "$DIR/calls.txt")
check "the runs: a checkpoint every 3, newest kept, each -ac" \
  "$(echo "$calls" | grep -oE -- '-x 10 -n 3 -nk 1 -ac [0-9]' | tr '\n' ,)" \
  "-x 10 -n 3 -nk 1 -ac 0,-x 10 -n 3 -nk 1 -ac 2,-x 10 -n 3 -nk 1 -ac 1,"
check "then a fresh start: the resume's command without -y 1, in a directory of its own" \
  "$(echo "$calls" | sed -n 4p | grep -cE -- "-x 11 -n 3 -nk 1 -o $DIR/out/d12_b4_fresh\$")" 1
check "... stopped at its first step line" "$(grep -c '^step ' "$DIR/out/d12_b4_fresh.log")" 1
check "and the resume of the last run's directory" \
  "$(echo "$calls" | sed -n 5p | grep -cE -- "-x 11 -n 3 -nk 1 -o $DIR/out/d12_b4_ac1 -y 1\$")" 1
check "no checkpoint is left behind" "$(find "$DIR/out" -name '*.bin' ! -name random_tokens.bin | wc -l)" 0

out=$(FAIL_AC=2 bench --steps 10 --every 3 2>&1)
status=$?
check "a failed run: exit 1" "$status" 1
check "... naming the way of writing and the log" \
  "$(echo "$out" | grep -c -- "-ac 2 at d12:4 failed (exit 1; log $DIR/out/d12_b4_ac2.log)")" 1
check "... the other rows still shown" "$(echo "$out" | grep -cE '^ +d12:4 +-ac [01] ')" 2

: > "$DIR/calls.txt"
out=$(bench --steps 10 --every 3 --modes 1,0 --resume 0 2>&1)
check "--modes 1,0 --resume 0: exit 0" "$?" 0
check "... the runs of those modes, in that order, and no resume" \
  "$(grep -oE -- '-ac [0-9]|-y 1|_fresh$' "$DIR/calls.txt" | tr '\n' ,)" "-ac 1,-ac 0,"
check "... their rows" "$(echo "$out" | grep -oE '^ +d12:4 +-ac [0-9]' | tr -s ' ' | sed 's/^ //' | tr '\n' ,)" \
  "d12:4 -ac 1,d12:4 -ac 0,"
check "... each run's line as it ends" "$(echo "$out" | grep -cE '^d12:4 -ac [01]: step [0-9.]+ ms, stall [0-9.-]+ ms a checkpoint$')" 2
check "... no checkpoint left behind" "$(find "$DIR/out" -name '*.bin' ! -name random_tokens.bin | wc -l)" 0
for modes in 3 1,1 ""; do
  out=$(bench --steps 10 --every 3 --modes "$modes" 2>&1)
  check "--modes '$modes' is refused" "$?:$(echo "$out" | grep -c -- "--modes $modes: give distinct -ac values")" "1:1"
done

out=$(bench --steps 5 --every 3 2>&1)
check "fewer than two checkpoints in --steps is refused" \
  "$?:$(echo "$out" | grep -c 'need --every at least 3 and two checkpoints within --steps')" "1:1"

finish test_bench_checkpoint
