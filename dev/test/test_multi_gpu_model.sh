#!/usr/bin/env bash
# Tests dev/multi_gpu_model.py without a GPU on logs fabricated in train_gpt2cu's formats (-pt 1):
# the fitted bandwidth and Muon split, each scheme's prediction worked by hand (the copy engines' gather
# among them), the check of another recipe and of a -od 1 log; the fit on a -od 1 -oc 2 log and its
# schemes, the tables sent as rows (-os 1) from a shard's marked rows; one-line errors for a log without
# phases and bad flags. Scratch: build/test_tmp/multi_gpu_model.
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/multi_gpu_model
rm -rf "$DIR"
mkdir -p "$DIR"
source "$(dirname "$0")/lib.sh"
PY=${PYTHON:-python3}

phases() {  # rank world micro reduction muon adamw
  echo "step phases (rank $1 of $2, ms, mean of 10 timed steps): micro steps $3 | gradient reduction $4 | loss and" \
       "norm 0.200 | Muon $5 | AdamW $6 | parameter gather 0.003 | rest 0.003 | host between steps 0.050"
}
# 1e9 parameters (2 GB of gradients); two ranks, the one that did not wait reducing them in 10 ms: 200 GB/s.
{ echo "| parameters                    | 1000000000   |"; phases 0 1 800 0.003 4 2; echo "average 806.20 ms per step"; } > "$DIR/one.log"
{ echo "| parameters                    | 1000000000   |"; phases 1 2 390 20 3 2; phases 0 2 400 10 3 2
  echo "average 415.20 ms per step"; } > "$DIR/two.log"
out=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/two.log" --muon_params 100000000 2>&1)
check "runs" "$?" 0
# Muon's broadcast of 1e8 BF16 parameters, half a process: 0.5 ms; D = 2 (4 - 3 + 0.5) = 3, R = 1.
check "fitted" "$(sed -n 1p <<< "$out")" \
  "fitted: all-reduce bus bandwidth 200.0 GB/s; Muon 3.000 ms divided, 1.000 ms replicated on one process; compute beside another process x1.0000"
# 8 processes: compute 100, all-reduce 2 (7/8) 2e9 / 2e11 = 17.5, Muon 3/8 + 1 + (7/8) 2e8 / 2e11 = 2.25, AdamW 2.
check "today, 8 processes" "$(grep -c '^today (all-reduce, optimizers replicated), 8 processes: 121.95 ms (x6.611): compute 100.000, loss and norm 0.200, reduction 17.500, Muon 2.250, AdamW 2.000$' <<< "$out")" 1
check "divided after the all-reduce, 8 processes: the parameters' gather after it (half its time)" \
  "$(grep -c '^divided optimizers after the all-reduce, 8 processes: 127.20 ms .*reduction 26.250, Muon 0.500, AdamW 0.250$' <<< "$out")" 1
check "divided, 8 processes: Muon 4/8, AdamW 2/8" "$(grep -c '^divided optimizers (reduce-scatter, all-gather), 8 processes: 118.45 ms .*Muon 0.500, AdamW 0.250$' <<< "$out")" 1
check "divided with the gather hidden: half the all-reduce's time" "$(grep -c '^divided, the all-gather hidden, 8 processes: 109.70 ms .*reduction 8.750,' <<< "$out")" 1
# The gather by the copy engines at 386 GB/s: the reduce-scatter's 8.75 and (7/8) 2e9 / 3.86e11 = 4.534 ms.
check "divided with the gather by the copy engines, 386 GB/s" \
  "$(grep -c '^divided, the all-gather by the copy engines, 8 processes: 114.23 ms .*reduction 13.284,' <<< "$out")" 1
out500=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/two.log" --muon_params 100000000 \
  --copy_bandwidth 500 2>&1)
check "--copy_bandwidth 500: (7/8) 2e9 / 5e11 = 3.5 ms" \
  "$(grep -c '^divided, the all-gather by the copy engines, 8 processes: 113.20 ms .*reduction 12.250,' <<< "$out500")" 1
err=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/two.log" --muon_params 1 --copy_bandwidth 0 2>&1 >/dev/null)
check "--copy_bandwidth 0: exit 1, one line" "$?:$(wc -l <<< "$err")" 1:1
# Another recipe: half the parameters, the same Muon parameters (R = 1 of its Muon 5: D = 4).
{ echo "| parameters                    | 500000000   |"; phases 0 1 600 0.003 5 1; echo "average 606.20 ms per step"; } > "$DIR/other_one.log"
{ echo "| parameters                    | 500000000   |"; phases 0 2 303 5 4 1; phases 1 2 300 8 4 1; echo "average 313.30 ms per step"; } > "$DIR/other_two.log"
out=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/two.log" --muon_params 100000000 --gpus 4 \
  --check_one "$DIR/other_one.log" --check_two "$DIR/other_two.log" --check_muon_params 100000000 2>&1)
# 300 + 0.2 + 5 (1e9 bytes at 200 GB/s) + (4/2 + 1 + 0.5) + 1 = 309.70; measured 313.30: -1.1%.
check "check: the other recipe's two-process step" "$(tail -1 <<< "$out" | grep -c 'on 2 processes: predicted 309.70 ms (.*reduction 5.000, Muon 3.500, AdamW 1.000); measured 313.30 ms (-1.1%)$')" 1
check "--gpus 4: predictions for 2 and 4 processes" "$(grep -c ', 4 processes: ' <<< "$out"):$(grep -c ', 8 processes: ' <<< "$out")" 5:0
# -od 1 on two processes: the rank that waited least (rank 0, 5 ms) spent 5 + 0.2 + 2.5 + 1 + 0.006 after its
# micro steps; the divided scheme predicts 0.2 + 10 (1e9 bytes reduced, 1e9 gathered at 200 GB/s) + 4/2 + 2/2.
{ echo "| parameters                    | 1000000000   |"; phases 0 2 400 5 2.5 1; phases 1 2 395 10 2.5 1
  echo "average 408.80 ms per step"; } > "$DIR/divided.log"
out=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/two.log" --muon_params 100000000 \
  --check_divided "$DIR/divided.log" 2>&1)
check "check of -od 1: after the micro steps, the rank that waited least" "$(tail -1 <<< "$out" | grep -c \
  'divided.log (-od 1) on 2 processes: after the micro steps predicted 13.20 ms, measured 8.71 ms (+51.6%)$')" 1
err=$("$PY" dev/multi_gpu_model.py --one "$DIR/other_two.log" --two "$DIR/two.log" --muon_params 1 2>&1 >/dev/null)
check "a two-process log as --one: exit 1, one line naming it" "$?:$(wc -l <<< "$err"):$(grep -c "other_two.log: a run of 2 processes, expected 1" <<< "$err")" 1:1:1
# A fit on -od 1 -oc 2: the rank that waited least (rank 0) reduced its half of 2e9 bytes in 5 ms (200 GB/s), its
# micro steps 404 against 800 / 2 (x1.01), the ranks' Muon 2.5 = 4 / 2 + 0.5.
divided_run() {  # -oc value, then the table's and phases' lines
  echo "| -od   divided optimizers      | 1   |"; echo "| -oc   copy-engine sharing     | $1   |"
  echo "| parameters                    | 1000000000   |"; phases 0 2 404 5 2.5 1; phases 1 2 398 11 2.5 1
  echo "average 413.00 ms per step"
}
divided_run 2 > "$DIR/oc2.log"
out=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/oc2.log" --muon_params 100000000 \
  --copy_bandwidth 500 --late_params 200000000 2>&1)
check "fit on -od 1 -oc 2" "$(sed -n 1p <<< "$out")" \
  "fitted on -od 1 -oc 2: reduction to the owners 200.0 GB/s; compute beside another process x1.0100; Muon 0.500 ms beyond its half"
# 2 processes: 404 + 0.2 + 5 + 1 + max(2 + 0.5, AdamW's 1.8e9 bytes / 2 at 500 GB/s = 1.8).
check "as run, 2 processes: the fitted log's phases" \
  "$(grep -c '^as run (-od 1 -oc 2), 2 processes: 412.70 ms (x1.953): compute 404.000, loss and norm 0.200, reduction 5.000, AdamW 1.000, Muon 2.500$' <<< "$out")" 1
# 8 processes: 1.01 x 100 + 0.2 + (7/8) 2e9 / 2e11 + 2/8 + max(4/8 + 0.5, (7/8) 1.8e9 / 5e11 = 3.15).
check "as run, 8 processes: AdamW's copies longer than Muon's share" \
  "$(grep -c '^as run (-od 1 -oc 2), 8 processes: 113.35 ms (x7.112): compute 101.000, loss and norm 0.200, reduction 8.750, AdamW 0.250, Muon 3.150$' <<< "$out")" 1
check "the reduction by the copy engines, 8 processes: (7/8) 2e9 / 5e11" \
  "$(grep -c '^the reduction by the copy engines, 8 processes: 108.10 ms .*reduction 3.500,' <<< "$out")" 1
check "during the backward pass, 8 processes: the late 2e8 parameters' (7/8) 4e8 / 5e11" \
  "$(grep -c '^the reduction by the copy engines during the backward pass, 8 processes: 105.30 ms .*reduction 0.700,' <<< "$out")" 1
out=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/oc2.log" --muon_params 100000000 --copy_bandwidth 500 \
  --check_one "$DIR/other_one.log" --check_two "$DIR/other_two.log" --check_muon_params 100000000 2>&1)
# 1.01 x 300 + 0.2 + (1/2) 1e9 / 2e11 + 1/2 + max(5/2 + 0.5, (1/2) 8e8 / 5e11) = 309.20; measured 313.30.
check "check of another recipe on the -od 1 -oc 2 fit" "$(tail -1 <<< "$out" | grep -c \
  'on 2 processes: predicted 309.20 ms (compute 303.000, .*reduction 2.500, AdamW 0.500, Muon 3.000); measured 313.30 ms (-1.3%)$')" 1
check "no --late_params: no scheme during the backward pass" "$(grep -c 'during the backward pass' <<< "$out")" 0
# The tables as rows: a shard of each of the 50,304 tokens 4 times over, one after another: the 2 processes'
# 201,216 tokens each mark every row; the 8 processes' 50,304 a quarter of them. 8 processes: of the 4e8
# tables' parameters a quarter sent, (7/8) (1e9 - 3e8) 2 / 2e11 = 6.125 ms in place of 8.75.
"$PY" -c "import sys; sys.stdout.buffer.write(bytes(1024) + b''.join(t.to_bytes(2, 'little') * 4 for t in range(50304)))" \
  > "$DIR/rows.bin"
out=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/oc2.log" --muon_params 100000000 \
  --copy_bandwidth 500 --sparse_params 400000000 --rows_from "$DIR/rows.bin" --step_tokens 402432 2>&1)
check "the tables as rows, 2 processes: every row marked, the reduction as run" \
  "$(grep -c '^the tables as rows (-os 1; 1.000 of the rows), 2 processes: 412.70 ms .*reduction 5.000,' <<< "$out")" 1
check "the tables as rows, 8 processes: a quarter of the rows" \
  "$(grep -c '^the tables as rows (-os 1; 0.250 of the rows), 8 processes: 110.73 ms .*reduction 6.125,' <<< "$out")" 1
err=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/oc2.log" --muon_params 1 --sparse_params 1 2>&1 >/dev/null)
check "--sparse_params without --rows_from: exit 1, one line" "$?:$(wc -l <<< "$err")" 1:1
divided_run 1 > "$DIR/oc1.log"
err=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/oc1.log" --muon_params 1 2>&1 >/dev/null)
check "a -od 1 -oc 1 log as --two: exit 1, one line naming -oc 2" "$?:$(wc -l <<< "$err"):$(grep -c "give a run with -od 1 -oc 2" <<< "$err")" 1:1:1
err=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/oc2.log" --muon_params 1 --check_divided "$DIR/divided.log" 2>&1 >/dev/null)
check "--check_divided with a -od 1 -oc 2 fit: exit 1, one line" "$?:$(wc -l <<< "$err")" 1:1
echo "average 1.0 ms per step" > "$DIR/bare.log"
err=$("$PY" dev/multi_gpu_model.py --one "$DIR/bare.log" --two "$DIR/two.log" --muon_params 1 2>&1 >/dev/null)
check "a log without -pt 1's lines: exit 1, one line naming it" "$?:$(wc -l <<< "$err"):$(grep -c "bare.log: no parameter count, average step or phases line" <<< "$err")" 1:1:1
err=$("$PY" dev/multi_gpu_model.py --one "$DIR/one.log" --two "$DIR/two.log" --muon_params 1 --gpus 1 2>&1 >/dev/null)
check "--gpus 1: exit 1, one line" "$?:$(wc -l <<< "$err")" 1:1
finish test_multi_gpu_model
