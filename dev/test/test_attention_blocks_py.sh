#!/usr/bin/env bash
# Compares llmc/attention_blocks.h (through build/test_attention_blocks --dump) with train_gpt2.py's
# port of modded-nanogpt's create_blockmasks and build_bm (attention_block_lists): for random
# documents (one token long, in runs, on and off block edges, one over the whole sequence, every
# token a document) in sequences of 128 to 49152 tokens, every query block's full and partial
# counts and lists for windows of 0 to 16 blocks. On the shorter sequences also
# document_attention_mask against the blocks the C++ rule selects (and full blocks needing no
# mask), and the window schedule (--windows) and the per-layer pattern against train_gpt2.py's.
# Scratch files go to build/scratch/test_attention_blocks_py.
#
#   bash dev/test/test_attention_blocks_py.sh     (PYTHON=... to pick the python with torch)
set -uo pipefail
cd "$(dirname "$0")/../.."

# MAKEFLAGS cleared: under `make test` the caller's jobserver is not open to this make.
MAKEFLAGS= ${MAKE:-make} -s build/test_attention_blocks || exit 1
source dev/test/lib.sh
require_python torch test_attention_blocks_py PYTHON
SCRATCH=build/scratch/test_attention_blocks_py
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"

out=$(PYTHONPATH=. "$PY" - "$SCRATCH" <<'EOF' 2>&1
import re, subprocess, sys
import numpy as np, torch
import train_gpt2 as tg

scratch = sys.argv[1]
WINDOWS = 16
rng = np.random.default_rng(43)


def sequence(T, starts):
    tokens = rng.integers(0, 50256, T)
    tokens[np.asarray(starts, dtype=np.int64)] = 50256
    return tokens


cases = []
for T in (128, 256, 1024, 4096, 49152):
    blocks = T // 128
    cases += [(f"T={T}: no document start", sequence(T, [])),
              (f"T={T}: every token a document start", np.full(T, 50256)),
              (f"T={T}: one document from token 0", sequence(T, [0])),
              (f"T={T}: documents on block edges", sequence(T, rng.choice(blocks, (blocks + 2) // 3) * 128))]
    for i in range(3):
        count = int(rng.integers(1, max(2, T // 48)))
        starts = list(rng.choice(T, count, replace=False))
        # runs of one-token documents, and documents starting just before, on and after edges
        for p in rng.choice(T - 8, 3):
            starts += range(p, p + int(rng.integers(2, 8)))
        for edge in rng.choice(blocks, 2) * 128:
            starts += [p for p in (edge - 1, edge, edge + 1) if 0 <= p < T and rng.random() < 0.7]
        cases.append((f"T={T}: random documents #{i}", sequence(T, starts)))

with open(f"{scratch}/cases.bin", "wb") as f:
    for _, tokens in cases:
        f.write(np.array([len(tokens), WINDOWS], np.int32).tobytes())
        f.write(tokens.astype(np.int32).tobytes())
subprocess.run(["build/test_attention_blocks", "--dump", f"{scratch}/cases.bin", f"{scratch}/blocks.bin"],
               check=True, stdout=subprocess.DEVNULL)
dump = np.fromfile(f"{scratch}/blocks.bin", np.int32).tolist()
at = 0
for name, tokens in cases:
    T = len(tokens)
    blocks = T // 128
    tokens_t = torch.from_numpy(tokens)
    difference = None
    for w in range(WINDOWS + 1):
        partial_num, partial_idx, full_num, full_idx = tg.attention_block_lists(tokens_t, w)
        selected = torch.zeros(blocks, blocks, dtype=torch.bool)
        full_blocks = torch.zeros(blocks, blocks, dtype=torch.bool)
        for q in range(blocks):
            full, partial = dump[at], dump[at + 1]
            listed = dump[at + 2:at + 2 + full + partial]
            at += 2 + full + partial
            got = ([-k - 1 for k in listed if k < 0], [k for k in listed if k >= 0])
            expected = (full_idx[q, :full_num[q]].tolist(), partial_idx[q, :partial_num[q]].tolist())
            if difference is None and (got != expected or (full, partial) != (full_num[q], partial_num[q])):
                difference = f"window {w}, block {q}: C++ full {got[0]} partial {got[1]}, port {expected}"
            for k in listed:
                selected[q, abs(k) - 1 if k < 0 else k] = True
                if k < 0:
                    full_blocks[q, -k - 1] = True
        if T <= 1024 and difference is None:
            expand = lambda m: m.repeat_interleave(128, 0).repeat_interleave(128, 1)
            docs = (tokens_t == 50256).cumsum(0)
            position = torch.arange(T)
            causal = (position[:, None] >= position) & (docs[:, None] == docs)
            if not torch.equal(tg.document_attention_mask(tokens_t, w), causal & expand(selected)):
                difference = f"window {w}: document_attention_mask differs from the C++ blocks"
            elif not causal[expand(full_blocks)].all():
                difference = f"window {w}: a full block holds a pair that is not document-causal"
            elif w > blocks and not torch.equal(tg.document_attention_mask(tokens_t, w), causal):
                difference = f"window {w} > {blocks} blocks: the mask is not all of document-causal"
    what = f"{name} ({int((tokens == 50256).sum())} starts): C++ and train_gpt2.py, windows 0..{WINDOWS}"
    print(f"{what}{' and the mask' if T <= 1024 else ''}\t{difference or 'same'}")
print(f"the dump was read to its end\t{'same' if at == len(dump) else f'{len(dump) - at} ints left'}")

for n in (1, 7, 100, 1750, 3250):
    cpp = subprocess.run(["build/test_attention_blocks", "--windows", str(n)], check=True,
                         capture_output=True, text=True).stdout.split()
    port = [str(tg.attention_window_blocks(s, n)) for s in range(n + 1)]
    print(f"the window schedule over {n} steps (C++ and train_gpt2.py)\t"
          f"{'same' if cpp == port else f'C++ {cpp[:20]}, port {port[:20]}'}")
pattern = re.search(r'kSpeedrunWindows\[\] = +"(\w+)"', open("llmc/gpt2.h").read()).group(1)
print(f"the per-layer pattern {tg.SPEEDRUN_WINDOWS} (llmc/gpt2.h and train_gpt2.py)\t"
      f"{'same' if pattern == tg.SPEEDRUN_WINDOWS else pattern}")
EOF
)
check_verdicts "the comparison" $? "$out"
finish test_attention_blocks_py
