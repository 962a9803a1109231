# Shared by scripts/multi_gpu_tests.sh and scripts/scaling_tests.sh (source it after setting
# `out`, the folder for the logs, and `ranks`, the number of processes): the mpirun command line
# in `mpi`, the training data and flags in `common`, and
#   check NAME COMMAND...           runs COMMAND into $out/NAME.log and counts PASS or FAIL (with
#                                   its seconds);
#   losses_close LOG1 LOG2 TOL      the step and validation losses of two logs agree within TOL
#                                   (with TOL 0: equal as printed, and the same parameter checksum).
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off
mpi="mpirun --oversubscribe -np $ranks -x NCCL_NVLS_ENABLE"
[ "$(id -u)" -eq 0 ] && mpi="mpirun --allow-run-as-root --oversubscribe -np $ranks -x NCCL_NVLS_ENABLE"
data=dev/data/tinyshakespeare
common="-i $data/tiny_shakespeare_train_*.bin -j $data/tiny_shakespeare_val_*.bin -e d12 -t 256 -s 0 -sh 0 -l 1e-4"
passed=0
failed=0

check() {
  local name=$1 start=$SECONDS
  shift
  if "$@" > "$out/$name.log" 2>&1; then
    echo "PASS $name ($((SECONDS - start)) s)"; passed=$((passed + 1))
  else
    echo "FAIL $name ($((SECONDS - start)) s; log: $out/$name.log)"; tail -5 "$out/$name.log"; failed=$((failed + 1))
  fi
}

losses_close() {
  paste <(grep -aoE "(val )?loss [0-9.]+" "$1") <(grep -aoE "(val )?loss [0-9.]+" "$2") | awk -v tol="$3" '
    { d = $NF - $(NF/2); if (d < 0) d = -d; if (d > worst) worst = d; count++ }
    END { printf "%d losses, largest difference %.3g (tolerance %g)\n", count, worst, tol; exit !(count >= 10 && worst <= tol) }' || return 1
  if [ "$3" = 0 ]; then
    [ "$(grep -a "parameter checksum" "$1")" = "$(grep -a "parameter checksum" "$2")" ] && grep -a "parameter checksum" "$1"
  fi
}
