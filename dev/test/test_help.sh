#!/usr/bin/env bash
# Tests that every script, data tool and trainer answers --help and -h with its usage and does
# nothing else: exit status 0, a "usage: ... NAME" line on stdout, no program called that installs,
# downloads, builds or launches (apt-get, sudo, pip, curl, wget, make, mpirun, srun, nvidia-smi
# and the like are replaced on the PATH by stand-ins that fail loudly and log the call), and no
# file in the tree created or changed. The scripts, tools and Python programs are found by their
# folders, so a new one is tested too.
#
# Then that every Python tool, under a python that cannot import numpy, torch or matplotlib
# (python -S: no site-packages), either still prints its help or stops with one line on stderr,
# "error: ... needs MODULE ...", naming the fix, and no traceback.
#
#   bash dev/test/test_help.sh      (PYTHON=... to pick the python with torch)
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh
require_python torch test_help PYTHON

tools=()
for source in dev/data/*.cpp dev/tools/*.cpp; do
  tools+=("build/$(basename "$source" .cpp)")
done
# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s train_gpt2 "${tools[@]}" || exit 1

SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
mkdir "$SCRATCH/bin"
for name in apt-get apt dpkg sudo pip pip3 curl wget git make cmake nvcc mpirun srun sbatch \
    scontrol ncu nsys nvidia-smi; do
  printf '#!/bin/sh\necho "%s $*" >> "%s/calls"\necho "error: --help called %s" >&2\nexit 1\n' \
    "$name" "$SCRATCH" "$name" > "$SCRATCH/bin/$name"
  chmod +x "$SCRATCH/bin/$name"
done
touch "$SCRATCH/calls"
# Python's bytecode cache (__pycache__) is Python's doing, not the tool's: left out of the count.
export PYTHONDONTWRITEBYTECODE=1

# Files created or changed in the tree since the marker (this test's own log left out).
changed_files() {
  find . \( -path ./.git -o -path ./build/test_logs \) -prune -o -newer "$SCRATCH/marker" -print |
    tr '\n' ' '
}

check_help() {  # check_help NAME COMMAND...: COMMAND --help and COMMAND -h (HELP_FLAGS: which)
  local name=$1 flag
  shift
  for flag in ${HELP_FLAGS:---help -h}; do
    touch "$SCRATCH/marker"
    : > "$SCRATCH/calls"
    PATH="$SCRATCH/bin:$PATH" "$@" "$flag" > "$SCRATCH/out" 2> "$SCRATCH/err"
    local status=$?
    local usage
    usage=$(grep -ciE "usage: .*$name" "$SCRATCH/out")
    check "$* $flag: exit 0, usage on stdout, nothing called or written" \
      "$status $([ "$usage" -gt 0 ] && echo usage) calls: $(cat "$SCRATCH/calls") files: $(changed_files)" \
      "0 usage calls:  files: "
  done
}

for script in scripts/*.sh scripts/multi_node/*.sh dev/data/*.sh; do
  check_help "$(basename "$script")" bash "$script"
done
for program in ./train_gpt2 "${tools[@]}"; do
  check_help "$(basename "$program")" "$program"
done
# The CUDA trainers where they are built (`make test` builds them; --help needs no GPU). Their -h
# is HellaSwag's flag, so --help alone.
for program in ./train_gpt2cu ./train_gpt2fp32cu; do
  if [ -x "$program" ]; then
    HELP_FLAGS=--help check_help "$(basename "$program")" "$program"
  else
    echo "skip $program: not built (make $(basename "$program"))"
  fi
done
python_tools=(train_gpt2.py dev/*.py dev/data/*.py dev/eval/*.py dev/cuda/*.py)
for tool in "${python_tools[@]}"; do
  check_help "$(basename "$tool")" "$PY" "$tool"
done

# --- without numpy, torch and matplotlib. A tool either needs none of them for its help or stops
# with the one line of pydeps.py; dev/test's helpers (no --help) stop before reading argv.
without_site_packages() {  # the output and status of a tool run by a python without site-packages
  local output
  output=$("$PY" -S "$@" 2>&1)
  echo "$? $output"
}
error_pattern="^1 error: [^ ]+ needs [a-z]+.*cannot import .*(install_deps.sh|pip install)"
for tool in "${python_tools[@]}" dev/test/*.py; do
  result=$(without_site_packages "$tool" --help)
  verdict=ok
  if [[ "$result" != "0 "*"usage: "* ]]; then
    [ "$(wc -l <<< "$result")" -eq 1 ] && [[ "$result" =~ $error_pattern ]] || verdict=$result
  fi
  check "$tool --help without site-packages: its usage, or one error line naming the fix" \
    "$verdict" ok
done
for spec in "train_gpt2.py numpy and torch" "dev/bench.py numpy" "dev/bench_checkpoint.py numpy" \
    "dev/eval/export_hf.py numpy and torch" "dev/profile_peer.py torch"; do
  tool=${spec%% *}
  check "$tool without site-packages: says it needs ${spec#* }" \
    "$(without_site_packages "$tool" --help | grep -c "^1 error: $tool needs ${spec#* }, ")" 1
done
check "dev/plot_log.py without site-packages: says it needs matplotlib" \
  "$(without_site_packages dev/plot_log.py "$SCRATCH/none" -o "$SCRATCH/plot.png" |
     grep -c '^1 error: dev/plot_log.py needs matplotlib, ')" 1

finish test_help
