#!/usr/bin/env bash
# Tests dev/eval/export_hf.py on the CPU, without transformers: a tiny checkpoint (FP32 and BF16)
# is exported; model.safetensors, parsed by a reader written here, must hold exactly the
# checkpoint's values under HF's names and layouts (Conv1D transposes, unpadded wte); config.json
# and the tokenizer files are checked; a forward pass written from HF's GPT-2 (numpy, float64, on
# the exported tensors) must give the logits of train_gpt2.py's model; importing back must give
# byte-identical checkpoints, also from the layouts found on the hub (no "transformer." prefix,
# mask buffers, a stored lm_head, pytorch_model.bin, shards); and each user error gets its message.
# Scratch files go to build/test_tmp/export_hf.
#
#   bash dev/test/test_export_hf.sh     (PYTHON=... to pick the python with torch and numpy)
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=build/test_tmp/export_hf
rm -rf "$DIR"
mkdir -p "$DIR"

source "$(dirname "$0")/lib.sh"

require_python "torch numpy" test_export_hf PYTHON
echo "using $PY"

# The tiny preset with every parameter perturbed: the seeded init leaves biases zero and layernorm
# weights one, which would hide a swapped bias or layernorm. Also a model of a 512-token
# vocabulary, which the export must refuse.
PYTHONPATH=. "$PY" - "$DIR" <<'EOF'
import sys, torch, train_gpt2 as tg
out = sys.argv[1]
config = tg.make_config(*tg.PRESETS["tiny"], source="tiny")
model = tg.GPT(config)
tg.init_weights(model, 7)
generator = torch.Generator().manual_seed(7)
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=generator))
    model.transformer.wte.weight[config.vocab_size:].zero_()
tg.write_checkpoint(model, f"{out}/tiny.bin", tg.CHECKPOINT_FP32)
tg.write_checkpoint(model, f"{out}/tiny_bf16.bin", tg.CHECKPOINT_BF16)
small = tg.GPT(tg.make_config(1, 1, 8, 8, 512, source="small"))
tg.init_weights(small, 1)
tg.write_checkpoint(small, f"{out}/v512.bin", tg.CHECKPOINT_FP32)
modern = tg.GPT(tg.make_config(*tg.MODERN_PRESETS["tiny"], source="modern", arch="modern"))
tg.init_weights(modern, 1)
tg.write_checkpoint(modern, f"{out}/modern.bin", tg.CHECKPOINT_FP32)
speedrun = tg.GPT(tg.make_config(*tg.SPEEDRUN_PRESETS["tiny"], source="speedrun", arch="speedrun"))
tg.init_weights(speedrun, 1)
tg.write_checkpoint(speedrun, f"{out}/speedrun.bin", tg.CHECKPOINT_FP32)
EOF
check "the tiny checkpoints were written" "$(ls "$DIR" | tr '\n' ' ')" \
  "modern.bin speedrun.bin tiny.bin tiny_bf16.bin v512.bin "

run() {  # run ARGS...: export_hf.py's exit status and its last output line
  "$PY" dev/eval/export_hf.py "$@" >"$DIR/out" 2>&1
  echo "$? $(tail -n1 "$DIR/out")"
}
LISTING="config.json, generation_config.json, vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json"
check "export FP32" "$(run "$DIR/tiny.bin" "$DIR/hf32")" \
  "0 wrote $DIR/hf32: model.safetensors (F32, 28 tensors, 6837888 parameters), $LISTING"
check "export BF16" "$(run "$DIR/tiny_bf16.bin" "$DIR/hf16")" \
  "0 wrote $DIR/hf16: model.safetensors (BF16, 28 tensors, 6837888 parameters), $LISTING"
check "import FP32" "$(run --import "$DIR/hf32" "$DIR/back32.bin")" \
  "0 wrote $DIR/back32.bin: FP32 checkpoint of tiny (L=2 NH=4 C=128 maxT=64 V=50257) from $DIR/hf32/model.safetensors"
check "import FP32: byte-identical to the original" "$(cmp "$DIR/tiny.bin" "$DIR/back32.bin" && echo same)" "same"
check "import BF16 --dtype bfloat16" "$(run --import "$DIR/hf16" "$DIR/back16.bin" --dtype bfloat16)" \
  "0 wrote $DIR/back16.bin: BF16 checkpoint of tiny (L=2 NH=4 C=128 maxT=64 V=50257) from $DIR/hf16/model.safetensors"
check "import BF16: byte-identical to the original" "$(cmp "$DIR/tiny_bf16.bin" "$DIR/back16.bin" && echo same)" "same"
run --import "$DIR/hf32" "$DIR/back32_as16.bin" --dtype bfloat16 >/dev/null
check "import FP32 --dtype bfloat16: identical to the BF16 checkpoint train_gpt2.py wrote" \
  "$(cmp "$DIR/tiny_bf16.bin" "$DIR/back32_as16.bin" && echo same)" "same"

# The command line itself: exit status 1 and one error line; argparse's usage errors exit 2.
check "CLI: a missing checkpoint" "$(run "$DIR/nothing.bin" "$DIR/x")" \
  "1 error: $DIR/nothing.bin: no such file; give a checkpoint written by a trainer or train_gpt2.py"
check "CLI: the error is a single line" "$(wc -l <"$DIR/out")" "1"
check "CLI: a modern checkpoint is refused" "$(run "$DIR/modern.bin" "$DIR/hfm")" \
  "1 error: $DIR/modern.bin: the modern architecture (RMSNorm, rotary, ReLU^2, a soft-capped head) has no GPT2LMHeadModel equivalent; export a GPT-2 checkpoint (-recipe gpt2)"
check "CLI: nothing written for it" "$([ -e "$DIR/hfm" ] && echo written || echo none)" "none"
check "CLI: a speedrun checkpoint is refused" "$(run "$DIR/speedrun.bin" "$DIR/hfs")" \
  "1 error: $DIR/speedrun.bin: the speedrun architecture (value embeddings, U-net skips, gated heads, a sigmoid-capped head) has no GPT2LMHeadModel equivalent; export a GPT-2 checkpoint (-recipe gpt2)"
check "CLI: nothing written for the speedrun" "$([ -e "$DIR/hfs" ] && echo written || echo none)" "none"
check "CLI: one positional argument" "$(run "$DIR/tiny.bin")" \
  "2 export_hf.py: error: the following arguments are required: OUT_DIR|OUT_CHECKPOINT"

# Everything else in one python process: the format, the logits, the hub layouts, the errors.
PYTHONPATH=.:dev/eval "$PY" - "$DIR" >"$DIR/python.log" 2>&1 <<'EOF'
import contextlib, io, json, os, struct, sys
import numpy as np
import torch
import export_hf
import train_gpt2 as tg

out = sys.argv[1]
L, NH, C, T, V = 2, 4, 128, 64, 50257
VP = 50304  # V padded to a multiple of 128
SPECIAL = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}


def check(description, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {description}" + (f"\n     {detail}" if detail and not ok else ""))


def parse_safetensors(path):
    """(header, data start, data size, {name: raw little-endian array}), read per the format's
    spec independently of export_hf.py."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    raw_dtype = {"F32": "<u4", "BF16": "<u2"}
    arrays = {name: np.frombuffer(blob, raw_dtype[e["dtype"]], int(np.prod(e["shape"])),
                                  8 + n + e["data_offsets"][0]).reshape(e["shape"])
              for name, e in header.items() if name != "__metadata__"}
    return header, 8 + n, len(blob) - 8 - n, arrays


def as_float32(raw):
    return (raw.astype(np.uint32) << 16).view(np.float32) if raw.dtype == np.dtype("<u2") else raw.view(np.float32)


# Our checkpoint, read here from the layout of llmc/gpt2.h: param_table() order, each per-layer
# entry stacked over the layers, linear weights [out, in], wte padded to VP rows.
TABLE = [("wte", [VP, C]), ("wpe", [T, C]),
         ("ln_1.weight", [L, C]), ("ln_1.bias", [L, C]),
         ("attn.c_attn.weight", [L, 3 * C, C]), ("attn.c_attn.bias", [L, 3 * C]),
         ("attn.c_proj.weight", [L, C, C]), ("attn.c_proj.bias", [L, C]),
         ("ln_2.weight", [L, C]), ("ln_2.bias", [L, C]),
         ("mlp.c_fc.weight", [L, 4 * C, C]), ("mlp.c_fc.bias", [L, 4 * C]),
         ("mlp.c_proj.weight", [L, C, 4 * C]), ("mlp.c_proj.bias", [L, C]),
         ("ln_f.weight", [C]), ("ln_f.bias", [C])]


def checkpoint_as_hf(path, raw_dtype):
    """({HF name: raw array in HF's layout}, wte's padding rows) of a checkpoint file."""
    values = np.fromfile(path, raw_dtype, offset=1024)
    expected, offset = {}, 0
    for name, shape in TABLE:
        size = int(np.prod(shape))
        tensor = values[offset:offset + size].reshape(shape)
        offset += size
        if name == "wte":
            expected["transformer.wte.weight"], padding = tensor[:V], tensor[V:]
        elif name == "wpe":
            expected["transformer.wpe.weight"] = tensor
        elif name.startswith("ln_f."):
            expected["transformer." + name] = tensor
        else:
            for layer in range(L):
                expected[f"transformer.h.{layer}.{name}"] = tensor[layer].T if tensor.ndim == 3 else tensor[layer]
    assert offset == values.size
    return expected, padding


def hf_forward(tensors, ids):
    """GPT2LMHeadModel's forward as transformers computes it (Conv1D: x @ weight + bias with
    weight [in, out]; gelu_new; layernorm eps 1e-5; lm_head tied to wte), in float64."""
    w = {name: value.astype(np.float64) for name, value in tensors.items()}

    def layernorm(x, prefix):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5) * w[prefix + ".weight"] + w[prefix + ".bias"]

    def conv1d(x, prefix):
        return x @ w[prefix + ".weight"] + w[prefix + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    n, hs = len(ids), C // NH
    causal = np.tril(np.ones((n, n), bool))
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:n]
    for layer in range(L):
        h = f"transformer.h.{layer}."
        qkv = np.split(conv1d(layernorm(x, h + "ln_1"), h + "attn.c_attn"), 3, axis=-1)
        q, k, v = (a.reshape(n, NH, hs).transpose(1, 0, 2) for a in qkv)
        scores = np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(hs), -np.inf)
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + conv1d((att @ v).transpose(1, 0, 2).reshape(n, C), h + "attn.c_proj")
        x = x + conv1d(gelu_new(conv1d(layernorm(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    return layernorm(x, "transformer.ln_f") @ w["transformer.wte.weight"].T


# --- the exported directories
ids = [int(i) for i in np.random.RandomState(0).randint(0, V, 15)] + [50256]
for label, checkpoint, hf_dir, dtype, raw_dtype, torch_dtype in [
        ("FP32", "tiny.bin", "hf32", "F32", "<u4", "float32"),
        ("BF16", "tiny_bf16.bin", "hf16", "BF16", "<u2", "bfloat16")]:
    safetensors = f"{out}/{hf_dir}/model.safetensors"
    header, data_start, data_size, arrays = parse_safetensors(safetensors)
    entries = {name: e for name, e in header.items() if name != "__metadata__"}
    expected, padding = checkpoint_as_hf(f"{out}/{checkpoint}", raw_dtype)
    check(f"{label}: the checkpoint's wte padding rows are zero", not padding.any())
    check(f"{label}: __metadata__ is {{'format': 'pt'}}", header.get("__metadata__") == {"format": "pt"})
    check(f"{label}: the data starts 8-byte aligned ({data_start})", data_start % 8 == 0)
    spans = sorted(e["data_offsets"] for e in entries.values())
    check(f"{label}: the tensors tile the {data_size} data bytes", spans[0][0] == 0 and spans[-1][1] == data_size
          and all(a[1] == b[0] for a, b in zip(spans, spans[1:])))
    check(f"{label}: every tensor is {dtype}", {e["dtype"] for e in entries.values()} == {dtype})
    check(f"{label}: the names are GPT2LMHeadModel's, lm_head not stored ({len(arrays)} tensors)",
          sorted(arrays) == sorted(expected),
          f"extra {sorted(set(arrays) - set(expected))}, missing {sorted(set(expected) - set(arrays))}")
    mismatched = [n for n in expected if n not in arrays or arrays[n].shape != expected[n].shape
                  or not np.array_equal(arrays[n], expected[n])]
    shapes = ", ".join(f"{n.split('.')[-2]} {list(arrays[n].shape)}" for n in
                       ["transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_proj.weight",
                        "transformer.wte.weight"])
    check(f"{label}: every tensor holds exactly the checkpoint's bits ({shapes})", not mismatched,
          f"differ: {mismatched[:4]}")
    check(f"{label}: export_hf's own reader agrees", all(
        np.array_equal(v, as_float32(arrays[n])) for n, v in export_hf.read_safetensors(safetensors).items()))

    config = json.load(open(f"{out}/{hf_dir}/config.json"))
    want = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": V,
            "n_positions": T, "n_ctx": T, "n_embd": C, "n_layer": L, "n_head": NH, "n_inner": None,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0,
            "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02, "bos_token_id": 50256,
            "eos_token_id": 50256, "tie_word_embeddings": True, "torch_dtype": torch_dtype}
    check(f"{label}: config.json", config == want, f"got {config}")

    tensors = {n: as_float32(a) for n, a in arrays.items()}
    theirs = hf_forward(tensors, ids)
    with torch.no_grad():
        ours = tg.read_checkpoint(f"{out}/{checkpoint}")(torch.tensor([ids]))[0][0].double().numpy()
    diff = np.abs(ours - theirs).max()
    check(f"{label}: HF-layout forward vs train_gpt2.py logits ({len(ids)} tokens, logits std "
          f"{ours.std():.3f}): max abs diff {diff:.2e} < 1e-4", ours.shape == theirs.shape and diff < 1e-4)
    # The square attn.c_proj is the one transpose a shape check cannot catch; the forward must.
    wrong = dict(tensors)
    for layer in range(L):
        name = f"transformer.h.{layer}.attn.c_proj.weight"
        wrong[name] = tensors[name].T
    wrong_diff = np.abs(ours - hf_forward(wrong, ids)).max()
    check(f"{label}: with attn.c_proj left untransposed the logits differ by {wrong_diff:.2e} > 1e-2",
          wrong_diff > 1e-2)


def same_bytes(a, b):
    return open(a, "rb").read() == open(b, "rb").read()


check("generation_config.json",
      json.load(open(f"{out}/hf32/generation_config.json")) == {"bos_token_id": 50256, "eos_token_id": 50256})
check("vocab.json is dev/data/gpt2/encoder.json", same_bytes(f"{out}/hf32/vocab.json", "dev/data/gpt2/encoder.json"))
check("merges.txt is dev/data/gpt2/vocab.bpe", same_bytes(f"{out}/hf32/merges.txt", "dev/data/gpt2/vocab.bpe"))
check("tokenizer_config.json", json.load(open(f"{out}/hf32/tokenizer_config.json"))
      == {"tokenizer_class": "GPT2Tokenizer", "model_max_length": T, "add_prefix_space": False,
          "add_bos_token": False, **SPECIAL})
check("special_tokens_map.json", json.load(open(f"{out}/hf32/special_tokens_map.json")) == SPECIAL)
vocab = json.load(open(f"{out}/hf32/vocab.json"))
check("the tokenizer has 50257 tokens, <|endoftext|> = 50256", len(vocab) == V and vocab["<|endoftext|>"] == 50256)

# --- imports from the layouts of other writers
hf32 = {n: torch.from_numpy(a.copy())
        for n, a in export_hf.read_safetensors(f"{out}/hf32/model.safetensors").items()}


def hf_dir_with(name, tensors=None, config=None, weights="model.safetensors"):
    """A copy of hf32 with other tensors (written as `weights`, or not at all) or config.json entries."""
    path = f"{out}/{name}"
    os.makedirs(path)
    json.dump(dict(json.load(open(f"{out}/hf32/config.json")), **(config or {})), open(f"{path}/config.json", "w"))
    tensors = hf32 if tensors is None else tensors
    if weights == "model.safetensors":
        export_hf.write_safetensors(f"{path}/model.safetensors", list(tensors.items()), "F32")
    elif weights == "pytorch_model.bin":
        torch.save(tensors, f"{path}/pytorch_model.bin")
    return path


def import_quietly(path):
    with contextlib.redirect_stdout(io.StringIO()):
        export_hf.main(["--import", path, f"{path}.bin"])
    return f"{path}.bin"


# The hub's GPT-2 files: no "transformer." prefix, causal-mask buffers, and in some a stored lm_head.
hub = {n.replace("transformer.", "", 1): t for n, t in hf32.items()}
for layer in range(L):
    hub[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    hub[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
hub["lm_head.weight"] = hf32["transformer.wte.weight"]
sharded = hf_dir_with("sharded", weights="none")
names = list(hf32)
shards = {"model-00001-of-00002.safetensors": names[:10], "model-00002-of-00002.safetensors": names[10:]}
for shard, shard_names in shards.items():
    export_hf.write_safetensors(f"{sharded}/{shard}", [(n, hf32[n]) for n in shard_names], "F32")
json.dump({"weight_map": {n: shard for shard, ns in shards.items() for n in ns}},
          open(f"{sharded}/model.safetensors.index.json", "w"))
for description, path in [("the hub's layout (no prefix, mask buffers, lm_head)", hf_dir_with("hub", hub)),
                          ("pytorch_model.bin", hf_dir_with("torch_bin", hub, weights="pytorch_model.bin")),
                          ("two safetensors shards", sharded)]:
    check(f"import of {description}: byte-identical to the original",
          same_bytes(import_quietly(path), f"{out}/tiny.bin"))

# F16, as other writers store GPT-2, from a file built here (its data not 8-byte aligned): the
# checkpoint holds the float16 values, widened exactly.
half = hf_dir_with("half", weights="none")
header, blobs, offset = {}, [], 0
for name, t in hf32.items():
    blobs.append(t.numpy().astype("<f2").tobytes())
    header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [offset, offset + len(blobs[-1])]}
    offset += len(blobs[-1])
text = json.dumps(header).encode()
open(f"{half}/model.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
imported = tg.read_checkpoint(import_quietly(half))
rounded = tg.read_checkpoint(f"{out}/tiny.bin")
with torch.no_grad():
    for p in rounded.parameters():
        p.copy_(p.half().float())
check("import of F16 safetensors: the float16 values, widened exactly",
      all(torch.equal(a, b) for a, b in zip(imported.parameters(), rounded.parameters())))


# --- errors: one "error: " line naming the file or flag
def expect_error(description, argv, text):
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            export_hf.main(argv)
        message = "(no error)"
    except SystemExit as e:
        message = str(e.code)
    ok = message.startswith("error: ") and text in message and "\n" not in message
    check(f"{description}: {message}", ok, f"expected a line with: {text}")


bad_magic = np.zeros(256, np.int32)
bad_magic[:2] = [1, 3]
open(f"{out}/magic.bin", "wb").write(bad_magic.tobytes() + b"\0" * 1024)
open(f"{out}/truncated.bin", "wb").write(open(f"{out}/tiny.bin", "rb").read(100000))
unchecked = bytearray(open(f"{out}/tiny.bin", "rb").read(100000))
unchecked[254 * 4:256 * 4] = bytes(8)  # no checksum, as llm.c writes them
open(f"{out}/truncated_unchecked.bin", "wb").write(unchecked)
open(f"{out}/a_file", "w").write("x")
for description, checkpoint, out_dir, text in [
        ("bad magic", "magic.bin", "x", "not a GPT-2 checkpoint (magic 1, expected 20240326)"),
        ("truncated checkpoint", "truncated.bin", "x", "truncated.bin: checksum mismatch (CRC-32"),
        ("truncated checkpoint without a checksum", "truncated_unchecked.bin", "x",
         "should be 27376640 bytes but is 100000 (truncated)"),
        ("vocabulary not GPT-2's", "v512.bin", "x", "vocab_size 512 is not GPT-2's 50257"),
        ("OUT_DIR is a file", "tiny.bin", "a_file", "a_file: exists and is not a directory")]:
    expect_error(f"export: {description}", [f"{out}/{checkpoint}", f"{out}/{out_dir}"], text)
expect_error("export: --dtype", [f"{out}/tiny.bin", f"{out}/x", "--dtype", "bfloat16"],
             "--dtype applies to --import only")

os.makedirs(f"{out}/empty")
without_ln_f_bias = {n: t for n, t in hf32.items() if n != "transformer.ln_f.bias"}
with_q_attn = dict(hf32, **{"transformer.h.0.attn.q_attn.weight": hf32["transformer.h.0.attn.c_proj.weight"]})
cut = hf_dir_with("cut")
data = open(f"{cut}/model.safetensors", "rb").read()
open(f"{cut}/model.safetensors", "wb").write(data[:len(data) // 2])
for description, hf_dir, text in [
        ("no directory", f"{out}/nothing", "nothing: no such directory"),
        ("no config.json", f"{out}/empty", "empty/config.json: no such file"),
        ("model_type", hf_dir_with("llama", config={"model_type": "llama"}), "model_type 'llama' is not 'gpt2'"),
        ("activation", hf_dir_with("relu", config={"activation_function": "relu"}),
         'activation_function is "relu", but our GPT-2 needs gelu_new or gelu_pytorch_tanh'),
        ("untied embeddings", hf_dir_with("untied", config={"tie_word_embeddings": False}),
         "tie_word_embeddings is false"),
        ("n_inner", hf_dir_with("inner", config={"n_inner": 256}),
         "n_inner is 256, but our GPT-2 needs null or 4*n_embd = 512"),
        ("no weights", hf_dir_with("no_weights", weights="none"),
         "has no model.safetensors, model.safetensors.index.json or pytorch_model.bin"),
        ("shapes against config.json", hf_dir_with("longer", config={"n_positions": 128}),
         "transformer.wpe.weight has shape [64, 128], but config.json (l2h4c128t128v50257) needs [128, 128]"),
        ("a missing tensor", hf_dir_with("missing", without_ln_f_bias), "missing transformer.ln_f.bias"),
        ("an unexpected tensor", hf_dir_with("extra", with_q_attn), "unexpected tensors transformer.h.0.attn.q_attn.weight"),
        ("untied lm_head", hf_dir_with("lm_head", dict(hf32, **{"lm_head.weight": torch.zeros(V, C)})),
         "lm_head.weight differs from transformer.wte.weight"),
        ("truncated safetensors", cut, "does not fit the 13674380 data bytes: the file is truncated or corrupt")]:
    expect_error(f"import: {description}", ["--import", hf_dir, f"{out}/x.bin"], text)
expect_error("import: output directory missing", ["--import", f"{out}/hf32", f"{out}/no/x.bin"],
             f"{out}/no/x.bin: the directory {out}/no does not exist")
open(f"{cut}/model.safetensors", "wb").write(b"not a safetensors file")
expect_error("import: not safetensors", ["--import", cut, f"{out}/x.bin"], "not a safetensors file, or truncated")
open(f"{cut}/model.safetensors", "wb").write(struct.pack("<Q", 5) + b"{oops")
expect_error("import: a header that is not JSON", ["--import", cut, f"{out}/x.bin"], "the header is not JSON")
check("no checkpoint was written by a failed import", not os.path.exists(f"{out}/x.bin"))
EOF
status=$?
cat "$DIR/python.log"
passed=$((passed + $(grep -c '^ok ' "$DIR/python.log")))
failed=$((failed + $(grep -c '^FAIL' "$DIR/python.log")))
check "the python checks ran to the end" "$status" "0"
finish test_export_hf
