// Record #89's YaRN (its reference's Yarn.apply): at each change of the stage plan's long window
// from `old` to `new` tokens within a run (the final validation's window, -awf, is none) the
// rotary's frequencies and the attention's softmax scale are rescaled. With r = old f / (2 pi),
// s = old / new and w = clamp((r - 1) / 31, 0, 1): f <- f (s + w (1 - s)), elementwise in float32
// as torch computes on a CPU's float32 tensors (each Python scalar taken as a float32, each
// operation rounded, divisions true ones); unturned pairs (f = 0) stay 0. The scale: scale <- scale
// (0.2 ln(new / old) + 1) in double, as Python's floats. A step's state is that of every change up
// to it, in order (yarn_at), so a resume derives it again from the plan and continues bitwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_blocks.h"
#include "stages.h"
#include "utils.h"

namespace llmc {

// The reference's interpolation bounds (alpha, beta, in rotations over the old window) and the
// scale's slope.
constexpr float kYarnAlpha = 1.0f, kYarnBeta = 32.0f;
constexpr double kYarnScaleSlope = 0.2;

struct YarnState {
  std::vector<float> freq;  // each rotary pair's frequency (0: unturned)
  double scale = 0.0;       // the attention's softmax scale
};

// One change of the long window from old_tokens to new_tokens.
inline void yarn_rescale(YarnState& y, long old_tokens, long new_tokens) {
  const double s = (double)old_tokens / (double)new_tokens;
  const float old_f = (float)old_tokens, two_pi = (float)(2.0 * M_PI), s_f = (float)s, rest = (float)(1.0 - s);
  for (float& f : y.freq) {
    const float rotations = old_f * f / two_pi;
    const float w = std::min(std::max((rotations - kYarnAlpha) / (kYarnBeta - kYarnAlpha), 0.0f), 1.0f);
    const float weighted = w * rest;
    f *= s_f + weighted;
  }
  y.scale *= kYarnScaleSlope * std::log((double)new_tokens / (double)old_tokens) + 1.0;
}

// The change, if any, from step - 1's long window to step's (the stage plan's, in tokens).
inline void yarn_advance(YarnState& y, const StagePlan& plan, long step) {
  if (step <= 0) return;
  const long old_tokens = (long)plan.stage_windows_at(step - 1).long_blocks * kAttentionBlock;
  const long new_tokens = (long)plan.stage_windows_at(step).long_blocks * kAttentionBlock;
  if (old_tokens != new_tokens) yarn_rescale(y, old_tokens, new_tokens);
}

// The state at `step` of a run from `base` (the base frequencies and scale): every change from
// step 1 to `step`, in order.
inline YarnState yarn_at(const StagePlan& plan, long step, YarnState base) {
  for (long s = 1; s <= step; s++) yarn_advance(base, plan, s);
  return base;
}

// YaRN follows the long window: every step of the plan must have one. `flag` names the switch.
inline void yarn_check(const StagePlan& plan, const char* flag) {
  for (size_t i = 0; i < plan.stages().size(); i++) {
    if (plan.stages()[i].window.long_blocks == 0) {
      LLMC_FAIL("%s 1 rescales the rotary at the stage plan's changes of the long window, and stage %zu of %zu has "
                "no window: give every stage one (aw=, or -aw, with -pd 1), or drop %s", flag, i + 1,
                plan.stages().size(), flag);
    }
  }
}

}  // namespace llmc
