#!/usr/bin/env bash
# Runs every test of the project (called by `make test` after the builds) and ends with the line
# "N passed, N failed, N skipped": tests passed and failed, and groups of GPU tests not run (named
# on the line before). Each test's output goes to the terminal and to build/test_logs/NAME.log
# (the shell tests of dev/test, which run one a core at a time, show theirs as each ends).
#
# Environment: PYTHON (a python with torch, for the reference tensors), TINYSHAKESPEARE (path of
# the tiny shakespeare text; default dev/data/tinyshakespeare/input.txt when it has been
# downloaded), GPU=0 to skip the GPU tests on a GPU machine, TEST_JOBS (default: the number of
# cores) to run the shell tests that many at a time, GPU_TEST_JOBS (default half the cores, at
# most 8, and one for each 24 GiB of free GPU memory) the chains of gpu_against_pytorch (a reference
# and its checks) that many at a time,
# GPU_LANES (default 1) to run the GPU groups in that many lanes side by side on the GPU, each lane
# in its own copy of the built tree (a GPU with memory to spare: the lanes' processes share it).
# `scripts/run_tests.sh --gpu-only [GROUP...]` runs only the GPU tests (only the groups named, in
# that order, when some are), with binaries already built.
#
# usage: scripts/run_tests.sh [--gpu-only [GROUP...]]   (-h, --help: this help)
set -u
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"
GPU_ONLY=0
SELECTED_GROUPS=()
if [ "${1:-}" = --gpu-only ]; then
  GPU_ONLY=1
  shift
  SELECTED_GROUPS=("$@")
elif [ $# -gt 0 ]; then
  echo "error: unknown argument '$1': give no arguments, or --gpu-only [GROUP...]" >&2
  exit 1
fi

PYTHON=${PYTHON:-python3}
if [ -z "${TINYSHAKESPEARE:-}" ] && [ -f dev/data/tinyshakespeare/input.txt ]; then
  TINYSHAKESPEARE=dev/data/tinyshakespeare/input.txt
fi
export TINYSHAKESPEARE=${TINYSHAKESPEARE:-}
REF=build/ref
LOGS=build/test_logs
mkdir -p "$REF" "$LOGS"

passed=0
failed=0
failures=()

run() {
  local name=$1
  shift
  echo "=== $name: $*"
  local start=$SECONDS
  "$@" > >(tee "$LOGS/$name.log") 2>&1
  local status=$?
  wait
  tally "$name" $status $((SECONDS - start))
}

# tally NAME STATUS SECONDS: a test's PASS or FAIL line, and its count.
tally() {
  if [ "$2" -eq 0 ]; then
    echo "--- PASS $1 ($3 s)"
    passed=$((passed + 1))
  else
    echo "--- FAIL $1 (exit $2, $3 s; log in $LOGS/$1.log)"
    failed=$((failed + 1))
    failures+=("$1")
  fi
}

# run_in_background NAME COMMAND...: run's test, one a core at a time (TEST_JOBS to change it),
# its output going to its log alone; report_ended_tests shows the log and run's lines of each test
# that has ended, wait_for_background_tests waits for every one. Each test's status and seconds
# are written in LOGS/NAME.ended as it ends.
TEST_JOBS=${TEST_JOBS:-$(nproc)}
background_tests=()  # "NAME COMMAND..." of each test started and not yet shown
run_in_background() {
  local name=$1
  shift
  while [ ${#background_tests[@]} -ge "$TEST_JOBS" ]; do
    sleep 0.2
    report_ended_tests
  done
  rm -f "$LOGS/$name.ended"
  ( start=$SECONDS
    "$@" > "$LOGS/$name.log" 2>&1
    echo "$? $((SECONDS - start))" > "$LOGS/$name.ended.tmp" && mv "$LOGS/$name.ended.tmp" "$LOGS/$name.ended" ) &
  background_tests+=("$name $*")
}

# run_chain_in_background CHAIN FUNCTION ARGS...: FUNCTION ARGS... as one job of
# run_in_background's, whose steps (each `run` by it) are tests of their own, run in order: in the
# job, `run` writes a step's output to its log and its status, seconds and command to
# LOGS/CHAIN.steps, which report_ended_tests shows and tallies step by step when the job ends. A
# chain is what must run in order, as a reference and then its checks; chains run side by side.
run_chain_in_background() {
  local chain=$1
  shift
  rm -f "$LOGS/$chain.steps"
  run_in_background "$chain" chain_steps "$chain" "$@"
}

chain_steps() {
  local chain=$1
  shift
  run() {
    local name=$1 start=$SECONDS
    shift
    "$@" > "$LOGS/$name.log" 2>&1
    echo "$? $((SECONDS - start)) $name $*" >> "$LOGS/$chain.steps"
  }
  "$@"
}

# A chain's steps as run shows a test; the chain itself as a test only where it failed outside them.
report_chain() {
  local chain=$1 status=$2 seconds=$3 step_status step_seconds step command
  while read -r step_status step_seconds step command; do
    echo "=== $step: $command"
    cat "$LOGS/$step.log"
    tally "$step" "$step_status" "$step_seconds"
  done < "$LOGS/$chain.steps"
  rm -f "$LOGS/$chain.steps"
  if [ "$status" -ne 0 ]; then
    cat "$LOGS/$chain.log"
    tally "$chain" "$status" "$seconds"
  fi
}

report_ended_tests() {
  local entry name status seconds running=()
  for entry in "${background_tests[@]}"; do
    name=${entry%% *}
    if [ -f "$LOGS/$name.ended" ]; then
      read -r status seconds < "$LOGS/$name.ended"
      rm -f "$LOGS/$name.ended"
      if [ -f "$LOGS/$name.steps" ]; then
        report_chain "$name" "$status" "$seconds"
        continue
      fi
      echo "=== $name: ${entry#* }"
      cat "$LOGS/$name.log"
      tally "$name" "$status" "$seconds"
    else
      running+=("$entry")
    fi
  done
  background_tests=("${running[@]}")
}

wait_for_background_tests() {
  while [ ${#background_tests[@]} -gt 0 ]; do
    sleep 0.2
    report_ended_tests
  done
}

source dev/test/compare_runs.sh
source dev/test/record89_args.sh  # RECORD89_TEST

have_torch() { "$PYTHON" -c 'import torch' 2>/dev/null; }

# The modern recipe and GPT-2 with Muon, tiny, on the CPU (d12's Muon steps are the GPU group's:
# PyTorch's BF16 products on a CPU take minutes). The modern init zeroes the head, so no gradient
# would reach the blocks at the first step: the debug state starts from noise added to the init.
tiny_recipe_references() {
  run reference_modern_tiny "$PYTHON" train_gpt2.py --recipe modern --model tiny --debug_noise 0.02 \
    --write_debug_state "$REF" --batch_size 4 --seq_len 64 --debug_steps 10 --seed 42
  run reference_tiny_muon "$PYTHON" train_gpt2.py --model tiny --optimizer muon \
    --write_debug_state "$REF" --batch_size 4 --seq_len 64 --debug_steps 10 --seed 42
}

cpu_tests() {
# --- CPU: unit tests of llmc/ and the data tools
for t in build/test_*; do
  case "$t" in
    *_fp32|*.log) continue ;;
  esac
  [ -f "dev/test/$(basename "$t").cpp" ] || continue
  if [ "$(basename "$t")" = test_rand ] && have_torch; then
    "$PYTHON" dev/test/rand_reference.py "$REF/rand_reference.bin" >/dev/null && export RAND_REFERENCE="$REF/rand_reference.bin"
  fi
  run "$(basename "$t")" "$t"
done
# The shell tests, one a core at a time: most run on one core, much of it Python starting up.
# test_fuzz runs fuzzers on every core for a fixed time, and test_help fails on any file written in
# the tree while it runs: those two run alone, after the others.
for s in dev/test/test_*.sh; do
  case "$s" in
    */test_fuzz.sh|*/test_help.sh) ;;
    *) run_in_background "$(basename "$s" .sh)" bash "$s" ;;
  esac
done
wait_for_background_tests
run test_fuzz bash dev/test/test_fuzz.sh
run test_help bash dev/test/test_help.sh
run tokenizer_reference bash dev/test/tokenizer_reference.sh

# --- CPU: the reference trainer against PyTorch
if have_torch; then
  run reference_tiny "$PYTHON" train_gpt2.py --model tiny --write_debug_state "$REF" \
    --batch_size 4 --seq_len 64 --debug_steps 10 --seed 42
  run reference_d12 "$PYTHON" train_gpt2.py --model d12 --write_debug_state "$REF" \
    --batch_size 4 --seq_len 64 --debug_steps 10 --seed 42
  tiny_recipe_references
else
  echo "=== no python with torch ($PYTHON): install python3-torch (apt-get install python3-torch) to make the reference tensors"
  failed=$((failed + 1))
  failures+=("reference (torch missing)")
fi
run test_gpt2_tiny ./test_gpt2 "$REF/gpt2_tiny.bin" "$REF/gpt2_tiny_debug_state.bin" --init-seed 42 \
    --bf16 "$REF/gpt2_tiny_bf16.bin"
run test_gpt2_d12 ./test_gpt2 "$REF/gpt2_d12.bin" "$REF/gpt2_d12_debug_state.bin"

}

# Two runs of a trainer command must print the same loss lines and parameter checksum.
same_losses() {
  local a=$1 b=$2
  # -a: samples may hold bytes that make grep treat the log as binary
  grep -aE "^step .*loss|checksum" "$a" | sed 's/ | [0-9.]* ms .*//' > "$a.losses"
  grep -aE "^step .*loss|checksum" "$b" | sed 's/ | [0-9.]* ms .*//' > "$b.losses"
  [ -s "$a.losses" ] && diff "$a.losses" "$b.losses" && echo "identical: $(wc -l < "$a.losses") lines"
}

# The training losses of two runs differ by at most $3 at every step.
losses_track() {
  paste <(grep -aE "^step .*[|] loss" "$1" | awk '{print $5}') <(grep -aE "^step .*[|] loss" "$2" | awk '{print $5}') |
    awk -v tol="$3" '{d = $1 - $2; if (d < 0) d = -d; if (d > max) max = d; n++} END {
      printf "%d steps, largest loss difference %.4f (at most %s)\n", n, max, tol; exit !(n > 0 && max <= tol) }'
}

# Some training loss of two runs differs by more than $3: the control that shows losses_track can fail.
losses_part() {
  ! losses_track "$@"
}

# The validation loss at the last evaluation is below the first one by at least $2.
val_loss_falls() {
  awk -v margin="$2" '/^step .*[|] val loss/ {v[n++] = $NF} END {
    if (n < 2) { print "fewer than two validation losses"; exit 1 }
    printf "val loss %.4f -> %.4f\n", v[0], v[n-1]; exit !(v[n-1] < v[0] - margin) }' "$1"
}

# Every validation loss of two runs agrees within a relative $3.
val_losses_agree() {
  paste <(grep -aE "^step .*[|] val loss" "$1" | awk '{print $NF}') <(grep -aE "^step .*[|] val loss" "$2" | awk '{print $NF}') |
    awk -v tol="$3" '{d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > max) max = d; n++} END {
      printf "%d validations, largest relative difference %.3g (at most %s)\n", n, max, tol; exit !(n > 0 && max <= tol) }'
}

# The weights of 10 speedrun steps (d12, -b 4 -t 256 on the test data; the head and the output
# projections start at zero), which several groups start from: trained once a run of this script,
# at the first group that asks, into SPEEDRUN_TRAINED (removed when the groups are done).
SPEEDRUN_TRAINED_DIR=build/test_speedrun_trained
SPEEDRUN_TRAINED=$SPEEDRUN_TRAINED_DIR/model_00000010.bin
speedrun_trained_weights() {
  [ -n "${speedrun_trained_asked:-}" ] && return
  speedrun_trained_asked=1
  rm -rf "$SPEEDRUN_TRAINED_DIR"
  run speedrun_trained ./train_gpt2cu $COMMON -recipe speedrun -e d12 -b 4 -t 256 -vt 0 -z 1024 -x 10 -v 0 -s 0 \
    -o "$SPEEDRUN_TRAINED_DIR"
  rm -f "$SPEEDRUN_TRAINED_DIR"/state_*.bin  # only the weights are read
}

# Validation longer than -t (-vt) runs a forward pass of its own (one layer's activations, the head
# over chunks of -b x -t rows); its loss is the one validation at that length in the training
# passes' activations gives (-t = -vt): GPT-2 (causal) at its initialisation, the speedrun (documents,
# a window) after 10 steps (its head starts at zero, where every loss is ln Vp), in both builds. The
# chunks' head products may take other cuBLASLt algorithms than one product over every row, hence a
# bound rather than the same bits (H200: the same bits in both builds).
validation_length_test() {
  local binary spec name args
  speedrun_trained_weights
  for binary in train_gpt2cu train_gpt2fp32cu; do
    for spec in "gpt2:-e d12" "speedrun:-recipe speedrun -e $SPEEDRUN_TRAINED -z 2048 -aw 2"; do
      name=${binary#train_}_${spec%%:*} args=${spec#*:}
      run "validation_length_${name}" ./$binary $COMMON $args -b 4 -t 256 -vt 512 -x 0 -m 4 -s 0
      run "validation_at_t_${name}" ./$binary $COMMON $args -b 4 -t 512 -vt 0 -x 0 -m 4 -s 0
      run "validation_length_${name}_agrees" val_losses_agree "$LOGS/validation_length_${name}.log" \
        "$LOGS/validation_at_t_${name}.log" 1e-5
    done
  done
}

# Resume on one GPU: the shared comparison of dev/test/compare_runs.sh.
resume_test() {
  local binary=$1 name=$2
  shift 2
  resume_equivalence run "$name" "build/test_resume/$name" 1 "$binary" $COMMON -e d12 -b 4 -t 256 -v 10 -m 4 -s 0 "$@"
}

# HellaSwag and generation: a tiny model trained on the right endings of the sample set picks
# them (acc_norm at least 0.75, chance is 0.25), greedy decoding with the KV cache continues a
# context with its memorized ending, and seeded sampling prints the same text twice. Once with
# each architecture (hellaswag_and_generation_test's args: a run name, then the recipe's flags).
hellaswag_data() {
  local dir=build/test_hellaswag
  rm -rf "$dir"
  mkdir -p "$dir"
  "$PYTHON" - "$dir" <<'PY'
import json, sys
records = [json.loads(line) for line in open("dev/test/hellaswag_sample.jsonl") if line.strip()]
text = "".join(f"{r['ctx']} {r['endings'][r['label']]}\n\n" for r in records)
open(sys.argv[1] + "/correct.txt", "w").write(text * 200)
open(sys.argv[1] + "/prompt.txt", "w").write(records[0]["ctx"])
open(sys.argv[1] + "/answer.txt", "w").write(" " + records[0]["endings"][records[0]["label"]])
PY
  run hellaswag_prepare bash -c "./build/prepare_shards --input $dir/correct.txt --output_dir $dir \
    --name hs --val_tokens 2048 --documents blank_lines && ./build/hellaswag \
    --input dev/test/hellaswag_sample.jsonl --output $dir/hellaswag.bin"
}

hellaswag_and_generation_test() {
  local name=$1 data=build/test_hellaswag
  local dir=$data/$name
  shift
  run "${name}_hellaswag_train" ./train_gpt2cu -e tiny -i "$data/hs_train_*.bin" -j "$data/hs_val_*.bin" -b 4 \
    -t 64 -x 300 -v 100 -m 2 -s 0 -h 1 -hs "$data/hellaswag.bin" -o "$dir" "$@"
  run "${name}_hellaswag_accuracy" awk '/hellaswag acc_norm/ {a = $6} END {print "final acc_norm", a; exit !(a >= 0.75)}' \
    "$LOGS/${name}_hellaswag_train.log"
  run "${name}_generate_memorized" generate_continues "$dir/model_00000300.bin" "$data"
  for i in 1 2; do
    run "${name}_generate_seeded_$i" ./train_gpt2cu -e "$dir/model_00000300.bin" -p "The" -g 24 -temp 0.9 -topk 40 -S 7
  done
  run "${name}_generate_same" same_text "$LOGS/${name}_generate_seeded_1.log" "$LOGS/${name}_generate_seeded_2.log"
}

# HellaSwag within documents (-pd 1), where each row (context + ending, padded) is one document:
# d12 trained on the packed sample text with a one-block window picks the right endings, and the
# FP32 build, whose attention masks hidden keys to probability exactly 0, scores the set with the
# same counts with and without -pd 1.
hellaswag_documents_test() {
  local data=build/test_hellaswag dir=build/test_hellaswag/documents
  local files=(-i "$data/hs_train_*.bin" -j "$data/hs_val_*.bin" -hs "$data/hellaswag.bin" -b 4 -t 128)
  run documents_hellaswag_train ./train_gpt2cu -e d12 "${files[@]}" -x 300 -v 100 -m 2 -s 0 -h 1 -l 1e-3 -u 10 \
    -pd 1 -aw 1 -o "$dir"
  run documents_hellaswag_accuracy awk '/hellaswag acc_norm/ {a = $6} END {print "final acc_norm", a; exit !(a >= 0.75)}' \
    "$LOGS/documents_hellaswag_train.log"
  local evaluate=(./train_gpt2fp32cu -e "$dir/model_00000300.bin" "${files[@]}" -x 0 -h 1)
  run documents_hellaswag_causal "${evaluate[@]}"
  run documents_hellaswag_within "${evaluate[@]}" -pd 1 -aw 1
  run documents_hellaswag_same same_scores "$LOGS/documents_hellaswag_causal.log" \
    "$LOGS/documents_hellaswag_within.log"
}

# The two logs' HellaSwag lines are there and the same.
same_scores() {
  local a b
  a=$(grep "hellaswag acc_norm" "$1") && b=$(grep "hellaswag acc_norm" "$2") && echo "$a" && [ "$a" = "$b" ]
}

# Greedy decoding of the first example's context gives (the start of) its right ending.
generate_continues() {
  (set -o pipefail; ./train_gpt2cu -e "$1" -p "$(cat "$2/prompt.txt")" -g 6 -temp 0 | tee "$1.generated.txt") &&
    grep -qF "$(head -c 12 "$2/answer.txt")" "$1.generated.txt" && echo "continues with the memorized ending"
}

same_text() { [ -s "$1" ] && ! grep -q "^error" "$1" && cmp "$1" "$2" && echo "identical: $(wc -c < "$1") bytes"; }

# Starts a trainer in the background, sends it `signals` SIGTERMs once it has printed step n,
# and checks its exit status: 3 after one signal (step finished, checkpoint written), 143 after two.
interrupt_at_step() {
  local n=$1 signals=$2 expected=$3 log=$4
  shift 4
  "$@" > "$log" 2>&1 &
  local pid=$!
  until grep -qaE "^step +$n/" "$log"; do
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  for _ in $(seq "$signals"); do kill -TERM $pid; sleep 0.05; done  # apart: pending signals merge
  wait $pid
  local status=$?
  cat "$log"
  echo "exit status $status (expected $expected)"
  [ $status -eq "$expected" ]
}

# every_marked_checkpoint_loads DIR TRAINER_COMMAND...: each checkpoint in DIR with a DONE marker,
# copied alone into a directory of its own, resumes (-y 1) for no steps: its model and state files
# load and pass their checksums. A model file without a marker (a checkpoint cut short) is left
# alone. Fails when there is no marker at all.
every_marked_checkpoint_loads() {
  local dir=$1 marker step copy count=0 out
  shift
  for marker in "$dir"/DONE_*; do
    [ -e "$marker" ] || continue
    step=$((10#${marker##*DONE_}))
    copy="$dir.load_$step"
    rm -rf "$copy"
    mkdir -p "$copy"
    cp "$marker" "$dir/model_${marker##*DONE_}.bin" "$dir/state_${marker##*DONE_}"_*.bin "$copy/" || return 1
    out=$("$@" -o "$copy" -y 1 -x "$step" 2>&1)
    if ! grep -q "^resumed from the checkpoint of step $step in " <<< "$out"; then
      echo "the checkpoint of step $step does not load:"
      tail -3 <<< "$out"
      return 1
    fi
    count=$((count + 1))
  done
  echo "$count checkpoint(s) with a DONE marker in $dir, each loads"
  [ $count -gt 0 ]
}

# resumes_from_newest DIR TRAINER_COMMAND...: the command (a resume, -y 1) succeeds and starts
# from the newest checkpoint with a DONE marker in DIR.
resumes_from_newest() {
  local dir=$1 newest out status
  shift
  newest=$(ls "$dir" | sed -n 's/^DONE_0*//p' | sort -n | tail -1)
  out=$("$@" 2>&1)
  status=$?
  echo "$out"
  echo "exit status $status; the newest checkpoint with a DONE marker was step ${newest:-none}"
  [ $status -eq 0 ] && [ -n "$newest" ] && grep -q "^resumed from the checkpoint of step $newest in " <<< "$out"
}

# Preemption: a SIGTERM mid-run finishes the step, writes a checkpoint and exits with status 3,
# and resuming gives the log and final checkpoint of a run never interrupted. Two SIGTERMs exit
# at once (143), which can cut a checkpoint short; every one with a DONE marker loads, and the
# newest resumes.
signal_test() {
  local dir=build/test_signal
  rm -rf "$dir"
  mkdir -p "$dir"
  local args="$COMMON -e d12 -b 4 -t 256 -x 30 -v 10 -m 2 -s 0 -n 100"
  run signal_straight ./train_gpt2cu $args -o "$dir/straight"
  run signal_interrupt interrupt_at_step 7 1 3 "$dir/interrupt.txt" ./train_gpt2cu $args -o "$dir/resumed"
  run signal_resume ./train_gpt2cu $args -o "$dir/resumed" -y 1
  run signal_same_log same_log "$dir/straight/main.log" "$dir/resumed/main.log"
  run signal_same_model cmp "$dir/straight/model_00000030.bin" "$dir/resumed/model_00000030.bin"
  run signal_twice interrupt_at_step 5 2 143 "$dir/twice.txt" ./train_gpt2cu $args -n 2 -nk 2 -o "$dir/twice"
  run signal_twice_complete every_marked_checkpoint_loads "$dir/twice" ./train_gpt2cu $args -n 2 -nk 2
  run signal_twice_resume ./train_gpt2cu $args -n 2 -nk 2 -o "$dir/twice" -y 1 -x 30
}

# Checkpoints written in the background through a snapshot on the GPU (-ac 1, the default), from
# pinned host memory only (-ac 2) and before training goes on (-ac 0), one at every step: the same
# losses, and the same bytes in every file of every step.
async_checkpoint_test() {
  local binary=$1 name=$2 dir=build/test_async_checkpoints/$2
  rm -rf "$dir"
  local args="$COMMON -e tiny -b 4 -t 64 -x 8 -v 4 -m 2 -s 0 -n 1"
  run "${name}_snapshot" ./$binary $args -o "$dir/snapshot" -ac 1
  run "${name}_snapshot_on" grep -aE "^\| checkpoints +\| written in the background \(a snapshot on the GPU" "$LOGS/${name}_snapshot.log"
  run "${name}_pinned" ./$binary $args -o "$dir/pinned" -ac 2
  run "${name}_pinned_on" grep -aE "^\| checkpoints +\| written in the background \(pinned host memory\)" "$LOGS/${name}_pinned.log"
  run "${name}_synchronous" ./$binary $args -o "$dir/synchronous" -ac 0
  for mode in snapshot pinned; do
    run "${name}_${mode}_same_losses" same_losses "$LOGS/${name}_${mode}.log" "$LOGS/${name}_synchronous.log"
    run "${name}_${mode}_same_files" same_checkpoints_every_step "$dir/$mode" "$dir/synchronous" 8 1
  done
}

# kill_while_writing DIR STEP TRAINER_COMMAND...: starts the trainer in the background and kills it
# (SIGKILL) once the checkpoint of STEP has its DONE marker and a later one is being written (a
# temporary file in DIR).
kill_while_writing() {
  local dir=$1 step=$2
  shift 2
  "$@" > "$dir.out" 2>&1 &
  local pid=$!
  until [ -e "$dir/$(printf DONE_%08d "$step")" ] && compgen -G "$dir/*.tmp" > /dev/null; do
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
  done
  kill -KILL $pid
  wait $pid
  local status=$?
  tail -3 "$dir.out"
  echo "files left: $(ls "$dir" | xargs)"
  echo "exit status $status (expected 137, killed)"
  [ $status -eq 137 ]
}

# SIGKILL while a checkpoint is written in the background (one at every step of the tiny model, so
# one is always being written): every checkpoint with a DONE marker loads, -y 1 resumes from the
# newest, and the run ends as one never killed (its log, its last checkpoint).
kill_during_write_test() {
  local dir=build/test_kill_write
  rm -rf "$dir"
  mkdir -p "$dir"
  local args="$COMMON -e tiny -b 4 -t 64 -x 60 -v 20 -m 2 -s 0 -n 1 -nk 3"
  run kill_write_straight ./train_gpt2cu $args -o "$dir/straight"
  run kill_write_killed kill_while_writing "$dir/killed" 5 ./train_gpt2cu $args -o "$dir/killed"
  run kill_write_marked_load every_marked_checkpoint_loads "$dir/killed" ./train_gpt2cu $args
  run kill_write_resume resumes_from_newest "$dir/killed" ./train_gpt2cu $args -o "$dir/killed" -y 1
  run kill_write_same_log same_log "$dir/straight/main.log" "$dir/killed/main.log"
  run kill_write_same_files same_checkpoint "$dir/straight" "$dir/killed" 60 1
}

# fails_with REGEX COMMAND...: the command exits with status 1 and one line on stderr,
# "error: ..." matching REGEX.
fails_with() {
  local pattern=$1 err status
  shift
  { err=$("$@" 2>&1 1>&3 3>&-); status=$?; } 3>&1
  echo "stderr: $err"
  echo "exit status $status (expected 1)"
  [ $status -eq 1 ] && [ "$(wc -l <<< "$err")" -eq 1 ] && grep -qE "^error: .*$pattern" <<< "$err"
}

# marked_steps_are DIR "STEP ...": the steps with a DONE marker in DIR are these, and no temporary
# file is left there.
marked_steps_are() {
  local steps
  steps=$(ls "$1" | sed -n 's/^DONE_0*//p' | sort -n | xargs)
  echo "steps with a DONE marker: $steps (expected $2); temporary files: $(ls "$1" | grep -c '\.tmp$')"
  [ "$steps" = "$2" ] && ! compgen -G "$1/*.tmp" > /dev/null
}

# A checkpoint write that fails in the background stops the run with status 1 and one line naming
# the file and the reason; the checkpoints before it stay complete and resume. Two failures that
# need no privileges (root writes through permissions and may not mount a small tmpfs): a directory
# where the step-3 state file's temporary file goes, so opening it fails while the run trains on;
# and a file size limit (ulimit -f, SIGXFSZ ignored) under which writes past 32 MiB fail part-way
# as on a full disk (EFBIG for ENOSPC): the tiny model's file (14 MB) fits, its state file
# (82 MB) does not.
failed_write_test() {
  local dir=build/test_failed_write
  rm -rf "$dir"
  local args="$COMMON -e tiny -b 4 -t 64 -x 8 -v 0 -s 0 -n 1"
  mkdir -p "$dir/blocked/state_00000003_00000.bin.tmp"
  run failed_write_open fails_with "checkpoint write failed \(step 3\): cannot open $dir/blocked/state_00000003_00000\.bin\.tmp for writing: Is a directory; the earlier checkpoints in $dir/blocked are intact" \
    ./train_gpt2cu $args -o "$dir/blocked"
  rm -rf "$dir/blocked/state_00000003_00000.bin.tmp"
  run failed_write_open_intact marked_steps_are "$dir/blocked" "1 2"
  run failed_write_open_resume resumes_from_newest "$dir/blocked" ./train_gpt2cu $args -o "$dir/blocked" -y 1
  run failed_write_limit_first ./train_gpt2cu $args -o "$dir/limited" -halt 2
  run failed_write_limit fails_with "checkpoint write failed \(step 3\): $dir/limited/state_00000003_00000\.bin\.tmp: writing .* failed after .*: File too large" \
    bash -c 'trap "" XFSZ; ulimit -f 32768; exec "$@"' limited ./train_gpt2cu $args -o "$dir/limited" -y 1
  run failed_write_limit_intact marked_steps_are "$dir/limited" "1 2"
  run failed_write_limit_resume resumes_from_newest "$dir/limited" ./train_gpt2cu $args -o "$dir/limited" -y 1
}

# The GPU's compute capability is 8.9 or newer (Ada, Hopper): cuBLASLt runs FP8 products there. A
# query that gives no number (an older driver) says no.
fp8_gpu() {
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 |
    awk '$1 ~ /^[0-9]+(\.[0-9]+)?$/ { ok = $1 + 0 >= 8.9 } END { exit !ok }'
}

# The GPU tests, in groups; without a GPU each group is named as skipped.
GPU_GROUPS=(gpu_against_pytorch gpu_kernel_tests gpu_accumulation gpu_determinism
  gpu_hellaswag_generation gpu_preemption gpu_bad_input_output gpu_resume gpu_training)

# gpu_lanes N: GPU_GROUPS in N lanes side by side, the longest groups first, each to the lane with the
# least work by GPU_GROUP_SECONDS (one H200's, about); each lane runs this script's --gpu-only on its
# groups in a copy of the built tree (the groups write the same paths under build/), its output shown
# and its logs copied into LOGS when every lane has ended, its counts added to this run's.
declare -A GPU_GROUP_SECONDS=([gpu_against_pytorch]=420 [gpu_resume]=410 [gpu_kernel_tests]=200
  [gpu_determinism]=150 [gpu_training]=160 [gpu_bad_input_output]=100 [gpu_accumulation]=80
  [gpu_hellaswag_generation]=60 [gpu_preemption]=40)
gpu_lanes() {
  local lanes=$1 group lane best sorted root i
  [ "$lanes" -gt ${#GPU_GROUPS[@]} ] && lanes=${#GPU_GROUPS[@]}
  local -a lane_groups=() lane_seconds=() lane_dirs=() pids=()
  for ((i = 0; i < lanes; i++)); do lane_groups[i]=""; lane_seconds[i]=0; done
  sorted=$(for group in "${GPU_GROUPS[@]}"; do echo "${GPU_GROUP_SECONDS[$group]:-100} $group"; done | sort -rn -s -k1,1)
  while read -r _ group; do
    best=0
    for ((i = 1; i < lanes; i++)); do [ "${lane_seconds[i]}" -lt "${lane_seconds[best]}" ] && best=$i; done
    lane_groups[best]+=" $group"
    lane_seconds[best]=$((lane_seconds[best] + ${GPU_GROUP_SECONDS[$group]:-100}))
  done <<< "$sorted"
  root=$(mktemp -d "${TMPDIR:-/tmp}/gpu_lanes.XXXXXX")
  for ((i = 0; i < lanes; i++)); do
    lane_dirs[i]="$root/lane$i"
    mkdir -p "${lane_dirs[i]}"
    tar -cf - --exclude=./.git --exclude="./$LOGS" --exclude="./$REF/gpu_*" . | tar -xf - -C "${lane_dirs[i]}"
    echo "=== lane $i:${lane_groups[i]} (its output when it has ended, the lanes in order)"
    ( cd "${lane_dirs[i]}" &&
      GPU_LANES=1 GPU_TEST_JOBS=${GPU_TEST_JOBS:-4} scripts/run_tests.sh --gpu-only ${lane_groups[i]} \
        > "$root/lane$i.out" 2>&1 ) &
    pids[i]=$!
  done
  for ((i = 0; i < lanes; i++)); do
    wait "${pids[i]}"
    lane_report "$i" "$root/lane$i.out" "${lane_dirs[i]}"
  done
  rm -rf "$root"
}

# A lane's output shown, its logs copied into LOGS and its closing line's counts (and failed tests'
# names) added to this run's; a lane without that line counts as one failure, named lane_N.
lane_report() {
  local lane=$1 out=$2 dir=$3 summary names names_list
  cat "$out"
  cp -r "$dir/$LOGS/." "$LOGS/" 2>/dev/null
  summary=$(tail -n 1 "$out")
  if [[ "$summary" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    names=$(grep -a '^failed: ' "$out" | tail -n 1)
    [ -n "$names" ] && read -r -a names_list <<< "${names#failed: }" && failures+=("${names_list[@]}")
  else
    echo "--- FAIL lane_$lane (no closing line; its output above)"
    failed=$((failed + 1))
    failures+=("lane_$lane")
  fi
}

# --gpu-only runs what an earlier make built: every program the groups start must be there, or
# the run stops at once with one line naming the missing ones.
gpu_programs_built() {
  local missing=() program
  for program in ./train_gpt2cu ./train_gpt2fp32cu ./test_gpt2cu ./test_gpt2fp32cu build/prepare_shards \
                 build/hellaswag build/test_kernels build/test_kernels_fp32 build/test_attention_mma_sync; do
    [ -x "$program" ] || missing+=("$program")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "error: --gpu-only: not built: ${missing[*]}: run make cpu cuda first" >&2
  return 1
}

gpu_setup() {
  local data=dev/data/tinyshakespeare
  if [ ! -f $data/tiny_shakespeare_val_000000.bin ]; then
    if [ -n "$TINYSHAKESPEARE" ]; then
      run prepare_tinyshakespeare bash dev/data/tinyshakespeare.sh --input "$TINYSHAKESPEARE"
    else
      run prepare_tinyshakespeare bash dev/data/tinyshakespeare.sh
    fi
  fi
  COMMON_TRAIN="$data/tiny_shakespeare_train_*.bin"
  COMMON_VAL="$data/tiny_shakespeare_val_*.bin"
  COMMON="-i $COMMON_TRAIN -j $COMMON_VAL"
}

# Both CUDA builds against PyTorch references beyond the CPU ones: the d48 width with a sequence
# length that is not a power of two, and a full 1024-token sequence; attention within documents
# (train_gpt2.py --documents 1: rows of several documents, some of one token, one starting on a
# block's edge) without a window (tiny: the GEMM path in both builds) and with one (d12 GPT-2 and
# modern: the flash kernels in BF16, 12 layers' long and short windows); the speedrun's block
# (tiny and d12, documents and a window, Muon's 5 steps and momentum warmup; d12 also at the
# schedule's window of step 100 of 300, 5 blocks, whose short layers' 2 no other case reaches);
# the modern recipe with Muon's Polar Express (--muon_ns polar: test_gpt2cu reads it in the header),
# with NorMuon, and with record #89's Q and K in head pairs (--muon_qk_heads 2: 6 heads of 128, so
# blocks of [256, 768]; -mq 2 in the debug state's settings);
# the speedrun tiny with record #89's loss (its shifted cap, three next tokens and the prefix term:
# test_gpt2cu reads them and the prefix table in the debug state's settings, version 5; and the
# cap's sigmoid rounded to BF16, -lc 23,5,bf16), and with
# its windows counted in tokens (-awt 1, also in the settings: 256 tokens back from each query in
# the long layers, 128 in the short ones, over 3 blocks, the edge blocks masked token by token);
# and with AdamW on odd steps (-ao 2 in the settings: its gradients of two steps summed, its t its
# own count of updates, Muon every step), and with record #89's key offset (-ko 1 in the settings:
# layers 0, 4 and 11, the long-window ones; the rows as one sequence, so row 1's first key takes row
# 0's last; the flash kernels in BF16 with Hopper's QK-norm backward left to its own kernel there);
# and with AdamW's tensors' own rows (-ar in the settings: wte's, ve's and the head's betas, ve's and
# the lambdas' rates, the head's decay x 150 of -c 0.005, the scalars' none, as record #89's);
# and with record #89's smear and bigram embedding (the model file's header slot 9: their rows of
# parameters, the batch's rows as one flat sequence, the bigram table's 377,280 rows, the fixed sign
# table, the gates before layer 0 and after attention); and with record #89's rotary pairs (the
# model file's header slot 9: adjacent pairs, positions over the batch's rows as one sequence, the
# Hopper backward's epilogue turning a pair in one thread), alone and with the key offset (its
# stationary dims then the upper half of each head); and from record #89's init (the model file:
# the head N(0, 0.005), wte its copy, the value embeddings N(0, 0.01), attprojw drawn); and with
# record #89's XSA (the model file's header slot 9: the strengths of layers 1, 3 and 4, nonzero from
# --debug_noise), at tiny and with heads of 128 (C 256), where the gate takes the flash backward's row
# dots on the other layers and leaves them to the flash backward on the XSA layers; and in record #89's
# plan (the model file's header slot 9: 11 layers, layer 6 adding layer 3's output with its gate,
# layers 9 and 10 attending over layer 7's, x0 added after each attention with a gate), alone, with
# the bigram embedding, residual lambdas, value-embedding gates and XSA (the terms of the attention's
# add together), and at d12; and with its paired heads (the model file's header slot 9: layers 0, 2, 5
# and 9 rotated at 2t + (h & 1), their attention over the rows doubled, windows in positions, -awt 1 in
# the settings): at tiny (one head a position), at 4 heads of 64 (C 256) with the bigram embedding,
# value-embedding gates (two paired layers mix a value embedding) and XSA, and at d12 (6 heads of 128:
# the Hopper flash kernels, QK-norm's backward apart on the paired layers); and with its attention
# lambdas (the model file's header slot 9: each attention layer's qkv and output products read s W,
# the weights' gradients s dW' and the lambdas' sum dW' W, the reference's betas through -ar), at tiny
# in the plan and at d12 with the bigram embedding and residual lambdas.
# speedrun_case NAME TEST MODEL KIND ARGS...: train_gpt2.py --recipe speedrun --model MODEL ARGS... (from
# noise added to the init, seed 42) writes its debug state into $REF/gpu_speedrun_NAME, whose file of
# Muon's steps and KIND (its name's part after _muon) ./TEST checks, then removed; $device as the
# caller's.
speedrun_case() {
  local name=$1 test=$2 model=$3 kind=$4 dir="$REF/gpu_speedrun_$1"
  shift 4
  run reference_speedrun_$name "$PYTHON" train_gpt2.py --recipe speedrun --model $model --debug_noise 0.02 "$@" \
    --write_debug_state "$dir" --seed 42 --device $device
  run ${test}_speedrun_$name ./$test "$dir/gpt2_speedrun_$model.bin" "$dir/gpt2_speedrun_${model}_muon${kind}_debug_state.bin"
  rm -rf "$dir"
}

gpu_against_pytorch() {
  local device=cpu spec cases=()
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && device=cuda
  for spec in "tiny:--model tiny --batch_size 4 --seq_len 64" \
              "d12:--model d12 --batch_size 4 --seq_len 64" \
              "wide:--num_layers 2 --num_heads 25 --channels 1600 --max_seq_len 1024 --batch_size 1 --seq_len 1000" \
              "d12_t1024:--model d12 --batch_size 1 --seq_len 1024" \
              "modern_d12:--recipe modern --model d12 --debug_noise 0.02 --batch_size 4 --seq_len 64" \
              "modern_d48_width:--recipe modern --num_layers 2 --num_heads 25 --channels 1600 --debug_noise 0.02 --batch_size 1 --seq_len 1000" \
              "d12_muon:--model d12 --optimizer muon --batch_size 4 --seq_len 64" \
              "modern_d12_polar:--recipe modern --model d12 --debug_noise 0.02 --muon_ns polar --batch_size 4 --seq_len 64" \
              "modern_d12_normuon:--recipe modern --model d12 --debug_noise 0.02 --muon_ns polar --normuon 1 --batch_size 4 --seq_len 64" \
              "modern_d12_qk_pairs:--recipe modern --model d12 --debug_noise 0.02 --muon_ns polar --normuon 1 --muon_qk_heads 2 --batch_size 4 --seq_len 64" \
              "documents_tiny:--model tiny --max_seq_len 256 --documents 1 --batch_size 4 --seq_len 256" \
              "documents_d12_window:--model d12 --documents 1 --window_blocks 3 --batch_size 2 --seq_len 512" \
              "documents_modern_d12_window:--recipe modern --model d12 --debug_noise 0.02 --documents 1 --window_blocks 2 --batch_size 2 --seq_len 256" \
              "speedrun_tiny:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256" \
              "speedrun_d12:--recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 3 --batch_size 1 --seq_len 512" \
              "speedrun_d12_window5:--recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 5 --batch_size 1 --seq_len 1024" \
              "speedrun_tiny_loss_terms:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --logit_cap 23,5 --mtp 1,0.5,0.25 --prefix_weight 0.25 --tokenizer dev/data/tinyshakespeare/gpt2_tokenizer.bin" \
              "speedrun_tiny_bf16_sigmoid:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --logit_cap 23,5,bf16 --mtp 1,0.5,0.25" \
              "speedrun_tiny_window_tokens:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --window_tokens 1 --batch_size 2 --seq_len 384" \
              "speedrun_tiny_adam_every:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --adam_every 2" \
              "speedrun_tiny_key_offset:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --key_offset 1" \
              "speedrun_tiny_adam_rows:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --weight_decay 0.005 --adam_rows wte:b1=0.75;ve:lr=0.5,b2=0.99;headw:b1=0.5,wd=150;skipw:wd=0;lambdas:lr=5,wd=0;value_scales:wd=0" \
              "speedrun_tiny_smear_bigram:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --smear 1 --bigram 1" \
              "speedrun_tiny_rotary_pairs:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --rotary_pairs 1" \
              "speedrun_tiny_rotary_pairs_key_offset:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --rotary_pairs 1 --key_offset 1" \
              "speedrun_tiny_record89_init:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record_init 89" \
              "speedrun_tiny_mlp_from_output:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --mlp_from_output 1" \
              "speedrun_tiny_ve_gates:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --ve_gates 1" \
              "speedrun_tiny_resid_lambdas:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --resid_lambdas 1 --smear 1 --bigram 1 --adam_rows resid_lambdas:b1=0.9;post_lambdas:lr=0.2,b1=0.9" \
              "speedrun_tiny_xsa:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --xsa 1" \
              "speedrun_h2c256_xsa:--recipe speedrun --model tiny --num_heads 2 --channels 256 --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --xsa 1 --ve_gates 1" \
              "speedrun_tiny_record89_plan:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record89_plan 1" \
              "speedrun_tiny_record89_plan_terms:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record89_plan 1 --bigram 1 --resid_lambdas 1 --ve_gates 1 --xsa 1 --adam_rows resid_lambdas:b1=0.9;post_lambdas:lr=0.2,b1=0.9" \
              "speedrun_d12_record89_plan:--recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 3 --batch_size 1 --seq_len 512 --record89_plan 1 --bigram 1 --resid_lambdas 1" \
              "speedrun_tiny_attn_lambdas:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record89_plan 1 --attn_lambdas 1 --adam_rows attn_lambdas:b1=0.9,b2=0.99" \
              "speedrun_d12_attn_lambdas:--recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 3 --batch_size 1 --seq_len 512 --record89_plan 1 --bigram 1 --resid_lambdas 1 --attn_lambdas 1" \
              "speedrun_tiny_paired_heads:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record89_plan 1 --rotary_pairs 1 --paired_heads 1 --window_tokens 1" \
              "speedrun_h4c256_paired_heads:--recipe speedrun --model tiny --num_heads 4 --channels 256 --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record89_plan 1 --rotary_pairs 1 --paired_heads 1 --window_tokens 1 --bigram 1 --ve_gates 1 --xsa 1" \
              "speedrun_tiny_mudd_gates:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record89_plan 1 --mudd_gates 1 --bigram 1 --resid_lambdas 1 --ve_gates 1 --xsa 1 --adam_rows resid_lambdas:b1=0.9;post_lambdas:lr=0.2,b1=0.9;mudd_gate_w1:lr=0.02,b2=0.99;mudd_gate_w2:lr=0.02,b2=0.99;mudd_gate_b2:lr=0.02,b2=0.99;mudd_gate_scale:lr=0.02,b2=0.99" \
              "speedrun_d12_mudd_gates:--recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 3 --batch_size 1 --seq_len 512 --record89_plan 1 --bigram 1 --resid_lambdas 1 --mudd_gates 1 --xsa 1 --adam_rows mudd_gate_w1:lr=0.02,b2=0.99;mudd_gate_w2:lr=0.02,b2=0.99;mudd_gate_b2:lr=0.02,b2=0.99;mudd_gate_scale:lr=0.02,b2=0.99" \
              "speedrun_tiny_composed:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record89_plan 1 --mudd_gates 1 --composed_attention 1 --bigram 1 --xsa 1 --adam_rows mudd_gate_w1:lr=0.02,b2=0.99;mudd_gate_w2:lr=0.02,b2=0.99;mudd_gate_b2:lr=0.02,b2=0.99;mudd_gate_scale:lr=0.02,b2=0.99" \
              "speedrun_d12_composed:--recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 3 --batch_size 1 --seq_len 512 --record89_plan 1 --bigram 1 --resid_lambdas 1 --mudd_gates 1 --composed_attention 1 --xsa 1 --adam_rows mudd_gate_w1:lr=0.02,b2=0.99;mudd_gate_w2:lr=0.02,b2=0.99;mudd_gate_b2:lr=0.02,b2=0.99;mudd_gate_scale:lr=0.02,b2=0.99" \
              "speedrun_tiny_mudd_connections:--recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --record89_plan 1 --mudd_gates 1 --mudd_connections 1 --bigram 1 --xsa 1 --adam_rows mudd_gate_w1:lr=0.02,b2=0.99;mudd_gate_w2:lr=0.02,b2=0.99;mudd_gate_b2:lr=0.02,b2=0.99;mudd_gate_scale:lr=0.02,b2=0.99;mudd_w1:lr=0.05,b2=0.99;mudd_w2:lr=0.05,b2=0.99;mudd_b2:lr=0.05,b2=0.99" \
              "speedrun_d12_mudd_connections:--recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 3 --batch_size 1 --seq_len 512 --record89_plan 1 --bigram 1 --resid_lambdas 1 --ve_gates 1 --mudd_gates 1 --mudd_connections 1 --composed_attention 1 --xsa 1 --adam_rows mudd_gate_w1:lr=0.02,b2=0.99;mudd_gate_w2:lr=0.02,b2=0.99;mudd_gate_b2:lr=0.02,b2=0.99;mudd_gate_scale:lr=0.02,b2=0.99;mudd_w1:lr=0.02,b2=0.99;mudd_w2:lr=0.02,b2=0.99;mudd_b2:lr=0.02,b2=0.99" \
              "speedrun_d12_paired_heads:--recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 3 --batch_size 1 --seq_len 512 --record89_plan 1 --rotary_pairs 1 --paired_heads 1 --window_tokens 1 --bigram 1 --resid_lambdas 1"; do
    cases+=("$spec")
  done
  # Each case a chain (its reference, then its checks), GPU_TEST_JOBS chains at a time: small models,
  # whose processes spend most of their time starting and in Python, side by side on the GPU. Each
  # state is removed after its checks: all of them together take about 74 GB, more than the disk of
  # a one-GPU machine may have.
  local jobs=$TEST_JOBS
  TEST_JOBS=${GPU_TEST_JOBS:-$(default_gpu_test_jobs)}
  for spec in "${cases[@]}"; do
    run_chain_in_background "chain_${spec%%:*}" debug_state_case "$device" "$spec"
  done
  # The untie (-ut 4), in the FP32 build: the speedrun recipe steps the embedding at 0.6 and the head
  # at 0.008, so the first untied step moves each embedding weight by up to 0.6 from the head's
  # moments, and the BF16 build's rounding then grows: its step losses parted from PyTorch's float32
  # by up to 0.138 (H200; the FP32 build's by 2.95e-4). Record #89 steps both at 0.008.
  local tiny=(--window_blocks 2 --batch_size 2 --seq_len 256)
  chain speedrun_case tiny_untie test_gpt2fp32cu tiny "" "${tiny[@]}" --debug_steps 10 --untie_step 4
  # The untie from record #89's init, where the tied embedding is the head's N(0, 0.005) copy (record
  # #28's zero head leaves it zero), in the FP32 build as above.
  chain speedrun_case tiny_record89_untie test_gpt2fp32cu tiny "" "${tiny[@]}" --debug_steps 10 --record_init 89 \
    --untie_step 4
  # Stage plans (--stages, -sp): each step's sequence length, window and rate multiplier as its
  # stage's, across a boundary where T doubles, and the speedrun's extension steps.
  chain staged_against_pytorch stages_d12 "0.5 t=256 aw=1; 0.5 t=512 aw=3 lr=1.5" --model d12 --documents 1 --window_blocks 3 \
    --batch_size 2 --seq_len 512
  chain staged_against_pytorch stages_modern_d12 "0.5 t=128; 0.5 t=256 aw=2 lr=0.5" --recipe modern --model d12 \
    --debug_noise 0.02 --documents 1 --window_blocks 1 --batch_size 2 --seq_len 256 --total_batch_size -1
  chain staged_against_pytorch stages_speedrun_tiny "1/2 t=128 aw=1; 1/2 t=256 aw=2 lr=0.5; +2 aw=0" --recipe speedrun \
    --model tiny --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --total_batch_size -1
  # Short windows given (aw=S/L), none half its long one: the short layers' 2 of (2, 2) at t=256,
  # 3 of (3, 4) and 1 of (1, 4) at t=512.
  chain staged_against_pytorch stages_short_windows_speedrun_tiny "1/2 t=256 aw=2/2; 1/2 t=512 aw=3/4 lr=0.5; +2 aw=1/4" \
    --recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 4 --batch_size 2 --seq_len 512 \
    --total_batch_size -1
  # The loss's weights a stage (mtp=, pw=): record #89's first two stages over 10 steps, each weight
  # linear within its stage (test_gpt2cu sets each step's), the prefix table kept beside -pw 0.0.
  chain staged_against_pytorch stages_loss_weights_speedrun_tiny \
    "1/2 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; 1/2 mtp=1,0.5>1,0 pw=0.25>0" --recipe speedrun --model tiny \
    --debug_noise 0.02 --window_blocks 2 --batch_size 2 --seq_len 256 --total_batch_size -1 --logit_cap 23,5 \
    --tokenizer dev/data/tinyshakespeare/gpt2_tokenizer.bin
  # Record #89's YaRN (-yn 1 in the settings) from its attention scale 0.1 (-asc 0.1), with its rotary
  # pairs and key offset: the long window 1 -> 3 blocks at step 4 and 3 -> 4 at step 8 (the
  # extension's), each rescaling the frequencies and the scale that test_gpt2cu derives a step.
  chain staged_against_pytorch stages_yarn_speedrun_tiny "1/2 aw=1; 1/2 aw=3; +2 aw=4" --recipe speedrun --model tiny \
    --debug_noise 0.02 --window_blocks 4 --batch_size 2 --seq_len 512 --total_batch_size -1 --rotary_pairs 1 \
    --key_offset 1 --yarn 1 --attention_scale 0.1
  # --recipe record89 itself, every switch and optimizer setting of it (the settings carry -cd 1, -mt,
  # -ar's rows, -ao 2, -mq 2, -mn 1, -ut), over its stage plan at a debug size: three thirds at t=256, 384
  # and 512 with their windows and loss weights, and 2 extension steps; the untie at step 7, the first odd
  # step of the third stage, as the recipe's 847. The stages' rate multipliers are a quarter of the
  # recipe's: at its own, ten steps on one batch are chaotic (PyTorch against itself, --debug_noise 0.02
  # and 0.0200001: step losses up to 5.9e-3 apart; at a quarter 3.5e-4).
  local plan89="1/3 t=256 aw=1/2 lr=0.25 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; 1/3 t=384 aw=1/3 lr=0.38 mtp=1,0.5>1,0"
  plan89+=" pw=0.25>0; 1/3 t=512 aw=2/3 lr=0.4325 mtp=1 pw=0; +2 aw=2/4"
  chain staged_against_pytorch record89_tiny "$plan89" --recipe record89 --model tiny --debug_noise 0.02 --batch_size 2 \
    --seq_len 512 --total_batch_size -1 --untie_step 7 --final_window_blocks 0 \
    --tokenizer dev/data/tinyshakespeare/gpt2_tokenizer.bin
  # The same at d12 (6 heads of 128: the Hopper flash kernels, paired heads, the MUDD connections at
  # their size), in the FP32 build: the BF16 build's step losses part from PyTorch's float32 by up to
  # 5.8e-2 there (H200; the FP32 build's by 4.4e-3), past its bound, as the untie's above. The BF16
  # build (the paired heads read in place) at a tenth of the recipe's rates, where the state is less
  # chaotic: PyTorch against itself (FP32 on a CPU, --debug_noise 0.02 and 0.0200001) parts by up to
  # 3.6e-4 there, 1.4e-3 at a quarter.
  chain record89_d12_against_pytorch record89_d12 "$plan89" test_gpt2fp32cu
  local plan89_tenth="1/3 t=256 aw=1/2 lr=0.1 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; 1/3 t=384 aw=1/3 lr=0.152"
  plan89_tenth+=" mtp=1,0.5>1,0 pw=0.25>0; 1/3 t=512 aw=2/3 lr=0.173 mtp=1 pw=0; +2 aw=2/4"
  chain record89_d12_against_pytorch record89_d12_tenth "$plan89_tenth" test_gpt2cu
  # The CPU part's references of the modern recipe and of GPT-2 with Muon (tiny), made here where
  # --gpu-only runs without that part.
  chain tiny_recipes_against_pytorch tiny_recipes
  # FP8: -fp8 1 against train_gpt2.py's FP8 recipe (torch._scaled_mm), by the 10-step loss curve
  # (the recipe needs PyTorch on the GPU).
  if fp8_gpu && [ "$device" = cuda ]; then
    chain d12_fp8_against_pytorch d12_fp8
    # The speedrun's FP8 head: -fh 1 (test_gpt2cu reads it in the debug state's header) against
    # train_gpt2.py --fp8_head 1, tensor by tensor (both cast the same E4M3 weights) and by the loss
    # curve.
    chain speedrun_case d12_fp8_head test_gpt2cu d12 _fp8_head --window_blocks 3 --batch_size 1 --seq_len 512 \
      --debug_steps 10 --fp8_head 1
    # Record #89's scales (--fp8_head_scales, -fhs in the debug state's settings).
    chain speedrun_case tiny_fp8_head_scales test_gpt2cu tiny _fp8_head "${tiny[@]}" --debug_steps 10 --fp8_head 1 \
      --fp8_head_scales 100,1.6,0.75
    # Record #89's FP8 MLP: -fm 1 (test_gpt2cu reads it in the debug state's settings) against
    # train_gpt2.py --fp8_mlp 1, over 20 steps: W2 cast under its own scale through step 16's forward,
    # under the delayed one after.
    chain speedrun_case tiny_fp8_mlp test_gpt2cu tiny _fp8_mlp "${tiny[@]}" --debug_steps 20 --mlp_from_output 1 \
      --fp8_mlp 1
  fi
  wait_for_background_tests
  TEST_JOBS=$jobs
  speedrun_validation_against_pytorch $device
}

# chain FUNCTION NAME ARGS...: FUNCTION NAME ARGS... as the chain chain_NAME (run_chain_in_background).
chain() { run_chain_in_background "chain_$2" "$@"; }

# The chains gpu_against_pytorch runs at a time by default: half the cores, at most 8, and one for
# each 24 GiB of the GPU's free memory (a d12 chain's PyTorch reference peaks at about 21 GB; eight
# at once can outgrow one GPU, and a GPU shared with other work has less to give), at least one.
default_gpu_test_jobs() {
  local cores free_mib jobs
  cores=$(nproc)
  jobs=$(( cores / 2 > 8 ? 8 : cores / 2 ))
  free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -n1)
  [[ "$free_mib" =~ ^[0-9]+$ ]] && (( free_mib / 24576 < jobs )) && jobs=$(( free_mib / 24576 ))
  echo $(( jobs < 1 ? 1 : jobs ))
}

# gpu_against_pytorch's case SPEC (NAME:train_gpt2.py's arguments) on DEVICE: its reference (kept
# from an earlier run where its state is there), its checks, then its directory removed (the logs
# keep the results).
debug_state_case() {
  local device=$1 name=${2%%:*} args=${2#*:} dir="$REF/gpu_${2%%:*}"
  if ! ls "$dir"/gpt2_*_debug_state.bin >/dev/null 2>&1; then
    # shellcheck disable=SC2086  # the case's words
    run "reference_$name" "$PYTHON" train_gpt2.py $args --write_debug_state "$dir" --debug_steps 10 --seed 42 \
      --device "$device"
  fi
  against_pytorch "$name" "$dir"
  rm -rf "${dir:?}"
}

# record89_d12_against_pytorch NAME PLAN TEST: --recipe record89 at d12 over PLAN (gpu_against_pytorch's
# plan89, or its rates scaled), its debug state checked by ./TEST.
record89_d12_against_pytorch() {
  local name=$1 plan=$2 test=$3 dir="$REF/gpu_$1" state
  run "reference_$name" "$PYTHON" train_gpt2.py --recipe record89 --model d12 --debug_noise 0.02 \
    --batch_size 1 --seq_len 512 --total_batch_size -1 --untie_step 7 --final_window_blocks 0 \
    --tokenizer dev/data/tinyshakespeare/gpt2_tokenizer.bin --stages "$plan" --write_debug_state "$dir" \
    --debug_steps 10 --seed 42 --device $device
  state=$(ls "$dir"/gpt2_*_muon_debug_state.bin 2>/dev/null | head -n1)
  run "${test}_$name" "./$test" "${state%_muon_debug_state.bin}.bin" "$state"
  rm -rf "$dir"
}

# The modern recipe and GPT-2 with Muon, tiny: the CPU part's references (made here where they are
# not there: --gpu-only runs without that part) against both CUDA builds.
tiny_recipes_against_pytorch() {
  ls "$REF"/gpt2_modern_tiny_*debug_state.bin "$REF"/gpt2_tiny_muon_*debug_state.bin >/dev/null 2>&1 ||
    tiny_recipe_references
  against_pytorch modern_tiny "$REF" gpt2_modern_tiny
  against_pytorch tiny_muon "$REF" gpt2_tiny gpt2_tiny_muon
}

# GPT-2's FP8 recipe (-fp8 1) at d12 against train_gpt2.py --fp8 1, by the 10-step loss curve.
d12_fp8_against_pytorch() {
  local dir="$REF/gpu_d12_fp8"
  run reference_d12_fp8 "$PYTHON" train_gpt2.py --model d12 --batch_size 4 --seq_len 64 --fp8 1 \
    --write_debug_state "$dir" --debug_steps 10 --seed 42 --device $device
  run test_gpt2cu_d12_fp8 ./test_gpt2cu --fp8 "$dir/gpt2_d12.bin" "$dir/gpt2_d12_fp8_debug_state.bin"
  rm -rf "$dir"
}

# A debug state of train_gpt2.py's steps under a stage plan (its 10 steps shared out by PLAN), then
# test_gpt2cu and test_gpt2fp32cu against it: staged_against_pytorch NAME PLAN TRAIN_GPT2_PY_ARGS...
staged_against_pytorch() {
  local name=$1 plan=$2 device=cpu
  shift 2
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && device=cuda
  local dir="$REF/gpu_$name"
  run "reference_$name" "$PYTHON" train_gpt2.py "$@" --stages "$plan" --write_debug_state "$dir" --debug_steps 10 \
    --seed 42 --device $device
  against_pytorch "$name" "$dir"
  rm -rf "$dir"  # checked: a d12 state takes gigabytes
}

# The speedrun's validation at -vt (a forward pass of its own: one layer's activations, the head in
# chunks) against train_gpt2.py --eval_only 1 on the same weights, 10 steps trained: a window of 3
# blocks (the short layers' 1) over 1,024-token sequences of documents, in both builds; then the
# final validation's long window of 6 (-awf) beside the short 1. At the
# recipe's 262,144-token validation after 100 steps of the corpus the two gave 1.976082 and 1.976066.
speedrun_validation_against_pytorch() {
  local device=$1 spec binary dtype tolerance
  speedrun_trained_weights
  for spec in "train_gpt2cu:bfloat16:1e-3" "train_gpt2fp32cu:float32:1e-5"; do
    IFS=: read -r binary dtype tolerance <<< "$spec"
    run "validation_pytorch_$binary" ./$binary $COMMON -recipe speedrun -e "$SPEEDRUN_TRAINED" -aw 3 -b 4 \
      -t 256 -vt 1024 -z 1024 -x 0 -m 4 -s 0
    run "validation_pytorch_reference_$dtype" "$PYTHON" train_gpt2.py --recipe speedrun --eval_only 1 \
      --init_from "$SPEEDRUN_TRAINED" --input_val_bin "$COMMON_VAL" --window_blocks 3 -b 4 --val_seq_len 1024 \
      --val_steps 4 --dtype "$dtype" --device "$device"
    run "validation_pytorch_${binary}_agrees" val_losses_agree "$LOGS/validation_pytorch_$binary.log" \
      "$LOGS/validation_pytorch_reference_$dtype.log" "$tolerance"
    # The final validation's windows: -awf 6 over -aw 1/3 validates at (1, 6), which --eval_only
    # takes as --window_blocks 1/6 (without -awf it would be the (1, 3) above).
    run "final_window_pytorch_$binary" ./$binary $COMMON -recipe speedrun -e "$SPEEDRUN_TRAINED" -aw 1/3 -awf 6 \
      -b 4 -t 256 -vt 1024 -z 1024 -x 0 -m 4 -s 0
    run "final_window_pytorch_reference_$dtype" "$PYTHON" train_gpt2.py --recipe speedrun --eval_only 1 \
      --init_from "$SPEEDRUN_TRAINED" --input_val_bin "$COMMON_VAL" --window_blocks 1/6 -b 4 --val_seq_len 1024 \
      --val_steps 4 --dtype "$dtype" --device "$device"
    run "final_window_pytorch_${binary}_agrees" val_losses_agree "$LOGS/final_window_pytorch_$binary.log" \
      "$LOGS/final_window_pytorch_reference_$dtype.log" "$tolerance"
  done
}

# test_gpt2cu and test_gpt2fp32cu against the debug state in DIR (or DIR/STATE_debug_state.bin
# with the model DIR/MODEL.bin, the model's name without an optimizer suffix).
against_pytorch() {
  local name=$1 dir=$2 model=${3:-} state=${4:-${3:-}}
  if [ -n "$model" ]; then
    model=$dir/$model.bin
    state=$(ls "$dir/${state}"_*debug_state.bin 2>/dev/null | head -n1)
  else
    state=$(ls "$dir"/gpt2_*_debug_state.bin 2>/dev/null | head -n1)
    model=$(ls "$dir"/gpt2_*.bin | grep -v -e '_bf16.bin$' -e '_debug_state.bin$' | head -n1)
  fi
  run "test_gpt2fp32cu_$name" ./test_gpt2fp32cu "$model" "$state"
  run "test_gpt2cu_$name" ./test_gpt2cu "$model" "$state"
}

# Every suite of the kernel tests (dev/cuda/test_*.cu) in both builds, one run each, named as its
# file (test_NAME, test_NAME_fp32); a program that is not built fails.
gpu_kernel_tests() {
  local program suites suite name
  for program in test_kernels test_kernels_fp32; do
    if [ ! -x "build/$program" ] || ! suites=$("build/$program" --list); then
      run "$program" bash -c "echo 'build/$program is not built or does not run: make cuda'; exit 1"
      continue
    fi
    for suite in $suites; do
      name=test_$suite${program#test_kernels}
      if [ "$name" = test_fp8 ] && ! fp8_gpu; then
        echo "=== skip test_fp8: its FP8 products need compute capability 8.9 or newer"
      else
        run "$name" "build/$program" "$suite"
      fi
    done
  done
  run test_attention_mma_sync build/test_attention_mma_sync
}

# Gradient accumulation: two micro steps of the same batch equal one (FP32, TF32 off).
gpu_accumulation() {
  run accumulate_1 ./train_gpt2fp32cu $COMMON -b 4 -t 64 -l 1e-4 -v 200 -s 200 -a 1 -x 10 -f 0
  run accumulate_2 ./train_gpt2fp32cu $COMMON -b 4 -t 64 -l 1e-4 -v 200 -s 200 -a 1 -x 10 -f 0 -z 512
  run accumulate_same_losses same_losses "$LOGS/accumulate_1.log" "$LOGS/accumulate_2.log"
  # The speedrun's steps of two sequences, as two micro steps of one each and as one of both, from
  # 10 steps' weights (at the init the head and the projections are zero, and Newton-Schulz makes
  # full-size updates of the rounding left in the first gradients): the same sequences, every
  # gradient (the blocks', the scalars', the gates', the embeddings' and the head's) summed over
  # both, so the losses agree to FP32's rounding as Newton-Schulz's BF16 products amplify it (8e-4
  # at most over 4 steps on an H100). The control: one sequence a step, half the tokens, parts from
  # them by far more.
  speedrun_trained_weights
  local speedrun=(./train_gpt2fp32cu $COMMON -recipe speedrun -e "$SPEEDRUN_TRAINED" -t 1024 -x 4 -v 0 -s 0)
  run accumulate_speedrun_one "${speedrun[@]}" -b 2 -z 2048
  run accumulate_speedrun_two "${speedrun[@]}" -b 1 -z 2048
  run accumulate_speedrun_half "${speedrun[@]}" -b 1 -z 1024
  run accumulate_speedrun_losses_track losses_track "$LOGS/accumulate_speedrun_one.log" \
    "$LOGS/accumulate_speedrun_two.log" 0.005
  run accumulate_speedrun_half_parts losses_part "$LOGS/accumulate_speedrun_one.log" \
    "$LOGS/accumulate_speedrun_half.log" 0.005
}

# Determinism: the same seed and configuration give bitwise-identical losses and parameters.
gpu_determinism() {
  for i in 1 2; do
    run "determinism_$i" ./train_gpt2cu $COMMON -e d12 -b 4 -t 256 -x 20 -v 10 -m 4 -s 0
  done
  run determinism_same_losses same_losses "$LOGS/determinism_1.log" "$LOGS/determinism_2.log"
  # The modern recipe (Muon's batched products and every new kernel) likewise.
  for i in 1 2; do
    run "determinism_modern_$i" ./train_gpt2cu $COMMON -recipe modern -e d12 -b 4 -t 256 -z 1024 -x 20 -v 10 -m 4 -s 0
  done
  run determinism_modern_same_losses same_losses "$LOGS/determinism_modern_1.log" "$LOGS/determinism_modern_2.log"
  # The speedrun recipe (its block's kernels, packed documents in the window's schedule) likewise.
  for i in 1 2; do
    run "determinism_speedrun_$i" ./train_gpt2cu $COMMON -recipe speedrun -e d12 -b 4 -t 256 -vt 512 -z 1024 -x 20 \
      -v 10 -m 4 -s 0
  done
  run determinism_speedrun_same_losses same_losses "$LOGS/determinism_speedrun_1.log" "$LOGS/determinism_speedrun_2.log"
  # -recipe record89 (RECORD89_TEST) likewise, at a seed of its own.
  for i in 1 2; do
    run "determinism_record89_$i" ./train_gpt2cu $COMMON -e d12 "${RECORD89_TEST[@]}" -x 20 -v 10 -m 4 -s 0 -S 7
  done
  run determinism_record89_same_losses same_losses "$LOGS/determinism_record89_1.log" "$LOGS/determinism_record89_2.log"
  # Where the GPU has FP8 products the runs above train the speedrun's head in FP8 (-fh 1, the
  # recipe's): the startup table says so, and the validation losses stay within 3% of the BF16
  # head's (-fh 0). The training losses are no measure here: steps of 1,024 tokens at the recipe's
  # rates jump by up to 1.0 from one step to the next, and the two heads' differ by up to 0.52 at a
  # step (H200), while their validation losses differ by 2.2% at step 10 and 0.5% at step 20 (with
  # the embeddings' steps in BF16; 1.0% and 0.5% with FP32 ones: one step's noise moves them). The
  # head's arithmetic is held to train_gpt2.py --fp8_head 1's in gpu_against_pytorch; a broken head
  # (a wrong scale or operand) does not learn.
  if fp8_gpu; then
    run determinism_speedrun_fp8_head_shown grep -aE "^\| head +\| FP8 in training" "$LOGS/determinism_speedrun_1.log"
    run speedrun_bf16_head ./train_gpt2cu $COMMON -recipe speedrun -e d12 -b 4 -t 256 -vt 512 -z 1024 -x 20 -v 10 -m 4 -s 0 \
      -fh 0
    run speedrun_fp8_head_val_losses_agree val_losses_agree "$LOGS/determinism_speedrun_1.log" \
      "$LOGS/speedrun_bf16_head.log" 0.03
    # Likewise record #89's FP8 MLP (-fm 1, the record89 recipe's): shown in the startup table, and
    # validation losses within 3% of the BF16 MLP's (-fm 0). Its kernels are held to the reference's
    # roundings in build/test_kernels fp8_mlp; its scales' state resumes bitwise in gpu_resume.
    run determinism_record89_fp8_mlp_shown grep -aE "^\| MLP +\| FP8 forward in training" \
      "$LOGS/determinism_record89_1.log"
    run record89_bf16_mlp ./train_gpt2cu $COMMON -e d12 "${RECORD89_TEST[@]}" -x 20 -v 10 -m 4 -s 0 -S 7 -fm 0
    run record89_fp8_mlp_val_losses_agree val_losses_agree "$LOGS/determinism_record89_1.log" \
      "$LOGS/record89_bf16_mlp.log" 0.03
  fi
  # FP8 linear layers: the same bits twice, and losses within 0.1 of the BF16 run's above at every
  # step: about 5x the 0.021 measured on an H200 (FP8's losses run 0.1-0.3% above BF16's as the
  # loss falls from 11.05 to 7.57); a broken layer's losses part by far more.
  # The same for delayed scaling (-fp8 2), whose steps after the first cast with the history's
  # scales: 0.0205 and 0.0224 measured on an H100, as current scaling's, so the same bound.
  if fp8_gpu; then
    local scaling
    for scaling in 1 2; do
      for i in 1 2; do
        run "determinism_fp8_${scaling}_$i" ./train_gpt2cu $COMMON -e d12 -b 4 -t 256 -x 20 -v 10 -m 4 -s 0 -fp8 $scaling
      done
      run "determinism_fp8_${scaling}_same_losses" same_losses "$LOGS/determinism_fp8_${scaling}_1.log" \
        "$LOGS/determinism_fp8_${scaling}_2.log"
      run "fp8_${scaling}_losses_track" losses_track "$LOGS/determinism_1.log" "$LOGS/determinism_fp8_${scaling}_1.log" 0.1
    done
    # The speedrun's blocks in FP8 (-fp8 1 casts its RMSNorm and ReLU^2 outputs as written, -fp8 2
    # computes them in the casts, all but ln1, which the gates read; validation at -vt 512 in BF16
    # products, in its own activations): the same bits twice, and validation losses within 2% of the
    # BF16 blocks' above (the FP8 head in both).
    for scaling in 1 2; do
      for i in 1 2; do
        run "determinism_speedrun_fp8_${scaling}_$i" ./train_gpt2cu $COMMON -recipe speedrun -e d12 -b 4 -t 256 \
          -vt 512 -z 1024 -x 20 -v 10 -m 4 -s 0 -fp8 $scaling
      done
      run "determinism_speedrun_fp8_${scaling}_same_losses" same_losses \
        "$LOGS/determinism_speedrun_fp8_${scaling}_1.log" "$LOGS/determinism_speedrun_fp8_${scaling}_2.log"
      run "speedrun_fp8_${scaling}_val_losses_agree" val_losses_agree "$LOGS/determinism_speedrun_1.log" \
        "$LOGS/determinism_speedrun_fp8_${scaling}_1.log" 0.02
    done
    # E4M3 output gradients (-fp8g 1): the startup table says so, and the losses track BF16's too.
    run fp8_e4m3_gradients ./train_gpt2cu $COMMON -e d12 -b 4 -t 256 -x 20 -v 10 -m 4 -s 0 -fp8 2 -fp8g 1
    run fp8_e4m3_gradients_shown grep -aE "^\| FP8 formats +\| E4M3 weights and activations, E4M3 gradients" \
      "$LOGS/fp8_e4m3_gradients.log"
    run fp8_e4m3_gradients_track losses_track "$LOGS/determinism_1.log" "$LOGS/fp8_e4m3_gradients.log" 0.1
  fi
}

gpu_hellaswag_generation() {
  hellaswag_data
  hellaswag_and_generation_test gpt2 -l 1e-3 -u 10
  hellaswag_and_generation_test modern -recipe modern -z 256
  hellaswag_documents_test
}

gpu_preemption() { signal_test; }

gpu_bad_input_output() {
  run bad_input_cuda env TRAINER=./train_gpt2cu bash dev/test/test_bad_input.sh
  run run_output_cuda env TRAINER=./train_gpt2cu bash dev/test/test_run_output.sh
}

gpu_resume() {
  # A resume reads its state into the pinned buffers of checkpoints written in the background
  # (-ac 1, the default), and into pageable memory with -ac 0: both continue bit for bit.
  resume_test ./train_gpt2cu resume_bf16
  resume_test ./train_gpt2cu resume_bf16_synchronous -ac 0
  resume_test ./train_gpt2fp32cu resume_fp32
  # The modern recipe: Muon's momentum lives in the state files' first moments.
  resume_test ./train_gpt2cu resume_modern_bf16 -recipe modern -z 1024
  resume_test ./train_gpt2fp32cu resume_modern_fp32 -recipe modern -z 1024
  # NorMuon: its second moments live in the state files' second moments of Muon's matrices.
  resume_test ./train_gpt2cu resume_normuon_bf16 -recipe modern -z 1024 -mn 1
  # Q and K in head pairs (-mq 2): NorMuon's second moments a row a [256, 768] block of each.
  resume_test ./train_gpt2cu resume_qk_pairs_bf16 -recipe modern -z 1024 -mn 1 -mq 2
  # Packed documents: the document loader's state, and the window's schedule from the resumed step.
  # Rows of 8 blocks (-t 1024): the short windows of steps 10-20 (3-7 blocks) are narrower than a
  # row, so a resume that took another step's window would train differently.
  resume_test ./train_gpt2cu resume_documents_bf16 -pd 1 -aw -1 -b 1 -t 1024 -z 2048
  resume_test ./train_gpt2fp32cu resume_documents_fp32 -pd 1 -aw -1 -b 1 -t 1024 -z 2048
  # The speedrun recipe: its scalars and value embeddings, Muon's momentum warmup and the window
  # from the resumed step.
  resume_test ./train_gpt2cu resume_speedrun_bf16 -recipe speedrun -b 1 -t 1024 -z 1024 -vt 512
  resume_test ./train_gpt2fp32cu resume_speedrun_fp32 -recipe speedrun -b 1 -t 1024 -z 1024 -vt 512
  # With record #89's smear and bigram embedding: their tensors and AdamW state, and the resume's
  # model from the checkpoint's header, which its -sm 1 -bg 1 agree with.
  resume_test ./train_gpt2cu resume_speedrun_smear_bigram_bf16 -recipe speedrun -sm 1 -bg 1 -b 1 -t 1024 -z 1024 \
    -vt 512
  # With its value-embedding gates (-vg 1): their weights and AdamW state, the model from the header.
  resume_test ./train_gpt2cu resume_speedrun_ve_gates_bf16 -recipe speedrun -vg 1 -b 1 -t 1024 -z 1024 -vt 512
  # With its residual lambdas (-rl 1) beside the bigram embedding: their values and AdamW state.
  resume_test ./train_gpt2cu resume_speedrun_resid_lambdas_bf16 -recipe speedrun -rl 1 -bg 1 -b 1 -t 1024 -z 1024 \
    -vt 512
  # With its XSA (-xs 1): the strengths and their AdamW state, the model from the header.
  resume_test ./train_gpt2cu resume_speedrun_xsa_bf16 -recipe speedrun -xs 1 -b 1 -t 1024 -z 1024 -vt 512
  # In record #89's plan (-lp 1) with the bigram embedding and residual lambdas: the x0 gates, the skip
  # gate and their AdamW state, the 11-layer model from the header.
  resume_test ./train_gpt2cu resume_speedrun_record89_plan_bf16 -recipe speedrun -lp 1 -bg 1 -rl 1 -b 1 -t 1024 \
    -z 1024 -vt 512
  # With its paired heads (-ph 1, windows in positions: -awt 1): the model from the header, the rows'
  # doubled document metadata and the window's schedule from the resumed step.
  # With its attention lambdas (-al 1), over two micro steps a step: the lambdas and their AdamW state,
  # the scaled weights made again from them after the resume, dW' summed over the micro steps.
  resume_test ./train_gpt2cu resume_speedrun_attn_lambdas_bf16 -recipe speedrun -lp 1 -al 1 -b 1 -t 1024 -z 2048 \
    -vt 512
  resume_test ./train_gpt2cu resume_speedrun_paired_heads_bf16 -recipe speedrun -lp 1 -rp 1 -ph 1 -awt 1 -b 1 \
    -t 1024 -z 1024 -vt 512
  # With its MUDD gate generators (-mg 1) and XSA: their four tensors and AdamW state, the model from the
  # header, the gates a token from the resumed parameters.
  resume_test ./train_gpt2cu resume_speedrun_mudd_gates_bf16 -recipe speedrun -lp 1 -mg 1 -xs 1 -bg 1 -b 1 -t 1024 \
    -z 1024 -vt 512
  # Record #89's YaRN (-yn 1) over a plan whose long window changes at steps 5 and 10 (1 -> 3 -> 5
  # blocks), with its rotary pairs, key offset and scale 0.1: the resume at step 10 derives the
  # frequencies and scale of both changes from the plan again.
  resume_test ./train_gpt2cu resume_speedrun_yarn_bf16 -recipe speedrun -rp 1 -ko 1 -asc 0.1 -yn 1 -b 1 -t 1024 \
    -z 1024 -vt 512 -sp "1/4 aw=1; 1/4 aw=3; 1/2 aw=5"
  # A stage plan (-sp): at step 11 of 20 a step's tokens double (T 256 -> 512 in 2 micro steps), the
  # document cap goes from 64 to 128 tokens, the window from 1 to 3 blocks and the rate to 0.8 of the
  # schedule's, so the checkpoint of step 10 is the last before the boundary; then a plan whose
  # boundary is the checkpoint's step, where the saved loader is already of the second stage.
  local stages="0.55 cap=64; 0.45 t=512 z=4096 cap=128 aw=3 lr=0.8"
  resume_test ./train_gpt2cu resume_stages_bf16 -pd 1 -z 2048 -aw 1 -sp "$stages"
  resume_test ./train_gpt2fp32cu resume_stages_fp32 -pd 1 -z 2048 -aw 1 -sp "$stages"
  resume_test ./train_gpt2cu resume_stages_at_boundary_bf16 -pd 1 -aw 2 -sp "1/2 cap=100; 1/2 t=512"
  # The untie step (-ut 12): the checkpoint of step 10 is tied (the embedding the head's copy, its
  # own AdamW state unused), and the resumed run unties after step 12's update as the straight one.
  resume_test ./train_gpt2cu resume_untie_bf16 -recipe modern -z 1024 -ut 12
  # -recipe record89 itself (RECORD89_TEST): the checkpoint of step 10 in stage 2, the resumed run crossing
  # stage 3's start (step 12), the untie (step 13) and the extension (steps 18-19).
  resume_test ./train_gpt2cu resume_record89_bf16 "${RECORD89_TEST[@]}"
  # Where the GPU has FP8 products that run trains its MLP's forward in FP8 (-fm 1): resumed at step 10
  # within W2's bootstrap (the casts after steps 0..15's updates) with the activations' delayed scales
  # from the state file, it crosses the bootstrap's end. Resumed at step 18, after it: W2's delayed
  # scale comes from the state file too.
  if fp8_gpu; then
    run resume_record89_fp8_mlp_shown grep -aE "^\| MLP +\| FP8 forward in training" \
      "$LOGS/resume_record89_bf16_straight.log"
    resume_equivalence_at 18 run resume_record89_fp8_mlp_step18 build/test_resume/resume_record89_fp8_mlp_step18 1 \
      ./train_gpt2cu $COMMON -e d12 -b 4 -t 256 -v 10 -m 4 -s 0 "${RECORD89_TEST[@]}"
  fi
  # AdamW every 4th step (-ao 4: at steps 3, 7, 11, ...): the checkpoint of step 10 holds the
  # gradients of steps 8 and 9, kept for step 11's update, and the resumed step 10 steps Muon alone
  # (AdamW's state carried to the arrays after the checkpoint).
  resume_test ./train_gpt2cu resume_adam_every_bf16 -recipe modern -z 1024 -ao 4
  async_checkpoint_test train_gpt2cu async_checkpoints_bf16
  async_checkpoint_test train_gpt2fp32cu async_checkpoints_fp32
  kill_during_write_test
  failed_write_test
  # Delayed FP8 scaling: the amax history in the state files continues the scales bit for bit.
  if fp8_gpu; then resume_test ./train_gpt2cu resume_fp8_delayed -fp8 2; fi
}

# Training from random initialisation learns: the validation loss falls, samples are printed.
gpu_training() {
  run train_d12 ./train_gpt2cu $COMMON -e d12 -b 16 -t 256 -x 150 -v 50 -m 8 -s 150 -g 48 -l 6e-4 -u 20
  run train_d12_val_loss_falls val_loss_falls "$LOGS/train_d12.log" 2.0
  run train_modern_d12 ./train_gpt2cu $COMMON -recipe modern -e d12 -b 16 -t 256 -z 4096 -x 150 -v 50 -m 8 \
    -s 150 -g 48
  run train_modern_d12_val_loss_falls val_loss_falls "$LOGS/train_modern_d12.log" 2.0
  validation_length_test
  port_speedrun_compile_test
}

# train_gpt2.py --recipe speedrun compiled (the benchmark's peer; it needs PyTorch 2 on the GPU):
# over 28 steps its window grows through all 14 sizes of the schedule and Muon's momentum rises,
# and the compiled forward recompiles once (for validation, without gradients), not for a window,
# and no compiled function reaches dynamo's recompile limit. The forward did recompile for each
# window while the masks were built inside it, until the limit left attention unfused (out of
# memory at the speedrun's validation length); Muon's compiled direction did for each momentum.
port_speedrun_compile_test() {
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() and hasattr(torch, "compile") else 1)' \
    2>/dev/null || return 0
  TORCH_LOGS=recompiles run train_speedrun_port_compiled "$PYTHON" train_gpt2.py --recipe speedrun --model tiny \
    --input_bin "${COMMON_TRAIN}" --input_val_bin "${COMMON_VAL}" --batch_size 1 --seq_len 1024 \
    --val_seq_len 1024 --total_batch_size 2048 --num_iterations 28 --val_every 14 --val_steps 1 --compile 1 \
    --device cuda
  run train_speedrun_port_compiles_once forward_recompiles_at_most 1 "$LOGS/train_speedrun_port_compiled.log"
}

# A log of TORCH_LOGS=recompiles shows at most $1 recompiles of a forward, and no function
# reaching the recompile limit (after which it runs uncompiled).
forward_recompiles_at_most() {
  local count limited
  count=$(grep -ac "Recompiling function forward" "$2")
  limited=$(grep -a -A1 "recompile_limit" "$2" | grep -ao "function: '[^']*'" | sort -u | tr '\n' ' ')
  echo "the forward recompiled $count times (at most $1); at the recompile limit: ${limited:-none}"
  [ -z "$limited" ] && [ "$count" -le "$1" ]
}

if [ ${#SELECTED_GROUPS[@]} -gt 0 ]; then
  for group in "${SELECTED_GROUPS[@]}"; do
    if [[ " ${GPU_GROUPS[*]} " != *" $group "* ]]; then
      echo "error: --gpu-only $group: not a group of GPU tests; the groups are ${GPU_GROUPS[*]}" >&2
      exit 1
    fi
  done
  GPU_GROUPS=("${SELECTED_GROUPS[@]}")
fi
[ $GPU_ONLY = 0 ] && cpu_tests
skipped_groups=()
if [ "${GPU:-1}" = 0 ]; then
  skip_reason="GPU=0"
elif ! nvidia-smi -L >/dev/null 2>&1; then
  skip_reason="no GPU visible"
else
  skip_reason=""
fi
if [ -z "$skip_reason" ]; then
  [ $GPU_ONLY = 1 ] && ! gpu_programs_built && exit 1
  gpu_setup
  if [ "${GPU_LANES:-1}" -gt 1 ] && [ ${#GPU_GROUPS[@]} -gt 1 ]; then
    gpu_lanes "$GPU_LANES"
  else
    for group in "${GPU_GROUPS[@]}"; do "$group"; done
  fi
  rm -rf "$SPEEDRUN_TRAINED_DIR"
else
  skipped_groups=("${GPU_GROUPS[@]}")
  echo "=== $skip_reason: the ${#skipped_groups[@]} groups of GPU tests are not run"
fi

echo
[ ${#failures[@]} -gt 0 ] && echo "failed: ${failures[*]}"
[ ${#skipped_groups[@]} -gt 0 ] && echo "skipped ($skip_reason): ${skipped_groups[*]}"
echo "$passed passed, $failed failed, ${#skipped_groups[@]} skipped"
[ $failed -eq 0 ]
