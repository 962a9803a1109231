"""Record #89's train_gpt.py made to run offline, on our shards, with the fewest changes.

    python3 dev/reference89_offline.py OUTDIR --reference DIR --train 'GLOB' --val 'GLOB'
                                       [--passes N] [--gpt2 DIR] [--val_tokens N] [--python PY]
                                       [--profile_steps S,S,... | --init_check | --first_steps N]
                                       [--init_from FILE] [--save_state DIR]

DIR holds the reference's train_gpt.py, triton_kernels.py and dc_triton_kernels.py (modded-nanogpt at
f411b3d3). Writes OUTDIR ready to run with OUTDIR/run.sh [PROCESSES] (torchrun from OUTDIR, one process
unless told; its log in OUTDIR/logs/):
- train_gpt.py with two lines changed: FlashAttention-3, which it loads from the Hugging Face hub, is
  dev/pylib/flash_varlen_attention.py (torch's FlashAttention-2 with the same documents and windows),
  copied beside it; with --val_tokens its validation tokens (10,485,760) are N (a multiple of its validation
  batch, 2,097,152). With --profile_steps, two lines more and one changed: the named training steps
  are recorded by torch.profiler (dev/pylib/step_profile.py, copied beside it with kernel_kinds.py),
  each step's kernel table in OUTDIR/logs/profile_stepNNNNNN.txt: a run for where the script's time
  goes, not for its clock.
- With --init_check, two lines more and two changed: no warm-up, each parameter's statistics at init
  printed (dev/pylib/init_stats.py, copied beside it), and the run stops after its step-0 validation
  (compiling only that forward): a check of the script's init and forward at init against ours', one
  unseeded draw a run.
- With --first_steps N, four lines more and one changed: no warm-up (each shape compiles when first
  met), each training step's loss printed ("step:S/1285 train_loss:L", S from 0: the mean over the
  step's tokens of the loss it trains on, its next-token, multi-token and prefix terms, as ours' step
  lines give it; on several processes over rank 0's tokens), and the run stops after N steps: the
  script's first steps to set beside ours' from the same weights. With --save_state DIR as well, one
  line more: after each step K of the N the model's state dict (its weights in their BF16 or float32,
  the FP8 scale buffers; on the CPU) is written to DIR/stepK.pt by rank 0 (torch.save), to set beside
  ours' checkpoint of that step (dev/record89_compare.py).
- With --init_from FILE, one line more: the model's weights are then FILE's (torch.load,
  load_state_dict strict: every tensor of its state dict; dev/record89_state.py writes ours') in place
  of its own unseeded draw; the run (or --init_check's statistics and validation) starts from them.
- triton_kernels.py with two lines changed: the FP8 down projection's torch._scaled_mm is
  dev/pylib/aligned_scaled_mm.py's (copied beside it), which copies the two scales first: the
  reference passes them as one-element slices at 4-byte offsets, which torch 2.11's cuBLAS 13 refuses
  from the second layer on (CUBLAS_STATUS_NOT_SUPPORTED); the same values, the same bits.
  Nothing else in either file is edited: a line not there exactly once stops it with an error naming
  the line.
- data/fineweb10B/fineweb_{train,val}_NNNNNN.bin: links to the shards of --train and --val in their
  sorted order (the reference's own order, read from DATA_PATH, which run.sh sets to OUTDIR). The
  reference reads its training shards once and stops when they run out; with --passes N the training
  shards are linked N times over, in the same order each time, for a corpus that holds fewer than the
  338.8M tokens it trains on once each document is cut at its cap. --passes auto counts the passes
  from the shards' documents (needs numpy): the reference's tokens at each cap over the tokens a pass
  gives at it, one pass more for the ends of shards and forwards it drops.
- tiktoken/: tiktoken's cache of the GPT-2 encoding (TIKTOKEN_CACHE_DIR in run.sh), filled from
  --gpt2's encoder.json and vocab.bpe (default dev/data/gpt2) through tiktoken itself, which checks
  them against the official files' hashes (so it needs the python with tiktoken: --python, else this
  one). It is filled first: when it fails, OUTDIR is not made.
"""
import argparse
import glob
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "pylib"))
import script_edits  # noqa: E402
REVISION = "modded-nanogpt f411b3d3"
REFERENCE_FILES = ("train_gpt.py", "triton_kernels.py", "dc_triton_kernels.py")
ATTENTION_MODULE = "flash_varlen_attention"
SCALED_MM_MODULE = "aligned_scaled_mm"
PROFILE_MODULE = "step_profile"  # with kernel_kinds, which it imports
INIT_MODULE = "init_stats"
# The training loop's lines that --profile_steps adds after: a step's start, and its end (2356, 2365).
TRAINING_SECTION = "    # --------------- TRAINING SECTION -----------------"
AFTER_STEP = "    model.quantize_mlp_fp8(bootstrap_down=(step < 16))"
# The end of a training step's last micro step, through AFTER_STEP (2363-2365), where --first_steps adds.
STEP_END = f"        del loss\n    training_manager.step_optimizers(step)\n{AFTER_STEP}"
# The lines --init_check changes: the warm-up's loop (2278) and the last line of the model's set-up (2257).
WARMUP_LOOP = "for step in warmup_steps:"
MODEL_SET_UP = "dist.broadcast(model.bigram_sign_table, 0)  # buffer, not in parameters()"
TRAIN_STEPS = 1285
GPT2_FILES = ("encoder.json", "vocab.bpe")
VAL_BATCH_TOKENS = 4 * 64 * 1024 * 8  # the reference's val_batch_size, which its val_tokens must be a multiple of
BOS = 50256
# The reference's training tokens at each document cap (TRAINING_STAGES, 1979-1990): stage 1's 423 steps
# of 131,072 at 896, then 424 steps of 262,144 and 423 + 15 of 393,216 at 2,048.
TRAIN_TOKENS_BY_CAP = ((896, 423 * 131072), (2048, 424 * 262144 + 438 * 393216))

# tiktoken's gpt2 encoding, built with tiktoken.load.read_file serving --gpt2's files by name: its
# read_file_cached then writes each under the name it looks for, after checking its hash.
FILL_TIKTOKEN_CACHE = """
import os, sys
import tiktoken.load
from tiktoken_ext import openai_public
gpt2_dir = sys.argv[1]
def read_local(blobpath):
    with open(os.path.join(gpt2_dir, os.path.basename(blobpath)), "rb") as f:
        return f.read()
tiktoken.load.read_file = read_local
openai_public.gpt2()
"""


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def kit_modules(args):
    """The modules of dev/pylib that the script's copy imports beside the attention's stand-in, and every
    module copied beside it (kernel_kinds is step_profile's)."""
    imported = ([PROFILE_MODULE] if args.profile_steps else []) + ([INIT_MODULE] if args.init_check else [])
    copied = [ATTENTION_MODULE, SCALED_MM_MODULE] + imported + (["kernel_kinds"] if args.profile_steps else [])
    return imported, copied


def edits(args):
    """{file: [(the reference's text, the copy's) for each line changed]}."""
    imports = ", ".join([ATTENTION_MODULE] + kit_modules(args)[0])
    script = [
        ("from kernels import get_kernel",
         f"import {imports}  # offline: FlashAttention-3 by FlashAttention-2 (dev/reference89_offline.py)"),
        ("flash_attn_interface = get_kernel('kernels-community/flash-attn3', version=1).flash_attn_interface",
         f"flash_attn_interface = {ATTENTION_MODULE}"),
    ]
    if args.val_tokens is not None:
        script.append(("val_tokens: int = 10485760", f"val_tokens: int = {args.val_tokens}"))
    if args.profile_steps:
        steps = ", ".join(str(s) for s in args.profile_steps) + ","
        script += [
            (TRAINING_SECTION, f"{TRAINING_SECTION}\n    profiled = {PROFILE_MODULE}.start(step, ({steps}))"
                               "  # offline: --profile_steps"),
            (AFTER_STEP, f"{AFTER_STEP}\n    {PROFILE_MODULE}.stop(step, profiled)  # offline: --profile_steps"),
        ]
    after_set_up = []
    if args.init_from:
        after_set_up.append(f"model.load_state_dict(torch.load({os.path.abspath(args.init_from)!r}, "
                            "map_location=device), strict=True)  # offline: --init_from")
    if args.init_check:
        after_set_up.append(f"{INIT_MODULE}.report(model, print0)  # offline: --init_check")
        script += [
            (WARMUP_LOOP, "for step in []:  # offline: --init_check, no warm-up"),
            (TRAINING_SECTION, f"    break  # offline: --init_check, the step-0 validation alone\n{TRAINING_SECTION}"),
        ]
    if args.first_steps:
        script += [
            (WARMUP_LOOP, "for step in []:  # offline: --first_steps, no warm-up"),
            (TRAINING_SECTION, f"    train_loss_sum = 0.0  # offline: --first_steps\n{TRAINING_SECTION}"),
            (STEP_END, "        train_loss_sum += loss.detach()  # offline: --first_steps\n" + STEP_END +
             "\n    print0(f\"step:{step}/{train_steps} train_loss:{train_loss_sum.item() * grad_accum_steps * world_size / "
             "training_manager.batch_size:.6f}\", console=True)  # offline: --first_steps\n"
             + save_state(args) + f"    if step + 1 == {args.first_steps}: break  # offline: --first_steps"),
        ]
    if after_set_up:
        script.append((MODEL_SET_UP, "\n".join([MODEL_SET_UP] + after_set_up)))
    kernels = [
        ("from triton.tools.tensor_descriptor import TensorDescriptor",
         f"from triton.tools.tensor_descriptor import TensorDescriptor; import {SCALED_MM_MODULE}  # offline"),
        ("x3 = torch._scaled_mm(",
         f"x3 = {SCALED_MM_MODULE}.scaled_mm(  # offline: the scales copied (dev/reference89_offline.py)"),
    ]
    return {"train_gpt.py": script, "triton_kernels.py": kernels}


def save_state(args):
    """--save_state's line before --first_steps' break (empty without it)."""
    if not args.save_state:
        return ""
    folder = os.path.abspath(args.save_state)
    # model is torch.compile's wrapper (2260), whose state dict names every tensor "_orig_mod.<name>"
    return (f"    master_process and torch.save({{k: v.detach().cpu() for k, v in "
            f"model._orig_mod.state_dict().items()}}, os.path.join({folder!r}, f'step{{step + 1}}.pt'))  # offline: --save_state\n")


def shards(pattern, flag):
    files = sorted(glob.glob(pattern))
    if not files:
        fail(f"{flag} '{pattern}': no file matches; give the glob of the shards (e.g. 'DIR/sp_train_*.bin')")
    return files


def shard_tokens(path):
    import numpy as np
    count = int(np.fromfile(path, dtype=np.int32, count=256)[2])
    return np.fromfile(path, dtype=np.uint16, offset=1024, count=count)


def passes_needed(files):
    """The passes over the training shards that the reference's run reads (--passes auto)."""
    try:
        import numpy as np
    except ImportError:
        fail("--passes auto: counting the shards' documents needs numpy: give --passes N, or a python with numpy")
    per_pass = dict.fromkeys((cap for cap, _ in TRAIN_TOKENS_BY_CAP), 0)
    for path in files:
        tokens = shard_tokens(path)
        starts = np.flatnonzero(tokens == BOS)
        if len(starts) == 0:
            fail(f"--train: {path} holds no document (no token {BOS}); the reference reads documents from their start")
        lengths = np.diff(np.append(starts, len(tokens)))
        for cap in per_pass:
            per_pass[cap] += int(np.minimum(lengths, cap).sum())
    return math.ceil(sum(tokens / per_pass[cap] for cap, tokens in TRAIN_TOKENS_BY_CAP)) + 1


def passes_arg(text):
    if text == "auto":
        return text
    try:
        passes = int(text)
    except ValueError:
        passes = 0
    if passes < 1:
        fail(f"--passes {text}: give a whole number of at least 1 (the times the training shards are read) or auto")
    return passes


def profile_steps_arg(text):
    try:
        steps = sorted({int(part) for part in text.split(",")})
    except ValueError:
        steps = []
    if not steps or steps[0] < 0 or steps[-1] >= TRAIN_STEPS:
        fail(f"--profile_steps {text}: give training steps from 0 to {TRAIN_STEPS - 1}, separated by commas "
             "(e.g. 10,430,860: one in each stage)")
    return steps


def link_shards(outdir, files, split, passes=1):
    folder = os.path.join(outdir, "data", "fineweb10B")
    os.makedirs(folder, exist_ok=True)
    for i, path in enumerate(files * passes):
        os.symlink(os.path.abspath(path), os.path.join(folder, f"fineweb_{split}_{i + 1:06d}.bin"))


def fill_tiktoken_cache(cache, gpt2_dir, python):
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=cache)
    done = subprocess.run([python, "-c", FILL_TIKTOKEN_CACHE, os.path.abspath(gpt2_dir)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        fail(f"--gpt2 {gpt2_dir}: tiktoken's GPT-2 cache not filled by {python} ({last}); give the python "
             "with tiktoken (--python) and the official encoder.json and vocab.bpe")


RUN_SH = """#!/usr/bin/env bash
# Record #89's train_gpt.py, offline (dev/reference89_offline.py): bash run.sh [PROCESSES]
cd "$(dirname "$0")"
DATA_PATH=$PWD TIKTOKEN_CACHE_DIR=$PWD/tiktoken exec {python} -m torch.distributed.run --standalone \\
  --nproc_per_node=${{1:-1}} train_gpt.py
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--reference", required=True, help="the folder of the reference's three files")
    parser.add_argument("--train", required=True, help="glob of the training shards")
    parser.add_argument("--val", required=True, help="glob of the validation shards")
    parser.add_argument("--passes", type=passes_arg, default=1,
                        help="times the training shards are linked over, or auto: as many as the run reads (default 1)")
    parser.add_argument("--gpt2", default=os.path.join(HERE, "data", "gpt2"),
                        help="the folder of GPT-2's encoder.json and vocab.bpe (default: dev/data/gpt2)")
    parser.add_argument("--val_tokens", type=int, help="validation tokens instead of the reference's 10,485,760")
    parser.add_argument("--python", default=sys.executable, help="the python that runs the reference")
    parser.add_argument("--profile_steps", type=profile_steps_arg,
                        help="training steps to record with torch.profiler, e.g. 10,430,860 (a table each in logs/)")
    parser.add_argument("--init_check", action="store_true",
                        help="print each parameter's statistics at init, validate once at step 0 and stop")
    parser.add_argument("--first_steps", type=int, help="run only this many training steps, each one's loss printed")
    parser.add_argument("--init_from", help="the weights to start from (a state dict of dev/record89_state.py's)")
    parser.add_argument("--save_state", help="with --first_steps: the folder of the model's state dict after each "
                        "step (stepK.pt)")
    args = parser.parse_args()
    if args.init_check and (args.profile_steps or args.first_steps):
        fail(f"--init_check stops before the first training step: give it or "
             f"{'--profile_steps' if args.profile_steps else '--first_steps'}, not both")
    if args.first_steps is not None and not 0 < args.first_steps <= TRAIN_STEPS:
        fail(f"--first_steps {args.first_steps}: give the training steps to run, 1 to {TRAIN_STEPS}")
    if args.first_steps and args.profile_steps:
        fail("--first_steps prints the steps that --profile_steps records: give one of them, not both")
    if args.save_state and not args.first_steps:
        fail(f"--save_state {args.save_state}: the states after --first_steps' steps; give --first_steps N too")
    if args.save_state and not os.path.isdir(args.save_state):
        fail(f"--save_state {args.save_state}: no such folder; make it first or give another")
    if args.init_from and not os.path.isfile(args.init_from):
        fail(f"--init_from {args.init_from}: no such file; give a state dict that dev/record89_state.py wrote")
    if args.val_tokens is not None and (args.val_tokens <= 0 or args.val_tokens % VAL_BATCH_TOKENS):
        fail(f"--val_tokens {args.val_tokens}: must be a positive multiple of the reference's validation batch, "
             f"{VAL_BATCH_TOKENS:,} tokens")
    for name in REFERENCE_FILES:
        if not os.path.isfile(os.path.join(args.reference, name)):
            fail(f"--reference {args.reference}: no {name}; give the folder of record #89's train_gpt.py "
                 f"and its kernel files ({REVISION})")
    for name in GPT2_FILES:
        if not os.path.isfile(os.path.join(args.gpt2, name)):
            fail(f"--gpt2 {args.gpt2}: no {name}; give the folder of GPT-2's encoder.json and vocab.bpe")
    train, val = shards(args.train, "--train"), shards(args.val, "--val")
    if os.path.exists(args.outdir) and os.listdir(args.outdir):
        fail(f"{args.outdir} is not empty: give a new folder")
    if args.passes == "auto":
        args.passes = passes_needed(train)
    edited = {}
    for name, changed in edits(args).items():
        with open(os.path.join(args.reference, name)) as f:
            source = f.read()
        try:
            edited[name] = script_edits.edit_script(source, changed, f"--reference {args.reference}/{name}",
                                                    f"record #89's {name} at {REVISION}")
        except script_edits.ScriptEditError as e:
            fail(str(e))
        try:
            compile(edited[name], name, "exec")
        except SyntaxError as e:
            fail(f"--reference {args.reference}/{name}: not Python after the edits (line {e.lineno}: {e.msg})")
    # The cache first, in a folder of its own: a failure leaves no OUTDIR behind.
    cache = tempfile.mkdtemp(prefix="tiktoken_")
    fill_tiktoken_cache(cache, args.gpt2, args.python)
    os.makedirs(args.outdir, exist_ok=True)
    shutil.move(cache, os.path.join(args.outdir, "tiktoken"))
    for name in REFERENCE_FILES:
        if name in edited:
            with open(os.path.join(args.outdir, name), "w") as f:
                f.write(edited[name])
        else:
            shutil.copy(os.path.join(args.reference, name), args.outdir)
    for module in kit_modules(args)[1]:
        shutil.copy(os.path.join(HERE, "pylib", module + ".py"), args.outdir)
    link_shards(args.outdir, train, "train", args.passes)
    link_shards(args.outdir, val, "val")
    with open(os.path.join(args.outdir, "run.sh"), "w") as f:
        f.write(RUN_SH.format(python=args.python))
    print(f"{args.outdir}: record #89's train_gpt.py offline (shards: {len(train)} training x {args.passes}, "
          f"{len(val)} validation); run it with: bash {os.path.join(args.outdir, 'run.sh')} [PROCESSES]")


if __name__ == "__main__":
    main()
