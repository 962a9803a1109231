"""Tokens/s of train_gpt2cu against the PyTorch peer (train_gpt2.py --benchmark: the fastest PyTorch
recipe measured for this model, which the table's header line spells out), side by side, in one
run on one machine.

    python3 dev/bench.py OUTDIR [--configs d12:64,d48:8] [--steps 20] [--gpus 1] [--peer 1] [--peer_flags F]
                         [--fp8 MODE] [--recipe gpt2|modern|speedrun] [--batch_tokens N] [--peer_micro_batch B]
                         [--train GLOB]

For each config PRESET:B (micro batch B at T=1024 unless --seq_len says otherwise) it trains both
on the same random-token shard for --steps steps with the recipe --recipe names (its architecture
and optimizers; -recipe in ours, --recipe in the peer), with no gradient accumulation unless
--batch_tokens sets the tokens of a step (ours accumulates micro batches of B, the peer of
--peer_micro_batch, default B, for a peer that does not fit B), and prints one
table: tokens/s of each, their ratio, ms/step, MFU against the dense BF16 peak, and peak GPU memory
(ours: every byte the trainer allocated; the peer's: torch.cuda.max_memory_allocated). With
--gpus N, ours runs under mpirun on N GPUs (the peer stays on one) and the table adds the scaling
over our one-GPU run. With --fp8 MODE each config gets a second row: ours with -fp8 MODE against
the peer's FP8 recipe (train_gpt2.py --fp8 1: torch._scaled_mm in the same layers), with a column
for ours against the BF16 peer too; MFU stays counted on the BF16 FLOPs. Each program's output is
kept in OUTDIR, ours with its step phases (-pt 1: where each rank's time went).

--train GLOB: ours trains on those shards (quote the glob) in place of random tokens (the peer's
benchmark always takes random tokens). The speedrun recipe needs it (its sequences are packed
documents) and runs without the peer (--peer 0: its PyTorch reference is record #28's script,
which dev/bench_quality.py runs); its MFU is left out, its attention's work depending on the
documents and windows (each step line of ours prints it):

    python3 dev/bench.py OUT --recipe speedrun --peer 0 --configs d12:1 --seq_len 49152 \
        --batch_tokens 393216 --gpus 2 --train 'DATA/train_*.bin'
"""
import argparse
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pydeps import require  # noqa: E402

require("numpy")
import numpy as np  # noqa: E402

SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256
VOCAB_SIZE = 50257
PEAK_FLOPS = 989e12  # dense BF16 of an H100/H200 SXM, as in train_gpt2.cu
RECIPES = ("gpt2", "modern", "speedrun")
FP8_MODES = (0, 1, 2)  # ours' -fp8: off, current scaling, delayed scaling
PRESET_LAYERS = {"d12": (12, 768), "d24": (24, 1024), "d36": (36, 1280), "d48": (48, 1600)}


def fail(message):
    print(f"{os.path.basename(sys.argv[0])}: {message}", file=sys.stderr)
    sys.exit(1)


def write_random_shard(path, num_tokens, seed):
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, num_tokens)
    tokens = np.random.default_rng(seed).integers(0, VOCAB_SIZE, num_tokens, dtype=np.uint16)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def parse_configs(text):
    """[(preset, micro batch)] from --configs' PRESET:MICRO_BATCH,...; fails naming a bad item."""
    configs = []
    for item in text.split(","):
        preset, _, batch = item.partition(":")
        if preset not in PRESET_LAYERS or not batch.isdigit() or int(batch) <= 0:
            fail(f"--configs {item}: give PRESET:MICRO_BATCH with PRESET one of {' '.join(PRESET_LAYERS)}, e.g. d12:64")
        configs.append((preset, int(batch)))
    return configs


def product_parameter_count(preset, recipe):
    """The parameters that SPEC.md's MFU counts: all, less the modern architecture's embedding (a
    lookup; its head is a product with a bias, its blocks have no LayerNorm biases)."""
    layers, channels = PRESET_LAYERS[preset]
    vocab_padded, max_t = 50304, 1024
    if recipe == "modern":
        return vocab_padded * (channels + 1) + 2 * channels + layers * (12 * channels * channels + 11 * channels)
    per_layer = 12 * channels * channels + 13 * channels
    return vocab_padded * channels + max_t * channels + layers * per_layer + 2 * channels


def flops_per_token(preset, T, recipe):
    layers, channels = PRESET_LAYERS[preset]
    return 6 * product_parameter_count(preset, recipe) + 6 * layers * channels * T


def run_logged(cmd, log_path, env=None):
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        status = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    with open(log_path) as log:
        text = log.read()
    if status != 0:
        tail = "\n".join(text.splitlines()[-5:])
        print(f"bench.py: {cmd[0]} exited with {status} (log {log_path}):\n{tail}", file=sys.stderr)
        return None
    return text


# The summary line each program prints: ours, then the peer's; both capture ms/step and tokens/s.
OURS_AVERAGE = r"average ([\d.]+) ms per step, (\d+) tok/s"
PEER_AVERAGE = r"average over steps [\d-]+: ([\d.]+) ms \| MFU [\d.]+% \| (\d+) tok/s"


def parse_run(text, average_pattern):
    """(ms/step, tokens/s, peak MiB or None) from a program's output, or None without its summary."""
    speed = re.search(average_pattern, text)
    memory = re.search(r"peak memory: (\d+) MiB", text)
    if not speed:
        return None
    return float(speed.group(1)), float(speed.group(2)), int(memory.group(1)) if memory else None


def run_ours(args, preset, B, shard, gpus, log_path, fp8=0):
    T = args.seq_len
    cmd = [args.trainer, "-recipe", args.recipe, "-i", shard, "-j", shard, "-e", preset, "-b", str(B),
           "-t", str(T), "-z", str(args.batch_tokens or B * T * gpus), "-x", str(args.steps), "-v", "0",
           "-s", "0", "-n", "0", "-u", "0", "-r", str(args.recompute), "-fp8", str(fp8), "-pt", "1"]
    env = None
    if gpus > 1:
        cmd = ["mpirun", "-np", str(gpus), "--allow-run-as-root", "--bind-to", "none"] + cmd
        env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    text = run_logged(cmd, log_path, env)
    return parse_run(text, OURS_AVERAGE) if text else None


def peer_command(args, preset, B, fp8):
    """The peer's command line for config PRESET:B with --fp8 FP8 (0 or 1)."""
    peer_B = args.peer_micro_batch or B
    cmd = [args.python, "train_gpt2.py", "--benchmark", "1", "--recipe", args.recipe, "--model", preset,
           "--batch_size", str(peer_B), "--seq_len", str(args.seq_len), "--total_batch_size",
           str(args.batch_tokens or peer_B * args.seq_len), "--num_iterations", str(args.steps),
           "--fp8", str(fp8)]
    return cmd + args.peer_flags.split()


def run_peer(args, preset, B, log_path, fp8=0):
    """(ms/step, tokens/s, peak MiB) as parse_run, and the recipe line the peer prints."""
    text = run_logged(peer_command(args, preset, B, fp8), log_path)
    if not text:
        return None, None
    recipe = re.search(r"^peer recipe: (.*)$", text, re.MULTILINE)
    return parse_run(text, PEER_AVERAGE), recipe.group(1) if recipe else None


def row_precisions(args):
    """(ours' -fp8 MODE, the peer's --fp8) of each config's rows: BF16, then --fp8's FP8 row
    against the peer's one FP8 recipe."""
    return [(0, 0), (args.fp8, 1)] if args.fp8 else [(0, 0)]


def fmt(value, pattern):
    return "-" if value is None else pattern.format(value)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", help="folder for the shard and every program's log")
    p.add_argument("--configs", default="d12:64,d48:8", help="comma-separated PRESET:MICRO_BATCH")
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--gpus", type=int, default=1, help="also run ours on this many GPUs (mpirun)")
    p.add_argument("--peer", type=int, default=1, choices=[0, 1], help="run the PyTorch peer")
    p.add_argument("--peer_flags", default="", help="extra train_gpt2.py flags for the peer, e.g. "
                   "'--compile_mode max-autotune' (default: its benchmark recipe)")
    p.add_argument("--recompute", type=int, default=0, help="train_gpt2cu -r level")
    p.add_argument("--fp8", type=int, default=0, choices=FP8_MODES, help="also run ours with -fp8 MODE "
                   "(1 current, 2 delayed scaling) and the peer's FP8 recipe, a row each config")
    p.add_argument("--recipe", default="gpt2", choices=RECIPES, help="both programs' recipe")
    p.add_argument("--batch_tokens", type=int, default=0, help="tokens a step (default: one micro batch)")
    p.add_argument("--peer_micro_batch", type=int, default=0, help="the peer's micro batch (default: B)")
    p.add_argument("--train", default="", help="glob of shards ours trains on in place of random tokens (quote it)")
    p.add_argument("--trainer", default="./train_gpt2cu")
    p.add_argument("--python", default=sys.executable)
    return p.parse_args(argv)


def check_args(args, configs):
    """Fails on flags that cannot make a run, before any is made."""
    if args.fp8 and args.recipe == "modern":
        fail("--fp8 with --recipe modern: the PyTorch peer has no FP8 layers for the modern architecture; "
             "drop --fp8")
    for preset, B in configs:
        for who, micro in (("ours", B * max(args.gpus, 1)), ("the peer", args.peer_micro_batch or B)):
            if args.batch_tokens and args.batch_tokens % (micro * args.seq_len):
                fail(f"--batch_tokens {args.batch_tokens} is not a multiple of {who}'s micro batch "
                     f"{micro}*{args.seq_len} for {preset}:{B}; pick a multiple")
    if args.steps < 3:
        fail(f"--steps {args.steps}: need at least 3 (the first steps are not timed)")
    if args.recipe == "speedrun" and args.peer:
        fail("--recipe speedrun: its PyTorch reference is record #28's script, which dev/bench_quality.py runs; "
             "give --peer 0")
    if args.recipe == "speedrun" and not args.train:
        fail("--recipe speedrun trains on packed documents, which random tokens lack: give --train 'DATA/*.bin'")
    if args.train and not glob.glob(args.train):
        fail(f"--train {args.train}: no files match; check the path, or prepare the data first (see README.md)")


def main():
    args = parse_args()
    configs = parse_configs(args.configs)
    check_args(args, configs)
    if not os.access(args.trainer, os.X_OK):
        fail(f"{args.trainer} is not an executable: build it with `make train_gpt2cu` or pass --trainer")
    os.makedirs(args.outdir, exist_ok=True)
    shard = args.train
    if not shard:
        shard = os.path.join(args.outdir, "random_tokens.bin")
        largest = max(max(B for _, B in configs) * args.seq_len * max(args.gpus, 1), args.batch_tokens)
        write_random_shard(shard, largest * 4 + 1, seed=1234)

    rows, recipes = [], set()
    for preset, B in configs:
        for fp8, peer_fp8 in row_precisions(args):
            name = f"{preset}_b{B}" + (f"_fp8_{fp8}" if fp8 else "")
            log = lambda who: os.path.join(args.outdir, f"{who}_{name}.log")
            ours = run_ours(args, preset, B, shard, 1, log("ours"), fp8)
            multi = None
            if args.gpus > 1:
                multi = run_ours(args, preset, B, shard, args.gpus, log(f"ours_x{args.gpus}"), fp8)
            peer, recipe = run_peer(args, preset, B, log("peer"), peer_fp8) if args.peer else (None, None)
            recipes.add(recipe)
            rows.append((preset, B, fp8, ours, peer, multi))

    step_tokens = f"{args.batch_tokens} tokens a step" if args.batch_tokens else "one micro batch a step"
    peer_micro = f", the peer's micro batch {args.peer_micro_batch}" if args.peer_micro_batch else ""
    print(f"\n{args.recipe} recipe, T={args.seq_len}, {step_tokens}{peer_micro}, {args.steps} steps per run; "
          f"MFU against {PEAK_FLOPS / 1e12:.0f} TFLOP/s dense BF16")
    for recipe in sorted(r for r in recipes if r):
        print(f"peer: train_gpt2.py --benchmark 1 {args.peer_flags}".rstrip() + f" ({recipe})")
    head = (f"{'config':>16} {'ours tok/s':>11} {'peer tok/s':>11} {'ratio':>6} {'ours ms':>8} {'peer ms':>8} "
            f"{'ours MFU':>8} {'peer MFU':>8} {'ours MiB':>9} {'peer MiB':>9}")
    if args.fp8:
        head += f" {'vs BF16 peer':>12}"
    if args.gpus > 1:
        head += f" {f'x{args.gpus} tok/s':>11} {'scaling':>7}"
    print(head)
    bf16_peer = {}  # (preset, B): the BF16 peer's tokens/s, for the FP8 rows' last column
    for preset, B, fp8, ours, peer, multi in rows:
        fpt = flops_per_token(preset, args.seq_len, args.recipe) if args.recipe != "speedrun" else None
        o_ms, o_tps, o_mem = ours or (None, None, None)
        p_ms, p_tps, p_mem = peer or (None, None, None)
        ratio = o_tps / p_tps if o_tps and p_tps else None
        if not fp8:
            bf16_peer[(preset, B)] = p_tps
        config = f"{preset}:{B}" + (f" fp8 {fp8}" if fp8 else "")
        line = (f"{config:>16} {fmt(o_tps, '{:.0f}'):>11} {fmt(p_tps, '{:.0f}'):>11} "
                f"{fmt(ratio, '{:.2f}'):>6} {fmt(o_ms, '{:.1f}'):>8} {fmt(p_ms, '{:.1f}'):>8} "
                f"{fmt(o_tps and fpt and 100 * o_tps * fpt / PEAK_FLOPS, '{:.1f}%'):>8} "
                f"{fmt(p_tps and fpt and 100 * p_tps * fpt / PEAK_FLOPS, '{:.1f}%'):>8} "
                f"{fmt(o_mem, '{}'):>9} {fmt(p_mem, '{}'):>9}")
        if args.fp8:
            against = bf16_peer.get((preset, B))
            line += f" {fmt(o_tps and against and o_tps / against, '{:.2f}'):>12}"
        if args.gpus > 1:
            m_tps = multi[1] if multi else None
            line += f" {fmt(m_tps, '{:.0f}'):>11} {fmt(m_tps and o_tps and m_tps / o_tps, '{:.3f}'):>7}"
        print(line)
    if args.fp8:
        print("fp8 rows: ours with -fp8 MODE, the peer with --fp8 1; MFU on the BF16 FLOPs")
    if any(r[3] is None or (args.peer and r[4] is None) for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
