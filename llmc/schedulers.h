// Learning-rate schedules, the same formulas as train_gpt2.py's learning_rate()
// and evaluated in double in the same order, so both give identical values.
//
// For step s (0-based) of N total steps, warmup W, peak lr, min_lr = lr * final_lr_frac and m the
// step's stage multiplier (llmc/stages.h; 1 without a plan):
//   s < W:      lr * (s + 1) / W * m                              (every schedule)
//   otherwise, with f = (s - S) / (N - S) clamped to [0, 1] (f = 0 when N <= S;
//   train_gpt2.py clamps only at 0, which gives the same value for every step
//   s < N of the run), each schedule's value below times m:
//     cosine:   min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * f)),  S = W
//     linear:   lr - (lr - min_lr) * f,                            S = W
//     wsd:      lr - (lr - min_lr) * f,                            S = max(W, N - N/5)
//               (warmup, then stable at lr, then a linear decay over the last
//               fifth of the run; N/5 is integer division), or with a decay
//               fraction d: S = max(W, N * (1 - d)), not rounded (the modern
//               recipe's d = 0.7: lr * min(1, (N - s) / (0.7 N)), as its reference)
//     constant: lr
//   or the cooldown, whose floor is min_lr whatever the stage's multiplier (modded-nanogpt's
//   record #89: c = 0.6, final_lr_frac 0.15, stages of m = 1, 1.52 and 1.73):
//     cooldown: lr * m before S, then lr * (m * (1 - t) + final_lr_frac * t) with
//               t = min(1, (s - S) / (N - S)) (t = 1 when N <= S), S = max(W, int(N * (1 - c)))
//               truncated to an integer as Python's int(), with a cooldown fraction c (c = 0:
//               S = max(W, N - N/5))
// No schedule reaches min_lr inside the run: its last step s = N - 1 has f < 1 (t < 1); the
// extension steps of a stage plan (s >= N) take f = 1 (t = 1).
//
// Then Muon's momentum at each step (MomentumSchedule), and at the end the attention window's
// schedule (attention_window_blocks), a run's long window at each step and its short one (which
// layers take which is the layer plan's, llmc/gpt2.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "utils.h"

namespace llmc {

enum class LrScheduleKind { kCosine, kLinear, kConstant, kWsd, kCooldown };

inline const char* lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kCosine: return "cosine";
    case LrScheduleKind::kLinear: return "linear";
    case LrScheduleKind::kConstant: return "constant";
    case LrScheduleKind::kWsd: return "wsd";
    case LrScheduleKind::kCooldown: return "cooldown";
  }
  return "unknown";
}

// `flag` names the command-line flag the name came from, for the error message.
inline LrScheduleKind parse_lr_schedule(const std::string& name, const char* flag) {
  for (LrScheduleKind kind : {LrScheduleKind::kCosine, LrScheduleKind::kLinear, LrScheduleKind::kConstant,
                              LrScheduleKind::kWsd, LrScheduleKind::kCooldown}) {
    if (name == lr_schedule_name(kind)) return kind;
  }
  LLMC_FAIL("unknown learning-rate schedule '%s' for %s: use one of cosine, linear, constant, wsd, cooldown",
            name.c_str(), flag);
}

struct LrSchedule {
  static constexpr double kPi = 3.14159265358979323846;  // Python's math.pi

  LrScheduleKind kind = LrScheduleKind::kCosine;
  double learning_rate = 0.0;  // peak
  long warmup_steps = 0;
  long total_steps = 0;
  double final_lr_frac = 0.0;
  double decay_fraction = 0.0;  // wsd: 0 for the last N/5 steps
  double cooldown_fraction = 0.0;  // cooldown: c (0 for the last N/5 steps)

  // The rate of step `step` in a stage whose rate multiplier is stage_multiplier.
  double at(long step, double stage_multiplier = 1.0) const {
    if (step < warmup_steps) return learning_rate * (double)(step + 1) / (double)warmup_steps * stage_multiplier;
    if (kind == LrScheduleKind::kCooldown) return learning_rate * cooldown_multiplier(step, stage_multiplier);
    return scaled_by_stage(step) * stage_multiplier;
  }

  // The cooldown's first step S.
  long cooldown_start() const {
    const long start = cooldown_fraction > 0.0 ? (long)(total_steps * (1.0 - cooldown_fraction))
                                               : total_steps - total_steps / 5;
    return std::max(warmup_steps, start);
  }

 private:
  // A step past the warmup of the schedules that a stage's multiplier scales as a whole.
  double scaled_by_stage(long step) const {
    const double lr = learning_rate;
    if (kind == LrScheduleKind::kConstant) return lr;
    const double min_lr = lr * final_lr_frac;
    const double start =
        kind != LrScheduleKind::kWsd ? (double)warmup_steps
        : decay_fraction > 0.0       ? std::max((double)warmup_steps, total_steps * (1.0 - decay_fraction))
                                     : (double)std::max(warmup_steps, total_steps - total_steps / 5);
    const double f =
        total_steps > start
            ? std::min(1.0, std::max(0.0, ((double)step - start) / ((double)total_steps - start)))
            : 0.0;
    if (kind == LrScheduleKind::kCosine) {
      return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(kPi * f));
    }
    return lr - (lr - min_lr) * f;
  }

  // The cooldown's multiplier of the peak at a step past the warmup: m, then from S on linear
  // from m to the absolute floor final_lr_frac, as modded-nanogpt's TrainingSchedule.get_lr.
  double cooldown_multiplier(long step, double m) const {
    const long start = cooldown_start();
    if (step < start) return m;
    const double t =
        total_steps > start ? std::min(1.0, (double)(step - start) / (double)(total_steps - start)) : 1.0;
    return m * (1.0 - t) + final_lr_frac * t;
  }
};

// Checks the settings; each flag name is used in the message for its value.
inline LrSchedule make_lr_schedule(const std::string& name, const char* name_flag,
                                   double learning_rate, long warmup_steps, long total_steps,
                                   double final_lr_frac) {
  LrSchedule s;
  s.kind = parse_lr_schedule(name, name_flag);
  if (!(learning_rate >= 0.0)) LLMC_FAIL("learning rate %g must be >= 0", learning_rate);
  if (warmup_steps < 0) LLMC_FAIL("warmup steps %ld must be >= 0", warmup_steps);
  if (total_steps <= 0) LLMC_FAIL("total steps %ld must be positive", total_steps);
  if (!(final_lr_frac >= 0.0 && final_lr_frac <= 1.0)) {
    LLMC_FAIL("final learning-rate fraction %g must be within [0, 1]", final_lr_frac);
  }
  s.learning_rate = learning_rate;
  s.warmup_steps = warmup_steps;
  s.total_steps = total_steps;
  s.final_lr_frac = final_lr_frac;
  return s;
}

// Muon's momentum at step s (0-based): `start` rising linearly to `end` over the first W =
// warmup_steps steps, (1 - f) start + f end with f = s / W, then `end` (at every step when W = 0);
// with a cooldown of K steps, over the last K of the run's S steps (scheduled and extension) back
// from `end` to `start`: for s > S - K, end - f (end - start) with f = (s - (S - K)) / K, as
// modded-nanogpt's get_muon_momentum (record #89: K = 50 of S = 1,285, 0.852 at step 1,284). The
// warmup comes first where the two overlap. train_gpt2.py's muon_momentum, in double in the same
// order from the same double values, so both give identical values; Muon's kernels take a step's
// value rounded to float.
struct MomentumSchedule {
  double start = 0.85, end = 0.95;
  long warmup_steps = 0;
  long cooldown_steps = 0;  // K; 0: none
  long run_steps = 0;       // S, which the cooldown counts back from (resolve)

  double at(long step) const {
    if (step < warmup_steps) {
      const double f = (double)step / (double)warmup_steps;
      return (1 - f) * start + f * end;
    }
    const long cooldown_start = run_steps - cooldown_steps;
    if (cooldown_steps > 0 && step > cooldown_start) {
      const double f = (double)(step - cooldown_start) / (double)cooldown_steps;
      return end - f * (end - start);
    }
    return end;
  }

  // The run's S steps; fails for a cooldown longer than the run (`flag` names K's setting, `run`
  // says where S comes from).
  void resolve(long steps, const char* flag, const std::string& run) {
    if (cooldown_steps > steps) {
      LLMC_FAIL("%s %ld: the momentum's cooldown is longer than the run's %ld steps (%s): give %s %ld or less",
                flag, cooldown_steps, steps, run.c_str(), flag, steps);
    }
    run_steps = steps;
  }
};

// modded-nanogpt's sliding attention window (llmc/attention_blocks.h), in blocks of 128 tokens:
// at step s of N (0 <= s <= N) the next multiple of 128 at or above 1728 * s / N, at least 128,
// in blocks; so 1 block at the start, growing linearly to 14 (1728 rounded up) at step N. s / N
// is taken first, in double, as the reference's s / N * 1728.
inline int attention_window_blocks(long step, long num_steps) {
  if (num_steps <= 0 || step < 0 || step > num_steps) {
    LLMC_FAIL("attention window of step %ld of %ld: the step must be within 0..%ld", step,
              num_steps, num_steps);
  }
  const double tokens = 1728 * ((double)step / (double)num_steps);
  const int blocks = (int)std::ceil(tokens / 128);  // exact: a division by a power of two
  return blocks < 1 ? 1 : blocks;
}

// A run's window (the CUDA trainer's -aw, train_gpt2.py's --window_blocks): N blocks at every
// step, kWindowSchedule for attention_window_blocks's, or 0 for none (every earlier block of the
// document).
constexpr int kWindowSchedule = -1;

// The window of step `step` of num_steps, in blocks (0: none).
inline int run_window_blocks(int window, long step, long num_steps) {
  return window == kWindowSchedule ? attention_window_blocks(step, num_steps) : window;
}

// The largest window of any step of a run (0: none): the schedule's last, 14 blocks.
inline int run_window_blocks_max(int window) {
  return window == kWindowSchedule ? attention_window_blocks(1, 1) : window;
}

// A short window not given (-aw N, a stage's aw=N): half of the long one, rounded down, as the
// reference's layers take it before record #89, which gives each stage's (short, long) pair.
constexpr int kShortWindowHalf = -1;

// One step's windows in blocks: the long one, which the layer plan's L layers take (0: none, every
// earlier block of the document), and the short one, which its S layers take.
struct StepWindows {
  int long_blocks = 0;
  int short_blocks = 0;
};

// The windows of a long window of long_blocks and a short one of short_window blocks
// (kShortWindowHalf: half the long).
inline StepWindows step_windows(int long_blocks, int short_window = kShortWindowHalf) {
  return {long_blocks, short_window == kShortWindowHalf ? long_blocks / 2 : short_window};
}

}  // namespace llmc
