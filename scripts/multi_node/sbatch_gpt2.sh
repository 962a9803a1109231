#!/usr/bin/env bash
# GPT-2 124M under Slurm without MPI: srun starts one process per GPU, each finds its rank in
# SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, and rank 0 hands out the NCCL id over TCP on the
# first node. The run token defaults to SLURM_JOB_ID.SLURM_STEP_ID.SLURM_RESTART_COUNT, so an id
# of an earlier job or a requeued attempt is never taken.
#
# usage: sbatch scripts/multi_node/sbatch_gpt2.sh   (from the repository root, on a shared filesystem)
#SBATCH --job-name=gpt2-124M
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --requeue
set -eu
# sbatch runs a copy of this script from its spool folder, where scripts/lib/help.sh is not.
case "${1:-}" in
  -h|--help) sed -n '2,${/^#\( \|$\)/!q;s/^# \{0,1\}//p}' "$0"; exit 0 ;;
  ?*) echo "error: unknown argument '$1': this script takes none (--help says more)" >&2; exit 1 ;;
esac
export NCCL_NVLS_ENABLE=0
# Rank 0 runs on the first node of the allocation; a port derived from the job id avoids two
# jobs sharing a node picking the same one. Alternatively: -rv fs:$PWD/rendezvous (shared dir).
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
port=$((20000 + SLURM_JOB_ID % 20000))
# -y 1 after a requeue continues from the newest checkpoint (the first attempt has none: start fresh).
resume=0
[ -n "$(ls log_gpt2_124M/DONE_* 2>/dev/null)" ] && resume=1
# -ct: a process that makes no progress for 10 minutes (a node died) ends, so the job fails
# instead of hanging until its time limit; Slurm's --requeue then restarts it.
srun --kill-on-bad-exit=1 ./train_gpt2cu -rv "tcp:$head_node:$port" -ct 600 \
  -e d12 -b 32 -t 1024 -z 524288 -l 6e-4 -u 700 -x 18865 -v 250 -s 20000 \
  -n 2000 -nk 3 -o log_gpt2_124M -y $resume -zs 1
