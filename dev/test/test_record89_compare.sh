#!/usr/bin/env bash
# Tests dev/record89_compare.py on record #89's tiny model (train_gpt2.py, CPU): ours' BF16 checkpoint
# of an init against the script's state dict of the same init with known changes (one element of one
# bank matrix a BF16 spacing up, one of the MLP bank's matrices and the third value embedding
# doubled, a float32 scalar moved by a quarter of a spacing, the FP8 scale buffers moved): a line a
# tensor, those changes found where they are and nothing else; with --init (the init, the vo_bank
# element halfway between ours and the script's in float32) the updates compared too: that element
# moved in opposite directions, its bank's updates 2 apart relative to the script's, the doubled
# matrices and the moved scalar 1; and its one-line errors (a missing file, a file that holds no
# state dict, a state dict of another process count, for the script's state and for --init's, an
# --init without one of the script's tensors).
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh
require_python "torch numpy" test_record89_compare PYTHON
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
TOKENIZER=$WORK/vocab.bin
require_vocab "$TOKENIZER" test_record89_compare

setup=$("$PY" - "$TOKENIZER" "$WORK" <<'PYEOF' 2>&1
import sys
sys.path.insert(0, "dev")
sys.path.insert(0, ".")
import torch
import record89_state as rs
import train_gpt2 as tg

model, signs = rs.record89_model(7, sys.argv[1], "tiny")
work = sys.argv[2]
tg.write_checkpoint(model, f"{work}/ours.bin", tg.CHECKPOINT_BF16)
state = rs.script_state(model, signs)
init = rs.script_state(model, signs)
bank = state["vo_bank"]
value = bank[3, 2, 5].float()
bank[3, 2, 5] = torch.nextafter(value.to(torch.bfloat16), torch.tensor(float("inf"), dtype=torch.bfloat16))
init["vo_bank"] = init["vo_bank"].float()
init["vo_bank"][3, 2, 5] = (value + bank[3, 2, 5].float()) / 2
torch.save(init, f"{work}/init.pt")
del init["mudd_w1"]
torch.save(init, f"{work}/init_short.pt")
state["mlp_bank"][1, 0] *= 2  # layer 1's up projection: matrix 2 (zero-initialised down projections)
V = state["embed.weight"].shape[0]
state["value_embeds"][2 * V:3 * V] *= 2
spacing = 2.0 ** (torch.floor(torch.log2(state["scalars"][1].abs())) - 7)
state["scalars"][1] += spacing / 4
for name in rs.FP8_SCALE_BUFFERS:
    state[name] *= 2
torch.save(state, f"{work}/script.pt")
torch.save(rs.script_state(model, signs, 8), f"{work}/script8.pt")
torch.save([1, 2], f"{work}/list.pt")
print(len(state))
PYEOF
)
check "the states are written (tiny model, seed 7)" "$?:$setup" "0:23"

out=$("$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/script.pt" 2>&1)
check "the comparison exits 0 with a row a compared tensor" "$?:$(grep -c '^| [a-z_.0-9]* | [0-9]' <<< "$out")" "0:20"
check "vo_bank: one element one BF16 spacing apart, in matrix 3" \
  "$(grep '^| vo_bank |' <<< "$out" | cut -d'|' -f4,5,7 | sed 's/ (.*//')" " 1 | 1 | 3"
check "scalars: one element a quarter of a BF16 spacing apart" "$(grep '^| scalars |' <<< "$out" | cut -d'|' -f4,5)" " 1 | 0.25 "
# Each doubled matrix: ours is half the script's there, a relative L2 difference of 0.5.
check "mlp_bank: layer 1's up projection (matrix 2) differs most" "$(grep '^| mlp_bank |' <<< "$out" | cut -d'|' -f7)" \
  " 2 (5.00e-01) "
check "value_embeds: the third one differs most" "$(grep '^| value_embeds |' <<< "$out" | cut -d'|' -f7)" " 2 (5.00e-01) "
check "every other tensor the same" "$(grep '^| [a-z_.0-9]* | [0-9]' <<< "$out" |
  grep -v '^| \(vo_bank\|scalars\|mlp_bank\|value_embeds\) ' |
  awk -F'|' '$4 != " 0 " || $5 != " 0 " || $6 != " 0.000e+00 "' | wc -l)" 0
check "the FP8 scale buffers named as not compared" "$(grep -c '^not compared: _mlp_down_act_scales, _mlp_down_proj_scales, _mlp_down_proj_next_scales$' <<< "$out")" 1

out=$("$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/script.pt" --init "$WORK/init.pt" 2>&1)
check "--init: a row a compared tensor, two columns more" \
  "$?:$(grep -c '^| [a-z_.0-9]* | [0-9].* | [0-9.e+-]* | [0-9]* |$' <<< "$out")" "0:20"
check "--init: vo_bank's element moved in opposite directions, the updates 2 apart" \
  "$(grep '^| vo_bank |' <<< "$out" | cut -d'|' -f8,9)" " 2.000e+00 | 1 "
check "--init: the doubled matrices and the moved scalar, the updates 1 apart, none opposite" \
  "$(grep '^| \(mlp_bank\|value_embeds\|scalars\) |' <<< "$out" | cut -d'|' -f8,9 | sort -u)" " 1.000e+00 | 0 "
check "--init: every other tensor's updates the same" "$(grep '^| [a-z_.0-9]* | [0-9]' <<< "$out" |
  grep -v '^| \(vo_bank\|scalars\|mlp_bank\|value_embeds\) ' | awk -F'|' '$8 != " 0.000e+00 " || $9 != " 0 "' | wc -l)" 0

expect_fail "a missing file" "$WORK/none.pt: no such file" "$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/none.pt"
expect_fail "a file of no state dict" "$WORK/list.pt: holds a list, not a state dict" \
  "$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/list.pt"
expect_fail "the script's banks padded for 8 processes" "qk_bank: ours \[.*\], the script's \[.*\]: give the script's process count" \
  "$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/script8.pt"
expect_fail "--init a missing file" "--init $WORK/none.pt: no such file; give the state dict both sides started from" \
  "$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/script.pt" --init "$WORK/none.pt"
expect_fail "--init a file of no state dict" "$WORK/list.pt: holds a list, not a state dict; give dev/record89_state.py's file" \
  "$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/script.pt" --init "$WORK/list.pt"
expect_fail "--init padded for 8 processes" "qk_bank: --init's \[.*\], the script's \[.*\]: give the script's process count" \
  "$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/script.pt" --init "$WORK/script8.pt"
expect_fail "--init without one of the script's tensors" "mudd_w1: not in --init's state dict: give the state both sides started from" \
  "$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/script.pt" --init "$WORK/init_short.pt"
expect_fail "no process" "--processes 0: give the script's process count" \
  "$PY" dev/record89_compare.py "$WORK/ours.bin" "$WORK/script.pt" --processes 0
finish test_record89_compare
