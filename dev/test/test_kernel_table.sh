#!/usr/bin/env bash
# Tests dev/cuda/kernel_table.py on made-up ncu CSVs (the raw page with its units row, and ncu's
# own "==PROF==" lines): kernels grouped by family name across template arguments, times in the
# units row's unit, the one-file table (with the memory metrics' columns where the CSV has them)
# and the two-file comparison (largest difference first, kernels of one file only shown with 0),
# and its errors. Scratch files go to build/test_tmp/kernel_table.
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/kernel_table
rm -rf "$DIR"
mkdir -p "$DIR"
source "$(dirname "$0")/lib.sh"
PY=$(python_with csv)

cat > "$DIR/bf16.csv" <<'CSV'
==PROF== Connected to process 1
"ID","Kernel Name","gpu__time_duration.sum"
"","","usecond"
"0","void matmul_kernel<float, 4>(int, float*)","100"
"1","void matmul_kernel<float, 8>(int, float*)","50"
"2","layernorm_forward(float*)","20"
CSV
cat > "$DIR/fp8.csv" <<'CSV'
"ID","Kernel Name","gpu__time_duration.sum"
"","","msecond"
"0","void matmul_kernel<__nv_fp8_e4m3, 4>(int, float*)","0.06"
"1","void fp8_cast_kernel<(Fp8Format)0, true>(int)","0.03"
"2","layernorm_forward(float*)","0.02"
CSV
table() { "$PY" dev/cuda/kernel_table.py "$@" 2>&1 | tr -s ' '; }

out=$(table "$DIR/bf16.csv")
check "one file: a family's calls, total, mean and share" "$(echo "$out" | grep '^matmul_kernel ')" "matmul_kernel 2 0.150 75.0 88.2%"
check "... slowest first, then the total" "$(echo "$out" | awk '{print $1}' | tr '\n' ,)" "kernel,matmul_kernel,layernorm_forward,all,"
out=$(table "$DIR/bf16.csv" "$DIR/fp8.csv" --labels bf16,fp8)
echo "$out"
check "two files: the header with the labels" "$(echo "$out" | head -1)" "kernel bf16 calls bf16 ms fp8 calls fp8 ms diff ms"
check "... the largest difference first (ms units read from each file)" "$(echo "$out" | sed -n 2p)" \
  "matmul_kernel 2 0.150 1 0.060 -0.090"
check "... a kernel of one file only" "$(echo "$out" | grep '^fp8_cast_kernel ')" "fp8_cast_kernel 0 0.000 1 0.030 +0.030"
check "... the totals" "$(echo "$out" | tail -1)" "all kernels 3 0.170 3 0.110 -0.060"
check "three files are refused" "$(table a b c)" \
  "usage: python3 dev/cuda/kernel_table.py kernels.csv | a.csv b.csv [--labels A,B]"
check "--labels needs two names" "$(table "$DIR/bf16.csv" "$DIR/fp8.csv" --labels bf16)" \
  "--labels needs two names, e.g. --labels bf16,fp8"
cat > "$DIR/memory.csv" <<'CSV'
"ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum","lts__t_bytes.sum","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed"
"","","Mbyte","byte","ns","Gbyte","%"
"0","void gemm_kernel<1>(int)","100","50,000,000","300,000","0.9","80"
"1","void gemm_kernel<2>(int)","50","0","100,000","0.3","40"
"2","rmsnorm_kernel(float*)","300","150,000,000","100,000","0.5","0"
CSV
out=$(table "$DIR/memory.csv")
echo "$out"
check "memory metrics: a family's DRAM GB (read and written), TB/s, L2 GB, time-weighted tensor %" \
  "$(echo "$out" | grep '^gemm_kernel ')" "gemm_kernel 2 0.400 200.0 80.0% 0.20 0.50 1.20 70.0"
check "... a memory-bound one" "$(echo "$out" | grep '^rmsnorm_kernel ')" "rmsnorm_kernel 1 0.100 100.0 20.0% 0.45 4.50 0.50 0.0"
check "... the totals" "$(echo "$out" | tail -1)" "all kernels 3 0.500 0.65 1.30 1.70 56.0"
check "... the header" "$(echo "$out" | head -1)" "kernel calls total ms mean us share DRAM GB TB/s L2 GB tensor%"
check "--memory-metrics: what scripts/profile_kernels.sh --memory asks ncu for, the columns above" \
  "$(table --memory-metrics | tr ',' '\n' | sort | tr '\n' ' ')" \
  "$(head -1 "$DIR/memory.csv" | tr -d '"' | tr ',' '\n' | grep __ | sort | tr '\n' ' ')"
printf '"ID","Name"\n"0","x"\n' > "$DIR/wrong.csv"
check "a CSV without the columns" "$(table "$DIR/wrong.csv")" \
  "$DIR/wrong.csv: no 'Kernel Name' / 'gpu__time_duration.sum' columns: run ncu with --csv --page raw"
finish test_kernel_table
