// The GPT-2 model description shared by every program: configuration, presets,
// the parameter table (one order for sizes, offsets, the checkpoint layout, the
// CPU trainer, the CUDA trainer and train_gpt2.py), and the headers of the
// checkpoint and debug-state files.
//
// Checkpoint file (llm.c compatible): 256 int32 header
//   [0] magic 20240326  [1] version (GPT-2: 3 = FP32 params, 5 = BF16 params; the modern and
//   speedrun architectures: 6 = FP32, 7 = BF16)  [2] max_seq_len  [3] vocab_size  [4] num_layers
//   [5] num_heads  [6] channels  [7] padded_vocab_size  [8] architecture (0 GPT-2, 1 modern,
//   2 speedrun; 0 in llm.c's files)  [9] record #89's features, bits (the speedrun's kFeatureSmear,
//   kFeatureBigram, kFeatureVeGates, kFeatureXsa, kFeatureRecord89Plan, kFeaturePairedHeads,
//   kFeatureAttnLambdas, kFeatureMuddGates, kFeatureMuddConnections, kFeatureComposedAttention; the modern
//   and speedrun's kFeatureRotaryPairs; 0 in files written before this slot)  [254] [255] checksum
//   kind and CRC-32 (llmc/file_header.h)
// followed by the parameters in table order, wte (and the modern head) padded to
// padded_vocab_size rows. Files without a checksum (llm.c's, [254] = 0) load unchecked; every
// file written here carries one. In memory a checkpoint's version is its precision (3 or 5); the
// architecture travels in the config.
//
// Debug-state file (written by train_gpt2.py, read by the tests): 256 int32 header
//   [0] magic 20240327  [1] version 3 to 6  [2] B  [3] T  [4] number of optimizer steps
//   [5] vocab_size  [6..11] float bits of AdamW's lr, beta1, beta2, eps, weight_decay, grad_clip
// version 4 (the modern or speedrun architecture, Muon, the summed loss, or documents; version 3
// is GPT-2 with AdamW, the mean loss and causal attention) also has
//   [12] architecture (0 GPT-2, 1 modern, 2 speedrun)  [13] optimizer of the blocks' matrices
//   (0 AdamW, 1 Muon)  [14] loss of the gradients (0 mean, 1 sum of the token losses)
//   [15..20] float bits of Muon's lr, weight decay, momentum (0 without Muon), and AdamW's lr of
//   the embedding (wte; GPT-2: wte, wpe; speedrun: and the value embeddings), the head weight and
//   the 1-D tensors (GPT-2: each [6]; speedrun: its scalars)
//   [21] attention within documents (0 causal, 1 documents: token 50256 opens each)
//   [22] with documents, the long window in 128-token blocks of every step (0: none; the short
//   one half of it, rounded down; a stage plan's aw=S/L gives its steps' own)
//   [23] Muon's Newton-Schulz steps, [24..26] float bits of their coefficients a, b, c (0 without
//   Muon; files written before these slots have 0 there: the baseline's 12 of (2, -1.5, 0.5))
//   [27] float bits of Muon's momentum at step 0, [28] the steps over which it rises linearly to
//   [17] (0: [17] at every step)  [29] AdamW's eps added to sqrt(v) before the bias correction
//   (1, the speedrun's: the update lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)) or to
//   sqrt(vhat) (0)  [30] the head's training products in FP8 with the speedrun's fixed scales (1:
//   train_gpt2.py --fp8_head 1; the logits, gradients and losses are that run's) or not (0)
//   [31] the byte length of the steps' stage plan (train_gpt2.py --stages, llmc/stages.h; 0: none,
//   as in files written before this slot), its text in [32..252], 4 bytes a slot, little-endian: step
//   s takes the first B*T_s tokens of x and y as B rows of its stage's T_s, at its stage's window,
//   the rates times its stage's multiplier; [4] counts the plan's N + E steps
//   [253] Muon's orthogonalisation, 1 + its row of llmc/recipe.h's kNewtonSchulzMethods (the rows of
//   train_gpt2.py's NEWTON_SCHULZ), whose steps and first polynomial [23..26] repeat; 0 without Muon
//   and in files written before this slot, where [23..26]'s one polynomial makes every step after
//   X / (|X|_F + 1e-7), and whose stage plans of 885 to 888 bytes filled it with text
// version 5 (version 4 with settings: train_gpt2.py --logit_cap, --mtp, --prefix_weight,
// --untie_step, --window_tokens, --normuon, --adam_every) then has the settings as train_gpt2cu's
// flags (int32 byte length, the text padded with zeros to 4-byte words: "-lc 23.0,5.0 -mtp
// 1.0,0.5,0.25 -pw 0.25 -ut 4 -awt 1 -mn 1 -ao 2"; with -ut the checkpoint's embedding is its head), then the prefix table's
// rows (int32: 0, or padded_vocab_size with -pw, maybe -pw 0.0 where the stage plan's pw= weights
// the prefix term) and its ids (int32 each, -1 none); the logits, loss and gradients below are of
// the loss those settings make, the step losses of each step's weights of the stage plan (its first
// stage's those) and of the optimizer's steps;
// version 6 (what train_gpt2.py writes for version 4 or 5; the settings maybe none) is version 5
// with one array more, before the step losses (below);
// then x (B*T int32), y (B*T int32), logits (B*T*vocab_size float32, unpadded; the modern
// head's output before the soft cap), loss (float32, the mean token loss; the speedrun's over all
// padded_vocab_size columns), every parameter gradient (float32, table order, padded wte; of the
// loss [14] names), version 6: the same gradients with every weight rounded to BF16 (the _bf16
// model file's) of the tensors of at most kDebugStateBf16WeightsMaxSize entries, and the losses (means) of the optimizer steps on that batch at constant
// learning rates, Muon's momentum and AdamW's eps as [27..29] make them step by step (float32
// each; the first is the loss before any update).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bigram_hash.h"
#include "file_header.h"
#include "rand.h"
#include "utils.h"

namespace llmc {

constexpr int kCheckpointMagic = 20240326;
constexpr int kCheckpointVersionFP32 = 3;
constexpr int kCheckpointVersionBF16 = 5;
constexpr int kCheckpointVersionModernFP32 = 6;
constexpr int kCheckpointVersionModernBF16 = 7;
constexpr int kDebugStateMagic = 20240327;
constexpr int kDebugStateVersion = 3;
constexpr int kDebugStateVersionRecipe = 4;  // the modern architectures or Muon
constexpr int kDebugStateVersionSettings = 5;  // version 4 and the loss's settings after the header
// Version 5, and before the step losses the first step's gradients at the BF16 model file's weights
// of each tensor of at most kDebugStateBf16WeightsMaxSize entries (DebugState::grads_at_bf16_weights).
constexpr int kDebugStateVersionBf16Weights = 6;
constexpr size_t kDebugStateBf16WeightsMaxSize = 8192;
constexpr int kDebugStateSettingsMaxBytes = 4096;
constexpr int kVocabPadMultiple = 128;

// GPT-2 (LayerNorm, learned positions, GELU, tied head), the modern architecture of
// modded-nanogpt's optimization-track baseline (RMSNorm, QK-norm and half-truncated rotary
// positions, ReLU^2, a separate head with bias, soft-capped logits), or its speedrun record #28
// (SPEC.md "The speedrun architecture": the modern blocks without gains or biases, wired with value
// embeddings, x0 lambdas, U-net skips, gated heads and a layer without attention), which the C++
// programs describe and read but do not train yet.
enum class Arch : int { kGpt2 = 0, kModern = 1, kSpeedrun = 2 };

struct GPT2Config {
  Arch arch = Arch::kGpt2;
  int max_seq_len = 0;        // maxT
  int vocab_size = 0;         // V, real tokens
  int padded_vocab_size = 0;  // Vp, V rounded up to kVocabPadMultiple
  int num_layers = 0;         // L
  int num_heads = 0;          // NH
  int channels = 0;           // C
  bool smear = false;         // the speedrun with record #89's smear (ArchSpec::smear; -sm)
  bool bigram = false;        // and its bigram hash embedding (ArchSpec::bigram; -bg)
  bool rotary_pairs = false;  // the modern or speedrun rotary in record #89's layout (ArchSpec::rotary_pairs; -rp)
  bool ve_gates = false;      // and its value-embedding gates (ArchSpec::ve_gates; -vg)
  bool resid_lambdas = false;  // and its residual and post lambdas (ArchSpec::resid_lambdas; -rl)
  bool xsa = false;           // and its exclusive self-attention (ArchSpec::xsa; -xs)
  bool record89_plan = false;  // and its 11-layer plan (layer_plan, ArchSpec::x0_gates; -lp)
  bool paired_heads = false;  // and the plan's paired-head attention (LayerSpec::paired; -ph)
  bool attn_lambdas = false;  // and its attention lambdas (ArchSpec::attn_lambdas; -al)
  bool mudd_gates = false;    // and the plan's gates a token from two generators (mudd_gate_column; -mg)
  bool mudd_connections = false;  // and the plan's MUDD dense connections (ArchSpec::mudd_connections)
  bool composed_attention = false;  // and its composed attention on layer 10 (ArchSpec::composed_attention)

  bool operator==(const GPT2Config& o) const {
    return arch == o.arch && max_seq_len == o.max_seq_len && vocab_size == o.vocab_size &&
           padded_vocab_size == o.padded_vocab_size && num_layers == o.num_layers &&
           num_heads == o.num_heads && channels == o.channels && smear == o.smear &&
           bigram == o.bigram && rotary_pairs == o.rotary_pairs && ve_gates == o.ve_gates &&
           resid_lambdas == o.resid_lambdas && xsa == o.xsa && record89_plan == o.record89_plan &&
           paired_heads == o.paired_heads && attn_lambdas == o.attn_lambdas && mudd_gates == o.mudd_gates &&
           mudd_connections == o.mudd_connections && composed_attention == o.composed_attention;
  }
  bool operator!=(const GPT2Config& o) const { return !(*this == o); }

  bool modern() const { return arch == Arch::kModern; }
  bool speedrun() const { return arch == Arch::kSpeedrun; }
  int head_size() const { return channels / num_heads; }

  std::string describe() const {
    const char* prefix = modern() ? "modern " : speedrun() ? "speedrun " : "";
    return strformat("%sL=%d NH=%d C=%d maxT=%d V=%d Vp=%d%s%s%s%s%s%s%s%s%s%s%s%s", prefix, num_layers, num_heads,
                     channels, max_seq_len, vocab_size, padded_vocab_size, smear ? " smear" : "",
                     bigram ? " bigram" : "", rotary_pairs ? " rotary-pairs" : "", ve_gates ? " ve-gates" : "",
                     resid_lambdas ? " resid-lambdas" : "", xsa ? " xsa" : "",
                     record89_plan ? " record89-plan" : "", paired_heads ? " paired-heads" : "",
                     attn_lambdas ? " attn-lambdas" : "", mudd_gates ? " mudd-gates" : "",
                     mudd_connections ? " mudd-connections" : "", composed_attention ? " composed-attention" : "");
  }
};

// ----------------------------------------------------------------------------
// BF16 on the host (checkpoint conversion, the sigmoid cap's rounding): round to nearest even, NaN
// kept NaN.

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// How the head's logits z are capped before the softmax, stated once for the classifier, the
// sampler and the tests: not at all (GPT-2's), y = cap * z / sqrt(z^2 + cap^2) (kRational, the
// modern architecture's), or y = cap * sigmoid((z + shift) / scale) (kSigmoid, modded-nanogpt's
// speedrun's, whose logits all lie in (0, cap): record #28's 30 sigmoid(z / 7.5), record #89's
// 23 sigmoid((z + 5) / 7.5)). bf16_sigmoid: the sigmoid rounded to BF16 before the cap multiplies
// it, in the loss and in dy/dz = (cap / scale) s (1 - s) alike, as record #89's training loss kernel
// keeps it. Only there: its evaluation is compiled PyTorch, which computes the BF16 logits' cap in
// FP32 without rounding between the fused operations, so forward passes that do not train
// (validation, HellaSwag, sampling) take evaluation()'s cap.
struct LogitCap {
  enum Kind : int { kNone, kRational, kSigmoid };
  Kind kind = kNone;
  float cap = 0.0f, scale = 0.0f, shift = 0.0f;
  bool bf16_sigmoid = false;

  // y, and dy/dz into *slope when given: in double, the reference the kernels are tested against;
  // in float, the sampler's.
  template <typename F>
  F apply(F z, F* slope = nullptr) const {
    if (kind == kRational) {
      z = std::min(std::max(z, (F)-1e18), (F)1e18);  // z^2 finite in float too; y = cap beyond
      const F root = std::sqrt(z * z + (F)cap * cap);
      if (slope) *slope = std::pow((F)cap / root, 3);
      return cap * z / root;
    }
    if (kind == kSigmoid) {
      // The exponent clamped below exp's overflow (in float, as the kernel's): past it 1 - sigmoid
      // would be inf * 0, a NaN slope, where both are below 1e-38.
      const F e = std::exp(std::min(-(z + (F)shift) / (F)scale, (F)88)), s = 1 / (1 + e);
      if (bf16_sigmoid) {
        const F r = bf16_bits_to_float(float_to_bf16_bits((float)s));
        if (slope) *slope = (F)cap / scale * r * (1 - r);
        return cap * r;
      }
      if (slope) *slope = (F)cap / scale * s * (e * s);
      return cap * s;
    }
    if (slope) *slope = 1;
    return z;
  }
  LogitCap evaluation() const {
    LogitCap c = *this;
    c.bf16_sigmoid = false;
    return c;
  }
  std::string describe() const {
    if (kind == kRational) return strformat("soft-capped at %g", cap);
    const char* rounded = bf16_sigmoid ? " (the training loss's sigmoid in BF16)" : "";
    if (kind == kSigmoid && shift != 0.0f) {
      return strformat("capped as %g sigmoid((z + %g) / %g)%s", cap, shift, scale, rounded);
    }
    if (kind == kSigmoid) return strformat("capped as %g sigmoid(z / %g)%s", cap, scale, rounded);
    return "uncapped";
  }
};

// What each architecture switches, stated once: the model's forward and backward passes, the
// decoder and the optimizers read these instead of testing the architecture themselves.
struct ArchSpec {
  const char* name;
  bool rms_norm;           // RMSNorm (no bias) instead of LayerNorm
  bool norm_gains;         // the norms have gains (the speedrun's RMS norms are weightless)
  bool embedding_norm;     // a norm of the embedding, the residual stream's start (lnew)
  bool learned_positions;  // wpe added to the embedding
  bool qk_norm_rotary;     // q and k: weightless RMS norm, then half-truncated rotary positions
  bool relu2;              // the MLP's activation: ReLU^2 instead of GELU (tanh)
  bool tied_head;          // the head is wte; else headw (with a bias headb where biases)
  bool biases;             // the linear layers (and a separate head) have biases
  bool zero_init_outputs;  // modded-nanogpt's seeded init (init_modern_from_seed,
                           // init_speedrun_from_seed): output projections and head start at zero
  LogitCap logit_cap;      // the logits the softmax sees
  float attention_scale;   // the softmax scale (0: 1 / sqrt(head size))
  bool loss_over_padded_vocab;  // the softmax and the loss over all Vp columns (the speedrun's
                                // reference keeps its padded columns); else over the V real ones
  // The speedrun's wiring of the blocks (SPEC.md "The speedrun architecture"; which layer has
  // attention, which value embedding and which skip is the layer plan's, layer_plan):
  bool value_mix;          // v = a v + b ve[k] in every attention layer (LayerSpec::value_embedding
                           // k), v = a v where it has none; without a in record #89's plan
                           // (value_mix_learns_a): v + b ve[k], v as it is where it has none
  bool x0_lambdas;         // a block's input is lambdas[0] x + lambdas[1] x0, x0 the normed embedding
  bool x0_gates;           // record #89's in place of x0_lambdas (its plan, -lp 1): x0 added after each
                           // attention with a learned gate, x <- x + attn + g x0 (the plan's gated skip
                           // and attention sources come with it: LayerSpec)
  bool attention_gate;     // each head's output times sigmoid(gate . h[:C/64]), h the normed input
  // Record #89's embedding (SPEC.md "Record #89's embedding"), off in every architecture and set
  // from the config (GPT2Config::smear, bigram, ve_gates: -sm, -bg, -vg, a checkpoint's header [9]):
  bool smear;              // x_t += lambda sigmoid(w . x_t[:12]) x_{t-1} before the embedding's norm
  bool bigram;             // the bigram hash embedding b, added with a gate to the residual stream
                           // before layer 0 and after the attention of every later attention layer
  bool ve_gates;           // the value mix's b a gate per head, 2 sigmoid(w_h . [h[:6], ve[:6]]), h the
                           // attention's normed input, in each layer with a value embedding
  bool resid_lambdas;      // each sublayer's add x <- r x + p out, (r, p) its layer's and sublayer's
  // Record #89's rotary layout, off in every architecture and set from the config (rotary_pairs:
  // -rp, header [9]'s bit 4; the modern and speedrun architectures):
  bool rotary_pairs;       // adjacent pairs (2i, 2i + 1) turn (i < HS/4), dims HS/2 to HS - 1 not, at
                           // positions over the forward's rows as one sequence
  // Record #89's exclusive self-attention, off in every architecture and set from the config (xsa:
  // -xs, header [9]'s bit 32; the speedrun's):
  bool xsa;                // in the plan's XSA layers (LayerSpec::xsa) each head's output y loses
                           // tanh(alpha_h) times its part along the value v it read, before the gate
  // Record #89's attention lambdas, off in every architecture and set from the config (attn_lambdas:
  // -al, header [9]'s bit 256; the speedrun's):
  bool attn_lambdas;       // each attention layer's qkv and output projections read their weights
                           // scaled by the layer's (s0, s1), each product bf16(s W) rounded once
  // Record #89's MUDD gate generators, off in every architecture and set from the config (mudd_gates:
  // -mg, header [9]'s bit 512; the speedrun's in its plan):
  bool mudd_gates;         // the plan's gates read a token from two generators' rows (mudd_gate_column)
  // Record #89's MUDD dense connections, off in every architecture and set from the config (header [9]'s
  // bit 1024; the speedrun's in its plan): the last layer's value, stream, lambdas and gates and the
  // final stream mixed from earlier layers' outputs by coefficients a token (kMuddConnection*)
  bool mudd_connections = false;
  // Record #89's composed attention, off in every architecture and set from the config (header [9]'s bit
  // 2048; the speedrun's in its plan, with its MUDD gate generators): layer 10's heads each add w_out_h (A
  // v_h), A the heads' attention probabilities over the last 112 keys mixed by w_in (train_gpt2.py's
  // composed_attention), w_in and w_out a token from the post gate generator's columns 29 and 35 on
  bool composed_attention = false;
};

// The attention gate reads the first C / kGateDivisor channels of the attention's input.
constexpr int kGateDivisor = 64;
// The smear's gate reads the first kSmearWidth channels of each token's embedding.
constexpr int kSmearWidth = 12;
// A value-embedding gate reads the first kVeGateInputs channels of the attention's normed input and of
// the layer's value embedding row: kVeGateWidth weights a head.
constexpr int kVeGateInputs = 6, kVeGateWidth = 2 * kVeGateInputs;

inline const ArchSpec& arch_spec(Arch a) {
  static const ArchSpec kGpt2 = {"gpt2", false, true, false, true, false, false, true, true, false,
                                 {}, 0.0f, false, false, false, false, false, false, false, false, false, false,
                                 false, false, false};
  static const ArchSpec kModern = {"modern", true, true, true, false, true, true, false, true, true,
                                   {LogitCap::kRational, 15.0f}, 0.12f, false, false, false, false, false,
                                   false, false, false, false, false, false, false, false};
  static const ArchSpec kSpeedrun = {"speedrun", true, false, true, false, true, true, false, false, true,
                                     {LogitCap::kSigmoid, 30.0f, 7.5f}, 0.12f, true, true, true, false, true,
                                     false, false, false, false, false, false, false, false};
  return a == Arch::kSpeedrun ? kSpeedrun : a == Arch::kModern ? kModern : kGpt2;
}

// Whether the value mix scales v by a learned a: not in record #89's plan, whose reference adds the
// gated value embedding to v as it is.
inline bool value_mix_learns_a(const ArchSpec& a) { return a.value_mix && !a.x0_gates; }

// A model's switches: its architecture's, with the features its config turns on.
inline ArchSpec arch_spec(const GPT2Config& c) {
  ArchSpec a = arch_spec(c.arch);
  a.smear = c.smear;
  a.bigram = c.bigram;
  a.rotary_pairs = c.rotary_pairs;
  a.ve_gates = c.ve_gates;
  a.resid_lambdas = c.resid_lambdas;
  a.xsa = c.xsa;
  a.attn_lambdas = c.attn_lambdas;
  a.mudd_gates = c.mudd_gates;
  a.mudd_connections = c.mudd_connections;
  a.composed_attention = c.composed_attention;
  // Record #89's plan: x0 after each attention with a gate, not mixed into each block's input, and
  // none of record #28's attention gates (the reference's, on two layers, come from MUDD).
  if (c.record89_plan) {
    a.x0_lambdas = false;
    a.x0_gates = true;
    a.attention_gate = false;
  }
  return a;
}

// The checkpoint header's slot of the config's record #89 features, and their bits.
constexpr int kFeaturesSlot = 9;
constexpr int kFeatureSmear = 1, kFeatureBigram = 2, kFeatureRotaryPairs = 4, kFeatureVeGates = 8;
constexpr int kFeatureResidLambdas = 16, kFeatureXsa = 32, kFeatureRecord89Plan = 64, kFeaturePairedHeads = 128;
constexpr int kFeatureAttnLambdas = 256;
constexpr int kFeatureMuddGates = 512;
constexpr int kFeatureMuddConnections = 1024;
constexpr int kFeatureComposedAttention = 2048;
// The bigram gates' start, the reference's bias of its generated gates (0.05).
constexpr float kBigramGateInit = 0.05f;
// The residual and post lambdas' start: r = sqrt(1.1), so that a layer's two sublayers scale the
// stream by 1.1, and p = 1 (the reference's float32 of the double sqrt).
constexpr float kResidLambdaInit = 1.0488088481701516f, kPostLambdaInit = 1.0f;
// Record #89's gated skip's start, sigmoid(skip_lambda) g, skip_lambda -1.5 (its scalars') and g 0.5 (the
// bias of the reference's generated gate); its x0 gates start at 0, its head gates at 0.25 (their
// generated gates' bias).
constexpr float kSkipLambdaInit = -1.5f, kSkipGateInit = 0.5f, kHeadGateInit = 0.25f;
// Record #89's attention lambdas' start: qkv's weight times 0.5, the output projection's times 1.
constexpr float kAttnLambdaQkvInit = 0.5f, kAttnLambdaProjInit = 1.0f;

// Record #89's MUDD gate generators (-mg 1, GPT2Config::mudd_gates; train_gpt2.py's MUDD_*): the pre (0)
// reads x0 (the normed embedding) and the post (1) the stream entering layer kMuddPostLayer, each giving a
// token a row (gelu(x W1^T) W2[:n]^T + b2[:n]) x scale, GELU the exact one, W1 [kMuddGateHidden, C], W2
// [kMuddGateWidth, kMuddGateHidden], b2 [kMuddGateWidth], n kMuddGateColumns[generator] (mudd_gate_column
// gives each gate's columns).
constexpr int kMuddGateHidden = 64, kMuddGateWidth = 41, kMuddPostLayer = 4;
constexpr float kMuddGateScaleInit = 0.1f;

// Record #89's MUDD dense connections (GPT2Config::mudd_connections; train_gpt2.py's MUDD_*): two generators
// of the gate generators' form with a fixed scale kMuddConnectionScale, W1 [kMuddConnectionHidden, C], W2
// [kMuddLayerCoefficients, kMuddConnectionHidden], b2 [kMuddLayerCoefficients]: the first reads the last
// layer's input and gives it kMuddLayerCoefficients a token (m0-m2 its value's terms of in0, out7 and x;
// m3-m5 its stream's, (1 + m5) x + m3 in0 + m4 out7; m6, m7 each half of the heads' value-embedding gate;
// m8, m9 its attention's r and p, m10 its x0 gate (of in0), m11 its bigram gate; m12, m13 its MLP's r and
// p), the second reads its output and gives kMuddFinalCoefficients, x += m0 in0 + m1 out7 + m2 out9 + m3 ve0
// + m4 out3 (in0 the stream entering layer 0, ve0 layer 1's value embedding).
constexpr int kMuddConnectionHidden = 64, kMuddLayerCoefficients = 14, kMuddFinalCoefficients = 5;
constexpr double kMuddConnectionScale = 0.1;
// The first generator's columns, in the order above.
enum MuddLayerCoefficient {
  kMuddValueIn0, kMuddValueOut7, kMuddValueX, kMuddStreamIn0, kMuddStreamOut7, kMuddStreamX, kMuddVeGateFirst,
  kMuddVeGateSecond, kMuddAttentionR, kMuddAttentionP, kMuddAttentionX0, kMuddAttentionBigram, kMuddMlpR, kMuddMlpP
};
// The layers whose outputs they mix (out7 and out3; out9 the last layer's input) and the layer whose value
// embedding the final mix adds (ve0).
constexpr int kMuddOut7 = 7, kMuddOut3 = 3, kMuddVe0Layer = 1;

// b2's start (before the scale): the layer's gates 2, its r sqrt(1.1), p 1 and bigram gate 0.05, the final
// mix's out7 coefficient -0.5, each over the scale (in double, then rounded); the rest 0.
inline float mudd_connection_bias_init(int generator, int column) {
  const double r = std::sqrt(1.1);
  const double layer[kMuddLayerCoefficients] = {0, 0, 0, 0, 0, 0, 2.0, 2.0, r, 1.0, 0, 0.05, r, 1.0};
  const double value = generator == 0 ? layer[column] : column == 1 ? -0.5 : 0.0;
  return (float)(value / kMuddConnectionScale);
}

// b2's start (before the scale): the head gates 0.25, the bigram gates 0.05, the skip's g 0.5 and the
// composed attention's first six weights 1.0, each over the scale's 0.1; the rest 0.
inline float mudd_gate_bias_init(int generator, int column) {
  if (column >= 12 && column < 18) return 2.5f;
  if (generator == 0) return column >= 19 && column < 26 && column % 2 == 1 ? 0.5f : 0.0f;
  if (column >= 19 && column < 28 && column % 2 == 1) return 0.5f;
  if (column == 28) return 5.0f;
  return column >= 29 && column < 35 ? 10.0f : 0.0f;
}

// ----------------------------------------------------------------------------
// Layer plan

// The speedrun reference's layers (modded-nanogpt record #28; train_gpt2.py's SPEEDRUN_* lists are
// the same), one list a feature and one entry a layer:
//   attention: A attention and MLP, - the MLP alone (no ln1, no attention tensors);
//   windows: with a window (-aw), the long one (L) or the short one (S; half the long rounded down
//     unless given, -aw S/L), also the other architectures' windows at this depth;
//   value embeddings: the ve[k] the layer's value mix adds (ArchSpec::value_mix), -1 none;
//   skip sources: the earlier layer whose output the U-net adds to the layer's input, -1 none;
//   XSA: X where record #89's exclusive self-attention runs (-xs 1), its reference's layers 1, 3,
//     4 and 7 (layer 7 has no attention here, so none there).
//                                                0   1   2   3   4   5   6   7   8   9  10  11
constexpr char kSpeedrunAttention[] =           "AAAAAAA-AAAA";
constexpr char kSpeedrunWindows[] =             "LSSSLSSLSSSL";
constexpr int kSpeedrunValueEmbeddings[] =    { 0,  1,  2, -1, -1, -1, -1, -1, -1,  0,  1,  2};
constexpr int kSpeedrunSkipSources[] =        {-1, -1, -1, -1, -1, -1,  5,  4,  3,  2,  1,  0};
constexpr char kSpeedrunXsa[] =                 "-X-XX--X----";
// Its only depth.
constexpr int kSpeedrunLayers = (int)sizeof(kSpeedrunWindows) - 1;
static_assert(sizeof(kSpeedrunAttention) - 1 == kSpeedrunLayers && sizeof(kSpeedrunXsa) - 1 == kSpeedrunLayers &&
                  sizeof(kSpeedrunValueEmbeddings) / sizeof(int) == kSpeedrunLayers &&
                  sizeof(kSpeedrunSkipSources) / sizeof(int) == kSpeedrunLayers,
              "the speedrun's lists give one entry a layer");

// Record #89's plan (-lp 1, GPT2Config::record89_plan; its reference's forward), the lists above and:
//   gated skips: the earlier layer whose output the layer adds, times sigmoid(skip_lambda) g, before
//     its MLP (its one layer without attention; skip_gate's two values);
//   attention sources: the earlier layer whose output its attention reads (normed) instead of its
//     input, -1 its input (layer 8's input is layer 7's output: the reference's out7 for 8 to 10);
//   head gates: G where each head's attention output is scaled by its gate before the output
//     projection (head_gates' rows; XSA's output where the layer has both).
// The windows' entry of the layer without attention is not read. No U-net skips.
//                                                0   1   2   3   4   5   6   7   8   9  10
constexpr char kRecord89Attention[] =           "AAAAAA-AAAA";
constexpr char kRecord89Windows[] =             "SSSLSSSSSSL";
constexpr int kRecord89ValueEmbeddings[] =    {-1,  0,  1, -1, -1, -1, -1, -1,  2,  3,  4};
constexpr int kRecord89GatedSkips[] =         {-1, -1, -1, -1, -1, -1,  3, -1, -1, -1, -1};
constexpr int kRecord89AttentionSources[] =   {-1, -1, -1, -1, -1, -1, -1, -1, -1,  7,  7};
constexpr char kRecord89Xsa[] =                 "-X-XX--X---";
constexpr char kRecord89HeadGates[] =           "---G------G";
// Its paired heads (-ph 1): the layers whose heads attend in pairs (LayerSpec::paired).
constexpr char kRecord89Paired[] =              "P-P--P---P-";
constexpr int kRecord89Layers = (int)sizeof(kRecord89Windows) - 1;
static_assert(sizeof(kRecord89Attention) - 1 == kRecord89Layers && sizeof(kRecord89Xsa) - 1 == kRecord89Layers &&
                  sizeof(kRecord89HeadGates) - 1 == kRecord89Layers &&
                  sizeof(kRecord89Paired) - 1 == kRecord89Layers &&
                  sizeof(kRecord89ValueEmbeddings) / sizeof(int) == kRecord89Layers &&
                  sizeof(kRecord89GatedSkips) / sizeof(int) == kRecord89Layers &&
                  sizeof(kRecord89AttentionSources) / sizeof(int) == kRecord89Layers,
              "record #89's lists give one entry a layer");

// Record #89's MUDD gates (-mg 1): two generators' rows, a row a token, give some of its plan's gates
// per token in place of their scalar parameters: generator 0, the "pre", reads x0; generator 1, the
// "post", layer 4's input. A row's columns (the reference's fixed layouts, for its 6 heads):
//   pre  [26]: 0-5 the XSA strengths of layer 1, 6-11 of layer 3; 12-17 the head gates of layer 3;
//              18 + 2j the x0 gate and 19 + 2j the bigram gate of layer j for j = 0..3 (layer 0's
//              bigram gate the stream start's);
//   post [41]: 0-5 the XSA strengths of layer 4, 6-11 of layer 7; 12-17 the head gates of layer 10;
//              18-27 the (x0, bigram) gate pairs of layers 4, 5, 7, 8, 9; 28 the gated skip's g (layer
//              6's); 29-34 the composed attention's w_in and 35-40 its w_out (layer 10's; read with
//              GPT2Config::composed_attention).
// A kind's columns for a layer start at mudd_gate_column's, its heads consecutive.
enum MuddGate { kMuddXsa, kMuddHeadGate, kMuddX0, kMuddBigram, kMuddSkip, kMuddComposedIn, kMuddComposedOut };
constexpr int kMuddGenerators = 2;
constexpr int kMuddGateColumns[kMuddGenerators] = {26, 41};
constexpr int kMuddGateHeads = 6;
// The rows as the model keeps them: kMuddGateStride floats apart (16-aligned for the products).
constexpr int kMuddGateStride = 48;
constexpr int kMuddXsaLayers[kMuddGenerators][2] = {{1, 3}, {4, 7}};
constexpr int kMuddHeadGateLayers[kMuddGenerators] = {3, 10};
constexpr int kMuddInjectLayers[kMuddGenerators][5] = {{0, 1, 2, 3, -1}, {4, 5, 7, 8, 9}};
constexpr int kMuddXsaColumn = 0, kMuddHeadGateColumn = 12, kMuddInjectColumn = 18;
constexpr int kMuddSkipLayer = 6, kMuddSkipColumn = 28;  // the post generator's
// Record #89's composed attention (GPT2Config::composed_attention): on layer kComposedLayer, over the last
// kComposedWindow keys of a query's document, its weights the post generator's columns from these.
constexpr int kComposedLayer = 10, kComposedWindow = 112;
constexpr int kMuddComposedInColumn = 29, kMuddComposedOutColumn = 35;
static_assert(kMuddGateColumns[0] <= kMuddGateStride && kMuddGateColumns[1] <= kMuddGateStride &&
                  kMuddGateStride % 16 == 0,
              "the MUDD gates' rows hold both generators' columns");

// Where a gate generator gives gate `kind` of `layer`.
struct MuddGateColumn {
  int generator;  // 0 the pre, 1 the post; -1 none (the gate is its scalar parameter)
  int column;     // its first column (the first head's), -1 with none
};
inline MuddGateColumn mudd_gate_column(MuddGate kind, int layer) {
  for (int g = 0; g < kMuddGenerators; g++) {
    for (int i = 0; i < 2; i++) {
      if (kind == kMuddXsa && kMuddXsaLayers[g][i] == layer) return {g, kMuddXsaColumn + i * kMuddGateHeads};
    }
    if (kind == kMuddHeadGate && kMuddHeadGateLayers[g] == layer) return {g, kMuddHeadGateColumn};
    for (int i = 0; i < 5; i++) {
      if (kMuddInjectLayers[g][i] != layer || layer < 0) continue;
      if (kind == kMuddX0) return {g, kMuddInjectColumn + 2 * i};
      if (kind == kMuddBigram) return {g, kMuddInjectColumn + 2 * i + 1};
    }
  }
  if (kind == kMuddSkip && layer == kMuddSkipLayer) return {1, kMuddSkipColumn};
  if (kind == kMuddComposedIn && layer == kComposedLayer) return {1, kMuddComposedInColumn};
  if (kind == kMuddComposedOut && layer == kComposedLayer) return {1, kMuddComposedOutColumn};
  return {-1, -1};
}

// The speedrun's depth: its reference's, record #28's or record #89's (its plan).
inline int speedrun_layers(bool record89_plan) { return record89_plan ? kRecord89Layers : kSpeedrunLayers; }

enum class LayerWindow : char { kLong = 'L', kShort = 'S' };

// What one layer does; -1: none. The slabs, skip weights and kept outputs are numbered in layer
// order.
struct LayerSpec {
  bool attention;       // attention and MLP, else the MLP alone
  LayerWindow window;   // which of the run's windows it takes (-aw)
  int attention_slab;   // its slab of the attention tensors (ParamStack::kAttentionLayers)
  int value_embedding;  // the ve[k] its value mix adds
  int value_embedding_slab;  // its slab among the layers with a value embedding (their gates' rows)
  int skip_source;      // the earlier layer whose output the U-net adds to its input
  int skip_weight;      // the skipw[j] it adds that output with
  int gated_skip_source;  // record #89's: the earlier layer whose output it adds with the skip gate
  int attention_source;   // record #89's: the earlier layer whose output its attention reads, -1 its input
  int kept;             // its output's slot among those kept for later layers (skips, attention sources)
  bool key_offset;      // after the rotary, each key's stationary dims are the previous key's
                        // (record #89's, on its long-window layers: plan_key_offsets)
  bool xsa;             // record #89's exclusive self-attention runs here (with ArchSpec::xsa)
  int xsa_slab;         // its slab among the XSA layers (xsa_alpha's rows)
  bool head_gate;       // record #89's plan: each head's output times its gate (head_gates)
  int head_gate_slab;   // its slab among the head-gate layers (head_gates' rows)
  bool paired;          // record #89's paired heads (GPT2Config::paired_heads): head h of token t rotated
                        // at 2t + (h & 1), then heads 0..NH/2-1 attend at position 2t and the rest at
                        // 2t + 1 of a sequence twice as long, as NH/2 heads (SPEC.md)

  // Its window in blocks among a step's long and short ones (llmc::StepWindows).
  int window_blocks(int long_blocks, int short_blocks) const {
    return window == LayerWindow::kLong ? long_blocks : short_blocks;
  }
};

// Every layer's record, computed once from the architecture and the depth (layer_plan), and the
// counts of what they hold: what the forward, backward, decoder, parameter table and optimizers
// read instead of a layer index or count of their own.
struct LayerPlan {
  std::vector<LayerSpec> layers;
  int attention_layers = 0;  // the slabs of the attention tensors
  int value_embeddings = 0;  // the ve tables [Vp, C]
  int value_embedding_layers = 0;  // the layers that add one (ParamStack::kValueEmbeddingLayers)
  int xsa_layers = 0;        // the layers with XSA (ParamStack::kXsaLayers)
  int head_gate_layers = 0;  // the layers with head gates (ParamStack::kHeadGateLayers)
  int skip_weights = 0;
  int kept_outputs = 0;

  const LayerSpec& operator[](int layer) const { return layers[layer]; }
  int size() const { return (int)layers.size(); }

  // Each layer's window class, "LSSSLSSLSSSL" for the reference's.
  std::string windows() const {
    std::string s;
    for (const LayerSpec& l : layers) s += (char)l.window;
    return s;
  }
  bool has_short_windows() const { return windows().find((char)LayerWindow::kShort) != std::string::npos; }
  // The smallest long window, in blocks, from which every layer attends to all of a sequence's
  // `blocks` blocks (a wider one selects the same keys): the short layers take half of it unless
  // the short window is given (short_given), which is no wider than the long one.
  int window_blocks_spanning(int blocks, bool short_given) const {
    return has_short_windows() && !short_given ? 2 * blocks : blocks;
  }
  // The start-up table's: the columns that differ from plain attention with the long window (the
  // windows only where the run has one: `windowed`).
  std::string describe(bool windowed) const {
    std::string attention, values, skips, gated_skips, sources;
    auto entry = [](int layer) { return layer >= 0 ? strformat(" %d", layer) : std::string(" -"); };
    for (const LayerSpec& l : layers) {
      attention += l.attention ? "A" : "-";
      values += entry(l.value_embedding);
      skips += entry(l.skip_source);
      gated_skips += entry(l.gated_skip_source);
      sources += entry(l.attention_source);
    }
    std::string s = strformat("%d", size());
    if (attention_layers < size()) s += "; attention " + attention;
    if (windowed && has_short_windows()) s += "; windows " + windows();
    if (value_embeddings > 0) s += "; value embeddings" + values;
    if (skip_weights > 0) s += "; U-net skips from" + skips;
    if (gated_skips.find_first_of("0123456789") != std::string::npos) s += "; gated skip from" + gated_skips;
    if (sources.find_first_of("0123456789") != std::string::npos) s += "; attention over the output of" + sources;
    if (key_offsets() != std::string(size(), '-')) s += "; key offset " + key_offsets();
    if (paired_layers() != std::string(size(), '-')) s += "; paired heads " + paired_layers();
    return s;
  }
  // Each layer's paired heads, "P" or "-".
  std::string paired_layers() const {
    std::string s;
    for (const LayerSpec& l : layers) s += l.paired ? "P" : "-";
    return s;
  }
  // Each layer's key offset, "K" or "-".
  std::string key_offsets() const {
    std::string s;
    for (const LayerSpec& l : layers) s += l.key_offset ? "K" : "-";
    return s;
  }
};

// Record #89's key offset (-ko 1) on the layers with attention and the long window, as its
// reference's `key_offset = [b == ws_long for b in bm_sizes]`: every attention layer at a depth
// other than the reference's, whose windows are all long.
inline void plan_key_offsets(LayerPlan& plan) {
  for (LayerSpec& l : plan.layers) l.key_offset = l.attention && l.window == LayerWindow::kLong;
}

// The speedrun's layers are its reference's lists, record #28's or with record89_plan record #89's
// (at their depth only); the other architectures attend in every layer, with record #28's windows at
// its depth and the long one at any other.
inline LayerPlan layer_plan(Arch arch, int num_layers, bool record89_plan = false, bool paired_heads = false) {
  const bool speedrun = arch == Arch::kSpeedrun, record89 = speedrun && record89_plan;
  const bool reference_depth = num_layers == kSpeedrunLayers;
  if (speedrun && num_layers != speedrun_layers(record89)) {
    LLMC_FAIL("layer plan: the speedrun's layers are its reference's %d, not %d", speedrun_layers(record89),
              num_layers);
  }
  const char* attention = record89 ? kRecord89Attention : kSpeedrunAttention;
  const char* windows = record89 ? kRecord89Windows : kSpeedrunWindows;
  const int* value_embeddings = record89 ? kRecord89ValueEmbeddings : kSpeedrunValueEmbeddings;
  const char* xsa = record89 ? kRecord89Xsa : kSpeedrunXsa;
  LayerPlan plan;
  plan.layers.resize(num_layers);
  for (int l = 0; l < num_layers; l++) {
    LayerSpec& s = plan.layers[l];
    s.attention = !speedrun || attention[l] == 'A';
    s.window = speedrun || reference_depth ? (LayerWindow)windows[l] : LayerWindow::kLong;
    s.attention_slab = s.attention ? plan.attention_layers++ : -1;
    s.value_embedding = speedrun ? value_embeddings[l] : -1;
    plan.value_embeddings = std::max(plan.value_embeddings, s.value_embedding + 1);
    s.value_embedding_slab = s.value_embedding >= 0 ? plan.value_embedding_layers++ : -1;
    s.skip_source = speedrun && !record89 ? kSpeedrunSkipSources[l] : -1;
    s.skip_weight = s.skip_source >= 0 ? plan.skip_weights++ : -1;
    s.gated_skip_source = record89 ? kRecord89GatedSkips[l] : -1;
    s.attention_source = record89 ? kRecord89AttentionSources[l] : -1;
    s.key_offset = false;
    s.xsa = speedrun && s.attention && xsa[l] == 'X';
    s.xsa_slab = s.xsa ? plan.xsa_layers++ : -1;
    s.head_gate = record89 && s.attention && kRecord89HeadGates[l] == 'G';
    s.head_gate_slab = s.head_gate ? plan.head_gate_layers++ : -1;
    s.paired = record89 && paired_heads && kRecord89Paired[l] == 'P';
  }
  // The outputs a later layer reads, kept in layer order; one pass, as a checkpoint's header may give
  // up to kMaxLayers layers.
  std::vector<char> read_later(num_layers, 0);
  for (const LayerSpec& s : plan.layers) {
    for (int source : {s.skip_source, s.gated_skip_source, s.attention_source}) {
      if (source >= 0) read_later[source] = 1;
    }
  }
  for (int l = 0; l < num_layers; l++) plan.layers[l].kept = read_later[l] ? plan.kept_outputs++ : -1;
  return plan;
}

inline LayerPlan layer_plan(const GPT2Config& c) {
  return layer_plan(c.arch, c.num_layers, c.record89_plan, c.paired_heads);
}

// PyTorch's F.rms_norm default (eps=None): the FP32 epsilon, also for BF16 inputs.
constexpr float kRmsNormEps = 1.1920928955078125e-07f;

inline int pad_vocab(int vocab_size) {
  return (int)round_up((size_t)vocab_size, kVocabPadMultiple);
}

// Limits far beyond any GPT-2-like model, chosen so that no count derived from a config (the
// parameter count, a file's size in bytes) can overflow 64 bits: a damaged checkpoint header then
// fails here instead of wrapping around to a size that seems to match its file.
constexpr int kMaxLayers = 1 << 16;
constexpr int kMaxChannels = 1 << 20;
constexpr int kMaxSeqLen = 1 << 24;
constexpr int kMaxVocabSize = 1 << 30;

inline GPT2Config make_config(int num_layers, int num_heads, int channels, int max_seq_len,
                              int vocab_size, Arch arch = Arch::kGpt2) {
  if (num_layers <= 0 || num_heads <= 0 || channels <= 0 || max_seq_len <= 0 || vocab_size <= 0) {
    LLMC_FAIL("invalid model config L=%d NH=%d C=%d maxT=%d V=%d: every value must be positive",
              num_layers, num_heads, channels, max_seq_len, vocab_size);
  }
  if (num_layers > kMaxLayers || channels > kMaxChannels || max_seq_len > kMaxSeqLen ||
      vocab_size > kMaxVocabSize) {
    LLMC_FAIL("invalid model config L=%d C=%d maxT=%d V=%d: the limits are L %d, C %d, maxT %d, "
              "V %d", num_layers, channels, max_seq_len, vocab_size, kMaxLayers, kMaxChannels,
              kMaxSeqLen, kMaxVocabSize);
  }
  if (channels % num_heads != 0) {
    LLMC_FAIL("invalid model config: channels %d is not divisible by heads %d", channels,
              num_heads);
  }
  if (arch_spec(arch).qk_norm_rotary && ((channels / num_heads) % 4 != 0 || max_seq_len <= 1)) {
    LLMC_FAIL("invalid %s model config: head size %d must be a multiple of 4 (rotary pairs)",
              arch_spec(arch).name, channels / num_heads);
  }
  const bool speedrun_depth = num_layers == kSpeedrunLayers || num_layers == kRecord89Layers;
  if (arch == Arch::kSpeedrun && (!speedrun_depth || channels < kGateDivisor)) {
    LLMC_FAIL("invalid speedrun model config L=%d C=%d: its references' %d layers (record #28's; %d record "
              "#89's), and C at least %d (the attention gate reads C/%d channels)", num_layers, channels,
              kSpeedrunLayers, kRecord89Layers, kGateDivisor, kGateDivisor);
  }
  GPT2Config c;
  c.arch = arch;
  c.num_layers = num_layers;
  c.num_heads = num_heads;
  c.channels = channels;
  c.max_seq_len = max_seq_len;
  c.vocab_size = vocab_size;
  c.padded_vocab_size = pad_vocab(vocab_size);
  return c;
}

// What a config with record #89's paired heads lacks of what they need, or null: its plan (the paired
// layers are the plan's), its rotary pairs (the paired positions are their tables'), an even number of
// heads (half of them a position).
inline const char* paired_heads_missing(const GPT2Config& c) {
  if (!c.paired_heads) return nullptr;
  if (!c.record89_plan) return "record #89's plan";
  if (!c.rotary_pairs) return "record #89's rotary pairs";
  if (c.num_heads % 2 != 0) return "an even number of heads";
  return nullptr;
}

// A speedrun config with record #89's plan, or without: its depth follows (speedrun_layers).
// What a config with record #89's MUDD gate generators lacks of what they need, or null: its plan (the
// gates are the plan's), at most kMuddGateHeads heads (a layer's heads' columns).
inline const char* mudd_gates_missing(const GPT2Config& c) {
  if (!c.mudd_gates) return nullptr;
  if (!c.record89_plan) return "record #89's plan";
  if (c.num_heads > kMuddGateHeads) return "at most 6 heads";
  return nullptr;
}

// What a config with record #89's MUDD dense connections lacks of what they need, or null: its plan (they
// join its layers), an even number of heads (each half's gate).
inline const char* mudd_connections_missing(const GPT2Config& c) {
  if (!c.mudd_connections) return nullptr;
  if (!c.record89_plan) return "record #89's plan";
  if (c.num_heads % 2 != 0) return "an even number of heads";
  return nullptr;
}

// What a config with record #89's composed attention lacks of what it needs, or null: the MUDD gate
// generators (its weights are the post generator's columns; they need the plan).
inline const char* composed_attention_missing(const GPT2Config& c) {
  if (!c.composed_attention) return nullptr;
  if (!c.mudd_gates) return "the MUDD gate generators";
  return nullptr;
}

inline void set_record89_plan(GPT2Config& c, bool on) {
  c.record89_plan = on;
  if (c.speedrun()) c.num_layers = speedrun_layers(on);
}

// "d12", "d24", "d36", "d48" are GPT-2 124M/350M/774M/1.5B; "tiny" is a small
// model for fast tests (head size 32, so it also exercises the non-64 paths). The modern
// architecture keeps the widths and depths with head size 128 (6, 8 and 10 heads); 128 does not
// divide d48's 1600, so d48 has 25 heads of 64; its tiny has one head of 128. The speedrun has its
// reference's d12 (maxT its validation's 262,144-token sequences) and a tiny of 12 layers of 2
// heads of 64 (train_gpt2.py's SPEEDRUN_PRESETS).
inline bool config_from_preset(const std::string& name, GPT2Config* out, Arch arch = Arch::kGpt2) {
  if (arch == Arch::kSpeedrun) {
    if (name == "d12") { *out = make_config(12, 6, 768, 262144, 50257, arch); return true; }
    if (name == "tiny") { *out = make_config(12, 2, 128, 1024, 50257, arch); return true; }
    return false;
  }
  if (arch == Arch::kModern) {
    if (name == "d12") { *out = make_config(12, 6, 768, 1024, 50257, arch); return true; }
    if (name == "d24") { *out = make_config(24, 8, 1024, 1024, 50257, arch); return true; }
    if (name == "d36") { *out = make_config(36, 10, 1280, 1024, 50257, arch); return true; }
    if (name == "d48") { *out = make_config(48, 25, 1600, 1024, 50257, arch); return true; }
    if (name == "tiny") { *out = make_config(2, 1, 128, 64, 50257, arch); return true; }
    return false;
  }
  if (name == "d12") { *out = make_config(12, 12, 768, 1024, 50257); return true; }
  if (name == "d24") { *out = make_config(24, 16, 1024, 1024, 50257); return true; }
  if (name == "d36") { *out = make_config(36, 20, 1280, 1024, 50257); return true; }
  if (name == "d48") { *out = make_config(48, 25, 1600, 1024, 50257); return true; }
  if (name == "tiny") { *out = make_config(2, 4, 128, 64, 50257); return true; }
  return false;
}

// ----------------------------------------------------------------------------
// Parameter table

// One table for every architecture: a tensor its switches (ArchSpec) leave out has size 0, so
// GPT-2's sizes, offsets and file layout are those of llm.c, the modern ones follow the same order,
// and the speedrun's tensors only it has come after them (SPEC.md "Speedrun checkpoint"). The
// bigram table follows the value embeddings, whose offset and size are multiples of 16 elements,
// so that its rows' 16-byte loads are aligned; the small tensors come last.
constexpr int kNumParamTensors = 43;

enum ParamIndex {
  kWte, kWpe, kLnew, kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,
  kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb, kLnfw, kLnfb, kHeadw, kHeadb,
  kVe, kBigram, kAttngate, kSkipw, kLambdas, kValueScales, kSmearw, kSmearLambda,
  kBigramGates, kVegate, kResidLambdas, kPostLambdas, kXsaAlpha, kX0Gates, kSkipGate, kHeadGates,
  kAttnLambdas,
  kMuddGateW1, kMuddGateW2, kMuddGateB2, kMuddGateScale, kMuddW1, kMuddW2, kMuddB2,
};

// What a tensor is to the optimizers: Muon (-opt muon) takes the blocks' matrices, AdamW the rest,
// each role with its own learning rate in the modern recipes (kVector: the 1-D tensors, the
// speedrun's scalars).
enum class ParamRole { kEmbedding, kMatrix, kVector, kHead };

// How a tensor is stacked: one tensor, one slab per layer, one per layer with attention (the
// attention's tensors: the layers whose LayerSpec::attention is set), one per layer with a value
// embedding (LayerSpec::value_embedding), one per layer with XSA (LayerSpec::xsa), or one per layer
// with head gates (LayerSpec::head_gate).
enum class ParamStack { kWhole, kLayers, kAttentionLayers, kValueEmbeddingLayers, kXsaLayers, kHeadGateLayers };

struct ParamSpec {
  const char* name;
  size_t size;      // elements
  ParamStack stack;
  bool decayed;     // GPT-2's AdamW weight decay applies (2-D matrices only)
  bool residual_projection;  // GPT-2's init std scaled by 1/sqrt(2L); the modern init's zeros
  ParamRole role;
  int rows = 0, cols = 0;  // kMatrix: one matrix [rows, cols]; a layer's slab holds `split` of them
  int split = 1;           // qkvw: q, k and v, which Muon orthogonalises one by one

  bool per_layer() const { return stack != ParamStack::kWhole; }
};

// Shapes follow PyTorch: linear weights are [out, in].
inline void param_table(const GPT2Config& c, ParamSpec table[kNumParamTensors]) {
  const size_t L = c.num_layers, C = c.channels, Vp = c.padded_vocab_size, T = c.max_seq_len;
  const LayerPlan plan = layer_plan(c);
  const size_t NH = c.num_heads, La = plan.attention_layers;
  const int Ci = c.channels;
  const ArchSpec a = arch_spec(c);
  // 1 where the switch gives the model the tensor(s), else 0.
  const size_t positions = a.learned_positions ? 1 : 0;
  const size_t gains = a.norm_gains ? 1 : 0, embedding_gain = a.embedding_norm && a.norm_gains ? 1 : 0;
  const size_t norm_bias = a.rms_norm ? 0 : 1, head = a.tied_head ? 0 : 1, bias = a.biases ? 1 : 0;
  const size_t ve = plan.value_embeddings, lambdas = a.x0_lambdas ? 2 : 0;
  const size_t skips = plan.skip_weights, gate = a.attention_gate ? 1 : 0;
  // (a, b) in every attention layer, or b alone (value_mix_learns_a)
  const size_t value_scales = a.value_mix ? (value_mix_learns_a(a) ? 2 : 1) : 0;
  const size_t smear = a.smear ? 1 : 0, bigram = a.bigram ? 1 : 0, ve_gates = a.ve_gates ? 1 : 0;
  const size_t Lve = plan.value_embedding_layers, xsa = a.xsa ? 1 : 0, Lx = plan.xsa_layers;
  const size_t sublayer_lambdas = a.resid_lambdas ? 2 : 0;  // (attention, MLP) in every layer
  const size_t x0_gates = a.x0_gates ? 1 : 0;  // one an attention layer
  const size_t attn_lambdas = a.attn_lambdas ? 2 : 0;  // (qkv's, attproj's) in every layer
  const size_t mudd = a.mudd_gates ? 1 : 0;  // the two MUDD gate generators' tensors (the scalars' role)
  const size_t connections = a.mudd_connections ? 1 : 0;  // and the dense connections' (the scalars' role)
  size_t gated_skips = 0;  // (skip_lambda, g) where the plan has a gated skip
  for (const LayerSpec& l : plan.layers) gated_skips = l.gated_skip_source >= 0 ? 2 : gated_skips;
  using R = ParamRole;
  const ParamStack whole = ParamStack::kWhole, layers = ParamStack::kLayers;
  const ParamStack attention = ParamStack::kAttentionLayers, with_ve = ParamStack::kValueEmbeddingLayers;
  const ParamStack with_xsa = ParamStack::kXsaLayers, with_head_gates = ParamStack::kHeadGateLayers;
  ParamSpec t[kNumParamTensors] = {
      {"wte", Vp * C, whole, true, false, R::kEmbedding},
      {"wpe", positions * T * C, whole, true, false, R::kEmbedding},
      {"lnew", embedding_gain * C, whole, false, false, R::kVector},
      {"ln1w", gains * La * C, attention, false, false, R::kVector},
      {"ln1b", norm_bias * La * C, attention, false, false, R::kVector},
      {"qkvw", La * 3 * C * C, attention, true, false, R::kMatrix, Ci, Ci, 3},
      {"qkvb", bias * La * 3 * C, attention, false, false, R::kVector},
      {"attprojw", La * C * C, attention, true, true, R::kMatrix, Ci, Ci},
      {"attprojb", bias * La * C, attention, false, false, R::kVector},
      {"ln2w", gains * L * C, layers, false, false, R::kVector},
      {"ln2b", norm_bias * L * C, layers, false, false, R::kVector},
      {"fcw", L * 4 * C * C, layers, true, false, R::kMatrix, 4 * Ci, Ci},
      {"fcb", bias * L * 4 * C, layers, false, false, R::kVector},
      {"fcprojw", L * C * 4 * C, layers, true, true, R::kMatrix, Ci, 4 * Ci},
      {"fcprojb", bias * L * C, layers, false, false, R::kVector},
      {"lnfw", gains * C, whole, false, false, R::kVector},
      {"lnfb", norm_bias * C, whole, false, false, R::kVector},
      {"headw", head * Vp * C, whole, true, true, R::kHead},
      {"headb", head * bias * Vp, whole, false, false, R::kVector},
      {"ve", ve * Vp * C, whole, true, false, R::kEmbedding},
      {"bigram", bigram * bigram_table_rows((int)Vp) * C, whole, true, false, R::kEmbedding},
      {"attngate", gate * La * NH * (C / kGateDivisor), attention, true, false, R::kMatrix, (int)NH,
       Ci / kGateDivisor},
      {"skipw", skips, whole, false, false, R::kVector},
      {"lambdas", L * lambdas, layers, false, false, R::kVector},
      {"value_scales", La * value_scales, attention, false, false, R::kVector},
      {"smearw", smear * kSmearWidth, whole, false, false, R::kVector},
      {"smear_lambda", smear, whole, false, false, R::kVector},
      {"bigram_gates", bigram * La, attention, false, false, R::kVector},
      {"vegate", ve_gates * Lve * NH * kVeGateWidth, with_ve, false, false, R::kVector},
      {"resid_lambdas", L * sublayer_lambdas, layers, false, false, R::kVector},
      {"post_lambdas", L * sublayer_lambdas, layers, false, false, R::kVector},
      {"xsa_alpha", xsa * Lx * NH, with_xsa, false, false, R::kVector},
      {"x0_gates", x0_gates * La, attention, false, false, R::kVector},
      {"skip_gate", gated_skips, whole, false, false, R::kVector},
      {"head_gates", plan.head_gate_layers * NH, with_head_gates, false, false, R::kVector},
      {"attn_lambdas", L * attn_lambdas, layers, false, false, R::kVector},
      {"mudd_gate_w1", mudd * 2 * kMuddGateHidden * C, whole, false, false, R::kVector},
      {"mudd_gate_w2", mudd * 2 * kMuddGateWidth * kMuddGateHidden, whole, false, false, R::kVector},
      {"mudd_gate_b2", mudd * 2 * kMuddGateWidth, whole, false, false, R::kVector},
      {"mudd_gate_scale", mudd, whole, false, false, R::kVector},
      {"mudd_w1", connections * 2 * kMuddConnectionHidden * C, whole, false, false, R::kVector},
      {"mudd_w2", connections * 2 * kMuddLayerCoefficients * kMuddConnectionHidden, whole, false, false,
       R::kVector},
      {"mudd_b2", connections * 2 * kMuddLayerCoefficients, whole, false, false, R::kVector},
  };
  for (int i = 0; i < kNumParamTensors; i++) table[i] = t[i];
}

// The layers a tensor is stacked over (ParamStack): L, the attention layers, those with a value
// embedding, those with XSA, or 1 (kWhole).
inline int param_layers(const LayerPlan& plan, const ParamSpec& s) {
  switch (s.stack) {
    case ParamStack::kWhole: return 1;
    case ParamStack::kAttentionLayers: return plan.attention_layers;
    case ParamStack::kValueEmbeddingLayers: return plan.value_embedding_layers;
    case ParamStack::kXsaLayers: return plan.xsa_layers;
    case ParamStack::kHeadGateLayers: return plan.head_gate_layers;
    case ParamStack::kLayers: break;
  }
  return plan.size();
}

// Elements of one layer's slab (kWhole: the tensor).
inline size_t param_slab_size(const LayerPlan& plan, const ParamSpec& s) {
  return s.size / param_layers(plan, s);
}

// Which slab of tensor s layer `layer` reads: its position among the layers s is stacked over; 0
// for a tensor of kWhole (any layer); -1 where the layer has none (an attention tensor in a layer
// without attention, a value-embedding gate in a layer without a value embedding, an XSA strength in
// a layer without XSA).
inline int param_slab(const LayerPlan& plan, const ParamSpec& s, int layer) {
  switch (s.stack) {
    case ParamStack::kWhole: return 0;
    case ParamStack::kAttentionLayers: return plan[layer].attention_slab;
    case ParamStack::kValueEmbeddingLayers: return plan[layer].value_embedding_slab;
    case ParamStack::kXsaLayers: return plan[layer].xsa_slab;
    case ParamStack::kHeadGateLayers: return plan[layer].head_gate_slab;
    case ParamStack::kLayers: break;
  }
  return layer;
}

// The stochastic rounding seeds of AdamW's tensors and Muon's groups take an index each, fixed when
// the table held kSeededTensors tensors (GPT-2's and the modern ones), so that those runs keep
// their bits: tensor i rounds with seed + 0x9e3779b9 * (param_seed_index(i) + 1), Muon's group g
// (a matrix shape; a handful) with index kSeededTensors + g, and the speedrun's tensors take
// indices after kMaxMuonGroups of those.
constexpr int kSeededTensors = 19;
constexpr int kMaxMuonGroups = 16;

// The speedrun's tensors in the order they joined the table, which gives their seeds: a tensor
// placed elsewhere in the table (the bigram table, for its alignment) keeps its seed.
constexpr ParamIndex kSpeedrunSeedOrder[kNumParamTensors - kSeededTensors] = {
    kVe, kAttngate, kSkipw, kLambdas, kValueScales, kSmearw, kSmearLambda, kBigram, kBigramGates, kVegate,
    kResidLambdas, kPostLambdas, kXsaAlpha, kX0Gates, kSkipGate, kHeadGates, kAttnLambdas,
    kMuddGateW1, kMuddGateW2, kMuddGateB2, kMuddGateScale, kMuddW1, kMuddW2, kMuddB2};

// The tensor's position in llm.c's GPT-2 table, the modern tensors after it, the speedrun's after
// Muon's groups: what seeds a tensor's stochastic rounding, so that GPT-2's seeds stay those of its
// 16-tensor table.
inline int param_seed_index(int i) {
  if (i == kLnew) return kSeededTensors - 1;
  if (i < kSeededTensors) return i > kLnew ? i - 1 : i;
  const ParamIndex* order = std::find(std::begin(kSpeedrunSeedOrder), std::end(kSpeedrunSeedOrder), i);
  if (order == std::end(kSpeedrunSeedOrder)) LLMC_FAIL("tensor %d has no rounding seed", i);
  return kSeededTensors + kMaxMuonGroups + (int)(order - std::begin(kSpeedrunSeedOrder));
}

inline int muon_group_seed_index(size_t g) {
  if (g >= (size_t)kMaxMuonGroups) {
    LLMC_FAIL("Muon: matrix group %zu, but the rounding seeds leave room for %d groups", g, kMaxMuonGroups);
  }
  return kSeededTensors + (int)g;
}

inline size_t num_parameters(const GPT2Config& c) {
  ParamSpec t[kNumParamTensors];
  param_table(c, t);
  size_t n = 0;
  for (int i = 0; i < kNumParamTensors; i++) n += t[i].size;
  return n;
}

// Offsets of each tensor in the flat parameter buffer (elements).
inline void param_offsets(const GPT2Config& c, size_t offsets[kNumParamTensors]) {
  ParamSpec t[kNumParamTensors];
  param_table(c, t);
  size_t o = 0;
  for (int i = 0; i < kNumParamTensors; i++) {
    offsets[i] = o;
    o += t[i].size;
  }
}

// ----------------------------------------------------------------------------
// File headers

// A file's version from its architecture and precision (kCheckpointVersionFP32 or BF16), and back.
inline int checkpoint_file_version(const GPT2Config& c, int precision) {
  if (c.arch == Arch::kGpt2) return precision;
  return precision == kCheckpointVersionBF16 ? kCheckpointVersionModernBF16 : kCheckpointVersionModernFP32;
}

inline int checkpoint_precision(int file_version) {
  return file_version == kCheckpointVersionBF16 || file_version == kCheckpointVersionModernBF16
             ? kCheckpointVersionBF16
             : kCheckpointVersionFP32;
}

// The config a checkpoint header describes, from its version on (the magic and the checksum are
// checked before); an impossible one names the file.
inline GPT2Config config_from_header(const int* h, const std::string& path) {
  const bool gpt2 = h[1] == kCheckpointVersionFP32 || h[1] == kCheckpointVersionBF16;
  const bool modern = h[1] == kCheckpointVersionModernFP32 || h[1] == kCheckpointVersionModernBF16;
  if (!gpt2 && !modern) {
    LLMC_FAIL("%s: unsupported checkpoint version %d (expected %d or %d for GPT-2 in FP32 or BF16, "
              "%d or %d for the modern and speedrun architectures)", path.c_str(), h[1], kCheckpointVersionFP32,
              kCheckpointVersionBF16, kCheckpointVersionModernFP32, kCheckpointVersionModernBF16);
  }
  const bool later_arch = h[8] == (int)Arch::kModern || h[8] == (int)Arch::kSpeedrun;
  if (modern && !later_arch) {
    LLMC_FAIL("%s: version %d names the modern or speedrun architecture but the header's architecture "
              "is %d (expected %d or %d): the header is damaged; re-create the file", path.c_str(), h[1],
              h[8], (int)Arch::kModern, (int)Arch::kSpeedrun);
  }
  GPT2Config c;
  try {
    c = make_config(h[4], h[5], h[6], h[2], h[3], modern ? (Arch)h[8] : Arch::kGpt2);
  } catch (const Error& e) {
    LLMC_FAIL("%s: %s: the header is damaged; re-create the file", path.c_str(), e.what());
  }
  if (h[7] != c.padded_vocab_size) {
    LLMC_FAIL("%s: padded vocab size %d does not match vocab %d padded to a multiple of %d (%d)",
              path.c_str(), h[7], h[3], kVocabPadMultiple, c.padded_vocab_size);
  }
  const int features = h[kFeaturesSlot];
  const int speedrun_only =
      kFeatureSmear | kFeatureBigram | kFeatureVeGates | kFeatureResidLambdas | kFeatureXsa | kFeatureRecord89Plan |
      kFeaturePairedHeads | kFeatureAttnLambdas | kFeatureMuddGates | kFeatureMuddConnections |
      kFeatureComposedAttention;
  if ((features & ~(speedrun_only | kFeatureRotaryPairs)) != 0 || ((features & speedrun_only) && !c.speedrun()) ||
      ((features & kFeatureRotaryPairs) && c.arch == Arch::kGpt2)) {
    LLMC_FAIL("%s: header slot %d holds features %d, but only the speedrun has any but the rotary pairs (%d: the "
              "smear, %d: the bigram embedding, %d: the value-embedding gates, %d: the residual lambdas, %d: XSA, "
              "%d: record #89's plan, %d: its paired heads, %d: its attention lambdas, %d: its MUDD gate "
              "generators, %d: its MUDD dense connections, %d: its composed attention), and GPT-2 has no rotary "
              "(%d: its pairs): the header is damaged or the file comes from a newer version; re-create it",
              path.c_str(), kFeaturesSlot, features, kFeatureSmear, kFeatureBigram, kFeatureVeGates,
              kFeatureResidLambdas, kFeatureXsa, kFeatureRecord89Plan, kFeaturePairedHeads, kFeatureAttnLambdas,
              kFeatureMuddGates, kFeatureMuddConnections, kFeatureComposedAttention, kFeatureRotaryPairs);
  }
  c.smear = (features & kFeatureSmear) != 0;
  c.bigram = (features & kFeatureBigram) != 0;
  c.rotary_pairs = (features & kFeatureRotaryPairs) != 0;
  c.ve_gates = (features & kFeatureVeGates) != 0;
  c.resid_lambdas = (features & kFeatureResidLambdas) != 0;
  c.xsa = (features & kFeatureXsa) != 0;
  c.record89_plan = (features & kFeatureRecord89Plan) != 0;
  if (c.speedrun() && c.num_layers != speedrun_layers(c.record89_plan)) {
    LLMC_FAIL("%s: a speedrun model of %d layers %s record #89's plan (header slot %d's bit %d), whose depth is %d: "
              "the header is damaged; re-create the file", path.c_str(), c.num_layers,
              c.record89_plan ? "with" : "without", kFeaturesSlot, kFeatureRecord89Plan,
              speedrun_layers(c.record89_plan));
  }
  c.paired_heads = (features & kFeaturePairedHeads) != 0;
  c.attn_lambdas = (features & kFeatureAttnLambdas) != 0;
  if (const char* missing = paired_heads_missing(c)) {
    LLMC_FAIL("%s: header slot %d's bit %d gives the model record #89's paired heads, which need %s: the header is "
              "damaged; re-create the file", path.c_str(), kFeaturesSlot, kFeaturePairedHeads, missing);
  }
  c.mudd_gates = (features & kFeatureMuddGates) != 0;
  if (const char* missing = mudd_gates_missing(c)) {
    LLMC_FAIL("%s: header slot %d's bit %d gives the model record #89's MUDD gate generators, which need %s: the "
              "header is damaged; re-create the file", path.c_str(), kFeaturesSlot, kFeatureMuddGates, missing);
  }
  c.mudd_connections = (features & kFeatureMuddConnections) != 0;
  if (const char* missing = mudd_connections_missing(c)) {
    LLMC_FAIL("%s: header slot %d's bit %d gives the model record #89's MUDD dense connections, which need %s: "
              "the header is damaged; re-create the file", path.c_str(), kFeaturesSlot, kFeatureMuddConnections,
              missing);
  }
  c.composed_attention = (features & kFeatureComposedAttention) != 0;
  if (const char* missing = composed_attention_missing(c)) {
    LLMC_FAIL("%s: header slot %d's bit %d gives the model record #89's composed attention, which needs %s: the "
              "header is damaged; re-create the file", path.c_str(), kFeaturesSlot, kFeatureComposedAttention,
              missing);
  }
  return c;
}

// version: the precision, kCheckpointVersionFP32 or BF16 (the file's version follows c.arch).
inline void header_from_config(const GPT2Config& c, int version, int h[kHeaderInts]) {
  memset(h, 0, kHeaderInts * sizeof(int));
  h[0] = kCheckpointMagic;
  h[1] = checkpoint_file_version(c, version);
  h[2] = c.max_seq_len;
  h[3] = c.vocab_size;
  h[4] = c.num_layers;
  h[5] = c.num_heads;
  h[6] = c.channels;
  h[7] = c.padded_vocab_size;
  h[8] = (int)c.arch;
  h[kFeaturesSlot] = (c.smear ? kFeatureSmear : 0) | (c.bigram ? kFeatureBigram : 0) |
                     (c.rotary_pairs ? kFeatureRotaryPairs : 0) | (c.ve_gates ? kFeatureVeGates : 0) |
                     (c.resid_lambdas ? kFeatureResidLambdas : 0) | (c.xsa ? kFeatureXsa : 0) |
                     (c.record89_plan ? kFeatureRecord89Plan : 0) | (c.paired_heads ? kFeaturePairedHeads : 0) |
                     (c.attn_lambdas ? kFeatureAttnLambdas : 0) | (c.mudd_gates ? kFeatureMuddGates : 0) |
                     (c.mudd_connections ? kFeatureMuddConnections : 0) |
                     (c.composed_attention ? kFeatureComposedAttention : 0);
}

// Fails unless h (as read from path) starts with a checkpoint's magic. It comes first: in a file
// of another kind the checksum slots mean nothing.
inline void checkpoint_check_magic(const int h[kHeaderInts], const std::string& path) {
  if (h[0] != kCheckpointMagic) {
    LLMC_FAIL("%s: not a GPT-2 checkpoint (magic %d, expected %d)", path.c_str(), h[0],
              kCheckpointMagic);
  }
}

// The config of a checkpoint's header h (its checksum verified, where it has one), checked to
// describe exactly the parameters of a file of file_bytes bytes.
inline GPT2Config checkpoint_config_for_file(const int h[kHeaderInts], const std::string& path,
                                             long file_bytes) {
  GPT2Config c = config_from_header(h, path);
  size_t elem = checkpoint_precision(h[1]) == kCheckpointVersionFP32 ? 4 : 2;
  long expected = (long)(kHeaderInts * sizeof(int) + num_parameters(c) * elem);
  if (file_bytes != expected) {
    LLMC_FAIL("%s: checkpoint for %s should be %ld bytes but is %ld (%s); re-create it",
              path.c_str(), c.describe().c_str(), expected, file_bytes,
              file_bytes < expected ? "truncated" : "trailing data");
  }
  return c;
}

constexpr const char* kCheckpointRemedy = "re-create it, or use an earlier checkpoint";

// Reads the header of a checkpoint into h, verifies the file's checksum when it has one, and
// checks that the file holds exactly the parameters the header describes. The magic comes first,
// then the checksum, and only then the config: a damaged header is reported as a damaged file, by
// name, not as the odd model config it seems to describe. Leaves the file positioned at the first
// parameter.
inline GPT2Config checkpoint_read_header(File& f, int h[kHeaderInts]) {
  f.read(h, kHeaderInts * sizeof(int), "the checkpoint header");
  checkpoint_check_magic(h, f.path());
  if (header_has_checksum(h, f.path())) header_verify_file_checksum(f, h, kCheckpointRemedy);
  return checkpoint_config_for_file(h, f.path(), f.size());
}

// A checkpoint's parameters as its file stores them (checkpoint_read).
struct CheckpointParams {
  GPT2Config config;
  int version = 0;                   // the precision: kCheckpointVersionFP32 or BF16
  std::vector<float> fp32;           // FP32: the values
  std::unique_ptr<uint16_t[]> bf16;  // BF16: the bit patterns, num_parameters(config)
};

// Reads a checkpoint's parameters as stored, in one pass over the file: the checksum is computed
// over the bytes as read (checkpoint_read_header verifies it in a pass of its own, before the
// parameters are read), and verified, as there, before anything else in the header is trusted.
// The BF16 bits are not zero-filled before the read (3.1 GB at d48).
inline CheckpointParams checkpoint_read(const std::string& path) {
  File f(path, "rb");
  int h[kHeaderInts];
  f.read(h, sizeof(h), "the checkpoint header");
  checkpoint_check_magic(h, f.path());
  const bool checksummed = header_has_checksum(h, f.path());
  const long file_bytes = f.size();
  const size_t bytes = (size_t)std::max(0L, file_bytes - (long)sizeof(h));
  CheckpointParams p;
  void* dst = nullptr;
  if (checkpoint_precision(h[1]) == kCheckpointVersionFP32) {
    p.fp32.resize((bytes + sizeof(float) - 1) / sizeof(float));
    dst = p.fp32.data();
  } else {
    p.bf16.reset(new uint16_t[bytes / sizeof(uint16_t) + 1]);
    dst = p.bf16.get();
  }
  f.read(dst, bytes, "the checkpoint's parameters");
  if (checksummed) {
    header_verify_checksum(h, crc32_update(header_checksum_start(h), dst, bytes), f.path(),
                           kCheckpointRemedy);
  }
  p.config = checkpoint_config_for_file(h, f.path(), file_bytes);
  p.version = checkpoint_precision(h[1]);
  return p;
}


// The parameters checkpoint_read read, as FP32 values: moved out of p where they are FP32, else
// converted from its BF16 bits, which are then freed (p keeps its config and version only).
inline std::vector<float> checkpoint_values(CheckpointParams&& p) {
  std::vector<float> values;
  if (p.version == kCheckpointVersionFP32) {
    values.swap(p.fp32);
    return values;
  }
  const size_t n = num_parameters(p.config);
  values.resize(n);
  const uint16_t* bits = p.bf16.get();
#pragma omp parallel for num_threads(host_pass_threads()) schedule(static)
  for (long i = 0; i < (long)n; i++) values[i] = bf16_bits_to_float(bits[i]);
  p.bf16.reset();
  return values;
}

// Loads a checkpoint of either precision into FP32 values, verifying its checksum when it has one.
inline GPT2Config checkpoint_load(const std::string& path, std::vector<float>* params) {
  CheckpointParams p = checkpoint_read(path);
  *params = checkpoint_values(std::move(p));
  return p.config;
}

// config_from_preset's names, for messages.
constexpr const char* kPresetNames = "d12 d24 d36 d48 tiny";

// Fails unless -e's `model`, which is no preset, names a model file, saying what -e takes;
// `resume_with`, the flags that resume a run from its folder (nullptr where the program cannot),
// is offered for a folder.
inline void require_model_file(const std::string& model, const char* resume_with) {
  const char* path = model.c_str();
  const std::string takes = strformat("-e takes a model file or a preset (%s)", kPresetNames);
  switch (path_kind(model)) {
    case PathKind::kFile: return;
    case PathKind::kMissing:
      LLMC_FAIL("-e %s: no such checkpoint file, and not a preset: %s", path, takes.c_str());
    case PathKind::kOther: LLMC_FAIL("-e %s is not a regular file: %s", path, takes.c_str());
    case PathKind::kDirectory: {
      const std::string resume =
          resume_with ? strformat("; to resume the run in that folder: -o %s %s", path, resume_with)
                      : std::string();
      LLMC_FAIL("-e %s is a folder: %s%s", path, takes.c_str(), resume.c_str());
    }
  }
}

// Writes a checkpoint whose parameters are in the file's precision already: version 3 takes the
// FP32 values, version 5 their BF16 bit patterns (the file says 6 or 7 for the modern
// architecture). With a checksum, through write_file_atomically (never a truncated checkpoint
// under its name).
inline void checkpoint_save_payload(const std::string& path, const GPT2Config& c, int version,
                                    const void* payload) {
  int h[kHeaderInts];
  header_from_config(c, version, h);
  const bool bf16 = version == kCheckpointVersionBF16;
  const size_t payload_bytes = num_parameters(c) * (bf16 ? sizeof(uint16_t) : sizeof(float));
  header_store_checksum(h, crc32_update(header_checksum_begin(h), payload, payload_bytes));
  write_file_atomically(path, [&](File& f) {
    f.write(h, sizeof(h), "the checkpoint header");
    f.write(payload, payload_bytes, bf16 ? "the BF16 parameters" : "the FP32 parameters");
  });
}

// Writes a checkpoint from FP32 values as version 3 (FP32) or 5 (BF16, rounded to nearest even),
// 6 or 7 for the modern architecture.
inline void checkpoint_save(const std::string& path, const GPT2Config& c, const float* params,
                            int version) {
  if (version != kCheckpointVersionBF16) {
    checkpoint_save_payload(path, c, version, params);
    return;
  }
  std::vector<uint16_t> bits(num_parameters(c));
#pragma omp parallel for num_threads(host_pass_threads()) schedule(static)
  for (long i = 0; i < (long)bits.size(); i++) bits[i] = float_to_bf16_bits(params[i]);
  checkpoint_save_payload(path, c, version, bits.data());
}

// ----------------------------------------------------------------------------
// Debug state (see the top of this file): one batch and PyTorch's answers for it.

struct DebugState {
  int B = 0, T = 0, steps = 0, vocab_size = 0;
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_clip = 0;
  // Version 4: Muon for the blocks' matrices, the gradients of the summed loss, and the AdamW
  // learning rates by role (version 3: AdamW alone, mean loss, lr for every tensor).
  bool muon = false, loss_sum = false;
  float muon_lr = 0, muon_weight_decay = 0, muon_momentum = 0;
  float lr_embedding = 0, lr_head = 0, lr_vector = 0;
  // Version 4: attention within documents, in a window of window_blocks (0: none).
  bool documents = false;
  int window_blocks = 0;
  // Version 4 with Muon: Newton-Schulz's steps of X <- a X + (b A + c A A) X; the momentum,
  // muon_momentum_start at step 0 rising linearly to muon_momentum over muon_momentum_warmup
  // steps. AdamW's eps before the bias correction (the speedrun's) or after it.
  int newton_schulz_steps = 0;
  float newton_schulz_a = 0, newton_schulz_b = 0, newton_schulz_c = 0;
  int newton_schulz_row = 0;  // 1 + the row of kNewtonSchulzMethods (0: the one polynomial above)
  float muon_momentum_start = 0;
  int muon_momentum_warmup = 0;
  bool eps_before_correction = false;
  bool fp8_head = false;  // version 4: the head's training products in FP8 (--fp8_head 1)
  std::string stages;     // version 4: the steps' stage plan (empty: none)
  // Version 5: the settings as train_gpt2cu's flags -lc, -mtp, -pw and -ut ("-lc 23.0,5.0 -mtp
  // 1.0,0.5,0.25 -pw 0.25 -ut 4"), after the header: their length in bytes, the text padded to 4-byte
  // words, then the prefix table's rows (0 where no -pw or pw= weights the prefix term) and its ids.
  std::string settings;
  std::vector<int> prefix_table;
  std::vector<int> inputs, targets;
  std::vector<float> logits;  // B*T*vocab_size
  float loss = 0;
  std::vector<float> grads;   // num_parameters(config), table order
  // Version 6: the same batch's gradients with every weight rounded to BF16, of the tensors of at most
  // kDebugStateBf16WeightsMaxSize entries (debug_state_bf16_weights_size) in table order, one after
  // another: how far BF16's rounding of the weights alone moves each (empty before version 6).
  std::vector<float> grads_at_bf16_weights;
  std::vector<float> losses;  // steps
};

inline float float_from_bits(int bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// A version-4 header's Newton-Schulz, momentum warmup and eps placement ([23..29]) into d, whose
// Muon settings ([13], [17]) are read already.
inline void debug_state_read_optimizer(const int h[kHeaderInts], const std::string& path, DebugState* d) {
  if (h[23] < 0 || h[28] < 0 || h[29] < 0 || h[29] > 1 || (!d->muon && (h[23] != 0 || h[28] != 0))) {
    LLMC_FAIL("%s: Newton-Schulz steps %d, momentum warmup %d and eps placement %d in the header (steps "
              "and warmup 0 or more, with Muon only; placement 0 or 1): the header is damaged; re-create "
              "it with train_gpt2.py", path.c_str(), h[23], h[28], h[29]);
  }
  d->eps_before_correction = h[29] == 1;
  if (!d->muon) return;
  if (h[23] == 0) {  // written before these slots: the baseline's Newton-Schulz, a constant momentum
    d->newton_schulz_steps = 12;
    d->newton_schulz_a = 2.0f, d->newton_schulz_b = -1.5f, d->newton_schulz_c = 0.5f;
    d->muon_momentum_start = d->muon_momentum;
    return;
  }
  d->newton_schulz_steps = h[23];
  d->newton_schulz_a = float_from_bits(h[24]);
  d->newton_schulz_b = float_from_bits(h[25]);
  d->newton_schulz_c = float_from_bits(h[26]);
  d->muon_momentum_start = float_from_bits(h[27]);
  d->muon_momentum_warmup = h[28];
}

// The header slot of Muon's orthogonalisation, and the longest stage plan that leaves it free.
constexpr int kDebugStateNewtonSchulzSlot = 253;
constexpr int kDebugStateStagesBytes = (kDebugStateNewtonSchulzSlot - 32) * 4;

// A version-4 header's orthogonalisation row ([253]) where its stage plan leaves that slot free,
// 0 or more, and 0 without Muon (llmc/recipe.h's debug_state_newton_schulz checks it against its
// table).
inline int debug_state_read_newton_schulz_row(const int h[kHeaderInts], const std::string& path, bool muon) {
  if (h[31] > kDebugStateStagesBytes) return 0;  // written before the slot: the plan's text
  const int row = h[kDebugStateNewtonSchulzSlot];
  if (row < 0 || (!muon && row != 0)) {
    LLMC_FAIL("%s: Muon's orthogonalisation %d in the header (0 or more, with Muon only): the header is "
              "damaged; re-create it with train_gpt2.py", path.c_str(), row);
  }
  return row;
}

// A version-4 header's stage plan ([31..252]; files written before [253] may fill it too).
inline std::string debug_state_read_stages(const int h[kHeaderInts], const std::string& path) {
  constexpr int kFirst = 32, kLast = 253;
  const int bytes = h[31];
  if (bytes < 0 || bytes > (kLast - kFirst + 1) * 4) {
    LLMC_FAIL("%s: a stage plan of %d bytes in the header (0 to %d): the header is damaged; re-create it with "
              "train_gpt2.py", path.c_str(), bytes, (kLast - kFirst + 1) * 4);
  }
  std::string text(bytes, '\0');
  for (int i = 0; i < bytes; i++) text[i] = (char)(((uint32_t)h[kFirst + i / 4] >> (8 * (i % 4))) & 0xff);
  return text;
}

// A version-5 debug state's settings and prefix table (padded_vocab_size rows, or none), read from
// after the header into d.
inline void debug_state_read_settings(File& f, const std::string& path, const GPT2Config& c, DebugState* d) {
  int bytes = 0, rows = 0;
  f.read(&bytes, sizeof(int), "the settings' length");
  if (bytes < 0 || bytes > kDebugStateSettingsMaxBytes) {
    LLMC_FAIL("%s: settings of %d bytes (0 to %d): the file is damaged; re-create it with train_gpt2.py",
              path.c_str(), bytes, kDebugStateSettingsMaxBytes);
  }
  std::vector<char> text((bytes + 3) / 4 * 4);
  f.read(text.data(), text.size(), "the settings");
  d->settings.assign(text.data(), bytes);
  f.read(&rows, sizeof(int), "the prefix table's rows");
  if (rows != 0 && rows != c.padded_vocab_size) {
    LLMC_FAIL("%s: a prefix table of %d rows for the model's %d (or none): the file is damaged; re-create it "
              "with train_gpt2.py", path.c_str(), rows, c.padded_vocab_size);
  }
  d->prefix_table.resize(rows);
  f.read(d->prefix_table.data(), rows * sizeof(int), "the prefix table");
}

// The values of a version-6 debug state's gradients at the BF16 weights: the sizes of c's tensors of
// at most kDebugStateBf16WeightsMaxSize entries.
inline size_t debug_state_bf16_weights_size(const GPT2Config& c) {
  ParamSpec table[kNumParamTensors];
  param_table(c, table);
  size_t n = 0;
  for (const ParamSpec& s : table) n += s.size <= kDebugStateBf16WeightsMaxSize ? s.size : 0;
  return n;
}

inline DebugState debug_state_load(const std::string& path, const GPT2Config& c) {
  File f(path, "rb");
  int h[kHeaderInts];
  f.read(h, sizeof(h), "the debug-state header");
  if (h[0] != kDebugStateMagic) {
    LLMC_FAIL("%s: not a debug-state file (magic %d, expected %d)", path.c_str(), h[0],
              kDebugStateMagic);
  }
  if (h[1] < kDebugStateVersion || h[1] > kDebugStateVersionBf16Weights) {
    LLMC_FAIL("%s: debug-state version %d, expected %d to %d: re-create it with train_gpt2.py",
              path.c_str(), h[1], kDebugStateVersion, kDebugStateVersionBf16Weights);
  }
  const bool recipe_header = h[1] != kDebugStateVersion;
  const int arch = recipe_header ? h[12] : 0;
  if (arch != (int)c.arch) {
    LLMC_FAIL("%s: a debug state of architecture %d, but the model is %s: pass the model file "
              "written beside it", path.c_str(), arch, arch_spec(c.arch).name);
  }
  DebugState d;
  d.B = h[2];
  d.T = h[3];
  d.steps = h[4];
  d.vocab_size = h[5];
  d.lr = float_from_bits(h[6]);
  d.beta1 = float_from_bits(h[7]);
  d.beta2 = float_from_bits(h[8]);
  d.eps = float_from_bits(h[9]);
  d.weight_decay = float_from_bits(h[10]);
  d.grad_clip = float_from_bits(h[11]);
  d.lr_embedding = d.lr_head = d.lr_vector = d.lr;
  if (recipe_header) {
    d.muon = h[13] == 1;
    d.loss_sum = h[14] == 1;
    d.muon_lr = float_from_bits(h[15]);
    d.muon_weight_decay = float_from_bits(h[16]);
    d.muon_momentum = float_from_bits(h[17]);
    d.lr_embedding = float_from_bits(h[18]);
    d.lr_head = float_from_bits(h[19]);
    d.lr_vector = float_from_bits(h[20]);
    if (h[21] < 0 || h[21] > 1 || h[22] < 0 || (h[21] == 0 && h[22] != 0)) {
      LLMC_FAIL("%s: documents %d and window %d in the header (documents 0 or 1, a window of 0 or more "
                "blocks with documents only): the header is damaged; re-create it with train_gpt2.py",
                path.c_str(), h[21], h[22]);
    }
    d.documents = h[21] == 1;
    d.window_blocks = h[22];
    debug_state_read_optimizer(h, path, &d);
    if (h[30] < 0 || h[30] > 1) {
      LLMC_FAIL("%s: FP8 head %d in the header (0 or 1): the header is damaged; re-create it with train_gpt2.py",
                path.c_str(), h[30]);
    }
    d.fp8_head = h[30] == 1;
    d.stages = debug_state_read_stages(h, path);
    d.newton_schulz_row = debug_state_read_newton_schulz_row(h, path, d.muon);
  }
  if (d.B <= 0 || d.T <= 0 || d.T > c.max_seq_len || d.steps < 0 || d.vocab_size != c.vocab_size) {
    LLMC_FAIL("%s: debug state (B=%d T=%d steps=%d V=%d) does not fit the model %s", path.c_str(),
              d.B, d.T, d.steps, d.vocab_size, c.describe().c_str());
  }
  // The body's size follows from the header; it is checked against the file before anything is
  // allocated, so that a damaged B, T or step count fails here instead of asking for absurd
  // amounts of memory. B*T is compared by division first so that the product cannot overflow.
  if (h[1] >= kDebugStateVersionSettings) debug_state_read_settings(f, path, c, &d);
  const size_t at_bf16_weights = h[1] == kDebugStateVersionBf16Weights ? debug_state_bf16_weights_size(c) : 0;
  const size_t body_bytes = (size_t)f.size() - (size_t)ftell(f.handle());
  const size_t body_floats = body_bytes / sizeof(float);
  const size_t BT = (size_t)d.B * d.T;
  const size_t floats_per_position = 2 + (size_t)d.vocab_size;  // input, target, logits
  const size_t needed_floats = BT <= body_floats / floats_per_position
                                   ? BT * floats_per_position + 1 + num_parameters(c) + at_bf16_weights + d.steps
                                   : SIZE_MAX;
  if (needed_floats > body_floats) {
    LLMC_FAIL("%s: file is truncated: reading the inputs, targets, logits, loss, gradients and "
              "step losses of B=%d T=%d V=%d and %d steps needs more than the %zu bytes after "
              "the header", path.c_str(), d.B, d.T, d.vocab_size, d.steps, body_bytes);
  }
  if (body_bytes != needed_floats * sizeof(float)) {
    LLMC_FAIL("%s: trailing data after the step losses: the file does not match its header",
              path.c_str());
  }
  d.inputs.resize(BT);
  d.targets.resize(BT);
  d.logits.resize(BT * d.vocab_size);
  d.grads.resize(num_parameters(c));
  d.grads_at_bf16_weights.resize(at_bf16_weights);
  d.losses.resize(d.steps);
  f.read(d.inputs.data(), BT * sizeof(int), "the inputs");
  f.read(d.targets.data(), BT * sizeof(int), "the targets");
  f.read(d.logits.data(), d.logits.size() * sizeof(float), "the logits");
  f.read(&d.loss, sizeof(float), "the loss");
  f.read(d.grads.data(), d.grads.size() * sizeof(float), "the gradients");
  f.read(d.grads_at_bf16_weights.data(), at_bf16_weights * sizeof(float), "the gradients at the BF16 weights");
  f.read(d.losses.data(), d.losses.size() * sizeof(float), "the step losses");
  return d;
}

// ----------------------------------------------------------------------------
// Initialisation from a seed (SPEC.md): the same values train_gpt2.py draws after
// torch.manual_seed(seed), in the same order.

// The modern architecture (train_gpt2.py init_modern_weights): every output projection and the
// head zero, the embedding N(0, 1) (padded rows zeroed), qkvw and fcw N(0, sqrt(0.33 / C)) one
// layer's slab per draw, biases zero, gains one.
inline void init_modern_from_seed(const GPT2Config& c, const ParamSpec* table, const size_t* offsets,
                                  Rng& rng, std::vector<float>& params) {
  const size_t L = c.num_layers, C = c.channels;
  for (int i : {kLnew, kLn1w, kLn2w, kLnfw}) std::fill_n(params.begin() + offsets[i], table[i].size, 1.0f);
  rng.normal(params.data() + offsets[kWte], table[kWte].size, 0.0, 1.0);
  std::fill(params.begin() + offsets[kWte] + (size_t)c.vocab_size * C,
            params.begin() + offsets[kWte] + table[kWte].size, 0.0f);
  const double std_in = std::sqrt(0.33 / (double)C);
  for (size_t layer = 0; layer < L; layer++) {
    for (int i : {kQkvw, kFcw}) {
      const size_t per_layer = table[i].size / L;
      rng.normal(params.data() + offsets[i] + layer * per_layer, per_layer, 0.0, std_in);
    }
  }
}

// The speedrun's inits from a seed (-ri, train_gpt2.py --record_init): record #28's, or record
// #89's (its head and value embeddings far smaller, its attention's output projection drawn).
enum class SpeedrunInit : int { kRecord28 = 0, kRecord89 = 89 };

// The speedrun (train_gpt2.py init_weights_speedrun, its reference's values): wte, then each value
// embedding, N(0, 1) with every row drawn (the loss reads the padded columns), then for each layer
// in turn qkvw (layers with attention) and fcw uniform in +-sqrt(3) * 0.5 / sqrt(C), one slab per
// draw; the output projections, the gates and the head zero, the skip weights one, each layer's
// lambdas (1, 0) and value scales 0.5; with record #89's embedding the smear and the bigram table
// zero, the bigram gates kBigramGateInit, its value-embedding gates' weights zero (each gate 1), its
// residual lambdas r sqrt(1.1) and p 1 (with either init), its XSA strengths zero, its attention lambdas
// (0.5, 1); with its plan its x0 gates zero, its skip gate's skip_lambda -1.5 and g 0.5, its head gates 0.25;
// with its MUDD gate generators their W1 uniform in +-1/sqrt(C) (one draw a generator, after every layer's),
// W2 zero, b2 mudd_gate_bias_init and the scale 0.1.
// Two MUDD generators' W1 (table index w1, where the model has them): a draw of each in +-1/sqrt(C)
// (kaiming_uniform_(a = sqrt(5))'s), in order; their b2 (index b2, width columns a generator) bias_init's.
inline void init_mudd_generators(const GPT2Config& c, const ParamSpec* table, const size_t* offsets, int w1, int b2,
                                 int width, float (*bias_init)(int, int), Rng& rng, std::vector<float>& params) {
  if (table[w1].size == 0) return;
  const double bound = 1.0 / std::sqrt((double)c.channels);
  const size_t generator = table[w1].size / 2;
  for (size_t g = 0; g < 2; g++) rng.uniform(params.data() + offsets[w1] + g * generator, generator, -bound, bound);
  for (int g = 0; g < 2; g++) {
    for (int k = 0; k < width; k++) params[offsets[b2] + g * width + k] = bias_init(g, k);
  }
}

// Record #89's init (SpeedrunInit::kRecord89) draws the head N(0, 0.005) in place of wte, which is
// its copy (tied at init; both [Vp, C]), each value embedding N(0, 0.01), and attprojw with qkvw and
// fcw, in that order in each layer; the rest as above.
inline void init_speedrun_from_seed(const GPT2Config& c, const ParamSpec* table, const size_t* offsets,
                                    Rng& rng, std::vector<float>& params, SpeedrunInit init) {
  const bool record89 = init == SpeedrunInit::kRecord89;
  std::fill_n(params.begin() + offsets[kSkipw], table[kSkipw].size, 1.0f);
  for (size_t k = 0; k < table[kLambdas].size; k += 2) params[offsets[kLambdas] + k] = 1.0f;
  std::fill_n(params.begin() + offsets[kValueScales], table[kValueScales].size, 0.5f);
  std::fill_n(params.begin() + offsets[kBigramGates], table[kBigramGates].size, kBigramGateInit);
  std::fill_n(params.begin() + offsets[kResidLambdas], table[kResidLambdas].size, kResidLambdaInit);
  std::fill_n(params.begin() + offsets[kPostLambdas], table[kPostLambdas].size, kPostLambdaInit);
  std::fill_n(params.begin() + offsets[kHeadGates], table[kHeadGates].size, kHeadGateInit);
  for (size_t k = 0; k < table[kAttnLambdas].size; k += 2) {
    params[offsets[kAttnLambdas] + k] = kAttnLambdaQkvInit;
    params[offsets[kAttnLambdas] + k + 1] = kAttnLambdaProjInit;
  }
  if (table[kSkipGate].size > 0) {
    params[offsets[kSkipGate]] = kSkipLambdaInit;
    params[offsets[kSkipGate] + 1] = kSkipGateInit;
  }
  const size_t embedding = table[kWte].size;
  if (record89) {
    rng.normal(params.data() + offsets[kHeadw], embedding, 0.0, 0.005);
    std::copy_n(params.begin() + offsets[kHeadw], embedding, params.begin() + offsets[kWte]);
  } else {
    rng.normal(params.data() + offsets[kWte], embedding, 0.0, 1.0);
  }
  for (size_t k = 0; k < table[kVe].size / embedding; k++) {
    rng.normal(params.data() + offsets[kVe] + k * embedding, embedding, 0.0, record89 ? 0.01 : 1.0);
  }
  const double bound = std::sqrt(3.0) * 0.5 / std::sqrt((double)c.channels);
  const LayerPlan plan = layer_plan(c);
  const std::vector<int> drawn = record89 ? std::vector<int>{kQkvw, kAttprojw, kFcw} : std::vector<int>{kQkvw, kFcw};
  for (int layer = 0; layer < c.num_layers; layer++) {
    for (int i : drawn) {
      const int slab = param_slab(plan, table[i], layer);
      if (slab < 0) continue;
      const size_t size = param_slab_size(plan, table[i]);
      rng.uniform(params.data() + offsets[i] + slab * size, size, -bound, bound);
    }
  }
  init_mudd_generators(c, table, offsets, kMuddGateW1, kMuddGateB2, kMuddGateWidth, mudd_gate_bias_init, rng, params);
  if (table[kMuddGateScale].size != 0) params[offsets[kMuddGateScale]] = kMuddGateScaleInit;
  // the dense connections' draws after the gate generators'
  init_mudd_generators(c, table, offsets, kMuddW1, kMuddB2, kMuddLayerCoefficients, mudd_connection_bias_init, rng,
                       params);
}

// init: the speedrun's (-ri); the other architectures have one init each.
inline std::vector<float> init_params_from_seed(const GPT2Config& c, uint64_t seed,
                                                SpeedrunInit init = SpeedrunInit::kRecord28) {
  ParamSpec table[kNumParamTensors];
  size_t offsets[kNumParamTensors];
  param_table(c, table);
  param_offsets(c, offsets);
  std::vector<float> params(num_parameters(c), 0.0f);
  Rng rng(seed);
  if (c.arch == Arch::kSpeedrun) {
    init_speedrun_from_seed(c, table, offsets, rng, params, init);
    return params;
  }
  if (c.arch == Arch::kModern) {
    init_modern_from_seed(c, table, offsets, rng, params);
    return params;
  }
  const size_t L = c.num_layers, C = c.channels;
  for (int layer = 0; layer < c.num_layers; layer++) {
    for (int i : {kLn1w, kLn2w}) {
      std::fill_n(params.begin() + offsets[i] + layer * C, C, 1.0f);
    }
  }
  std::fill_n(params.begin() + offsets[kLnfw], C, 1.0f);
  const double std_base = 0.02, std_residual = 0.02 / std::sqrt(2.0 * L);
  rng.normal(params.data() + offsets[kWte], table[kWte].size, 0.0, std_base);
  std::fill(params.begin() + offsets[kWte] + (size_t)c.vocab_size * C,
            params.begin() + offsets[kWte] + table[kWte].size, 0.0f);
  rng.normal(params.data() + offsets[kWpe], table[kWpe].size, 0.0, std_base);
  for (size_t layer = 0; layer < L; layer++) {
    for (int i : {kQkvw, kAttprojw, kFcw, kFcprojw}) {
      const size_t per_layer = table[i].size / L;
      rng.normal(params.data() + offsets[i] + layer * per_layer, per_layer, 0.0,
                 table[i].residual_projection ? std_residual : std_base);
    }
  }
  return params;
}

}  // namespace llmc
