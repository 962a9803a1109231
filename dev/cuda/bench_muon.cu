// Times muon_update on the Muon groups of the modern presets' blocks: 4L matrices of C x C (q, k, v,
// attention proj) and 2L of C x 4C (fc stored tall, fcproj wide), one call per group with every
// matrix, BF16 master weights on. Prints per group and for the step the median milliseconds of
// repeated runs and the TFLOP/s of the Newton-Schulz products (per matrix and iteration
// 2m^2n + 2m^3 + 2m^2n), for the whole update and for the products alone.
//   build/bench_kernels muon [C L]...   (default: d12, d24 and d48)
#include "dev/cuda/kernel_test.h"

#include <memory>

namespace muon_bench {

template <typename Launch>
float time_ms(const Launch& launch) {
  return median_launch_ms(10, 2, [&](int) { launch(); });
}

// One group's matrices, contiguous, and its device arrays of pointers.
struct BenchGroup {
  MuonGroup g;
  std::unique_ptr<DeviceArray<floatX>> params, grads;
  std::unique_ptr<DeviceArray<float>> master, momentum;
  std::unique_ptr<DeviceArray<floatX*>> param_ptrs;
  std::unique_ptr<DeviceArray<float*>> master_ptrs, momentum_ptrs;
  std::unique_ptr<DeviceArray<floatX*>> grad_ptrs;
  std::unique_ptr<DeviceArray<uint8_t>> tall;

  BenchGroup(int m, int n, const std::vector<uint8_t>& tall_flags, llmc::Rng& rng) {
    const int count = (int)tall_flags.size();
    const size_t size = (size_t)m * n, total = size * count;
    params.reset(new DeviceArray<floatX>(total));
    grads.reset(new DeviceArray<floatX>(total));
    master.reset(new DeviceArray<float>(total));
    momentum.reset(new DeviceArray<float>(total));
    // One random matrix copied into each: the values do not change the work.
    const DeviceArray<floatX> one(random_stored(rng, size, 0.0f, 1.0f));
    const DeviceArray<float> one_float(random_stored(rng, size, 0.0f, 0.02f));
    std::vector<floatX*> p;
    std::vector<float*> pm, pmo;
    std::vector<floatX*> pg;
    for (int i = 0; i < count; i++) {
      p.push_back((floatX*)*params + i * size);
      pg.push_back((floatX*)*grads + i * size);
      pm.push_back((float*)*master + i * size);
      pmo.push_back((float*)*momentum + i * size);
      cudaCheck(cudaMemcpy(p.back(), (floatX*)one, size * sizeof(floatX), cudaMemcpyDeviceToDevice));
      cudaCheck(cudaMemcpy(pg.back(), (floatX*)one, size * sizeof(floatX), cudaMemcpyDeviceToDevice));
      cudaCheck(cudaMemcpy(pm.back(), (float*)one_float, size * sizeof(float), cudaMemcpyDeviceToDevice));
      cudaCheck(cudaMemcpy(pmo.back(), (float*)one_float, size * sizeof(float), cudaMemcpyDeviceToDevice));
    }
    param_ptrs.reset(new DeviceArray<floatX*>(p));
    master_ptrs.reset(new DeviceArray<float*>(pm));
    momentum_ptrs.reset(new DeviceArray<float*>(pmo));
    grad_ptrs.reset(new DeviceArray<floatX*>(pg));
    tall.reset(new DeviceArray<uint8_t>(tall_flags));
    g.m = m;
    g.n = n;
    g.count = count;
    g.params = *param_ptrs;
    g.master = sizeof(floatX) == sizeof(float) ? nullptr : (float**)*master_ptrs;
    g.grads = *grad_ptrs;
    g.momentum = *momentum_ptrs;
    g.tall = *tall;
  }
};

double newton_schulz_flops(const MuonGroup& g, const llmc::NewtonSchulz& ns) {
  const double m = g.m, n = g.n;
  return (double)g.count * ns.steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

void bench(int C, int L) {
  llmc::Rng rng(7);
  std::vector<uint8_t> mlp_tall(2 * L);
  for (int i = 0; i < 2 * L; i++) mlp_tall[i] = i % 2 == 0;  // fc [4C, C], then fcproj [C, 4C]
  std::vector<std::unique_ptr<BenchGroup>> groups;
  groups.emplace_back(new BenchGroup(C, C, std::vector<uint8_t>(4 * L, 0), rng));
  groups.emplace_back(new BenchGroup(C, 4 * C, mlp_tall, rng));
  std::vector<MuonGroup> described;
  for (const auto& b : groups) described.push_back(b->g);
  MuonWorkspace ws;
  muon_workspace_alloc(ws, described, 4 * L);
  const MuonParams hp = {0.025f, 0.05f, 0.95f};
  printf("\nC %d L %d: workspace %.2f GB\n", C, L, muon_workspace_size(described, 4 * L) / 1e9);
  double step_flops = 0.0;
  for (const MuonGroup& g : described) {
    const double flops = newton_schulz_flops(g, hp.newton_schulz);
    step_flops += flops;
    const float update_ms = time_ms([&] { muon_update(g, 0, g.count, hp, 1234u, ws, 0); });
    const float products_ms =
        time_ms([&] { muon_newton_schulz(ws, hp.newton_schulz, g.m, g.n, 0, g.count, g.count, 0); });
    printf("  %3d of %4dx%-5d  muon_update %8.3f ms %6.1f TFLOP/s   products alone %8.3f ms %6.1f TFLOP/s\n",
           g.count, g.m, g.n, update_ms, flops / update_ms / 1e9, products_ms, flops / products_ms / 1e9);
  }
  const float step_ms = time_ms([&] {
    for (const MuonGroup& g : described) muon_update(g, 0, g.count, hp, 1234u, ws, 0);
  });
  printf("  step: %.2f TFLOP in %.3f ms, %.1f TFLOP/s\n", step_flops / 1e12, step_ms,
         step_flops / step_ms / 1e9);
  muon_workspace_free(ws);
}

int run(int argc, char** argv) {
  std::vector<std::pair<int, int>> shapes = {{768, 12}, {1024, 24}, {1600, 48}};
  if (argc > 1) {
    REQUIRE(argc % 2 == 1, "give pairs of the model width and depth, [C L]...");
    shapes.clear();
    for (int i = 1; i < argc; i += 2) shapes.push_back({atoi(argv[i]), atoi(argv[i + 1])});
  }
  return run_kernel_tests("bench_kernels muon", [&] {
    for (const auto& s : shapes) bench(s.first, s.second);
  });
}

}  // namespace muon_bench
