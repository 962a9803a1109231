#!/usr/bin/env bash
# Tests dev/pylib/aligned_scaled_mm.py, the stand-in for torch._scaled_mm in record #89's offline copy
# (its FP8 down projection), on a CUDA GPU with FP8 (compute capability 8.9 or newer): with scales
# that are one-element slices at 4-byte offsets, as the reference passes them, its result has the
# bits of torch._scaled_mm's on the same values in tensors of their own, called as it is and inside
# a graph compiled with fullgraph=True. Prints whether torch._scaled_mm itself takes the slices on
# this GPU and torch. PYTHON as in train_gpt2_py_lib.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/test/train_gpt2_py_lib.sh

check "the scales copied: torch._scaled_mm's bits (CUDA, FP8)" <<'PYEOF'
import sys, torch
sys.path.insert(0, "dev/pylib")
if not (hasattr(torch.library, "custom_op") and torch.cuda.is_available()
        and torch.cuda.get_device_capability() >= (8, 9)):
    print("skipped: no CUDA GPU with FP8, or torch before 2.4")
    sys.exit(0)
import aligned_scaled_mm

torch.manual_seed(0)
M, K, N = 512, 3072, 768  # the reference's down projection: post [M, 3072] by W2 [3072, 768]
a = (torch.randn(M, K, device="cuda") * 4).to(torch.float8_e4m3fn)
b = (torch.randn(N, K, device="cuda") * 4).to(torch.float8_e4m3fn).t()  # column-major, as the reference's
act_scales = torch.rand(12, device="cuda") + 0.5
w_scales = torch.rand(12, device="cuda") + 0.5
compiled = torch.compile(lambda a, b, sa, sb: aligned_scaled_mm.scaled_mm(
    a, b, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb, use_fast_accum=True), fullgraph=True)
for layer in (0, 1, 5):
    sa, sb = act_scales[layer:layer + 1], w_scales[layer:layer + 1]
    want = torch._scaled_mm(a, b, scale_a=sa.clone(), scale_b=sb.clone(), out_dtype=torch.bfloat16,
                            use_fast_accum=True)
    got = aligned_scaled_mm.scaled_mm(a, b, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb, use_fast_accum=True)
    assert torch.equal(got, want), f"layer {layer}: the stand-in's result differs"
    assert torch.equal(compiled(a, b, sa, sb), want), f"layer {layer}: compiled, the result differs"
    try:
        torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=True)
        taken = "takes"
    except RuntimeError as e:
        taken = f"refuses ({str(e).splitlines()[0][:90]})"
    print(f"layer {layer} (scales at a {4 * layer}-byte offset): torch._scaled_mm itself {taken}")
print("the stand-in has torch._scaled_mm's bits, eager and compiled")
PYEOF
echo "test_aligned_scaled_mm: passed"
