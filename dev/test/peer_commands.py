"""Builds the PyTorch peer's command line exactly as dev/bench.py and dev/bench_quality.py would run
it, for every recipe and --fp8 mode bench.py takes and the micro batch variants of both, and hands
each to train_gpt2.py's own parser and flag checks, without running anything. Prints one line per
command line, "SCRIPT FLAGS: PEER ARGUMENTS", a tab, then "train_gpt2.py takes it" or the error
train_gpt2.py would stop with; dev/test/test_peer_commands.sh checks every line.
"""
import contextlib
import io
import itertools
import os
import shlex
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "dev")]
import bench  # noqa: E402
import bench_quality  # noqa: E402
import train_gpt2  # noqa: E402

TAKEN = "train_gpt2.py takes it"
# Flags that change the peer's command line beyond the recipe and --fp8; bench.py's values fit its
# default configs (d12:64,d48:8) and carry the --peer_flags example of its help.
BENCH_VARIANTS = [[], ["--batch_tokens", "65536", "--peer_micro_batch", "8",
                       "--peer_flags", "--compile_mode max-autotune"]]
QUALITY_VARIANTS = [[], ["--peer_micro_batch", "16"]]


def exit_message(program, call):
    """(call's result, None), or (None, the one line the program would exit with): argparse's error
    or the program's own. argparse names the program after sys.argv[0]."""
    sys.argv[0] = program
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return call(), None
    except SystemExit as e:
        lines = stderr.getvalue().strip().splitlines()
        return None, lines[-1] if lines else str(e.code)


def check_peer(script, flags, cmd):
    """Prints the line of one peer command line: taken, or train_gpt2.py's error."""
    if cmd[1] != "train_gpt2.py":
        verdict = f"runs {cmd[1]}, not train_gpt2.py"
    else:
        _, error = exit_message("train_gpt2.py", lambda: train_gpt2.check_args(train_gpt2.parse_args(cmd[2:])))
        verdict = error or TAKEN
    print(f"{script} {shlex.join(flags)}: {shlex.join(cmd[1:])}\t{verdict}")


def check_bench():
    for recipe, fp8, variant in itertools.product(bench.RECIPES, bench.FP8_MODES, BENCH_VARIANTS):
        flags = ["--recipe", recipe, "--fp8", str(fp8)] + variant
        args, refused = exit_message("bench.py", lambda: bench.parse_args(["OUT"] + flags))
        configs = bench.parse_configs(args.configs) if args else []
        refused = refused or exit_message("bench.py", lambda: bench.check_args(args, configs))[1]
        if refused:
            print(f"bench.py {shlex.join(flags)}: refused by bench.py, no peer to check ({refused})")
            continue
        for preset, B in configs:
            for _, peer_fp8 in bench.row_precisions(args):
                check_peer("bench.py", flags, bench.peer_command(args, preset, B, peer_fp8))


def check_bench_quality():
    for variant in QUALITY_VARIANTS:
        flags = ["--train", "data/train_*.bin", "--val", "data/val_*.bin"] + variant
        args, refused = exit_message("bench_quality.py", lambda: bench_quality.parse_args(["OUT"] + flags))
        if refused:
            print(f"bench_quality.py {shlex.join(flags)}\tbench_quality.py refuses its own flags: {refused}")
            continue
        check_peer("bench_quality.py", flags, bench_quality.peer_command(args))


if __name__ == "__main__":
    check_bench()
    check_bench_quality()
