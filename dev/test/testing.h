// A small check harness for the test programs: every check prints what it
// compared (and by how much, for tensors), and test_summary() ends the program
// with a line of counts and an exit status that says whether all passed.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "../../llmc/utils.h"

namespace testing {

inline int& passed_count() { static int n = 0; return n; }
inline int& failed_count() { static int n = 0; return n; }

inline bool check(bool ok, const std::string& what) {
  if (ok) {
    passed_count()++;
  } else {
    failed_count()++;
    printf("FAIL %s\n", what.c_str());
  }
  return ok;
}

// Like check, but also prints passing checks (for the tests whose numbers matter).
inline bool check_verbose(bool ok, const std::string& what) {
  if (ok) printf("ok   %s\n", what.c_str());
  return check(ok, what);
}

// Runs fn and checks that it throws llmc::Error whose message contains `needle`.
inline bool check_throws(const std::function<void()>& fn, const std::string& needle,
                         const std::string& what) {
  try {
    fn();
  } catch (const llmc::Error& e) {
    std::string msg = e.what();
    bool ok = msg.find(needle) != std::string::npos;
    if (!ok) printf("     (message was: %s)\n", msg.c_str());
    return check(ok, what + " -> error mentioning '" + needle + "'");
  }
  return check(false, what + " -> expected an error mentioning '" + needle + "', got none");
}

// Compares two float tensors: passes when every element satisfies
// |a - b| <= atol + rtol * |b|. Prints max abs/rel error either way.
inline bool check_tensor(const std::string& name, const float* got, const float* ref, size_t n,
                         float atol, float rtol) {
  double max_abs = 0.0, max_rel = 0.0;
  size_t worst = 0, bad = 0;
  for (size_t i = 0; i < n; i++) {
    double a = got[i], b = ref[i];
    double d = std::fabs(a - b);
    if (!(d <= atol + rtol * std::fabs(b))) bad++;  // also catches NaN
    if (!(d <= max_abs)) { max_abs = d; worst = i; }
    double r = d / (std::fabs(b) + 1e-12);
    if (std::fabs(b) > atol && r > max_rel) max_rel = r;
  }
  bool ok = bad == 0;
  printf("%s %-24s n=%-10zu max abs %.3e  max rel %.3e  (atol %.1e rtol %.1e)",
         ok ? "ok  " : "FAIL", name.c_str(), n, max_abs, max_rel, atol, rtol);
  if (!ok) printf("  %zu bad, worst [%zu] got %.7g ref %.7g", bad, worst, got[worst], ref[worst]);
  printf("\n");
  if (ok) passed_count()++; else failed_count()++;
  return ok;
}

// ||got - ref|| / ||ref|| of n values, in double.
inline double relative_norm_error(const float* got, const float* ref, size_t n) {
  double diff = 0.0, base = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - ref[i];
    diff += d * d;
    base += (double)ref[i] * ref[i];
  }
  return std::sqrt(diff) / (std::sqrt(base) + 1e-30);
}

// Relative error of the whole tensor: ||got - ref|| / ||ref||.
inline bool check_tensor_norm(const std::string& name, const float* got, const float* ref,
                              size_t n, double max_rel_norm) {
  double rel = relative_norm_error(got, ref, n);
  bool ok = rel <= max_rel_norm;  // NaN fails
  printf("%s %-24s n=%-10zu |got-ref|/|ref| %.3e  (bound %.1e)\n", ok ? "ok  " : "FAIL",
         name.c_str(), n, rel, max_rel_norm);
  if (ok) passed_count()++; else failed_count()++;
  return ok;
}

// Prints "<program>: N passed, M failed" and returns the exit status.
inline int summary(const char* program) {
  printf("%s: %d passed, %d failed\n", program, passed_count(), failed_count());
  return failed_count() == 0 ? 0 : 1;
}

}  // namespace testing
