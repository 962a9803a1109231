// Training recipes: GPT-2's (llm.c's settings) and the modern one, modded-nanogpt's
// optimization-track baseline (records/track_3_optimization/train_gpt_simple.py): its
// architecture, Muon for the blocks' matrices and AdamW for the rest with a rate for each role,
// the sum of the token losses, no clipping, and a schedule stable for 30% of the steps, then
// linear to zero. -recipe picks one; every flag given on the command line overrides its value.
#pragma once

#include <string>

#include "gpt2.h"
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

struct Recipe {
  const char* name;
  Arch arch;
  OptimizerKind optimizer;
  // AdamW: the schedule's peak (-l), betas, eps, weight decay (on the 2-D tensors, or on every
  // AdamW tensor with decay_vectors), and each role's rate as a multiplier of the schedule's
  // (by ParamRole: embedding, matrix, vector, head).
  float lr, beta1, beta2, eps, weight_decay;
  bool decay_vectors;
  float role_lr[4];
  float grad_clip;  // 0: none
  float muon_lr, muon_weight_decay, muon_momentum;
  bool loss_sum;  // the gradient of the summed token losses, not of their mean
  // The schedule (-k), and with wsd the fraction of the steps it decays over (0: the last fifth).
  const char* schedule;
  float decay_fraction;
  long total_batch_tokens;  // -z (-1: one micro batch)
  int B, T;                 // T 0: the model's maximum
  int zero_stage;           // -zs: 0 with Muon, which with 1 takes one more all-gather a step
};

inline const Recipe& recipe_gpt2() {
  static const Recipe r = {"gpt2", Arch::kGpt2, OptimizerKind::kAdamW, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, false,
                           {1.0f, 1.0f, 1.0f, 1.0f}, 1.0f, 0.025f, 0.05f, 0.95f, false, "cosine", 0.0f,
                           -1, 4, 0, 1};
  return r;
}

// The reference's rates: embedding 0.7, head 0.004, gains and biases 0.015, each times the
// schedule (peak 1); the blocks' matrices with -opt adamw take the head's rate.
inline const Recipe& recipe_modern() {
  static const Recipe r = {"modern", Arch::kModern, OptimizerKind::kMuon, 1.0f, 0.8f, 0.95f, 1e-10f, 0.001f,
                           true, {0.7f, 0.004f, 0.015f, 0.004f}, 0.0f, 0.025f, 0.05f, 0.95f, true, "wsd",
                           0.7f, 524288, 64, 1024, 0};
  return r;
}

inline const Recipe& recipe_by_name(const std::string& name, const char* flag) {
  if (name == "gpt2") return recipe_gpt2();
  if (name == "modern") return recipe_modern();
  LLMC_FAIL("%s %s: unknown recipe: use gpt2 (llm.c's GPT-2) or modern (modded-nanogpt's "
            "optimization-track baseline: RMSNorm, rotary, ReLU^2, Muon)", flag, name.c_str());
}

}  // namespace llmc
