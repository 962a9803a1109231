#!/usr/bin/env bash
# Tests train_gpt2.py's --documents, --window_blocks and --window_tokens on the CPU: a document's
# logits do not depend on the tokens of the documents before it, and with a window a block's
# logits do not depend on the key blocks outside it, nor with a window in tokens a query's on the
# tokens out of its reach (each also the other way round, so the test can fail),
# in both architectures and both attention paths (the explicit softmax and
# F.scaled_dot_product_attention), and on a CUDA GPU FlexAttention's BlockMask against the dense
# mask; a short training on document shards with the window's schedule
# runs and repeats bit for bit; a debug state with documents holds them (its header, its rows);
# and the flags' errors. PYTHON as in train_gpt2_py_lib.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/test/train_gpt2_py_lib.sh

check "documents and windows cut what a token sees" <<'EOF'
import torch, train_gpt2 as tg

def logits(model, idx):
    with torch.no_grad():
        return model(idx)[0]

def largest_change(model, idx, changed, rows):
    """The largest change of the logits at `rows` when the tokens at `changed` are redrawn."""
    other = idx.clone()
    generator = torch.Generator().manual_seed(3)
    other[0, changed] = torch.randint(0, tg.DOCUMENT_START, (len(changed),), generator=generator)
    return (logits(model, idx)[0, rows] - logits(model, other)[0, rows]).abs().max().item()

T = 256
for arch in ("gpt2", "modern"):
    for flash in ([False, True] if hasattr(torch.nn.functional, "scaled_dot_product_attention") else [False]):
        config = tg.GPTConfig(2, 4, 64, T, 50304, arch=arch)
        torch.manual_seed(1)
        model = tg.GPT(config, flash=flash)
        for p in model.parameters():  # every tensor non-zero (the modern init zeroes some)
            torch.nn.init.normal_(p, 0.0, 0.05)
        generator = torch.Generator().manual_seed(2)
        idx = torch.randint(0, tg.DOCUMENT_START, (1, T), generator=generator)
        idx[0, 0] = idx[0, 100] = tg.DOCUMENT_START  # documents [0, 100) and [100, 256)
        name = f"{arch}, flash {int(flash)}"
        model.documents = False
        assert largest_change(model, idx, range(1, 100), range(100, T)) > 1e-4, f"{name}: causal sees back"
        model.documents = True
        change = largest_change(model, idx, range(1, 100), range(100, T))
        assert change == 0.0, f"{name}: document 2's logits moved by {change} with document 1's tokens"
        # One document over both blocks: a window of 1 block keeps block 1 from block 0's keys.
        idx[0, 100] = 7
        model.window_blocks = 1
        change = largest_change(model, idx, range(1, 128), range(128, T))
        assert change == 0.0, f"{name}: window 1: block 1 moved by {change} with block 0's tokens"
        model.window_blocks = 2
        assert largest_change(model, idx, range(1, 128), range(128, T)) > 1e-4, f"{name}: window 2 sees back"
        model.window_blocks = None
        print(f"{name}: document 2 apart from document 1; window 1 apart from the block before")

# Windows in tokens (--window_tokens): a window of 1 block is 128 tokens back from each query, so
# in one layer query 400 sees token 272 (a block further back than the block window's) and nothing
# before it; the mask is its definition and holds the block mask of as many blocks (a block's
# first query sees a whole block further back).
T = 512
for flash in ([False, True] if hasattr(torch.nn.functional, "scaled_dot_product_attention") else [False]):
    config = tg.GPTConfig(1, 4, 64, T, 50304, arch="modern")
    torch.manual_seed(1)
    model = tg.GPT(config, flash=flash)
    for p in model.parameters():
        torch.nn.init.normal_(p, 0.0, 0.05)
    generator = torch.Generator().manual_seed(2)
    idx = torch.randint(0, tg.DOCUMENT_START, (1, T), generator=generator)
    idx[0, 0] = tg.DOCUMENT_START
    model.documents, model.window_blocks, model.window_tokens = True, 1, True
    change = largest_change(model, idx, range(1, 272), range(400, T))
    assert change == 0.0, f"flash {int(flash)}: window of 128 tokens: queries 400.. moved by {change} with tokens ..271"
    assert largest_change(model, idx, range(272, 280), range(400, 408)) > 1e-4, f"flash {int(flash)}: 272.. unseen"
    print(f"flash {int(flash)}: a window of 128 tokens: query 400 sees token 272, no further back")
tokens = torch.randint(0, tg.DOCUMENT_START, (T,), generator=generator)
tokens[0] = tokens[40] = tokens[41] = tg.DOCUMENT_START  # documents shorter than the windows, and longer
for blocks in (0, 1, 3):
    by_blocks = tg.document_attention_mask(tokens, blocks)
    by_tokens = tg.document_attention_mask(tokens, blocks, blocks * tg.ATTENTION_BLOCK)
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    docs = (tokens == tg.DOCUMENT_START).cumsum(0)
    definition = (j <= i) & (i - j <= blocks * tg.ATTENTION_BLOCK) & (docs[i] == docs[j])
    assert torch.equal(by_tokens, definition), f"{blocks} blocks in tokens: not the definition's mask"
    # (A block window of 0 still sees the query's own block, a token window of 0 the query alone.)
    assert blocks == 0 or not (by_blocks & ~by_tokens).any() and (by_tokens & ~by_blocks).any(), f"{blocks} blocks"
    print(f"window of {blocks} blocks in tokens: the definition's {int(by_tokens.sum())} keys (block mask: "
          f"{int(by_blocks.sum())})")

# On a CUDA GPU with FlexAttention the masks are the reference's BlockMasks: the same logits as the
# dense masks, over two rows of different documents.
if torch.cuda.is_available() and tg.flex_attention_available():
    T = 512
    config = tg.GPTConfig(2, 4, 64, T, 50304, arch="modern")
    flex, dense = tg.GPT(config, flash=True).cuda(), tg.GPT(config, flash=False).cuda()
    for p in flex.parameters():
        torch.nn.init.normal_(p, 0.0, 0.05)
    dense.load_state_dict(flex.state_dict())
    idx = torch.randint(0, tg.DOCUMENT_START, (2, T), device="cuda")
    idx[:, 0] = idx[0, 200] = idx[1, 333] = idx[1, 334] = tg.DOCUMENT_START
    for window, tokens in [(None, False), (0, False), (1, False), (3, False), (0, True), (1, True), (3, True)]:
        for model in (flex, dense):
            model.documents, model.window_blocks, model.window_tokens = True, window, tokens
        assert not torch.is_tensor(flex.attention_masks(idx)[0]), "no BlockMask on the GPU"
        difference = (logits(flex, idx) - logits(dense, idx)).abs().max().item()
        unit = " in tokens" if tokens else ""
        assert difference < 1e-4, f"window {window}{unit}: FlexAttention's logits {difference} from the dense mask's"
        print(f"FlexAttention's BlockMask, window {window}{unit}: the dense mask's logits within {difference:.1e}")

# The mask of a layer follows the reference's long/short pattern at 12 layers.
model = tg.GPT(tg.GPTConfig(12, 2, 32, T, 50304))
model.documents, model.window_blocks = True, 6
windows = [model.layer_window(layer) for layer in range(12)]
assert windows == [6 if c == "L" else 3 for c in tg.SPEEDRUN_WINDOWS], windows
model.window_blocks = None
assert model.layer_window(0) is None
print("12 layers:", windows)
EOF

echo "--- training on document shards with the window's schedule, twice"
"$PYTHON" - "$WORK/data" <<'EOF'
import os, sys, numpy as np
sys.path.insert(0, "dev/test")
import documents_reference as ref
rng = np.random.default_rng(5)
os.makedirs(sys.argv[1])
for name, count in (("train", 2), ("val", 1)):
    for i in range(count):
        tokens = ref.documents(rng, rng.integers(1, 700, 120))
        ref.write_shard(os.path.join(sys.argv[1], f"{name}_{i:06d}.bin"), tokens)
EOF
run_documents() {  # 2 micro steps of one 256-token sequence, the window 1 block, then 2
  "$PYTHON" train_gpt2.py --model tiny --channels 64 --num_heads 2 --max_seq_len 256 -b 1 -t 256 \
    --total_batch_size 512 --num_iterations 3 --input_bin "$WORK/data/train_*.bin" \
    --input_val_bin "$WORK/data/val_*.bin" --val_every 3 --val_steps 1 --documents 1 --window_blocks -1 \
    --device cpu "$@"
}
run_documents > "$WORK/first.log"
run_documents > "$WORK/second.log"
grep -E "^step +3/3 \| loss" "$WORK/first.log"
grep -E "^step +3/3 .*val loss" "$WORK/first.log"
losses() { grep -E "\| (val )?loss" "$1" | sed -e 's/ | [0-9.]* ms .*//' -e 's/ | train time [0-9.]* s//'; }
diff <(losses "$WORK/first.log") <(losses "$WORK/second.log")
echo "the same losses twice"

echo "--- a debug state with documents and a window"
"$PYTHON" train_gpt2.py --model tiny --max_seq_len 256 --documents 1 --window_blocks 2 -b 2 -t 256 \
  --write_debug_state "$WORK/debug" --debug_steps 1 --seed 42 > /dev/null
"$PYTHON" train_gpt2.py --model tiny --max_seq_len 256 -b 2 -t 256 \
  --write_debug_state "$WORK/causal" --debug_steps 1 --seed 42 > /dev/null
check "its header names the mask; its rows are document-aligned, with documents on a block's edge and of one token" <<'EOF'
import os, numpy as np, train_gpt2 as tg
def read(directory):
    path = os.path.join(os.environ["WORK"], directory, "gpt2_l2h4c128t256v50257_debug_state.bin")
    header, x, _, _ = tg.read_debug_state(path)
    return header, x.numpy()
header, x = read("debug")
assert header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and list(header[21:23]) == [1, 2], header[:23]
for row in x:
    starts = np.flatnonzero(row == tg.DOCUMENT_START)
    assert starts[0] == 0 and len(starts) >= 4, starts
    assert any(s % tg.ATTENTION_BLOCK == 0 and s > 0 for s in starts), f"no start on a block's edge: {starts}"
    assert any(np.diff(starts) == 1), f"no document of one token: {starts}"
    print("document starts:", *starts)
causal_header, causal_x = read("causal")
assert causal_header[1] == tg.DEBUG_STATE_VERSION, causal_header[:2]
changed = x != causal_x
assert (x[changed] == tg.DOCUMENT_START).all(), "documents change tokens other than their starts"
print("without --documents: version 3 and the same tokens but the starts")
EOF

"$PYTHON" train_gpt2.py --model tiny --max_seq_len 384 --documents 1 --window_blocks 1 --window_tokens 1 -b 2 \
  -t 384 --write_debug_state "$WORK/tokens" --debug_steps 1 --seed 42 > /dev/null
"$PYTHON" train_gpt2.py --init_from "$WORK/tokens/gpt2_l2h4c128t384v50257.bin" --flash 0 --device cpu \
  --check_debug_state "$WORK/tokens/gpt2_l2h4c128t384v50257_debug_state.bin" > "$WORK/check_tokens.out"
check "--window_tokens 1: the debug state's settings hold -awt 1, which --check_debug_state applies" <<'EOF'
import os, train_gpt2 as tg
work = os.environ["WORK"]
path = f"{work}/tokens/gpt2_l2h4c128t384v50257_debug_state.bin"
header, x, _, _ = tg.read_debug_state(path)
text, prefix, _ = tg.read_debug_state_settings(path, header)
assert header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and text == "-awt 1", (header[1], text)
# Its rows have documents across a block's edge, where the window in tokens sees more than in blocks.
assert any(not tg.document_attention_mask(row, 1).equal(tg.document_attention_mask(row, 1, 128)) for row in x)
lines = open(f"{work}/check_tokens.out").read().splitlines()[1:]
errors = {line[:24].strip(): float(line.split()[-1]) for line in lines}
assert max(errors.values()) <= 1e-6, errors
print(f"version {header[1]}, settings '{text}'; checked in tokens: largest error {max(errors.values()):.1e}")
EOF

echo "--- errors"
expect_error "add --documents 1" --model tiny --write_debug_state "$WORK/e" -t 128 --window_blocks 2
expect_error "drop --window_tokens" --model tiny --write_debug_state "$WORK/e" -t 128 --documents 1 --window_tokens 1
expect_error "not a multiple of 128" --model tiny --write_debug_state "$WORK/e" -t 64 --documents 1 --window_blocks 2
expect_error "give a window of 1 or more" --model tiny --write_debug_state "$WORK/e" -t 128 --documents 1 --window_blocks -2
expect_error "drop --documents" --model tiny --benchmark 1 --documents 1
expect_error "outside the vocabulary of 512; drop --vocab_size" --model tiny --vocab_size 512 \
  --write_debug_state "$WORK/e" -t 64 --documents 1
echo "test_document_attention_py: passed"
