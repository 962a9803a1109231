#!/usr/bin/env bash
# Tests dev/bench_quality.py without a GPU and without running a trainer: (a) the edits of the
# reference script's copy, on a stand-in holding only the lines they look for (the new values are
# there, nothing else changed; a missing line stops the bench with one line naming it, before any
# run), and the commands of --dry_run (ours' speedrun run, --same_tokens' steps and validation); (b)
# the report from fabricated finished outputs of the speedrun pair in the real line formats (the
# ms/step ratio, the largest relative validation-loss difference, the time to reach a loss); (c)
# with --speedrun_repeats, the repeats' commands and the comparison of each side's means, spread and
# standard error, and the table's GPU column from a fabricated sample file; (d) the GPU sampler,
# with a stand-in nvidia-smi; (e) --stop_after: its errors, longer outputs read up to its step, and
# the stop itself on a stand-in run; (f) --shared_init: the commands, the reference's copy loading
# the init, the init's tensors in the reference's layout (a stand-in of its parameter table), the
# paired standard error; (g) two benches in one OUTDIR: a run one is making is refused by the other,
# its log untouched; (h) record #89's pair: its commands (the offline kit's among them), its refusals,
# and its report. Scratch files go to build/test_tmp/bench_quality.
#
#   bash dev/test/test_bench_quality.sh     (PLOT_PYTHON=... to pick the python with matplotlib)
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/bench_quality
rm -rf "$DIR"
mkdir -p "$DIR"

source "$(dirname "$0")/lib.sh"

require_python matplotlib test_bench_quality PLOT_PYTHON
echo "using $PY"

bench() { "$PY" dev/bench_quality.py "$@"; }

# --- (a) the reference's copy. The stand-in: each line the edits look for, as record #28 has it,
# and a line of its own that must come through unchanged.
cat > "$DIR/stand_in.py" <<'EOF'
class Hyperparameters:
    train_files = "data/fineweb10B/fineweb_train_*.bin" # input .bin to train on
    val_files = "data/fineweb10B/fineweb_val_*.bin" # input .bin to eval validation loss on
    val_tokens = 10485760 # how many tokens of validation data?
    num_iterations = 1695 # number of iterations to run
    val_loss_every = 125 # every how many steps to evaluate val loss? 0 for only at the end
def loader(tokens, pos, seq_len, token_window):
                batch_starts, tokens_consumed = find_batch_starts(tokens, pos, seq_len, token_window)
for param in model.parameters():
    dist.broadcast(param.detach(), 0)
print("unchanged")
EOF
out=$(bench "$DIR/a" --train 'shards/t_*.bin' --val 'shards/v_*.bin' --steps 300 --val_every 100 \
  --runs ours_speedrun,ref_speedrun --reference_script "$DIR/stand_in.py" --dry_run 2>&1)
check "dry run with the stand-in exits 0" "$?" 0
copy="$DIR/a/ref_speedrun/train_gpt.py"
check "the copy is in OUTDIR/ref_speedrun" "$(test -f "$copy" && echo yes)" yes
check "its log folder logs/final is made" "$(test -d "$DIR/a/ref_speedrun/logs/final" && echo yes)" yes
abs=$(pwd)
check "train_files: --train, absolute" "$(grep -c "^    train_files = '$abs/shards/t_\*.bin' # input .bin to train on$" "$copy")" 1
check "val_files: --val, absolute" "$(grep -c "^    val_files = '$abs/shards/v_\*.bin' # input" "$copy")" 1
check "num_iterations: --steps" "$(grep -c '^    num_iterations = 300 # number' "$copy")" 1
check "val_loss_every: --val_every" "$(grep -c '^    val_loss_every = 100 # every' "$copy")" 1
check "val_tokens: --speedrun_val_tokens" "$(grep -c '^    val_tokens = 10485760 # how' "$copy")" 1
check "the document-aligned search: 16 x a step's tokens" \
  "$(grep -c '^                batch_starts, tokens_consumed = find_batch_starts(tokens, pos, seq_len, 16 \* grad_accum_steps \* batch_size)$' "$copy")" 1
check "five lines changed (val_tokens keeps its value), the rest the same" \
  "$(diff "$DIR/stand_in.py" "$copy" | grep -c '^>')" 5
check "the edited copy is valid Python" "$("$PY" -c "import ast, sys; ast.parse(open(sys.argv[1]).read()); print(1)" "$copy")" 1
check "ours' speedrun command (-vt, -m = val tokens / -vt, no -b/-t/-z)" \
  "$(grep '^=== ours_speedrun:' <<< "$out")" \
  "=== ours_speedrun: ./train_gpt2cu -recipe speedrun -e d12 -i 'shards/t_*.bin' -j 'shards/v_*.bin' -x 300 -v 100 -m 40 -vt 262144 -s 0 -o $DIR/a/ours_speedrun"
check "the reference's command runs train_gpt.py in its folder with one process" \
  "$(grep -c "^=== ref_speedrun (in $DIR/a/ref_speedrun): .*\(torchrun\|-m torch.distributed.run\) --standalone --nproc_per_node=1 train_gpt.py$" <<< "$out")" 1

out=$(bench "$DIR/a2" --train 't_*.bin' --val 'v_*.bin' --steps 300 --val_every 100 --runs ref_speedrun \
  --reference_script "$DIR/stand_in.py" --speedrun_val_tokens 5242880 --dry_run 2>&1)
check "--speedrun_val_tokens reaches the copy" \
  "$(grep -c -e 'val_tokens = 5242880 #' "$DIR/a2/ref_speedrun/train_gpt.py")" 1

# A stand-in without one of the lines: one line on stderr naming it, status 1, no copy, and the
# runs before the reference in --runs not started (their logs not written).
grep -v 'num_iterations' "$DIR/stand_in.py" > "$DIR/other_version.py"
err=$(bench "$DIR/b" --train 't_*.bin' --val 'v_*.bin' --runs ours_speedrun,ref_speedrun \
  --reference_script "$DIR/other_version.py" 2>&1 >/dev/null)
check "a missing line: exit status 1" "$?" 1
check "a missing line: one line on stderr" "$(wc -l <<< "$err")" 1
check "a missing line: the error names it" \
  "$(grep -c "^error: --reference_script $DIR/other_version.py: expected the line 'num_iterations = 1695' once .*found it 0 times" <<< "$err")" 1
check "a missing line: no copy written, no run started" \
  "$(ls "$DIR/b" 2>/dev/null | grep -c -e train_gpt.py -e '\.log$')" 0
# A whole log given instead of its code: the edits fit, the rest is no Python.
{ cat "$DIR/stand_in.py"; printf '%s\n' "$(printf '=%.0s' {1..100})" "Running Python 3.10.12" \
  "step:0/1695 val_loss:10.8258 train_time:0ms step_avg:0.03ms"; } > "$DIR/whole_log.txt"
err=$(bench "$DIR/b2" --train 't_*.bin' --val 'v_*.bin' --runs ref_speedrun --reference_script "$DIR/whole_log.txt" \
  --dry_run 2>&1 >/dev/null)
check "a whole log instead of the code: exit 1, one line saying so" \
  "$?:$(wc -l <<< "$err"):$(grep -c 'not Python after the edits (line [0-9]*: .*give only the code at the top of the log$' <<< "$err")" 1:1:1
err=$(bench "$DIR/c" --train 't_*.bin' --val 'v_*.bin' --runs ref_speedrun 2>&1 >/dev/null)
check "no --reference_script: exit 1 with one line" "$?:$(wc -l <<< "$err")" 1:1

# --same_tokens: the runs at --batch_tokens take the speedrun's tokens (131,072 x 900 = 393,216 x 300).
out=$(bench "$DIR/d" --train 't_*.bin' --val 'v_*.bin' --steps 300 --val_every 25 --same_tokens \
  --runs ours_modern,ours_gpt2,ours_speedrun --target_run ours_modern --dry_run 2>&1)
check "--same_tokens: modern takes 900 steps, validates every 75" \
  "$(grep -c '^=== ours_modern: .* -z 131072 -x 900 -v 75 ' <<< "$out")" 1
check "--same_tokens: GPT-2 likewise" "$(grep -c '^=== ours_gpt2: .* -x 900 -v 75 ' <<< "$out")" 1
check "--same_tokens: the speedrun keeps --steps" "$(grep -c '^=== ours_speedrun: .* -x 300 -v 25 ' <<< "$out")" 1
check "--same_tokens: the runs at --batch_tokens validate on the speedrun's 10,485,760 tokens" \
  "$(grep -cE '^=== ours_(modern|gpt2): .* -v 75 -m 160 ' <<< "$out")" 2
err=$(bench "$DIR/d2" --train 't_*.bin' --val 'v_*.bin' --same_tokens --speedrun_val_tokens 1048576 --micro_batch 48 \
  --runs ours_modern --target_run ours_modern --dry_run 2>&1)
check "--same_tokens refuses validation tokens of no whole number of batches" \
  "$?:$(wc -l <<< "$err"):$(grep -c "^error: --same_tokens: --speedrun_val_tokens 1048576 is no whole number of ours_modern's" <<< "$err")" 1:1:1
out=$(bench "$DIR/e" --train 't_*.bin' --val 'v_*.bin' --dry_run 2>&1)
check "defaults unchanged: ours_modern's command" "$(grep '^=== ours_modern:' <<< "$out")" \
  "=== ours_modern: ./train_gpt2cu -recipe modern -e d12 -i 't_*.bin' -j 'v_*.bin' -b 64 -t 1024 -z 131072 -x 600 -v 50 -m 20 -s 0 -o $DIR/e/ours_modern"
err=$(bench "$DIR/f" --train 't_*.bin' --val 'v_*.bin' --same_tokens --batch_tokens 524288 --steps 301 --dry_run 2>&1)
check "--same_tokens refuses a budget of no whole number of steps" "$?:$(grep -c '^error: --same_tokens: --steps 301' <<< "$err")" 1:1

# --- (b) the report from finished outputs (read again, not run). Reference: 1000 ms a step
# (its train_time), final 5.0 in 4.0 s. Ours: step 1 (tuning) not counted, then 500 ms a step.
mkdir -p "$DIR/g/ref_speedrun"
cat > "$DIR/g/ref_speedrun/output.log" <<'EOF'
logs/final/00000000-0000-0000-0000-000000000000.txt
step:0/4 val_loss:10.8250 train_time:0ms step_avg:0.03ms
step:1/4 train_time:1000ms step_avg:1000.00ms
step:2/4 train_time:2000ms step_avg:1000.00ms
step:2/4 val_loss:6.0000 train_time:2000ms step_avg:1000.00ms
step:3/4 train_time:3000ms step_avg:1000.00ms
step:4/4 train_time:4000ms step_avg:1000.00ms
step:4/4 val_loss:5.0000 train_time:4000ms step_avg:1000.00ms
peak memory allocated: 40000 MiB reserved: 42000 MiB
EOF
cat > "$DIR/g/ours_speedrun.log" <<'EOF'
step    0/4 | val loss 10.830000
step    1/4 | loss 10.825000 | norm 1.0000 | lr 1.000e+00 | 5000.00 ms | MFU 1.0% | 78643 tok/s | ETA 2s
step    2/4 | loss 7.000000 | norm 1.0000 | lr 1.000e+00 | 500.00 ms | MFU 1.0% | 786432 tok/s | ETA 1s
step    2/4 | val loss 6.030000
step    3/4 | loss 6.000000 | norm 1.0000 | lr 1.000e+00 | 500.00 ms | MFU 1.0% | 786432 tok/s | ETA 1s
step    4/4 | loss 5.000000 | norm 1.0000 | lr 1.000e+00 | 500.00 ms | MFU 1.0% | 786432 tok/s | ETA 0s
step    4/4 | val loss 4.980000
EOF
out=$(bench "$DIR/g" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 \
  --runs ours_speedrun,ref_speedrun --target_run ref_speedrun 2>&1)
check "report from finished outputs exits 0" "$?" 0
[ -f "$DIR/g/quality.md" ] || echo "$out"
md="$DIR/g/quality.md"
check "both runs read, none run" "$(grep -c '^=== .*: read ' <<< "$out")" 2
check "table: ours' row (median and mean 500 ms, 786,432 tokens/s, 1.5 s, reaches 5.0 in 1.48 s)" \
  "$(grep '^| train_gpt2cu, speedrun recipe' "$md")" \
  "| train_gpt2cu, speedrun recipe | 4 | 4.9800 | 500.0 | 500.0 | 786432 | 1.5 | 1.5 | - |"
check "table: the reference's row" "$(grep "^| record #28's train_gpt.py" "$md")" \
  "| record #28's train_gpt.py | 4 | 5.0000 | 1000.0 | 1000.0 | 393216 | 4.0 | 4.0 | - |"
check "ms/step ratio 2.00x, target met" "$(grep -c '^- ms/step (mean of the timed steps): ours 500.0, reference 1000.0: 2.00x (at least 1.4x: yes)$' "$md")" 1
check "largest relative val-loss difference 0.50% at step 2, within 1%" \
  "$(grep -c '^- validation loss: largest relative difference 0.50% at step 2 (within 1% at every validation: yes)$' "$md")" 1
# (6.03 - 5.0) / (6.03 - 4.98) of the 1.0 s between ours' validations at 0.5 s and 1.5 s.
check "time to reach the reference's final loss: 1.48 s against 4.0 / 1.4 = 2.86 s" \
  "$(grep -c "^- ours reaches the reference's final validation loss 5.0000 in 1.48 s; the reference trained 4.00 s, 1/1.4 of it 2.86 s: yes$" "$md")" 1
check "per-step table: step 4" "$(grep '^| 4 |' "$md")" "| 4 | 5.0000 | 4.9800 | 0.40% |"
check "the plot is written" "$(test -s "$DIR/g/quality.png" && echo yes)" yes

# A log whose first line names another command is not read as this one's: one line, status 1.
mkdir -p "$DIR/h"
{ echo "# bench_quality command: ./train_gpt2cu -recipe speedrun -x 4 -v 1"; cat "$DIR/g/ours_speedrun.log"; } \
  > "$DIR/h/ours_speedrun.log"
err=$(bench "$DIR/h" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun 2>&1 >/dev/null)
check "another command's log: exit 1 with one line naming it" \
  "$?:$(wc -l <<< "$err"):$(grep -c "^error: $DIR/h/ours_speedrun.log is the output of another command" <<< "$err")" 1:1:1
# One that names this command is read (the reference's names the edits of its copy too).
flags=(--train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun
  --target_run ref_speedrun)
for name in ours_speedrun ref_speedrun; do
  "$PY" -c 'import sys; sys.path.insert(0, "dev"); import bench_quality as bq
print(bq.COMMAND_MARK + bq.run_signature(sys.argv[1], bq.parse_args(sys.argv[2:])))' "$name" "$DIR/h" "${flags[@]}" \
    > "$DIR/h/signature"
  log="$DIR/h/$name.log"
  [ $name = ref_speedrun ] && mkdir -p "$DIR/h/ref_speedrun" && log="$DIR/h/ref_speedrun/output.log"
  [ $name = ref_speedrun ] && src="$DIR/g/ref_speedrun/output.log" || src="$DIR/g/$name.log"
  cat "$DIR/h/signature" "$src" > "$log"
done
out=$(bench "$DIR/h" "${flags[@]}" 2>&1)
check "logs naming this command are read" "$?:$(grep -c '^=== .*: read ' <<< "$out")" 0:2
check "the report from them is the same" "$(diff "$DIR/g/quality.md" "$DIR/h/quality.md" && echo same)" same

# The same numbers straight from the functions, and a run over 1% and too slow.
numbers=$("$PY" - <<'EOF'
import sys
sys.path.insert(0, "dev")
import bench_quality as bq
ours = ([(0, 0.0, 10.0), (2, 2.0, 6.3), (4, 4.0, 5.2)], [1000.0] * 4)  # 5% above at step 2
ref = ([(0, 0.0, 10.0), (2, 2.5, 6.0), (4, 5.0, 5.0)], [1250.0] * 4)
c = bq.speedrun_comparison([ours], [ref])
print(f"{c['ratio']:.3f} {c['worst'][0]} {c['worst'][3]:.4f} {c['ours_reach']}")
print("\n".join(bq.speedrun_report(c)[2:5]))
EOF
)
check "functions: ratio 1.25, worst 5% at step 2, 5.0 never reached" "$(head -1 <<< "$numbers")" "1.250 2 0.0500 None"
check "functions: the report says NO three times (speed, losses, time)" "$(grep -c 'NO' <<< "$numbers")" 3

# --- (c) --speedrun_repeats 2: ours again with seed 43 in its own log and folder, the reference
# again from the same copy; the comparison of each side's means, with each side's spread.
out=$(bench "$DIR/r" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun \
  --reference_script "$DIR/stand_in.py" --speedrun_repeats 2 --dry_run 2>&1)
check "repeats: ours' first run as without repeats" "$(grep -c "^=== ours_speedrun 1/2: .* -s 0 -o $DIR/r/ours_speedrun$" <<< "$out")" 1
check "repeats: ours' second with seed 43, its own folder" \
  "$(grep -c "^=== ours_speedrun 2/2: .* -s 0 -S 43 -o $DIR/r/ours_speedrun_2$" <<< "$out")" 1
check "repeats: the reference twice in its folder" "$(grep -c "^=== ref_speedrun [12]/2 (in $DIR/r/ref_speedrun): " <<< "$out")" 2
err=$(bench "$DIR/r" --train 't_*.bin' --val 'v_*.bin' --runs ours_speedrun --speedrun_repeats 0 --dry_run 2>&1)
check "--speedrun_repeats 0: exit 1 with one line" "$?:$(wc -l <<< "$err")" 1:1
# The second runs: ours 600 ms a step, val 6.09 and 5.00; the reference 1200 ms a step, 5.94 and 5.00.
mkdir -p "$DIR/s/ref_speedrun"
cp "$DIR/g/ours_speedrun.log" "$DIR/s/ours_speedrun.log"
cp "$DIR/g/ref_speedrun/output.log" "$DIR/s/ref_speedrun/output.log"
sed -e 's/| 500.00 ms/| 600.00 ms/' -e 's/val loss 6.030000/val loss 6.090000/' -e 's/val loss 4.980000/val loss 5.000000/' \
  "$DIR/g/ours_speedrun.log" > "$DIR/s/ours_speedrun_2.log"
awk '{ if (match($0, /train_time:[0-9]+ms/)) { t = substr($0, RSTART + 11, RLENGTH - 13) * 1.2;
  $0 = substr($0, 1, RSTART - 1) "train_time:" t "ms" substr($0, RSTART + RLENGTH) } print }' \
  "$DIR/g/ref_speedrun/output.log" | sed 's/val_loss:6.0000/val_loss:5.9400/' > "$DIR/s/ref_speedrun/output_2.log"
# Ours' second run sampled its GPU: two busy samples (one under the power cap), one idle, one that
# nvidia-smi could not read; the table's cell is the busy ones' means.
printf '%s\n' "100, 1650, 690.5, 0x0000000000000004" "95, 1750, 650.5, 0x0000000000000000" \
  "10, 1980, 90.0, 0x0000000000000000" "[N/A], [N/A], 700.0, 0x0000000000000004" > "$DIR/s/ours_speedrun_2.log.gpu.csv"
out=$(bench "$DIR/s" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun \
  --target_run ref_speedrun --speedrun_repeats 2 2>&1)
check "repeats: the report from four finished outputs exits 0, reading all" "$?:$(grep -c '^=== .*: read ' <<< "$out")" 0:4
md="$DIR/s/quality.md"
check "repeats: each run its row (ours' second by its seed)" "$(grep '(seed 43)' "$md")" \
  "| train_gpt2cu, speedrun recipe (seed 43) | 4 | 5.0000 | 600.0 | 600.0 | 655360 | 1.8 | 1.8 | 1700 / 670 / 50% |"
check "repeats: a run without samples: '-' in the GPU column" "$(grep '(seed 42)' "$md" | awk -F'|' '{print $10}')" " - "
check "repeats: the means named" "$(grep -c '^- 2 runs of ours (seeds 42-43) and 2 of the reference (which sets no seed)' "$md")" 1
check "repeats: ms/step of the means, 550 against 1100" \
  "$(grep -c '^- ms/step (mean of the timed steps): ours 550.0, reference 1100.0: 2.00x' "$md")" 1
check "repeats: the means 6.06 and 5.97 at step 2 differ by 1.51%" \
  "$(grep -c '^- validation loss: largest relative difference 1.51% at step 2 (within 1% at every validation: NO)$' "$md")" 1
check "repeats: each side's spread there" "$(grep -c "^- the runs' own spread at step 2 (highest over lowest loss): ours 1.00%, the reference 1.01%$" "$md")" 1
# Ours' mean curve: 6.06 at 0.55 s, 4.99 at 1.65 s; the reference's mean final 5.0 after 4.4 s.
check "repeats: time to the reference's mean final loss" \
  "$(grep -c "^- ours reaches the reference's final validation loss 5.0000 in 1.64 s; the reference trained 4.40 s" "$md")" 1
# Each side's standard deviation at step 2 is 0.0424 (0.06 apart over two runs): the difference's
# standard error is 0.0424 / 5.97 = 0.71%, 0.09 is 2.1 of it, and 0.5% of 5.97 as the standard error
# takes (2 x 0.0424^2) / 0.02985^2 = 4.04, so 5 runs a side.
check "repeats: per-step table with each side's lowest and highest, and the standard error" "$(grep '^| 2 |' "$md")" \
  "| 2 | 5.9700 | 5.9400-6.0000 | 6.0600 | 6.0300-6.0900 | 1.51% | 0.71% |"
check "repeats: step 0, the same losses everywhere: a standard error of 0" "$(grep '^| 0 |' "$md" | awk -F'|' '{print $8}')" " 0.00% "
check "repeats: the difference in standard errors, and the runs a side for 1% at two" \
  "$(grep -c "^- there the difference of the means is 2.1 standard errors of it (0.71%, .*); a standard error of 0.5% (so that 1% is two of them) would take about 5 runs a side$" "$md")" 1
# --reference_repeats: the sides' finished runs differ in number (a session held fewer of one side).
mkdir -p "$DIR/s1/ref_speedrun"
cp "$DIR/s"/ours_speedrun*.log "$DIR/s1/"
cp "$DIR/s/ref_speedrun/output.log" "$DIR/s1/ref_speedrun/"
out=$(bench "$DIR/s1" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun \
  --target_run ref_speedrun --speedrun_repeats 2 --reference_repeats 1 2>&1)
check "--reference_repeats 1: ours' two runs and the reference's one read" "$?:$(grep -c '^=== .*: read ' <<< "$out")" 0:3
check "--reference_repeats 1: the sides' counts named" \
  "$(grep -c '^- 2 runs of ours (seeds 42-43) and 1 of the reference (which sets no seed)' "$DIR/s1/quality.md")" 1
check "--reference_repeats 1: ours' mean 6.06 against the reference's 6.00 at step 2" \
  "$(grep '^| 2 |' "$DIR/s1/quality.md" | cut -d'|' -f2-7)" " 2 | 6.0000 | 6.0000-6.0000 | 6.0600 | 6.0300-6.0900 | 1.00% "
out=$(bench "$DIR/s1" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun \
  --target_run ref_speedrun --reference_script "$DIR/stand_in.py" --speedrun_repeats 1 --reference_repeats 2 \
  --dry_run 2>&1)
check "--reference_repeats 2 beside one of ours: the reference's first read, its second run" \
  "$(grep -c '^=== ref_speedrun 1/2: read ' <<< "$out"):$(grep -c '^=== ref_speedrun 2/2 (in ' <<< "$out")" 1:1
err=$(bench "$DIR/s1" --train 't_*.bin' --val 'v_*.bin' --runs ours_speedrun,ref_speedrun --reference_script \
  "$DIR/stand_in.py" --speedrun_repeats 3 --reference_repeats 2 --shared_init --dry_run 2>&1)
check "--reference_repeats 2 with --shared_init of 3 pairs: exit 1 with one line naming both" \
  "$?:$(wc -l <<< "$err"):$(grep -c 'reference_repeats 2.*--shared_init' <<< "$err")" 1:1:1

# --- (d) the GPU sampler, with a stand-in nvidia-smi on the PATH that records its arguments and
# prints a sample every 0.1 s until it is stopped.
mkdir -p "$DIR/smi"
cat > "$DIR/smi/nvidia-smi" <<EOF
#!/bin/sh
echo "\$@" > "$DIR/smi/arguments"
while true; do echo "100, 1600, 700.0, 0x0000000000000004"; sleep 0.1; done
EOF
chmod +x "$DIR/smi/nvidia-smi"
PATH="$DIR/smi:$PATH" CUDA_VISIBLE_DEVICES=3,1 "$PY" - "$DIR/smi/samples.csv" <<'EOF'
import sys, time
sys.path.insert(0, "dev")
import bench_quality as bq
with bq.gpu_sampler(sys.argv[1]):
    time.sleep(0.5)
EOF
check "sampler: exits 0 and returns" "$?" 0
check "sampler: nvidia-smi asked for the visible GPU's fields in a loop" "$(cat "$DIR/smi/arguments")" \
  "--id=3 --query-gpu=utilization.gpu,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader,nounits --loop-ms=500"
check "sampler: its samples in the file" "$(sort -u "$DIR/smi/samples.csv")" "100, 1600, 700.0, 0x0000000000000004"
sleep 0.3
check "sampler: nvidia-smi stopped with the body" "$(pgrep -f "$DIR/smi/nvidia-smi" | wc -l)" 0
check "sampler: without nvidia-smi no file" "$(PATH=/nonexistent "$(command -v "$PY")" -c 'import sys; sys.path.insert(0, "dev")
import bench_quality as bq
with bq.gpu_sampler(sys.argv[1]): pass
import os; print(os.path.exists(sys.argv[1]))' "$DIR/smi/none.csv" 2>&1)" False

# --- (e) --stop_after: the speedrun pair's runs end after a validation; outputs that went on are
# read up to it; the argument's errors; the stop itself on a stand-in command.
err=$(bench "$DIR/t" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_modern,ours_speedrun \
  --stop_after 2 --dry_run 2>&1)
check "--stop_after with a batch run: exit 1, one line naming it" "$?:$(wc -l <<< "$err"):$(grep -c 'not ours_modern$' <<< "$err")" 1:1:1
for bad in 3 4 0; do
  [ $bad = 0 ] && bad=-2
  err=$(bench "$DIR/t" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun \
    --stop_after $bad --dry_run 2>&1)
  check "--stop_after $bad (no validation step before --steps 4): exit 1, one line" "$?:$(wc -l <<< "$err")" 1:1
done
mkdir -p "$DIR/t/ref_speedrun"
cp "$DIR/g/ours_speedrun.log" "$DIR/t/"
cp "$DIR/g/ref_speedrun/output.log" "$DIR/t/ref_speedrun/"
out=$(bench "$DIR/t" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun \
  --target_run ref_speedrun --stop_after 2 2>&1)
check "--stop_after 2 over outputs that went on to step 4: both read, exit 0" "$?:$(grep -c '^=== .*: read ' <<< "$out")" 0:2
md="$DIR/t/quality.md"
check "--stop_after 2: said in the report" "$(grep -c 'each run stopped after its validation at step 2$' "$md")" 1
check "--stop_after 2: ours' row ends at step 2 (one counted step of 500 ms)" "$(grep '^| train_gpt2cu, speedrun recipe' "$md")" \
  "| train_gpt2cu, speedrun recipe | 2 | 6.0300 | 500.0 | 500.0 | 786432 | 0.5 | not reached | - |"
check "--stop_after 2: the comparison's steps 0 and 2 only" "$(grep -c '^| [0-9] | ' "$md"):$(grep -c '^| 4 | ' "$md")" 2:0

cat > "$DIR/stand_in_run.sh" <<'EOF'
#!/bin/sh
# A run that validates at step 2 and would then go on for a long time, in a child as well.
echo "step    1/4 | loss 7.0"
echo "step    2/4 | val loss 6.5"
sleep 31.25 &
echo "step    3/4 | loss 6.0"
wait
EOF
chmod +x "$DIR/stand_in_run.sh"
result=$("$PY" - "$DIR/stand_in_run.sh" "$DIR/stand_in_run.log" <<'EOF'
import sys, time
sys.path.insert(0, "dev")
import bench_quality as bq
start = time.time()
with open(sys.argv[2], "w") as log:
    status = bq.run_until([sys.argv[1]], None, log, False, lambda line: bq.validation_step("ours_speedrun", line) == 2)
print(status, time.time() - start < 10, open(sys.argv[2]).read().splitlines()[-1])
with open(sys.argv[2], "w") as log:
    print(bq.run_until(["sh", "-c", "echo one; exit 3"], None, log, False, None))
EOF
)
check "run_until: stopped at the validation (its log's last line), status 0, at once" "$(head -1 <<< "$result")" \
  "0 True step    2/4 | val loss 6.5"
check "run_until: without a stop, the command's own status" "$(tail -1 <<< "$result")" "3"
check "run_until: its log, the second command's line" "$(cat "$DIR/stand_in_run.log")" "one"
check "run_until: the session's child killed with it" "$(pgrep -f 'sleep 31.25' | wc -l)" 0
# A signal reaches the bench alone (the run is a session of its own): run_until kills the run first.
# SIGINT as Ctrl-C; SIGTERM through main's handler, as Ctrl-C (scripts/record89_pair.sh stops its
# benches with it).
signal_bench() {  # signal_bench SIGNAL NAME: the stand-in run under run_until, stopped by SIGNAL
  "$PY" - "$DIR/stand_in_run.sh" "$DIR/$2.log" 2> "$DIR/$2.err" <<'EOF' &
import signal, sys
sys.path.insert(0, "dev")
import bench_quality as bq
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
bq.interrupt_on_sigterm()
with open(sys.argv[2], "w") as log:
    bq.run_until([sys.argv[1]], None, log, False, None)
EOF
  local bench_pid=$!
  for _ in $(seq 50); do grep -q "step    3/4" "$DIR/$2.log" 2>/dev/null && break; sleep 0.1; done
  kill "-$1" $bench_pid
  wait $bench_pid
  check "run_until $2: the bench stops (status 130 or 1)" "$(case $? in 1|130) echo yes;; esac)" yes
  sleep 0.3
  check "run_until $2: the run's session killed" "$(pgrep -f 'sleep 31.25' | wc -l)" 0
}
signal_bench INT interrupted
signal_bench TERM terminated

# --- (f) --shared_init: each pair from the same weights.
out=$(bench "$DIR/p" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun \
  --reference_script "$DIR/stand_in.py" --speedrun_repeats 2 --shared_init --dry_run 2>&1)
check "--shared_init: dry run exits 0" "$?" 0
check "--shared_init: ours starts from the pair's BF16 file" \
  "$(grep -c -e "^=== ours_speedrun 1/2: ./train_gpt2cu -recipe speedrun -e $DIR/p/init_seed42.bin " \
    -e "^=== ours_speedrun 2/2: ./train_gpt2cu -recipe speedrun -e $DIR/p/init_seed43.bin .* -S 43 " <<< "$out")" 2
check "--shared_init: a dry run writes no init" "$(ls "$DIR/p" | grep -c init)" 0
copy="$DIR/p/ref_speedrun/train_gpt.py"
check "--shared_init: the copy loads \$SPEEDRUN_INIT after its broadcast" \
  "$(grep -A1 '^    dist.broadcast(param.detach(), 0)$' "$copy" | tail -1)" \
  'shared_init = torch.load(os.environ["SPEEDRUN_INIT"])  # bench_quality.py --shared_init'
check "--shared_init: the edited copy is valid Python" "$("$PY" -c "import ast, sys; ast.parse(open(sys.argv[1]).read()); print(1)" "$copy")" 1
err=$(bench "$DIR/p2" --train 't_*.bin' --val 'v_*.bin' --runs ours_speedrun --shared_init --dry_run 2>&1)
check "--shared_init without the reference: exit 1, one line" "$?:$(wc -l <<< "$err"):$(grep -c 'give --runs both' <<< "$err")" 1:1:1
out=$(bench "$DIR/p3" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun \
  --reference_script "$DIR/stand_in.py" --speedrun_repeats 2 --shared_init --init_seed 43 --dry_run 2>&1)
check "--init_seed 43: every pair from that init, ours' seeds still 42 and 43" \
  "$(grep -c -e "^=== ours_speedrun 1/2: .* -e $DIR/p3/init_seed43.bin .* -s 0 -o " \
    -e "^=== ours_speedrun 2/2: .* -e $DIR/p3/init_seed43.bin .* -s 0 -S 43 -o " <<< "$out")" 2
err=$(bench "$DIR/p4" --train 't_*.bin' --val 'v_*.bin' --runs ours_speedrun,ref_speedrun --init_seed 43 --dry_run 2>&1)
check "--init_seed without --shared_init: exit 1, one line" "$?:$(wc -l <<< "$err"):$(grep -c 'give --shared_init too' <<< "$err")" 1:1:1

# Finished outputs of a --shared_init bench are read again (no init written): the reference's
# signature, its edits' line breaks written as \n, is the log's one first line.
flags=(--train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun
  --target_run ref_speedrun --shared_init)
mkdir -p "$DIR/q/ref_speedrun"
for name in ours_speedrun ref_speedrun; do
  "$PY" -c 'import sys; sys.path.insert(0, "dev"); import bench_quality as bq
print(bq.COMMAND_MARK + bq.run_signature(sys.argv[1], bq.parse_args(sys.argv[2:])))' "$name" "$DIR/q" "${flags[@]}" \
    > "$DIR/q/signature_$name"
  [ $name = ref_speedrun ] && log="$DIR/q/ref_speedrun/output.log" src="$DIR/g/ref_speedrun/output.log" ||
    log="$DIR/q/$name.log" src="$DIR/g/$name.log"
  cat "$DIR/q/signature_$name" "$src" > "$log"
done
check "--shared_init: the reference's signature is one line, with its load" \
  "$(wc -l < "$DIR/q/signature_ref_speedrun"):$(grep -c 'dist.broadcast(param.detach(), 0)\\nshared_init = torch.load' "$DIR/q/signature_ref_speedrun")" 1:1
out=$(bench "$DIR/q" "${flags[@]}" 2>&1)
check "--shared_init: finished outputs are read, none run, no init written" \
  "$?:$(grep -c '^=== .*: read ' <<< "$out"):$(ls "$DIR/q" | grep -c '^init')" 0:2:0

# The init's tensors (tiny speedrun: 12 layers, C 128, 2 heads), every parameter made non-zero,
# loaded by the copy's own lines into a stand-in of record #28's parameter table (written from its
# GPT, Block, CausalSelfAttention and MLP: names, shapes, layer 7 without attention, 5 L scalars).
result=$("$PY" - "$DIR" <<'EOF'
import os, sys, torch, torch.nn as nn
sys.path.insert(0, "dev")
sys.path.insert(0, ".")
import bench_quality as bq, train_gpt2 as tg
config = tg.make_config(*tg.SPEEDRUN_PRESETS["tiny"], source="tiny", arch="speedrun")
ours = tg.GPT(config)
tg.init_weights(ours, 5)
torch.manual_seed(5)
with torch.no_grad():
    for p in ours.parameters():
        p.add_(torch.randn_like(p))
L, C, NH, Vp = config.num_layers, config.channels, config.num_heads, config.padded_vocab_size

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkvo_w = nn.Parameter(torch.zeros(4, C, C))
        self.dampen = nn.Linear(C // 64, NH, bias=False)

class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.c_proj = nn.Parameter(torch.zeros(C, 4 * C)), nn.Parameter(torch.zeros(C, 4 * C))

class Block(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.attn = Attention() if i != 7 else None
        self.mlp = Mlp()

class Reference(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(Vp, C).bfloat16()
        self.value_embeds = nn.ModuleList([nn.Embedding(Vp, C).bfloat16() for _ in range(3)])
        self.blocks = nn.ModuleList([Block(i) for i in range(L)])
        self.lm_head = nn.Linear(C, Vp, bias=False)
        self.scalars = nn.Parameter(torch.zeros(5 * L))

path = os.path.join(sys.argv[1], "tiny_init.pt")
torch.save(bq.reference_init_tensors(ours), path)
os.environ["SPEEDRUN_INIT"] = path
load = bq.REFERENCE_SHARED_INIT.split("\n", 1)[1]  # the lines after the broadcast
model = Reference()
exec(load, {"torch": torch, "os": os, "model": model})
bf = lambda t: t.detach().to(torch.bfloat16).float()
t, ok = ours.transformer, []
ok.append(torch.equal(model.embed.weight.float(), bf(t.wte.weight)))
ok.append(all(torch.equal(model.value_embeds[k].weight.float(), bf(t.ve[k].weight)) for k in range(3)))
for i in range(L):
    b, r = t.h[i], model.blocks[i]
    if i != 7:  # the reference's q, k, v: F.linear(x, qkvo_w[:3].flatten(end_dim=1)); o: qkvo_w[3]
        ok.append(torch.equal(r.attn.qkvo_w[:3].flatten(end_dim=1), bf(b.attn.c_attn.weight)))
        ok.append(torch.equal(r.attn.qkvo_w[3], bf(b.attn.c_proj.weight)))
        ok.append(torch.equal(r.attn.dampen.weight, bf(b.attn.gate.weight)))
    ok.append(torch.equal(r.mlp.c_fc.T, bf(b.mlp.c_fc.weight)))  # F.linear(x, c_fc.T)
    ok.append(torch.equal(r.mlp.c_proj, bf(b.mlp.c_proj.weight)))
ok.append(torch.equal(model.lm_head.weight, bf(ours.lm_head.weight)))
s = model.scalars
ok.append(torch.equal(s[:L // 2], bf(ours.skip_weights)) and torch.equal(s[L // 2:L], torch.ones(L // 2)))
ok.append(all(torch.equal(s[L + 2 * i:L + 2 * i + 2], bf(t.h[i].lambdas)) for i in range(L)))
ok.append(all(torch.equal(s[3 * L + 2 * i:3 * L + 2 * i + 2],
                          bf(t.h[i].attn.value_scales) if i != 7 else torch.full((2,), 0.5)) for i in range(L)))
print(len(ok), all(ok))
# A tensor of the wrong shape, and one the model does not have, stop the load.
for name, change in [("blocks.0.mlp.c_fc", lambda d: d.update({"blocks.0.mlp.c_fc": d["blocks.0.mlp.c_fc"].t()})),
                     ("extra", lambda d: d.update({"extra": torch.zeros(1)}))]:
    tensors = bq.reference_init_tensors(ours)
    change(tensors)
    torch.save(tensors, path)
    try:
        exec(load, {"torch": torch, "os": os, "model": Reference()})
        print(name, "loaded")
    except AssertionError as e:
        print(name, "refused:", str(e).split(":")[0])
EOF
)
check "--shared_init: every tensor of the stand-in loaded, each in its place (63 checks)" "$(head -1 <<< "$result")" "63 True"
check "--shared_init: a tensor of another shape stops the load" "$(sed -n 2p <<< "$result")" "blocks.0.mlp.c_fc refused: blocks.0.mlp.c_fc"
check "--shared_init: a tensor of no parameter stops the load" "$(sed -n 3p <<< "$result")" "extra refused: initial tensors of no parameter"

# Paired runs: the references' losses spread 10%, each of ours 0.1%, 0.2%, 0.3% above its pair.
# The pairs' differences have a standard deviation of 0.1%: a standard error of 0.058%, where each
# side's own spread would make it 3.9%.
paired=$("$PY" - <<'EOF'
import sys
sys.path.insert(0, "dev")
import bench_quality as bq
refs = [5.0, 5.25, 5.5]
ref = [([(0, 0.0, 10.0), (2, 2.0, r)], [1000.0] * 2) for r in refs]
ours = [([(0, 0.0, 10.0), (2, 1.0, r * (1 + d))], [500.0] * 2) for r, d in zip(refs, [0.001, 0.002, 0.003])]
for paired in (True, False):
    error, runs = bq.difference_error(bq.speedrun_comparison(ours, ref, paired), 2)
    print(f"{100 * error:.3f} {runs}")
print([line for line in bq.speedrun_report(bq.speedrun_comparison(ours, ref, True)) if "standard errors" in line][0])
EOF
)
check "paired: the standard error of the pairs' differences, 1 pair needed" "$(sed -n 1p <<< "$paired")" "0.058 1"
check "unpaired: each side's spread, 186 runs a side" "$(sed -n 2p <<< "$paired")" "3.933 186"
check "paired: the report says where its standard error comes from" \
  "$(grep -c "standard errors of it (0.06%, from the spread of the pairs' differences)" <<< "$paired")" 1

# --- (g) peer_speedrun: train_gpt2.py's speedrun recipe as a third side, compared with the
# reference as ours is. Its commands: its own init (seed 42, then 43), or the pair's file.
out=$(bench "$DIR/u" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs peer_speedrun \
  --speedrun_repeats 2 --python python3 --dry_run 2>&1)
check "peer_speedrun: dry run exits 0" "$?" 0
check "peer_speedrun: the port compiled, BF16, the FP8 head, the pair's steps and validation" \
  "$(grep '^=== peer_speedrun 1/2:' <<< "$out")" \
  "=== peer_speedrun 1/2: python3 train_gpt2.py --recipe speedrun --model d12 --seed 42 --input_bin 't_*.bin' --input_val_bin 'v_*.bin' --num_iterations 4 --val_every 2 --val_steps 40 --val_seq_len 262144 --dtype bfloat16 --fp8_head 1 --flash 1 --compile 1 --output_dir $DIR/u/peer_speedrun"
check "peer_speedrun: the second with seed 43, its own folder" \
  "$(grep -c "^=== peer_speedrun 2/2: .* --seed 43 .* --output_dir $DIR/u/peer_speedrun_2$" <<< "$out")" 1
out=$(bench "$DIR/u2" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ref_speedrun,peer_speedrun \
  --reference_script "$DIR/stand_in.py" --speedrun_repeats 2 --shared_init --init_seed 44 --dry_run 2>&1)
check "peer_speedrun --shared_init: from the pair's BF16 file" \
  "$(grep -c "^=== peer_speedrun [12]/2: .* train_gpt2.py --recipe speedrun --init_from $DIR/u2/init_seed44.bin --seed 4[23] " <<< "$out")" 2
err=$(bench "$DIR/u3" --train 't_*.bin' --val 'v_*.bin' --runs ours_speedrun,peer_speedrun --shared_init --dry_run 2>&1)
check "--shared_init without the reference (ours and the port): exit 1, one line" \
  "$?:$(wc -l <<< "$err"):$(grep -c 'give --runs both ref_speedrun' <<< "$err")" 1:1:1
# Its report, from finished outputs in its own lines (a validation line with its training time):
# the port 800 ms a step, val 6.09 at step 2 and 5.00 at 4, against the reference of (b).
mkdir -p "$DIR/v/ref_speedrun"
cp "$DIR/g/ours_speedrun.log" "$DIR/v/"
cp "$DIR/g/ref_speedrun/output.log" "$DIR/v/ref_speedrun/"
sed -e 's/| 500.00 ms | \(.*\) | ETA .*$/| 800.00 ms | \1/' -e 's/| val loss 6.030000/| train time 0.800 s | val loss 6.090000/' \
  -e 's/| val loss 4.980000/| train time 2.400 s | val loss 5.000000/' -e 's/| val loss \(1[0-9.]*\)$/| train time 0.000 s | val loss \1/' \
  "$DIR/g/ours_speedrun.log" > "$DIR/v/peer_speedrun.log"
out=$(bench "$DIR/v" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 \
  --runs ours_speedrun,ref_speedrun,peer_speedrun --target_run ref_speedrun 2>&1)
check "peer_speedrun: the report from three finished outputs exits 0, reading all" "$?:$(grep -c '^=== .*: read ' <<< "$out")" 0:3
md="$DIR/v/quality.md"
check "peer_speedrun: its row" "$(grep '^| PyTorch, speedrun recipe' "$md")" \
  "| PyTorch, speedrun recipe | 4 | 5.0000 | 800.0 | 800.0 | 491520 | 2.4 | 2.4 | - |"
check "peer_speedrun: ours' comparison as before, then the port's" \
  "$(grep -c -e "^speedrun recipe against record #28's script" -e "^the PyTorch port (train_gpt2.py --recipe speedrun) against record #28's script" "$md")" 2
check "peer_speedrun: the port's speed, without ours' target" \
  "$(grep -c '^- ms/step (mean of the timed steps): the port 800.0, reference 1000.0: 1.25x$' "$md")" 1
check "peer_speedrun: its largest difference, 1.50% at step 2" \
  "$(grep -c '^- validation loss: largest relative difference 1.50% at step 2 (within 1% at every validation: NO)$' "$md")" 1
check "peer_speedrun: the time it reaches the reference's final loss, without ours' target" \
  "$(grep -c "^- the port reaches the reference's final validation loss 5.0000 in 2.40 s; the reference trained 4.00 s$" "$md")" 1
check "peer_speedrun: its per-step table" "$(grep -A4 '^| step | reference val loss | the port |' "$md" | tail -1)" \
  "| 4 | 5.0000 | 5.0000 | 0.00% |"

# --- (g) two benches in one OUTDIR: a run that one bench is making is not started by another over
# its log. The holder locks two runs as a bench that makes them does (lock_runs), then waits.
mkdir -p "$DIR/w"
printf '%s\n' "step    1/4 | loss 7.0" > "$DIR/w/ours_speedrun.log"
cp "$DIR/w/ours_speedrun.log" "$DIR/w/partial.log"
"$PY" - "$DIR/w" <<'EOF' &
import os, sys, time
sys.path.insert(0, "dev")
import bench_quality as bq
args = bq.parse_args([sys.argv[1], "--train", "t_*.bin", "--val", "v_*.bin", "--steps", "4", "--val_every", "2"])
locks = bq.lock_runs(args, [("ours_speedrun", 1), ("ref_speedrun", 1)])
open(os.path.join(sys.argv[1], "held"), "w").close()
while not os.path.exists(os.path.join(sys.argv[1], "release")):
    time.sleep(0.05)
EOF
holder=$!
for _ in $(seq 100); do [ -f "$DIR/w/held" ] && break; sleep 0.05; done
# Not a dry run: were the run started, its log would be rewritten (the trainer then failing on the
# made-up shards, or missing).
err=$(bench "$DIR/w" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun 2>&1)
check "a run another bench is making: exit 1, one line naming the run and that bench's pid" \
  "$?:$(wc -l <<< "$err"):$(grep -c "ours_speedrun.log: ours_speedrun is being run by another bench_quality.py (pid $holder) in this OUTDIR" <<< "$err")" 1:1:1
check "a run another bench is making: its log untouched" "$(cmp "$DIR/w/ours_speedrun.log" "$DIR/w/partial.log" && echo same)" same
err=$(bench "$DIR/w" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ref_speedrun \
  --reference_script "$DIR/stand_in.py" --dry_run 2>&1)
check "the reference another bench is making: exit 1, its copy not written" \
  "$?:$(grep -c 'ref_speedrun is being run by another' <<< "$err"):$(test -e "$DIR/w/ref_speedrun/train_gpt.py" && echo copy)" 1:1:
out=$(bench "$DIR/w" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_modern --dry_run 2>&1)
check "another run in the same OUTDIR at the same time: exit 0" "$?:$(grep -c '^=== ours_modern: ' <<< "$out")" 0:1
touch "$DIR/w/release"
wait $holder
out=$(bench "$DIR/w" --train 't_*.bin' --val 'v_*.bin' --steps 4 --val_every 2 --runs ours_speedrun,ref_speedrun \
  --reference_script "$DIR/stand_in.py" --dry_run 2>&1)
check "the holder gone, its locks are free: exit 0, the copy written" \
  "$?:$(test -f "$DIR/w/ref_speedrun/train_gpt.py" && echo copy)" 0:copy

# --- (h) record #89's pair: the commands, the kit's, the refusals, and the report from fabricated
# outputs stopped after step 500 (their schedules still 1,285 steps).
mkdir -p "$DIR/ref89"
touch "$DIR/ref89/train_gpt.py" "$DIR/vocab.bin"
R89=(--runs ours_record89,ref_record89 --reference89 "$DIR/ref89" --tokenizer "$DIR/vocab.bin")
out=$(bench "$DIR/p" --train 't_*.bin' --val 'v_*.bin' "${R89[@]}" --speedrun_repeats 2 --dry_run 2>&1)
check "record89: dry run exits 0" "$?" 0
check "record89: ours' command (the recipe's schedule, -tk, -m = 10,485,760 / 262,144)" \
  "$(grep -c "^=== ours_record89 1/2: ./train_gpt2cu -recipe record89 -i 't_\*.bin' -j 'v_\*.bin' -tk $DIR/vocab.bin -m 40 -s 0 -o $DIR/p/ours_record89$" <<< "$out")" 1
check "record89: ours' second run with seed 43" "$(grep -c "^=== ours_record89 2/2: .* -S 43 -o $DIR/p/ours_record89_2$" <<< "$out")" 1
check "record89: the kit's command (shards as many passes as read, the validation tokens, the python)" \
  "$(grep -c "^=== ref_record89's script offline: .*dev/reference89_offline.py $DIR/p/ref_record89/kit --reference $DIR/ref89 --train 't_\*.bin' --val 'v_\*.bin' --passes auto --val_tokens 10485760 --python " <<< "$out")" 1
check "record89: the reference run twice from the kit's folder" \
  "$(grep -c "^=== ref_record89 [12]/2 (in $DIR/p/ref_record89/kit): bash run.sh$" <<< "$out")" 2
check "record89: a dry run makes no kit" "$(test -e "$DIR/p/ref_record89/kit" && echo kit)" ""
out=$(bench "$DIR/p" --train 't_*.bin' --val 'v_*.bin' "${R89[@]}" --reference89_profile_steps 10,430 --dry_run 2>&1)
check "record89: --reference89_profile_steps goes to the kit" \
  "$?:$(grep -c "^=== ref_record89's script offline: .*dev/reference89_offline.py .* --python .* --profile_steps 10,430$" <<< "$out")" 0:1
err=$(bench "$DIR/p" --train 't_*.bin' --val 'v_*.bin' --runs ref_record89 --dry_run 2>&1)
check "record89: no --reference89: exit 1, one line" "$?:$(grep -c '^error: ref_record89 needs --reference89 DIR' <<< "$err")" 1:1
err=$(bench "$DIR/p" --train 't_*.bin' --val 'v_*.bin' --runs ours_record89 --dry_run 2>&1)
check "record89: no --tokenizer: exit 1, one line" "$?:$(grep -c '^error: ours_record89 needs --tokenizer FILE' <<< "$err")" 1:1
err=$(bench "$DIR/p" --train 't_*.bin' --val 'v_*.bin' "${R89[@]}" --stop_after 300 --dry_run 2>&1)
check "record89: --stop_after off its validations: exit 1" \
  "$?:$(grep -c '^error: --stop_after 300: ours_record89 needs a validation step before its last, 1285 (a multiple of 250)$' <<< "$err")" 1:1
err=$(bench "$DIR/p" --train 't_*.bin' --val 'v_*.bin' "${R89[@]}" --speedrun_val_tokens 1048576 --dry_run 2>&1)
check "record89: validation tokens of no whole batch: exit 1" "$?:$(grep -c '^error: --speedrun_val_tokens 1048576: record #89' <<< "$err")" 1:1
err=$(bench "$DIR/p" --train 't_*.bin' --val 'v_*.bin' --runs ours_speedrun,ref_speedrun,ours_record89 \
  --reference_script "$DIR/stand_in.py" --tokenizer "$DIR/vocab.bin" --shared_init --dry_run 2>&1)
check "record89: --shared_init refused for its runs" "$?:$(grep -c '^error: --shared_init pairs record #28' <<< "$err")" 1:1
# A kit an earlier bench made for other shards is not run as this one's: one line, status 1, before any run.
mkdir -p "$DIR/k/ref_record89/kit"
echo "other.py $DIR/k/ref_record89/kit --train 'x_*.bin'" > "$DIR/k/ref_record89/kit_command.txt"
err=$(bench "$DIR/k" --train 't_*.bin' --val 'v_*.bin' --runs ref_record89 --reference89 "$DIR/ref89" 2>&1 >/dev/null)
check "record89: another command's kit: exit 1, one line naming it" \
  "$?:$(wc -l <<< "$err"):$(grep -c "^error: $DIR/k/ref_record89/kit was made by other.py .*give another OUTDIR, or remove it$" <<< "$err")" 1:1:1
check "record89: ... and no run started" "$(test -e "$DIR/k/ref_record89/output.log" && echo started)" ""
# Ours: 200 ms a step (step 1, tuning, not counted), final 3.95 at step 500; the reference 250 ms a step,
# 4.0. Each output goes on past step 500, which the report does not read.
mkdir -p "$DIR/q/ref_record89"
{
  echo "step:0/1285 val_loss:10.8250 train_time:0ms step_avg:0.03ms"
  for s in $(seq 1 501); do
    echo "step:$s/1285 train_time:$((s * 250))ms step_avg:250.00ms"
    [ $s = 250 ] && echo "step:250/1285 val_loss:4.5000 train_time:62500ms step_avg:250.00ms"
    [ $s = 500 ] && echo "step:500/1285 val_loss:4.0000 train_time:125000ms step_avg:250.00ms"
  done
} > "$DIR/q/ref_record89/output.log"
{
  echo "step    0/1285 | val loss 10.830000"
  for s in $(seq 1 501); do
    ms=$([ $s = 1 ] && echo 9000.00 || echo 200.00)
    echo "step $s/1285 | loss 5.000000 | norm 1.0000 | lr 1.000e+00 | $ms ms | MFU 1.0% | 655360 tok/s | ETA 1s"
    [ $s = 250 ] && echo "step  250/1285 | val loss 4.460000"
    [ $s = 500 ] && echo "step  500/1285 | val loss 3.950000"
  done
} > "$DIR/q/ours_record89.log"
out=$(bench "$DIR/q" --train 't_*.bin' --val 'v_*.bin' "${R89[@]}" --stop_after 500 --target_run ref_record89 2>&1)
check "record89: report from finished outputs exits 0, both read" "$?:$(grep -c '^=== .*: read ' <<< "$out")" 0:2
md="$DIR/q/quality.md"
# Tokens up to step 500: 423 x 131,072 + 77 x 262,144 = 75,628,544; ours over 499 x 0.2 s, the reference's over 125 s.
check "record89: ours' row (200 ms a step, the tokens to step 500 over 99.8 s)" \
  "$(grep '^| train_gpt2cu, record89 recipe' "$md" | head -n1 | cut -d'|' -f2-7)" \
  " train_gpt2cu, record89 recipe | 500 | 3.9500 | 200.0 | 200.0 | 757801 "
check "record89: the reference's row" "$(grep "^| record #89's train_gpt.py" "$md" | head -n1 | cut -d'|' -f2-7)" \
  " record #89's train_gpt.py | 500 | 4.0000 | 250.0 | 250.0 | 605028 "
check "record89: the comparison's heading, ratio without record #28's target" \
  "$(grep -c '^record89 recipe against record #89.s script' "$md"):$(grep -c '^- ms/step (mean of the timed steps): ours 200.0, reference 250.0: 1.25x$' "$md")" 1:1
check "record89: largest difference 1.25% at step 500, over 1%" \
  "$(grep -c '^- validation loss: largest relative difference 1.25% at step 500 (within 1% at every validation: NO)$' "$md")" 1
check "record89: the stages' table, the reference's 250 ms in stages 1 and 2, no stage 3 by step 500" \
  "$(grep "^| record #89's train_gpt.py |" "$md" | tail -n1)" "| record #89's train_gpt.py | 250.0 | 250.0 | - |"

# ms a step by stage: ours 200 ms to step 423 and 300 ms from step 424 (stage 2) on.
mkdir -p "$DIR/stages89/ref_record89"
cp "$DIR/q/ref_record89/output.log" "$DIR/stages89/ref_record89/"
{
  echo "step    0/1285 | val loss 10.830000"
  for s in $(seq 1 501); do
    ms=$([ $s = 1 ] && echo 9000.00 || { [ $s -le 423 ] && echo 200.00 || echo 300.00; })
    echo "step $s/1285 | loss 5.000000 | norm 1.0000 | lr 1.000e+00 | $ms ms | MFU 1.0% | 655360 tok/s | ETA 1s"
    [ $s = 250 ] && echo "step  250/1285 | val loss 4.460000"
    [ $s = 500 ] && echo "step  500/1285 | val loss 3.950000"
  done
} > "$DIR/stages89/ours_record89.log"
bench "$DIR/stages89" --train 't_*.bin' --val 'v_*.bin' "${R89[@]}" --stop_after 500 > /dev/null 2>&1
check "record89: ours' stages (200 ms to step 423, 300 ms after)" \
  "$(grep '^| train_gpt2cu, record89 recipe |' "$DIR/stages89/quality.md" | tail -n1)" \
  "| train_gpt2cu, record89 recipe | 200.0 | 300.0 | - |"

finish test_bench_quality
