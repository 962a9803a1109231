"""How far record #89's first Muon update moves when its gradient is perturbed at the scale of
rounding: the yardstick for two implementations' updates (dev/record89_compare.py --init), which
round differently. train_gpt2.py's --recipe record89 model at its init, one forward and backward
pass, and for each Muon matrix its first step's direction (muon_direction: Polar Express in BF16
products, NorMuon) of the gradient G against the same of G * (1 + 2^-b r), r standard normal per
element, for each b of --noise_bits; and against the same iteration in FP64 on G.

    python3 dev/muon_rounding.py --tokenizer VOCAB [--model d12] [--seed 42] [--batch 4] [--seq_len 1024]
                                 [--tokens SHARD] [--noise_bits 8,12]

VOCAB: the GPT-2 vocabulary file (build/write_tokenizer's), which --recipe record89 reads; SHARD: a
token shard (the trainer's format) whose first batch * seq_len + 1 tokens are the batch, else
tokens drawn from the seed. A line a matrix: the relative L2 distance of each update from the
unperturbed one, |u' - u| / |u|; then each kind's range.
"""
import argparse
import functools
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from pydeps import require  # noqa: E402
from record89_state import fail, record89_model  # noqa: E402


def first_direction(tg, grad, group, orthogonalise):
    """Muon's first step on grad (momentum and NorMuon's second moments from zero), in FP32."""
    import torch
    rows = tg.block_rows(grad, group.get("blocks", 1))
    second_moments = [torch.zeros(max(r, grad.size(1))) for r in rows]
    return tg.muon_direction(grad, torch.zeros_like(grad), 0.0, group.get("blocks", 1), tg.NEWTON_SCHULZ["polar"],
                             group.get("transposed", False), orthogonalise, second_moments).float()


def batch(args, vocab_size):
    import numpy as np
    import torch
    count = args.batch * args.seq_len + 1
    if args.tokens:
        import train_gpt2 as tg
        tg.shard_token_count(args.tokens)  # the header checked, or one line naming the file
        tokens = tg.read_shard(args.tokens, vocab_size)
        if len(tokens) < count:
            fail(f"--tokens {args.tokens}: {len(tokens)} tokens, fewer than --batch x --seq_len + 1 = {count}")
        tokens = torch.tensor(tokens[:count].astype(np.int64))
    else:
        tokens = torch.randint(vocab_size, (count,), generator=torch.Generator().manual_seed(args.seed))
    return tokens[:-1].view(args.batch, args.seq_len), tokens[1:].view(args.batch, args.seq_len)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="GPT-2's vocabulary file (build/write_tokenizer's)")
    parser.add_argument("--model", default="d12", help="train_gpt2.py's model (default d12)")
    parser.add_argument("--seed", type=int, default=42, help="the init's seed (default 42)")
    parser.add_argument("--batch", type=int, default=4, help="sequences (default 4)")
    parser.add_argument("--seq_len", type=int, default=1024, help="tokens a sequence (default 1024)")
    parser.add_argument("--tokens", help="a token shard whose first tokens are the batch (default: drawn)")
    parser.add_argument("--noise_bits", default="8,12", help="b of each relative noise 2^-b (default 8,12)")
    args = parser.parse_args()
    text = args.noise_bits
    try:
        args.noise_bits = [int(b) for b in text.split(",")]
    except ValueError:
        fail(f"--noise_bits {text}: give whole numbers b (noise 2^-b) separated by commas, e.g. 8,12")
    if any(b < 1 for b in args.noise_bits):
        fail(f"--noise_bits {text}: each b at least 1")
    if args.batch < 1 or args.seq_len < 1:
        fail(f"--batch {args.batch} --seq_len {args.seq_len}: both at least 1")
    for flag, path in (("--tokenizer", args.tokenizer), ("--tokens", args.tokens)):
        if path and not os.path.isfile(path):
            fail(f"{flag} {path}: no such file")
    return args


def main():
    args = parse_args()
    require("torch", "numpy")
    import torch
    import train_gpt2 as tg
    model, _ = record89_model(args.seed, args.tokenizer, args.model)
    inputs, targets = batch(args, model.config.vocab_size)
    _, loss = model(inputs, targets)
    loss.backward()
    names = {id(p): name for name, p in model.named_parameters()}
    noise = torch.Generator().manual_seed(args.seed)
    print(f"loss {loss.item():.6f}")
    print("| matrix | shape | " + " | ".join(f"noise 2^-{b}" for b in args.noise_bits) + " | FP64 iteration |")
    print("| --- | --- | " + "---: | " * (len(args.noise_bits) + 1))
    ranges, still = {}, []
    qk_heads = tg.MUON_FLAGS["muon_qk_heads"][tg.RECIPES.index("record89")]
    for group in tg.muon_param_groups(model, qk_heads):
        for p in group["params"]:
            grad = p.grad.float()
            if not grad.any():  # the up projections behind zero-initialised down projections
                still.append(names[id(p)])
                continue
            update = first_direction(tg, grad, group, tg.orthogonalise)
            others = [first_direction(tg, grad * (1 + 2.0 ** -b * torch.randn(grad.shape, generator=noise)), group,
                                      tg.orthogonalise) for b in args.noise_bits]
            others.append(first_direction(tg, grad, group, functools.partial(tg.orthogonalise, dtype=torch.float64)))
            apart = [((u - update).norm() / update.norm().clamp_min(1e-30)).item() for u in others]
            name = names[id(p)]
            print(f"| {name} | {list(p.shape)} | " + " | ".join(f"{a:.4f}" for a in apart) + " |")
            kind = name.split(".", 3)[-1]
            ranges.setdefault(kind, []).append(apart)
    for kind, rows in ranges.items():
        spans = [f"{min(col):.4f}-{max(col):.4f}" for col in zip(*rows)]
        print(f"{kind} ({len(rows)}): " + ", ".join(spans))
    if still:
        print(f"no gradient: {len(still)} matrices ({still[0]}, ...)")


if __name__ == "__main__":
    main()
