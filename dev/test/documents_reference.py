"""The checks of dev/test/test_documents.sh: the document-aligned order of llmc/dataloader.h
(through build/test_dataloader --dump-documents) and of train_gpt2.py against each other, and
train_gpt2.py's against modded-nanogpt's own loader, transcribed below, as it is and as
dev/bench_quality.py's copy of it searches; the stage plan's steps, rates and momentum of
llmc/stages.h and llmc/schedulers.h (build/test_stages) against train_gpt2.py's, and record #89's
rate, momentum and loss weights against its reference's expressions (transcribed below too); record
#89's packing of documents under a cap, both languages' against its loader (transcribed below).
Writes its shards under the folder given; prints one line per check, "what<TAB>same" or "what<TAB>the
difference", and notes without a tab.

  python3 dev/test/documents_reference.py SCRATCH     (from the repository's root)
"""
import glob
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pydeps import require  # noqa: E402

require("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402

import train_gpt2 as tg  # noqa: E402

# ------------------------------------------------------------------------------------------------
# modded-nanogpt (records/track_1_short/2025-08-23_SparseAttnGate), find_batch_starts and
# distributed_data_generator with align_to_bos=True, in numpy: the rank and process count are
# arguments instead of torch.distributed's, the files are given, and a step yields the sequence as
# one array of T+1 tokens instead of inputs and targets on the GPU. Everything else is as there:
# the window of 2 * grad_accum * T * world tokens that shrinks by what each micro step consumes,
# the next file only at a step's start, the assert where a window holds no sequence T tokens
# long, the IndexError (of boundary_positions[0]) where it holds no document start, and the end
# of the files raising RuntimeError (a StopIteration inside a generator). Two edits of the copy
# dev/bench_quality.py runs are arguments here: search_factor, each micro step searching that many
# times its step's tokens in place of what is left of its window (16: the bench's edit); and
# window_factor, the window's 2 (16: the bench's earlier edit, which also moved the switch to the
# next shard).


def find_batch_starts(tokens, pos, seq_len, token_window, world_size):
    boundary_mask = tokens[pos : pos + token_window] == 50256
    boundary_positions = np.nonzero(boundary_mask)[0] + pos
    start = boundary_positions[0].item()
    starts = []
    for i in range(1, len(boundary_positions)):
        end = boundary_positions[i].item()
        if end - start >= seq_len:
            starts.append(start)  # append start once end pos is confirmed
            if len(starts) == world_size:
                return starts, end - pos
            start = end
    assert False  # increase token_window if necessary


def distributed_data_generator(files, seq_len, grad_accum_steps, rank, world_size, search_factor=None,
                               window_factor=2):
    batch_size = seq_len * world_size
    file_iter = iter(files)
    tokens, pos = load_shard(next(file_iter)), 0
    while True:
        token_window = grad_accum_steps * window_factor * batch_size
        if pos + token_window + 1 >= len(tokens):
            tokens = load_shard(next(file_iter))
            pos = 0
        for _ in range(grad_accum_steps):
            search = token_window if search_factor is None else search_factor * grad_accum_steps * batch_size
            batch_starts, tokens_consumed = find_batch_starts(tokens, pos, seq_len, search, world_size)
            start_idx = batch_starts[rank]
            buf = tokens[start_idx:][:seq_len + 1]
            pos += tokens_consumed
            token_window -= tokens_consumed
            yield buf


def load_shard(path):
    return np.fromfile(path, np.uint16, offset=tg.HEADER_INTS * 4)


# ------------------------------------------------------------------------------------------------
# Record #89 (modded-nanogpt f411b3d3, train_gpt.py 1710-1777 and 1796-1874): Shard.next_batch and
# distributed_data_generator with align_to_bos=True, in numpy, every rank's groups at once (each
# rank computes all of them alike and keeps its own). As there: the document starts indexed once
# per shard (the full index; the reference's partial index of the first 6,000,000 tokens gives the
# same starts where a batch does not outrun it), each rank's group filled to num_tokens_local + 1
# tokens from the starts in order, each document cut at max_seq_len and at what the group still
# needs, the index moving past every document taken; StopIteration where no start is left, the
# call then repeated whole on the next file; the boundaries cum_lengths padded to max_num_docs.
# What is left out: the GPU, the bigram hash, the async loads. The generator ends where the files
# do (TypeError: the reference calls its getter None); `sends` maps a call to the
# (num_tokens, max_seq_len, grad_accum_steps) the loop sends with it at a stage's first step.

RECORD89_MAX_NUM_DOCS = {16384: 64, 32768: 96, 49152: 128}


def record89_shard_next_batch(tokens, bos_idx, i, num_tokens_local, max_seq_len, world_size):
    n = len(bos_idx)
    starts = [[] for _ in range(world_size)]
    ends = [[] for _ in range(world_size)]
    idx = i
    for r in range(world_size):
        cur_len = 0
        while cur_len <= num_tokens_local:
            if idx >= n:
                raise StopIteration("Insufficient BOS ahead; hit tail of shard.")
            cur = bos_idx[idx]
            starts[r].append(cur)
            idx += 1
            end = min(bos_idx[idx] if idx < n else len(tokens), cur + max_seq_len, cur + num_tokens_local - cur_len + 1)
            ends[r].append(end)
            cur_len += end - cur
        assert cur_len == num_tokens_local + 1
    return starts, ends, idx


def record89_batches(files, num_tokens, max_seq_len, world_size, grad_accum_steps=1, sends=None):
    """Yields each call's groups, every rank's: (rows of num_tokens_local + 1 tokens, the padded
    cum_lengths of each rank). sends: {call: the arguments sent with it}."""
    assert num_tokens % (world_size * grad_accum_steps) == 0
    num_tokens = num_tokens // grad_accum_steps
    file_iter = iter(files)
    tokens = load_shard(next(file_iter))
    bos_idx, i = np.flatnonzero(tokens == 50256), 0
    call = 0
    while True:
        num_tokens_local = num_tokens // world_size
        max_num_docs = RECORD89_MAX_NUM_DOCS.get(num_tokens_local, tg.next_multiple_of_n(num_tokens_local // 300, n=128))
        try:
            seq_starts, seq_ends, i_next = record89_shard_next_batch(tokens, bos_idx, i, num_tokens_local,
                                                                     max_seq_len, world_size)
        except StopIteration:
            path = next(file_iter, None)
            if path is None:
                return
            tokens = load_shard(path)
            bos_idx, i = np.flatnonzero(tokens == 50256), 0
            continue
        i = i_next
        rows, boundaries = [], []
        for starts, ends in zip(seq_starts, seq_ends):
            rows.append(np.concatenate([tokens[a:b] for a, b in zip(starts, ends)]))
            lengths = np.array(ends) - np.array(starts)
            lengths[-1] -= 1  # the last document's last token is a target only
            cum_lengths = np.cumsum(lengths)
            padded = np.full(max_num_docs, num_tokens_local)
            padded[0] = 0
            padded[1:len(cum_lengths) + 1] = cum_lengths  # the reference fails where they do not fit
            boundaries.append(padded)
        yield rows, boundaries
        call += 1
        new_params = (sends or {}).get(call)
        if new_params is not None:
            new_num_tokens, max_seq_len, new_grad_accum_steps = new_params
            assert new_num_tokens % (world_size * new_grad_accum_steps) == 0
            num_tokens = new_num_tokens // new_grad_accum_steps


# ------------------------------------------------------------------------------------------------

def write_shard(path, tokens):
    header = np.zeros(tg.HEADER_INTS, np.int32)
    header[:3] = [tg.SHARD_MAGIC, tg.SHARD_VERSION, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, np.uint16).tobytes())


def documents(rng, lengths, prefix=0):
    """Documents of the given lengths, each 50256 and then random tokens; `prefix` tokens first."""
    parts = [rng.integers(0, 50256, prefix)]
    for length in lengths:
        parts += [[50256], rng.integers(0, 50256, length - 1)]
    return np.concatenate(parts).astype(np.uint16)


def write_dataset(folder, name, shards):
    for i, tokens in enumerate(shards):
        write_shard(f"{folder}/{name}_{i:03d}.bin", tokens)
    return f"{folder}/{name}_*.bin"


def port_rows(pattern, B, T, grad_accum, world, shuffle, seed, steps=None, epochs=None, cap=0):
    """train_gpt2.py's sequences over every rank, in stream order (micro batch by micro batch, rank
    by rank, row by row), for `steps` steps or until the step after `epochs` epochs; and the steps."""
    ranks = [tg.DocumentLoader(pattern, "test", B, T, grad_accum, r, world, shuffle, seed, 50257, cap)
             for r in range(world)]
    rows, step = [], 0
    while (steps is None or step < steps) and (epochs is None or ranks[0].epoch < epochs):
        for _ in range(grad_accum):
            for loader in ranks:
                inputs, targets = loader.next_batch()
                assert (inputs[:, 1:] == targets[:, :-1]).all(), "targets are the inputs shifted"
                rows += list(np.concatenate([inputs.numpy(), targets[:, -1:].numpy()], axis=1))
        step += 1
    return np.array(rows), step


def cpp_rows(scratch, pattern, B, T, grad_accum, world, shuffle, seed, steps, cap=0):
    out = f"{scratch}/dump.bin"
    subprocess.run(["build/test_dataloader", "--dump-documents", out, pattern, str(B), str(T),
                    str(grad_accum), str(world), str(int(shuffle)), str(seed), str(steps), str(cap)],
                   check=True, stdout=subprocess.DEVNULL)
    return np.fromfile(out, np.int32).reshape(-1, T + 1)


def port_plan_lines(plan, B, T, Z, AW, AWF, world, steps):
    """train_gpt2.py's plan of each step 0..N+E as build/test_stages --dump prints it, or its error."""
    try:
        args = tg.parse_args(["--input_bin", "x", "--documents", "1", "-b", str(B), "-t", str(T), "--total_batch_size",
                              str(Z), "--window_blocks", str(AW), "--final_window_blocks", str(AWF),
                              "--num_iterations", str(steps), "--stages", plan])
        stages = tg.stage_plan(args, world)
    except SystemExit as e:
        return str(e)
    return [f"{s} {p.stage} {p.seq_len} {p.tokens} {p.micro_steps} {p.cap} {p.window_blocks} "
            f"{p.short_window_blocks} {'%.17g' % p.lr_multiplier}"
            for s, p in ((s, stages.step(s)) for s in range(stages.steps + 1))]


def run_cpp(what, command):
    """The C++ program's run: (stdout, None), or (None, why it gave nothing) printed as a failed check."""
    if not os.path.exists(command[0]):
        print(f"{what}\t{command[0]} is missing: make {command[0]} (llmc/stages.h's test program)")
        return None, None
    result = subprocess.run(command, capture_output=True, text=True)
    return result.stdout, result


def print_dump_check(what, dumped, port, out, result):
    """One check line of a build/test_stages dump against train_gpt2.py's lines (port), or, where
    train_gpt2.py refused the plan (port its error), that the C++ side refused it too."""
    if isinstance(port, str):
        errors = result.returncode == 1 and result.stderr.startswith("error: ") and not out
        print(f"{what}: both reject it\t{'same' if errors else f'C++ exit {result.returncode}: {result.stderr!r}'}")
        return
    lines = out.splitlines()
    differ = next((i for i, (a, b) in enumerate(zip(lines, port)) if a != b), None)
    verdict = ("same" if lines == port else f"C++ {len(lines)} lines, train_gpt2.py {len(port)}; first "
               f"difference at step {differ}: {lines[differ]!r} and {port[differ]!r}" if differ is not None
               else f"C++ {len(lines)} lines (exit {result.returncode}: {result.stderr.strip()!r}), "
                    f"train_gpt2.py {len(port)}")
    print(f"{what}: {dumped}, C++ and train_gpt2.py\t{verdict}")


def check_plan_dumps(scratch):
    """The plan of every step, llmc/stages.h's (build/test_stages --dump) against train_gpt2.py's: its
    long and short windows among them, record #89's (short, long) pairs and its final window of 20."""
    record89 = "1/3 t=16384 aw=1/3; 1/3 t=32768 aw=3/7 lr=1.52; 1/3 t=49152 aw=5/11 lr=1.73; +15 aw=6/13 lr=1"
    cases = [  # (PLAN, B, T, Z, AW, AWF, WORLD, STEPS)
        ("", 4, 256, -1, -1, 0, 1, 37),
        ("1 lr=0.75", 2, 128, 1024, 3, 0, 2, 20),
        ("1/3 t=1024; 1/3 t=2048 lr=0.5; 1/3 aw=7; +15 lr=0.25", 1, 2048, -1, -1, 0, 1, 1270),
        ("1/3; 1/3; 1/3; +15", 1, 2048, -1, 0, 0, 1, 1270),
        ("0.25 t=256 z=4096 cap=64; 0.5 aw=2 lr=1e-1; 0.25 z=-1 aw=-1 lr=0.3333333333333333; +7 cap=0",
         2, 128, 2048, -1, 0, 2, 101),
        ("0.1; 2/7 t=512; 0.2 cap=100; 29/70 t=256 aw=5", 1, 256, -1, 0, 0, 1, 997),
        (record89, 1, 16384, -1, 0, 20, 1, 1270),
        (record89, 1, 16384, -1, 0, 0, 1, 1270),
        ("1/2 aw=2/5; 1/2 lr=0.5; +3 aw=9", 1, 2048, -1, "1/4", 12, 1, 40),
        ("1/2; 1/2 aw=4", 1, 2048, -1, "3/8", 0, 1, 10),
        ("1", 1, 2048, -1, -1, 16, 1, 10),
        ("1/2; 1/2", 1, 128, -1, 0, 0, 1, 7),
        ("0.5; 0.4", 1, 128, -1, 0, 0, 1, 10),
        ("0.5 q=1; 0.5", 1, 128, -1, 0, 0, 1, 10),
        ("+3; 1", 1, 128, -1, 0, 0, 1, 10),
        ("0.01; 0.99", 1, 128, -1, 0, 0, 1, 10),
        ("1 t=+64", 1, 128, -1, 0, 0, 1, 10),
        ("+1/2; 1/2", 1, 128, -1, 0, 0, 1, 10),
        ("0x1p-1; 0x1p-1", 1, 128, -1, 0, 0, 1, 10),
        ("1; ++2", 1, 128, -1, 0, 0, 1, 10),
        ("1 lr=0x1p0", 1, 128, -1, 0, 0, 1, 10),
        ("1 aw=5/3", 1, 256, -1, 0, 0, 1, 10),
        ("1 aw=0/3", 1, 256, -1, 0, 0, 1, 10),
        ("1 aw=2/-1", 1, 256, -1, 0, 0, 1, 10),
        ("1 aw=1/x", 1, 256, -1, 0, 0, 1, 10),
        ("1 aw=1/2/3", 1, 256, -1, 0, 0, 1, 10),
        ("1", 1, 256, -1, "4/2", 0, 1, 10),
        ("1 aw=2/5", 1, 256, -1, 0, 1, 1, 10),
        ("1/2 aw=3; 1/2 aw=0", 1, 256, -1, 0, 20, 1, 10),
    ]
    for plan, B, T, Z, AW, AWF, world, steps in cases:
        what = f"--stages {plan!r} (B {B}, T {T}, z {Z}, aw {AW}, awf {AWF}, {world} process(es), {steps} steps)"
        port = port_plan_lines(plan, B, T, Z, AW, AWF, world, steps)
        out, result = run_cpp(what, ["build/test_stages", "--dump", plan, str(B), str(T), str(Z), str(AW), str(AWF),
                                     str(world), str(steps)])
        if result is None:
            continue
        print_dump_check(what, "every step's plan", port, out, result)


# modded-nanogpt's record #89 (train_gpt.py at f411b3d3, TrainingSchedule.get_lr and
# get_muon_momentum), its rate multiplier and Muon's momentum at a step: the stage's lr_mul
# (`multiplier`), the scheduled and total steps and the cooldown fraction as arguments instead of
# its globals; the expressions as there.
def reference_lr(step, multiplier, scheduled_iterations, cooldown_frac=0.60):
    lr = multiplier
    cd_start = int(scheduled_iterations * (1 - cooldown_frac))
    if step >= cd_start:
        t = min(1.0, (step - cd_start) / (scheduled_iterations - cd_start))
        lr = lr * (1 - t) + 0.15 * t
    return lr


def reference_momentum(step, total_steps, muon_warmup_steps=300, muon_cooldown_steps=50, momentum_min=0.85,
                       momentum_max=0.95):
    momentum_cd_start = total_steps - muon_cooldown_steps
    if step < muon_warmup_steps:
        frac = step / muon_warmup_steps
        momentum = momentum_min + frac * (momentum_max - momentum_min)
    elif step > momentum_cd_start:
        frac = (step - momentum_cd_start) / muon_cooldown_steps
        momentum = momentum_max - frac * (momentum_max - momentum_min)
    else:
        momentum = momentum_max
    return momentum


def port_rate_lines(plan, steps, schedule, lr, warmup, final_frac, cooldown_frac, momentum, momentum_warmup,
                    momentum_cooldown):
    """train_gpt2.py's learning rate and Muon's momentum of each step 0..N+E as build/test_stages
    --dump-rates prints them."""
    start, end = momentum
    args = tg.parse_args(["--input_bin", "x", "--documents", "1", "-t", "128", "--num_iterations", str(steps),
                          "--stages", plan, "--optimizer", "muon", "--lr_schedule", schedule, "--learning_rate", lr,
                          "--warmup_iters", str(warmup), "--final_lr_frac", final_frac, "--cooldown_frac",
                          cooldown_frac, "--muon_momentum_start", start, "--muon_momentum", end,
                          "--muon_momentum_warmup", str(momentum_warmup), "--muon_momentum_cooldown",
                          str(momentum_cooldown)])
    stages = tg.stage_plan(args, 1)
    return [f"{s} {'%.17g' % tg.learning_rate(s, args, None, stages.step(s).lr_multiplier)} "
            f"{'%.17g' % tg.muon_momentum(s, args, stages.steps)}" for s in range(stages.steps + 1)]


def check_rate_dumps():
    """The learning rate and Muon's momentum of every step, llmc/schedulers.h's over a plan's
    multipliers (build/test_stages --dump-rates) against train_gpt2.py's; record #89's against its
    reference's expressions too."""
    record89 = "1/3 t=128; 1/3 t=256 lr=1.52; 1/3 t=384 lr=1.73; +15"
    cases = [  # (PLAN, STEPS, SCHEDULE, LR, WARMUP, FINAL_FRAC, COOLDOWN_FRAC, (MOMENTUM START, END), ITS WARMUP,
               #  ITS COOLDOWN)
        (record89, 1270, "cooldown", "1", 0, "0.15", "0.6", ("0.85", "0.95"), 300, 50),
        (record89, 1270, "cooldown", "0.008", 0, "0.15", "0.6", ("0.85", "0.95"), 300, 50),
        ("1/2 lr=2; 1/2 lr=0.5; +3", 41, "cooldown", "0.023", 25, "0.1", "0.55", ("0.8", "0.95"), 10, 44),
        ("1/4; 3/4 lr=1.25", 97, "cooldown", "0.0006", 5, "0", "1", ("0.85", "0.95"), 0, 97),
        # the existing schedules and the speedrun's momentum: each schedule's value times the stage's
        ("1/3; 1/3 lr=0.5; 1/3 lr=0.25; +5", 200, "cosine", "0.0006", 20, "0.1", "0.5", ("0.85", "0.95"), 300, 0),
        ("1/3; 1/3 lr=0.5; 1/3 lr=0.25; +5", 200, "linear", "0.0003", 7, "0.25", "0.5", ("0.85", "0.95"), 0, 0),
        ("1/2; 1/2 lr=1.5; +5", 1000, "wsd", "0.001", 20, "0", "0.5", ("0.85", "0.95"), 300, 0),
        ("1/2; 1/2 lr=1.5", 13, "constant", "0.0002", 3, "0.3", "0.5", ("0.85", "0.95"), 0, 0),
    ]
    for plan, steps, schedule, lr, warmup, final_frac, cooldown_frac, momentum, momentum_warmup, momentum_cooldown \
            in cases:
        what = (f"--stages {plan!r} of {steps} steps, {schedule} from {lr} (warmup {warmup}, final {final_frac}, "
                f"cooldown {cooldown_frac}), momentum {momentum[0]} to {momentum[1]} (warmup {momentum_warmup}, "
                f"cooldown {momentum_cooldown})")
        port = port_rate_lines(plan, steps, schedule, lr, warmup, final_frac, cooldown_frac, momentum,
                               momentum_warmup, momentum_cooldown)
        out, result = run_cpp(what, ["build/test_stages", "--dump-rates", plan, str(steps), schedule, lr, str(warmup),
                                     final_frac, cooldown_frac, *momentum, str(momentum_warmup),
                                     str(momentum_cooldown)])
        if result is None:
            continue
        lines = out.splitlines()
        differ = next((i for i, (a, b) in enumerate(zip(lines, port)) if a != b), None)
        verdict = ("same" if lines == port else f"C++ {len(lines)} lines (exit {result.returncode}: "
                   f"{result.stderr.strip()!r}), train_gpt2.py {len(port)}" if differ is None
                   else f"first difference at step {differ}: {lines[differ]!r} and {port[differ]!r}")
        print(f"{what}: every step's rate and momentum, C++ and train_gpt2.py\t{verdict}")
    # Record #89 (rate 1: the multiplier itself), against its reference: the rate at every step; the momentum
    # from step 300, and before it as float (Muon's kernels take float), its warmup written 0.85 + f 0.1
    # where ours is (1 - f) 0.85 + f 0.95 (record #28's), which differs in the last bit of some doubles.
    stages = tg.StagePlan(tg.parse_stages(record89, 128, -1, 0), 1270, 1, 1)
    multipliers = [stages.stages[stages.stage_index(s)].lr_multiplier for s in range(stages.steps + 1)]
    port = port_rate_lines(*cases[0])
    as_float = lambda x: float(np.float32(x))
    reference = [(reference_lr(s, m, 1270), reference_momentum(s, stages.steps)) for s, m in enumerate(multipliers)]
    ours = [(float(lr), float(mu)) for _, lr, mu in (line.split() for line in port)]
    differ = [s for s, ((lr, mu), (ref_lr, ref_mu)) in enumerate(zip(ours, reference))
              if lr != ref_lr or (mu != ref_mu if s >= 300 else as_float(mu) != as_float(ref_mu))]
    print(f"record #89's plan: the rate at each of {len(ours)} steps, and the momentum (as float before step 300), "
          f"train_gpt2.py and its reference\t{'same' if not differ else f'differ at steps {differ[:5]}'}")
    named = {846: ours[846][0], 847: ours[847][0], 1284: ours[1284][1], 508: ours[508][0], 1270: ours[1270][0]}
    print(f"record #89: rate 1.52 at the cooldown's start (508), 0.912 at step 846, 1.027 at 847, 0.15 from 1270; "
          f"momentum 0.852 at 1284\t{'same' if [round(named[s], 3) for s in (508, 846, 847, 1270, 1284)] == [1.52, 0.912, 1.027, 0.15, 0.852] else named}")


def port_stage_rows(pattern, B, world, shuffle, seed, plan, T, Z, steps):
    """train_gpt2.py's loaders of every rank following the plan, reshaped where a step's shape
    changes: the rows of its N+E steps, flat in stream order."""
    stages = tg.StagePlan(tg.parse_stages(plan, T, Z, 0), steps, B, world)
    first = stages.step(0)
    ranks = [tg.DocumentLoader(pattern, "test", B, first.seq_len, first.micro_steps, r, world, shuffle, seed,
                               50257, first.cap) for r in range(world)]
    rows = []
    for step in range(stages.steps):
        p = stages.step(step)
        for loader in ranks:
            loader.reshape(p.seq_len, p.micro_steps, p.cap)
        for _ in range(p.micro_steps):
            for loader in ranks:
                inputs, targets = loader.next_batch()
                rows.append(np.concatenate([inputs.numpy(), targets[:, -1:].numpy()], axis=1).ravel())
    return np.concatenate(rows), ranks[0].epoch


# modded-nanogpt's record #89 (train_gpt.py at f411b3d3, TrainingSchedule.__init__'s lists and its
# lookup), the loss weights of a step: the stages' (mtp start, mtp end, prefix start, prefix end) and
# its boundaries (the scheduled stages' and the extension's (start, end)) as arguments instead of its
# TRAINING_STAGES; the expressions as there, torch.tensor's default dtype float32.
def reference_loss_weights(step, stages, boundaries):
    for i, (start, end) in enumerate(boundaries):
        if step < end:
            stage, t = stages[i], (step - start) / (end - start)
            break
    else:
        stage, t = stages[-1], 1.0
    mtp_start, mtp_end, prefix_start, prefix_end = stage
    w = [a + (b - a) * t for a, b in zip(mtp_start, mtp_end)]
    pw = prefix_start + (prefix_end - prefix_start) * t
    return torch.tensor(w).tolist(), torch.tensor([pw]).item()


def port_loss_lines(plan, steps, mtp, prefix_weight):
    """train_gpt2.py's loss weights of each step 0..N+E as build/test_stages --dump-loss prints them, or
    its error."""
    try:
        args = tg.parse_args(["--input_bin", "x", "--num_iterations", str(steps), "--stages", plan, "--mtp", mtp,
                              "--prefix_weight", prefix_weight])
        stages = tg.stage_plan(args, 1)
    except SystemExit as e:
        return str(e)
    return [f"{s} {','.join('%.9g' % w for w in p.next_token_weights)} {'%.9g' % p.prefix_weight}"
            for s, p in ((s, stages.step(s)) for s in range(stages.steps + 1))]


def check_loss_dumps():
    """The loss weights of every step (mtp=, pw=), llmc/stages.h's (build/test_stages --dump-loss)
    against train_gpt2.py's, bit for bit; record #89's against its reference's expressions too."""
    record89 = "1/3 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; 1/3 mtp=1,0.5>1,0 pw=0.25>0; 1/3 mtp=1 pw=0; +15"
    cases = [  # (PLAN, STEPS, -mtp, -pw)
        (record89, 1270, "1", "0"),
        ("1/7 mtp=1,0.333>0.1,0.9 pw=0.123456789>0.987654321; 6/7 pw=0; +4", 997, "1", "0"),
        ("1/2 mtp=0.3,0.7>0.9,0.1 pw=.1>6e-1; 1/2 mtp=0.2 pw=0.3>0; +3", 97, "1", "0"),
        ("1/2; 1/2 mtp=1 pw=0", 11, "1,0.5,0.25", "0.25"),
        ("1/3; 1/3 mtp=1,1>1,0; 1/3", 10, "0.7", "0.1"),
        ("1", 0, "1,0.5", "0.25"),
        ("1 mtp=1,0.5>1", 10, "1", "0"),
        ("1 mtp=0 pw=0", 10, "1", "0"),
        ("1/2; 1/2 mtp=0>1", 10, "1", "0"),
        ("1 pw=1.5", 10, "1", "0"),
        ("1 pw=-0", 10, "1", "0"),
        ("1 mtp=1,1,1,1", 10, "1", "0"),
        ("1 mtp=1>", 10, "1", "0"),
        ("1 mtp=1>0>1", 10, "1", "0"),
        ("1 mtp=1,,1", 10, "1", "0"),
        ("1 pw=0x1p-2", 10, "1", "0"),
    ]
    for plan, steps, mtp, prefix_weight in cases:
        what = f"--stages {plan!r} of {steps} steps, -mtp {mtp} -pw {prefix_weight}"
        port = port_loss_lines(plan, steps, mtp, prefix_weight)
        out, result = run_cpp(what, ["build/test_stages", "--dump-loss", plan, str(steps), mtp, prefix_weight])
        if result is None:
            continue
        print_dump_check(what, "every step's loss weights", port, out, result)
    reference_stages = [([1.0, 0.5, 0.25], [1.0, 0.5, 0.0], 0.25, 0.25), ([1.0, 0.5], [1.0, 0.0], 0.25, 0.0),
                        ([1.0], [1.0], 0.0, 0.0), ([1.0], [1.0], 0.0, 0.0)]
    boundaries = [(0, 423), (423, 847), (847, 1270), (1270, 1285)]
    reference = []
    for step in range(1286):
        w, pw = reference_loss_weights(step, reference_stages, boundaries)
        reference.append(f"{step} {','.join('%.9g' % x for x in w)} {'%.9g' % pw}")
    port = port_loss_lines(*cases[0])
    differ = [s for s, (a, b) in enumerate(zip(port, reference)) if a != b]
    print(f"record #89's plan: the loss weights at each of {len(reference)} steps, train_gpt2.py and its reference\t"
          f"{'same' if not differ and len(port) == len(reference) else f'differ at steps {differ[:5]}'}")


def check_stage_rows(scratch, pattern, T):
    """The sequences of loaders following a plan, llmc/dataloader.h's (build/test_dataloader
    --dump-stages) against train_gpt2.py's: the length doubling as the cap begins, and one cap
    giving way to another, over one and two processes, plain and shuffled."""
    for B, world in [(2, 1), (1, 2)]:
        Z = 2 * B * 2 * T * world  # 4 micro batches of T, then 2 of 2T
        plans = [f"1/2; 1/2 t={2 * T} cap={T * 5 // 8}", f"0.4 cap={T // 3}; 0.6 t={2 * T} cap={T * 3 // 4}; +3 cap=10"]
        for plan in plans:
            for shuffle in (False, True):
                steps = 30
                what = (f"--stages {plan!r}, T {T}, z {Z}, B {B} x {world} process(es)"
                        f"{', shuffled' if shuffle else ''}, {steps} steps")
                port, epoch = port_stage_rows(pattern, B, world, shuffle, 1337, plan, T, Z, steps)
                out = f"{scratch}/dump_stages.bin"
                _, result = run_cpp(what, ["build/test_dataloader", "--dump-stages", out, pattern, str(B), str(world),
                                           str(int(shuffle)), "1337", plan, str(T), str(Z), str(steps)])
                if result is None:
                    continue
                if result.returncode != 0:
                    print(f"{what}: C++ and train_gpt2.py\tC++ exit {result.returncode}: {result.stderr.strip()!r}")
                    continue
                cpp = np.fromfile(out, np.int32)
                same = cpp.shape == port.shape and (cpp == port).all()
                differ = next((i for i in range(min(len(cpp), len(port))) if cpp[i] != port[i]), None)
                print(f"{what} (to epoch {epoch}): C++ and train_gpt2.py\t"
                      f"{'same' if same else f'{len(cpp)} and {len(port)} tokens, first difference at {differ}'}")


def record89_rows(pattern, T, cap, world_size=8, grad_accum_steps=1, sends=None):
    """Record #89's groups (num_tokens = 8T a step, so T a forward) in stream order until its files
    end, and every forward's boundaries."""
    files = sorted(glob.glob(pattern))
    rows, boundaries = [], []
    for call_rows, call_boundaries in record89_batches(files, 8 * T, cap, world_size, grad_accum_steps, sends):
        rows += call_rows
        boundaries += call_boundaries
    return rows, boundaries


def check_packing(scratch, rng):
    """Record #89's packing (a stage's cap): llmc/dataloader.h's against train_gpt2.py's over layouts
    of 8 forwards a step, plain and shuffled, two epochs; train_gpt2.py's against the reference's
    groups on 8 processes (its own layout) to its files' end, and the boundaries it hands its
    attention against the document starts of each forward's inputs (where ours are found); across
    a stage boundary where the length and the cap change, C++, train_gpt2.py and the reference."""
    T = 64

    def lengths(n):  # one token, short, exactly T+1, longer than T+1 or than a cap of 24 or 100
        return [int(rng.choice([1, int(rng.integers(2, 24)), 24, 25, T + 1, 100, int(rng.integers(26, 3 * T)),
                                5 * T])) for _ in range(n)]

    pattern = write_dataset(scratch, "packing", [documents(rng, lengths(150)), documents(rng, lengths(120), prefix=7),
                                                 documents(rng, lengths(170))])
    layouts = [(1, 8, 1), (1, 1, 8), (2, 2, 2), (1, 4, 2)]
    for cap in (24, 100):
        for B, grad_accum, world in layouts:
            setting = f"packing, cap {cap}: T={T} B={B} x {grad_accum} micro batches x {world} processes"
            for shuffle in (False, True):
                port, steps = port_rows(pattern, B, T, grad_accum, world, shuffle, 1337, epochs=2, cap=cap)
                cpp = cpp_rows(scratch, pattern, B, T, grad_accum, world, shuffle, 1337, steps, cap)
                compare(f"{setting}{', shuffled' if shuffle else ''}: C++ and train_gpt2.py, {steps} steps over "
                        f"2 epochs", cpp, port)
            reference, boundaries = record89_rows(pattern, T, cap)
            port = port_rows(pattern, B, T, grad_accum, world, False, 0, epochs=1, cap=cap)[0]
            compare(f"{setting}: train_gpt2.py and record #89's loader on 8 processes, its {len(reference)} "
                    f"forwards to its files' end", port, np.array(reference))
        starts_agree = all((np.flatnonzero(row[:-1] == 50256) == np.concatenate([[0], b[1:][b[1:] < T]])).all()
                           for row, b in zip(reference, boundaries))
        print(f"packing, cap {cap}: record #89's boundaries of each of {len(reference)} forwards (cum_lengths "
              f"before its padding) are the document starts of its inputs\t{'same' if starts_agree else 'differ'}")
    # The reference on 2 processes of 4 micro batches reads a call's 2 groups where 8 processes read
    # 8: at a shard's end it goes on in the shard, so from there its forwards are others.
    eight, _ = record89_rows(pattern, T, 24)
    two, _ = record89_rows(pattern, T, 24, world_size=2, grad_accum_steps=4)
    differ = next((i for i in range(min(len(eight), len(two))) if not (eight[i] == two[i]).all()), None)
    print(f"packing, cap 24: record #89's loader on 2 processes x 4 micro batches reads its 8-process forwards "
          f"up to forward {differ} of {len(eight)} (a shard's end)")
    plan, Z, steps = f"1/2 cap=24; 1/2 t={2 * T} z={16 * T} cap=100", 8 * T, 12  # within the reference's files
    reference = np.concatenate(record89_rows(pattern, T, 24, sends={steps // 2: (16 * T, 100, 1)})[0])
    for B, world in [(1, 1), (1, 2), (2, 4)]:
        what = f"packing, --stages {plan!r}, T {T}, z {Z}, B {B} x {world} process(es), {steps} steps"
        port = port_stage_rows(pattern, B, world, False, 0, plan, T, Z, steps)[0]
        out = f"{scratch}/dump_stages.bin"
        _, result = run_cpp(what, ["build/test_dataloader", "--dump-stages", out, pattern, str(B), str(world), "0",
                                   "0", plan, str(T), str(Z), str(steps)])
        if result is not None:
            cpp = np.fromfile(out, np.int32) if result.returncode == 0 else np.zeros(0, np.int32)
            print(f"{what}: C++ and train_gpt2.py\t{'same' if cpp.shape == port.shape and (cpp == port).all() else 'differ'}")
        print(f"{what}: train_gpt2.py and record #89's loader, the stage sent at step {steps // 2}\t"
              f"{'same' if len(reference) >= len(port) and (reference[:len(port)] == port).all() else 'differ'}")


def reference_rows(pattern, B, T, grad_accum, world, **edits):
    """The reference's sequences over world*B processes of one row each (rank r's row b is the
    reference's rank r*B + b), in stream order, until it stops; and how it stopped. `edits`: the
    bench's (distributed_data_generator's keywords)."""
    files = sorted(glob.glob(pattern))
    size = world * B
    generators = [distributed_data_generator(files, T, grad_accum, r, size, **edits) for r in range(size)]
    rows = []
    try:
        while True:
            step = [next(g) for g in generators]
            if any(len(row) != T + 1 for row in step):  # a sequence past the shard's end
                return np.array(rows).reshape(-1, T + 1), "past the shard's end"
            rows += step
    except AssertionError:
        stop = "assert"
    except IndexError:
        stop = "no document start"
    except RuntimeError:  # StopIteration raised inside the generator: no more files
        stop = "files ended"
    return np.array(rows).reshape(-1, T + 1), stop


def compare(what, got, expected):
    if got.shape == expected.shape and (got == expected).all():
        print(f"{what}\tsame")
        return
    rows = min(len(got), len(expected))
    differ = [i for i in range(rows) if not (got[i] == expected[i]).all()]
    print(f"{what}\t{len(got)} and {len(expected)} sequences, first difference at "
          f"{differ[0] if differ else rows}")


BENCH_SEARCH_FACTOR = 16  # dev/bench_quality.py's REFERENCE_SEARCH_FACTOR (its reference_edits)


def check_bench_edit(patterns, layouts, T):
    """dev/bench_quality.py's copy of the reference searches 16 x a step's tokens each micro step: it
    reads train_gpt2.py's sequences for as long as it runs, past the windows where the reference
    stops. The bench's earlier edit, a window of 16 x, moved the switch to the next shard too."""
    expected_stop = {"short": "files ended", "long": "assert", "bare": "no document start",
                     "exact": "files ended", "tight": "files ended"}
    for name, pattern in patterns.items():
        for B, grad_accum, world in layouts:
            setting = f"{name}: T={T} B={B} x {grad_accum} micro batches x {world} processes"
            port = port_rows(pattern, B, T, grad_accum, world, False, 0, epochs=1)[0]
            edited, stop = reference_rows(pattern, B, T, grad_accum, world, search_factor=BENCH_SEARCH_FACTOR)
            compare(f"{setting}: train_gpt2.py and the bench's copy of the reference up to its end ({stop})",
                    port if stop == "files ended" else port[:len(edited)], edited)
            print(f"{setting}: how the bench's copy stops\t"
                  f"{'same' if stop == expected_stop[name] else stop + ', not ' + expected_stop[name]}")
    B, grad_accum, world = layouts[0]
    wide = reference_rows(patterns["long"], B, T, grad_accum, world, window_factor=16)[0]
    port = port_rows(patterns["long"], B, T, grad_accum, world, False, 0, epochs=1)[0]
    first = next((i for i in range(min(len(wide), len(port))) if not (wide[i] == port[i]).all()), None)
    second_shard = load_shard(patterns["long"].replace("*", "001"))
    moved = first is not None and (wide[first] == second_shard[:T + 1]).all()
    print(f"long: T={T}, a window of 16 x: the next shard begins earlier than train_gpt2.py's, so the "
          f"sequences differ from there\t{'same' if moved else f'first difference at {first}'}")


def main(scratch):
    rng = np.random.default_rng(43)
    T = 64

    def short_lengths(n):  # one token to T: a fifth of one token, some of exactly T
        return [1 if u < 0.2 else T if u > 0.9 else int(rng.integers(2, T)) for u in rng.random(n)]

    datasets = {
        # documents of 1..T tokens; the second shard begins 7 tokens before its first document
        "short": [documents(rng, short_lengths(150)), documents(rng, short_lengths(120), prefix=7),
                  documents(rng, short_lengths(170))],
        # some documents of 20T to 40T tokens, longer than a window of 16T; the last shard is one
        # document
        "long": [documents(rng, [int(rng.integers(20 * T, 40 * T)) if rng.random() < 0.05 else
                                 int(rng.integers(1, 2 * T)) for _ in range(300)]),
                 documents(rng, short_lengths(200) + [30 * T] + short_lengths(100)),
                 documents(rng, [50 * T])],
        # a shard without a document start
        "bare": [documents(rng, short_lengths(160)), rng.integers(0, 50256, 40 * T).astype(np.uint16),
                 documents(rng, short_lengths(160))],
        # 32 documents of T and one of 1: a step starts where its window and one token more end
        # exactly at the shard's end (2 steps in with 8 sequences a step, 6 with 4), so the next
        # shard begins; with a last document of 2, one token before it, so it does not
        "exact": [documents(rng, [T] * 32 + [1]), documents(rng, [T] * 32 + [2]),
                  documents(rng, short_lengths(150))],
        # 7 documents of 120 tokens and one of 300: with 8 sequences a step the eighth does not
        # end within the step's window of 1024 tokens (but would within 1024 from where it
        # starts), so the reference stops after the sequences of the micro steps before it
        "tight": [documents(rng, [120] * 7 + [300] + short_lengths(100))],
    }
    patterns = {name: write_dataset(scratch, name, shards) for name, shards in datasets.items()}
    expected_stop = {"short": "files ended", "long": "assert", "bare": "no document start",
                     "exact": "files ended", "tight": "assert"}
    # (dataset, B, grad_accum, world): how many sequences the reference reads before it stops
    expected_count = {("tight", 1, 8, 1): 7, ("tight", 1, 2, 4): 4, ("tight", 1, 1, 8): 0,
                      ("tight", 2, 2, 2): 4, ("tight", 4, 1, 1): 4}
    # (B, grad_accum, world): 8 sequences a step, and 4 with B=4
    layouts = [(1, 8, 1), (1, 2, 4), (1, 1, 8), (2, 2, 2), (4, 1, 1)]
    for name, pattern in patterns.items():
        for B, grad_accum, world in layouts:
            setting = f"{name}: T={T} B={B} x {grad_accum} micro batches x {world} processes"
            for shuffle in (False, True):
                port, steps = port_rows(pattern, B, T, grad_accum, world, shuffle, 1337, epochs=2)
                cpp = cpp_rows(scratch, pattern, B, T, grad_accum, world, shuffle, 1337, steps)
                compare(f"{setting}{', shuffled' if shuffle else ''}: C++ and train_gpt2.py, "
                        f"{steps} steps over 2 epochs", cpp, port)
            reference, stop = reference_rows(pattern, B, T, grad_accum, world)
            # The first epoch; all of it when the reference read all its files, else as far as it read.
            port = port_rows(pattern, B, T, grad_accum, world, False, 0, epochs=1)[0]
            compare(f"{setting}: train_gpt2.py and the reference up to its end ({stop})",
                    port if stop == "files ended" else port[:len(reference)], reference)
            print(f"{setting}: how the reference stops\t"
                  f"{'same' if stop == expected_stop[name] else stop + ', not ' + expected_stop[name]}")
            count = expected_count.get((name, B, grad_accum, world))
            if count is None:
                print(f"{setting}: the reference read {len(reference)} sequences before it stopped ({stop})")
            else:
                print(f"{setting}: the reference reads {count} sequences before its window runs out\t"
                      f"{'same' if len(reference) == count else len(reference)}")
    check_bench_edit(patterns, layouts, T)
    check_plan_dumps(scratch)
    check_rate_dumps()
    check_loss_dumps()
    check_stage_rows(scratch, patterns["short"], T)
    check_packing(scratch, rng)

    # modded-nanogpt's own setting: T = 48K, 8 processes of one micro batch, a window of 786,432
    # tokens; a 663,000-token document after 16 of T tokens (the third step starts at it).
    T = 48 * 1024
    lengths = [T] * 16 + [663000] + [int(n) for n in rng.integers(1, 30000, 100)]
    pattern = write_dataset(scratch, "long_document", [documents(rng, lengths)])
    setting = "a 663,000-token document, T=48K over 8 processes"
    port, steps = port_rows(pattern, 1, T, 1, 8, False, 0, epochs=2)
    compare(f"{setting}: C++ and train_gpt2.py, {steps} steps over 2 epochs",
            cpp_rows(scratch, pattern, 1, T, 1, 8, False, 0, steps), port)
    reference, stop = reference_rows(pattern, 1, T, 1, 8)
    compare(f"{setting}: train_gpt2.py and the reference up to its end ({stop})", port[:len(reference)],
            reference)
    print(f"{setting}: the reference stops at the document\t"
          f"{'same' if stop == 'assert' and len(reference) == 16 else f'{stop} after {len(reference)}'}")
    edited, stop = reference_rows(pattern, 1, T, 1, 8, search_factor=BENCH_SEARCH_FACTOR)
    compare(f"{setting}: train_gpt2.py and the bench's copy of the reference up to its end ({stop})",
            port[:len(edited)], edited)
    print(f"{setting}: the bench's copy reads on past the document\t"
          f"{'same' if len(edited) > 17 else f'{stop} after {len(edited)}'}")
    tokens = load_shard(pattern.replace("*", "000"))
    start, after = 16 * T, 16 * T + 663000
    as_expected = ((port[16] == tokens[start:start + T + 1]).all() and
                   (port[17] == tokens[after:after + T + 1]).all())
    print(f"{setting}: sequence 16 is the document's first T+1 tokens, 17 starts after it\t"
          f"{'same' if as_expected else 'differs'}")


    # A shard one token short of a step's window and 2 more: 2 x 4 x 1 x 8 x 2 + 2 = 130 tokens.
    pattern = write_dataset(scratch, "too_short", [documents(rng, [60, 69])])
    try:
        tg.DocumentLoader(pattern, "--input_bin", 1, 8, 4, 0, 2, False, 0, 50257)
        message = "no error"
    except SystemExit as e:
        message = str(e)
    named = message.startswith(f"error: {pattern.replace('*', '000')}: 129 tokens are too few")
    print(f"a shard of 129 tokens for a step of 2 x 4 x 1 x 8 tokens fails naming it\t"
          f"{'same' if named and 'needs at least 130' in message else message}")


if __name__ == "__main__":
    main(sys.argv[1])
