#!/usr/bin/env bash
# GPT-2 124M on every GPU of the nodes in a hostfile, launched by OpenMPI's mpirun.
# Run from the repository root of a checkout that every node sees at the same path; the hostfile
# lists each node with its slots (scripts/multi_node/hostfile.example).
#
# usage: [GPUS_PER_NODE=N] scripts/multi_node/mpirun_gpt2.sh HOSTFILE [more trainer flags]
set -eu
source "$(dirname "$0")/../lib/help.sh" "$@"
[ $# -ge 1 ] && [[ "$1" != -* ]] ||
  { echo "error: usage: [GPUS_PER_NODE=N] $0 HOSTFILE [trainer flags] (--help says more)" >&2; exit 1; }
hostfile=$1
shift
[ -r "$hostfile" ] || { echo "error: HOSTFILE $hostfile: no such readable file" >&2; exit 1; }
# One process per GPU. Unless given, GPUS_PER_NODE is the number of GPUs nvidia-smi lists here
# (the nodes are assumed alike), or 8 where this node has none (e.g. a login node). The hostfile's
# slots per node should equal it: mpirun starts as many processes as there are slots in all.
if [ -z "${GPUS_PER_NODE:-}" ]; then
  GPUS_PER_NODE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  [ "$GPUS_PER_NODE" -gt 0 ] || GPUS_PER_NODE=8
fi
# -x passes the NCCL settings to the remote processes. NVLink multicast (NVLS) stays off; set
# NCCL_SOCKET_IFNAME / NCCL_IB_HCA here if NCCL picks the wrong network.
export NCCL_NVLS_ENABLE=0
processes=$(awk '!/^#/ && NF { split($2, s, "="); n += s[2] } END { print n }' "$hostfile")
mpirun -np "$processes" --hostfile "$hostfile" --map-by "ppr:$GPUS_PER_NODE:node" \
  -x NCCL_NVLS_ENABLE -x PATH \
  ./train_gpt2cu -e d12 -b 32 -t 1024 -z 524288 -l 6e-4 -u 700 -x 18865 -v 250 -s 20000 \
  -n 2000 -nk 3 -o log_gpt2_124M -zs 1 -ct 600 "$@"
