#!/usr/bin/env bash
# Tests dev/error_budget.py without a GPU: its three commands (--dry_run), the errors read from
# test_gpt2cu's and train_gpt2.py --check_debug_state's lines (fabricated in their formats) and the
# table made of them, and the one-line error without ./test_gpt2cu. Scratch files go to
# build/test_tmp/error_budget.
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/error_budget
rm -rf "$DIR"
mkdir -p "$DIR"
source "$(dirname "$0")/lib.sh"
PY=${PYTHON:-python3}

out=$("$PY" dev/error_budget.py "$DIR/a" --train 'shards/t_*.bin' --python python3 --dry_run 2>&1)
check "dry run exits 0" "$?" 0
check "the float32 state: the speedrun at its training length, window 5, noise, one step" "$(sed -n 1p <<< "$out")" \
  "=== python3 train_gpt2.py --recipe speedrun --model d12 --debug_noise 0.02 --window_blocks 5 -b 1 -t 49152 --input_bin 'shards/t_*.bin' --flash 1 --write_debug_state $DIR/a/state --debug_steps 1"
check "ours: test_gpt2cu on the state's model and state" "$(sed -n 2p <<< "$out")" \
  "=== ./test_gpt2cu $DIR/a/state/MODEL.bin $DIR/a/state/STATE_debug_state.bin"
check "PyTorch: the same step in bfloat16 as it trains" "$(sed -n 3p <<< "$out")" \
  "=== python3 train_gpt2.py --recipe speedrun --init_from $DIR/a/state/MODEL.bin --check_debug_state $DIR/a/state/STATE_debug_state.bin --dtype bfloat16 --flash 1"
out=$("$PY" dev/error_budget.py "$DIR/t" --init_from runs/model_00000100.bin --python python3 --dry_run 2>&1)
check "--init_from: the checkpoint's weights in place of --model, no noise" "$(sed -n 1p <<< "$out")" \
  "=== python3 train_gpt2.py --recipe speedrun --init_from runs/model_00000100.bin --window_blocks 5 -b 1 -t 49152 --flash 1 --write_debug_state $DIR/t/state --debug_steps 1"
out=$("$PY" dev/error_budget.py "$DIR/t" --init_from runs/model_00000100.bin --noise 0.01 --python python3 --dry_run 2>&1)
check "--init_from with --noise: the noise added" "$(sed -n 1p <<< "$out" | grep -c -e '--init_from runs/model_00000100.bin --debug_noise 0.01 ')" 1
out=$("$PY" dev/error_budget.py "$DIR/t" --fp8_head --python python3 --dry_run 2>&1)
check "--fp8_head: the state and PyTorch's check with the FP8 head, ours reads it from the state" \
  "$(grep -c -e '--flash 1 --fp8_head 1 --write_debug_state' <<< "$(sed -n 1p <<< "$out")"):$(sed -n 2p <<< "$out" | grep -c fp8):$(sed -n 3p <<< "$out" | grep -c -e '--flash 1 --fp8_head 1$')" 1:0:1
err=$("$PY" dev/error_budget.py "$DIR/t" --init_from "$DIR/missing.bin" 2>&1 >/dev/null)
check "--init_from a missing file: exit 1, one line naming it" \
  "$?:$(wc -l <<< "$err"):$(grep -c -e "--init_from $DIR/missing.bin: no such file" <<< "$err")" 1:1:1
check "and nothing written" "$(ls "$DIR" | grep -c '^t$')" 0
out=$("$PY" dev/error_budget.py "$DIR/b" --recipe gpt2 --model tiny --window_blocks 0 -t 64 --python python3 --dry_run 2>&1)
check "random tokens and no window: neither flag" "$(sed -n 1p <<< "$out" | grep -c -e '--input_bin' -e '--window_blocks')" 0
# Once the state is written, its files are the commands' (the model: not the BF16 copy, not the state).
mkdir -p "$DIR/b/state"
touch "$DIR/b/state/gpt2_tiny.bin" "$DIR/b/state/gpt2_tiny_bf16.bin" "$DIR/b/state/gpt2_tiny_debug_state.bin"
check "the written model and state named" "$("$PY" dev/error_budget.py "$DIR/b" --dry_run | sed -n 2p)" \
  "=== ./test_gpt2cu $DIR/b/state/gpt2_tiny.bin $DIR/b/state/gpt2_tiny_debug_state.bin"

cat > "$DIR/ours.log" <<'EOF'
BF16 build, model speedrun L=12 NH=6 C=768 maxT=262144 V=50257 Vp=50304, B=1 T=49152, 1 steps
ok   logits                   n=2470232064 max abs 4.127e-02  max rel 3.265e-01  (atol 1.0e-01 rtol 0.0e+00)
ok   loss 11.0000000 vs PyTorch 10.0000000 (tolerance 5e-02)
ok   grad wte                 n=38633472   |got-ref|/|ref| 6.000e-03  (bound 4.0e-02)
ok   grad wpe                 n=0          |got-ref|/|ref| 0.000e+00  (bound 4.0e-02)
FAIL grad qkvw                n=19464192   |got-ref|/|ref| 5.000e-02  (bound 4.0e-02)
ok   grad lambdas             n=24         |got-ref|/|ref| 1.200e-02  (bound 4.0e-02)
ok   step  0 loss 11.089597 vs PyTorch 11.091007 (diff 1.41e-03, tolerance 5e-02)
EOF
cat > "$DIR/pytorch.log" <<'EOF'
bfloat16 as training computes it (parameter and compute dtypes) against STATE's float32:
logits                   n=2470232064 |got-ref|/|ref| 5.000e-03
loss                     n=1          |got-ref|/|ref| 2.000e-02
grad wte                 n=38633472   |got-ref|/|ref| 3.000e-03
grad qkvw                n=19464192   |got-ref|/|ref| 1.000e-02
grad headw               n=38633472   |got-ref|/|ref| 4.000e-03
grad lambdas             n=24         |got-ref|/|ref| 0.000e+00
EOF
table=$("$PY" - "$DIR" <<'EOF'
import sys
sys.path.insert(0, "dev")
import error_budget as eb
ours, pytorch = eb.ours_errors(open(sys.argv[1] + "/ours.log").read()), eb.pytorch_errors(open(sys.argv[1] + "/pytorch.log").read())
print("\n".join(eb.budget_table(ours, pytorch)))
EOF
)
check "the table: header, then the loss and each gradient with values, in PyTorch's order" \
  "$(sed -n '3,$p' <<< "$table" | cut -d'|' -f2 | tr -d ' ' | tr '\n' ' ')" "loss gradwte gradqkvw gradheadw gradlambdas "
check "the loss: ours' first step's relative difference (the curve's lines not read), 5x PyTorch's" \
  "$(grep '^| loss ' <<< "$table")" "| loss | 1 | 1.000e-01 | 2.000e-02 | 5.00 |"
check "a gradient in both: the ratio" "$(grep '^| grad wte ' <<< "$table")" "| grad wte | 38633472 | 6.000e-03 | 3.000e-03 | 2.00 |"
check "a failed bound is still read" "$(grep '^| grad qkvw ' <<< "$table")" "| grad qkvw | 19464192 | 5.000e-02 | 1.000e-02 | 5.00 |"
check "a tensor ours did not print: '-'" "$(grep '^| grad headw ' <<< "$table")" "| grad headw | 38633472 | - | 4.000e-03 | - |"
check "PyTorch's error 0: no ratio" "$(grep '^| grad lambdas ' <<< "$table")" "| grad lambdas | 24 | 1.200e-02 | 0.000e+00 | - |"

mkdir -p "$DIR/elsewhere"
err=$(cd "$DIR/elsewhere" && "$PY" "$OLDPWD/dev/error_budget.py" out 2>&1 >/dev/null)
check "without ./test_gpt2cu: exit 1, one line naming the fix" \
  "$?:$(wc -l <<< "$err"):$(grep -c 'run make test_gpt2cu first' <<< "$err")" 1:1:1
check "and nothing written" "$(ls "$DIR/elsewhere")" ""

finish test_error_budget
