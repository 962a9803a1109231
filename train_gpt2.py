"""
The PyTorch GPT-2 reference: the model, llm.c checkpoints, the debug state the C++ tests compare
against, training on token shards, and a benchmark. Formats and algorithms follow dev/SPEC.md; the
parameter order follows param_table() in llmc/gpt2.h.

  python3 train_gpt2.py --model tiny --write_debug_state OUT -b 4 -t 64 --debug_steps 10 --seed 42
  python3 train_gpt2.py --model d12 --input_bin "data/train_*.bin" --input_val_bin "data/val_*.bin" \
      -b 16 -t 1024 --total_batch_size 524288 --learning_rate 6e-4 --warmup_iters 700 \
      --num_iterations 10000 --val_every 250 --dtype bfloat16 --output_dir out
  python3 train_gpt2.py --bench -b 16 -t 1024 --num_iterations 20 [--fp8 1]
  torchrun --nproc_per_node 8 train_gpt2.py ...        (data parallel over 8 GPUs)

Runs on PyTorch 1.13 (CPU) and 2.x (CUDA); torch.compile, F.scaled_dot_product_attention and fused
AdamW are used only where this PyTorch has them. --fp8 1 (the CUDA trainer's FP8 linear layers)
needs PyTorch 2.1+ and a GPU of compute capability 8.9+.
"""
import argparse
import glob
import inspect
import math
import os
import resource
import sys
import time
import zlib
from contextlib import nullcontext
from dataclasses import astuple, dataclass

from pydeps import require

require("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

# File headers (llmc/gpt2.h, dev/SPEC.md).
HEADER_INTS = 256
CHECKPOINT_MAGIC, CHECKPOINT_FP32, CHECKPOINT_BF16 = 20240326, 3, 5
# The checksum in the last two header slots (llmc/file_header.h): the kind (0 none, 1 CRC-32) and
# the CRC-32 of the whole file read with the checksum slot as 0; zlib.crc32 computes the same value.
HEADER_CHECKSUM_KIND_SLOT, HEADER_CHECKSUM_SLOT = 254, 255
CHECKSUM_NONE, CHECKSUM_CRC32 = 0, 1
DEBUG_STATE_MAGIC, DEBUG_STATE_VERSION = 20240327, 3
SHARD_MAGIC, SHARD_VERSION = 20240520, 1
VOCAB_PAD_MULTIPLE = 128

# (num_layers, num_heads, channels, max_seq_len, vocab_size), as config_from_preset() in llmc/gpt2.h.
PRESETS = {
    "d12": (12, 12, 768, 1024, 50257),
    "d24": (24, 16, 1024, 1024, 50257),
    "d36": (36, 20, 1280, 1024, 50257),
    "d48": (48, 25, 1600, 1024, 50257),
    "tiny": (2, 4, 128, 64, 50257),
}
ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS = 0.9, 0.95, 1e-8
WARMUP_STEPS_UNTIMED = 3  # the first steps include compilation and autotuning; averages skip them
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
SDPA_BACKENDS = {"auto": None, "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION"}
# The benchmark's defaults: the fastest PyTorch recipe measured on an H100 (dev/cuda/NOTES.md,
# "The PyTorch peer"), so the trainers are compared against the best PyTorch does.
BENCHMARK_RECIPE = {"compile_mode": "default", "sdpa_backend": "auto", "compile_optimizer": 0}
# FP8 linear layers (--fp8 1; train_gpt2.cu section 5): each format's largest exponent emax, its
# largest value being 1.75 * 2^emax (448, 57344); the scale exponent's cap, so that s and 1/s are
# normal floats; _scaled_mm's dimensions are multiples of this.
FP8_E4M3_EMAX, FP8_E5M2_EMAX = 8, 15
FP8_SCALE_EXPONENT_CAP = 126
FP8_DIM_MULTIPLE = 16


def fail(message):
    sys.exit(f"error: {message}")


# ------------------------------------------------------------------------------------------------
# Model


@dataclass
class GPTConfig:
    num_layers: int
    num_heads: int
    channels: int
    max_seq_len: int
    vocab_size: int

    @property
    def padded_vocab_size(self):
        return -(-self.vocab_size // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE

    def num_parameters(self):
        """All parameters, wte with padded_vocab_size rows (llmc/gpt2.h num_parameters)."""
        C, L = self.channels, self.num_layers
        return (self.padded_vocab_size + self.max_seq_len) * C + L * (12 * C * C + 13 * C) + 2 * C

    def flops_per_token(self, T):
        """SPEC.md's MFU count: 6*N + 6*L*C*T FLOPs per token, N = all parameters (padded vocabulary)."""
        return 6 * self.num_parameters() + 6 * self.num_layers * self.channels * T

    def name(self):
        """The preset name when the shape is a preset's, else one spelling out the shape."""
        presets = [name for name, shape in PRESETS.items() if shape == astuple(self)]
        return presets[0] if presets else "l{}h{}c{}t{}v{}".format(*astuple(self))


def make_config(num_layers, num_heads, channels, max_seq_len, vocab_size, source):
    config = GPTConfig(int(num_layers), int(num_heads), int(channels), int(max_seq_len), int(vocab_size))
    if min(astuple(config)) <= 0:
        fail(f"{source}: invalid model config L={num_layers} NH={num_heads} C={channels} "
             f"maxT={max_seq_len} V={vocab_size}: every value must be positive")
    if channels % num_heads != 0:
        fail(f"{source}: channels {channels} is not divisible by num_heads {num_heads}")
    return config


# FP8 linear layers (--fp8 1): the recipe of the CUDA trainer's -fp8 1 (train_gpt2.cu section 5,
# "FP8 linear layers") with PyTorch's own FP8 product, torch._scaled_mm: weights and layer inputs
# cast from BF16 to E4M3, output gradients to E5M2, each tensor with one power-of-two scale from
# its own amax; FP32 accumulation, BF16 outputs. Everything stays on the device: no scale is read
# by the host, and torch.compile traces the layer with the rest of the model.


def fp8_scale(amax, emax):
    """s = 2^e for max |x| = amax (a float32 tensor, elementwise), as fp8_scale_exponent in
    train_gpt2.cu: the largest e with amax * 2^e <= 1.75 * 2^emax, at most FP8_SCALE_EXPONENT_CAP;
    s = 1 when amax is 0 or not finite."""
    mantissa, exponent = torch.frexp(amax)  # amax = (2 * mantissa) * 2^(exponent - 1)
    e = emax - (exponent - 1) - (2 * mantissa > 1.75).to(exponent.dtype)
    e = e.clamp(max=FP8_SCALE_EXPONENT_CAP)
    e = torch.where((amax > 0) & torch.isfinite(amax), e, torch.zeros_like(e))
    return ((e + 127) << 23).view(torch.float32)  # the float32 bits of 2^e: exact


def fp8_cast(x, dtype, emax):
    """(fp8(x * s), 1/s): x in float8 `dtype`, rounded to nearest even, with its scale's inverse
    (the product's dequantisation scale). x * s and q / s are exact: s is a power of two."""
    s = fp8_scale(x.abs().amax().float(), emax)
    return (x.float() * s).to(dtype), s.reciprocal()


def scaled_mm(a, b, inv_a, inv_b, out_dtype, bias=None, fast_accum=False):
    """a @ b on FP8 operands (a row-major, b column-major) dequantised by inv_a * inv_b, FP32
    accumulation; fast_accum skips cuBLASLt's promotions into FP32 (the CUDA trainer's forward and
    input-gradient products, whose sums run over channels)."""
    out = torch._scaled_mm(a, b, scale_a=inv_a, scale_b=inv_b, bias=bias, out_dtype=out_dtype,
                           use_fast_accum=fast_accum)
    return out[0] if isinstance(out, tuple) else out  # PyTorch before 2.5 also returned the amax


def column_major(t):
    return t.t().contiguous().t()


class Fp8LinearFunction(torch.autograd.Function):
    """y = x @ w^T + b with FP8 products; x, w, b in BF16. The backward pass reuses the forward's
    FP8 input and weight, as the CUDA trainer does."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        x2 = x.reshape(-1, x.size(-1)).contiguous()  # _scaled_mm's first operand is row-major
        xq, x_inv = fp8_cast(x2, torch.float8_e4m3fn, FP8_E4M3_EMAX)
        wq, w_inv = fp8_cast(weight, torch.float8_e4m3fn, FP8_E4M3_EMAX)
        ctx.save_for_backward(xq, x_inv, wq, w_inv)
        y = scaled_mm(xq, wq.t(), x_inv, w_inv, torch.bfloat16, bias, fast_accum=True)
        return y.view(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, dy):
        xq, x_inv, wq, w_inv = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.size(-1)).contiguous()
        dyq, dy_inv = fp8_cast(dy2, torch.float8_e5m2, FP8_E5M2_EMAX)
        dx = scaled_mm(dyq, column_major(wq), dy_inv, w_inv, torch.bfloat16, fast_accum=True)
        # BF16, as the CUDA trainer's weight gradients (and autocast's BF16 linear layers): FP32
        # sums rounded once.
        dweight = scaled_mm(dyq.t().contiguous(), column_major(xq), dy_inv, x_inv, torch.bfloat16)
        dbias = dy2.float().sum(0).to(torch.bfloat16)
        return dx.view(*dy.shape[:-1], wq.size(1)), dweight, dbias


class Fp8Linear(nn.Linear):
    """nn.Linear (the same parameters, in float32) whose product is Fp8LinearFunction on the
    parameters and the input rounded to BF16, the values the CUDA trainer casts from."""

    def forward(self, x):
        bf16 = torch.bfloat16
        return Fp8LinearFunction.apply(x.to(bf16), self.weight.to(bf16), self.bias.to(bf16))


class CausalSelfAttention(nn.Module):
    def __init__(self, config, flash, linear):
        super().__init__()
        self.c_attn = linear(config.channels, 3 * config.channels)  # q, k, v stacked as [3C, C]
        self.c_proj = linear(config.channels, config.channels)
        self.num_heads = config.num_heads
        self.flash = flash

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2) for t in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config, linear):
        super().__init__()
        self.c_fc = linear(config.channels, 4 * config.channels)
        self.c_proj = linear(4 * config.channels, config.channels)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config, flash, linear):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.channels)
        self.attn = CausalSelfAttention(config, flash, linear)
        self.ln_2 = nn.LayerNorm(config.channels)
        self.mlp = MLP(config, linear)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config, flash=False, fp8=False):
        """fp8: the blocks' linear layers are Fp8Linear (a CUDA GPU of compute capability 8.9+)."""
        super().__init__()
        self.config = config
        linear = Fp8Linear if fp8 else nn.Linear
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.padded_vocab_size, config.channels),
            wpe=nn.Embedding(config.max_seq_len, config.channels),
            h=nn.ModuleList([Block(config, flash, linear) for _ in range(config.num_layers)]),
            ln_f=nn.LayerNorm(config.channels),
        ))
        self.lm_head = nn.Linear(config.channels, config.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def final_hidden(self, idx):
        """The blocks' output after the final layernorm, [B, T, C]: the classifier's input."""
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def forward(self, idx, targets=None):
        """Returns the logits over the real vocabulary, [B, T, vocab_size], and the mean loss."""
        # The padded columns are dropped before the loss, so padded wte rows get zero gradient.
        logits = self.lm_head(self.final_hidden(idx))[:, :, :self.config.vocab_size]
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def padded_vocab_loss(self, idx, targets):
        """The benchmark's loss, as nanoGPT computes it: cross-entropy over all padded_vocab_size
        logits, which are neither sliced nor returned, so the compiled graph keeps no logits beyond
        what its backward needs. The padded columns' logits are 0 while their wte rows are (at
        initialisation), so this is the reference loss with padded_vocab_size - vocab_size zero
        logits added to each softmax."""
        logits = self.lm_head(self.final_hidden(idx))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


BLOCK_PARAMS = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]


def params_in_file_order(model):
    """The parameters in llmc/gpt2.h param_table() order (the checkpoint layout): each table
    entry in turn, the per-layer entries layer by layer."""
    t = model.transformer
    stacked = [block.get_parameter(name) for name in BLOCK_PARAMS for block in t.h]
    return [t.wte.weight, t.wpe.weight] + stacked + [t.ln_f.weight, t.ln_f.bias]


def init_weights(model, seed):
    """SPEC.md "Model initialisation from a seed". The C++ trainers reproduce these weights bit
    for bit, so the draw order (one normal_ call per tensor, on the CPU) is part of the contract."""
    config, t = model.config, model.transformer
    projection_std = 0.02 / math.sqrt(2 * config.num_layers)
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
            if isinstance(module, (nn.LayerNorm, nn.Linear)) and module.bias is not None:
                module.bias.zero_()
        t.wte.weight.normal_(0.0, 0.02)
        t.wte.weight[config.vocab_size:].zero_()
        t.wpe.weight.normal_(0.0, 0.02)
        for block in t.h:
            block.attn.c_attn.weight.normal_(0.0, 0.02)
            block.attn.c_proj.weight.normal_(0.0, projection_std)
            block.mlp.c_fc.weight.normal_(0.0, 0.02)
            block.mlp.c_proj.weight.normal_(0.0, projection_std)


# ------------------------------------------------------------------------------------------------
# Checkpoints (llm.c format)


def header_checksum_start(header):
    """The CRC-32 of a checksummed header with its checksum slot read as 0: where the file's starts."""
    start = header.copy()
    start[HEADER_CHECKSUM_KIND_SLOT] = CHECKSUM_CRC32
    start[HEADER_CHECKSUM_SLOT] = 0
    return zlib.crc32(start.tobytes())


def write_checkpoint(model, path, version):
    """Writes FP32 (version 3) or BF16 (version 5, rounded to nearest even) parameters, with a
    checksum."""
    c = model.config
    header = np.zeros(HEADER_INTS, np.int32)
    header[:8] = [CHECKPOINT_MAGIC, version, c.max_seq_len, c.vocab_size, c.num_layers,
                  c.num_heads, c.channels, c.padded_vocab_size]
    header[HEADER_CHECKSUM_KIND_SLOT] = CHECKSUM_CRC32
    crc = header_checksum_start(header)
    partial = path + ".partial"  # a crash mid-write must not leave a plausible-looking checkpoint
    with open(partial, "wb") as f:
        f.write(header.tobytes())  # again at the end, with the checksum
        for p in params_in_file_order(model):
            values = p.detach().float().cpu()
            if version == CHECKPOINT_BF16:
                # PyTorch's float -> bfloat16 conversion rounds to nearest even.
                values = values.to(torch.bfloat16).view(torch.int16)
            payload = values.numpy().tobytes()
            crc = zlib.crc32(payload, crc)
            f.write(payload)
        header[HEADER_CHECKSUM_SLOT] = np.array([crc], np.uint32).view(np.int32)[0]
        f.seek(0)
        f.write(header.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def read_checkpoint(path, flash=False, fp8=False):
    """Returns a CPU model holding the parameters of a version 3 or 5 checkpoint."""
    if not os.path.isfile(path):
        fail(f"--init_from {path}: no such file; check the path")
    header = np.fromfile(path, np.int32, HEADER_INTS)
    if header.size < HEADER_INTS:
        fail(f"{path}: too short for a checkpoint header ({os.path.getsize(path)} bytes); re-create it")
    magic, version, max_seq_len, vocab_size, num_layers, num_heads, channels, padded = header[:8].tolist()
    if magic != CHECKPOINT_MAGIC:
        fail(f"{path}: not a GPT-2 checkpoint (magic {magic}, expected {CHECKPOINT_MAGIC})")
    # The checksum before the rest of the header: a damaged header is a damaged file, by name.
    checksum_kind = int(header[HEADER_CHECKSUM_KIND_SLOT])
    if checksum_kind not in (CHECKSUM_NONE, CHECKSUM_CRC32):
        fail(f"{path}: unknown checksum kind {checksum_kind} in header slot {HEADER_CHECKSUM_KIND_SLOT} "
             f"(0 none, {CHECKSUM_CRC32} CRC-32): the header is damaged or the file comes from a newer "
             f"version; re-create it")
    payload = np.fromfile(path, np.uint8, offset=HEADER_INTS * 4)
    if checksum_kind == CHECKSUM_CRC32:  # files without one (llm.c's) load unchecked
        stored = int(header[HEADER_CHECKSUM_SLOT]) & 0xFFFFFFFF
        computed = zlib.crc32(payload, header_checksum_start(header))
        if stored != computed:
            fail(f"{path}: checksum mismatch (CRC-32 {stored:08x} in the header, {computed:08x} "
                 f"computed): the file is damaged; re-create it, or use an earlier checkpoint")
    if version not in (CHECKPOINT_FP32, CHECKPOINT_BF16):
        fail(f"{path}: unsupported checkpoint version {version} "
             f"(expected {CHECKPOINT_FP32} for FP32 or {CHECKPOINT_BF16} for BF16)")
    config = make_config(num_layers, num_heads, channels, max_seq_len, vocab_size, source=path)
    if padded != config.padded_vocab_size:
        fail(f"{path}: padded vocab size {padded} does not match vocab {vocab_size} padded to a "
             f"multiple of {VOCAB_PAD_MULTIPLE} ({config.padded_vocab_size})")
    bytes_per_value = 4 if version == CHECKPOINT_FP32 else 2
    expected = HEADER_INTS * 4 + config.num_parameters() * bytes_per_value
    actual = os.path.getsize(path)
    if actual != expected:
        fail(f"{path}: checkpoint for L={num_layers} NH={num_heads} C={channels} maxT={max_seq_len} "
             f"V={vocab_size} should be {expected} bytes but is {actual} "
             f"({'truncated' if actual < expected else 'trailing data'}); re-create it")
    raw = payload.view(np.float32 if version == CHECKPOINT_FP32 else np.int16)
    values = torch.from_numpy(raw)
    if version == CHECKPOINT_BF16:
        values = values.view(torch.bfloat16).float()
    model = GPT(config, flash, fp8)
    offset = 0
    with torch.no_grad():
        for p in params_in_file_order(model):
            p.copy_(values[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    return model


# ------------------------------------------------------------------------------------------------
# Random numbers and data order (dev/SPEC.md, llmc/rand.h, llmc/dataloader.h)


class MT19937:
    """The standard 32-bit Mersenne Twister, seeded by init_genrand as torch.manual_seed seeds
    PyTorch's CPU generator."""
    N, M = 624, 397

    def __init__(self, seed):
        state = [seed & 0xFFFFFFFF]
        for i in range(1, self.N):
            state.append((1812433253 * (state[-1] ^ (state[-1] >> 30)) + i) & 0xFFFFFFFF)
        self.state, self.index = state, self.N

    def _twist(self):
        s = self.state
        for i in range(self.N):
            y = (s[i] & 0x80000000) | (s[(i + 1) % self.N] & 0x7FFFFFFF)
            s[i] = s[(i + self.M) % self.N] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        self.index = 0

    def u32(self):
        if self.index == self.N:
            self._twist()
        y = self.state[self.index]
        self.index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)

    def permutation(self, n):
        """Fisher-Yates from the top: for i = n-1 down to 1, swap a[i] with a[u32() % (i+1)]."""
        a = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.u32() % (i + 1)
            a[i], a[j] = a[j], a[i]
        return a


def mt19937_self_check():
    first = MT19937(5489).u32()
    if first != 3499211612:
        fail(f"MT19937 self-check failed: seed 5489 gave {first}, expected 3499211612")


class ShardLoader:
    """Batches from token shards in SPEC.md "Data order": shards in a per-epoch order, batches of
    each shard in a per-shard order, both shuffled by one MT19937 shared by all ranks."""

    def __init__(self, pattern, flag, B, T, rank, world, shuffle, seed, vocab_size):
        self.paths = sorted(glob.glob(pattern))
        if not self.paths:
            fail(f"{flag} {pattern}: no files match; check the pattern (quote it so the shell "
                 f"does not expand it) or prepare the data first")
        self.B, self.T, self.rank, self.world = B, T, rank, world
        self.shuffle, self.vocab_size = shuffle, vocab_size
        self.num_batches = [self._num_batches(path) for path in self.paths]
        self.rng = MT19937(seed)
        self.loaded_index, self.tokens = None, None
        self.reset()

    def _num_batches(self, path):
        header = np.fromfile(path, np.int32, HEADER_INTS)
        if header.size < HEADER_INTS or header[0] != SHARD_MAGIC:
            fail(f"{path}: not a token shard (expected magic {SHARD_MAGIC} in a "
                 f"{HEADER_INTS * 4}-byte header); re-create it with the data tools")
        if header[1] != SHARD_VERSION:
            fail(f"{path}: unsupported shard version {header[1]} (expected {SHARD_VERSION})")
        count, size = int(header[2]), os.path.getsize(path)
        if size != HEADER_INTS * 4 + 2 * count:
            fail(f"{path}: header says {count} tokens, so the file should be "
                 f"{HEADER_INTS * 4 + 2 * count} bytes, but it is {size}; re-create it")
        num_batches = (count - 1) // (self.world * self.B * self.T)
        if num_batches < 1:
            fail(f"{path}: {count} tokens are too few for one batch of B*T*world = "
                 f"{self.B}*{self.T}*{self.world} (+1) tokens; use a smaller -b/-t or a larger shard")
        return num_batches

    def reset(self):
        """Starts an epoch: a new shard order (the identity without shuffle), then the first
        batch of its first shard."""
        n = len(self.paths)
        self.shard_order = self.rng.permutation(n) if self.shuffle else list(range(n))
        self.shard_position = 0
        self._open_shard()

    def _open_shard(self):
        index = self.shard_order[self.shard_position]
        if index != self.loaded_index:
            path = self.paths[index]
            self.tokens = np.fromfile(path, np.uint16, offset=HEADER_INTS * 4)
            largest = int(self.tokens.max())
            if largest >= self.vocab_size:
                fail(f"{path}: token id {largest} is not below the vocab size {self.vocab_size}; "
                     f"the shard was made for another tokenizer")
            self.loaded_index = index
        n = self.num_batches[index]
        self.batch_order = self.rng.permutation(n) if self.shuffle else list(range(n))
        self.batch_position = 0

    def next_batch(self):
        """Returns (inputs, targets) of this rank, each a [B, T] int64 CPU tensor."""
        if self.batch_position == len(self.batch_order):
            self.shard_position += 1
            if self.shard_position == len(self.shard_order):
                self.reset()
            else:
                self._open_shard()
        chunk = self.B * self.T
        offset = (self.batch_order[self.batch_position] * self.world + self.rank) * chunk
        self.batch_position += 1
        window = torch.from_numpy(self.tokens[offset:offset + chunk + 1].astype(np.int64))
        return window[:-1].view(self.B, self.T), window[1:].view(self.B, self.T)


class RandomTokens:
    """One batch of uniform random tokens from a seeded generator, returned by every call."""

    def __init__(self, B, T, vocab_size, seed):
        generator = torch.Generator().manual_seed(seed)
        window = torch.randint(0, vocab_size, (B, T + 1), generator=generator)
        self.batch = (window[:, :-1].contiguous(), window[:, 1:].contiguous())

    def next_batch(self):
        return self.batch


# ------------------------------------------------------------------------------------------------
# Optimisation


def learning_rate(step, args):
    """The learning rate of step `step` (0-based) of N = num_iterations, with W = warmup_iters,
    lr = learning_rate and min_lr = lr * final_lr_frac:
      step < W:     lr * (step + 1) / W                        (every schedule)
      otherwise, with f = max(0, (step - S) / (N - S)):
        cosine:     min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * f)),      S = W
        linear:     lr - (lr - min_lr) * f,                                S = W
        wsd:        lr - (lr - min_lr) * f,  S = max(W, N - N // 5)  (stable, then the last 20% decay)
        constant:   lr
    """
    lr, W, N = args.learning_rate, args.warmup_iters, args.num_iterations
    if step < W:
        return lr * (step + 1) / W
    if args.lr_schedule == "constant":
        return lr
    min_lr = lr * args.final_lr_frac
    start = max(W, N - N // 5) if args.lr_schedule == "wsd" else W
    f = max(0.0, (step - start) / (N - start))
    if args.lr_schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * f))
    return lr - (lr - min_lr) * f


def clip_gradients(params, grad_clip):
    """SPEC.md clipping: returns the global norm; scales by clip / (norm + 1e-6) when norm > clip."""
    return torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))


def adamw_step(params, moments, t, lr, weight_decay):
    """SPEC.md AdamW written out in float32, op by op as the spec writes it (t counts from 1).
    Scalar coefficients are computed in double and rounded to float32 once."""
    with torch.no_grad():
        for p, (m, v) in zip(params, moments):
            g = p.grad
            m.copy_(ADAMW_BETA1 * m + (1 - ADAMW_BETA1) * g)
            v.copy_(ADAMW_BETA2 * v + (1 - ADAMW_BETA2) * g * g)
            mhat = m / (1 - ADAMW_BETA1 ** t)
            vhat = v / (1 - ADAMW_BETA2 ** t)
            decay = weight_decay if p.dim() == 2 else 0.0
            p.sub_(lr * (mhat / (vhat.sqrt() + ADAMW_EPS) + decay * p))


def make_optimizer(model, args, device_type, tensor_lr=False):
    """torch AdamW: the same update as adamw_step (decoupled decay lr*wd*p, bias-corrected m and v,
    eps added to sqrt(vhat)), fused on CUDA where this PyTorch has it. tensor_lr keeps the learning
    rate in a device tensor, so a compiled step does not recompile when the rate changes."""
    params = params_in_file_order(model)
    groups = [{"params": [p for p in params if p.dim() == 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}]
    fused = device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    extra = {"fused": True} if fused else {}
    lr = torch.tensor(args.learning_rate, device=device_type) if tensor_lr else args.learning_rate
    return torch.optim.AdamW(groups, lr=lr, betas=(ADAMW_BETA1, ADAMW_BETA2), eps=ADAMW_EPS, **extra), fused


# ------------------------------------------------------------------------------------------------
# Debug state


def write_debug_state(model, batch, args, device, out_dir):
    """Writes the initial model and the debug state of llmc/gpt2.h: x, y, logits, loss and every
    gradient of the first step, then the losses of debug_steps AdamW steps on the same batch at a
    constant learning rate (the first loss is the one before any update).

    The debug state is float32, the reference the C++ builds are checked against, except with
    --fp8 1 (gpt2_<name>_fp8_debug_state.bin): float32 has no FP8 products to compare with, so
    that one is the FP8 recipe itself, bfloat16 autocast with FP8 block linear layers as the CUDA
    trainer's -fp8 1 runs, and its loss curve is what test_gpt2cu --fp8 compares."""
    name = model.config.name()
    kind = "_fp8" if args.fp8 else ""
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if args.fp8 else nullcontext()
    os.makedirs(out_dir, exist_ok=True)
    write_checkpoint(model, os.path.join(out_dir, f"gpt2_{name}.bin"), CHECKPOINT_FP32)
    write_checkpoint(model, os.path.join(out_dir, f"gpt2_{name}_bf16.bin"), CHECKPOINT_BF16)
    model.to(device)
    x, y = (t.to(device) for t in batch)
    params = params_in_file_order(model)
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    losses = []
    for step in range(args.debug_steps):
        with autocast:
            logits, loss = model(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        if step == 0:
            first = [logits.detach().cpu(), loss.detach().cpu()] + [p.grad.detach().cpu().clone() for p in params]
        losses.append(loss.item())
        print(f"debug step {step + 1}/{args.debug_steps} | loss {losses[-1]:.6f}")
        clip_gradients(params, args.grad_clip)
        adamw_step(params, moments, step + 1, args.learning_rate, args.weight_decay)

    B, T = x.shape
    header = np.zeros(HEADER_INTS, np.int32)
    header[:6] = [DEBUG_STATE_MAGIC, DEBUG_STATE_VERSION, B, T, args.debug_steps, model.config.vocab_size]
    hyper = [args.learning_rate, ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS, args.weight_decay, args.grad_clip]
    header[6:12] = np.array(hyper, np.float32).view(np.int32)
    path = os.path.join(out_dir, f"gpt2_{name}{kind}_debug_state.bin")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in batch:
            f.write(t.numpy().astype(np.int32).tobytes())
        for t in first:
            f.write(t.float().numpy().tobytes())
        f.write(np.array(losses, np.float32).tobytes())
    print(f"wrote {out_dir}/gpt2_{name}.bin, gpt2_{name}_bf16.bin and gpt2_{name}{kind}_debug_state.bin")


# ------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch GPT-2 reference: debug states for the C++ "
                                "tests, training on token shards, and a benchmark (see dev/SPEC.md).")
    a = p.add_argument_group("model")
    a.add_argument("--model", choices=sorted(PRESETS), help="preset shape (llmc/gpt2.h); default d12")
    a.add_argument("--num_layers", type=int, help="override the preset's number of layers")
    a.add_argument("--num_heads", type=int, help="override the preset's number of heads")
    a.add_argument("--channels", type=int, help="override the preset's channels")
    a.add_argument("--max_seq_len", type=int, help="override the preset's max sequence length")
    a.add_argument("--vocab_size", type=int, help="override the preset's vocabulary size")
    a.add_argument("--init_from", help="start from this llm.c checkpoint (FP32 or BF16)")
    a.add_argument("--seed", type=int, default=42, help="seed of the init, random tokens and shuffling")
    a = p.add_argument_group("data")
    a.add_argument("--input_bin", help="glob of training token shards")
    a.add_argument("--input_val_bin", help="glob of validation token shards")
    a.add_argument("-b", "--batch_size", type=int, default=4, help="micro batch size per process")
    a.add_argument("-t", "--seq_len", type=int, default=64, help="sequence length")
    a.add_argument("--total_batch_size", type=int, default=-1,
                   help="tokens per step; -1 = B*T*world (grad accumulation = total / (B*T*world))")
    a.add_argument("--shuffle", type=int, choices=[0, 1], default=1, help="shuffle the training data")
    a = p.add_argument_group("optimisation")
    a.add_argument("--learning_rate", type=float, default=1e-4, help="peak learning rate")
    a.add_argument("--warmup_iters", type=int, default=0, help="linear warmup steps")
    a.add_argument("--final_lr_frac", type=float, default=0.0, help="final lr as a fraction of the peak")
    a.add_argument("--lr_schedule", choices=["cosine", "linear", "constant", "wsd"], default="cosine")
    a.add_argument("--weight_decay", type=float, default=0.1, help="AdamW decay of the 2-D matrices")
    a.add_argument("--grad_clip", type=float, default=1.0, help="global gradient norm clip; 0 = off")
    a.add_argument("--num_iterations", type=int, default=10, help="optimizer steps")
    a.add_argument("--val_every", type=int, default=0, help="validate every N steps and at the end; 0 = never")
    a.add_argument("--val_steps", type=int, default=20, help="batches per validation")
    a = p.add_argument_group("execution")
    a.add_argument("--device", help="cpu, cuda or cuda:N; default cuda when available")
    a.add_argument("--dtype", choices=["float32", "bfloat16"], help="bfloat16 = bf16 autocast; "
                   "default float32 (bfloat16 in benchmark mode)")
    a.add_argument("--compile", type=int, choices=[0, 1], help="torch.compile (default 1 in benchmark mode)")
    a.add_argument("--fp8", type=int, choices=[0, 1], default=0, help="1: the blocks' linear layers in FP8 "
                   "with torch._scaled_mm, the CUDA trainer's -fp8 1 (bfloat16; CUDA, compute capability 8.9+)")
    a.add_argument("--flash", type=int, choices=[0, 1], help="F.scaled_dot_product_attention "
                   "(default 1 in benchmark mode)")
    a.add_argument("--sdpa_backend", choices=sorted(SDPA_BACKENDS), help="the one kernel family "
                   "F.scaled_dot_product_attention may use with --flash 1 (default: PyTorch picks; "
                   f"{BENCHMARK_RECIPE['sdpa_backend']} in benchmark mode)")
    a.add_argument("--compile_mode", choices=COMPILE_MODES, help="torch.compile mode (default: "
                   f"default; {BENCHMARK_RECIPE['compile_mode']} in benchmark mode)")
    a.add_argument("--compile_optimizer", type=int, choices=[0, 1], help="benchmark mode: compile the "
                   f"clipping and AdamW step into one graph (default {BENCHMARK_RECIPE['compile_optimizer']})")
    a.add_argument("--output_dir", help="write main.log and the final checkpoint here")
    a.add_argument("--checkpoint_dtype", choices=["float32", "bfloat16"], default="float32")
    a = p.add_argument_group("modes")
    a.add_argument("--write_debug_state", metavar="DIR", help="write the initial model and the debug "
                   "state of llmc/gpt2.h to DIR and exit")
    a.add_argument("--debug_steps", type=int, default=10, help="AdamW steps recorded in the debug state")
    a.add_argument("--benchmark", "--bench", type=int, nargs="?", const=1, default=0, choices=[0, 1],
                   help="time training steps on random tokens")
    a.add_argument("--peak_flops", type=float, default=989e12, help="peak FLOP/s for MFU (H100 dense BF16)")
    return p.parse_args(argv)


def check_args(args):
    """Rejects flag combinations that cannot work, before any work is done."""
    if args.write_debug_state and args.benchmark:
        fail("--write_debug_state and --benchmark are separate modes; give one")
    if not (args.write_debug_state or args.benchmark or args.input_bin):
        fail("nothing to do: give --input_bin PATTERN to train, --write_debug_state DIR, or --benchmark 1")
    if args.benchmark and args.input_bin:
        fail("--benchmark trains on random tokens; drop --input_bin")
    if args.write_debug_state and args.dtype == "bfloat16" and not args.fp8:
        fail("--write_debug_state computes in float32; drop --dtype bfloat16")
    if args.fp8 and args.dtype == "float32":
        fail("--fp8 1 runs under bfloat16 autocast, as the CUDA trainer's BF16 build; drop --dtype float32")
    if args.fp8 and args.batch_size * args.seq_len % FP8_DIM_MULTIPLE != 0:
        fail(f"--fp8 1 needs B*T = {args.batch_size}*{args.seq_len} to be a multiple of {FP8_DIM_MULTIPLE} "
             f"(torch._scaled_mm's dimensions); change -b/-t")
    for flag, value in [("-b/--batch_size", args.batch_size), ("-t/--seq_len", args.seq_len),
                        ("--num_iterations", args.num_iterations), ("--val_steps", args.val_steps),
                        ("--debug_steps", args.debug_steps)]:
        if value <= 0:
            fail(f"{flag} must be positive, not {value}")
    if args.compile_optimizer is not None and not args.benchmark:
        fail("--compile_optimizer applies to --benchmark 1 only; drop it")
    if args.warmup_iters < 0 or not 0.0 <= args.final_lr_frac <= 1.0:
        fail("--warmup_iters must be >= 0 and --final_lr_frac within [0, 1]")


def resolve_config(args):
    """The model shape from --model and the size flags (None when --init_from supplies it)."""
    overrides = [args.num_layers, args.num_heads, args.channels, args.max_seq_len, args.vocab_size]
    if args.init_from:
        if args.model or any(v is not None for v in overrides):
            fail("--init_from takes the model shape from the checkpoint; drop --model and the size flags")
        return None
    shape = [v if v is not None else base for v, base in zip(overrides, PRESETS[args.model or "d12"])]
    return make_config(*shape, source="--model/--num_layers/--num_heads/--channels/--max_seq_len/--vocab_size")


def check_fp8(config, device):
    """--fp8 1 needs torch._scaled_mm and the float8 dtypes, a CUDA GPU of compute capability 8.9+
    and channels that are a multiple of FP8_DIM_MULTIPLE."""
    if not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")):
        fail(f"--fp8 1 needs PyTorch 2.1 or newer (torch._scaled_mm, torch.float8_e4m3fn); this is "
             f"{torch.__version__}: upgrade PyTorch or use --fp8 0")
    if not device.startswith("cuda"):
        fail(f"--fp8 1 needs a CUDA device (torch._scaled_mm); --device is {device}: use --device cuda or --fp8 0")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        fail(f"--fp8 1 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); "
             f"{torch.cuda.get_device_name(device)} is {major}.{minor}: use --fp8 0")
    if config.channels % FP8_DIM_MULTIPLE != 0:
        fail(f"--fp8 1 needs channels {config.channels} to be a multiple of {FP8_DIM_MULTIPLE} "
             f"(torch._scaled_mm's dimensions); use --fp8 0")


def feature_flag(args, name, available, requirement):
    """A 0/1 flag that defaults to on in benchmark mode where this PyTorch supports it."""
    value = getattr(args, name)
    if value is None:
        return bool(args.benchmark and available)
    if value and not available:
        fail(f"--{name} 1 needs {requirement}; use --{name} 0")
    return bool(value)


def setup_processes(args):
    """Returns (device, rank, world). Processes started by torchrun find RANK, WORLD_SIZE and
    LOCAL_RANK in their environment and join one data-parallel group."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device {device}: this PyTorch sees no CUDA device; use --device cpu")
    # float32 means float32: reference numbers must not come from TF32 matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if "RANK" not in os.environ:
        return device, 0, 1
    if args.write_debug_state:
        fail("--write_debug_state runs in one process; run it without torchrun")
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda"):
        device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"
        torch.cuda.set_device(device)
    return device, dist.get_rank(), dist.get_world_size()


def mean_over_ranks(value, world):
    if world > 1:
        dist.all_reduce(value)
        value /= world
    return value.item()


def evaluate(model, loader, steps, device, autocast, world):
    loader.reset()
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for _ in range(steps):
            x, y = (t.to(device) for t in loader.next_batch())
            with autocast:
                total += model(x, y)[1].float() / steps
    return mean_over_ranks(total, world)


def step_line(step, N, loss, norm, lr, ms, tokens_per_step, flops_per_token, peak_flops):
    """SPEC.md's per-step line, for step `step` (0-based) that took ms milliseconds."""
    tokens_per_s = 1000 * tokens_per_step / ms
    return (f"step {step + 1:4d}/{N} | loss {loss:.6f} | norm {norm:.4f} | lr {lr:.3e} | {ms:.2f} ms | "
            f"MFU {100.0 * flops_per_token * tokens_per_s / peak_flops:.1f}% | {tokens_per_s:.0f} tok/s")


def log_average_and_peak_memory(log, step_ms, tokens_per_step, flops_per_token, peak_flops, cuda):
    """The closing lines of a run (SPEC.md): the average step after the untimed warm-up steps, and
    the peak memory (the GPU's allocations, or the process's resident set on the CPU)."""
    N = len(step_ms)
    skip = min(WARMUP_STEPS_UNTIMED, N - 1)
    average_ms = sum(step_ms[skip:]) / (N - skip)
    tokens_per_s = 1000 * tokens_per_step / average_ms
    log(f"average over steps {skip + 1}-{N}: {average_ms:.2f} ms | "
        f"MFU {100.0 * flops_per_token * tokens_per_s / peak_flops:.1f}% | {tokens_per_s:.0f} tok/s")
    if cuda:
        peak_mib = torch.cuda.max_memory_allocated() // 2**20
    else:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # Linux reports KiB
    log(f"peak memory: {peak_mib} MiB")


def train(args, model, train_loader, val_loader, device, rank, world, dtype, use_compile):
    """Runs num_iterations optimizer steps, printing the SPEC.md line per step; validates at step 0,
    every val_every steps and at the end; writes main.log and the final checkpoint to output_dir."""
    config, (B, T), N = model.config, (args.batch_size, args.seq_len), args.num_iterations
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    tokens_per_micro_step = B * T * world
    total_batch_size = tokens_per_micro_step if args.total_batch_size == -1 else args.total_batch_size
    if total_batch_size <= 0 or total_batch_size % tokens_per_micro_step != 0:
        fail(f"--total_batch_size {total_batch_size} is not a positive multiple of B*T*world = "
             f"{B}*{T}*{world} = {tokens_per_micro_step}; pick a multiple or change -b/-t")
    grad_accum_steps = total_batch_size // tokens_per_micro_step
    raw_model = model.to(device)
    optimizer, fused = make_optimizer(raw_model, args, device_type)
    if use_compile:
        model = torch.compile(model, mode=None if args.compile_mode in (None, "default") else args.compile_mode)
    if world > 1:
        model = DistributedDataParallel(model, device_ids=[device] if device_type == "cuda" else None)
    autocast = torch.autocast(device_type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    num_params = config.num_parameters()
    flops_per_token = config.flops_per_token(T)
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    settings = dict(vars(args), model=config.name(), device=device, dtype=dtype, compile=use_compile,
                    flash=raw_model.transformer.h[0].attn.flash, fused_adamw=fused, world=world,
                    grad_accum_steps=grad_accum_steps, total_batch_size=total_batch_size,
                    num_parameters=num_params, torch=torch.__version__)
    for key in sorted(settings):
        log(f"{key:20s} {settings[key]}")
    log_file = None
    if args.output_dir and master:
        os.makedirs(args.output_dir, exist_ok=True)
        log_file = open(os.path.join(args.output_dir, "main.log"), "w")

    step_times = []
    for step in range(N + 1):
        if val_loader and args.val_every > 0 and (step % args.val_every == 0 or step == N):
            val_loss = evaluate(model, val_loader, args.val_steps, device, autocast, world)
            log(f"step {step:4d}/{N} | val loss {val_loss:.6f}")
            if log_file:
                log_file.write(f"step={step} kind=val loss={val_loss:.6f}\n")
                log_file.flush()
        if step == N:
            break
        t0 = time.perf_counter()
        lr = learning_rate(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        train_loss = torch.zeros((), device=device)
        for micro_step in range(grad_accum_steps):
            x, y = (t.to(device) for t in train_loader.next_batch())
            # DDP all-reduces the gradients in the last micro step's backward only.
            sync = world == 1 or micro_step == grad_accum_steps - 1
            with nullcontext() if sync else model.no_sync():
                with autocast:
                    loss = model(x, y)[1] / grad_accum_steps
                train_loss += loss.detach().float()
                loss.backward()
        norm = clip_gradients(raw_model.parameters(), args.grad_clip)
        optimizer.step()
        train_loss = mean_over_ranks(train_loss, world)
        if device_type == "cuda":
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        tokens_per_s = total_batch_size / step_times[-1]
        log(step_line(step, N, train_loss, norm.item(), lr, 1000 * step_times[-1], total_batch_size,
                      flops_per_token, args.peak_flops))
        if log_file:
            # The run-log format of llmc/logger.h, so both trainers' logs plot and compare alike.
            log_file.write(f"step={step + 1} kind=train loss={train_loss:.6f} norm={norm.item():.4f} "
                           f"lr={lr:.4e} ms={1000 * step_times[-1]:.2f} tok_per_s={tokens_per_s:.0f}\n")
            log_file.flush()

    log_average_and_peak_memory(log, [1000 * t for t in step_times], total_batch_size, flops_per_token,
                                args.peak_flops, device_type == "cuda")
    if log_file:
        log_file.close()
        path = os.path.join(args.output_dir, f"model_{N:08d}.bin")
        write_checkpoint(raw_model, path, CHECKPOINT_BF16 if args.checkpoint_dtype == "bfloat16" else CHECKPOINT_FP32)
        log(f"wrote {path}")


def select_sdpa_backend(name, device):
    """Leaves only the named kernel family on for F.scaled_dot_product_attention. These are global
    switches, which torch.compile's traces follow as eager calls do."""
    if name == "auto":
        return
    if not device.startswith("cuda") or not hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        fail(f"--sdpa_backend {name} needs a CUDA device and PyTorch 2.2 or newer; use --sdpa_backend auto")
    switches = torch.backends.cuda
    switches.enable_flash_sdp(name == "flash")
    switches.enable_cudnn_sdp(name == "cudnn")
    switches.enable_mem_efficient_sdp(name == "efficient")
    switches.enable_math_sdp(False)


def benchmark(args, model, batch, device, dtype, use_compile, compile_optimizer, log=print, step_hook=None):
    """Times num_iterations training steps on one batch of random tokens as a strong PyTorch user
    runs them: the batch is copied to the device once; forward and loss are one compiled graph
    (padded_vocab_loss: no logits sliced or returned); fused AdamW, optionally compiled with the
    clipping; nothing waits for the GPU inside the timed steps (CUDA events time them, and the
    losses are read after the last step). Prints the per-step lines of SPEC.md, the average and the
    peak memory; returns the per-step (loss, norm) as floats. step_hook, when given, is called after
    each step's work is queued (a profiler's step())."""
    config, (B, T), N = model.config, (args.batch_size, args.seq_len), args.num_iterations
    cuda = device.startswith("cuda")
    total_batch_size = B * T if args.total_batch_size == -1 else args.total_batch_size
    if total_batch_size <= 0 or total_batch_size % (B * T) != 0:
        fail(f"--total_batch_size {total_batch_size} is not a positive multiple of B*T = {B}*{T}; "
             f"pick a multiple or change -b/-t")
    grad_accum_steps = total_batch_size // (B * T)
    if cuda:
        torch.set_float32_matmul_precision("high")  # what a benchmark user sets; bf16 products are unaffected
    model.to(device)
    optimizer, fused = make_optimizer(model, args, "cuda" if cuda else "cpu", tensor_lr=compile_optimizer)
    x, y = (t.to(device) for t in batch)
    loss_fn = model.padded_vocab_loss
    mode = args.compile_mode or BENCHMARK_RECIPE["compile_mode"]
    if use_compile:
        loss_fn = torch.compile(loss_fn, mode=None if mode == "default" else mode)

    def clip_and_step():
        norm = clip_gradients(model.parameters(), args.grad_clip)
        optimizer.step()
        return norm

    if compile_optimizer:
        clip_and_step = torch.compile(clip_and_step)

    def update(lr):
        for group in optimizer.param_groups:
            if torch.is_tensor(group["lr"]):  # a compiled step reads it from the device
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        return clip_and_step()

    autocast = torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    flops_per_token = config.flops_per_token(T)
    sdpa = args.sdpa_backend or BENCHMARK_RECIPE["sdpa_backend"]
    recipe = (f"torch {torch.__version__} | torch.compile {mode if use_compile else 'off'} | "
              f"SDPA {sdpa if model.transformer.h[0].attn.flash else 'off'} | {dtype}"
              f"{' with FP8 block linear layers (torch._scaled_mm)' if args.fp8 else ''} | "
              f"AdamW{' fused' if fused else ''}{', compiled with clipping' if compile_optimizer else ''} | "
              f"loss over the padded vocabulary ({config.padded_vocab_size})")
    log(f"peer recipe: {recipe}")

    uses_cudagraphs = use_compile and mode in ("reduce-overhead", "max-autotune")
    marks, results, clock = [], [], []
    for step in range(N):
        if uses_cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        clock.append(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=device)
        for _ in range(grad_accum_steps):
            with autocast:
                loss = loss_fn(x, y) / grad_accum_steps
            loss_sum += loss.detach().float()
            loss.backward()
        norm = update(learning_rate(step, args))
        results.append((loss_sum, norm.detach().clone()))
        if step_hook:
            step_hook()
    if cuda:
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()
        torch.cuda.synchronize()
        step_ms = [start.elapsed_time(end) for start, end in zip(marks, marks[1:])]
    else:
        clock.append(time.perf_counter())
        step_ms = [1000 * (end - start) for start, end in zip(clock, clock[1:])]

    losses = [(loss.item(), norm.item()) for loss, norm in results]
    for step, ((loss, norm), ms) in enumerate(zip(losses, step_ms)):
        log(step_line(step, N, loss, norm, learning_rate(step, args), ms, total_batch_size, flops_per_token,
                      args.peak_flops))
    log_average_and_peak_memory(log, step_ms, total_batch_size, flops_per_token, args.peak_flops, cuda)
    return losses


def main(argv=None, step_hook=None):
    """Runs the mode the flags name; in benchmark mode returns its per-step (loss, norm)."""
    args = parse_args(argv)
    mt19937_self_check()
    check_args(args)
    config = resolve_config(args)
    flash = feature_flag(args, "flash", hasattr(F, "scaled_dot_product_attention"),
                         "PyTorch 2.0 or newer (F.scaled_dot_product_attention)")
    use_compile = feature_flag(args, "compile", hasattr(torch, "compile"), "PyTorch 2.0 or newer (torch.compile)")
    dtype = args.dtype or ("bfloat16" if args.benchmark or args.fp8 else "float32")
    device, rank, world = setup_processes(args)
    if args.benchmark and world > 1:
        fail("--benchmark times one process; run it without torchrun")
    if flash:
        select_sdpa_backend(args.sdpa_backend or (BENCHMARK_RECIPE["sdpa_backend"] if args.benchmark else "auto"), device)
    if config is None:
        model = read_checkpoint(args.init_from, flash, args.fp8)
        config = model.config
    else:
        model = GPT(config, flash, args.fp8)
        init_weights(model, args.seed)
    B, T = args.batch_size, args.seq_len
    if T > config.max_seq_len:
        fail(f"-t/--seq_len {T} exceeds the model's max_seq_len {config.max_seq_len}; lower -t")
    if args.fp8:
        check_fp8(config, device)
    train_loader = RandomTokens(B, T, config.vocab_size, args.seed)
    if args.input_bin:
        train_loader = ShardLoader(args.input_bin, "--input_bin", B, T, rank, world, args.shuffle,
                                   args.seed, config.vocab_size)
    if args.write_debug_state:
        write_debug_state(model, train_loader.next_batch(), args, device, args.write_debug_state)
        return
    if args.benchmark:
        compile_optimizer = use_compile and bool(BENCHMARK_RECIPE["compile_optimizer"]
                                                 if args.compile_optimizer is None else args.compile_optimizer)
        return benchmark(args, model, train_loader.next_batch(), device, dtype, use_compile, compile_optimizer,
                         step_hook=step_hook)
    val_loader = None
    if args.input_val_bin:
        val_loader = ShardLoader(args.input_val_bin, "--input_val_bin", B, T, rank, world, 0,
                                 args.seed, config.vocab_size)
    train(args, model, train_loader, val_loader, device, rank, world, dtype, use_compile)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
