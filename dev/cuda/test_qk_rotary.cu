// Tests qk_norm_rotary_forward and qk_norm_rotary_backward (the modern architecture's QK-norm and
// half-truncated rotary, in place on qkv [B, T, 3C]), and record #89's key offset after it (its
// own section below). The first two against the double-precision CPU reference of
// qk_rotary_reference.h, written from the definition: odd token counts and head counts, head sizes
// 128 and 64 (and 8 and 256, the smallest and largest the launcher takes; 72, whose lanes hold a
// pair past the half of the head), positions up to 1022, head counts that leave a part of the heads
// a lane loads at once, token counts that leave a block's warps idle. v's columns must come back
// unchanged, qk_rstd is poisoned first, and each kernel runs twice for identical bits. The kernels
// work in place, so their outputs cannot be poisoned; the inputs (mean 0.5, std 2: rstd near 0.5)
// differ from every correct output, so an element left unwritten fails. The CPU's analytic backward
// is itself checked against central differences of its forward on a few elements: q's and k's,
// rotated and unrotated pairs. Each shape also runs in record #89's layout (adjacent pairs (2j,
// 2j + 1), positions over the rows as one sequence), with frequencies rescaled as YaRN's are, passed
// in as the model passes its own; and with record #89's paired heads, which rotate head h of the token
// at position t at 2t + (h & 1) (q's and k's heads alike). The paired heads' regrouping of each
// token's qkv row (paired_heads_regroup) has its own section below.
#include "dev/cuda/kernel_test.h"
#include "dev/cuda/qk_rotary_reference.h"

namespace qk_rotary_tests {

struct QkShape {
  int B, T, NH, HS;
};

// d(sum_i dy_i y_i)/dx_i by central differences of reference_forward, beside reference_backward,
// for elements of both halves, rotated (i < HS/4 and its partner) and passed unrotated.
void check_reference_backward(const std::vector<double>& x, const std::vector<double>& dy, int t,
                              const std::vector<float>& freq, bool adjacent, const std::string& what) {
  const int HS = (int)x.size();
  std::vector<double> dx(HS), y(HS), xh = x;
  reference_backward(dx.data(), dy.data(), x.data(), HS, t, freq, adjacent);
  auto loss = [&](const std::vector<double>& at) {
    reference_forward(y.data(), at.data(), HS, t, freq, adjacent);
    double sum = 0.0;
    for (int i = 0; i < HS; i++) sum += dy[i] * y[i];
    return sum;
  };
  double squares = 0.0;
  for (double v : dx) squares += v * v;
  const double rms = std::sqrt(squares / HS);
  double worst = 0.0;
  for (int i : {0, 1, HS / 4 - 1, HS / 4, HS / 2 - 1, HS / 2, HS / 2 + 1, 3 * HS / 4, HS - 1}) {
    const double h = 1e-5 * (std::fabs(x[i]) + 1.0);
    xh[i] = x[i] + h;
    const double up = loss(xh);
    xh[i] = x[i] - h;
    const double down = loss(xh);
    xh[i] = x[i];
    worst = std::max(worst, std::fabs((up - down) / (2 * h) - dx[i]) / (std::fabs(dx[i]) + rms));
  }
  testing::check_verbose(worst <= 1e-7, llmc::strformat("reference backward %s against central "
                                                        "differences: max error %.2e (1e-7)",
                                                        what.c_str(), worst));
}

// The kernels' frequencies: the base ones, or record #89's layout with frequencies as YaRN rescales
// them; freq: the same for the reference.
RotaryFrequencies test_frequencies(int HS, bool record89, std::vector<float>* freq) {
  RotaryFrequencies f = rotary_frequencies(HS, record89);
  *freq = record89 ? reference_rescaled_frequencies(HS) : reference_frequencies(HS);
  for (int j = 0; j < HS / 2; j++) f.freq[j] = (*freq)[j];
  return f;
}

// paired: record #89's paired heads (with its layout; NH even).
void test_qk_rotary(const QkShape& s, bool record89, llmc::Rng& rng, bool paired = false) {
  const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, C = NH * HS;
  printf("\nqk norm rotary B=%d T=%d NH=%d HS=%d%s%s\n", B, T, NH, HS,
         record89 ? " record #89's pairs, flat positions, YaRN's frequencies" : "", paired ? ", paired heads" : "");
  const size_t N = (size_t)B * T, n = N * 3 * C;
  const std::vector<float> qkv = random_stored(rng, n, 0.5f, 2.0f), dout = random_stored(rng, n, 0.0f, 1.0f);
  std::vector<float> freq;
  RotaryFrequencies f = test_frequencies(HS, record89, &freq);
  f.paired_heads = paired;

  // q and k heads of each token, in double, from the stored inputs; v is neither changed nor used.
  std::vector<float> ref_out = qkv, ref_dqkv = dout, ref_rstd(N * 2 * NH);
  std::vector<double> x(HS), dy(HS), y(HS), dx(HS);
  for (size_t token = 0; token < N; token++) {
    const int token_position = (int)(record89 ? token : token % T);
    for (int head = 0; head < 2 * NH; head++) {
      const int t = paired ? 2 * token_position + (head % NH) % 2 : token_position;
      const size_t at = token * 3 * C + (size_t)head * HS;
      for (int i = 0; i < HS; i++) x[i] = qkv[at + i], dy[i] = dout[at + i];
      ref_rstd[token * 2 * NH + head] = (float)reference_forward(y.data(), x.data(), HS, t, freq, record89);
      reference_backward(dx.data(), dy.data(), x.data(), HS, t, freq, record89);
      for (int i = 0; i < HS; i++) ref_out[at + i] = (float)y[i], ref_dqkv[at + i] = (float)dx[i];
      const bool spot = token == N - 1 && (head == 0 || head == 2 * NH - 1);
      if (spot) check_reference_backward(x, dy, t, freq, record89, head == 0 ? "q head 0" : "k's last head");
    }
  }

  DeviceArray<floatX> d_qkv(n);
  DeviceArray<float> rstd(N * 2 * NH);
  auto forward = [&] {
    d_qkv.upload(qkv);
    rstd.poison();
    qk_norm_rotary_forward(d_qkv, rstd, B, T, NH, HS, f, 0);
  };
  forward();
  const std::vector<float> got = d_qkv.download();
  check_close("forward q, k", columns(got, N, 3 * C, 0, 2 * C), columns(ref_out, N, 3 * C, 0, 2 * C),
              kTolStore);
  check_close("forward v unchanged", columns(got, N, 3 * C, 2 * C, 3 * C),
              columns(qkv, N, 3 * C, 2 * C, 3 * C), 0.0f);
  check_close("forward qk_rstd", rstd.download(), ref_rstd, kTolFP32);
  const Snapshot forward_bits(d_qkv, rstd);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(d_qkv, rstd));

  // In place: the gradient of the rotary's output becomes the gradient of the norm's input, from
  // the forward's output (d_qkv) and rstd.
  DeviceArray<floatX> d(n);
  auto backward = [&] {
    d.upload(dout);
    qk_norm_rotary_backward(d, d_qkv, rstd, B, T, NH, HS, f, 0);
  };
  backward();
  const std::vector<float> got_d = d.download();
  // BF16: the GPU recovers xhat from the forward's rounded output (2^-8 of each pair's size) and
  // rounds dx once; emulating that on the CPU for these shapes gave errors (in check_close's
  // measure) up to 3.5e-3 (forward 3.0e-3), within kTolStore. FP32: up to 5.7e-7.
  check_close("backward dq, dk", columns(got_d, N, 3 * C, 0, 2 * C), columns(ref_dqkv, N, 3 * C, 0, 2 * C),
              kTolStore);
  check_close("backward dv unchanged", columns(got_d, N, 3 * C, 2 * C, 3 * C),
              columns(dout, N, 3 * C, 2 * C, 3 * C), 0.0f);
  const Snapshot backward_bits(d);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(d));
}

// Head sizes the kernels cannot take are refused with a message naming the limit; so are paired heads of
// an odd number of heads.
void test_qk_rotary_bad_head_size() {
  DeviceArray<floatX> qkv(3 * 512);
  DeviceArray<float> rstd(2);
  const RotaryFrequencies f = rotary_frequencies(8);
  testing::check_throws([&] { qk_norm_rotary_forward(qkv, rstd, 1, 1, 1, 512, f, 0); }, "head size 512",
                        "qk_norm_rotary_forward at head size 512");
  testing::check_throws([&] { qk_norm_rotary_backward(qkv, qkv, rstd, 1, 1, 1, 6, f, 0); }, "head size 6",
                        "qk_norm_rotary_backward at head size 6");
  RotaryFrequencies paired = rotary_frequencies(8, true);
  paired.paired_heads = true;
  testing::check_throws([&] { qk_norm_rotary_forward(qkv, rstd, 1, 1, 3, 8, paired, 0); }, "paired heads of 3 heads",
                        "qk_norm_rotary_forward with paired heads of 3 heads");
}

// Decoding token by token (B = 1, T = 1, first_position t) in record #89's layout gives the bits of
// the forward over the whole sequence: the position is the token's place in the decoded sequence
// (with paired heads, its heads' positions 2t and 2t + 1 follow it).
void test_qk_rotary_decode(int T, int NH, int HS, llmc::Rng& rng, bool paired = false) {
  const int C = NH * HS, W = 3 * C;
  printf("\nqk norm rotary decoding T=%d NH=%d HS=%d, record #89's pairs%s\n", T, NH, HS,
         paired ? ", paired heads" : "");
  const std::vector<float> qkv = random_stored(rng, (size_t)T * W, 0.5f, 2.0f);
  std::vector<float> freq;
  RotaryFrequencies f = test_frequencies(HS, true, &freq);
  f.paired_heads = paired;
  DeviceArray<floatX> whole(qkv.size()), row(W);
  DeviceArray<float> rstd((size_t)T * 2 * NH), row_rstd(2 * NH);
  whole.upload(qkv);
  qk_norm_rotary_forward(whole, rstd, 1, T, NH, HS, f, 0);
  std::vector<float> decoded;
  for (int t = 0; t < T; t++) {
    row.upload(std::vector<float>(qkv.begin() + (size_t)t * W, qkv.begin() + (size_t)(t + 1) * W));
    qk_norm_rotary_forward(row, row_rstd, 1, 1, NH, HS, f, 0, t);
    const std::vector<float> got = row.download();
    decoded.insert(decoded.end(), got.begin(), got.end());
  }
  check_close("decoded rows against the forward", decoded, whole.download(), 0.0f);
}

// ---- The key offset (key_offset_forward, key_offset_backward, key_offset_decode) ----
// Against a CPU reference written from the definition: over the N = B x T rows as one sequence,
// dims d of a key head with d % (HS/2) >= HS/4 (the rotary's unturned ones; in record #89's layout of
// adjacent pairs d >= HS/2) from the row before,
// row 0 keeping its own. Copies are exact (tolerance 0), the gradient's row 0 (two values summed,
// rounded once) to a rounding; q, v and the turned dims must come back unchanged, the scratch and
// the tail are poisoned first, and each launcher runs twice for identical bits.

bool key_stationary(int column, int C, int HS, bool adjacent) {
  if (column < C || column >= 2 * C) return false;
  const int d = (column - C) % HS;
  return adjacent ? d >= HS / 2 : d % (HS / 2) >= HS / 4;
}

void test_key_offset(int B, int T, int NH, int HS, bool adjacent, llmc::Rng& rng) {
  const int C = NH * HS, N = B * T, W = 3 * C;
  printf("\nkey offset B=%d T=%d NH=%d HS=%d%s\n", B, T, NH, HS, adjacent ? " record #89's pairs" : "");
  const std::vector<float> qkv = random_stored(rng, (size_t)N * W, 0.0f, 1.0f);
  const std::vector<float> dout = random_stored(rng, (size_t)N * W, 0.0f, 1.0f);
  std::vector<float> shifted = qkv, dshifted = dout, tail;
  for (int n = 0; n < N; n++) {
    for (int c = 0; c < W; c++) {
      if (!key_stationary(c, C, HS, adjacent)) continue;
      const size_t at = (size_t)n * W + c;
      if (n > 0) shifted[at] = qkv[at - W];
      dshifted[at] = (n + 1 < N ? dout[at + W] : 0.0f) + (n == 0 ? dout[at] : 0.0f);
      if (n == N - 1) tail.push_back(qkv[at]);
    }
  }
  DeviceArray<floatX> d_qkv(qkv.size()), d_tail(C / 2), scratch((size_t)N * C);
  auto forward = [&] {
    d_qkv.upload(qkv);
    d_tail.poison();
    scratch.poison();
    key_offset_forward(d_qkv, scratch, d_tail, N, C, HS, adjacent, 0);
  };
  forward();
  check_close("forward qkv", d_qkv.download(), shifted, 0.0f);
  check_close("forward tail (last key's)", d_tail.download(), tail, 0.0f);
  const Snapshot forward_bits(d_qkv, d_tail);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(d_qkv, d_tail));

  DeviceArray<floatX> d(dout.size());
  auto backward = [&] {
    d.upload(dout);
    d_qkv.upload(shifted);
    scratch.poison();
    key_offset_backward(d, d_qkv, scratch, d_tail, N, C, HS, adjacent, 0);
  };
  backward();
  check_close("backward dqkv", d.download(), dshifted, kTolStore);
  check_close("backward qkv restored", d_qkv.download(), qkv, 0.0f);
  const Snapshot backward_bits(d, d_qkv);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(d, d_qkv));
}

// Decoding token by token (B = 1): the keys each step leaves in the cache, where the attention's
// decoder puts the token's k (emulated: copied in on the host), are the forward's shifted ones.
void test_key_offset_decode(int T, int NH, int HS, bool adjacent, llmc::Rng& rng) {
  const int C = NH * HS, W = 3 * C, max_t = T + 1;
  printf("\nkey offset decoding T=%d NH=%d HS=%d%s\n", T, NH, HS, adjacent ? " record #89's pairs" : "");
  const std::vector<float> qkv = random_stored(rng, (size_t)T * W, 0.0f, 1.0f);
  std::vector<float> ref_cache((size_t)NH * max_t * HS, 0.0f);
  for (int t = 0; t < T; t++) {
    for (int c = C; c < 2 * C; c++) {
      const int h = (c - C) / HS, i = (c - C) % HS, from = key_stationary(c, C, HS, adjacent) && t > 0 ? t - 1 : t;
      ref_cache[((size_t)h * max_t + t) * HS + i] = qkv[(size_t)from * W + c];
    }
  }
  DeviceArray<floatX> cache(ref_cache.size()), row(W);
  cache.upload(std::vector<float>(ref_cache.size(), 0.0f));
  for (int t = 0; t < T; t++) {
    row.upload(std::vector<float>(qkv.begin() + (size_t)t * W, qkv.begin() + (size_t)(t + 1) * W));
    key_offset_decode(row, cache, t, max_t, C, HS, adjacent, 0);
    std::vector<float> host = cache.download();
    const std::vector<float> k = row.download();
    for (int h = 0; h < NH; h++) {
      for (int i = 0; i < HS; i++) host[((size_t)h * max_t + t) * HS + i] = k[C + h * HS + i];
    }
    cache.upload(host);
  }
  std::vector<float> got = cache.download();
  for (int h = 0; h < NH; h++) {  // row T: the last token's own keys, left for a next token
    for (int i = 0; i < HS; i++) got[((size_t)h * max_t + T) * HS + i] = 0.0f;
  }
  check_close("decoded keys in the cache", got, ref_cache, 0.0f);
}

// ---- Record #89's paired heads' regrouping (paired_heads_regroup) ----
// Against a CPU reference written from the definition: a token's row [q0 q1 k0 k1 v0 v1] (halves of
// C/2) becomes [q0 k0 v0 q1 k1 v1], and the inverse puts it back. Copies: exact (tolerance 0). Each
// direction runs twice for identical bits; a half that is not a whole number of 16-byte pieces is
// refused with a message naming the launcher.

void test_paired_regroup(int N, int C, llmc::Rng& rng) {
  printf("\npaired heads' regrouping N=%d C=%d\n", N, C);
  const int half = C / 2;
  const std::vector<float> rows = random_stored(rng, (size_t)N * 3 * C, 0.0f, 1.0f);
  std::vector<float> ref(rows.size());
  const int order[6] = {0, 2, 4, 1, 3, 5};  // q0 k0 v0 q1 k1 v1 of q0 q1 k0 k1 v0 v1
  for (int n = 0; n < N; n++) {
    for (int part = 0; part < 6; part++) {
      const float* from = rows.data() + (size_t)n * 3 * C + (size_t)order[part] * half;
      std::copy(from, from + half, ref.begin() + (size_t)n * 3 * C + (size_t)part * half);
    }
  }
  DeviceArray<floatX> qkv(rows.size());
  auto regroup = [&](PairedDirection direction, const std::vector<float>& from) {
    qkv.upload(from);
    paired_heads_regroup(qkv, N, C, direction, 0);
  };
  regroup(PairedDirection::kForward, rows);
  check_close("regrouped rows", qkv.download(), ref, 0.0f);
  const Snapshot forward_bits(qkv);
  regroup(PairedDirection::kForward, rows);
  check_same_bits("regrouped twice", forward_bits, Snapshot(qkv));
  regroup(PairedDirection::kInverse, ref);
  check_close("the inverse gives the rows back", qkv.download(), rows, 0.0f);
  const Snapshot inverse_bits(qkv);
  regroup(PairedDirection::kInverse, ref);
  check_same_bits("inverse twice", inverse_bits, Snapshot(qkv));
}

void test_paired_regroup_refused() {
  DeviceArray<floatX> qkv(3 * 12);
  testing::check_throws([&] { paired_heads_regroup(qkv, 1, 12, PairedDirection::kForward, 0); },
                        "paired_heads_regroup", "paired_heads_regroup at C 12 (halves of 6 values)");
}

void run() {
  llmc::Rng rng(35);
  for (bool record89 : {false, true}) {
    test_qk_rotary({3, 37, 5, 128}, record89, rng);  // d12's head size, 111 tokens
    test_qk_rotary({1, 1023, 1, 128}, record89, rng);  // the tiny preset's one head; positions up to 1022
    test_qk_rotary({3, 29, 7, 64}, record89, rng);  // d48's head size; 14 heads: 8 loaded at once, then 6
    test_qk_rotary({2, 7, 3, 72}, record89, rng);   // 36 pairs: a lane's second pair only on lanes 0-3
    test_qk_rotary({1, 9, 3, 256}, record89, rng);  // the largest head size: 4 pairs a lane
    test_qk_rotary({5, 3, 1, 8}, record89, rng);  // the smallest: 2 frequencies, 1 and 1/1024
  }
  test_qk_rotary({4, 300, 1, 64}, true, rng);  // flat positions up to 1199 over 4 rows
  // Record #89's paired heads: d12's 6 heads of 128 (q's and k's 12 loaded 4 at once, a group taking q's
  // last two and k's first two), the tiny preset's 2 of 64 (positions up to 2 x 299 + 1 over 2 rows), 14
  // of 64 (8 at once, the last group part-filled), 4 of 72, 2 of 256 (2 at once), 2 of 8.
  test_qk_rotary({3, 37, 6, 128}, true, rng, true);
  test_qk_rotary({2, 150, 2, 64}, true, rng, true);
  test_qk_rotary({3, 29, 14, 64}, true, rng, true);
  test_qk_rotary({2, 7, 4, 72}, true, rng, true);
  test_qk_rotary({1, 9, 2, 256}, true, rng, true);
  test_qk_rotary({5, 3, 2, 8}, true, rng, true);
  test_qk_rotary_decode(37, 3, 64, rng);
  test_qk_rotary_decode(29, 6, 128, rng, true);
  test_qk_rotary_bad_head_size();
  for (bool adjacent : {false, true}) {
    test_key_offset(3, 37, 5, 128, adjacent, rng);  // d12's head size, 111 rows, the last block part-filled
    test_key_offset(1, 1, 1, 8, adjacent, rng);     // one row: nothing shifts, the tail its own
    test_key_offset(2, 29, 3, 64, adjacent, rng);   // row 29 takes row 28's over the rows' seam
    test_key_offset_decode(13, 3, 64, adjacent, rng);
  }
  test_paired_regroup(37, 768, rng);  // d12's width, an odd number of rows
  test_paired_regroup(1, 128, rng);   // the tiny preset's, one row
  test_paired_regroup(300, 256, rng);
  test_paired_regroup(5, 16, rng);    // halves of one 16-byte piece (BF16)
  test_paired_regroup_refused();
}

}  // namespace qk_rotary_tests
