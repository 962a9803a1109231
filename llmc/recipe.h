// Training recipes: GPT-2's (llm.c's settings); the modern one, modded-nanogpt's
// optimization-track baseline (records/track_3_optimization/train_gpt_simple.py): its
// architecture, Muon for the blocks' matrices and AdamW for the rest with a rate for each role,
// the sum of the token losses, no clipping, and a schedule stable for 30% of the steps, then
// linear to zero; and its speedrun record #28 (SPEC.md "The speedrun architecture and recipe"):
// the speedrun's architecture on document-aligned 49,152-token sequences in the window's schedule,
// Muon's 5 steepened Newton-Schulz steps with a momentum warmup, a schedule stable for 55% of
// the steps, then linear to 0.1 at step 1,695, and the head's training products in FP8; and its
// record #89 (recipe_record89). -recipe picks one;
// every flag given on the command line overrides its value.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "gpt2.h"
#include "schedulers.h"
#include "utils.h"

namespace llmc {

enum class OptimizerKind { kAdamW, kMuon };

inline const char* optimizer_name(OptimizerKind k) { return k == OptimizerKind::kMuon ? "muon" : "adamw"; }

// `flag` names the command-line flag the name came from.
inline OptimizerKind parse_optimizer(const std::string& name, const char* flag) {
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "muon") return OptimizerKind::kMuon;
  LLMC_FAIL("%s %s: unknown optimizer: use adamw, or muon (Muon for the blocks' matrices, AdamW for "
            "the rest)", flag, name.c_str());
}

// How an optimizer's weight decay falls on a weight p (-cd). Decoupled: on every weight, AdamW's
// p - lr (u + wd p), Muon's p (1 - lr wd) - lr u (u the step's direction). Cautious (record #89's):
// only where the step moves p towards zero, its direction and p of one sign, and times the rate
// twice: AdamW's p - u - [u p > 0] lr^2 wd p (u = lr x its direction), Muon's
// p - [u p >= 0] (wd lr) lr_eff p - lr u, lr_eff = lr x the matrix's shape scale (MuonParams).
enum class WeightDecayKind { kDecoupled, kCautious };

inline const char* weight_decay_name(WeightDecayKind k) {
  return k == WeightDecayKind::kCautious ? "cautious weight decay" : "weight decay";
}

// What of an AdamW tensor's step is rounded to nearest BF16 (BF16 builds): nothing; the weight
// (record #89's BF16 parameters, whose moments its reference keeps in FP32); or the weight and both
// moments (record #28's, whose reference's moments follow its BF16 parameters). -ar's key bf16.
enum class AdamBf16 { kNone, kWeight, kAll };

inline const char* adam_bf16_name(AdamBf16 b) {
  return b == AdamBf16::kWeight ? "weight" : b == AdamBf16::kAll ? "all" : "none";
}

// One step of Muon's orthogonalisation: X <- a X + B X, B = b A + c A A, A = X X^T.
struct NewtonSchulzStep {
  float a, b, c;
};

constexpr bool operator==(const NewtonSchulzStep& x, const NewtonSchulzStep& y) {
  return x.a == y.a && x.b == y.b && x.c == y.c;
}

constexpr int kNewtonSchulzMaxSteps = 12;

// Muon's orthogonalisation (train_gpt2.py's NEWTON_SCHULZ: the same rows in the same order, which
// the debug state's header names by place): X <- X / (norm_scale |X|_F + norm_eps) in BF16, then
// `steps` steps, step i of polynomial[i].
struct NewtonSchulz {
  const char* name;  // -ns's value
  int steps;
  NewtonSchulzStep polynomial[kNewtonSchulzMaxSteps];
  float norm_scale, norm_eps;
};

// `steps` steps of one polynomial after X / (|X|_F + 1e-7).
constexpr NewtonSchulz newton_schulz_repeated(const char* name, int steps, NewtonSchulzStep p) {
  NewtonSchulz ns = {name, steps, {}, 1.0f, 1e-7f};
  for (int i = 0; i < steps; i++) ns.polynomial[i] = p;
  return ns;
}

// The baseline's (modern.md); the speedrun's (record #28: fewer steps of a steeper polynomial,
// whose singular values end near 1 rather than at it); Polar Express (record #89: each step the
// polynomial best for the singular values the steps before leave, after a norm 2% larger, which
// keeps them inside the first polynomial's interval through BF16's rounding).
constexpr NewtonSchulz kNewtonSchulzMethods[] = {
    newton_schulz_repeated("baseline", 12, {2.0f, -1.5f, 0.5f}),
    newton_schulz_repeated("speedrun", 5, {3.4445f, -4.7750f, 2.0315f}),
    {"polar",
     5,
     {{8.156554524902461f, -22.48329292557795f, 15.878769915207462f},
      {4.042929935166739f, -2.808917465908714f, 0.5000178451051316f},
      {3.8916678022926607f, -2.772484153217685f, 0.5060648178503393f},
      {3.285753657755655f, -2.3681294933425376f, 0.46449024233003106f},
      {2.3465413258596377f, -1.7097828382687081f, 0.42323551169305323f}},
     1.02f,
     1e-6f},
};
constexpr int kNewtonSchulzMethodCount = sizeof(kNewtonSchulzMethods) / sizeof(kNewtonSchulzMethods[0]);
constexpr const NewtonSchulz& kNewtonSchulzBaseline = kNewtonSchulzMethods[0];
constexpr const NewtonSchulz& kNewtonSchulzSpeedrun = kNewtonSchulzMethods[1];
constexpr const NewtonSchulz& kNewtonSchulzPolar = kNewtonSchulzMethods[2];

// `flag` names the command-line flag the name came from.
inline const NewtonSchulz& parse_newton_schulz(const std::string& name, const char* flag) {
  for (const NewtonSchulz& ns : kNewtonSchulzMethods) {
    if (name == ns.name) return ns;
  }
  LLMC_FAIL("%s %s: unknown orthogonalisation: use baseline (12 Newton-Schulz steps of one polynomial), "
            "speedrun (record #28's 5 steps of a steeper one) or polar (record #89's Polar Express: 5 steps, "
            "each of its own polynomial)", flag, name.c_str());
}

// The orthogonalisation a debug state's steps ran (llmc/gpt2.h's header [23..26] and [253]): its row
// of kNewtonSchulzMethods, whose steps and first polynomial must be the header's; in files written
// before [253], the header's steps of its one polynomial from X / (|X|_F + 1e-7). `path` names the file.
inline NewtonSchulz debug_state_newton_schulz(const DebugState& d, const std::string& path) {
  const NewtonSchulzStep header = {d.newton_schulz_a, d.newton_schulz_b, d.newton_schulz_c};
  if (d.newton_schulz_row == 0) {
    if (d.newton_schulz_steps < 1 || d.newton_schulz_steps > kNewtonSchulzMaxSteps) {
      LLMC_FAIL("%s: %d Newton-Schulz steps in the header (1 to %d): the header is damaged; re-create it with "
                "train_gpt2.py", path.c_str(), d.newton_schulz_steps, kNewtonSchulzMaxSteps);
    }
    return newton_schulz_repeated("the debug state's", d.newton_schulz_steps, header);
  }
  const bool known = d.newton_schulz_row <= kNewtonSchulzMethodCount;
  const NewtonSchulz& ns = kNewtonSchulzMethods[known ? d.newton_schulz_row - 1 : 0];
  if (!known || ns.steps != d.newton_schulz_steps || !(ns.polynomial[0] == header)) {
    LLMC_FAIL("%s: Muon's orthogonalisation %d in the header, of %d steps from (%g, %g, %g), is not row %d of "
              "the %d here: train_gpt2.py's NEWTON_SCHULZ and llmc/recipe.h's rows "
              "differ, or the header is damaged; re-create it with this train_gpt2.py", path.c_str(),
              d.newton_schulz_row, d.newton_schulz_steps, header.a, header.b, header.c, d.newton_schulz_row,
              kNewtonSchulzMethodCount);
  }
  return ns;
}

// The training loss's weights of the targets after a position's next token (modded-nanogpt record
// #89's multi-token prediction): position t's cross-entropy against target t + k (k = 0 the next
// token) times weight[k], k < count, where t + k is inside t's sequence. Only the next token, weight
// 1: the plain loss.
constexpr int kMaxPredictedTokens = 3;
struct PredictionWeights {
  int count = 1;
  float weight[kMaxPredictedTokens] = {1.0f, 0.0f, 0.0f};
};

// -lc: the head's cap, the sigmoid cap's shift and its sigmoid in BF16, in place of the
// architecture's (cap 0: its own).
struct LogitCapSetting {
  float cap = 0.0f, shift = 0.0f;
  bool bf16_sigmoid = false;
};

inline std::string logit_cap_setting_text(const LogitCapSetting& s) {
  if (s.cap == 0.0f) return "the architecture's";
  if (s.bf16_sigmoid) return strformat("%g,%g,bf16", s.cap, s.shift);
  return s.shift == 0.0f ? strformat("%g", s.cap) : strformat("%g,%g", s.cap, s.shift);
}

// The architecture's cap with -lc's values in place of its own; `arch` names the architecture.
inline LogitCap logit_cap_of(const LogitCap& arch_cap, const LogitCapSetting& s, const char* arch) {
  if (s.cap == 0.0f) return arch_cap;
  const std::string text = logit_cap_setting_text(s);
  if (arch_cap.kind == LogitCap::kNone) {
    LLMC_FAIL("-lc %s: the %s architecture's logits are uncapped: leave -lc out", text.c_str(), arch);
  }
  if (arch_cap.kind == LogitCap::kRational && (s.shift != 0.0f || s.bf16_sigmoid)) {
    LLMC_FAIL("-lc %s: a shift and a BF16 sigmoid are the sigmoid cap's, and the %s architecture's cap is %s: give "
              "-lc %g", text.c_str(), arch, arch_cap.describe().c_str(), s.cap);
  }
  LogitCap cap = arch_cap;
  cap.cap = s.cap;
  cap.shift = s.shift;
  cap.bf16_sigmoid = s.bf16_sigmoid;
  return cap;
}

// NorMuon's (record #89's): Muon's orthogonalised update divided, entry by entry of the matrix's
// longer side, by the square root of a running mean of its squares (this beta2's), then scaled
// back to the norm it had.
constexpr double kNorMuonBeta2 = 0.9;
constexpr int kMaxAdamEvery = 1000;  // -ao's largest interval

// A multiplier for each parameter tensor (by ParamIndex), 1 for all.
using TensorMultipliers = std::array<float, kNumParamTensors>;
inline TensorMultipliers tensor_multipliers_one() {
  TensorMultipliers x;
  x.fill(1.0f);
  return x;
}

// One AdamW tensor's own hyperparameters (record #89's table, a row a tensor; -ar): its rate and
// weight decay as multipliers of its role's, or in place of them where rate and decay are set (a
// product in float is not always the reference's rate: record #89's embedding takes 0.008 where its
// role's is 0.6), its betas in place of the role's where set. The default row is the role's.
struct AdamTensorRow {
  float lr = 1.0f, weight_decay = 1.0f;
  std::optional<float> rate, decay;
  std::optional<float> beta1, beta2;
  std::optional<AdamBf16> bf16;  // in place of its role's

  bool operator==(const AdamTensorRow& o) const {
    return lr == o.lr && weight_decay == o.weight_decay && rate == o.rate && decay == o.decay && beta1 == o.beta1 &&
           beta2 == o.beta2 && bf16 == o.bf16;
  }
  bool operator!=(const AdamTensorRow& o) const { return !(*this == o); }
};
using AdamTensorRows = std::array<AdamTensorRow, kNumParamTensors>;  // by ParamIndex

inline std::string prediction_weights_text(const PredictionWeights& w) {
  std::string text;
  for (int k = 0; k < w.count; k++) text += strformat(k ? ",%g" : "%g", w.weight[k]);
  return text;
}

// The FP8 head's fixed scales (-fhs X,W,G), each a value over 448 (E4M3's largest): the input's
// x_s = X / 448 (0: sqrt(C) / 448, the bound of a weightless RMS norm's output), the weight's
// w_s = W / 448 and the output gradient's grad_s = G / 448. Record #28's: 0, 0.875 (w_s = 2^-9), 1;
// record #89's: 100, 1.6, 0.75 (both over the dlogits of a summed loss, Recipe::loss_sum).
struct Fp8HeadScales {
  double input = 0.0, weight = 0.875, grad = 1.0;
  bool operator==(const Fp8HeadScales& o) const {
    return input == o.input && weight == o.weight && grad == o.grad;
  }
};

// A run's settings, the record that a recipe fills and the command line's flags then write: GPT-2's
// where no recipe sets another. The fields a flag writes are named by it in their comment, in the
// order the flags are listed as the recipe's (recipe_flags); the others have no flag.
struct Recipe {
  const char* name = "gpt2";
  Arch arch = Arch::kGpt2;
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // -opt
  float lr = 3e-4f;            // -l: the schedule's peak
  float weight_decay = 0.1f;   // -c: AdamW's
  float grad_clip = 1.0f;      // -gc; 0: none
  // The schedule (-k), with wsd the fraction of the steps it decays over (-kd; 0: the last fifth),
  // with cooldown the fraction its cooldown takes (-kc; 0: the last fifth), a double as
  // train_gpt2.py's --cooldown_frac, for the cooldown's first step int(N (1 - c)).
  std::string schedule = "cosine";
  float decay_fraction = 0.0f;  // -kd
  double cooldown_fraction = 0.0;  // -kc
  float final_lr_frac = 0.0f;  // -q
  long total_batch = -1;       // -z (-1: one micro batch)
  int B = 4, T = 0;            // -b, -t (T 0: the model's maximum)
  int max_steps = -1;          // -x (-1: an epoch of the data)
  int val_every = 20, val_batches = 20;  // -v, -m
  int val_T = 0;               // -vt (0: -t)
  int shuffle = 1;             // -sh
  int documents = 0;           // -pd
  int window_blocks = 0;       // -aw (-1: the window's schedule)
  int short_window_blocks = kShortWindowHalf;  // -aw S/L's S (kShortWindowHalf: half of -aw's long one)
  int final_window_blocks = 0;  // -awf (0: the last stage's long window)
  int window_tokens = 0;        // -awt: windows of N blocks counted as N x 128 tokens from each query
  std::string stages;         // -sp: the stage plan (llmc/stages.h; empty: one stage of the flags)
  float muon_lr = 0.025f, muon_weight_decay = 0.05f;  // -ml, -mw
  int cautious_decay = 0;  // -cd: 1 both optimizers' decay cautious (WeightDecayKind), 0 decoupled
  int normuon = 0;         // -mn: 1 Muon's update normalised by its second moment (kNorMuonBeta2)
  // -mk: 1 a Muon matrix's BF16 weight is its FP32 master's high 16 bits (record #89's BF16 weight and
  // kept 16-bit mantissa: the master cut toward zero), 0 the master stochastically rounded.
  int muon_high_bits = 0;
  // -ao K: AdamW steps on every K-th step only ((step + 1) % K == 0), with the sum of the K steps'
  // gradients, which the steps between keep (record #89's 2: its odd steps); 1: every step.
  int adam_every = 1;
  int untie_step = -1;  // -ut (-1: the embedding and the head apart from the start)
  // -mq: qkvw's Q and K orthogonalised in row blocks of this many heads each (record #89's 2, its
  // qk_bank's head pairs), V whole; 0: Q, K and V whole (muon_matrix_rows).
  int muon_qk_heads = 0;
  // -mt: Muon's rate of each tensor's matrices times its multiplier (record #89's per-matrix
  // multiplier; where the reference stores a matrix transposed, also the ratio of its shape scale
  // to ours): the step's lr_eff, also in the cautious decay.
  TensorMultipliers muon_tensor_lr = tensor_multipliers_one();
  // -ar: AdamW's tensors' own rates, betas and decays over their roles' (record #89's rows); a row
  // of a tensor Muon updates is refused (adam_rows_check).
  AdamTensorRows adam_rows;
  // -zs: 1 ran fastest (train_gpt2.cu's MultiGpuOptions); 0 with Muon, which with 1 takes one
  // more all-gather a step.
  int zero_stage = 1;
  // -od: 1 divides the optimizers' work over the processes (train_gpt2.cu's OptimizerSpread), where
  // ZeRO does not (-zs 0): on two H200s all after the micro steps took 2.05 ms less a step for the
  // speedrun, 1.34 for the modern recipe (dev/notes/multi-gpu-scaling.md).
  int divided_optimizers = 0;
  int fp8_head = 0;            // -fh: the head's training products in FP8 with fixed scales (BF16 builds)
  int fp8_mlp = 0;             // -fm: record #89's MLP training forward in FP8 (BF16 builds)
  Fp8HeadScales fp8_head_scales;  // -fhs
  // AdamW: betas, eps, weight decay on the 2-D tensors (or on every AdamW tensor with
  // decay_vectors), and each role's rate as a multiplier of the schedule's (by ParamRole:
  // embedding, matrix, vector, head).
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  bool decay_vectors = false;
  bool eps_before_correction = false;  // eps added to sqrt(v) before the bias correction
  // The embeddings' AdamW moments and weights rounded to nearest BF16 after each step, as the
  // speedrun's reference keeps those tensors in BF16 (BF16 builds).
  bool bf16_embeddings = false;
  float role_lr[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  const char* lr_help = "peak learning rate";  // what -l means under the recipe
  MomentumSchedule muon_momentum;  // 0.95 at every step (no warmup, no cooldown); -mc: its cooldown_steps
  NewtonSchulz muon_newton_schulz = kNewtonSchulzBaseline;  // -ns
  // A tall matrix's update times sqrt(rows / cols), as the reference scales it; false where the
  // recipe's reference holds every matrix so that its scale is 1 (the speedrun's fc as [C, 4C]).
  bool muon_scale_tall = true;
  bool loss_sum = false;  // the gradient of the summed token losses, not of their mean
  // The training loss's terms (record #89's; validation keeps the next token's alone): the targets
  // after the next one (-mtp), and the next token's prefix token (llmc/tokenizer.h's
  // token_prefix_table) with the weight -pw where it has one (0: none).
  PredictionWeights next_token_weights;  // -mtp
  LogitCapSetting logit_cap;             // -lc
  float prefix_weight = 0.0f;            // -pw
  // -asc: the attention's softmax scale before YaRN's changes (record #89's 0.1), a double as
  // train_gpt2.py's; 0: the architecture's (ArchSpec::attention_scale).
  double attention_scale = 0.0;
  int key_offset = 0;  // -ko 1: record #89's key offset on the long-window layers
  int yarn = 0;        // -yn 1: record #89's YaRN at the stage plan's long-window changes
  // -mr 1: record #89's MLP backward, ReLU^2's derivative 2 sqrt(y) from its kept output y, the
  // pre-activation not kept (its reference's numerics; 2 relu(x) up to y's rounding).
  int mlp_from_output = 0;
  // val_batches counts every process's batches, not each one's (-m): the speedrun's 40 sequences,
  // its reference's validation tokens on any number of processes (recipe_val_batches).
  bool val_batches_shared = false;
  // Record #89's features of a model made from a preset (a model file's header says which it has):
  int smear = 0;          // -sm: a speedrun model's smear
  int bigram = 0;         // -bg: and its bigram hash embedding
  int rotary_pairs = 0;   // -rp: a modern or speedrun model's rotary pairs
  SpeedrunInit record_init = SpeedrunInit::kRecord28;  // -ri: a speedrun model's init from the seed
  int ve_gates = 0;       // -vg: and its value-embedding gates
  int resid_lambdas = 0;  // -rl: and its residual and post lambdas
  int xsa = 0;            // -xs: and its exclusive self-attention
  int record89_plan = 0;  // -lp: and its 11-layer plan
  int paired_heads = 0;   // -ph: and the plan's paired heads
  int attn_lambdas = 0;   // -al: and its attention lambdas
  int mudd_gates = 0;     // -mg: and the plan's MUDD gate generators
  int composed_attention = 0;  // -ca: and its composed attention on layer 10
  int mudd_connections = 0;    // -md: and its MUDD dense connections
};

inline const Recipe& recipe_gpt2() {
  static const Recipe r;
  return r;
}

// The reference's rates: embedding 0.7, head 0.004, gains and biases 0.015, each times the
// schedule (peak 1); the blocks' matrices with -opt adamw take the head's rate.
inline const Recipe& recipe_modern() {
  static const Recipe r = [] {
    Recipe m;
    m.name = "modern";
    m.arch = Arch::kModern;
    m.optimizer = OptimizerKind::kMuon;
    m.lr = 1.0f;
    m.beta1 = 0.8f;
    m.eps = 1e-10f;
    m.weight_decay = 0.001f;
    m.decay_vectors = true;
    const float role_lr[4] = {0.7f, 0.004f, 0.015f, 0.004f};
    std::copy(role_lr, role_lr + 4, m.role_lr);
    m.lr_help = "scale of the per-role AdamW rates at the schedule's peak (at 1: embedding 0.7, "
                "matrices and head 0.004, gains and biases 0.015)";
    m.grad_clip = 0.0f;
    m.loss_sum = true;
    m.schedule = "wsd";
    m.decay_fraction = 0.7f;
    m.total_batch = 524288;
    m.B = 64;
    m.T = 1024;
    m.zero_stage = 0;
    m.divided_optimizers = 1;
    return m;
  }();
  return r;
}

// Record #28's rates: Adam's 0.008 times 75 for the embedding and the value embeddings, 1 for the
// head, 5 for the scalars (role kVector), each times the schedule (peak 1); Muon's 0.05.
inline const Recipe& recipe_speedrun() {
  static const Recipe r = [] {
    Recipe m;
    m.name = "speedrun";
    m.arch = Arch::kSpeedrun;
    m.optimizer = OptimizerKind::kMuon;
    m.lr = 1.0f;
    m.beta1 = 0.8f;
    m.eps = 1e-10f;
    m.weight_decay = 0.0f;
    m.eps_before_correction = true;
    const float role_lr[4] = {0.6f, 0.008f, 0.04f, 0.008f};
    std::copy(role_lr, role_lr + 4, m.role_lr);
    m.lr_help = "scale of the per-role AdamW rates at the schedule's peak (at 1: embeddings 0.6, head 0.008, "
                "scalars 0.04)";
    m.grad_clip = 0.0f;
    m.muon_lr = 0.05f;
    m.muon_weight_decay = 0.0f;
    m.muon_momentum.start = 0.85;
    m.muon_momentum.warmup_steps = 300;
    m.muon_newton_schulz = kNewtonSchulzSpeedrun;
    m.muon_scale_tall = false;
    m.loss_sum = true;
    m.schedule = "wsd";
    m.decay_fraction = 0.45f;
    m.final_lr_frac = 0.1f;
    m.total_batch = 393216;
    m.B = 1;
    m.T = 49152;
    m.max_steps = 1695;
    // The reference validates every 125 steps on 10,485,760 tokens, 40 contiguous sequences of
    // 262,144 (its model's maximum), with the step's window.
    m.val_every = 125;
    m.val_batches = 40;
    m.val_batches_shared = true;
    m.val_T = 262144;
    m.shuffle = 0;  // the reference reads its shards in name order
    m.documents = 1;
    m.window_blocks = -1;
    m.zero_stage = 0;
    m.divided_optimizers = 1;
    m.fp8_head = 1;
    m.bf16_embeddings = true;
    return m;
  }();
  return r;
}

// Record #89's AdamW row of a tensor: its reference's Adam rate 0.008 and decay 0.005 times the
// tensor's lr_mul and wd_mul (train_gpt.py's param_table), each product in double as there and
// rounded once, in place of the role's; its betas.
inline AdamTensorRow record89_adam_row(double lr_mul, double wd_mul, float beta1, float beta2) {
  AdamTensorRow row;
  row.rate = (float)(0.008 * lr_mul);
  row.decay = (float)(0.005 * wd_mul);
  row.beta1 = beta1;
  row.beta2 = beta2;
  return row;
}

// Record #89's AdamW rows by its reference's tensors (dev/notes/record89-reference.md, section 2):
// embed and lm_head (wte, headw); value_embeds and bigram_embed (ve, bigram); scalars, whose
// entries are our attn_lambdas, smear_lambda and skip_gate; smear_gate (smearw); ve_gate_bank
// (vegate); resid_lambdas, post_lambdas; the MUDD gate generators' tensors. Ours with no
// counterpart (value_scales, and the gates the reference's MUDD dense connections give layer 10:
// x0_gates, bigram_gates, and xsa_alpha, head_gates) keep the scalars' role's row.
inline AdamTensorRows record89_adam_rows() {
  AdamTensorRows rows;
  const AdamTensorRow embedding = record89_adam_row(1.0, 150.0, 0.5f, 0.95f);
  const AdamTensorRow value_embedding = record89_adam_row(75.0, 5.0, 0.75f, 0.95f);
  const AdamTensorRow scalars = record89_adam_row(5.0, 0.0, 0.9f, 0.99f);
  const AdamTensorRow mudd_gate_weights = record89_adam_row(0.1, 1.0, 0.9f, 0.99f);
  const AdamTensorRow mudd_gate_scalars = record89_adam_row(0.1, 0.0, 0.9f, 0.99f);
  rows[kWte] = rows[kHeadw] = embedding;
  rows[kVe] = rows[kBigram] = value_embedding;
  rows[kAttnLambdas] = rows[kSmearLambda] = rows[kSkipGate] = scalars;
  rows[kSmearw] = record89_adam_row(0.01, 0.0, 0.9f, 0.99f);
  rows[kVegate] = record89_adam_row(1.0, 1.0, 0.9f, 0.99f);
  rows[kResidLambdas] = record89_adam_row(5.0, 0.0, 0.9f, 0.95f);
  rows[kPostLambdas] = record89_adam_row(1.0, 0.0, 0.9f, 0.95f);
  rows[kMuddGateW1] = rows[kMuddGateW2] = mudd_gate_weights;
  rows[kMuddGateB2] = rows[kMuddGateScale] = mudd_gate_scalars;
  rows[kMuddW1] = rows[kMuddW2] = record89_adam_row(0.25, 1.0, 0.9f, 0.99f);
  rows[kMuddB2] = record89_adam_row(0.25, 0.0, 0.9f, 0.99f);
  // The reference's BF16 parameters (its Embedding and Linear modules' weights, value_embeds,
  // ve_gate_bank and the MUDD tensors but the gates' scale): each step's weight rounded to nearest
  // BF16, the moments FP32 (its Adam state is FP32 for every tensor).
  for (int i : {kWte, kHeadw, kVe, kBigram, kSmearw, kVegate, kMuddGateW1, kMuddGateW2, kMuddGateB2, kMuddW1, kMuddW2,
                kMuddB2}) {
    rows[i].bf16 = AdamBf16::kWeight;
  }
  return rows;
}

// Record #89 (modded-nanogpt's speedrun record of dev/notes/record89-reference.md): record #28's
// recipe with every switch of the notes' "Our flags for record #89" command (but the data's -i, -j
// and -tk; its FP8 MLP, -fm 1, in BF16 builds on GPUs with FP8 products), AdamW's rows by tensor
// (record89_adam_rows), and Muon's rate of the MLP's matrices: the reference's lr_eff is 0.023
// times its shape's scale 2 for both, which it stores tall, and times 2 more for the down
// projection; ours are fcw tall, fcprojw wide, and unscaled (muon_scale_tall false, as record
// #28's), so x2 and x4.
inline const Recipe& recipe_record89() {
  static const Recipe r = [] {
    Recipe m = recipe_speedrun();
    m.name = "record89";
    m.lr_help = "scale of the AdamW rates at the schedule's peak (at 1: each tensor's own of -ar, record #89's, "
                "and the roles' elsewhere: embeddings 0.6, head 0.008, scalars 0.04)";
    m.record89_plan = m.paired_heads = m.rotary_pairs = m.window_tokens = m.key_offset = m.yarn = 1;
    m.mlp_from_output = m.fp8_mlp = 1;
    m.attention_scale = 0.1;
    m.smear = m.bigram = m.ve_gates = m.resid_lambdas = m.xsa = m.attn_lambdas = m.mudd_gates = 1;
    m.composed_attention = m.mudd_connections = 1;
    m.record_init = SpeedrunInit::kRecord89;
    m.max_steps = 1270;
    m.stages = "1/3 t=16384 z=131072 cap=896 aw=1/3 lr=1 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; "
               "1/3 t=32768 z=262144 cap=2048 aw=3/7 lr=1.52 mtp=1,0.5>1,0 pw=0.25>0; "
               "1/3 t=49152 z=393216 aw=5/11 lr=1.73 mtp=1 pw=0; +15 aw=6/13";
    m.final_window_blocks = 20;
    m.schedule = "cooldown";
    m.cooldown_fraction = 0.6;
    m.final_lr_frac = 0.15f;
    m.muon_momentum.cooldown_steps = 50;
    m.muon_newton_schulz = kNewtonSchulzPolar;
    m.normuon = 1;
    m.muon_high_bits = 1;
    m.muon_qk_heads = 2;
    m.cautious_decay = 1;
    m.muon_lr = 0.023f;
    m.muon_weight_decay = 1.2f;
    m.weight_decay = 0.005f;
    m.adam_every = 2;
    m.untie_step = 847;
    m.logit_cap = {23.0f, 5.0f, true};
    m.fp8_head_scales = {100.0, 1.6, 0.75};
    m.prefix_weight = 0.25f;
    m.val_every = 250;
    m.val_batches = 40;
    m.val_T = 262144;
    m.adam_rows = record89_adam_rows();
    m.muon_tensor_lr[kFcw] = 2.0f;
    m.muon_tensor_lr[kFcprojw] = 4.0f;
    return m;
  }();
  return r;
}

// One parameter role's optimizer, a row of OptimizerTable.
struct RoleOptimizer {
  OptimizerKind method = OptimizerKind::kAdamW;
  // AdamW's: a multiplier of the schedule's rate; Muon's: its rate at the schedule's peak, which
  // follows the schedule's shape.
  float lr = 1.0f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;  // AdamW's
  float weight_decay = 0.0f;                       // on every tensor of the role
  WeightDecayKind decay = WeightDecayKind::kDecoupled;  // how it falls
  // What of AdamW's step is rounded to nearest BF16 (BF16 builds).
  AdamBf16 bf16 = AdamBf16::kNone;
};

constexpr int kParamRoles = 4;  // ParamRole's values

// Every hyperparameter of the update but the schedule's rate, resolved once from the run's record
// (optimizer_table): a row for each parameter role, and what the roles share.
struct OptimizerTable {
  RoleOptimizer roles[kParamRoles];  // by ParamRole
  float grad_clip = 1.0f;            // the gradient norm clipped to (<= 0: none)
  // AdamW's eps added to sqrt(v) before the bias correction (the speedrun's reference): AdamW at
  // step t with eps / sqrt(1 - beta2^t), as train_gpt2.py's adam_eps.
  bool eps_before_correction = false;
  MomentumSchedule muon_momentum;  // Muon's, as Recipe's fields of these names
  NewtonSchulz muon_newton_schulz = kNewtonSchulzBaseline;
  bool muon_scale_tall = true;
  bool normuon = false;                                        // Recipe::normuon
  bool muon_high_bits = false;  // Recipe::muon_high_bits, in BF16 builds
  int adam_every = 1;                                          // Recipe::adam_every
  TensorMultipliers muon_tensor_lr = tensor_multipliers_one();  // Recipe::muon_tensor_lr
  // Each tensor's row (by ParamIndex): its role's, an AdamW tensor's with its own rate, betas and
  // decay (Recipe::adam_rows).
  RoleOptimizer tensors[kNumParamTensors];

  const RoleOptimizer& of(ParamRole role) const { return roles[(int)role]; }
  const RoleOptimizer& of_tensor(int tensor) const { return tensors[tensor]; }
  // Whether AdamW steps at `step` (0-based); at the others its tensors' gradients are kept.
  bool adamw_steps_at(long step) const { return (step + 1) % adam_every == 0; }
  bool muon() const {
    return std::any_of(roles, roles + kParamRoles,
                       [](const RoleOptimizer& r) { return r.method == OptimizerKind::kMuon; });
  }
  float adamw_eps(const RoleOptimizer& row, int t) const {
    return eps_before_correction ? (float)(row.eps / std::sqrt(1.0 - std::pow((double)row.beta2, t))) : row.eps;
  }
};

// Parameter tensor i's entry of the table (ParamIndex) in what no configuration changes, its name
// and role: GPT-2 d12's table's.
inline ParamSpec param_tensor_spec(int i) {
  GPT2Config c;
  c.max_seq_len = 1024;
  c.vocab_size = 50257;
  c.padded_vocab_size = 50304;
  c.num_layers = c.num_heads = 12;
  c.channels = 768;
  ParamSpec table[kNumParamTensors];
  param_table(c, table);
  return table[i];
}

inline const char* param_tensor_name(int i) { return param_tensor_spec(i).name; }

// The tensor of that name (ParamIndex), or -1.
inline int param_tensor_index(const std::string& name) {
  for (int i = 0; i < kNumParamTensors; i++) {
    if (name == param_tensor_name(i)) return i;
  }
  return -1;
}

// v as "%g" writes it, with more significant digits where 6 do not read back (strtof) as v.
inline std::string float_text(float v) {
  for (int digits = 6;; digits++) {
    const std::string text = strformat("%.*g", digits, (double)v);
    if (strtof(text.c_str(), nullptr) == v) return text;
  }
}

// -ar's text of the rows other than the default, "wte:lr=75,b1=0.75,b2=0.95,wd=5;headw:b1=0.5" (its
// keys in the order lr, rate, b1, b2, wd, decay, bf16; "" for none), which parse_adam_rows reads back exactly.
inline std::string adam_rows_text(const AdamTensorRows& rows) {
  std::string text;
  for (int i = 0; i < kNumParamTensors; i++) {
    const AdamTensorRow& row = rows[i];
    if (row == AdamTensorRow()) continue;
    std::string keys;
    if (row.lr != 1.0f) keys += ",lr=" + float_text(row.lr);
    if (row.rate) keys += ",rate=" + float_text(*row.rate);
    if (row.beta1) keys += ",b1=" + float_text(*row.beta1);
    if (row.beta2) keys += ",b2=" + float_text(*row.beta2);
    if (row.weight_decay != 1.0f) keys += ",wd=" + float_text(row.weight_decay);
    if (row.decay) keys += ",decay=" + float_text(*row.decay);
    if (row.bf16) keys += std::string(",bf16=") + adam_bf16_name(*row.bf16);
    text += strformat("%s%s:%s", text.empty() ? "" : ";", param_tensor_name(i), keys.c_str() + 1);
  }
  return text;
}

// Fails where a row of -ar (`flag`) names a tensor that Muon updates (the blocks' matrices with
// -opt muon), whose rate and decay are Muon's.
inline void adam_rows_check(const Recipe& r, const char* flag) {
  if (r.optimizer != OptimizerKind::kMuon) return;
  for (int i = 0; i < kNumParamTensors; i++) {
    if (r.adam_rows[i] != AdamTensorRow() && param_tensor_spec(i).role == ParamRole::kMatrix) {
      LLMC_FAIL("%s %s: %s is Muon's (-opt muon takes the blocks' matrices), its rate and decay Muon's (-ml, -mw): "
                "drop its row, or give -opt adamw", flag, adam_rows_text(r.adam_rows).c_str(), param_tensor_name(i));
    }
  }
}

// The run's optimizers from its record (bf16_build: BF16 state can be kept): AdamW for every
// role, or Muon for the blocks' matrices (-opt muon) and AdamW for the rest. Each AdamW role's
// rate is the schedule's times its multiplier (Recipe::role_lr): 1 in GPT-2's recipe; in the
// modern ones, whose schedule peaks at 1 (-l scales it), the reference's rate of the role.
// AdamW's weight decay (-c) falls on the roles of 2-D tensors (ParamSpec::decayed), and on the
// vectors too with decay_vectors; Muon's is its own (-mw); in every row cautious with -cd 1. Each
// AdamW tensor's row is its role's with its own of Recipe::adam_rows: the rate and the decay its own
// where it sets them, else times its multipliers (a role without decay keeps none), its betas where
// it sets them.
inline OptimizerTable optimizer_table(const Recipe& r, bool bf16_build) {
  OptimizerTable t;
  for (int i = 0; i < kParamRoles; i++) {
    const ParamRole role = (ParamRole)i;
    RoleOptimizer& row = t.roles[i];
    row.lr = r.role_lr[i];
    row.beta1 = r.beta1;
    row.beta2 = r.beta2;
    row.eps = r.eps;
    row.weight_decay = role != ParamRole::kVector || r.decay_vectors ? r.weight_decay : 0.0f;
    row.decay = r.cautious_decay ? WeightDecayKind::kCautious : WeightDecayKind::kDecoupled;
    row.bf16 = role == ParamRole::kEmbedding && r.bf16_embeddings && bf16_build ? AdamBf16::kAll : AdamBf16::kNone;
    if (role == ParamRole::kMatrix && r.optimizer == OptimizerKind::kMuon) {
      row.method = OptimizerKind::kMuon;
      row.lr = r.muon_lr;
      row.weight_decay = r.muon_weight_decay;
    }
  }
  t.grad_clip = r.grad_clip;
  t.eps_before_correction = r.eps_before_correction;
  t.muon_momentum = r.muon_momentum;
  t.muon_newton_schulz = r.muon_newton_schulz;
  t.muon_scale_tall = r.muon_scale_tall;
  t.normuon = r.normuon != 0;
  t.muon_high_bits = r.muon_high_bits != 0 && bf16_build;
  t.adam_every = r.adam_every;
  t.muon_tensor_lr = r.muon_tensor_lr;
  for (int i = 0; i < kNumParamTensors; i++) {
    RoleOptimizer& row = t.tensors[i] = t.of(param_tensor_spec(i).role);
    if (row.method != OptimizerKind::kAdamW) continue;
    const AdamTensorRow& own = r.adam_rows[i];
    row.lr = own.rate.value_or(row.lr * own.lr);
    row.weight_decay = own.decay.value_or(row.weight_decay * own.weight_decay);
    row.beta1 = own.beta1.value_or(row.beta1);
    row.beta2 = own.beta2.value_or(row.beta2);
    if (own.bf16) row.bf16 = bf16_build ? *own.bf16 : AdamBf16::kNone;
  }
  return t;
}

// Muon's orthogonalisation in the start-up table: its steps, their polynomial where it is not the
// baseline's (or that each step has its own), and the norm where it is not |X| + 1e-7.
inline std::string newton_schulz_description(const NewtonSchulz& ns) {
  const NewtonSchulzStep& first = ns.polynomial[0];
  const bool one_polynomial = std::all_of(ns.polynomial, ns.polynomial + ns.steps,
                                          [&](const NewtonSchulzStep& p) { return p == first; });
  std::string text = strformat("%d Newton-Schulz steps", ns.steps);
  if (!one_polynomial) {
    text += " each of its own polynomial";
  } else if (!(first == kNewtonSchulzBaseline.polynomial[0])) {
    text += strformat(" of (%g, %g, %g)", first.a, first.b, first.c);
  }
  if (ns.norm_scale != kNewtonSchulzBaseline.norm_scale || ns.norm_eps != kNewtonSchulzBaseline.norm_eps) {
    text += strformat(" from X / (%g |X| + %g)", ns.norm_scale, ns.norm_eps);
  }
  return text;
}

// The start-up table's optimizers, from the run's record (what optimizer_table makes of it), the
// rates at the schedule's peak.
inline std::string optimizer_description(const Recipe& r, bool bf16_build) {
  const float* x = r.role_lr;
  const WeightDecayKind decay = r.cautious_decay ? WeightDecayKind::kCautious : WeightDecayKind::kDecoupled;
  std::string adamw = strformat("AdamW betas %g %g eps %g, %s on %s", r.beta1, r.beta2, r.eps,
                                weight_decay_name(decay), r.decay_vectors ? "every tensor" : "the 2-D tensors");
  if (x[0] != 1.0f || x[1] != 1.0f || x[2] != 1.0f || x[3] != 1.0f) {
    adamw += strformat(", lr x %g embedding, %g matrices, %g gains and biases, %g head", x[0], x[1], x[2], x[3]);
  }
  if (r.bf16_embeddings && bf16_build) adamw += ", the embeddings' steps in BF16";
  if (r.adam_every > 1) adamw += strformat(", every %d steps with their summed gradients", r.adam_every);
  for (int i = 0; i < kNumParamTensors; i++) {
    const AdamTensorRow& own = r.adam_rows[i];
    if (own == AdamTensorRow()) continue;
    const std::string lr = own.rate ? strformat("lr %g", *own.rate) : strformat("lr x %g", own.lr);
    const std::string decay = own.decay ? strformat("decay %g", *own.decay) : strformat("decay x %g", own.weight_decay);
    adamw += strformat(", %s's %s betas %g %g %s", param_tensor_name(i), lr.c_str(), own.beta1.value_or(r.beta1),
                       own.beta2.value_or(r.beta2), decay.c_str());
    if (own.bf16 && bf16_build) adamw += strformat(" BF16 %s", adam_bf16_name(*own.bf16));
  }
  if (r.optimizer != OptimizerKind::kMuon) return adamw;
  const MomentumSchedule& mu = r.muon_momentum;
  std::string momentum = strformat("%g", mu.end);
  if (mu.warmup_steps > 0) {
    momentum = strformat("%g rising to %g over %ld steps", mu.start, mu.end, mu.warmup_steps);
  }
  if (mu.cooldown_steps > 0) momentum += strformat(", back to %g over the last %ld", mu.start, mu.cooldown_steps);
  std::string rates;
  for (int i = 0; i < kNumParamTensors; i++) {
    if (r.muon_tensor_lr[i] != 1.0f) rates += strformat(", %s's rate x %g", param_tensor_name(i), r.muon_tensor_lr[i]);
  }
  const std::string qk = r.muon_qk_heads ? strformat(", Q and K in blocks of %d heads", r.muon_qk_heads) : "";
  return strformat("Muon for the blocks' matrices (lr %g, %s %g, Nesterov momentum %s, %s in BF16%s%s%s%s%s); "
                   "%s for the rest", r.muon_lr, weight_decay_name(decay), r.muon_weight_decay, momentum.c_str(),
                   newton_schulz_description(r.muon_newton_schulz).c_str(),
                   r.normuon ? strformat(", NorMuon's second moment (beta2 %g)", kNorMuonBeta2).c_str() : "",
                   qk.c_str(), r.muon_scale_tall ? "" : ", tall matrices unscaled", rates.c_str(),
                   r.muon_high_bits && bf16_build ? ", BF16 weights the master's high 16 bits" : "", adamw.c_str());
}

// -m's default on `world` processes: the recipe's val_batches, or where they are shared by the
// processes (val_batches_shared) each one's share, which must be whole.
inline int recipe_val_batches(const Recipe& r, int world) {
  if (!r.val_batches_shared) return r.val_batches;
  if (world <= 0 || r.val_batches % world != 0) {
    LLMC_FAIL("-m: -recipe %s validates on %d batches in all, which %d processes cannot share evenly: give -m, "
              "the batches of each process", r.name, r.val_batches, world);
  }
  return r.val_batches / world;
}

inline const Recipe& recipe_by_name(const std::string& name, const char* flag) {
  if (name == "gpt2") return recipe_gpt2();
  if (name == "modern") return recipe_modern();
  if (name == "speedrun") return recipe_speedrun();
  if (name == "record89") return recipe_record89();
  LLMC_FAIL("%s %s: unknown recipe: use gpt2 (llm.c's GPT-2), modern (modded-nanogpt's "
            "optimization-track baseline: RMSNorm, rotary, ReLU^2, Muon), speedrun (its record #28) or record89 "
            "(its record #89)", flag, name.c_str());
}

}  // namespace llmc
