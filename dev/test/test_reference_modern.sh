#!/usr/bin/env bash
# Tests of train_gpt2.py's modern architecture and Muon (dev/SPEC.md), on the CPU: Muon's
# Newton-Schulz output against the exact polar factor, one Muon step, the modern init and its loss
# of ln(V), checkpoints of versions 6 and 7, the version-4 debug state, a few steps lowering the
# loss, the quality mode's lines, and the flag errors. PYTHON names a python with torch and numpy
# (default: the first of python3, /usr/bin/python3 that has them).
set -euo pipefail
cd "$(dirname "$0")/../.."
source dev/test/train_gpt2_py_lib.sh
SMALL=(--model tiny --vocab_size 512 --device cpu)  # a small vocabulary keeps the head cheap

check "Newton-Schulz: the polar factor of tall, wide and square matrices, in bfloat16" <<'EOF'
import torch, train_gpt2 as tg
torch.manual_seed(0)
for rows, cols in [(96, 48), (40, 120), (64, 64), (256, 64)]:
    G = torch.randn(rows, cols, dtype=torch.float64)
    X = tg.orthogonalise(G.float())
    assert X.dtype == torch.bfloat16 and X.shape == G.shape
    s = torch.linalg.svdvals(X.double())
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    error = ((X.double() - U @ Vh).norm() / (U @ Vh).norm()).item()
    print(f"{rows}x{cols}: singular values {s.min().item():.3f}..{s.max().item():.3f}, "
          f"relative distance to U V^T {error:.4f}")
    # NS's fixed point is 1; 12 steps leave the small singular values within ~0.3 (as the reference)
    assert 0.6 < s.min().item() and s.max().item() < 1.25, (rows, cols)
    assert error < 0.2, (rows, cols)
EOF

check "Muon: one step, q, k and v orthogonalised as three C x C matrices" <<'EOF'
import math, torch, train_gpt2 as tg
torch.manual_seed(1)
C, lr, wd = 32, 0.02, 0.1
qkv = torch.nn.Parameter(torch.randn(3 * C, C))
fc = torch.nn.Parameter(torch.randn(4 * C, C))
start = [qkv.detach().clone(), fc.detach().clone()]
qkv.grad, fc.grad = torch.randn(3 * C, C), torch.randn(4 * C, C)
grads = [qkv.grad.clone(), fc.grad.clone()]
opt = tg.Muon([dict(params=[qkv], blocks=3), dict(params=[fc])], lr, wd, 0.95)
opt.step()
def polar(g):
    U, _, Vh = torch.linalg.svd(g.double(), full_matrices=False)
    return U @ Vh
# the first step: u = 0.0975 g, and Newton-Schulz forgets the scale
updates = [(p0 * (1 - lr * wd) - p.detach()) / lr for p, p0 in [(qkv, start[0]), (fc, start[1])]]
for update, g, blocks in [(updates[0], grads[0], 3), (updates[1], grads[1], 1)]:
    for part, gpart in zip(update.chunk(blocks), g.chunk(blocks)):
        scale = math.sqrt(max(1, gpart.size(0) / gpart.size(1)))
        error = ((part.double() / scale - polar(gpart)).norm() / polar(gpart).norm()).item()
        print(f"{list(gpart.shape)} block: relative distance to its polar factor {error:.4f} (scale {scale:.3f})")
        assert error < 0.2
whole = ((updates[0].double() - polar(grads[0])).norm() / polar(grads[0]).norm()).item()
assert whole > 0.5, "qkv was orthogonalised as one [3C, C] matrix"
assert torch.equal(opt.state[qkv]["momentum"], 0.05 * grads[0]), "momentum after one step is 0.05 g"
print("momentum 0.05 g; qkv is three blocks, not one matrix")
EOF

"$PYTHON" train_gpt2.py "${SMALL[@]}" --recipe modern --write_debug_state "$WORK/m" -b 2 -t 32 \
  --debug_steps 6 --seed 7 > "$WORK/m.out"
"$PYTHON" train_gpt2.py "${SMALL[@]}" --optimizer muon --write_debug_state "$WORK/g" -b 2 -t 32 \
  --debug_steps 6 --seed 7 --learning_rate 1e-3 > "$WORK/g.out"
"$PYTHON" train_gpt2.py "${SMALL[@]}" --write_debug_state "$WORK/g" -b 2 -t 32 --debug_steps 2 --seed 7 \
  > /dev/null

check "modern init, checkpoints (versions 6 and 7) and the loss at init" <<'EOF'
import math, os, numpy as np, torch, train_gpt2 as tg
d = os.environ["WORK"] + "/m/"
m = tg.read_checkpoint(d + "gpt2_modern_l2h1c128t64v512.bin")
c = m.config
assert c.modern and c.name() == "modern_l2h1c128t64v512" and c.num_parameters() == sum(p.numel() for p in m.parameters())
header = np.fromfile(d + "gpt2_modern_l2h1c128t64v512.bin", np.int32, 256)
assert header[1] == 6 and header[8] == 1 and os.path.getsize(d + "gpt2_modern_l2h1c128t64v512.bin") == 1024 + 4 * c.num_parameters()
assert np.fromfile(d + "gpt2_modern_l2h1c128t64v512_bf16.bin", np.int32, 256)[1] == 7
mb = tg.read_checkpoint(d + "gpt2_modern_l2h1c128t64v512_bf16.bin")
tg.write_checkpoint(mb, d + "again_bf16.bin", tg.CHECKPOINT_BF16)
assert open(d + "again_bf16.bin", "rb").read() == open(d + "gpt2_modern_l2h1c128t64v512_bf16.bin", "rb").read()
torch.manual_seed(7)
C, std = c.channels, math.sqrt(0.33 / c.channels)
wte = torch.empty(c.padded_vocab_size, C).normal_(0, 1)
wte[c.vocab_size:] = 0
draws = {}
for l in range(c.num_layers):
    draws[("qkv", l)] = torch.empty(3 * C, C).normal_(0, std)
    draws[("fc", l)] = torch.empty(4 * C, C).normal_(0, std)
t = m.transformer
assert torch.equal(t.wte.weight, wte)
for l, block in enumerate(t.h):
    assert torch.equal(block.attn.c_attn.weight, draws[("qkv", l)]) and torch.equal(block.mlp.c_fc.weight, draws[("fc", l)])
drawn = ("wte.weight", "c_attn.weight", "c_fc.weight")
gains = ("ln_e.weight", "ln_1.weight", "ln_2.weight", "ln_f.weight")
for name, p in m.named_parameters():
    if not name.endswith(drawn):
        assert torch.all(p == (1.0 if name.endswith(gains) else 0.0)), f"{name}: not zero (a gain: not one)"
print("versions 6/7, slot 8 = 1; BF16 round trip identical; init = SPEC.md's draws, gains one, the rest zero")
x, y = tg.RandomTokens(2, 32, c.vocab_size, 3).next_batch()
full = tg.GPT(tg.make_config(*tg.MODERN_PRESETS["tiny"], source="tiny", arch="modern"))
tg.init_weights(full, 3)
loss = full(x % 512, y % 512)[1].item()
print(f"modern tiny at init: loss {loss:.6f}, ln(50257) = {math.log(50257):.6f}")
assert abs(loss - math.log(50257)) < 1e-5, "a zero head gives zero logits: the loss is ln(V)"
EOF

check "debug state version 6: header, mean loss of summed gradients, and the loss falls" <<'EOF'
import math, os, numpy as np, torch, train_gpt2 as tg
d = os.environ["WORK"]
def read(path):
    header, _, _, data = tg.read_debug_state(path)
    floats = lambda s: header[s].view(np.float32).tolist()
    B, T, steps, V = header[2:6]
    return header, floats, data[B * T * V], np.asarray(data[-steps:])
h, f, loss0, losses = read(d + "/m/gpt2_modern_l2h1c128t64v512_muon_debug_state.bin")
assert h[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and list(h[12:15]) == [1, 1, 1], h[:21]
assert np.allclose(f(slice(6, 12)), [1e-4, 0.8, 0.95, 1e-10, 0.001, 0.0])
assert np.allclose(f(slice(15, 21)), [0.025, 0.05, 0.95, 0.7, 0.004, 0.015])
assert abs(loss0 - math.log(512)) < 1e-5 and losses[0] == loss0
print("modern + Muon:", " ".join(f"{l:.4f}" for l in losses))
assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < losses[0] - 1.0
h, f, loss0, losses = read(d + "/g/gpt2_l2h4c128t64v512_muon_debug_state.bin")
assert h[1] == tg.DEBUG_STATE_VERSION_BF16_WEIGHTS and list(h[12:15]) == [0, 1, 0]
assert np.allclose(f(slice(15, 21)), [0.025, 0.05, 0.95] + [1e-3] * 3)
print("GPT-2 + Muon:", " ".join(f"{l:.4f}" for l in losses))
assert all(b < a for a, b in zip(losses, losses[1:]))
assert np.fromfile(d + "/g/gpt2_l2h4c128t64v512_debug_state.bin", np.int32, 2)[1] == 3, "GPT-2 + AdamW stays version 3"
print("GPT-2 + AdamW: version 3")
EOF

check "summed loss: gradients B*T times the mean loss's" <<'EOF'
import torch, argparse, train_gpt2 as tg
config = tg.make_config(2, 1, 128, 64, 512, source="t", arch="modern")
model = tg.GPT(config)
tg.init_weights(model, 5)
with torch.no_grad():  # a head that is not zero, so that every gradient is
    model.lm_head.weight.normal_(0, 0.02)
x, y = tg.RandomTokens(2, 16, 512, 5).next_batch()
grads = []
for reduction in ("mean", "sum"):
    model.zero_grad()
    model(x, y, reduction)[1].backward()
    grads.append([p.grad.clone() for p in tg.params_in_file_order(model)])
worst = max(((s - 32 * m).abs().max() / (32 * m).abs().max().clamp(min=1e-12)).item() for m, s in zip(*grads))
print(f"largest relative difference {worst:.2e}")
assert worst < 1e-5
EOF

check "quality mode: step lines, and val lines with the training time" <<'EOF'
import os, numpy as np
d = os.environ["WORK"]
rng = np.random.default_rng(0)
for name in ("train", "val"):
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, 4096]
    with open(f"{d}/{name}_000.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, 512, 4096).astype(np.uint16).tobytes())
EOF
"$PYTHON" train_gpt2.py "${SMALL[@]}" --recipe modern -b 2 -t 32 --total_batch_size 128 --num_iterations 6 \
  --val_every 3 --val_steps 2 --input_bin "$WORK/train_*.bin" --input_val_bin "$WORK/val_*.bin" > "$WORK/q.out"
grep -E "^step +[0-9]+/6 \| (loss|train time)" "$WORK/q.out"
[ "$(grep -cE '^step +[0-9]+/6 \| loss [0-9.]+ \| norm [0-9.]+ \| lr [0-9.e+-]+ \| [0-9.]+ ms \|' "$WORK/q.out")" = 6 ]
[ "$(grep -cE '^step +[0-9]+/6 \| train time [0-9.]+ s \| val loss [0-9.]+$' "$WORK/q.out")" = 3 ]
grep -q "^lr_schedule *stable_decay" "$WORK/q.out"

echo "--- flag errors"
expect_error "drop --arch gpt2" "${SMALL[@]}" --recipe modern --arch gpt2 --write_debug_state "$WORK/e"
expect_error "--muon_lr" "${SMALL[@]}" --muon_lr 0.1 --write_debug_state "$WORK/e"
expect_error "--fp8 1 is GPT-2" "${SMALL[@]}" --arch modern --fp8 1 --write_debug_state "$WORK/e"
expect_error "--embedding_lr" "${SMALL[@]}" --head_lr 0.1 --write_debug_state "$WORK/e"
expect_error "is a gpt2 checkpoint" --init_from "$WORK/g/gpt2_l2h4c128t64v512.bin" --recipe modern \
  --write_debug_state "$WORK/e"
expect_error "multiple of 4" --arch modern --model tiny --num_heads 64 --write_debug_state "$WORK/e"
echo "PASS"
