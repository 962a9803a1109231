#!/usr/bin/env bash
# Tests on a machine with 2 or more GPUs (OpenMPI's mpirun):
#  - rank equivalence: 2 ranks x micro batch B against 1 rank x B with 2 accumulation steps, on
#    unshuffled data so both see the same tokens (and validation the same chunks): FP32 losses
#    within 1e-5 over 10 steps, BF16 within 2e-2 (each rank rounds its own gradient to BF16 before
#    they are averaged, and the stochastic roundings' seeds are drawn once a micro step, so one rank
#    with 2 micro steps draws others than 2 ranks with 1);
#  - resume: 10 steps, a resume and 10 more against 20 straight steps on 2 ranks, bit for bit;
#  - checkpoints written in the background (-ac 1) against before training goes on (-ac 0), one
#    at every step: the same losses and the same bytes in every file;
#  - speed: tokens/s of GPT-2 124M on 1 and on 2 GPUs at the same micro batch;
#  - overlap: gradients reduced per layer during the backward pass (-ov 1) give the bits of one
#    reduction after it (-ov 0), with ZeRO off and on;
#  - divided optimizers (-od 1: each rank steps its share, reducing its gradients to itself, and
#    the others take its parameters): the steps and the checkpoint's bytes of -od 0 without
#    clipping, for the speedrun, the modern recipe and GPT-2, close with clipping, and a resume bit
#    for bit;
#  - the embedding tables' rows sent to their owners (-os 1): the steps and the checkpoint's bytes
#    of -od 0 for the speedrun (wte and the value embeddings) in both builds and the modern recipe
#    (its untied embedding), with -oc 2 too, and a resume bit for bit;
#  - ZeRO-1 (-zs 1) against off: identical losses and parameters without clipping (FP32 and
#    BF16), close with clipping; its checkpoint resumes exactly;
#  - resharded resume: a checkpoint of 2 ranks resumed on 1 and one of 1 rank on 2 (-y 1), and
#    -zs 1 converted for -zs 0 by build/reshard_checkpoint;
#  - Muon (-recipe modern, and GPT-2 with -opt muon; each rank orthogonalising its share): 2
#    ranks against 1, two 2-rank runs bit for bit, resume, 2 ranks resumed on 1 and 1 on 2; with
#    ZeRO-1 (-zs 1) the bits of -zs 0 without clipping, two runs bit for bit, resume, and its
#    checkpoint resumed with -zs 0 (bit for bit) and on 1 rank;
#  - delayed FP8 scaling (-fp8 2, compute capability 8.9+), with the amaxes reduced over the
#    ranks: two runs bit for bit, within 0.1 of BF16, and a resume bit for bit;
#  - packed documents (-pd 1) with the window's schedule (-aw -1), each rank its own sequences:
#    2 ranks x 1 micro batch against 1 rank x 2 (the same sequences), two 2-rank runs bit for bit,
#    resume bit for bit, 2 ranks resumed on 1 and 1 on 2;
#  - a stage plan (-sp) on packed documents: T, the tokens a step, the document cap, the window and
#    the rate changing at step 6 of 10 (11 of 20): rank equivalence, two 2-rank runs bit for bit,
#    resume bit for bit across the boundary, and a checkpoint of the step before it resumed on the
#    other process count;
#  - the speedrun recipe (-recipe speedrun, each rank its own sequence of packed documents, its
#    FP8 head where the GPU has FP8 products): 2 ranks x 2 micro batches against 1 rank x 4 (the
#    same sequences; BF16 within 2e-2, FP32 within 2e-3), two 2-rank runs bit for bit, resume bit
#    for bit (Muon's momentum warmup, the FP8 head), 2 ranks resumed on 1 and 1 on 2, -zs 1
#    with the bits of -zs 0 (also with record #89's Q and K head pairs, -mq 2), and -ov 1 with the
#    bits of -ov 0;
#  - AdamW every 2 steps (-ao 2, record #89's; the speedrun recipe from record #89's init, the head
#    untied at step 5), every rank keeping AdamW's gradients whole: 2 ranks against 1, -od 1 and
#    -ov 1 with the bits of -od 0, a resume bit for bit from a checkpoint with kept gradients, and
#    that checkpoint resumed on 1 rank; -recipe record89 at a test size: two 2-rank runs bit for
#    bit, a resume bit for bit and on 1 rank;
#  - every run of 2 ranks against 1 (and the speedrun's -zs 1) ends with both ranks' parameters
#    identical (the trainer compares their checksums);
#  - launches without mpirun (fs and tcp rendezvous) give the losses of mpirun;
#  - a rank killed (kill -9) or stopped (SIGSTOP) mid-run makes the other exit with status 4
#    and its message within the -ct bound.
# Ends with "N passed, N failed".
#
# usage: scripts/multi_gpu_tests.sh [OUTDIR [GROUP...]]   (default build/test_multi_gpu, every group)
#   The groups, in the order they run: gpt2_ranks_test modern_recipe_test packed_documents_test
#   stages_test speedrun_test adam_every_test gpt2_muon_test overlap_test divided_test sparse_rows_test
#   zero_test reshard_test by_hand_test lost_rank_test multi_gpu_resume_tests async_checkpoint_test
#   fp8_delayed_test speed_test
set -u
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"
test_groups=(gpt2_ranks_test modern_recipe_test packed_documents_test stages_test speedrun_test adam_every_test
  gpt2_muon_test overlap_test
  divided_test sparse_rows_test zero_test reshard_test by_hand_test lost_rank_test multi_gpu_resume_tests async_checkpoint_test fp8_delayed_test
  speed_test)
out=${1:-build/test_multi_gpu}
selected=("${@:2}")
for group in "${selected[@]}"; do
  if [[ " ${test_groups[*]} " != *" $group "* ]]; then
    echo "error: scripts/multi_gpu_tests.sh: unknown group '$group'; the groups are ${test_groups[*]}" >&2
    exit 1
  fi
done
[ ${#selected[@]} -gt 0 ] || selected=("${test_groups[@]}")
mkdir -p "$out"
ranks=2
source dev/test/multi_gpu_lib.sh
source dev/test/compare_runs.sh
source dev/test/record89_args.sh  # RECORD89_TEST

# ranks_equivalence NAME BINARY TOL VAL_BATCHES ARGS...: 10 steps of ARGS on 1 rank and on 2, whose
# steps take the same tokens (ARGS give a -z that B*T and 2*B*T divide); their step and validation
# losses within TOL. Validation reads the same chunks of the val shard on both (batch b gives rank
# r chunk 2b + r): 2 x VAL_BATCHES batches on 1 rank, VAL_BATCHES on each of 2.
ranks_equivalence() {
  local name=$1 binary=$2 tol=$3 m=$4
  shift 4
  check "${name}_one_rank" "./$binary" "$@" -x 10 -m $((2 * m))
  check "${name}_two_ranks" $mpi "./$binary" "$@" -x 10 -m "$m"
  check "${name}_equivalent" losses_close "$out/${name}_one_rank.log" "$out/${name}_two_ranks.log" "$tol"
  check "${name}_ranks_identical" grep -a "^parameters identical on 2 processes" "$out/${name}_two_ranks.log"
}

# GPT-2's rank equivalence (the first item above) in the FP32 and BF16 builds.
gpt2_ranks_test() {
  local build binary tol extra
  for build in "train_gpt2fp32cu:1e-5:-f 0" "train_gpt2cu:2e-2:"; do
    IFS=: read -r binary tol extra <<< "$build"
    ranks_equivalence "$binary" "$binary" "$tol" 4 $common -b 4 -z 2048 -v 5 $extra
  done
}

# --- Resume on two GPUs: 20 straight steps against 10, a resume (-y 1) and 10 more give the same
# run log and bitwise-identical model and per-rank state files, in FP32 and BF16, with shuffled data
# (each rank's loader position and the shared shuffle state come back from its state file).
multi_gpu_resume_tests() {
  local binary
  for binary in train_gpt2fp32cu train_gpt2cu; do
    resume_equivalence check "${binary}_resume_two_ranks" "$out/resume_$binary" 2 \
      $mpi ./$binary $common -b 4 -v 10 -m 4 -sh 1
  done
}

# Checkpoints written in the background against before training goes on, on two ranks with ZeRO
# (each rank writes its state file, rank 0 the DONE marker once both are written): the same
# losses, and at every step the same bytes in the model and both state files.
async_checkpoint_test() {
  local dir=$out/async_checkpoints ac
  rm -rf "$dir"
  for ac in 1 0; do
    check "async_checkpoints_ac$ac" $mpi ./train_gpt2cu $common -e tiny -t 64 -b 4 -x 6 -v 3 -m 2 \
      -n 1 -ac $ac -o "$dir/ac$ac"
  done
  check async_checkpoints_on grep -aE "^\| checkpoints +\| written in the background " "$out/async_checkpoints_ac1.log"
  check async_checkpoints_same_steps same_steps "$out/async_checkpoints_ac1.log" "$out/async_checkpoints_ac0.log"
  check async_checkpoints_same_files same_checkpoints_every_step "$dir/ac1" "$dir/ac0" 6 2
}

# The step and validation lines (up to the timing; with a third argument "no-norm", up to the
# norm) and the parameter checksum of two logs are identical.
same_steps() {
  local cut='s/ | [0-9.]* ms .*//' a b
  [ "${3:-}" = no-norm ] && cut='s/ | norm .*//'
  a=$(grep -aE "^step .*loss|checksum" "$1" | sed "$cut")
  b=$(grep -aE "^step .*loss|checksum" "$2" | sed "$cut")
  [ -n "$a" ] && [ "$a" = "$b" ] && echo "identical: $(echo "$a" | wc -l) lines"
}

# Per-layer reduction during the backward pass against one reduction after it: bitwise.
overlap_test() {
  local zs
  for zs in 0 1; do
    check "overlap_zs${zs}_off" $mpi ./train_gpt2fp32cu $common -b 4 -x 10 -v 5 -m 4 -f 0 -zs $zs -ov 0
    check "overlap_zs${zs}_on" $mpi ./train_gpt2fp32cu $common -b 4 -x 10 -v 5 -m 4 -f 0 -zs $zs -ov 1
    check "overlap_zs${zs}_same" same_steps "$out/overlap_zs${zs}_off.log" "$out/overlap_zs${zs}_on.log"
  done
}

# ZeRO-1 against ZeRO off. Without clipping (-gc 0) every element's update is the same (same
# averaged gradient, same AdamW, same rounding bits), so losses and parameters are identical;
# the norm is summed per shard then over the ranks, so with clipping the scale can differ in its
# last bit and the losses agree within a tolerance. Then a ZeRO checkpoint resumes exactly.
zero_test() {
  local build binary tol extra
  for build in "train_gpt2fp32cu:1e-5:-f 0" "train_gpt2cu:2e-2:"; do
    IFS=: read -r binary tol extra <<< "$build"
    check "${binary}_zs0_noclip" $mpi ./$binary $common -b 4 -x 10 -v 5 -m 4 -gc 0 -zs 0 $extra
    check "${binary}_zs1_noclip" $mpi ./$binary $common -b 4 -x 10 -v 5 -m 4 -gc 0 -zs 1 $extra
    check "${binary}_zero_identical" same_steps "$out/${binary}_zs0_noclip.log" "$out/${binary}_zs1_noclip.log" no-norm
    check "${binary}_zs0_clip" $mpi ./$binary $common -b 4 -x 10 -v 5 -m 4 -zs 0 $extra
    check "${binary}_zs1_clip" $mpi ./$binary $common -b 4 -x 10 -v 5 -m 4 -zs 1 $extra
    check "${binary}_zero_close" losses_close "$out/${binary}_zs0_clip.log" "$out/${binary}_zs1_clip.log" "$tol"
  done
  local dir=$out/zero_resume
  rm -rf "$dir"
  local args="$common -b 4 -x 8 -v 4 -m 2 -n 4 -zs 1"
  check zero_straight $mpi ./train_gpt2cu $args -o "$dir/straight"
  check zero_halt $mpi ./train_gpt2cu $args -o "$dir/resumed" -halt 4
  check zero_continue $mpi ./train_gpt2cu $args -o "$dir/resumed" -y 1
  check zero_resume_same bash -c "cmp $dir/straight/model_00000008.bin $dir/resumed/model_00000008.bin && \
    cmp $dir/straight/state_00000008_00001.bin $dir/resumed/state_00000008_00001.bin && echo identical"
}

# A checkpoint of step 5 resumed (-y 1) on another process count continues as the run that never
# stopped on that layout: 2 ranks to 1 and 1 to 2 within the rank-equivalence tolerances above
# (1 rank sums the 2 micro batches' gradients in another order than 2 ranks do), in FP32 and
# BF16. A -zs 1 checkpoint converted for -zs 0 by build/reshard_checkpoint, on the same 2 ranks
# without clipping (where the two settings give the same bits, as zero_test shows), continues bit
# for bit, model and state files included.
reshard_test() {
  local dir=$out/reshard build binary tol extra
  rm -rf "$dir"
  for build in "train_gpt2fp32cu:1e-5:-f 0" "train_gpt2cu:2e-2:"; do
    IFS=: read -r binary tol extra <<< "$build"
    local d=$dir/$binary name=${binary}_reshard args="$common -b 4 -z 2048 -x 10 -v 0 -n 5 $extra"
    check "${name}_one" ./$binary $args -o "$d/one"
    check "${name}_two" $mpi ./$binary $args -o "$d/two"
    check "${name}_one_halt" ./$binary $args -o "$d/one_halted" -halt 5
    check "${name}_two_halt" $mpi ./$binary $args -o "$d/two_halted" -halt 5
    check "${name}_resumed_on_1" ./$binary $args -o "$d/two_halted" -y 1
    check "${name}_resumed_on_2" $mpi ./$binary $args -o "$d/one_halted" -y 1
    check "${name}_said_so" grep -q "resharded: the checkpoint of 2 processes with ZeRO stage 1 resumes on 1 with stage 0" "$out/${name}_resumed_on_1.log"
    check "${name}_2_to_1_close" losses_close_from "$out/${name}_one.log" "$out/${name}_resumed_on_1.log" 5 "$tol"
    check "${name}_1_to_2_close" losses_close_from "$out/${name}_two.log" "$out/${name}_resumed_on_2.log" 5 "$tol"
  done
  local d=$dir/zero args="$common -b 4 -x 10 -v 0 -n 5 -gc 0 -f 0"
  check reshard_zs0 $mpi ./train_gpt2fp32cu $args -zs 0 -o "$d/zs0"
  check reshard_zs1_halt $mpi ./train_gpt2fp32cu $args -zs 1 -o "$d/zs1" -halt 5
  check reshard_zs1_to_zs0 build/reshard_checkpoint -i "$d/zs1" -o "$d/zs1_as_zs0" -p 2 -zs 0
  check reshard_resumed_zs0 $mpi ./train_gpt2fp32cu $args -zs 0 -o "$d/zs1_as_zs0" -y 1
  check reshard_zs1_to_zs0_same losses_close_from "$out/reshard_zs0.log" "$out/reshard_resumed_zs0.log" 5 0
  check reshard_zs1_to_zs0_files bash -c "cmp $d/zs0/model_00000010.bin $d/zs1_as_zs0/model_00000010.bin && \
    cmp $d/zs0/state_00000010_00000.bin $d/zs1_as_zs0/state_00000010_00000.bin && \
    cmp $d/zs0/state_00000010_00001.bin $d/zs1_as_zs0/state_00000010_00001.bin && echo identical"
}

# Two processes started by hand, one per GPU, through rendezvous $1 (rank 1 sees only its own GPU
# with $2 = isolate). Prints rank 0's output; fails unless both exit 0.
by_hand() {
  local rendezvous=$1 mapping=$2 binary=$3
  shift 3
  local token="test-$$-$RANDOM" log="$out/by_hand_$RANDOM"
  ./$binary "$@" -pr 0 -pn 2 -rv "$rendezvous" -rt "$token" > "$log.0" 2>&1 &
  local p0=$!
  if [ "$mapping" = isolate ]; then
    CUDA_VISIBLE_DEVICES=1 ./$binary "$@" -pr 1 -pn 2 -pl 0 -rv "$rendezvous" -rt "$token" > "$log.1" 2>&1 &
  else
    ./$binary "$@" -pr 1 -pn 2 -rv "$rendezvous" -rt "$token" > "$log.1" 2>&1 &
  fi
  local p1=$!
  wait $p0
  local s0=$?
  wait $p1
  local s1=$?
  cat "$log.0"
  echo "rank 0 exit $s0, rank 1 exit $s1"; tail -2 "$log.1"
  [ $s0 -eq 0 ] && [ $s1 -eq 0 ]
}

# Launches without mpirun give exactly the losses of mpirun (the same ranks and data).
by_hand_test() {
  local args="$common -b 4 -x 10 -v 5 -m 4 -f 0"
  rm -rf "$out/rendezvous"
  check by_hand_mpirun $mpi ./train_gpt2fp32cu $args
  check by_hand_fs by_hand "fs:$out/rendezvous" same train_gpt2fp32cu $args
  check by_hand_fs_same same_steps "$out/by_hand_mpirun.log" "$out/by_hand_fs.log"
  check by_hand_fs_file_removed bash -c "[ -z \"\$(ls -A $out/rendezvous)\" ] && echo 'rendezvous directory empty'"
  check by_hand_tcp by_hand "tcp:localhost:$((29500 + RANDOM % 1000))" isolate train_gpt2fp32cu $args
  check by_hand_tcp_same same_steps "$out/by_hand_mpirun.log" "$out/by_hand_tcp.log"
}

# A by-hand launch with -ct 20: once rank 0 has printed step 5, rank 1 gets signal $1 (KILL: it
# dies; STOP: it hangs). Rank 0 must exit with status 4 and its message within the documented
# 1.1 x 20 + 10 s (+2 s for the shell clock's whole seconds and the process exit).
lost_rank() {
  local signal=$1 ct=20 bound=34 token="lost-$$-$RANDOM" log="$out/lost_$1"
  local args="$common -b 4 -x 100000 -v 0 -ct $ct -rv fs:$out/rendezvous -rt $token -pn 2"
  ./train_gpt2cu $args -pr 0 > "$log.0" 2>&1 &
  local p0=$!
  ./train_gpt2cu $args -pr 1 > "$log.1" 2>&1 &
  local p1=$!
  ( sleep 300; kill -9 $p0 $p1 2>/dev/null ) &  # a broken watchdog must not hang the tests
  local guard=$!
  until grep -qaE "^step +5/" "$log.0"; do
    kill -0 $p0 2>/dev/null || break
    sleep 0.2
  done
  kill -$signal $p1
  local start=$SECONDS
  wait $p0
  local status=$? elapsed=$((SECONDS - start))
  kill -CONT $p1 2>/dev/null  # a stopped rank, resumed, finds rank 0 gone: its watchdog ends it
  wait $p1
  local status1=$?
  kill $guard 2>/dev/null
  tail -3 "$log.0"
  tail -1 "$log.1"
  echo "rank 0: exit status $status after $elapsed s (expected 4 within $bound s); rank 1: exit $status1"
  [ $status -eq 4 ] && [ $elapsed -le $bound ] && [ $status1 -ne 0 ] &&
    grep -q "rank 0 made no progress for $ct s" "$log.0"
}

lost_rank_test() {
  check lost_rank_killed lost_rank KILL
  check lost_rank_stopped lost_rank STOP
}

# Whether the GPU has FP8 products (compute capability 8.9+).
fp8_gpu() {
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | awk '{ exit !($1 >= 8.9) }'
}

# Delayed FP8 scaling on two ranks: the step's amaxes are reduced over the ranks (ncclMax) before
# they enter the history, so the runs are deterministic, track BF16, and resume bit for bit
# (each rank's state file holds the reduced history).
fp8_delayed_test() {
  if ! fp8_gpu; then
    echo "skip fp8_delayed_test: FP8 needs compute capability 8.9+"
    return
  fi
  local args="$common -b 4 -x 20 -v 10 -m 4"
  check fp8_delayed_first $mpi ./train_gpt2cu $args -fp8 2
  check fp8_delayed_second $mpi ./train_gpt2cu $args -fp8 2
  check fp8_delayed_deterministic losses_close "$out/fp8_delayed_first.log" "$out/fp8_delayed_second.log" 0
  check fp8_delayed_bf16 $mpi ./train_gpt2cu $args
  check fp8_delayed_tracks_bf16 losses_close "$out/fp8_delayed_first.log" "$out/fp8_delayed_bf16.log" 0.1
  resume_equivalence check fp8_delayed_resume "$out/resume_fp8_delayed" 2 \
    $mpi ./train_gpt2cu $common -b 4 -v 10 -m 4 -sh 1 -fp8 2
}

# ranks_sequence NAME VAL_BATCHES ARGS...: the checks NAME_* of a recipe or data order on two ranks
# (train_gpt2cu, ARGS without -x and -m): ranks_equivalence within the BF16 rank tolerance 2e-2;
# two 2-rank runs bit for bit (same_steps: losses, norms, parameter checksum); 20 straight steps on
# 2 ranks against 10, a resume and 10 more, bit for bit (resume_equivalence); a checkpoint of step
# 5 of 2 ranks resumed on 1 and one of 1 rank resumed on 2, whose losses from step 5 on stay within
# the tolerance of the run that never stopped on that process count (1 rank sums the micro
# batches' gradients in another order than 2 ranks do).
ranks_sequence() {
  local name=$1 m=$2 tol=2e-2
  shift 2
  ranks_equivalence "$name" train_gpt2cu $tol "$m" "$@"
  check "${name}_two_ranks_again" $mpi ./train_gpt2cu "$@" -x 10 -m "$m"
  check "${name}_deterministic" same_steps "$out/${name}_two_ranks.log" "$out/${name}_two_ranks_again.log"
  resume_equivalence check "${name}_resume_two_ranks" "$out/resume_$name" 2 $mpi ./train_gpt2cu "$@" -m "$m"
  local dir=$out/${name}_reshard
  rm -rf "$dir"
  check "${name}_reshard_two_halt" $mpi ./train_gpt2cu "$@" -x 10 -m "$m" -n 5 -o "$dir/two" -halt 5
  check "${name}_reshard_on_one" ./train_gpt2cu "$@" -x 10 -m $((2 * m)) -n 5 -o "$dir/two" -y 1
  check "${name}_reshard_2_to_1_close" losses_close_from "$out/${name}_one_rank.log" \
    "$out/${name}_reshard_on_one.log" 5 $tol
  check "${name}_reshard_one_halt" ./train_gpt2cu "$@" -x 10 -m $((2 * m)) -n 5 -o "$dir/one" -halt 5
  check "${name}_reshard_on_two" $mpi ./train_gpt2cu "$@" -x 10 -m "$m" -n 5 -o "$dir/one" -y 1
  check "${name}_reshard_1_to_2_close" losses_close_from "$out/${name}_two_ranks.log" \
    "$out/${name}_reshard_on_two.log" 5 $tol
  rm -f "$dir"/*/*.bin  # compared: the logs stay; a d12 run's checkpoints take gigabytes
}

# The modern recipe on two ranks (its defaults -zs 0 -od 1: each rank takes the averaged gradient
# of its share of Muon's matrices and of its part of the large AdamW tensors, steps them and
# broadcasts their new parameters): against one rank with two accumulation steps within the BF16
# rank tolerance, two runs bit for bit (the shares are fixed by the process count), a resume bit
# for bit, a checkpoint of 2 ranks resumed on 1 and one of 1 rank on 2 against the runs that never
# stopped (ranks_sequence). Then ZeRO-1 (-zs 1, to which the recipe's -od 1 yields: each rank steps
# its shard's momentum, the Nesterov inputs are gathered, each applies the update to its
# shard): the bits of -zs 0 (the recipe does not clip; the norms, summed per shard, are not
# compared), two runs bit for bit, a resume bit for bit, and a -zs 1 checkpoint resumed with -zs
# 0, bit for bit against the -zs 0 run, and on 1 rank, within the rank tolerance.
modern_recipe_test() {
  local args="$common -recipe modern -e d12 -b 4 -t 256 -v 5 -z 2048"
  ranks_sequence modern 4 $args
  args="$args -m 4"
  local dir=$out/modern_zero
  rm -rf "$dir"
  check modern_zs1 $mpi ./train_gpt2cu $args -x 10 -zs 1
  check modern_zs1_same_as_zs0 same_steps "$out/modern_two_ranks.log" "$out/modern_zs1.log" no-norm
  check modern_zs1_again $mpi ./train_gpt2cu $args -x 10 -zs 1
  check modern_zs1_deterministic same_steps "$out/modern_zs1.log" "$out/modern_zs1_again.log"
  resume_equivalence check modern_resume_zs1 "$out/resume_modern_zs1" 2 $mpi ./train_gpt2cu $args -zs 1
  check modern_zs1_halt $mpi ./train_gpt2cu $args -x 10 -n 5 -zs 1 -o "$dir/zs1" -halt 5
  cp -r "$dir/zs1" "$dir/zs1_for_one"
  check modern_zs1_resumed_zs0 $mpi ./train_gpt2cu $args -x 10 -n 5 -zs 0 -o "$dir/zs1" -y 1
  check modern_zs1_to_zs0_said_so grep -q "resharded: the checkpoint of 2 processes with ZeRO stage 1 resumes on 2 with stage 0" "$out/modern_zs1_resumed_zs0.log"
  check modern_zs1_to_zs0_same losses_close_from "$out/modern_two_ranks.log" "$out/modern_zs1_resumed_zs0.log" 5 0
  check modern_zs1_resumed_on_one ./train_gpt2cu $args -x 10 -n 5 -m 8 -o "$dir/zs1_for_one" -y 1
  check modern_zs1_2_to_1_close losses_close_from "$out/modern_one_rank.log" "$out/modern_zs1_resumed_on_one.log" 5 2e-2
  rm -f "$dir"/*/*.bin
}

# Packed documents with the window's schedule: a step's sequences come from one stream, micro batch
# m giving rank r its sequences (m * ranks + r) * B.. (dev/SPEC.md "Document-aligned order"), so two
# ranks with one micro batch read the sequences one rank reads with two: ranks_sequence (losses
# within the BF16 rank tolerance; two 2-rank runs bit for bit; a resume bit for bit, each rank's
# loader state and the schedule's window from the resumed step; a 2-rank checkpoint resumed on 1
# rank and a 1-rank one on 2, within the tolerance of the runs that never stopped).
packed_documents_test() {
  ranks_sequence packed 4 $common -pd 1 -aw -1 -b 4 -v 5 -z 2048
}

# A stage plan on packed documents: a step's tokens double where T does (2 micro batches of 4 x 256
# on 1 rank, then of 4 x 512; 1 micro batch on each of 2 ranks), the document cap, the window and the
# rate change, at step 6 of -x 10 and step 11 of -x 20 (ranks_sequence's resumes: from step 10 of
# 20, and from step 5 of 10 on the other process count, each the last step before its boundary).
stages_test() {
  ranks_sequence stages 4 $common -pd 1 -b 4 -v 5 -z 2048 -aw 1 \
    -sp "0.55 cap=64; 0.45 t=512 z=4096 cap=128 aw=3 lr=0.8"
}

# The speedrun recipe (record #28: packed documents in the window's schedule, Muon and Adam, value
# embeddings, U-net skips, gated heads, and where the GPU has FP8 products the head's training
# products in FP8 with fixed scales, -fh 1) in the reference's layout, each process its own
# sequence (-b 1): a step's 4 sequences of 256 tokens are 4 micro batches on 1 rank or 2 on each of
# 2 (micro batch m gives rank r the step's sequence 2m + r: dev/SPEC.md "Document-aligned order");
# validation on sequences of -vt 512.
# Adam's rates are 1% of the recipe's (-l 0.01), Muon's the recipe's (0.05). At the recipe's own,
# the losses of steps of 1,024 tokens jump by up to 1.0 from one step to the next
# (scripts/run_tests.sh gpu_determinism), too chaotic for a rank tolerance. At $common's -l 1e-4
# the zero-initialised head moves by 8e-7 a step, under half of E4M3's smallest step at its fixed
# scale 2^-9 (2^-18 = 3.8e-6): its FP8 copy would stay zero for the first steps and pass no gradient
# to the blocks. At 1% the first step moves it by 8e-5, 0.04 in E4M3's units, a normal number.
# ranks_sequence's checks, with the bound of the other Muon tests (2e-2: each rank rounds its own
# gradient to BF16 before the average, and Muon orthogonalises in BF16). The FP8 head's casts see
# the same values on 1 and 2 ranks up to a power of two (the summed loss's gradient times the process
# count, which the ranks' average divides again), which moves no rounding of a normal E5M2 number.
# The FP32 build (-f 0; no FP8 head there): 1 rank against 2 within 2e-3. Its gradients differ
# only in their last bits (1 rank adds its 4 micro batches in turn, 2 ranks 2 each and then the
# all-reduce), but Muon's Newton-Schulz runs in BF16 in every build, so the inputs whose rounding
# those bits flip give other updates: a tenth of BF16's bound, not GPT-2's 1e-5. Then -zs 1 gives
# the bits of -zs 0 (the recipe does not clip; the norms, summed per shard, are not compared), and
# the startup table shows the FP8 head where the GPU has FP8 products. Every two-rank run but those
# with -zs 1 divides the optimizers (the recipe's -od 1).
speedrun_test() {
  local args="$common -recipe speedrun -e d12 -b 1 -t 256 -vt 512 -z 1024 -v 5 -l 0.01"
  ranks_sequence speedrun 4 $args
  ranks_equivalence speedrun_fp32 train_gpt2fp32cu 2e-3 4 $args -f 0
  check speedrun_zs1 $mpi ./train_gpt2cu $args -x 10 -m 4 -zs 1
  check speedrun_zs1_same_as_zs0 same_steps "$out/speedrun_two_ranks.log" "$out/speedrun_zs1.log" no-norm
  check speedrun_zs1_ranks_identical grep -a "^parameters identical on 2 processes" "$out/speedrun_zs1.log"
  # Record #89's Q and K in head pairs (-mq 2): its [256, 768] group spread over the processes like
  # the others, -zs 1 the bits of -zs 0.
  check speedrun_qk_pairs_zs0 $mpi ./train_gpt2cu $args -x 10 -m 4 -mq 2 -zs 0
  check speedrun_qk_pairs_zs1 $mpi ./train_gpt2cu $args -x 10 -m 4 -mq 2 -zs 1
  check speedrun_qk_pairs_zs1_same same_steps "$out/speedrun_qk_pairs_zs0.log" "$out/speedrun_qk_pairs_zs1.log" \
    no-norm
  # Each layer's gradients reduced during the backward (-ov 1): its scalars, value embeddings and
  # FP8 head among the tensors reduced at the end; two ranks' sums are the same in any order.
  check speedrun_overlap $mpi ./train_gpt2cu $args -x 10 -m 4 -ov 1
  check speedrun_overlap_same same_steps "$out/speedrun_two_ranks.log" "$out/speedrun_overlap.log"
  if fp8_gpu; then
    check speedrun_fp8_head_on grep -aE "^\| head +\| FP8 in training" "$out/speedrun_two_ranks.log"
  fi
}

# AdamW every 2 steps (-ao 2), the speedrun recipe from record #89's init with the head untied at
# step 5: every rank keeps AdamW's gradients whole, averaged at each step. 2 ranks against 1 (BF16
# within 2e-2, FP32 within 2e-3); -od 1 with the steps of -od 0 (norms close: summed in another
# order), -ov 1 with the bits of -ov 0; a resume bit for bit from the checkpoint of step 5 (after
# step 4, whose gradients AdamW keeps), and that checkpoint of 2 ranks resumed on 1 (its kept
# gradients resharded), close to the straight run of 1 rank.
adam_every_test() {
  local args="$common -recipe speedrun -e d12 -ri 89 -b 1 -t 256 -vt 512 -z 1024 -v 5 -l 0.01 -ao 2 -ut 5"
  ranks_equivalence adam_every train_gpt2cu 2e-2 4 $args
  ranks_equivalence adam_every_fp32 train_gpt2fp32cu 2e-3 4 $args -f 0
  local run
  for run in "od0:-od 0" "od1:-od 1" "ov1:-od 1 -ov 1"; do
    # shellcheck disable=SC2086  # the flags' words
    check "adam_every_${run%%:*}" $mpi ./train_gpt2cu $args -x 10 -m 4 ${run#*:}
  done
  check adam_every_od1_same same_steps "$out/adam_every_od0.log" "$out/adam_every_od1.log" no-norm
  check adam_every_od1_norms norms_close "$out/adam_every_od0.log" "$out/adam_every_od1.log"
  check adam_every_ov1_same same_steps "$out/adam_every_od1.log" "$out/adam_every_ov1.log"
  resume_equivalence_at 5 check adam_every_resume "$out/resume_adam_every" 2 $mpi ./train_gpt2cu $args -m 4
  local d=$out/adam_every_reshard
  rm -rf "$d"
  check adam_every_straight_one ./train_gpt2cu $args -x 10 -m 8 -n 5 -o "$d/one"
  check adam_every_two_halt $mpi ./train_gpt2cu $args -x 10 -m 4 -n 5 -o "$d/two" -halt 5
  check adam_every_resumed_on_1 ./train_gpt2cu $args -x 10 -m 8 -n 5 -o "$d/two" -y 1
  check adam_every_2_to_1_close losses_close_from "$out/adam_every_straight_one.log" \
    "$out/adam_every_resumed_on_1.log" 5 2e-2
  rm -f "$d"/*/*.bin
  # -recipe record89 itself at its test size (RECORD89_TEST, one sequence a rank): two runs of 2
  # ranks bit for bit, a resume bit for bit from the checkpoint of step 9 (stage 2, after step 8,
  # whose gradients AdamW keeps), and that checkpoint resumed on 1 rank to the end.
  # shellcheck disable=SC2206  # common's words
  local record89=($common "${RECORD89_TEST[@]}" -v 5 -m 4) i
  for i in 1 2; do
    check "adam_every_record89_$i" $mpi ./train_gpt2cu "${record89[@]}" -x 20
  done
  check adam_every_record89_twice same_steps "$out/adam_every_record89_1.log" "$out/adam_every_record89_2.log"
  check adam_every_record89_ranks_identical grep -a "^parameters identical on 2 processes" \
    "$out/adam_every_record89_1.log"
  resume_equivalence_at 9 check adam_every_record89_resume "$out/resume_adam_every_record89" 2 \
    $mpi ./train_gpt2cu "${record89[@]}"
  d=$out/adam_every_record89_reshard
  rm -rf "$d"
  check adam_every_record89_two_halt $mpi ./train_gpt2cu "${record89[@]}" -x 20 -n 9 -o "$d" -halt 9
  check adam_every_record89_resumed_on_1 ./train_gpt2cu "${record89[@]}" -x 20 -n 9 -o "$d" -y 1 -m 8
  check adam_every_record89_resharded grep -q "resharded: the checkpoint of 2 processes with ZeRO stage 0 resumes on 1" \
    "$out/adam_every_record89_resumed_on_1.log"
  rm -f "$d"/*.bin
}

# GPT-2 with Muon (-opt muon, -zs 0) on two ranks against one rank with two accumulation steps,
# within the BF16 rank tolerance, and two runs on two ranks bit for bit; -zs 1 against -zs 0: the
# same bits without clipping (BF16 and FP32 builds: the gathered Nesterov inputs are in floatX),
# close with clipping (the norms, summed per shard, may round apart and so the clipping factors).
gpt2_muon_test() {
  local args="$common -opt muon -b 4 -x 10 -v 5" build binary extra zs
  check gpt2_muon_one_rank ./train_gpt2cu $args -z 2048 -m 8
  check gpt2_muon_two_ranks $mpi ./train_gpt2cu $args -m 4 -zs 0
  check gpt2_muon_equivalent losses_close "$out/gpt2_muon_one_rank.log" "$out/gpt2_muon_two_ranks.log" 2e-2
  check gpt2_muon_two_ranks_again $mpi ./train_gpt2cu $args -m 4 -zs 0
  check gpt2_muon_deterministic same_steps "$out/gpt2_muon_two_ranks.log" "$out/gpt2_muon_two_ranks_again.log"
  for build in "train_gpt2cu:" "train_gpt2fp32cu:-f 0"; do
    IFS=: read -r binary extra <<< "$build"
    for zs in 0 1; do
      check "${binary}_muon_zs${zs}_noclip" $mpi ./$binary $args -m 4 -gc 0 -zs $zs $extra
    done
    check "${binary}_muon_zero_identical" same_steps "$out/${binary}_muon_zs0_noclip.log" \
      "$out/${binary}_muon_zs1_noclip.log" no-norm
  done
  check gpt2_muon_zs1 $mpi ./train_gpt2cu $args -m 4 -zs 1
  check gpt2_muon_zero_close losses_close "$out/gpt2_muon_two_ranks.log" "$out/gpt2_muon_zs1.log" 2e-2
  # -e tiny with -zs 1: rank 0's slice of the optimizer state holds no Muon matrix, and the
  # checkpoint still resumes bit for bit (a state file records the run's optimizer, not its slice's).
  resume_equivalence check gpt2_muon_tiny_zs1 "$out/resume_gpt2_muon_tiny_zs1" 2 \
    $mpi ./train_gpt2cu $common -e tiny -opt muon -b 4 -t 64 -v 5 -m 4 -zs 1
}

# The gradient norms of two logs' steps agree within the printed digits and float rounding (one part
# in 10^5): the same gradients' squares added in another order.
norms_close() {
  paste <(grep -aoE "\| norm [0-9.]+" "$1") <(grep -aoE "\| norm [0-9.]+" "$2") | awk '
    { d = $3 - $6; if (d < 0) d = -d; if (d > 1e-4 + 1e-5 * $3) bad++; count++ }
    END { printf "%d norms, %d apart\n", count, bad; exit !(count >= 10 && bad == 0) }'
}

# same_checkpoint_but_norms DIR_A DIR_B STEP RANKS: STEP's model files are the same bytes, and so
# is each rank's state file but for the checksum and the host part, which holds the spike detector's
# recent gradient norms: the header before its checksum, and the payload after the host part (the
# moments, master weights, FP8 history and kept gradients, their sizes from the header).
same_checkpoint_but_norms() {
  local step rank f n master history kept payload
  step=$(printf %08d "$3")
  cmp "$1/model_$step.bin" "$2/model_$step.bin" || return 1
  header_int() { od -An -t d4 -j $((4 * $2)) -N 4 "$1" | tr -d ' '; }
  for ((rank = 0; rank < $4; rank++)); do
    f=$(printf "state_%s_%05d.bin" "$step" "$rank")
    [ -s "$1/$f" ] && [ -s "$2/$f" ] && [ "$(stat -c %s "$1/$f")" = "$(stat -c %s "$2/$f")" ] || return 1
    cmp -n 1020 "$1/$f" "$2/$f" || return 1
    n=$(od -An -t u8 -j 32 -N 8 "$1/$f" | tr -d ' ')
    master=$(header_int "$1/$f" 6); history=$(header_int "$1/$f" 10); kept=$(header_int "$1/$f" 18)
    payload=$((n * 4 * (2 + master + kept) + history * 4))
    cmp <(tail -c "$payload" "$1/$f") <(tail -c "$payload" "$2/$f") || return 1
  done
  echo "identical but the norms: model_$step.bin and $4 state files ($payload bytes of payload each)"
}

# -od 1 against -od 0, two processes: where the norm does not clip (the speedrun, the modern recipe,
# GPT-2 with -gc 0 in both builds) the same losses, parameters and checkpoint bytes at step 10 (but
# the spike detector's norms), the norms within rounding (-od 1 adds the processes' parts of the squares); GPT-2 clipping at 1: -od 1
# twice the same bits, its losses within 1e-3 of -od 0's; the speedrun's -od 1 resumed bit for bit, also
# with -oc 1 and -oc 2 (the copy engines' copies, Muon's behind the next forward pass).
divided_test() {
  local speedrun="$common -recipe speedrun -e d12 -b 1 -t 256 -vt 512 -z 1024 -v 5 -l 0.01 -m 4"
  local modern="$common -recipe modern -e d12 -b 4 -t 256 -v 5 -z 2048 -m 4"
  local gpt2="$common -b 4 -z 2048 -v 5 -m 4 -zs 0" run name binary args od dir
  for run in "speedrun:train_gpt2cu:$speedrun" "modern:train_gpt2cu:$modern" "gpt2:train_gpt2cu:$gpt2 -gc 0" \
      "gpt2_fp32:train_gpt2fp32cu:$gpt2 -gc 0 -f 0"; do
    IFS=: read -r name binary args <<< "$run"
    dir=$out/divided_$name
    rm -rf "$dir"
    # -od 1's parameters broadcast by NCCL (od1), or copied by the copy engines (-oc 1: oc1), Muon's behind
    # the next forward pass (-oc 2: oc2): the same bits.
    for od in "od0:-od 0" "od1:-od 1" "oc1:-od 1 -oc 1" "oc2:-od 1 -oc 2"; do
      # shellcheck disable=SC2086  # the flags' words
      check "divided_${name}_${od%%:*}" $mpi ./$binary $args -x 10 -n 10 -o "$dir/${od%%:*}" ${od#*:}
    done
    for od in od1 oc1 oc2; do
      check "divided_${name}_${od}_same" same_steps "$out/divided_${name}_od0.log" "$out/divided_${name}_$od.log" no-norm
      check "divided_${name}_${od}_norms" norms_close "$out/divided_${name}_od0.log" "$out/divided_${name}_$od.log"
      check "divided_${name}_${od}_same_checkpoint" same_checkpoint_but_norms "$dir/od0" "$dir/$od" 10 2
      check "divided_${name}_${od}_ranks_identical" grep -a "^parameters identical on 2 processes" \
        "$out/divided_${name}_$od.log"
    done
    rm -f "$dir"/*/*.bin
  done
  for run in od0:0 od1:1 od1_again:1; do
    check "divided_gpt2_clip_${run%%:*}" $mpi ./train_gpt2cu $gpt2 -x 10 -od "${run##*:}"
  done
  check divided_gpt2_clip_clipped grep -aqE "\| norm ([1-9][0-9]*\.|[2-9])" "$out/divided_gpt2_clip_od0.log"
  check divided_gpt2_clip_twice same_steps "$out/divided_gpt2_clip_od1.log" "$out/divided_gpt2_clip_od1_again.log"
  check divided_gpt2_clip_near losses_close "$out/divided_gpt2_clip_od0.log" "$out/divided_gpt2_clip_od1.log" 1e-3
  resume_equivalence check divided_speedrun_resume "$out/resume_divided_speedrun" 2 \
    $mpi ./train_gpt2cu $speedrun -od 1
  resume_equivalence check divided_copies_speedrun_resume "$out/resume_divided_copies_speedrun" 2 \
    $mpi ./train_gpt2cu $speedrun -od 1 -oc 1
  resume_equivalence check divided_copies_behind_speedrun_resume "$out/resume_divided_copies_behind_speedrun" 2 \
    $mpi ./train_gpt2cu $speedrun -od 1 -oc 2
}

# -od 1 -os 1 (alone and with -oc 2) against -od 0, two processes: the same losses, parameters and
# checkpoint bytes at step 10 (but the spike detector's norms), the norms within rounding; the
# speedrun's -os 1 resumed bit for bit.
sparse_rows_test() {
  local speedrun="$common -recipe speedrun -e d12 -b 1 -t 256 -vt 512 -z 1024 -v 5 -l 0.01 -m 4"
  local modern="$common -recipe modern -e d12 -b 4 -t 256 -v 5 -z 2048 -m 4" run name binary args os dir
  for run in "speedrun:train_gpt2cu:$speedrun" "speedrun_fp32:train_gpt2fp32cu:$speedrun -f 0" \
      "modern:train_gpt2cu:$modern"; do
    IFS=: read -r name binary args <<< "$run"
    dir=$out/sparse_$name
    rm -rf "$dir"
    for os in "od0:-od 0" "os1:-od 1 -os 1" "os1oc2:-od 1 -os 1 -oc 2"; do
      # shellcheck disable=SC2086  # the flags' words
      check "sparse_${name}_${os%%:*}" $mpi ./$binary $args -x 10 -n 10 -o "$dir/${os%%:*}" ${os#*:}
    done
    for os in os1 os1oc2; do
      check "sparse_${name}_${os}_same" same_steps "$out/sparse_${name}_od0.log" "$out/sparse_${name}_$os.log" no-norm
      check "sparse_${name}_${os}_norms" norms_close "$out/sparse_${name}_od0.log" "$out/sparse_${name}_$os.log"
      check "sparse_${name}_${os}_same_checkpoint" same_checkpoint_but_norms "$dir/od0" "$dir/$os" 10 2
      check "sparse_${name}_${os}_ranks_identical" grep -a "^parameters identical on 2 processes" \
        "$out/sparse_${name}_$os.log"
    done
    rm -f "$dir"/*/*.bin
  done
  resume_equivalence check sparse_rows_speedrun_resume "$out/resume_sparse_rows_speedrun" 2 \
    $mpi ./train_gpt2cu $speedrun -od 1 -os 1
}

# Speed: tokens/s of GPT-2 124M on 1 and on 2 GPUs at the same micro batch.
speed_test() {
  check speed_one_gpu ./train_gpt2cu $common -b 32 -t 1024 -x 30 -v 0 -sh 1
  check speed_two_gpus $mpi ./train_gpt2cu $common -b 32 -t 1024 -x 30 -v 0 -sh 1
  local one two
  one=$(awk '/^average/ {print $(NF-1)}' "$out/speed_one_gpu.log")
  two=$(awk '/^average/ {print $(NF-1)}' "$out/speed_two_gpus.log")
  echo "GPT-2 124M, B=32 T=1024 per GPU: 1 GPU ${one:-?} tok/s, 2 GPUs ${two:-?} tok/s" \
    "(x$(awk -v a="${one:-0}" -v b="${two:-0}" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "?" }'))"
}

for group in "${selected[@]}"; do "$group"; done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
