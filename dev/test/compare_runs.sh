# Comparisons of two training runs, shared by scripts/run_tests.sh and scripts/multi_gpu_tests.sh
# (source it); dev/test/test_compare_runs.sh tests them on made-up logs.

# Two run logs, neither missing nor empty, agree on every line but the timings.
same_log() {
  local strip='s/ ms=[^ ]*//; s/ tok_per_s=[^ ]*//'
  [ -s "$1" ] && [ -s "$2" ] && diff <(sed "$strip" "$1") <(sed "$strip" "$2") &&
    echo "identical: $(wc -l < "$1") lines"
}

# losses_close_from LOG_A LOG_B STEP TOL: the training losses of the steps after STEP that both logs
# print agree within TOL, at least 5 steps compared, paired by their step number: a run resumed
# from STEP's checkpoint prints from step STEP + 1 on, the run that went on prints every step.
losses_close_from() {
  local steps='$1 == "step" && $3 == "|" && $4 == "loss" { split($2, a, "/"); if (a[1] > from) print a[1], $5 }'
  awk -v tol="$4" '
    NR == FNR { loss[$1] = $2; next }
    $1 in loss { d = loss[$1] - $2; if (d < 0) d = -d; if (d > worst) worst = d; count++ }
    END { printf "%d losses, largest difference %.3g (tolerance %g)\n", count, worst, tol; exit !(count >= 5 && worst <= tol) }' \
    <(awk -v from="$3" "$steps" "$1") <(awk -v from="$3" "$steps" "$2")
}

# same_checkpoint DIR_A DIR_B STEP RANKS: the model file and the RANKS state files of STEP are
# there in both directories and byte for byte the same.
same_checkpoint() {
  local a=$1 b=$2 step rank f
  step=$(printf %08d "$3")
  local files=("model_$step.bin")
  for ((rank = 0; rank < $4; rank++)); do files+=("$(printf "state_%s_%05d.bin" "$step" "$rank")"); done
  for f in "${files[@]}"; do
    cmp "$a/$f" "$b/$f" || return 1
  done
  if [ -e "$a/$(printf "state_%s_%05d.bin" "$step" "$4")" ]; then
    echo "$a has state files of more than $4 ranks"
    return 1
  fi
  echo "identical: ${files[*]}"
}

# same_checkpoints_every_step DIR_A DIR_B STEPS RANKS: steps 1 to STEPS each have a DONE marker in
# both directories and the same bytes in their model and RANKS state files.
same_checkpoints_every_step() {
  local step marker
  for ((step = 1; step <= $3; step++)); do
    marker=$(printf DONE_%08d "$step")
    if [ ! -e "$1/$marker" ] || [ ! -e "$2/$marker" ]; then
      echo "step $step: $marker is missing in $1 or $2"
      return 1
    fi
    same_checkpoint "$1" "$2" "$step" "$4" || return 1
  done
}

# resume_equivalence RUNNER NAME DIR RANKS TRAINER_COMMAND...: 20 straight steps against 10
# steps, a resume from their checkpoint (-y 1) and 10 more give the same run log (losses, norms,
# validation) and bitwise-identical final model and per-rank state files (the last checkpoint's: of
# step 20, or later where a stage plan's extension adds steps). `RUNNER NAME COMMAND...`
# runs and counts one check (run_tests.sh's run, multi_gpu_tests.sh's check); TRAINER_COMMAND is
# the trainer and its flags, behind a launcher (mpirun) where RANKS > 1.
resume_equivalence() { resume_equivalence_at 10 "$@"; }

# resume_equivalence_at STEP RUNNER NAME DIR RANKS TRAINER_COMMAND...: the same with the checkpoint
# of step STEP (below 20) resumed.
resume_equivalence_at() {
  local step=$1 runner=$2 name=$3 dir=$4 ranks=$5
  shift 5
  rm -rf "$dir"
  "$runner" "${name}_straight" "$@" -x 20 -n "$step" -o "$dir/straight"
  "$runner" "${name}_halt" "$@" -x 20 -n "$step" -o "$dir/resumed" -halt "$step"
  "$runner" "${name}_continue" "$@" -x 20 -n "$step" -o "$dir/resumed" -y 1
  "$runner" "${name}_same_log" same_log "$dir/straight/main.log" "$dir/resumed/main.log"
  local last
  last=$(cd "$dir/straight" 2>/dev/null && ls DONE_* 2>/dev/null | sort | tail -n1)
  last=${last#DONE_}
  "$runner" "${name}_same_files" same_checkpoint "$dir/straight" "$dir/resumed" "$((10#${last:-0}))" "$ranks"
  rm -f "$dir"/*/*.bin  # compared: the logs stay; a d12 run's checkpoints take gigabytes
}
