#!/usr/bin/env bash
# Tests dev/bench.py's table without a GPU: a stand-in trainer and a stand-in peer print the
# summary lines the real programs print (ours faster with -fp8 2, the peer faster with --fp8 1),
# and the table must show each row's numbers, the ratios against the peer of the same precision
# and against the BF16 peer, and each program must have been given the precision of its row; the
# speedrun's row is ours alone on --train's shards, without MFU, and its refusals are one line each.
# Scratch files go to build/test_tmp/bench.
#
#   bash dev/test/test_bench.sh     (BENCH_PYTHON=... to pick the python with numpy)
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/bench
rm -rf "$DIR"
mkdir -p "$DIR"

source "$(dirname "$0")/lib.sh"

require_python numpy test_bench BENCH_PYTHON

# Each stand-in appends its arguments to calls.txt; FAIL_FP8=1 makes the trainer fail with -fp8 2.
cat > "$DIR/ours" <<EOF
#!/bin/sh
echo "ours \$*" >> "$DIR/calls.txt"
case "\$*" in
  *"-fp8 2"*) [ -n "\${FAIL_FP8:-}" ] && { echo "error: -fp8 2 failed"; exit 1; }
              echo "average 80.0 ms per step, 800000 tok/s"; echo "peak memory: 900 MiB" ;;
  *) echo "average 100.0 ms per step, 600000 tok/s"; echo "peak memory: 1000 MiB" ;;
esac
EOF
cat > "$DIR/peer" <<EOF
#!/bin/sh
echo "peer \$*" >> "$DIR/calls.txt"
echo "peer recipe: stand-in"
case "\$*" in
  *"--fp8 1"*) echo "average over steps 2-5: 125.0 ms | MFU 1.0% | 500000 tok/s" ;;
  *) echo "average over steps 2-5: 150.0 ms | MFU 1.0% | 400000 tok/s" ;;
esac
echo "peak memory: 2000 MiB"
EOF
chmod +x "$DIR/ours" "$DIR/peer"
bench() { "$PY" dev/bench.py "$DIR/out" --trainer "$DIR/ours" --python "$DIR/peer" --steps 5 "$@"; }

out=$(bench --configs d12:64 --fp8 2 2>&1)
status=$?
echo "$out"
check "bench.py --fp8 2 exits 0" "$status" 0
row() { echo "$out" | grep -E "^ *$1 +[0-9]" | tr -s ' ' | sed 's/^ //'; }
# d12 at T=1024: 6 * 124,475,904 + 6 * 12 * 768 * 1024 FLOPs a token; 600,000 tok/s is 48.7% of
# 989 TFLOP/s. The BF16 row's ratio against the BF16 peer is its last column too.
check "the BF16 row" "$(row d12:64)" "d12:64 600000 400000 1.50 100.0 150.0 48.7% 32.5% 1000 2000 1.50"
check "the FP8 row: against the FP8 peer, then the BF16 peer" "$(row 'd12:64 fp8 2')" \
  "d12:64 fp8 2 800000 500000 1.60 80.0 125.0 65.0% 40.6% 900 2000 2.00"
check "the trainer got -fp8 0, then -fp8 2" "$(grep -o '^ours.*-fp8 [0-9]' "$DIR/calls.txt" | grep -o -- '-fp8 [0-9]' | tr '\n' ,)" \
  "-fp8 0,-fp8 2,"
check "the peer got --fp8 0, then --fp8 1" "$(grep '^peer' "$DIR/calls.txt" | grep -o -- '--fp8 [0-9]' | tr '\n' ,)" \
  "--fp8 0,--fp8 1,"
check "every program's log is kept" "$(ls "$DIR/out" | grep -c '\.log$')" 4

out=$(bench --configs d12:64 2>&1)
check "without --fp8: one row, no FP8 column" \
  "$(echo "$out" | grep -c 'fp8'):$(echo "$out" | grep -c '^ *d12:64 ')" "0:1"

out=$(FAIL_FP8=1 bench --configs d12:64 --fp8 2 2>&1)
status=$?
check "a failed FP8 run: exit 1" "$status" 1
check "... naming the program and its log" \
  "$(echo "$out" | grep -c "ours exited with 1 (log $DIR/out/ours_d12_b64_fp8_2.log)")" 1
check "... its row shows no numbers" "$(echo "$out" | grep -E '^ *d12:64 fp8 2 ' | tr -s ' ' | cut -d' ' -f5)" "-"

out=$(bench --configs d12:64 --fp8 3 2>&1)
check "--fp8 3 is refused" "$?:$(echo "$out" | grep -c 'invalid choice')" "2:1"

# The speedrun: ours alone on the shards --train names, its step phases asked for, no MFU.
: > "$DIR/calls.txt"
printf 'tokens' > "$DIR/train_000.bin"
out=$(bench --recipe speedrun --peer 0 --configs d12:1 --seq_len 512 --batch_tokens 1024 \
  --train "$DIR/train_*.bin" 2>&1)
check "--recipe speedrun --peer 0 --train: exit 0, ours alone" "$?:$(grep -c '^peer' "$DIR/calls.txt")" "0:0"
check "ours read --train's shards, with -pt 1" \
  "$(grep -c -e "-recipe speedrun -i $DIR/train_\*.bin .*-pt 1" "$DIR/calls.txt")" 1
check "the speedrun's row: no MFU, no peer" "$(row d12:1 | cut -d' ' -f2-8)" "600000 - - 100.0 - - -"
err=$(bench --recipe speedrun --configs d12:1 --train "$DIR/train_*.bin" 2>&1 >/dev/null)
check "--recipe speedrun with the peer: exit 1, one line naming --peer 0" \
  "$?:$(wc -l <<< "$err"):$(grep -c 'give --peer 0' <<< "$err")" 1:1:1
err=$(bench --recipe speedrun --peer 0 --configs d12:1 2>&1 >/dev/null)
check "--recipe speedrun without --train: exit 1, one line" "$?:$(wc -l <<< "$err"):$(grep -c 'give --train' <<< "$err")" 1:1:1
err=$(bench --configs d12:64 --train "$DIR/none_*.bin" 2>&1 >/dev/null)
check "--train matching nothing: exit 1, one line naming it" \
  "$?:$(wc -l <<< "$err"):$(grep -c "none_\*.bin: no files match" <<< "$err")" 1:1:1

finish test_bench
