"""Validation loss against training time: train_gpt2cu with the modern recipe, the PyTorch reference
(train_gpt2.py) with the same recipe and data order, and train_gpt2cu with GPT-2's recipe, one after
the other on one GPU, on the same token shards; train_gpt2cu's speedrun recipe against the script
it follows, modded-nanogpt's record #28 (its train_gpt.py, given by --reference_script); and its
record89 recipe against record #89's script (the folder of its files, given by --reference89).

    python3 dev/bench_quality.py OUTDIR --train 'DIR/python_train_*.bin' --val 'DIR/python_val_*.bin'
                                 [--steps 600] [--batch_tokens 131072] [--micro_batch 64] [--seq_len 1024]
                                 [--val_every 50] [--val_batches 20] [--gpt2_lr 6e-4] [--gpt2_warmup 60]
                                 [--peer_micro_batch B] [--same_tokens] [--target_run ours_gpt2]
                                 [--speedrun_val_seq_len 262144] [--speedrun_val_tokens 10485760]
                                 [--reference_script PATH] [--reference89 DIR] [--tokenizer FILE]
                                 [--reference89_profile_steps S,S,...] [--speedrun_repeats 1]
                                 [--reference_repeats R]
                                 [--shared_init [--init_seed S]] [--dry_run]
                                 [--runs ours_modern,peer_modern,ours_gpt2[,ours_speedrun,ref_speedrun,peer_speedrun]
                                         [,ours_record89,ref_record89]]

Every run is d12 on the same shards, validated every --val_every steps and at the last. ours_modern,
peer_modern and ours_gpt2 take --steps steps of --batch_tokens tokens and validate on --val_batches
batches. The speedrun runs take --steps steps of record #28's 393,216 tokens (8 document-aligned
sequences of 49,152; the recipe sets its batch, ours gets no -b/-t/-z) and validate on
--speedrun_val_tokens tokens: ours in sequences of --speedrun_val_seq_len (-vt), the reference in its
own 262,144. --same_tokens gives the other runs the speedrun's token budget: --steps and --val_every
times 393,216 / --batch_tokens (which must come out whole: 3 at 131,072), so every run trains on
--steps x 393,216 tokens and validates at the same token counts; and the speedrun's validation
tokens: --speedrun_val_tokens / (micro batch x --seq_len) batches in place of --val_batches (160 at
the defaults), the same first tokens of the validation shards, so that every run's losses are over
the same text.

ref_speedrun runs a copy of --reference_script in OUTDIR/ref_speedrun/train_gpt.py (torchrun, one
process, from that folder; its log in logs/final/ there and its output in output.log) with these
edits only, each of an exact line of record #28 that must be there once (else the bench stops naming
it): train_files and val_files to --train and --val (absolute), num_iterations to --steps,
val_loss_every to --val_every, val_tokens to --speedrun_val_tokens, and the document-aligned loader's
search to 16 x its step's tokens ahead: the reference searches what is left of its step's window
(2 x its step's tokens) and stops (assert False) when that holds no document start with a
sequence's length after it, as a long source file does. The window still decides when the next
shard begins, so the copy reads ours' sequences (ours searches to the shard's end;
dev/test/documents_reference.py); a wider window would begin the next shard earlier, and the data
would differ from there. A search to the shard's end would scan up to 100M tokens on the host at
every micro step.

--speedrun_repeats K makes each of the speedrun pair K times: ours with seeds 42, 43, ... (-S; the
k-th's output in OUTDIR/ours_speedrun_k.log and its folder, the first's as without repeats), the
reference K times from its one copy (it sets no seed: each run draws its own; output_k.log);
--reference_repeats R makes the references R times instead (not with --shared_init), where the
sides' finished runs differ in number. One
run a side cannot tell a real difference from the seed's: at step 100 of 300 ours' validation loss
moved by 3.7% between seeds (dev/notes/speedrun-pairs.md). The comparison then takes each side's
mean, and reports each side's spread and, with two runs a side or more, the standard error of the
difference of the means and about how many runs a side would make it half the 1% tolerance. Such
runs cost less with --stop_after S: each run of the pair stops after its validation at step S (its
schedule still that of --steps), and finished runs of the same OUTDIR are read up to step S.

ours_record89 and ref_record89 are record #89's pair: train_gpt2cu -recipe record89 (the recipe's 1,285
steps in their stages, validation every 250 steps in sequences of 262,144; --tokenizer its -tk), and
record #89's script made to run offline by dev/reference89_offline.py in OUTDIR/ref_record89/kit (its
shards linked as many times over as it reads them; its output in OUTDIR/ref_record89/output.log), both
on --speedrun_val_tokens validation tokens, the pair made --speedrun_repeats times and stopped at
--stop_after (a multiple of 250) as record #28's; no --shared_init. Their rows give tokens/s as a
run's tokens up to its last validation over its training time, the steps growing by stage, and a table
of their own gives each run's median ms a step in each stage. With --reference89_profile_steps the kit
records those steps of the script under torch.profiler, a kernel table each in
OUTDIR/ref_record89/kit/logs/ (where its time goes, per kind and per kernel); each such step takes
longer, and the script's clock with it (a few steps of 1,285; the stages' medians do not move).

peer_speedrun is train_gpt2.py --recipe speedrun, the PyTorch port of ours' model, loader and
optimizers with the script's numerics (FP32 gradients, weights cast to BF16; compiled, FlexAttention,
the FP8 head), on the same shards, steps and validation tokens (in sequences of --speedrun_val_seq_len):
a third side of the speedrun, which tells a difference in what ours computes (the port then sides
with ours) from one in how it computes it (the port then sides with the script). Its k-th run has
seed 42 + k - 1, whose init is the one ours draws with -S; the report compares it with the
reference as it compares ours.

--shared_init pairs the k-th runs of the two sides: both start from the same weights, the seeded
init of train_gpt2.py (seed 42 + k - 1, the init ours draws with -S; every pair --init_seed's with
it) rounded to BF16, written by the bench as OUTDIR/init_seedS.bin (ours' -e, a BF16 checkpoint) and
OUTDIR/ref_speedrun/init_seedS.pt (the reference's parameter names and shapes,
reference_init_tensors). Ours keeps its seed 42 + k - 1 (-S), which then moves only its stochastic
rounding, so --init_seed measures each side's spread from one init: its numerics' alone. The
reference's copy then has one edit more: after its own init it copies every parameter from the file
in $SPEEDRUN_INIT, asserting that each name and shape is there and nothing is left over. The two
sides then differ only in their numerics and code, not in their draw of weights, and the comparison
takes each pair's relative difference: its mean and the standard error from the pairs' own spread,
which the seeds' spread (each side's runs apart) no longer widens. peer_speedrun's k-th run then
starts from ours' file of the pair (--init_from).

The training time of a step is its step line's ms (ours; validation, start-up and the first step,
which compiles or tunes, are not counted), summed up to each validation; the reference's is its own
train_time (its compile and warm-up steps and its validation are not counted). Prints one table
(steps, final validation loss, ms per step, tokens/s, training time, and the time each run needs to
reach the final validation loss of --target_run, interpolated between validations), and with the
reference its comparison with ours and with the port, each that runs (ms/step, the validation losses
at each step, the time each needs to reach the reference's final loss); writes them to
OUTDIR/quality.md with the curves in OUTDIR/quality.png. Each run's output is kept in OUTDIR, and a
run whose output there reached its last step is read again instead of run (so the runs can be
spread over several invocations with the same OUTDIR; the output's first line names its command,
and one of another command stops the bench, so give each set of options its own OUTDIR). Benches may
share an OUTDIR at the same time when they make different runs (the reference on one GPU, ours on
another): each holds, while it lives, a lock on every run it is to make (its log's name + .lock), and
one that finds a run's lock held stops at once with one line naming it, before it writes anything,
so that the running bench's log stays whole. --dry_run prints the commands and writes the
reference's copy, and runs nothing.

Where nvidia-smi is on the PATH, each run's GPU is sampled while it runs (utilization, SM clock,
power, whether the software power cap holds the clock down) into its log's name + .gpu.csv, and
the table gives the samples in which the GPU was busy: their mean SM clock, mean power and the
share under the power cap. A step's time depends on them: under sustained load an H200 runs at
its 700 W cap, its SM clock well under the 1,980 MHz it boosts to (dev/notes/speedrun-pairs.md),
and machines of one kind differ in it.
"""
import argparse
import contextlib
import fcntl
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
from fractions import Fraction

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pylib"))
import pydeps  # noqa: E402
import script_edits  # noqa: E402

pydeps.require("matplotlib")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RUNS = ("ours_modern", "peer_modern", "ours_gpt2", "ours_speedrun", "ref_speedrun", "peer_speedrun",
        "ours_record89", "ref_record89")
DEFAULT_RUNS = ("ours_modern", "peer_modern", "ours_gpt2")
SPEEDRUN_RUNS = ("ours_speedrun", "ref_speedrun", "peer_speedrun")
RECORD89_RUNS = ("ours_record89", "ref_record89")
PAIR_RUNS = SPEEDRUN_RUNS + RECORD89_RUNS  # made --speedrun_repeats times, stopped at --stop_after
REFERENCE_RUNS = ("ref_speedrun", "ref_record89")  # the records' scripts: their own output lines
SEEDED_RUNS = ("ours_speedrun", "peer_speedrun", "ours_record89")  # the k-th repeat's seed is 42 + k - 1
# The side each run is compared with (report): the reference script of its recipe.
COMPARED_WITH = {"ours_speedrun": "ref_speedrun", "peer_speedrun": "ref_speedrun", "ours_record89": "ref_record89"}
LABELS = {"ours_modern": "train_gpt2cu, modern recipe", "peer_modern": "PyTorch, modern recipe",
          "ours_gpt2": "train_gpt2cu, GPT-2 recipe", "ours_speedrun": "train_gpt2cu, speedrun recipe",
          "ref_speedrun": "record #28's train_gpt.py", "peer_speedrun": "PyTorch, speedrun recipe",
          "ours_record89": "train_gpt2cu, record89 recipe", "ref_record89": "record #89's train_gpt.py"}
# Record #89's schedule (its TRAINING_STAGES; -recipe record89's): steps and tokens a step of each stage,
# the extension's 15 steps at the last stage's tokens; a validation every 250 steps and at the last, in
# sequences of 262,144 tokens on both sides.
RECORD89_STAGES = ((423, 131072), (424, 262144), (438, 393216))
RECORD89_STEPS = sum(steps for steps, _ in RECORD89_STAGES)
RECORD89_VAL_EVERY = 250
RECORD89_VAL_SEQ_LEN = 262144
RECORD89_KIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference89_offline.py")
SPEEDRUN_STEP_TOKENS = 8 * 49152      # record #28's step: 8 document-aligned sequences of 49,152
REFERENCE_VAL_SEQ_LEN = 4 * 64 * 1024  # the reference validates on contiguous sequences of this
REFERENCE_SEARCH_FACTOR = 16  # the copy's loader searches this many times a step's tokens ahead
SPEED_TARGET = 1.4                     # ours at least this much faster than the reference
LOSS_TOLERANCE = 0.01                  # validation losses within 1% of the reference's
STEP_LINE = re.compile(r"^step\s+(\d+)/\d+ \| loss [-0-9.naif]+ .*?\| ([0-9.]+) ms")
VAL_LINE = re.compile(r"^step\s+(\d+)/\d+ \|.*val loss ([0-9.]+)")
# The reference's lines: "step:126/1695 train_time:99900ms step_avg:792.86ms" after each step, and
# "step:125/1695 val_loss:4.1234 train_time:99123ms step_avg:792.98ms" at each validation.
REF_STEP_LINE = re.compile(r"^step:(\d+)/\d+ train_time:(\d+)ms")
REF_VAL_LINE = re.compile(r"^step:(\d+)/\d+ val_loss:([0-9.]+|nan) train_time:(\d+)ms")
COMMAND_MARK = "# bench_quality command: "  # the first line of each run's log
SPEEDRUN_SEED = 42                          # ours' speedrun seed (train_gpt2cu's default), then +1 a repeat
GPU_QUERY = "utilization.gpu,clocks.sm,power.draw,clocks_throttle_reasons.active"  # nvidia-smi's fields
GPU_SAMPLE_MS = 500
GPU_BUSY_PERCENT = 90                       # samples at this utilization or above count
SW_POWER_CAP = 0x4                          # the software power cap's bit in the clock reasons


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def step_tokens(name, args):
    return SPEEDRUN_STEP_TOKENS if name in SPEEDRUN_RUNS else args.batch_tokens


def record89_tokens(steps):
    """The tokens of record #89's first `steps` steps."""
    tokens = 0
    for stage_steps, stage_tokens in RECORD89_STAGES:
        tokens += min(steps, stage_steps) * stage_tokens
        steps -= min(steps, stage_steps)
    return tokens


def tokens_per_second(name, args, curve, ms):
    """A run's tokens/s: a step's tokens over its median ms; record #89's (whose steps grow by stage) its
    tokens up to its last validation over its training time."""
    if name in RECORD89_RUNS:
        return record89_tokens(curve[-1][0]) / curve[-1][1]
    return step_tokens(name, args) / (median_step_ms(ms) / 1000)


def token_scale(name, args):
    """How many of the run's steps cover one speedrun step's tokens under --same_tokens; else 1."""
    if name in PAIR_RUNS or not args.same_tokens:
        return Fraction(1)
    return Fraction(SPEEDRUN_STEP_TOKENS, args.batch_tokens)


def run_steps(name, args):
    return RECORD89_STEPS if name in RECORD89_RUNS else int(args.steps * token_scale(name, args))


def run_val_every(name, args):
    return RECORD89_VAL_EVERY if name in RECORD89_RUNS else int(args.val_every * token_scale(name, args))


def run_micro_batch(name, args):
    return args.peer_micro_batch or args.micro_batch if name == "peer_modern" else args.micro_batch


def run_val_batches(name, args):
    """The batches a run at --batch_tokens validates on: --val_batches, or under --same_tokens the
    speedrun's validation tokens, so that every run's loss is over the same tokens."""
    if not args.same_tokens:
        return args.val_batches
    return args.speedrun_val_tokens // (run_micro_batch(name, args) * args.seq_len)


def run_last_step(name, args):
    """The step after whose validation a run ends: --stop_after, or its last step."""
    return args.stop_after or run_steps(name, args)


def validation_step(name, line):
    """The step of a validation line of run `name`'s output, or None."""
    match = (REF_VAL_LINE if name in REFERENCE_RUNS else VAL_LINE).match(line)
    return int(match.group(1)) if match else None


def output_through(name, text, step):
    """The run's output up to and including its validation at `step` (all of it if there is none)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if validation_step(name, line) == step:
            return "".join(lines[:i + 1])
    return text


def run_repeats(name, args):
    """How many times a run is made: --reference_repeats for the records' scripts, --speedrun_repeats for
    the pairs' other runs, else once."""
    if name in REFERENCE_RUNS and args.reference_repeats:
        return args.reference_repeats
    return args.speedrun_repeats if name in PAIR_RUNS else 1


def repeat_suffix(repeat):
    return "" if repeat == 1 else f"_{repeat}"


def run_log(name, args, repeat=1):
    """Where a run's output goes: OUTDIR/NAME.log (NAME_k.log for its k-th repeat), a reference's in
    OUTDIR/NAME (output.log, output_k.log)."""
    if name in REFERENCE_RUNS:
        return os.path.join(args.outdir, name, f"output{repeat_suffix(repeat)}.log")
    return os.path.join(args.outdir, f"{name}{repeat_suffix(repeat)}.log")


def run_label(name, args, repeat):
    """A run's name in the report: ours' and the port's repeats by their seed, the reference's by their
    number."""
    if run_repeats(name, args) == 1:
        return LABELS[name]
    return LABELS[name] + (f" (seed {SPEEDRUN_SEED + repeat - 1})" if name in SEEDED_RUNS
                           else f" (run {repeat})")


def run_command(name, args, repeat=1):
    """The command line of one run; its output directory is OUTDIR/name (name_k for ours' k-th
    repeat of the speedrun, which trains with seed 42 + k - 1: the reference sets no seed)."""
    common_ours = ["-e", "d12", "-i", args.train, "-j", args.val, "-b", str(args.micro_batch),
                   "-t", str(args.seq_len), "-z", str(args.batch_tokens), "-x", str(run_steps(name, args)),
                   "-v", str(run_val_every(name, args)), "-m", str(run_val_batches(name, args)), "-s", "0",
                   "-o", os.path.join(args.outdir, name)]
    if name == "ours_modern":
        return ["./train_gpt2cu", "-recipe", "modern"] + common_ours
    if name == "ours_gpt2":
        return ["./train_gpt2cu", "-recipe", "gpt2", "-l", str(args.gpt2_lr), "-u", str(args.gpt2_warmup)] + common_ours
    if name == "ours_speedrun":
        seed = ["-S", str(SPEEDRUN_SEED + repeat - 1)] if repeat > 1 else []
        model = shared_init_paths(args, repeat)[0] if args.shared_init else "d12"
        return ["./train_gpt2cu", "-recipe", "speedrun", "-e", model, "-i", args.train, "-j", args.val,
                "-x", str(args.steps), "-v", str(args.val_every),
                "-m", str(args.speedrun_val_tokens // args.speedrun_val_seq_len),
                "-vt", str(args.speedrun_val_seq_len), "-s", "0"] + seed + \
               ["-o", os.path.join(args.outdir, name + repeat_suffix(repeat))]
    if name == "ours_record89":
        seed = ["-S", str(SPEEDRUN_SEED + repeat - 1)] if repeat > 1 else []
        return ["./train_gpt2cu", "-recipe", "record89", "-i", args.train, "-j", args.val, "-tk", args.tokenizer,
                "-m", str(args.speedrun_val_tokens // RECORD89_VAL_SEQ_LEN), "-s", "0"] + seed + \
               ["-o", os.path.join(args.outdir, name + repeat_suffix(repeat))]
    if name == "ref_speedrun":
        return reference_command(args)
    if name == "ref_record89":
        return ["bash", "run.sh"]
    if name == "peer_speedrun":
        return peer_speedrun_command(args, repeat)
    return peer_command(args)


def peer_command(args):
    """The command line of peer_modern, the PyTorch run: the modern recipe on the same data, batch and
    validation."""
    return [args.python, "train_gpt2.py", "--recipe", "modern", "--model", "d12", "--input_bin", args.train,
            "--input_val_bin", args.val, "-b", str(run_micro_batch("peer_modern", args)), "-t", str(args.seq_len),
            "--total_batch_size", str(args.batch_tokens), "--num_iterations", str(run_steps("peer_modern", args)),
            "--val_every", str(run_val_every("peer_modern", args)),
            "--val_steps", str(run_val_batches("peer_modern", args)),
            "--compile", "1", "--dtype", "bfloat16",
            "--output_dir", os.path.join(args.outdir, "peer_modern")]


def peer_speedrun_command(args, repeat):
    """The command line of peer_speedrun's k-th run: train_gpt2.py's speedrun recipe compiled, in
    BF16 with the FP8 head, as the speedrun pair runs (steps, validation), its init that of seed
    42 + k - 1 or --shared_init's file of the pair."""
    seed = str(SPEEDRUN_SEED + repeat - 1)
    model = ["--init_from", shared_init_paths(args, repeat)[0]] if args.shared_init else ["--model", "d12"]
    return [args.python, "train_gpt2.py", "--recipe", "speedrun"] + model + [
        "--seed", seed, "--input_bin", args.train, "--input_val_bin", args.val,
        "--num_iterations", str(args.steps), "--val_every", str(args.val_every),
        "--val_steps", str(args.speedrun_val_tokens // args.speedrun_val_seq_len),
        "--val_seq_len", str(args.speedrun_val_seq_len), "--dtype", "bfloat16", "--fp8_head", "1", "--flash", "1",
        "--compile", "1", "--output_dir", os.path.join(args.outdir, "peer_speedrun" + repeat_suffix(repeat))]


def reference_command(args):
    """torchrun with one process, run from OUTDIR/ref_speedrun: the torchrun beside --python, else that
    python's torch.distributed.run (the same program)."""
    python = os.path.abspath(args.python) if os.sep in args.python else args.python  # it runs elsewhere
    torchrun = os.path.join(os.path.dirname(python), "torchrun")
    if os.sep in python and os.access(torchrun, os.X_OK):
        launcher = [torchrun]
    else:
        launcher = [python, "-m", "torch.distributed.run"]
    return launcher + ["--standalone", "--nproc_per_node=1", "train_gpt.py"]


# --shared_init: after the reference's own init (and its broadcast from rank 0), every parameter
# is copied from the file that $SPEEDRUN_INIT names, by name, its shape asserted.
REFERENCE_BROADCAST = "    dist.broadcast(param.detach(), 0)"
REFERENCE_SHARED_INIT = REFERENCE_BROADCAST + """
shared_init = torch.load(os.environ["SPEEDRUN_INIT"])  # bench_quality.py --shared_init
with torch.no_grad():
    for name, param in model.named_parameters():
        init = shared_init.pop(name)
        assert init.shape == param.shape, f"{name}: initial {tuple(init.shape)}, parameter {tuple(param.shape)}"
        param.copy_(init)
assert not shared_init, f"initial tensors of no parameter: {sorted(shared_init)}\""""


def shared_init_seed(args, repeat):
    """--shared_init: the seed of the k-th pair's initial weights."""
    return args.init_seed if args.init_seed is not None else SPEEDRUN_SEED + repeat - 1


def shared_init_paths(args, repeat):
    """--shared_init: the k-th pair's initial weights, ours' (a BF16 checkpoint) and the reference's."""
    seed = shared_init_seed(args, repeat)
    return (os.path.join(args.outdir, f"init_seed{seed}.bin"),
            os.path.join(args.outdir, "ref_speedrun", f"init_seed{seed}.pt"))


def reference_init_tensors(model):
    """{name: BF16 tensor} of record #28's GPT (one process) holding the values of train_gpt2.py's
    speedrun model, each rounded to BF16 as its BF16 checkpoint rounds it: embed and value_embeds.k
    (wte, ve.k); per layer with attention blocks.i.attn.qkvo_w [4, C, C] (q, k, v from c_attn's
    [3C, C], then the output projection) and attn.dampen.weight (the gate); per layer
    blocks.i.mlp.c_fc [C, 4C] (fc's weight transposed: the reference applies c_fc.T) and
    blocks.i.mlp.c_proj [C, 4C]; lm_head.weight; and scalars [5 L]: L skip weights (ours' L/2, then
    ones: the reference reads only the first L/2), each layer's lambdas, each layer's value scales
    (0.5, 0.5 in the layer without attention, which reads none)."""
    import torch  # only --shared_init needs it: the bench's python may lack it (--python)
    config, t = model.config, model.transformer
    L, C = config.num_layers, config.channels
    tensors = {"embed.weight": t.wte.weight, "lm_head.weight": model.lm_head.weight}
    for k, table in enumerate(t.ve):
        tensors[f"value_embeds.{k}.weight"] = table.weight
    value_scales = []
    for i, block in enumerate(t.h):
        if block.attn is not None:
            qkv = block.attn.c_attn.weight.view(3, C, C)
            tensors[f"blocks.{i}.attn.qkvo_w"] = torch.cat([qkv, block.attn.c_proj.weight[None]])
            tensors[f"blocks.{i}.attn.dampen.weight"] = block.attn.gate.weight
            value_scales.append(block.attn.value_scales)
        else:
            value_scales.append(torch.full((2,), 0.5))
        tensors[f"blocks.{i}.mlp.c_fc"] = block.mlp.c_fc.weight.t()
        tensors[f"blocks.{i}.mlp.c_proj"] = block.mlp.c_proj.weight
    skips = torch.cat([model.skip_weights, torch.ones(L - model.skip_weights.numel())])
    tensors["scalars"] = torch.cat([skips] + [block.lambdas for block in t.h] + value_scales)
    return {name: tensor.detach().to(torch.bfloat16).contiguous() for name, tensor in tensors.items()}


def write_shared_init(args, repeat):
    """Writes the k-th pair's initial weights (shared_init_paths) where they are not there yet."""
    ours, reference = shared_init_paths(args, repeat)
    if os.path.exists(ours) and os.path.exists(reference):
        return
    import torch
    import train_gpt2 as tg
    seed = shared_init_seed(args, repeat)
    config = tg.make_config(*tg.SPEEDRUN_PRESETS["d12"], source="d12", arch="speedrun")
    model = tg.GPT(config)
    tg.init_weights(model, seed)
    tg.write_checkpoint(model, ours, tg.CHECKPOINT_BF16)
    torch.save(reference_init_tensors(model), reference + ".partial")
    os.replace(reference + ".partial", reference)
    print(f"=== shared init: train_gpt2.py's seed {seed} in {ours} and {reference}", flush=True)


def reference_edits(args):
    """(record #28's text, the bench's) for each edit of the reference's copy."""
    search = "find_batch_starts(tokens, pos, seq_len, {})"
    wider_search = f"{REFERENCE_SEARCH_FACTOR} * grad_accum_steps * batch_size"
    shared_init = [(REFERENCE_BROADCAST, REFERENCE_SHARED_INIT)] if args.shared_init else []
    return shared_init + [
        ('train_files = "data/fineweb10B/fineweb_train_*.bin"', f"train_files = {os.path.abspath(args.train)!r}"),
        ('val_files = "data/fineweb10B/fineweb_val_*.bin"', f"val_files = {os.path.abspath(args.val)!r}"),
        ("num_iterations = 1695", f"num_iterations = {args.steps}"),
        ("val_loss_every = 125", f"val_loss_every = {args.val_every}"),
        ("val_tokens = 10485760", f"val_tokens = {args.speedrun_val_tokens}"),
        (search.format("token_window"), search.format(wider_search)),
    ]


def edit_reference(source, edits, path):
    """source with each edit made; stops naming the first expected text that is not there exactly once."""
    try:
        return script_edits.edit_script(source, edits, f"--reference_script {path}", "record #28's train_gpt.py")
    except script_edits.ScriptEditError as e:
        fail(str(e))


def prepare_reference(args):
    """Writes the edited copy of the reference into OUTDIR/ref_speedrun, with its log folder."""
    if not args.reference_script:
        fail("ref_speedrun needs --reference_script PATH (record #28's train_gpt.py, the code at the top of "
             "its logs in modded-nanogpt's records/track_1_short/2025-08-23_SparseAttnGate/)")
    try:
        source = open(args.reference_script).read()
    except OSError as e:
        fail(f"--reference_script {args.reference_script}: {e.strerror}")
    edited = edit_reference(source, reference_edits(args), args.reference_script)
    try:  # a whole log given instead of the code at its top parses no further than the code
        compile(edited, args.reference_script, "exec")
    except SyntaxError as e:
        fail(f"--reference_script {args.reference_script}: not Python after the edits (line {e.lineno}: {e.msg}); "
             "give only the code at the top of the log")
    folder = os.path.join(args.outdir, "ref_speedrun")
    os.makedirs(os.path.join(folder, "logs", "final"), exist_ok=True)
    with open(os.path.join(folder, "train_gpt.py"), "w") as f:
        f.write(edited)


def record89_kit(args):
    """The folder of record #89's script made to run offline (dev/reference89_offline.py), in which
    ref_record89 runs."""
    return os.path.join(args.outdir, "ref_record89", "kit")


def record89_kit_command(args):
    """dev/reference89_offline.py's command that writes record89_kit: --reference89's script on the
    shards (their passes as many as it reads), on --speedrun_val_tokens validation tokens, run by
    --python; with --reference89_profile_steps those steps under torch.profiler (--profile_steps)."""
    profile = ["--profile_steps", args.reference89_profile_steps] if args.reference89_profile_steps else []
    return [sys.executable, RECORD89_KIT, record89_kit(args), "--reference", args.reference89, "--train", args.train,
            "--val", args.val, "--passes", "auto", "--val_tokens", str(args.speedrun_val_tokens),
            "--python", args.python] + profile


def prepare_record89_kit(args):
    """Writes record89_kit and, beside it, the kit's command (kit_command.txt), unless an earlier bench of
    this OUTDIR wrote them with the same command; stops with the kit's error, or where the kit there is
    another command's (other shards or reference), which the reference would otherwise run."""
    command = record89_kit_command(args)
    text = shlex.join(command[1:])  # the kit's arguments, whichever python runs it
    recorded = os.path.join(os.path.dirname(record89_kit(args)), "kit_command.txt")
    if os.path.isdir(record89_kit(args)):
        made_by = open(recorded).read().strip() if os.path.exists(recorded) else "an unrecorded command"
        if made_by != text:
            fail(f"{record89_kit(args)} was made by {made_by}, not {text}: give another OUTDIR, or remove it")
        return
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        fail(f"ref_record89: {shlex.join(command)} failed: {done.stdout.strip()}")
    with open(recorded, "w") as f:
        f.write(text + "\n")


def parse_curve(text):
    """[(step, training seconds, val loss)] and [(step, ms)] of the steps counted, from our trainer's or
    train_gpt2.py's output. The first step compiles (PyTorch) or tunes the products (ours): its time
    is not counted."""
    timed, curve, elapsed = [], [], 0.0
    for line in text.splitlines():
        step = STEP_LINE.match(line)
        if step:
            if int(step.group(1)) > 1:
                timed.append((int(step.group(1)), float(step.group(2))))
                elapsed += float(step.group(2)) / 1000.0
            continue
        val = VAL_LINE.match(line)
        if val:
            curve.append((int(val.group(1)), elapsed, float(val.group(2))))
    return curve, timed


def parse_reference_curve(text):
    """The same from the reference's output: the training seconds are its train_time at each
    validation (taken after a synchronisation), a step's ms the difference of its step lines'
    train_time (not synchronised: the median is right, a single step only roughly so)."""
    timed, curve, last = [], [], 0
    for line in text.splitlines():
        step = REF_STEP_LINE.match(line)
        if step:
            timed.append((int(step.group(1)), float(int(step.group(2)) - last)))
            last = int(step.group(2))
            continue
        val = REF_VAL_LINE.match(line)
        if val:
            curve.append((int(val.group(1)), int(val.group(3)) / 1000.0, float(val.group(2))))
    return curve, timed


def parse_run(name, text):
    """A run's curve and [(step, ms)] of its counted steps."""
    return parse_reference_curve(text) if name in REFERENCE_RUNS else parse_curve(text)


def record89_stage_ms(timed):
    """The median ms of each of record #89's stages (RECORD89_STAGES: steps 1-423, 424-847, 848 on) over a
    run's counted [(step, ms)]; nan for a stage it has none of."""
    medians, first = [], 1
    for stage_steps, _ in RECORD89_STAGES:
        medians.append(median_step_ms([ms for step, ms in timed if first <= step < first + stage_steps]))
        first += stage_steps
    return medians


def record89_stage_lines(args, instances, step_timed):
    """The report's table of record #89's runs, ms a step by stage."""
    runs = [(name, repeat) for name, repeat in instances if name in RECORD89_RUNS]
    if not runs:
        return []
    lines = ["", "record #89's stages, ms a step (the median of each stage's timed steps):",
             "| run | " + " | ".join(f"stage {i + 1} ({tokens} tokens)" for i, (_, tokens) in
                                    enumerate(RECORD89_STAGES)) + " |",
             "| --- |" + " ---: |" * len(RECORD89_STAGES)]
    for name, repeat in runs:
        cells = ["-" if math.isnan(ms) else f"{ms:.1f}" for ms in record89_stage_ms(step_timed[(name, repeat)])]
        lines.append(f"| {run_label(name, args, repeat)} | " + " | ".join(cells) + " |")
    return lines


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


def mean_step_ms(curve, ms):
    """The mean ms of the counted steps: the training time at the last validation over their number."""
    return curve[-1][1] * 1000.0 / len(ms) if ms else float("nan")


def median_step_ms(ms):
    return sorted(ms)[len(ms) // 2] if ms else float("nan")


def mean(values):
    values = list(values)
    return sum(values) / len(values)


def mean_curve(runs):
    """[(step, mean training seconds, mean validation loss)] over runs [(curve, ms)], at the steps
    every one of them validated (one run: its own curve)."""
    at = [{point[0]: point for point in curve} for curve, _ in runs]
    steps = sorted(set.intersection(*[set(points) for points in at]))
    return [(step, mean(points[step][1] for points in at), mean(points[step][2] for points in at))
            for step in steps]


def losses_by_step(runs):
    """{step: [each run's validation loss]} over runs [(curve, ms)] at the steps all validated."""
    at = [{step: loss for step, _, loss in curve} for curve, _ in runs]
    steps = set.intersection(*[set(losses) for losses in at])
    return {step: [losses[step] for losses in at] for step in steps}


def loss_spread(runs):
    """{step: (lowest, highest validation loss)} over runs at the steps all validated."""
    return {step: (min(losses), max(losses)) for step, losses in losses_by_step(runs).items()}


def loss_stdev(runs):
    """{step: sample standard deviation of the validation loss} over runs at the steps all
    validated; {} for a single run."""
    if len(runs) < 2:
        return {}
    return {step: statistics.stdev(losses) for step, losses in losses_by_step(runs).items()}


def pair_differences_sd(ours, ref):
    """{step: sample standard deviation of the pairs' relative differences (ours - reference) /
    reference} over runs paired in order (--shared_init); {} for fewer than two pairs."""
    if len(ours) != len(ref) or len(ours) < 2:
        return {}
    ours_at, ref_at = losses_by_step(ours), losses_by_step(ref)
    return {step: statistics.stdev((o - r) / r for o, r in zip(ours_at[step], ref_at[step]))
            for step in set(ours_at) & set(ref_at)}


def difference_error(c, step):
    """At a step, the standard error of the difference of the two sides' mean losses relative to the
    reference's mean, and the runs a side that would bring it to half of LOSS_TOLERANCE (so that
    the tolerance is two standard errors); None without two runs on each side. Paired runs
    (--shared_init): from the spread of the pairs' differences, else from each side's own."""
    if c["paired"]:
        if step not in c["pair_sd"]:
            return None
        sd = c["pair_sd"][step]
        return sd / math.sqrt(c["ours_runs"]), math.ceil((sd / (LOSS_TOLERANCE / 2)) ** 2)
    if step not in c["ours_sd"] or step not in c["ref_sd"]:
        return None
    ref_loss = next(row[1] for row in c["losses"] if row[0] == step)
    ours_var, ref_var = c["ours_sd"][step] ** 2, c["ref_sd"][step] ** 2
    error = math.sqrt(ours_var / c["ours_runs"] + ref_var / c["ref_runs"]) / ref_loss
    runs = math.ceil((ours_var + ref_var) / (LOSS_TOLERANCE / 2 * ref_loss) ** 2)
    return error, runs


def speedrun_comparison(ours, ref, paired=False):
    """The numbers of the speedrun pair from each side's runs [(curve, step ms)], one or several
    (repeats): ratio (the reference's mean ms/step over ours, each the mean of its runs'), losses
    [(step, reference, ours, relative difference)] of the runs' mean losses at the steps all
    validated, the largest relative difference and its step, the reference's (mean) final loss and
    training seconds, the seconds ours (its mean curve) needs to reach that loss (None if it never
    does), and each side's number of runs, spread of losses ({step: (lowest, highest)}) and their
    standard deviations ({step: sd}, empty for one run); paired (--shared_init: ours' k-th run and
    the reference's from the same weights): the standard deviation of the pairs' relative
    differences ({step: sd})."""
    ours_curve, ref_curve = mean_curve(ours), mean_curve(ref)
    ours_ms = mean(mean_step_ms(curve, ms) for curve, ms in ours)
    ref_ms = mean(mean_step_ms(curve, ms) for curve, ms in ref)
    ours_at = {step: loss for step, _, loss in ours_curve}
    losses = [(step, loss, ours_at[step], abs(ours_at[step] - loss) / loss)
              for step, _, loss in ref_curve if step in ours_at]
    worst = max(losses, key=lambda row: row[3]) if losses else None
    ref_final, ref_seconds = ref_curve[-1][2], ref_curve[-1][1]
    return {"ratio": ref_ms / ours_ms, "ours_ms": ours_ms, "ref_ms": ref_ms,
            "losses": losses, "worst": worst, "ref_final": ref_final, "ref_seconds": ref_seconds,
            "ours_reach": time_to_reach(ours_curve, ref_final), "ours_runs": len(ours), "ref_runs": len(ref),
            "ours_spread": loss_spread(ours), "ref_spread": loss_spread(ref),
            "ours_sd": loss_stdev(ours), "ref_sd": loss_stdev(ref),
            "paired": paired, "pair_sd": pair_differences_sd(ours, ref) if paired else {}}


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
    p.add_argument("--same_tokens", action="store_true", help="the runs at --batch_tokens take the speedrun's "
                   f"tokens: --steps and --val_every times {SPEEDRUN_STEP_TOKENS} / --batch_tokens")
    p.add_argument("--target_run", default="ours_gpt2", help="the run whose final validation loss the "
                   "'to target' column is timed to (when it is among the runs)")
    p.add_argument("--speedrun_val_seq_len", type=int, default=REFERENCE_VAL_SEQ_LEN,
                   help="ours' validation sequence length in the speedrun (-vt); the reference's stays "
                   f"{REFERENCE_VAL_SEQ_LEN}")
    p.add_argument("--speedrun_val_tokens", type=int, default=10485760,
                   help="the speedrun runs' validation tokens (ours: -m this / --speedrun_val_seq_len)")
    p.add_argument("--reference_script", default="", help="record #28's train_gpt.py (for ref_speedrun)")
    p.add_argument("--reference89", default="", help="the folder of record #89's train_gpt.py, triton_kernels.py "
                   "and dc_triton_kernels.py (for ref_record89, through dev/reference89_offline.py)")
    p.add_argument("--reference89_profile_steps", default="", help="training steps of ref_record89 to record "
                   "under torch.profiler, e.g. 10,430,860 (the kit's --profile_steps: a kernel table each in "
                   "OUTDIR/ref_record89/kit/logs/; each such step's own time grows, and the script's clock with "
                   "it)")
    p.add_argument("--tokenizer", default="", help="GPT-2's vocabulary file (build/write_tokenizer's) for "
                   "ours_record89's prefix table (-tk)")
    p.add_argument("--speedrun_repeats", type=int, default=1, help="runs of each of the records' pairs: ours with "
                   f"seeds {SPEEDRUN_SEED}, {SPEEDRUN_SEED + 1}, ..., the reference (unseeded) as often; the "
                   "comparison takes each side's mean")
    p.add_argument("--reference_repeats", type=int, default=0, help="runs of the records' scripts, where not "
                   "--speedrun_repeats: the sides then have different numbers of runs (not with --shared_init)")
    p.add_argument("--shared_init", action="store_true", help="the speedrun pair's k-th runs start from the same "
                   "weights (train_gpt2.py's init, seed 42 + k - 1); the comparison takes the pairs' differences")
    p.add_argument("--init_seed", type=int, help="with --shared_init: every pair from the init of this seed "
                   "(each side's spread from one init)")
    p.add_argument("--stop_after", type=int, default=0, help="the records' pairs' runs stop after their "
                   "validation at this step, their schedule still their own (0: they run to the end)")
    p.add_argument("--dry_run", action="store_true", help="print the commands, write the reference's copy, "
                   "run nothing")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS), help="which runs, in order: " + " ".join(RUNS))
    p.add_argument("--python", default=sys.executable, help="the python with torch for the peer and the reference")
    args = p.parse_args(argv)
    check_args(args)
    return args


def check_args(args):
    runs = args.runs.split(",")
    for name in runs:
        if name not in RUNS:
            fail(f"--runs {name}: use some of {','.join(RUNS)}")
    if args.speedrun_repeats < 1:
        fail(f"--speedrun_repeats {args.speedrun_repeats}: at least 1")
    if args.reference_repeats < 0:
        fail(f"--reference_repeats {args.reference_repeats}: at least 1 (0: as --speedrun_repeats)")
    if args.reference_repeats and args.shared_init and args.reference_repeats != args.speedrun_repeats:
        fail(f"--reference_repeats {args.reference_repeats}: --shared_init pairs the k-th runs of the two sides, so "
             f"both make --speedrun_repeats {args.speedrun_repeats}; drop one of the two")
    if args.stop_after:
        if any(name not in PAIR_RUNS for name in runs):
            fail(f"--stop_after {args.stop_after}: for the records' pairs' runs only, not "
                 f"{','.join(name for name in runs if name not in PAIR_RUNS)}")
        for name in runs:
            steps, every = run_steps(name, args), run_val_every(name, args)
            if not 0 < args.stop_after < steps or args.stop_after % every:
                fail(f"--stop_after {args.stop_after}: {name} needs a validation step before its last, {steps} (a "
                     f"multiple of {every})")
    if args.target_run not in RUNS:
        fail(f"--target_run {args.target_run}: use one of {','.join(RUNS)}")
    if args.target_run != "ours_gpt2" and args.target_run not in runs:
        fail(f"--target_run {args.target_run}: not among --runs {args.runs}")
    if args.same_tokens:
        for flag, value in (("--steps", args.steps), ("--val_every", args.val_every)):
            if (value * SPEEDRUN_STEP_TOKENS) % args.batch_tokens:
                fail(f"--same_tokens: {flag} {value} x {SPEEDRUN_STEP_TOKENS} tokens is no whole number of "
                     f"--batch_tokens {args.batch_tokens} steps")
        for name in runs:
            batch = run_micro_batch(name, args) * args.seq_len
            if name not in SPEEDRUN_RUNS and args.speedrun_val_tokens % batch:
                fail(f"--same_tokens: --speedrun_val_tokens {args.speedrun_val_tokens} is no whole number of "
                     f"{name}'s validation batches of {batch} tokens")
    if any(name in SPEEDRUN_RUNS for name in runs):
        if args.speedrun_val_seq_len <= 0 or args.speedrun_val_tokens % args.speedrun_val_seq_len:
            fail(f"--speedrun_val_tokens {args.speedrun_val_tokens} is no multiple of --speedrun_val_seq_len "
                 f"{args.speedrun_val_seq_len}")
    if args.shared_init and not ("ref_speedrun" in runs and any(name in runs for name in ("ours_speedrun", "peer_speedrun"))):
        fail("--shared_init pairs the speedrun's runs with the reference's: give --runs both ref_speedrun and "
             "ours_speedrun (or peer_speedrun)")
    if args.init_seed is not None and not args.shared_init:
        fail(f"--init_seed {args.init_seed}: the seed of --shared_init's weights; give --shared_init too")
    check_record89_args(args, runs)
    if "ref_speedrun" in runs:
        if args.speedrun_val_tokens % REFERENCE_VAL_SEQ_LEN:
            fail(f"--speedrun_val_tokens {args.speedrun_val_tokens} is no multiple of the reference's "
                 f"validation sequence, {REFERENCE_VAL_SEQ_LEN} tokens (its assert)")


def check_record89_args(args, runs):
    """The record #89 pair's needs: the reference's folder, ours' vocabulary, validation tokens in
    whole batches of both (and no shared init, which is record #28's pair's)."""
    if "ref_record89" in runs and not os.path.isfile(os.path.join(args.reference89, "train_gpt.py")):
        fail(f"ref_record89 needs --reference89 DIR, the folder of record #89's train_gpt.py and its kernel files "
             f"(modded-nanogpt f411b3d3); got '{args.reference89}'")
    if "ours_record89" in runs and not os.path.isfile(args.tokenizer):
        fail(f"ours_record89 needs --tokenizer FILE, GPT-2's vocabulary (build/write_tokenizer --output FILE) for "
             f"its prefix table; got '{args.tokenizer}'")
    if any(name in RECORD89_RUNS for name in runs):
        batch = 8 * RECORD89_VAL_SEQ_LEN  # the reference's validation batch
        if args.speedrun_val_tokens % batch:
            fail(f"--speedrun_val_tokens {args.speedrun_val_tokens}: record #89's runs validate in batches of "
                 f"{batch} tokens (the reference's); give a multiple of it")
        if args.shared_init:
            fail("--shared_init pairs record #28's runs; drop ours_record89 and ref_record89 from --runs, or it")


def run_signature(name, args, repeat=1):
    """What a run's log records of the command that wrote it, on one line: the command line, and for
    the reference the edits of its copy (their line breaks written as \\n)."""
    signature = shlex.join(run_command(name, args, repeat))
    if name == "ref_speedrun":
        edits = (replacement.replace("\n", "\\n") for _, replacement in reference_edits(args))
        signature += " | edits: " + "; ".join(edits)
    if name == "ref_record89":
        signature += " | kit: " + shlex.join(record89_kit_command(args)[1:])
    return signature


def finished(name, args, repeat=1):
    """The run's curve and [(step, ms)] when its output in OUTDIR reached its last step; else None. Stops
    where that output is another command's (other steps or validation in the same OUTDIR)."""
    log = run_log(name, args, repeat)
    if not os.path.exists(log):
        return None
    text = open(log, errors="replace").read()
    first = text.split("\n", 1)[0]
    if first.startswith(COMMAND_MARK) and first[len(COMMAND_MARK):] != run_signature(name, args, repeat):
        fail(f"{log} is the output of another command ({first[len(COMMAND_MARK):]}), not of "
             f"{run_signature(name, args, repeat)}: give another OUTDIR, or remove it and {name}'s folder")
    last = run_last_step(name, args)
    curve, timed = parse_run(name, output_through(name, text, last))
    return (curve, timed) if curve and curve[-1][0] == last else None


def lock_runs(args, runs):
    """Locks each run's log + '.lock' (flock, released when the bench ends) and returns the open
    files; stops with one line naming the run when another bench holds one, before anything is
    written (its log would otherwise be truncated under the bench that runs it)."""
    locks = []
    for name, repeat in runs:
        log = run_log(name, args, repeat)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        lock = open(log + ".lock", "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            fail(f"{log}: {name} is being run by another bench_quality.py ({holder}) in this OUTDIR: wait for it "
                 "to end (its finished output is then read, not run again), or give another OUTDIR")
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        locks.append(lock)
    return locks


def run_until(command, cwd, log, echo, stop, env=None):
    """Runs command in cwd in a session of its own (env: variables added to the bench's), its output
    (unbuffered, for Python) appended to the open file log line by line, and with echo to the
    terminal too. stop: None, or a function of a line that says the run has done its part: then the
    session is killed (torchrun's workers with it) and the status is 0. Else the command's status.
    Interrupted (Ctrl-C or SIGTERM reaches the bench alone, the session being its own), it kills the
    session before it stops."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", bufsize=1, start_new_session=True,
                               env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    try:
        for line in process.stdout:
            if echo:
                sys.stdout.write(line)
            log.write(line)
            log.flush()
            if stop is not None and stop(line):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return 0
    except KeyboardInterrupt:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return process.wait()


def run_logged(name, args, repeat=1):
    """Runs one run with its output in its log (the reference's also on the terminal), after a first
    line naming the command, until its end or its validation at --stop_after; its status."""
    command, log = run_command(name, args, repeat), run_log(name, args, repeat)
    cwd = {"ref_speedrun": os.path.join(args.outdir, "ref_speedrun"), "ref_record89": record89_kit(args)}.get(name)
    last = run_last_step(name, args)
    stop = (lambda line: validation_step(name, line) == last) if args.stop_after else None
    env = {}
    if args.shared_init and name == "ref_speedrun":
        env["SPEEDRUN_INIT"] = os.path.abspath(shared_init_paths(args, repeat)[1])
    with open(log, "w") as f:
        f.write(COMMAND_MARK + run_signature(name, args, repeat) + "\n")
        f.flush()
        return run_until(command, cwd, f, name in REFERENCE_RUNS, stop, env)


def gpu_samples_path(log):
    return log + ".gpu.csv"


def visible_gpu():
    """The GPU a run uses: the first of CUDA_VISIBLE_DEVICES when it is an index, else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return first if first.isdigit() else "0"


@contextlib.contextmanager
def gpu_sampler(path):
    """Samples GPU_QUERY every GPU_SAMPLE_MS into path (nvidia-smi's CSV, no header or units) while
    the body runs; samples nothing where nvidia-smi is not on the PATH."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        yield
        return
    with open(path, "w") as f:
        process = subprocess.Popen([smi, "--id=" + visible_gpu(), "--query-gpu=" + GPU_QUERY,
                                    "--format=csv,noheader,nounits", "--loop-ms=" + str(GPU_SAMPLE_MS)],
                                   stdout=f, stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            process.terminate()
            process.wait()


def gpu_load(path):
    """(mean SM MHz, mean W, share under the software power cap) of path's samples in which the GPU
    was busy; None without such samples (or without the file). Lines that are not a sample (a field
    nvidia-smi could not read) are skipped."""
    if not os.path.exists(path):
        return None
    busy = []
    for line in open(path, errors="replace"):
        fields = [field.strip() for field in line.split(",")]
        try:
            utilization, mhz, watts, reasons = float(fields[0]), float(fields[1]), float(fields[2]), int(fields[3], 16)
        except (IndexError, ValueError):
            continue
        if utilization >= GPU_BUSY_PERCENT:
            busy.append((mhz, watts, 1.0 if reasons & SW_POWER_CAP else 0.0))
    if not busy:
        return None
    return tuple(mean(sample[i] for sample in busy) for i in range(3))


def gpu_load_cell(path):
    load = gpu_load(path)
    return "-" if load is None else f"{load[0]:.0f} / {load[1]:.0f} / {100 * load[2]:.0f}%"


def interrupt_on_sigterm():
    """A SIGTERM stops the bench as a Ctrl-C does, its run's session killed with it (run_until): a
    bench started in the background, where SIGINT may be ignored, is stopped that way."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)


def main():
    interrupt_on_sigterm()
    args = parse_args()
    runs = args.runs.split(",")
    os.makedirs(args.outdir, exist_ok=True)
    # Each run (name, repeat), in --runs' order, a run's repeats one after the other.
    instances = [(name, repeat) for name in runs for repeat in range(1, run_repeats(name, args) + 1)]
    results = {run: finished(run[0], args, run[1]) for run in instances}
    # Held until the bench ends, so that no other bench in this OUTDIR starts these runs over their logs.
    locks = lock_runs(args, [run for run, result in results.items() if result is None])
    # The reference's copy is made before any run starts, so that a script these edits do not fit
    # stops the bench at once rather than after the other runs.
    if any(name == "ref_speedrun" and result is None for (name, _), result in results.items()):
        prepare_reference(args)
    if any(name == "ref_record89" and result is None for (name, _), result in results.items()):
        print(f"=== ref_record89's script offline: {shlex.join(record89_kit_command(args))}", flush=True)
        if not args.dry_run:
            prepare_record89_kit(args)
    curves, step_timed = {}, {}
    for name, repeat in instances:
        run, log = (name, repeat), run_log(name, args, repeat)
        folder = {"ref_speedrun": os.path.join(args.outdir, "ref_speedrun"), "ref_record89": record89_kit(args)}
        where = f" (in {folder[name]})" if name in folder else ""
        title = name + ("" if run_repeats(name, args) == 1 else f" {repeat}/{run_repeats(name, args)}")
        if results[run] is not None:  # a finished run of the same OUTDIR is read again, not rerun
            print(f"=== {title}: read {log}", flush=True)
            curves[run], step_timed[run] = results[run]
            continue
        print(f"=== {title}{where}: {shlex.join(run_command(name, args, repeat))}", flush=True)
        if args.dry_run:
            continue
        if args.shared_init and name in SPEEDRUN_RUNS:
            write_shared_init(args, repeat)
        with gpu_sampler(gpu_samples_path(log)):
            status = run_logged(name, args, repeat)
        text = open(log, errors="replace").read()
        if status != 0:
            fail(f"{title} exited with status {status}: see {log}\n{text[-2000:]}")
        curves[run], step_timed[run] = parse_run(name, output_through(name, text, run_last_step(name, args)))
        if not curves[run]:
            fail(f"{title}: no validation line in {log}")
    if not args.dry_run:
        step_ms = {run: [ms for _, ms in timed] for run, timed in step_timed.items()}
        report(args, runs, instances, curves, step_ms, step_timed)


def runs_of(name, instances, curves, step_ms):
    """[(curve, ms)] of each repeat of run `name`."""
    return [(curves[run], step_ms[run]) for run in instances if run[0] == name]


def report(args, runs, instances, curves, step_ms, step_timed):
    target_run = args.target_run if args.target_run in runs else None
    # The target: the run's final validation loss (the mean of its repeats' final losses).
    target = mean_curve(runs_of(target_run, instances, curves, step_ms))[-1][2] if target_run else None
    lines = []
    batch_runs = [name for name in runs if name not in PAIR_RUNS]
    if batch_runs:
        name = batch_runs[0]
        lines.append(f"d12, {run_steps(name, args)} steps of {args.batch_tokens} tokens (micro batch "
                     f"{args.micro_batch} x {args.seq_len}), validation every {run_val_every(name, args)} steps "
                     f"on {run_val_batches(name, args)} batches"
                     + (f" (--same_tokens: the speedrun's {args.steps} steps of {SPEEDRUN_STEP_TOKENS} tokens)"
                        if args.same_tokens else ""))
    if args.peer_micro_batch and "peer_modern" in runs:
        lines.append(f"PyTorch's micro batch: {args.peer_micro_batch} x {args.seq_len}, the same {args.batch_tokens} "
                     "tokens a step")
    if any(name in SPEEDRUN_RUNS for name in runs):
        lines.append(f"speedrun: d12, {args.steps} steps of {SPEEDRUN_STEP_TOKENS} tokens (8 document-aligned "
                     f"sequences of 49152), validation every {args.val_every} steps on {args.speedrun_val_tokens} "
                     f"tokens, ours in sequences of {args.speedrun_val_seq_len}"
                     + (f", the reference's of {REFERENCE_VAL_SEQ_LEN} (its loader searching "
                        f"{REFERENCE_SEARCH_FACTOR} x a step's tokens)"
                        if "ref_speedrun" in runs else "")
                     + (f"; each run stopped after its validation at step {args.stop_after}" if args.stop_after else "")
                     + (f"; every pair from train_gpt2.py's init of seed {args.init_seed}"
                        if args.init_seed is not None else ""))
    if any(name in RECORD89_RUNS for name in runs):
        lines.append(f"record #89: its {RECORD89_STEPS} steps (stages of {', '.join(str(t) for _, t in RECORD89_STAGES)} "
                     f"tokens a step), validation every {RECORD89_VAL_EVERY} steps and at the last on "
                     f"{args.speedrun_val_tokens} tokens in sequences of {RECORD89_VAL_SEQ_LEN}"
                     + (f"; each run stopped after its validation at step {args.stop_after}" if args.stop_after else ""))
    if target is not None:
        lines.append(f"target: {LABELS[target_run]}'s final validation loss {target:.4f}")
    lines.append("| run | steps | final val loss | ms/step (median) | ms/step (mean) | tokens/s | training s "
                 "| s to target | GPU busy: SM MHz / W / power-capped |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, repeat in instances:
        curve, ms = curves[(name, repeat)], step_ms[(name, repeat)]
        median = median_step_ms(ms)
        reach = time_to_reach(curve, target) if target is not None else None
        to_target = "-" if target is None else "not reached" if reach is None else f"{reach:.1f}"
        lines.append(f"| {run_label(name, args, repeat)} | {curve[-1][0]} | {curve[-1][2]:.4f} | {median:.1f} | "
                     f"{mean_step_ms(curve, ms):.1f} | {tokens_per_second(name, args, curve, ms):.0f} | "
                     f"{curve[-1][1]:.1f} | {to_target} | "
                     f"{gpu_load_cell(gpu_samples_path(run_log(name, args, repeat)))} |")
    lines += record89_stage_lines(args, instances, step_timed)
    for name, reference in COMPARED_WITH.items():
        if name in runs and reference in runs:
            lines += speedrun_report(speedrun_comparison(runs_of(name, instances, curves, step_ms),
                                                         runs_of(reference, instances, curves, step_ms),
                                                         args.shared_init), name)
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.outdir, "quality.md"), "w") as f:
        f.write(table + "\n")
    plot(os.path.join(args.outdir, "quality.png"), runs, instances, curves, step_ms, target)


def plot(path, runs, instances, curves, step_ms, target):
    """Validation loss against training time, a run's repeats in one colour. The axis starts its
    losses below the largest one after the first validation, so that the untrained model's (about
    10.8, every run's) does not squeeze the curves into the bottom of the plot."""
    plt.figure(figsize=(7, 4.5))
    later = [c[2] for curve in curves.values() for c in curve[1:]]
    for name in runs:
        color = None
        for curve, _ in runs_of(name, instances, curves, step_ms):
            line, = plt.plot([c[1] for c in curve], [c[2] for c in curve], marker="o", ms=3, color=color,
                             label=LABELS[name] if color is None else None)
            color = line.get_color()
    if target is not None:
        plt.axhline(target, color="gray", lw=0.8, ls="--")
    if later and max(later) > min(later):
        low, high = min(later), max(later)
        plt.ylim(low - 0.05 * (high - low), high + 0.1 * (high - low))
    plt.xlabel("training time (s)")
    plt.ylabel("validation loss")
    plt.legend()
    plt.grid(alpha=0.3)
    plt.tight_layout()
    plt.savefig(path, dpi=120)


def yes_no(ok):
    return "yes" if ok else "NO"


def spread_percent(spread, step):
    lowest, highest = spread[step]
    return 100 * (highest - lowest) / lowest


# Each side the report compares with the reference: its heading, and its name in the lines.
SPEEDRUN_SIDES = {"ours_speedrun": ("speedrun recipe against record #28's script", "ours"),
                  "peer_speedrun": ("the PyTorch port (train_gpt2.py --recipe speedrun) against record #28's script",
                                    "the port"),
                  "ours_record89": ("record89 recipe against record #89's script", "ours")}


def speedrun_report(c, name="ours_speedrun"):
    """The lines of the report on one side of a record's pair (ours, or the port) against its reference,
    from speedrun_comparison's numbers. The speed targets are ours' of record #28 alone."""
    heading, side = SPEEDRUN_SIDES[name]
    targets = name == "ours_speedrun"
    repeated = c["ours_runs"] > 1 or c["ref_runs"] > 1
    lines = ["", f"{heading} (same shards, steps and validation tokens):"]
    if repeated:
        seeds = (f"seed {SPEEDRUN_SEED}" if c["ours_runs"] == 1
                 else f"seeds {SPEEDRUN_SEED}-{SPEEDRUN_SEED + c['ours_runs'] - 1}")
        lines.append(f"- {c['ours_runs']} run{'s' * (c['ours_runs'] > 1)} of {side} ({seeds}) "
                     f"and {c['ref_runs']} of the reference "
                     + ("(each pair from the same weights, --shared_init)" if c["paired"] else "(which sets no seed)")
                     + ": the numbers below are the means of each side's runs")
    lines.append(f"- ms/step (mean of the timed steps): {side} {c['ours_ms']:.1f}, reference {c['ref_ms']:.1f}: "
                 f"{c['ratio']:.2f}x" + (f" (at least {SPEED_TARGET}x: {yes_no(c['ratio'] >= SPEED_TARGET)})"
                                         if targets else ""))
    if c["worst"] is not None:
        step, _, _, worst = c["worst"]
        lines.append(f"- validation loss: largest relative difference {100 * worst:.2f}% at step {step} "
                     f"(within {100 * LOSS_TOLERANCE:.0f}% at every validation: {yes_no(worst <= LOSS_TOLERANCE)})")
    else:
        lines.append("- validation loss: no step validated by both")
    limit = c["ref_seconds"] / SPEED_TARGET
    reach = c["ours_reach"]
    lines.append(f"- {side} reaches the reference's final validation loss {c['ref_final']:.4f} in "
                 + (f"{reach:.2f} s" if reach is not None else "never (not reached)")
                 + f"; the reference trained {c['ref_seconds']:.2f} s"
                 + (f", 1/{SPEED_TARGET} of it {limit:.2f} s: " + yes_no(reach is not None and reach <= limit)
                    if targets else ""))
    if repeated and c["worst"] is not None:
        step = c["worst"][0]
        lines.append(f"- the runs' own spread at step {step} (highest over lowest loss): {side} "
                     f"{spread_percent(c['ours_spread'], step):.2f}%, the reference "
                     f"{spread_percent(c['ref_spread'], step):.2f}%")
        error = difference_error(c, step)
        if error is not None and error[0] > 0:
            lines.append(f"- there the difference of the means is {c['worst'][3] / error[0]:.1f} standard errors "
                         f"of it ({100 * error[0]:.2f}%, from "
                         + ("the spread of the pairs' differences" if c["paired"]
                            else "each side's standard deviation over its runs") + "); "
                         f"a standard error of {50 * LOSS_TOLERANCE:.1f}% (so that {100 * LOSS_TOLERANCE:.0f}% is two of "
                         f"them) would take about {error[1]} runs a side")
    lines.append("")
    if not repeated:
        lines.append(f"| step | reference val loss | {side} | relative difference |")
        lines.append("| ---: | ---: | ---: | ---: |")
        for step, ref_loss, side_loss, rel in c["losses"]:
            lines.append(f"| {step} | {ref_loss:.4f} | {side_loss:.4f} | {100 * rel:.2f}% |")
        return lines
    lines.append(f"| step | reference val loss (mean) | lowest-highest | {side} (mean) | lowest-highest | "
                 "relative difference | its standard error |")
    lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for step, ref_loss, side_loss, rel in c["losses"]:
        (ref_low, ref_high), (side_low, side_high) = c["ref_spread"][step], c["ours_spread"][step]
        error = difference_error(c, step)
        lines.append(f"| {step} | {ref_loss:.4f} | {ref_low:.4f}-{ref_high:.4f} | {side_loss:.4f} | "
                     f"{side_low:.4f}-{side_high:.4f} | {100 * rel:.2f}% | "
                     + ("-" if error is None else f"{100 * error[0]:.2f}%") + " |")
    return lines


if __name__ == "__main__":
    main()
