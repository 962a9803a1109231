# The shared part of scripts/run_gpt2_*.sh (sourced; not run on its own). Each of those scripts
# sets its model's hyperparameters and calls `run_gpt2 "$@"`:
#   model          the trainer's -e preset (d12 d24 d36 d48)
#   run_name       names the default output directory, log_<run_name>
#   learning_rate  the peak learning rate of the GPT-3 paper's table 2.1 for that size
#   micro_batch    the default micro batch per GPU (sequences of 1024 tokens)
#
# Every size trains on 10B tokens in batches of 524288 (2^19, the GPT-3 paper's 0.5M) tokens:
# 700 warmup steps (the paper's 375M tokens), cosine decay to 10% of the peak, weight decay 0.1,
# gradient clipping at 1.0. The run checkpoints every --checkpoint-every steps and, when the
# trainer is interrupted (exit status 3: a signal, e.g. preemption) or crashes, restarts it with
# -y 1 from the newest complete checkpoint, up to --max-attempts times.

set -uo pipefail

readonly kTotalTokens=10000000000
readonly kBatchTokens=524288
readonly kSeqLen=1024
readonly kWarmupSteps=700
readonly kExitInterrupted=3

run_gpt2_usage() {
  cat <<USAGE
usage: $0 [flags] [-- trainer flags]
Trains GPT-2 ($model) on $kTotalTokens tokens of FineWeb-style shards (DATA/fineweb_train_*.bin,
DATA/fineweb_val_*.bin, made by dev/data/shard_dump.py), resuming after interruptions.
  --data DIR              token shards (default dev/data/fineweb10B)
  --out DIR               log and checkpoints (default log_$run_name)
  --gpus N                GPUs on this node; N > 1 runs the trainer under mpirun -np N
                          (default: the number nvidia-smi lists, or 1)
  --micro-batch B         sequences of $kSeqLen tokens per GPU per micro step (default $micro_batch)
  --trainer PATH          the trainer binary (default ./train_gpt2cu)
  --steps N               training steps (default $((kTotalTokens / kBatchTokens)): $kTotalTokens tokens)
  --checkpoint-every N    checkpoint every N steps (default 1000; the newest 2 are kept)
  --max-attempts N        start the trainer at most N times in all (default 10)
  --dry-run               print the trainer command and exit
  -h, --help              this help
Flags after -- go to the trainer unchanged (./train_gpt2cu --help lists them).
USAGE
}

# Prints "error: ..." on stderr and exits with status 1.
run_gpt2_fail() {
  echo "error: $*" >&2
  exit 1
}

# Checks that flag $1's value $2 is a whole number of at least $3.
run_gpt2_require_count() {
  [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] ||
    run_gpt2_fail "$1 '$2' must be a whole number of at least $3"
}

run_gpt2_default_gpus() {
  local listed
  listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || true
  echo $((listed > 0 ? listed : 1))
}

run_gpt2() {
  local data=dev/data/fineweb10B out=log_$run_name gpus="" trainer=./train_gpt2cu
  local steps=$((kTotalTokens / kBatchTokens)) checkpoint_every=1000 max_attempts=10 dry_run=0
  local extra=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -h|--help) run_gpt2_usage; exit 0 ;;
      --dry-run) dry_run=1; shift; continue ;;
      --) shift; extra=("$@"); break ;;
      --data|--out|--gpus|--micro-batch|--trainer|--steps|--checkpoint-every|--max-attempts)
        [ $# -ge 2 ] || run_gpt2_fail "$1 needs a value ($0 --help lists the flags)" ;;
      *) run_gpt2_fail "unknown argument '$1' ($0 --help lists the flags; trainer flags go after --)" ;;
    esac
    case "$1" in
      --data) data=$2 ;;
      --out) out=$2 ;;
      --gpus) gpus=$2 ;;
      --micro-batch) micro_batch=$2 ;;
      --trainer) trainer=$2 ;;
      --steps) steps=$2 ;;
      --checkpoint-every) checkpoint_every=$2 ;;
      --max-attempts) max_attempts=$2 ;;
    esac
    shift 2
  done
  [ -n "$gpus" ] || gpus=$(run_gpt2_default_gpus)
  run_gpt2_require_count --gpus "$gpus" 1
  run_gpt2_require_count --micro-batch "$micro_batch" 1
  run_gpt2_require_count --steps "$steps" 1
  run_gpt2_require_count --checkpoint-every "$checkpoint_every" 1
  run_gpt2_require_count --max-attempts "$max_attempts" 1
  local tokens_per_micro_step=$((micro_batch * kSeqLen * gpus))
  [ $((kBatchTokens % tokens_per_micro_step)) -eq 0 ] ||
    run_gpt2_fail "--micro-batch $micro_batch x $kSeqLen tokens x --gpus $gpus = $tokens_per_micro_step" \
      "tokens does not divide the $kBatchTokens-token batch: use powers of two for both"
  compgen -G "$data/fineweb_train_*.bin" >/dev/null ||
    run_gpt2_fail "--data $data has no fineweb_train_*.bin shards: make them with dev/data/shard_dump.py" \
      "--output_dir $data, or point --data at them"
  compgen -G "$data/fineweb_val_*.bin" >/dev/null ||
    run_gpt2_fail "--data $data has no fineweb_val_*.bin shard: dev/data/shard_dump.py writes it as shard 0"

  local command=()
  if [ "$gpus" -gt 1 ]; then
    command=(mpirun -np "$gpus")
    [ "$(id -u)" -eq 0 ] && command+=(--allow-run-as-root)
  fi
  command+=("$trainer" -e "$model" -i "$data/fineweb_train_*.bin" -j "$data/fineweb_val_*.bin"
    -o "$out" -b "$micro_batch" -t "$kSeqLen" -z "$kBatchTokens" -x "$steps"
    -l "$learning_rate" -u "$kWarmupSteps" -k cosine -q 0.1 -c 0.1 -gc 1.0
    -v 250 -m 20 -s 5000 -tk "$data/gpt2_tokenizer.bin" -n "$checkpoint_every" -nk 2
    "${extra[@]}")
  if [ $dry_run -eq 1 ]; then
    printf '%q' "${command[0]}"
    printf ' %q' "${command[@]:1}"
    echo
    exit 0
  fi
  [ -f "$trainer" ] && [ -x "$trainer" ] ||
    run_gpt2_fail "--trainer $trainer is not an executable file: build it with make train_gpt2cu"
  run_gpt2_until_done "$out" "$max_attempts" "${command[@]}"
}

run_gpt2_has_checkpoint() { compgen -G "$1/DONE_*" >/dev/null; }

# Runs the trainer command until it succeeds, restarting it with -y 1 after an interruption or a
# crash. A signal to this script (Ctrl-C, a scheduler's SIGTERM) is passed on to the trainer, which
# checkpoints and stops; the script then stops too instead of restarting it.
run_gpt2_until_done() {
  local out=$1 max_attempts=$2
  shift 2
  local attempt status child signals=0
  trap 'signals=$((signals + 1)); [ -n "${child:-}" ] && kill -TERM "$child" 2>/dev/null' INT TERM
  for ((attempt = 1; attempt <= max_attempts; attempt++)); do
    local resume=()
    if run_gpt2_has_checkpoint "$out"; then
      resume=(-y 1)
    elif [ -s "$out/main.log" ]; then
      # A run that stopped before its first checkpoint starts over; its log is kept aside.
      local kept="$out/main.log.before_attempt_$attempt"
      mv "$out/main.log" "$kept" || run_gpt2_fail "cannot move aside $out/main.log: move or delete it by hand"
      echo "run_gpt2: $out has a log but no complete checkpoint: starting over, the log moved to $kept"
    fi
    echo "run_gpt2: attempt $attempt of $max_attempts: $* ${resume[*]}"
    "$@" "${resume[@]}" &
    child=$!
    # A trapped signal ends wait early with 128 + the signal, before the trainer has finished
    # its step: wait again for the trainer's own status.
    while true; do
      local signals_before=$signals
      wait "$child"
      status=$?
      [ $status -gt 128 ] && [ "$signals" -ne "$signals_before" ] || break
    done
    child=""
    if [ $status -eq 0 ]; then
      echo "run_gpt2: training finished after $attempt attempt(s); log and checkpoints in $out"
      return 0
    fi
    if [ $signals -gt 0 ]; then
      echo "run_gpt2: stopped by a signal (trainer exit status $status); run the same command again to continue" >&2
      exit $status
    fi
    if [ $status -eq $kExitInterrupted ]; then
      echo "run_gpt2: the trainer was interrupted (exit status $status); resuming"
    else
      echo "run_gpt2: the trainer failed with exit status $status; restarting from the newest checkpoint"
    fi
  done
  run_gpt2_fail "gave up after $max_attempts attempts (last trainer exit status $status); fix the" \
    "error printed above and run the same command again to continue from $out"
}
