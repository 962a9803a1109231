"""Ours' record #89 checkpoint against record #89's script's state dict after the same steps from the same
weights, tensor by tensor: where the two sides' weights part.

    python3 dev/record89_compare.py OURS.bin SCRIPT.pt [--processes P]

OURS.bin: a model checkpoint of train_gpt2cu -recipe record89 (-n) from -e of dev/record89_state.py's
--checkpoint; SCRIPT.pt: the script's state dict after the same step (dev/reference89_offline.py
--first_steps N --save_state DIR: DIR/stepK.pt), its run from --init_from of the same init (P its
processes, which pad its banks). Ours' weights go through dev/record89_state.py's map to the script's
names and layout. A line a tensor: its elements, how many differ, the largest difference in units of
BF16's spacing at the script's value (BF16 ulps), the relative L2 difference |ours - script| /
|script|, and for the tensors of several matrices (the banks, the five value embeddings) the one
that differs most, by its relative L2 difference. Ours' checkpoint is BF16, so the script's float32
tensors (its lambdas and scalars) agree where they are at most half a BF16 spacing apart. The
script's FP8 scale buffers are not compared: ours keeps its scales outside the checkpoint.
"""
import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from pydeps import require  # noqa: E402
from record89_state import FP8_SCALE_BUFFERS, fail, script_state  # noqa: E402

# Tensors of several matrices, and how many: their leading dimensions, or the five value embeddings
# stacked along the rows.
MATRICES = {"qk_bank": None, "vo_bank": None, "mlp_bank": None, "ve_gate_bank": None, "value_embeds": 5}
BF16_MANTISSA_BITS = 7
BF16_SMALLEST_NORMAL = 2.0 ** -126


def bf16_ulps(difference, reference):
    """|difference| in units of BF16's spacing at each reference value (at the smallest normal one for 0)."""
    spacing = reference.abs().clamp_min(BF16_SMALLEST_NORMAL).log2().floor().sub(BF16_MANTISSA_BITS).exp2()
    return difference.abs() / spacing


def relative_l2(difference, reference):
    norm, apart = reference.norm().item(), difference.norm().item()
    return apart / norm if norm > 0 else (0.0 if apart == 0 else math.inf)


def as_matrices(name, tensor):
    """The tensor as [matrices, rows, columns] (MATRICES), its matrices numbered in row-major order."""
    count = MATRICES[name]
    if count is None:
        return tensor.flatten(0, tensor.dim() - 3)
    return tensor.view(count, -1, tensor.shape[-1])


def compare_tensor(name, ours, script):
    """(name, elements, differing, max BF16 ulps, relative L2, the worst matrix or None) of one tensor, in
    FP32 (exact for the difference of two BF16 values near each other)."""
    ours, script = ours.float(), script.float()
    difference = ours - script
    worst = None
    if name in MATRICES:
        matrices, differences = as_matrices(name, script), as_matrices(name, difference)
        norms = differences.flatten(1).norm(dim=1) / matrices.flatten(1).norm(dim=1).clamp_min(1e-30)
        worst = (int(norms.argmax()), norms.max().item())
    return (name, script.numel(), int((difference != 0).sum()), bf16_ulps(difference, script).max().item(),
            relative_l2(difference, script), worst)


def compare(ours_state, saved, skipped):
    """The rows of compare_tensor for each tensor the script holds, in its order, and the names left out."""
    rows, left_out = [], []
    for name, script in saved.items():
        if name in skipped or name not in ours_state:
            left_out.append(name)
            continue
        if tuple(ours_state[name].shape) != tuple(script.shape):
            raise ValueError(f"{name}: ours {list(ours_state[name].shape)}, the script's {list(script.shape)}: "
                             "give the script's process count (--processes) or states of the same model")
        rows.append(compare_tensor(name, ours_state[name], script))
    return rows, left_out


def report(rows, left_out):
    lines = ["| tensor | elements | differing | max BF16 ulps | relative L2 | the matrix that differs most |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, elements, differing, ulps, l2, worst in rows:
        matrix = f"{worst[0]} ({worst[1]:.2e})" if worst else ""
        lines.append(f"| {name} | {elements} | {differing} | {ulps:.3g} | {l2:.3e} | {matrix} |")
    if left_out:
        lines.append(f"not compared: {', '.join(left_out)}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ours", help="train_gpt2cu's model checkpoint (-recipe record89)")
    parser.add_argument("script", help="the script's state dict (dev/reference89_offline.py --save_state)")
    parser.add_argument("--processes", type=int, default=1, help="the script's process count (default 1)")
    args = parser.parse_args()
    if args.processes < 1:
        fail(f"--processes {args.processes}: give the script's process count, 1 or more")
    for path in (args.ours, args.script):
        if not os.path.isfile(path):
            fail(f"{path}: no such file; give ours' checkpoint, then the script's state dict")
    require("torch")
    import torch
    import train_gpt2 as tg
    try:
        saved = torch.load(args.script, map_location="cpu")
    except Exception as e:  # torch.load's errors are of many kinds; one line names the file
        fail(f"{args.script}: not a state dict torch.load reads ({type(e).__name__}); give --save_state's file")
    if not isinstance(saved, dict):
        fail(f"{args.script}: holds a {type(saved).__name__}, not a state dict; give --save_state's file")
    model = tg.read_checkpoint(args.ours)
    ours_state = script_state(model, tg.bigram_sign_table(model.config.channels), args.processes)
    try:
        rows, left_out = compare(ours_state, saved, FP8_SCALE_BUFFERS)
    except ValueError as e:
        fail(str(e))
    print("\n".join(report(rows, left_out)))


if __name__ == "__main__":
    main()
