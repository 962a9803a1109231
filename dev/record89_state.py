"""Our record #89 model's weights as its reference's state dict: what record #89's train_gpt.py (modded-nanogpt
f411b3d3) loads with load_state_dict(strict=True) in place of its own unseeded init
(dev/reference89_offline.py --init_from). From train_gpt2.py's model (--recipe record89, d12), whose init
from a seed is train_gpt2cu's bit for bit, so that both sides start from the same weights.

    python3 dev/record89_state.py OUT.pt --tokenizer VOCAB [--seed S] [--processes P] [--checkpoint OURS.bin]

(the init of seed S, default 42; VOCAB the GPT-2 vocabulary file build/write_tokenizer writes, which
--recipe record89 reads; P the reference's process count, which pads its banks). Every value is
rounded to BF16, as ours' BF16 checkpoint holds it: --checkpoint writes that checkpoint too, so that
train_gpt2cu -e OURS.bin and the reference start from the same values, the reference's float32
tensors (its lambdas and scalars) included.

The reference keeps its matrices in banks (its lines 1261-1470, 2240-2254):
- qk_bank [60 + padding, 256, C]: each attention layer's q rows, then its k rows, in groups of two
  heads (6 a layer, 10 layers), then zero groups up to a multiple of the process count; vo_bank
  [20 + padding, C, C]: each layer's v rows, then its output projection ([out, in], as ours), then
  zero matrices likewise. The layers are those with attention, in order (not 6).
- mlp_bank [L + 1, 2, 4C, C]: each layer's c_fc ([4C, C], as ours) and its c_proj transposed (the
  reference multiplies post @ W2), then a zero padding layer (its 12 at its 11 layers).
- value_embeds [5 V, C]: our five tables one after another (layers 1, 2, 8, 9, 10 on both sides);
  ve_gate_bank [5, NH, 12] our ve_gates; scalars [2 L + 2]: each layer's attention lambdas (qkv's,
  then the output's), smear_lambda, then skip_lambda (our skip_gate's first); lm_head.weight [C, V]
  (CastedLinearT's, transposed); bigram_sign_table our fixed table (its buffer, drawn unseeded there).
- The FP8 down projections' three scale buffers [L + 1]: ones, as the reference starts them.
Tensors of ours the reference generates instead (the MUDD gate generators' x0, bigram, XSA and head
gates, the value scales, the skip's gate) have no entry. Each tensor goes in the reference's dtype
after its casts to BF16 (line 2242-2254), the others in float32 (holding BF16 values).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from pydeps import require  # noqa: E402

FP8_SCALE_BUFFERS = ("_mlp_down_act_scales", "_mlp_down_proj_scales", "_mlp_down_proj_next_scales")
# The reference's tensors in BF16 after its set-up; every other one float32.
BF16_TENSORS = ("lm_head.weight", "embed.weight", "value_embeds", "ve_gate_bank", "qk_bank", "vo_bank", "mlp_bank",
                "smear_gate.weight", "bigram_embed.weight", "bigram_sign_table", "mudd_w1", "mudd_w2", "mudd_b2",
                "mudd_gate_w1", "mudd_gate_w2", "mudd_gate_b2")


def padded(torch, blocks, count):
    """The blocks stacked, then zero blocks up to count of them."""
    stacked = torch.stack(blocks)
    padding = stacked.new_zeros((count - stacked.shape[0],) + tuple(stacked.shape[1:]))
    return torch.cat([stacked, padding])


def attention_banks(torch, model, processes):
    """qk_bank and vo_bank from the attention layers' c_attn [3C, C] and c_proj [C, C]."""
    C, hs = model.config.channels, model.config.channels // model.config.num_heads
    qk, vo = [], []
    for block in model.transformer.h:
        if block.attn is None:
            continue
        qkv = block.attn.c_attn.weight
        qk += list(qkv[:2 * C].reshape(-1, 2 * hs, C))
        vo += [qkv[2 * C:], block.attn.c_proj.weight]
    def multiple(n):  # the reference's next_multiple_of_n(n, world_size)
        return -(-n // processes) * processes
    return padded(torch, qk, multiple(len(qk))), padded(torch, vo, multiple(len(vo)))


def mlp_bank(torch, model):
    layers = [torch.stack([b.mlp.c_fc.weight, b.mlp.c_proj.weight.t()]) for b in model.transformer.h]
    return padded(torch, layers, len(layers) + 1)


def script_state(model, sign_table, processes=1):
    """{the reference's name: tensor} for train_gpt2.py's record #89 model and our bigram sign table, for
    the reference on `processes` processes."""
    import torch
    t = model.transformer
    qk_bank, vo_bank = attention_banks(torch, model, processes)
    state = {
        "lm_head.weight": model.lm_head.weight.t(),
        "embed.weight": t.wte.weight,
        "value_embeds": torch.cat([table.weight for table in t.ve]),
        "ve_gate_bank": model.ve_gates,
        "qk_bank": qk_bank,
        "vo_bank": vo_bank,
        "mlp_bank": mlp_bank(torch, model),
        "smear_gate.weight": model.smear_weight.view(1, -1),
        "bigram_embed.weight": model.bigram.weight,
        "bigram_sign_table": sign_table,
        "post_lambdas": model.post_lambdas,
        "resid_lambdas": model.resid_lambdas,
        "scalars": torch.cat([model.attn_lambdas.flatten(), model.smear_lambda.view(1), model.skip_gate[:1]]),
        "mudd_w1": model.mudd_w1, "mudd_w2": model.mudd_w2, "mudd_b2": model.mudd_b2,
        "_mudd_gate_scale": model.mudd_gate_scale.view(()),
        "mudd_gate_w1": model.mudd_gate_w1, "mudd_gate_w2": model.mudd_gate_w2, "mudd_gate_b2": model.mudd_gate_b2,
    }
    state.update({name: torch.ones(len(t.h) + 1) for name in FP8_SCALE_BUFFERS})
    return {name: tensor.detach().to(torch.bfloat16).to(torch.bfloat16 if name in BF16_TENSORS else torch.float32)
            .contiguous() for name, tensor in state.items()}


def record89_model(seed, tokenizer, model_name="d12"):
    """train_gpt2.py's --recipe record89 model at its init from seed, and our bigram sign table."""
    import train_gpt2 as tg
    args = tg.parse_args(["--recipe", "record89", "--model", model_name, "--seed", str(seed), "--device", "cpu",
                          "--tokenizer", tokenizer, "--write_debug_state", os.devnull, "--final_window_blocks", "0"])
    tg.check_args(args)
    model = tg.GPT(tg.resolve_config(args), False, args.fp8, args.fp8_head)
    tg.init_weights(model, args.seed, args.record_init)
    return model, tg.bigram_sign_table(model.config.channels)


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the state dict's file (torch.save)")
    parser.add_argument("--tokenizer", required=True, help="GPT-2's vocabulary file (build/write_tokenizer's)")
    parser.add_argument("--seed", type=int, default=42, help="the init's seed (train_gpt2cu's -S; default 42)")
    parser.add_argument("--processes", type=int, default=1, help="the reference's process count (default 1)")
    parser.add_argument("--checkpoint", help="also write ours' BF16 checkpoint of the same init here (-e)")
    args = parser.parse_args()
    if os.path.isdir(args.output):
        fail(f"{args.output} is a folder: give the path of the file to write")
    if args.processes < 1:
        fail(f"--processes {args.processes}: give the reference's process count, 1 or more")
    require("torch")
    import torch
    model, sign_table = record89_model(args.seed, args.tokenizer)
    torch.save(script_state(model, sign_table, args.processes), args.output)
    if args.checkpoint:
        import train_gpt2 as tg
        tg.write_checkpoint(model, args.checkpoint, tg.CHECKPOINT_BF16)
        print(f"wrote {args.checkpoint}: ours' BF16 checkpoint of the same init")
    print(f"wrote {args.output}: record #89's reference's state dict of our init from seed {args.seed}")


if __name__ == "__main__":
    main()
