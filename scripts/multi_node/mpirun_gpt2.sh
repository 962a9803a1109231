#!/usr/bin/env bash
# GPT-2 124M on every GPU of the nodes in a hostfile, launched by OpenMPI's mpirun.
# Usage: scripts/multi_node/mpirun_gpt2.sh HOSTFILE [more trainer flags]
# Run from the repository root of a checkout that every node sees at the same path.
set -eu
hostfile=${1:?usage: $0 HOSTFILE [trainer flags]}
shift
# One process per slot; -x passes the NCCL settings to the remote processes. NVLink multicast
# (NVLS) stays off; set NCCL_SOCKET_IFNAME / NCCL_IB_HCA here if NCCL picks the wrong network.
export NCCL_NVLS_ENABLE=0
processes=$(awk '!/^#/ && NF { split($2, s, "="); n += s[2] } END { print n }' "$hostfile")
mpirun -np "$processes" --hostfile "$hostfile" --map-by ppr:8:node -x NCCL_NVLS_ENABLE -x PATH \
  ./train_gpt2cu -e d12 -b 32 -t 1024 -z 524288 -l 6e-4 -u 700 -x 18865 -v 250 -s 20000 \
  -n 2000 -nk 3 -o log_gpt2_124M -zs 1 -ct 600 "$@"
