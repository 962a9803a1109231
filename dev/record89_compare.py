"""Ours' record #89 checkpoint against record #89's script's state dict after the same steps from the same
weights, tensor by tensor: where the two sides' weights part.

    python3 dev/record89_compare.py OURS.bin SCRIPT.pt [--processes P] [--init INIT.pt]

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

With --init INIT.pt, the state dict both sides started from (dev/record89_state.py's), two columns
more: how far apart the two sides' updates are, |(ours - init) - (script - init)| / |script - init|,
and how many elements the two sides moved in opposite directions. A tensor's weights can be far
apart where both sides' updates are near each other, and the reverse: Adam's first update moves
nearly every element by its rate times the sign of its gradient, so an element whose gradient is
within rounding of zero moves either way.
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


def compare_tensor(name, ours, script, init=None):
    """(name, elements, differing, max BF16 ulps, relative L2, the worst matrix or None, and with init the
    updates' relative L2 difference and the count of opposite updates) of one tensor, in FP32 (exact for
    the difference of two BF16 values near each other)."""
    ours, script = ours.float(), script.float()
    difference = ours - script
    worst = None
    if name in MATRICES:
        matrices, differences = as_matrices(name, script), as_matrices(name, difference)
        norms = differences.flatten(1).norm(dim=1) / matrices.flatten(1).norm(dim=1).clamp_min(1e-30)
        worst = (int(norms.argmax()), norms.max().item())
    row = (name, script.numel(), int((difference != 0).sum()), bf16_ulps(difference, script).max().item(),
           relative_l2(difference, script), worst)
    if init is None:
        return row
    ours_update, script_update = ours - init.float(), script - init.float()
    return row + (relative_l2(difference, script_update), int((ours_update * script_update < 0).sum()))


def same_shape(name, tensor, script, whose):
    if tuple(tensor.shape) != tuple(script.shape):
        raise ValueError(f"{name}: {whose} {list(tensor.shape)}, the script's {list(script.shape)}: "
                         "give the script's process count (--processes) or states of the same model")


def compare(ours_state, saved, skipped, init_state=None):
    """The rows of compare_tensor for each tensor the script holds, in its order, and the names left out."""
    rows, left_out = [], []
    for name, script in saved.items():
        if name in skipped or name not in ours_state:
            left_out.append(name)
            continue
        same_shape(name, ours_state[name], script, "ours")
        init = None
        if init_state is not None:
            if name not in init_state:
                raise ValueError(f"{name}: not in --init's state dict: give the state both sides started from")
            init = init_state[name]
            same_shape(name, init, script, "--init's")
        rows.append(compare_tensor(name, ours_state[name], script, init))
    return rows, left_out


def report(rows, left_out):
    head = "| tensor | elements | differing | max BF16 ulps | relative L2 | the matrix that differs most |"
    rule = "| --- | ---: | ---: | ---: | ---: | --- |"
    if rows and len(rows[0]) > 6:
        head, rule = head + " updates' relative L2 | opposite updates |", rule + " ---: | ---: |"
    lines = [head, rule]
    for name, elements, differing, ulps, l2, worst, *updates in rows:
        matrix = f"{worst[0]} ({worst[1]:.2e})" if worst else ""
        line = f"| {name} | {elements} | {differing} | {ulps:.3g} | {l2:.3e} | {matrix} |"
        if updates:
            line += f" {updates[0]:.3e} | {updates[1]} |"
        lines.append(line)
    if left_out:
        lines.append(f"not compared: {', '.join(left_out)}")
    return lines


def load_state(path, fix):
    """A state dict torch.load reads from path, or a one-line error ending in fix."""
    import torch
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as e:  # torch.load's errors are of many kinds; one line names the file
        fail(f"{path}: not a state dict torch.load reads ({type(e).__name__}); {fix}")
    if not isinstance(state, dict):
        fail(f"{path}: holds a {type(state).__name__}, not a state dict; {fix}")
    return state


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ours", help="train_gpt2cu's model checkpoint (-recipe record89)")
    parser.add_argument("script", help="the script's state dict (dev/reference89_offline.py --save_state)")
    parser.add_argument("--processes", type=int, default=1, help="the script's process count (default 1)")
    parser.add_argument("--init", help="the state dict both sides started from (dev/record89_state.py's): "
                        "the updates compared too")
    args = parser.parse_args()
    if args.processes < 1:
        fail(f"--processes {args.processes}: give the script's process count, 1 or more")
    for path in (args.ours, args.script):
        if not os.path.isfile(path):
            fail(f"{path}: no such file; give ours' checkpoint, then the script's state dict")
    if args.init and not os.path.isfile(args.init):
        fail(f"--init {args.init}: no such file; give the state dict both sides started from")
    require("torch")
    import train_gpt2 as tg
    saved = load_state(args.script, "give --save_state's file")
    init_state = load_state(args.init, "give dev/record89_state.py's file") if args.init else None
    model = tg.read_checkpoint(args.ours)
    ours_state = script_state(model, tg.bigram_sign_table(model.config.channels), args.processes)
    try:
        rows, left_out = compare(ours_state, saved, FP8_SCALE_BUFFERS, init_state)
    except ValueError as e:
        fail(str(e))
    print("\n".join(report(rows, left_out)))


if __name__ == "__main__":
    main()
