#!/usr/bin/env bash
# Tests on a machine with 2 or more GPUs (OpenMPI's mpirun):
#  - rank equivalence: 2 ranks x micro batch B against 1 rank x B with 2 accumulation steps, on
#    unshuffled data so both see the same tokens: FP32 losses within 1e-5 over 10 steps, BF16
#    within 2e-2 (each rank rounds its own gradient to BF16 before they are averaged);
#  - resume: 10 steps, a resume and 10 more against 20 straight steps on 2 ranks, bit for bit;
#  - speed: tokens/s of GPT-2 124M on 1 and on 2 GPUs at the same micro batch.
# Ends with "N passed, N failed". Usage: scripts/multi_gpu_tests.sh [OUTDIR]
set -u
cd "$(dirname "$0")/.."
out=${1:-build/test_multi_gpu}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off
mpi="mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_NVLS_ENABLE"
[ "$(id -u)" -ne 0 ] && mpi="mpirun --oversubscribe -np 2 -x NCCL_NVLS_ENABLE"
data=dev/data/tinyshakespeare
common="-i $data/tiny_shakespeare_train_*.bin -j $data/tiny_shakespeare_val_*.bin -e d12 -t 256 -s 0 -sh 0 -l 1e-4"
passed=0
failed=0

check() {  # name, command...
  local name=$1
  shift
  if "$@" > "$out/$name.log" 2>&1; then
    echo "PASS $name"; passed=$((passed + 1))
  else
    echo "FAIL $name (log: $out/$name.log)"; tail -5 "$out/$name.log"; failed=$((failed + 1))
  fi
}

# Step and validation losses of two logs, within an absolute tolerance.
losses_close() {
  paste <(grep -aoE "(val )?loss [0-9.]+" "$1") <(grep -aoE "(val )?loss [0-9.]+" "$2") | awk -v tol="$3" '
    { d = $NF - $(NF/2); if (d < 0) d = -d; if (d > worst) worst = d; n++ }
    END { printf "%d losses, largest difference %.3g (tolerance %g)\n", n, worst, tol; exit !(n >= 10 && worst <= tol) }'
}

for build in "train_gpt2fp32cu:1e-5:-f 0" "train_gpt2cu:2e-2:"; do
  IFS=: read -r binary tol extra <<< "$build"
  # Validation: one rank reads 8 batches, two ranks 4 each: the same 8 chunks of data.
  check "${binary}_one_rank" ./$binary $common -b 4 -z 2048 -x 10 -v 5 -m 8 $extra
  check "${binary}_two_ranks" $mpi ./$binary $common -b 4 -x 10 -v 5 -m 4 $extra
  check "${binary}_equivalent" losses_close "$out/${binary}_one_rank.log" "$out/${binary}_two_ranks.log" "$tol"
done

# --- Resume on two GPUs: 20 straight steps against 10, a resume (-y 1) and 10 more give the same
# run log and bitwise-identical model and per-rank state files, in FP32 and BF16, with shuffled data
# (each rank's loader position and the shared shuffle state come back from its state file).
multi_gpu_resume_tests() {
  source dev/test/compare_runs.sh
  local binary
  for binary in train_gpt2fp32cu train_gpt2cu; do
    resume_equivalence check "${binary}_resume_two_ranks" "$out/resume_$binary" 2 \
      $mpi ./$binary $common -b 4 -v 10 -m 4 -sh 1
  done
}
multi_gpu_resume_tests

check speed_one_gpu ./train_gpt2cu $common -b 32 -t 1024 -x 30 -v 0 -sh 1
check speed_two_gpus $mpi ./train_gpt2cu $common -b 32 -t 1024 -x 30 -v 0 -sh 1
one=$(awk '/^average/ {print $(NF-1)}' "$out/speed_one_gpu.log")
two=$(awk '/^average/ {print $(NF-1)}' "$out/speed_two_gpus.log")
echo "GPT-2 124M, B=32 T=1024 per GPU: 1 GPU ${one:-?} tok/s, 2 GPUs ${two:-?} tok/s" \
  "(x$(awk -v a="${one:-0}" -v b="${two:-0}" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "?" }'))"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
