#!/usr/bin/env bash
# Tests scripts/run_gpt2_*.sh without a GPU: argument errors (one line, non-zero exit), the exact
# trainer command each model size runs (--dry-run), and the resume-until-done loop with fake
# trainers given through --trainer: one interrupted twice (exit status 3), one that always
# crashes, and one stopped by a signal to the script. Then the other scripts' argument errors:
# one line, exit status 1, multi_gpu_tests.sh's groups (its test functions, each in its usage),
# and quickstart.sh's commands with and without a GPU (--dry-run), the CPU ones as the README
# writes them. Scratch files go to build/scratch/.
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh
SCRATCH=build/scratch/test_run_scripts
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH/data"
data=$SCRATCH/data
touch "$data/fineweb_val_000000.bin" "$data/fineweb_train_000001.bin"

# Runs a command that must fail; checks that it prints exactly one line, starting "error:" and
# containing NEEDLE.
check_error() {  # check_error DESCRIPTION NEEDLE COMMAND...
  local description=$1 needle=$2
  shift 2
  local output status
  output=$("$@" 2>&1)
  status=$?
  local verdict=ok
  [ $status -ne 0 ] || verdict="exit status 0"
  [ "$(printf '%s\n' "$output" | wc -l)" -eq 1 ] || verdict="more than one line"
  [[ "$output" == "error: "*"$needle"* ]] || verdict="no 'error: ...$needle...'"
  check "$description: one error line mentioning '$needle'" "$verdict ($output)" "ok ($output)"
}

run=scripts/run_gpt2_124M.sh
check_error "an unknown flag" "unknown argument '--bogus'" $run --data "$data" --bogus
check_error "a flag without its value" "--gpus needs a value" $run --data "$data" --gpus
check_error "a non-numeric --micro-batch" "--micro-batch 'big' must be a whole number" \
  $run --data "$data" --micro-batch big
check_error "--gpus 0" "--gpus '0' must be a whole number of at least 1" $run --data "$data" --gpus 0
check_error "--max-attempts 0" "--max-attempts '0'" $run --data "$data" --max-attempts 0
check_error "a GPU count that does not divide the batch" "does not divide the 524288-token batch" \
  $run --data "$data" --gpus 3
check_error "a data directory without shards" "--data $SCRATCH/none has no fineweb_train_*.bin" \
  $run --data "$SCRATCH/none"
mkdir -p "$SCRATCH/no_val"
touch "$SCRATCH/no_val/fineweb_train_000001.bin"
check_error "a data directory without the val shard" "no fineweb_val_*.bin shard" \
  $run --data "$SCRATCH/no_val"
check_error "a missing trainer" "--trainer $SCRATCH/none is not an executable file" \
  $run --data "$data" --gpus 1 --trainer "$SCRATCH/none"

# --- the trainer command of each size
for spec in "124M d12 6e-4 64" "350M d24 3e-4 32" "774M d36 2.5e-4 16" "1558M d48 2e-4 8"; do
  read -r size model lr micro_batch <<< "$spec"
  check "run_gpt2_$size.sh --dry-run: the trainer command" \
    "$(scripts/run_gpt2_$size.sh --data "$data" --out "$SCRATCH/out" --gpus 1 --dry-run)" \
    "./train_gpt2cu -e $model -i $data/fineweb_train_\\*.bin -j $data/fineweb_val_\\*.bin -o $SCRATCH/out -b $micro_batch -t 1024 -z 524288 -x 19073 -l $lr -u 700 -k cosine -q 0.1 -c 0.1 -gc 1.0 -v 250 -m 20 -s 5000 -tk $data/gpt2_tokenizer.bin -n 1000 -nk 2"
done
check "several GPUs run under mpirun, flags after -- go to the trainer" \
  "$($run --data "$data" --out o --gpus 4 --micro-batch 16 --trainer bin/t --dry-run -- -r 1 |
    sed 's/ --allow-run-as-root//; s/ -e d12 .*-nk 2//')" "mpirun -np 4 bin/t -r 1"
check "--help prints the flags" "$($run --help | grep -c -- '--max-attempts')" 1

# --- the other scripts' own argument errors: one line, exit status 1, before anything is done
check_error_status() {  # check_error_status NEEDLE SCRIPT ARGS...: check_error, and status 1
  local needle=$1
  shift
  check_error "$* (bash)" "$needle" bash "$@"
  bash "$@" > /dev/null 2>&1
  check "$*: exit status 1" $? 1
}
check_error_status "--input needs a file" scripts/quickstart.sh --input
check_error_status "--input $SCRATCH/none: no such readable file" scripts/quickstart.sh --input "$SCRATCH/none"
check_error_status "unknown argument '--gpu'" scripts/install_deps.sh --gpu
check_error_status "usage: scripts/parity_tinyshakespeare.sh OUTDIR" scripts/parity_tinyshakespeare.sh
check_error_status "usage: scripts/profile_kernels.sh OUTDIR" scripts/profile_kernels.sh -b 4
check_error_status "--step 'x': give the number of the training step to profile" scripts/profile_kernels.sh \
  "$SCRATCH/profile" --step x -recipe record89
check_error_status "with N = 2, 4 or 8 GPUs" scripts/scaling_tests.sh 3
check_error_status "unknown group 'speedrun'; the groups are gpt2_ranks_test" scripts/multi_gpu_tests.sh \
  "$SCRATCH/multi_gpu" speedrun_test speedrun
check "multi_gpu_tests.sh with an unknown group: no output directory made" \
  "$([ -e "$SCRATCH/multi_gpu" ] && echo made || echo none)" none
# The groups multi_gpu_tests.sh accepts are its functions named *_test or *_tests, each named in its
# usage.
multi_gpu_groups=$(sed -n '/^test_groups=(/,/)$/p' scripts/multi_gpu_tests.sh | tr -d '()\n' | sed 's/^test_groups=//')
check "multi_gpu_tests.sh's groups are its test functions" \
  "$(tr ' ' '\n' <<< "$multi_gpu_groups" | grep . | sort | tr '\n' ' ')" \
  "$(sed -n 's/^\([a-z0-9_]*_tests\{0,1\}\)() {$/\1/p' scripts/multi_gpu_tests.sh | sort | tr '\n' ' ')"
for group in $multi_gpu_groups; do
  check "multi_gpu_tests.sh's group $group: a function, named in its usage" \
    "$(grep -c "^$group() {" scripts/multi_gpu_tests.sh) $(bash scripts/multi_gpu_tests.sh --help | grep -cw "$group")" "1 1"
done
check_error_status "usage: [GPUS_PER_NODE=N]" scripts/multi_node/mpirun_gpt2.sh
check_error_status "HOSTFILE $SCRATCH/none: no such readable file" scripts/multi_node/mpirun_gpt2.sh "$SCRATCH/none"
check_error_status "unknown argument '-x': this script takes none" scripts/multi_node/sbatch_gpt2.sh -x
check_error_status "--input needs a file" dev/data/hellaswag.sh --input
check_error_status "unknown argument '--output'" dev/data/hellaswag.sh --output x

# --- quickstart.sh --dry-run on each branch, an nvidia-smi on the PATH saying whether there is a
# GPU; without one its trainer line is the README's, whose plot command reads its -o directory.
quickstart() {  # quickstart GPU(0|1) ARGS...: quickstart.sh --dry-run's commands
  mkdir -p "$SCRATCH/gpu_$1"
  printf '#!/bin/sh\nexit %d\n' $((1 - $1)) > "$SCRATCH/gpu_$1/nvidia-smi"
  chmod +x "$SCRATCH/gpu_$1/nvidia-smi"
  PATH="$SCRATCH/gpu_$1:$PATH" bash scripts/quickstart.sh --dry-run "${@:2}"
}
check "quickstart.sh without a GPU: its commands" "$(quickstart 0 --input README.md -l 3e-3)" \
  "no GPU found: training the tiny model with the CPU reference trainer instead
bash scripts/install_deps.sh --cpu-only
bash dev/data/tinyshakespeare.sh --input README.md
make train_gpt2
./train_gpt2 -e tiny -b 8 -t 64 -x 100 -v 25 -s 50 -o log_cpu -l 3e-3"
cpu_trainer=$(quickstart 0 | tail -n1)
check "quickstart.sh without a GPU trains as the README's CPU lines" \
  "$(grep -m1 '^\./train_gpt2 ' README.md)" "$cpu_trainer"
log_dir=$(sed -n 's/.* -o \([^ ]*\).*/\1/p' <<< "$cpu_trainer")
check "the README plots the -o directory of quickstart.sh without a GPU" \
  "$(grep -m1 '^python3 dev/plot_log.py ' README.md | cut -d'#' -f1 | sed 's/ *$//')" \
  "python3 dev/plot_log.py $log_dir -o $log_dir/plot.png"
check "quickstart.sh with a GPU: its trainer command" "$(quickstart 1 | tail -n1)" \
  "./train_gpt2cu -e d12 -b 16 -t 256 -x 300 -v 50 -s 100 -l 6e-4 -u 20 -o log_quickstart"

# --- the resume loop. A fake trainer logs its arguments to DIR/calls, writes a DONE marker into
# its -o directory as a checkpoint would, and exits with the status its name holds for each call.
make_fake_trainer() {  # make_fake_trainer PATH STATUS...: the n-th call exits with the n-th status
  cat > "$1" <<FAKE
#!/usr/bin/env bash
statuses=(${*:2})
echo "\$*" >> "\$(dirname "\$0")/calls"
calls=\$(wc -l < "\$(dirname "\$0")/calls")
while [ \$# -gt 0 ]; do [ "\$1" = -o ] && out=\$2; shift; done
mkdir -p "\$out" && echo "step=1 kind=val loss=1" >> "\$out/main.log"
[ "\${statuses[calls - 1]}" = 3 ] && touch "\$out/DONE_00001000"
exit "\${statuses[calls - 1]}"
FAKE
  chmod +x "$1"
}

mkdir -p "$SCRATCH/interrupted"
make_fake_trainer "$SCRATCH/interrupted/trainer" 3 3 0
$run --data "$data" --out "$SCRATCH/interrupted/out" --gpus 1 --steps 10 \
  --trainer "$SCRATCH/interrupted/trainer" > "$SCRATCH/interrupted/output" 2>&1
check "interrupted twice, then done: exit status 0" $? 0
check "three calls, the second and third with -y 1" \
  "$(grep -o -- '-nk 2.*' "$SCRATCH/interrupted/calls")" $'-nk 2\n-nk 2 -y 1\n-nk 2 -y 1'
check "the loop says it resumed and finished" \
  "$(grep -c 'interrupted (exit status 3); resuming' "$SCRATCH/interrupted/output") $(tail -n1 "$SCRATCH/interrupted/output")" \
  "2 run_gpt2: training finished after 3 attempt(s); log and checkpoints in $SCRATCH/interrupted/out"

mkdir -p "$SCRATCH/crashing"
make_fake_trainer "$SCRATCH/crashing/trainer" 1 1 1 1
$run --data "$data" --out "$SCRATCH/crashing/out" --gpus 1 --max-attempts 3 \
  --trainer "$SCRATCH/crashing/trainer" > "$SCRATCH/crashing/output" 2> "$SCRATCH/crashing/errors"
check "always crashing: non-zero exit" "$([ $? -ne 0 ] && echo non-zero)" non-zero
check "always crashing: three attempts, none with -y 1" \
  "$(wc -l < "$SCRATCH/crashing/calls") $(grep -c -- '-y 1' "$SCRATCH/crashing/calls")" "3 0"
check "always crashing: one error line saying it gave up" \
  "$(cat "$SCRATCH/crashing/errors")" \
  "error: gave up after 3 attempts (last trainer exit status 1); fix the error printed above and run the same command again to continue from $SCRATCH/crashing/out"
check "a log without a checkpoint is moved aside, not lost" \
  "$(ls "$SCRATCH/crashing/out" | tr '\n' ' ')" \
  "main.log main.log.before_attempt_2 main.log.before_attempt_3 "

# A signal to the script goes to the trainer, which checkpoints and exits 3; the script then stops.
mkdir -p "$SCRATCH/signal"
cat > "$SCRATCH/signal/trainer" <<'FAKE'
#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/calls"
sleep 30 &
trap 'kill $!; exit 3' TERM
wait
FAKE
chmod +x "$SCRATCH/signal/trainer"
$run --data "$data" --out "$SCRATCH/signal/out" --gpus 1 --trainer "$SCRATCH/signal/trainer" \
  > "$SCRATCH/signal/output" 2>&1 &
script=$!
for _ in $(seq 100); do [ -s "$SCRATCH/signal/calls" ] && break; sleep 0.1; done
sleep 0.2
kill -TERM $script
wait $script
check "a SIGTERM to the script: exit status 3, no restart" "$? $(wc -l < "$SCRATCH/signal/calls")" "3 1"

# --- record89_pair.sh with a stand-in for the python that runs dev/bench_quality.py: it logs each
# bench's --runs (and --dry_run), sleeps FAKE_<ours|ref>_S seconds in that bench and fails the one
# FAKE_FAIL names.
pair=scripts/record89_pair.sh
check_error_status "usage: scripts/record89_pair.sh OUTDIR" $pair --train x
check_error_status "--delay 'soon': give the seconds between the two runs' starts" $pair "$SCRATCH/pair" --delay soon
check_error_status "--runs: this script runs ours_record89 and ref_record89" $pair "$SCRATCH/pair" --runs ours_gpt2
cat > "$SCRATCH/fake_python" <<'FAKE'
#!/usr/bin/env bash
shift  # dev/bench_quality.py
calls=$(dirname "$0")/pair_calls
case "$*" in
  *--dry_run*) echo dry_run >> "$calls"; [ "${FAKE_FAIL:-}" != dry_run ] || { echo "error: --val: no shard" >&2; exit 1; } ;;
  *"--runs ours_record89 "*) echo ours >> "$calls"; sleep "${FAKE_OURS_S:-0}"; [ "${FAKE_FAIL:-}" != ours ] ;;
  *"--runs ref_record89 "*) echo ref >> "$calls"; sleep "${FAKE_REF_S:-0}"; [ "${FAKE_FAIL:-}" != ref ] ;;
  *) echo report >> "$calls"; echo "the pair's report" ;;
esac
FAKE
chmod +x "$SCRATCH/fake_python"
run_pair() {  # run_pair DELAY VAR=VALUE...: the script's output (stdout and stderr) and exit status
  rm -rf "$SCRATCH/pair" "$SCRATCH/pair_calls"
  env "${@:2}" PYTHON="$SCRATCH/fake_python" bash $pair "$SCRATCH/pair" --delay "$1" --train t --val v 2>&1
  echo "status $?"
}
pair_calls() { tr '\n' ' ' < "$SCRATCH/pair_calls"; }
check "record89_pair.sh: the dry run, ours, the script's run after ours had a head start, the report" \
  "$(run_pair 1 FAKE_OURS_S=2 | tr '\n' ' ')$(pair_calls)" "the pair's report status 0 dry_run ours ref report "
check "record89_pair.sh: a wrong flag stops it at the dry run, nothing run, no OUTDIR" \
  "$(run_pair 0 FAKE_FAIL=dry_run | tr '\n' ' ')$(pair_calls)$([ -e "$SCRATCH/pair" ] && echo made)" \
  "error: --val: no shard status 1 dry_run "
check "record89_pair.sh: ours failing before the delay, the script's run is not started" \
  "$(run_pair 1 FAKE_FAIL=ours | tr '\n' ' ')$(pair_calls)" \
  "error: ours' bench (--runs ours_record89) failed: see $SCRATCH/pair/ours_bench.log status 1 dry_run ours "
check "record89_pair.sh: the script's run failing, no report" \
  "$(run_pair 1 FAKE_FAIL=ref FAKE_OURS_S=2 | tr '\n' ' ')$(pair_calls)" \
  "error: the script's bench (--runs ref_record89) failed: see $SCRATCH/pair/ref_bench.log status 1 dry_run ours ref "
rm -rf "$SCRATCH/pair" "$SCRATCH/pair_calls"
PYTHON="$SCRATCH/fake_python" FAKE_OURS_S=30 bash $pair "$SCRATCH/pair" --delay 30 --train t > /dev/null 2>&1 &
script=$!
for _ in $(seq 100); do grep -q ours "$SCRATCH/pair_calls" 2> /dev/null && break; sleep 0.1; done
killed_at=$SECONDS
kill -TERM $script
wait $script
check "record89_pair.sh: a SIGTERM stops the benches at once (not after their 30 s), exit status 130" \
  "$? $(pgrep -f "$SCRATCH/fake_python" | wc -l) $((SECONDS - killed_at < 10))" "130 0 1"

finish test_run_scripts
