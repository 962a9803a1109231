#!/usr/bin/env bash
# Tests dev/record89_state.py on record #89's tiny model (train_gpt2.py, CPU): the state dict has the
# reference's names, shapes and dtypes (its banks padded for 1 and for 8 processes), each of our
# tensors lands where the reference reads it (banks, value embeddings, scalars, the transposed head and
# MLP projections, zero padding), every value rounded to BF16 (the float32 ones too); the command's
# d12 state and ours' BF16 checkpoint beside it (--checkpoint) hold the same values; its one-line errors.
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh
require_python "torch numpy" test_record89_state PYTHON
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# GPT-2's vocabulary file, which --recipe record89 reads for its prefix table (from dev/data/gpt2).
TOKENIZER=$WORK/vocab.bin
require_vocab "$TOKENIZER" test_record89_state

out=$("$PY" - "$TOKENIZER" <<'PYEOF' 2>&1
import sys
sys.path.insert(0, "dev")
import torch
import record89_state as rs

def verdict(what, ok):
    print(f"{what}\t{'same' if ok else 'different'}")

model, signs = rs.record89_model(7, sys.argv[1], "tiny")
c = model.config
L, C, NH, V = c.num_layers, c.channels, c.num_heads, c.padded_vocab_size
hs = C // NH
attention = [b for b in model.transformer.h if b.attn is not None]
A = len(attention)
for processes in (1, 8):
    state = rs.script_state(model, signs, processes)
    pad = lambda n: -(-n // processes) * processes
    shapes = {"lm_head.weight": (C, V), "embed.weight": (V, C), "value_embeds": (5 * V, C), "ve_gate_bank": (5, NH, 12),
              "qk_bank": (pad(2 * NH // 2 * A), 2 * hs, C), "vo_bank": (pad(2 * A), C, C),
              "mlp_bank": (L + 1, 2, 4 * C, C), "smear_gate.weight": (1, 12),
              "bigram_embed.weight": tuple(model.bigram.weight.shape), "bigram_sign_table": (8192, C),
              "post_lambdas": (L, 2), "resid_lambdas": (L, 2), "scalars": (2 * L + 2,),
              "mudd_w1": tuple(model.mudd_w1.shape), "mudd_w2": tuple(model.mudd_w2.shape),
              "mudd_b2": tuple(model.mudd_b2.shape), "_mudd_gate_scale": (),
              "mudd_gate_w1": tuple(model.mudd_gate_w1.shape), "mudd_gate_w2": tuple(model.mudd_gate_w2.shape),
              "mudd_gate_b2": tuple(model.mudd_gate_b2.shape), "_mlp_down_act_scales": (L + 1,),
              "_mlp_down_proj_scales": (L + 1,), "_mlp_down_proj_next_scales": (L + 1,)}
    verdict(f"{processes} process(es): the reference's names and shapes",
            {k: tuple(v.shape) for k, v in state.items()} == shapes)
    verdict(f"{processes} process(es): BF16 where the reference casts, float32 elsewhere",
            all(v.dtype == (torch.bfloat16 if k in rs.BF16_TENSORS else torch.float32) for k, v in state.items()))
    bf = lambda t: t.detach().to(torch.bfloat16)
    verdict(f"{processes} process(es): bank padding zero",
            not state["qk_bank"][NH * A:].any() and not state["vo_bank"][2 * A:].any() and not state["mlp_bank"][L].any())
state = rs.script_state(model, signs)
ok = True
for a, block in enumerate(attention):
    w = block.attn.c_attn.weight
    for g in range(NH):  # q's head pairs, then k's
        ok &= torch.equal(state["qk_bank"][NH * a + g], bf(w[g * 2 * hs:(g + 1) * 2 * hs]))
    ok &= torch.equal(state["vo_bank"][2 * a], bf(w[2 * C:])) and torch.equal(state["vo_bank"][2 * a + 1], bf(block.attn.c_proj.weight))
verdict("each attention layer's q, k head pairs, v and output projection in the banks", ok)
verdict("each layer's c_fc and transposed c_proj in mlp_bank", all(
    torch.equal(state["mlp_bank"][i, 0], bf(b.mlp.c_fc.weight)) and torch.equal(state["mlp_bank"][i, 1], bf(b.mlp.c_proj.weight.t()))
    for i, b in enumerate(model.transformer.h)))
verdict("the five value embeddings one after another",
        all(torch.equal(state["value_embeds"][k * V:(k + 1) * V], bf(t.weight)) for k, t in enumerate(model.transformer.ve)))
verdict("the head transposed, the embedding as it is", torch.equal(state["lm_head.weight"], bf(model.lm_head.weight.t()))
        and torch.equal(state["embed.weight"], bf(model.transformer.wte.weight)))
s = state["scalars"]
verdict("scalars: the attention lambdas a layer, smear_lambda, skip_lambda",
        torch.equal(s[:2 * L].view(L, 2), model.attn_lambdas.detach()) and s[2 * L].item() == model.smear_lambda.item()
        and s[2 * L + 1].item() == model.skip_gate[0].item() == -1.5)
verdict("float32 tensors hold BF16 values", torch.equal(state["resid_lambdas"], bf(model.resid_lambdas).float())
        and not torch.equal(state["resid_lambdas"], model.resid_lambdas.detach()))
verdict("the sign table ours, the FP8 scales one", torch.equal(state["bigram_sign_table"], bf(signs))
        and all(state[n].eq(1).all() for n in rs.FP8_SCALE_BUFFERS))
PYEOF
)
check_verdicts record89_state.py $? "$out"

"$PY" dev/record89_state.py "$WORK/d12.pt" --tokenizer "$TOKENIZER" --seed 3 --checkpoint "$WORK/d12.bin" > /dev/null 2>&1
check "the command writes a d12 state dict and ours' checkpoint of the same values" "$("$PY" -c "
import sys; sys.path.insert(0, '.')
import torch, train_gpt2 as tg
s = torch.load('$WORK/d12.pt')
m = tg.read_checkpoint('$WORK/d12.bin', False, 0, 0)
same = torch.equal(s['qk_bank'][:6].flatten(0, 1), m.transformer.h[0].attn.c_attn.weight[:1536].to(torch.bfloat16)) and \
       torch.equal(s['resid_lambdas'], m.resid_lambdas.detach()) and torch.equal(s['embed.weight'], m.transformer.wte.weight.to(torch.bfloat16))
print(len(s), list(s['qk_bank'].shape), same)")" "23 [60, 256, 768] True"
expect_fail "a folder for the output" "$WORK is a folder: give the path of the file to write" "$PY" dev/record89_state.py "$WORK" --tokenizer "$TOKENIZER"
expect_fail "no process" "--processes 0: give the reference's process count" \
  "$PY" dev/record89_state.py "$WORK/x.pt" --tokenizer "$TOKENIZER" --processes 0
finish test_record89_state
