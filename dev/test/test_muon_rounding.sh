#!/usr/bin/env bash
# Tests dev/muon_rounding.py on record #89's tiny model (train_gpt2.py, CPU): a row a Muon matrix with
# a gradient and its distances; noise of 2^-200 leaves the gradient and so the update as it was (0),
# noise of 2^-4 moves every update, the FP64 iteration too; the up projections behind zero-initialised
# down projections named as without gradient; a batch read from a token shard; and its one-line errors
# (bad --noise_bits, a missing file, a file that is no token shard, a shard shorter than the batch).
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh
require_python "torch numpy" test_muon_rounding PYTHON
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
TOKENIZER=$WORK/vocab.bin
require_vocab "$TOKENIZER" test_muon_rounding
run() { "$PY" dev/muon_rounding.py --tokenizer "$TOKENIZER" --model tiny --batch 2 --seq_len 64 "$@"; }

out=$(run --noise_bits 200,4 2>&1)
rc=$?
rows=$(grep '^| transformer' <<< "$out")
check "exits 0 with a row for each of the 31 matrices with a gradient" "$rc:$(wc -l <<< "$rows")" "0:31"
check "noise 2^-200: every update as it was" "$(cut -d'|' -f4 <<< "$rows" | sort -u)" " 0.0000 "
check "noise 2^-4 and the FP64 iteration: every update moved" \
  "$(awk -F'|' '$5 + 0 <= 0.01 || $6 + 0 <= 0.001 || $6 + 0 >= 1' <<< "$rows" | wc -l)" 0
check "the 11 up projections without gradient" "$(grep -c '^no gradient: 11 matrices' <<< "$out")" 1
check "each kind's ranges" "$(grep -c '^\(attn.c_attn\|attn.c_proj\|mlp.c_proj\).weight ([0-9]*): ' <<< "$out")" 3

"$PY" - "$WORK" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, ".")
import train_gpt2 as tg
for name, count in (("shard.bin", 200), ("short.bin", 100)):
    header = np.zeros(tg.HEADER_INTS, np.int32)
    header[:3] = tg.SHARD_MAGIC, tg.SHARD_VERSION, count
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(header.tobytes())
        f.write(np.arange(count, dtype=np.uint16).tobytes())
with open(f"{sys.argv[1]}/text.bin", "wb") as f:
    f.write(b"not a shard" * 100)
PYEOF
out=$(run --tokens "$WORK/shard.bin" 2>&1)
check "a batch from a token shard" "$?:$(grep -c '^| transformer' <<< "$out")" "0:31"
drawn=$(run 2>&1 | grep -m1 '^loss')
check "the shard's batch, not the drawn one" "$([ "$(grep -m1 '^loss' <<< "$out")" != "$drawn" ] && echo other)" other

expect_fail "--noise_bits not numbers" "--noise_bits 8,x: give whole numbers b" run --noise_bits 8,x
expect_fail "--noise_bits 0" "--noise_bits 0: each b at least 1" run --noise_bits 0
expect_fail "a missing shard" "--tokens $WORK/none.bin: no such file" run --tokens "$WORK/none.bin"
expect_fail "a file that is no token shard" "$WORK/text.bin: not a token shard" run --tokens "$WORK/text.bin"
expect_fail "a shard shorter than the batch" "--tokens $WORK/short.bin: 100 tokens, fewer than --batch x --seq_len + 1 = 129" \
  run --tokens "$WORK/short.bin"
finish test_muon_rounding
