"""Validation loss against training time: train_gpt2cu with the modern recipe, the PyTorch reference
(train_gpt2.py) with the same recipe and data order, and train_gpt2cu with GPT-2's recipe, one after
the other on one GPU, on the same token shards.

    python3 dev/bench_quality.py OUTDIR --train 'DIR/python_train_*.bin' --val 'DIR/python_val_*.bin'
                                 [--steps 600] [--batch_tokens 131072] [--micro_batch 64] [--seq_len 1024]
                                 [--val_every 50] [--val_batches 20] [--gpt2_lr 6e-4] [--gpt2_warmup 60]
                                 [--peer_micro_batch B]
                                 [--runs ours_modern,peer_modern,ours_gpt2]

Every run is d12 at the same batch, steps and validation batches. The training time of a step is its
step line's ms (validation, start-up and the first step, which compiles or tunes, are not counted),
summed up to each validation. Prints one
table (final validation loss, ms per step, tokens/s, training time, and the time each run needs to
reach the final validation loss of GPT-2's recipe, interpolated between validations) and writes it
to OUTDIR/quality.md with the curves in OUTDIR/quality.png. Each run's output is kept in OUTDIR, and
a run whose output there reached its last step is read again instead of run (so the runs can be
spread over several invocations with the same OUTDIR).
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import pydeps  # noqa: E402

pydeps.require("matplotlib")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RUNS = ("ours_modern", "peer_modern", "ours_gpt2")
LABELS = {"ours_modern": "train_gpt2cu, modern recipe", "peer_modern": "PyTorch, modern recipe",
          "ours_gpt2": "train_gpt2cu, GPT-2 recipe"}
STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ \| loss [-0-9.naif]+ .*?\| ([0-9.]+) ms")
VAL_LINE = re.compile(r"^step\s+(\d+)/\d+ \|.*val loss ([0-9.]+)")


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def run_command(name, args):
    """The command line of one run; its output directory is OUTDIR/name."""
    common_ours = ["-e", "d12", "-i", args.train, "-j", args.val, "-b", str(args.micro_batch),
                   "-t", str(args.seq_len), "-z", str(args.batch_tokens), "-x", str(args.steps),
                   "-v", str(args.val_every), "-m", str(args.val_batches), "-s", "0",
                   "-o", os.path.join(args.outdir, name)]
    if name == "ours_modern":
        return ["./train_gpt2cu", "-recipe", "modern"] + common_ours
    if name == "ours_gpt2":
        return ["./train_gpt2cu", "-recipe", "gpt2", "-l", str(args.gpt2_lr), "-u", str(args.gpt2_warmup)] + common_ours
    return peer_command(args)


def peer_command(args):
    """The command line of peer_modern, the PyTorch run: the modern recipe on the same data, batch and
    validation."""
    return [args.python, "train_gpt2.py", "--recipe", "modern", "--model", "d12", "--input_bin", args.train,
            "--input_val_bin", args.val, "-b", str(args.peer_micro_batch or args.micro_batch), "-t", str(args.seq_len),
            "--total_batch_size", str(args.batch_tokens), "--num_iterations", str(args.steps),
            "--val_every", str(args.val_every), "--val_steps", str(args.val_batches), "--compile", "1",
            "--dtype", "bfloat16",
            "--output_dir", os.path.join(args.outdir, "peer_modern")]


def parse_curve(text):
    """[(step, training seconds, val loss)] and the steps' ms, from a run's output. The first step
    compiles (PyTorch) or tunes the products (ours): its time is not counted."""
    ms, curve, elapsed = [], [], 0.0
    for line in text.splitlines():
        step = STEP_LINE.match(line)
        if step:
            ms.append(float(step.group(2)))
            if int(step.group(1)) > 1:
                elapsed += float(step.group(2)) / 1000.0
            continue
        val = VAL_LINE.match(line)
        if val:
            curve.append((int(val.group(1)), elapsed, float(val.group(2))))
    return curve, ms


def time_to_reach(curve, target):
    """Training seconds at which the validation loss first reaches target, interpolated linearly
    between the validations around it; None when it never does."""
    for i, (_, seconds, loss) in enumerate(curve):
        if loss <= target:
            if i == 0:
                return seconds
            _, s0, l0 = curve[i - 1]
            return s0 + (seconds - s0) * (l0 - target) / (l0 - loss)
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir")
    p.add_argument("--train", required=True, help="glob of the training shards (quote it)")
    p.add_argument("--val", required=True, help="glob of the validation shards (quote it)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch_tokens", type=int, default=131072)
    p.add_argument("--micro_batch", type=int, default=64)
    p.add_argument("--peer_micro_batch", type=int, default=0, help="the PyTorch run's micro batch, where "
                   "--micro_batch does not fit its memory (0: --micro_batch); the batch stays --batch_tokens")
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--val_every", type=int, default=50)
    p.add_argument("--val_batches", type=int, default=20)
    p.add_argument("--gpt2_lr", type=float, default=6e-4, help="GPT-2 recipe's peak learning rate")
    p.add_argument("--gpt2_warmup", type=int, default=60, help="GPT-2 recipe's warmup steps")
    p.add_argument("--runs", default=",".join(RUNS), help="which runs, in order: " + " ".join(RUNS))
    p.add_argument("--python", default=sys.executable, help="the python with torch for the peer")
    return p.parse_args(argv)


def main():
    args = parse_args()
    runs = args.runs.split(",")
    for name in runs:
        if name not in RUNS:
            fail(f"--runs {name}: use some of {','.join(RUNS)}")
    os.makedirs(args.outdir, exist_ok=True)
    curves, step_ms = {}, {}
    for name in runs:
        log = os.path.join(args.outdir, f"{name}.log")
        if os.path.exists(log):  # a finished run of the same OUTDIR is read again, not rerun
            curves[name], step_ms[name] = parse_curve(open(log, errors="replace").read())
            if curves[name] and curves[name][-1][0] == args.steps:
                print(f"=== {name}: read {log}", flush=True)
                continue
        print(f"=== {name}: {' '.join(run_command(name, args))}", flush=True)
        with open(log, "w") as f:
            status = subprocess.run(run_command(name, args), stdout=f, stderr=subprocess.STDOUT).returncode
        text = open(log, errors="replace").read()
        if status != 0:
            fail(f"{name} exited with status {status}: see {log}\n{text[-2000:]}")
        curves[name], step_ms[name] = parse_curve(text)
        if not curves[name]:
            fail(f"{name}: no validation line in {log}")
    report(args, runs, curves, step_ms)


def report(args, runs, curves, step_ms):
    target = curves["ours_gpt2"][-1][2] if "ours_gpt2" in curves else None
    lines = [f"d12, {args.steps} steps of {args.batch_tokens} tokens (micro batch {args.micro_batch} x "
             f"{args.seq_len}), validation every {args.val_every} steps on {args.val_batches} batches"]
    if args.peer_micro_batch and "peer_modern" in runs:
        lines.append(f"PyTorch's micro batch: {args.peer_micro_batch} x {args.seq_len}, the same {args.batch_tokens} "
                     "tokens a step")
    if target is not None:
        lines.append(f"target: GPT-2 recipe's final validation loss {target:.4f}")
    lines.append("| run | final val loss | ms/step (median) | tokens/s | training s | s to target |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in runs:
        ms = sorted(step_ms[name][1:]) or step_ms[name]
        median = ms[len(ms) // 2]
        reach = time_to_reach(curves[name], target) if target is not None else None
        lines.append(f"| {LABELS[name]} | {curves[name][-1][2]:.4f} | {median:.1f} | "
                     f"{args.batch_tokens / (median / 1000):.0f} | {curves[name][-1][1]:.1f} | "
                     f"{'%.1f' % reach if reach is not None else 'not reached'} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.outdir, "quality.md"), "w") as f:
        f.write(table + "\n")
    plt.figure(figsize=(7, 4.5))
    for name in runs:
        plt.plot([c[1] for c in curves[name]], [c[2] for c in curves[name]], marker="o", ms=3, label=LABELS[name])
    if target is not None:
        plt.axhline(target, color="gray", lw=0.8, ls="--")
    plt.xlabel("training time (s)")
    plt.ylabel("validation loss")
    plt.legend()
    plt.grid(alpha=0.3)
    plt.tight_layout()
    plt.savefig(os.path.join(args.outdir, "quality.png"), dpi=120)


if __name__ == "__main__":
    main()
