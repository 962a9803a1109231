"""
The PyTorch GPT-2 reference: the model, llm.c checkpoints, the debug state the C++ tests compare
against, training on token shards, and a benchmark. Formats and algorithms follow dev/SPEC.md; the
parameter order follows param_table() in llmc/gpt2.h. Beside GPT-2 with AdamW: the modern
architecture (--arch modern), Muon (--optimizer muon), modded-nanogpt's baseline recipe
(--recipe modern, SPEC.md "The modern architecture and recipe") and its speedrun record #28
(--recipe speedrun, SPEC.md "The speedrun architecture and recipe").

  python3 train_gpt2.py --model tiny --write_debug_state OUT -b 4 -t 64 --debug_steps 10 --seed 42
  python3 train_gpt2.py --model d12 --input_bin "data/train_*.bin" --input_val_bin "data/val_*.bin" \
      -b 16 -t 1024 --total_batch_size 524288 --learning_rate 6e-4 --warmup_iters 700 \
      --num_iterations 10000 --val_every 250 --dtype bfloat16 --output_dir out
  python3 train_gpt2.py --bench -b 16 -t 1024 --num_iterations 20 [--fp8 1]
  python3 train_gpt2.py --recipe modern --model d12 --input_bin "data/train_*.bin" \
      --input_val_bin "data/val_*.bin" --num_iterations 3250 --val_every 125 --dtype bfloat16 --compile 1 --flash 1
  torchrun --nproc_per_node 8 train_gpt2.py ...        (data parallel over 8 GPUs)

Runs on PyTorch 1.13 (CPU) and 2.x (CUDA); torch.compile, F.scaled_dot_product_attention and fused
AdamW are used only where this PyTorch has them. --fp8 1 (the CUDA trainer's FP8 linear layers)
and --fp8_head 1 (the speedrun head's FP8 products) need PyTorch 2.1+ and a GPU of compute
capability 8.9+.
"""
import argparse
import collections
import glob
import inspect
import math
import os
import re
import resource
import sys
import time
import zlib
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cached_property, partial

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
# The modern architecture's files (modern.md in dev/SPEC.md): versions 6 (FP32) and 7 (BF16), with
# the architecture id in header slot 8 (0 GPT-2, as llm.c's files have it, 1 modern).
MODERN_CHECKPOINT_VERSION = {CHECKPOINT_FP32: 6, CHECKPOINT_BF16: 7}
ARCH_SLOT, ARCH_IDS = 8, {"gpt2": 0, "modern": 1, "speedrun": 2}
# Record #89's features in header slot 9, as bits (0 in files written before): the speedrun's smear, bigram
# embedding, value-embedding gates, residual lambdas, XSA and plan, and the modern and speedrun models' rotary
# pairs.
FEATURES_SLOT, FEATURE_SMEAR, FEATURE_BIGRAM = 9, 1, 2
FEATURE_ROTARY_PAIRS = 4  # the modern and speedrun models' rotary in record #89's layout (--rotary_pairs)
FEATURE_VE_GATES = 8  # the speedrun's value-embedding gates (--ve_gates)
FEATURE_RESID_LAMBDAS = 16  # the speedrun's residual and post lambdas (--resid_lambdas)
FEATURE_XSA = 32  # the speedrun's exclusive self-attention (--xsa)
FEATURE_RECORD89_PLAN = 64  # the speedrun's 11-layer plan (--record89_plan)
FEATURE_PAIRED_HEADS = 128  # that plan's paired heads (--paired_heads)
FEATURE_ATTN_LAMBDAS = 256  # the speedrun's attention lambdas (--attn_lambdas)
FEATURE_MUDD_GATES = 512  # that plan's MUDD gate generators (--mudd_gates)
FEATURE_MUDD_CONNECTIONS = 1024  # that plan's MUDD dense connections (--mudd_connections)
FEATURE_COMPOSED_ATTENTION = 2048  # that plan's composed attention on layer 10 (--composed_attention)
# The checksum in the last two header slots (llmc/file_header.h): the kind (0 none, 1 CRC-32) and
# the CRC-32 of the whole file read with the checksum slot as 0; zlib.crc32 computes the same value.
HEADER_CHECKSUM_KIND_SLOT, HEADER_CHECKSUM_SLOT = 254, 255
CHECKSUM_NONE, CHECKSUM_CRC32 = 0, 1
DEBUG_STATE_MAGIC, DEBUG_STATE_VERSION, DEBUG_STATE_VERSION_MODERN = 20240327, 3, 4
DEBUG_STATE_VERSION_SETTINGS = 5  # version 4's header, then the loss's settings (debug_state_settings)
# Version 5's layout with, between the gradients and the step losses, the first step's gradients at the
# BF16 model file's weights of every tensor of at most DEBUG_BF16_WEIGHTS_MAX_SIZE entries
# (gradients_at_bf16_weights).
DEBUG_STATE_VERSION_BF16_WEIGHTS = 6
DEBUG_BF16_WEIGHTS_MAX_SIZE = 8192
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
# The modern architecture's presets: head size 128 (64 for d48, as 128 does not divide 1600).
MODERN_PRESETS = {
    "d12": (12, 6, 768, 1024, 50257),
    "d24": (24, 8, 1024, 1024, 50257),
    "d36": (36, 10, 1280, 1024, 50257),
    "d48": (48, 25, 1600, 1024, 50257),
    "tiny": (2, 1, 128, 64, 50257),
}
# The speedrun architecture's: its reference's 12 layers (the layer plan's lists, SPEEDRUN_ATTENTION
# and those after it), d12 with maxT its validation's 262,144-token sequences; tiny keeps the 12
# layers at 2 heads of 64.
SPEEDRUN_PRESETS = {
    "d12": (12, 6, 768, 262144, 50257),
    "tiny": (12, 2, 128, 1024, 50257),
}
SPEEDRUN_GATE_DIVISOR = 64  # the attention gate reads the first C/64 channels of the block's input
SMEAR_WIDTH = 12  # record #89's smear gate reads the first 12 channels of each token's embedding
# Record #89's value-embedding gates read the first 6 channels of the attention's normed input and of
# the layer's value embedding (llmc::kVeGateInputs): 12 weights a head.
VE_GATE_INPUTS = 6
XSA_MIN_SQUARES = 1e-8  # record #89's XSA clamps each head's |v|^2 to at least this (llmc's kXsaMinSquares)
# Record #89's bigram hash embedding (llmc/bigram_hash.h): the hash's factors, the sign table's rows,
# and our pinned sign table's seed (the reference draws it unseeded); the gates' start (the
# reference's bias of its generated gates).
BIGRAM_HASH_CURRENT, BIGRAM_HASH_PREVIOUS, BIGRAM_SIGN_ROWS, BIGRAM_SIGN_SEED = 36313, 27191, 8192, 89
BIGRAM_GATE_INIT = 0.05
# Record #89's residual lambdas' start (llmc/gpt2.h kResidLambdaInit), so that a layer's two sublayers
# scale the stream by 1.1 (the post lambdas start at 1).
RESID_LAMBDA_INIT = 1.1 ** 0.5
# Record #89's gated skip's start, sigmoid(skip_lambda) g: its scalars' skip_lambda and its generated
# gate's bias (llmc's kSkipLambdaInit, kSkipGateInit); its x0 gates start at 0.
SKIP_LAMBDA_INIT, SKIP_GATE_INIT = -1.5, 0.5
HEAD_GATE_INIT = 0.25  # record #89's head gates' start, their generated gates' bias (llmc's kHeadGateInit)
ATTN_LAMBDA_INIT = (0.5, 1.0)  # record #89's attention lambdas' start, qkv's and the output projection's
# Record #89's MUDD gate generators (--mudd_gates 1; llmc/gpt2.h's kMudd*): two of them, "pre" reading x0 and
# "post" reading the stream entering layer MUDD_POST_LAYER, each rows = (gelu(x W1^T) W2[:n]^T + b2[:n]) x scale
# with a hidden width of MUDD_GATE_HIDDEN; W2 and b2 hold MUDD_GATE_COLUMNS rows, the pre generator reads the
# first MUDD_PRE_COLUMNS. A head's gates take MUDD_HEAD_SLOTS columns (the reference's 6 heads; fewer heads
# read the first NH). b2 starts in units before the scale (0.1): a gate's start over 0.1.
MUDD_GATE_HIDDEN, MUDD_GATE_COLUMNS, MUDD_PRE_COLUMNS, MUDD_HEAD_SLOTS = 64, 41, 26, 6
MUDD_POST_LAYER, MUDD_GATE_SCALE_INIT = 4, 0.1
# Each gate's (generator, first column) by (kind, layer): XSA strengths, head gates, x0 and bigram gates, the
# skip's g; a gate not here stays its learned scalar (layer 10's x0 and bigram gates).
MUDD_GATE_COLUMNS_OF = {("xsa", 1): (0, 0), ("xsa", 3): (0, 6), ("head", 3): (0, 12),
                        ("xsa", 4): (1, 0), ("xsa", 7): (1, 6), ("head", 10): (1, 12), ("skip", 6): (1, 28)}
MUDD_GATE_COLUMNS_OF.update({(kind, layer): (0, 18 + 2 * layer + second)
                             for layer in range(4) for second, kind in enumerate(("x0", "bigram"))})
MUDD_GATE_COLUMNS_OF.update({(kind, layer): (1, 18 + 2 * k + second) for k, layer in enumerate((4, 5, 7, 8, 9))
                             for second, kind in enumerate(("x0", "bigram"))})
# Record #89's MUDD dense connections (--mudd_connections 1; llmc/gpt2.h's kMuddConnection*): two generators of
# the gate generators' form, (gelu(x W1^T) W2[:n]^T + b2[:n]) x MUDD_SCALE (fixed), hidden width MUDD_HIDDEN.
# The first reads the last layer's input and gives its MUDD_LAYER_COEFFICIENTS per token (mudd_layer_terms):
# v += m0 in0 + m1 out7 + m2 x, x <- (1 + m5) x + m3 in0 + m4 out7, heads' value-embedding gates m6 (the first
# half) and m7, the attention's add m8 x + m9 attn + m10 in0 (+ m11 b), the MLP's m12 x + m13 mlp. The second
# reads the last layer's output and gives MUDD_FINAL_COEFFICIENTS: x += m0 in0 + m1 out7 + m2 out9 + m3 ve0 +
# m4 out3 (in0 the stream entering layer 0, outK layer K's output, ve0 the value-embedding lookup of layer 1).
MUDD_HIDDEN, MUDD_LAYER_COEFFICIENTS, MUDD_FINAL_COEFFICIENTS, MUDD_SCALE = 64, 14, 5, 0.1
# b2's start (before the scale): the layer's ve gates 2, its lambdas r sqrt(1.1) and p 1, its bigram gate 0.05
# (its x0 gate 0), and the final mix's out7 coefficient -0.5, each over the scale.
MUDD_BIAS_INIT = [((0, 6), 2.0), ((0, 7), 2.0), ((0, 8), 1.1 ** 0.5), ((0, 9), 1.0), ((0, 11), 0.05),
                  ((0, 12), 1.1 ** 0.5), ((0, 13), 1.0), ((1, 1), -0.5)]
# b2's start a column (before the scale): the head gates 0.25, the bigram gates 0.05, the skip's g 0.5 and the
# composed attention's w_in (layer 10's, read with --composed_attention) 1.0, over the scale; the rest 0.
MUDD_GATE_BIAS_INIT = [((0, 12, 18), 2.5), ((0, 19, 26, 2), 0.5), ((1, 12, 18), 2.5), ((1, 19, 28, 2), 0.5),
                       ((1, 28, 29), 5.0), ((1, 29, 35), 10.0)]
# Record #89's composed attention (--composed_attention 1; llmc/gpt2.h's kComposed*), on layer COMPOSED_LAYER of
# its plan: each head's output plus w_out_h (A v_h), A = sum_h w_in_h P_h mixing the heads' attention
# probabilities P_h over the last COMPOSED_WINDOW keys of the query's document (their own softmax), w_in the
# RMS norm over the heads (eps COMPOSED_NORM_EPS) of the post generator's columns from COMPOSED_IN_COLUMN, w_out
# its columns from COMPOSED_OUT_COLUMN (MUDD_HEAD_SLOTS each; fewer heads read the first NH).
COMPOSED_LAYER, COMPOSED_WINDOW, COMPOSED_NORM_EPS = 10, 112, 1e-6
COMPOSED_IN_COLUMN, COMPOSED_OUT_COLUMN = 29, 35
SPEEDRUN_SOFTCAP, SPEEDRUN_SOFTCAP_SCALE = 30.0, 7.5
ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS = 0.9, 0.95, 1e-8
RMS_NORM_EPS = 2.0 ** -23  # FLT_EPSILON: F.rms_norm's default, float32's even for bfloat16 inputs
ATTENTION_SCALE_MODERN = 0.12
# Record #89's YaRN (yarn_rescale): the interpolation's bounds in rotations over the old window, the scale's slope.
YARN_ALPHA, YARN_BETA, YARN_SCALE_SLOPE = 1, 32, 0.2
LOGIT_SOFTCAP_MODERN = 15.0
# Muon's orthogonalisation in bfloat16 (--muon_ns): X <- X / (scale |X|_F + eps), then a step
# X <- a X + (b A + c A A) X, A = X X^T, for each (a, b, c) of its polynomials. The baseline's (modern.md:
# 12 steps of one polynomial), the speedrun's (record #28: 5 of a steeper one) and Polar Express (record
# #89: each step the polynomial best for the singular values the steps before leave, after a norm 2%
# larger). llmc/recipe.h's kNewtonSchulzMethods holds the same rows in this order; the debug state's
# header names one by its place.
@dataclass(frozen=True)
class NewtonSchulz:
    polynomials: tuple
    scale: float = 1.0
    eps: float = 1e-7

    def describe(self):
        first = self.polynomials[0]
        each = all(p == first for p in self.polynomials)
        text = f"{len(self.polynomials)} steps of {first if each else 'a polynomial each'}"
        return text + ("" if (self.scale, self.eps) == (1.0, 1e-7) else f" from X / ({self.scale} |X| + {self.eps})")


NEWTON_SCHULZ = {
    "baseline": NewtonSchulz(((2.0, -1.5, 0.5),) * 12),
    "speedrun": NewtonSchulz(((3.4445, -4.7750, 2.0315),) * 5),
    "polar": NewtonSchulz(((8.156554524902461, -22.48329292557795, 15.878769915207462),
                           (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                           (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                           (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                           (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)), 1.02, 1e-6),
}
# Record #89's model switches that --recipe record89 turns on, of a model made from a preset.
RECORD89_SWITCHES = ("smear", "bigram", "rotary_pairs", "ve_gates", "resid_lambdas", "xsa", "record89_plan",
                     "paired_heads", "attn_lambdas", "mudd_gates", "composed_attention", "mudd_connections")
# Record #89's AdamW rows (--recipe record89's --adam_rows; llmc/recipe.h record89_adam_rows): for each
# tensor of ours, the lr_mul and wd_mul of its reference's tensor (train_gpt.py's param_table) over Adam's
# rate and decay, and its betas. scalars are our attn_lambdas, smear_lambda and skip_gate.
RECORD89_ADAM_RATE, RECORD89_ADAM_DECAY = 0.008, 0.005
RECORD89_ADAM_TABLE = {
    "wte": (1.0, 150.0, 0.5, 0.95), "headw": (1.0, 150.0, 0.5, 0.95), "ve": (75.0, 5.0, 0.75, 0.95),
    "bigram": (75.0, 5.0, 0.75, 0.95), "smearw": (0.01, 0.0, 0.9, 0.99), "smear_lambda": (5.0, 0.0, 0.9, 0.99),
    "vegate": (1.0, 1.0, 0.9, 0.99), "resid_lambdas": (5.0, 0.0, 0.9, 0.95), "post_lambdas": (1.0, 0.0, 0.9, 0.95),
    "skip_gate": (5.0, 0.0, 0.9, 0.99), "attn_lambdas": (5.0, 0.0, 0.9, 0.99), "mudd_gate_w1": (0.1, 1.0, 0.9, 0.99),
    "mudd_gate_w2": (0.1, 1.0, 0.9, 0.99), "mudd_gate_b2": (0.1, 0.0, 0.9, 0.99),
    "mudd_gate_scale": (0.1, 0.0, 0.9, 0.99), "mudd_w1": (0.25, 1.0, 0.9, 0.99), "mudd_w2": (0.25, 1.0, 0.9, 0.99),
    "mudd_b2": (0.25, 0.0, 0.9, 0.99),
}


def number_text(x):
    """x as "%g" writes it where that reads back as x, else as repr (llmc/recipe.h float_text's form)."""
    return f"{x:g}" if float(f"{x:g}") == x else repr(x)


# The reference's BF16 parameters (its Embedding and Linear modules' weights, value_embeds, ve_gate_bank
# and the MUDD tensors but the gates' scale): each step's weight rounded to nearest bfloat16, the
# moments float32, as its Adam state is for every tensor (--adam_rows' bf16=weight).
RECORD89_BF16_WEIGHTS = ("wte", "headw", "ve", "bigram", "smearw", "vegate", "mudd_gate_w1", "mudd_gate_w2",
                         "mudd_gate_b2", "mudd_w1", "mudd_w2", "mudd_b2")
# Each row's rate and decay the reference's products (in double, as there), in place of the role's.
RECORD89_ADAM_ROWS = ";".join(
    f"{name}:rate={number_text(RECORD89_ADAM_RATE * lr_mul)},b1={number_text(b1)},b2={number_text(b2)},"
    f"decay={number_text(RECORD89_ADAM_DECAY * wd_mul)}" + (",bf16=weight" if name in RECORD89_BF16_WEIGHTS else "")
    for name, (lr_mul, wd_mul, b1, b2) in RECORD89_ADAM_TABLE.items())
RECORD89_STAGES = ("1/3 t=16384 z=131072 cap=896 aw=1/3 lr=1 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; "
                   "1/3 t=32768 z=262144 cap=2048 aw=3/7 lr=1.52 mtp=1,0.5>1,0 pw=0.25>0; "
                   "1/3 t=49152 z=393216 aw=5/11 lr=1.73 mtp=1 pw=0; +15 aw=6/13")
# Every flag a recipe sets, a column per recipe of RECIPES: GPT-2's (also the value without --recipe),
# modern's (modern.md: modded-nanogpt's optimization-track baseline), speedrun's (SPEC.md:
# modded-nanogpt's speedrun record #28) and record89's (its record #89 but the FP8 MLP: the speedrun's
# with record #89's switches, the CUDA trainer's -recipe record89). A flag
# given on the command line overrides its column.
RECIPES = ("gpt2", "modern", "speedrun", "record89")
RECIPE_FLAGS = {
    "arch": ("gpt2", "modern", "speedrun", "speedrun"), "optimizer": ("adamw", "muon", "muon", "muon"),
    "loss_reduction": ("mean", "sum", "sum", "sum"), "learning_rate": (1e-4, 1e-4, 0.008, 0.008),
    "embedding_lr": (None, 0.7, 0.008 * 75, 0.008 * 75), "head_lr": (None, 0.004, 0.008, 0.008),
    "scalar_lr": (None, 0.015, 0.008 * 5, 0.008 * 5), "beta1": (ADAMW_BETA1, 0.8, 0.8, 0.8),
    "beta2": (ADAMW_BETA2, 0.95, 0.95, 0.95), "adam_eps": (ADAMW_EPS, 1e-10, 1e-10, 1e-10),
    "adam_eps_before_correction": (0, 0, 1, 1), "weight_decay": (0.1, 0.001, 0.0, 0.005),
    "cautious_decay": (0, 0, 0, 1), "grad_clip": (1.0, 0.0, 0.0, 0.0),
    "lr_schedule": ("cosine", "stable_decay", "stable_decay", "cooldown"), "cooldown_frac": (0.7, 0.7, 0.45, 0.6),
    "final_lr_frac": (0.0, 0.0, 0.1, 0.15), "num_iterations": (10, 10, 1695, 1270), "batch_size": (4, 64, 1, 1),
    "seq_len": (64, 1024, 49152, 49152), "total_batch_size": (-1, 524288, 8 * 49152, 8 * 49152),
    "documents": (0, 0, 1, 1), "window_blocks": (0, 0, -1, -1), "val_seq_len": (None, None, 4 * 65536, 4 * 65536),
    "val_steps": (20, 20, 40, 40), "val_every": (0, 0, 0, 250),
    "shuffle": (1, 1, 0, 0),  # the speedrun's reference reads its shards in name order
    "stages": ("", "", "", RECORD89_STAGES), "final_window_blocks": (0, 0, 0, 20), "window_tokens": (0, 0, 0, 1),
    "key_offset": (0, 0, 0, 1), "yarn": (0, 0, 0, 1), "mlp_from_output": (0, 0, 0, 1),
    "attention_scale": (None, None, None, 0.1),
    "untie_step": (-1, -1, -1, 847), "adam_every": (1, 1, 1, 2), "adam_rows": ("", "", "", RECORD89_ADAM_ROWS),
    "logit_cap": (None, None, None, "23,5,bf16"), "prefix_weight": (0.0, 0.0, 0.0, 0.25),
    "fp8_head_scales": (None, None, None, "100,1.6,0.75"), "record_init": (0, 0, 0, 89),
    # record #89's model switches (None: off, or --init_from's checkpoint's)
    **{key: (None, None, None, 1) for key in RECORD89_SWITCHES},
}
# Muon's flags, set with --optimizer muon only (GPT-2's column is what --optimizer muon gives GPT-2).
MUON_FLAGS = {
    "muon_lr": (0.025, 0.025, 0.05, 0.023), "muon_weight_decay": (0.05, 0.05, 0.0, 1.2),
    "muon_momentum": (0.95, 0.95, 0.95, 0.95), "muon_momentum_start": (0.85, 0.85, 0.85, 0.85),
    "muon_momentum_warmup": (0, 0, 300, 300), "muon_momentum_cooldown": (0, 0, 0, 50),
    "muon_ns": ("baseline", "baseline", "speedrun", "polar"), "normuon": (0, 0, 0, 1), "muon_qk_heads": (0, 0, 0, 2),
    # record #89's rates of the MLP's matrices over --muon_lr: its reference's shape scale 2 of both (it stores
    # them tall) and its x2 of the down projection, where ours are unscaled (muon_scale)
    "muon_tensor_lr": ("", "", "", "fcw=2,fcprojw=4"),
}
NORMUON_BETA2 = 0.9  # NorMuon's running mean of the update's squares (normuon_step)
ADAM_EVERY_MAX = 1000  # --adam_every's largest interval (the CUDA trainer's kMaxAdamEvery)
WARMUP_STEPS_UNTIMED = 3  # the first steps include compilation and autotuning; averages skip them
COMPILE_MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
SDPA_BACKENDS = {"auto": None, "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION"}
# The benchmark's defaults: the fastest PyTorch recipe measured on an H100
# (dev/notes/floors-and-versions.md, "v12: the PyTorch peer"), so the trainers are compared
# against the best PyTorch does.
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
# The training loss's terms (modded-nanogpt record #89's multi-token and prefix prediction)

MAX_PREDICTED_TOKENS = 3
TOKENIZER_MAGIC, TOKENIZER_HEADER_INTS, GPT2_EOT_TOKEN = 20240328, 256, 50256


def read_vocabulary(path, flag):
    """An llm.c vocabulary file (llmc/tokenizer.h): each token's bytes, and the end-of-text id."""
    if not os.path.isfile(path):
        fail(f"{flag} {path}: no such vocabulary file; dev/data/tinyshakespeare.sh makes one (gpt2_tokenizer.bin)")
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(TOKENIZER_HEADER_INTS * 4), "<i4")
        if len(header) < TOKENIZER_HEADER_INTS or header[0] != TOKENIZER_MAGIC or header[1] not in (1, 2):
            fail(f"{flag} {path}: not an llm.c vocabulary file (magic {TOKENIZER_MAGIC}, version 1 or 2)")
        tokens = []
        for _ in range(int(header[2])):
            length = f.read(1)
            tokens.append(f.read(length[0]) if length else b"")
        if not all(tokens) or f.read(1):
            fail(f"{flag} {path}: the tokens do not fill the file as its header says: the file is damaged")
    return tokens, int(header[3]) if header[1] == 2 else GPT2_EOT_TOKEN


def prefix_table(tokens, eot, rows):
    """Each token's prefix token, as record #89's build_prefix_table makes it from tiktoken's ranks
    (llmc/tokenizer.h's token_prefix_table): the id of the longest proper prefix of its bytes that is
    a token, -1 where none is, for `rows` ids (the padded rows -1). Sorted, a byte string comes after
    its prefixes and before its extensions, so a stack of the current one's prefixes that are tokens
    holds the longest on top. The end-of-text token has no bytes there: no prefix, and none."""
    table = [-1] * rows
    stack = []  # (bytes, id), shortest first
    for token, tid in sorted((b, i) for i, b in enumerate(tokens) if i != eot):
        while stack and not token.startswith(stack[-1][0]):
            stack.pop()
        if stack:
            table[tid] = stack[-1][1]
        stack.append((token, tid))
    return table


def parse_prediction_weights(text):
    """--mtp's value: 1 to 3 weights within [0, 1] apart by commas (llmc/flags.h's parse_prediction_weights)."""
    items = text.split(",")
    if len(items) > MAX_PREDICTED_TOKENS:
        fail(f"--mtp {text}: more than {MAX_PREDICTED_TOKENS} weights (the next token's and the "
             f"{MAX_PREDICTED_TOKENS - 1} after it)")
    weights = []
    for item in items:
        try:
            weight = float(np.float32(item))
        except ValueError:
            fail(f"--mtp '{item}': not a number")
        if not 0.0 <= weight <= 1.0:
            fail(f"--mtp {item}: must be within [0, 1]")
        weights.append(weight)
    return weights


@dataclass
class LossTerms:
    """The training loss's terms (the CUDA trainer's ClassifierTerms): position t's cross-entropy
    against target t + k times next_token_weights[k] where t + k is inside its sequence of T, and
    against prefix[target t] times prefix_weight where that is not -1 (prefix: prefix_table's, or
    None without the term)."""
    next_token_weights: list
    prefix_weight: float = 0.0
    prefix: torch.Tensor = None

    def loss(self, capped, targets, reduction):
        """The mean or the sum of the positions' losses; capped: [B, T, columns] float32 logits."""
        log_p = F.log_softmax(capped, dim=-1)
        T = targets.size(1)
        losses = torch.zeros(targets.shape, dtype=log_p.dtype, device=log_p.device)
        for k, weight in enumerate(self.next_token_weights[:T]):
            nll = -log_p[:, :T - k].gather(-1, targets[:, k:, None])[..., 0]
            losses[:, :T - k] += weight * nll
        if self.prefix is not None:
            prefix = self.prefix.to(targets.device)[targets]
            nll = -log_p.gather(-1, prefix.clamp(min=0)[..., None])[..., 0]
            losses += self.prefix_weight * torch.where(prefix >= 0, nll, torch.zeros_like(nll))
        return losses.sum() if reduction == "sum" else losses.mean()


class Bf16Sigmoid(torch.autograd.Function):
    """sigmoid(u) rounded to bfloat16 (in u's float32), its gradient s (1 - s) of the rounded s: record #89's
    loss kernel keeps the sigmoid so for its softmax and its dlogits alike."""

    @staticmethod
    def forward(ctx, u):
        s = torch.sigmoid(u).bfloat16().float()
        ctx.save_for_backward(s)
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return grad * s * (1 - s)


def set_logit_cap(model, text):
    """--logit_cap: the head's cap within [1, 40] and the sigmoid cap's shift within [-100, 100] ("23,5"), and a
    third item bf16 for the sigmoid rounded to bfloat16 ("23,5,bf16"), in place of the architecture's
    (llmc/recipe.h's logit_cap_of); None keeps the architecture's."""
    if text is None:
        return
    items = text.split(",")
    rounded = len(items) == 3
    if rounded and items[2] != "bf16":
        fail(f"--logit_cap {text}: the third item rounds the sigmoid to BF16 and can only be bf16 (e.g. 23,5,bf16)")
    try:
        values = [float(np.float32(item)) for item in items[:2]]
    except ValueError:
        fail(f"--logit_cap {text}: not a number, or two apart by a comma")
    if len(items) > 3 or not 1.0 <= values[0] <= 40.0 or (len(values) == 2 and not -100.0 <= values[1] <= 100.0):
        fail(f"--logit_cap {text}: the cap within [1, 40], and the sigmoid cap's shift within [-100, 100]")
    if not model.config.modern:
        fail(f"--logit_cap {text}: the {model.config.arch} architecture's logits are uncapped: leave --logit_cap out")
    if ((len(values) == 2 and values[1] != 0.0) or rounded) and not model.config.speedrun:
        fail(f"--logit_cap {text}: a shift and a BF16 sigmoid are the sigmoid cap's, and the {model.config.arch} "
             f"architecture's cap is the rational one: give --logit_cap {items[0]}")
    model.logit_cap = values[0]
    model.logit_shift = values[1] if len(values) == 2 else 0.0
    model.logit_bf16_sigmoid = rounded


def run_prefix_table(args, config, plan):
    """The prefix table of --tokenizer's vocabulary where --prefix_weight or a stage's pw= gives the
    prefix term a weight, else None."""
    if args.prefix_weight == 0.0 and not (plan and plan.has_prefix_term()):
        return None
    what = f"--prefix_weight {args.prefix_weight}" if args.prefix_weight > 0.0 else "--stages' pw="
    tokens, eot = read_vocabulary(args.tokenizer, "--tokenizer")
    if len(tokens) > config.vocab_size:
        fail(f"{what}: --tokenizer {args.tokenizer} holds {len(tokens)} tokens, more than the model's "
             f"{config.vocab_size}: give the model's vocabulary file")
    return torch.tensor(prefix_table(tokens, eot, config.padded_vocab_size), dtype=torch.int64)


def loss_terms(next_token_weights, prefix_weight, prefix):
    """The terms of these weights (--mtp's and --prefix_weight's, or a step's of the plan), the prefix
    table `prefix` where the prefix term has a weight; None for the next token's loss alone."""
    if list(next_token_weights) == [1.0] and prefix_weight == 0.0:
        return None
    return LossTerms(list(next_token_weights), prefix_weight, prefix if prefix_weight > 0.0 else None)


def set_step_loss_terms(model, step_plan):
    """The step's loss weights (StepPlan) into the model's terms, replaced only where they change, so
    that a compiled model is not traced again at every step of constant weights."""
    terms = model.loss_terms
    weights = ([1.0], 0.0) if terms is None else (terms.next_token_weights, terms.prefix_weight)
    if weights != (step_plan.next_token_weights, step_plan.prefix_weight):
        model.loss_terms = loss_terms(step_plan.next_token_weights, step_plan.prefix_weight, model.prefix_table)


# ------------------------------------------------------------------------------------------------
# Model

# The layer plan (llmc/gpt2.h's, whose kSpeedrun* lists are these). The speedrun reference's layers
# (modded-nanogpt record #28), one list a feature and one entry a layer:
#   attention: A attention and MLP, - the MLP alone (no ln_1, no attention tensors);
#   windows: with --window_blocks, all of it (L, long) or half of it rounded down (S, short), also
#     the other architectures' windows at this depth;
#   value embeddings: the ve[k] the layer's value mix adds;
#   skip sources: the earlier layer whose output the U-net adds to the layer's input;
#   XSA: X where record #89's exclusive self-attention runs (--xsa 1), its reference's layers 1, 3, 4
#     and 7 (layer 7 has no attention here, so none there).
#                            0     1     2     3     4     5     6     7     8     9     10    11
SPEEDRUN_ATTENTION =        "AAAAAAA-AAAA"
SPEEDRUN_WINDOWS =          "LSSSLSSLSSSL"
SPEEDRUN_VALUE_EMBEDDINGS = [0,    1,    2,    None, None, None, None, None, None, 0,    1,    2]
SPEEDRUN_SKIP_SOURCES =     [None, None, None, None, None, None, 5,    4,    3,    2,    1,    0]
SPEEDRUN_XSA =              "-X-XX--X----"
SPEEDRUN_LAYERS = len(SPEEDRUN_WINDOWS)  # its depth

# Record #89's plan (--record89_plan 1; llmc/gpt2.h's kRecord89* lists), the lists above and:
#   gated skips: the earlier layer whose output the layer adds, times sigmoid(skip_lambda) g, before its
#     MLP (its one layer without attention);
#   attention sources: the earlier layer whose output its attention reads (normed) instead of its input
#     (layer 8's input is layer 7's output: the reference's out7 for layers 8 to 10);
#   head gates: G where each head's attention output is scaled by its gate before the output projection.
# The windows' entry of the layer without attention is not read. No U-net skips.
#                            0     1     2     3     4     5     6     7     8     9     10
RECORD89_ATTENTION =        "AAAAAA-AAAA"
RECORD89_WINDOWS =          "SSSLSSSSSSL"
RECORD89_VALUE_EMBEDDINGS = [None, 0,    1,    None, None, None, None, None, 2,    3,    4]
RECORD89_GATED_SKIPS =      [None, None, None, None, None, None, 3,    None, None, None, None]
RECORD89_ATTENTION_SOURCES = [None, None, None, None, None, None, None, None, None, 7,   7]
RECORD89_XSA =              "-X-XX--X---"
RECORD89_HEAD_GATES =       "---G------G"
RECORD89_PAIRED =           "P-P--P---P-"  # its paired heads (--paired_heads 1; LayerSpec.paired)
RECORD89_LAYERS = len(RECORD89_WINDOWS)


@dataclass(frozen=True)
class LayerSpec:
    """What one layer does (None: none); the skip weights are numbered in layer order."""
    attention: bool
    window: str  # "L" or "S": its share of the run's window
    value_embedding: int = None  # the ve[k] its value mix adds
    skip_source: int = None  # the earlier layer whose output the U-net adds to its input
    skip_weight: int = None  # the skip_weights[j] it adds that output with
    xsa: bool = False  # record #89's exclusive self-attention runs here (with --xsa 1)
    gated_skip_source: int = None  # record #89's: the earlier layer whose output it adds with the skip gate
    attention_source: int = None  # record #89's: the earlier layer whose output its attention reads
    head_gate: bool = False  # record #89's: each head's output times its gate (head_gates)
    paired: bool = False  # record #89's paired heads (rotate's paired_heads, CausalSelfAttention.forward's views)


def layer_plan(arch, num_layers, record89_plan=False, paired_heads=False):
    """Every layer's LayerSpec: the speedrun's from its reference's lists, record #28's or with
    record89_plan record #89's (at their depth only); the other architectures attend in every layer,
    with record #28's windows at its depth and the long one at any other."""
    if arch != "speedrun":
        windows = SPEEDRUN_WINDOWS if num_layers == SPEEDRUN_LAYERS else "L" * num_layers
        return [LayerSpec(True, window) for window in windows]
    if record89_plan:
        assert num_layers == RECORD89_LAYERS, f"record #89's plan has its reference's {RECORD89_LAYERS} layers"
        return [LayerSpec(RECORD89_ATTENTION[layer] == "A", RECORD89_WINDOWS[layer], RECORD89_VALUE_EMBEDDINGS[layer],
                          xsa=RECORD89_ATTENTION[layer] == "A" and RECORD89_XSA[layer] == "X",
                          gated_skip_source=RECORD89_GATED_SKIPS[layer],
                          attention_source=RECORD89_ATTENTION_SOURCES[layer],
                          head_gate=RECORD89_ATTENTION[layer] == "A" and RECORD89_HEAD_GATES[layer] == "G",
                          paired=paired_heads and RECORD89_PAIRED[layer] == "P")
                for layer in range(num_layers)]
    assert num_layers == SPEEDRUN_LAYERS, f"the speedrun's layers are its reference's {SPEEDRUN_LAYERS}"
    skips = [layer for layer, source in enumerate(SPEEDRUN_SKIP_SOURCES) if source is not None]
    return [LayerSpec(SPEEDRUN_ATTENTION[layer] == "A", SPEEDRUN_WINDOWS[layer], SPEEDRUN_VALUE_EMBEDDINGS[layer],
                      SPEEDRUN_SKIP_SOURCES[layer], skips.index(layer) if layer in skips else None,
                      SPEEDRUN_ATTENTION[layer] == "A" and SPEEDRUN_XSA[layer] == "X")
            for layer in range(num_layers)]


@dataclass
class GPTConfig:
    num_layers: int
    num_heads: int
    channels: int
    max_seq_len: int
    vocab_size: int
    # "gpt2", "modern" (dev/SPEC.md "The modern architecture"): RMSNorm with gains (also after the
    # embedding), no position embedding, QK-norm and half-truncated rotary, attention scale 0.12,
    # ReLU^2, a separate head with a bias, logits soft-capped at 15; or "speedrun" (SPEC.md "The
    # speedrun architecture"): modern's blocks with weightless norms and no biases, wired as its
    # reference (x0 lambdas, U-net skips, value embeddings, gated heads, no attention in layer 7), a
    # head without bias whose logits are capped by a sigmoid, the loss over the padded vocabulary.
    arch: str = "gpt2"
    # speedrun: record #89's smear before the embedding's norm, its bigram hash embedding added to
    # the residual stream with gates (SPEC.md "Record #89's embedding"), and its value-embedding gates
    # (SPEC.md "The speedrun architecture")
    smear: bool = False
    bigram: bool = False
    # modern or speedrun: the rotary in record #89's layout (rotate's pairs)
    rotary_pairs: bool = False
    ve_gates: bool = False
    # speedrun: record #89's residual and post lambdas, each sublayer's add r x + p out (SPEC.md)
    resid_lambdas: bool = False
    xsa: bool = False  # speedrun: record #89's exclusive self-attention in the plan's XSA layers
    # speedrun: record #89's 11-layer plan (RECORD89_*), x0 added after each attention with a learned gate
    # in place of the x0 lambdas, no attention gates (SPEC.md)
    record89_plan: bool = False
    paired_heads: bool = False  # speedrun in record #89's plan: its paired heads (RECORD89_PAIRED; SPEC.md)
    attn_lambdas: bool = False  # speedrun: record #89's attention lambdas, the attention's weights scaled (SPEC.md)
    # speedrun in record #89's plan: its gates read per token from two MUDD gate generators (SPEC.md)
    mudd_gates: bool = False
    # speedrun in record #89's plan: its MUDD dense connections at the last layer and after it (SPEC.md)
    mudd_connections: bool = False
    # speedrun in record #89's plan with its MUDD gate generators: the composed attention on layer 10 (SPEC.md)
    composed_attention: bool = False

    @property
    def modern(self):
        """Both modern architectures: RMS norms, rotary, QK-norm, ReLU^2, a head of their own."""
        return self.arch in ("modern", "speedrun")

    @property
    def speedrun(self):
        return self.arch == "speedrun"

    @cached_property
    def plan(self):
        """What each layer does (layer_plan)."""
        return layer_plan(self.arch, self.num_layers, self.record89_plan, self.paired_heads)

    @property
    def x0_lambdas(self):
        """Record #28's mix of each block's input, lambdas[0] x + lambdas[1] x0 (the speedrun's but in
        record #89's plan)."""
        return self.speedrun and not self.record89_plan

    @property
    def attention_gate(self):
        """Record #28's gate of each head's output (the speedrun's but in record #89's plan)."""
        return self.x0_lambdas

    @cached_property
    def value_embeddings(self):
        """The value embeddings' tables, ve[k] for each k of the plan."""
        return 1 + max((spec.value_embedding for spec in self.plan if spec.value_embedding is not None), default=-1)

    @property
    def padded_vocab_size(self):
        return -(-self.vocab_size // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE

    @property
    def bigram_rows(self):
        """The bigram table's rows: 377,280 at 50,304 (bigram_table_rows)."""
        return self.padded_vocab_size * 15 // 2

    def shape(self):
        return (self.num_layers, self.num_heads, self.channels, self.max_seq_len, self.vocab_size)

    def num_parameters(self):
        """All parameters, wte (and the modern head) with padded_vocab_size rows (llmc/gpt2.h)."""
        C, L, Vp = self.channels, self.num_layers, self.padded_vocab_size
        if self.speedrun:
            gate = self.num_heads * (C // SPEEDRUN_GATE_DIVISOR) if self.attention_gate else 0
            attention = 4 * C * C + gate + (1 if self.record89_plan else 2)  # the value scales: (a, b) or (b)
            x0 = 2 if self.x0_lambdas else 0  # each layer's x0 lambdas
            layers = sum(x0 + 8 * C * C + (attention if spec.attention else 0) for spec in self.plan)
            skips = sum(spec.skip_weight is not None for spec in self.plan)
            smear = (SMEAR_WIDTH + 1) if self.smear else 0  # the gate's weights and lambda
            attention_layers = sum(spec.attention for spec in self.plan)
            bigram = self.bigram_rows * C + attention_layers if self.bigram else 0  # the table and its gates
            ve_layers = sum(spec.value_embedding is not None for spec in self.plan)
            ve_gates = ve_layers * self.num_heads * 2 * VE_GATE_INPUTS if self.ve_gates else 0
            sublayer_lambdas = 4 * L if self.resid_lambdas else 0  # r and p of both sublayers a layer
            xsa = sum(spec.xsa for spec in self.plan) * self.num_heads if self.xsa else 0
            x0_gates = attention_layers if self.record89_plan else 0
            skip_gate = 2 if any(spec.gated_skip_source is not None for spec in self.plan) else 0
            head_gates = sum(spec.head_gate for spec in self.plan) * self.num_heads
            attn_lambdas = 2 * L if self.attn_lambdas else 0  # (qkv's, the output projection's) a layer
            mudd = (MUDD_GATE_HIDDEN * C + MUDD_GATE_COLUMNS * (MUDD_GATE_HIDDEN + 1)) * 2 + 1 if self.mudd_gates else 0
            if self.mudd_connections:  # W1 [2, 64, C], W2 [2, 14, 64], b2 [2, 14]
                mudd += (MUDD_HIDDEN * C + MUDD_LAYER_COEFFICIENTS * (MUDD_HIDDEN + 1)) * 2
            return ((2 + self.value_embeddings) * Vp * C + skips + layers + smear + bigram + ve_gates
                    + sublayer_lambdas + xsa + x0_gates + skip_gate + head_gates + attn_lambdas + mudd)
        if self.modern:
            return 2 * Vp * C + Vp + 2 * C + L * (12 * C * C + 11 * C)
        return (Vp + self.max_seq_len) * C + L * (12 * C * C + 13 * C) + 2 * C

    def flops_per_token(self, T, keys=None):
        """SPEC.md's MFU count: 6*N + 12*C*K FLOPs per token, N = all parameters (padded vocabulary)
        less the embeddings that are lookups only (the modern one, not tied to the head; speedrun's
        value embeddings and bigram table too), K = `keys`, the keys a query attends to summed over the
        layers with attention (GPT.attention_keys); causal where not given (T/2 in each: GPT-2's
        6*L*C*T)."""
        if keys is None:
            keys = sum(T / 2 for spec in self.plan if spec.attention)
        lookups = (1 + self.value_embeddings) if self.speedrun else int(self.modern)
        lookup = (lookups * self.padded_vocab_size + (self.bigram_rows if self.bigram else 0)) * self.channels
        return 6 * (self.num_parameters() - lookup) + 12 * self.channels * keys

    def name(self):
        """The preset name when the shape is a preset's, else one spelling out the shape; the other
        architectures' names start with their own (modern_, speedrun_)."""
        presets = [name for name, shape in ARCH_PRESETS[self.arch].items() if shape == self.shape()]
        name = presets[0] if presets else "l{}h{}c{}t{}v{}".format(*self.shape())
        return name if self.arch == "gpt2" else f"{self.arch}_{name}"


ARCH_PRESETS = {"gpt2": PRESETS, "modern": MODERN_PRESETS, "speedrun": SPEEDRUN_PRESETS}


def make_config(num_layers, num_heads, channels, max_seq_len, vocab_size, source, arch="gpt2", smear=False,
                bigram=False, rotary_pairs=False, ve_gates=False, resid_lambdas=False, xsa=False,
                record89_plan=False, paired_heads=False, attn_lambdas=False, mudd_gates=False,
                mudd_connections=False, composed_attention=False):
    config = GPTConfig(int(num_layers), int(num_heads), int(channels), int(max_seq_len), int(vocab_size), arch,
                       bool(smear), bool(bigram), bool(rotary_pairs), bool(ve_gates), bool(resid_lambdas),
                       bool(xsa), bool(record89_plan), bool(paired_heads), bool(attn_lambdas), bool(mudd_gates),
                       bool(mudd_connections), bool(composed_attention))
    # Each feature with what it needs: the first one missing stops the run, naming both.
    for missing, problem in (
            (config.rotary_pairs and not config.modern,
             "the rotary pairs (record #89's) lay out the modern and speedrun rotary, and GPT-2 has none; "
             "give --recipe modern or speedrun or drop --rotary_pairs"),
            (config.smear and not config.speedrun,
             "the smear (record #89's) is the speedrun's; give --recipe speedrun or drop --smear"),
            (config.bigram and not config.speedrun,
             "the bigram embedding (record #89's) is the speedrun's; give --recipe speedrun or drop "
             "--bigram"),
            (config.ve_gates and not config.speedrun,
             "the value-embedding gates (record #89's) are the speedrun's; give --recipe speedrun or "
             "drop --ve_gates"),
            (config.resid_lambdas and not config.speedrun,
             "the residual lambdas (record #89's) are the speedrun's; give --recipe speedrun or drop "
             "--resid_lambdas"),
            (config.xsa and not config.speedrun,
             "XSA (record #89's) is the speedrun's; give --recipe speedrun or drop --xsa"),
            (config.record89_plan and not config.speedrun,
             "record #89's plan is the speedrun's; give --recipe speedrun or drop --record89_plan"),
            (config.attn_lambdas and not config.speedrun,
             "the attention lambdas (record #89's) are the speedrun's; give --recipe speedrun or drop "
             "--attn_lambdas"),
            (config.paired_heads and not (config.record89_plan and config.rotary_pairs),
             "record #89's paired heads pair the heads of its plan's layers, rotated in its rotary pairs; "
             "give --record89_plan 1 and --rotary_pairs 1 or drop --paired_heads"),
            (config.paired_heads and num_heads % 2 != 0,
             f"record #89's paired heads attend half the heads a position, and num_heads {num_heads} is "
             "odd; give an even --num_heads or drop --paired_heads"),
            (config.mudd_gates and not config.record89_plan,
             "the MUDD gate generators make record #89's plan's gates; give --recipe speedrun and "
             "--record89_plan 1 or drop --mudd_gates"),
            (config.mudd_connections and not config.record89_plan,
             "the MUDD dense connections join record #89's plan's layers; give --recipe speedrun and "
             "--record89_plan 1 or drop --mudd_connections"),
            (config.mudd_connections and num_heads % 2 != 0,
             "the MUDD dense connections gate the value embedding a half of the heads each, and "
             f"num_heads {num_heads} is odd; give an even --num_heads or drop --mudd_connections"),
            (config.composed_attention and not config.mudd_gates,
             "the composed attention reads its weights from the MUDD gate generators; give "
             "--mudd_gates 1 (with --recipe speedrun and --record89_plan 1) or drop --composed_attention"),
            (config.mudd_gates and num_heads > MUDD_HEAD_SLOTS,
             f"the MUDD gate generators hold {MUDD_HEAD_SLOTS} columns a layer's heads, and num_heads "
             f"{num_heads} is more; give at most {MUDD_HEAD_SLOTS} --num_heads or drop --mudd_gates"),
    ):
        if missing:
            fail(f"{source}: {problem}")
    if min(config.shape()) <= 0:
        fail(f"{source}: invalid model config L={num_layers} NH={num_heads} C={channels} "
             f"maxT={max_seq_len} V={vocab_size}: every value must be positive")
    if channels % num_heads != 0:
        fail(f"{source}: channels {channels} is not divisible by num_heads {num_heads}")
    if config.modern and (channels // num_heads) % 4 != 0:
        fail(f"{source}: head size {channels // num_heads} (C/NH) is not a multiple of 4, which the "
             f"modern architecture's rotary embedding needs; change --channels or --num_heads")
    depth, plan = (RECORD89_LAYERS, " (record #89's plan)") if config.record89_plan else (SPEEDRUN_LAYERS, "")
    if config.speedrun and num_layers != depth:
        fail(f"{source}: the speedrun architecture has its reference's {depth} layers{plan}, not {num_layers}; "
             f"drop --num_layers")
    if config.speedrun and channels < SPEEDRUN_GATE_DIVISOR:
        fail(f"{source}: the speedrun's attention gate reads C/{SPEEDRUN_GATE_DIVISOR} channels, so "
             f"channels {channels} must be at least {SPEEDRUN_GATE_DIVISOR}; raise --channels")
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


class CastLinear(nn.Linear):
    """nn.Linear whose float32 parameters are cast to the input's dtype: the modern model's
    bfloat16 activations (without autocast) take bfloat16 products, as modded-nanogpt's do."""

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x), None if self.bias is None else self.bias.type_as(x))


# The speedrun head's FP8 layer (--fp8_head 1): training products with fixed scales (train_gpt2.cu
# section 5, "FP8 with fixed scales"): x / x_s and w / w_s cast to E4M3, the output gradient / grad_s
# to E5M2; the output BF16 with fast accumulation, the input gradient BF16 and the weight gradient
# FP32, both without. The scales (--fp8_head_scales X,W,G, the CUDA trainer's -fhs) are values over
# 448: x_s = X/448 (0: sqrt(C)/448, as x is RMS-normed: |x| / x_s <= 448), w_s = W/448, grad_s = G/448;
# record #28's x_s = sqrt(C)/448, w_s = 2^-9, grad_s = 1/448 and record #89's 100, 1.6, 0.75.
FP8_HEAD_SCALES_RECORD28 = (0.0, 0.875, 1.0)


def parse_fp8_head_scales(text):
    """--fp8_head_scales' "X,W,G" as three floats (X 0 or more, W and G above 0), or fail."""
    try:
        scales = tuple(float(v) for v in text.split(","))
    except ValueError:
        scales = ()
    if len(scales) != 3 or not all(math.isfinite(v) for v in scales) or scales[0] < 0 or min(scales[1:]) <= 0:
        fail(f"--fp8_head_scales {text}: give three numbers apart by commas, X,W,G (x_s = X/448 with 0 for "
             "sqrt(C)/448, w_s = W/448, grad_s = G/448, W and G above 0), e.g. 100,1.6,0.75")
    return scales


def fp8_head_scale_values(setting, channels):
    """(x_s, w_s, grad_s) of the setting (X, W, G) for a head of `channels` inputs."""
    x, w, g = setting
    return (math.sqrt(channels) if x == 0 else x) / 448, w / 448, g / 448


def fp8_fixed_cast(x, s, dtype):
    """fp8(x / s) in float8 `dtype` as the compiled reference computes it: torch.compile lowers the
    division to a product with 1/s (rounded once to float32), in float32, rounded to nearest even;
    the CUDA trainer's casts give the same bits."""
    return (x.float() * (1.0 / s)).to(dtype)


class Fp8HeadFunction(torch.autograd.Function):
    """y = x @ w^T with the reference's mm_op and mm_backward_op: FP8 products under fixed scales."""

    @staticmethod
    def forward(ctx, x, weight, scales):
        x_s, w_s, _ = scales
        x2 = x.reshape(-1, x.size(-1)).contiguous()  # _scaled_mm's first operand is row-major
        xq = fp8_fixed_cast(x2, x_s, torch.float8_e4m3fn)
        wq = fp8_fixed_cast(weight, w_s, torch.float8_e4m3fn)
        ctx.save_for_backward(xq, wq)
        ctx.scales, ctx.x_dtype = scales, x.dtype
        scale = partial(torch.tensor, dtype=torch.float32, device=x.device)
        y = scaled_mm(xq, wq.t(), scale(x_s), scale(w_s), torch.bfloat16, fast_accum=True)
        return y.view(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, dy):
        xq, wq = ctx.saved_tensors
        scale = partial(torch.tensor, dtype=torch.float32, device=dy.device)
        x_s, w_s, grad_s = (scale(v) for v in ctx.scales)
        dyq = fp8_fixed_cast(dy.reshape(-1, dy.size(-1)).contiguous(), ctx.scales[2], torch.float8_e5m2)
        dx = scaled_mm(dyq, column_major(wq), grad_s, w_s, torch.bfloat16)
        dweight = scaled_mm(xq.t().contiguous(), column_major(dyq), x_s, grad_s, torch.float32).t()
        return dx.view(*dy.shape[:-1], xq.size(1)).to(ctx.x_dtype), dweight, None


class Fp8Head(CastLinear):
    """The speedrun's head (no bias) with --fp8_head 1: Fp8HeadFunction under the scales of `setting`
    (X, W, G) in a forward whose graph a backward pass will take (training), CastLinear's product where
    none will (validation, under torch.no_grad), as the reference evaluates its head."""

    setting = FP8_HEAD_SCALES_RECORD28

    def forward(self, x):
        if not torch.is_grad_enabled():
            return super().forward(x)
        return Fp8HeadFunction.apply(x, self.weight, fp8_head_scale_values(self.setting, x.size(-1)))


def rms_norm(x, weight=None):
    """x * rsqrt(mean(x^2) + FLT_EPSILON) * weight over the last axis, computed in float32 and
    returned in x's dtype. On CUDA, F.rms_norm (PyTorch 2.4+) where it exists: the same function,
    one fused kernel."""
    if x.is_cuda and hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.size(-1),), None if weight is None else weight.type_as(x), eps=RMS_NORM_EPS)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_NORM_EPS)
    return (y if weight is None else y * weight.float()).type_as(x)


class RMSNorm(nn.Module):
    """rms_norm with a gain vector, or weightless (gain=False: the speedrun's, no parameter)."""

    def __init__(self, channels, gain=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels)) if gain else None

    def forward(self, x):
        return rms_norm(x, self.weight)


def rotary_frequencies(head_size):
    """Half-truncated rotary: hs/4 angular frequencies (1/1024)^(j/(hs/4-1)), then hs/4 zeros."""
    freq = (1 / 1024) ** torch.linspace(0, 1, steps=head_size // 4, dtype=torch.float32)
    return torch.cat([freq, freq.new_zeros(head_size // 4)])


def rotate(x, freq, pairs=False, paired_heads=False):
    """x [B, T, NH, hs] with each pair (j, j + hs/2) rotated by t * freq[j] at position t, in float32;
    pairs: record #89's layout, each pair (2j, 2j + 1) at its place in the B x T tokens as one sequence
    (b T + t), its cos and sin rounded to bfloat16 as the reference's tables hold them (in every dtype).
    paired_heads (with pairs; record #89's paired tables): head h of the token at t rotated at 2t + (h & 1)."""
    B, T, NH = x.shape[:3]
    pos = torch.arange(B * T if pairs else T, dtype=torch.float32, device=x.device)
    if paired_heads:
        head_parity = torch.arange(NH, device=x.device) % 2
        theta = ((2 * pos[:, None] + head_parity)[..., None] * freq).view(B, T, NH, -1)
    else:
        theta = torch.outer(pos, freq).view(B if pairs else 1, T, 1, -1)
    cos, sin = theta.cos(), theta.sin()
    if pairs:
        cos, sin = cos.bfloat16().float(), sin.bfloat16().float()
        x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
        return torch.stack((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), dim=-1).flatten(-2).type_as(x)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), dim=-1).type_as(x)


def shift_stationary_keys(k, pairs=False):
    """Record #89's key offset: k [B, T, NH, hs] after the rotary, each key's stationary dims (those
    rotate leaves unturned, j and j + hs/2 for hs/4 <= j < hs/2; with its pairs hs/2 to hs - 1) taken
    from the key before it over the B x T tokens as one sequence (rows continue each other, documents
    do not matter); the first key keeps its own."""
    B, T, NH, hs = k.shape
    flat = k.reshape(B * T, NH, hs)
    dims = torch.arange(hs, device=k.device)
    stationary = dims >= hs // 2 if pairs else dims % (hs // 2) >= hs // 4
    return torch.where(stationary, torch.cat((flat[:1], flat[:-1])), flat).view(B, T, NH, hs)


def make_norm(config):
    return RMSNorm(config.channels, gain=not config.speedrun) if config.modern else nn.LayerNorm(config.channels)


def exclusive_self_attention(y, v, alpha):
    """Record #89's XSA: each head's output y [B, T, NH, hs] less tanh(alpha_h) times its part along
    the value v [B, T, NH, hs] it read (after the value mix), y . v / max(|v|^2, 1e-8) v; alpha [NH], or
    [B, T, NH] a token (the MUDD gate generators'; None: y as it is). In y's dtype, as the reference's BF16 tensors."""
    if alpha is None:
        return y
    dot = (y * v).sum(-1, keepdim=True)
    squares = v.square().sum(-1, keepdim=True).clamp_min(XSA_MIN_SQUARES)
    strength = torch.tanh(alpha).type_as(y)
    strength = strength[..., None] if alpha.dim() > 1 else strength.view(1, 1, -1, 1)
    return y - strength * (dot / squares) * v


def composed_attention(y, q, k, v, w_in, w_out, documents, scale):
    """Record #89's composed attention (COMPOSED_LAYER's comment): each head's output y [B, NH, T, hs] plus
    w_out_h (A v_h), A [B, T, COMPOSED_WINDOW] = sum_h w_in_h P_h in float32, the heads in order, P_h the
    softmax of scale q_h . k_h over the keys at most COMPOSED_WINDOW - 1 back in the query's document
    (documents [B, T], each position's) in float32; q, k, v [B, NH, T, hs] as the attention read them.
    w_in, w_out [B, T, NH]: w_in normed over the heads in float32, both then in y's dtype; w_out_h A
    rounded to v's dtype, its product with v summed in float32 and added to y, rounded once to y's dtype
    (the reference's kernel)."""
    window = COMPOSED_WINDOW
    w_in = w_in.float()
    w_in = (w_in * torch.rsqrt(w_in.square().mean(-1, keepdim=True) + COMPOSED_NORM_EPS)).type_as(y)
    w_out = w_out.type_as(y)
    # key t - window + 1 + o at index o of query t's window; the positions before the row in no document
    keys, values = (F.pad(t, (0, 0, window - 1, 0)).unfold(2, window, 1) for t in (k, v))  # [B, NH, T, hs, W]
    key_documents = F.pad(documents, (window - 1, 0), value=-1).unfold(1, window, 1)  # [B, T, W]
    seen = (key_documents == documents[..., None])[:, None]
    scores = torch.einsum("bhtd,bhtdw->bhtw", q.float(), keys.float()) * scale
    probs = scores.masked_fill(~seen, float("-inf")).softmax(dim=-1)
    mixed = w_in[..., 0, None].float() * probs[:, 0]
    for h in range(1, probs.size(1)):
        mixed = mixed + w_in[..., h, None].float() * probs[:, h]
    weights = (w_out.float().transpose(1, 2)[..., None] * mixed[:, None]).to(v.dtype)  # [B, NH, T, W]
    correction = torch.einsum("bhtw,bhtdw->bhtd", weights.float(), values.float())
    return (y.float() + correction).to(y.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, flash, linear, layer):
        super().__init__()
        self.c_attn = linear(config.channels, 3 * config.channels)  # q, k, v stacked as [3C, C]
        self.c_proj = linear(config.channels, config.channels)
        self.num_heads = config.num_heads
        self.flash = flash
        # modern: QK-norm and rotary on q and k, and the scale 0.12 instead of 1/sqrt(hs)
        self.modern = config.modern
        if self.modern:
            self.register_buffer("freq", rotary_frequencies(config.channels // config.num_heads), persistent=False)
        self.rotary_pairs = config.rotary_pairs  # rotate's record #89 layout
        # record #89's paired heads: rotate's paired positions, then half the heads a position of each row
        # doubled (forward's views, GPT.attention_masks' paired_rows)
        self.paired = config.plan[layer].paired
        # the softmax scale (None: 1/sqrt(hs)); set_attention_scale's, and YaRN's (set_yarn)
        self.scale = ATTENTION_SCALE_MODERN if self.modern else None
        self.key_offset = False  # shift_stationary_keys after the rotary (set_key_offset)
        # speedrun: v scaled, plus a value embedding scaled in the layers that have one (value_scales:
        # two scalars in every layer, as the reference's, the second unused where no value embedding
        # comes; in record #89's plan one, b: v is not scaled, as its reference's); each head's output
        # gated by a sigmoid of the input's first C/64 channels
        self.value_scales = self.gate = None
        self.scale_v = config.speedrun and not config.record89_plan  # the mix's a
        if config.speedrun:
            self.value_scales = nn.Parameter(torch.full((2 if self.scale_v else 1,), 0.5))
        if config.attention_gate:
            self.gate = linear(config.channels // SPEEDRUN_GATE_DIVISOR, config.num_heads)

    def mix_values(self, v, value_embedding, x=None, ve_gate=None, v_mix=None):
        """speedrun: a v, or a v + b ve with the layer's value embedding ve [B, T, C]; in record #89's plan
        v, or v + b ve (no a); with record #89's gate weights ve_gate [NH, 12] each head's b is
        2 sigmoid(ve_gate[h] . [x[:6], ve[:6]]), x the attention's normed input, in v's dtype as the rest
        of the mix. v_mix (MUDD's dense connections, mudd_layer_terms): (g [B, T, NH], e [B, T, C]), v + (g
        ve + e), each head's g in b's place."""
        if self.value_scales is None:
            return v
        scaled = self.value_scales[0] * v if self.scale_v else v
        if value_embedding is None:
            return scaled
        ve = value_embedding.view_as(v)
        if v_mix is not None:
            gate, extra = v_mix
            return scaled + (gate[..., None] * ve + extra.view_as(v))
        if ve_gate is None:
            return scaled + self.value_scales[-1] * ve
        gate_in = torch.cat([x[..., :VE_GATE_INPUTS], value_embedding[..., :VE_GATE_INPUTS]], dim=-1)
        gate = 2 * torch.sigmoid(F.linear(gate_in, ve_gate.type_as(v)))
        return scaled + gate[..., None] * ve

    def gate_heads(self, x, y):
        """speedrun: each head's output y [B, T, NH, hs] times sigmoid(gate . x[..., :C/64]), x the
        attention's (normed) input."""
        if self.gate is None:
            return y
        gate = torch.sigmoid(self.gate(x[..., :self.gate.in_features]))
        return y * gate.view(*gate.shape, 1)

    def forward(self, x, mask=None, value_embedding=None, ve_gate=None, xsa_alpha=None, head_gate=None,
                attn_lambda=None, v_mix=None, composed=None):
        """mask: [B, 1, T, T], True where a query attends to a key (GPT.attention_masks); None:
        causal. value_embedding: this layer's (speedrun), or None; ve_gate: its gates' weights, or None;
        xsa_alpha: its XSA strengths [NH] (or [B, T, NH]), or None; head_gate: record #89's gate of each head
        [NH] (or [B, T, NH]: a token's, from the MUDD gate generators), which scales its output (after XSA)
        before the output projection, or None; attn_lambda: record #89's (s0, s1) of the layer, which scale
        c_attn's and c_proj's weights (scaled_linear), or None. With paired heads the mask is of the rows
        doubled ([B, 1, 2T, 2T]: GPT.attention_masks). v_mix: MUDD's terms of the value (mix_values), or None.
        composed: (w_in, w_out, documents) of record #89's composed attention (composed_attention), which adds
        to the heads' outputs before XSA, or None."""
        B, T, C = x.size()
        q, k, v = scaled_linear(self.c_attn, x, None if attn_lambda is None else attn_lambda[0]).split(C, dim=2)
        q, k, v = (t.view(B, T, self.num_heads, C // self.num_heads) for t in (q, k, v))
        if self.modern:
            q, k = (rotate(rms_norm(t), self.freq, self.rotary_pairs, self.paired) for t in (q, k))
        if self.key_offset:
            k = shift_stationary_keys(k, self.rotary_pairs)
        v = self.mix_values(v, value_embedding, x, ve_gate, v_mix)
        if self.paired:  # record #89's views: token t's first NH/2 heads at position 2t, the rest at 2t + 1
            q, k, v = (t.reshape(B, 2 * T, self.num_heads // 2, C // self.num_heads) for t in (q, k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.flash and mask is not None and not torch.is_tensor(mask):
            scale = {} if self.scale is None else {"scale": self.scale}
            y = compiled_flex_attention()(q, k, v, block_mask=mask, **scale)
        elif self.flash:
            scale = {} if self.scale is None else {"scale": self.scale}
            masking = {"is_causal": True} if mask is None else {"attn_mask": mask}
            y = F.scaled_dot_product_attention(q, k, v, **masking, **scale)
        else:
            scale = 1.0 / math.sqrt(k.size(-1)) if self.scale is None else self.scale
            att = (q @ k.transpose(-2, -1)) * scale
            if mask is None:
                positions = q.size(2)
                mask = torch.ones(positions, positions, dtype=torch.bool, device=x.device).tril()
            y = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
        if composed is not None:
            scale = 1.0 / math.sqrt(k.size(-1)) if self.scale is None else self.scale
            y = composed_attention(y, q, k, v, *composed, scale)
        y = exclusive_self_attention(y.transpose(1, 2), v.transpose(1, 2), xsa_alpha)
        y = y.reshape(B, T, self.num_heads, C // self.num_heads)  # paired: the positions back as tokens
        y = self.gate_heads(x, y)
        if head_gate is not None:
            y = y * head_gate.type_as(y)[..., None]
        y = y.contiguous().view(B, T, C)
        return scaled_linear(self.c_proj, y, None if attn_lambda is None else attn_lambda[1])


def scaled_linear(layer, x, s=None):
    """layer(x), or with s (record #89's attention lambda, a float32 0-dim tensor) the product with its
    weight scaled, F.linear(x, s W), W cast to x's dtype first as the reference's: in bfloat16 runs torch
    casts s to bfloat16 too and rounds each product once, bf16(bf16(s) W) (the CUDA trainer's lambdas are
    bfloat16 parameters); in float32 runs s W. The speedrun's layers have no bias."""
    if s is None:
        return layer(x)
    return F.linear(x, s * layer.weight.type_as(x))


class Relu2FromOutput(torch.autograd.Function):
    """relu(x)^2 that keeps only its output y: the backward's derivative is 2 sqrt(y), in FP32, the
    gradient rounded to x's type once (record #89's MLP kernel; --mlp_from_output 1). 2 relu(x) up to
    y's rounding."""

    @staticmethod
    def forward(ctx, x):
        y = F.relu(x).square()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return (2.0 * dy.float() * y.float().sqrt()).to(dy.dtype)


# Record #89's FP8 MLP (--fp8_mlp 1, the CUDA trainer's -fm 1; train_gpt2.cu section 5, SPEC.md): a
# training forward's two products in E4M3 under the reference's scales, each rounding as its code
# does (its eager ops here too; Inductor's and Triton's divisions by torch's, which differ by an ulp
# at most); evaluation and the backward in the run's dtype, the backward from ReLU^2's output.
FP8_MLP_BOOTSTRAP_STEPS = 16  # the updates of steps 0..15 cast W2 under its own scale


class Fp8MlpState:
    """One layer's FP8 MLP state: its activation scale a (1 at the start), W2's delayed scale, and
    the weights' casts, made again before the first forward after each update (stale)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.act = self.w2_next = self.casts = None
        self.stale = self.bootstrap = True

    def updated(self, step):
        """After step `step`'s update (0-based)."""
        self.stale, self.bootstrap = True, step < FP8_MLP_BOOTSTRAP_STEPS


def fp8_weight_scale(w):
    """The reference's scale of a BF16 weight, its eager BF16 ops: bf16(bf16(max(amax, 1e-12)) / 448)."""
    return w.abs().amax().clamp(min=1e-12) / 448.0


def fp8_mlp_casts(state, w1, w2):
    """(s1, W1's E4M3 cast, s2, W2's) of the current weights (fc [4C, C], fcproj [C, 4C]), cast once an update."""
    if state.stale:
        f32 = partial(torch.tensor, dtype=torch.float32, device=w1.device)
        w1b, w2b = w1.detach().bfloat16(), w2.detach().bfloat16()
        s1 = fp8_weight_scale(w1b)
        w1_8 = (w1b / s1).to(torch.float8_e4m3fn)
        s2 = fp8_weight_scale(w2b).float() if state.bootstrap or state.w2_next is None else state.w2_next
        w2_8 = (w2b.float() / s2).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        state.w2_next = w2b.abs().amax().float().clamp(min=1e-12) * f32(1.12 / 448.0)
        state.casts, state.stale = (s1.float(), w1_8, s2, w2_8), False
    return state.casts


class Fp8MlpFunction(torch.autograd.Function):
    """fcproj(relu(fc(x))^2) with the forward's products in FP8; the backward's from post = relu(pre)^2
    as the forward rounded it (BF16), 2 sqrt(post) its derivative, in float32."""

    @staticmethod
    def forward(ctx, x, w1, w2, state):
        f32 = partial(torch.tensor, dtype=torch.float32, device=x.device)
        s1, w1_8, s2, w2_8 = fp8_mlp_casts(state, w1, w2)
        if state.act is None:
            state.act = f32(1.0)
        xb = x.reshape(-1, x.size(-1)).bfloat16().contiguous()
        amax = xb.abs().max().float().clamp(min=1e-12)
        x8 = (xb.float() * ((1.0 / amax) * 448.0)).to(torch.float8_e4m3fn)
        d = (s1 * amax) * f32(1.0 / 448.0)
        pre = scaled_mm(x8, w1_8.t(), d, f32(1.0), torch.bfloat16, fast_accum=True)
        post = F.relu(pre.float()).square().bfloat16()
        a = state.act
        post8 = torch.clamp(post.float() * (1.0 / a), max=448.0).to(torch.float8_e4m3fn)
        out = scaled_mm(post8, w2_8.t(), a, s2, torch.bfloat16, fast_accum=True)
        state.act = post.float().amax().clamp(min=1e-12) * f32(1.8 / 448.0)
        ctx.save_for_backward(x, w1, w2, post)
        return out.view(*x.shape[:-1], w2.size(0)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, w1, w2, post = ctx.saved_tensors
        dy2, x2, postf = dy.reshape(-1, dy.size(-1)).float(), x.reshape(-1, x.size(-1)).float(), post.float()
        dw2 = dy2.t() @ postf
        dpre = (2.0 * (dy2 @ w2.float()) * postf.sqrt()).to(x.dtype).float()
        dw1 = dpre.t() @ x2
        dx = dpre @ w1.float()
        return dx.view(x.shape).to(x.dtype), dw1.to(w1.dtype), dw2.to(w2.dtype), None


class MLP(nn.Module):
    def __init__(self, config, linear):
        super().__init__()
        self.c_fc = linear(config.channels, 4 * config.channels)
        self.c_proj = linear(4 * config.channels, config.channels)
        self.modern = config.modern  # ReLU^2 instead of GELU
        self.from_output = False  # ReLU^2's backward from its output (set_mlp_from_output)
        self.fp8 = None  # Fp8MlpState with --fp8_mlp 1 (set_fp8_mlp)

    def forward(self, x):
        if self.fp8 is not None and torch.is_grad_enabled():
            return Fp8MlpFunction.apply(x, self.c_fc.weight, self.c_proj.weight, self.fp8)
        h = self.c_fc(x)
        if not self.modern:
            return self.c_proj(F.gelu(h, approximate="tanh"))
        return self.c_proj(Relu2FromOutput.apply(h) if self.from_output else F.relu(h).square())


def bigram_rows(tokens, table_rows):
    """Record #89's bigram hash (llmc/bigram_hash.h) of tokens as one flat sequence: each token's row
    of the table and of the sign table, (ids, sign_rows) [N] int64. With m = table_rows - 1, id_0 = m
    and id_t = (36313 p_t XOR 27191 p_{t-1}) mod m in int32, products wrapping, p the tokens with p_0
    replaced by m (the reference overwrites position 0 before its shifted read); sign row 0 at t = 0,
    else (token_{t-1} XOR token_t) mod 8192."""
    flat, m = tokens.reshape(-1).long(), table_rows - 1
    previous = torch.cat([flat.new_full((1,), m), flat[:-1]])
    hashed = previous.clone()
    hashed[:2] = m

    def wrapped(factor, v):  # the int32 product's bits, as uint32
        return (factor * v) & 0xFFFFFFFF

    h = wrapped(BIGRAM_HASH_CURRENT, flat) ^ wrapped(BIGRAM_HASH_PREVIOUS, hashed)
    ids = torch.remainder(torch.where(h >= 2 ** 31, h - 2 ** 32, h), m)
    ids[0] = m
    sign_rows = torch.remainder(previous ^ flat, BIGRAM_SIGN_ROWS)
    sign_rows[0] = 0
    return ids, sign_rows


def mudd_bias_init():
    """The MUDD dense connections' b2 [2, 14] at init (MUDD_BIAS_INIT, over the scale)."""
    bias = torch.zeros(2, MUDD_LAYER_COEFFICIENTS)
    for (generator, column), value in MUDD_BIAS_INIT:
        bias[generator, column] = value / MUDD_SCALE
    return bias


def mudd_gate_bias_init():
    """The MUDD gate generators' b2 [2, 41] at init (MUDD_GATE_BIAS_INIT)."""
    bias = torch.zeros(2, MUDD_GATE_COLUMNS)
    for (generator, *columns), value in MUDD_GATE_BIAS_INIT:
        bias[generator, slice(*columns)] = value
    return bias


def bigram_sign_table(channels):
    """The fixed sign table [8192, C] of +-1 (llmc::bigram_sign_table): the reference's sign(randn) drawn
    unseeded, ours torch.randint(0, 2) from a generator seeded with BIGRAM_SIGN_SEED, one MT19937 u32 a
    value (odd: +1)."""
    generator = torch.Generator().manual_seed(BIGRAM_SIGN_SEED)
    return (torch.randint(0, 2, (BIGRAM_SIGN_ROWS, channels), generator=generator) * 2 - 1).float()


class Block(nn.Module):
    def __init__(self, config, flash, linear, layer):
        super().__init__()
        # speedrun: the block's input is lambdas[0] x + lambdas[1] x0, x0 the normed embedding (record #28's)
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0])) if config.x0_lambdas else None
        attention = config.plan[layer].attention
        self.ln_1 = make_norm(config) if attention else None
        self.attn = CausalSelfAttention(config, flash, linear, layer) if attention else None
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config, linear)

    def mix_input(self, x, x0):
        return x if self.lambdas is None else self.lambdas[0] * x + self.lambdas[1] * x0

    def forward(self, x, mask=None, x0=None, value_embedding=None, bigram=None, ve_gate=None, xsa_alpha=None,
                lambdas=None, x0_term=None, source=None, head_gate=None, attn_lambda=None, v_mix=None,
                composed=None):
        """bigram: the gated bigram embedding the layer adds to its attention's output, or None;
        ve_gate: the weights of its value embedding's gates, or None; xsa_alpha: its XSA strengths, or None;
        lambdas: (r_attention, p_attention, r_mlp, p_mlp) of the residual lambdas, each sublayer's add
        r x + p out (the bigram term beside p out, as the reference's), or None: x + out; x0_term: record
        #89's gated x0 the layer adds after its attention, before the bigram term, or None; source: the
        earlier layer's output its attention reads instead of x (LayerSpec.attention_source), or None;
        head_gate: its heads' gates (record #89's), or None; attn_lambda: its attention lambdas (s0, s1), or
        None; v_mix: MUDD's terms of its attention's value (CausalSelfAttention.mix_values), or None;
        composed: its attention's composition (CausalSelfAttention.forward), or None. The lambdas and terms
        may be a token's ([B, T, 1]: MUDD's)."""
        x = self.mix_input(x, x0)
        r_attention, p_attention, r_mlp, p_mlp = lambdas if lambdas is not None else (None,) * 4
        if self.attn is not None:
            y = self.attn(self.ln_1(x if source is None else source), mask, value_embedding, ve_gate, xsa_alpha,
                          head_gate, attn_lambda, v_mix, composed)
            if x0_term is not None:  # record #89's plan: the attention's terms summed, then the stream's add
                terms = (y if lambdas is None else p_attention * y) + x0_term
                terms = terms if bigram is None else terms + bigram
                x = (x if lambdas is None else r_attention * x) + terms
            elif lambdas is None:
                x = x + (y if bigram is None else y + bigram)
            else:
                x = r_attention * x + p_attention * y + (0 if bigram is None else bigram)
        y = self.mlp(self.ln_2(x))
        return x + y if lambdas is None else r_mlp * x + p_mlp * y


class GPT(nn.Module):
    def __init__(self, config, flash=False, fp8=False, fp8_head=False):
        """fp8: the blocks' linear layers are Fp8Linear; fp8_head: the speedrun's head is Fp8Head (each
        a CUDA GPU of compute capability 8.9+)."""
        super().__init__()
        self.config = config
        plain = CastLinear if config.modern else nn.Linear
        if config.speedrun:  # no biases
            plain = partial(CastLinear, bias=False)
        linear = Fp8Linear if fp8 else plain
        Vp, C = config.padded_vocab_size, config.channels
        layers = dict(wte=nn.Embedding(Vp, C))
        if config.modern:
            layers["ln_e"] = make_norm(config)  # the norm after the embedding
        else:
            layers["wpe"] = nn.Embedding(config.max_seq_len, C)
        if config.speedrun:
            layers["ve"] = nn.ModuleList([nn.Embedding(Vp, C) for _ in range(config.value_embeddings)])
        layers["h"] = nn.ModuleList([Block(config, flash, linear, layer) for layer in range(config.num_layers)])
        layers["ln_f"] = make_norm(config)
        self.transformer = nn.ModuleDict(layers)
        # speedrun: the U-net's weights, one for each layer with a skip source (unet_skip)
        skips = sum(spec.skip_weight is not None for spec in config.plan)
        self.skip_weights = nn.Parameter(torch.ones(skips)) if skips else None
        # speedrun with the smear: the gate's weights over the first 12 channels and its lambda (smear)
        self.smear_weight = nn.Parameter(torch.zeros(SMEAR_WIDTH)) if config.smear else None
        self.smear_lambda = nn.Parameter(torch.zeros(1)) if config.smear else None
        # speedrun with the bigram embedding: its table, the fixed sign table, and a gate for each
        # attention layer (layer 0's before it, the others' after their attention: bigram_terms)
        self.bigram = self.bigram_gates = None
        if config.bigram:
            self.bigram = nn.Embedding(config.bigram_rows, C)
            self.register_buffer("bigram_signs", bigram_sign_table(C), persistent=False)
            self.bigram_gates = nn.Parameter(torch.full((sum(spec.attention for spec in config.plan),),
                                                        BIGRAM_GATE_INIT))
        # speedrun with the value-embedding gates: [NH, 12] weights for each layer with a value embedding,
        # in layer order (layer_ve_gates)
        ve_layers = sum(spec.value_embedding is not None for spec in config.plan)
        self.ve_gates = (nn.Parameter(torch.zeros(ve_layers, config.num_heads, 2 * VE_GATE_INPUTS))
                         if config.ve_gates else None)
        # speedrun with record #89's residual lambdas: [L, 2] each, column 0 the attention's, 1 the MLP's
        self.resid_lambdas = self.post_lambdas = None
        if config.resid_lambdas:
            self.resid_lambdas = nn.Parameter(torch.full((config.num_layers, 2), RESID_LAMBDA_INIT))
            self.post_lambdas = nn.Parameter(torch.ones(config.num_layers, 2))
        # speedrun with XSA: each head's strength alpha for each XSA layer, in layer order (layer_xsa_alphas)
        xsa_layers = sum(spec.xsa for spec in config.plan)
        self.xsa_alpha = nn.Parameter(torch.zeros(xsa_layers, config.num_heads)) if config.xsa else None
        # speedrun in record #89's plan: a gate for each attention layer's x0 term (layer_x0_terms), and
        # the gated skip's (skip_lambda, g) where the plan has one (gated_skip)
        self.x0_gates = self.skip_gate = None
        if config.record89_plan:
            self.x0_gates = nn.Parameter(torch.zeros(sum(spec.attention for spec in config.plan)))
        if any(spec.gated_skip_source is not None for spec in config.plan):
            self.skip_gate = nn.Parameter(torch.tensor([SKIP_LAMBDA_INIT, SKIP_GATE_INIT]))
        # and each head's gate [NH] on the plan's head-gate layers, in layer order (layer_head_gates)
        head_gate_layers = sum(spec.head_gate for spec in config.plan)
        self.head_gates = (nn.Parameter(torch.full((head_gate_layers, config.num_heads), HEAD_GATE_INIT))
                           if head_gate_layers else None)
        # speedrun with record #89's attention lambdas: (s0, s1) for every layer [L, 2], the pair of a layer
        # without attention unused, as the reference's
        self.attn_lambdas = (nn.Parameter(torch.tensor([ATTN_LAMBDA_INIT] * config.num_layers))
                             if config.attn_lambdas else None)
        # and with its MUDD gate generators (mudd_gate_rows) their W1 [2, 64, C], W2 [2, 41, 64], b2 [2, 41] and
        # scale [1], which replace the gates above that MUDD_GATE_COLUMNS_OF names (those stay, unread)
        self.mudd_gate_w1 = self.mudd_gate_w2 = self.mudd_gate_b2 = self.mudd_gate_scale = None
        if config.mudd_gates:
            self.mudd_gate_w1 = nn.Parameter(torch.zeros(2, MUDD_GATE_HIDDEN, C))
            self.mudd_gate_w2 = nn.Parameter(torch.zeros(2, MUDD_GATE_COLUMNS, MUDD_GATE_HIDDEN))
            self.mudd_gate_b2 = nn.Parameter(mudd_gate_bias_init())
            self.mudd_gate_scale = nn.Parameter(torch.tensor([MUDD_GATE_SCALE_INIT]))
        # and with its MUDD dense connections (mudd_coefficients) their W1 [2, 64, C], W2 [2, 14, 64] and b2 [2, 14],
        # whose coefficients replace the last layer's residual lambdas, x0 and bigram gates and value-embedding
        # gates (those stay, unread)
        self.mudd_w1 = self.mudd_w2 = self.mudd_b2 = None
        if config.mudd_connections:
            self.mudd_w1 = nn.Parameter(torch.zeros(2, MUDD_HIDDEN, C))
            self.mudd_w2 = nn.Parameter(torch.zeros(2, MUDD_LAYER_COEFFICIENTS, MUDD_HIDDEN))
            self.mudd_b2 = nn.Parameter(mudd_bias_init())
        # modern: a separate head with a bias (speedrun: without); GPT-2's is wte itself
        self.lm_head = (Fp8Head if fp8_head else plain)(C, Vp, bias=config.arch == "modern")
        if not config.modern:
            self.lm_head.weight = self.transformer.wte.weight
        # The modern model's activations: float32, or bfloat16 with float32 parameters cast to it
        # (set_compute_dtype). GPT-2's bfloat16 runs use autocast instead.
        self.compute_dtype = torch.float32
        # --documents: attention stays within a document; window_blocks (>= 0, with documents):
        # within the reference's window of that many 128-token blocks (attention_masks), the short
        # layers' short_window_blocks (None: half of it)
        self.documents = False
        self.window_blocks = None
        self.short_window_blocks = None
        self.window_tokens = False  # --window_tokens: a window of N blocks reaches N x 128 tokens back
        self.key_offset = False  # --key_offset: set_key_offset's
        self.attention_scale = None  # --attention_scale: set_attention_scale's (None: the architecture's)
        self.yarn = False  # --yarn: set_yarn_switch's
        self.mlp_from_output = False  # --mlp_from_output: set_mlp_from_output's
        self.fp8_mlp = False  # --fp8_mlp: set_fp8_mlp's
        self.loss_terms = None  # the training loss's terms beyond the next token (LossTerms), or none
        self.prefix_table = None  # the loss's prefix term's (run_prefix_table), where a step weights it
        # the head's cap (soft_cap; --logit_cap sets another)
        self.logit_cap = SPEEDRUN_SOFTCAP if config.speedrun else LOGIT_SOFTCAP_MODERN
        self.logit_bf16_sigmoid = False  # the sigmoid cap's sigmoid rounded to bfloat16 (--logit_cap's bf16)
        self.logit_shift = 0.0

    def attention_masks(self, idx):
        """Each layer's attention mask for the rows of idx (None for every layer without documents:
        causal). With documents a query attends to the earlier keys of its own document; with
        window_blocks also only within the key blocks the reference selects, the window in each
        layer as its LayerSpec.window gives it (12 layers: the reference's long and short windows;
        other depths: the long window in every layer); with window_tokens the window is N x 128 tokens
        back from each query instead (record #89's). A mask is FlexAttention's BlockMask where the
        attention is F.scaled_dot_product_attention's (--flash 1) on a CUDA GPU with FlexAttention
        and T a multiple of 128, as the reference runs it; else a [B, 1, T, T] boolean tensor. A layer
        with record #89's paired heads takes the mask of the rows doubled (paired_rows), its window in
        positions."""
        layers = self.config.num_layers
        if not self.documents:
            return [None] * layers
        flex = (self.transformer.h[0].attn.flash and idx.is_cuda and idx.size(1) % ATTENTION_BLOCK == 0
                and flex_attention_available())
        masks = {}

        def key(layer):
            return self.layer_window(layer), self.config.plan[layer].paired

        for layer in range(layers):
            if key(layer) in masks:
                continue
            window, paired = key(layer)
            rows = paired_rows(idx) if paired else idx
            tokens = window * ATTENTION_BLOCK if self.window_tokens and window is not None else None
            if flex:
                masks[key(layer)] = document_block_mask(rows, window, tokens)
            else:
                row_masks = [document_attention_mask(row.cpu(), window, tokens) for row in rows]
                masks[key(layer)] = torch.stack(row_masks)[:, None].to(idx.device)
        return [masks[key(layer)] for layer in range(layers)]

    def attention_keys(self, T):
        """SPEC.md's K at the current window for rows of T tokens: the keys a query attends to on
        average, summed over the layers with attention. T/2 causal, and within documents without a
        window (as if one document spanned the row); with a window of N blocks, query block i sees
        min(i + 1, N) blocks, the last half (a window of 0, the short layers' half of 1, still sees
        its own block, as attention_block_lists gives it); with window_tokens query t sees
        min(t + 1, 128 N + 1) keys. A layer with paired heads: those of its rows of 2T positions (each
        token two positions of C/2, as one of C)."""
        keys = 0.0
        for layer, spec in enumerate(self.config.plan):
            if not spec.attention:
                continue
            n = 2 * T if spec.paired else T  # the layer's positions a row
            blocks = n // ATTENTION_BLOCK
            window = self.layer_window(layer) if self.documents else None
            if window is None:
                keys += n / 2
            elif self.window_tokens:  # the sum over t of min(t + 1, reach)
                reach = min(n, window * ATTENTION_BLOCK + 1)
                keys += (reach * (reach + 1) // 2 + (n - reach) * reach) / n
            else:
                window = min(blocks, max(1, window))
                keys += sum(min(i + 1, window) - 0.5 for i in range(blocks)) * ATTENTION_BLOCK / blocks
        return keys

    def flops_per_token(self, T):
        """SPEC.md's MFU count at the current window (GPTConfig.flops_per_token)."""
        return self.config.flops_per_token(T, self.attention_keys(T))

    def layer_window(self, layer):
        if self.window_blocks is None:
            return None
        return layer_window_blocks(self.config.plan[layer].window, self.window_blocks, self.short_window_blocks)

    def final_hidden(self, idx, masks=None):
        """The blocks' output after the final norm, [B, T, C]: the classifier's input. masks: each
        layer's attention mask (attention_masks(idx)); None builds them here."""
        t = self.transformer
        if self.config.modern:
            x = t.ln_e(self.smear(t.wte(idx).to(self.compute_dtype)))
        else:
            pos = torch.arange(idx.size(1), device=idx.device)
            x = t.wte(idx) + t.wpe(pos)
        x0, outputs = x, []
        rows = [self.mudd_gate_rows(x0, 0), None]  # the MUDD gate generators' (the post one's from layer 4 on)
        bigram = self.bigram_embedding(idx)
        if bigram is not None:
            x = x0 + self.bigram_term(0, bigram, rows)
        in0 = x  # the stream entering layer 0, which MUDD's dense connections mix in
        value_embeddings = self.layer_value_embeddings(idx)
        ve_gates = self.layer_ve_gates()
        masks = self.attention_masks(idx) if masks is None else masks
        lambdas = self.sublayer_lambdas(x)
        attn_lambdas = [None] * self.config.num_layers if self.attn_lambdas is None else self.attn_lambdas
        for layer, (spec, block, mask, value_embedding) in enumerate(zip(self.config.plan, t.h, masks,
                                                                          value_embeddings)):
            if layer == MUDD_POST_LAYER:
                rows[1] = self.mudd_gate_rows(x, 1)
            x = self.unet_skip(spec, x, outputs)
            x = self.gated_skip(spec, x, outputs, layer, rows)
            source = None if spec.attention_source is None else outputs[spec.attention_source]
            bigram_term = self.bigram_term(layer, bigram, rows) if layer > 0 else None
            layer_lambdas, x0_term, v_mix = lambdas[layer], self.x0_term(layer, x0, rows), None
            if self.mudd_w1 is not None and layer == self.config.num_layers - 1:
                x, layer_lambdas, x0_term, bigram_term, v_mix = self.mudd_layer_terms(x, in0, outputs, bigram)
            x = block(x, mask, x0, value_embedding, bigram_term, ve_gates[layer], self.layer_xsa_alpha(layer, rows),
                      layer_lambdas, x0_term, source, self.layer_head_gate(layer, rows), attn_lambdas[layer], v_mix,
                      self.layer_composition(layer, rows, idx))
            outputs.append(x)
        return t.ln_f(self.mudd_final_mix(x, in0, outputs, value_embeddings))

    def mudd_coefficients(self, x, generator):
        """Record #89's MUDD dense connections' coefficients of x [B, T, C] from generator 0 (the last layer's, 14)
        or 1 (the final mix's, 5): (gelu(x W1^T) W2[:n]^T + b2[:n]) x 0.1, a list of n [B, T, 1], each step in
        x's dtype, the GELU the exact one."""
        n = MUDD_LAYER_COEFFICIENTS if generator == 0 else MUDD_FINAL_COEFFICIENTS
        hidden = F.gelu(F.linear(x, self.mudd_w1[generator].type_as(x)))
        product = F.linear(hidden, self.mudd_w2[generator, :n].type_as(x))
        return list(((product + self.mudd_b2[generator, :n].type_as(x)) * MUDD_SCALE).split(1, dim=-1))

    def mudd_layer_terms(self, x, in0, outputs, bigram):
        """The last layer's terms from MUDD's first generator of its input x (MUDD_BIAS_INIT's comment): its
        stream (1 + m5) x + m3 in0 + m4 out7, its lambdas (m8, m9, m12, m13), x0 term m10 in0, bigram term m11 b
        (None without the bigram embedding) and value terms (each half of the heads' gate m6, m7; m0 in0 + m1
        out7 + m2 x), each step in x's dtype."""
        m, out7 = self.mudd_coefficients(x, 0), outputs[7]
        extra = m[0] * in0 + m[1] * out7 + m[2] * x
        stream = (1 + m[5]) * x + m[3] * in0 + m[4] * out7
        half = self.config.num_heads // 2
        gates = torch.cat([m[6].expand(*m[6].shape[:-1], half), m[7].expand(*m[7].shape[:-1], half)], dim=-1)
        bigram_term = None if bigram is None else m[11] * bigram
        return stream, (m[8], m[9], m[12], m[13]), m[10] * in0, bigram_term, (gates, extra)

    def mudd_final_mix(self, x, in0, outputs, value_embeddings):
        """After the last layer, x + m0 in0 + m1 out7 + m2 out9 + m3 ve0 + m4 out3 from MUDD's second generator
        of x (ve0 layer 1's value embedding), added in that order in x's dtype; x itself without MUDD."""
        if self.mudd_w1 is None:
            return x
        m = self.mudd_coefficients(x, 1)
        terms = (in0, outputs[7], outputs[9], value_embeddings[1], outputs[3])
        for coefficient, term in zip(m, terms):
            x = x + coefficient * term
        return x

    def mudd_gate_rows(self, x, generator):
        """Record #89's MUDD gate generator `generator` (0 pre, 1 post) of x [B, T, C]: its rows [B, T, n],
        (gelu(x W1^T) W2[:n]^T + b2[:n]) x scale, each step in x's dtype (the reference's BF16), the GELU the
        exact one; n MUDD_PRE_COLUMNS or MUDD_GATE_COLUMNS. None without the generators."""
        if self.mudd_gate_w1 is None:
            return None
        n = MUDD_PRE_COLUMNS if generator == 0 else MUDD_GATE_COLUMNS
        hidden = F.gelu(F.linear(x, self.mudd_gate_w1[generator].type_as(x)))
        product = F.linear(hidden, self.mudd_gate_w2[generator, :n].type_as(x))
        return (product + self.mudd_gate_b2[generator, :n].type_as(x)) * self.mudd_gate_scale.type_as(x)

    def mudd_gate(self, kind, layer, rows, width=1):
        """Layer `layer`'s gate of `kind` (MUDD_GATE_COLUMNS_OF) a token, [B, T, width] of its generator's rows;
        None without the generators, or where the gate stays a learned scalar."""
        where = MUDD_GATE_COLUMNS_OF.get((kind, layer)) if self.mudd_gate_w1 is not None else None
        if where is None:
            return None
        generator, column = where
        return rows[generator][..., column:column + width]

    def sublayer_lambdas(self, x):
        """Each layer's (r_attention, p_attention, r_mlp, p_mlp) in x's dtype (the reference's bfloat16
        casts in bfloat16 runs), or None without the residual lambdas."""
        if self.resid_lambdas is None:
            return [None] * self.config.num_layers
        r, p = self.resid_lambdas.type_as(x), self.post_lambdas.type_as(x)
        return [(r[layer, 0], p[layer, 0], r[layer, 1], p[layer, 1]) for layer in range(self.config.num_layers)]

    def bigram_embedding(self, idx):
        """The bigram embedding b of idx (its signed table rows, bigram_rows), or None without one."""
        if self.bigram is None:
            return None
        ids, sign_rows = bigram_rows(idx, self.config.bigram_rows)
        return (self.bigram(ids) * self.bigram_signs[sign_rows]).view(*idx.shape, -1).to(self.compute_dtype)

    def attention_slab(self, layer):
        """The layer's place among the attention layers (the row of their per-layer tensors)."""
        return sum(spec.attention for spec in self.config.plan[:layer])

    def bigram_term(self, layer, b, rows):
        """Layer `layer`'s gated bigram embedding g_l b, None without one: layer 0's added to x0 before it,
        the later attention layers' to their attention's output (the reference's layers). g_l a learned
        scalar, one an attention layer, or with the MUDD gate generators the layer's gate a token."""
        if b is None or not self.config.plan[layer].attention:
            return None
        gate = self.mudd_gate("bigram", layer, rows)
        return (self.bigram_gates[self.attention_slab(layer)].type_as(b) if gate is None else gate) * b

    def layer_value_embeddings(self, idx):
        """Each layer's value embedding of idx (speedrun), or None."""
        lookups = [ve(idx).to(self.compute_dtype) for ve in self.transformer.ve] if self.config.speedrun else []
        return [None if spec.value_embedding is None else lookups[spec.value_embedding] for spec in self.config.plan]

    def layer_ve_gates(self):
        """Each layer's value-embedding gate weights [NH, 12] (a row of ve_gates for each layer with a
        value embedding, in layer order), or None."""
        rows = iter(self.ve_gates if self.ve_gates is not None else [])
        return [next(rows) if self.ve_gates is not None and spec.value_embedding is not None else None
                for spec in self.config.plan]

    def layer_xsa_alpha(self, layer, rows):
        """The layer's XSA strengths alpha: [NH], its row of xsa_alpha (a row for each XSA layer, in layer
        order), or with the MUDD gate generators [B, T, NH] a token; None where it has no XSA."""
        plan = self.config.plan
        if self.xsa_alpha is None or not plan[layer].xsa:
            return None
        gate = self.mudd_gate("xsa", layer, rows, self.config.num_heads)
        return self.xsa_alpha[sum(spec.xsa for spec in plan[:layer])] if gate is None else gate

    def layer_composition(self, layer, rows, idx):
        """Layer COMPOSED_LAYER's (w_in, w_out, documents) for composed_attention with --composed_attention: w_in
        and w_out [B, T, NH] from the post MUDD gate generator's rows, documents [B, T] each position's as the
        attention masks count them (one a row without --documents); None in other layers."""
        if not self.config.composed_attention or layer != COMPOSED_LAYER:
            return None
        heads = self.config.num_heads
        w_in = rows[1][..., COMPOSED_IN_COLUMN:COMPOSED_IN_COLUMN + heads]
        w_out = rows[1][..., COMPOSED_OUT_COLUMN:COMPOSED_OUT_COLUMN + heads]
        documents = (idx == DOCUMENT_START).cumsum(1) if self.documents else torch.zeros_like(idx)
        return w_in, w_out, documents

    def layer_head_gate(self, layer, rows):
        """The layer's head gates: [NH], its row of head_gates (a row for each head-gate layer of record
        #89's plan, in layer order), or with the MUDD gate generators [B, T, NH] a token; None where it has
        none."""
        plan = self.config.plan
        if not plan[layer].head_gate:
            return None
        gate = self.mudd_gate("head", layer, rows, self.config.num_heads)
        return self.head_gates[sum(spec.head_gate for spec in plan[:layer])] if gate is None else gate

    def x0_term(self, layer, x0, rows):
        """An attention layer's gated x0, g_l x0 in x0's dtype (record #89's plan), or None: g_l a learned
        scalar, one an attention layer, or with the MUDD gate generators the layer's gate a token."""
        if self.x0_gates is None or not self.config.plan[layer].attention:
            return None
        gate = self.mudd_gate("x0", layer, rows)
        return (self.x0_gates[self.attention_slab(layer)].type_as(x0) if gate is None else gate) * x0

    def gated_skip(self, spec, x, outputs, layer, rows):
        """Record #89's skip, before the layer of `spec` (its MLP alone): x + sigmoid(skip_lambda) g times
        the output of layer spec.gated_skip_source, each step in x's dtype; g with the MUDD gate generators
        the layer's gate a token."""
        if spec.gated_skip_source is None:
            return x
        skip_lambda, gate = self.skip_gate.type_as(x)
        generated = self.mudd_gate("skip", layer, rows)
        gate = gate if generated is None else generated
        return x + (torch.sigmoid(skip_lambda) * gate) * outputs[spec.gated_skip_source]

    def unet_skip(self, spec, x, outputs):
        """The speedrun's U-net, before the layer of `spec` whose input is x: it adds
        skip_weights[spec.skip_weight] times the output of layer spec.skip_source (outputs: the
        earlier layers')."""
        if spec.skip_source is None:
            return x
        return x + self.skip_weights[spec.skip_weight] * outputs[spec.skip_source]

    def smear(self, x):
        """Record #89's smear of the embedding x [B, T, C] (SPEC.md "Record #89's embedding"): over its
        rows as one flat sequence, x_t + lambda sigmoid(w . x_t[:12]) x_{t-1} for t >= 1, each step in
        x's dtype; x itself without the smear."""
        if self.smear_weight is None:
            return x
        flat = x.reshape(-1, x.size(-1))
        gate = torch.sigmoid(F.linear(flat[1:, :SMEAR_WIDTH], self.smear_weight.type_as(x)[None]))
        share = self.smear_lambda.type_as(x) * gate
        return torch.cat([flat[:1], flat[1:] + share * flat[:-1]]).view_as(x)

    def soft_cap(self, logits):
        """The logits the softmax sees, in float32: the modern model's c z / sqrt(z^2 + c^2) (c = 15), the
        speedrun's c sigmoid((z + shift) / 7.5) (c = 30, shift 0; record #89's 23 and 5: --logit_cap).
        --logit_cap's bf16 rounds the sigmoid where gradients are taken (record #89's training loss kernel);
        its evaluation, compiled, takes the sigmoid of the BF16 logits in float32, as here under no_grad."""
        if not self.config.modern:
            return logits
        z = logits.float()
        cap = self.logit_cap
        if self.config.speedrun and self.logit_bf16_sigmoid and torch.is_grad_enabled():
            return cap * Bf16Sigmoid.apply((z + self.logit_shift) / SPEEDRUN_SOFTCAP_SCALE)
        if self.config.speedrun:
            return cap * torch.sigmoid((z + self.logit_shift) / SPEEDRUN_SOFTCAP_SCALE)
        return cap * z * torch.rsqrt(z.square() + cap ** 2)

    def forward(self, idx, targets=None, reduction="mean", masks=None):
        """Returns the logits over the real vocabulary, [B, T, vocab_size] (before the modern soft
        cap), and the loss: the mean or the sum of the token losses, with loss_terms' terms where
        gradients are taken (training; evaluation under torch.no_grad keeps the next token's alone, as
        the CUDA trainer's validation). masks: as final_hidden's."""
        # The padded columns are dropped before the loss, so padded wte rows get zero gradient; the
        # speedrun's reference keeps them in the softmax (capped, a zero logit is 15 there).
        logits = self.lm_head(self.final_hidden(idx, masks))
        loss = None
        if targets is not None:
            columns = self.config.padded_vocab_size if self.config.speedrun else self.config.vocab_size
            capped = self.soft_cap(logits[:, :, :columns])
            if self.loss_terms is not None and torch.is_grad_enabled():
                loss = self.loss_terms.loss(capped, targets, reduction)
            else:
                loss = F.cross_entropy(capped.reshape(-1, capped.size(-1)), targets.reshape(-1), reduction=reduction)
        return logits[:, :, :self.config.vocab_size], loss

    def padded_vocab_loss(self, idx, targets, reduction="mean"):
        """The benchmark's loss, as nanoGPT and modded-nanogpt compute it: cross-entropy over all
        padded_vocab_size logits, which are neither sliced nor returned, so the compiled graph keeps
        no logits beyond what its backward needs. The padded columns' logits are 0 while their wte
        (modern: head) rows are (at initialisation), so this is the reference loss with
        padded_vocab_size - vocab_size zero logits added to each softmax."""
        logits = self.soft_cap(self.lm_head(self.final_hidden(idx)))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), reduction=reduction)


def set_parameter_dtypes(model, dtype, adam_rows=""):
    """In bfloat16 runs, the tensors a reference stores in bfloat16 are bfloat16 parameters: the
    speedrun's embedding, value embeddings and bigram table (their AdamW state follows them, record
    #28's), and those of --adam_rows with bf16=weight or all (bf16=none: float32); every other parameter
    stays float32. Called before the optimizers and DDP take the parameters."""
    if dtype != "bfloat16":
        return
    rows = parse_adam_rows(adam_rows)
    embeddings = {"wte", "ve", "bigram"} if model.config.speedrun else set()
    for name, p in model.named_parameters():
        table = table_name(name)
        if rows.get(table, {}).get("bf16", "all" if table in embeddings else "none") != "none":
            p.data = p.data.bfloat16()


def set_compute_dtype(model, dtype, device_type):
    """The context a forward pass runs in for --dtype `dtype`: GPT-2 uses bfloat16 autocast; the
    modern model computes in bfloat16 itself (activations and products, norms, rotary and the soft
    cap in float32 inside), as modded-nanogpt does, with float32 parameters."""
    if model.config.modern:
        model.compute_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        return nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()


BLOCK_PARAMS = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
# The speedrun's per-layer tensors in file order: its matrices, where GPT-2's are in the table, and
# after the head the tensors only it has (SPEC.md "Checkpoint files").
SPEEDRUN_MATRICES = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"]
SPEEDRUN_GATES, SPEEDRUN_SCALARS = ["attn.gate.weight"], ["lambdas", "attn.value_scales"]


def params_in_file_order(model):
    """The parameters in llmc/gpt2.h param_table() order (the checkpoint layout): each table
    entry in turn, the per-layer entries layer by layer. GPT-2: wte, wpe, the blocks, ln_f's weight
    and bias; modern: wte, ln_e, the blocks (no norm biases), ln_f, the head's weight and bias;
    speedrun: wte, the blocks' matrices (the attention's over the layers that have it), the head's
    weight, the value embeddings (with the bigram embedding: its table, aligned as theirs), the gates,
    the skip weights, the lambdas, the value scales (with the smear: its gate's weights and lambda;
    with the bigram embedding: its gates; with the value-embedding gates: theirs; with the residual
    lambdas: resid_lambdas, post_lambdas; with XSA: xsa_alpha; in record #89's plan: x0_gates, skip_gate,
    head_gates; with the attention lambdas: attn_lambdas; with its MUDD gate generators: mudd_gate_w1,
    mudd_gate_w2, mudd_gate_b2, mudd_gate_scale; with its MUDD dense connections: mudd_w1, mudd_w2, mudd_b2)."""
    t = model.transformer

    def stacked(names):
        return [block.get_parameter(name) for name in names for block in t.h
                if name in dict(block.named_parameters())]

    if model.config.speedrun:
        smear = [model.smear_weight, model.smear_lambda] if model.config.smear else []
        bigram, bigram_gates = ([model.bigram.weight], [model.bigram_gates]) if model.config.bigram else ([], [])
        ve_gates = [model.ve_gates] if model.config.ve_gates else []
        lambdas = [model.resid_lambdas, model.post_lambdas] if model.config.resid_lambdas else []
        xsa = [model.xsa_alpha] if model.config.xsa else []
        record89 = [q for q in (model.x0_gates, model.skip_gate, model.head_gates, model.attn_lambdas)
                    if q is not None]
        record89 += ([model.mudd_gate_w1, model.mudd_gate_w2, model.mudd_gate_b2, model.mudd_gate_scale]
                     if model.config.mudd_gates else [])
        record89 += [model.mudd_w1, model.mudd_w2, model.mudd_b2] if model.config.mudd_connections else []
        unet = [model.skip_weights] if model.skip_weights is not None else []  # none in record #89's plan
        return ([t.wte.weight] + stacked(SPEEDRUN_MATRICES) + [model.lm_head.weight] + [ve.weight for ve in t.ve]
                + bigram + stacked(SPEEDRUN_GATES) + unet + stacked(SPEEDRUN_SCALARS) + smear
                + bigram_gates + ve_gates + lambdas + xsa + record89)
    present = dict(t.h[0].named_parameters())
    blocks = stacked([name for name in BLOCK_PARAMS if name in present])
    if model.config.modern:
        return [t.wte.weight, t.ln_e.weight] + blocks + [t.ln_f.weight, model.lm_head.weight, model.lm_head.bias]
    return [t.wte.weight, t.wpe.weight] + blocks + [t.ln_f.weight, t.ln_f.bias]


def init_weights(model, seed, record_init=0):
    """SPEC.md "Model initialisation from a seed". The C++ trainers reproduce these weights bit
    for bit, so the draw order (one normal_ call per tensor, on the CPU) is part of the contract."""
    if model.config.speedrun:
        return init_weights_speedrun(model, seed, record_init)
    if model.config.modern:
        return init_weights_modern(model, seed)
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


def init_weights_modern(model, seed):
    """The modern model's init (SPEC.md): wte N(0, 1), then per layer qkvw and fcw N(0, sqrt(0.33/C));
    the output projections and the head zero, biases zero, gains one."""
    config, t = model.config, model.transformer
    std = math.sqrt(0.33 / config.channels)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        t.wte.weight.normal_(0.0, 1.0)
        t.wte.weight[config.vocab_size:].zero_()
        for block in t.h:
            block.attn.c_attn.weight.normal_(0.0, std)
            block.mlp.c_fc.weight.normal_(0.0, std)


def init_weights_speedrun(model, seed, record_init=0):
    """The speedrun's init, its reference's values (which draws them unseeded, in its own order):
    wte and the value embeddings N(0, 1) (every row), then per layer qkvw and fcw uniform in
    +-sqrt(3) * 0.5 / sqrt(C); the output projections, the gates and the head zero; the skip weights
    one, the lambdas (1, 0) and the value scales 0.5; record #89's smear and bigram table zero, its
    bigram gates 0.05, its value-embedding gates' weights zero (each gate 1); its MUDD gate generators' W1
    uniform in +-1/sqrt(C) (one draw a generator, after every layer's), W2 zero, b2 mudd_gate_bias_init and the
    scale 0.1; its MUDD dense connections' likewise (their draws after the gate generators'), b2
    mudd_bias_init. record_init 89 (--record_init): record #89's, the head N(0, 0.005) drawn in wte's place
    and wte its copy (tied at init), the value embeddings N(0, 0.01), and each layer's c_proj of the attention
    drawn with c_attn and c_fc, in that order."""
    config, t = model.config, model.transformer
    bound = math.sqrt(3) * 0.5 / math.sqrt(config.channels)
    record89 = record_init == 89
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        if model.skip_weights is not None:
            model.skip_weights.fill_(1.0)
        if record89:
            model.lm_head.weight.normal_(0.0, 0.005)
            t.wte.weight.copy_(model.lm_head.weight)
        else:
            t.wte.weight.normal_(0.0, 1.0)
        for embedding in t.ve:
            embedding.weight.normal_(0.0, 0.01 if record89 else 1.0)
        for block in t.h:
            if block.lambdas is not None:
                block.lambdas.copy_(torch.tensor([1.0, 0.0]))
            if block.attn is not None:
                block.attn.value_scales.fill_(0.5)
                block.attn.c_attn.weight.uniform_(-bound, bound)
                if record89:
                    block.attn.c_proj.weight.uniform_(-bound, bound)
            block.mlp.c_fc.weight.uniform_(-bound, bound)
        if model.bigram_gates is not None:
            model.bigram_gates.fill_(BIGRAM_GATE_INIT)
        if model.resid_lambdas is not None:
            model.resid_lambdas.fill_(RESID_LAMBDA_INIT)
            model.post_lambdas.fill_(1.0)
        if model.skip_gate is not None:
            model.skip_gate.copy_(torch.tensor([SKIP_LAMBDA_INIT, SKIP_GATE_INIT]))
        if model.head_gates is not None:
            model.head_gates.fill_(HEAD_GATE_INIT)
        if model.attn_lambdas is not None:
            model.attn_lambdas.copy_(torch.tensor([ATTN_LAMBDA_INIT] * model.config.num_layers))
        if model.mudd_gate_w1 is not None:
            mudd_bound = 1.0 / math.sqrt(config.channels)  # kaiming_uniform_(a=sqrt(5))'s
            for generator in model.mudd_gate_w1:
                generator.uniform_(-mudd_bound, mudd_bound)
            model.mudd_gate_b2.copy_(mudd_gate_bias_init())
            model.mudd_gate_scale.fill_(MUDD_GATE_SCALE_INIT)
        if model.mudd_w1 is not None:
            mudd_bound = 1.0 / math.sqrt(config.channels)  # kaiming_uniform_(a=sqrt(5))'s
            for generator in model.mudd_w1:
                generator.uniform_(-mudd_bound, mudd_bound)
            model.mudd_w2.zero_()
            model.mudd_b2.copy_(mudd_bias_init())


# ------------------------------------------------------------------------------------------------
# Checkpoints (llm.c format)


def header_checksum_start(header):
    """The CRC-32 of a checksummed header with its checksum slot read as 0: where the file's starts."""
    start = header.copy()
    start[HEADER_CHECKSUM_KIND_SLOT] = CHECKSUM_CRC32
    start[HEADER_CHECKSUM_SLOT] = 0
    return zlib.crc32(start.tobytes())


def write_checkpoint(model, path, version):
    """Writes FP32 (version CHECKPOINT_FP32) or BF16 (CHECKPOINT_BF16, rounded to nearest even)
    parameters, with a checksum. The other architectures' files carry version 6 or 7 instead of
    3 or 5, and their architecture id in header slot 8 (ARCH_IDS)."""
    c = model.config
    header = np.zeros(HEADER_INTS, np.int32)
    file_version = MODERN_CHECKPOINT_VERSION[version] if c.modern else version
    header[:8] = [CHECKPOINT_MAGIC, file_version, c.max_seq_len, c.vocab_size, c.num_layers,
                  c.num_heads, c.channels, c.padded_vocab_size]
    header[ARCH_SLOT] = ARCH_IDS[c.arch]
    header[FEATURES_SLOT] = ((FEATURE_SMEAR if c.smear else 0) | (FEATURE_BIGRAM if c.bigram else 0)
                             | (FEATURE_ROTARY_PAIRS if c.rotary_pairs else 0) | (FEATURE_VE_GATES if c.ve_gates else 0)
                             | (FEATURE_RESID_LAMBDAS if c.resid_lambdas else 0) | (FEATURE_XSA if c.xsa else 0)
                             | (FEATURE_RECORD89_PLAN if c.record89_plan else 0)
                             | (FEATURE_PAIRED_HEADS if c.paired_heads else 0)
                             | (FEATURE_ATTN_LAMBDAS if c.attn_lambdas else 0)
                             | (FEATURE_MUDD_GATES if c.mudd_gates else 0)
                             | (FEATURE_MUDD_CONNECTIONS if c.mudd_connections else 0)
                             | (FEATURE_COMPOSED_ATTENTION if c.composed_attention else 0))
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


def read_checkpoint(path, flash=False, fp8=False, fp8_head=False):
    """Returns a CPU model holding the parameters of a checkpoint: GPT-2 (version 3 or 5), or modern
    or speedrun (version 6 or 7, header slot 8 telling which)."""
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
    precisions = {CHECKPOINT_FP32: CHECKPOINT_FP32, CHECKPOINT_BF16: CHECKPOINT_BF16}
    precisions.update({v: k for k, v in MODERN_CHECKPOINT_VERSION.items()})
    if version not in precisions:
        fail(f"{path}: unsupported checkpoint version {version} (expected {CHECKPOINT_FP32}/{CHECKPOINT_BF16} "
             f"for GPT-2 in FP32/BF16, {MODERN_CHECKPOINT_VERSION[CHECKPOINT_FP32]}/"
             f"{MODERN_CHECKPOINT_VERSION[CHECKPOINT_BF16]} for the modern and speedrun architectures)")
    arch = "gpt2"
    if version in MODERN_CHECKPOINT_VERSION.values():
        ids = {ARCH_IDS["modern"]: "modern", ARCH_IDS["speedrun"]: "speedrun"}
        if header[ARCH_SLOT] not in ids:
            fail(f"{path}: version {version} is a modern or speedrun checkpoint, but header slot {ARCH_SLOT} "
                 f"holds architecture id {header[ARCH_SLOT]}, not one of {sorted(ids)}: the header is damaged; "
                 f"re-create it")
        arch = ids[int(header[ARCH_SLOT])]
    version = precisions[version]
    features = int(header[FEATURES_SLOT])
    speedrun_only = (FEATURE_SMEAR | FEATURE_BIGRAM | FEATURE_VE_GATES | FEATURE_RESID_LAMBDAS | FEATURE_XSA
                     | FEATURE_RECORD89_PLAN | FEATURE_PAIRED_HEADS | FEATURE_ATTN_LAMBDAS | FEATURE_MUDD_GATES
                     | FEATURE_MUDD_CONNECTIONS | FEATURE_COMPOSED_ATTENTION)
    if (features & ~(speedrun_only | FEATURE_ROTARY_PAIRS) or (features & speedrun_only and arch != "speedrun")
            or (features & FEATURE_ROTARY_PAIRS and arch == "gpt2")):
        fail(f"{path}: header slot {FEATURES_SLOT} holds features {features}, but only the speedrun has any but the "
             f"rotary pairs ({FEATURE_SMEAR}: the smear, {FEATURE_BIGRAM}: the bigram embedding, {FEATURE_VE_GATES}: "
             f"the value-embedding gates, {FEATURE_RESID_LAMBDAS}: the residual lambdas, {FEATURE_XSA}: XSA, "
             f"{FEATURE_RECORD89_PLAN}: record #89's plan, {FEATURE_PAIRED_HEADS}: its paired heads, "
             f"{FEATURE_ATTN_LAMBDAS}: its attention lambdas, {FEATURE_MUDD_GATES}: its MUDD gate generators, "
             f"{FEATURE_MUDD_CONNECTIONS}: its MUDD dense connections, {FEATURE_COMPOSED_ATTENTION}: its composed "
             f"attention), and GPT-2 has "
             f"no rotary ({FEATURE_ROTARY_PAIRS}: its pairs): the header is damaged or the file comes from a newer "
             f"version; re-create it")
    config = make_config(num_layers, num_heads, channels, max_seq_len, vocab_size, source=path, arch=arch,
                         smear=features & FEATURE_SMEAR, bigram=features & FEATURE_BIGRAM,
                         rotary_pairs=features & FEATURE_ROTARY_PAIRS, ve_gates=features & FEATURE_VE_GATES,
                         resid_lambdas=features & FEATURE_RESID_LAMBDAS, xsa=features & FEATURE_XSA,
                         record89_plan=features & FEATURE_RECORD89_PLAN,
                         paired_heads=features & FEATURE_PAIRED_HEADS, attn_lambdas=features & FEATURE_ATTN_LAMBDAS,
                         mudd_gates=features & FEATURE_MUDD_GATES,
                         mudd_connections=features & FEATURE_MUDD_CONNECTIONS,
                         composed_attention=features & FEATURE_COMPOSED_ATTENTION)
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
    model = GPT(config, flash, fp8, fp8_head)
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


def shard_token_count(path):
    """The token count of a shard (dev/SPEC.md "Token shard"), its header checked against its size."""
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
    return count


def read_shard(path, vocab_size):
    """A shard's tokens (uint16), checked against the vocabulary."""
    tokens = np.fromfile(path, np.uint16, offset=HEADER_INTS * 4)
    largest = int(tokens.max())
    if largest >= vocab_size:
        fail(f"{path}: token id {largest} is not below the vocab size {vocab_size}; "
             f"the shard was made for another tokenizer")
    return tokens


def shard_paths(pattern, flag):
    paths = sorted(glob.glob(pattern))
    if not paths:
        fail(f"{flag} {pattern}: no files match; check the pattern (quote it so the shell "
             f"does not expand it) or prepare the data first")
    return paths


class ShardLoader:
    """Batches from token shards in SPEC.md "Data order": shards in a per-epoch order, batches of
    each shard in a per-shard order, both shuffled by one MT19937 shared by all ranks."""

    def __init__(self, pattern, flag, B, T, rank, world, shuffle, seed, vocab_size):
        self.paths = shard_paths(pattern, flag)
        self.B, self.T, self.rank, self.world = B, T, rank, world
        self.shuffle, self.vocab_size = shuffle, vocab_size
        self.num_batches = [self._num_batches(path) for path in self.paths]
        self.rng = MT19937(seed)
        self.loaded_index, self.tokens = None, None
        self.reset()

    def _num_batches(self, path):
        count = shard_token_count(path)
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
            self.tokens = read_shard(self.paths[index], self.vocab_size)
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


DOCUMENT_START = 50256  # GPT-2's end of text, which the data tools write before every document


class DocumentLoader:
    """Document-aligned sequences in SPEC.md "Document-aligned order" (llmc/dataloader.h's
    DocumentLoader): every row is T+1 tokens from a document start, chosen as modded-nanogpt's
    align_to_bos loader chooses them but searched to the shard's end, and cut where the shard has
    no document start. A step's world*grad_accum*B sequences come one after another from one
    stream that every rank computes alike; micro batch m gives rank r, row b the step's sequence
    (m*world + r)*B + b. Epochs take the shards in the order of permutation(num_shards) drawn from
    MT19937(seed) at each epoch's start (the identity without shuffle). With a document cap C > 0
    a row is a group of documents capped at C tokens, as record #89 packs a forward (_pack_group).
    reshape() changes (T, grad_accum, cap) between steps."""

    def __init__(self, pattern, flag, B, T, grad_accum, rank, world, shuffle, seed, vocab_size, cap=0):
        self.paths = shard_paths(pattern, flag)
        self.B, self.rank, self.world = B, rank, world
        self.shuffle, self.vocab_size = shuffle, vocab_size
        self._set_shape(T, grad_accum, cap)
        self.rng = MT19937(seed)
        self.epoch = -1
        self._begin_epoch()
        self._read_step()

    @property
    def shape(self):
        return self.T, self.grad_accum, self.cap

    def _set_shape(self, T, grad_accum, cap):
        self.T, self.grad_accum, self.cap = T, grad_accum, cap
        self.window = 2 * grad_accum * self.world * self.B * T  # the tokens a step searches in the reference
        for path in self.paths:
            count = shard_token_count(path)
            if count < self.window + 2:
                fail(f"{path}: {count} tokens are too few for one step of document-aligned "
                     f"sequences, which are sought in twice a step's tokens: 2 x --total_batch_size "
                     f"{self.window // 2} ({grad_accum} micro batches x B={self.B} x T={T} x {self.world} "
                     f"process{'' if self.world == 1 else 'es'}) + 2 needs at least {self.window + 2}; use a "
                     f"smaller --total_batch_size (or -b, -t) or a longer shard")

    def reshape(self, T, grad_accum, cap):
        """Reads the step not yet taken again with the new shape, from where its search began: the
        loader then reads what one built at that position with this shape would."""
        if (T, grad_accum, cap) == self.shape:
            return
        assert self.batch == 0, "a loader reshapes between steps"
        epoch, shard_order, shard_position, position, rng_state = self.step_start
        self.epoch, self.shard_order = epoch, shard_order
        self.rng.state, self.rng.index = list(rng_state[0]), rng_state[1]
        self._open_shard(shard_position)
        self.position = position
        self._set_shape(T, grad_accum, cap)
        self._read_step()

    def _begin_epoch(self):
        self.epoch += 1
        n = len(self.paths)
        self.shard_order = self.rng.permutation(n) if self.shuffle else list(range(n))
        self._open_shard(0)

    def _open_shard(self, position):
        self.shard_position, self.position = position, 0
        self.tokens = read_shard(self.paths[self.shard_order[position]], self.vocab_size)
        self.documents = np.flatnonzero(self.tokens == DOCUMENT_START)

    def _open_next_shard(self):
        if self.shard_position + 1 < len(self.paths):
            self._open_shard(self.shard_position + 1)
        else:
            self._begin_epoch()

    def _next_document(self, start):
        """The first document start at or after `start`, or the shard's length when none is."""
        i = np.searchsorted(self.documents, start)
        return int(self.documents[i]) if i < len(self.documents) else len(self.tokens)

    def _next_sequence(self):
        """Where the stream's next sequence starts in the shard held. As the reference: at the
        first document start at or after the position, which moves on to the first document start
        T or more tokens after that. The cuts: no document start with T tokens after it, the
        position itself; none T or more tokens on, T tokens on; fewer than T+1 tokens left, the
        next shard."""
        T = self.T
        if self.position + T >= len(self.tokens):
            self._open_next_shard()
        start = self._next_document(self.position)
        if start + T >= len(self.tokens):
            start = self.position
        end = self._next_document(start + T)
        self.position = end if end < len(self.tokens) else start + T
        return start

    def _pack_group(self, position):
        """Record #89's Shard.next_batch for one forward: from the first document start at or after
        `position`, each document's first tokens up to the cap (a document runs to the next start or
        the shard's end) until T+1 are taken, the last one cut to fit. Returns the row and the
        document start after the last document's, or None where no start is left before it is full."""
        i = int(np.searchsorted(self.documents, position))
        pieces, filled = [], 0
        while filled < self.T + 1:
            if i == len(self.documents):
                return None
            start = int(self.documents[i])
            i += 1
            end = int(self.documents[i]) if i < len(self.documents) else len(self.tokens)
            n = min(end - start, self.cap, self.T + 1 - filled)
            pieces.append(self.tokens[start:start + n])
            filled += n
        return np.concatenate(pieces), int(self.documents[i]) if i < len(self.documents) else len(self.tokens)

    def _packed_step(self):
        """The step's groups, all from the shard held; where it cannot give them all, the whole step
        from the next shard's first document start (as the reference's call for 8 processes moves
        on). A shard that cannot give one step from its start is an error."""
        while True:
            rows, position = [], self.position
            for _ in range(self.grad_accum * self.world * self.B):
                group = self._pack_group(position)
                if group is None:
                    break
                row, position = group
                rows.append(row)
            else:
                self.position = position
                return rows
            if self.position == 0:
                count = self.grad_accum * self.world * self.B
                fail(f"{self.paths[self.shard_order[self.shard_position]]}: its documents, capped at {self.cap} "
                     f"tokens each, hold fewer than one step's {count} sequence{'' if count == 1 else 's'} of "
                     f"T+1 = {self.T + 1} tokens from its first document start: use a smaller --seq_len or "
                     f"--total_batch_size, a larger cap, or longer shards")
            self._open_next_shard()

    def _read_step(self):
        """The step's sequences in stream order, this rank's rows kept. Where the step began is kept
        for reshape() before it may move on to the next shard. Without a cap the step begins in the
        next shard when its window and one token more do not fit (the reference's test)."""
        self.step_start = (self.epoch, list(self.shard_order), self.shard_position, self.position,
                           (list(self.rng.state), self.rng.index))
        if self.cap > 0:
            sequences = self._packed_step()
        else:
            if self.position + self.window + 1 >= len(self.tokens):
                self._open_next_shard()
            sequences = []
            for _ in range(self.grad_accum * self.world * self.B):
                start = self._next_sequence()
                sequences.append(self.tokens[start:start + self.T + 1])
        per_batch = self.world * self.B
        rows = [row.astype(np.int64) for q, row in enumerate(sequences) if q % per_batch // self.B == self.rank]
        self.rows = torch.from_numpy(np.stack(rows)).view(self.grad_accum, self.B, self.T + 1)
        self.batch = 0

    def next_batch(self):
        """Returns (inputs, targets) of this rank's next micro batch, each a [B, T] int64 CPU tensor."""
        rows = self.rows[self.batch]
        self.batch += 1
        if self.batch == self.grad_accum:
            self._read_step()
        return rows[:, :-1], rows[:, 1:]


# ------------------------------------------------------------------------------------------------
# Document-causal attention in blocks with a sliding window (dev/SPEC.md "Attention blocks",
# llmc/attention_blocks.h; the window's schedule as llmc/schedulers.h)

ATTENTION_BLOCK = 128


def next_multiple_of_n(v, n):
    return next(x for x in range(n, int(v) + 1 + n, n) if x >= v)


def attention_window_blocks(step, num_steps):
    """modded-nanogpt's window at step `step` of num_steps, in blocks: 1 growing to 14."""
    x = step / num_steps
    assert 0 <= x <= 1
    return next_multiple_of_n(1728 * x, n=ATTENTION_BLOCK) // ATTENTION_BLOCK


def layer_window_blocks(window, window_blocks, short_window_blocks=None):
    """A layer's window among the run's: the long window_blocks (window "L") or the short one ("S"),
    short_window_blocks or, where None, half the long one rounded down."""
    if window == "L":
        return window_blocks
    return window_blocks // 2 if short_window_blocks is None else short_window_blocks


def window_setting(text, what):
    """--window_blocks' value and a stage's aw= (llmc/stages.h's parse_window_setting): "L" or "S/L"
    as (long, short), short None where not given. `what` names it in messages. A short window takes a
    fixed long one: the schedule's grows from 1 block, and 0 is none."""
    first, slash, rest = text.partition("/")
    long_text, short_text = (rest, first) if slash else (first, None)

    def blocks(digits):
        if not INTEGER.fullmatch(digits) or not -2**31 <= int(digits) < 2**31:
            fail(f"{what}: give the window in blocks of 128 tokens (N, -1 for the schedule, 0 for none), or the "
                 f"short and the long window as S/L")
        return int(digits)

    long_blocks = blocks(long_text)
    if long_blocks < -1:
        fail(f"{what}: give a window of 1 or more blocks, -1 for the schedule or 0 for none")
    if not slash:
        return long_blocks, None
    short_blocks = blocks(short_text)
    if long_blocks <= 0:
        fail(f"{what}: a short window takes a fixed long one of 1 or more blocks (the schedule's grows from 1, 0 is "
             f"none): give S/L with 1 <= S <= L, or the long window alone")
    if not 1 <= short_blocks <= long_blocks:
        fail(f"{what}: the short window {short_blocks} is not within 1 and the long window {long_blocks}: give S/L "
             f"with 1 <= S <= L")
    return long_blocks, short_blocks


def attention_block_lists(tokens, window_blocks):
    """modded-nanogpt's create_blockmasks and build_bm(window_blocks) for one sequence (a 1-D tensor
    of token ids, its length a multiple of ATTENTION_BLOCK): for each query block, the number of
    partial and of full key blocks and each list nearest first, as flex attention reads them
    (partial_num, partial_indices, full_num, full_indices). A full count the reference leaves
    negative (a window of 0) is clamped to 0, which is what flex attention makes of it."""
    docs = (tokens == DOCUMENT_START).cumsum(0)
    num_blocks = len(tokens) // ATTENTION_BLOCK
    block_idx = torch.arange(num_blocks, dtype=torch.int32)
    causal_any = block_idx[:, None] >= block_idx
    causal_all = block_idx[:, None] > block_idx
    docs_low = docs.view(-1, ATTENTION_BLOCK)[:, 0]
    docs_high = docs.view(-1, ATTENTION_BLOCK)[:, -1]
    document_any = (docs_low[:, None] <= docs_high) & (docs_high[:, None] >= docs_low)
    document_all = (docs_low[:, None] == docs_high) & (docs_high[:, None] == docs_low)
    blockmask_any = causal_any & document_any
    blockmask_all = causal_all & document_all

    def dense_to_ordered(dense):
        count = dense.sum(dim=-1, dtype=torch.int32)
        indices = dense.argsort(dim=-1, descending=False, stable=True).flip(-1).to(torch.int32)
        return count, indices

    partial_num, partial_indices = dense_to_ordered(blockmask_any & ~blockmask_all)
    full_num, full_indices = dense_to_ordered(blockmask_all)
    window = torch.tensor(window_blocks, dtype=torch.int32)
    partial_num = torch.clamp_max(partial_num, torch.clamp_min(window - full_num, 1))
    full_num = torch.clamp_min(torch.clamp_max(full_num, window - 1), 0)
    return partial_num, partial_indices, full_num, full_indices


def document_attention_mask(tokens, window_blocks, window_tokens=None):
    """The [T, T] boolean mask of one sequence (True where query i attends to key j): document-causal
    (j <= i, one document) within the key blocks attention_block_lists selects for i's block; every
    earlier key of the document where window_blocks is None. With window_tokens w (a number) instead
    within w tokens: i - w <= j (FlashAttention's window_size=(w, 0), record #89's)."""
    docs = (tokens == DOCUMENT_START).cumsum(0)
    position = torch.arange(len(tokens))
    document_causal = (position[:, None] >= position) & (docs[:, None] == docs)
    if window_tokens is not None:
        return document_causal & (position[:, None] - position <= window_tokens)
    if window_blocks is None:
        return document_causal
    partial_num, partial_indices, full_num, full_indices = attention_block_lists(tokens, window_blocks)
    num_blocks = len(tokens) // ATTENTION_BLOCK
    selected = torch.zeros(num_blocks, num_blocks, dtype=torch.bool)
    for q in range(num_blocks):
        selected[q, partial_indices[q, :partial_num[q]].long()] = True
        selected[q, full_indices[q, :full_num[q]].long()] = True
    tokens_selected = selected.repeat_interleave(ATTENTION_BLOCK, 0).repeat_interleave(ATTENTION_BLOCK, 1)
    return document_causal & tokens_selected


def paired_rows(idx):
    """The rows of idx [B, T] doubled for record #89's paired heads, [B, 2T]: each token followed by a
    placeholder that opens no document, so that a document of tokens [s, e) is positions [2s, 2e) (the
    reference's sequence lengths doubled)."""
    placeholder = torch.full_like(idx, DOCUMENT_START + 1)
    return torch.stack((idx, placeholder), dim=2).view(idx.size(0), 2 * idx.size(1))


def flex_attention_available():
    try:
        from torch.nn.attention.flex_attention import BlockMask  # noqa: F401
    except ImportError:
        return False
    return True


def compiled_flex_attention():
    """FlexAttention compiled: uncompiled it applies the mask_mod to every score and leaves the
    BlockMask's block lists, and so the window, out (PyTorch 2.11). Inside a compiled forward it is
    FlexAttention itself, which that compile fuses (the global set while tracing would be a guard
    that recompiles the forward); outside, FlexAttention compiled once."""
    global _compiled_flex_attention
    from torch.nn.attention.flex_attention import flex_attention
    if torch.compiler.is_compiling():
        return flex_attention
    if _compiled_flex_attention is None:
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex_attention


_compiled_flex_attention = None


def document_block_mask(idx, window_blocks, window_tokens=None):
    """FlexAttention's BlockMask for the rows of idx [B, T] (on the GPU), as the reference builds it:
    attention_block_lists' blocks (every block up to the query's where window_blocks is None) and
    the document-causal mask inside them. With window_tokens w: the blocks of a window one block
    wider (which hold every key within w tokens), all masked, the mask also i - w <= j."""
    from torch.nn.attention.flex_attention import BlockMask
    window = idx.size(1) // ATTENTION_BLOCK if window_blocks is None else window_blocks
    lists = [attention_block_lists(row.cpu(), window if window_tokens is None else window + 1) for row in idx]
    partial_num, partial_indices, full_num, full_indices = (
        torch.stack([row[i] for row in lists])[:, None].to(idx.device).contiguous() for i in range(4))
    docs = (idx == DOCUMENT_START).cumsum(1)

    def document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (docs[b, q_idx] == docs[b, kv_idx])

    if window_tokens is None:
        return BlockMask.from_kv_blocks(partial_num, partial_indices, full_num, full_indices,
                                        BLOCK_SIZE=ATTENTION_BLOCK, mask_mod=document_causal)

    def document_window(b, h, q_idx, kv_idx):
        return document_causal(b, h, q_idx, kv_idx) & (q_idx - kv_idx <= window_tokens)

    # Each query block's full blocks follow its partial ones, as one list of partial blocks.
    blocks = partial_num.size(-1)
    take = torch.arange(blocks, device=idx.device)
    run_indices = torch.where(take < partial_num[..., None], partial_indices,
                              full_indices.gather(-1, (take - partial_num[..., None]).clamp(0, blocks - 1)))
    return BlockMask.from_kv_blocks(partial_num + full_num, run_indices.contiguous(),
                                    BLOCK_SIZE=ATTENTION_BLOCK, mask_mod=document_window)


class RandomTokens:
    """One batch of uniform random tokens from a seeded generator, returned by every call. With
    documents the rows are document-aligned, as DocumentLoader's: each opens with a document start,
    and about one token in 64 starts another, at least one of them on a 128-token block's edge and
    one a document of one token, so that the document masks have something to keep apart (the
    tokens without documents are the same)."""

    def __init__(self, B, T, vocab_size, seed, documents=False):
        generator = torch.Generator().manual_seed(seed)
        window = torch.randint(0, vocab_size, (B, T + 1), generator=generator)
        if documents:
            if vocab_size <= DOCUMENT_START:
                fail(f"--documents 1 starts documents with token {DOCUMENT_START}, outside the vocabulary of "
                     f"{vocab_size}; drop --vocab_size")
            blocks = T // ATTENTION_BLOCK
            for row in window:
                starts = torch.randint(1, T + 1, (max(1, T // 64),), generator=generator).tolist()
                edge = ATTENTION_BLOCK * int(torch.randint(1, blocks, (1,), generator=generator)) if blocks > 1 else 0
                single = int(torch.randint(1, T, (1,), generator=generator))
                for start in starts + [0, edge, single, single + 1]:
                    row[start] = DOCUMENT_START
        self.batch = (window[:, :-1].contiguous(), window[:, 1:].contiguous())

    def next_batch(self):
        return self.batch


# ------------------------------------------------------------------------------------------------
# Stage plan (llmc/stages.h): the run as stages, each a share of the scheduled steps with its own
# sequence length, tokens a step, document cap, attention window, learning-rate multiplier and loss
# weights


STAGE_KEYS = {"t": "seq_len", "z": "total_batch_size", "cap": "cap", "aw": "window_blocks", "lr": "lr_multiplier",
              "mtp": "next_token_weights", "pw": "prefix_weight"}


@dataclass
class Stage:
    share: float  # of the scheduled steps; 0 for the extension
    extension: int  # steps after the scheduled ones (the last stage only)
    seq_len: int
    total_batch_size: int  # -1: one micro batch
    cap: int  # tokens of one document a sequence takes; 0: all
    window_blocks: int  # -1: the schedule
    short_window_blocks: object  # None: half the long window, rounded down
    lr_multiplier: float
    next_token_weights: tuple = ((1.0,), (1.0,))  # (at the stage's first step, at its end): mtp=A>B
    prefix_weight: tuple = (0.0, 0.0)  # pw=A>B


@dataclass
class StepPlan:
    stage: int  # 0-based
    seq_len: int
    tokens: int  # a step, over all processes
    micro_steps: int
    cap: int
    window_blocks: int  # resolved: the schedule's at -1; 0 none
    short_window_blocks: int  # resolved: half the long one where not given
    lr_multiplier: float
    next_token_weights: list = None  # the loss's at this step (loss_weights_at)
    prefix_weight: float = 0.0


def loss_weights_at(stage, t):
    """A stage's loss weights at t = (s - first) / (end - first) of its steps: each a + (b - a) t in
    double, rounded to float32 (record #89's TrainingSchedule, a float32 tensor of Python floats)."""
    def lerp(a, b):
        return float(np.float32(a + (b - a) * t))
    return [lerp(a, b) for a, b in zip(*stage.next_token_weights)], lerp(*stage.prefix_weight)


def loss_weight(text):
    """A loss weight of mtp= or pw= as -mtp and -pw read theirs (a float), or None where it is no
    plain decimal within [0, 1]."""
    weight = float(np.float32(text)) if DECIMAL.fullmatch(text) else None
    return weight if weight is not None and 0.0 <= weight <= 1.0 else None


def loss_weight_ramp(key, text, number):
    """mtp='s or pw='s value: "A" (constant) or "A>B", (start, end); mtp's ends tuples of 1 to
    MAX_PREDICTED_TOKENS weights, as many at each."""
    ends = []
    for end in text.split(">", 1):
        weights = [loss_weight(item) for item in end.split(",")] if key == "mtp" else [loss_weight(end)]
        if None in weights or len(weights) > MAX_PREDICTED_TOKENS:
            wanted = (f"1 to {MAX_PREDICTED_TOKENS} next-token weights within [0, 1] apart by commas (1,0.5,0.25)"
                      if key == "mtp" else "the prefix term's weight within [0, 1]")
            fail(f"--stages: stage {number} sets {key}={text}; {key} takes {wanted}, or START>END")
        ends.append(tuple(weights) if key == "mtp" else weights[0])
    if len(ends) == 1:
        ends.append(ends[0])
    if key == "mtp" and len(ends[0]) != len(ends[1]):
        fail(f"--stages: stage {number} sets mtp={text}: {len(ends[0])} weights at the start and {len(ends[1])} at "
             f"the end; give as many at each end")
    return tuple(ends)


def loss_ramp_text(stage):
    """"mtp 1,0.5,0.25>1,0.5,0, pw 0.25" (llmc/stages.h's LossWeightRamp::describe)."""
    def ends(a, b):
        return a if a == b else f"{a}>{b}"
    mtp = [",".join(f"{w:g}" for w in end) for end in stage.next_token_weights]
    return f"mtp {ends(*mtp)}, pw {ends(*(f'{w:g}' for w in stage.prefix_weight))}"


# The numbers of a plan, in plain ASCII notation (no signs but an integer's minus, no "inf", no "1_000").
INTEGER = re.compile(r"-?[0-9]+")
DECIMAL = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def stage_share(word, number):
    """A stage's first word: (share, extension steps)."""
    a, slash, b = word.partition("/")
    if word.startswith("+") and INTEGER.fullmatch(word[1:]) and int(word[1:]) >= 1:
        return 0.0, int(word[1:])
    if slash and INTEGER.fullmatch(a) and INTEGER.fullmatch(b) and int(a) > 0 and int(b) > 0:
        return int(a) / int(b), 0
    if DECIMAL.fullmatch(word) and 0 < float(word) < math.inf:
        return float(word), 0
    fail(f"--stages: stage {number} begins with '{word}', which is no share of the steps: give a positive "
         f"decimal (0.25), a fraction of two positive integers (1/3) or +E extension steps (+15)")


def stage_value(key, text, number):
    """KEY=VALUE's value, checked against what the key takes."""
    if key == "aw":
        return window_setting(text, f"--stages: stage {number}: aw={text}")
    if key in ("mtp", "pw"):
        return loss_weight_ramp(key, text, number)
    minimum = {"t": 1, "z": -1, "cap": 0}
    number_format = DECIMAL if key == "lr" else INTEGER
    value = (float if key == "lr" else int)(text) if number_format.fullmatch(text) else None
    if key == "lr":
        good = value is not None and value < math.inf
        wanted = "a number >= 0"
    else:
        good = value is not None and value >= minimum[key] and not (key == "z" and value == 0)
        wanted = {"t": "an integer >= 1", "z": "an integer >= 1, or -1 for one micro batch",
                  "cap": "an integer >= 0 (0: all of a document)"}[key]
    if not good:
        fail(f"--stages: stage {number} sets {key}={text}; {key} takes {wanted}")
    return value


def parse_stages(text, seq_len, total_batch_size, window_blocks, short_window_blocks=None, next_token_weights=(1.0,),
                 prefix_weight=0.0):
    """The stages of PLAN (`;` between stages; a stage's words: its share, then KEY=VALUE), a key
    not given taking the stage before's value, the first stage's the flags'; aw= sets both windows,
    aw=N the short one to half of N; mtp= and pw= a constant or START>END. "" is one stage of the
    flags."""
    weights = tuple(next_token_weights)
    previous = Stage(1.0, 0, seq_len, total_batch_size, 0, window_blocks, short_window_blocks, 1.0, (weights, weights),
                     (prefix_weight, prefix_weight))
    if not text.strip():
        return [previous]
    stages, parts = [], text.split(";")
    for number, part in enumerate(parts, 1):
        words = part.split()
        if not words:
            fail(f"--stages: stage {number} is empty; give its share (0.25, 1/3 or +E) and any of "
                 f"t=, z=, cap=, aw=, lr=, mtp=, pw=, or drop the extra ';'")
        share, extension = stage_share(words[0], number)
        if extension and number != len(parts):
            fail(f"--stages: stage {number} is {words[0]} extension steps, which only the last stage can be; "
                 f"move it last")
        settings = {}
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if key not in STAGE_KEYS or not equals:
                fail(f"--stages: stage {number}: '{word}' is no KEY=VALUE of t, z, cap, aw, lr, mtp, pw; fix it")
            if STAGE_KEYS[key] in settings:
                fail(f"--stages: stage {number} sets {key} twice; give it once")
            if key == "aw":
                settings["window_blocks"], settings["short_window_blocks"] = stage_value(key, value, number)
            else:
                settings[STAGE_KEYS[key]] = stage_value(key, value, number)
        previous = Stage(**{**vars(previous), "share": share, "extension": extension, **settings})
        if not any(w > 0.0 for w in previous.next_token_weights[0]) and previous.prefix_weight[0] <= 0.0:
            fail(f"--stages: stage {number}: every term of the loss starts at weight 0 ({loss_ramp_text(previous)}); "
                 f"give the next token a weight (mtp=1)")
        stages.append(previous)
    scheduled = stages[:-1] if stages[-1].extension else stages
    total = sum(stage.share for stage in scheduled)
    if not scheduled or abs(total - 1) > 1e-6:
        fail(f"--stages: the shares of stages 1 to {len(scheduled)} sum to {total:.9g}, not 1; "
             f"make them sum to 1 (+E steps come after them)")
    return stages


class StagePlan:
    """The plan of every step of a run: the stages of parse_stages over N scheduled steps, which
    stage i ends at e_i = round((share_0 + ... + share_i) * N) (half to even; the last at N), then
    the extension's E steps. A step's tokens resolve -1 to B*T*world, its window -1 to the
    schedule's over the N + E steps, and its short window to half the long one where not given; step
    N + E, the final validation's, takes final_window_blocks (set_final_window) as its long window."""

    def __init__(self, stages, num_iterations, batch_size, world, steps_flag="--num_iterations"):
        self.stages, self.N, self.B, self.world = stages, num_iterations, batch_size, world
        self.final_window_blocks = 0
        self.extension = stages[-1].extension
        scheduled = len(stages) - (1 if self.extension else 0)
        self.ends, cumulative = [], 0.0
        for i, stage in enumerate(stages[:scheduled]):
            cumulative += stage.share
            end = num_iterations if i == scheduled - 1 else round(cumulative * num_iterations)
            start = self.ends[-1] if self.ends else 0
            if end <= start and scheduled > 1:
                fail(f"--stages: stage {i + 1} gets 0 steps (its share ends at step {end}, where the stage "
                     f"before's does) of {steps_flag} {num_iterations}; give it a larger share or more {steps_flag}")
            self.ends.append(end)

    @property
    def steps(self):
        """The steps trained: the scheduled ones and the extension's."""
        return self.N + self.extension

    def set_final_window(self, blocks, flag):
        """The long window of the final evaluation (step N + E) in place of the last stage's (0: the
        last stage's); its short window stays the last stage's."""
        self.final_window_blocks = 0
        if blocks == 0:
            return
        last = self.step(self.steps)
        if last.window_blocks == 0:
            fail(f"{flag} {blocks} sets the long window of the validation after the last step, and the last stage "
                 f"has no window: give it one (aw=, or --window_blocks, with documents), or drop {flag}")
        if blocks < last.short_window_blocks:
            fail(f"{flag} {blocks} is below the last stage's short window of {last.short_window_blocks} blocks, which "
                 f"the final validation keeps: give {flag} {last.short_window_blocks} or more")
        self.final_window_blocks = blocks

    def tokens(self, stage):
        micro_batch = self.B * stage.seq_len * self.world
        return micro_batch if stage.total_batch_size == -1 else stage.total_batch_size

    def stage_index(self, step):
        """The first scheduled stage ending after `step`; past them, the extension (or the last)."""
        for i, end in enumerate(self.ends):
            if step < end:
                return i
        return len(self.stages) - 1

    def table(self):
        """The plan's lines for the start-up table: each stage's steps and settings."""
        starts = [0] + self.ends
        lines = []
        for i, stage in enumerate(self.stages):
            first, last = (starts[i], self.ends[i] - 1) if i < len(self.ends) else (self.N, self.steps - 1)
            window = "schedule" if stage.window_blocks == -1 else stage.window_blocks
            if stage.short_window_blocks is not None:
                window = f"{stage.short_window_blocks}/{stage.window_blocks}"
            lines.append(f"stage {i + 1}: steps {first}-{last} | t {stage.seq_len} | tokens a step "
                         f"{self.tokens(stage)} | cap {stage.cap} | window {window} | lr x{stage.lr_multiplier:g} | "
                         f"{loss_ramp_text(stage)}")
        return lines

    def stage_window_blocks(self, step):
        """The long window of step `step`'s stage, at the last step too (the windows YaRN follows)."""
        stage = self.stages[self.stage_index(step)]
        return attention_window_blocks(step, self.steps) if stage.window_blocks == -1 else stage.window_blocks

    def step(self, step):
        i = self.stage_index(step)
        stage = self.stages[i]
        tokens = self.tokens(stage)
        window = self.stage_window_blocks(step)
        short = window // 2 if stage.short_window_blocks is None else stage.short_window_blocks
        if step == self.steps and self.final_window_blocks:
            window = self.final_window_blocks
        first = ([0] + self.ends)[i] if i < len(self.ends) else self.N
        end = self.ends[i] if i < len(self.ends) else self.steps
        weights, prefix_weight = loss_weights_at(stage, (step - first) / (end - first) if end > first else 0.0)
        return StepPlan(i, stage.seq_len, tokens, tokens // (self.B * stage.seq_len * self.world), stage.cap,
                        window, short, stage.lr_multiplier, weights, prefix_weight)

    def has_prefix_term(self):
        """Whether a stage's prefix term has a weight, so the run needs the prefix table."""
        return any(w > 0.0 for stage in self.stages for w in stage.prefix_weight)


# ------------------------------------------------------------------------------------------------
# Optimisation


def learning_rate(step, args, peak=None, multiplier=1.0):
    """The learning rate of step `step` (0-based) of N = num_iterations in a stage of rate multiplier
    `multiplier` (m), with W = warmup_iters, lr = peak (default learning_rate) and min_lr = lr *
    final_lr_frac (llmc/schedulers.h, in double in the same order):
      step < W:     lr * (step + 1) / W * m                    (every schedule)
      otherwise, with f = (step - S) / (N - S) within [0, 1], each schedule's value times m:
        cosine:     min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * f)),      S = W
        linear:     lr - (lr - min_lr) * f,                                S = W
        wsd:        lr - (lr - min_lr) * f,  S = max(W, N - N // 5)  (stable, then the last 20% decay)
        constant:   lr
        stable_decay: lr while step/N < 1 - D, then lr * (w + (1 - w) * final_lr_frac),
                    w = (1 - step/N) / D, D = cooldown_frac  (modern.md: D 0.7, to 0; speedrun: D 0.45, to 0.1 lr)
      or
        cooldown:   lr * m before S, then lr * (m * (1 - t) + final_lr_frac * t), t = min(1, (step - S) / (N - S)),
                    S = max(W, int(N * (1 - cooldown_frac))): min_lr whatever m (modded-nanogpt's record #89)
    A stage plan's extension steps (step >= N) take the schedule's end value, f = 1, t = 1 and w = 0.
    """
    lr = args.learning_rate if peak is None else peak
    W, N = args.warmup_iters, args.num_iterations
    if step < W:
        return lr * (step + 1) / W * multiplier
    if args.lr_schedule == "cooldown":
        start = max(W, int(N * (1 - args.cooldown_frac)))
        if step < start:
            return lr * multiplier
        t = min(1.0, (step - start) / (N - start)) if N > start else 1.0
        return lr * (multiplier * (1 - t) + args.final_lr_frac * t)
    return scaled_by_stage(step, args, lr) * multiplier


def scaled_by_stage(step, args, lr):
    """learning_rate's value past the warmup of the schedules that a stage's multiplier scales as a whole."""
    W, N = args.warmup_iters, args.num_iterations
    if args.lr_schedule == "constant":
        return lr
    if args.lr_schedule == "stable_decay":
        progress = step / N
        if progress < 1 - args.cooldown_frac:
            return lr
        w = max(0.0, (1 - progress) / args.cooldown_frac)
        return lr * (w + (1 - w) * args.final_lr_frac)
    min_lr = lr * args.final_lr_frac
    start = max(W, N - N // 5) if args.lr_schedule == "wsd" else W
    f = min(1.0, max(0.0, (step - start) / (N - start)))
    if args.lr_schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * f))
    return lr - (lr - min_lr) * f


def clip_gradients(params, grad_clip):
    """SPEC.md clipping: returns the global norm; scales by clip / (norm + 1e-6) when norm > clip."""
    return torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))


def adamw_step(params, moments, t, lr, weight_decay, betas=(ADAMW_BETA1, ADAMW_BETA2), eps=ADAMW_EPS,
               decay_all=False):
    """SPEC.md AdamW written out in float32, op by op as the spec writes it (t counts from 1), with
    weight decay on the 2-D tensors (decay_all: on every tensor, the modern recipe's). Scalar
    coefficients are computed in double and rounded to float32 once."""
    beta1, beta2 = betas
    with torch.no_grad():
        for p, (m, v) in zip(params, moments):
            g = p.grad
            m.copy_(beta1 * m + (1 - beta1) * g)
            v.copy_(beta2 * v + (1 - beta2) * g * g)
            mhat = m / (1 - beta1 ** t)
            vhat = v / (1 - beta2 ** t)
            decay = weight_decay if decay_all or p.dim() == 2 else 0.0
            p.sub_(lr * (mhat / (vhat.sqrt() + eps) + decay * p))


def adamw_cautious_step(p, m, v, t, lr, weight_decay, betas, eps):
    """SPEC.md's AdamW with record #89's cautious weight decay on one tensor, in float32 op by op
    (t counts from 1): the moments as adamw_step's, u = lr mhat / (sqrt(vhat) + eps), then
    p <- p - (u + (lr^2 wd) p [u p > 0]), in the order of the reference's
    update.addcmul_(p, mask, value=lr^2 wd); p - update. A BF16 tensor's step (the speedrun's
    embeddings) is computed in float32 too, its weight rounded to nearest once, and its moments where
    they are BF16 (record #28's; record #89's are float32), as the CUDA trainer's BF16 steps. lr may be
    a tensor (a compiled step's)."""
    beta1, beta2 = betas
    g, p32 = p.grad.float(), p.float()
    m32 = beta1 * m.float() + (1 - beta1) * g
    v32 = beta2 * v.float() + (1 - beta2) * g * g
    mhat = m32 / (1 - beta1 ** t)
    vhat = v32 / (1 - beta2 ** t)
    u = lr * (mhat / (vhat.sqrt() + eps))
    mask = (u * p32 > 0).float()
    m.copy_(m32)
    v.copy_(v32)
    p.copy_(p32 - (u + lr * lr * weight_decay * p32 * mask))


class CautiousAdamW(torch.optim.Optimizer):
    """AdamW with the cautious weight decay (--cautious_decay 1), which torch's AdamW cannot apply:
    adamw_cautious_step on each tensor. Its groups hold what torch AdamW's hold (lr, betas, eps,
    weight_decay), so the schedule sets them alike."""

    def __init__(self, groups, lr, betas, eps):
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    dtype = torch.float32 if group.get("float32_moments") else p.dtype
                    state["step"], state["m"], state["v"] = 0, torch.zeros_like(p, dtype=dtype), torch.zeros_like(
                        p, dtype=dtype)
                state["step"] += 1
                adamw_cautious_step(p, state["m"], state["v"], state["step"], group["lr"], group["weight_decay"],
                                    group["betas"], group["eps"])


def orthogonalise(G, newton_schulz=NEWTON_SCHULZ["baseline"], dtype=torch.bfloat16):
    """modern.md's Newton-Schulz iteration towards the nearest semi-orthogonal matrix of G, in
    bfloat16 products (FP32 accumulation) as modded-nanogpt runs it: the wide orientation, X / (scale
    |X|_F + eps), then for each (a, b, c) of its polynomials X <- a X + (b A + (c A) A) X with A = X X^T
    (newton_schulz: a row of NEWTON_SCHULZ). At scale 1 the norm's product is the norm itself. dtype:
    the products' type (another than bfloat16 for dev/muon_rounding.py's exact iteration)."""
    X = G.to(dtype)
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.t()
    X = X / (X.norm() * newton_schulz.scale + newton_schulz.eps)
    for a, b, c in newton_schulz.polynomials:
        A = X @ X.t()
        B = b * A + (c * A) @ A
        X = a * X + B @ X
    return X.t() if tall else X


def muon_scale(block, transposed):
    """sqrt(max(1, rows/cols)) of one row block, of its transpose when `transposed`: the factor of its
    update, and of its rate under the cautious decay (record #89's rate of the matrix)."""
    rows, cols = block.shape[::-1] if transposed else block.shape
    return max(1, rows / cols) ** 0.5


def normuon_step(v, second_moment, beta2=NORMUON_BETA2):
    """Record #89's NorMuon on one orthogonalised matrix v (bfloat16, [rows, cols] as stored), in its
    order and types (SPEC.md): the float32 means of v^2 along the shorter side, one per row when rows >=
    cols, else per column; second_moment (float32, one per mean, updated in place) their running mean;
    v divided by its root and scaled back to its norm before, the scale rounded to bfloat16."""
    dim = 1 if v.size(0) >= v.size(1) else 0
    size = v.size(dim)
    mean = v.float().square().mean(dim=dim)
    norm = (mean.sum() * size).sqrt()
    second_moment.lerp_(mean, 1 - beta2)
    step = second_moment.clamp_min(1e-10).rsqrt()
    after = ((mean * size) * step.square()).sum().sqrt()
    scale = step * (norm / after.clamp_min(1e-10))
    return v * scale.unsqueeze(dim).to(v.dtype)


def block_rows(p, blocks):
    """The row counts of p's row blocks: `blocks` equal ones (an int), or the counts listed."""
    return [p.size(0) // blocks] * blocks if isinstance(blocks, int) else list(blocks)


def muon_direction(grad, momentum, mu, blocks, newton_schulz, transposed, orthogonalise=orthogonalise,
                   second_moments=None):
    """Muon's update of one parameter (bfloat16): Nesterov momentum (momentum updated in place), then
    each of its row blocks (block_rows) orthogonalised (by `orthogonalise`, Muon's: compiled or not),
    with second_moments (NorMuon's state, a row a block, its first max(rows, cols) values the block's)
    normalised by normuon_step, and scaled by sqrt(max(1, rows/cols)), of the block transposed when
    `transposed` (the speedrun's reference holds its fc as [C, 4C]: scale 1)."""
    momentum.lerp_(grad, 1 - mu)
    u = grad.lerp(momentum, mu)
    blocks = u.split(block_rows(u, blocks))
    updates = [orthogonalise(b, newton_schulz) for b in blocks]
    if second_moments is not None:
        updates = [normuon_step(v, s[:max(v.shape)]) for v, s in zip(updates, second_moments)]
    return torch.cat([v * muon_scale(b, transposed) for v, b in zip(updates, blocks)])


class Muon(torch.optim.Optimizer):
    """modern.md's Muon: p <- p * (1 - lr * wd), then p <- p - lr s * muon_direction; with cautious
    (record #89's cautious weight decay, SPEC.md) p <- p - (wd lr) lr_eff p [u p >= 0], then
    p <- p - lr s * u, lr_eff = lr s muon_scale of each block. s is a group's "lr_scale" (1 but for
    --muon_tensor_lr's tensors): it scales the update's rate and lr_eff, not the decay's wd lr, as
    record #89's reference scales a matrix's rate. A group's "blocks" splits each of its
    matrices into that many equal row blocks (qkvw: q, k and v, three C x C matrices), or into blocks
    of the row counts it lists (--muon_qk_heads); its "transposed" scales by the transpose's shape.
    newton_schulz: a row of NEWTON_SCHULZ. compile: Newton-Schulz as one torch.compile graph per
    shape, as modded-nanogpt compiles its; the momentum stays eager, as there, so the warmup's
    momentum (a float that changes every step) does not recompile it. normuon: record #89's NorMuon
    (normuon_step), its state a row a block, of the blocks' largest max(rows, cols)."""

    def __init__(self, groups, lr, weight_decay, momentum, newton_schulz=NEWTON_SCHULZ["baseline"], compile=False,
                 cautious=False, normuon=False):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, blocks=1, transposed=False, lr_scale=1.0)
        super().__init__(groups, defaults)
        self.cautious = cautious
        self.normuon = normuon
        self.newton_schulz = newton_schulz
        self.orthogonalise = torch.compile(orthogonalise) if compile else orthogonalise

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                rows = block_rows(p, group["blocks"])
                if not state:
                    state["momentum"] = torch.zeros_like(p)
                    if self.normuon:
                        side = max(max(r, p.size(1)) for r in rows)
                        state["second_moments"] = torch.zeros(len(rows), side, device=p.device)
                update = muon_direction(p.grad, state["momentum"], group["momentum"], rows,
                                        self.newton_schulz, group["transposed"], self.orthogonalise,
                                        state.get("second_moments"))
                lr, wd, scale = group["lr"], group["weight_decay"], group["lr_scale"]
                if self.cautious:
                    for block, u in zip(p.split(rows), update.split(rows)):
                        lr_eff = lr * scale * muon_scale(block, group["transposed"])
                        mask = (u.float() * block >= 0).to(p.dtype)
                        block.sub_(block * mask * (wd * lr) * lr_eff)
                else:
                    p.mul_(1 - lr * wd)
                p.add_(update, alpha=-lr * scale)


def qkv_blocks(config, qk_heads):
    """qkvw's row blocks for Muon: q, k and v (3), or with qk_heads > 0 (--muon_qk_heads) q's rows in
    blocks of qk_heads heads, then k's, then v whole (record #89's qk_bank: Q's head pairs, K's)."""
    if not qk_heads:
        return 3
    if qk_heads < 0 or config.num_heads % qk_heads:
        fail(f"--muon_qk_heads {qk_heads}: the model's {config.num_heads} heads do not split into blocks of "
             f"{qk_heads}: give a divisor of {config.num_heads} (record #89's 2), or 0 for q and k whole")
    rows = qk_heads * (config.channels // config.num_heads)
    return [rows] * (2 * config.num_heads // qk_heads) + [config.channels]


# The tensors whose matrices Muon takes (llmc/gpt2.h's role kMatrix), by their names there.
MUON_TENSORS = ("qkvw", "attprojw", "fcw", "fcprojw", "attngate")


def parse_muon_tensor_lr(text, flag="--muon_tensor_lr"):
    """--muon_tensor_lr's multipliers of Muon's rate, {tensor: multiplier} (the CUDA trainer's -mt): "NAME=X,..." with NAME one of MUON_TENSORS and X
    positive; "" none."""
    multipliers = {}
    for pair in [pair for pair in text.split(",") if pair]:
        name, equals, value = pair.partition("=")
        if name not in MUON_TENSORS:
            fail(f"{flag} {text}: '{name}' is not a tensor Muon takes: name one of {', '.join(MUON_TENSORS)}")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not equals or not math.isfinite(number) or number <= 0:
            fail(f"{flag} {pair}: give NAME=X, X the tensor's multiplier of --muon_lr, positive: 'fcprojw=4'")
        if name in multipliers:
            fail(f"{flag} {text}: {name} is named twice: give it once")
        multipliers[name] = number
    return multipliers


def muon_tensor_groups(model, groups, args):
    """Muon's groups with --muon_tensor_lr: each group's tensors with a multiplier taken out into a group
    after it whose "lr_scale" is the multiplier (Muon.step: the update's rate and lr_eff, not the decay's
    wd lr; the CUDA trainer's MuonGroup::lr_scale)."""
    multipliers = parse_muon_tensor_lr(args.muon_tensor_lr or "")
    names = {id(p): table_name(n) for n, p in model.named_parameters()}
    split = []
    for group in groups:
        by_multiplier = {}
        for p in group["params"]:
            by_multiplier.setdefault(multipliers.get(names[id(p)], 1.0), []).append(p)
        for multiplier, params in by_multiplier.items():
            rate = {"lr_scale": multiplier} if multiplier != 1.0 else {}
            split.append(dict(group, params=params, **rate))
    return split


def muon_param_groups(model, qk_heads=0):
    """Muon's groups: the blocks' matrices, qkvw as q, k, v (or qkv_blocks' blocks of qk_heads
    heads). The speedrun's also takes the gates, and its fc is scaled as its reference holds it,
    [C, 4C] (transposed)."""
    blocks = model.transformer.h
    qkv = dict(params=[b.attn.c_attn.weight for b in blocks if b.attn is not None],
               blocks=qkv_blocks(model.config, qk_heads))
    if model.config.speedrun:
        projections = [linear.weight for b in blocks if b.attn is not None for linear in (b.attn.c_proj, b.attn.gate)
                       if linear is not None]  # record #89's plan has no gates
        others = projections + [b.mlp.c_proj.weight for b in blocks]
        fc = [b.mlp.c_fc.weight for b in blocks]
        return [qkv, dict(params=others), dict(params=fc, transposed=True)]
    others = [p for b in blocks for p in (b.attn.c_proj.weight, b.mlp.c_fc.weight, b.mlp.c_proj.weight)]
    return [qkv, dict(params=others)]


def optimizer_groups(model, args):
    """Every parameter's optimizer and hyperparameters, as (optimizer, group) pairs; each group's
    "lr" is its peak, which the schedule scales. With --optimizer muon, Muon takes muon_groups'
    matrices. AdamW takes the rest: GPT-2's 2-D tensors with weight decay and the others without,
    at --learning_rate; the modern models' embeddings (speedrun: with its value embeddings), head
    weight, 1-D tensors (gains, biases; the speedrun's scalars) and any block matrix at their own
    rates, all with weight decay but the speedrun's scalars (the CUDA trainer's decay_vectors is the
    modern recipe's alone)."""
    t, groups = model.transformer, []
    if args.optimizer == "muon":
        groups = [("muon", group) for group in muon_tensor_groups(model, muon_param_groups(model, args.muon_qk_heads),
                                                                 args)]
    taken = {id(p) for _, group in groups for p in group["params"]}
    rest = [p for p in params_in_file_order(model) if id(p) not in taken]
    if model.config.modern:
        head = model.lm_head.weight
        embeddings = [t.wte.weight] + ([ve.weight for ve in t.ve] if model.config.speedrun else [])
        embeddings += [model.bigram.weight] if model.config.bigram else []
        decay, vector_decay = args.weight_decay, args.weight_decay if model.config.arch == "modern" else 0.0
        # the scalars' role, as the CUDA trainer's vegate, resid_lambdas, post_lambdas, xsa_alpha, head_gates
        # and the MUDD gate generators' and dense connections' tensors
        scalar_tables = [q for q in (model.ve_gates, model.resid_lambdas, model.post_lambdas, model.xsa_alpha,
                                     model.head_gates, model.attn_lambdas, model.mudd_gate_w1, model.mudd_gate_w2,
                                     model.mudd_gate_b2, model.mudd_w1, model.mudd_w2, model.mudd_b2)
                         if q is not None]

        def scalar(p):
            return p.dim() == 1 or any(p is q for q in scalar_tables)

        roles = [(args.embedding_lr, decay, lambda p: any(p is e for e in embeddings)),
                 (args.head_lr, decay, lambda p: p is head), (args.scalar_lr, vector_decay, scalar),
                 (args.learning_rate, decay, lambda p: True)]
        for lr, weight_decay, belongs in roles:
            params = [p for p in rest if belongs(p)]
            rest = [p for p in rest if not belongs(p)]
            groups += [("adamw", dict(params=params, lr=lr, weight_decay=weight_decay))] if params else []
    else:
        groups += [("adamw", dict(params=[p for p in rest if p.dim() == 2], lr=args.learning_rate,
                                  weight_decay=args.weight_decay)),
                   ("adamw", dict(params=[p for p in rest if p.dim() != 2], lr=args.learning_rate,
                                  weight_decay=0.0))]
    groups = adam_row_groups(model, groups, args)
    covered = [id(p) for _, group in groups for p in group["params"]]
    assert sorted(covered) == sorted(id(p) for p in model.parameters()), "a parameter has no or two optimizers"
    return groups


# --adam_rows' keys (the CUDA trainer's -ar): multipliers of the role's rate and decay or the tensor's own,
# betas, and what of a bfloat16 run's step is rounded to bfloat16 (ADAM_BF16_KINDS, in place of the role's).
ADAM_ROW_KEYS = ("lr", "rate", "b1", "b2", "wd", "decay", "bf16")
ADAM_BF16_KINDS = ("none", "weight", "all")


def parse_adam_rows(text, flag="--adam_rows"):
    """--adam_rows' rows as {tensor: {key: value}} (llmc/flags.h parse_adam_rows): "NAME:key=value,...;..."
    with NAME a tensor of llmc/gpt2.h's table (TABLE_NAMES), keys lr and wd (multipliers of its role's
    rate and decay) or rate and decay (its own), b1, b2 (its betas, within (0, 1)), and bf16 (none,
    weight or all: a bfloat16 run's tensor in float32, a bfloat16 parameter with float32 moments, or
    with moments that follow it); "" none."""
    names, rows = list(TABLE_NAMES.values()), {}
    parts = text.split(";")
    for row in parts[:-1] + ([parts[-1]] if parts[-1] else []):
        name, colon, keys = row.partition(":")
        if not colon or not keys:
            fail(f"{flag} '{row}': a row is NAME:key=value,... (keys lr, rate, b1, b2, wd, decay, bf16): "
                 "'ve:lr=75,b1=0.75,b2=0.95,wd=5'")
        if name not in names:
            fail(f"{flag} {row}: no parameter tensor '{name}': name one of {', '.join(names)}")
        if name in rows:
            fail(f"{flag} {text}: {name} has two rows: give it one")
        rows[name] = {}
        for pair in keys.split(","):
            key, _, value = pair.partition("=")
            if key not in ADAM_ROW_KEYS:
                fail(f"{flag} {row}: '{pair}' is not key=value of lr, rate, b1, b2, wd, decay or bf16")
            if key == "bf16":
                if value not in ADAM_BF16_KINDS:
                    fail(f"{flag} {name}:bf16 '{value}': give none (FP32), weight (the weight rounded to BF16) or "
                         "all (the moments too)")
                rows[name][key] = value
                continue
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if not math.isfinite(number):
                fail(f"{flag} {name}:{key} '{value}': not a number")
            if key in ("b1", "b2") and not 0 < number < 1:
                fail(f"{flag} {name}:{key} {value}: must be within (0, 1)")
            if key in ("lr", "rate", "wd", "decay") and number < 0:
                fail(f"{flag} {name}:{key} {value}: must be at least 0")
            rows[name][key] = number
        for own, multiplier in (("rate", "lr"), ("decay", "wd")):
            if own in rows[name] and rows[name].get(multiplier, 1.0) != 1.0:
                fail(f"{flag} {row}: {name} sets its own {own} and a multiplier of its role's: give one of {own} "
                     f"and {multiplier}")
    return rows


def adam_row_groups(model, groups, args):
    """optimizer_groups' AdamW groups with --adam_rows: each group's tensors with a row of their own
    (parse_adam_rows) taken out into a group per distinct row after it, its rate and decay the row's rate
    and decay, or times its lr and wd, its betas the row's b1 and b2 where given; every AdamW group with its
    betas. A row of a tensor Muon takes, or that the model lacks, is refused; a recipe's rows of tensors the
    model lacks are left out."""
    rows = parse_adam_rows(args.adam_rows)
    names = {id(p): table_name(n) for n, p in model.named_parameters()}
    if "adam_rows" in args.from_recipe:
        rows = {name: row for name, row in rows.items() if name in names.values()}
    muon = {names[id(p)] for kind, group in groups if kind == "muon" for p in group["params"]}
    for name in rows:
        if name in muon:
            fail(f"--adam_rows {args.adam_rows}: {name} is Muon's (--optimizer muon takes the blocks' matrices), "
                 "its rate and decay Muon's (--muon_lr, --muon_weight_decay): drop its row, or give --optimizer adamw")
        if name not in names.values():
            fail(f"--adam_rows {args.adam_rows}: the {model.config.arch} model has no {name}: drop its row")
    split = []
    for kind, group in groups:
        if kind != "adamw":
            split.append((kind, group))
            continue
        by_row = {}
        for p in group["params"]:
            by_row.setdefault(tuple(sorted(rows.get(names[id(p)], {}).items())), []).append(p)
        for row, params in by_row.items():
            row = dict(row)
            split.append((kind, dict(group, params=params, lr=row.get("rate", group["lr"] * row.get("lr", 1.0)),
                                     weight_decay=row.get("decay", group["weight_decay"] * row.get("wd", 1.0)),
                                     betas=(row.get("b1", args.beta1), row.get("b2", args.beta2)),
                                     float32_moments=row.get("bf16") == "weight")))
    return split


def make_optimizers(model, args, device_type, tensor_lr=False, compile_muon=False):
    """The optimizers of optimizer_groups: torch AdamW (the same update as adamw_step: decoupled
    decay lr*wd*p, bias-corrected m and v, eps added to sqrt(vhat)), fused on CUDA where this
    PyTorch has it, or with --cautious_decay 1 CautiousAdamW, and Muon (cautious likewise). Each
    group keeps its peak rate as "peak_lr". tensor_lr keeps AdamW's rates in device tensors, so a
    compiled step does not recompile when they change. Returns (optimizers, fused)."""
    groups = optimizer_groups(model, args)
    for _, group in groups:
        group["peak_lr"] = group.get("lr", args.muon_lr)
    adamw_groups = [group for kind, group in groups if kind == "adamw"]
    for group in adamw_groups:
        group["lr"] = torch.tensor(group["lr"], device=device_type) if tensor_lr else group["lr"]
    cautious = bool(args.cautious_decay)
    fused = not cautious and device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    extra = {"fused": True} if fused else {}
    adamw = CautiousAdamW if cautious else torch.optim.AdamW
    if not cautious and any(g.get("float32_moments") and p.dtype == torch.bfloat16 for g in adamw_groups
                            for p in g["params"]):
        fail("--adam_rows' bf16=weight keeps a bfloat16 tensor's moments in float32, which torch's AdamW cannot: "
             "give --cautious_decay 1, or bf16=all")
    optimizers = [adamw(adamw_groups, lr=args.learning_rate, betas=(args.beta1, args.beta2), eps=args.adam_eps,
                        **extra)]
    muon_groups = [group for kind, group in groups if kind == "muon"]
    if muon_groups:
        optimizers.append(Muon(muon_groups, args.muon_lr, args.muon_weight_decay, args.muon_momentum,
                               NEWTON_SCHULZ[args.muon_ns], compile=compile_muon, cautious=cautious,
                               normuon=bool(args.normuon)))
    return optimizers, fused


def tie_embedding(model):
    """While the embedding is tied to the head (--untie_step, record #89's tied phase): its weights
    the head's, the same [Vp, C]."""
    with torch.no_grad():
        model.transformer.wte.weight.copy_(model.lm_head.weight)


def tied_step_gradient(model):
    """Before a tied update: the head steps with the sum of both gradients (the CUDA trainer's
    gpt2_update: head + embedding, rounded once)."""
    model.lm_head.weight.grad.add_(model.transformer.wte.weight.grad)


def untie_step_done(model, step, args, moments):
    """After the update of a step through --untie_step: the embedding the head's copy, and at the
    untie step itself the head's AdamW state (`moments`: a parameter's dict of its state tensors)
    copied to the embedding's, which from the next step is updated on its own."""
    if step > args.untie_step:
        return
    tie_embedding(model)
    if step == args.untie_step:
        head, wte = moments(model.lm_head.weight), moments(model.transformer.wte.weight)
        for key, value in head.items():
            if torch.is_tensor(value):
                wte[key].copy_(value)


def optimizer_state_of(optimizers):
    """A parameter's state dict in whichever of the torch optimizers holds it."""
    def state(p):
        return next(o.state[p] for o in optimizers if p in o.state)
    return state


def muon_momentum(step, args, steps=None):
    """Muon's momentum at `step` (0-based) of a run of `steps` steps, scheduled and extension (default
    --num_iterations): from --muon_momentum_start rising linearly to --muon_momentum over the first
    --muon_momentum_warmup steps (the speedrun's 0.85 to 0.95 over 300; none in the others), then
    --muon_momentum; over the run's last K = --muon_momentum_cooldown steps back to the start value,
    as modded-nanogpt's get_muon_momentum (llmc/schedulers.h MomentumSchedule)."""
    warmup, cooldown = args.muon_momentum_warmup, args.muon_momentum_cooldown
    if step < warmup:
        frac = step / warmup
        return (1 - frac) * args.muon_momentum_start + frac * args.muon_momentum
    cooldown_start = (args.num_iterations if steps is None else steps) - cooldown
    if cooldown > 0 and step > cooldown_start:
        frac = (step - cooldown_start) / cooldown
        return args.muon_momentum - frac * (args.muon_momentum - args.muon_momentum_start)
    return args.muon_momentum


def adam_eps(step, args, beta2):
    """The eps torch's AdamW adds to sqrt(vhat) at `step` (0-based) in a group of beta2 `beta2`:
    --adam_eps; with --adam_eps_before_correction 1, --adam_eps / sqrt(1 - beta2^t)
    (t = adamw_updates(step, args)), which gives the update lr sqrt(1 - beta2^t) / (1 - beta1^t) m /
    (sqrt(v) + eps) of the speedrun's reference."""
    if not args.adam_eps_before_correction:
        return args.adam_eps
    return args.adam_eps / math.sqrt(1 - beta2 ** adamw_updates(step, args))


def adamw_steps_at(step, args):
    """Whether AdamW updates its tensors at `step` (0-based): every --adam_every-th step, (step + 1) % K
    == 0 (record #89's K = 2: its odd steps); at the others their gradients are kept and added to."""
    return (step + 1) % args.adam_every == 0


def adamw_updates(step, args):
    """AdamW's updates through `step`, the t of its bias correction at an update."""
    return (step + 1) // args.adam_every


def zero_step_grads(model, optimizers, step, args):
    """Clears the gradients for `step`'s micro steps to add into, but AdamW's tensors' where its last
    update was before the previous step (adamw_steps_at): those add up until its next update."""
    keep = step % args.adam_every != 0
    kept = {id(p) for group in optimizers[0].param_groups for p in group["params"]} if keep else set()
    for p in model.parameters():
        if id(p) not in kept:
            p.grad = None


def set_learning_rates(optimizers, step, args, multiplier=1.0, steps=None):
    """Every group's rate at `step` in a stage of rate multiplier `multiplier`: its peak under the
    schedule (learning_rate); Muon's momentum (of a run of `steps` steps: muon_momentum), AdamW's eps
    (with --adam_eps_before_correction 1). Returns the rate of --learning_rate."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            if isinstance(optimizer, Muon):
                group["momentum"] = muon_momentum(step, args, steps)
            elif args.adam_eps_before_correction and adamw_steps_at(step, args):  # its next update's
                group["eps"] = adam_eps(step, args, group["betas"][1])
            lr = learning_rate(step, args, group["peak_lr"], multiplier)
            if torch.is_tensor(group["lr"]):  # a compiled step reads it from the device
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
    return learning_rate(step, args, None, multiplier)


# ------------------------------------------------------------------------------------------------
# Debug state


def add_debug_noise(model, std, seed):
    """N(0, std) added to every parameter (padded wte and head rows stay zero), drawn on the CPU
    from seed + 1; the checkpoint written next holds the result, so no trainer redraws it."""
    if std <= 0:
        return
    generator = torch.Generator().manual_seed(seed + 1)
    V = model.config.vocab_size
    with torch.no_grad():
        for p in params_in_file_order(model):
            noise = torch.randn(p.shape, generator=generator) * std
            if p.shape[0] == model.config.padded_vocab_size:
                noise[V:] = 0
            p.add_(noise.to(p.device, p.dtype))


def debug_adamw_step(group, moments, t, lr, eps, decay_all, cautious):
    """One debug step of an AdamW group at rate lr: adamw_step's, or with the cautious decay
    adamw_cautious_step's on each tensor, the decay where adamw_step would apply it."""
    params = group["params"]
    if not cautious:
        adamw_step(params, [moments[id(p)] for p in params], t, lr, group["weight_decay"], group["betas"], eps,
                   decay_all=decay_all)
        return
    with torch.no_grad():
        for p in params:
            decay = group["weight_decay"] if decay_all or p.dim() == 2 else 0.0
            adamw_cautious_step(p, *moments[id(p)], t, lr, decay, group["betas"], eps)


def write_debug_state(model, batch, args, device, out_dir, plan=None):
    """Writes the initial model and the debug state of llmc/gpt2.h: x, y, logits, loss and every
    gradient of the first step, then the losses of debug_steps optimizer steps on the same batch
    at constant learning rates, Muon's momentum and AdamW's eps as the recipe makes them step by
    step (the first loss is the one before any update). GPT-2 with AdamW and the mean loss writes
    version 3; the modern or speedrun architecture, Muon, the summed loss, documents or settings
    version 6, whose header also names the architecture, the optimizers and their settings
    (Newton-Schulz's steps, first coefficients and row, the momentum's warmup, AdamW's eps placement),
    and the attention's documents and window (the window of step 0, which every debug step keeps);
    then the settings (debug_state_settings, maybe none), and before the step losses the small
    tensors' gradients at the BF16 weights (gradients_at_bf16_weights).

    The debug state is float32, the reference the C++ builds are checked against, except with
    --fp8 1 (gpt2_<name>_fp8_debug_state.bin): float32 has no FP8 products to compare with, so
    that one is the FP8 recipe itself, bfloat16 autocast with FP8 block linear layers as the CUDA
    trainer's -fp8 1 runs, and its loss curve is what test_gpt2cu --fp8 compares. With --fp8_head 1
    (..._fp8_head_debug_state.bin, header slot 30) the speedrun's head takes FP8 products in the
    training steps, the rest float32; test_gpt2cu compares its loss curve with -fh 1.

    With --stages (plan, over --debug_steps less its extension) debug step s takes the first B*t
    tokens of the batch as B rows of t, its stage's fixed window and its rates times the stage's
    multiplier; the header keeps the plan's text (debug_state_stages). The logits and gradients
    stay those of the whole batch at --window_blocks."""
    config, name = model.config, model.config.name()
    muon, summed = args.optimizer == "muon", args.loss_reduction == "sum"
    kind = ("_muon" if muon else "") + ("_fp8" if args.fp8 else "") + ("_fp8_head" if args.fp8_head else "")
    kind += "_fp8_mlp" if model.fp8_mlp else ""
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if args.fp8 else nullcontext()
    os.makedirs(out_dir, exist_ok=True)
    if args.untie_step >= 0:  # the file's model starts tied: its embedding the head
        tie_embedding(model)
    write_checkpoint(model, os.path.join(out_dir, f"gpt2_{name}.bin"), CHECKPOINT_FP32)
    write_checkpoint(model, os.path.join(out_dir, f"gpt2_{name}_bf16.bin"), CHECKPOINT_BF16)
    model.to(device)
    x, y = (t.to(device) for t in batch)
    params = params_in_file_order(model)
    groups = optimizer_groups(model, args)
    moments = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for p in params}
    muon_groups = [group for kind, group in groups if kind == "muon"]
    cautious = bool(args.cautious_decay)
    muon_optimizer = (Muon(muon_groups, args.muon_lr, args.muon_weight_decay, args.muon_momentum,
                           NEWTON_SCHULZ[args.muon_ns], cautious=cautious, normuon=bool(args.normuon))
                      if muon else None)
    B, T = x.shape
    windows, terms, first, losses = (model.window_blocks, model.short_window_blocks), model.loss_terms, None, []
    adamw_params = [p for owner, group in groups if owner == "adamw" for p in group["params"]]
    kept = {}  # AdamW's tensors' gradients since its last update (--adam_every)
    settings = debug_state_settings(model, args.untie_step, muon and bool(args.normuon), args.adam_every,
                                    args.muon_qk_heads if muon else 0, args.adam_rows,
                                    (args.muon_tensor_lr or "") if muon else "", cautious)
    version4 = config.modern or muon or summed or model.documents or plan is not None or bool(settings)
    at_bf16_weights = gradients_at_bf16_weights(model, x, y, params, args, autocast) if version4 else []
    fp8_mlp_reset(model)  # the file's values and steps each from a new run's FP8 scales, as test_gpt2cu's
    if plan:  # the file's logits and gradients: the whole batch at --window_blocks, whatever the stages
        first = debug_first_values(model, x, y, params, args, autocast)
        fp8_mlp_reset(model)
    for step in range(args.debug_steps):
        xs, ys, multiplier = x, y, 1.0
        if plan:
            step_plan = plan.step(step)
            xs, ys = (t.reshape(-1)[:B * step_plan.seq_len].view(B, step_plan.seq_len) for t in (x, y))
            model.window_blocks, multiplier = step_plan.window_blocks or None, step_plan.lr_multiplier
            model.short_window_blocks = step_plan.short_window_blocks
            set_step_loss_terms(model, step_plan)
            if model.yarn:
                set_yarn(model, *yarn_at(plan, step, *yarn_base(model)))
        if first is None:  # step 0 on the whole batch: one forward gives the file's values and its loss
            first = debug_first_values(model, xs, ys, params, args, autocast)
            losses.append(first[1].item())
        else:
            losses.append(debug_forward_backward(model, xs, ys, args, autocast)[1].item())
        print(f"debug step {step + 1}/{args.debug_steps} | loss {losses[-1]:.6f}")
        for p in adamw_params:
            p.grad = kept[id(p)] + p.grad if kept else p.grad
        clip_gradients(params, args.grad_clip)
        adamw_steps = adamw_steps_at(step, args)
        kept = {} if adamw_steps else {id(p): p.grad.clone() for p in adamw_params}
        if step <= args.untie_step and adamw_steps:
            tied_step_gradient(model)
        for owner, group in groups:
            if owner == "adamw" and adamw_steps:
                debug_adamw_step(group, moments, adamw_updates(step, args), group["lr"] * multiplier,
                                 adam_eps(step, args, group["betas"][1]), config.modern, cautious)
        if muon_optimizer:
            for group in muon_optimizer.param_groups:
                group["momentum"], group["lr"] = muon_momentum(step, args), args.muon_lr * multiplier
            muon_optimizer.step()
        untie_step_done(model, step, args, lambda p: dict(enumerate(moments[id(p)])))
        fp8_mlp_updated(model, step)
    model.window_blocks, model.short_window_blocks = windows
    model.loss_terms = terms
    if model.yarn:
        set_yarn(model, *yarn_base(model))

    version = DEBUG_STATE_VERSION_BF16_WEIGHTS if version4 else DEBUG_STATE_VERSION
    header = np.zeros(HEADER_INTS, np.int32)
    header[:6] = [DEBUG_STATE_MAGIC, version, B, T, args.debug_steps, config.vocab_size]
    hyper = [args.learning_rate, args.beta1, args.beta2, args.adam_eps, args.weight_decay, args.grad_clip]
    header[6:12] = np.array(hyper, np.float32).view(np.int32)
    if version4:
        header[12:15] = [ARCH_IDS[config.arch], int(muon), int(summed)]
        muon_hyper = [args.muon_lr, args.muon_weight_decay, args.muon_momentum] if muon else [0.0] * 3
        adamw_lrs = [args.embedding_lr, args.head_lr, args.scalar_lr] if config.modern else [args.learning_rate] * 3
        header[15:21] = np.array(muon_hyper + adamw_lrs, np.float32).view(np.int32)
        header[21:23] = [int(model.documents), model.window_blocks or 0]
        if muon:
            newton_schulz = NEWTON_SCHULZ[args.muon_ns]
            header[23] = len(newton_schulz.polynomials)
            first_polynomial = list(newton_schulz.polynomials[0])
            header[24:28] = np.array(first_polynomial + [muon_momentum(0, args)], np.float32).view(np.int32)
            header[28] = args.muon_momentum_warmup
            header[DEBUG_NEWTON_SCHULZ_SLOT] = list(NEWTON_SCHULZ).index(args.muon_ns) + 1
        header[29] = int(args.adam_eps_before_correction)
        header[30] = args.fp8_head
        stages = args.stages.strip().encode() if plan else b""
        header[DEBUG_STAGES_SLOT - 1] = len(stages)
        slots = np.frombuffer(stages.ljust(-(-len(stages) // 4) * 4, b"\0"), "<i4")
        header[DEBUG_STAGES_SLOT:DEBUG_STAGES_SLOT + len(slots)] = slots
    path = os.path.join(out_dir, f"gpt2_{name}{kind}_debug_state.bin")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        if version4:
            text = settings.encode()
            prefix = model.prefix_table
            f.write(np.array([len(text)], np.int32).tobytes() + text.ljust(-(-len(text) // 4) * 4, b"\0"))
            f.write(np.array([0 if prefix is None else len(prefix)], np.int32).tobytes())
            if prefix is not None:
                f.write(prefix.numpy().astype(np.int32).tobytes())
        for t in batch:
            f.write(t.numpy().astype(np.int32).tobytes())
        for t in first:
            f.write(t.float().numpy().tobytes())
        for t in at_bf16_weights:
            f.write(t.float().numpy().tobytes())
        f.write(np.array(losses, np.float32).tobytes())
    print(f"wrote {out_dir}/gpt2_{name}.bin, gpt2_{name}_bf16.bin and gpt2_{name}{kind}_debug_state.bin")


def debug_forward_backward(model, x, y, args, autocast):
    """One forward and backward of x, y, the gradients left in the parameters: (logits, mean loss)."""
    with autocast:
        logits, loss = model(x, y, args.loss_reduction)
    model.zero_grad(set_to_none=True)
    loss.backward()
    for p in model.parameters():  # a tensor the forward does not read (the scalars MUDD gates replace): zero
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return logits.detach(), loss.detach() / y.numel() if args.loss_reduction == "sum" else loss.detach()


def bf16_weights_tensors(model, params):
    """The parameters among `params` (file order) whose table tensor (llmc/gpt2.h's: a block's are its
    layers' together) holds at most DEBUG_BF16_WEIGHTS_MAX_SIZE entries."""
    names = {id(p): table_name(name) for name, p in model.named_parameters()}
    sizes = collections.Counter()
    for p in params:
        sizes[names[id(p)]] += p.numel()
    return [p for p in params if sizes[names[id(p)]] <= DEBUG_BF16_WEIGHTS_MAX_SIZE]


def gradients_at_bf16_weights(model, x, y, params, args, autocast):
    """The gradients of one forward and backward of x, y at the weights of the BF16 model file (every
    parameter rounded to bfloat16), of the tensors bf16_weights_tensors names, in file order; the
    weights restored after. Their distance from the float32 gradients is how far
    rounding at bfloat16's precision moves each: for a tensor of a few scalars, each entry one sum
    over the batch that may cancel, test_gpt2cu's BF16 build bounds its error by a multiple of it."""
    kept = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.copy_(p.bfloat16().float())
    debug_forward_backward(model, x, y, args, autocast)
    grads = [p.grad.detach().cpu().clone() for p in bf16_weights_tensors(model, params)]
    with torch.no_grad():
        for p, value in zip(params, kept):
            p.copy_(value)
    model.zero_grad(set_to_none=True)
    return grads


def debug_first_values(model, x, y, params, args, autocast):
    """The debug state's logits, mean loss and gradients of one forward and backward of x, y."""
    logits, mean_loss = debug_forward_backward(model, x, y, args, autocast)
    return [logits.cpu(), mean_loss.cpu()] + [p.grad.detach().cpu().clone() for p in params]


# The debug state's header keeps the text of its --stages in slots 32 to 252, 4 bytes a slot in
# little-endian order, its length in bytes in slot 31 (0: none); slot 253 names Muon's orthogonalisation,
# 1 + its place in NEWTON_SCHULZ (0: no Muon).
DEBUG_STAGES_SLOT = 32
DEBUG_NEWTON_SCHULZ_SLOT = 253
DEBUG_STAGES_BYTES = 4 * (DEBUG_NEWTON_SCHULZ_SLOT - DEBUG_STAGES_SLOT)


def debug_state_settings(model, untie_step=-1, normuon=False, adam_every=1, muon_qk_heads=0, adam_rows="",
                         muon_tensor_lr="", cautious_decay=False):
    """The settings a version-5 debug state keeps, as the CUDA trainer's flags: the loss's, the
    untie step, windows in tokens, Muon's NorMuon, Q and K blocks and rates of tensors, AdamW's interval
    and tensors' rows, the FP8 head's scales, the key offset, the attention's scale and the cautious
    weight decay ("-lc 23,5 -mtp 1.0,0.5,0.25 -pw 0.25 -ut 4 -awt 1 -mn 1 -mq 2 -ao 2 -ar ve:lr=75,b1=0.75
    -fhs 100.0,1.6,0.75 -ko 1 -asc 0.1 -mt fcw=2,fcprojw=4 -cd 1"; ""
    for the defaults; -pw, maybe 0, wherever the prefix table is, which
    --prefix_weight or a stage's pw= asks for). The file holds them after its header: their length
    in bytes, the text padded to 4-byte words, then the prefix table's rows (0 without one) and its
    int32 ids."""
    words = []
    default_cap = SPEEDRUN_SOFTCAP if model.config.speedrun else LOGIT_SOFTCAP_MODERN
    if model.config.modern and (model.logit_cap != default_cap or model.logit_shift != 0.0 or
                                model.logit_bf16_sigmoid):
        rounded = ",bf16" if model.logit_bf16_sigmoid else ""
        words += ["-lc", f"{np.float32(model.logit_cap)},{np.float32(model.logit_shift)}{rounded}"]
    terms = model.loss_terms
    if terms is not None:
        words += ["-mtp", ",".join(str(np.float32(w)) for w in terms.next_token_weights)]
    if model.prefix_table is not None:
        words += ["-pw", str(np.float32(terms.prefix_weight if terms is not None else 0.0))]
    if untie_step >= 0:
        words += ["-ut", str(untie_step)]
    if model.window_tokens:
        words += ["-awt", "1"]
    if normuon:
        words += ["-mn", "1"]
    if adam_every > 1:
        words += ["-ao", str(adam_every)]
    if muon_qk_heads:
        words += ["-mq", str(muon_qk_heads)]
    if adam_rows:
        words += ["-ar", adam_rows]
    if isinstance(model.lm_head, Fp8Head) and model.lm_head.setting != FP8_HEAD_SCALES_RECORD28:
        words += ["-fhs", ",".join(repr(v) for v in model.lm_head.setting)]
    if model.key_offset:
        words += ["-ko", "1"]
    if model.attention_scale is not None:
        words += ["-asc", repr(model.attention_scale)]
    if model.yarn:
        words += ["-yn", "1"]
    if muon_tensor_lr:
        words += ["-mt", muon_tensor_lr]
    if cautious_decay:
        words += ["-cd", "1"]
    if model.mlp_from_output:
        words += ["-mr", "1"]
    if model.fp8_mlp:
        words += ["-fm", "1"]
    return " ".join(words)


def read_debug_state_settings(path, header):
    """(the settings' text, the prefix table or None, the byte offset of the batch) of a debug state."""
    if header[1] not in (DEBUG_STATE_VERSION_SETTINGS, DEBUG_STATE_VERSION_BF16_WEIGHTS):
        return "", None, 4 * HEADER_INTS
    at = 4 * HEADER_INTS
    length = int(np.fromfile(path, np.int32, 1, offset=at)[0])
    text = np.fromfile(path, np.uint8, length, offset=at + 4).tobytes().decode()
    at += 4 + -(-length // 4) * 4
    rows = int(np.fromfile(path, np.int32, 1, offset=at)[0])
    prefix = torch.from_numpy(np.fromfile(path, np.int32, rows, offset=at + 4).astype(np.int64)) if rows else None
    return text, prefix, at + 4 + 4 * rows


def apply_debug_state_settings(model, text, prefix, path):
    """A version-5 debug state's settings (debug_state_settings) onto the model: its cap, loss terms
    and windows' unit (-ut: its checkpoint's embedding is the head already, and one step is checked;
    -mn, -mq, -ao, -ar, -mt, -cd: its first step's gradients, which the check compares, come before the
    optimizers' steps; -fhs: the FP8 head's scales, where the head is FP8; -asc: the attention's scale)."""
    words = text.split()
    settings = dict(zip(words[::2], words[1::2]))
    unknown = set(settings) - {"-lc", "-mtp", "-pw", "-ut", "-awt", "-mn", "-mq", "-ao", "-ar", "-fhs", "-ko", "-asc",
                               "-yn", "-mt", "-cd", "-mr", "-fm"}
    ones = all(settings.get(flag, "1") == "1" for flag in ("-awt", "-ko", "-yn", "-cd", "-mr", "-fm"))
    if len(words) % 2 or unknown or not ones:
        fail(f"--check_debug_state {path}: settings '{text}' are not pairs of -lc, -mtp, -pw, -ut, -awt 1, "
             "-mn, -mq, -ao, -ar, -fhs, -ko 1, -asc, -yn 1, -mt, -cd 1, -mr 1 and -fm 1: re-create it")
    if "-fhs" in settings and isinstance(model.lm_head, Fp8Head):
        model.lm_head.setting = parse_fp8_head_scales(settings["-fhs"])
    model.window_tokens = "-awt" in settings
    set_key_offset(model, "-ko" in settings)
    set_attention_scale(model, float(settings["-asc"]) if "-asc" in settings else None)
    set_yarn_switch(model, "-yn" in settings)
    set_mlp_from_output(model, "-mr" in settings)
    set_fp8_mlp(model, "-fm" in settings)
    set_logit_cap(model, settings.get("-lc"))
    prefix_weight = float(settings.get("-pw", 0.0))
    if prefix is None and prefix_weight > 0.0:
        fail(f"--check_debug_state {path}: -pw {prefix_weight} and no prefix table: the file is damaged; re-create it")
    model.prefix_table = prefix
    model.loss_terms = loss_terms(parse_prediction_weights(settings.get("-mtp", "1")), prefix_weight, prefix)


def yarn_rescale(freq, scale, old_window, new_window):
    """Record #89's YaRN (its reference's Yarn.apply) at a change of the long window from old_window
    to new_window tokens: the rotary's frequencies freq (float32, on the CPU, whose divisions are
    true ones) and the attention's scale (a Python float), rescaled."""
    rotations = old_window * freq / (2 * math.pi)
    s = old_window / new_window
    w = torch.clamp((rotations - YARN_ALPHA) / (YARN_BETA - YARN_ALPHA), 0, 1)
    return freq * (s + w * (1 - s)), scale * (YARN_SCALE_SLOPE * math.log(new_window / old_window) + 1)


def yarn_advance(plan, step, freq, scale):
    """YaRN's (freq, scale) at `step` from those at step - 1: the change of the plan's long window
    between them, if any (its stages' windows: the final validation's is none)."""
    old, new = (plan.stage_window_blocks(s) * ATTENTION_BLOCK for s in (step - 1, step))
    return yarn_rescale(freq, scale, old, new) if step > 0 and old != new else (freq, scale)


def yarn_at(plan, step, freq, scale):
    """YaRN's (freq, scale) at `step` from the base ones: every change from step 1 to `step`, in order."""
    for s in range(1, step + 1):
        freq, scale = yarn_advance(plan, s, freq, scale)
    return freq, scale


def yarn_base(model):
    """YaRN's start: the base rotary frequencies (CPU float32) and the attention's base scale."""
    attn = next(block.attn for block in model.transformer.h if block.attn is not None)
    scale = model.attention_scale if model.attention_scale is not None else ATTENTION_SCALE_MODERN
    return rotary_frequencies(attn.freq.numel() * 2), scale


def set_yarn(model, freq, scale):
    """YaRN's frequencies and scale into every attention (the model's base scale unchanged)."""
    for block in model.transformer.h:
        if block.attn is not None:
            block.attn.freq.copy_(freq)
            block.attn.scale = scale


def set_mlp_from_output(model, on):
    """--mlp_from_output: ReLU^2's derivative from its output (Relu2FromOutput) in every MLP."""
    if on and not model.config.modern:
        fail("--mlp_from_output 1 takes ReLU^2's derivative from its output, and GPT-2's MLP has GELU: give "
             "--recipe modern or speedrun, or drop --mlp_from_output")
    model.mlp_from_output = on
    for block in model.transformer.h:
        block.mlp.from_output = on


def set_fp8_mlp(model, on):
    """--fp8_mlp: record #89's FP8 MLP (Fp8MlpFunction) in every MLP's training forward."""
    if on and (not model.config.modern or model.transformer.h[0].mlp.c_fc.bias is not None):
        fail("--fp8_mlp 1 is record #89's MLP, ReLU^2 without biases: give --recipe speedrun or record89")
    if on and not model.mlp_from_output:
        fail("--fp8_mlp 1's backward reads ReLU^2's output alone: give --mlp_from_output 1 with it")
    model.fp8_mlp = on
    for block in model.transformer.h:
        block.mlp.fp8 = Fp8MlpState() if on else None


def fp8_mlp_reset(model):
    """The FP8 MLP's state as a new run's (its scales at the start, the casts made again)."""
    for block in model.transformer.h:
        if block.mlp.fp8 is not None:
            block.mlp.fp8.reset()


def fp8_mlp_updated(model, step):
    """After step `step`'s update: the FP8 MLP's casts made again before the next forward."""
    for block in model.transformer.h:
        if block.mlp.fp8 is not None:
            block.mlp.fp8.updated(step)


def set_yarn_switch(model, on):
    """--yarn: YaRN at the stage plan's long-window changes, which the steps apply (yarn_at)."""
    if on and not model.config.modern:
        fail("--yarn 1 rescales the rotary's frequencies, and GPT-2 has no rotary: give --recipe modern or speedrun, "
             "or drop --yarn")
    model.yarn = on


def check_yarn(args, plan):
    """--yarn 1 follows the stage plan's long window: every stage needs one (and --write_debug_state
    a --stages plan)."""
    if not args.yarn:
        return
    stages = plan.stages if plan is not None else []
    missing = [number for number, stage in enumerate(stages, 1) if stage.window_blocks == 0]
    if plan is None or missing:
        where = f"stage {missing[0]} of {len(stages)} has no window" if missing else "--write_debug_state has none"
        fail(f"--yarn 1 rescales the rotary at the stage plan's changes of the long window, and {where}: give every "
             f"stage one (--stages' aw=, or --window_blocks, with --documents 1), or drop --yarn")


def set_attention_scale(model, scale):
    """--attention_scale: every attention's softmax scale (a Python float, as record #89's 0.1) instead
    of the architecture's; None: the architecture's."""
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        fail(f"--attention_scale {scale}: the attention's softmax scale must be positive (record #89's 0.1; leave "
             f"it out for the architecture's)")
    model.attention_scale = scale
    for block in model.transformer.h:
        if block.attn is not None:
            block.attn.scale = scale if scale is not None else ATTENTION_SCALE_MODERN if model.config.modern else None


def set_key_offset(model, on):
    """--key_offset: record #89's key offset (shift_stationary_keys) in the layers with attention and
    the long window, as its reference's key_offset = [b == ws_long for b in bm_sizes]: every layer at
    a depth other than the speedrun's 12."""
    if on and not model.config.modern:
        fail("--key_offset 1 shifts the keys' stationary rotary dims, and GPT-2 has no rotary: give --recipe "
             "modern or speedrun, or drop --key_offset")
    model.key_offset = on
    for spec, block in zip(model.config.plan, model.transformer.h):
        if block.attn is not None:
            block.attn.key_offset = on and spec.window == "L"


def debug_state_stages(header):
    """The --stages text of a debug state's header ("" for none, and for files written before)."""
    length = int(header[DEBUG_STAGES_SLOT - 1])
    return header[DEBUG_STAGES_SLOT:].astype("<i4").tobytes()[:length].decode()


# Each parameter's tensor in llmc/gpt2.h's table (its name in test_gpt2cu's lines), by the parameter's
# name with a block's "transformer.h.N." and a value embedding's index taken off.
TABLE_NAMES = {"transformer.wte.weight": "wte", "transformer.wpe.weight": "wpe", "transformer.ln_e.weight": "lnew",
               "ln_1.weight": "ln1w", "ln_1.bias": "ln1b", "attn.c_attn.weight": "qkvw", "attn.c_attn.bias": "qkvb",
               "attn.c_proj.weight": "attprojw", "attn.c_proj.bias": "attprojb", "ln_2.weight": "ln2w",
               "ln_2.bias": "ln2b", "mlp.c_fc.weight": "fcw", "mlp.c_fc.bias": "fcb", "mlp.c_proj.weight": "fcprojw",
               "mlp.c_proj.bias": "fcprojb", "transformer.ln_f.weight": "lnfw", "transformer.ln_f.bias": "lnfb",
               "lm_head.weight": "headw", "lm_head.bias": "headb", "transformer.ve.weight": "ve",
               "attn.gate.weight": "attngate", "skip_weights": "skipw", "lambdas": "lambdas",
               "attn.value_scales": "value_scales", "smear_weight": "smearw", "smear_lambda": "smear_lambda",
               "bigram.weight": "bigram", "bigram_gates": "bigram_gates", "ve_gates": "vegate",
               "resid_lambdas": "resid_lambdas", "post_lambdas": "post_lambdas", "xsa_alpha": "xsa_alpha",
               "x0_gates": "x0_gates", "skip_gate": "skip_gate", "head_gates": "head_gates",
               "attn_lambdas": "attn_lambdas", "mudd_gate_w1": "mudd_gate_w1", "mudd_gate_w2": "mudd_gate_w2",
               "mudd_gate_b2": "mudd_gate_b2", "mudd_gate_scale": "mudd_gate_scale", "mudd_w1": "mudd_w1",
               "mudd_w2": "mudd_w2", "mudd_b2": "mudd_b2"}


def table_name(parameter_name):
    parts = parameter_name.split(".")
    if parts[:2] == ["transformer", "h"]:
        parts = parts[3:]
    elif parts[:2] == ["transformer", "ve"]:
        parts = parts[:2] + parts[3:]
    return TABLE_NAMES[".".join(parts)]


def read_debug_state(path, header_only=False):
    """(header, x, y, the float32 values after them, mapped rather than read: a long sequence's
    logits are gigabytes) of a debug state file (write_debug_state); its header alone with
    header_only."""
    try:
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(4 * HEADER_INTS), np.int32)
        size = os.path.getsize(path)
    except OSError as e:
        fail(f"--check_debug_state {path}: {e.strerror}")
    if len(header) < HEADER_INTS or header[0] != DEBUG_STATE_MAGIC:
        fail(f"--check_debug_state {path}: not a debug state (written by --write_debug_state)")
    if header_only:
        return header
    B, T = int(header[2]), int(header[3])
    batch_at = read_debug_state_settings(path, header)[2]
    floats_at = batch_at + 4 * 2 * B * T
    if size < floats_at:
        fail(f"--check_debug_state {path}: shorter than its batch of {B} x {T}: the file is cut off")
    tokens = np.fromfile(path, np.int32, 2 * B * T, offset=batch_at).astype(np.int64)
    floats = np.memmap(path, np.float32, "r", floats_at, ((size - floats_at) // 4,))
    x, y = (torch.from_numpy(t.reshape(B, T).copy()) for t in (tokens[:B * T], tokens[B * T:]))
    return header, x, y, floats


def check_debug_state(args, model, device, dtype, use_compile):
    """--check_debug_state STATE: the first step of write_debug_state again, from --init_from's model
    (the state's) on the state's batch, window and loss, but as train() computes a step in --dtype
    (the parameter and compute dtypes, --fp8_head, --flash, --compile); prints each tensor's
    ||got - ref|| / ||ref|| against the state's float32 logits, loss and gradients (a table tensor's
    layers together), test_gpt2cu's measure, so that PyTorch's error in bfloat16 and ours' can be set
    side by side, tensor by tensor."""
    path = args.check_debug_state
    header, x, y, floats = read_debug_state(path)
    version4 = header[1] in (DEBUG_STATE_VERSION_MODERN, DEBUG_STATE_VERSION_SETTINGS, DEBUG_STATE_VERSION_BF16_WEIGHTS)
    apply_debug_state_settings(model, *read_debug_state_settings(path, header)[:2], path)
    if version4 and bool(header[30]) != bool(args.fp8_head):
        head = "FP8 (--fp8_head 1), the rest in float32" if header[30] else "float32"
        fail(f"--check_debug_state {path}: its steps took the head in {head}, and this check's --fp8_head is "
             f"{int(bool(args.fp8_head))}; give the state's head, so that only the rest's dtype differs")
    if version4:
        model.documents, model.window_blocks = bool(header[21]), int(header[22]) or None
        model.short_window_blocks = None  # the header's: half the long window
    reduction = "sum" if version4 and header[14] else "mean"
    if version4 and debug_state_stages(header):
        print(f"{path}'s debug steps followed --stages {debug_state_stages(header)!r}; its first step, "
              f"measured here, is the whole batch's")
    raw_model, model, autocast = placed_model(args, model, device, dtype, use_compile)
    x, y = x.to(device), y.to(device)
    with autocast:
        logits, loss = model(x, y, reduction, raw_model.attention_masks(x))
    loss.backward()
    named = list(raw_model.named_parameters())
    in_file_order = params_in_file_order(raw_model)
    order = {id(p): i for i, p in enumerate(in_file_order)}
    named.sort(key=lambda item: order[id(item[1])])
    got = [("logits", logits.detach()), ("loss", loss.detach() / (y.numel() if reduction == "sum" else 1))]
    got += [("grad " + table_name(name), torch.zeros_like(p) if p.grad is None else p.grad) for name, p in named]
    expected = sum(t.numel() for _, t in got) + int(header[4])
    if header[1] == DEBUG_STATE_VERSION_BF16_WEIGHTS:
        expected += sum(p.numel() for p in bf16_weights_tensors(raw_model, in_file_order))
    if len(floats) != expected:
        fail(f"--check_debug_state {path}: holds {len(floats)} values after its batch, where --init_from's "
             f"model's tensors and the losses of its {int(header[4])} steps take {expected}: give the state written "
             "with that model")
    print(f"{dtype} as training computes it (parameter and compute dtypes) against {path}'s float32:")
    for name, (n, error) in relative_errors(got, floats).items():
        print(f"{name:<24s} n={n:<10d} |got-ref|/|ref| {error:.3e}")


def relative_errors(got, floats, chunk=1 << 24):
    """{name: (values, ||got - ref|| / ||ref||)} of the tensors [(name, tensor)] against the float32
    values that follow one another in `floats`, the tensors of one name taken together; in float64,
    `chunk` values at a time on the tensor's device (a long sequence's logits would not fit twice)."""
    squares, at = {}, 0
    for name, tensor in got:
        flat = tensor.detach().flatten()
        sums = squares.setdefault(name, [0, 0.0, 0.0])
        sums[0] += flat.numel()
        for start in range(0, flat.numel(), chunk):
            piece = flat[start:start + chunk].double()
            ref = torch.from_numpy(np.array(floats[at + start:at + start + piece.numel()])).to(piece.device).double()
            diff = piece - ref
            sums[1] += float(diff.dot(diff))
            sums[2] += float(ref.dot(ref))
        at += flat.numel()
    return {name: (n, math.sqrt(diff) / (math.sqrt(base) + 1e-30)) for name, (n, diff, base) in squares.items()}


# ------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch GPT-2 reference: debug states for the C++ "
                                "tests, training on token shards, and a benchmark (see dev/SPEC.md).")
    a = p.add_argument_group("model")
    a.add_argument("--recipe", choices=RECIPES, help="gpt2: GPT-2 trained with AdamW, as without --recipe; "
                   "modern: the modern architecture trained with Muon as modded-nanogpt's optimization-track "
                   "baseline; speedrun: modded-nanogpt's speedrun record #28, its architecture, optimizers, "
                   "schedules and document-aligned data (dev/SPEC.md); record89: its record #89 but the MUDD "
                   "dense connections and the FP8 MLP, the speedrun architecture with record #89's switches, "
                   "stages, optimizers and AdamW rows by tensor; sets every flag marked 'recipe' below that is not "
                   "given")
    a.add_argument("--arch", choices=sorted(ARCH_PRESETS), help=recipe_help("arch", "architecture"))
    a.add_argument("--model", choices=sorted(PRESETS), help="preset shape of the architecture (llmc/gpt2.h; "
                   "speedrun: d12 and tiny); default d12")
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
    a.add_argument("-b", "--batch_size", type=int, help=recipe_help("batch_size", "micro batch size per process"))
    a.add_argument("-t", "--seq_len", type=int, help=recipe_help("seq_len", "sequence length"))
    a.add_argument("--total_batch_size", type=int, help=recipe_help(
        "total_batch_size", "tokens per step; -1 = B*T*world (grad accumulation = total / (B*T*world))"))
    a.add_argument("--shuffle", type=int, choices=[0, 1], help=recipe_help("shuffle", "shuffle the training data"))
    a.add_argument("--documents", type=int, choices=[0, 1], help=recipe_help("documents", "1: training "
                   "sequences of whole documents, each from a document start (token 50256), in modded-nanogpt's "
                   "order (DocumentLoader), and attention within a document: a token attends only to the earlier "
                   "tokens of its own document (validation too, its sequences contiguous slices)"))
    a.add_argument("--window_blocks", help=recipe_help("window_blocks", "with --documents 1: "
                   "attention within modded-nanogpt's window of N blocks of 128 tokens (12 layers: N in its long "
                   "layers, N // 2 in its short ones; other depths: N in every layer), or S/N: S blocks in the short "
                   "layers (1 <= S <= N); -1: its schedule, 1 block growing to 14 over --num_iterations; 0: no "
                   "window"))
    a.add_argument("--window_tokens", type=int, choices=[0, 1], help=recipe_help(
        "window_tokens", "with --documents 1 and a window: 1: a window of N blocks is N x 128 tokens back from "
        "each query (record #89's FlashAttention window: key j seen by query i when i - 128N <= j <= i); 0: whole "
        "blocks (the block mask)"))
    a.add_argument("--attention_scale", type=float, help=recipe_help(
        "attention_scale", "the attention's softmax scale, positive (record #89's 0.1; --yarn 1 changes it from "
        "there; the CUDA trainer's -asc); none given: the architecture's (0.12 modern and speedrun, 1/sqrt(hs) "
        "GPT-2)"))
    a.add_argument("--mlp_from_output", type=int, choices=[0, 1], help=recipe_help(
        "mlp_from_output", "1: record #89's MLP backward: ReLU^2's derivative 2 sqrt(y) from its output y in "
        "FP32, which alone is kept (the CUDA trainer's -mr); 0: 2 relu(x) from its input x"))
    a.add_argument("--yarn", type=int, choices=[0, 1], help=recipe_help(
        "yarn", "1: record #89's YaRN: at each change of the stage plan's long window (--stages' aw=, not "
        "--final_window_blocks) from O to N tokens, each rotary frequency f times s + w (1 - s), s = O/N, w = "
        "clamp((O f / 2 pi - 1) / 31, 0, 1), the attention's scale times 1 + 0.2 ln(N/O) (the CUDA trainer's -yn); "
        "every stage needs a window"))
    a.add_argument("--key_offset", type=int, choices=[0, 1], help=recipe_help(
        "key_offset", "1: record #89's key offset on the layers with the long window (every layer at a depth other "
        "than the speedrun's 12): after the rotary, each key's stationary dims are the previous key's over the "
        "batch's tokens as one sequence (the first key keeping its own); the modern architectures"))
    a.add_argument("--final_window_blocks", type=int, help=recipe_help(
        "final_window_blocks", "with --documents 1 and a window: the long window N of the validation after the "
        "last step, its short one staying the last stage's (modded-nanogpt's record #89: 20); 0: the last stage's"))
    a = p.add_argument_group("optimisation")
    a.add_argument("--optimizer", choices=["adamw", "muon"], help=recipe_help(
        "optimizer", "muon: Muon for the blocks' matrices, AdamW for the rest"))
    a.add_argument("--learning_rate", type=float, help=recipe_help(
        "learning_rate", "AdamW's peak learning rate (modern: of the blocks' matrices under AdamW)"))
    a.add_argument("--embedding_lr", type=float, help=recipe_help(
        "embedding_lr", "modern: AdamW lr of wte (speedrun: and of the value embeddings)"))
    a.add_argument("--head_lr", type=float, help=recipe_help("head_lr", "modern: AdamW lr of the head weight"))
    a.add_argument("--scalar_lr", type=float, help=recipe_help(
        "scalar_lr", "modern: AdamW lr of the 1-D tensors (gains, biases; speedrun: its scalars)"))
    a.add_argument("--beta1", type=float, help=recipe_help("beta1", "AdamW beta1"))
    a.add_argument("--beta2", type=float, help=recipe_help("beta2", "AdamW beta2"))
    a.add_argument("--adam_eps", type=float, help=recipe_help("adam_eps", "AdamW eps"))
    a.add_argument("--adam_eps_before_correction", type=int, choices=[0, 1], help=recipe_help(
        "adam_eps_before_correction", "1: AdamW's eps added to sqrt(v) before the bias correction, as the "
        "speedrun's reference adds it; 0: to the corrected sqrt(vhat), as torch's AdamW"))
    a.add_argument("--weight_decay", type=float, help=recipe_help(
        "weight_decay", "AdamW decay (GPT-2: of the 2-D matrices; modern: of every AdamW tensor)"))
    a.add_argument("--cautious_decay", type=int, choices=[0, 1], help=recipe_help(
        "cautious_decay", "1: both optimizers' weight decay cautious, record #89's (SPEC.md): only where the step and "
        "the weight agree in sign, AdamW's lr^2 wd p, Muon's wd lr lr_eff p; 0: decoupled, lr wd p on every weight"))
    a.add_argument("--muon_lr", type=float, help=muon_help("muon_lr", "Muon's peak learning rate"))
    a.add_argument("--muon_weight_decay", type=float, help=muon_help("muon_weight_decay", "Muon's weight decay"))
    a.add_argument("--muon_momentum", type=float, help=muon_help("muon_momentum", "Muon's momentum"))
    a.add_argument("--muon_momentum_start", type=float, help=muon_help(
        "muon_momentum_start", "Muon's momentum at step 0, rising linearly to --muon_momentum"))
    a.add_argument("--muon_momentum_warmup", type=int, help=muon_help(
        "muon_momentum_warmup", "the steps over which Muon's momentum rises; 0: constant"))
    a.add_argument("--muon_momentum_cooldown", type=int, help=muon_help(
        "muon_momentum_cooldown", "the run's last steps (with --stages' extension) over which Muon's momentum "
        "falls linearly back to --muon_momentum_start; 0: none"))
    a.add_argument("--muon_ns", choices=sorted(NEWTON_SCHULZ), help=muon_help(
        "muon_ns", "Muon's orthogonalisation: " + "; ".join(
            f"{name} {newton_schulz.describe()}" for name, newton_schulz in NEWTON_SCHULZ.items())))
    a.add_argument("--normuon", type=int, choices=[0, 1], help=muon_help(
        "normuon", "1: record #89's NorMuon (SPEC.md): Muon's orthogonalised update divided, per row or column of "
        "the longer side, by the root of a running mean (beta2 0.9) of its squares, then scaled back to its norm"))
    a.add_argument("--muon_qk_heads", type=int, help=muon_help(
        "muon_qk_heads", "N: each attention's q and k orthogonalised in row blocks of N heads, v whole (record "
        "#89's 2: its head pairs, a matrix of 2 heads' rows); 0: q, k and v whole"))
    a.add_argument("--muon_tensor_lr", help=muon_help(
        "muon_tensor_lr", "Muon's rate of a tensor's matrices over --muon_lr, NAME=X,... (NAME of "
        f"{', '.join(MUON_TENSORS)}), in its lr and the cautious decay's lr_eff: record #89's fcw=2,fcprojw=4; "
        "none: 1 (the CUDA trainer's -mt)"))
    a.add_argument("--loss_reduction", choices=["mean", "sum"], help=recipe_help(
        "loss_reduction", "the gradients' loss: the mean or the sum of the token losses (printed: the mean)"))
    a.add_argument("--logit_cap", help=recipe_help(
        "logit_cap", "the head's cap within [1, 40] in place of the architecture's, and the sigmoid cap's shift "
        "within [-100, 100]: '23,5', record #89's 23 sigmoid((z + 5) / 7.5); a third item bf16 rounds the training "
        "loss's sigmoid to bfloat16, as record #89's kernel (evaluation keeps it float32): '23,5,bf16'"))
    a.add_argument("--mtp", default="1", help="the training loss's weights of the next token and of the one or "
                   "two after it, each within [0, 1] (validation keeps the next token's alone): '1,0.5,0.25' (record "
                   "#89's first stage); a target past the sequence's end adds nothing")
    a.add_argument("--prefix_weight", type=float, help=recipe_help(
        "prefix_weight", "the training loss's weight of the next token's prefix token, the longest proper prefix "
        "of its bytes that is a token (--tokenizer's vocabulary), where it has one: record #89's 0.25 (0: none)"))
    a.add_argument("--untie_step", type=int, help=recipe_help(
        "untie_step", "the modern models' head tied to the embedding through step U's update (the head stepped "
        "with both gradients, the embedding its copy), then the head's AdamW state copied to the embedding, "
        "separate from step U + 1 (the CUDA trainer's -ut; modded-nanogpt's record #89: 847); -1: separate "
        "throughout"))
    a.add_argument("--smear", type=int, choices=[0, 1], help=recipe_help(
        "smear", "--recipe speedrun: 1 the model smears its embedding (record #89's: each token's takes a gated "
        "share of the one before, before the norm; the CUDA trainer's -sm); --init_from's checkpoint says whether "
        "it smears"))
    a.add_argument("--bigram", type=int, choices=[0, 1], help=recipe_help(
        "bigram", "--recipe speedrun: 1 the model has record #89's bigram hash embedding (a table of hashed token "
        "pairs, added with learned gates before layer 0 and after the later layers' attention; the CUDA trainer's "
        "-bg); --init_from's checkpoint says whether it has it"))
    a.add_argument("--rotary_pairs", type=int, choices=[0, 1], help=recipe_help(
        "rotary_pairs", "--recipe modern or speedrun: 1 the rotary in record #89's layout: adjacent dims (2i, 2i + "
        "1) turned for i < hs/4, hs/2 to hs - 1 unturned, at positions over each forward's rows as one sequence "
        "(the CUDA trainer's -rp); --init_from's checkpoint says which it has"))
    a.add_argument("--resid_lambdas", type=int, choices=[0, 1], help=recipe_help(
        "resid_lambdas", "--recipe speedrun: 1 the model has record #89's residual and post lambdas (each "
        "sublayer's add r x + p out, r and p learned a layer and sublayer; the CUDA trainer's -rl); --init_from's "
        "checkpoint says whether it has them"))
    a.add_argument("--record_init", type=int, choices=[0, 89], help=recipe_help(
        "record_init", "--recipe speedrun: 89 the model's init from --seed is record #89's (the head N(0, 0.005) "
        "and the embedding its copy, the value embeddings N(0, 0.01), the attention's output projection uniform as "
        "its input's; the CUDA trainer's -ri); 0: record #28's"))
    a.add_argument("--ve_gates", type=int, choices=[0, 1], help=recipe_help(
        "ve_gates", "--recipe speedrun: 1 the model has record #89's value-embedding gates (each head's share of "
        "the value embedding 2 sigmoid of learned weights times the first 6 channels of the attention's input and "
        "of the embedding; the CUDA trainer's -vg); --init_from's checkpoint says whether it has them"))
    a.add_argument("--xsa", type=int, choices=[0, 1], help=recipe_help(
        "xsa", "--recipe speedrun: 1 the model has record #89's exclusive self-attention in its layers 1, 3 and 4 "
        "(each head's output less tanh(alpha) times its part along the value it read, alpha learned per layer and "
        "head; the CUDA trainer's -xs); --init_from's checkpoint says whether it has it"))
    a.add_argument("--record89_plan", type=int, choices=[0, 1], help=recipe_help(
        "record89_plan", "--recipe speedrun: 1 the model has record #89's 11 layers (no attention in layer 6, "
        "which adds layer 3's output with a gate, layers 9 and 10 attending over layer 7's output, five value "
        "embeddings, x0 added after each attention with a learned gate in place of the x0 lambdas, no attention "
        "gates; the CUDA trainer's -lp); --init_from's checkpoint says whether it has it"))
    a.add_argument("--paired_heads", type=int, choices=[0, 1], help=recipe_help(
        "paired_heads", "--recipe speedrun with --record89_plan 1 and --rotary_pairs 1: 1 the model has record "
        "#89's paired heads in its layers 0, 2, 5 and 9 (head h of token t rotated at position 2t + (h & 1); heads "
        "0..NH/2-1 of token t attend at position 2t and the rest at 2t + 1 of each row doubled, as NH/2 heads; "
        "windows in positions: --window_tokens 1; the CUDA trainer's -ph); --init_from's checkpoint says whether "
        "it has them"))
    a.add_argument("--attn_lambdas", type=int, choices=[0, 1], help=recipe_help(
        "attn_lambdas", "--recipe speedrun: 1 the model has record #89's attention lambdas (each attention layer's "
        "qkv and output projections read their weights times learned scalars s0 and s1, 0.5 and 1 at the start; "
        "the CUDA trainer's -al); --init_from's checkpoint says whether it has them"))
    a.add_argument("--mudd_gates", type=int, choices=[0, 1], help=recipe_help(
        "mudd_gates", "--recipe speedrun with --record89_plan 1: 1 the model reads record #89's XSA strengths, "
        "head gates, x0 and bigram gates (but layer 10's) and the skip's gate a token, from two MUDD gate "
        "generators (gelu(x W1^T) W2^T + b2) x scale, one of x0 and one of layer 4's input; the CUDA trainer's "
        "-mg); --init_from's checkpoint says whether it has them"))
    a.add_argument("--mudd_connections", type=int, choices=[0, 1], help="--recipe speedrun with --record89_plan "
                   "1: 1 the model has record #89's MUDD dense connections: coefficients a token from two generators "
                   "(gelu(x W1^T) W2^T + b2) x 0.1, one of the last layer's input, which mix earlier layers' outputs "
                   "into its value and stream and replace its lambdas and gates, one of its output, which mixes "
                   "them into the final stream; --init_from's checkpoint says whether it has them")
    a.add_argument("--composed_attention", type=int, choices=[0, 1], help=recipe_help(
        "composed_attention", "--recipe speedrun with --mudd_gates 1: 1 layer 10's heads each add w_out_h (A v_h), "
        "A the sum over the heads of w_in_h times their attention probabilities over the last 112 keys of the "
        "query's document (record #89's composed attention; w_in normed over the heads, w_in and w_out a token "
        "from the post MUDD gate generator); --init_from's checkpoint says whether it has it"))
    a.add_argument("--adam_every", type=int, help=recipe_help(
        "adam_every", "AdamW steps on every K-th step only ((step + 1) % K == 0), with the sum of the K steps' "
        "gradients, which the steps between keep (the CUDA trainer's -ao; record #89's 2: its odd steps; "
        "--grad_clip 0); 1: every step"))
    a.add_argument("--adam_rows", help=recipe_help(
        "adam_rows", "AdamW tensors' own rows over their roles' (the CUDA trainer's -ar), NAME:key=value,... apart "
        "by ';', NAME a tensor of llmc/gpt2.h's table, keys lr (times its role's rate), b1 and b2 (its betas), "
        "wd (times its role's decay) and bf16 (none, weight or all: what of a bfloat16 run's step stays bfloat16): "
        "'ve:lr=75,b1=0.75,b2=0.95,wd=5;headw:b1=0.5' (record #89's value embeddings "
        "and head); not the tensors Muon takes"))
    a.add_argument("--tokenizer", default="dev/data/tinyshakespeare/gpt2_tokenizer.bin", help="the llm.c "
                   "vocabulary file --prefix_weight reads the tokens' bytes from")
    a.add_argument("--warmup_iters", type=int, default=0, help="linear warmup steps")
    a.add_argument("--final_lr_frac", type=float, help=recipe_help("final_lr_frac", "final lr as a fraction of the peak"))
    a.add_argument("--lr_schedule", choices=["cosine", "linear", "constant", "wsd", "stable_decay", "cooldown"],
                   help=recipe_help("lr_schedule", "stable_decay: constant, then for the last --cooldown_frac of "
                                    "the steps linear to --final_lr_frac; cooldown: each stage's lr multiplier, "
                                    "from step int(N (1 - --cooldown_frac)) falling linearly to --final_lr_frac of "
                                    "the peak at N, whatever the stage's multiplier (modded-nanogpt's record #89)"))
    a.add_argument("--cooldown_frac", type=float, help=recipe_help(
        "cooldown_frac", "stable_decay and cooldown: the fraction of the steps that decays"))
    a.add_argument("--grad_clip", type=float, help=recipe_help("grad_clip", "global gradient norm clip; 0 = off"))
    a.add_argument("--num_iterations", type=int, help=recipe_help("num_iterations", "optimizer steps"))
    a.add_argument("--stages", metavar="PLAN", help=recipe_help(
        "stages", "the run as stages separated by ';', each its share of --num_iterations (0.25 or 1/3; the last "
        "may be +E: E steps more after them) and KEY=VALUE words that hold from it on: t= sequence length, z= "
        "tokens a step (-1: one micro batch), cap= tokens of one document a sequence takes (0: all; needs "
        "--documents 1), aw= window as --window_blocks (N or S/N), lr= learning-rate multiplier, mtp= and pw= the "
        "loss's weights as --mtp and --prefix_weight (constant, or A>B linear from A at the stage's first step "
        "towards B at its end); the first stage's start from -t, --total_batch_size, --window_blocks, cap 0, lr 1, "
        "--mtp, --prefix_weight. Default: one stage of the flags"))
    a.add_argument("--val_every", type=int, help=recipe_help(
        "val_every", "validate every N steps and at the end; 0 = never"))
    a.add_argument("--val_steps", type=int, help=recipe_help(
        "val_steps", "batches per validation and process (--recipe speedrun's 40: in all, shared)"))
    a.add_argument("--val_seq_len", type=int, help=recipe_help("val_seq_len", "validation sequence length"))
    a = p.add_argument_group("execution")
    a.add_argument("--device", help="cpu, cuda or cuda:N; default cuda when available")
    a.add_argument("--dtype", choices=["float32", "bfloat16"], help="bfloat16 = bf16 autocast; "
                   "default float32 (bfloat16 in benchmark mode)")
    a.add_argument("--compile", type=int, choices=[0, 1], help="torch.compile (default 1 in benchmark mode)")
    a.add_argument("--fp8", type=int, choices=[0, 1], default=0, help="1: the blocks' linear layers in FP8 "
                   "with torch._scaled_mm, the CUDA trainer's -fp8 1 (bfloat16; CUDA, compute capability 8.9+)")
    a.add_argument("--fp8_mlp", type=int, choices=[0, 1], default=0, help="1: record #89's MLP training forward "
                   "in FP8 under its scales (torch._scaled_mm; with --mlp_from_output 1; evaluation and the backward "
                   "stay in the run's dtype), the CUDA trainer's -fm 1 (CUDA, compute capability 8.9+)")
    a.add_argument("--fp8_head", type=int, choices=[0, 1], default=0, help="1: the speedrun head's training "
                   "products in FP8 with its record's fixed scales (torch._scaled_mm; evaluation stays in the run's "
                   "dtype), the CUDA trainer's -fh 1 (CUDA, compute capability 8.9+)")
    a.add_argument("--fp8_head_scales", help=recipe_help(
        "fp8_head_scales", "X,W,G: the FP8 head's x_s = X/448 (0: sqrt(C)/448), w_s = W/448 and grad_s = G/448, "
        "the CUDA trainer's -fhs (with --fp8_head 1; default 0,0.875,1, record #28's; record #89's 100,1.6,0.75)"))
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
    a.add_argument("--debug_steps", type=int, default=10, help="optimizer steps recorded in the debug state")
    a.add_argument("--check_debug_state", metavar="STATE", help="one forward and backward of STATE's batch from "
                   "--init_from's model (the state's) in --dtype, each tensor's relative error against the state's "
                   "float32 ones printed, then exit (a state of --fp8_head 1: with --fp8_head 1)")
    a.add_argument("--debug_noise", type=float, default=0.0, help="--write_debug_state: add N(0, this) to "
                   "every parameter after the init, so that a model whose init zeroes its head (the modern "
                   "architecture) has a gradient in every tensor at the first step")
    a.add_argument("--benchmark", "--bench", type=int, nargs="?", const=1, default=0, choices=[0, 1],
                   help="time training steps on random tokens")
    a.add_argument("--eval_only", type=int, default=0, choices=[0, 1], help="1: the validation loss of "
                   "--init_from's weights on --input_val_bin (--val_steps batches of -b x --val_seq_len, at "
                   "--window_blocks' window), printed as a validation line of step 0, then exit")
    a.add_argument("--peak_flops", type=float, default=989e12, help="peak FLOP/s for MFU (H100 dense BF16)")
    args = p.parse_args(argv)
    args.arch_given = args.arch is not None  # --init_from takes the architecture from the checkpoint
    column = RECIPES.index(args.recipe or "gpt2")
    args.from_recipe = {key for key in RECIPE_FLAGS if getattr(args, key) is None}  # for the errors' words
    for key, values in RECIPE_FLAGS.items():
        if getattr(args, key) is None:
            setattr(args, key, values[column])
    if args.val_seq_len is None:
        args.val_seq_len = args.seq_len
    args.window_blocks, args.short_window_blocks = window_setting(str(args.window_blocks),
                                                                  f"--window_blocks {args.window_blocks}")
    if args.optimizer == "muon":
        for key, values in MUON_FLAGS.items():
            setattr(args, key, values[column] if getattr(args, key) is None else getattr(args, key))
    return args


# Recipes whose --val_steps count every process's batches, not each one's: the speedrun's 40
# sequences are its reference's validation tokens on any number of processes (the CUDA trainer's
# -m likewise).
SHARED_VAL_STEPS = ("speedrun", "record89")


def process_val_steps(args, world):
    """--val_steps for each of `world` processes: as given, or the recipe's share of its batches
    (SHARED_VAL_STEPS), which must be whole."""
    if args.recipe not in SHARED_VAL_STEPS or "val_steps" not in args.from_recipe:
        return args.val_steps
    if args.val_steps % world:
        fail(f"--val_steps: --recipe {args.recipe} validates on {args.val_steps} batches in all, which {world} "
             "processes cannot share evenly: give --val_steps, the batches of each process")
    return args.val_steps // world


# What a recipe flag's None stands for.
RECIPE_NONE = {"embedding_lr": "--learning_rate", "head_lr": "--learning_rate", "scalar_lr": "--learning_rate",
               "val_seq_len": "-t", "attention_scale": "the architecture's", "logit_cap": "the architecture's",
               "fp8_head_scales": "0,0.875,1", **{key: "0 (--init_from: the checkpoint's)" for key in RECORD89_SWITCHES}}


def recipe_help(flag, text, table=RECIPE_FLAGS):
    """A recipe flag's help: what it is, its default (GPT-2's recipe's) and the other recipes' values."""
    values = [RECIPE_NONE[flag] if value is None else value if value != "" else "none" for value in table[flag]]
    others = "; ".join(f"{recipe} recipe: {value}" for recipe, value in zip(RECIPES[1:], values[1:]))
    return f"{text} (default and gpt2 recipe: {values[0]}; {others})".replace("%", "%%")


def muon_help(flag, text):
    return recipe_help(flag, text + "; --optimizer muon only", MUON_FLAGS)


def check_args(args):
    """Rejects flag combinations that cannot work, before any work is done (--fp8_head_scales read
    into its three numbers)."""
    if args.fp8_head_scales is not None:
        if not args.fp8_head and "fp8_head_scales" not in args.from_recipe:
            fail(f"--fp8_head_scales {args.fp8_head_scales} sets the FP8 head's scales: give --fp8_head 1 with it")
        args.fp8_head_scales = parse_fp8_head_scales(args.fp8_head_scales)
    if args.write_debug_state and args.benchmark:
        fail("--write_debug_state and --benchmark are separate modes; give one")
    if args.eval_only:
        check_eval_only_args(args)
    elif args.check_debug_state:
        check_debug_state_args(args)
    elif not (args.write_debug_state or args.benchmark or args.input_bin):
        fail("nothing to do: give --input_bin PATTERN to train, --write_debug_state DIR, --benchmark 1, "
             "--eval_only 1 with --init_from and --input_val_bin, or --check_debug_state STATE with --init_from")
    if args.benchmark and args.input_bin:
        fail("--benchmark trains on random tokens; drop --input_bin")
    if args.write_debug_state and args.dtype == "bfloat16" and not args.fp8:
        fail("--write_debug_state computes in float32; drop --dtype bfloat16")
    if args.fp8 and args.dtype == "float32":
        fail("--fp8 1 runs under bfloat16 autocast, as the CUDA trainer's BF16 build; drop --dtype float32")
    if args.fp8_mlp and (args.compile or args.benchmark):
        fail("--fp8_mlp 1 runs eagerly (its scales are state the forward changes): drop --compile and --benchmark")
    for flag in ("fp8", "fp8_mlp", "fp8_head"):  # torch._scaled_mm's rows
        if getattr(args, flag) and args.batch_size * args.seq_len % FP8_DIM_MULTIPLE != 0:
            fail(f"--{flag} 1 needs B*T = {args.batch_size}*{args.seq_len} to be a multiple of {FP8_DIM_MULTIPLE} "
                 f"(torch._scaled_mm's dimensions); change -b/-t")
    for flag, value in [("-b/--batch_size", args.batch_size), ("-t/--seq_len", args.seq_len),
                        ("--num_iterations", args.num_iterations), ("--val_steps", args.val_steps),
                        ("--val_seq_len", args.val_seq_len), ("--debug_steps", args.debug_steps)]:
        if value <= 0:
            fail(f"{flag} must be positive, not {value}")
    if args.compile_optimizer is not None and not args.benchmark:
        fail("--compile_optimizer applies to --benchmark 1 only; drop it")
    if args.warmup_iters < 0 or not 0.0 <= args.final_lr_frac <= 1.0:
        fail("--warmup_iters must be >= 0 and --final_lr_frac within [0, 1]")
    weights = parse_prediction_weights(args.mtp)
    if not 0.0 <= args.prefix_weight <= 1.0:
        fail(f"--prefix_weight {args.prefix_weight}: must be within [0, 1]")
    if args.prefix_weight == 0.0 and not any(weights):
        fail(f"--mtp {args.mtp} and --prefix_weight 0: every term of the training loss has weight 0; give the next "
             f"token a weight (--mtp 1)")
    if not 0.0 < args.cooldown_frac <= 1.0:
        fail(f"--cooldown_frac {args.cooldown_frac}: the decaying fraction of the steps is within (0, 1]")
    if args.recipe and args.arch != RECIPE_FLAGS["arch"][RECIPES.index(args.recipe)]:
        fail(f"--recipe {args.recipe} trains the {args.recipe} architecture; drop --arch {args.arch}")
    if args.optimizer != "muon":
        given = [f"--{key}" for key in MUON_FLAGS if getattr(args, key) is not None]
        if given:
            fail(f"{given[0]} sets Muon, which --optimizer {args.optimizer} does not use; add --optimizer muon or drop it")
    if args.optimizer == "muon" and args.compile_optimizer:
        fail("--compile_optimizer 1 compiles AdamW's step; with --optimizer muon, --compile compiles Muon's "
             "Newton-Schulz per matrix: drop --compile_optimizer")
    if args.fp8 and (args.arch != "gpt2" or args.optimizer == "muon"):
        fail("--fp8 1 is GPT-2's recipe with AdamW; drop --fp8 or use --arch gpt2 --optimizer adamw")
    if args.optimizer == "muon" and args.muon_momentum_warmup < 0:
        fail(f"--muon_momentum_warmup {args.muon_momentum_warmup}: give 0 (constant momentum) or more steps")
    if args.optimizer == "muon" and args.muon_momentum_cooldown < 0:
        fail(f"--muon_momentum_cooldown {args.muon_momentum_cooldown}: give 0 (no cooldown) or more steps")
    if (args.write_debug_state and args.optimizer == "muon" and args.muon_momentum_cooldown > 0 and
            args.num_iterations - args.muon_momentum_cooldown < args.debug_steps):
        fail(f"--muon_momentum_cooldown {args.muon_momentum_cooldown}: the momentum's cooldown would begin within "
             f"the --debug_steps {args.debug_steps} steps of --num_iterations {args.num_iterations}, and the debug "
             f"state's header holds no cooldown, so test_gpt2cu would step without it; give --num_iterations "
             f"{args.debug_steps + args.muon_momentum_cooldown} or more, or drop the cooldown")
    if args.optimizer == "muon":
        parse_muon_tensor_lr(args.muon_tensor_lr or "")
    check_cautious_args(args)
    check_document_args(args)


def check_cautious_args(args):
    """--cautious_decay 1 needs a weight decay to make cautious."""
    if not args.cautious_decay:
        return
    muon = args.optimizer == "muon"
    if args.weight_decay <= 0 and not (muon and args.muon_weight_decay > 0):
        zero, flags = (", --muon_weight_decay 0", " or --muon_weight_decay") if muon else ("", "")
        fail(f"--cautious_decay 1 makes the weight decay cautious, and this run decays nothing (--weight_decay 0{zero}): "
             f"give --weight_decay{flags} a decay, or drop --cautious_decay")


def stage_plan(args, world):
    """The run's StagePlan of --stages over --num_iterations (--write_debug_state: over --debug_steps
    less the extension, and None without --stages), checked against the flags."""
    given = bool(args.stages.strip())
    if given and (args.benchmark or args.eval_only or args.check_debug_state):
        fail("--stages plans a training run or --write_debug_state's steps; drop it")
    stages = parse_stages(args.stages, args.seq_len, args.total_batch_size, args.window_blocks,
                          args.short_window_blocks, parse_prediction_weights(args.mtp),
                          float(np.float32(args.prefix_weight)))
    if args.write_debug_state:
        if not given:
            return None
        scheduled, world = args.debug_steps - stages[-1].extension, 1
        if len(args.stages.strip().encode()) > DEBUG_STAGES_BYTES:
            fail(f"--stages: the plan's {len(args.stages.strip().encode())} bytes do not fit the debug state's "
                 f"header, which holds {DEBUG_STAGES_BYTES}; shorten it")
        if scheduled < 1:
            fail(f"--stages: stage {len(stages)}'s +{stages[-1].extension} steps leave none of --debug_steps "
                 f"{args.debug_steps} to the others; give more --debug_steps or fewer extension steps")
        plan = StagePlan(stages, scheduled, args.batch_size, world, "--debug_steps")
    else:
        plan = StagePlan(stages, args.num_iterations, args.batch_size, world, "--num_iterations")
        if args.optimizer == "muon" and args.muon_momentum_cooldown > plan.steps:
            extension = f" and --stages' {plan.extension} extension steps" if plan.extension else ""
            fail(f"--muon_momentum_cooldown {args.muon_momentum_cooldown}: the momentum's cooldown is longer than the "
                 f"run's {plan.steps} steps (--num_iterations {args.num_iterations}{extension}); give "
                 f"{plan.steps} or less")
    for number, stage in enumerate(stages, 1):
        check_stage(args, stage, number, stages[0].seq_len, given)
        tokens, micro_batch = plan.tokens(stage), args.batch_size * stage.seq_len * world
        if tokens <= 0 or tokens % micro_batch != 0:
            what = f"--stages: stage {number}'s z={tokens}" if given else f"--total_batch_size {tokens}"
            fail(f"{what} is not a positive multiple of B*T*world = {args.batch_size}*{stage.seq_len}*{world} = "
                 f"{micro_batch}; pick a multiple (or -1 for one micro batch) or change -b/-t")
    resolve_final_window(plan, args)
    return plan


def resolve_final_window(plan, args):
    """--final_window_blocks (the CUDA trainer's -awf) into the plan, checked as --window_blocks is
    against the sequences it attends over: --val_seq_len's where the run validates, else the longest
    stage's t."""
    if not args.final_window_blocks:
        return
    flag = "--final_window_blocks"
    plan.set_final_window(args.final_window_blocks, flag)
    validating = args.val_every > 0 and bool(args.input_val_bin)
    length = args.val_seq_len if validating else max(stage.seq_len for stage in plan.stages)
    blocks = length // ATTENTION_BLOCK
    if args.final_window_blocks > blocks:
        fail(f"{flag} {args.final_window_blocks} counts blocks of {ATTENTION_BLOCK} tokens, and "
             f"{'--val_seq_len' if validating else 't'} {length} is {blocks} block{'' if blocks == 1 else 's'}: "
             f"{flag} {blocks} already attends to all of it; use {flag} {blocks} or less")


def check_stage(args, stage, number, first_seq_len, given):
    """A stage's settings against the flags: a changing length, a cap and a window need documents;
    windows whole blocks, as --window_blocks; --write_debug_state's stages one micro batch of its
    batch's rows each, no cap and a fixed window."""
    where = f"--stages: stage {number}"
    if stage.seq_len != first_seq_len and not args.documents:
        fail(f"{where} sets t={stage.seq_len} (the first stage's is {first_seq_len}): a sequence length that "
             f"changes between stages needs document-aligned sequences (--documents 1)")
    if stage.cap > 0 and not args.documents:
        fail(f"{where} sets cap={stage.cap}: a document cap needs document-aligned sequences (--documents 1)")
    if given and stage.window_blocks != 0 and not args.documents:
        fail(f"{where} sets aw={stage.window_blocks}, a window of document-causal attention; add --documents 1")
    if given and (args.documents or stage.window_blocks != 0) and stage.seq_len % ATTENTION_BLOCK != 0:
        fail(f"{where} sets t={stage.seq_len}, which is not a multiple of {ATTENTION_BLOCK}: document-aligned "
             f"sequences and windows take whole blocks of {ATTENTION_BLOCK} tokens")
    if given and args.write_debug_state:
        if stage.seq_len > args.seq_len:
            fail(f"{where} sets t={stage.seq_len}, longer than the debug state's batch of -t {args.seq_len}: "
                 f"give -t {stage.seq_len} or a shorter t")
        if stage.total_batch_size not in (-1, args.batch_size * stage.seq_len):
            fail(f"{where} sets z={stage.total_batch_size}: a debug step is one micro batch of B*t = "
                 f"{args.batch_size}*{stage.seq_len} tokens; give z=-1")
        if stage.cap > 0:
            fail(f"{where} sets cap={stage.cap}: the debug state's batch is random tokens, which no cap cuts; "
                 f"give cap=0")
        if stage.window_blocks == -1:
            fail(f"{where} takes the window's schedule (aw=-1): a debug step keeps a fixed window; give aw=N")


def check_debug_state_args(args):
    """--check_debug_state measures one step against a debug state, and does nothing else."""
    for flag, other in [("--write_debug_state", args.write_debug_state), ("--benchmark", args.benchmark),
                        ("--input_bin", args.input_bin), ("--input_val_bin", args.input_val_bin)]:
        if other:
            fail(f"--check_debug_state measures one step on the state's batch and trains nothing; drop {flag}")
    if not args.init_from:
        fail("--check_debug_state STATE starts from the state's model: give --init_from with the gpt2_<name>.bin "
             "written beside it")
    header = read_debug_state(args.check_debug_state, header_only=True)
    args.batch_size, args.seq_len = int(header[2]), int(header[3])  # the state's batch


def check_eval_only_args(args):
    """--eval_only 1 validates the weights of a checkpoint at one window, and does nothing else."""
    for flag, other in [("--write_debug_state", args.write_debug_state), ("--benchmark", args.benchmark),
                        ("--input_bin", args.input_bin), ("--check_debug_state", args.check_debug_state)]:
        if other:
            fail(f"--eval_only 1 validates a checkpoint and trains nothing; drop {flag}")
    if not args.init_from or not args.input_val_bin:
        fail("--eval_only 1 validates --init_from's weights on --input_val_bin; give both")
    if args.window_blocks == -1:
        fail("--eval_only 1 has no schedule to take a window from: give the window of the weights' step, "
             "--window_blocks N (or 0 for none)")


def check_document_args(args):
    if args.window_tokens and (not args.documents or (args.window_blocks == 0 and "aw=" not in args.stages)):
        fail("--window_tokens 1 counts the attention windows in tokens, and this run has none: give --documents 1 "
             "with a window (--window_blocks, or --stages' aw=), or drop --window_tokens")
    if args.final_window_blocks < 0:
        fail(f"--final_window_blocks {args.final_window_blocks}: give a window of 1 or more blocks, or 0 for the "
             f"last stage's")
    if args.final_window_blocks and (args.write_debug_state or args.benchmark or args.eval_only
                                     or args.check_debug_state):
        fail("--final_window_blocks sets the window of a training run's validation after its last step; drop it")
    if args.write_debug_state and args.short_window_blocks is not None:
        fail(f"--window_blocks {args.short_window_blocks}/{args.window_blocks}: the debug state's header holds the "
             f"long window alone, the short one half of it; give the short windows in --stages' aw=S/L, which "
             f"the header keeps")
    if args.window_blocks != 0 and not args.documents:
        if "window_blocks" in args.from_recipe:
            fail(f"--recipe {args.recipe} trains within a window of blocks (--window_blocks {args.window_blocks}), "
                 f"which needs documents: add --window_blocks 0 to --documents 0")
        fail(f"--window_blocks {args.window_blocks} windows document-causal attention; add --documents 1")
    for flag, length in [("-t/--seq_len", args.seq_len), ("--val_seq_len", args.val_seq_len)]:
        if args.window_blocks != 0 and length % ATTENTION_BLOCK != 0:
            fail(f"--window_blocks takes whole blocks of {ATTENTION_BLOCK} tokens: {flag} {length} "
                 f"is not a multiple of {ATTENTION_BLOCK}")
    if args.documents and args.benchmark:
        if "documents" in args.from_recipe:
            fail(f"--benchmark times causal attention on random tokens, but --recipe {args.recipe} trains on "
                 f"documents: add --documents 0 --window_blocks 0")
        fail("--benchmark times causal attention on random tokens; drop --documents")


def settle_arch(args, config):
    """Checks the architecture-dependent flags against the model's architecture, which --init_from
    can supply, and gives the modern model's AdamW groups their rates (--learning_rate by default)."""
    if (args.arch_given or args.recipe) and args.arch != config.arch:
        fail(f"--init_from {args.init_from} is a {config.arch} checkpoint, but --arch/--recipe ask for "
             f"{args.arch}; drop --arch/--recipe or use a {args.arch} checkpoint")
    args.arch = config.arch
    if args.untie_step < -1:
        fail(f"--untie_step {args.untie_step}: give the step through which the embedding is tied to the head, or -1")
    if args.untie_step >= 0 and args.benchmark:
        fail(f"--untie_step {args.untie_step}: --benchmark times untied steps; drop --untie_step")
    parse_adam_rows(args.adam_rows)
    if not 1 <= args.adam_every <= ADAM_EVERY_MAX:
        fail(f"--adam_every {args.adam_every}: give AdamW's interval in steps, 1 to {ADAM_EVERY_MAX} (1: every step)")
    if args.adam_every > 1 and args.benchmark:
        fail(f"--adam_every {args.adam_every}: --benchmark times AdamW at every step; drop --adam_every")
    if args.adam_every > 1 and args.grad_clip > 0:
        fail(f"--adam_every {args.adam_every} sums {args.adam_every} steps' gradients for AdamW, and --grad_clip "
             f"{args.grad_clip:g} would clip each step's apart: give --grad_clip 0 with it (record #89 clips nothing)")
    if args.untie_step >= 0 and (args.untie_step + 1) % args.adam_every != 0:
        fail(f"--untie_step {args.untie_step} unties at a step without AdamW's update under --adam_every "
             f"{args.adam_every}: give an untie step U with (U + 1) % {args.adam_every} == 0 (record #89's is odd)")
    if args.untie_step >= 0 and not config.modern:
        fail(f"--untie_step {args.untie_step} ties the embedding to the head through step {args.untie_step}, and the "
             f"{config.arch} architecture's head is the embedding throughout: drop --untie_step")
    if args.record_init and not config.speedrun:
        fail(f"--record_init {args.record_init} is the speedrun's init, and the {config.arch} architecture has its "
             f"own: give --recipe speedrun with it, or drop --record_init")
    windowed = args.documents and (args.window_blocks != 0 or "aw=" in args.stages)
    if config.paired_heads and windowed and not args.window_tokens:
        fail("the model's paired heads (--paired_heads 1) attend over each row doubled, whose windows record #89 "
             "counts in positions: give --window_tokens 1 (a window of N blocks is then N x 128 positions back from "
             "each query)")
    if args.fp8_head and not config.speedrun:
        fail(f"--fp8_head 1: the FP8 head's fixed scales are the speedrun's (an untied head without bias after "
             f"a weightless RMS norm); the {config.arch} head runs in the run's dtype: use --fp8_head 0 or "
             f"--recipe speedrun")
    group_lrs = ["embedding_lr", "head_lr", "scalar_lr"]
    if config.modern:
        for key in group_lrs:
            setattr(args, key, args.learning_rate if getattr(args, key) is None else getattr(args, key))
    elif any(getattr(args, key) is not None for key in group_lrs):
        fail("--embedding_lr/--head_lr/--scalar_lr set the modern model's AdamW groups; GPT-2's AdamW "
             "tensors all take --learning_rate: drop them")


def resolve_config(args):
    """The model shape from --model and the size flags (None when --init_from supplies it)."""
    overrides = [args.num_layers, args.num_heads, args.channels, args.max_seq_len, args.vocab_size]
    if args.init_from:
        # a recipe's switches (--recipe record89's) stand for the models it makes from a preset alone
        features = [getattr(args, key) for key in RECORD89_SWITCHES + ("mudd_connections",)
                    if key not in args.from_recipe]
        if args.model or args.arch_given or any(v is not None for v in overrides + features):
            fail("--init_from takes the model shape and architecture from the checkpoint; drop --model, --arch, "
                 "--smear, --bigram, --rotary_pairs, --ve_gates, --resid_lambdas, --xsa, --record89_plan, "
                 "--paired_heads, --attn_lambdas, --mudd_gates, --mudd_connections, --composed_attention and the "
                 "size flags")
        if args.record_init and "record_init" not in args.from_recipe:
            fail(f"--record_init {args.record_init} initialises a model from --seed, and --init_from's checkpoint "
                 f"holds the parameters: drop --record_init")
        return None
    presets = ARCH_PRESETS[args.arch]
    if (args.model or "d12") not in presets:
        fail(f"--model {args.model}: the {args.arch} architecture's presets are {', '.join(sorted(presets))}; "
             f"pick one")
    preset = presets[args.model or "d12"]
    if args.record89_plan and args.arch == "speedrun":
        preset = (RECORD89_LAYERS,) + preset[1:]  # the preset's width at record #89's depth
    shape = [v if v is not None else base for v, base in zip(overrides, preset)]
    return make_config(*shape, source="--model/--num_layers/--num_heads/--channels/--max_seq_len/--vocab_size",
                       arch=args.arch, smear=args.smear, bigram=args.bigram, rotary_pairs=args.rotary_pairs,
                       ve_gates=args.ve_gates, resid_lambdas=args.resid_lambdas, xsa=args.xsa,
                       record89_plan=args.record89_plan, paired_heads=args.paired_heads,
                       attn_lambdas=args.attn_lambdas, mudd_gates=args.mudd_gates,
                       mudd_connections=args.mudd_connections, composed_attention=args.composed_attention)


def check_fp8(config, device, flag="--fp8"):
    """`flag` 1 (--fp8 1 or --fp8_head 1) needs torch._scaled_mm and the float8 dtypes, a CUDA GPU of
    compute capability 8.9+ and channels that are a multiple of FP8_DIM_MULTIPLE."""
    if not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")):
        fail(f"{flag} 1 needs PyTorch 2.1 or newer (torch._scaled_mm, torch.float8_e4m3fn); this is "
             f"{torch.__version__}: upgrade PyTorch or use {flag} 0")
    if not device.startswith("cuda"):
        fail(f"{flag} 1 needs a CUDA device (torch._scaled_mm); --device is {device}: use --device cuda or {flag} 0")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        fail(f"{flag} 1 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); "
             f"{torch.cuda.get_device_name(device)} is {major}.{minor}: use {flag} 0")
    if config.channels % FP8_DIM_MULTIPLE != 0:
        fail(f"{flag} 1 needs channels {config.channels} to be a multiple of {FP8_DIM_MULTIPLE} "
             f"(torch._scaled_mm's dimensions); use {flag} 0")


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


def evaluate(model, raw_model, loader, steps, device, autocast, world):
    loader.reset()
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for _ in range(steps):
            x, y = (t.to(device) for t in loader.next_batch())
            with autocast:
                total += model(x, y, masks=raw_model.attention_masks(x))[1].float() / steps
    return mean_over_ranks(total, world)


def evaluate_only(args, model, val_loader, device, rank, world, dtype, use_compile):
    """--eval_only 1: the model's validation loss as train() computes it at a validation step (the
    same parameter and compute dtypes, at --window_blocks), printed as the SPEC.md line of a
    validation at step 0 of 0, which the CUDA trainer's -x 0 prints too."""
    raw_model, model, autocast = placed_model(args, model, device, dtype, use_compile)
    val_loss = evaluate(model, raw_model, val_loader, args.val_steps, device, autocast, world)
    if rank == 0:
        print(f"step {0:4d}/0 | val loss {val_loss:.6f}")


def micro_step_loss(loss, reduction, tokens, grad_accum_steps, world=1):
    """(the loss to backpropagate, its share of the step's mean loss) for one micro step's loss of
    `tokens` tokens: mean losses are averaged over the micro steps; summed ones (the modern recipe)
    are summed over every token of the step, as modded-nanogpt does, and times world since DDP
    averages the ranks' gradients."""
    if reduction == "sum":
        return loss * world if world > 1 else loss, loss.detach().float() / (tokens * grad_accum_steps)
    loss = loss / grad_accum_steps
    return loss, loss.detach().float()


def step_line(step, N, loss, norm, lr, ms, tokens_per_step, flops_per_token, peak_flops):
    """SPEC.md's per-step line, for step `step` (0-based) that took ms milliseconds."""
    tokens_per_s = 1000 * tokens_per_step / ms
    return (f"step {step + 1:4d}/{N} | loss {loss:.6f} | norm {norm:.4f} | lr {lr:.3e} | {ms:.2f} ms | "
            f"MFU {100.0 * flops_per_token * tokens_per_s / peak_flops:.1f}% | {tokens_per_s:.0f} tok/s")


def log_average_and_peak_memory(log, step_ms, step_tokens, step_flops, peak_flops, cuda):
    """The closing lines of a run (SPEC.md): the average step after the untimed warm-up steps (its
    MFU from their tokens and FLOPs per token, step_flops, which a growing window and the stages
    change), and the peak memory (the GPU's allocations, or the process's resident set on the CPU)."""
    N = len(step_ms)
    skip = min(WARMUP_STEPS_UNTIMED, N - 1)
    average_ms = sum(step_ms[skip:]) / (N - skip)
    seconds = sum(step_ms[skip:]) / 1000
    tokens_per_s = sum(step_tokens[skip:]) / seconds
    flops_per_s = sum(f * t for f, t in zip(step_flops[skip:], step_tokens[skip:])) / seconds
    log(f"average over steps {skip + 1}-{N}: {average_ms:.2f} ms | "
        f"MFU {100.0 * flops_per_s / peak_flops:.1f}% | {tokens_per_s:.0f} tok/s")
    if cuda:
        peak_mib = torch.cuda.max_memory_allocated() // 2**20
    else:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # Linux reports KiB
    log(f"peak memory: {peak_mib} MiB")


def step_batch(args, world):
    """(tokens a step, micro steps a step) of --total_batch_size over B*T*world."""
    B, T = args.batch_size, args.seq_len
    tokens_per_micro_step = B * T * world
    total_batch_size = tokens_per_micro_step if args.total_batch_size == -1 else args.total_batch_size
    if total_batch_size <= 0 or total_batch_size % tokens_per_micro_step != 0:
        fail(f"--total_batch_size {total_batch_size} is not a positive multiple of B*T*world = "
             f"{B}*{T}*{world} = {tokens_per_micro_step}; pick a multiple or change -b/-t")
    return total_batch_size, total_batch_size // tokens_per_micro_step


def set_attention_window(model, args, step):
    """The windows of step `step`: --window_blocks, or its schedule's (-1); none without it."""
    if args.window_blocks != 0:
        schedule = args.window_blocks == -1
        model.window_blocks = attention_window_blocks(step, args.num_iterations) if schedule else args.window_blocks
        model.short_window_blocks = args.short_window_blocks


def placed_model(args, model, device, dtype, use_compile):
    """(the model on `device` in the run's parameter dtypes, the module its forward passes call:
    that model or its compiled form, the forward's autocast context)."""
    raw_model = model.to(device)
    set_parameter_dtypes(raw_model, dtype, args.adam_rows)
    if use_compile:
        # The attention masks are built outside the compiled forward and passed in (train's and
        # evaluate's calls): built inside, the graph would specialise on the window (an int), and
        # the schedule's windows would recompile it until dynamo falls back to eager attention.
        model = torch.compile(model, mode=None if args.compile_mode in (None, "default") else args.compile_mode)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    return raw_model, model, set_compute_dtype(raw_model, dtype, device_type)


def train(args, plan, model, train_loader, val_loader, device, rank, world, dtype, use_compile):
    """Runs the plan's optimizer steps (StagePlan: --num_iterations and any extension), printing the
    SPEC.md line per step; each step takes its stage's sequence length, micro steps, document cap,
    window and learning-rate multiplier. Validates at step 0, every val_every steps and at the end;
    writes main.log and the final checkpoint to output_dir."""
    config, N = model.config, plan.steps
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    raw_model, model, autocast = placed_model(args, model, device, dtype, use_compile)
    optimizers, fused = make_optimizers(raw_model, args, device_type, compile_muon=use_compile)
    if args.untie_step >= 0:  # tied at step 0: the embedding starts as the head
        tie_embedding(raw_model)
    if world > 1:
        # the MUDD gate generators leave scalars they replace unread
        model = DistributedDataParallel(model, device_ids=[device] if device_type == "cuda" else None,
                                        find_unused_parameters=config.mudd_gates or config.mudd_connections)
    num_params = config.num_parameters()
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    first = plan.step(0)
    settings = dict(vars(args), model=config.name(), device=device, dtype=dtype, compile=use_compile,
                    flash=raw_model.transformer.h[0].attn.flash, fused_adamw=fused, world=world,
                    grad_accum_steps=first.micro_steps, total_batch_size=first.tokens,
                    num_parameters=num_params, torch=torch.__version__)
    for key in sorted(settings):
        log(f"{key:20s} {settings[key]}")
    if args.stages.strip():
        for line in plan.table():
            log(line)
    log_file = None
    if args.output_dir and master:
        os.makedirs(args.output_dir, exist_ok=True)
        log_file = open(os.path.join(args.output_dir, "main.log"), "w")

    step_times, step_flops, step_tokens = [], [], []
    yarn = yarn_base(raw_model) if raw_model.yarn else None
    for step in range(N + 1):
        step_plan = plan.step(step)
        raw_model.window_blocks = step_plan.window_blocks or None
        raw_model.short_window_blocks = step_plan.short_window_blocks
        set_step_loss_terms(raw_model, step_plan)
        if yarn:
            yarn = yarn_advance(plan, step, *yarn)
            set_yarn(raw_model, *yarn)
        if val_loader and args.val_every > 0 and (step % args.val_every == 0 or step == N):
            val_loss = evaluate(model, raw_model, val_loader, args.val_steps, device, autocast, world)
            # the training time so far, validation left out, for loss-against-time comparisons
            log(f"step {step:4d}/{N} | train time {sum(step_times):.3f} s | val loss {val_loss:.6f}")
            if log_file:
                log_file.write(f"step={step} kind=val loss={val_loss:.6f}\n")
                log_file.flush()
        if step == N:
            break
        t0 = time.perf_counter()
        train_loss, norm, lr = train_step(args, step, step_plan, N, model, raw_model, optimizers, train_loader,
                                          device, autocast, world)
        if device_type == "cuda":
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - t0)
        step_flops.append(raw_model.flops_per_token(step_plan.seq_len))
        step_tokens.append(step_plan.tokens)
        tokens_per_s = step_plan.tokens / step_times[-1]
        log(step_line(step, N, train_loss, norm, lr, 1000 * step_times[-1], step_plan.tokens,
                      step_flops[-1], args.peak_flops))
        if log_file:
            # The run-log format of llmc/logger.h, so both trainers' logs plot and compare alike.
            log_file.write(f"step={step + 1} kind=train loss={train_loss:.6f} norm={norm:.4f} "
                           f"lr={lr:.4e} ms={1000 * step_times[-1]:.2f} tok_per_s={tokens_per_s:.0f}\n")
            log_file.flush()

    log_average_and_peak_memory(log, [1000 * t for t in step_times], step_tokens, step_flops,
                                args.peak_flops, device_type == "cuda")
    if log_file:
        log_file.close()
        path = os.path.join(args.output_dir, f"model_{N:08d}.bin")
        write_checkpoint(raw_model, path, CHECKPOINT_BF16 if args.checkpoint_dtype == "bfloat16" else CHECKPOINT_FP32)
        log(f"wrote {path}")


def train_step(args, step, step_plan, steps, model, raw_model, optimizers, train_loader, device, autocast, world):
    """One optimizer step of the step's plan in a run of `steps` steps; returns (its mean loss over
    the ranks, the gradient norm, the rate of --learning_rate). A document loader takes the step's
    shape first."""
    if isinstance(train_loader, DocumentLoader):
        train_loader.reshape(step_plan.seq_len, step_plan.micro_steps, step_plan.cap)
    lr = set_learning_rates(optimizers, step, args, step_plan.lr_multiplier, steps)
    zero_step_grads(raw_model, optimizers, step, args)
    train_loss = torch.zeros((), device=device)
    grad_accum_steps = step_plan.micro_steps
    for micro_step in range(grad_accum_steps):
        x, y = (t.to(device) for t in train_loader.next_batch())
        # DDP all-reduces the gradients in the last micro step's backward only.
        sync = world == 1 or micro_step == grad_accum_steps - 1
        with nullcontext() if sync else model.no_sync():
            with autocast:
                loss = model(x, y, args.loss_reduction, raw_model.attention_masks(x))[1]
            loss, mean_share = micro_step_loss(loss, args.loss_reduction, y.numel(), grad_accum_steps, world)
            train_loss += mean_share
            loss.backward()
    norm = clip_gradients(raw_model.parameters(), args.grad_clip)
    adamw_steps = adamw_steps_at(step, args)
    if step <= args.untie_step and adamw_steps:
        tied_step_gradient(raw_model)
    for optimizer in optimizers[0 if adamw_steps else 1:]:  # make_optimizers': AdamW first
        optimizer.step()
    untie_step_done(raw_model, step, args, optimizer_state_of(optimizers))
    fp8_mlp_updated(raw_model, step)
    return mean_over_ranks(train_loss, world), norm.item(), lr


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
    clipping (with --optimizer muon, Muon with its Newton-Schulz compiled per matrix under --compile);
    nothing waits for the GPU inside the timed steps (CUDA events time them, and the
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
    set_parameter_dtypes(model, dtype, args.adam_rows)
    optimizers, fused = make_optimizers(model, args, "cuda" if cuda else "cpu", tensor_lr=compile_optimizer,
                                        compile_muon=use_compile)
    x, y = (t.to(device) for t in batch)
    loss_fn = model.padded_vocab_loss
    mode = args.compile_mode or BENCHMARK_RECIPE["compile_mode"]
    if use_compile:
        loss_fn = torch.compile(loss_fn, mode=None if mode == "default" else mode)

    def clip_and_step():
        norm = clip_gradients(model.parameters(), args.grad_clip)
        for optimizer in optimizers:
            optimizer.step()
        return norm

    if compile_optimizer:
        clip_and_step = torch.compile(clip_and_step)

    def update(step):
        set_learning_rates(optimizers, step, args)
        return clip_and_step()

    autocast = set_compute_dtype(model, dtype, "cuda" if cuda else "cpu")
    flops_per_token = model.flops_per_token(T)
    sdpa = args.sdpa_backend or BENCHMARK_RECIPE["sdpa_backend"]
    recipe = (f"torch {torch.__version__} | torch.compile {mode if use_compile else 'off'} | "
              f"SDPA {sdpa if model.transformer.h[0].attn.flash else 'off'} | {dtype}"
              f"{' with FP8 block linear layers (torch._scaled_mm)' if args.fp8 else ''}"
              f"{' with the FP8 head (torch._scaled_mm, fixed scales)' if args.fp8_head else ''} | "
              f"{'Muon (Newton-Schulz in bfloat16) and ' if args.optimizer == 'muon' else ''}"
              f"AdamW{' fused' if fused else ''}{', compiled with clipping' if compile_optimizer else ''} | "
              f"{config.arch} | {args.loss_reduction} loss over the padded vocabulary ({config.padded_vocab_size})")
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
        model.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=device)
        for _ in range(grad_accum_steps):
            with autocast:
                loss = loss_fn(x, y, args.loss_reduction)
            loss, mean_share = micro_step_loss(loss, args.loss_reduction, y.numel(), grad_accum_steps)
            loss_sum += mean_share
            loss.backward()
        norm = update(step)
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
    log_average_and_peak_memory(log, step_ms, [total_batch_size] * len(step_ms), [flops_per_token] * len(step_ms),
                                args.peak_flops, cuda)
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
    plan = stage_plan(args, int(os.environ.get("WORLD_SIZE", 1)))  # torchrun's process count
    check_yarn(args, plan)
    device, rank, world = setup_processes(args)
    args.val_steps = process_val_steps(args, world)
    if args.benchmark and world > 1:
        fail("--benchmark times one process; run it without torchrun")
    if flash:
        select_sdpa_backend(args.sdpa_backend or (BENCHMARK_RECIPE["sdpa_backend"] if args.benchmark else "auto"), device)
    if config is None:
        model = read_checkpoint(args.init_from, flash, args.fp8, args.fp8_head)
        config = model.config
    else:
        model = GPT(config, flash, args.fp8, args.fp8_head)
        init_weights(model, args.seed, args.record_init)
    settle_arch(args, config)
    B, T = args.batch_size, args.seq_len
    lengths = [("-t/--seq_len", T)] + ([("--val_seq_len", args.val_seq_len)] if args.input_val_bin else [])
    lengths += [(f"--stages: stage {i + 1}'s t", stage.seq_len) for i, stage in enumerate(plan.stages if plan else [])]
    for flag, length in lengths:
        if length > config.max_seq_len:
            fail(f"{flag} {length} exceeds the model's max_seq_len {config.max_seq_len}; lower it")
    if args.fp8:
        check_fp8(config, device)
    if args.fp8_head:
        check_fp8(config, device, "--fp8_head")
    model.documents = bool(args.documents)
    model.window_tokens = bool(args.window_tokens)
    set_key_offset(model, bool(args.key_offset))
    set_attention_scale(model, args.attention_scale)
    set_yarn_switch(model, bool(args.yarn))
    set_mlp_from_output(model, bool(args.mlp_from_output))
    set_fp8_mlp(model, bool(args.fp8_mlp))
    if args.fp8_mlp:
        check_fp8(config, device, "--fp8_mlp")
    model.prefix_table = run_prefix_table(args, config, plan)
    model.loss_terms = loss_terms(parse_prediction_weights(args.mtp), args.prefix_weight, model.prefix_table)
    set_logit_cap(model, args.logit_cap)
    if args.fp8_head_scales is not None:
        model.lm_head.setting = args.fp8_head_scales
    set_attention_window(model, args, 0)
    if args.check_debug_state:
        return check_debug_state(args, model, device, dtype, use_compile)
    train_loader = RandomTokens(B, T, config.vocab_size, args.seed, bool(args.documents))
    if args.input_bin and args.documents:
        if args.write_debug_state:  # one batch of B x T, whatever the stages
            seq_len, micro_steps, cap = T, step_batch(args, world)[1], 0
        else:
            first = plan.step(0)
            seq_len, micro_steps, cap = first.seq_len, first.micro_steps, first.cap
        train_loader = DocumentLoader(args.input_bin, "--input_bin", B, seq_len, micro_steps, rank, world,
                                      args.shuffle, args.seed, config.vocab_size, cap)
    elif args.input_bin:
        train_loader = ShardLoader(args.input_bin, "--input_bin", B, T, rank, world, args.shuffle,
                                   args.seed, config.vocab_size)
    if args.write_debug_state:
        add_debug_noise(model, args.debug_noise, args.seed)
        write_debug_state(model, train_loader.next_batch(), args, device, args.write_debug_state, plan)
        return
    if args.benchmark:
        compile_optimizer = use_compile and bool(BENCHMARK_RECIPE["compile_optimizer"]
                                                 if args.compile_optimizer is None else args.compile_optimizer)
        return benchmark(args, model, train_loader.next_batch(), device, dtype, use_compile, compile_optimizer,
                         step_hook=step_hook)
    val_loader = None
    if args.input_val_bin:
        val_loader = ShardLoader(args.input_val_bin, "--input_val_bin", B, args.val_seq_len, rank, world, 0,
                                 args.seed, config.vocab_size)
    if args.eval_only:
        evaluate_only(args, model, val_loader, device, rank, world, dtype, use_compile)
    else:
        train(args, plan, model, train_loader, val_loader, device, rank, world, dtype, use_compile)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
