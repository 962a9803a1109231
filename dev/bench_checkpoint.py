"""The stall a checkpoint adds to its step, and the time to resume, of train_gpt2cu.

    python3 dev/bench_checkpoint.py OUTDIR [--configs d12:64,d48:8] [--steps 16] [--every 5]
                                    [--modes 0,2,1] [--resume 1]

For each config PRESET:B (micro batch B at T=1024) it trains on a random-token shard with a
checkpoint every --every steps, once per way of writing them: before training goes on (-ac 0),
in the background from pinned host memory (-ac 2) and through a snapshot on the GPU (-ac 1). Each
step line is timed as it arrives. The checkpoint of step s is taken between the lines of steps s
and s+1, so its stall is that interval less the median interval between two lines with no
checkpoint between them (the first two steps are setup and not counted). The run's end waits for
the last checkpoint, so the time from the last step line to the exit is shown too. Then it
resumes the last run from its newest checkpoint (-y 1, one more step) and times the start to the
first step line, with the split of the trainer's `resumed from` line (the seconds loading the
model file, loading the state, and to that line), against a fresh start of the same command without -y 1 (into a
directory of its own, so that it sets up the same checkpoints, pinned host memory included),
stopped at its first step line. Every program's output is kept in OUTDIR;
each run keeps its newest checkpoint only (-nk 1), and a run's checkpoints are deleted once the
next run starts. --modes picks the ways of writing (-ac values, in that order) and --resume 0
leaves out the resume: a large model's runs may be split over several calls.

A background write that has not ended by the next checkpoint makes that checkpoint wait for it: to
measure the stall of the copies alone, give --every enough steps for a write (the end wait column
is about one write).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import fail, parse_configs, write_random_shard  # noqa: E402

STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ \| loss ")
RESUMED_LINE = re.compile(r"^resumed from .* \(the model loaded in ([\d.]+) s, the state in ([\d.]+) s, "
                          r"([\d.]+) s since the start\)$",
                          re.MULTILINE)


def timed_run(cmd, log_path, stop_at_first_step=False):
    """Runs cmd, timing its output: (exit status, seconds to each step line by step, seconds to
    the exit). Times count from the start of the process. stop_at_first_step: the process is
    killed at its first step line (only the time to it is wanted)."""
    start = time.monotonic()
    step_times = {}
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        for line in proc.stdout:
            now = time.monotonic() - start
            log.write(line)
            match = STEP_LINE.match(line)
            if match:
                step_times[int(match.group(1))] = now
                if stop_at_first_step:
                    proc.kill()
                    break
        proc.stdout.close()
        status = proc.wait()
    return status, step_times, time.monotonic() - start


def checkpoint_stalls(step_times, every, first_step=0):
    """(median seconds between step lines with no checkpoint between them, [stall of each
    checkpoint]) from {step line number: seconds}. Line k is printed after training step k-1; the
    checkpoint of step s (s a multiple of every, past first_step) comes between lines s and s+1.
    The interval ending at line first_step+1 holds the setup and that ending at first_step+2 the
    first timed step's warm-up, so neither counts."""
    lines = sorted(step_times)
    plain, with_checkpoint = [], []
    for previous, line in zip(lines, lines[1:]):
        if line != previous + 1 or line <= first_step + 2:
            continue
        interval = step_times[line] - step_times[previous]
        (with_checkpoint if previous % every == 0 else plain).append(interval)
    if not plain or not with_checkpoint:
        return None, []
    step = statistics.median(plain)
    return step, [interval - step for interval in with_checkpoint]


def remove_files(directory):
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            os.remove(os.path.join(directory, name))


def checkpoint_bytes(directory, step):
    """The bytes of the checkpoint of step in directory: its model file and every state file."""
    prefix_model, prefix_state = f"model_{step:08d}.bin", f"state_{step:08d}_"
    total = 0
    for name in os.listdir(directory):
        if name == prefix_model or (name.startswith(prefix_state) and name.endswith(".bin")):
            total += os.path.getsize(os.path.join(directory, name))
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", help="folder for the shard, the checkpoints and every program's log")
    p.add_argument("--configs", default="d12:64,d48:8", help="comma-separated PRESET:MICRO_BATCH")
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--every", type=int, default=5, help="a checkpoint every this many steps")
    p.add_argument("--trainer", default="./train_gpt2cu")
    p.add_argument("--flags", default="", help="more train_gpt2cu flags for every run, e.g. '-fp8 1'")
    p.add_argument("--modes", default="0,2,1", help="comma-separated -ac values, run in this order")
    p.add_argument("--resume", type=int, default=1, choices=[0, 1], help="time the resume from the last run")
    args = p.parse_args()
    modes = args.modes.split(",")
    if not modes or any(mode not in ("0", "1", "2") for mode in modes) or len(set(modes)) != len(modes):
        fail(f"--modes {args.modes}: give distinct -ac values among 0, 1, 2, comma-separated (e.g. 0,2,1)")
    configs = parse_configs(args.configs)
    if args.every < 3 or args.steps < 2 * args.every:
        fail(f"--every {args.every} --steps {args.steps}: need --every at least 3 and two checkpoints "
             "within --steps (the first steps are not timed)")
    if not os.access(args.trainer, os.X_OK):
        fail(f"{args.trainer} is not an executable: build it with `make train_gpt2cu` or pass --trainer")
    os.makedirs(args.outdir, exist_ok=True)
    shard = os.path.join(args.outdir, "random_tokens.bin")
    largest = max(B for _, B in configs) * args.seq_len
    write_random_shard(shard, largest * (args.steps + 2) + 1, seed=1234)

    rows, failed = [], False
    for preset, B in configs:
        base = [args.trainer, "-i", shard, "-j", shard, "-e", preset, "-b", str(B), "-t", str(args.seq_len),
                "-z", str(B * args.seq_len), "-v", "0", "-s", "0", "-u", "0"] + args.flags.split()
        name = f"{preset}_b{B}"
        run_dir = None
        for ac in modes:
            label = f"-ac {ac}"
            if run_dir:
                remove_files(run_dir)  # the large models' checkpoints fill a disk quickly
            run_dir = os.path.join(args.outdir, f"{name}_ac{ac}")
            remove_files(run_dir)
            log = os.path.join(args.outdir, f"{name}_ac{ac}.log")
            status, times, total = timed_run(base + ["-x", str(args.steps), "-n", str(args.every), "-nk", "1",
                                                     "-ac", ac, "-o", run_dir], log)
            step, stalls = checkpoint_stalls(times, args.every)
            if status != 0 or step is None:
                print(f"bench_checkpoint.py: {label} at {preset}:{B} failed (exit {status}; log {log})", file=sys.stderr)
                failed = True
                continue
            size = checkpoint_bytes(run_dir, args.steps)
            rows.append((f"{preset}:{B}", label, step, statistics.mean(stalls), max(stalls),
                         total - times[max(times)], size))
            # At once too, for a run that a time limit stops before the table.
            print(f"{preset}:{B} {label}: step {step * 1e3:.1f} ms, stall {statistics.mean(stalls) * 1e3:.1f} ms a "
                  f"checkpoint", flush=True)
        if not args.resume:
            remove_files(run_dir)
            continue
        # The resume: from the newest checkpoint of the last run, one step more, against a fresh start
        # of the same command (the same checkpoint setup) in a directory of its own.
        fresh_log = os.path.join(args.outdir, f"{name}_fresh.log")
        resume_log = os.path.join(args.outdir, f"{name}_resume.log")
        fresh_dir = os.path.join(args.outdir, f"{name}_fresh")
        continued = base + ["-x", str(args.steps + 1), "-n", str(args.every), "-nk", "1"]
        remove_files(fresh_dir)
        _, fresh, _ = timed_run(continued + ["-o", fresh_dir], fresh_log, stop_at_first_step=True)
        remove_files(fresh_dir)
        status, resumed, _ = timed_run(continued + ["-o", run_dir, "-y", "1"], resume_log)
        if status != 0 or not fresh or not resumed:
            print(f"bench_checkpoint.py: the resume at {preset}:{B} failed (exit {status}; log {resume_log})",
                  file=sys.stderr)
            failed = True
        else:
            with open(resume_log) as f:
                parts = RESUMED_LINE.search(f.read())
            split = tuple(float(parts.group(i)) for i in (1, 2, 3)) if parts else None
            rows.append((f"{preset}:{B}", "resume", split, resumed[min(resumed)], None, fresh[min(fresh)], None))
        remove_files(run_dir)

    print(f"\nT={args.seq_len}, {args.steps} steps, a checkpoint every {args.every}; seconds from the step lines")
    print(f"{'config':>10} {'writes':>7} {'step ms':>8} {'stall ms':>9} {'stall %':>8} {'worst ms':>9} "
          f"{'end wait s':>10} {'GB':>6}")
    for config, label, step, stall, worst, end_wait, size in rows:
        if label == "resume":
            # step holds the trainer's own split: seconds loading the model file, the state, and
            # to its line
            split = (f" (the model loaded in {step[0]:.1f} s, the state in {step[1]:.1f} s, {step[2]:.1f} s to the "
                     "resumed line)") if step else ""
            print(f"{config:>10} resume: {stall:.1f} s to the first step line{split}, {end_wait:.1f} s for a "
                  "fresh start")
            continue
        print(f"{config:>10} {label:>7} {step * 1e3:>8.1f} {stall * 1e3:>9.1f} {100 * stall / step:>7.1f}% "
              f"{worst * 1e3:>9.1f} {end_wait:>10.1f} {size / 1e9:>6.2f}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
