#!/usr/bin/env bash
# Installs what building and testing need on Debian/Ubuntu, from the distribution's packages: a
# C++ compiler, clang with the fuzzer runtime of that clang, OpenMPI, PyTorch (CPU, for the
# reference tensors), numpy, matplotlib, and node/npm (for the independent tokenizer reference).
#
# It does not install the CUDA toolkit, which the user brings: nvcc with cuBLAS, and NCCL (tested
# with CUDA 13.0 and the NCCL that comes with it), under /usr/local/cuda or on the PATH. The script
# checks for them at the end and fails, naming what is missing, unless --cpu-only is given (the
# CPU programs only: make cpu).
#
# usage: bash scripts/install_deps.sh [--cpu-only]   (-h, --help: this help)
set -euo pipefail
source "$(dirname "$0")/lib/help.sh" "$@"

cpu_only=0
case "${1:-}" in
  "") ;;
  --cpu-only) cpu_only=1 ;;
  *) echo "error: unknown argument '$1': the only flags are --cpu-only and --help" >&2; exit 1 ;;
esac

fail() {
  echo "error: $*" >&2
  exit 1
}

command -v apt-get >/dev/null ||
  fail "apt-get not found: this script is for Debian/Ubuntu; elsewhere install by hand what its header lists"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || fail "not root and no sudo: run this script as root"
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive

install() {  # install PACKAGE...: one apt-get install, failing with the packages' names
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
    fail "apt-get could not install $*: see 'apt-get install $*' for why"
}

$SUDO apt-get update -qq || fail "apt-get update failed: check the network and the apt sources"
packages=(build-essential curl ca-certificates python3 python3-numpy python3-torch
  libopenblas0-pthread python3-matplotlib libopenmpi-dev openmpi-bin clang)
# A node from another source (with its own npm) conflicts with Debian's npm package.
command -v npm >/dev/null || packages+=(nodejs npm)
install "${packages[@]}"

# libFuzzer's runtime is packaged per clang version (libclang-rt-N-dev from clang 14 on; before,
# it came with clang itself): the one of the clang just installed.
clang_major=$(clang++ --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n1)
[ -n "$clang_major" ] || fail "cannot read the version of clang++ ($(command -v clang++))"
runtime=libclang-rt-$clang_major-dev
if apt-cache show "$runtime" >/dev/null 2>&1; then
  install "$runtime"
  packages+=("$runtime")
fi
probe=$(mktemp -d)
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  > "$probe/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" 2>/dev/null; then
  rm -rf "$probe"
  fail "clang++ $clang_major cannot link -fsanitize=fuzzer: install its fuzzer runtime ($runtime)"
fi
rm -rf "$probe"
echo "installed: ${packages[*]}"

if [ $cpu_only -eq 1 ]; then
  echo "--cpu-only: the CUDA toolkit is not checked (make cpu builds the CPU programs)"
  exit 0
fi
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || fail "no CUDA toolkit: nvcc is neither on the PATH nor in /usr/local/cuda/bin;" \
  "install CUDA 13 (developer.nvidia.com/cuda-downloads), or run with --cpu-only for the CPU programs"
# nvcc may be a wrapper script outside the toolkit (/usr/local/bin/nvcc), so its own dry run,
# not its path, says which include folder it compiles against.
nvcc_dryrun=$("$nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1) ||
  fail "$nvcc --dryrun failed: reinstall the CUDA toolkit"
cuda_root=$(readlink -f "$(sed -n 's/^#\$ TOP=\(.*\)$/\1/p' <<<"$nvcc_dryrun")")
cuda_include=$(sed -n 's/^#\$ INCLUDES="-I\([^"]*\)".*/\1/p' <<<"$nvcc_dryrun")
[ -n "$cuda_include" ] || cuda_include=$cuda_root/include
[ -f "$cuda_include/cublasLt.h" ] || [ -f /usr/include/cublasLt.h ] ||
  fail "cublasLt.h is neither in $cuda_include nor in /usr/include: install the CUDA toolkit's cuBLAS"
[ -f "$cuda_include/nccl.h" ] || [ -f /usr/include/nccl.h ] ||
  fail "nccl.h is neither in $cuda_include nor in /usr/include: install NCCL (libnccl-dev from" \
    "NVIDIA's CUDA repository)"
echo "CUDA toolkit: $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p') at $cuda_root"
