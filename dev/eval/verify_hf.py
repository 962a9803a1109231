#!/usr/bin/env python3
"""Checks, with transformers itself, that a directory written by dev/eval/export_hf.py computes
what its checkpoint computes (transformers 4.56 or newer, for from_pretrained's dtype argument).

  python3 dev/eval/export_hf.py CKPT /tmp/hf
  python3 dev/eval/verify_hf.py --checkpoint CKPT --hf_dir /tmp/hf --tokens "The meaning of life is"

The text is encoded by the directory's own tokenizer (AutoTokenizer, offline). transformers'
GPT2LMHeadModel, loaded in float32, and train_gpt2.py's model, loaded from CKPT, run on the same
device with TF32 off. The checks, printed as a table (exit status 1 when one fails):
  - the tokenizer decodes the tokens back to the text;
  - the logits of the tokens agree within --atol, default 1e-4: both models compute in float32 and
    BF16 weights widen to float32 exactly, so only the order of the sums differs;
  - with --ours_logits FILE, logits computed elsewhere (the CUDA trainer, say) for the same
    tokens, as little-endian float32 [T, vocab_size] row by row, agree with transformers' within
    --atol too;
  - greedy decoding of --generate tokens (default 20), by transformers' generate() with its KV
    cache and by recomputing train_gpt2.py's model on the whole sequence, gives the same tokens.
    On a difference, the gap between our top two logits at the first differing step is printed:
    a gap below --atol is a near-tie, not a wrong mapping.
"""
import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from pydeps import require  # noqa: E402

require("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import train_gpt2 as tg  # noqa: E402  (our model and checkpoint reader)
from train_gpt2 import fail  # noqa: E402

END_OF_TEXT_ID = 50256  # generate() stops after it; the greedy loop here does the same


def parse_args():
    p = argparse.ArgumentParser(description="Compares an exported Hugging Face GPT-2 directory with "
                                "its checkpoint: logits and greedy generation (dev/eval/README.md).")
    p.add_argument("--checkpoint", required=True, help="our checkpoint (FP32 or BF16)")
    p.add_argument("--hf_dir", required=True, help="the directory export_hf.py wrote from it")
    p.add_argument("--tokens", required=True, help="text to encode and run")
    p.add_argument("--ours_logits", help="float32 [T, vocab_size] logits of the same tokens to compare too")
    p.add_argument("--generate", type=int, default=20, help="greedy tokens to generate")
    p.add_argument("--atol", type=float, default=1e-4, help="largest allowed |logit difference|")
    p.add_argument("--device", help="default cuda when available, else cpu")
    return p.parse_args()


def greedy_ours(model, ids, steps, device):
    """The argmax token appended step by step, each step a forward pass over the whole sequence."""
    sequence = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            sequence.append(int(model(torch.tensor([sequence], device=device))[0][0, -1].argmax()))
            if sequence[-1] == END_OF_TEXT_ID:
                break
    return sequence[len(ids):]


def top_two_gap(model, sequence, device):
    with torch.no_grad():
        top = model(torch.tensor([sequence], device=device))[0][0, -1].topk(2).values
    return (top[0] - top[1]).item()


def main():
    args = parse_args()
    if not os.path.isfile(args.checkpoint):
        fail(f"--checkpoint {args.checkpoint}: no such file; give the checkpoint the directory was exported from")
    if not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        fail(f"--hf_dir {args.hf_dir}: has no config.json; write it with dev/eval/export_hf.py CHECKPOINT DIR")
    if args.generate < 1:
        fail(f"--generate {args.generate}: give at least 1 token")
    try:
        import transformers
        from transformers import AutoTokenizer, GPT2LMHeadModel
    except ImportError:
        fail("transformers is not installed here: pip install transformers safetensors")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on both sides
    torch.backends.cudnn.allow_tf32 = False

    ours = tg.read_checkpoint(args.checkpoint).to(device).eval()
    theirs = GPT2LMHeadModel.from_pretrained(args.hf_dir, dtype=torch.float32, local_files_only=True)
    theirs = theirs.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.hf_dir, local_files_only=True)
    ids = tokenizer(args.tokens)["input_ids"]
    T, max_seq_len = len(ids), ours.config.max_seq_len
    if T == 0:
        fail("--tokens: the text encodes to no tokens; give some text")
    if T + args.generate > max_seq_len:
        fail(f"--tokens and --generate: {T} tokens + {args.generate} generated exceed the model's "
             f"max_seq_len {max_seq_len}; shorten the text or lower --generate")
    precision = "BF16" if np.fromfile(args.checkpoint, np.int32, 2)[1] == tg.CHECKPOINT_BF16 else "FP32"
    print(f"verify_hf: {args.checkpoint} ({ours.config.name()}, {precision}) vs {args.hf_dir} on {device}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}; {T} tokens: {ids}")

    idx = torch.tensor([ids], device=device)
    with torch.no_grad():
        ours_logits = ours(idx)[0][0].float().cpu()
        hf_logits = theirs(idx).logits[0].float().cpu()
    if ours_logits.shape != hf_logits.shape:
        fail(f"logits of shape {list(ours_logits.shape)} (train_gpt2.py) and {list(hf_logits.shape)} "
             f"(transformers): config.json does not describe the checkpoint; export it again")
    rows = []  # (check, value, tolerance, passed)
    rows.append(("tokenizer: decode(encode(text)) == text", f"{T} tokens", "exact",
                 tokenizer.decode(ids) == args.tokens))
    diff = (ours_logits - hf_logits).abs().max().item()
    rows.append(("logits: train_gpt2.py vs transformers, max abs diff", f"{diff:.3e}", f"{args.atol:.0e}",
                 diff <= args.atol))
    if args.ours_logits:
        given = np.fromfile(args.ours_logits, "<f4")
        if given.size != hf_logits.numel():
            fail(f"--ours_logits {args.ours_logits}: {given.size} floats, but {T} tokens x vocab "
                 f"{hf_logits.shape[1]} need {hf_logits.numel()}; write float32 logits [T, vocab_size] of these tokens")
        given_diff = np.abs(given.reshape(hf_logits.shape) - hf_logits.numpy()).max()
        rows.append(("logits: --ours_logits vs transformers, max abs diff", f"{given_diff:.3e}",
                     f"{args.atol:.0e}", given_diff <= args.atol))

    ours_tokens = greedy_ours(ours, ids, args.generate, device)
    with torch.no_grad():
        generated = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=args.generate,
                                    do_sample=False, pad_token_id=END_OF_TEXT_ID)
    hf_tokens = generated[0, T:].tolist()
    first_difference = next((i for i in range(max(len(ours_tokens), len(hf_tokens)))
                             if ours_tokens[i:i + 1] != hf_tokens[i:i + 1]), None)
    rows.append((f"greedy generation of {args.generate} tokens: train_gpt2.py vs transformers",
                 "identical" if first_difference is None else f"differ at token {first_difference}",
                 "identical", first_difference is None))

    print("| check | value | tolerance | result |")
    print("|---|---:|---:|---|")
    for check, value, tolerance, passed in rows:
        print(f"| {check} | {value} | {tolerance} | {'ok' if passed else 'FAIL'} |")
    print(f"train_gpt2.py: {tokenizer.decode(ours_tokens)!r}")
    print(f"transformers:  {tokenizer.decode(hf_tokens)!r}")
    if first_difference is not None and first_difference < min(len(ours_tokens), len(hf_tokens)):
        gap = top_two_gap(ours, ids + ours_tokens[:first_difference], device)
        print(f"at token {first_difference} our top two logits are {gap:.3e} apart"
              + (" (below --atol: a near-tie)" if gap <= args.atol else ""))
    failed = sum(not passed for *_, passed in rows)
    print(f"verify_hf: {len(rows) - failed} of {len(rows)} checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
