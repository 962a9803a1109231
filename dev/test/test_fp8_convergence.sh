#!/usr/bin/env bash
# Tests scripts/fp8_convergence.sh without a GPU, with a stand-in trainer: the runs it starts (one
# per -fp8 mode, the same flags but -fp8), a run stopped midway continued by running the script
# again (-y 1 from its checkpoint) while finished runs are left alone, the last validation losses
# against BF16's, the checkpoints of finished runs dropped, and one-line errors for bad arguments.
# Scratch files go to build/test_tmp/fp8_convergence.
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/fp8_convergence
rm -rf "$DIR"
mkdir -p "$DIR"
source "$(dirname "$0")/lib.sh"

# The stand-in: writes main.log lines (val loss 3 + mode / 100 at step 0 and every -v steps, and
# at the last) and a checkpoint (DONE marker) every -n steps; with STOP_MODE=M, the run of -fp8 M
# stops with status 3 after its checkpoint of step 2 the first time. It logs its flags.
cat > "$DIR/trainer" <<EOF
#!/bin/bash
echo "\$*" >> "$DIR/calls.txt"
while [ \$# -gt 0 ]; do
  case "\$1" in -x) x=\$2;; -o) o=\$2;; -y) y=\$2;; -v) v=\$2;; -n) n=\$2;; -fp8) mode=\$2;; -fp8g) mode=3;; esac
  shift
done
mkdir -p "\$o"
first=0
[ "\$y" = 1 ] && first=\$(ls "\$o" | sed -n 's/^DONE_0*\([0-9]\)/\1/p' | sort -n | tail -1)
for ((s = first; s <= x; s++)); do
  if [ "\$y" != 1 ] || [ \$s -gt \$first ]; then
    if [ \$((s % v)) -eq 0 ] || [ \$s -eq \$x ]; then
      echo "step=\$s kind=val loss=\$(awk -v m=\$mode -v s=\$s 'BEGIN { printf "%.6f", 3 + m / 100 + 1 / (s + 1) }')" >> "\$o/main.log"
    fi
  fi
  if [ \$s -gt 0 ] && { [ \$((s % n)) -eq 0 ] || [ \$s -eq \$x ]; }; then
    touch "\$o/\$(printf 'model_%08d.bin' \$s)" "\$o/\$(printf 'DONE_%08d' \$s)"
    if [ "\${STOP_MODE:-}" = "\$mode" ] && [ \$s -eq 2 ] && [ "\$y" != 1 ]; then echo "stopped by a signal"; exit 3; fi
  fi
done
echo "done"
EOF
chmod +x "$DIR/trainer"
mkdir -p "$DIR/data"
touch "$DIR/data/tiny_shakespeare_val_000000.bin"
converge() { PYTHON=true scripts/fp8_convergence.sh "$DIR/out" --trainer "$DIR/trainer" --data "$DIR/data" --steps 5 --val-every 2 --checkpoint-every 2 "$@"; }

out=$(STOP_MODE=1 converge --modes "0 1 2" 2>&1)
status=$?
echo "$out"
check "a run stopped midway: exit 1" "$status" 1
check "... one error line naming the run and how to continue" \
  "$(echo "$out" | grep -c "^error: fp8_current stopped with status 3 before step 5 (log $DIR/out/fp8_current.out); run the same command again to continue$")" 1
check "... the runs before it finished, the one after not started" \
  "$(ls "$DIR/out" | grep -v '\.out$' | xargs)" "bf16 fp8_current"

out=$(converge --modes "0 1 2" 2>&1)
status=$?
echo "$out"
check "run again: exit 0" "$status" 0
check "... bf16 is not run again" "$(echo "$out" | grep -c '^bf16: finished earlier')" 1
check "... fp8_current continues, fp8_delayed starts" \
  "$(echo "$out" | grep -oE '^fp8_(current|delayed): (continuing|starting)' | tr '\n' ,)" \
  "fp8_current: continuing,fp8_delayed: starting,"
calls=$(cat "$DIR/calls.txt")
check "the trainer's runs: -fp8 0, 1, 1 resumed, 2" \
  "$(echo "$calls" | grep -oE -- '-fp8 [012] -o [^ ]+ -y [01]' | sed "s|$DIR/out/||" | tr '\n' ,)" \
  "-fp8 0 -o bf16 -y 0,-fp8 1 -o fp8_current -y 0,-fp8 1 -o fp8_current -y 1,-fp8 2 -o fp8_delayed -y 0,"
check "the same flags but -fp8, -o and -y" \
  "$(echo "$calls" | sed -E 's/ -fp8 [012] -o [^ ]+ -y [01]//' | sort -u | wc -l)" 1
check "d12, 64K tokens a step in micro batches of 16, the whole validation split" \
  "$(echo "$calls" | head -1 | grep -cE -- '-e d12 .*-b 16 -t 1024 -z 65536 -x 5 .*-v 2 -m 2 ')" 1
check "the last validation losses, against BF16's" \
  "$(echo "$out" | sed -n '/the last validation loss/,$p' | tail -3 | tr -s ' ' | tr '\n' ,)" \
  "bf16 3.166667,fp8_current 3.176667 +0.32% against BF16,fp8_delayed 3.186667 +0.63% against BF16,"

out=$(converge 2>&1)
check "the default modes add E4M3 gradients (-fp8 2 -fp8g 1) to the three finished" \
  "$(tail -1 "$DIR/calls.txt" | grep -oE -- "-fp8 2 -fp8g 1 -o $DIR/out/fp8_delayed_e4m3grad -y 0"):$(echo "$out" | grep -c 'finished earlier')" \
  "-fp8 2 -fp8g 1 -o $DIR/out/fp8_delayed_e4m3grad -y 0:3"
check "... and its last validation loss" "$(echo "$out" | tail -1 | tr -s ' ')" "fp8_delayed_e4m3grad 3.196667 +0.95% against BF16"
check "the resumed run's log: every validation step once" \
  "$(grep -oE '^step=[0-9]+' "$DIR/out/fp8_current/main.log" | tr '\n' ,)" "step=0,step=2,step=4,step=5,"
check "finished runs keep main.log only" "$(ls "$DIR/out/bf16" "$DIR/out/fp8_current" "$DIR/out/fp8_delayed" | grep -vc 'main.log\|^$\|:$')" 0

out=$(converge --modes "1 4" 2>&1)
check "--modes 4 is refused" "$?:$(echo "$out" | grep -c "^error: --modes '1 4': each must be 0, 1, 2 (the trainer's -fp8) or 3 (-fp8 2 -fp8g 1)")" "1:1"
out=$(converge --steps 0 2>&1)
check "--steps 0 is refused" "$?:$(echo "$out" | grep -c "^error: --steps '0' must be a whole number of at least 1")" "1:1"
out=$(scripts/fp8_convergence.sh "$DIR/out" --trainer "$DIR/missing" --data "$DIR/data" 2>&1)
check "a missing trainer" "$?:$(echo "$out" | grep -c "^error: $DIR/missing is not an executable")" "1:1"

out=$(scripts/fp8_convergence.sh "$DIR/out" --trainer "$DIR/trainer" --data "$DIR/nothing" 2>&1)
check "a --data folder without shards" "$?:$(echo "$out" | grep -c "^error: --data $DIR/nothing holds no tiny_shakespeare_val_000000.bin")" "1:1"
finish test_fp8_convergence
