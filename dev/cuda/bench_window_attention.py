"""Document-causal attention with a sliding window of 128-token blocks, as modded-nanogpt's speedrun
trains it: the time of PyTorch's FlexAttention with the reference's block mask (train_gpt2.py's
attention_block_lists), and of scaled_dot_product_attention with the same mask as a dense boolean
tensor (every backend that takes a mask computes all T^2 scores), at one sequence of T tokens.
    python3 dev/cuda/bench_window_attention.py OUT_DIR [--seq_len 49152] [--windows 1,4,8,14]
TFLOP/s are counted on the visible blocks (the blocks the mask selects, 4 * 128^2 * HS FLOPs per
block and head forward, 2.5 times that backward), whatever an implementation computes. The
documents are random (lengths drawn from a geometric distribution, --document_mean tokens on
average) unless --shard gives a token shard, whose first T tokens after a document start are used.
Each window's FlexAttention output is checked against the dense mask's. With --ours (build/bench_kernels,
its attention benchmark), our windowed kernels run on the same tokens and windows, and the table
gives their times and the ratio of FlexAttention's forward + backward time to ours. Writes
OUT_DIR/window_attention.md.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)
from pydeps import require  # noqa: E402

require("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import train_gpt2  # noqa: E402
from dev.cuda.bench_attention import time_ms  # noqa: E402

BLOCK = train_gpt2.ATTENTION_BLOCK


def sequence_tokens(args):
    """T token ids whose documents start at train_gpt2.DOCUMENT_START, from --shard or random."""
    rng = np.random.default_rng(args.seed)
    if args.shard:
        tokens = np.fromfile(args.shard, np.uint16, offset=train_gpt2.HEADER_INTS * 4).astype(np.int64)
        starts = np.flatnonzero(tokens == train_gpt2.DOCUMENT_START)
        if len(starts) == 0 or starts[0] + args.seq_len > len(tokens):
            sys.exit(f"bench_window_attention.py: {args.shard} holds no {args.seq_len} tokens after a "
                     f"document start; give a larger shard or a smaller --seq_len")
        return torch.from_numpy(tokens[starts[0]:starts[0] + args.seq_len].copy())
    tokens = rng.integers(0, train_gpt2.DOCUMENT_START, args.seq_len)
    position = 0
    while position < args.seq_len:
        tokens[position] = train_gpt2.DOCUMENT_START
        position += int(rng.geometric(1.0 / args.document_mean))
    return torch.from_numpy(tokens)


def dense_mask(tokens, partial_num, partial_indices, full_num, full_indices):
    """The [T, T] mask of the selected blocks, document-causal inside them, built on the GPU."""
    T = len(tokens)
    blocks = T // BLOCK
    selected = torch.zeros(blocks, blocks, dtype=torch.bool, device="cuda")
    for num, indices in ((partial_num, partial_indices), (full_num, full_indices)):
        columns = torch.arange(blocks, device="cuda")[None, :] < num.cuda()[:, None]
        rows = torch.arange(blocks, device="cuda")[:, None].expand(blocks, blocks)
        selected[rows[columns], indices.cuda().long()[columns]] = True
    docs = (tokens.cuda() == train_gpt2.DOCUMENT_START).cumsum(0)
    position = torch.arange(T, device="cuda")
    mask = (position[:, None] >= position) & (docs[:, None] == docs)
    return mask & selected.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)


def time_forward_backward(attend, q, k, v, dout):
    forward = time_ms(lambda: attend(q, k, v))
    out = attend(q, k, v)
    backward = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return forward, backward, out


def dense_row(args, tokens, lists, q, k, v, dout, flex_out):
    """SDPA's times with the dense mask and its largest difference from flex_out, or dashes where
    it is not asked for or does not fit the GPU."""
    if not args.dense:
        return ["-", "-", "-"]
    try:
        mask = dense_mask(tokens, *lists)
        forward, backward, out = time_forward_backward(
            lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask), q, k, v, dout)
        return [f"{forward:.3f}", f"{backward:.3f}", f"{(flex_out - out).abs().max().item():.2e}"]
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return ["out of memory", "-", "-"]


def our_times(args, tokens, windows):
    """{window: (forward ms, backward ms)} of our kernels (bench_kernels attention --window) on `tokens`."""
    if not args.ours:
        return {}
    path = os.path.join(args.out_dir, "window_tokens.bin")
    tokens.numpy().astype(np.int32).tofile(path)
    command = [args.ours, "attention", "--window", path, str(args.heads), str(args.head_size)]
    command += [str(w) for w in windows]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"bench_window_attention.py: {' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    times = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if fields and fields[0] == "window":
            times[int(fields[1])] = (float(fields[fields.index("forward_ms") + 1]),
                                     float(fields[fields.index("backward_ms") + 1]))
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--seq_len", type=int, default=49152)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--head_size", type=int, default=128)
    p.add_argument("--windows", default="1,4,8,14", help="windows in blocks of 128 tokens")
    p.add_argument("--document_mean", type=float, default=1024.0)
    p.add_argument("--shard", default="", help="take the documents of this token shard")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dense", type=int, default=1, help="1: also SDPA with the dense mask")
    p.add_argument("--ours", default="", help="our build/bench_kernels (its attention benchmark): time ours too")
    args = p.parse_args()
    if args.seq_len % BLOCK != 0:
        sys.exit(f"bench_window_attention.py: --seq_len {args.seq_len} is not a multiple of {BLOCK}")
    if not torch.cuda.is_available():
        sys.exit("bench_window_attention.py: needs a CUDA GPU and PyTorch with CUDA")
    from torch.nn.attention.flex_attention import flex_attention
    os.makedirs(args.out_dir, exist_ok=True)
    flex = torch.compile(flex_attention, dynamic=False)
    tokens = sequence_tokens(args)
    T, NH, HS = args.seq_len, args.heads, args.head_size
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    q, k, v = (torch.randn(1, NH, T, HS, device="cuda", dtype=torch.bfloat16, generator=generator,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn(1, NH, T, HS, device="cuda", dtype=torch.bfloat16, generator=generator)
    documents = int((tokens == train_gpt2.DOCUMENT_START).sum())
    windows = [int(w) for w in args.windows.split(",")]
    ours = our_times(args, tokens, windows)
    lines = [f"T = {T}, {NH} heads of {HS}, {documents} documents"
             f" ({'from ' + args.shard if args.shard else f'random, mean {args.document_mean:g} tokens'}),"
             f" {torch.cuda.get_device_name()}, PyTorch {torch.__version__}", "",
             "| window (blocks) | visible blocks | flex fwd ms | flex bwd ms | flex fwd TFLOP/s | "
             "flex bwd TFLOP/s | ours fwd ms | ours bwd ms | ours fwd TFLOP/s | ours bwd TFLOP/s | "
             "flex / ours (fwd + bwd) | dense SDPA fwd ms | dense SDPA bwd ms | max abs diff |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for window in windows:
        lists = train_gpt2.attention_block_lists(tokens, window)
        visible = int(lists[0].sum() + lists[2].sum())
        flops = 4.0 * BLOCK * BLOCK * HS * NH * visible
        block_mask = train_gpt2.document_block_mask(tokens[None].cuda(), window)
        fwd, bwd, out = time_forward_backward(lambda a, b, c: flex(a, b, c, block_mask=block_mask), q, k, v, dout)
        row = [f"{window}", f"{visible}", f"{fwd:.3f}", f"{bwd:.3f}", f"{flops / fwd / 1e9:.1f}",
               f"{2.5 * flops / bwd / 1e9:.1f}"]
        if window in ours:
            our_fwd, our_bwd = ours[window]
            row += [f"{our_fwd:.3f}", f"{our_bwd:.3f}", f"{flops / our_fwd / 1e9:.1f}",
                    f"{2.5 * flops / our_bwd / 1e9:.1f}", f"{(fwd + bwd) / (our_fwd + our_bwd):.2f}"]
        else:
            row += ["-"] * 5
        row += dense_row(args, tokens, lists, q, k, v, dout, out)
        lines.append("| " + " | ".join(row) + " |")
        print(lines[-1], flush=True)
    with open(os.path.join(args.out_dir, "window_attention.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:1]))


if __name__ == "__main__":
    main()
