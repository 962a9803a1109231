#!/usr/bin/env bash
# Tests of train_gpt2.py's stage plan (--stages PLAN) on the CPU: the stages' ends and each step's
# plan, an error for each kind of bad plan, the plan of the flags alone giving every step today's
# values; the document loader's cap (rows cut by hand on shards written here) and its reshape
# between steps; a two-stage run on document shards (the length doubling, the cap changing) the
# same twice; and the debug state of a plan. The plan against llmc/stages.h and the loaders
# following one against llmc/dataloader.h's: dev/test/test_documents.sh. PYTHON names a python
# with torch and numpy (default: the first of python3, /usr/bin/python3 that has them).
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/test/train_gpt2_py_lib.sh
TINY=(--model tiny --vocab_size 50304 --max_seq_len 256 --device cpu)  # the documents' start token is 50256

check "the stages' ends and each step's stage" <<'EOF'
import train_gpt2 as tg
plan = tg.StagePlan(tg.parse_stages("1/3; 1/3 t=2048; 1/3 lr=0.5; +15 aw=3", 1024, -1, -1), 1270, 1, 1)
assert plan.ends == [423, 847, 1270] and plan.steps == 1285, (plan.ends, plan.steps)
stages = {s: plan.step(s).stage for s in (0, 422, 423, 846, 847, 1269, 1270, 1284, 1285)}
assert stages == {0: 0, 422: 0, 423: 1, 846: 1, 847: 2, 1269: 2, 1270: 3, 1284: 3, 1285: 3}, stages
step = plan.step(1270)
assert (step.seq_len, step.tokens, step.micro_steps, step.window_blocks, step.lr_multiplier) == (2048, 2048, 1, 3, 0.5)
assert plan.step(0).window_blocks == tg.attention_window_blocks(0, 1285) == 1
assert plan.step(1000).window_blocks == tg.attention_window_blocks(1000, 1285)
# round half to even: 1/2 of 5 steps ends at 2, of 7 at 4; 0.25 + 0.5 of 10 at round(7.5) = 8
for text, N, ends in [("1/2; 1/2", 5, [2, 5]), ("1/2; 1/2", 7, [4, 7]), ("0.25; 0.5; 0.25", 10, [2, 8, 10])]:
    got = tg.StagePlan(tg.parse_stages(text, 64, -1, 0), N, 1, 1).ends
    assert got == ends, (text, N, got)
z = tg.StagePlan(tg.parse_stages("0.5 z=4096; 0.5 t=256", 128, -1, 0), 10, 4, 2)
assert [(s.seq_len, s.tokens, s.micro_steps) for s in (z.step(0), z.step(9))] == [(128, 4096, 4), (256, 4096, 2)]
print("1/3 1/3 1/3 +15 of 1270: ends 423 847 1270, 1285 steps; half to even; z=-1 and z=N per stage")
EOF

check "a bad plan: one error line naming --stages, the stage and the fix" <<'EOF'
import train_gpt2 as tg
def error(text, *flags):
    args = tg.parse_args(["--input_bin", "x", "-t", "128", "--num_iterations", "10", "--stages", text] + list(flags))
    try:
        tg.stage_plan(args, 1)
    except SystemExit as e:
        return str(e)
    raise AssertionError(f"no error for --stages {text!r}")
cases = [  # (plan, extra flags, what the error says)
    ("0.5; ", [], "stage 2 is empty"),
    ("1 t=128 t=256", [], "stage 1 sets t twice"),
    ("1 x=3", [], "stage 1: 'x=3' is no KEY=VALUE"),
    ("1 t", [], "stage 1: 't' is no KEY=VALUE"),
    ("1 t=12x", [], "stage 1 sets t=12x; t takes an integer >= 1"),
    ("1 t=0", [], "t takes an integer >= 1"),
    ("1 z=0", [], "z takes an integer >= 1, or -1"),
    ("1 cap=-1", ["--documents", "1"], "cap takes an integer >= 0"),
    ("1 aw=-2", [], "stage 1: aw=-2: give a window of 1 or more blocks, -1 for the schedule or 0 for none"),
    ("1 aw=5/3", [], "stage 1: aw=5/3: the short window 5 is not within 1 and the long window 3: give S/L"),
    ("1 aw=2/0", [], "stage 1: aw=2/0: a short window takes a fixed long one of 1 or more blocks"),
    ("1 aw=1/-1", [], "stage 1: aw=1/-1: a short window takes a fixed long one"),
    ("1 aw=1/x", [], "stage 1: aw=1/x: give the window in blocks of 128 tokens"),
    ("1 lr=-0.5", [], "lr takes a number >= 0"),
    ("1 lr=inf", [], "lr takes a number >= 0"),
    ("1 mtp=1,0.5,0.25,0.1", [], "stage 1 sets mtp=1,0.5,0.25,0.1; mtp takes 1 to 3 next-token weights within [0, 1]"),
    ("1 mtp=1,x", [], "mtp takes 1 to 3 next-token weights"),
    ("1 mtp=1>", [], "mtp takes 1 to 3 next-token weights"),
    ("1 mtp=1,0.5>1", [], "stage 1 sets mtp=1,0.5>1: 2 weights at the start and 1 at the end; give as many at each end"),
    ("1 pw=1.5", [], "stage 1 sets pw=1.5; pw takes the prefix term's weight within [0, 1], or START>END"),
    ("1 pw=0.25>-1", [], "pw takes the prefix term's weight"),
    ("1/2; 1/2 mtp=0>1", [], "stage 2: every term of the loss starts at weight 0 (mtp 0>1, pw 0); give the next token "
                              "a weight (mtp=1)"),
    ("1 mtp=1 mtp=0.5", [], "stage 1 sets mtp twice"),
    ("half", [], "stage 1 begins with 'half', which is no share"),
    ("1/0", [], "which is no share"),
    ("-0.5; 1.5", [], "stage 1 begins with '-0.5'"),
    ("0.5; 0.4", [], "the shares of stages 1 to 2 sum to 0.9, not 1"),
    ("+5; 1", [], "stage 1 is +5 extension steps, which only the last stage can be"),
    ("0.01; 0.99", [], "stage 1 gets 0 steps (its share ends at step 0, where the stage before's does) of --num_iterations 10"),
    ("0.5; 0.5 t=256", [], "stage 2 sets t=256 (the first stage's is 128): a sequence length that changes between "
                           "stages needs document-aligned sequences (--documents 1)"),
    ("1 cap=64", [], "stage 1 sets cap=64: a document cap needs document-aligned sequences (--documents 1)"),
    ("1 aw=2", [], "stage 1 sets aw=2, a window of document-causal attention; add --documents 1"),
    ("1 t=192", ["--documents", "1"], "stage 1 sets t=192, which is not a multiple of 128"),
    ("0.5; 0.5 z=1000", [], "stage 2's z=1000 is not a positive multiple of B*T*world"),
    ("1", ["--benchmark", "1", "--input_bin", ""], "--stages plans a training run"),
]
for text, flags, words in cases:
    message = error(text, *flags)
    assert message.startswith("error: --stages") and words in message, (text, message)
    print(f"{text!r}: {message}")
debug = ["--write_debug_state", "d", "-b", "2", "--debug_steps", "4", "--documents", "1"]
for text, words in [("0.5; 0.5 t=256", "longer than the debug state's batch of -t 128"),
                    ("0.5; 0.5 z=512", "a debug step is one micro batch of B*t = 2*128 tokens; give z=-1"),
                    ("1 cap=8", "the debug state's batch is random tokens"),
                    ("1 aw=-1", "a debug step keeps a fixed window"),
                    ("1; +4", "leave none of --debug_steps 4"),
                    ("1." + "0" * 900, "do not fit the debug state's header, which holds 884")]:
    message = error(text, *debug)
    assert words in message, (text, message)
    print(f"--write_debug_state, {text[:20]!r}: {message}")
EOF

check "the plan of the flags alone: every step today's values" <<'EOF'
import argparse, train_gpt2 as tg
def todays_window(step, args):  # set_attention_window's
    return tg.attention_window_blocks(step, args.num_iterations) if args.window_blocks == -1 else args.window_blocks
for flags, world in [(["-t", "256", "--window_blocks", "-1", "--documents", "1"], 1),
                     (["-t", "128", "--total_batch_size", "2048", "-b", "4", "--lr_schedule", "cosine"], 2),
                     (["--recipe", "speedrun", "--num_iterations", "97", "-t", "1024", "-b", "2"], 1),
                     (["--recipe", "modern", "-t", "64", "-b", "1", "--total_batch_size", "-1"], 4)]:
    args = tg.parse_args(["--input_bin", "x", "--num_iterations", "37", "--warmup_iters", "3"] + flags)
    plan = tg.stage_plan(args, world)
    tokens, micro_steps = tg.step_batch(args, world)
    assert plan.steps == args.num_iterations
    for step in range(plan.steps + 1):
        p = plan.step(step)
        assert (p.stage, p.seq_len, p.tokens, p.micro_steps, p.cap, p.lr_multiplier) == (
            0, args.seq_len, tokens, micro_steps, 0, 1.0), (flags, step, p)
        assert p.window_blocks == todays_window(step, args), (flags, step, p)
        assert p.short_window_blocks == p.window_blocks // 2, (flags, step, p)
        assert tg.learning_rate(step, args) * p.lr_multiplier == tg.learning_rate(step, args)
    print(f"{' '.join(flags)}, {world} process(es): {plan.steps + 1} steps as today")
# The extension's steps take the schedule's end value, for every schedule
for schedule in ("cosine", "linear", "wsd", "stable_decay", "constant", "cooldown"):
    args = tg.parse_args(["--input_bin", "x", "--num_iterations", "20", "--lr_schedule", schedule,
                          "--final_lr_frac", "0.1", "--stages", "1; +5"])
    end = tg.learning_rate(20, args)
    assert [tg.learning_rate(s, args) for s in range(20, 25)] == [end] * 5, schedule
    assert abs(end - (args.learning_rate if schedule == "constant" else 0.1 * args.learning_rate)) < 1e-15, schedule
print("extension steps: each schedule's end value")
EOF

check "record #89's (short, long) windows a stage and its final validation's long window" <<'EOF'
import train_gpt2 as tg
record89 = "1/3 aw=1/3; 1/3 aw=3/7; 1/3 aw=5/11; +15 aw=6/13"
args = tg.parse_args(["--input_bin", "x", "--documents", "1", "-t", "2560", "--num_iterations", "1270",
                      "--stages", record89, "--final_window_blocks", "20"])
plan = tg.stage_plan(args, 1)
windows = {s: (plan.step(s).short_window_blocks, plan.step(s).window_blocks) for s in (0, 423, 847, 1270, 1284, 1285)}
assert windows == {0: (1, 3), 423: (3, 7), 847: (5, 11), 1270: (6, 13), 1284: (6, 13), 1285: (6, 20)}, windows
halves = tg.StagePlan(tg.parse_stages("1/2 aw=2/8; 1/2 lr=1; +2 aw=9", 256, -1, 4, 3), 10, 1, 1)
assert [(halves.step(s).short_window_blocks, halves.step(s).window_blocks) for s in (0, 5, 10)] == [(2, 8), (2, 8), (4, 9)]
first = tg.parse_stages("1/2; 1/2 aw=6", 256, -1, 4, 3)
assert [(s.short_window_blocks, s.window_blocks) for s in first] == [(3, 4), (None, 6)], first
assert tg.layer_window_blocks("S", 13, 6) == 6 and tg.layer_window_blocks("S", 13) == 6 and tg.layer_window_blocks("L", 13, 6) == 13
flags = tg.parse_args(["--input_bin", "x", "--documents", "1", "-t", "1024", "--window_blocks", "3/8"])
assert (flags.window_blocks, flags.short_window_blocks) == (8, 3), flags
print("(1, 3) (3, 7) (5, 11) (6, 13), final (6, 20); aw=N resets the short to half; --window_blocks 3/8")

def error(argv, check=False):
    args = tg.parse_args(["--input_bin", "x", "--documents", "1", "-t", "256", "--num_iterations", "10"] + argv)
    tg.check_args(args) if check else tg.stage_plan(args, 1)
for argv, check, words in [
        (["--stages", "1 aw=2/5", "--final_window_blocks", "1"], False,
         "error: --final_window_blocks 1 is below the last stage's short window of 2 blocks, which the final "
         "validation keeps: give --final_window_blocks 2 or more"),
        (["--stages", "1/2 aw=1; 1/2 aw=0", "--final_window_blocks", "2"], False,
         "error: --final_window_blocks 2 sets the long window of the validation after the last step, and the last "
         "stage has no window"),
        (["--window_blocks", "2", "--final_window_blocks", "3"], False,
         "error: --final_window_blocks 3 counts blocks of 128 tokens, and t 256 is 2 blocks"),
        (["--window_blocks", "1/2", "--write_debug_state", "d"], True,
         "error: --window_blocks 1/2: the debug state's header holds the long window alone"),
        (["--window_blocks", "2", "--final_window_blocks", "2", "--write_debug_state", "d"], True,
         "error: --final_window_blocks sets the window of a training run's validation after its last step"),
        (["--window_blocks=-1/4"], False, "error: --window_blocks -1/4: the short window -1 is not within 1"),
        (["--window_blocks", "2/-1"], False, "error: --window_blocks 2/-1: a short window takes a fixed long one")]:
    try:
        error(argv, check)
    except SystemExit as e:
        message = str(e)
    else:
        raise AssertionError(f"no error for {argv}")
    assert message.startswith(words), (argv, message)
    print(f"{' '.join(argv)}: {message}")
EOF

check "the momentum's cooldown: one error line for each bad value" <<'EOF'
import train_gpt2 as tg
def error(*flags):
    args = tg.parse_args(["--input_bin", "x", "--num_iterations", "10", "--stages", "1; +5"] + list(flags))
    try:
        tg.check_args(args)
        tg.stage_plan(args, 1)
    except SystemExit as e:
        return str(e)
    raise AssertionError(f"no error for {flags}")
cases = [
    (["--optimizer", "muon", "--muon_momentum_cooldown", "-1"],
     "error: --muon_momentum_cooldown -1: give 0 (no cooldown) or more steps"),
    (["--optimizer", "muon", "--muon_momentum_cooldown", "16"],
     "error: --muon_momentum_cooldown 16: the momentum's cooldown is longer than the run's 15 steps (--num_iterations "
     "10 and --stages' 5 extension steps); give 15 or less"),
    (["--optimizer", "muon", "--muon_momentum_cooldown", "2", "--write_debug_state", "d"],
     "error: --muon_momentum_cooldown 2: the momentum's cooldown would begin within the --debug_steps 10 steps of "
     "--num_iterations 10, and the debug state's header holds no cooldown, so test_gpt2cu would step without it; give "
     "--num_iterations 12 or more, or drop the cooldown"),
    (["--muon_momentum_cooldown", "2"],
     "error: --muon_momentum_cooldown sets Muon, which --optimizer adamw does not use; add --optimizer muon or drop it"),
]
for flags, expected in cases:
    message = error(*flags)
    assert message == expected, (flags, message)
    print(f"{' '.join(flags)}: {message}")
args = tg.parse_args(["--input_bin", "x", "--num_iterations", "10", "--stages", "1; +5", "--optimizer", "muon",
                      "--muon_momentum_cooldown", "15"])
tg.check_args(args)
plan = tg.stage_plan(args, 1)
momenta = [tg.muon_momentum(s, args, plan.steps) for s in range(plan.steps + 1)]
assert momenta[0] == 0.95 and momenta[-1] == 0.85 and all(a > b for a, b in zip(momenta, momenta[1:])), momenta
print("a cooldown as long as the run's 15 steps: 0.95 at step 0, falling at every step to 0.85 at step 15")
EOF

check "the document cap: rows cut as specified on shards written here" <<'EOF'
import os, sys, numpy as np, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from documents_reference import write_shard
work = os.environ["WORK"]
def shard(name, length, starts):  # token i is 1000 + i, a document start 50256
    tokens = 1000 + np.arange(length)
    tokens[starts] = tg.DOCUMENT_START
    write_shard(f"{work}/{name}.bin", tokens)
    return tokens
a = shard("cap_000", 40, [0, 5, 7, 15, 16, 30])
b = shard("cap_001", 40, [3, 10, 20, 38])
loader = tg.DocumentLoader(f"{work}/cap_*.bin", "test", 1, 7, 1, 0, 1, False, 0, 50304, cap=3)
rows = []
for _ in range(3):
    x, y = loader.next_batch()
    rows.append(np.concatenate([x[0].numpy(), y[0, -1:].numpy()]))
# 1: 3 of [0, 5), all 2 of [5, 7), 3 of [7, 15); next from 15, the document start after 7.
# 2: 1 of [15, 16), 3 of [16, 30), 3 of [30, 40): no document start is left before 8 tokens, so the
#    step is read from the next shard's first document start: 3 of [3, 10), 3 of [10, 20), 2 of [20, 38).
# 3: 2 of [38, 40) and no document start left: the next epoch's first shard, as row 1.
expected = [a[[0, 1, 2, 5, 6, 7, 8, 9]], b[[3, 4, 5, 10, 11, 12, 20, 21]], a[[0, 1, 2, 5, 6, 7, 8, 9]]]
for i, (got, want) in enumerate(zip(rows, expected)):
    assert (got == want).all(), (i, got, want)
assert loader.epoch == 1
shard("short_000", 20, [0, 10])  # documents capped at 3 hold 6 tokens, fewer than 8
try:
    tg.DocumentLoader(f"{work}/short_*.bin", "test", 1, 7, 1, 0, 1, False, 0, 50304, cap=3)
    raise AssertionError("no error for a shard whose capped documents are too short for a row")
except SystemExit as e:
    assert str(e) == (f"error: {work}/short_000.bin: its documents, capped at 3 tokens each, hold fewer than one "
                      "step's 1 sequence of T+1 = 8 tokens from its first document start: use a smaller --seq_len "
                      "or --total_batch_size, a larger cap, or longer shards"), str(e)
print("cap 3, T 7: rows of capped documents, a step the shard cannot finish read from the next shard; "
      "too few capped tokens in a fresh shard: the error")
EOF

check "reshape between steps: a loader built at the step's start; the same shape: nothing" <<'EOF'
import copy, os, sys, numpy as np, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from documents_reference import write_shard, documents
work = os.environ["WORK"]
rng = np.random.default_rng(3)
for i in range(3):
    write_shard(f"{work}/docs_{i:03d}.bin", documents(rng, [int(n) for n in rng.integers(1, 160, 40)]))
pattern = f"{work}/docs_*.bin"
def loader(shape, rank=1):
    T, grad_accum, cap = shape
    return tg.DocumentLoader(pattern, "test", 2, T, grad_accum, rank, 2, True, 5, 50304, cap)
def steps(loader, n):  # the rows of n steps
    return [torch.cat([torch.cat([x, y[:, -1:]], 1) for x, y in (loader.next_batch()
                                                                for _ in range(loader.grad_accum))]) for _ in range(n)]
def built_at(state, shape):  # a loader of this shape whose next step's search begins at state
    fresh = loader(shape)
    fresh.epoch, fresh.shard_order, shard_position, position, (mt, index) = copy.deepcopy(state)
    fresh.rng.state, fresh.rng.index = mt, index
    fresh._open_shard(shard_position)
    fresh.position = position
    fresh._read_step()
    return fresh
old, new = (16, 2, 0), (32, 1, 20)
for taken in (0, 1, 7, 25):  # 25 steps cross an epoch
    reshaped = loader(old)
    steps(reshaped, taken)
    state = reshaped.step_start
    reshaped.reshape(*new)
    expected = steps(built_at(state, new), 6)
    assert all(torch.equal(a, b) for a, b in zip(steps(reshaped, 6), expected)), taken
    back = loader(old)
    steps(back, taken)
    rows_before = back.rows
    back.reshape(*new)
    back.reshape(*old)
    kept = loader(old)
    steps(kept, taken)
    rows_kept, index_kept = kept.rows, kept.rng.index
    kept.reshape(*old)
    assert kept.rows is rows_kept and kept.rng.index == index_kept, "the same shape re-read the step"
    assert taken < 25 or reshaped.epoch > 0, "25 steps stay in the first epoch"
    assert torch.equal(back.rows, rows_before)
    assert all(torch.equal(a, b) for a, b in zip(steps(back, 6), steps(kept, 6)))
    print(f"after {taken} steps: reshaped (T 16, 2 micro steps, cap 0 -> T 32, 1, cap 20) reads what a loader "
          f"built there reads; there and back reads on as without; the same shape changes nothing")
assert all(torch.equal(a, b) for a, b in zip(steps(loader(new), 4), steps(built_at(loader(old).step_start, new), 4)))
EOF

echo "--- a two-stage run on document shards (t 128 -> 256, cap 0 -> 100 -> 60) is the same twice"
"$PYTHON" - <<EOF
import sys, numpy as np
sys.path.insert(0, "dev/test")
from documents_reference import write_shard, documents
rng = np.random.default_rng(11)
for i in range(2):
    write_shard(f"$WORK/train_{i:03d}.bin", documents(rng, [int(n) for n in rng.integers(1, 400, 400)]))
EOF
RUN=("${TINY[@]}" --input_bin "$WORK/train_*.bin" --documents 1 --window_blocks 1 -b 2 -t 128 --num_iterations 6
     --total_batch_size 512 --warmup_iters 2 --stages "1/2; 1/2 t=256 z=-1 cap=100 aw=2 lr=0.5; +2 cap=60")
"$PYTHON" train_gpt2.py "${RUN[@]}" > "$WORK/run1"
"$PYTHON" train_gpt2.py "${RUN[@]}" > "$WORK/run2"
grep -E '^stage [0-9]' "$WORK/run1"
step_values() { grep -E '^step +[0-9]+/8 \| loss' "$1" | cut -d'|' -f1-4; }
step_values "$WORK/run1"
[ "$(step_values "$WORK/run1" | wc -l)" -eq 8 ] || { echo "FAIL: the run did not take its 8 steps"; exit 1; }
[ "$(step_values "$WORK/run1")" = "$(step_values "$WORK/run2")" ] || { echo "FAIL: the two runs differ"; exit 1; }
echo "ok: 8 steps (6 and 2 of extension), the same twice"

echo "--- the final validation's long window (--final_window_blocks): only the validation after the last step"
FINAL=("${TINY[@]}" --input_bin "$WORK/train_*.bin" --input_val_bin "$WORK/train_*.bin" --val_every 4 --val_steps 1
       --documents 1 -b 2 -t 256 --num_iterations 6 --total_batch_size -1 --stages "1/2 aw=2; 1/2 lr=0.5; +2 aw=1")
"$PYTHON" train_gpt2.py "${FINAL[@]}" > "$WORK/last_stage"
"$PYTHON" train_gpt2.py "${FINAL[@]}" --final_window_blocks 2 > "$WORK/final_window"
val_loss() { grep -E "^step +$2/8 \| train time .* \| val loss" "$1" | sed 's/.*val loss //'; }
for step in 0 4 8; do echo "step $step: val loss $(val_loss "$WORK/last_stage" $step), $(val_loss "$WORK/final_window" $step) with 2"; done
[ -n "$(val_loss "$WORK/last_stage" 8)" ] && [ "$(step_values "$WORK/last_stage")" = "$(step_values "$WORK/final_window")" ] &&
  [ "$(val_loss "$WORK/last_stage" 0)" = "$(val_loss "$WORK/final_window" 0)" ] &&
  [ "$(val_loss "$WORK/last_stage" 4)" = "$(val_loss "$WORK/final_window" 4)" ] &&
  [ "$(val_loss "$WORK/last_stage" 8)" != "$(val_loss "$WORK/final_window" 8)" ] ||
  { echo "FAIL: --final_window_blocks 2 should change the step-8 validation alone"; exit 1; }
echo "ok: the same steps and validations but the last, at a long window of 2 blocks in place of the extension's 1"

echo "--- the debug state of a plan: its text in the header, the steps it takes"
"$PYTHON" train_gpt2.py "${TINY[@]}" --write_debug_state "$WORK/debug" -b 2 -t 256 --debug_steps 5 --documents 1 \
  --window_blocks 2 --stages "1/2 t=128 aw=1; 1/2 lr=0.5; +1 t=256 aw=0" > "$WORK/debug.out"
"$PYTHON" train_gpt2.py "${TINY[@]}" --write_debug_state "$WORK/plain" -b 2 -t 256 --debug_steps 5 --documents 1 \
  --window_blocks 2 > "$WORK/plain.out"
check "the debug state of a plan" <<'EOF'
import os, numpy as np, torch, train_gpt2 as tg
work = os.environ["WORK"]
name = "gpt2_l2h4c128t256v50304_debug_state.bin"
header, x, y, floats = tg.read_debug_state(f"{work}/debug/{name}")
plain, px, py, pfloats = tg.read_debug_state(f"{work}/plain/{name}")
assert tg.debug_state_stages(header) == "1/2 t=128 aw=1; 1/2 lr=0.5; +1 t=256 aw=0" and header[31] == 41
assert tg.debug_state_stages(plain) == "" and (plain[31:] == 0).all()
assert header[4] == 5 and header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and header[22] == 2
assert (header[:31] == plain[:31]).all() and torch.equal(x, px)
# the first step's values are the whole batch's at --window_blocks, with or without a plan
assert np.array_equal(floats[:-5], pfloats[:-5])
losses, plain_losses = floats[-5:], pfloats[-5:]
assert losses[0] != plain_losses[0] and all(np.isfinite(losses)), (losses, plain_losses)
print(f"header slot 31 = 41 bytes of plan; the step count 5 (4 and 1 of extension); the logits and gradients "
      f"the plain state's; the losses {np.round(losses, 6).tolist()}")
EOF
check "record #89's loss weights a step (mtp=, pw=): linear within a stage, float32" <<'EOF'
import numpy as np, train_gpt2 as tg
record89 = "1/3 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; 1/3 mtp=1,0.5>1,0 pw=0.25>0; 1/3 mtp=1 pw=0; +15"
plan = tg.stage_plan(tg.parse_args(["--input_bin", "x", "--num_iterations", "1270", "--stages", record89]), 1)
weights = {s: (plan.step(s).next_token_weights, plan.step(s).prefix_weight) for s in (0, 422, 423, 846, 847, 1285)}
f32 = lambda x: float(np.float32(x))
assert weights == {0: ([1.0, 0.5, 0.25], 0.25), 422: ([1.0, 0.5, f32(0.25 - 0.25 * (422 / 423))], 0.25),
                   423: ([1.0, 0.5], 0.25), 846: ([1.0, f32(0.5 - 0.5 * (423 / 424))], f32(0.25 - 0.25 * (423 / 424))),
                   847: ([1.0], 0.0), 1285: ([1.0], 0.0)}, weights
assert plan.has_prefix_term() and "mtp 1,0.5>1,0, pw 0.25>0" in plan.table()[1]
flags = tg.stage_plan(tg.parse_args(["--input_bin", "x", "--num_iterations", "10", "--mtp", "1,0.5",
                                     "--prefix_weight", "0.1", "--stages", "1/2; 1/2 pw=0"]), 1)
assert (flags.step(0).next_token_weights, flags.step(0).prefix_weight, flags.step(5).prefix_weight) == (
    [1.0, 0.5], f32(0.1), 0.0)
print("3, 2 and 1 weights; w2 0.25 -> 0, then w1 0.5 -> 0 and the prefix 0.25 -> 0; --mtp and --prefix_weight fill "
      "the first stage")
EOF

echo "--- the debug state of a plan with loss weights: the steps take each step's weights"
# A vocabulary of the 256 bytes, then pairs of bytes (each with its first byte as its prefix token), then
# the end of text: the prefix term applies at most positions of the random batch.
PYTHONPATH=. "$PYTHON" - <<'EOF'
import os, numpy as np, train_gpt2 as tg
tokens = [bytes([i]) for i in range(256)] + [bytes(divmod(i, 256)) for i in range(tg.GPT2_EOT_TOKEN - 256)]
header = np.zeros(tg.TOKENIZER_HEADER_INTS, np.int32)
header[:4] = [tg.TOKENIZER_MAGIC, 2, len(tokens) + 1, tg.GPT2_EOT_TOKEN]
with open(os.path.join(os.environ["WORK"], "pairs_tokenizer.bin"), "wb") as f:
    f.write(header.tobytes() + b"".join(bytes([len(t)]) + t for t in tokens + [b"<|endoftext|>"]))
EOF
LOSS=("${TINY[@]}" -b 2 -t 256 --debug_steps 4 --tokenizer "$WORK/pairs_tokenizer.bin")
"$PYTHON" train_gpt2.py "${LOSS[@]}" --write_debug_state "$WORK/ramp" \
  --stages "1/2 mtp=1,0.5>1,0 pw=0.25>0; 1/2 mtp=1 pw=0" > "$WORK/ramp.out"
"$PYTHON" train_gpt2.py "${LOSS[@]}" --write_debug_state "$WORK/constant" --stages "1 mtp=1,0.5 pw=0.25" \
  > "$WORK/constant.out"
"$PYTHON" train_gpt2.py "${LOSS[@]}" --write_debug_state "$WORK/flags" --mtp 1,0.5 --prefix_weight 0.25 \
  > "$WORK/flags.out"
check "the debug state of a plan with loss weights" <<'EOF'
import os, numpy as np, train_gpt2 as tg
work = os.environ["WORK"]
name = "gpt2_l2h4c128t256v50304_debug_state.bin"
def losses(folder):
    header = tg.read_debug_state(f"{work}/{folder}/{name}", header_only=True)
    return header, tg.read_debug_state(f"{work}/{folder}/{name}")[3][-4:]
(ramp_header, ramp), (_, constant), (_, flags) = losses("ramp"), losses("constant"), losses("flags")
text, prefix, _ = tg.read_debug_state_settings(f"{work}/ramp/{name}", ramp_header)
assert ramp_header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and text == "-pw 0.0" and prefix is not None, (text, prefix)
assert np.array_equal(constant, flags), (constant, flags)
assert ramp[0] == flags[0] and all(ramp[1:] != flags[1:]) and all(np.isfinite(ramp)), (ramp, flags)
print(f"a plan's constant mtp= and pw= take the steps --mtp and --prefix_weight take ({np.round(flags, 6).tolist()}); "
      f"the ramp the same first step, then its own ({np.round(ramp, 6).tolist()}); the prefix table kept "
      f"with -pw 0.0 for its steps")
EOF
echo "test_stages_py: all passed"
