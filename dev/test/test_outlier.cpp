// Tests llmc/outlier.h: z-scores against hand-computed values, the minimum count, window
// eviction, NaN/Inf that never enter the statistics, spikes flagged and kept out of the window,
// a window of identical values, settings checks, and a state saved as bytes (as a checkpoint
// stores it) that continues bit for bit.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/outlier.h"
#include "llmc/rand.h"

using llmc::OutlierDetector;
using llmc::OutlierState;
using testing::check_throws;
using testing::check_verbose;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

bool close(double got, double expected) { return std::fabs(got - expected) <= 1e-12; }

// Same z, bit for bit (so inf == inf and NaN would fail).
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

bool same_state(const OutlierDetector& a, const OutlierDetector& b) {
  return std::memcmp(&a.state(), &b.state(), sizeof(OutlierState)) == 0;
}

void feed(OutlierDetector& detector, const std::vector<double>& values) {
  for (double v : values) detector.update_and_score(v);
}

void test_reference_scores() {
  // 1..8: mean 4.5, squared deviations 2*(3.5^2 + 2.5^2 + 1.5^2 + 0.5^2) = 42, sample variance
  // 42/7 = 6.
  OutlierDetector d;
  bool zero = true;
  for (int i = 1; i <= 7; i++) zero = zero && d.update_and_score(i) == 0.0;
  check_verbose(zero && d.score(1000.0) == 0.0 && d.count() == 7,
                "with 7 values (minimum 8) every score is 0 and each value was taken");
  d.update_and_score(8);
  const double z10 = d.score(10.0), z2 = d.score(2.0), z_mean = d.score(4.5);
  check_verbose(close(z10, 5.5 / std::sqrt(6.0)) && close(z2, -2.5 / std::sqrt(6.0)) &&
                    z_mean == 0.0,
                llmc::strformat("window 1..8: z(10) = %.15f (5.5/sqrt(6) = %.15f), z(2) = %.15f, "
                                "z(4.5) = %g", z10, 5.5 / std::sqrt(6.0), z2, z_mean));

  // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, squared deviations 32, sample variance 32/7.
  OutlierDetector e;
  feed(e, {2, 4, 4, 4, 5, 5, 7, 9});
  const double z = e.update_and_score(12.0);
  const double expected = 7.0 / std::sqrt(32.0 / 7.0);
  check_verbose(close(z, expected),
                llmc::strformat("window 2,4,4,4,5,5,7,9: z(12) = %.15f, by hand 7/sqrt(32/7) = "
                                "%.15f", z, expected));
  check_verbose(e.count() == 9, "update_and_score scores against the window before pushing");

  OutlierDetector small(4, 3);
  feed(small, {10.0, 20.0});
  const double before = small.score(0.0);
  small.update_and_score(30.0);
  const double after = small.score(40.0);  // mean 20, variance 200/2
  check_verbose(before == 0.0 && close(after, 2.0),
                llmc::strformat("minimum count 3: z = %g with 2 values, z(40) = %.15f against "
                                "10,20,30 (by hand 2)", before, after));
}

void test_eviction() {
  // Each value x scores 4.5 / sqrt(6) = 1.84 against the 8 before it (mean x - 4.5): never a spike.
  OutlierDetector d(8, 8);
  std::vector<double> values;
  for (int i = 1; i <= 16; i++) values.push_back(i);
  feed(d, values);
  OutlierDetector fresh(8, 8);
  feed(fresh, {9, 10, 11, 12, 13, 14, 15, 16});
  const double z = d.score(20.0), z_fresh = fresh.score(20.0);
  check_verbose(d.count() == 8 && same_bits(z, z_fresh) && close(z, 7.5 / std::sqrt(6.0)),
                llmc::strformat("window 8 after 1..16 holds 9..16: count %d, z(20) = %.15f, a "
                                "detector fed only 9..16 gives %.15f, by hand 7.5/sqrt(6)",
                                d.count(), z, z_fresh));
}

void test_non_finite_never_poison() {
  OutlierDetector d;
  const double z_empty = d.update_and_score(kNaN);
  check_verbose(z_empty == kInf && d.is_spike(z_empty) && d.count() == 0,
                "NaN on an empty window scores +inf, is a spike, is not pushed");
  feed(d, {1, 2, 3, 4, 5, 6, 7, 8});
  const OutlierState before = d.state();
  const double z_before = d.score(10.0);
  bool all_inf = true;
  for (double bad : {kNaN, kInf, -kInf, -kNaN}) {
    const double z = d.update_and_score(bad);
    all_inf = all_inf && z == kInf && d.is_spike(z);
  }
  check_verbose(all_inf, "NaN, +Inf, -Inf, -NaN all score +inf and are spikes");
  check_verbose(std::memcmp(&before, &d.state(), sizeof(OutlierState)) == 0 &&
                    same_bits(d.score(10.0), z_before),
                llmc::strformat("after them the window is unchanged (count %d) and z(10) is the "
                                "same bits, %.15f", d.count(), d.score(10.0)));
}

void test_spikes() {
  // A plateau: a sawtooth around 4 (period 7, amplitude 0.03), then values at known z.
  OutlierDetector d(128, 8, 5.0);
  for (int i = 0; i < 64; i++) d.update_and_score(4.0 + 0.01 * ((i % 7) - 3));
  const int held = d.count();
  const double z_spike = d.update_and_score(6.0);
  const double z_again = d.update_and_score(6.0);
  check_verbose(d.is_spike(z_spike) && same_bits(z_spike, z_again) && d.count() == held,
                llmc::strformat("a jump to 6.0 scores %.1f > 5: flagged, not pushed, so the same "
                                "jump again scores the same %.1f and is flagged too", z_spike,
                                z_again));
  // Values just below and just above the threshold, placed with the window's own statistics:
  // z is linear in x, with slope 1/std.
  const double slope = d.score(5.0) - d.score(4.0);
  const double mean = 4.0 - d.score(4.0) / slope;
  const double z_above = d.score(mean + 5.01 / slope);
  check_verbose(d.is_spike(z_above), llmc::strformat("z = %.3f (above 5) is a spike", z_above));
  const double z_below = d.update_and_score(mean + 4.99 / slope);
  check_verbose(!d.is_spike(z_below) && d.count() == held + 1,
                llmc::strformat("z = %.3f (below 5) is not a spike and is pushed", z_below));
  const int before_drop = d.count();
  const double z_drop = d.update_and_score(1.0);
  check_verbose(z_drop < -5.0 && !d.is_spike(z_drop) && d.count() == before_drop + 1,
                llmc::strformat("a drop to 1.0 (z = %.1f) is no spike and is pushed: the window "
                                "follows a falling loss", z_drop));
}

void test_constant_window() {
  OutlierDetector d;
  feed(d, std::vector<double>(10, 3.25));
  check_verbose(d.score(3.25) == 0.0 && d.score(3.2500001) == kInf && d.score(3.0) == -kInf,
                "a window of identical values: the same value scores 0, higher +inf, lower -inf");
}

void test_extreme_values() {
  // The sum of eight 1e308 overflows to inf, and (x - inf) / inf would be NaN.
  OutlierDetector d;
  feed(d, std::vector<double>(8, 1e308));
  const double z = d.score(1e308);
  check_verbose(z == kInf && d.is_spike(z),
                llmc::strformat("a window whose sums overflow scores %g, a spike, not NaN", z));
}

void test_settings() {
  check_throws([] { OutlierDetector d(1); }, "window", "window of 1 value");
  check_throws([] { OutlierDetector d(llmc::kOutlierMaxWindow + 1); }, "window",
               "window over the maximum");
  check_throws([] { OutlierDetector d(16, 1); }, "minimum count", "minimum count 1");
  check_throws([] { OutlierDetector d(16, 17); }, "minimum count", "minimum count over the window");
  check_throws([] { OutlierDetector d(16, 8, 0.0); }, "threshold", "threshold 0");
  check_throws([] { OutlierDetector d(16, 8, kNaN); }, "threshold", "threshold NaN");
}

// A falling loss-like series from a seeded generator, with spikes, NaNs and Infs planted in it.
struct Series {
  std::vector<double> values;
  int planted = 0;
};

Series noisy_series(int n) {
  llmc::Rng rng(1234);
  std::vector<float> noise(n);
  rng.normal(noise.data(), n, 0.0, 0.05);
  Series series;
  for (int i = 0; i < n; i++) {
    double v = 6.0 * std::exp(-i / 200.0) + 3.0 + noise[i];
    bool planted = true;
    if (i % 101 == 50) {
      v = kNaN;
    } else if (i % 149 == 70) {
      v = kInf;
    } else if (i % 37 == 11) {
      v += 4.0;
    } else {
      planted = false;
    }
    series.values.push_back(v);
    series.planted += planted;
  }
  return series;
}

void test_state_round_trip() {
  const Series noisy = noisy_series(600);
  const std::vector<double>& series = noisy.values;
  const int cut = 257;
  OutlierDetector straight(64, 8);
  std::vector<double> scores_straight;
  int spikes = 0;
  std::vector<unsigned char> saved(sizeof(OutlierState));
  for (int i = 0; i < (int)series.size(); i++) {
    if (i == cut) std::memcpy(saved.data(), &straight.state(), sizeof(OutlierState));
    const double z = straight.update_and_score(series[i]);
    spikes += straight.is_spike(z);
    scores_straight.push_back(z);
  }
  OutlierState loaded;
  std::memcpy(&loaded, saved.data(), sizeof(OutlierState));
  OutlierDetector resumed(64, 8);
  resumed.restore(loaded);
  bool identical = true;
  for (int i = cut; i < (int)series.size(); i++) {
    identical = identical && same_bits(resumed.update_and_score(series[i]), scores_straight[i]);
  }
  check_verbose(identical && same_state(straight, resumed),
                llmc::strformat("state saved as %zu bytes at value %d and restored: the next %zu "
                                "scores and the final state are bitwise identical (%d spikes in "
                                "all)", sizeof(OutlierState), cut, series.size() - cut, spikes));
  check_verbose(spikes == noisy.planted,
                llmc::strformat("exactly the series' %d planted spikes, NaNs and Infs are flagged "
                                "(%d)", noisy.planted, spikes));

  OutlierDetector again(64, 8);
  feed(again, series);
  check_verbose(same_state(straight, again),
                "two detectors fed the same values hold byte-identical states");

  OutlierDetector other_window(32, 8);
  check_throws([&] { other_window.restore(loaded); }, "window of 64", "restore into window 32");
  auto corrupt = [&](void (*damage)(OutlierState*), const char* what) {
    OutlierState s = loaded;
    damage(&s);
    OutlierDetector target(64, 8);
    check_throws([&] { target.restore(s); }, "corrupt state", what);
  };
  corrupt([](OutlierState* s) { s->count = 65; }, "count over the window");
  corrupt([](OutlierState* s) { s->count = -1; }, "negative count");
  corrupt([](OutlierState* s) { s->next = 64; }, "next slot past the window");
  corrupt([](OutlierState* s) { s->values[3] = kNaN; }, "a NaN in the window");
  corrupt([](OutlierState* s) { s->count = 10; s->next = 3; }, "partly full window, next slot "
                                                                 "not after the last value");
}

}  // namespace

int main() {
  test_reference_scores();
  test_eviction();
  test_non_finite_never_poison();
  test_spikes();
  test_constant_window();
  test_extreme_values();
  test_settings();
  test_state_round_trip();
  return testing::summary("test_outlier");
}
