#!/usr/bin/env bash
# Tests and measurements on N GPUs of one machine (OpenMPI's mpirun), N = 2, 4 or 8:
#  - rank equivalence: N ranks x micro batch B against 1 rank x B with N accumulation steps, on
#    unshuffled data so both see the same tokens: FP32 losses within 1e-5 over 10 steps, BF16
#    within 2e-2;
#  - ZeRO-1 on and off at N ranks, without clipping: at 2 ranks identical losses and parameter
#    checksums; above 2, NCCL's reduce-scatter may add the N gradients in another order than its
#    all-reduce, so the losses agree within the rank-equivalence tolerances instead;
#  - scaling: dev/bench.py for GPT-2 124M (B=64) and 1.5B (B=8) on 1 and on N GPUs.
# Ends with "N passed, N failed".
#
# usage: scripts/scaling_tests.sh N [OUTDIR]   (N = 2, 4 or 8; OUTDIR default build/test_scaling_N)
set -u
cd "$(dirname "$0")/.."
source scripts/lib/help.sh "$@"
n=${1:-}
case "$n" in
  2|4|8) ;;
  *) echo "error: usage: scripts/scaling_tests.sh N [OUTDIR] with N = 2, 4 or 8 GPUs" >&2; exit 1 ;;
esac
out=${2:-build/test_scaling_$n}
mkdir -p "$out"
ranks=$n
source dev/test/multi_gpu_lib.sh

# Validation: one rank reads 8 batches, N ranks 8/N each: the same 8 chunks of data.
for build in "train_gpt2fp32cu:1e-5:-f 0" "train_gpt2cu:2e-2:"; do
  IFS=: read -r binary tol extra <<< "$build"
  check "${binary}_one_rank" ./$binary $common -b 4 -z $((4 * 256 * n)) -x 10 -v 5 -m 8 $extra
  check "${binary}_${n}_ranks" $mpi ./$binary $common -b 4 -x 10 -v 5 -m $((8 / n)) $extra
  check "${binary}_${n}_ranks_equivalent" losses_close "$out/${binary}_one_rank.log" "$out/${binary}_${n}_ranks.log" "$tol"
  check "${binary}_${n}_ranks_zero1" $mpi ./$binary $common -b 4 -x 10 -v 5 -m $((8 / n)) -gc 0 -zs 1 $extra
  check "${binary}_${n}_ranks_zero0" $mpi ./$binary $common -b 4 -x 10 -v 5 -m $((8 / n)) -gc 0 -zs 0 $extra
  zero_tol=$tol
  [ "$n" = 2 ] && zero_tol=0
  check "${binary}_${n}_ranks_zero_same" losses_close "$out/${binary}_${n}_ranks_zero1.log" "$out/${binary}_${n}_ranks_zero0.log" "$zero_tol"
done

check "bench_$n" "${PYTHON:-python3}" dev/bench.py "$out/bench" --configs d12:64,d48:8 --gpus "$n" --steps 12 --peer 0
tail -4 "$out/bench_$n.log"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
