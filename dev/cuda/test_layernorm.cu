// Tests layernorm_forward, fused_residual_layernorm_forward and layernorm_backward against
// cpu::layernorm_forward / cpu::layernorm_backward (and cpu::residual_forward): row counts that
// fill neither the 8-row launch blocks nor the 256 fixed row blocks of the backward's column sums,
// C = 768 and 1600 and a C narrower than one warp's pass, gradients accumulated onto random
// non-zero ones, outputs poisoned first, and every kernel run twice for identical bits. The
// backward also sums the columns of the dresidual it writes (the bias gradient of the projection
// below) when asked, and must give the same other outputs either way.
#include "dev/cuda/kernel_test.h"

namespace layernorm_tests {

void test_layernorm(int N, int C, llmc::Rng& rng) {
  printf("\nlayernorm N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const std::vector<float> weight = random_stored(rng, C, 1.0f, 0.3f);
  const std::vector<float> bias = random_stored(rng, C, 0.0f, 0.3f);
  DeviceArray<floatX> d_weight(weight), d_bias(bias), out(n);
  DeviceArray<float> mean(N), rstd(N);

  // Forward: an offset and a spread unlike the normalised output's, so both statistics matter.
  const std::vector<float> inp = random_stored(rng, n, 0.5f, 2.0f);
  DeviceArray<floatX> d_inp(inp);
  std::vector<float> ref_out(n), ref_mean(N), ref_rstd(N);
  cpu::layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), inp.data(),
                         weight.data(), bias.data(), N, C);
  auto forward = [&] {
    out.poison();
    mean.poison();
    rstd.poison();
    layernorm_forward(out, mean, rstd, d_inp, d_weight, d_bias, N, C, 0);
  };
  forward();
  check_close("forward out", out.download(), ref_out, kTolStore);
  check_close("forward mean", mean.download(), ref_mean, kTolFP32);
  check_close("forward rstd", rstd.download(), ref_rstd, kTolFP32);
  const Snapshot forward_bits(out, mean, rstd);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out, mean, rstd));

  // Fused: residual = a + b rounded to nearest (the same on host and device: exact), then the
  // layernorm of that rounded residual.
  const std::vector<float> a = random_stored(rng, n, 0.5f, 1.5f);
  const std::vector<float> b = random_stored(rng, n, 0.0f, 1.0f);
  DeviceArray<floatX> d_a(a), d_b(b), residual(n);
  std::vector<float> ref_residual(n);
  cpu::residual_forward(ref_residual.data(), a.data(), b.data(), n);
  ref_residual = stored(ref_residual);
  cpu::layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), ref_residual.data(),
                         weight.data(), bias.data(), N, C);
  auto fused = [&] {
    residual.poison();
    out.poison();
    mean.poison();
    rstd.poison();
    fused_residual_layernorm_forward(residual, out, mean, rstd, d_a, d_b, d_weight, d_bias, N, C,
                                     0);
  };
  fused();
  check_close("fused residual", residual.download(), ref_residual, 0.0f);
  check_close("fused out", out.download(), ref_out, kTolStore);
  check_close("fused mean", mean.download(), ref_mean, kTolFP32);
  check_close("fused rstd", rstd.download(), ref_rstd, kTolFP32);
  const Snapshot fused_bits(residual, out, mean, rstd);
  fused();
  check_same_bits("fused twice", fused_bits, Snapshot(residual, out, mean, rstd));

  // Backward of the layernorm of `inp`, with the statistics of the CPU forward given to both
  // sides, accumulating onto random gradients.
  cpu::layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), inp.data(),
                         weight.data(), bias.data(), N, C);
  mean.upload(ref_mean);
  rstd.upload(ref_rstd);
  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dresidual0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dweight0 = random_stored(rng, C, 0.0f, 1.0f);
  const std::vector<float> dbias0 = random_stored(rng, C, 0.0f, 1.0f);
  const std::vector<float> dresidual_dbias0 = random_stored(rng, C, 0.0f, 1.0f);
  DeviceArray<floatX> d_dout(dout), dresidual(n), dweight(C), dbias(C), dresidual_dbias(C);
  DeviceArray<float> partials((size_t)kRowBlocks * 3 * C);
  const uint32_t seed = rng.u32();
  auto backward = [&](bool sum_dresidual) {
    dresidual.upload(dresidual0);
    dweight.upload(dweight0);
    dbias.upload(dbias0);
    dresidual_dbias.upload(dresidual_dbias0);
    layernorm_backward(dresidual, dweight, dbias, sum_dresidual ? (floatX*)dresidual_dbias : nullptr,
                       partials, d_dout, d_inp, d_weight, mean, rstd, N, C, seed, 0);
  };
  backward(false);
  const Snapshot no_sums_bits(dresidual, dweight, dbias);
  backward(true);
  std::vector<float> ref_dresidual = dresidual0, ref_dweight = dweight0, ref_dbias = dbias0;
  cpu::layernorm_backward(ref_dresidual.data(), ref_dweight.data(), ref_dbias.data(), dout.data(),
                          inp.data(), weight.data(), ref_mean.data(), ref_rstd.data(), N, C);
  check_close("backward dresidual", dresidual.download(), ref_dresidual, kTolStore);
  check_close("backward dweight", dweight.download(), ref_dweight, kTolSum);
  check_close("backward dbias", dbias.download(), ref_dbias, kTolSum);
  // The column sums of the updated dresidual (as stored), added onto dresidual_dbias0.
  const std::vector<float> got_dresidual = dresidual.download();
  std::vector<double> column_sums(C, 0.0);
  for (size_t i = 0; i < n; i++) column_sums[i % C] += got_dresidual[i];
  std::vector<float> ref_dresidual_dbias(C);
  for (int c = 0; c < C; c++) ref_dresidual_dbias[c] = (float)(dresidual_dbias0[c] + column_sums[c]);
  check_close("backward dresidual column sums", dresidual_dbias.download(), ref_dresidual_dbias, kTolSum);
  check_same_bits("backward without the column sums", no_sums_bits, Snapshot(dresidual, dweight, dbias));
  const Snapshot backward_bits(dresidual, dweight, dbias, dresidual_dbias);
  backward(true);
  check_same_bits("backward twice", backward_bits, Snapshot(dresidual, dweight, dbias, dresidual_dbias));
}

void run() {
  llmc::Rng rng(42);
  test_layernorm(4 * 64, 768, rng);    // GPT-2 small
  test_layernorm(3 * 100, 1600, rng);  // d48 width, 37.5 launch blocks
  test_layernorm(5 * 203, 768, rng);   // 4 rows per backward block; one short, two empty
  test_layernorm(4 * 1000, 1600, rng); // 16 rows per backward block, the last blocks empty
  test_layernorm(7, 64, rng);          // one partial launch block; C < 32 lanes x 8
}

}  // namespace layernorm_tests
