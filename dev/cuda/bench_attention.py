"""Flash attention TFLOP/s: ours (build/bench_kernels attention) against PyTorch's
scaled_dot_product_attention with its flash and cuDNN backends, causal, BF16, at GPT-2 shapes.
    python3 dev/cuda/bench_attention.py [--binary build/bench_kernels]
Causal FLOPs as FlashAttention counts them: 2*B*NH*T*T*HS forward, 2.5 times that backward.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pydeps import require  # noqa: E402

require("torch")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SHAPES = [(64, 12, 1024, 64), (8, 25, 1024, 64), (32, 6, 1024, 128)]


def time_ms(fn, reps=20):
    """Median GPU time of fn over reps runs queued back to back, each between its own pair of
    events, with one synchronisation at the end: the launches' host time overlaps the GPU's work
    instead of being counted in it."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[len(times) // 2]


def torch_backend(backend, B, NH, T, HS):
    from torch.nn.attention import sdpa_kernel
    q, k, v = (torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, NH, T, HS, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(backend):
        forward = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        backward = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return forward, backward


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="build/bench_kernels")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py: needs a CUDA GPU and PyTorch with CUDA")
    from torch.nn.attention import SDPBackend
    ours = {}
    result = subprocess.run([args.binary, "attention"] + [str(x) for s in SHAPES for x in s], capture_output=True,
                            text=True)
    if result.returncode != 0:
        sys.exit(f"bench_attention.py: {args.binary} failed: {result.stdout[-500:]}{result.stderr[-500:]}")
    for line in result.stdout.splitlines():
        f = line.split()
        if f and f[0] == "shape":
            ours[tuple(int(x) for x in f[1:5])] = (float(f[6]), float(f[8]))
    print(f"{'B NH T HS':>16} {'ours fwd':>9} {'flash fwd':>9} {'cudnn fwd':>9} {'ours bwd':>9} {'flash bwd':>9} {'cudnn bwd':>9}   (TFLOP/s)")
    for shape in SHAPES:
        B, NH, T, HS = shape
        flops = 2.0 * B * NH * T * T * HS
        row = [ours.get(shape)]
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                row.append(torch_backend(backend, B, NH, T, HS))
            except RuntimeError as e:
                print(f"  {backend}: {str(e).splitlines()[0]}")
                row.append(None)
        fwd = [f"{flops / r[0] / 1e9:9.1f}" if r else f"{'-':>9}" for r in row]
        bwd = [f"{2.5 * flops / r[1] / 1e9:9.1f}" if r else f"{'-':>9}" for r in row]
        print(f"{' '.join(map(str, shape)):>16} {' '.join(fwd)} {' '.join(bwd)}")


if __name__ == "__main__":
    main()
