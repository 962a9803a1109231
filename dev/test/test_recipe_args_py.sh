#!/usr/bin/env bash
# Tests train_gpt2.py's arguments whose defaults depend on the recipe as the CUDA trainer's do
# (llmc/recipe.h): --val_steps on N processes (process_val_steps; the CUDA trainer's -m in
# dev/test/test_schedulers.cpp): the speedrun recipe's 40 batches are shared by the processes,
# given --val_steps and the other recipes' are each process's, and a share that is not whole is
# refused with one line naming the flag; --shuffle: the speedrun reads its shards in name order;
# --recipe record89: the arguments of the CUDA trainer's record #89 command, the reference's AdamW rows and
# Muon's rates in the optimizers' groups, a checkpoint taken as it is.
#
#   bash dev/test/test_recipe_args_py.sh     (PYTHON=... to pick the python with torch)
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh
require_python torch test_recipe_args_py PYTHON

steps() {
  PYTHONPATH=. "$PY" - "$@" <<'EOF' 2>&1
import sys
import train_gpt2 as tg
world, argv = int(sys.argv[1]), sys.argv[2:]
print(tg.process_val_steps(tg.parse_args(argv + ["--input_bin", "x"]), world))
EOF
}

check "speedrun on 1, 2 and 8 processes: 40, 20 and 5 batches each" \
  "$(steps 1 --recipe speedrun) $(steps 2 --recipe speedrun) $(steps 8 --recipe speedrun)" "40 20 5"
check "record89 on 2 processes: 20 batches each, as the speedrun" "$(steps 2 --recipe record89)" 20
check "speedrun with --val_steps 7 on 8 processes: 7 each, as given" "$(steps 8 --recipe speedrun --val_steps 7)" 7
check "modern and GPT-2 on 8 processes: 20 each" "$(steps 8 --recipe modern) $(steps 8)" "20 20"
out=$(steps 3 --recipe speedrun)
check "speedrun on 3 processes: exit 1, one line naming --val_steps" "$?:$out" \
  "1:error: --val_steps: --recipe speedrun validates on 40 batches in all, which 3 processes cannot share evenly: give --val_steps, the batches of each process"

shuffle() {
  PYTHONPATH=. "$PY" -c 'import sys, train_gpt2 as tg; print(tg.parse_args(sys.argv[1:] + ["--input_bin", "x"]).shuffle)' "$@" 2>&1
}
check "--shuffle: 0 for the speedrun (given: as given), 1 for the others" \
  "$(shuffle --recipe speedrun) $(shuffle --recipe speedrun --shuffle 1) $(shuffle --recipe modern) $(shuffle)" "0 1 1 1"

# --recipe record89 is the speedrun's with the python twins of the CUDA trainer's record #89 command
# (dev/notes/record89-reference.md, "Our flags for record #89"), its AdamW rows by tensor (--adam_rows) and
# Muon's rates of the MLP's matrices (--muon_tensor_lr): every argument the same but the recipe's name and
# which arguments came from it.
rows="wte:rate=0.008,b1=0.5,b2=0.95,decay=0.75,bf16=weight;"
rows+="headw:rate=0.008,b1=0.5,b2=0.95,decay=0.75,bf16=weight;"
rows+="ve:rate=0.6,b1=0.75,b2=0.95,decay=0.025,bf16=weight;"
rows+="bigram:rate=0.6,b1=0.75,b2=0.95,decay=0.025,bf16=weight;"
rows+="smearw:rate=8e-05,b1=0.9,b2=0.99,decay=0,bf16=weight;"
rows+="smear_lambda:rate=0.04,b1=0.9,b2=0.99,decay=0;"
rows+="vegate:rate=0.008,b1=0.9,b2=0.99,decay=0.005,bf16=weight;"
rows+="resid_lambdas:rate=0.04,b1=0.9,b2=0.95,decay=0;post_lambdas:rate=0.008,b1=0.9,b2=0.95,decay=0;"
rows+="skip_gate:rate=0.04,b1=0.9,b2=0.99,decay=0;attn_lambdas:rate=0.04,b1=0.9,b2=0.99,decay=0;"
rows+="mudd_gate_w1:rate=0.0008,b1=0.9,b2=0.99,decay=0.005,bf16=weight;"
rows+="mudd_gate_w2:rate=0.0008,b1=0.9,b2=0.99,decay=0.005,bf16=weight;"
rows+="mudd_gate_b2:rate=0.0008,b1=0.9,b2=0.99,decay=0,bf16=weight;"
rows+="mudd_gate_scale:rate=0.0008,b1=0.9,b2=0.99,decay=0;"
rows+="mudd_w1:rate=0.002,b1=0.9,b2=0.99,decay=0.005,bf16=weight;"
rows+="mudd_w2:rate=0.002,b1=0.9,b2=0.99,decay=0.005,bf16=weight;"
rows+="mudd_b2:rate=0.002,b1=0.9,b2=0.99,decay=0,bf16=weight"
stages="1/3 t=16384 z=131072 cap=896 aw=1/3 lr=1 mtp=1,0.5,0.25>1,0.5,0 pw=0.25;"
stages+=" 1/3 t=32768 z=262144 cap=2048 aw=3/7 lr=1.52 mtp=1,0.5>1,0 pw=0.25>0;"
stages+=" 1/3 t=49152 z=393216 aw=5/11 lr=1.73 mtp=1 pw=0; +15 aw=6/13"
record89_flags=(--recipe speedrun --record89_plan 1 --paired_heads 1 --rotary_pairs 1 --window_tokens 1
  --key_offset 1 --yarn 1 --mlp_from_output 1 --attention_scale 0.1 --smear 1 --bigram 1 --ve_gates 1 --resid_lambdas 1 --xsa 1
  --attn_lambdas 1 --mudd_gates 1 --composed_attention 1 --mudd_connections 1 --record_init 89 --num_iterations 1270 --stages "$stages"
  --final_window_blocks 20 --lr_schedule cooldown --cooldown_frac 0.6 --final_lr_frac 0.15
  --muon_momentum_cooldown 50 --muon_ns polar --normuon 1 --muon_qk_heads 2 --cautious_decay 1 --muon_lr 0.023
  --muon_weight_decay 1.2 --weight_decay 0.005 --adam_every 2 --untie_step 847 --logit_cap 23,5,bf16
  --fp8_head_scales 100,1.6,0.75 --prefix_weight 0.25 --val_every 250 --val_seq_len 262144 --val_steps 40
  --adam_rows "$rows" --muon_tensor_lr fcw=2,fcprojw=4)
out=$(PYTHONPATH=. "$PY" - "${record89_flags[@]}" <<'EOF' 2>&1
import sys
import train_gpt2 as tg
recipe = vars(tg.parse_args(["--recipe", "record89", "--input_bin", "x"]))
flags = vars(tg.parse_args(sys.argv[1:] + ["--input_bin", "x"]))
keys = [key for key in recipe if key not in ("recipe", "from_recipe")]
differing = [f"{key}: {recipe[key]!r} / {flags[key]!r}" for key in keys
             if recipe[key] != flags[key] or type(recipe[key]) is not type(flags[key])]
print(f"{len(keys)} arguments;", "; ".join(differing) or "all the same")
EOF
)
check "--recipe record89: every argument the command's (but --recipe and which came from it)" \
  "${out#* arguments; }" "all the same"
echo "     ${out%%;*} compared"

# The other recipes keep the defaults the arguments record #89 added to the recipes' table had.
out=$(PYTHONPATH=. "$PY" - <<'EOF' 2>&1
import train_gpt2 as tg
before = {"stages": "", "final_window_blocks": 0, "window_tokens": 0, "key_offset": 0, "yarn": 0,
          "attention_scale": None, "untie_step": -1, "adam_every": 1, "adam_rows": "", "logit_cap": None,
          "prefix_weight": 0.0, "fp8_head_scales": None, "record_init": 0, "val_every": 0,
          **{key: None for key in tg.RECORD89_SWITCHES}}
for recipe in (None, "gpt2", "modern", "speedrun"):
    args = vars(tg.parse_args((["--recipe", recipe] if recipe else []) + ["--input_bin", "x"]))
    print(recipe, [f"{key}={args[key]!r}" for key in before if args[key] != before[key]] or "as before")
EOF
)
check "gpt2, modern and speedrun: record #89's arguments as before" "$out" "None as before
gpt2 as before
modern as before
speedrun as before"

# The optimizers' groups of a record89 model (tiny): each AdamW tensor of the reference's table at its
# rate 0.008 x lr_mul, decay 0.005 x wd_mul (products in double, as there) and betas, the others the
# scalars' role's; Muon's fc at 0.023 x 2, its projection at 0.023 x 4; without the bigram table its
# row is left out.
out=$(PYTHONPATH=. "$PY" - <<'EOF' 2>&1
import train_gpt2 as tg
reference = {"wte": (1, 150, 0.5, 0.95), "headw": (1, 150, 0.5, 0.95), "ve": (75, 5, 0.75, 0.95),
             "bigram": (75, 5, 0.75, 0.95), "attn_lambdas": (5, 0, 0.9, 0.99), "smear_lambda": (5, 0, 0.9, 0.99),
             "skip_gate": (5, 0, 0.9, 0.99), "smearw": (0.01, 0, 0.9, 0.99), "vegate": (1, 1, 0.9, 0.99),
             "resid_lambdas": (5, 0, 0.9, 0.95), "post_lambdas": (1, 0, 0.9, 0.95),
             "mudd_gate_w1": (0.1, 1, 0.9, 0.99), "mudd_gate_w2": (0.1, 1, 0.9, 0.99),
             "mudd_gate_b2": (0.1, 0, 0.9, 0.99), "mudd_gate_scale": (0.1, 0, 0.9, 0.99),
             "mudd_w1": (0.25, 1, 0.9, 0.99), "mudd_w2": (0.25, 1, 0.9, 0.99), "mudd_b2": (0.25, 0, 0.9, 0.99)}
muon = {"qkvw": 0.023, "attprojw": 0.023, "fcw": 0.023 * 2, "fcprojw": 0.023 * 4}
for extra in ([], ["--bigram", "0"]):
    args = tg.parse_args(["--recipe", "record89", "--model", "tiny", "--input_bin", "x"] + extra)
    tg.check_args(args)
    model = tg.GPT(tg.resolve_config(args))
    names = {id(p): tg.table_name(n) for n, p in model.named_parameters()}
    wrong, seen = [], set()
    for kind, group in tg.optimizer_groups(model, args):
        for p in group["params"]:
            name = names[id(p)]
            seen.add(name)
            if kind == "muon":
                got, want = group.get("lr", args.muon_lr) * group.get("lr_scale", 1.0), muon[name]
            elif name in reference:
                lr_mul, wd_mul, b1, b2 = reference[name]
                got = (group["lr"], group["weight_decay"], group["betas"])
                want = (0.008 * lr_mul, 0.005 * wd_mul, (b1, b2))
            else:
                got, want = (group["lr"], group["betas"]), (0.008 * 5, (0.8, 0.95))
            if got != want:
                wrong.append(f"{name} {got} not {want}")
    print(len(seen), "tensors:", "; ".join(wrong) or "all the reference's")
EOF
)
check "record89's tiny model: each tensor's group the reference's rate, decay and betas; Muon's rates" "$out" \
  "27 tensors: all the reference's
25 tensors: all the reference's"

# A recipe's model switches and init stand for the models it makes from a preset: a checkpoint given
# with --recipe record89 is taken as it is; the recipe's FP8 head scales wait for --fp8_head 1.
out=$(PYTHONPATH=. "$PY" - "$(mktemp -d)/model.bin" <<'EOF' 2>&1
import sys
import train_gpt2 as tg
config = tg.make_config(11, 2, 128, 256, 512, "x", arch="speedrun", record89_plan=True)
tg.write_checkpoint(tg.GPT(config), sys.argv[1], tg.CHECKPOINT_FP32)
args = tg.parse_args(["--recipe", "record89", "--init_from", sys.argv[1], "--input_bin", "x"])
tg.check_args(args)
print(tg.resolve_config(args), args.fp8_head, args.fp8_head_scales)
EOF
)
check "--recipe record89 --init_from a checkpoint: taken; the FP8 head's scales read, --fp8_head 0" "$out" \
  "None 0 (100.0, 1.6, 0.75)"

finish test_recipe_args_py
