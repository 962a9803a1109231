#!/usr/bin/env bash
# Tests of train_gpt2.py on its default device (a GPU where one is present): the MT19937
# self-check, seeded init, the debug state read back and recomputed, checkpoint round trips (FP32
# and BF16), the AdamW formula, the data order, training on small shards (one process and two),
# the LR schedules, AdamW's tensors' rows, --check_debug_state, the benchmark mode, the FP8 recipe
# (its scales on any PyTorch, its casts from 2.1, its products on a GPU of compute capability
# 8.9+) and the error messages. PYTHON names a python with torch and numpy (default: the first of
# python3, /usr/bin/python3 that has them).
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/test/train_gpt2_py_lib.sh
TINY=(--model tiny --vocab_size 512)  # a small vocabulary keeps the classifier cheap


echo "--- help"
"$PYTHON" train_gpt2.py --help >/dev/null

check "MT19937 matches torch's CPU generator" <<'EOF'
import torch, train_gpt2 as tg
tg.mt19937_self_check()
for seed in (0, 42, 1337):
    rng = tg.MT19937(seed)
    ours = [rng.u32() % 1000003 for _ in range(2000)]
    torch.manual_seed(seed)
    theirs = torch.randint(0, 1000003, (2000,)).tolist()  # small ranges take one u32 per value
    assert ours == theirs, f"seed {seed}: MT19937 differs from torch.manual_seed's generator"
print("seed 5489 -> 3499211612; seeds 0, 42, 1337 agree with torch for 2000 draws")
EOF

check "the prefix table of GPT-2's vocabulary (record #89's construction) and the loss's terms" <<'EOF'
import json, os, numpy as np, torch, train_gpt2 as tg
# encoder.json's tokens as bytes (GPT-2's printable stand-ins for the bytes), written as an llm.c
# vocabulary file ($WORK/gpt2_tokenizer.bin, for the debug state of the loss's settings below) and
# read back
printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
stand_in = printable + [256 + i for i in range(256 - len(printable))]
byte_of = {chr(c): b for b, c in zip(printable + [b for b in range(256) if b not in printable], stand_in)}
encoder = json.load(open("dev/data/gpt2/encoder.json"))
tokens = [b""] * len(encoder)
for text, i in encoder.items():
    tokens[i] = bytes(byte_of[ch] for ch in text)
path = os.path.join(os.environ["WORK"], "gpt2_tokenizer.bin")
header = np.zeros(tg.TOKENIZER_HEADER_INTS, np.int32)
header[:4] = [tg.TOKENIZER_MAGIC, 2, len(tokens), tg.GPT2_EOT_TOKEN]
with open(path, "wb") as f:
    f.write(header.tobytes() + b"".join(bytes([len(t)]) + t for t in tokens))
assert tg.read_vocabulary(path, "--tokenizer") == (tokens, tg.GPT2_EOT_TOKEN)
table = tg.prefix_table(tokens, tg.GPT2_EOT_TOKEN, 50304)
ids = {t: i for i, t in enumerate(tokens) if i != tg.GPT2_EOT_TOKEN}
longest = lambda t: next((ids[t[:n]] for n in range(len(t) - 1, 0, -1) if t[:n] in ids), -1)
assert table[:len(tokens)] == [-1 if i == tg.GPT2_EOT_TOKEN else longest(t) for i, t in enumerate(tokens)]
assert table[tg.GPT2_EOT_TOKEN:] == [-1] * (50304 - tg.GPT2_EOT_TOKEN)
# test_tokenizer.cpp holds llmc's table to the same count and checksum
count, checksum = sum(p >= 0 for p in table), sum(i * p for i, p in enumerate(table) if p >= 0) % 1000000007
assert (count, checksum) == (50000, 641303553), (count, checksum)
# the terms' loss against a sum over each position's terms
torch.manual_seed(0)
capped, targets, prefix = torch.randn(2, 5, 11, dtype=torch.float64) * 3, torch.randint(0, 11, (2, 5)), torch.randint(-1, 11, (11,))
log_p = torch.log_softmax(capped, -1)
expected = 0.0
for b in range(2):
    for t in range(5):
        expected -= sum(w * log_p[b, t, targets[b, t + k]] for k, w in enumerate([1, 0.5, 0.25]) if t + k < 5)
        expected -= 0.25 * log_p[b, t, prefix[targets[b, t]]] if prefix[targets[b, t]] >= 0 else 0.0
got = tg.LossTerms([1.0, 0.5, 0.25], 0.25, prefix).loss(capped, targets, "sum")
assert abs(got - expected) < 1e-12, (got, expected)
assert abs(tg.LossTerms([1.0, 0.5, 0.25], 0.25, prefix).loss(capped, targets, "mean") - expected / 10) < 1e-12
print(f"{count} tokens with a prefix, checksum {checksum}; the terms' loss {float(got):.6f}, as summed by hand")
EOF

"$PYTHON" train_gpt2.py "${TINY[@]}" --write_debug_state "$WORK/a" -b 2 -t 32 --debug_steps 4 --seed 7 >/dev/null
"$PYTHON" train_gpt2.py "${TINY[@]}" --write_debug_state "$WORK/b" -b 2 -t 32 --debug_steps 4 --seed 7 >/dev/null
"$PYTHON" train_gpt2.py "${TINY[@]}" --write_debug_state "$WORK/c" -b 2 -t 32 --debug_steps 4 --seed 8 >/dev/null
echo "--- init is deterministic for a seed"
cmp "$WORK/a/gpt2_l2h4c128t64v512.bin" "$WORK/b/gpt2_l2h4c128t64v512.bin"
cmp "$WORK/a/gpt2_l2h4c128t64v512_debug_state.bin" "$WORK/b/gpt2_l2h4c128t64v512_debug_state.bin"
if cmp -s "$WORK/a/gpt2_l2h4c128t64v512.bin" "$WORK/c/gpt2_l2h4c128t64v512.bin"; then
  echo "FAIL: seeds 7 and 8 gave the same model"
  exit 1
fi
echo "seed 7 twice: identical files; seed 8: different"

check "initial weights follow SPEC.md" <<'EOF'
import math, os, torch, train_gpt2 as tg
m = tg.read_checkpoint(os.environ["WORK"] + "/a/gpt2_l2h4c128t64v512.bin")
c, t = m.config, m.transformer
assert c.padded_vocab_size == 512 and tg.GPTConfig(12, 12, 768, 1024, 50257).padded_vocab_size == 50304
assert c.num_parameters() == sum(p.numel() for p in m.parameters())
ref = tg.GPT(c)
torch.manual_seed(7)
expected = [torch.empty(c.padded_vocab_size, c.channels).normal_(0, 0.02),
            torch.empty(c.max_seq_len, c.channels).normal_(0, 0.02)]
for _ in range(c.num_layers):
    for shape, std in [((3 * c.channels, c.channels), 0.02), ((c.channels, c.channels), 0.02 / math.sqrt(4)),
                       ((4 * c.channels, c.channels), 0.02), ((c.channels, 4 * c.channels), 0.02 / math.sqrt(4))]:
        expected.append(torch.empty(shape).normal_(0, std))
got = [t.wte.weight, t.wpe.weight] + [w for b in t.h for w in (b.attn.c_attn.weight, b.attn.c_proj.weight,
                                                              b.mlp.c_fc.weight, b.mlp.c_proj.weight)]
assert torch.equal(got[0], expected[0]), "wte differs from one normal_ call"
for g, e in zip(got[1:], expected[1:]):
    assert torch.equal(g, e), "a matrix differs from the SPEC.md draw order"
for name, p in m.named_parameters():
    if name.endswith("bias"):
        assert not p.any(), name
    elif "ln_" in name:
        assert (p == 1).all(), name
print("matrices equal fresh normal_ draws in SPEC.md order; biases 0, layernorm weights 1")
EOF

check "debug state read back and recomputed" <<'EOF'
import os, numpy as np, torch, train_gpt2 as tg
d = os.environ["WORK"] + "/a"
m = tg.read_checkpoint(d + "/gpt2_l2h4c128t64v512.bin")
raw = open(d + "/gpt2_l2h4c128t64v512_debug_state.bin", "rb").read()
h = np.frombuffer(raw, np.int32, 256)
B, T, steps, V = h[2:6]
assert list(h[:6]) == [20240327, 3, 2, 32, 4, 512], h[:6]
hyper = np.frombuffer(h[6:12].tobytes(), np.float32)
assert np.array_equal(hyper, np.array([1e-4, 0.9, 0.95, 1e-8, 0.1, 1.0], np.float32)), hyper
o = 1024
x = np.frombuffer(raw, np.int32, B * T, o); o += 4 * B * T
y = np.frombuffer(raw, np.int32, B * T, o); o += 4 * B * T
logits = np.frombuffer(raw, np.float32, B * T * V, o); o += 4 * B * T * V
loss = np.frombuffer(raw, np.float32, 1, o)[0]; o += 4
params = tg.params_in_file_order(m)
n = sum(p.numel() for p in params)
grads = np.frombuffer(raw, np.float32, n, o); o += 4 * n
losses = np.frombuffer(raw, np.float32, steps, o); o += 4 * steps
assert o == len(raw), f"debug state has {len(raw)} bytes, expected {o}"
assert x.max() < V and np.array_equal(x.reshape(B, T)[:, 1:], y.reshape(B, T)[:, :-1])
X, Y = (torch.from_numpy(a.astype(np.int64)).view(int(B), int(T)) for a in (x, y))
lg, ls = m(X, Y)
ls.backward()
ours = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
for name, a, b in [("logits", lg.detach().numpy().reshape(-1), logits), ("loss", ls.item(), loss),
                   ("grads", ours, grads)]:
    print(f"{name:7s} max abs diff {np.abs(np.asarray(a) - b).max():.3e}")
    assert np.allclose(a, b, rtol=1e-5, atol=1e-6), name
assert losses[0] == loss and losses[-1] < losses[0], losses
Vp = m.config.padded_vocab_size
assert m.transformer.wte.weight[V:].abs().sum() == 0 and not m.transformer.wte.weight.grad[V:].any()
print("losses", " ".join(f"{v:.6f}" for v in losses))
EOF

check "checkpoint round trips (FP32, BF16 rounded to nearest even)" <<'EOF'
import os, numpy as np, train_gpt2 as tg
d = os.environ["WORK"] + "/a/"
m = tg.read_checkpoint(d + "gpt2_l2h4c128t64v512.bin")
tg.write_checkpoint(m, d + "again.bin", tg.CHECKPOINT_FP32)
assert open(d + "again.bin", "rb").read() == open(d + "gpt2_l2h4c128t64v512.bin", "rb").read()
bits = np.fromfile(d + "gpt2_l2h4c128t64v512.bin", np.uint32, offset=1024).astype(np.uint64)
rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
bf16 = np.fromfile(d + "gpt2_l2h4c128t64v512_bf16.bin", np.uint16, offset=1024)
assert np.array_equal(rounded, bf16), "BF16 checkpoint is not the FP32 one rounded to nearest even"
mb = tg.read_checkpoint(d + "gpt2_l2h4c128t64v512_bf16.bin")
tg.write_checkpoint(mb, d + "again_bf16.bin", tg.CHECKPOINT_BF16)
assert open(d + "again_bf16.bin", "rb").read() == open(d + "gpt2_l2h4c128t64v512_bf16.bin", "rb").read()
print("FP32 read/write identical; BF16 == RNE(FP32) bit for bit; BF16 read/write identical")
EOF

check "AdamW: adamw_step equals torch.optim.AdamW" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
ours = [torch.randn(64, 32, requires_grad=True), torch.randn(32, requires_grad=True)]
theirs = [p.detach().clone().requires_grad_() for p in ours]
opt = torch.optim.AdamW([{"params": theirs[:1], "weight_decay": 0.1}, {"params": theirs[1:], "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in ours]
for t in range(1, 6):
    grads = [torch.randn_like(p) for p in ours]
    for p, q, g in zip(ours, theirs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    tg.adamw_step(ours, moments, t, 1e-3, 0.1)
    opt.step()
diff = max(((p - q).abs() / q.abs().clamp(min=1e-3)).max().item() for p, q in zip(ours, theirs))
print(f"5 steps: max relative difference {diff:.2e}")
assert diff < 1e-5
EOF

check "cautious weight decay: CautiousAdamW's and Muon's steps against float64, each mask" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
def start(rows, cols, std):  # weights of both signs, every 7th zero; gradients, every 5th zero
    w, g = torch.randn(rows, cols) * std, torch.randn(rows, cols)
    w.view(-1)[::7] = 0
    g.view(-1)[3::5] = 0
    p = w.clone().requires_grad_()
    p.grad = g.clone()
    return w, g, p
def compare(name, got, expected, w, u, strict):
    diff = ((got.detach().double() - expected).abs() / expected.abs().clamp(min=1e-3)).max().item()
    zero_u = (u == 0) & (w != 0)
    kept = torch.equal(got.detach()[zero_u], w[zero_u])
    cases = [int(x.sum()) for x in (u * w.double() > 0, u * w.double() < 0, zero_u, w == 0)]
    print(f"{name}: max relative difference {diff:.2e}; u p > 0, u p < 0, u = 0 with p != 0, p = 0: {cases}")
    assert diff < 1e-5 and min(cases) > 0, name
    assert kept == strict, f"{name}: a weight whose step is zero {'decayed' if strict else 'kept its value'}"
# AdamW, step 1: u = lr sign(g) (zero where g is), decayed by lr^2 wd p where u p > 0.
lr, wd, betas, eps = 1e-2, 2.0, (0.9, 0.95), 1e-8
w, g, p = start(64, 32, 0.02)
tg.CautiousAdamW([{"params": [p], "weight_decay": wd}], lr=lr, betas=betas, eps=eps).step()
m, v, wd64 = (1 - betas[0]) * g.double(), (1 - betas[1]) * g.double() ** 2, w.double()
u = lr * (m / (1 - betas[0])) / ((v / (1 - betas[1])).sqrt() + eps)
compare("CautiousAdamW", p, wd64 - u - (u * wd64 > 0) * lr * lr * wd * wd64, w, u, True)
# Muon on a tall matrix (lr_eff = lr sqrt(3)), the orthogonalisation left out so that u = 0 where g is.
lr, wd = 0.05, 1.2
w, g, p = start(48, 16, 0.05)
muon = tg.Muon([dict(params=[p])], lr, wd, 0.95, cautious=True)
muon.orthogonalise = lambda b, ns: b.bfloat16()
muon.step()
u = tg.muon_direction(g, torch.zeros_like(g), 0.95, 1, tg.NEWTON_SCHULZ["baseline"], False,
                      lambda b, ns: b.bfloat16()).double()
wd64 = w.double()
compare("Muon", p, wd64 - (u * wd64 >= 0) * wd * lr * (lr * 3 ** 0.5) * wd64 - lr * u, w, u, False)
# A tensor's rate multiplier s (--muon_tensor_lr, record #89's fcprojw x4): the update's rate and lr_eff
# times s, the decay's wd lr not, cautious or decoupled.
s = 4.0
for cautious in (True, False):
    w, g, p = start(48, 16, 0.05)
    muon = tg.Muon([dict(params=[p], lr_scale=s)], lr, wd, 0.95, cautious=cautious)
    muon.orthogonalise = lambda b, ns: b.bfloat16()
    muon.step()
    u = tg.muon_direction(g, torch.zeros_like(g), 0.95, 1, tg.NEWTON_SCHULZ["baseline"], False,
                          lambda b, ns: b.bfloat16()).double()
    wd64 = w.double()
    decayed = (wd64 - (u * wd64 >= 0) * wd * lr * (lr * s * 3 ** 0.5) * wd64 if cautious else wd64 * (1 - lr * wd))
    compare(f"Muon x{s:g}, {'cautious' if cautious else 'decoupled'}", p, decayed - lr * s * u, w, u, False)
# The trainer's optimizers: CautiousAdamW and a cautious Muon with the flag, torch's AdamW without.
for flag, adamw, cautious in (("1", tg.CautiousAdamW, True), ("0", torch.optim.AdamW, False)):
    args = tg.parse_args(["--model", "tiny", "--optimizer", "muon", "--cautious_decay", flag, "--input_bin", "x"])
    optimizers, _ = tg.make_optimizers(tg.GPT(tg.resolve_config(args)), args, "cpu")
    assert [type(o) for o in optimizers] == [adamw, tg.Muon] and optimizers[1].cautious == cautious, flag
print("--cautious_decay 1: CautiousAdamW and Muon's cautious step; 0: torch's AdamW and Muon's decoupled one")
EOF

check "--adam_rows' bf16: which tensors a bfloat16 run keeps in bfloat16, their moments' dtype, one step" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
# record89's tiny model in a bfloat16 run: the reference's BF16 tensors (bf16=weight) bfloat16, the rest
# float32; the speedrun's embeddings (no rows) bfloat16, a row's bf16=none keeping one float32.
args = tg.parse_args(["--recipe", "record89", "--model", "tiny", "--input_bin", "x"])
model = tg.GPT(tg.resolve_config(args))
tg.set_parameter_dtypes(model, "bfloat16", args.adam_rows)
kinds = {tg.table_name(n): p.dtype for n, p in model.named_parameters()}
bf16 = sorted(name for name, dtype in kinds.items() if dtype == torch.bfloat16)
assert set(bf16) == set(tg.RECORD89_BF16_WEIGHTS) & set(kinds), bf16
speedrun = tg.GPT(tg.resolve_config(tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--input_bin", "x"])))
tg.set_parameter_dtypes(speedrun, "bfloat16", "ve:bf16=none")
kinds28 = {tg.table_name(n): p.dtype for n, p in speedrun.named_parameters()}
assert kinds28["wte"] == torch.bfloat16 and kinds28["ve"] == torch.float32 and kinds28["headw"] == torch.float32
# One CautiousAdamW step of a bfloat16 tensor: float32 moments (float32_moments, bf16=weight) hold the float32
# step's, bfloat16 moments its rounding; the weight the float32 step rounded to nearest in both.
w, g = torch.randn(300).bfloat16(), torch.randn(300).bfloat16()
lr, wd, betas, eps = 1e-2, 0.5, (0.9, 0.95), 1e-10
m = (1 - betas[0]) * g.float()
v = (1 - betas[1]) * g.float() ** 2
u = lr * (m / (1 - betas[0])) / ((v / (1 - betas[1])).sqrt() + eps)
expected = w.float() - (u + lr * lr * wd * w.float() * (u * w.float() > 0).float())
for float32_moments in (True, False):
    p = w.clone().requires_grad_()
    p.grad = g.clone()
    opt = tg.CautiousAdamW([dict(params=[p], weight_decay=wd, float32_moments=float32_moments)], lr=lr, betas=betas,
                           eps=eps)
    opt.step()
    state = opt.state[p]
    assert state["m"].dtype == (torch.float32 if float32_moments else torch.bfloat16), state["m"].dtype
    assert torch.equal(state["m"].float(), m if float32_moments else m.bfloat16().float()), float32_moments
    assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), expected.bfloat16()), float32_moments
# torch's AdamW cannot keep a bfloat16 tensor's moments in float32: refused.
args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--input_bin", "x", "--adam_rows", "wte:bf16=weight"])
model = tg.GPT(tg.resolve_config(args))
tg.set_parameter_dtypes(model, "bfloat16", args.adam_rows)
try:
    tg.make_optimizers(model, args, "cpu")
    raise AssertionError("torch's AdamW took bf16=weight")
except SystemExit:
    pass
print(f"record89 bfloat16: {', '.join(bf16)}; the step's moments float32 or bfloat16, the weight rounded once")
EOF

check "--adam_every 2 with eps before the correction: AdamW's eps set at its updates alone" <<'EOF'
import torch, train_gpt2 as tg
args = tg.parse_args(["--recipe", "record89", "--model", "tiny", "--input_bin", "x"])
p = torch.nn.Parameter(torch.zeros(3))
opt = torch.optim.AdamW([dict(params=[p], peak_lr=0.01, betas=(0.9, 0.95))], lr=0.01, eps=1.0)
eps = []
for step in range(4):  # steps 0 and 2 keep their gradients (no update, t = 0 there), 1 and 3 update
    tg.set_learning_rates([opt], step, args)
    eps.append(opt.param_groups[0]["eps"])
expected = [1.0, args.adam_eps / (1 - 0.95) ** 0.5, args.adam_eps / (1 - 0.95) ** 0.5,
            args.adam_eps / (1 - 0.95 ** 2) ** 0.5]
assert eps == expected, (eps, expected)
print("eps at steps 0-3:", ", ".join(f"{e:.4g}" for e in eps))
EOF

check "--mlp_from_output 1: ReLU^2's derivative from its output (FP32 tight, BF16 bits), the model's MLPs" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
x = torch.randn(4, 37) * 3
for dtype in (torch.float32, torch.bfloat16):
    xd = x.to(dtype).requires_grad_()
    y = tg.Relu2FromOutput.apply(xd)
    assert torch.equal(y, torch.relu(xd).square()), dtype
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, xd, dy)
    # the reference's kernel: 2 dy sqrt(y) in FP32, rounded once to the input's type
    assert torch.equal(dx, (2.0 * dy.float() * y.detach().float().sqrt()).to(dtype)), dtype
    plain = 2.0 * dy.double() * torch.relu(xd.detach().double())  # 2 relu(x) dy, no rounding
    bound = 2.0 ** -22 if dtype == torch.float32 else 2.0 ** -7
    err = ((dx.double() - plain).abs() / (plain.abs() + 1e-30))[plain != 0].max().item()
    assert err <= bound, (dtype, err)
args = tg.parse_args(["--recipe", "record89", "--input_bin", "x"])
assert args.mlp_from_output == 1
for flag in ("1", "0"):
    args = tg.parse_args(["--model", "tiny", "--recipe", "speedrun", "--mlp_from_output", flag, "--input_bin", "x"])
    model = tg.GPT(tg.resolve_config(args))
    tg.set_mlp_from_output(model, bool(args.mlp_from_output))
    assert all(b.mlp.from_output == (flag == "1") for b in model.transformer.h), flag
print("Relu2FromOutput: forward relu(x)^2, backward 2 dy sqrt(y) in FP32 rounded once (within 2^-22 of 2 relu(x) dy "
      "in FP32, 2^-7 in BF16); --recipe record89 sets it, every MLP takes it")
EOF

check "NorMuon: normuon_step against float64 (tall, wide, square, odd shapes, two steps), Muon's state" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
def reference(v, s, dim):  # SPEC.md's NorMuon in float64, no rounding
    v = v.double()
    mean = v.square().mean(dim)
    s = s + (1 - tg.NORMUON_BETA2) * (mean - s)
    step = s.clamp(min=1e-10).rsqrt()
    after = ((mean * v.size(dim)) * step.square()).sum().sqrt()
    return v * (step * v.norm() / after).unsqueeze(dim), s
for rows, cols in ((48, 16), (16, 40), (24, 24), (7, 5)):
    dim = 1 if rows >= cols else 0  # one value per row when rows >= cols, else per column
    s, s64 = torch.zeros(max(rows, cols)), torch.zeros(max(rows, cols), dtype=torch.float64)
    for step in range(2):
        v = (torch.randn(rows, cols) * torch.rand(rows, 1) * torch.rand(1, cols)).bfloat16()
        got = tg.normuon_step(v, s)
        expected, s64 = reference(v, s64, dim)
        diff = ((got.double() - expected).abs() / expected.abs().clamp(min=1e-3)).max().item()
        state = ((s.double() - s64).abs() / s64).max().item()
        norm = abs(got.double().norm().item() / v.double().norm().item() - 1)
        print(f"{rows}x{cols} step {step + 1}: update within {diff:.1e}, state {state:.1e}, norm kept within {norm:.1e}")
        # two BF16 roundings (the scale, the product), each within 2^-8 of its value
        assert got.dtype == torch.bfloat16 and diff < 2 * 2 ** -8 + 1e-4 and state < 1e-6 and norm < 4e-3, (rows, cols, step)
    # a state of the other side's entries is another normalisation
    other, _ = reference(v, torch.zeros(min(rows, cols), dtype=torch.float64), 1 - dim)
    assert rows == cols or ((got.double() - other).abs() / other.abs().clamp(min=1e-3)).max() > 0.05
# Muon's state: a row of max(rows, cols) a block (qkvw's three C x C blocks), the blocks' updates each its own.
p = torch.randn(48, 16).requires_grad_()
p.grad = torch.randn(48, 16)
muon = tg.Muon([dict(params=[p], blocks=3)], 0.05, 0.0, 0.95, normuon=True)
muon.orthogonalise = lambda b, ns: b.bfloat16()
muon.step()
state = muon.state[p]["second_moments"]
u = p.grad.lerp(0.05 * p.grad, 0.95).bfloat16()  # the Nesterov input from a zero momentum
expected = torch.stack([(1 - tg.NORMUON_BETA2) * b.float().square().mean(1) for b in u.chunk(3)])
assert state.shape == (3, 16) and torch.allclose(state, expected, rtol=1e-6, atol=0), state
for flag in ("1", "0"):
    args = tg.parse_args(["--model", "tiny", "--optimizer", "muon", "--normuon", flag, "--input_bin", "x"])
    optimizers, _ = tg.make_optimizers(tg.GPT(tg.resolve_config(args)), args, "cpu")
    assert optimizers[1].normuon == (flag == "1"), flag
print("--normuon 1: Muon with NorMuon's state; 0: without")
EOF

check "--muon_qk_heads 2: qkvw's q and k in blocks of 2 heads, each orthogonalised on its own, v whole" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
args = tg.parse_args(["--model", "tiny", "--optimizer", "muon", "--muon_qk_heads", "2", "--input_bin", "x"])
model = tg.GPT(tg.resolve_config(args))
C, hs = model.config.channels, model.config.channels // model.config.num_heads  # 4 heads of 32
qkv = tg.muon_param_groups(model, args.muon_qk_heads)[0]
assert qkv["blocks"] == [2 * hs] * 4 + [C] and tg.muon_param_groups(model)[0]["blocks"] == 3, qkv["blocks"]
polar, lr, wd, mu = tg.NEWTON_SCHULZ["polar"], 0.05, 1.2, 0.95
p0 = model.transformer.h[0].attn.c_attn.weight.detach()
grad = torch.randn(3 * C, C)
def stepped(blocks):  # one Muon step of qkvw alone, NorMuon and the cautious decay, from zero state
    p = p0.clone().requires_grad_()
    p.grad = grad.clone()
    muon = tg.Muon([dict(params=[p], blocks=blocks)], lr, wd, mu, polar, cautious=True, normuon=True)
    muon.step()
    return p.detach(), muon.state[p]["second_moments"]
got, second = stepped(qkv["blocks"])
# By hand: q's rows [2h hs, (2h + 2) hs) for each head pair h, then k's, then v, each orthogonalised
# and normalised on its own from a zero state, all wide (scale 1).
u = grad.lerp((1 - mu) * grad, mu)
rows = [(part * C + pair * 2 * hs, part * C + (pair + 1) * 2 * hs) for part in (0, 1) for pair in range(2)]
expected, states = p0.clone(), []
for begin, end in rows + [(2 * C, 3 * C)]:
    state = torch.zeros(C)
    v = tg.normuon_step(tg.orthogonalise(u[begin:end], polar), state)
    old = p0[begin:end]
    mask = (v.float() * old >= 0).to(old.dtype)
    expected[begin:end] = (old - old * mask * (wd * lr) * lr) - lr * v.float()
    states.append(state)
whole, _ = stepped(3)
diff = (got - expected).abs().max().item()
print(f"{len(states)} blocks against the by-hand step: within {diff:.1e}; q and k against them whole: "
      f"{(got[:2 * C] - whole[:2 * C]).abs().max().item():.1e} apart")
# Muon's p.add_(update, alpha=-lr) may fuse the product: an FP32 ulp or two of the weights (about 4e-9).
assert diff <= 2e-8 and torch.equal(second, torch.stack(states)), diff
assert (got[:2 * C] - whole[:2 * C]).abs().max() > 1e-3 and torch.equal(got[2 * C:], whole[2 * C:])
EOF

check "learning rate schedules" <<'EOF'
import math, argparse, train_gpt2 as tg
a = argparse.Namespace(learning_rate=1.0, warmup_iters=2, num_iterations=12, final_lr_frac=0.1)
lr = lambda s, k: tg.learning_rate(s, argparse.Namespace(**vars(a), lr_schedule=k))
assert [lr(s, "cosine") for s in (0, 1)] == [0.5, 1.0]
assert lr(2, "cosine") == 1.0 and abs(lr(7, "cosine") - (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))) < 1e-12
assert lr(7, "linear") == 0.55 and lr(11, "constant") == 1.0
assert [lr(s, "wsd") for s in (9, 10, 11)] == [1.0, 1.0, 1.0 - 0.9 * 0.5]
for k in ("cosine", "linear", "wsd", "constant"):
    print(k.ljust(8), " ".join(f"{lr(s, k):.3f}" for s in range(12)))
EOF

check "the layer plan: the speedrun's layers, llmc/gpt2.h's lists the same, the other architectures' windows" <<'EOF'
import re
import train_gpt2 as tg
def text(plan):  # "A|- window ve,skip source:skip weight" a layer, "." for None
    dot = lambda v: "." if v is None else str(v)
    return " ".join(f"{'A' if s.attention else '-'}{s.window}{dot(s.value_embedding)},{dot(s.skip_source)}:"
                    f"{dot(s.skip_weight)}" for s in plan)
speedrun = text(tg.layer_plan("speedrun", 12))
assert speedrun == ("AL0,.:. AS1,.:. AS2,.:. AS.,.:. AL.,.:. AS.,.:. AS.,5:0 -L.,4:1 AS.,3:2 AS0,2:3 AS1,1:4 "
                    "AL2,0:5"), speedrun
gpt2 = text(tg.layer_plan("gpt2", 12))
assert gpt2 == "AL.,.:. AS.,.:. AS.,.:. AS.,.:. AL.,.:. AS.,.:. AS.,.:. AL.,.:. AS.,.:. AS.,.:. AS.,.:. AL.,.:.", gpt2
assert text(tg.layer_plan("modern", 12)) == gpt2
assert text(tg.layer_plan("modern", 2)) == "AL.,.:. AL.,.:." and len(tg.layer_plan("gpt2", 24)) == 24
assert all(s.attention and s.window == "L" for s in tg.layer_plan("gpt2", 13))
header = open("llmc/gpt2.h").read()
def cpp(name):  # a list of llmc/gpt2.h's layer plan, -1 as None
    value = re.search(name + r"\[\] = +(.+?);", header).group(1)
    if value.startswith('"'):
        return value.strip('"')
    return [None if v == -1 else v for v in map(int, value.strip("{}").split(","))]
for name in ("Attention", "Windows", "ValueEmbeddings", "SkipSources"):
    python = getattr(tg, "SPEEDRUN_" + re.sub(r"(?<=.)([A-Z])", r"_\1", name).upper())
    assert cpp("kSpeedrun" + name) == python, (name, cpp("kSpeedrun" + name), python)
print("speedrun:", speedrun)
EOF

check "the MFU count (SPEC.md): causal, and the speedrun's windows in blocks and in tokens" <<'EOF'
import train_gpt2 as tg
g = tg.make_config(*tg.PRESETS["d12"], source="d12")
assert g.flops_per_token(1024) == 6 * g.num_parameters() + 6 * 12 * 768 * 1024
config = tg.make_config(*tg.SPEEDRUN_PRESETS["d12"], source="d12", arch="speedrun")
model = tg.GPT(config)
model.documents = True
T, blocks = 49152, 49152 // 128
def mean_keys(n):  # query block i sees min(i + 1, n) blocks, the last half: summed over i, per query
    n = max(1, n)
    return (n * n / 2 + (blocks - n) * (n - 0.5)) * 128 / blocks
lookups = (1 + 3) * config.padded_vocab_size * 768
for window in (1, 5, 14):
    model.window_blocks = window
    keys = sum(mean_keys(window if spec.window == "L" else window // 2) for spec in config.plan if spec.attention)
    expected = 6 * (config.num_parameters() - lookups) + 12 * 768 * keys
    assert abs(model.flops_per_token(T) - expected) < 1e-9 * expected, (window, model.flops_per_token(T), expected)
    print(f"speedrun d12, window {window:2d}: {model.flops_per_token(T) / 1e6:.1f} MFLOP a token")
model.window_tokens = True  # query t sees min(t + 1, 128 n + 1) keys, counted one by one
for window in (1, 5):
    model.window_blocks = window
    keys = sum(sum(min(t + 1, (window if spec.window == "L" else window // 2) * 128 + 1) for t in range(T)) / T
               for spec in config.plan if spec.attention)
    expected = 6 * (config.num_parameters() - lookups) + 12 * 768 * keys
    assert abs(model.flops_per_token(T) - expected) < 1e-9 * expected, (window, model.flops_per_token(T), expected)
    print(f"speedrun d12, window {window:2d} in tokens: {model.flops_per_token(T) / 1e6:.1f} MFLOP a token")
model.window_tokens = False
model.documents = False
assert model.flops_per_token(T) == config.flops_per_token(T, 11 * T / 2)
EOF

check "data order" <<'EOF'
import os, sys, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from documents_reference import write_shard
d = os.environ["WORK"]
for s, n in enumerate([4 * 8 + 1, 3 * 8 + 5]):
    write_shard(f"{d}/order_{s}.bin", [s * 100 + i for i in range(n)])
def starts(shuffle, world=1, rank=0, count=7):
    loader = tg.ShardLoader(d + "/order_*.bin", "--input_bin", 2, 4 // world, rank, world, shuffle, 42, 512)
    return [int(loader.next_batch()[0][0, 0]) for _ in range(count)]
assert starts(0) == [0, 8, 16, 24, 100, 108, 116], starts(0)
assert starts(0, 2, 1, 4) == [4, 12, 20, 28]
order = starts(1, count=14)
assert sorted(order[:7]) == sorted(starts(0)) and sorted(order[7:]) == sorted(starts(0)) and order[:7] != order[7:]
rng = tg.MT19937(42)
shards = rng.permutation(2)
batches = [rng.permutation([4, 3][shards[0]]), rng.permutation([4, 3][shards[1]])]
assert order[:7] == [s * 100 + 8 * b for k, s in enumerate(shards) for b in batches[k]]
print("no shuffle:", starts(0), "| shuffled epochs:", order[:7], order[7:])
EOF

check "training on shards (one process)" <<'EOF'
import os, sys, numpy as np
sys.path.insert(0, "dev/test")
from documents_reference import write_shard
d = os.environ["WORK"]
pattern = np.arange(20000) % 97 * 5 % 512  # a cycle a model learns within a few steps
for s in range(2):
    write_shard(f"{d}/train_{s}.bin", np.roll(pattern, 1000 * s))
write_shard(f"{d}/val_0.bin", pattern[:5000])
EOF
"$PYTHON" train_gpt2.py "${TINY[@]}" --input_bin "$WORK/train_*.bin" --input_val_bin "$WORK/val_*.bin" \
  -b 4 -t 32 --total_batch_size 256 --num_iterations 8 --val_every 4 --val_steps 2 \
  --learning_rate 3e-3 --warmup_iters 2 --output_dir "$WORK/run" | tee "$WORK/train.out" | grep -E '^step'
grep -q '^peak memory: [0-9]* MiB' "$WORK/train.out"
[ "$(grep -c 'kind=val' "$WORK/run/main.log")" = 3 ] && [ "$(grep -c 'kind=train' "$WORK/run/main.log")" = 8 ]
check "the loss falls and the final checkpoint loads" <<'EOF'
import os, train_gpt2 as tg
d = os.environ["WORK"]
log = [dict(kv.split("=") for kv in line.split()) for line in open(d + "/run/main.log")]
val = [float(r["loss"]) for r in log if r["kind"] == "val"]
assert val[-1] < val[0] - 1.0, val
tg.read_checkpoint(d + "/run/model_00000008.bin")
print("val loss", " -> ".join(f"{v:.3f}" for v in val))
EOF
echo "--- --eval_only 1 gives the final checkpoint the run's last validation loss"
"$PYTHON" train_gpt2.py --init_from "$WORK/run/model_00000008.bin" --eval_only 1 \
  --input_val_bin "$WORK/val_*.bin" -b 4 --val_seq_len 32 --val_steps 2 | tee "$WORK/eval.out"
"$PYTHON" -c "import sys; last = lambda f: float([l for l in open(f) if ' val loss ' in l][-1].split()[-1]); \
a, b = last(sys.argv[1]), last(sys.argv[2]); assert abs(a - b) <= 1e-5, (a, b); \
print('eval_only', b, 'training run', a)" "$WORK/train.out" "$WORK/eval.out"
[ "$(grep -c '' "$WORK/eval.out")" = 1 ] && grep -q '^step    0/0 | val loss [0-9.]*$' "$WORK/eval.out"

echo "--- --check_debug_state: a state's first step again, in float32 as written, in bfloat16 off by its rounding"
"$PYTHON" train_gpt2.py --recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 2 -b 2 -t 256 --flash 0 \
  --write_debug_state "$WORK/speedrun_state" --debug_steps 1 --device cpu >/dev/null
speedrun_state=(--init_from "$WORK/speedrun_state/gpt2_speedrun_tiny.bin"
  --check_debug_state "$WORK/speedrun_state/gpt2_speedrun_tiny_muon_debug_state.bin" --flash 0 --device cpu)
gpt2_state=(--init_from "$WORK/a/gpt2_l2h4c128t64v512.bin" --check_debug_state "$WORK/a/gpt2_l2h4c128t64v512_debug_state.bin"
  --device cpu)
for dtype in float32 bfloat16; do
  "$PYTHON" train_gpt2.py --recipe speedrun "${speedrun_state[@]}" --dtype $dtype > "$WORK/check_speedrun_$dtype.out"
  "$PYTHON" train_gpt2.py "${gpt2_state[@]}" --dtype $dtype > "$WORK/check_gpt2_$dtype.out"
done
cat "$WORK/check_speedrun_bfloat16.out"
"$PYTHON" - "$WORK" <<'EOF'
import sys
def errors(name):
    lines = open(f"{sys.argv[1]}/check_{name}.out").read().splitlines()[1:]
    return {line[:24].strip(): float(line.split()[-1]) for line in lines}
speedrun = ["logits", "loss"] + ["grad " + t for t in ("wte qkvw attprojw fcw fcprojw headw ve attngate skipw lambdas "
                                                        "value_scales").split()]
gpt2 = ["logits", "loss"] + ["grad " + t for t in ("wte wpe ln1w ln1b qkvw qkvb attprojw attprojb ln2w ln2b fcw fcb "
                                                    "fcprojw fcprojb lnfw lnfb").split()]
for model, names in (("speedrun", speedrun), ("gpt2", gpt2)):
    exact, rounded = errors(f"{model}_float32"), errors(f"{model}_bfloat16")
    assert list(exact) == names and list(rounded) == names, (model, list(exact), list(rounded))
    assert all(e <= 1e-6 for e in exact.values()), (model, exact)
    # bfloat16's rounding shows in every tensor, within a few of its units (2^-8).
    assert all(1e-4 < e < 0.1 for name, e in rounded.items() if name != "loss"), (model, rounded)
    print(f"{model}: float32 largest {max(exact.values()):.1e}; bfloat16 {min(rounded.values()):.1e} to "
          f"{max(rounded.values()):.1e}")
EOF

echo "--- the loss's settings in a debug state (version 5): record #89's cap and terms written, read back, checked"
"$PYTHON" train_gpt2.py --recipe speedrun --model tiny --debug_noise 0.02 --window_blocks 1 -b 1 -t 128 --flash 0 \
  --logit_cap 23,5 --mtp 1,0.5,0.25 --prefix_weight 0.25 --tokenizer "$WORK/gpt2_tokenizer.bin" \
  --write_debug_state "$WORK/settings_state" --debug_steps 1 --device cpu >/dev/null
"$PYTHON" train_gpt2.py --recipe speedrun --init_from "$WORK/settings_state/gpt2_speedrun_tiny.bin" --flash 0 \
  --check_debug_state "$WORK/settings_state/gpt2_speedrun_tiny_muon_debug_state.bin" --device cpu \
  > "$WORK/check_settings.out"
check "the settings and prefix table read back; --check_debug_state applies them (its loss the state's)" <<'EOF'
import os, train_gpt2 as tg
work = os.environ["WORK"]
path = f"{work}/settings_state/gpt2_speedrun_tiny_muon_debug_state.bin"
header = tg.read_debug_state(path, header_only=True)
text, prefix, _ = tg.read_debug_state_settings(path, header)
assert header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and text == "-lc 23.0,5.0 -mtp 1.0,0.5,0.25 -pw 0.25", text
assert prefix.tolist() == tg.prefix_table(*tg.read_vocabulary(f"{work}/gpt2_tokenizer.bin", "--tokenizer"), 50304)
lines = open(f"{work}/check_settings.out").read().splitlines()[1:]
errors = {line[:24].strip(): float(line.split()[-1]) for line in lines}
assert max(errors.values()) <= 1e-6, errors
print(f"version {header[1]}: '{text}', {len(prefix)} prefix rows; checked: largest error {max(errors.values()):.1e}")
EOF

check "--logit_cap 23,5,bf16: the sigmoid rounded to bfloat16 in training, its gradient of the rounded value, float32 under no_grad, the settings' text" <<'EOF'
import torch, train_gpt2 as tg
args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "-b", "1", "-t", "64", "--input_bin", "x",
                      "--device", "cpu"])
config = tg.resolve_config(args)
tg.settle_arch(args, config)
model = tg.GPT(config)
z = torch.linspace(-60, 60, 4001, dtype=torch.float32, requires_grad=True)
tg.set_logit_cap(model, "23,5,bf16")
y = model.soft_cap(z)
s = torch.sigmoid((z.detach() + 5) / 7.5).bfloat16().float()
assert torch.equal(y.detach(), 23 * s), (y - 23 * s).abs().max()
assert (y.detach() - 23 * torch.sigmoid((z.detach() + 5) / 7.5)).abs().max() > 1e-2  # the rounding shows
y.sum().backward()
assert torch.allclose(z.grad, 23 / 7.5 * s * (1 - s), rtol=1e-6, atol=0), (z.grad - 23 / 7.5 * s * (1 - s)).abs().max()
with torch.no_grad():  # evaluation: the sigmoid in float32
    assert torch.equal(model.soft_cap(z), 23 * torch.sigmoid((z + 5) / 7.5))
text = tg.debug_state_settings(model)
assert text == "-lc 23.0,5.0,bf16", text
print(f"y = 23 bf16(s) over {z.numel()} logits, its gradient s (1 - s) of the rounded s, float32 s under no_grad; "
      f"settings '{text}'")
EOF
expect_error "logit_cap 23,5,fp8: the third item rounds the sigmoid to BF16" --recipe speedrun --model tiny --bench \
  --documents 0 --window_blocks 0 -b 1 -t 64 --logit_cap 23,5,fp8

check "--untie_step: the head steps with both gradients through step U, the embedding its copy, then its own" <<'EOF'
import copy, contextlib, torch, train_gpt2 as tg
args = tg.parse_args(["--recipe", "modern", "--model", "tiny", "--vocab_size", "512", "-b", "2", "-t", "32",
                      "--total_batch_size", "-1", "--num_iterations", "4", "--untie_step", "1", "--input_bin", "x",
                      "--device", "cpu"])
config = tg.resolve_config(args)
tg.settle_arch(args, config)
model = tg.GPT(config)
tg.init_weights(model, 42)
tg.add_debug_noise(model, 0.02, 42)
tg.tie_embedding(model)
head, wte = model.lm_head.weight, model.transformer.wte.weight
plan = tg.stage_plan(args, 1)
optimizers, _ = tg.make_optimizers(model, args, "cpu")
state = tg.optimizer_state_of(optimizers)
loader = tg.RandomTokens(2, 32, 512, 3, False)
for step in range(4):
    before = copy.deepcopy(model)
    by_hand, _ = tg.make_optimizers(before, args, "cpu")
    for o, h in zip(optimizers, by_hand):
        h.load_state_dict(o.state_dict())
    tg.train_step(args, step, plan.step(step), 4, model, model, optimizers, loader, "cpu", contextlib.nullcontext(), 1)
    # the same step by hand: where tied, the head's gradient plus the embedding's, then the embedding the head
    x, y = loader.next_batch()
    tg.set_learning_rates(by_hand, step, args, 1.0, 4)
    before.zero_grad(set_to_none=True)
    before(x, y, args.loss_reduction, before.attention_masks(x))[1].backward()
    tg.clip_gradients(before.parameters(), args.grad_clip)
    if step <= args.untie_step:
        before.lm_head.weight.grad += before.transformer.wte.weight.grad
    for h in by_hand:
        h.step()
    if step <= args.untie_step:
        with torch.no_grad():
            before.transformer.wte.weight.copy_(before.lm_head.weight)
    assert torch.equal(before.lm_head.weight, head) and torch.equal(before.transformer.wte.weight, wte), step
    tied = torch.equal(wte, head)
    same_state = all(torch.equal(state(wte)[k], state(head)[k]) for k in ("exp_avg", "exp_avg_sq"))
    assert tied == (step <= 1) and same_state == (step == 1), (step, tied, same_state)
    print(f"step {step}: as by hand; {'tied' if tied else 'separate'}, the AdamW states "
          f"{'the same (copied at the untie step)' if same_state else 'apart'}")
EOF
"$PYTHON" train_gpt2.py --recipe modern --model tiny --vocab_size 512 --debug_noise 0.02 -b 2 -t 32 --untie_step 2 \
  --write_debug_state "$WORK/untie_state" --debug_steps 4 --device cpu >/dev/null
check "--untie_step in the debug state: -ut in its settings, its model tied" <<'EOF'
import os, torch, train_gpt2 as tg
work = os.environ["WORK"]
path = f"{work}/untie_state/gpt2_modern_l2h1c128t64v512_muon_debug_state.bin"
header = tg.read_debug_state(path, header_only=True)
text, prefix, _ = tg.read_debug_state_settings(path, header)
model = tg.read_checkpoint(f"{work}/untie_state/gpt2_modern_l2h1c128t64v512.bin")
assert header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and text == "-ut 2" and prefix is None, text
assert torch.equal(model.transformer.wte.weight, model.lm_head.weight)
print(f"version {header[1]}: '{text}', the checkpoint's embedding its head")
EOF
check "--adam_every 2: AdamW on odd steps with the two steps' gradients summed, its t its updates; Muon every step" <<'EOF'
import copy, contextlib, torch, train_gpt2 as tg
args = tg.parse_args(["--recipe", "modern", "--model", "tiny", "--vocab_size", "512", "-b", "2", "-t", "32",
                      "--total_batch_size", "-1", "--num_iterations", "4", "--adam_every", "2", "--untie_step", "1",
                      "--input_bin", "x", "--device", "cpu"])
config = tg.resolve_config(args)
tg.settle_arch(args, config)
model = tg.GPT(config)
tg.init_weights(model, 42)
tg.add_debug_noise(model, 0.02, 42)
tg.tie_embedding(model)
plan = tg.stage_plan(args, 1)
optimizers, _ = tg.make_optimizers(model, args, "cpu")
adamw = [p for group in optimizers[0].param_groups for p in group["params"]]
loader = tg.RandomTokens(2, 32, 512, 3, False)
kept = {}  # by hand: AdamW's tensors' gradients of the even step before
for step in range(4):
    before = copy.deepcopy(model)
    by_hand, _ = tg.make_optimizers(before, args, "cpu")
    for o, h in zip(optimizers, by_hand):
        h.load_state_dict(o.state_dict())
    tg.train_step(args, step, plan.step(step), 4, model, model, optimizers, loader, "cpu", contextlib.nullcontext(), 1)
    x, y = loader.next_batch()
    tg.set_learning_rates(by_hand, step, args, 1.0, 4)
    before.zero_grad(set_to_none=True)
    before(x, y, args.loss_reduction, before.attention_masks(x))[1].backward()
    hand_adamw = [p for group in by_hand[0].param_groups for p in group["params"]]
    for i, p in enumerate(hand_adamw):
        p.grad = kept[i] + p.grad if kept else p.grad
    odd = step % 2 == 1
    kept = {} if odd else {i: p.grad.clone() for i, p in enumerate(hand_adamw)}
    if odd and step <= args.untie_step:
        before.lm_head.weight.grad += before.transformer.wte.weight.grad
    for h in by_hand if odd else by_hand[1:]:
        h.step()
    if step <= args.untie_step:
        with torch.no_grad():
            before.transformer.wte.weight.copy_(before.lm_head.weight)
    for (name, a), b in zip(before.named_parameters(), model.parameters()):
        assert torch.equal(a, b), (step, name)
    updates = {int(optimizers[0].state[p]["step"]) for p in adamw if p in optimizers[0].state}
    assert updates == ({(step + 1) // 2} if step else set()), (step, updates)
    print(f"step {step}: as by hand; AdamW's updates {(step + 1) // 2}, its gradients "
          f"{'applied' if odd else 'kept for the next step'}")
EOF
"$PYTHON" train_gpt2.py --recipe modern --model tiny --vocab_size 512 --debug_noise 0.02 -b 2 -t 32 --adam_every 2 \
  --untie_step 1 --write_debug_state "$WORK/adam_every_state" --debug_steps 4 --device cpu >/dev/null
check "--adam_every in the debug state: -ao in its settings" <<'EOF'
import os, train_gpt2 as tg
path = f"{os.environ['WORK']}/adam_every_state/gpt2_modern_l2h1c128t64v512_muon_debug_state.bin"
header = tg.read_debug_state(path, header_only=True)
text, prefix, _ = tg.read_debug_state_settings(path, header)
assert header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and text == "-ut 1 -ao 2" and prefix is None, text
print(f"version {header[1]}: '{text}'")
EOF
check "--smear: the smear against a loop over the flat sequence; its header slot and parameters read back" <<'EOF'
import os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
config = tg.make_config(12, 2, 128, 1024, 512, "test", arch="speedrun", smear=True)
model = tg.GPT(config)
tg.init_weights(model, 42)
assert not model.smear_weight.any() and not model.smear_lambda.any(), "the smear starts at zero"
with torch.no_grad():
    model.smear_weight.normal_(0.0, 0.5)
    model.smear_lambda.fill_(0.7)
x = torch.randn(2, 5, 128)
flat = x.reshape(-1, 128)
want = flat.clone()
for t in range(1, flat.size(0)):  # the flat sequence: row 1's first token reads row 0's last
    want[t] = flat[t] + 0.7 * torch.sigmoid(flat[t, :12] @ model.smear_weight) * flat[t - 1]
got = model.smear(x).reshape(-1, 128)
error = (got - want).abs().max().item()
assert error < 1e-5, error
back, header = checkpoint_round_trip(model, "smear")
assert header[tg.FEATURES_SLOT] == tg.FEATURE_SMEAR and back.config.smear
assert torch.equal(back.smear_weight, model.smear_weight) and torch.equal(back.smear_lambda, model.smear_lambda)
assert config.num_parameters() == sum(p.numel() for p in model.parameters())
names = [tg.table_name(n) for n, _ in model.named_parameters()]
assert "smearw" in names and "smear_lambda" in names
print(f"the smear within {error:.1e} of its loop over 10 flat rows; header slot {tg.FEATURES_SLOT} "
      f"{int(header[tg.FEATURES_SLOT])}, its 13 parameters read back")
EOF
check "--bigram: the hash as llmc's, the pinned signs, each layer's gated term by hand; its header and parameters" <<'EOF'
import os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
# the hash's rows against llmc/bigram_hash.h's pinned values (dev/test/test_bigram_hash.cpp)
for tokens, rows, ids, signs in [
        ([50256, 15496, 11, 995, 0, 50303, 7], 377280, [377279, 126884, 175303, 56405, 268236, 245200, 46095],
         [0, 6360, 7299, 1000, 995, 1151, 1144]),
        ([100000, 2000000000, 59139, 5, 123456789], 377280, [377279, 54871, 145461, 166078, 97912],
         [0, 4768, 4867, 1798, 3344]),
        ([3, 1, 4, 1, 5, 9, 2, 6], 480, [479, 156, 246, 289, 89, 7, 164, 410], [0, 2, 5, 5, 4, 12, 11, 4])]:
    got_ids, got_signs = tg.bigram_rows(torch.tensor(tokens), rows)
    assert got_ids.tolist() == ids and got_signs.tolist() == signs, (tokens, got_ids.tolist(), got_signs.tolist())
signs = tg.bigram_sign_table(128).flatten()
assert signs[:4].tolist() == [1, -1, -1, 1] and signs[-4:].tolist() == [-1, -1, -1, 1] and signs.sum() == 1262
config = tg.make_config(12, 2, 128, 1024, 512, "test", arch="speedrun", bigram=True)
model = tg.GPT(config)
tg.init_weights(model, 42)
assert not model.bigram.weight.any() and (model.bigram_gates == tg.BIGRAM_GATE_INIT).all()
tg.add_debug_noise(model, 0.02, 42)  # the head is zero at init: no gradient would pass it
with torch.no_grad():
    model.bigram.weight.normal_()
    model.bigram_gates.uniform_(0.5, 1.5)
idx = torch.randint(0, 512, (2, 6))
bigram = model.bigram_embedding(idx)
terms = [model.bigram_term(layer, bigram, [None, None]) for layer in range(config.num_layers)]
flat = idx.flatten().tolist()
for layer, spec in enumerate(config.plan):  # by hand: the flat sequence's pairs, each layer's gate
    if not spec.attention:
        assert terms[layer] is None
        continue
    slab = sum(s.attention for s in config.plan[:layer])
    for t in range(len(flat)):
        id_t, sign = (config.bigram_rows - 1, 0) if t == 0 else (None, (flat[t - 1] ^ flat[t]) % 8192)
        if t:
            previous = config.bigram_rows - 1 if t == 1 else flat[t - 1]
            h = ((36313 * flat[t]) & 0xFFFFFFFF) ^ ((27191 * previous) & 0xFFFFFFFF)
            id_t = (h - (1 << 32) if h >= 1 << 31 else h) % (config.bigram_rows - 1)
        want = model.bigram_gates[slab] * model.bigram.weight[id_t] * model.bigram_signs[sign]
        assert torch.allclose(terms[layer].view(-1, 128)[t], want), (layer, t)
x, y = idx, torch.randint(0, 512, (2, 6))
model(x, y)[1].backward()
assert model.bigram_gates.grad.abs().sum() > 0 and model.bigram.weight.grad.abs().sum() > 0
back, header = checkpoint_round_trip(model, "bigram")
assert header[tg.FEATURES_SLOT] == tg.FEATURE_BIGRAM and back.config.bigram and not back.config.smear
assert torch.equal(back.bigram.weight, model.bigram.weight) and torch.equal(back.bigram_gates, model.bigram_gates)
assert config.num_parameters() == sum(p.numel() for p in model.parameters())
both = tg.GPT(tg.make_config(12, 2, 128, 1024, 512, "test", arch="speedrun", smear=True, bigram=True))
names = {id(p): tg.table_name(name) for name, p in both.named_parameters()}
order = list(dict.fromkeys(names[id(p)] for p in tg.params_in_file_order(both)))
assert order == ["wte", "qkvw", "attprojw", "fcw", "fcprojw", "headw", "ve", "bigram", "attngate", "skipw", "lambdas",
                 "value_scales", "smearw", "smear_lambda", "bigram_gates"], order  # llmc/gpt2.h's table
print(f"the hash's rows as llmc's, the sign table torch's; {config.bigram_rows} rows, 11 gates; layer 0's before it, "
      f"the later attention layers' after it, by hand; header slot {tg.FEATURES_SLOT} {int(header[tg.FEATURES_SLOT])}; "
      f"with the smear, the file order {' '.join(order)}")
EOF
check "--ve_gates: each head's gate by hand, its gradients against autograd's; file order, header, refusals" <<'EOF'
import os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
config = tg.make_config(12, 2, 128, 1024, 512, "test", arch="speedrun", ve_gates=True)
model = tg.GPT(config)
tg.init_weights(model, 42)
assert model.ve_gates.shape == (6, 2, 12) and not model.ve_gates.any(), "the gates' weights start at zero"
tg.add_debug_noise(model, 0.02, 42)  # the head is zero at init: no gradient would pass it
assert model.ve_gates.all(), "the debug state's noise reaches every gate weight"
with torch.no_grad():
    model.ve_gates.normal_(0.0, 0.5)
layers = [layer for layer, spec in enumerate(config.plan) if spec.value_embedding is not None]
gates = model.layer_ve_gates()
assert layers == [0, 1, 2, 9, 10, 11] and [g is not None for g in gates] == [l in layers for l in range(12)]
assert all(gates[layer] is model.ve_gates[row] or torch.equal(gates[layer], model.ve_gates[row])
           for row, layer in enumerate(layers))
# By hand, layer 10 (the gates' row 4): v = a v + 2 sigmoid(w_h . [x[:6], ve[:6]]) ve, head by head.
attn, w = model.transformer.h[10].attn, model.ve_gates[4].detach()
x, v, ve = torch.randn(2, 3, 128), torch.randn(2, 3, 2, 64), torch.randn(2, 3, 128)
a = attn.value_scales[0].item()
got = attn.mix_values(v, ve, x, gates[10]).detach()
want = torch.empty_like(v)
for b in range(2):
    for t in range(3):
        inputs = torch.cat([x[b, t, :6], ve[b, t, :6]])
        for h in range(2):
            gate = 2 / (1 + torch.exp(-(w[h] @ inputs)))
            want[b, t, h] = a * v[b, t, h] + gate * ve[b, t, 64 * h:64 * (h + 1)]
error = (got - want).abs().max().item()
assert error < 1e-5, error
# The gradients autograd takes, in float64, against the formulas the CUDA kernels compute.
wd = w.double().requires_grad_()
xd, ved, vd = x.double().requires_grad_(), ve.double().requires_grad_(), v.double().requires_grad_()
out = attn.mix_values(vd, ved, xd, wd)
dout = torch.randn_like(out)
out.backward(dout)
inputs = torch.cat([xd[..., :6], ved[..., :6]], -1).detach()
g = 2 * torch.sigmoid(inputs @ wd.detach().T)                      # [2, 3, NH]
dz = (dout * ved.detach().view(2, 3, 2, 64)).sum(-1) * g * (1 - g / 2)
want_dw = torch.einsum("bth,btj->hj", dz, inputs)
want_dx = torch.zeros_like(xd)
want_dx[..., :6] = dz @ wd.detach()[:, :6]
want_dve = (g[..., None] * dout).reshape(2, 3, 128)
want_dve[..., :6] += dz @ wd.detach()[:, 6:]
grad_errors = [(got_grad - ref).abs().max().item() for got_grad, ref in
               [(wd.grad, want_dw), (xd.grad, want_dx), (ved.grad, want_dve), (vd.grad, a * dout)]]
assert max(grad_errors) < 1e-12, grad_errors
# The whole model: the gates take b's place, whose gradient is zero in every layer.
idx, targets = torch.randint(0, 512, (2, 6)), torch.randint(0, 512, (2, 6))
model(idx, targets)[1].backward()
scales = [block.attn.value_scales.grad for block in model.transformer.h if block.attn is not None]
assert model.ve_gates.grad.abs().sum() > 0 and all(s[1] == 0 and s[0] != 0 for s in scales)
back, header = checkpoint_round_trip(model, "ve_gates")
assert header[tg.FEATURES_SLOT] == tg.FEATURE_VE_GATES and back.config.ve_gates and not back.config.bigram
assert torch.equal(back.ve_gates, model.ve_gates)
assert config.num_parameters() == sum(p.numel() for p in model.parameters())
every = tg.GPT(tg.make_config(12, 2, 128, 1024, 512, "test", arch="speedrun", smear=True, bigram=True,
                              ve_gates=True))
names = {id(p): tg.table_name(name) for name, p in every.named_parameters()}
order = list(dict.fromkeys(names[id(p)] for p in tg.params_in_file_order(every)))
assert order == ["wte", "qkvw", "attprojw", "fcw", "fcprojw", "headw", "ve", "bigram", "attngate", "skipw", "lambdas",
                 "value_scales", "smearw", "smear_lambda", "bigram_gates", "vegate"], order  # llmc/gpt2.h's table
args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--input_bin", "x", "--device", "cpu"])
tg.settle_arch(args, tg.resolve_config(args))
groups = tg.optimizer_groups(every, args)
scalar_group, = [group for _, group in groups if any(p is every.ve_gates for p in group["params"])]
assert all(p.dim() == 1 or p is every.ve_gates for p in scalar_group["params"]), "the gates go with the scalars"
print(f"layer 10's mix within {error:.1e} of the gates by hand; dW, dx, dve, dv within "
      f"{max(grad_errors):.1e} of autograd's; b's gradient zero in every layer; header slot {tg.FEATURES_SLOT} "
      f"{int(header[tg.FEATURES_SLOT])}; with the smear and the bigram embedding, the file order {' '.join(order)}")
EOF
check "--resid_lambdas: r x + p out by hand and the gradients of r and p; AdamW's groups; header and parameters back" <<'EOF'
import math, os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
config = tg.make_config(12, 2, 128, 1024, 512, "test", arch="speedrun", resid_lambdas=True)
model = tg.GPT(config)
tg.init_weights(model, 42, 89)
assert torch.equal(model.resid_lambdas, torch.full((12, 2), math.sqrt(1.1), dtype=torch.float32))
assert torch.equal(model.post_lambdas, torch.ones(12, 2))
order = tg.params_in_file_order(model)
assert order[-2] is model.resid_lambdas and order[-1] is model.post_lambdas
assert config.num_parameters() == sum(p.numel() for p in model.parameters())
with torch.no_grad():
    model.resid_lambdas.uniform_(0.5, 1.5)
    model.post_lambdas.uniform_(0.5, 1.5)
    for block in model.transformer.h:  # the MLP's output, zero at init, nonzero: p's gradient too
        block.mlp.c_proj.weight.normal_(0.0, 0.02)
seen = {}
def keep(name):
    def hook(module, inputs, output):
        seen[name + "_in"] = inputs[0]
        seen[name + "_out"] = output
        output.retain_grad()
    return hook
for layer in (7, 10):
    block = model.transformer.h[layer]
    block.ln_2.register_forward_hook(keep(f"ln2_{layer}"))  # its input: the stream after the attention's add
    block.mlp.register_forward_hook(keep(f"mlp_{layer}"))
    block.register_forward_hook(keep(f"block_{layer}"))
    if block.attn is not None:
        block.attn.register_forward_hook(keep(f"attn_{layer}"))
        block.ln_1.register_forward_hook(keep(f"ln1_{layer}"))  # its input: the block's mixed input
x, y = tg.RandomTokens(2, 64, 512, 3).next_batch()
model(x, y)[1].backward()
r, p = model.resid_lambdas, model.post_lambdas
errors = []
for layer in (7, 10):
    g = seen[f"block_{layer}_out"].grad
    mid, mlp = seen[f"ln2_{layer}_in"], seen[f"mlp_{layer}_out"]
    out = seen[f"block_{layer}_out"]
    errors.append((out - (r[layer, 1] * mid + p[layer, 1] * mlp)).abs().max().item())
    errors.append(abs(r.grad[layer, 1] - (mid * g).sum()).item() / (mid * g).sum().abs().item())
    errors.append(abs(p.grad[layer, 1] - (mlp * g).sum()).item() / (mlp * g).sum().abs().item())
    if layer == 10:
        mixed, attn, g_mid = seen["ln1_10_in"], seen["attn_10_out"], seen["ln2_10_in"]
        errors.append((mid - (r[10, 0] * mixed + p[10, 0] * attn)).abs().max().item())
assert max(errors) < 1e-5, errors
assert r.grad[7, 0] == 0 and p.grad[7, 0] == 0, "layer 7's attention pair: no attention, no gradient"
assert r.grad.count_nonzero() == 23 and p.grad.count_nonzero() == 23
# The reference's AdamW rows for them, as --adam_rows gives them: betas (0.9, 0.95), rates 5 and 1 times
# 0.008 (the scalars' rate is 0.008 x 5), no decay.
args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--resid_lambdas", "1", "--benchmark", "1",
                      "--adam_rows", "resid_lambdas:b1=0.9;post_lambdas:lr=0.2,b1=0.9"])
tg.settle_arch(args, config)
groups = [g for kind, g in tg.optimizer_groups(model, args) if kind == "adamw"]
for tensor, lr in ((r, 0.008 * 5), (p, 0.008)):
    group, = [g for g in groups if any(q is tensor for q in g["params"])]
    assert group["params"] == [tensor] and group["betas"] == (0.9, 0.95) and group["weight_decay"] == 0.0
    assert math.isclose(group["lr"], lr), (group["lr"], lr)
back, header = checkpoint_round_trip(model, "resid_lambdas")
assert header[tg.FEATURES_SLOT] == tg.FEATURE_RESID_LAMBDAS and back.config.resid_lambdas
assert torch.equal(back.resid_lambdas, r) and torch.equal(back.post_lambdas, p)
tg.init_weights(model, 5)
tg.write_checkpoint(model, f"{os.environ['WORK']}/resid_lambdas_init.bin", tg.CHECKPOINT_FP32)
print(f"r x + p out by hand and d r = sum x dy, d p = sum out dy within {max(errors):.1e} (layers 7 and 10; "
      f"layer 7's attention pair zero); AdamW: r at 0.04, p at 0.008, betas (0.9, 0.95), no decay; header slot "
      f"{tg.FEATURES_SLOT} {int(header[tg.FEATURES_SLOT])}, the 48 lambdas read back")
EOF
MAKEFLAGS= ${MAKE:-make} -s build/test_utils
build/test_utils --init "$WORK/resid_lambdas_init.bin" 5 0
check "--xsa: XSA by hand, its gradients against autograd's; the plan's layers, file order, header, groups" <<'EOF'
import os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
config = tg.make_config(12, 2, 128, 1024, 512, "test", arch="speedrun", xsa=True)
model = tg.GPT(config)
tg.init_weights(model, 42)
assert model.xsa_alpha.shape == (3, 2) and not model.xsa_alpha.any(), "the strengths start at zero"
tg.add_debug_noise(model, 0.02, 42)  # the head is zero at init: no gradient would pass it
assert model.xsa_alpha.all(), "the debug state's noise reaches every strength"
layers = [layer for layer, spec in enumerate(config.plan) if spec.xsa]
alphas = [model.layer_xsa_alpha(layer, [None, None]) for layer in range(config.num_layers)]
assert layers == [1, 3, 4] and [a is not None for a in alphas] == [l in layers for l in range(12)], layers
assert all(torch.equal(alphas[layer], model.xsa_alpha[row]) for row, layer in enumerate(layers))
# By hand: y - tanh(alpha_h) (y . v / max(|v|^2, 1e-8)) v, head by head; head 1 of row (1, 2) has v = 0.
y, v, alpha = torch.randn(2, 3, 2, 64), torch.randn(2, 3, 2, 64), torch.tensor([0.7, -1.3])
v[1, 2, 1] = 0
got = tg.exclusive_self_attention(y, v, alpha)
want = torch.empty_like(y)
for b in range(2):
    for t in range(3):
        for h in range(2):
            yh, vh = y[b, t, h], v[b, t, h]
            want[b, t, h] = yh - torch.tanh(alpha[h]) * (yh @ vh) / max((vh @ vh).item(), 1e-8) * vh
error = (got - want).abs().max().item()
assert error < 1e-5 and torch.equal(got[1, 2, 1], y[1, 2, 1]), error
assert tg.exclusive_self_attention(y, v, None) is y
low = tg.exclusive_self_attention(y.bfloat16(), v.bfloat16(), alpha)
assert low.dtype == torch.bfloat16, "in y's dtype, as the reference's BF16 tensors"
# The gradients autograd takes, in float64, against the formulas the CUDA kernels compute.
yd, vd, ad = y.double().requires_grad_(), v.double().requires_grad_(), alpha.double().requires_grad_()
out = tg.exclusive_self_attention(yd, vd, ad)
g = torch.randn_like(out)
out.backward(g)
y64, v64, s, t = yd.detach(), vd.detach(), torch.tanh(ad.detach()).view(1, 1, 2, 1), torch.tanh(ad.detach())
dot, squares = (y64 * v64).sum(-1, keepdim=True), (v64 * v64).sum(-1, keepdim=True)
den = squares.clamp_min(1e-8)
gv = (g * v64).sum(-1, keepdim=True)
a = s * gv / den
b = torch.where(squares < 1e-8, torch.zeros_like(den), 2 * s * gv * dot / den ** 2)
want_dy = g - a * v64
want_dv = -s * dot / den * g - a * y64 + b * v64
want_dalpha = (-(dot / den) * gv).sum((0, 1, 3)) * (1 - t * t)
grad_errors = [(got_grad - ref).abs().max().item() for got_grad, ref in
               [(yd.grad, want_dy), (vd.grad, want_dv), (ad.grad, want_dalpha)]]
assert max(grad_errors) < 1e-10, grad_errors
# The whole model: each strength has a gradient; the file, its header and the optimizer's groups.
idx, targets = torch.randint(0, 512, (2, 6)), torch.randint(0, 512, (2, 6))
model(idx, targets)[1].backward()
assert model.xsa_alpha.grad.abs().min() > 0, model.xsa_alpha.grad
back, header = checkpoint_round_trip(model, "xsa")
assert header[tg.FEATURES_SLOT] == tg.FEATURE_XSA == 32 and back.config.xsa and not back.config.ve_gates
assert torch.equal(back.xsa_alpha, model.xsa_alpha)
assert config.num_parameters() == sum(p.numel() for p in model.parameters())
every = tg.GPT(tg.make_config(12, 2, 128, 1024, 512, "test", arch="speedrun", smear=True, bigram=True,
                              ve_gates=True, xsa=True))
names = {id(p): tg.table_name(name) for name, p in every.named_parameters()}
order = list(dict.fromkeys(names[id(p)] for p in tg.params_in_file_order(every)))
assert order == ["wte", "qkvw", "attprojw", "fcw", "fcprojw", "headw", "ve", "bigram", "attngate", "skipw", "lambdas",
                 "value_scales", "smearw", "smear_lambda", "bigram_gates", "vegate", "xsa_alpha"], order
args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--input_bin", "x", "--device", "cpu"])
tg.settle_arch(args, tg.resolve_config(args))
groups = tg.optimizer_groups(every, args)
scalar_group, = [group for _, group in groups if any(p is every.xsa_alpha for p in group["params"])]
assert any(p is every.skip_weights for p in scalar_group["params"]), "the strengths go with the scalars"
print(f"XSA within {error:.1e} of the heads by hand (v = 0: y kept); dy, dv, dalpha within "
      f"{max(grad_errors):.1e} of autograd's; layers {layers}; header slot {tg.FEATURES_SLOT} "
      f"{int(header[tg.FEATURES_SLOT])}; with every record #89 feature, the file order {' '.join(order)}")
EOF
check "--attn_lambdas: the loss and gradients against a copy scaled by hand, the BF16 product's rounding; init, file order, header, groups" <<'EOF'
import os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
config = tg.make_config(11, 2, 128, 1024, 512, "test", arch="speedrun", record89_plan=True, attn_lambdas=True)
model = tg.GPT(config)
tg.init_weights(model, 42)
assert torch.equal(model.attn_lambdas, torch.tensor([[0.5, 1.0]] * 11)), "(0.5, 1) in every layer at init"
tg.add_debug_noise(model, 0.02, 42)  # the head is zero at init: no gradient would pass it
with torch.no_grad():
    model.attn_lambdas.copy_(torch.rand(11, 2) + 0.5)
# A copy without the lambdas whose attention weights are s W by hand gives the same loss, and its weight
# gradients dW' give W's (s dW') and the lambdas' (sum dW' W).
plain = tg.GPT(tg.make_config(11, 2, 128, 1024, 512, "test", arch="speedrun", record89_plan=True))
scaled = {n: p for n, p in model.named_parameters() if n != "attn_lambdas"}
plain.load_state_dict(scaled, strict=True)
attention = [layer for layer, spec in enumerate(config.plan) if spec.attention]
with torch.no_grad():
    for layer in attention:
        s = model.attn_lambdas[layer]
        plain.transformer.h[layer].attn.c_attn.weight.mul_(s[0])
        plain.transformer.h[layer].attn.c_proj.weight.mul_(s[1])
idx, targets = torch.randint(0, 512, (2, 16)), torch.randint(0, 512, (2, 16))
loss = model(idx, targets)[1]
loss.backward()
loss_plain = plain(idx, targets)[1]
loss_plain.backward()
assert (loss - loss_plain).abs().item() < 1e-5, (loss.item(), loss_plain.item())
errors = []
for layer in attention:
    s = model.attn_lambdas[layer].detach()
    for k, name in enumerate(("c_attn", "c_proj")):
        w = getattr(model.transformer.h[layer].attn, name).weight
        dw_scaled = getattr(plain.transformer.h[layer].attn, name).weight.grad
        errors.append((w.grad - s[k] * dw_scaled).abs().max().item())
        errors.append(abs(model.attn_lambdas.grad[layer, k].item() - (dw_scaled * w.detach()).sum().item()))
assert max(errors) < 1e-5, max(errors)
assert model.attn_lambdas.grad[6].abs().max() == 0, "layer 6 has no attention: its pair is unused"
assert model.attn_lambdas.grad[attention].abs().min() > 0, model.attn_lambdas.grad
# bfloat16: a float32 0-dim tensor times a bfloat16 matrix, s cast to bfloat16 first, s W rounded once
w, s = torch.randn(6, 4), torch.tensor(0.7)
layer = torch.nn.Linear(4, 6, bias=False)
with torch.no_grad():
    layer.weight.copy_(w)
x = torch.randn(3, 4).bfloat16()
want = torch.nn.functional.linear(x, (s.bfloat16().float() * w.bfloat16().float()).bfloat16())
assert torch.equal(tg.scaled_linear(layer, x, s), want)
assert torch.equal(tg.scaled_linear(layer, x.float(), s), torch.nn.functional.linear(x.float(), s * w))
# the file, its header and the optimizer's groups
back, header = checkpoint_round_trip(model, "attn_lambdas")
assert header[tg.FEATURES_SLOT] == tg.FEATURE_RECORD89_PLAN | tg.FEATURE_ATTN_LAMBDAS == 64 + 256, header[9]
assert back.config == config and torch.equal(back.attn_lambdas, model.attn_lambdas)
assert config.num_parameters() == sum(p.numel() for p in model.parameters())
names = {id(p): tg.table_name(name) for name, p in model.named_parameters()}
order = list(dict.fromkeys(names[id(p)] for p in tg.params_in_file_order(model)))
assert order[-1] == "attn_lambdas" and order[-2] == "head_gates", order
args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--input_bin", "x", "--device", "cpu"])
tg.settle_arch(args, tg.resolve_config(args))
groups = tg.optimizer_groups(model, args)
scalar_group, = [group for _, group in groups if any(p is model.attn_lambdas for p in group["params"])]
assert any(p is model.x0_gates for p in scalar_group["params"]), "the lambdas go with the scalars"
print(f"the loss and gradients within {max(errors):.1e} of a copy with s W by hand; bf16(bf16(s) W) in "
      f"bfloat16; header slot {tg.FEATURES_SLOT} {int(header[tg.FEATURES_SLOT])}; file order ... {' '.join(order[-3:])}")
EOF
check "--record89_plan: the plan's lists as llmc's; the value mix without a; the gated skip, an x0 term and an attention source by hand, their gates' and a head gate's gradients; file order, header, groups" <<'EOF'
import math, os, re, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
header_text = open("llmc/gpt2.h").read()
def cpp(name):  # a list of llmc/gpt2.h's record #89 plan, -1 as None
    value = re.search(name + r"\[\] = +(.+?);", header_text).group(1)
    if value.startswith('"'):
        return value.strip('"')
    return [None if v == -1 else v for v in map(int, value.strip("{}").split(","))]
for name in ("Attention", "Windows", "ValueEmbeddings", "GatedSkips", "AttentionSources", "Xsa", "HeadGates"):
    python = getattr(tg, "RECORD89_" + re.sub(r"(?<=.)([A-Z])", r"_\1", name).upper())
    assert cpp("kRecord89" + name) == python, (name, cpp("kRecord89" + name), python)
config = tg.make_config(11, 2, 128, 1024, 512, "test", arch="speedrun", record89_plan=True)
plan = config.plan
assert [l for l, s in enumerate(plan) if not s.attention] == [6] and plan[6].gated_skip_source == 3
assert [s.attention_source for s in plan] == [None] * 9 + [7, 7] and config.value_embeddings == 5
assert all(s.skip_source is None for s in plan) and not config.x0_lambdas and not config.attention_gate
model = tg.GPT(config)
tg.init_weights(model, 42, 89)
t = model.transformer
assert model.skip_weights is None and all(b.lambdas is None for b in t.h)
assert all(b.attn is None or b.attn.gate is None for b in t.h), "no attention gates in the plan"
assert torch.equal(model.x0_gates, torch.zeros(10)) and torch.equal(model.skip_gate, torch.tensor([-1.5, 0.5]))
assert [l for l, s in enumerate(plan) if s.head_gate] == [3, 10]
assert torch.equal(model.head_gates, torch.full((2, 2), 0.25))
# The value mix without a (the reference's v + gated ve): b alone a layer; v as it is without a value embedding.
assert all(b.attn is None or b.attn.value_scales.shape == (1,) for b in t.h)
assert plan[0].value_embedding is None and plan[1].value_embedding is not None
v, e = torch.randn(2, 8, 2, 64), torch.randn(2, 8, 128)
with torch.no_grad():
    assert torch.equal(t.h[0].attn.mix_values(v, None), v)
    assert torch.equal(t.h[1].attn.mix_values(v, e), v + t.h[1].attn.value_scales[0] * e.view_as(v))
order = tg.params_in_file_order(model)
names = {id(p): tg.table_name(name) for name, p in model.named_parameters()}
tables = list(dict.fromkeys(names[id(p)] for p in order))
assert tables == ["wte", "qkvw", "attprojw", "fcw", "fcprojw", "headw", "ve", "value_scales", "x0_gates",
                  "skip_gate", "head_gates"], tables
n = sum(p.numel() for p in model.parameters())
assert len(order) == len(list(model.parameters())) and sum(p.numel() for p in order) == n == config.num_parameters()
# Record #89's init: every gate's gradient nonzero through the drawn head and projections.
x, y = tg.RandomTokens(2, 64, 512, 3).next_batch()
model(x, y)[1].backward()
assert min(q.grad.abs().min() for q in (model.x0_gates, model.skip_gate, model.head_gates)) > 0, \
    (model.x0_gates.grad, model.skip_gate.grad, model.head_gates.grad)
init_grads = (model.x0_gates.grad.clone(), model.skip_gate.grad.clone())
# By hand, with the gates moved off their start: layer 6's input is layer 5's output plus
# sigmoid(skip_lambda) g layer 3's; layer 7's stream after its attention x + (attn + g_6 x0) (its x0
# gate's slab 6); layers 9 and 10 norm layer 7's output for their attention.
with torch.no_grad():
    model.x0_gates.uniform_(-0.5, 0.5)
    model.skip_gate.copy_(torch.tensor([0.3, 0.8]))
    model.head_gates.uniform_(0.2, 0.6)
model.zero_grad()
seen = {}
def keep(name, take_input=False):
    def hook(module, inputs, output):
        tensor = inputs[0] if take_input else output
        tensor.retain_grad()
        seen[name] = tensor
    return hook
t.ln_e.register_forward_hook(keep("x0"))
for layer in (3, 5, 7):
    t.h[layer].register_forward_hook(keep(f"out{layer}"))
t.h[6].ln_2.register_forward_hook(keep("in6", True))  # layer 6's input: it has no attention
t.h[7].ln_1.register_forward_hook(keep("ln1_7_in", True))
t.h[7].attn.register_forward_hook(keep("attn7"))
t.h[7].ln_2.register_forward_hook(keep("mid7", True))
for layer in (8, 9, 10):
    t.h[layer].ln_1.register_forward_hook(keep(f"ln1_{layer}_in", True))
t.h[10].attn.c_proj.register_forward_hook(keep("gated10", True))  # layer 10's heads after their gates
model(x, y)[1].backward()
sig, g = torch.sigmoid(model.skip_gate[0]).item(), model.skip_gate[1].item()
errors = [(seen["in6"] - (seen["out5"] + sig * g * seen["out3"])).abs().max().item(),
          (seen["mid7"] - (seen["ln1_7_in"] + (seen["attn7"] + model.x0_gates[6] * seen["x0"]))).abs().max().item()]
assert max(errors) < 1e-5, errors
assert all(torch.equal(seen[f"ln1_{layer}_in"], seen["out7"]) for layer in (8, 9, 10)), "the attention's source"
# The gradients the CUDA trainer computes: S = sum dout . out3, d skip_lambda = g sig (1 - sig) S, dg = sig S;
# an x0 gate's, sum d(stream after the attention) . x0.
S = (seen["in6"].grad * seen["out3"]).sum().item()
want = [g * sig * (1 - sig) * S, sig * S, (seen["mid7"].grad * seen["x0"]).sum().item()]
# A head gate's, the sum over its head's columns of d(gated output) . the output before the gate.
heads = seen["gated10"].view(2, 64, 2, 64)
gate10 = model.head_gates[1, 1].item()
want.append((seen["gated10"].grad.view(2, 64, 2, 64)[:, :, 1] * heads[:, :, 1] / gate10).sum().item())
got = [model.skip_gate.grad[0].item(), model.skip_gate.grad[1].item(), model.x0_gates.grad[6].item(),
       model.head_gates.grad[1, 1].item()]
grad_errors = [abs(a - b) / abs(b) for a, b in zip(got, want)]
assert max(grad_errors) < 1e-4, (got, want)
# The file, its header, the optimizer's groups: the gates with the scalars.
back, header = checkpoint_round_trip(model, "record89_plan")
assert header[tg.FEATURES_SLOT] == tg.FEATURE_RECORD89_PLAN == 64 and header[4] == 11, "bit 64, 11 layers"
assert back.config == config and back.config.record89_plan
assert torch.equal(back.x0_gates, model.x0_gates) and torch.equal(back.skip_gate, model.skip_gate)
args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--record89_plan", "1", "--input_bin", "x",
                      "--device", "cpu"])
resolved = tg.resolve_config(args)
assert resolved.record89_plan and resolved.num_layers == 11 and resolved.channels == 128, resolved
tg.settle_arch(args, resolved)
groups = tg.optimizer_groups(model, args)
gates = (model.x0_gates, model.skip_gate, model.head_gates)
owners = [group for _, group in groups for p in group["params"] if any(p is q for q in gates)]
value_scales = t.h[0].attn.value_scales
assert len(owners) == 3 and owners[0] is owners[1] is owners[2] and any(p is value_scales for p in owners[0]["params"])
assert sum(len(group["params"]) for _, group in groups) == len(order), "every tensor in one group"
print(f"the lists as llmc's; the gated skip and layer 7's x0 term within {max(errors):.1e} by hand, layers 8-10 "
      f"attend over layer 7's output; d skip_lambda, dg, d g_x0 and a head gate's within {max(grad_errors):.1e} of "
      f"the formulas (at record #89's init: skip_gate's {init_grads[1].tolist()}, x0_gates' nonzero); {n:,} "
      f"parameters; header "
      f"slot {tg.FEATURES_SLOT} {int(header[tg.FEATURES_SLOT])}; the file order {' '.join(tables)}")
EOF
check "--paired_heads: the rotary as the reference's paired tables; the attention by positions by hand" <<'EOF'
import os, re, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
torch.manual_seed(3)
# The rotary: the reference's paired tables (each token's [NH/2, 2 hs] view, its first hs dims at 2t, the
# rest at 2t + 1; cos and sin in bfloat16), applied as its Yarn.rotary does.
B, T, NH, hs = 2, 16, 6, 128
x = torch.randn(B, T, NH, hs)
freq = tg.rotary_frequencies(hs)
angular = torch.cat([((1 / 1024) ** torch.linspace(0, 1, steps=hs // 4)).repeat_interleave(2), torch.zeros(hs // 2)])
t = torch.arange(2 * B * T, dtype=torch.float32)
cos = torch.cat((torch.outer(2 * t, angular).cos(), torch.outer(2 * t + 1, angular).cos()), -1).bfloat16()
sin = torch.cat((torch.outer(2 * t, angular).sin(), torch.outer(2 * t + 1, angular).sin()), -1).bfloat16()
sin[..., 1::2] *= -1
view = x.reshape(1, B * T, NH // 2, 2 * hs)
flipped = view.view(*view.shape[:-1], hs, 2).flip(-1).view(view.shape)
want = (cos[None, :B * T, None] * view + sin[None, :B * T, None] * flipped).view(B, T, NH, hs)
assert torch.equal(tg.rotate(x, freq, pairs=True, paired_heads=True), want), "the paired rotary"
# The plan: layers 0, 2, 5 and 9.
config = tg.make_config(11, 4, 256, 1024, 512, "test", arch="speedrun", rotary_pairs=True, record89_plan=True,
                        paired_heads=True)
assert [layer for layer, spec in enumerate(config.plan) if spec.paired] == [0, 2, 5, 9]
header = open("llmc/gpt2.h").read()
assert re.search(r'kRecord89Paired\[\] = +"(.+?)";', header).group(1) == tg.RECORD89_PAIRED, "llmc/gpt2.h's list"
# The MFU count: a paired layer's queries are its 2T positions of C/2 (causal: T keys on average).
assert tg.GPT(config).attention_keys(256) == 6 * 128 + 4 * 256
# One paired layer's attention against positions by hand: position 2t + j holds heads 2j, 2j + 1 of token t
# (the first or the last NH/2 of its qkv), documents doubled, the window 128 positions back.
model = tg.GPT(config)
tg.init_weights(model, 42)
tg.add_debug_noise(model, 0.02, 42)
model.documents, model.window_tokens, model.window_blocks = True, True, 2
T = 256
idx = torch.randint(0, 512, (1, T))
idx[0, [0, 70, 201]] = tg.DOCUMENT_START
layer = 2
attn = model.transformer.h[layer].attn
outputs = []  # the heads' outputs, c_proj's input
attn.c_proj.register_forward_hook(lambda module, inputs, output: outputs.append(inputs[0]))
xin = torch.randn(1, T, 256)
mask = model.attention_masks(idx)[layer]
window = model.layer_window(layer) * tg.ATTENTION_BLOCK
with torch.no_grad():
    attn(xin, mask)
    got = outputs[0].view(T, 4, 64)
    q, k, v = attn.c_attn(xin).split(256, dim=2)
    q, k = (tg.rotate(tg.rms_norm(u.view(1, T, 4, 64)), attn.freq, True, True)[0] for u in (q, k))
    v = attn.mix_values(v.view(1, T, 4, 64), None)[0]
docs = (idx[0] == tg.DOCUMENT_START).cumsum(0)
error = 0.0
for p in range(2 * T):
    token, j = divmod(p, 2)
    keys = [r for r in range(p + 1) if docs[r // 2] == docs[token] and p - r <= window]
    for h in range(2):
        head = 2 * j + h
        kk = torch.stack([k[r // 2, 2 * (r % 2) + h] for r in keys])
        vv = torch.stack([v[r // 2, 2 * (r % 2) + h] for r in keys])
        y = torch.softmax(kk @ q[token, head] * attn.scale, 0) @ vv
        error = max(error, (y - got[token, head]).abs().max().item())
assert error < 1e-5, error
back, header = checkpoint_round_trip(model, "paired")
assert int(header[tg.FEATURES_SLOT]) == tg.FEATURE_PAIRED_HEADS | tg.FEATURE_RECORD89_PLAN | tg.FEATURE_ROTARY_PAIRS
assert back.config == config
print(f"the rotary the reference's paired tables' bits; layer {layer}'s attention (window {window} positions) "
      f"within {error:.1e} of positions by hand; header slot {tg.FEATURES_SLOT} {int(header[tg.FEATURES_SLOT])}")
EOF
expect_error "paired heads pair the heads of its plan's layers" --recipe speedrun --model tiny --paired_heads 1 \
  --rotary_pairs 1 --input_bin x
expect_error "paired heads pair the heads of its plan's layers" --recipe speedrun --model tiny --paired_heads 1 \
  --record89_plan 1 --input_bin x
expect_error "num_heads 3 is odd" --recipe speedrun --model tiny --paired_heads 1 --record89_plan 1 \
  --rotary_pairs 1 --num_heads 3 --channels 192 --input_bin x
expect_error "give --window_tokens 1" --recipe speedrun --model tiny --paired_heads 1 --record89_plan 1 \
  --rotary_pairs 1 --window_blocks 2 --batch_size 2 --seq_len 256 --write_debug_state "$WORK/paired_state"
echo "--- record #89's MUDD gate generators (--mudd_gates 1)"
check "the generators' tensors at init, their rows' columns, the checkpoint's bit 512 and its round trip" <<'EOF'
import os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
config = tg.make_config(11, 2, 128, 256, 512, "test", arch="speedrun", bigram=True, xsa=True, record89_plan=True,
                        mudd_gates=True)
model = tg.GPT(config)
tg.init_weights(model, 42)
b2 = model.mudd_gate_b2.detach().clone()
assert 0 < model.mudd_gate_w1.abs().max() <= 128 ** -0.5 and model.mudd_gate_w2.abs().sum() == 0
assert b2[0, 12] == b2[1, 17] == 2.5 and b2[0, 19] == b2[1, 27] == 0.5 and b2[1, 28] == 5.0 and b2[1, 34] == 10.0
assert b2[0, 18] == b2[1, 35] == b2[0, 26] == 0 and abs(model.mudd_gate_scale.item() - 0.1) < 1e-8
assert tg.MUDD_GATE_COLUMNS_OF[("bigram", 9)] == (1, 27) and tg.MUDD_GATE_COLUMNS_OF[("x0", 3)] == (0, 24)
assert ("x0", 10) not in tg.MUDD_GATE_COLUMNS_OF
assert config.num_parameters() == sum(p.numel() for p in model.parameters())
tg.add_debug_noise(model, 0.02, 42)
idx = torch.randint(0, 512, (1, 64))
loss = model(idx, idx)[1]
loss.backward()
assert model.mudd_gate_b2.grad[1, 28] != 0 and model.mudd_gate_scale.grad.item() != 0 and model.head_gates.grad is None
back, header = checkpoint_round_trip(model, "mudd")
assert int(header[tg.FEATURES_SLOT]) & tg.FEATURE_MUDD_GATES == 512
assert back.config == config and torch.equal(back.mudd_gate_b2, model.mudd_gate_b2)
print(f"loss {loss.item():.4f}; header slot {tg.FEATURES_SLOT} {int(header[tg.FEATURES_SLOT])}")
EOF
expect_error "the MUDD gate generators make record #89's plan's gates" --recipe speedrun --model tiny --mudd_gates 1 \
  --input_bin x
echo "--- record #89's MUDD dense connections (--mudd_connections 1)"
check "the connections' tensors at init; layer 10's stream, value, adds and the final mix by hand; bit 1024" <<'EOF'
import os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
config = tg.make_config(11, 2, 128, 256, 512, "test", arch="speedrun", bigram=True, ve_gates=True, resid_lambdas=True,
                        record89_plan=True, mudd_gates=True, mudd_connections=True)
model = tg.GPT(config)
tg.init_weights(model, 42, 89)
t, b2 = model.transformer, model.mudd_b2.detach()
assert config.num_parameters() == sum(p.numel() for p in model.parameters())
assert 0 < model.mudd_w1.abs().max() <= 128 ** -0.5 and model.mudd_w2.abs().sum() == 0
# The reference's starts over its 0.1: the ve gates 2, r sqrt(1.1), p 1, the bigram gate 0.05, out7's -0.5 after.
assert torch.allclose(b2 * 0.1, torch.tensor([[0, 0, 0, 0, 0, 0, 2, 2, 1.1 ** 0.5, 1, 0, 0.05, 1.1 ** 0.5, 1],
                                              [0, -0.5] + [0] * 12]))
assert tg.params_in_file_order(model)[-3:] == [model.mudd_w1, model.mudd_w2, model.mudd_b2]
with torch.no_grad():  # the coefficients off their start, different for each token
    model.mudd_w2.normal_(0.0, 0.5)
    model.mudd_b2.add_(torch.randn_like(model.mudd_b2))
    model.bigram.weight.normal_(0.0, 0.1)
seen = {}
def keep(name, take_input=False):
    def hook(module, inputs, output):
        seen[name] = inputs[0] if take_input else output
    return hook
t.h[0].ln_1.register_forward_hook(keep("in0", True))
for layer in (3, 7, 9):
    t.h[layer].register_forward_hook(keep(f"out{layer}"))
t.h[10].register_forward_hook(keep("out10"))
t.h[10].ln_2.register_forward_hook(keep("mid10", True))
t.h[10].attn.register_forward_hook(keep("attn10"))
t.h[10].mlp.register_forward_hook(keep("mlp10"))
t.ln_f.register_forward_hook(keep("final", True))
attn10, mixes = t.h[10].attn, []
plain_mix = attn10.mix_values
def recorded_mix(v, ve, *rest):
    out = plain_mix(v, ve, *rest)
    mixes.append((v, ve, out))
    return out
attn10.mix_values = recorded_mix
original_block = t.h[10].forward
def recorded_block(x, *args, **kwargs):
    seen["stream10"] = x
    return original_block(x, *args, **kwargs)
t.h[10].forward = recorded_block
idx = torch.randint(0, 512, (2, 64))
loss = model(idx, idx)[1]
m = model.mudd_coefficients(seen["out9"], 0)
hidden = torch.nn.functional.gelu(seen["out9"] @ model.mudd_w1[0].T)
by_hand = (hidden @ model.mudd_w2[0].T + model.mudd_b2[0]) * 0.1
assert m[0].shape == (2, 64, 1) and (torch.cat(m, dim=-1) - by_hand).abs().max() < 1e-6
assert float(by_hand.std(dim=(0, 1)).min()) > 0.01, "each coefficient varies over the tokens"
in0, out3, out7, out9 = seen["in0"], seen["out3"], seen["out7"], seen["out9"]
bigram = model.bigram(tg.bigram_rows(idx, config.bigram_rows)[0]).view(2, 64, -1) * \
    model.bigram_signs[tg.bigram_rows(idx, config.bigram_rows)[1]].view(2, 64, -1)
errors = {"stream": (seen["stream10"] - ((1 + m[5]) * out9 + m[3] * in0 + m[4] * out7)).abs().max()}
v, ve, mixed = mixes[0]
gate = torch.cat([m[6].expand(2, 64, 1), m[7].expand(2, 64, 1)], dim=-1)[..., None]
extra = (m[0] * in0 + m[1] * out7 + m[2] * out9).view_as(v)
errors["value"] = (mixed - (v + (gate * ve.view_as(v) + extra))).abs().max()
errors["attention add"] = (seen["mid10"] - (m[8] * seen["stream10"] + (m[9] * seen["attn10"] + m[10] * in0
                                                                       + m[11] * bigram))).abs().max()
errors["MLP add"] = (seen["out10"] - (m[12] * seen["mid10"] + m[13] * seen["mlp10"])).abs().max()
f = model.mudd_coefficients(seen["out10"], 1)
ve0 = t.ve[config.plan[1].value_embedding](idx)
want = seen["out10"] + f[0] * in0 + f[1] * out7 + f[2] * out9 + f[3] * ve0 + f[4] * out3
errors["final mix"] = (seen["final"] - want).abs().max()
assert max(errors.values()) < 1e-5, errors
loss.backward()
assert all(q.grad is not None and q.grad.abs().sum() > 0 for q in (model.mudd_w1, model.mudd_w2, model.mudd_b2))
assert model.resid_lambdas.grad[10].abs().sum() == 0, "layer 10's own lambdas, unread"
back, header = checkpoint_round_trip(model, "mudd_connections")
assert int(header[tg.FEATURES_SLOT]) & tg.FEATURE_MUDD_CONNECTIONS == 1024
assert back.config == config and torch.equal(back.mudd_b2, model.mudd_b2)
print("layer 10 and the final mix within " + ", ".join(f"{k} {float(e):.1e}" for k, e in errors.items())
      + f"; {config.num_parameters():,} parameters; header slot {tg.FEATURES_SLOT} {int(header[tg.FEATURES_SLOT])}")
EOF
expect_error "the MUDD dense connections join record #89's plan's layers" --recipe speedrun --model tiny \
  --mudd_connections 1 --input_bin x
echo "--- record #89's composed attention (--composed_attention 1)"
check "the composition against a dense one by hand; layer 10's weights from the post generator; bit 2048" <<'PYEOF'
import os, sys, torch, train_gpt2 as tg
sys.path.insert(0, "dev/test")
from checkpoint_round_trip import checkpoint_round_trip
torch.manual_seed(5)
B, NH, T, hs, scale = 2, 3, 300, 8, 0.3
q, k, v, y = (torch.randn(B, NH, T, hs) for _ in range(4))
w_in, w_out = torch.randn(B, T, NH), torch.randn(B, T, NH)
documents = torch.zeros(B, T, dtype=torch.long)
documents[0, 40:] += 1
documents[0, 250:] += 1
documents[1, 1:] += 1
got = tg.composed_attention(y, q, k, v, w_in, w_out, documents, scale)
# By hand, densely in float64: the keys at most 111 back in the query's document, each head's softmax, w_in
# normed over the heads, A the mix of the heads' probabilities, each head's output plus w_out_h (A v_h).
position = torch.arange(T)
d = lambda t: t.double()
want = torch.empty(B, NH, T, hs, dtype=torch.float64)
for b in range(B):
    seen = (position[:, None] - position[None, :] >= 0) & (position[:, None] - position[None, :] < 112) & \
        (documents[b][:, None] == documents[b][None, :])
    probs = (d(q[b]) @ d(k[b]).transpose(1, 2) * scale).masked_fill(~seen, float("-inf")).softmax(-1)
    normed = d(w_in[b]) / (d(w_in[b]).square().mean(-1, keepdim=True) + 1e-6).sqrt()
    mixed = (normed.T[:, :, None] * probs).sum(0)
    want[b] = d(y[b]) + d(w_out[b]).T[:, :, None] * (mixed[None] @ d(v[b]))
error = (got.double() - want).abs().max().item()
assert error < 2e-5, error
assert tg.COMPOSED_WINDOW == 112 and (tg.COMPOSED_IN_COLUMN, tg.COMPOSED_OUT_COLUMN) == (29, 35)
# In the model: layer 10 alone composes, its weights the post generator's columns 29 and 35 on (the first NH),
# documents as the attention counts them.
config = tg.make_config(11, 2, 128, 256, 512, "test", arch="speedrun", bigram=True, xsa=True, record89_plan=True,
                        mudd_gates=True, composed_attention=True)
model = tg.GPT(config)
tg.init_weights(model, 42)
tg.add_debug_noise(model, 0.02, 42)
with torch.no_grad():
    model.mudd_gate_b2[1, 35:37] = 5.0  # w_out 0.5 (it starts at 0)
calls, plain = [], tg.composed_attention
def recorded(y, q, k, v, w_in, w_out, documents, scale):
    calls.append((w_in, w_out, documents))
    return plain(y, q, k, v, w_in, w_out, documents, scale)
tg.composed_attention = recorded
post_rows = []
plain_rows = model.mudd_gate_rows
model.mudd_gate_rows = lambda x, generator: post_rows.append(plain_rows(x, generator)) or post_rows[-1]
idx = torch.randint(0, 512, (2, 160))
loss = model(idx, idx)[1]
assert len(calls) == 1 and torch.equal(calls[0][0], post_rows[1][..., 29:31])
assert torch.equal(calls[0][1], post_rows[1][..., 35:37]) and calls[0][2].abs().sum() == 0
loss.backward()
assert model.mudd_gate_w2.grad[1, 29:31].abs().sum() > 0 and model.mudd_gate_w2.grad[1, 35:37].abs().sum() > 0
assert model.mudd_gate_w2.grad[1, 31:35].abs().sum() == 0, "the slots of heads the model does not have"
tg.composed_attention = plain
plain_config = tg.make_config(11, 2, 128, 256, 512, "test", arch="speedrun", bigram=True, xsa=True,
                              record89_plan=True, mudd_gates=True)
plain_model = tg.GPT(plain_config)
plain_model.load_state_dict(model.state_dict())
assert abs(plain_model(idx, idx)[1].item() - loss.item()) > 1e-6, "the composition changes the loss"
back, header = checkpoint_round_trip(model, "composed")
assert int(header[tg.FEATURES_SLOT]) & tg.FEATURE_COMPOSED_ATTENTION == 2048
assert back.config == config
print(f"the composition within {error:.1e} of the dense one; loss {loss.item():.4f}; header slot "
      f"{tg.FEATURES_SLOT} {int(header[tg.FEATURES_SLOT])}")
PYEOF
expect_error "the composed attention reads its weights from the MUDD gate generators" --recipe speedrun --model tiny \
  --record89_plan 1 --composed_attention 1 --input_bin x
echo "--- NorMuon and Q and K blocks in a debug state (version 5's settings: -mn 1 -mq 2)"
"$PYTHON" train_gpt2.py "${TINY[@]}" -b 2 -t 32 --optimizer muon --normuon 1 --muon_qk_heads 2 \
  --write_debug_state "$WORK/normuon_state" --debug_steps 2 --device cpu >/dev/null
check "the debug state names NorMuon and Muon's Q and K blocks in its settings" <<'EOF'
import glob, os, train_gpt2 as tg
path, = glob.glob(f"{os.environ['WORK']}/normuon_state/*_muon_debug_state.bin")
header = tg.read_debug_state(path, header_only=True)
text, prefix, _ = tg.read_debug_state_settings(path, header)
assert header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and text == "-mn 1 -mq 2" and prefix is None, (header[1], text)
print(f"version {header[1]}: '{text}'")
EOF
echo "--- the cautious decay and Muon's rates of tensors in a debug state (-cd 1 -mt fcw=2)"
for mt in "" fcw=2; do
  "$PYTHON" train_gpt2.py "${TINY[@]}" -b 2 -t 32 --optimizer muon --weight_decay 0.1 --cautious_decay 1 \
    --muon_tensor_lr "$mt" --write_debug_state "$WORK/cautious_state$mt" --debug_steps 3 --device cpu \
    > "$WORK/cautious_state$mt.log"
done
check "the debug state names the cautious decay and Muon's rates of tensors, and its steps take the rates" <<'EOF'
import glob, os, re, train_gpt2 as tg
texts, losses = [], []
for mt in ("", "fcw=2"):
    path, = glob.glob(f"{os.environ['WORK']}/cautious_state{mt}/*_muon_debug_state.bin")
    texts.append(tg.read_debug_state_settings(path, tg.read_debug_state(path, header_only=True))[0])
    losses.append(re.findall(r"debug step \d+/3 \| loss (\S+)", open(f"{os.environ['WORK']}/cautious_state{mt}.log").read()))
assert texts == ["-cd 1", "-mt fcw=2 -cd 1"], texts
assert losses[0][0] == losses[1][0] and losses[0][1:] != losses[1][1:], losses  # fcw's rate moves the steps after
print(f"'{texts[0]}', '{texts[1]}'; step losses {losses[0]} and {losses[1]}")
EOF

check "--fp8_head_scales: the FP8 head's x_s, w_s and grad_s, and the debug state's -fhs" <<'EOF'
import math, train_gpt2 as tg
args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--input_bin", "x"])
model = tg.GPT(tg.resolve_config(args), fp8_head=True)
C = model.config.channels
assert tg.fp8_head_scale_values(model.lm_head.setting, C) == (math.sqrt(C) / 448, 2.0 ** -9, 1.0 / 448)
assert tg.debug_state_settings(model) == "", tg.debug_state_settings(model)
model.lm_head.setting = tg.parse_fp8_head_scales("100,1.6,0.75")
assert tg.fp8_head_scale_values(model.lm_head.setting, C) == (100 / 448, 1.6 / 448, 0.75 / 448)
text = tg.debug_state_settings(model)
assert text == "-fhs 100.0,1.6,0.75", text
other = tg.GPT(tg.resolve_config(args), fp8_head=True)
tg.apply_debug_state_settings(other, text, None, "d.bin")
assert other.lm_head.setting == (100.0, 1.6, 0.75), other.lm_head.setting
print(f"record #28's scales by default (no setting), record #89's as '{text}' and read back")
EOF
expect_error "--fp8_head_scales 100,1.6: give three numbers apart by commas" --recipe speedrun --model tiny \
  --fp8_head 1 --fp8_head_scales 100,1.6 --input_bin "$WORK/train_*.bin" --device cpu
expect_error "--fp8_head_scales 100,1.6,0.75 sets the FP8 head's scales: give --fp8_head 1 with it" \
  --recipe speedrun --model tiny --fp8_head_scales 100,1.6,0.75 --input_bin "$WORK/train_*.bin" --device cpu
check "--key_offset: each key's stationary dims the previous key's over the batch as one sequence, long layers" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
B, T, NH, hs = 2, 5, 3, 16
k = torch.randn(B, T, NH, hs, dtype=torch.float64, requires_grad=True)
shifted = tg.shift_stationary_keys(k)
flat, out = k.detach().reshape(B * T, NH, hs), shifted.detach().reshape(B * T, NH, hs)
for n in range(B * T):
    for d in range(hs):
        stationary = hs // 4 <= d % (hs // 2)  # rotary_frequencies's zeros, on pairs (j, j + hs/2)
        source = n - 1 if stationary and n > 0 else n
        assert torch.equal(out[n, :, d], flat[source, :, d]), (n, d)
g = torch.randn_like(shifted)
shifted.backward(g)
g, dk = g.reshape(B * T, NH, hs), k.grad.reshape(B * T, NH, hs)
for n in range(B * T):
    for d in range(hs):
        if hs // 4 > d % (hs // 2):
            expected = g[n, :, d]
        else:
            expected = (g[n + 1, :, d] if n + 1 < B * T else 0 * g[n, :, d]) + (g[0, :, d] if n == 0 else 0)
        assert torch.equal(dk[n, :, d], expected), (n, d)
print(f"B={B} T={T} NH={NH} hs={hs}: the shift and its gradient as by hand (row 0 keeps its own, its "
      f"gradient that of rows 0 and 1; row {B * T - 1}'s stationary gradient 0)")
config = tg.make_config(*tg.SPEEDRUN_PRESETS["tiny"], source="tiny", arch="speedrun")
model = tg.GPT(config)
tg.set_key_offset(model, True)
layers = [l for l, b in enumerate(model.transformer.h) if b.attn is not None and b.attn.key_offset]
assert layers == [0, 4, 11] and tg.debug_state_settings(model) == "-ko 1", layers
print(f"speedrun tiny: key offset in layers {layers} (windows {tg.SPEEDRUN_WINDOWS}, layer 7 without attention)")
EOF
"$PYTHON" train_gpt2.py "${TINY[@]}" --recipe modern -b 2 -t 32 --key_offset 1 --write_debug_state "$WORK/ko_state" \
  --debug_steps 2 --device cpu >/dev/null
check "--key_offset in the debug state: -ko 1 in its settings, which --check_debug_state applies" <<'EOF'
import glob, os, train_gpt2 as tg
path, = glob.glob(f"{os.environ['WORK']}/ko_state/*_debug_state.bin")
header = tg.read_debug_state(path, header_only=True)
text, prefix, _ = tg.read_debug_state_settings(path, header)
assert text == "-ko 1", text
config = tg.make_config(*tg.MODERN_PRESETS["tiny"], source="tiny", arch="modern")
model = tg.GPT(config)
tg.apply_debug_state_settings(model, text, prefix, path)
assert model.key_offset and all(b.attn.key_offset for b in model.transformer.h)
print(f"'{text}': both layers of the modern tiny shift their keys")
EOF

check "--rotary_pairs: rotate turns adjacent pairs at flat positions by BF16 tables, as by hand; the key offset's dims move" <<'EOF'
import math, torch, train_gpt2 as tg
torch.manual_seed(0)
B, T, NH, hs = 2, 5, 3, 16
x = torch.randn(B, T, NH, hs, dtype=torch.float32)
freq = tg.rotary_frequencies(hs)
y = tg.rotate(x, freq, pairs=True)
for b in range(B):
    for t in range(T):
        for i in range(hs // 2):
            theta = torch.tensor(float(b * T + t), dtype=torch.float32) * freq[i]  # float32, as torch.outer
            # the reference's tables: each of cos and sin in float32, then rounded to bfloat16
            c, s = (torch.tensor(f(theta.item()), dtype=torch.float32).bfloat16().item() for f in (math.cos, math.sin))
            x0, x1 = x[b, t, :, 2 * i].double(), x[b, t, :, 2 * i + 1].double()
            assert torch.allclose(y[b, t, :, 2 * i].double(), c * x0 + s * x1, atol=1e-6), (b, t, i)
            assert torch.allclose(y[b, t, :, 2 * i + 1].double(), c * x1 - s * x0, atol=1e-6), (b, t, i)
assert torch.equal(y[..., hs // 2:], x[..., hs // 2:]), "dims hs/2 and up are not turned"
k = torch.randn(B, T, NH, hs, dtype=torch.float64)
shifted = tg.shift_stationary_keys(k, pairs=True).reshape(B * T, NH, hs)
flat = k.reshape(B * T, NH, hs)
assert torch.equal(shifted[1:, :, hs // 2:], flat[:-1, :, hs // 2:]) and torch.equal(shifted[0], flat[0])
assert torch.equal(shifted[:, :, :hs // 2], flat[:, :, :hs // 2])
config = tg.make_config(*tg.SPEEDRUN_PRESETS["tiny"], source="tiny", arch="speedrun", rotary_pairs=True)
model = tg.GPT(config)
assert all(b.attn.rotary_pairs for b in model.transformer.h if b.attn is not None)
print(f"B={B} T={T} NH={NH} hs={hs}: pairs (2i, 2i + 1) at positions b T + t, dims {hs // 2}.. unturned; the key "
      f"offset shifts dims {hs // 2}..{hs - 1}")
EOF
"$PYTHON" train_gpt2.py "${TINY[@]}" --recipe modern -b 2 -t 32 --rotary_pairs 1 --write_debug_state "$WORK/rp_state" \
  --debug_steps 2 --device cpu >/dev/null
check "--rotary_pairs in the model file: header slot 9's bit 4, read back into the config" <<'EOF'
import glob, os, numpy as np, train_gpt2 as tg
for path in glob.glob(f"{os.environ['WORK']}/rp_state/*.bin"):
    if path.endswith("_debug_state.bin"):
        continue
    header = np.fromfile(path, np.int32, tg.HEADER_INTS)
    config = tg.read_checkpoint(path).config
    assert header[tg.FEATURES_SLOT] == tg.FEATURE_ROTARY_PAIRS and config.rotary_pairs, (path, config)
    print(f"{os.path.basename(path)}: slot {tg.FEATURES_SLOT} holds {header[tg.FEATURES_SLOT]}; {config}")
EOF

"$PYTHON" train_gpt2.py "${TINY[@]}" --recipe modern -b 2 -t 32 --attention_scale 0.1 \
  --write_debug_state "$WORK/asc_state" --debug_steps 2 --device cpu >/dev/null
check "--attention_scale: every attention's softmax scale, -asc in the debug state's settings, applied back" <<'EOF'
import glob, os, train_gpt2 as tg
path, = glob.glob(f"{os.environ['WORK']}/asc_state/*_debug_state.bin")
header = tg.read_debug_state(path, header_only=True)
text, prefix, _ = tg.read_debug_state_settings(path, header)
assert text == "-asc 0.1", text
config = tg.make_config(*tg.MODERN_PRESETS["tiny"], source="tiny", arch="modern")
model = tg.GPT(config)
attentions = [b.attn for b in model.transformer.h if b.attn is not None]
assert all(a.scale == tg.ATTENTION_SCALE_MODERN for a in attentions)
tg.apply_debug_state_settings(model, text, prefix, path)
assert model.attention_scale == 0.1 and all(a.scale == 0.1 for a in attentions)
print(f"'{text}': the modern tiny's {len(attentions)} attentions at 0.1 (0.12 before)")
EOF

check "--yarn: YaRN's rescaling against its formula by hand, record #89's scales at its window changes" <<'EOF'
import math, numpy as np, torch, train_gpt2 as tg
freq = tg.rotary_frequencies(128)
got, scale = tg.yarn_rescale(freq, 0.1, 384, 896)
f32 = np.float32
for j in range(64):  # float32 step by step, true divisions, each Python scalar a float32
    f = f32(freq[j].item())
    r = f32(f32(384) * f) / f32(2 * math.pi)
    w = min(max(f32(r - f32(1)) / f32(31), f32(0)), f32(1))
    expected = f32(f * f32(f32(384 / 896) + f32(w * f32(1 - 384 / 896))))
    assert got[j].item() == expected, (j, got[j].item(), expected)
assert torch.equal(got[32:], freq[32:]) and scale == 0.1 * (0.2 * math.log(896 / 384) + 1)
plan = tg.StagePlan(tg.parse_stages("1/3 aw=1/3; 1/3 aw=3/7; 1/3 aw=5/11; +15 aw=6/13", 2048, -1, 0), 1270, 1, 1)
plan.set_final_window(20, "--final_window_blocks")
scales = [tg.yarn_at(plan, step, freq, 0.1)[1] for step in (422, 423, 847, 1270, 1285)]
assert scales == [0.1, 0.11694595720774409, 0.12751752379570258, 0.1317779884389435, 0.1317779884389435], scales
stepped = (freq, 0.1)
for step in range(1, 1286):
    stepped = tg.yarn_advance(plan, step, *stepped)
derived = tg.yarn_at(plan, 1285, freq, 0.1)
assert torch.equal(stepped[0], derived[0]) and stepped[1] == derived[1]
print(f"f[10] {freq[10].item():.9g} -> {got[10].item():.9g} at 384 -> 896 tokens; scales {scales} (the final "
      f"window 20 no change); stepped and derived the same")
EOF
"$PYTHON" train_gpt2.py --model tiny --recipe modern -b 2 -t 256 --max_seq_len 256 --documents 1 --yarn 1 \
  --attention_scale 0.1 --stages "1/2 aw=1; 1/2 aw=2" --total_batch_size -1 --write_debug_state "$WORK/yn_state" \
  --debug_steps 4 --device cpu >/dev/null
check "--yarn in the debug state: -yn 1 in its settings beside -asc, the model's base frequencies kept" <<'EOF'
import glob, os, torch, train_gpt2 as tg
path, = glob.glob(f"{os.environ['WORK']}/yn_state/*_debug_state.bin")
header = tg.read_debug_state(path, header_only=True)
text, prefix, _ = tg.read_debug_state_settings(path, header)
assert text == "-asc 0.1 -yn 1", text
config = tg.make_config(*tg.MODERN_PRESETS["tiny"], source="tiny", arch="modern")
model = tg.GPT(config)
tg.apply_debug_state_settings(model, text, prefix, path)
freq, scale = tg.yarn_base(model)
assert model.yarn and scale == 0.1 and torch.equal(freq, tg.rotary_frequencies(128))
print(f"'{text}': YaRN from the base frequencies and scale {scale}")
EOF

# two_processes_match STEPS ARGS...: train_gpt2.py on two processes (DDP, gloo) prints the steps'
# losses and norms of one process with the same total batch (its micro steps split between them),
# within 1e-4 relative, and rank 1 prints nothing.
two_processes_match() {
  local steps=$1
  shift
  "$PYTHON" train_gpt2.py "$@" | grep -E '^step' | cut -d'|' -f2,3 >"$WORK/one"
  # The variables torchrun would set, so the test does not depend on the launcher.
  local port=$((20000 + RANDOM % 20000)) rank
  for rank in 0 1; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 \
      "$PYTHON" train_gpt2.py "$@" >"$WORK/rank$rank" 2>&1 &
  done
  wait
  grep -E '^step' "$WORK/rank0" | cut -d'|' -f2,3 >"$WORK/two"
  [ ! -s "$WORK/rank1" ] || { echo "FAIL: rank 1 printed:"; cat "$WORK/rank1"; exit 1; }
  paste "$WORK/one" "$WORK/two"
  "$PYTHON" -c "import sys; a, b = ([[float(w) for w in l.split()[1::3]] for l in open(f)] for f in sys.argv[2:]); \
assert len(a) == int(sys.argv[1]) == len(b) and all(abs(x - y) <= 1e-4 * abs(x) for p, q in zip(a, b) \
for x, y in zip(p, q)), (a, b)" "$steps" "$WORK/one" "$WORK/two"
}

if "$PYTHON" -c 'import torch.distributed as d; assert d.is_available()' 2>/dev/null; then
  echo "--- two processes (DDP, gloo) match one process with gradient accumulation"
  two_processes_match 3 "${TINY[@]}" --input_bin "$WORK/train_*.bin" --shuffle 0 -b 2 -t 32 --total_batch_size 256 \
    --num_iterations 3 --device cpu
  # AdamW's kept gradients (--adam_every 2), averaged with each step's: the sum of the steps' averages,
  # as one process's sum; the norms of the steps without AdamW's update hold the kept ones. The head
  # tied to the embedding through step 3.
  echo "--- two processes match one with AdamW every 2 steps and an untie"
  two_processes_match 6 --recipe modern "${TINY[@]}" --input_bin "$WORK/train_*.bin" --shuffle 0 -b 2 -t 32 \
    --total_batch_size 256 --num_iterations 6 --device cpu --adam_every 2 --untie_step 3 --val_every 0
fi

echo "--- benchmark mode"
"$PYTHON" train_gpt2.py "${TINY[@]}" --bench -b 2 -t 32 --num_iterations 4 --device cpu | tee "$WORK/bench.out" \
  | grep -E "^(step|average|peak memory)"
grep -qE '^step    4/4 \| loss [0-9.]+ \| norm [0-9.]+ \| lr [0-9.e+-]+ \| [0-9.]+ ms \| MFU [0-9.]+% \| [0-9]+ tok/s$' \
  "$WORK/bench.out"
grep -qE '^peak memory: [0-9]+ MiB$' "$WORK/bench.out"

check "benchmark mode computes the reference's loss, with the padded columns in the softmax" <<'EOF'
import torch, train_gpt2 as tg
from torch.nn import functional as F
# vocab 400 pads to 512, so the benchmark's softmax has 112 columns the reference's drops (they
# move the loss by about 0.24, ten times the bound below). On a GPU the benchmark runs its full
# recipe (torch.compile, the chosen SDPA kernels, bf16 autocast).
flags = ["--model", "tiny", "--vocab_size", "400", "-b", "4", "-t", "64", "--seed", "11"]
losses = tg.main(flags + ["--benchmark", "1", "--num_iterations", "1"])
config = tg.resolve_config(tg.parse_args(flags))
model = tg.GPT(config)
tg.init_weights(model, 11)
x, y = tg.RandomTokens(4, 64, config.vocab_size, 11).next_batch()
with torch.no_grad():
    reference = model(x, y)[1].item()  # the reference mode: float32, padded columns sliced off
    full = model.lm_head(model.final_hidden(x)).double()
assert full[:, :, config.vocab_size:].abs().max().item() == 0.0, "padded logits must start at 0"
padded = F.cross_entropy(full.view(-1, config.padded_vocab_size), y.view(-1)).item()
# The padded columns add exp(0) = 1 each to every softmax sum, and nothing else.
real = full[:, :, :config.vocab_size]
sums = torch.logsumexp(real, -1)
expected = (sums + torch.log1p((config.padded_vocab_size - config.vocab_size) / sums.exp())).mean() \
    - real.gather(-1, y.unsqueeze(-1)).mean()
assert abs(expected.item() - padded) < 1e-9, (expected.item(), padded)
assert abs(reference - F.cross_entropy(real.view(-1, config.vocab_size), y.view(-1)).item()) < 1e-5
bench = losses[0][0]
bound = padded * 2.0 ** -8  # one BF16 rounding of the loss (relative 2^-8)
print(f"first-step loss: reference {reference:.6f} (float32, {config.vocab_size} columns); with the "
      f"{config.padded_vocab_size - config.vocab_size} padded columns {padded:.6f}; benchmark {bench:.6f} "
      f"(|difference| {abs(bench - padded):.2e}, bound {bound:.2e})")
assert abs(bench - padded) <= bound
EOF

check "FP8 scales: fp8_scale against a brute-force search" <<'EOF'
import numpy as np, torch, train_gpt2 as tg
# Random positive floats over the whole finite range, each format's boundaries 1.75 * 2^k and
# their neighbours, 0, Inf, NaN, the largest float and denormals (whose scales hit the cap).
rng = np.random.default_rng(0)
values = list(rng.integers(1, 0x7F800000, 20000, dtype=np.int64).astype(np.uint32).view(np.float32))
for emax in (tg.FP8_E4M3_EMAX, tg.FP8_E5M2_EMAX):
    for k in range(-160, 128 - emax):
        v = np.float32(1.75 * 2.0 ** (emax + k))
        values += [v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(0))]
f32 = np.finfo(np.float32)
values += [np.float32(0), np.float32(np.inf), np.float32(np.nan), f32.max, f32.tiny, np.float32(1e-45)]
amax = np.array(values, np.float32)

def brute_force(a, emax):
    """The largest e with a * 2^e <= 1.75 * 2^emax (exact in double), at most the cap."""
    if not (a > 0 and np.isfinite(a)):
        return 0
    e = 300
    while float(a) * 2.0 ** e > 1.75 * 2.0 ** emax:
        e -= 1
    return min(e, tg.FP8_SCALE_EXPONENT_CAP)

for name, emax in [("E4M3", tg.FP8_E4M3_EMAX), ("E5M2", tg.FP8_E5M2_EMAX)]:
    s = tg.fp8_scale(torch.from_numpy(amax), emax).numpy().astype(np.float64)
    expected = np.array([2.0 ** brute_force(a, emax) for a in amax])
    wrong = np.nonzero(s != expected)[0]
    assert len(wrong) == 0, [(amax[i], s[i], expected[i]) for i in wrong[:5]]
    print(f"{name}: {len(amax)} amax values, every scale the brute force's power of two")
EOF

check "FP8 linear layer: casts and products against float64 on the dequantised values" <<'EOF'
import torch, train_gpt2 as tg
if not hasattr(torch, "float8_e4m3fn"):
    print(f"skip: PyTorch {torch.__version__} has no float8 dtypes (2.1+)")
    raise SystemExit
torch.manual_seed(0)
e4m3, e5m2 = (torch.float8_e4m3fn, tg.FP8_E4M3_EMAX), (torch.float8_e5m2, tg.FP8_E5M2_EMAX)
for dtype, emax in (e4m3, e5m2):  # the scale is the largest: |q| reaches past half of fp8_max
    x = (torch.randn(1000) * 3e-3).to(torch.bfloat16)
    q, inv = tg.fp8_cast(x, dtype, emax)
    top = q.float().abs().max().item()
    assert 1.75 * 2.0 ** (emax - 1) < top <= 1.75 * 2.0 ** emax, (dtype, top)
    print(f"{dtype}: max |q| {top} of {1.75 * 2.0 ** emax}, 1/s = 2^{int(inv.log2().item())}")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)):
    print("skip the products: torch._scaled_mm needs a CUDA GPU of compute capability 8.9+")
    raise SystemExit
N, C, OC = 64, 128, 384
x = torch.randn(N, C, device="cuda").to(torch.bfloat16)
w = (0.02 * torch.randn(OC, C, device="cuda")).to(torch.bfloat16)
b = (0.1 * torch.randn(OC, device="cuda")).to(torch.bfloat16)
dy = (1e-3 * torch.randn(N, OC, device="cuda")).to(torch.bfloat16)

def dequantised(t, dtype, emax):
    q, inv = tg.fp8_cast(t, dtype, emax)
    return q.double() * inv.double()

xd, wd, dyd = dequantised(x, *e4m3), dequantised(w, *e4m3), dequantised(dy, *e5m2)
expected = [xd @ wd.T + b.double(), dyd @ wd, dyd.T @ xd, dy.double().sum(0)]

def run(fn):
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = fn(*leaves)
    y.backward(dy)
    return [y.detach()] + [t.grad for t in leaves]

eager = run(tg.Fp8LinearFunction.apply)
compiled = run(torch.compile(lambda *a: tg.Fp8LinearFunction.apply(*a), fullgraph=True))  # no graph break
for name, e, ours, theirs in zip(["y", "dx", "dw", "db"], expected, eager, compiled):
    error = ((ours.double() - e).abs().max() / e.abs().max()).item()
    compile_error = ((theirs.double() - ours.double()).abs().max() / e.abs().max()).item()
    print(f"{name}: {ours.dtype}, max error {error:.2e} of the largest value; compiled vs eager {compile_error:.2e}")
    assert ours.dtype == torch.bfloat16 and error <= 2.0 ** -8 and compile_error <= 2.0 ** -8, name
EOF

echo "--- error messages"
"$PYTHON" -c "import numpy as np; h = np.zeros(256, np.int32); h[:3] = [20240520, 1, 100]; \
open('$WORK/short.bin', 'wb').write(h.tobytes() + np.zeros(99, np.uint16).tobytes()); \
open('$WORK/big.bin', 'wb').write(h.tobytes() + np.full(100, 600, np.uint16).tobytes()); \
h[0] = 1; open('$WORK/magic.bin', 'wb').write(h.tobytes() + np.zeros(100, np.uint16).tobytes())"
head -c 5000 "$WORK/a/gpt2_l2h4c128t64v512.bin" >"$WORK/truncated.bin"
# One byte of the header (the head count, 4 -> 127), with the checksum and without one (llm.c's),
# and a file cut short without one.
"$PYTHON" -c "
d = bytearray(open('$WORK/a/gpt2_l2h4c128t64v512.bin', 'rb').read()); d[-7] ^= 4
open('$WORK/damaged.bin', 'wb').write(d); d[-7] ^= 4
d[20] ^= 0x7b; open('$WORK/header_byte.bin', 'wb').write(d)
d[254 * 4:256 * 4] = bytes(8); open('$WORK/header_byte_unchecked.bin', 'wb').write(d)
d[20] ^= 0x7b; open('$WORK/truncated_unchecked.bin', 'wb').write(d[:5000])"
expect_error "no files match" "${TINY[@]}" --input_bin "$WORK/missing_*.bin"
expect_error "should be 1224 bytes" "${TINY[@]}" --input_bin "$WORK/short.bin" -b 1 -t 8
expect_error "token id 600" "${TINY[@]}" --input_bin "$WORK/big.bin" -b 1 -t 8
expect_error "not a token shard" "${TINY[@]}" --input_bin "$WORK/magic.bin" -b 1 -t 8
expect_error "too few for one batch" "${TINY[@]}" --input_bin "$WORK/train_0.bin" -b 400 -t 64
expect_error "total_batch_size 100" "${TINY[@]}" --input_bin "$WORK/train_*.bin" -b 4 -t 32 --total_batch_size 100
expect_error "truncated.bin: checksum mismatch (CRC-32" --init_from "$WORK/truncated.bin" --bench
expect_error "truncated_unchecked.bin: checkpoint for .* (truncated)" --init_from "$WORK/truncated_unchecked.bin" --bench
expect_error "no such file" --init_from "$WORK/nothing.bin" --bench
expect_error "damaged.bin: checksum mismatch (CRC-32" --init_from "$WORK/damaged.bin" --bench
expect_error "header_byte.bin: checksum mismatch (CRC-32" --init_from "$WORK/header_byte.bin" --bench
expect_error "header_byte_unchecked.bin: channels 128 is not divisible by num_heads 127" \
  --init_from "$WORK/header_byte_unchecked.bin" --bench
expect_error "not a GPT-2 checkpoint" --init_from "$WORK/magic.bin" --bench
expect_error "max_seq_len 64" "${TINY[@]}" --bench -t 128
expect_error "drop --model" --init_from "$WORK/a/gpt2_l2h4c128t64v512.bin" --model tiny --bench
expect_error "not divisible" --model tiny --num_heads 3 --bench
expect_error "nothing to do" --model tiny
expect_error "mtp 1,0.5,0.25,0.1: more than 3 weights" "${TINY[@]}" --bench --mtp 1,0.5,0.25,0.1
expect_error "mtp 2: must be within" "${TINY[@]}" --bench --mtp 1,2
expect_error "mtp 'x': not a number" "${TINY[@]}" --bench --mtp 1,x
expect_error "prefix_weight 2.0: must be within" "${TINY[@]}" --bench --prefix_weight 2
echo "--- AdamW's tensors' own rows (--adam_rows, the CUDA trainer's -ar)"
check "--adam_rows: a group a distinct row beside its role's, the rate and decay multiplied, its betas" <<'EOF'
import torch, train_gpt2 as tg

def groups_of(extra):
    args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "--weight_decay", "0.005", "--input_bin", "x",
                          "--device", "cpu"] + extra)
    config = tg.resolve_config(args)
    tg.settle_arch(args, config)
    model = tg.GPT(config)
    names = {id(p): tg.table_name(n) for n, p in model.named_parameters()}
    rows = [(kind, sorted({names[id(p)] for p in g["params"]}), g.get("lr"), g.get("weight_decay"), g.get("betas"))
            for kind, g in tg.optimizer_groups(model, args)]
    return args, model, rows

args, _, plain = groups_of([])
adamw = [r for r in plain if r[0] == "adamw"]
assert [r[1] for r in adamw] == [["ve", "wte"], ["headw"], ["lambdas", "skipw", "value_scales"]], adamw
assert all(r[4] == (args.beta1, args.beta2) and r[3] == (0.0 if "lambdas" in r[1] else 0.005) for r in adamw), adamw
print("no rows: the role groups (embeddings, head, scalars), each with --beta1, --beta2 and --weight_decay, the "
      "scalars without (as the CUDA trainer's speedrun)")
args, model, rows = groups_of(["--adam_rows", "ve:lr=75,b1=0.75,b2=0.95,wd=5;headw:b1=0.5;lambdas:lr=5;skipw:lr=5"])
by_name = {name: r for r in rows for name in r[1]}
e, h, s = args.embedding_lr, args.head_lr, args.scalar_lr
assert by_name["wte"] == ("adamw", ["wte"], e, 0.005, (0.8, 0.95)), by_name["wte"]
assert by_name["ve"] == ("adamw", ["ve"], e * 75, 0.005 * 5, (0.75, 0.95)), by_name["ve"]
assert by_name["headw"] == ("adamw", ["headw"], h, 0.005, (0.5, 0.95)), by_name["headw"]
assert by_name["lambdas"] == ("adamw", ["lambdas", "skipw"], s * 5, 0.0, (0.8, 0.95)), by_name["lambdas"]
assert by_name["value_scales"] == ("adamw", ["value_scales"], s, 0.0, (0.8, 0.95)), by_name["value_scales"]
assert [r[1] for r in rows if r[0] == "muon"] == [r[1] for r in plain if r[0] == "muon"]
print("ve x75 (0.75, 0.95) decay x5, headw (0.5, 0.95), lambdas and skipw one group x5, the rest their roles', "
      "Muon's as without")
optimizers, _ = tg.make_optimizers(model, args, "cpu")
tg.set_learning_rates(optimizers, 0, args, 1.0)
for group in optimizers[0].param_groups:
    expected = args.adam_eps / (1 - group["betas"][1]) ** 0.5
    assert group["eps"] == expected and group["betas"] in ((0.8, 0.95), (0.75, 0.95), (0.5, 0.95)), group["betas"]
print("torch's AdamW takes each group's betas, its eps before the correction from the group's beta2")
EOF
"$PYTHON" train_gpt2.py "${TINY[@]}" -b 2 -t 32 --adam_rows "wte:lr=2,b1=0.5;ln1w:b2=0.99" \
  --write_debug_state "$WORK/adam_rows_state" --debug_steps 2 --device cpu >/dev/null
check "the debug state names AdamW's rows in its settings" <<'EOF'
import glob, os, train_gpt2 as tg
path, = glob.glob(f"{os.environ['WORK']}/adam_rows_state/*_debug_state.bin")
header = tg.read_debug_state(path, header_only=True)
text, prefix, _ = tg.read_debug_state_settings(path, header)
assert header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and text == "-ar wte:lr=2,b1=0.5;ln1w:b2=0.99", (header[1], text)
print(f"version {header[1]}: '{text}'")
EOF
expect_error "adam_rows emb:lr=2: no parameter tensor 'emb': name one of wte, wpe, " "${TINY[@]}" --bench \
  --adam_rows "emb:lr=2"
expect_error "adam_rows wte:b1 1.5: must be within .0, 1." "${TINY[@]}" --bench --adam_rows "wte:b1=1.5"
expect_error "adam_rows wte:beta1=0.5: 'beta1=0.5' is not key=value of lr, rate, b1, b2, wd, decay or bf16" "${TINY[@]}" \
  --bench --adam_rows "wte:beta1=0.5"
expect_error "adam_rows wte:bf16 'moments': give none .FP32., weight .the weight rounded to BF16. or all" "${TINY[@]}" \
  --bench --adam_rows "wte:bf16=moments"
expect_error "adam_rows qkvw:lr=2: qkvw is Muon's .--optimizer muon takes the blocks' matrices." "${TINY[@]}" --bench \
  --optimizer muon --adam_rows "qkvw:lr=2"
expect_error "adam_rows wpe:lr=2: the speedrun model has no wpe: drop its row" --recipe speedrun --model tiny --bench \
  --documents 0 --window_blocks 0 -b 1 -t 64 --adam_rows "wpe:lr=2"
expect_error "every term of the training loss has weight 0" "${TINY[@]}" --bench --mtp 0
expect_error "logit_cap 50: the cap within" --recipe speedrun --model tiny --bench --documents 0 --window_blocks 0 \
  -b 1 -t 64 --logit_cap 50
expect_error "logit_cap 23,5: the gpt2 architecture's logits are uncapped" "${TINY[@]}" --bench --logit_cap 23,5
expect_error "logit_cap 15,5: a shift and a BF16 sigmoid are the sigmoid cap's" --recipe modern --model tiny --bench -b 1 -t 64 \
  --logit_cap 15,5
expect_error "tokenizer $WORK/nothing.bin: no such vocabulary file" "${TINY[@]}" --bench --prefix_weight 0.25 \
  --tokenizer "$WORK/nothing.bin"
expect_error "untie_step 3 ties the embedding to the head through step 3, and the gpt2 architecture's head is the embedding" \
  "${TINY[@]}" --untie_step 3 --write_debug_state "$WORK/untie_gpt2"
expect_error "untie_step -2: give the step through which" --recipe modern --model tiny --untie_step -2 \
  --write_debug_state "$WORK/untie_bad"
expect_error "untie_step 1: --benchmark times untied steps" --recipe modern --model tiny --bench -b 1 -t 64 \
  --untie_step 1
expect_error "adam_every 2: --benchmark times AdamW at every step" --recipe modern --model tiny --bench -b 1 -t 64 \
  --adam_every 2
expect_error "adam_every 0: give AdamW's interval in steps, 1 to 1000" "${TINY[@]}" --adam_every 0 \
  --write_debug_state "$WORK/adam_every_bad"
expect_error "the smear (record #89's) is the speedrun's" "${TINY[@]}" --smear 1 --write_debug_state "$WORK/smear_gpt2"
expect_error "the residual lambdas (record #89's) are the speedrun's" "${TINY[@]}" --resid_lambdas 1 \
  --write_debug_state "$WORK/resid_lambdas_gpt2"
expect_error "record_init 89 is the speedrun's init, and the gpt2 architecture has its own" "${TINY[@]}" \
  --record_init 89 --write_debug_state "$WORK/record_init_gpt2"
expect_error "the bigram embedding (record #89's) is the speedrun's" "${TINY[@]}" --bigram 1 \
  --write_debug_state "$WORK/bigram_gpt2"
expect_error "the value-embedding gates (record #89's) are the speedrun's" "${TINY[@]}" --ve_gates 1 \
  --write_debug_state "$WORK/ve_gates_gpt2"
expect_error "XSA (record #89's) is the speedrun's" "${TINY[@]}" --xsa 1 --write_debug_state "$WORK/xsa_gpt2"
expect_error "record #89's plan is the speedrun's; give --recipe speedrun or drop --record89_plan" --recipe modern \
  --model tiny --record89_plan 1 --write_debug_state "$WORK/record89_plan_modern"
expect_error "the attention lambdas (record #89's) are the speedrun's; give --recipe speedrun or drop --attn_lambdas" \
  --recipe modern --model tiny --attn_lambdas 1 --write_debug_state "$WORK/attn_lambdas_modern"
expect_error "the speedrun architecture has its reference's 11 layers .record #89's plan., not 12; drop --num_layers" \
  --recipe speedrun --model tiny --record89_plan 1 --num_layers 12 --write_debug_state "$WORK/record89_plan_12"
expect_error "adam_every 2 sums 2 steps' gradients for AdamW, and --grad_clip 1 would clip each step's apart" \
  "${TINY[@]}" --adam_every 2 --write_debug_state "$WORK/adam_every_clip"
expect_error "untie_step 2 unties at a step without AdamW's update under --adam_every 2" --recipe modern --model tiny \
  --adam_every 2 --untie_step 2 --write_debug_state "$WORK/adam_every_untie"
ckpt="$WORK/run/model_00000008.bin"
expect_error "init_from takes the model shape and architecture from the checkpoint; drop .*--record89_plan" \
  --init_from "$ckpt" --record89_plan 1 --input_bin "$WORK/train_*.bin"
expect_error "eval_only 1 validates a checkpoint and trains nothing; drop --input_bin" --eval_only 1 \
  --init_from "$ckpt" --input_val_bin "$WORK/val_*.bin" --input_bin "$WORK/train_*.bin"
expect_error "eval_only 1 validates --init_from's weights on --input_val_bin; give both" --eval_only 1 \
  --init_from "$ckpt"
expect_error "eval_only 1 has no schedule to take a window from" --eval_only 1 --recipe speedrun \
  --init_from "$ckpt" --input_val_bin "$WORK/val_*.bin"
"$PYTHON" train_gpt2.py "${TINY[@]}" --vocab_size 256 --write_debug_state "$WORK/v256" -b 2 -t 32 --debug_steps 1 \
  --device cpu >/dev/null
expect_error "check_debug_state STATE starts from the state's model: give --init_from" \
  --check_debug_state "$WORK/a/gpt2_l2h4c128t64v512_debug_state.bin"
expect_error "check_debug_state measures one step on the state's batch and trains nothing; drop --input_bin" \
  "${gpt2_state[@]}" --input_bin "$WORK/train_*.bin"
expect_error "magic.bin: not a debug state" --init_from "$ckpt" --check_debug_state "$WORK/magic.bin"
# A state whose head trained in FP8 (its header's flag, set here) is checked with that head only.
"$PYTHON" - "$WORK/speedrun_state/gpt2_speedrun_tiny_muon_debug_state.bin" "$WORK/fp8_head_state.bin" <<'EOF'
import sys
import numpy as np
data = bytearray(open(sys.argv[1], "rb").read())
header = np.frombuffer(bytes(data[:1024]), np.int32).copy()
assert header[30] == 0, header[30]
header[30] = 1
data[:1024] = header.tobytes()
open(sys.argv[2], "wb").write(data)
EOF
expect_error "fp8_head_state.bin: its steps took the head in FP8 .--fp8_head 1., the rest in float32, and this check's --fp8_head is 0; give the state's head" \
  --recipe speedrun --init_from "$WORK/speedrun_state/gpt2_speedrun_tiny.bin" --check_debug_state "$WORK/fp8_head_state.bin" \
  --flash 0 --device cpu
expect_error "gpt2_l2h4c128t64v256_debug_state.bin: holds .* give the state written with that model" \
  --init_from "$WORK/a/gpt2_l2h4c128t64v512.bin" --check_debug_state "$WORK/v256/gpt2_l2h4c128t64v256_debug_state.bin" \
  --device cpu
expect_error "eval_only 1 validates a checkpoint and trains nothing; drop --check_debug_state" --eval_only 1 \
  --init_from "$ckpt" --input_val_bin "$WORK/val_*.bin" --check_debug_state "$WORK/a/gpt2_l2h4c128t64v512_debug_state.bin"
expect_error "cautious_decay 1 makes the weight decay cautious, and this run decays nothing .--weight_decay 0.: give --weight_decay a decay" \
  "${TINY[@]}" --bench --weight_decay 0 --cautious_decay 1
expect_error "normuon sets Muon, which --optimizer adamw does not use" "${TINY[@]}" --bench --normuon 1
expect_error "key_offset 1 shifts the keys' stationary rotary dims, and GPT-2 has no rotary" "${TINY[@]}" --bench \
  --key_offset 1
expect_error "the rotary pairs (record #89's) lay out the modern and speedrun rotary, and GPT-2 has none" "${TINY[@]}" \
  --bench --rotary_pairs 1
expect_error "attention_scale 0.0: the attention's softmax scale must be positive" "${TINY[@]}" --bench \
  --attention_scale 0
expect_error "yarn 1 rescales the rotary's frequencies, and GPT-2 has no rotary" --model tiny -b 2 -t 256 \
  --max_seq_len 256 --documents 1 --stages "1/2 aw=1; 1/2 aw=2" --total_batch_size -1 --yarn 1 \
  --write_debug_state "$WORK/x" --device cpu
expect_error "yarn 1 rescales the rotary at the stage plan's changes of the long window, and stage 2 of 2 has no window" \
  --model tiny --recipe modern -b 2 -t 256 --max_seq_len 256 --documents 1 --stages "1/2 aw=1; 1/2 aw=0" \
  --total_batch_size -1 --yarn 1 --write_debug_state "$WORK/x" --device cpu
expect_error "yarn 1 rescales the rotary at the stage plan's changes of the long window, and --write_debug_state has none" \
  "${TINY[@]}" --recipe modern --yarn 1 --write_debug_state "$WORK/x" --device cpu
expect_error "muon_qk_heads sets Muon, which --optimizer adamw does not use" "${TINY[@]}" --bench --muon_qk_heads 2
expect_error "muon_qk_heads 3: the model's 4 heads do not split into blocks of 3: give a divisor of 4" "${TINY[@]}" \
  --bench --optimizer muon --muon_qk_heads 3
expect_error "compile_optimizer applies to --benchmark 1 only" "${TINY[@]}" --write_debug_state "$WORK/x" --compile_optimizer 1
expect_error "fp8 1 needs" "${TINY[@]}" --write_debug_state "$WORK/x" --fp8 1 --device cpu
expect_error "fp8 1 needs B\*T = 1\*15 to be a multiple of 16" "${TINY[@]}" --bench -b 1 -t 15 --fp8 1
expect_error "fp8 1 runs under bfloat16 autocast" "${TINY[@]}" --bench --fp8 1 --dtype float32
echo "all train_gpt2.py tests passed"
