#!/usr/bin/env bash
# Tests, without a GPU and without running anything, that train_gpt2.py takes the command line of
# the PyTorch peer that dev/bench.py and dev/bench_quality.py build (dev/test/peer_commands.py):
# for each recipe and --fp8 mode bench.py takes, and the micro batch variants of both scripts,
# train_gpt2.py's own parser and flag checks must accept it. A failure names the script, its flags,
# the peer's command line and train_gpt2.py's error.
#
#   bash dev/test/test_peer_commands.sh     (PYTHON=... to pick the python with torch)
set -uo pipefail
cd "$(dirname "$0")/../.."

source "$(dirname "$0")/lib.sh"

require_python torch test_peer_commands PYTHON

out=$("$PY" dev/test/peer_commands.py 2>&1)
check_verdicts peer_commands.py $? "$out" "train_gpt2.py takes it"
grep -v $'\t' <<< "$out" | sed 's/^/note /'

# The runs whose peer must have been checked: bench.py refuses --fp8 with --recipe modern only.
lines=$(grep $'\t' <<< "$out")
for runs in "bench.py --recipe gpt2 --fp8 0" "bench.py --recipe gpt2 --fp8 1" \
  "bench.py --recipe gpt2 --fp8 2" "bench.py --recipe modern --fp8 0" "bench_quality.py"; do
  check "$runs: its peer's command lines were checked" \
    "$(grep -c "^$runs " <<< "$lines" | sed 's/^[1-9][0-9]*$/some/')" some
done

finish test_peer_commands
