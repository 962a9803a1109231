// Times the FP8 cast kernels of the -fp8 2 step (BF16 build) at the shapes of GPT-2's layers and
// prints one line per kernel and shape: milliseconds and the bytes a second they move, beside a
// device-to-device copy of the same bytes (the memory system's practical rate). Bytes counted:
// the cast-transposes read 2 and write 2 a value (the FP8 rows and their transpose), with GELU or
// LayerNorm in the cast as well (the row statistics and LayerNorm's parameters are not counted),
// GELU' in the cast reads 4 and writes 2 (its column sums, C floats every 128 rows, not counted),
// the amax reads 2. Inputs rotate among several sets larger than L2 together, so the timed runs
// read from memory.
//   build/bench_kernels fp8_cast [R C]...   (default: d48 at B=8 and d12 at B=64, T=1024)
#include "dev/cuda/kernel_test.h"

#include <memory>

namespace fp8_cast_bench {

struct CastShape {
  int R, C;
};

// The median of 20 runs of launch(set), the sets in turn.
template <typename Launch>
float time_ms(int sets, const Launch& launch) {
  return median_launch_ms(20, 3, [&](int rep) { launch(rep % sets); });
}

void report(const char* kernel, const CastShape& s, double bytes, float ms) {
  printf("%-34s R %6d C %5d  %7.3f ms  %6.0f GB/s\n", kernel, s.R, s.C, ms, bytes / ms / 1e6);
}

void bench(const CastShape& s) {
  const size_t n = (size_t)s.R * s.C;
  const int sets = std::max(2, ceil_div(128l << 20, (long)(2 * n * sizeof(floatX))));  // 128 MiB and more
  llmc::Rng rng(7);
  std::vector<std::unique_ptr<DeviceArray<floatX>>> x, pre_gelu;
  for (int i = 0; i < sets; i++) {
    x.emplace_back(new DeviceArray<floatX>(random_stored(rng, n, 0.0f, 1.0f)));
    pre_gelu.emplace_back(new DeviceArray<floatX>(random_stored(rng, n, 0.0f, 1.5f)));
  }
  DeviceArray<floatX> copy(n);
  DeviceArray<uint8_t> rows(n), rows_t((size_t)s.C * fp8_padded(s.R));
  // Delayed scaling's scales (s = 1), as the trainer's casts after its first step.
  const Fp8Scale e4m3 = {1.0f, 0u, 1.0f, fp8_emax(Fp8Format::kE4M3)};
  const Fp8Scale e5m2 = {1.0f, 0u, 1.0f, fp8_emax(Fp8Format::kE5M2)};
  DeviceArray<Fp8Scale> scales(std::vector<Fp8Scale>{e4m3, e5m2});
  Fp8Scale* scale = scales;

  report("copy (cudaMemcpyAsync)", s, 4.0 * n, time_ms(sets, [&](int k) {
    cudaCheck(cudaMemcpyAsync(copy, *x[k], n * sizeof(floatX), cudaMemcpyDeviceToDevice));
  }));
  report("fp8_cast_transpose E4M3", s, 4.0 * n, time_ms(sets, [&](int k) {
    fp8_cast_transpose(rows, rows_t, scale, *x[k], s.R, s.C, Fp8Format::kE4M3, true, 0);
  }));
  report("fp8_cast_transpose E5M2", s, 4.0 * n, time_ms(sets, [&](int k) {
    fp8_cast_transpose(rows, rows_t, scale + 1, *x[k], s.R, s.C, Fp8Format::kE5M2, true, 0);
  }));
  report("fp8_source_cast_transpose (GELU)", s, 4.0 * n, time_ms(sets, [&](int k) {
    fp8_source_cast_transpose(rows, rows_t, scale, *pre_gelu[k], fp8_activation_source(Activation::kGelu), s.R, s.C,
                              Fp8Format::kE4M3, true, 0);
  }));
  DeviceArray<float> mean(random_stored(rng, s.R, 0.0f, 0.5f)), rstd(random_stored(rng, s.R, 1.0f, 0.2f));
  DeviceArray<floatX> ln_weight(random_stored(rng, s.C, 1.0f, 0.2f)), ln_bias(random_stored(rng, s.C, 0.0f, 0.2f));
  const Fp8CastSource ln = fp8_norm_source(mean, rstd, ln_weight, ln_bias);
  report("fp8_source_cast_transpose LayerNorm", s, 4.0 * n, time_ms(sets, [&](int k) {
    fp8_source_cast_transpose(rows, rows_t, scale, *x[k], ln, s.R, s.C, Fp8Format::kE4M3, true, 0);
  }));
  DeviceArray<float> col_partials((size_t)fp8_tile_rows(s.R) * s.C);
  report("fp8_activation_backward_cast_transpose (GELU')", s, 6.0 * n, time_ms(sets, [&](int k) {
    fp8_activation_backward_cast_transpose(rows, rows_t, scale + 1, *x[k], *pre_gelu[k], Activation::kGelu,
                                           col_partials, s.R, s.C, Fp8Format::kE5M2, 0);
  }));
  report("fp8_amax", s, 2.0 * n, time_ms(sets, [&](int k) { fp8_amax(scale, *x[k], n, 0); }));
}

int run(int argc, char** argv) {
  std::vector<CastShape> shapes = {{8192, 1600}, {8192, 4800}, {8192, 6400},
                                   {65536, 768}, {65536, 2304}, {65536, 3072}};
  if (argc > 1) {
    if ((argc - 1) % 2 != 0) {
      fprintf(stderr, "error: bench_kernels fp8_cast: give each shape as two numbers, rows and columns\n");
      return 1;
    }
    shapes.clear();
    for (int i = 1; i < argc; i += 2) shapes.push_back({atoi(argv[i]), atoi(argv[i + 1])});
  }
  return run_kernel_tests("bench_kernels fp8_cast", [&] {
    REQUIRE(sizeof(floatX) == 2, "bench_kernels fp8_cast times the BF16 build's casts");
    for (const CastShape& s : shapes) {
      REQUIRE(s.R > 0 && s.C > 0 && s.C % x128::size == 0,
              "shape %d %d: need positive rows and columns a multiple of %d", s.R, s.C, x128::size);
      bench(s);
    }
  });
}

}  // namespace fp8_cast_bench
