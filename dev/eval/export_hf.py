#!/usr/bin/env python3
"""Converts between our checkpoints (llmc/gpt2.h) and Hugging Face GPT-2 model directories.

  python3 dev/eval/export_hf.py CHECKPOINT OUT_DIR
      writes a GPT2LMHeadModel directory: model.safetensors (F32 from a version-3 checkpoint, BF16
      from a version-5 one), config.json, generation_config.json and the GPT-2 tokenizer files.
  python3 dev/eval/export_hf.py --import HF_DIR OUT_CHECKPOINT [--dtype float32|bfloat16]
      reads a GPT-2 directory (config.json with model.safetensors, its shards, or
      pytorch_model.bin) and writes our checkpoint (default float32), which
      ./train_gpt2cu -e OUT_CHECKPOINT fine-tunes.

Our model's modules carry Hugging Face's names (transformer.h.{i}.attn.c_attn.weight, ...), so a
tensor keeps its name across the conversion. The layouts differ twice: HF's Conv1D stores the
c_attn, c_proj and c_fc weights as [in, out], the transpose of our [out, in]; and HF's wte has
vocab_size rows where ours has zero rows up to a multiple of 128. lm_head is tied to wte in both
and not stored.

safetensors, written and read here with json and numpy: an 8-byte little-endian header length, a
JSON header {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {...}}
padded with spaces so the data starts 8-byte aligned, then the little-endian tensor bytes, the
offsets counting from the end of the header.
"""
import argparse
import json
import math
import os
import re
import shutil
import struct
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from pydeps import require  # noqa: E402

require("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import train_gpt2 as tg  # noqa: E402  (the model and the checkpoint format)
from train_gpt2 import fail  # noqa: E402

TOKENIZER_DIR = os.path.join(REPO_ROOT, "dev", "data", "gpt2")
GPT2_VOCAB_SIZE = 50257
# What sets the other architectures apart from GPT2LMHeadModel, for the refusal.
NOT_GPT2 = {"modern": "RMSNorm, rotary, ReLU^2, a soft-capped head",
            "speedrun": "value embeddings, U-net skips, gated heads, a sigmoid-capped head"}
END_OF_TEXT_ID, END_OF_TEXT = 50256, "<|endoftext|>"  # GPT-2's bos, eos and unk token
LAYER_NORM_EPSILON = 1e-5  # nn.LayerNorm's default, which our model uses
# HF activation names for the tanh approximation of GELU that our model computes.
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
# Bytes as stored; BF16 is kept as its bit pattern and widened by bf16_to_float32.
SAFETENSORS_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
# The causal-mask buffers that older GPT-2 files store with the weights.
MASK_BUFFER = re.compile(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)")


# ------------------------------------------------------------------------------------------------
# safetensors


def write_safetensors(path, tensors, dtype):
    """tensors: (name, float32 CPU tensor) pairs, written as dtype "F32" or "BF16" (rounded to
    nearest even, exact for values that came from a BF16 checkpoint). Written under a temporary
    name and renamed, so an interrupted export never leaves a truncated file under the final name."""
    itemsize = 2 if dtype == "BF16" else 4
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, value in tensors:
        nbytes = value.numel() * itemsize
        header[name] = {"dtype": dtype, "shape": list(value.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-(8 + len(header_bytes)) % 8)
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for _, value in tensors:
            if dtype == "BF16":
                f.write(value.contiguous().to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes())
            else:
                f.write(value.contiguous().numpy().astype("<f4").tobytes())
    os.replace(partial, path)


def bf16_to_float32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path):
    """{name: float32 array} of a safetensors file of F32, F16 or BF16 tensors."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        header_len = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else None
        if header_len is None or header_len > size - 8:
            fail(f"{path}: the header length {header_len} does not fit the {size}-byte file: "
                 f"not a safetensors file, or truncated; re-create it")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            fail(f"{path}: the header is not JSON ({e}): not a safetensors file; re-create it")
    if not isinstance(header, dict):
        fail(f"{path}: the header is not a JSON object: not a safetensors file; re-create it")
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    data = np.memmap(path, np.uint8, "r", offset=data_start) if size > data_start else np.zeros(0, np.uint8)
    tensors = {}
    for name, entry in header.items():
        try:
            dtype, shape = entry["dtype"], [int(n) for n in entry["shape"]]
            begin, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            fail(f"{path}: tensor {name}: header entry {entry!r} lacks dtype, shape or data_offsets; re-create the file")
        if dtype not in SAFETENSORS_DTYPES:
            fail(f"{path}: tensor {name} has dtype {dtype}; only F32, F16 and BF16 convert")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype].itemsize
        if not (0 <= begin and end - begin == nbytes and end <= data.size):
            fail(f"{path}: tensor {name} ({dtype} {shape}, {nbytes} bytes) at [{begin}, {end}) does not "
                 f"fit the {data.size} data bytes: the file is truncated or corrupt; re-create it")
        raw = data[begin:end].view(SAFETENSORS_DTYPES[dtype])
        values = bf16_to_float32(raw) if dtype == "BF16" else raw.astype(np.float32)
        tensors[name] = values.reshape(shape)
    return tensors


# ------------------------------------------------------------------------------------------------
# The tensor mapping


def hf_tensors(model):
    """(name, float32 tensor) of a GPT2LMHeadModel state dict, from our model: wte without its
    padding rows, the 2-D block weights transposed to Conv1D's [in, out]. named_parameters()
    lists a shared tensor once, under its first name, so the tied lm_head does not appear."""
    tensors = []
    for name, p in model.named_parameters():
        value = p.detach()
        if name == "transformer.wte.weight":
            value = value[:model.config.vocab_size]
        elif name.startswith("transformer.h.") and value.dim() == 2:
            value = value.t()
        tensors.append((name, value))
    return tensors


def read_hf_weights(hf_dir):
    """({name: float32 array}, the file(s) named in errors) of a save_pretrained directory."""
    single = os.path.join(hf_dir, "model.safetensors")
    index = single + ".index.json"
    legacy = os.path.join(hf_dir, "pytorch_model.bin")
    if os.path.isfile(single):
        return read_safetensors(single), single
    if os.path.isfile(index):
        try:
            shards = sorted(set(json.load(open(index))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            fail(f"{index}: not a safetensors index ({e!r}): it needs a weight_map of tensor -> shard file")
        tensors = {}
        for shard in shards:
            path = os.path.join(hf_dir, shard)
            if not os.path.isfile(path):
                fail(f"{index}: lists the shard {shard}, which is not in {hf_dir}; download every shard")
            tensors.update(read_safetensors(path))
        return tensors, f"the shards of {index}"
    if os.path.isfile(legacy):
        try:
            state = torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as e:  # torch.load raises many types for a damaged or foreign file
            fail(f"{legacy}: torch.load cannot read it ({e}); re-download it or save the model as safetensors")
        if not isinstance(state, dict):
            fail(f"{legacy}: holds a {type(state).__name__}, not a state dict; save the model with save_pretrained")
        return {name: t.float().numpy() for name, t in state.items()}, legacy
    fail(f"{hf_dir}: has no model.safetensors, model.safetensors.index.json or pytorch_model.bin; "
         f"give a directory written by save_pretrained")


def config_from_hf(path):
    """Our GPTConfig from a GPT-2 config.json (GPT2Config's defaults for absent keys), after
    checking that the model computes what ours computes."""
    try:
        hf = json.load(open(path))
    except ValueError as e:
        fail(f"{path}: not valid JSON ({e}); re-create it")
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        model_type = hf.get("model_type") if isinstance(hf, dict) else None
        fail(f"{path}: model_type {model_type!r} is not 'gpt2'; only GPT-2 models convert to our checkpoint")
    n_embd = hf.get("n_embd", 768)

    def require(key, default, allowed, needed):  # each a difference in what the model computes
        if hf.get(key, default) not in allowed:
            fail(f"{path}: {key} is {json.dumps(hf[key])}, but our GPT-2 needs {needed}; "
                 f"this model cannot be converted")

    require("activation_function", "gelu_new", TANH_GELU, " or ".join(TANH_GELU))
    require("n_inner", None, (None, 4 * n_embd), f"null or 4*n_embd = {4 * n_embd}")
    require("layer_norm_epsilon", LAYER_NORM_EPSILON, (LAYER_NORM_EPSILON,), LAYER_NORM_EPSILON)
    require("scale_attn_weights", True, (True,), "true")
    require("scale_attn_by_inverse_layer_idx", False, (False,), "false")
    require("add_cross_attention", False, (False,), "false")
    require("tie_word_embeddings", True, (True,), "true (lm_head is wte)")
    return tg.make_config(hf.get("n_layer", 12), hf.get("n_head", 12), n_embd, hf.get("n_positions", 1024),
                          hf.get("vocab_size", GPT2_VOCAB_SIZE), source=path)


def listing(names):
    names = sorted(names)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def load_hf_state(model, tensors, source):
    """Copies HF tensors into our model: the 'transformer.' prefix is optional (the hub's own
    gpt2 files lack it), mask buffers are skipped, a stored lm_head must equal wte."""
    state = {}
    for name, value in tensors.items():
        if MASK_BUFFER.fullmatch(name):
            continue
        if name != "lm_head.weight" and not name.startswith("transformer."):
            name = "transformer." + name
        state[name] = value
    expected = {name: tuple(value.shape) for name, value in hf_tensors(model)}
    missing, unexpected = expected.keys() - state.keys(), state.keys() - expected.keys() - {"lm_head.weight"}
    if missing:
        fail(f"{source}: missing {listing(missing)}: not a GPT-2 LM model of config.json's shape")
    if unexpected:
        fail(f"{source}: unexpected tensors {listing(unexpected)}: not a plain GPT-2 LM model")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            fail(f"{source}: {name} has shape {list(state[name].shape)}, but config.json "
                 f"({model.config.name()}) needs {list(shape)}; the weights and config.json disagree")
    wte = state["transformer.wte.weight"]
    if "lm_head.weight" in state and not np.array_equal(state["lm_head.weight"], wte):
        fail(f"{source}: lm_head.weight differs from transformer.wte.weight; our model ties them, "
             f"so an untied output layer cannot be converted")
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = torch.from_numpy(state[name])
            if name == "transformer.wte.weight":
                p.zero_()  # the padding rows stay zero (llmc/gpt2.h)
                p[:wte.shape[0]].copy_(value)
            elif name.startswith("transformer.h.") and p.dim() == 2:
                p.copy_(value.t())
            else:
                p.copy_(value)


# ------------------------------------------------------------------------------------------------
# The two directions


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def export_hf(checkpoint, out_dir):
    if not os.path.isfile(checkpoint):
        fail(f"{checkpoint}: no such file; give a checkpoint written by a trainer or train_gpt2.py")
    model = tg.read_checkpoint(checkpoint)
    version = int(np.fromfile(checkpoint, np.int32, 2)[1])
    c = model.config
    if c.arch != "gpt2":
        fail(f"{checkpoint}: the {c.arch} architecture ({NOT_GPT2[c.arch]}) has no GPT2LMHeadModel equivalent; "
             f"export a GPT-2 checkpoint (-recipe gpt2)")
    if c.vocab_size != GPT2_VOCAB_SIZE:
        fail(f"{checkpoint}: vocab_size {c.vocab_size} is not GPT-2's {GPT2_VOCAB_SIZE}; the export "
             f"writes the GPT-2 tokenizer, which needs a model of its full vocabulary")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        fail(f"{out_dir}: exists and is not a directory; give a new or existing directory as OUT_DIR")
    for name in ("encoder.json", "vocab.bpe"):
        if not os.path.isfile(os.path.join(TOKENIZER_DIR, name)):
            fail(f"{os.path.join(TOKENIZER_DIR, name)}: missing; restore the GPT-2 tokenizer files from git")
    os.makedirs(out_dir, exist_ok=True)
    dtype, torch_dtype = ("BF16", "bfloat16") if version == tg.CHECKPOINT_BF16 else ("F32", "float32")
    tensors = hf_tensors(model)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype)
    write_json(os.path.join(out_dir, "config.json"), {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": c.vocab_size,
        "n_positions": c.max_seq_len,
        "n_ctx": c.max_seq_len,
        "n_embd": c.channels,
        "n_layer": c.num_layers,
        "n_head": c.num_heads,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": END_OF_TEXT_ID,
        "eos_token_id": END_OF_TEXT_ID,
        "tie_word_embeddings": True,
        "torch_dtype": torch_dtype,
    })
    write_json(os.path.join(out_dir, "generation_config.json"),
               {"bos_token_id": END_OF_TEXT_ID, "eos_token_id": END_OF_TEXT_ID})
    shutil.copyfile(os.path.join(TOKENIZER_DIR, "encoder.json"), os.path.join(out_dir, "vocab.json"))
    shutil.copyfile(os.path.join(TOKENIZER_DIR, "vocab.bpe"), os.path.join(out_dir, "merges.txt"))
    special_tokens = {"bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT}
    write_json(os.path.join(out_dir, "tokenizer_config.json"),
               {"tokenizer_class": "GPT2Tokenizer", "model_max_length": c.max_seq_len,
                "add_prefix_space": False, "add_bos_token": False, **special_tokens})
    write_json(os.path.join(out_dir, "special_tokens_map.json"), special_tokens)
    count = sum(value.numel() for _, value in tensors)
    print(f"wrote {out_dir}: model.safetensors ({dtype}, {len(tensors)} tensors, {count} parameters), "
          f"config.json, generation_config.json, vocab.json, merges.txt, tokenizer_config.json, "
          f"special_tokens_map.json")


def import_hf(hf_dir, out_path, dtype):
    if not os.path.isdir(hf_dir):
        fail(f"--import {hf_dir}: no such directory; give a directory written by save_pretrained or export_hf.py")
    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_path):
        fail(f"{config_path}: no such file; a Hugging Face model directory has its config.json")
    out_parent = os.path.dirname(out_path) or "."
    if not os.path.isdir(out_parent):
        fail(f"{out_path}: the directory {out_parent} does not exist; create it first")
    config = config_from_hf(config_path)
    tensors, source = read_hf_weights(hf_dir)
    model = tg.GPT(config)
    load_hf_state(model, tensors, source)
    version = tg.CHECKPOINT_BF16 if dtype == "bfloat16" else tg.CHECKPOINT_FP32
    tg.write_checkpoint(model, out_path, version)
    print(f"wrote {out_path}: {'BF16' if version == tg.CHECKPOINT_BF16 else 'FP32'} checkpoint of "
          f"{config.name()} (L={config.num_layers} NH={config.num_heads} C={config.channels} "
          f"maxT={config.max_seq_len} V={config.vocab_size}) from {source}")


def main(argv=None):
    p = argparse.ArgumentParser(description="Converts our GPT-2 checkpoints to Hugging Face "
                                "GPT2LMHeadModel directories and back (dev/eval/README.md).")
    p.add_argument("--import", dest="import_hf", action="store_true",
                   help="convert HF_DIR to OUT_CHECKPOINT instead of CHECKPOINT to OUT_DIR")
    p.add_argument("source", metavar="CHECKPOINT|HF_DIR")
    p.add_argument("destination", metavar="OUT_DIR|OUT_CHECKPOINT")
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="with --import: precision of the written checkpoint (default float32)")
    args = p.parse_args(argv)
    if args.import_hf:
        import_hf(args.source, args.destination, args.dtype or "float32")
    elif args.dtype:
        fail("--dtype applies to --import only: an export keeps the checkpoint's precision; drop --dtype")
    else:
        export_hf(args.source, args.destination)


if __name__ == "__main__":
    main()
