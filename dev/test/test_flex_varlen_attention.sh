#!/usr/bin/env bash
# Tests dev/pylib/flex_varlen_attention.py, the FlexAttention stand-in for FlashAttention-3's varlen call in
# record #89's offline copy: its block lists against the dense document-window mask (every pair a
# query sees in a listed block, every full block seen whole, each list in order; documents of one
# token, on block edges, the padded cu_seqlens; windows of 0, within a block, across blocks, none),
# the refusal of a length off the block; and, on a CUDA GPU with FlexAttention, its attention and
# gradients against attention under the dense mask, called as it is and inside a graph compiled
# with fullgraph=True, as the reference calls it. PYTHON as in train_gpt2_py_lib.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/test/train_gpt2_py_lib.sh

check "block lists against the dense mask" <<'EOF'
import sys, torch
sys.path.insert(0, "dev/pylib")
import flex_varlen_attention as fva

def dense_mask(starts, length, window):
    doc = torch.zeros(length, dtype=torch.long)
    for s in starts[1:]:
        doc[s:] += 1
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return (i >= j) & (i - j <= window) & (doc[:, None] == doc[None, :])

def padded(starts, length, slots):
    return torch.tensor(starts + [length] * (slots - len(starts)), dtype=torch.int32)

def check_lists(starts, length, window, block):
    mask = dense_mask(starts, length, window)
    cu = padded(starts, length, len(starts) + 3)
    partial, full, _ = fva.block_pairs(cu, length, window, block)
    (partial_num, partial_idx), (full_num, full_idx) = fva.block_lists(partial), fva.block_lists(full)
    n = length // block
    listed = torch.zeros(n, n, dtype=torch.bool)
    for qb in range(n):
        for count, idx, full in ((partial_num, partial_idx, False), (full_num, full_idx, True)):
            cols = idx[qb, :int(count[qb])].tolist()
            assert cols == sorted(cols), f"row {qb}'s list out of order: {cols}"
            for kb in cols:
                assert not listed[qb, kb], f"block ({qb}, {kb}) listed twice"
                listed[qb, kb] = True
                pairs = mask[qb * block:(qb + 1) * block, kb * block:(kb + 1) * block]
                if full:
                    assert bool(pairs.all()), f"full block ({qb}, {kb}) has pairs the mask hides"
    seen = mask.view(n, block, n, block).any(dim=3).any(dim=1)
    missed = seen & ~listed
    assert not bool(missed.any()), f"blocks with seen pairs left out: {missed.nonzero().tolist()}"
    return int(listed.sum()), int(full_num.sum())

block, length = 8, 64
cases = [
    ([0], None), ([0], 0), ([0], 5), ([0], 8), ([0], 20),
    ([0, 8, 16, 40], 11), ([0, 1, 2, 33], 7), ([0, 31, 32, 63], 16), ([0, 17], None),
]
fulls = 0
for starts, window in cases:
    w = length if window is None else window
    listed, full = check_lists(starts, length, w, block)
    fulls += full
    print(f"starts {starts}, window {window}: {listed} blocks listed, {full} full")
generator = torch.Generator().manual_seed(7)
for trial in range(40):
    count = int(torch.randint(1, 9, (1,), generator=generator))
    starts = sorted(set([0] + torch.randint(1, length, (count,), generator=generator).tolist()))
    window = int(torch.randint(0, 3 * block, (1,), generator=generator))
    check_lists(starts, length, window, block)
assert fulls > 0, "no case had a full block: the full lists went untested"
print("ok: 49 layouts")
try:
    fva.block_pairs(padded([0], 60, 2), 60, 4, block)
    raise AssertionError("60 positions in blocks of 8 were taken")
except ValueError as e:
    assert "not a multiple of 8" in str(e), str(e)
    print(f"ok: {e}")
EOF

check "attention and gradients against the dense mask (CUDA, FlexAttention)" <<'EOF'
import sys, torch
sys.path.insert(0, "dev/pylib")
import flex_varlen_attention as fva
try:
    from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    ready = torch.cuda.is_available()
except ImportError:
    ready = False
if not ready:
    print("skipped: no CUDA GPU with FlexAttention")
    sys.exit(0)

def reference(q, k, v, starts, window, scale):
    length = q.size(0)
    doc = torch.zeros(length, dtype=torch.long, device=q.device)
    for s in starts[1:]:
        doc[s:] += 1
    i = torch.arange(length, device=q.device)[:, None]
    j = torch.arange(length, device=q.device)[None, :]
    mask = (i >= j) & (i - j <= window) & (doc[:, None] == doc[None, :])
    scores = torch.einsum("ihd,jhd->hij", q.float(), k.float()) * scale
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return torch.einsum("hij,jhd->ihd", probs, v.float())

def worst_excess(outputs, expected, atol, rtol):
    """The largest |a - b| - rtol |b| over the tensors: within atol, every entry is close."""
    return max(((a.float() - b.float()).abs() - rtol * b.float().abs()).max().item() for a, b in zip(outputs, expected))

# The reference compiles its whole forward with fullgraph=True and calls the attention on tensors that
# the graph computed: the same here, with the inputs passed through a pointwise function first.
@torch.compile(fullgraph=True, dynamic=False)
def compiled_attention(q, k, v, cu, window):
    q, k, v = (2 * torch.tanh(t) for t in (q, k, v))
    return fva.flash_attn_varlen_func(q, k, v, cu, cu, q.size(0), q.size(0), causal=True, softmax_scale=0.12,
                                      window_size=(window, 0))

def eager_attention(q, k, v, cu, window):
    return fva.flash_attn_varlen_func(q, k, v, cu, cu, q.size(0), q.size(0), causal=True, softmax_scale=0.12,
                                      window_size=(window, 0))

torch.manual_seed(3)
length, heads, dim = 1024, 3, 128
starts = [0, 100, 128, 129, 700]
cu = torch.tensor(starts + [length] * 4, dtype=torch.int32, device="cuda")
for dtype, atol, rtol in ((torch.float32, 2e-4, 1e-4), (torch.bfloat16, 6e-2, 2 ** -6)):
    for mode, attention, windows in (("eager", eager_attention, (0, 100, 384, length)),
                                     ("compiled", compiled_attention, (100, length))):
        for window in windows:
            q, k, v = (torch.randn(length, heads, dim, device="cuda", dtype=dtype, requires_grad=True)
                       for _ in range(3))
            dy = torch.randn(length, heads, dim, device="cuda")
            y = attention(q, k, v, cu, window)
            grads = torch.autograd.grad((y.float() * dy).sum(), (q, k, v))
            inputs = (q, k, v) if mode == "eager" else tuple(2 * torch.tanh(t) for t in (q, k, v))
            y_ref = reference(*inputs, starts, window, 0.12)
            grads_ref = torch.autograd.grad((y_ref * dy).sum(), (q, k, v))
            excess = worst_excess((y,) + grads, (y_ref,) + grads_ref, atol, rtol)
            name = f"{dtype}, {mode}, window {window}"
            assert excess <= atol, f"{name}: largest difference {excess:.3g} beyond {rtol:.3g} |x| (tolerance {atol})"
            print(f"ok: {name}: largest difference {excess:.3g} beyond {rtol:.3g} |x|")
EOF
echo "test_flex_varlen_attention: passed"
