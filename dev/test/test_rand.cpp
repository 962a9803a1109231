// Tests llmc/rand.h: MT19937 known answers, state save/restore, the SPEC.md
// permutation, and, when RAND_REFERENCE names a file written by
// dev/test/rand_reference.py, every draw against PyTorch bit for bit.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/rand.h"

using llmc::NormalKernel;
using llmc::Rng;
using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

constexpr int kReferenceMagic = 20240611;
constexpr int kReferenceVersion = 2;

enum ReferenceKind { kState = 1, kUniformDouble = 2, kUniformFloat = 3, kNormal = 4 };

const char* kind_name(int kind) {
  switch (kind) {
    case kState: return "state";
    case kUniformDouble: return "uniform double";
    case kUniformFloat: return "uniform float";
    case kNormal: return "normal";
  }
  return "unknown";
}

struct Record {
  int kind = 0;
  int kernel = 0;  // 0 none, 1 avx2, 2 libm
  uint64_t seed = 0;
  double mean = 0.0, std = 0.0;
  std::vector<int> calls;
  std::vector<uint32_t> values;  // raw 4-byte values (uint32 or float32 bits)
};

// Reads one record; false at the end of the file.
bool read_record(llmc::File& f, long file_size, Record* r) {
  if (ftell(f.handle()) >= file_size) return false;
  int32_t head[2];
  f.read(head, sizeof(head), "a record kind");
  r->kind = head[0];
  r->kernel = head[1];
  f.read(&r->seed, sizeof(r->seed), "a record seed");
  f.read(&r->mean, sizeof(r->mean), "a record mean");
  f.read(&r->std, sizeof(r->std), "a record std");
  int32_t num_calls = 0;
  f.read(&num_calls, sizeof(num_calls), "a record call count");
  if (num_calls < 0 || num_calls > 1000) {
    LLMC_FAIL("%s: corrupt record (%d calls); regenerate it with dev/test/rand_reference.py",
              f.path().c_str(), num_calls);
  }
  r->calls.resize(num_calls);
  if (num_calls > 0) f.read(r->calls.data(), num_calls * sizeof(int32_t), "record call sizes");
  int32_t num_values = 0;
  f.read(&num_values, sizeof(num_values), "a record value count");
  if (num_values < 0) {
    LLMC_FAIL("%s: corrupt record (%d values); regenerate it with dev/test/rand_reference.py",
              f.path().c_str(), num_values);
  }
  r->values.resize(num_values);
  if (num_values > 0) f.read(r->values.data(), num_values * sizeof(uint32_t), "record values");
  return true;
}

NormalKernel kernel_from_id(int id) {
  if (id == 1) return NormalKernel::kAvx2;
  if (id == 2) return NormalKernel::kLibm;
  LLMC_FAIL("rand reference: unknown normal kernel id %d; regenerate the file with "
            "dev/test/rand_reference.py", id);
}

std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  for (size_t i = 0; i < v.size(); i++) bits[i] = llmc::detail::float_bits(v[i]);
  return bits;
}

// What rand.h produces for the draws a record describes, as raw 4-byte values.
std::vector<uint32_t> reproduce(const Record& r) {
  Rng rng(r.seed);
  std::vector<uint32_t> out;
  switch (r.kind) {
    case kState: {
      for (int i = 0; i < r.calls[0]; i++) rng.u32();
      const llmc::RngState& s = rng.state();
      out.assign(s.words, s.words + llmc::kMtStateWords);
      out.push_back(s.position);
      break;
    }
    case kUniformDouble:
      for (int i = 0; i < r.calls[0]; i++) {
        const double d = rng.uniform_double();
        uint32_t words[2];
        memcpy(words, &d, sizeof(d));
        out.insert(out.end(), words, words + 2);
      }
      break;
    case kUniformFloat: {
      std::vector<float> v(r.calls[0]);
      for (float& x : v) x = rng.uniform_float();
      out = float_bits(v);
      break;
    }
    case kNormal: {
      const NormalKernel kernel = kernel_from_id(r.kernel);
      for (int n : r.calls) {
        std::vector<float> v(n);
        rng.normal(v.data(), n, r.mean, r.std, kernel);
        const std::vector<uint32_t> bits = float_bits(v);
        out.insert(out.end(), bits.begin(), bits.end());
      }
      break;
    }
  }
  return out;
}

std::string describe(const Record& r) {
  std::string calls;
  for (int n : r.calls) calls += (calls.empty() ? "" : ",") + std::to_string(n);
  const std::string kernel =
      r.kernel ? std::string("/") + llmc::normal_kernel_name(kernel_from_id(r.kernel)) : "";
  return llmc::strformat("%s%s seed %" PRIu64 " calls [%s] mean %g std %g", kind_name(r.kind),
                         kernel.c_str(), r.seed, calls.c_str(), r.mean, r.std);
}

struct GroupTally {
  int records = 0, records_differing = 0;
  long values = 0, values_differing = 0;
  long max_ulp = 0;
};

void compare_with_pytorch(const char* path) {
  llmc::File f(path, "rb");
  const long file_size = f.size();
  int32_t header[2];
  f.read(header, sizeof(header), "the header");
  if (header[0] != kReferenceMagic || header[1] != kReferenceVersion) {
    LLMC_FAIL("%s: not a rand reference file version %d (header %d %d); regenerate it with "
              "dev/test/rand_reference.py", path, kReferenceVersion, header[0], header[1]);
  }
  std::map<std::string, GroupTally> groups;
  std::set<int> kernels;
  Record r;
  while (read_record(f, file_size, &r)) {
    const std::vector<uint32_t> got = reproduce(r);
    std::string group = kind_name(r.kind);
    if (r.kernel) {
      group += std::string(" (") + llmc::normal_kernel_name(kernel_from_id(r.kernel)) + ")";
      kernels.insert(r.kernel);
    }
    GroupTally& g = groups[group];
    g.records++;
    g.values += (long)r.values.size();
    long differing = 0, first = -1;
    if (got.size() != r.values.size()) {
      differing = (long)r.values.size();
    } else {
      for (size_t i = 0; i < got.size(); i++) {
        if (got[i] == r.values[i]) continue;
        if (first < 0) first = (long)i;
        differing++;
        if (r.kind == kUniformFloat || r.kind == kNormal) {
          long ulp = std::labs((long)(int32_t)got[i] - (long)(int32_t)r.values[i]);
          if (ulp > g.max_ulp) g.max_ulp = ulp;
        }
      }
    }
    g.values_differing += differing;
    if (differing) g.records_differing++;
    std::string what = describe(r) + ": bitwise equal to PyTorch";
    if (differing && first >= 0) {
      what += llmc::strformat(" (%ld of %zu differ, first at [%ld]: got 0x%08x, PyTorch 0x%08x)",
                              differing, r.values.size(), first, got[first], r.values[first]);
    } else if (differing) {
      what += llmc::strformat(" (got %zu values, PyTorch %zu)", got.size(), r.values.size());
    }
    check(differing == 0, what);
  }
  for (const auto& [name, g] : groups) {
    printf("     %-28s %3d records, %8ld values, %ld differ (max %ld ulp)\n", name.c_str(),
           g.records, g.values, g.values_differing, g.max_ulp);
  }
  std::string compared, missing;
  for (int id = 1; id <= 2; id++) {
    std::string& list = kernels.count(id) ? compared : missing;
    list += std::string(list.empty() ? "" : ", ") + llmc::normal_kernel_name(kernel_from_id(id));
  }
  if (!missing.empty()) {
    printf("note: no PyTorch draws for the %s kernel here (this CPU cannot run PyTorch's "
           "version of it), so it was not compared\n", missing.c_str());
  }
  check_verbose(!kernels.empty(), "normal kernels compared with PyTorch: " + compared);
}

void test_known_answers() {
  Rng rng(5489);
  const uint32_t first = rng.u32();
  uint32_t tenth_thousand = first;
  for (int i = 2; i <= 10000; i++) tenth_thousand = rng.u32();
  check_verbose(first == 3499211612u,
                llmc::strformat("MT19937 seed 5489: first output %u (expected 3499211612)", first));
  check_verbose(tenth_thousand == 4123659995u,
                llmc::strformat("MT19937 seed 5489: 10000th output %u (expected 4123659995)",
                                tenth_thousand));
  Rng low(7), high((1ull << 32) + 7);
  bool same = true;
  for (int i = 0; i < 1000; i++) same = same && low.u32() == high.u32();
  check_verbose(same,
                "seeds equal in their low 32 bits give the same stream (as torch.manual_seed)");
}

void test_kernel_names() {
  check(llmc::parse_normal_kernel("avx2", "-x") == NormalKernel::kAvx2 &&
            llmc::parse_normal_kernel("libm", "-x") == NormalKernel::kLibm &&
            llmc::parse_normal_kernel(llmc::normal_kernel_name(NormalKernel::kLibm), "-x") ==
                NormalKernel::kLibm,
        "normal kernel names parse back");
  check_throws([] { llmc::parse_normal_kernel("avx512", "-x"); },
               "unknown normal kernel 'avx512' for -x: use avx2 or libm", "an unknown kernel name");
}

void test_uniform_ranges() {
  Rng rng(1);
  bool in_range = true;
  for (int i = 0; i < 100000; i++) {
    const float f = rng.uniform_float();
    const double d = rng.uniform_double();
    in_range = in_range && f >= 0.0f && f < 1.0f && d >= 0.0 && d < 1.0;
  }
  check_verbose(in_range, "uniform_float and uniform_double stay in [0, 1)");
}

void test_normal_moments(NormalKernel kernel) {
  const size_t n = 1 << 20;
  std::vector<float> v(n);
  Rng rng(123);
  rng.normal(v.data(), n, 0.5, 2.0, kernel);
  double sum = 0.0, sum_sq = 0.0;
  bool finite = true;
  for (float x : v) {
    finite = finite && std::isfinite(x);
    sum += x;
    sum_sq += (double)x * x;
  }
  const double mean = sum / n, std = std::sqrt(sum_sq / n - mean * mean);
  check_verbose(finite && std::fabs(mean - 0.5) < 0.01 && std::fabs(std - 2.0) < 0.01,
                llmc::strformat("%s kernel: 2^20 draws of normal(0.5, 2) have mean %.4f std %.4f",
                                llmc::normal_kernel_name(kernel), mean, std));
}

// The cephes emulations must stay close to the C library over the whole input
// range they see (log on (0, 1], sincos on [0, 2*pi)).
void test_avx2_math_accuracy() {
  double max_log_err = 0.0, max_sincos_err = 0.0;
  for (uint32_t i = 1; i <= (1u << 24); i += 7) {
    const float u = (float)i * (1.0f / 16777216.0f);
    max_log_err =
        std::fmax(max_log_err, std::fabs(llmc::detail::log_avx2(u) - std::log((double)u)));
    const float theta = (float)(2.0 * llmc::kPi) * u;
    float s, c;
    llmc::detail::sincos_avx2(theta, &s, &c);
    max_sincos_err = std::fmax(max_sincos_err, std::fabs(s - std::sin((double)theta)));
    max_sincos_err = std::fmax(max_sincos_err, std::fabs(c - std::cos((double)theta)));
  }
  check_verbose(
      max_log_err < 2e-6 && max_sincos_err < 2e-7,
      llmc::strformat("avx2 log/sincos emulation: max abs error %.2e / %.2e vs libm double",
                      max_log_err, max_sincos_err));
}

void test_state_restore() {
  Rng rng(99);
  std::vector<float> warm(7);
  rng.normal(warm.data(), 7, 0.0, 1.0);  // 7 scalar draws leave the pair's second value kept
  const llmc::RngState saved = rng.state();
  check_verbose(saved.has_kept_normal == 1, "an odd count of scalar normals keeps one value");
  std::vector<uint32_t> first_u32(1500);
  std::vector<float> first_normals(40);
  rng.normal(first_normals.data(), 3, 0.0, 1.0);
  for (uint32_t& x : first_u32) x = rng.u32();
  rng.normal(first_normals.data() + 3, 37, 0.0, 1.0);

  Rng other(12345);
  other.restore(saved);
  std::vector<uint32_t> second_u32(1500);
  std::vector<float> second_normals(40);
  other.normal(second_normals.data(), 3, 0.0, 1.0);
  for (uint32_t& x : second_u32) x = other.u32();
  other.normal(second_normals.data() + 3, 37, 0.0, 1.0);
  check_verbose(first_u32 == second_u32 &&
                    float_bits(first_normals) == float_bits(second_normals),
                "restore() continues the exact stream, kept normal included");

  llmc::RngState bad = saved;
  bad.position = llmc::kMtStateWords + 1;
  check_throws([&] { other.restore(bad); }, "corrupt RNG state", "restore rejects a bad position");
  bad = saved;
  bad.has_kept_normal = 2;
  check_throws([&] { other.restore(bad); }, "corrupt RNG state", "restore rejects a bad flag");

  Rng reseeded(99);
  rng.seed(99);
  bool same = true;
  for (int i = 0; i < 2000; i++) same = same && rng.u32() == reseeded.u32();
  check_verbose(same && rng.state().has_kept_normal == 0,
                "seed() restarts the stream and drops the kept normal");
}

void test_permutation() {
  // Hand-run SPEC.md's algorithm with a twin generator.
  Rng rng(2024), twin(2024);
  std::vector<int> expected = {0, 1, 2, 3, 4, 5};
  for (int i = 5; i >= 1; i--) std::swap(expected[i], expected[twin.u32() % (uint32_t)(i + 1)]);
  check_verbose(llmc::random_permutation(rng, 6) == expected,
                "random_permutation(6) follows SPEC.md");
  check(rng.u32() == twin.u32(), "random_permutation(n) draws exactly n - 1 values");

  Rng again(5);
  std::vector<int> p = llmc::random_permutation(again, 1000);
  std::vector<int> seen(1000, 0);
  bool valid = true;
  for (int x : p) {
    valid = valid && x >= 0 && x < 1000 && !seen[x];
    if (x >= 0 && x < 1000) seen[x] = 1;
  }
  check_verbose(valid, "random_permutation(1000) is a permutation");
  Rng none(5);
  check(llmc::random_permutation(none, 1) == std::vector<int>{0} &&
            llmc::random_permutation(none, 0).empty(),
        "random_permutation of 0 and 1 elements");
  check(none.u32() == Rng(5).u32(), "random_permutation of 0 and 1 elements draws nothing");
}

}  // namespace

int main() {
  try {
    test_known_answers();
    test_kernel_names();
    test_uniform_ranges();
    test_normal_moments(NormalKernel::kAvx2);
    test_normal_moments(NormalKernel::kLibm);
    test_avx2_math_accuracy();
    test_state_restore();
    test_permutation();
    const char* reference = getenv("RAND_REFERENCE");
    if (reference && *reference) {
      printf("comparing with PyTorch draws from %s\n", reference);
      compare_with_pytorch(reference);
    } else {
      printf("note: RAND_REFERENCE is not set, so draws were not compared with PyTorch "
             "(run dev/test/rand_reference.py OUT.bin and set RAND_REFERENCE=OUT.bin)\n");
    }
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_rand");
}
