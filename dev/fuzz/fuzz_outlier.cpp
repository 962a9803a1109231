// Fuzzes the outlier detector with the input read as a series of doubles (any bit patterns:
// NaNs, infinities, subnormals, values near the limits). Scores are never NaN, NaN/Inf and spikes
// never enter the window, and a detector restored from a byte copy of the state saved half way
// continues with the same bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/outlier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const size_t n = size / sizeof(double);
  if (n == 0) return 0;
  std::vector<double> series(n);
  memcpy(series.data(), data, n * sizeof(double));
  llmc::OutlierDetector detector(/*window=*/16, /*min_count=*/4, /*threshold=*/3.0);
  std::vector<unsigned char> saved(sizeof(llmc::OutlierState));
  std::vector<double> scores;
  for (size_t i = 0; i < n; i++) {
    if (i == n / 2) memcpy(saved.data(), &detector.state(), sizeof(llmc::OutlierState));
    const int before = detector.count();
    const double z = detector.update_and_score(series[i]);
    fuzz::require(!std::isnan(z), "a score is never NaN");
    if (!std::isfinite(series[i])) fuzz::require(z == INFINITY, "NaN and Inf score +inf");
    const bool pushed = !detector.is_spike(z);
    fuzz::require(detector.count() == (pushed && before < 16 ? before + 1 : before),
                  "only values that are no spike enter the window");
    scores.push_back(z);
  }
  for (int i = 0; i < detector.count(); i++) {
    fuzz::require(std::isfinite(detector.state().values[i]), "the window holds finite values only");
  }
  llmc::OutlierState state;
  memcpy(&state, saved.data(), sizeof(state));
  llmc::OutlierDetector resumed(16, 4, 3.0);
  resumed.restore(state);
  for (size_t i = n / 2; i < n; i++) {
    const double z = resumed.update_and_score(series[i]);
    fuzz::require(memcmp(&z, &scores[i], sizeof(double)) == 0,
                  "a restored detector gives the same scores");
  }
  fuzz::require(memcmp(&resumed.state(), &detector.state(), sizeof(llmc::OutlierState)) == 0,
                "a restored detector ends in the same state");
  return 0;
}
