#!/usr/bin/env bash
# Tests of train_gpt2.py --recipe speedrun (dev/SPEC.md "The speedrun architecture and recipe"), on
# the CPU: the parameter table and its optimizer groups (tiny and d12), the init, the model's loss
# against a forward written out here from the reference's steps (skips, lambdas, value embeddings,
# gates, layer 7 without attention, the sigmoid cap over the padded vocabulary), which layers each
# value embedding reaches, the schedules at sample steps, Newton-Schulz with the speedrun's
# coefficients, Muon's scale of fc, Adam's eps before the bias correction, its checkpoints (SPEC's
# order, round trips, the CPU trainer's refusal), its debug state read back by build/test_utils
# --speedrun (with the seeded init against llmc's), the bfloat16 embeddings of bfloat16 runs, a short
# training on document shards (the loss falls, twice the same), record #89's init (against llmc's
# tensor by tensor, also in record #89's plan; tied through an untie step, the loss falls), and the
# flag errors (--fp8_head 1 on the CPU, whose default 0 leaves the debug state as it was). PYTHON as
# in train_gpt2_py_lib.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/test/train_gpt2_py_lib.sh

check "parameter table: every tensor in one optimizer group at the recipe's rate (tiny and d12)" <<'EOF'
import math, torch, train_gpt2 as tg
for model_name, size in [("tiny", []), ("d12", ["-t", "1024"])]:
    args = tg.parse_args(["--recipe", "speedrun", "--model", model_name, "--benchmark", "1"] + size)
    config = tg.resolve_config(args)
    tg.settle_arch(args, config)
    model = tg.GPT(config)
    params = dict(model.named_parameters())
    assert config.num_parameters() == sum(p.numel() for p in params.values())
    assert len(tg.params_in_file_order(model)) == len(params)
    optimizers, _ = tg.make_optimizers(model, args, "cpu")
    adam, muon = optimizers
    owner = {}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                assert id(p) not in owner, "a tensor in two groups"
                owner[id(p)] = (type(optimizer).__name__, group)
    C, Vp = config.channels, config.padded_vocab_size
    assert Vp == 50304 and config.vocab_size == 50257
    for name, p in params.items():
        kind, group = owner[id(p)]
        if name.endswith(("wte.weight", "lm_head.weight")) or ".ve." in name:
            lr = 0.008 * (1 if name.startswith("lm_head") else 75)
            assert kind == "AdamW" and p.shape == (Vp, C) and math.isclose(group["peak_lr"], lr), name
        elif p.dim() == 1:
            assert kind == "AdamW" and math.isclose(group["peak_lr"], 0.008 * 5), name
        else:
            assert kind == "Muon" and group["peak_lr"] == 0.05 and group["weight_decay"] == 0.0, name
            assert group["blocks"] == (3 if name.endswith("c_attn.weight") else 1), name
            assert group["transposed"] == name.endswith("c_fc.weight"), name
    assert adam.defaults["betas"] == (0.8, 0.95) and adam.defaults["eps"] == 1e-10
    assert all(group["weight_decay"] == 0.0 for group in adam.param_groups)
    assert muon.newton_schulz.polynomials == ((3.4445, -4.7750, 2.0315),) * 5
    assert (muon.newton_schulz.scale, muon.newton_schulz.eps) == (1.0, 1e-7)
    assert not any(".h.7.attn" in name or ".h.7.ln_1" in name for name in params), "layer 7 has attention"
    gates = [p for name, p in params.items() if name.endswith("gate.weight")]
    assert len(gates) == 11 and all(g.shape == (config.num_heads, C // 64) for g in gates)
    print(f"{model_name}: {len(params)} tensors, {config.num_parameters():,} parameters; Adam: embeddings 0.6, "
          f"head 0.008, scalars 0.04; Muon 0.05 (qkv as 3, fc scaled as [C, 4C]); 11 gates of "
          f"{tuple(gates[0].shape)}")
    del model, optimizers
EOF

check "init: zero, uniform and N(0, 1) tensors, the scalars, and the loss ln(50304)" <<'EOF'
import math, torch, train_gpt2 as tg
config = tg.make_config(*tg.SPEEDRUN_PRESETS["tiny"], source="tiny", arch="speedrun")
model = tg.GPT(config)
tg.init_weights(model, 3)
bound = math.sqrt(3) * 0.5 / math.sqrt(config.channels)
for name, p in model.named_parameters():
    if name.endswith(("c_attn.weight", "c_fc.weight")):
        assert p.abs().max() <= bound and p.abs().max() > 0.99 * bound, name
        assert abs(p.std().item() - bound / math.sqrt(3)) < 0.02 * bound, name
    elif name.endswith("wte.weight") or ".ve." in name:
        assert abs(p.std().item() - 1) < 0.01 and p[config.vocab_size:].abs().min() > 0, name
    elif name == "skip_weights":
        assert torch.equal(p, torch.ones(6)), name
    elif name.endswith("lambdas"):
        assert torch.equal(p, torch.tensor([1.0, 0.0])), name
    elif name.endswith("value_scales"):
        assert torch.equal(p, torch.full((2,), 0.5)), name
    else:
        assert name.endswith(("c_proj.weight", "gate.weight", "lm_head.weight")) and torch.all(p == 0), name
x, y = tg.RandomTokens(2, 64, config.vocab_size, 3).next_batch()
loss = model(x, y)[1].item()
print(f"bound {bound:.5f}; loss at init {loss:.6f}, ln(50304) = {math.log(50304):.6f}")
assert abs(loss - math.log(50304)) < 1e-5, "a zero head caps every logit to 15: uniform over the padded vocabulary"
EOF

check "the model against the reference's forward written out; each value embedding reaches its two layers" <<'EOF'
import math, torch, torch.nn.functional as F, train_gpt2 as tg
config = tg.make_config(12, 2, 128, 64, 500, source="t", arch="speedrun")  # 500: 12 padded columns
model = tg.GPT(config)
torch.manual_seed(4)
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.randn(p.shape) * (0.5 if p.dim() == 1 else 0.05) + (0.5 if p.dim() == 1 else 0))
B, T, NH, C = 2, 64, config.num_heads, config.channels
hs = C // NH
x, y = tg.RandomTokens(B, T, config.vocab_size, 4).next_batch()

def norm(z):
    return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 2.0 ** -23)

def rotary(z):
    freq = (1 / 1024) ** torch.linspace(0, 1, hs // 4)
    theta = torch.arange(T, dtype=torch.float32)[:, None] * torch.cat([freq, torch.zeros(hs // 4)])
    cos, sin = theta.cos()[None, :, None], theta.sin()[None, :, None]
    z1, z2 = z.chunk(2, dim=-1)
    return torch.cat([z1 * cos + z2 * sin, -z1 * sin + z2 * cos], dim=-1)

def reference_loss(model, idx, targets):
    t = model.transformer
    x = x0 = norm(t.wte(idx))
    ve = [e(idx) for e in t.ve]
    ve = ve + [None] * 6 + ve
    skips, causal = [], torch.ones(T, T, dtype=torch.bool).tril()
    for i, block in enumerate(t.h):
        if i >= 6:
            x = x + model.skip_weights[i - 6] * skips.pop()
        x = block.lambdas[0] * x + block.lambdas[1] * x0
        if i != 7:
            a, h = block.attn, norm(x)
            q, k, v = (h @ a.c_attn.weight.T).view(B, T, 3 * NH, hs).chunk(3, dim=-2)
            q, k = rotary(norm(q)), rotary(norm(k))
            v = a.value_scales[0] * v + (0 if ve[i] is None else a.value_scales[1] * ve[i].view_as(v))
            scores = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)) * 0.12
            att = F.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v.transpose(1, 2)
            gate = torch.sigmoid(h[..., :C // 64] @ a.gate.weight.T).view(B, T, NH, 1)
            x = x + (att.transpose(1, 2) * gate).reshape(B, T, C) @ a.c_proj.weight.T
        h = norm(x)
        x = x + F.relu(h @ block.mlp.c_fc.weight.T).square() @ block.mlp.c_proj.weight.T
        if i < 6:
            skips.append(x)
    logits = 30 * torch.sigmoid((norm(x) @ model.lm_head.weight.T) / 7.5)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), reduction="sum")

got, want = model(x, y, "sum")[1], reference_loss(model, x, y)
print(f"summed loss: model {got.item():.6f}, written out {want.item():.6f}")
assert abs(got.item() - want.item()) < 1e-5 * abs(want.item())
for j in range(3):
    first, second = model.transformer.h[j].attn.value_scales, model.transformer.h[9 + j].attn.value_scales
    reached = []
    for silenced in ([first], [second], [first, second]):
        saved = [s[1].item() for s in silenced]
        with torch.no_grad():
            for s in silenced:
                s[1] = 0.0
        model.zero_grad()
        model(x, y, "sum")[1].backward()
        reached.append(model.transformer.ve[j].weight.grad.abs().max().item())
        with torch.no_grad():
            for s, value in zip(silenced, saved):
                s[1] = value
    print(f"ve{j}: gradient with layer {j}'s scale zeroed {reached[0]:.3e}, layer {9 + j}'s {reached[1]:.3e}, both {reached[2]:.3e}")
    assert reached[0] > 0 and reached[1] > 0 and reached[2] == 0, f"ve{j} reaches other layers than {j} and {9 + j}"
model.zero_grad()
model(x, y, "sum")[1].backward()
unused = [name for name, p in model.named_parameters() if p.grad is None or p.grad.abs().max() == 0]
assert not unused, f"parameters without a gradient: {unused}"
print("every parameter has a gradient")
EOF

check "schedules: lr, Muon's momentum and the window at sample steps of 1695" <<'EOF'
import math, train_gpt2 as tg
args = tg.parse_args(["--recipe", "speedrun", "--benchmark", "1"])
assert args.num_iterations == 1695 and args.lr_schedule == "stable_decay" and args.warmup_iters == 0
# get_lr: 1 while step/1695 < 0.55 (step 932: 0.54985), then w + 0.1 (1 - w), w = (1 - step/1695) / 0.45
lr = {0: 1.0, 932: 1.0, 933: 0.9991150442477876, 1200: 0.6840707964601770, 1694: 0.1011799410029499}
for step, factor in lr.items():
    got = tg.learning_rate(step, args) / args.learning_rate
    assert math.isclose(got, factor, rel_tol=1e-12), (step, got, factor)
# momentum: (1 - f) 0.85 + f 0.95, f = min(step / 300, 1)
momentum = {0: 0.85, 150: 0.9, 299: 0.9496666666666667, 300: 0.95, 1000: 0.95}
for step, mu in momentum.items():
    assert math.isclose(tg.muon_momentum(step, args), mu, rel_tol=1e-12), (step, tg.muon_momentum(step, args))
# window: next multiple of 128 at or above 1728 step/1695, in blocks
window = {0: 1, 1: 1, 125: 1, 126: 2, 847: 7, 1695: 14}
for step, blocks in window.items():
    assert tg.attention_window_blocks(step, 1695) == blocks, (step, tg.attention_window_blocks(step, 1695))
layers = [tg.layer_window_blocks(spec.window, 14) for spec in tg.layer_plan("speedrun", 12)]
assert layers == [14, 7, 7, 7, 14, 7, 7, 14, 7, 7, 7, 14] and tg.layer_window_blocks("S", 1) == 0, layers
config = tg.make_config(*tg.SPEEDRUN_PRESETS["tiny"], source="tiny", arch="speedrun")
tg.settle_arch(args, config)
optimizers, _ = tg.make_optimizers(tg.GPT(config), args, "cpu")
tg.set_learning_rates(optimizers, 1200, args)
for optimizer in optimizers:
    for group in optimizer.param_groups:
        assert math.isclose(group["lr"], group["peak_lr"] * lr[1200], rel_tol=1e-12)
        assert not isinstance(optimizer, tg.Muon) or group["momentum"] == 0.95
tg.set_learning_rates(optimizers, 150, args)
assert all(math.isclose(g["momentum"], 0.9) for g in optimizers[1].param_groups)
print("lr factors", lr, "\nmomentum", momentum, "\nwindows", window, layers)
EOF

check "Newton-Schulz's speedrun and Polar Express rows: each step's polynomial on the singular values" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
def iterate(s, polynomials):
    for a, b, c in polynomials:
        s = a * s + b * s ** 3 + c * s ** 5
    return s
# Newton-Schulz maps each singular value s of G / (scale |G|_F) by its step's polynomial; spread over
# two decades, the small ones tell the steps apart (each step multiplies them by ~a). The fit is the
# mean error over the singular values: a single one's BF16 rounding can move by 0.07 with the CPU's
# BF16 products (64x32's largest error fit 4 steps better than 5 on one machine, 0.058 against
# 0.070, while its mean error still picks 5: 0.014 against 0.025).
def singular_values(rows, cols, method):
    """Singular values s (log-spaced over two decades) of a rows x cols matrix, and those of its
    orthogonalisation by NEWTON_SCHULZ[method] (BF16, as train_gpt2.py's Muon), sorted."""
    n = min(rows, cols)
    U = torch.linalg.qr(torch.randn(rows, n, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(cols, n, dtype=torch.float64))[0]
    s = torch.logspace(-2, 0, n, dtype=torch.float64)
    X = tg.orthogonalise((U @ torch.diag(s) @ V.T).float(), tg.NEWTON_SCHULZ[method])
    assert X.dtype == torch.bfloat16 and X.shape == (rows, cols)
    return s, torch.linalg.svdvals(X.double()).sort().values
def error(s, got, polynomials, scale=1.0, worst=False):
    e = (got - iterate(s / (scale * s.norm()), polynomials).sort().values).abs()
    return (e.max() if worst else e.mean()).item()
speedrun, baseline, polar = (tg.NEWTON_SCHULZ[m] for m in ("speedrun", "baseline", "polar"))
for rows, cols in [(48, 8), (8, 48), (16, 16), (64, 32)]:
    s, got = singular_values(rows, cols, "speedrun")
    distances = {k: error(s, got, list(speedrun.polynomials[:1]) * k) for k in range(3, 8)}
    worst_baseline = error(s, got, baseline.polynomials, worst=True)
    print(f"speedrun {rows}x{cols}: mean singular value error against k steps of its polynomial",
          {k: round(d, 4) for k, d in distances.items()}, f"(the baseline's 12 steps: largest {worst_baseline:.3f})")
    assert min(distances, key=distances.get) == 5 and distances[5] < 0.03 and worst_baseline > 0.2
# Polar Express: its polynomials in their order fit best, against the same in reverse order, without
# the last, or the speedrun's 5 steps. Its first step multiplies the small singular values by 8, and
# their BF16 rounding with them: errors of 0.017 to 0.055 on these shapes, where the speedrun's are
# 0.02 (the norm's 2% does not show through that; test_muon checks the CUDA trainer's norm on its own).
for rows, cols in [(48, 8), (8, 48), (16, 16), (64, 32)]:
    s, got = singular_values(rows, cols, "polar")
    fits = {"polar": error(s, got, polar.polynomials, 1.02), "reversed": error(s, got, polar.polynomials[::-1], 1.02),
            "4 steps": error(s, got, polar.polynomials[:4], 1.02), "speedrun's": error(s, got, speedrun.polynomials)}
    print(f"polar {rows}x{cols}: mean singular value error", {k: round(d, 4) for k, d in fits.items()})
    assert min(fits, key=fits.get) == "polar" and fits["polar"] < 0.08
EOF

check "Muon: the speedrun's fc takes the scale of [C, 4C] (1), the modern's of [4C, C] (2)" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(1)
C, lr = 16, 0.05
updates = []
for transposed in (True, False):
    fc = torch.nn.Parameter(torch.zeros(4 * C, C))
    fc.grad = torch.randn(4 * C, C, generator=torch.Generator().manual_seed(2))
    tg.Muon([dict(params=[fc], transposed=transposed)], lr, 0.0, 0.85, tg.NEWTON_SCHULZ["speedrun"]).step()
    updates.append(-fc.detach() / lr)
momentum = torch.zeros_like(fc.grad).lerp(fc.grad, 1 - 0.85)  # the first step's Nesterov input
direction = tg.orthogonalise(fc.grad.lerp(momentum, 0.85), tg.NEWTON_SCHULZ["speedrun"]).float()
print(f"update / orthogonalised gradient: transposed {(updates[0].norm() / direction.norm()).item():.4f}, "
      f"not {(updates[1].norm() / direction.norm()).item():.4f}")
assert torch.allclose(updates[0], direction, rtol=1e-6, atol=0) and torch.equal(updates[1], 2 * updates[0])
EOF

check "Adam's eps before the bias correction, as the reference adds it (gradients near eps tell it apart)" <<'EOF'
import math, torch, train_gpt2 as tg
args = tg.parse_args(["--recipe", "speedrun", "--benchmark", "1"])
assert args.adam_eps_before_correction == 1 and args.adam_eps == 1e-10
p = torch.nn.Parameter(torch.zeros(4))
optimizer = torch.optim.AdamW([dict(params=[p], lr=0.008, peak_lr=0.008, weight_decay=0.0)], betas=(0.8, 0.95),
                              eps=args.adam_eps)
grads = torch.tensor([[1e-10, -3e-10, 2e-9, 5e-11], [2e-10, 1e-10, -1e-9, 0.0], [-1e-10, 4e-10, 1e-9, 1e-11]],
                     dtype=torch.float64)
m = v = torch.zeros(4, dtype=torch.float64)
reference, torch_form = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
for step, g in enumerate(grads):
    p.grad = g.float()
    tg.set_learning_rates([optimizer], step, args)
    optimizer.step()
    t, lr = step + 1, tg.learning_rate(step, args, 0.008)
    m, v = 0.8 * m + 0.2 * g, 0.95 * v + 0.05 * g * g
    reference -= lr * math.sqrt(1 - 0.95 ** t) / (1 - 0.8 ** t) * m / (v.sqrt() + 1e-10)
    torch_form -= lr * (m / (1 - 0.8 ** t)) / ((v / (1 - 0.95 ** t)).sqrt() + 1e-10)
got = p.detach().double()
print("reference's update", [f"{x:.6g}" for x in reference.tolist()],
      "torch's form", [f"{x:.6g}" for x in torch_form.tolist()])
assert torch.allclose(got, reference, rtol=1e-5, atol=0), got
assert (torch_form - reference).abs().max() > 0.1 * reference.abs().max(), "the test cannot tell the forms apart"
for recipe in ("gpt2", "modern"):
    assert tg.parse_args(["--recipe", recipe, "--benchmark", "1"]).adam_eps_before_correction == 0
EOF

check "checkpoints: SPEC's order, versions 6 and 7 with architecture 2, FP32 and BF16 round trips" <<'EOF'
import os, numpy as np, torch, train_gpt2 as tg
config = tg.make_config(*tg.SPEEDRUN_PRESETS["tiny"], source="tiny", arch="speedrun")
model = tg.GPT(config)
tg.init_weights(model, 4)
tg.add_debug_noise(model, 0.02, 5)
t = model.transformer
attention = [b.attn for b in t.h if b.attn is not None]
spec_order = ([t.wte.weight] + [a.c_attn.weight for a in attention] + [a.c_proj.weight for a in attention]
              + [b.mlp.c_fc.weight for b in t.h] + [b.mlp.c_proj.weight for b in t.h] + [model.lm_head.weight]
              + [ve.weight for ve in t.ve] + [a.gate.weight for a in attention] + [model.skip_weights]
              + [b.lambdas for b in t.h] + [a.value_scales for a in attention])
assert [id(p) for p in tg.params_in_file_order(model)] == [id(p) for p in spec_order]
assert len(spec_order) == len(list(model.parameters())) and len(attention) == 11
names = {id(p): name for name, p in model.named_parameters()}
out = os.environ["WORK"]
for version, dtype in ((tg.CHECKPOINT_FP32, torch.float32), (tg.CHECKPOINT_BF16, torch.bfloat16)):
    path = f"{out}/speedrun_{version}.bin"
    tg.write_checkpoint(model, path, version)
    header = np.fromfile(path, np.int32, tg.HEADER_INTS)
    back = tg.read_checkpoint(path)
    assert back.config == config and header[tg.ARCH_SLOT] == 2
    assert header[1] == tg.MODERN_CHECKPOINT_VERSION[version]
    assert os.path.getsize(path) == tg.HEADER_INTS * 4 + config.num_parameters() * (4 if version == 3 else 2)
    for p, q in zip(tg.params_in_file_order(model), tg.params_in_file_order(back)):
        assert torch.equal(p.detach().to(dtype).float(), q.detach()), names[id(p)]
    print(f"version {header[1]}, architecture {header[tg.ARCH_SLOT]}: {config.num_parameters():,} parameters "
          f"back as written ({str(dtype)[6:]})")
EOF

check "bfloat16 runs: the embeddings are bfloat16 parameters with bfloat16 AdamW state, the rest float32" <<'EOF'
import torch, train_gpt2 as tg
for dtype in ("bfloat16", "float32"):
    args = tg.parse_args(["--recipe", "speedrun", "--model", "tiny", "-t", "128", "--dtype", dtype])
    config = tg.resolve_config(args)
    tg.settle_arch(args, config)
    model = tg.GPT(config)
    tg.init_weights(model, 1)
    tg.set_parameter_dtypes(model, dtype)
    optimizers, _ = tg.make_optimizers(model, args, "cpu")
    tg.set_compute_dtype(model, dtype, "cpu")
    embeddings = [model.transformer.wte.weight] + [ve.weight for ve in model.transformer.ve]
    before = [e.detach().clone() for e in embeddings]
    idx = torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(2))
    for step in range(3):  # the zero head and output projections: the value embeddings move third
        model(idx, torch.roll(idx, -1, 1), "sum")[1].backward()
        for optimizer in optimizers:
            optimizer.step()
        model.zero_grad(set_to_none=False)
    wanted = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    state = [optimizers[0].state[e][key] for e in embeddings for key in ("exp_avg", "exp_avg_sq")]
    assert all(e.dtype == wanted and e.grad.dtype == wanted for e in embeddings), dtype
    assert all(t.dtype == wanted for t in state), dtype
    others = [p for p in model.parameters() if all(p is not e for e in embeddings)]
    assert all(p.dtype == torch.float32 for p in others), dtype
    assert all(not torch.equal(b, e) for b, e in zip(before, embeddings)), "an embedding did not move"
    print(f"{dtype}: embeddings and their AdamW state {str(wanted)[6:]}, {len(others)} other tensors float32")
EOF

echo "--- training on document shards: the recipe at a tiny size, the loss falls, twice the same"
"$PYTHON" - "$WORK/data" <<'EOF'
import os, sys, numpy as np
sys.path.insert(0, "dev/test")
import documents_reference as ref
rng = np.random.default_rng(5)
os.makedirs(sys.argv[1])
def documents(count):  # each a run of consecutive tokens mod 64 from a random one: something to learn
    parts = [[50256, *((rng.integers(64) + np.arange(length)) % 64)] for length in rng.integers(1, 400, count)]
    return np.concatenate(parts)
for name in ("train", "val"):
    ref.write_shard(os.path.join(sys.argv[1], f"{name}_000000.bin"), documents(100))
EOF
echo "--- the CPU trainer refuses a speedrun checkpoint by name"
MAKEFLAGS= ${MAKE:-make} -s train_gpt2 build/test_utils
expect_cpp_refusal() {  # the CPU trainer given the speedrun file: one line naming it
  if ./train_gpt2 -e "$1" -x 1 -i "$WORK/data/train_*.bin" -j "$WORK/data/val_*.bin" > "$WORK/cpp.out" 2>&1; then
    echo "FAIL: the CPU trainer took the speedrun checkpoint $1"
    exit 1
  fi
  grep -qF "error: $1: the CPU trainer runs GPT-2's architecture only, not the speedrun one" "$WORK/cpp.out" &&
    grep -qF "train it with train_gpt2.py --recipe speedrun" "$WORK/cpp.out" && [ "$(wc -l < "$WORK/cpp.out")" = 1 ] ||
    { echo "FAIL: unexpected error:"; cat "$WORK/cpp.out"; exit 1; }
  echo "ok: $(head -n 1 "$WORK/cpp.out")"
}
expect_cpp_refusal "$WORK/speedrun_3.bin"
expect_cpp_refusal "$WORK/speedrun_5.bin"

echo "--- the debug state (float32, Muon, documents), read back by the C++ model description"
"$PYTHON" train_gpt2.py --recipe speedrun --model tiny --write_debug_state "$WORK/debug" -b 1 -t 128 \
  --debug_steps 2 --seed 7 --debug_noise 0.02 --device cpu
check "train_gpt2.py's seeded init and the debug state's gradients by tensor, for build/test_utils --speedrun" <<'EOF'
import os, numpy as np, torch, train_gpt2 as tg
out = os.environ["WORK"]
config = tg.make_config(*tg.SPEEDRUN_PRESETS["tiny"], source="tiny", arch="speedrun")
model = tg.GPT(config)
tg.init_weights(model, 9)
tg.write_checkpoint(model, f"{out}/init.bin", tg.CHECKPOINT_FP32)
path = f"{out}/debug/gpt2_speedrun_tiny_muon_debug_state.bin"
header, _, _, floats = tg.read_debug_state(path)
B, T, V = header[2], header[3], header[5]
assert header[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and list(header[12:15]) == [2, 1, 1] and header[21] == 1
assert header[30] == 0, "the head in FP8 without --fp8_head 1"
grads = np.asarray(floats[B * T * V + 1:])  # after the logits and the loss
names = {id(p): name for name, p in model.named_parameters()}
offset = 0
with open(f"{out}/tensors.txt", "w") as f:
    for p in tg.params_in_file_order(model):
        g = grads[offset:offset + p.numel()].astype(np.float64)
        f.write(f"{names[id(p)]} {p.numel()} {offset} {np.dot(g, g):.17g}\n")
        offset += p.numel()
at_bf16_weights = sum(p.numel() for p in tg.bf16_weights_tensors(model, tg.params_in_file_order(model)))
assert offset + at_bf16_weights + header[4] == grads.size, \
    "the gradients, those at the BF16 weights and the step losses fill the file"
print(f"{len(names)} tensors, {offset:,} gradients; init of seed 9 written")
EOF
build/test_utils --speedrun "$WORK/init.bin" 9 "$WORK/debug/gpt2_speedrun_tiny_muon_debug_state.bin" "$WORK/tensors.txt"
check "--record_init 89: record #89's init (the head N(0, 0.005), wte its copy, ve N(0, 0.01), c_proj drawn)" <<'EOF'
import math, os, torch, train_gpt2 as tg
out = os.environ["WORK"]
plan = {"record89_plan": True}  # record #89's plan: its 11 layers, x0_gates and skip_gate
for name, features in [("tiny", {}), ("tiny_smear_bigram", {"smear": True, "bigram": True}),
                       ("tiny_plan", {**plan, "bigram": True, "resid_lambdas": True, "attn_lambdas": True}),
                       ("tiny_plan_alone", plan),
                       ("tiny_mudd_gates", {**plan, "bigram": True, "xsa": True, "mudd_gates": True})]:
    shape = tg.SPEEDRUN_PRESETS["tiny"]
    shape = (tg.RECORD89_LAYERS,) + shape[1:] if features.get("record89_plan") else shape
    config = tg.make_config(*shape, source="tiny", arch="speedrun", **features)
    model = tg.GPT(config)
    tg.init_weights(model, 11, 89)
    bound = math.sqrt(3) * 0.5 / math.sqrt(config.channels)
    head, wte = model.lm_head.weight, model.transformer.wte.weight
    assert torch.equal(head, wte) and abs(head.std().item() - 0.005) < 1e-4 and head.abs().min() > 0
    for p_name, p in model.named_parameters():
        if ".attn.c_" in p_name or p_name.endswith("c_fc.weight"):
            assert p.abs().max() <= bound and p.abs().max() > 0.99 * bound, p_name
        elif ".ve." in p_name:
            assert abs(p.std().item() - 0.01) < 1e-4, p_name
        elif p_name.endswith("mlp.c_proj.weight"):
            assert torch.all(p == 0), p_name
    tg.write_checkpoint(model, f"{out}/record89_{name}.bin", tg.CHECKPOINT_FP32)
    print(f"{name}: head std {head.std().item():.5f}, wte its copy; written for build/test_utils --init")
EOF
build/test_utils --init "$WORK/record89_tiny.bin" 11 89
build/test_utils --init "$WORK/record89_tiny_smear_bigram.bin" 11 89
build/test_utils --init "$WORK/record89_tiny_plan.bin" 11 89
build/test_utils --init "$WORK/record89_tiny_plan_alone.bin" 11 89
build/test_utils --init "$WORK/record89_tiny_mudd_gates.bin" 11 89
echo "--- --fp8_head 0 (the default) writes the same files"
"$PYTHON" train_gpt2.py --recipe speedrun --model tiny --write_debug_state "$WORK/debug_fp8_head_0" -b 1 -t 128 \
  --debug_steps 2 --seed 7 --debug_noise 0.02 --device cpu --fp8_head 0 > /dev/null
for file in gpt2_speedrun_tiny.bin gpt2_speedrun_tiny_bf16.bin gpt2_speedrun_tiny_muon_debug_state.bin; do
  cmp "$WORK/debug/$file" "$WORK/debug_fp8_head_0/$file"
done
echo "the same bytes"

run_speedrun() {  # 2 micro steps of one 256-token sequence, validation on 512-token sequences
  "$PYTHON" train_gpt2.py --recipe speedrun --model tiny -t 256 --total_batch_size 512 --num_iterations 8 \
    --input_bin "$WORK/data/train_*.bin" --input_val_bin "$WORK/data/val_*.bin" --val_every 8 --val_steps 1 \
    --val_seq_len 512 --device cpu "$@"
}
run_speedrun > "$WORK/first.log"
run_speedrun > "$WORK/second.log"
grep -E "^step +[0-9]+/8 \| (loss|train time)" "$WORK/first.log"
losses() { grep -E "\| (val )?loss" "$1" | sed -e 's/ | [0-9.]* ms .*//' -e 's/ | train time [0-9.]* s//'; }
diff <(losses "$WORK/first.log") <(losses "$WORK/second.log")
echo "the same losses twice"
grep -q "^window_blocks *-1$" "$WORK/first.log" && grep -q "^documents *1$" "$WORK/first.log"
awk '/^step +1\/8 \| loss/ {first = $5} /^step +8\/8 \| loss/ {last = $5}
     END {printf "loss %s -> %s\n", first, last; exit !(last < first - 1.0)}' "$WORK/first.log"
awk '/val loss/ {v[n++] = $NF} END {printf "val loss %s -> %s\n", v[0], v[1]; exit !(n == 2 && v[1] < v[0])}' \
  "$WORK/first.log"

echo "--- record #89's init tied to the head through step 4 (--record_init 89 --untie_step 4): the loss falls"
# With record #28's zero head the tied embedding is zero too, and no gradient reaches either.
"$PYTHON" train_gpt2.py --recipe speedrun --model tiny -t 256 --total_batch_size 512 --num_iterations 6 \
  --input_bin "$WORK/data/train_*.bin" --device cpu --record_init 89 --untie_step 4 > "$WORK/record89.log"
awk '/^step +1\/6 \| loss/ {first = $5} /^step +6\/6 \| loss/ {last = $5}
     END {printf "loss %s -> %s\n", first, last; exit !(last < first - 1.0)}' "$WORK/record89.log"

echo "--- flag errors"
SPEEDRUN=(--recipe speedrun -t 256 --device cpu --input_bin "$WORK/data/train_*.bin")
expect_error "drop --arch modern" "${SPEEDRUN[@]}" --arch modern
expect_error "--fp8 1 is GPT-2" "${SPEEDRUN[@]}" --fp8 1
# The FP8 head: torch._scaled_mm on a CUDA GPU only (PyTorch 2.1+), in one line; the speedrun's head only.
expect_error "--fp8_head 1 needs .*use --fp8_head 0" "${SPEEDRUN[@]}" --fp8_head 1
[ "$(wc -l < "$WORK/out")" = 1 ] || { echo "FAIL: --fp8_head 1 on the CPU: more than one line"; cat "$WORK/out"; exit 1; }
expect_error "the FP8 head's fixed scales are the speedrun's" --arch modern --model tiny -t 256 --device cpu \
  --input_bin "$WORK/data/train_*.bin" --fp8_head 1
expect_error "presets are d12, tiny" "${SPEEDRUN[@]}" --model d24
expect_error "12 layers, not 8" "${SPEEDRUN[@]}" --num_layers 8
expect_error "window of blocks (--window_blocks -1), which needs documents: add --window_blocks 0 to --documents 0" \
  "${SPEEDRUN[@]}" --documents 0
expect_error "but --recipe speedrun trains on documents: add --documents 0 --window_blocks 0" \
  --recipe speedrun --benchmark 1 --device cpu
expect_error "--cooldown_frac 0.0" "${SPEEDRUN[@]}" --cooldown_frac 0
expect_error "--record_init 89 initialises a model from --seed, and --init_from's checkpoint holds the parameters" \
  --init_from "$WORK/record89_tiny.bin" --record_init 89 --device cpu --input_bin "$WORK/data/train_*.bin"
echo "PASS"
