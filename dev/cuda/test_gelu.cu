// Tests the MLP's activations: gelu_forward and gelu_backward_inplace (the fallbacks of the
// matmul's GELU epilogues and the recomputation of -r 1) against cpu::gelu_forward /
// cpu::gelu_backward, and relu2_forward and relu2_backward_inplace (the modern architecture's
// relu(x)^2), relu2_backward_from_output_inplace (record #89's, -mr 1: 2 sqrt(y) of the stored output)
// and gelu_erf_forward and gelu_erf_backward_inplace (the exact GELU of record #89's MUDD
// gate generators) against references written here (the CPU trainer has GELU only): inputs of std 2
// so both tails (and ReLU's zero side) are covered, sizes of whole and partial launch blocks, the
// forward output poisoned first, and both kernels run twice for identical bits. Also the generators'
// gate rows, gate_rows_bias_scale and its backward, against a reference of their roundings: odd row
// counts, both gate generators' columns and both dense connections' (their fixed scale, a float, and
// no scale gradient), the outputs poisoned first, twice for identical bits.
#include "dev/cuda/kernel_test.h"

namespace gelu_tests {

using ActivationLauncher = void (*)(floatX*, const floatX*, size_t, cudaStream_t);
// ref[i] = act(inp[i]); ref_dinp[i] = dout[i] * act'(inp[i]), in FP32 as the kernels compute.
using ActivationReference = std::function<void(std::vector<float>& ref, std::vector<float>& ref_dinp,
                                               const std::vector<float>& inp,
                                               const std::vector<float>& dout)>;

void gelu_reference(std::vector<float>& ref, std::vector<float>& ref_dinp,
                    const std::vector<float>& inp, const std::vector<float>& dout) {
  cpu::gelu_forward(ref.data(), inp.data(), inp.size());
  std::fill(ref_dinp.begin(), ref_dinp.end(), 0.0f);  // cpu::gelu_backward accumulates
  cpu::gelu_backward(ref_dinp.data(), inp.data(), dout.data(), inp.size());
}

void relu2_reference(std::vector<float>& ref, std::vector<float>& ref_dinp,
                     const std::vector<float>& inp, const std::vector<float>& dout) {
  for (size_t i = 0; i < inp.size(); i++) {
    const float r = std::max(inp[i], 0.0f);
    ref[i] = r * r;
    ref_dinp[i] = dout[i] * (2.0f * r);
  }
}

void gelu_erf_reference(std::vector<float>& ref, std::vector<float>& ref_dinp,
                        const std::vector<float>& inp, const std::vector<float>& dout) {
  for (size_t i = 0; i < inp.size(); i++) {
    const double x = inp[i], phi = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
    ref[i] = (float)(x * phi);
    ref_dinp[i] = (float)(dout[i] * (phi + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI)));
  }
}

void test_activation(const char* name, ActivationLauncher forward_launch,
                     ActivationLauncher backward_launch, const ActivationReference& reference,
                     size_t n, llmc::Rng& rng) {
  printf("\n%s n=%zu\n", name, n);
  const std::vector<float> inp = random_stored(rng, n, 0.0f, 2.0f);
  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  std::vector<float> ref(n), ref_dinp(n);
  reference(ref, ref_dinp, inp, dout);
  DeviceArray<floatX> d_inp(inp), out(n);
  auto forward = [&] {
    out.poison();
    forward_launch(out, d_inp, n, 0);
  };
  forward();
  check_close("forward out", out.download(), ref, kTolStore);
  const Snapshot forward_bits(out);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out));

  // In place: the gradient of the activation's output becomes the gradient of its input.
  DeviceArray<floatX> d(n);
  auto backward = [&] {
    d.upload(dout);
    backward_launch(d, d_inp, n, 0);
  };
  backward();
  check_close("backward dinp", d.download(), ref_dinp, kTolStore);
  const Snapshot backward_bits(d);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(d));
}

// relu2_backward_from_output_inplace: dout times 2 sqrt(y), y = relu(x)^2 as stored, in FP32 and
// rounded once; within the build's rounding of the derivative from x (2 relu(x)); twice the same bits.
void test_relu2_from_output(size_t n, llmc::Rng& rng) {
  printf("\nrelu2 backward from its output n=%zu\n", n);
  const std::vector<float> inp = random_stored(rng, n, 0.0f, 2.0f);
  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  std::vector<float> y(n), ref_dinp(n), plain_dinp(n);
  for (size_t i = 0; i < n; i++) {
    const float r = std::max(inp[i], 0.0f);
    y[i] = r * r;
  }
  y = stored(y);
  for (size_t i = 0; i < n; i++) {
    ref_dinp[i] = dout[i] * (2.0f * std::sqrt(y[i]));
    plain_dinp[i] = dout[i] * (2.0f * std::max(inp[i], 0.0f));
  }
  DeviceArray<floatX> d_y(y), d(n);
  auto backward = [&] {
    d.upload(dout);
    relu2_backward_from_output_inplace(d, d_y, n, 0);
  };
  backward();
  const std::vector<float> got = d.download();
  check_close("backward dinp = dout 2 sqrt(y)", got, ref_dinp, kTolStore);
  check_close("backward dinp near dout 2 relu(x) (y's rounding apart)", got, plain_dinp, 2 * kTolStore);
  const Snapshot bits(d);
  backward();
  check_same_bits("backward twice", bits, Snapshot(d));
}

// gate_rows_bias_scale and its backward over N rows of stride 48, the first `columns` of each gated;
// fixed: the scale the float 0.1 (the dense connections'), else a parameter of 0.1 stored.
void test_gate_rows(int N, int columns, bool fixed, llmc::Rng& rng) {
  const int stride = llmc::kMuddGateStride;
  printf("\ngate_rows N=%d columns=%d stride=%d%s\n", N, columns, stride, fixed ? " fixed scale" : "");
  const size_t n = (size_t)N * stride;
  const std::vector<float> product = random_stored(rng, n, 0.0f, 1.0f), drows = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> bias = random_stored(rng, columns, 0.5f, 2.0f);
  const std::vector<float> scale = fixed ? std::vector<float>{(float)llmc::kMuddConnectionScale} : stored({0.1f});
  const std::vector<float> dbias_start = random_stored(rng, columns, 0.0f, 1.0f), dscale_start = stored({0.25f});
  std::vector<float> ref_pre(n, 0.0f), ref_rows(n, 0.0f), ref_dpre(n, 0.0f), ref_dbias(dbias_start);
  double dscale_sum = dscale_start[0];
  std::vector<double> dbias_sums(dbias_start.begin(), dbias_start.end());
  for (int r = 0; r < N; r++) {
    for (int k = 0; k < columns; k++) {
      const size_t i = (size_t)r * stride + k;
      ref_pre[i] = (float)(floatX)(product[i] + bias[k]);
      ref_rows[i] = (float)(floatX)(ref_pre[i] * scale[0]);
      ref_dpre[i] = (float)(floatX)(drows[i] * scale[0]);
      dbias_sums[k] += ref_dpre[i];
      dscale_sum += (double)ref_pre[i] * drows[i];
    }
  }
  for (int k = 0; k < columns; k++) ref_dbias[k] = (float)dbias_sums[k];
  DeviceArray<floatX> d_product(product), d_bias(bias), d_scale(scale), rows(n), pre(n);
  auto forward = [&] {
    rows.poison();
    pre.poison();
    gate_rows_bias_scale(rows, pre, d_product, d_bias, fixed ? nullptr : (const floatX*)d_scale, N, columns, stride,
                         0, scale[0]);
  };
  forward();
  check_close("rows", rows.download(), ref_rows, kTolStore);
  check_close("pre-scale rows", pre.download(), ref_pre, kTolStore);
  const Snapshot forward_bits(rows, pre);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(rows, pre));

  DeviceArray<floatX> d_drows(drows), dpre(n), dbias(columns), dscale(1);
  DeviceArray<float> partials((size_t)kRowBlocks * (columns + 1));
  auto backward = [&] {
    dpre.poison();
    partials.poison();
    dbias.upload(dbias_start);
    dscale.upload(dscale_start);
    gate_rows_bias_scale_backward(dpre, dbias, fixed ? nullptr : (floatX*)dscale, partials, d_drows, pre,
                                  fixed ? nullptr : (const floatX*)d_scale, N, columns, stride, 7, 0, scale[0]);
  };
  backward();
  check_close("dpre", dpre.download(), ref_dpre, kTolStore);
  check_close("dbias", dbias.download(), ref_dbias, kTolSum);
  check_close("dscale", dscale.download(), {fixed ? dscale_start[0] : (float)dscale_sum}, fixed ? 0.0f : kTolSum);
  const Snapshot backward_bits(dpre, dbias, dscale);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dpre, dbias, dscale));
}

void run() {
  llmc::Rng rng(11);
  const size_t sizes[] = {
      (size_t)4 * 64 * 4 * 768,    // GPT-2 small fch
      (size_t)3 * 100 * 4 * 1600,  // d48 fch, T=100
      (size_t)8 * 12347,           // the last launch block partly used
  };
  for (size_t n : sizes) {
    test_activation("gelu", gelu_forward, gelu_backward_inplace, gelu_reference, n, rng);
  }
  for (size_t n : sizes) {
    test_activation("relu2", relu2_forward, relu2_backward_inplace, relu2_reference, n, rng);
    test_relu2_from_output(n, rng);
  }
  for (size_t n : sizes) {
    test_activation("gelu_erf", gelu_erf_forward, gelu_erf_backward_inplace, gelu_erf_reference, n, rng);
  }
  for (int N : {1, 37, 1001, 5003}) {  // 5003: rows of 20 and of 3 in the row blocks
    for (int columns : {26, 41}) test_gate_rows(N, columns, false, rng);
    for (int columns : {llmc::kMuddLayerCoefficients, llmc::kMuddFinalCoefficients}) {
      test_gate_rows(N, columns, true, rng);
    }
  }
}

}  // namespace gelu_tests
