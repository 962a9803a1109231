// Progress output for people, shared by both trainers: the time left on each step line and the
// summary at the end of a run.
//
// EtaEstimator: the time left is the remaining steps times the mean wall-clock time of the last
// `window` steps, the first step (warm-up) left out. Wall-clock intervals between finished steps
// include validation, sampling and checkpoints, so the estimate covers them too; the window lets
// it follow speed changes.
// Times are passed in (wall_seconds() in the trainers) so that the tests can give their own.
//
// RunSummary collects what the closing lines report:
//   summary: wall time 1h02m (3725.4 s), 300 steps
//   summary: tokens seen 157286400 (300 steps of 524288)
//   summary: best val loss 3.281234 at step 250
//   summary: last checkpoint log_d12/model_00000300.bin
// A resumed run takes the validation losses of its earlier part from its main.log.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "logger.h"
#include "utils.h"

namespace llmc {

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "42s", "12m05s", "3h07m", "2d04h": two units, enough to plan by.
inline std::string format_duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  if (s < 60) return strformat("%lds", s);
  if (s < 3600) return strformat("%ldm%02lds", s / 60, s % 60);
  if (s < 86400) return strformat("%ldh%02ldm", s / 3600, s % 3600 / 60);
  return strformat("%ldd%02ldh", s / 86400, s % 86400 / 3600);
}

class EtaEstimator {
 public:
  explicit EtaEstimator(size_t window) : window_(window) {}

  // Called when a step has finished, at time now_seconds. The first step only starts the clock:
  // it includes one-time warm-up (allocation, the first touch of every buffer, library set-up).
  void step_finished(double now_seconds) {
    if (steps_finished_++ > 0) {
      intervals_.push_back(now_seconds - last_);
      sum_ += intervals_.back();
      if (intervals_.size() > window_) {
        sum_ -= intervals_.front();
        intervals_.pop_front();
      }
    }
    last_ = now_seconds;
  }

  double seconds_left(long remaining_steps) const {
    if (intervals_.empty()) return 0.0;
    return sum_ / intervals_.size() * (double)remaining_steps;
  }

  // What the line of step `step` says after "ETA": the time left for `remaining_steps` more
  // steps, or "after step N" (the next one) while no step after the first has finished.
  std::string time_left(long step, long remaining_steps) const {
    if (remaining_steps > 0 && intervals_.empty()) return strformat("after step %ld", step + 1);
    return format_duration(seconds_left(remaining_steps));
  }

 private:
  size_t window_;
  long steps_finished_ = 0;
  double last_ = 0.0;
  double sum_ = 0.0;
  std::deque<double> intervals_;
};

constexpr size_t kEtaWindow = 20;

class RunSummary {
 public:
  RunSummary(double start_seconds, long tokens_per_step)
      : start_(start_seconds), tokens_per_step_(tokens_per_step) {}
  // Where a step's tokens change over the run (a stage plan, llmc/stages.h): tokens_through(s) is
  // the tokens of steps 0 to s - 1.
  RunSummary(double start_seconds, std::function<long(long)> tokens_through)
      : start_(start_seconds), tokens_per_step_(0), tokens_through_(std::move(tokens_through)) {}

  // The validation losses a resumed run logged before it was interrupted.
  void add_logged(const std::vector<LogRecord>& records) {
    for (const LogRecord& r : records) {
      if (r.kind == "val" && r.has("loss")) val_loss(r.step, r.number("loss"));
    }
  }

  void val_loss(long step, double loss) {
    if (best_step_ < 0 || loss < best_loss_) {
      best_loss_ = loss;
      best_step_ = step;
    }
  }

  void checkpoint(const std::string& path) { last_checkpoint_ = path; }

  // The summary lines for a run that ended after `steps` steps (counted from step 0).
  std::vector<std::string> lines(double now_seconds, long steps) const {
    const double seconds = now_seconds - start_;
    std::vector<std::string> out;
    out.push_back(strformat("summary: wall time %s (%.1f s), %ld steps", format_duration(seconds).c_str(),
                            seconds, steps));
    out.push_back(tokens_through_
                      ? strformat("summary: tokens seen %ld (%ld steps of the stage plan)", tokens_through_(steps), steps)
                      : strformat("summary: tokens seen %ld (%ld steps of %ld)", steps * tokens_per_step_, steps,
                                  tokens_per_step_));
    out.push_back(best_step_ < 0 ? std::string("summary: best val loss none (no validation)")
                                 : strformat("summary: best val loss %.6f at step %ld", best_loss_, best_step_));
    out.push_back("summary: last checkpoint " + (last_checkpoint_.empty() ? std::string("none") : last_checkpoint_));
    return out;
  }

  void print(double now_seconds, long steps) const {
    for (const std::string& line : lines(now_seconds, steps)) printf("%s\n", line.c_str());
    fflush(stdout);
  }

 private:
  double start_;
  long tokens_per_step_;
  std::function<long(long)> tokens_through_;  // empty: tokens_per_step_ every step
  double best_loss_ = 0.0;
  long best_step_ = -1;
  std::string last_checkpoint_;
};

}  // namespace llmc
