"""One training step's BF16 error, ours against PyTorch's, tensor by tensor: train_gpt2.py writes a
float32 debug state (the first step's loss and gradients), then ours' BF16 build (test_gpt2cu) and
PyTorch in bfloat16 (train_gpt2.py --check_debug_state --dtype bfloat16, as its training computes)
each redo that step from the same weights and batch, and each tensor's ||got - ref|| / ||ref|| is
set beside the other's, with their ratio. Where ours trains worse than PyTorch from the same
weights, a tensor whose error is several times PyTorch's names the kernel to look at.

    python3 dev/error_budget.py OUTDIR [--recipe speedrun] [--model d12 | --init_from MODEL] [--train GLOB]
                                [--batch_size 1] [--seq_len 49152] [--window_blocks 5] [--noise 0.02]
                                [--fp8_head] [--python PYTHON] [--dry_run]

--train takes the batch from token shards (real documents; the document-aligned loader where the
recipe has documents); without it train_gpt2.py's random tokens. --noise is the debug state's
--debug_noise (the speedrun's init zeroes the head and the output projections, so that without it
the blocks get no gradient). --init_from takes the weights from an llm.c checkpoint instead, such as
a training run's (trained weights: sharper attention, larger activations than an init's), with no
noise unless --noise is given. --fp8_head writes the state with PyTorch's FP8 head (the rest in
float32), so that both sides compute the head as the speedrun trains it and differ in the rest:
ours' FP8 head is then measured against PyTorch's. Needs a GPU and ./test_gpt2cu built (make
test_gpt2cu). Writes the model and the state to OUTDIR/state, the two programs' outputs to
OUTDIR/ours.log and OUTDIR/pytorch.log, and the table to OUTDIR/error_budget.md (printed too).
--dry_run prints the commands and runs nothing.
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

# test_gpt2cu's lines (dev/test/testing.h): "ok   grad qkvw   n=19464192   |got-ref|/|ref| 8.488e-03  (bound
# 4.0e-02)" and "ok   loss 11.0895967 vs PyTorch 11.0910072 (tolerance 5e-02)".
OURS_TENSOR = re.compile(r"^(?:ok|FAIL)\s+(grad \S+)\s+n=(\d+)\s+\|got-ref\|/\|ref\| (\S+)")
OURS_LOSS = re.compile(r"^(?:ok|FAIL)\s+loss ([-0-9.e+]+) vs PyTorch ([-0-9.e+]+)")
# train_gpt2.py --check_debug_state's: "grad qkvw   n=19464192   |got-ref|/|ref| 8.488e-03".
PYTORCH_TENSOR = re.compile(r"^(logits|loss|grad \S+)\s+n=(\d+)\s+\|got-ref\|/\|ref\| (\S+)")


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir")
    p.add_argument("--recipe", default="speedrun")
    p.add_argument("--model", default="d12")
    p.add_argument("--init_from", help="the state's weights from this llm.c checkpoint, not a --model init")
    p.add_argument("--train", help="glob of token shards for the batch (quote it); default random tokens")
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--seq_len", type=int, default=49152)
    p.add_argument("--window_blocks", type=int, default=5, help="the attention's window in blocks of 128 "
                   "(recipes with documents; 0: none)")
    p.add_argument("--noise", type=float, help="the debug state's --debug_noise (default 0.02, with "
                   "--init_from 0)")
    p.add_argument("--fp8_head", action="store_true", help="the head in FP8 on every side (the state's too)")
    p.add_argument("--python", default=sys.executable, help="the python with torch for train_gpt2.py")
    p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    if args.noise is None:
        args.noise = 0.0 if args.init_from else 0.02
    return args


def state_command(args):
    """train_gpt2.py writing the float32 debug state of one step into OUTDIR/state."""
    batch = ["--input_bin", args.train] if args.train else []
    window = ["--window_blocks", str(args.window_blocks)] if args.window_blocks else []
    weights = ["--init_from", args.init_from] if args.init_from else ["--model", args.model]
    noise = ["--debug_noise", str(args.noise)] if args.noise else []
    return [args.python, "train_gpt2.py", "--recipe", args.recipe] + weights + noise + window + [
            "-b", str(args.batch_size), "-t", str(args.seq_len)] + batch + [
            "--flash", "1"] + fp8_head(args) + ["--write_debug_state", os.path.join(args.outdir, "state"),
            "--debug_steps", "1"]


def fp8_head(args):
    return ["--fp8_head", "1"] if args.fp8_head else []


def state_files(outdir):
    """(model, debug state) written into OUTDIR/state; placeholders before they exist (--dry_run)."""
    folder = os.path.join(outdir, "state")
    states = glob.glob(os.path.join(folder, "gpt2_*_debug_state.bin"))
    models = [path for path in glob.glob(os.path.join(folder, "gpt2_*.bin"))
              if not path.endswith(("_bf16.bin", "_debug_state.bin"))]
    if len(states) == 1 and len(models) == 1:
        return models[0], states[0]
    return os.path.join(folder, "MODEL.bin"), os.path.join(folder, "STATE_debug_state.bin")


def ours_command(model, state):
    return ["./test_gpt2cu", model, state]


def pytorch_command(args, model, state):
    return [args.python, "train_gpt2.py", "--recipe", args.recipe, "--init_from", model, "--check_debug_state", state,
            "--dtype", "bfloat16", "--flash", "1"] + fp8_head(args)


def ours_errors(text):
    """{name: (values, relative error)} from test_gpt2cu's output: each gradient's, and the loss's."""
    errors = {}
    for line in text.splitlines():
        tensor, loss = OURS_TENSOR.match(line), OURS_LOSS.match(line)
        if tensor:
            errors[tensor.group(1)] = (int(tensor.group(2)), float(tensor.group(3)))
        elif loss and "loss" not in errors:  # the first step's; the loss curve's lines follow
            got, ref = float(loss.group(1)), float(loss.group(2))
            errors["loss"] = (1, abs(got - ref) / abs(ref))
    return errors


def pytorch_errors(text):
    return {m.group(1): (int(m.group(2)), float(m.group(3)))
            for m in map(PYTORCH_TENSOR.match, text.splitlines()) if m}


def budget_table(ours, pytorch):
    """Markdown lines: the loss and every gradient with values, in PyTorch's (the file's) order, ours'
    and PyTorch's relative error and their ratio ('-' where one is missing or PyTorch's is 0)."""
    order = ["loss"] + [name for name in pytorch if name not in ("loss", "logits")]
    order += [name for name in ours if name not in order]
    lines = ["| tensor | values | ours (BF16 build) | PyTorch (bfloat16) | ours / PyTorch |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name in order:
        n = max(ours.get(name, (0, 0))[0], pytorch.get(name, (0, 0))[0])
        if n == 0:
            continue
        mine, theirs = ours.get(name, (0, None))[1], pytorch.get(name, (0, None))[1]
        ratio = f"{mine / theirs:.2f}" if mine is not None and theirs else "-"
        lines.append(f"| {name} | {n} | {error_cell(mine)} | {error_cell(theirs)} | {ratio} |")
    return lines


def error_cell(error):
    return "-" if error is None else f"{error:.3e}"


def run(command, log):
    """Runs command with its output in the file log; its status."""
    print("===", shlex.join(command), flush=True)
    with open(log, "w") as f:
        return subprocess.run(command, stdout=f, stderr=subprocess.STDOUT).returncode


def main():
    args = parse_args()
    if args.dry_run:
        model, state = state_files(args.outdir)
        for command in (state_command(args), ours_command(model, state), pytorch_command(args, model, state)):
            print("===", shlex.join(command))
        return
    if args.init_from and not os.path.isfile(args.init_from):
        fail(f"--init_from {args.init_from}: no such file; give an llm.c checkpoint (model_*.bin of -o)")
    if not os.access("./test_gpt2cu", os.X_OK):
        fail("./test_gpt2cu is not built: run make test_gpt2cu first (from the repository's root)")
    os.makedirs(args.outdir, exist_ok=True)
    state_log = os.path.join(args.outdir, "state.log")
    if run(state_command(args), state_log) != 0:
        fail(f"writing the debug state failed: see {state_log}")
    model, state = state_files(args.outdir)
    logs = {"ours": os.path.join(args.outdir, "ours.log"), "pytorch": os.path.join(args.outdir, "pytorch.log")}
    ours_status = run(ours_command(model, state), logs["ours"])  # a bound missed is still a measurement
    if run(pytorch_command(args, model, state), logs["pytorch"]) != 0:
        fail(f"train_gpt2.py --check_debug_state failed: see {logs['pytorch']}")
    ours, pytorch = (parse(open(logs[side]).read()) for side, parse in (("ours", ours_errors),
                                                                          ("pytorch", pytorch_errors)))
    lines = [f"{args.recipe} {args.init_from or args.model}, {args.batch_size} x {args.seq_len} tokens"
             + (f" of {args.train}" if args.train else " (random tokens)")
             + (f", window {args.window_blocks}" if args.window_blocks else "")
             + (", the head in FP8 on both sides and in the state" if args.fp8_head else "")
             + f"; test_gpt2cu exited {ours_status}", ""] + budget_table(ours, pytorch)
    with open(os.path.join(args.outdir, "error_budget.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
