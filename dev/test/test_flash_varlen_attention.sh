#!/usr/bin/env bash
# Tests dev/pylib/flash_varlen_attention.py, torch's FlashAttention-2 standing in for FlashAttention-3's
# varlen call in record #89's offline copy: its refusal of what the reference never asks (not causal, a
# right window, FP32); and, on a CUDA GPU, its attention and gradients against attention under the
# dense document-window mask (documents of one token, off any block edge, cu_seqlens padded at the end,
# a max_seqlen above the longest document; windows of 0, within a block, across blocks, none), called
# as it is and inside a graph compiled with fullgraph=True, as the reference calls it. PYTHON as in
# train_gpt2_py_lib.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/test/train_gpt2_py_lib.sh

check "refusals" <<'EOF'
import sys, torch
sys.path.insert(0, "dev/pylib")
import flash_varlen_attention as fva
q = torch.zeros(8, 1, 8, dtype=torch.bfloat16)
cu = torch.tensor([0, 8], dtype=torch.int32)
for kwargs, message in (({"causal": False}, "only causal"), ({"window_size": (4, 2)}, "only causal"),
                        ({"window_size": (-2, 0)}, "only causal"), ({"dtype": torch.float32}, "bfloat16 or float16")):
    dtype = kwargs.pop("dtype", torch.bfloat16)
    try:
        fva.flash_attn_varlen_func(q.to(dtype), q.to(dtype), q.to(dtype), cu, cu, 8, 8, **kwargs)
        raise AssertionError(f"{kwargs}, {dtype} was taken")
    except ValueError as e:
        assert message in str(e), str(e)
        print(f"ok: {kwargs}, {dtype}: {e}")
EOF

check "attention and gradients against the dense mask (CUDA)" <<'EOF'
import sys, torch
sys.path.insert(0, "dev/pylib")
import flash_varlen_attention as fva
if not torch.cuda.is_available():
    print("skipped: no CUDA GPU")
    sys.exit(0)

def reference(q, k, v, starts, window, scale):
    length = q.size(0)
    doc = torch.zeros(length, dtype=torch.long, device=q.device)
    for s in starts[1:]:
        doc[s:] += 1
    i = torch.arange(length, device=q.device)[:, None]
    j = torch.arange(length, device=q.device)[None, :]
    mask = (i >= j) & (doc[:, None] == doc[None, :])
    if window >= 0:
        mask &= i - j <= window
    scores = torch.einsum("ihd,jhd->hij", q.float(), k.float()) * scale
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return torch.einsum("hij,jhd->ihd", probs, v.float())

def worst_excess(outputs, expected, rtol):
    """The largest |a - b| - rtol |b| over the tensors: within atol, every entry is close."""
    return max(((a.float() - b.float()).abs() - rtol * b.float().abs()).max().item() for a, b in zip(outputs, expected))

MAX_SEQLEN = 1024  # a bound on the documents' lengths, as the reference passes its stage's cap

# The reference compiles its whole forward with fullgraph=True and calls the attention on tensors that
# the graph computed: the same here, with the inputs passed through a pointwise function first.
@torch.compile(fullgraph=True, dynamic=False)
def compiled_attention(q, k, v, cu, window):
    q, k, v = (2 * torch.tanh(t) for t in (q, k, v))
    return fva.flash_attn_varlen_func(q, k, v, cu, cu, MAX_SEQLEN, MAX_SEQLEN, causal=True, softmax_scale=0.12,
                                      window_size=(window, 0))

def eager_attention(q, k, v, cu, window):
    return fva.flash_attn_varlen_func(q, k, v, cu, cu, MAX_SEQLEN, MAX_SEQLEN, causal=True, softmax_scale=0.12,
                                      window_size=(window, 0))

torch.manual_seed(3)
length, heads, dim = 1000, 3, 128
starts = [0, 100, 128, 129, 700]
cu = torch.tensor(starts + [length] * 4, dtype=torch.int32, device="cuda")
for dtype, atol, rtol in ((torch.bfloat16, 6e-2, 2 ** -6), (torch.float16, 8e-3, 2 ** -9)):
    for mode, attention, windows in (("eager", eager_attention, (0, 100, 384, -1)),
                                     ("compiled", compiled_attention, (100, -1))):
        for window in windows:
            q, k, v = (torch.randn(length, heads, dim, device="cuda", dtype=dtype, requires_grad=True)
                       for _ in range(3))
            dy = torch.randn(length, heads, dim, device="cuda")
            y = attention(q, k, v, cu, window)
            grads = torch.autograd.grad((y.float() * dy).sum(), (q, k, v))
            inputs = (q, k, v) if mode == "eager" else tuple(2 * torch.tanh(t) for t in (q, k, v))
            y_ref = reference(*inputs, starts, window, 0.12)
            grads_ref = torch.autograd.grad((y_ref * dy).sum(), (q, k, v))
            excess = worst_excess((y,) + grads, (y_ref,) + grads_ref, rtol)
            name = f"{dtype}, {mode}, window {window}"
            assert excess <= atol, f"{name}: largest difference {excess:.3g} beyond {rtol:.3g} |x| (tolerance {atol})"
            print(f"ok: {name}: largest difference {excess:.3g} beyond {rtol:.3g} |x|")
EOF
echo "test_flash_varlen_attention: passed"
