#!/usr/bin/env bash
# FP8 against BF16 on tiny shakespeare, the loss curves side by side: one model from one seed,
# trained on the same data order with -fp8 0 (BF16), 1 (current scaling), 2 (delayed scaling) and,
# as mode 3, 2 with E4M3 output gradients (-fp8g 1, against E5M2's range), validated every --val-every steps on the whole validation split (2 batches of 16 x 1024).
#
#   usage: scripts/fp8_convergence.sh OUTDIR [--model d12] [--steps 2000] [--modes "0 1 2 3"]
#          [--micro-batch 16] [--batch-tokens 65536] [--val-every 100] [--checkpoint-every 250]
#          [--trainer ./train_gpt2cu] [--data dev/data/tinyshakespeare]
#   (-h, --help: this help; TINYSHAKESPEARE=FILE: a local copy of the text, for preparing the data)
#
# Each run checkpoints every --checkpoint-every steps (the newest kept), so running the same command again
# continues the runs not yet finished (-y 1): a long comparison may be split over several calls,
# and --modes picks the runs of this call. A finished run keeps its main.log and drops its
# checkpoints. Once every run of --modes has finished it prints the last validation losses and
# their difference from BF16's (when -fp8 0 is among them), and plots the runs with
# dev/plot_log.py (OUTDIR/convergence.png).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"

fail() {
  echo "error: $*" >&2
  exit 1
}

[ $# -ge 1 ] && [[ "$1" != -* ]] || fail "usage: $0 OUTDIR [--model d12] [--steps 2000] [--modes \"0 1 2 3\"] [--micro-batch 16] [--batch-tokens 65536] [--val-every 100] [--checkpoint-every 250] [--trainer ./train_gpt2cu] [--data DIR]"
out=$1
shift
model=d12 steps=2000 modes="0 1 2 3" micro_batch=16 batch_tokens=65536 val_every=100 checkpoint_every=250
trainer=./train_gpt2cu data=dev/data/tinyshakespeare
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || fail "$1 needs a value"
  case "$1" in
    --model) model=$2 ;;
    --steps) steps=$2 ;;
    --modes) modes=$2 ;;
    --micro-batch) micro_batch=$2 ;;
    --batch-tokens) batch_tokens=$2 ;;
    --val-every) val_every=$2 ;;
    --checkpoint-every) checkpoint_every=$2 ;;
    --trainer) trainer=$2 ;;
    --data) data=$2 ;;
    *) fail "unknown argument '$1' (see the usage at the top of $0)" ;;
  esac
  shift 2
done
for count in "--steps:$steps" "--micro-batch:$micro_batch" "--batch-tokens:$batch_tokens" "--val-every:$val_every" \
    "--checkpoint-every:$checkpoint_every"; do
  [[ "${count#*:}" =~ ^[1-9][0-9]*$ ]] || fail "${count%%:*} '${count#*:}' must be a whole number of at least 1"
done
for mode in $modes; do
  [[ "$mode" =~ ^[0-3]$ ]] || fail "--modes '$modes': each must be 0, 1, 2 (the trainer's -fp8) or 3 (-fp8 2 -fp8g 1)"
done
[ -n "$modes" ] || fail "--modes is empty: give some of 0 1 2 3"
[ -x "$trainer" ] || fail "$trainer is not an executable: build it with make train_gpt2cu, or give --trainer"

if [ ! -f "$data/tiny_shakespeare_val_000000.bin" ]; then
  [ "$data" = dev/data/tinyshakespeare ] || fail "--data $data holds no tiny_shakespeare_val_000000.bin: give the folder dev/data/tinyshakespeare.sh wrote"
  bash dev/data/tinyshakespeare.sh ${TINYSHAKESPEARE:+--input "$TINYSHAKESPEARE"} || fail "cannot prepare tiny shakespeare"
fi
mkdir -p "$out"
name_of() { case $1 in 0) echo bf16 ;; 1) echo fp8_current ;; 2) echo fp8_delayed ;; 3) echo fp8_delayed_e4m3grad ;; esac; }
fp8_flags() { case $1 in 3) echo "-fp8 2 -fp8g 1" ;; *) echo "-fp8 $1" ;; esac; }
finished() { grep -qE "^step=$steps kind=val " "$1/main.log" 2>/dev/null; }

for mode in $modes; do
  dir=$out/$(name_of "$mode")
  if finished "$dir"; then
    echo "$(name_of "$mode"): finished earlier"
    continue
  fi
  resume=0
  compgen -G "$dir/DONE_*" > /dev/null && resume=1
  [ $resume = 1 ] || rm -rf "$dir"  # a run stopped before its first checkpoint starts again
  echo "$(name_of "$mode"): $([ $resume = 1 ] && echo "continuing" || echo "starting") ($dir)"
  "$trainer" -e "$model" -i "$data/tiny_shakespeare_train_*.bin" -j "$data/tiny_shakespeare_val_*.bin" \
    -b "$micro_batch" -t 1024 -z "$batch_tokens" -x "$steps" -l 6e-4 -u 100 -q 0 -k cosine -c 0.1 \
    -gc 1.0 -S 42 -sh 1 -v "$val_every" -m 2 -s 0 -n "$checkpoint_every" -nk 1 $(fp8_flags "$mode") -o "$dir" -y "$resume" \
    > "$dir.out" 2>&1
  status=$?
  tail -2 "$dir.out"
  [ $status -eq 0 ] && finished "$dir" || fail "$(name_of "$mode") stopped with status $status before step $steps (log $dir.out); run the same command again to continue"
  rm -f "$dir"/model_*.bin "$dir"/state_*.bin "$dir"/DONE_*
done

logs=() labels=()
for mode in $modes; do
  logs+=("$out/$(name_of "$mode")")
  labels+=("$(name_of "$mode")")
done
last_val() { grep -E "^step=$steps kind=val " "$1/main.log" | sed 's/.*loss=//'; }
echo "$model, $steps steps of $batch_tokens tokens: the last validation loss"
bf16=
[[ " $modes " == *" 0 "* ]] && bf16=$(last_val "$out/bf16")
for mode in $modes; do
  loss=$(last_val "$out/$(name_of "$mode")")
  if [ -n "$bf16" ] && [ "$mode" != 0 ]; then
    awk -v n="$(name_of "$mode")" -v l="$loss" -v b="$bf16" 'BEGIN { printf "%-20s %.6f  %+.2f%% against BF16\n", n, l, 100 * (l - b) / b }'
  else
    printf "%-20s %.6f\n" "$(name_of "$mode")" "$loss"
  fi
done
"${PYTHON:-python3}" dev/plot_log.py "${logs[@]}" --labels "$(IFS=,; echo "${labels[*]}")" \
  -o "$out/convergence.png" > "$out/convergence_table.txt" ||
  echo "note: no plot (dev/plot_log.py needs matplotlib); the val losses are in each run's main.log"
