// Spike detection for the training loss and the gradient norm: a rolling z-score of each new value
// against the last N accepted values.
//
//   z = (x - mean) / std    over the window (std is the sample standard deviation, n - 1)
//
// Policy, so that one bad step can neither go unnoticed nor hide the next one:
//   - z is 0 while the window holds fewer than min_count values (too few to judge by).
//   - NaN and +-Inf score +inf, so they are always spikes, and are never pushed: a diverged step
//     cannot poison the mean and the spread.
//   - A spike is z > threshold, upward only. Spikes are not pushed either, so a spike cannot widen
//     the spread and hide the spike after it. Drops are pushed like any other value: the loss is
//     meant to fall, and the window has to follow it down.
//   - As spikes are never accepted, a lasting upward shift (say, the loss of a new data mix) keeps
//     being flagged; the detector reports, the trainer decides what to do about it.
//   - A window of identical values has std 0: a value equal to them scores 0, any other +-inf.
//
// The window is kept explicitly and the mean and spread are recomputed from it in two passes on
// every score: O(N) per training step, which costs nothing next to the step, and unlike running
// sums it neither drifts nor cancels catastrophically. The sums run in slot order, which the state
// fixes, so the same inputs (or a restored state and the same inputs) give the same bits.
//
// state()/restore() hand over OutlierState, plain fixed-size data that a checkpoint stores byte for
// byte; unused slots stay zero so that identical runs write identical bytes.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "utils.h"

namespace llmc {

constexpr int kOutlierMaxWindow = 1024;
constexpr int kOutlierDefaultWindow = 128;
constexpr int kOutlierDefaultMinCount = 8;
// Under a normal distribution one value in about 3.5 million lies 5 standard deviations above the
// mean, so a flagged value is worth a look.
constexpr double kOutlierDefaultThreshold = 5.0;

struct OutlierState {
  double values[kOutlierMaxWindow];  // ring buffer: slots [0, count) hold values, the rest are 0
  int64_t window;                    // N, the most values held
  int64_t count;                     // values held, at most window
  int64_t next;                      // slot the next accepted value goes to (the oldest once full)
};
static_assert(sizeof(OutlierState) == kOutlierMaxWindow * sizeof(double) + 3 * sizeof(int64_t),
              "OutlierState must have no padding, so its bytes are fully determined");

class OutlierDetector {
 public:
  explicit OutlierDetector(int window = kOutlierDefaultWindow,
                           int min_count = kOutlierDefaultMinCount,
                           double threshold = kOutlierDefaultThreshold)
      : min_count_(min_count), threshold_(threshold), s_() {
    if (window < 2 || window > kOutlierMaxWindow) {
      LLMC_FAIL("outlier detector: window of %d values is not 2 to %d", window, kOutlierMaxWindow);
    }
    if (min_count < 2 || min_count > window) {
      LLMC_FAIL("outlier detector: minimum count %d is not 2 (a spread needs two values) to the "
                "window of %d", min_count, window);
    }
    if (!(threshold > 0.0)) {
      LLMC_FAIL("outlier detector: threshold %g must be a positive number of standard deviations",
                threshold);
    }
    s_.window = window;
  }

  // The z-score of x against the window, without changing it.
  double score(double x) const {
    const double inf = std::numeric_limits<double>::infinity();
    if (!std::isfinite(x)) return inf;
    const int64_t n = s_.count;
    if (n < min_count_) return 0.0;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += s_.values[i];
    const double mean = sum / (double)n;
    double squares = 0.0;
    for (int64_t i = 0; i < n; i++) {
      const double d = s_.values[i] - mean;
      squares += d * d;
    }
    const double stddev = std::sqrt(squares / (double)(n - 1));
    if (stddev == 0.0) return x == mean ? 0.0 : (x > mean ? inf : -inf);
    const double z = (x - mean) / stddev;
    // Only values near the limits of double overflow the sums into inf - inf; call that a spike
    // rather than return a NaN that no threshold catches.
    return std::isnan(z) ? inf : z;
  }

  bool is_spike(double z) const { return z > threshold_; }

  // Scores x, then adds it to the window unless it is a spike (or NaN/Inf, which always are).
  double update_and_score(double x) {
    const double z = score(x);
    if (!is_spike(z)) push(x);
    return z;
  }

  int window() const { return (int)s_.window; }
  int count() const { return (int)s_.count; }
  double threshold() const { return threshold_; }

  const OutlierState& state() const { return s_; }

  // Continues from a saved state; the window size is part of it and must match this detector's
  // (min_count and the threshold are settings, free to change between runs).
  void restore(const OutlierState& state) {
    if (state.window != s_.window) {
      LLMC_FAIL("cannot resume the outlier detector: it was saved with a window of %lld values, "
                "this run uses %lld; resume with the same window", (long long)state.window,
                (long long)s_.window);
    }
    bool consistent = state.count >= 0 && state.count <= state.window && state.next >= 0 &&
                      state.next < state.window &&
                      (state.count == state.window || state.next == state.count);
    for (int64_t i = 0; consistent && i < state.count; i++) {
      consistent = std::isfinite(state.values[i]);
    }
    if (!consistent) {
      LLMC_FAIL("cannot resume the outlier detector: corrupt state (%lld values, next slot %lld, "
                "window %lld, or a value that is not finite); the checkpoint is damaged",
                (long long)state.count, (long long)state.next, (long long)state.window);
    }
    s_ = state;
  }

 private:
  void push(double x) {
    s_.values[s_.next] = x;
    s_.next = (s_.next + 1) % s_.window;
    if (s_.count < s_.window) s_.count++;
  }

  int min_count_;
  double threshold_;
  OutlierState s_;
};

}  // namespace llmc
