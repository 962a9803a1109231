#!/usr/bin/env bash
# Installs what building and testing need on Debian/Ubuntu: a C++ compiler, clang with libFuzzer, OpenMPI, PyTorch (CPU,
# for the reference tensors), numpy, and node/npm (for the independent tokenizer reference).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is expected under /usr/local/cuda or on the PATH.
set -euo pipefail
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
packages="build-essential curl ca-certificates python3 python3-numpy python3-torch
  libopenblas0-pthread python3-matplotlib libopenmpi-dev openmpi-bin clang libclang-rt-14-dev"
# A node from another source (with its own npm) conflicts with Debian's npm package.
command -v npm >/dev/null || packages="$packages nodejs npm"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $packages >/dev/null
echo "dependencies installed"
