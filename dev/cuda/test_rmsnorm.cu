// Tests rmsnorm_forward, fused_residual_rmsnorm_forward and rmsnorm_backward against a CPU
// reference written here (the CPU trainer has GPT-2's LayerNorm only): y = x * rstd * weight with
// rstd = 1 / sqrt(mean(x^2) + FLT_EPSILON), and dx = rstd * (dnorm - norm * mean(dnorm * norm)),
// dnorm = weight * dout, norm = x * rstd. Odd row counts that fill neither the 8-row launch blocks
// nor the 256 fixed row blocks of the backward's column sums, C = 768, 1600 and 136 (17 16-byte
// pieces of BF16: lanes with no piece, a partial chunk), the statistics-only forward (out nullptr),
// gradients accumulated onto random non-zero ones, outputs poisoned first, and every kernel run
// twice for identical bits. The backward sums the columns of the dresidual it writes when asked,
// and must give the same other outputs either way. Without a gain (weight and dweight nullptr, the
// speedrun's norms) against the reference with a weight of ones, and the forwards bit for bit the
// same as the weighted kernels given ones (multiplying by 1 is exact, so they must agree).
#include "dev/cuda/kernel_test.h"

namespace rmsnorm_tests {

// Sums in double: the reference is more exact than either build.
void rmsnorm_forward_reference(std::vector<float>& out, std::vector<float>& rstd,
                               const std::vector<float>& inp, const std::vector<float>& weight,
                               int N, int C) {
  for (int r = 0; r < N; r++) {
    const float* x = &inp[(size_t)r * C];
    double squares = 0.0;
    for (int c = 0; c < C; c++) squares += (double)x[c] * x[c];
    const double s = 1.0 / std::sqrt(squares / C + (double)FLT_EPSILON);
    rstd[r] = (float)s;
    for (int c = 0; c < C; c++) out[(size_t)r * C + c] = (float)(x[c] * s * weight[c]);
  }
}

// dresidual += dx, dweight += sum over rows of norm * dout.
void rmsnorm_backward_reference(std::vector<float>& dresidual, std::vector<float>& dweight,
                                const std::vector<float>& dout, const std::vector<float>& inp,
                                const std::vector<float>& weight, const std::vector<float>& rstd,
                                int N, int C) {
  std::vector<double> dweight_sum(C, 0.0);
  for (int r = 0; r < N; r++) {
    const size_t base = (size_t)r * C;
    const double s = rstd[r];
    double dnorm_norm = 0.0;
    for (int c = 0; c < C; c++) dnorm_norm += (double)weight[c] * dout[base + c] * inp[base + c] * s;
    const double dnorm_norm_mean = dnorm_norm / C;
    for (int c = 0; c < C; c++) {
      const double norm = inp[base + c] * s, dnorm = (double)weight[c] * dout[base + c];
      dresidual[base + c] = (float)(dresidual[base + c] + s * (dnorm - norm * dnorm_norm_mean));
      dweight_sum[c] += norm * dout[base + c];
    }
  }
  for (int c = 0; c < C; c++) dweight[c] = (float)(dweight[c] + dweight_sum[c]);
}

void test_rmsnorm(int N, int C, bool gain, llmc::Rng& rng) {
  printf("\nrmsnorm N=%d C=%d%s\n", N, C, gain ? "" : ", without a gain");
  const size_t n = (size_t)N * C;
  const std::vector<float> weight = gain ? random_stored(rng, C, 1.0f, 0.3f) : std::vector<float>(C, 1.0f);
  DeviceArray<floatX> d_weight(weight), out(n);
  DeviceArray<float> rstd(N);
  // The kernels' weight: none without a gain; d_weight (ones) is then the weighted kernels' check.
  const floatX* kernel_weight = gain ? (floatX*)d_weight : nullptr;

  // Forward: an offset and a spread unlike the normalised output's.
  const std::vector<float> inp = random_stored(rng, n, 0.5f, 2.0f);
  DeviceArray<floatX> d_inp(inp);
  std::vector<float> ref_out(n), ref_rstd(N);
  rmsnorm_forward_reference(ref_out, ref_rstd, inp, weight, N, C);
  auto forward = [&](bool with_out) {
    out.poison();
    rstd.poison();
    rmsnorm_forward(with_out ? (floatX*)out : nullptr, rstd, d_inp, kernel_weight, N, C, 0);
  };
  forward(true);
  check_close("forward out", out.download(), ref_out, kTolStore);
  check_close("forward rstd", rstd.download(), ref_rstd, kTolFP32);
  const Snapshot forward_bits(out, rstd);
  forward(true);
  check_same_bits("forward twice", forward_bits, Snapshot(out, rstd));
  const Snapshot rstd_bits(rstd);
  forward(false);
  check_same_bits("forward statistics only", rstd_bits, Snapshot(rstd));
  if (!gain) {
    rmsnorm_forward(out, rstd, d_inp, d_weight, N, C, 0);
    check_same_bits("forward as weight ones", forward_bits, Snapshot(out, rstd));
  }

  // Fused: residual = a + b rounded to nearest (the same on host and device: exact), then the
  // norm of that rounded residual.
  const std::vector<float> a = random_stored(rng, n, 0.5f, 1.5f);
  const std::vector<float> b = random_stored(rng, n, 0.0f, 1.0f);
  DeviceArray<floatX> d_a(a), d_b(b), residual(n);
  std::vector<float> ref_residual(n);
  for (size_t i = 0; i < n; i++) ref_residual[i] = a[i] + b[i];
  ref_residual = stored(ref_residual);
  rmsnorm_forward_reference(ref_out, ref_rstd, ref_residual, weight, N, C);
  auto fused = [&] {
    residual.poison();
    out.poison();
    rstd.poison();
    fused_residual_rmsnorm_forward(residual, out, rstd, d_a, d_b, kernel_weight, N, C, 0);
  };
  fused();
  check_close("fused residual", residual.download(), ref_residual, 0.0f);
  check_close("fused out", out.download(), ref_out, kTolStore);
  check_close("fused rstd", rstd.download(), ref_rstd, kTolFP32);
  const Snapshot fused_bits(residual, out, rstd);
  fused();
  check_same_bits("fused twice", fused_bits, Snapshot(residual, out, rstd));
  if (!gain) {
    fused_residual_rmsnorm_forward(residual, out, rstd, d_a, d_b, d_weight, N, C, 0);
    check_same_bits("fused as weight ones", fused_bits, Snapshot(residual, out, rstd));
  }

  // Backward of the norm of `inp`, with the reference's rstd given to both sides, accumulating
  // onto random gradients.
  rmsnorm_forward_reference(ref_out, ref_rstd, inp, weight, N, C);
  rstd.upload(ref_rstd);
  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dresidual0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dweight0 = random_stored(rng, C, 0.0f, 1.0f);
  const std::vector<float> dresidual_dbias0 = random_stored(rng, C, 0.0f, 1.0f);
  DeviceArray<floatX> d_dout(dout), dresidual(n), dweight(C), dresidual_dbias(C);
  DeviceArray<float> partials((size_t)kRowBlocks * 2 * C);
  const uint32_t seed = rng.u32();
  auto backward = [&](bool sum_dresidual, bool weighted) {
    dresidual.upload(dresidual0);
    dweight.upload(dweight0);
    dresidual_dbias.upload(dresidual_dbias0);
    partials.poison();
    rmsnorm_backward(dresidual, weighted ? (floatX*)dweight : nullptr,
                     sum_dresidual ? (floatX*)dresidual_dbias : nullptr, partials, d_dout, d_inp,
                     weighted ? (floatX*)d_weight : nullptr, rstd, N, C, seed, 0);
  };
  backward(false, gain);
  const Snapshot no_sums_bits(dresidual, dweight);
  backward(true, gain);
  std::vector<float> ref_dresidual = dresidual0, ref_dweight = dweight0;
  rmsnorm_backward_reference(ref_dresidual, ref_dweight, dout, inp, weight, ref_rstd, N, C);
  check_close("backward dresidual", dresidual.download(), ref_dresidual, kTolStore);
  // Without a gain dweight is neither given nor touched.
  check_close("backward dweight", dweight.download(), gain ? ref_dweight : dweight0, gain ? kTolSum : 0.0f);
  // The column sums of the updated dresidual (as stored), added onto dresidual_dbias0.
  const std::vector<float> got_dresidual = dresidual.download();
  std::vector<double> column_sums(C, 0.0);
  for (size_t i = 0; i < n; i++) column_sums[i % C] += got_dresidual[i];
  std::vector<float> ref_dresidual_dbias(C);
  for (int c = 0; c < C; c++) ref_dresidual_dbias[c] = (float)(dresidual_dbias0[c] + column_sums[c]);
  check_close("backward dresidual column sums", dresidual_dbias.download(), ref_dresidual_dbias, kTolSum);
  check_same_bits("backward without the column sums", no_sums_bits, Snapshot(dresidual, dweight));
  const Snapshot backward_bits(dresidual, dweight, dresidual_dbias);
  backward(true, gain);
  check_same_bits("backward twice", backward_bits, Snapshot(dresidual, dweight, dresidual_dbias));
  if (!gain) {
    // Nothing to sum at all: no partials. (Unlike the forwards, the backward without a gain is not
    // the weighted one's bits with ones: it leaves out the gain's products, which the compiler then
    // contracts into other fused multiply-adds; the reference above bounds both.)
    dresidual.upload(dresidual0);
    dweight.upload(dweight0);
    rmsnorm_backward(dresidual, nullptr, nullptr, nullptr, d_dout, d_inp, nullptr, rstd, N, C, seed, 0);
    check_same_bits("backward without partials", no_sums_bits, Snapshot(dresidual, dweight));
  }
}

void run() {
  llmc::Rng rng(43);
  for (bool gain : {true, false}) {
    test_rmsnorm(4 * 64 + 1, 768, gain, rng);  // d12 width, one row past whole launch blocks
    test_rmsnorm(3 * 101, 1600, gain, rng);    // d48 width, a partial chunk of the row
    test_rmsnorm(5 * 203, 136, gain, rng);     // 4 rows per backward block; one short, two empty
    test_rmsnorm(3999, 768, gain, rng);        // 16 rows per backward block; one short, six empty
    test_rmsnorm(7, 136, gain, rng);           // one partial launch block
  }
  test_rmsnorm(2 * 97, 128, false, rng);       // the speedrun's tiny width
}

}  // namespace rmsnorm_tests
