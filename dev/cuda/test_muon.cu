// Tests the Muon update (muon_prepare, muon_orthogonalize, muon_apply, muon_update and
// muon_update_spread) against a CPU reference that follows the reference optimizer op by op: the
// momentum and Nesterov step in FP32, then BF16 tensors with every product and every elementwise
// result rounded to BF16 (FP32 accumulation). Groups of odd shapes: one of 96x160 matrices, 3 wide
// and 2 stored tall as 160x96 (orthogonalised transposed), one 64x64 matrix, and 5 of the
// speedrun gates' 6x12 (one stored tall), whose slots past the first are only 8-byte aligned,
// scattered in a parameter buffer; with and without master weights. Each group runs under the modern recipe's
// hyperparameters (12 steps of the baseline's polynomial, tall matrices scaled), the speedrun's (5
// steps of its polynomial, no tall scale), 3 steps of the speedrun's polynomial with the tall
// scale (odd counts, whose iterations start in the workspace's second buffer) and Polar Express (5
// steps, each of its own polynomial, after a norm 1.02 |X| + 1e-6), the cautious weight decay
// (record #89's, whose master weights must be its formula's bits) and NorMuon's second moment
// with per-matrix rate multipliers (record #89's, with the cautious decay). Each stage is checked
// on its own (momentum, the norm, orthogonalised update, NorMuon's state bit for bit and its
// update, parameters from the GPU's update), the
// baseline's orthogonalised update also for its property (X X^T near I), then muon_update twice
// for the same bits, in pieces of a smaller workspace, and over sub-ranges, which must give the
// whole group's bits for their matrices and leave the others as they were; then
// muon_update_spread as each process of 1, 2 and 3 runs it, divided (-od 1) as each of 2 and 3
// does (its share stepped alone), and the ZeRO-1 step
// (muon_prepare_shard, muon_update_sharded) as each process of 2 and 3 does (without NorMuon,
// whose state is not sharded). Then the cautious decay from updates and weights of both signs and
// zeros of each, where u = 0 decays too (>=); and NorMuon's step alone on tall, wide, square and
// odd shapes, from zero and from a running state, twice for the same bits. Last, record #89's
// Q and K head pairs: qkvw's rows as muon_matrix_rows lists them, and a group of the speedrun's
// 6 [256, 768] blocks under NorMuon against the CPU as above.
#include "dev/cuda/kernel_test.h"

namespace muon_tests {

// The GPU's products accumulate in another order and fuse B = -1.5 A + 0.5 A A and X = 2 X + B X
// into one rounding each where the reference rounds each term: each BF16 result may differ by an
// ulp (2^-8 relative), and 12 iterations carry such differences along; the iteration damps them
// (its fixed point 1 of the singular values is superattracting), which leaves a few ulps.
constexpr float kTolOrthogonal = 5e-2f;
// The speedrun's polynomial has no such fixed point: each step multiplies the small singular
// values by about 3.4 and with them the ulps in which the two orders of rounding differ. Simulated
// on the CPU (torch, 100 random matrices of each test shape, the GPU's fused sums against the
// reference's), the largest difference is 0.13 after 5 steps and 0.08 after 3; a coefficient 1.5%
// off (c = 2.0) or a step more or less gives 0.31 and more.
constexpr float kTolSteepOrthogonal = 0.2f;
// Polar Express's first polynomial is steeper still (a = 8.2): simulated as above (200 matrices of
// each shape), the largest difference is 0.37, on the gates' 6x12; a step dropped, two steps
// swapped or the fourth polynomial for the fifth give 0.9 and more. Its norm's scale, which moves
// the update less than the rounding does on small shapes, is checked on its own (kTolNorm).
constexpr float kTolPolarOrthogonal = 0.5f;
// The denominators |X|_F scale + eps in BF16: the sums of squares in another order may move one
// across a rounding boundary, an ulp of BF16 (at most 2^-7 relative); a scale 2% off is more.
constexpr float kTolNorm = 4e-3f;
// X X^T of the orthogonalised update: singular values within about an ulp of BF16 of 1.
constexpr float kTolIdentity = 5e-2f;
// NorMuon's update: the GPU adds its two norms in a tree, the CPU in order, so their factor may
// differ by FP32 ulps, and an entry's BF16 scale, then its product, by an ulp each (2 x 2^-7).
constexpr float kTolNorMuon = 1.6e-2f;

float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Finite values as the storage type cut toward zero holds them: a BF16 build's high 16 bits.
std::vector<float> toward_zero(std::vector<float> x) {
  if (sizeof(floatX) == sizeof(float)) return x;
  for (float& v : x) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    bits &= 0xffff0000u;
    memcpy(&v, &bits, sizeof(v));
  }
  return x;
}

// c[m, n] = bf16(a[m, k] op(b)), op(b) = b[k, n] or, transposed, b[n, k]^T; FP32 sums.
std::vector<float> bf16_product(const std::vector<float>& a, const std::vector<float>& b, int m, int n, int k,
                                bool trans_b) {
  std::vector<float> c((size_t)m * n);
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      float sum = 0.0f;
      for (int l = 0; l < k; l++) {
        sum += a[(size_t)i * k + l] * (trans_b ? b[(size_t)j * k + l] : b[(size_t)l * n + j]);
      }
      c[(size_t)i * n + j] = bf16_round(sum);
    }
  }
  return c;
}

// The reference's denominator of X, |X|_F scale + eps with each result a BF16 number.
float cpu_newton_schulz_denominator(const std::vector<float>& x, const llmc::NewtonSchulz& ns) {
  float squares = 0.0f;
  for (float v : x) squares += v * v;
  return bf16_round(bf16_round(bf16_round(std::sqrt(squares)) * ns.norm_scale) + ns.norm_eps);
}

// The reference's orthogonalise (train_gpt2.py) after its transpose, on x [m, n], m <= n: ns.steps
// of A = X X^T; B = b A + (c A) A; X = a X + B X, step i of ns.polynomial[i], each term rounded to
// BF16 as torch rounds it.
std::vector<float> cpu_newton_schulz(std::vector<float> x, int m, int n, const llmc::NewtonSchulz& ns) {
  const float denominator = cpu_newton_schulz_denominator(x, ns);
  for (float& v : x) v = bf16_round(v / denominator);
  for (int it = 0; it < ns.steps; it++) {
    const llmc::NewtonSchulzStep& p = ns.polynomial[it];
    const std::vector<float> a = bf16_product(x, x, m, m, n, true);
    std::vector<float> ca(a.size());
    for (size_t i = 0; i < a.size(); i++) ca[i] = bf16_round(p.c * a[i]);
    const std::vector<float> caa = bf16_product(ca, a, m, m, m, false);
    std::vector<float> b(a.size());
    for (size_t i = 0; i < b.size(); i++) b[i] = bf16_round(bf16_round(p.b * a[i]) + caa[i]);
    const std::vector<float> bx = bf16_product(b, x, m, n, m, false);
    for (size_t i = 0; i < x.size(); i++) x[i] = bf16_round(bf16_round(p.a * x[i]) + bx[i]);
  }
  return x;
}

// Muon's cautious step on the CPU in muon_cautious_decay's order, each operation an FP32 rounding
// (no fused multiply-add on the host).
float cpu_cautious_decay(float old, float u, float lr, float wd_lr, float lr_eff) {
  const float mask = u * old >= 0.0f ? 1.0f : 0.0f;
  return (old - old * mask * wd_lr * lr_eff) - lr * u;
}

// NorMuon's step on the CPU (muon_second_moment_kernel's) on x [m, n] (wide) with its state s of n
// values, every FP32 operation rounded on its own as there; the norms' sums in order (the GPU's
// in a tree).
std::vector<float> cpu_second_moment(std::vector<float> x, int m, int n, std::vector<float>& s, float weight) {
  const bool rows = m == n;
  auto at = [&](int k, int i) -> float& { return rows ? x[(size_t)k * n + i] : x[(size_t)i * n + k]; };
  std::vector<float> mean(n), step(n);
  const float side = (float)m;
  float before = 0.0f, after = 0.0f;
  for (int k = 0; k < n; k++) {
    float sum = 0.0f;
    for (int i = 0; i < m; i++) sum += at(k, i) * at(k, i);
    mean[k] = sum * (1.0f / side);
    s[k] = std::fma(weight, mean[k] - s[k], s[k]);
    step[k] = 1.0f / std::sqrt(std::max(s[k], 1e-10f));
    before += mean[k];
    after += (mean[k] * side) * (step[k] * step[k]);
  }
  const float factor = std::sqrt(before * side) / std::max(std::sqrt(after), 1e-10f);
  for (int k = 0; k < n; k++) {
    const float scale = bf16_round(step[k] * factor);
    for (int i = 0; i < m; i++) at(k, i) = bf16_round(at(k, i) * scale);
  }
  return x;
}

// Matrix i's rate multiplier in the groups that have them (MuonGroup::lr_scale).
float test_rate(int i) { return i % 3 == 0 ? 1.0f : i % 3 == 1 ? 2.0f : 0.75f; }

// One group's matrices in a shared parameter buffer, each kGap elements after the previous; tall[i]:
// matrix i is stored [n, m].
struct TestGroup {
  const char* name;
  int m, n;
  std::vector<uint8_t> tall;
  int count() const { return (int)tall.size(); }
  int rows(int i) const { return tall[i] ? n : m; }
  int cols(int i) const { return tall[i] ? m : n; }
  size_t offset(int i) const { return kGap + (size_t)i * ((size_t)m * n + kGap); }
  size_t elements() const { return offset(count()); }
  static constexpr size_t kGap = 24;
};

struct HostState {
  std::vector<float> params, master, grads, momentum;  // whole buffers, gaps included
  std::vector<float> second;  // NorMuon's, matrix i's n values from offset(i), as the trainer lays them out
};

// The matrix i of a whole buffer.
std::vector<float> matrix(const TestGroup& t, const std::vector<float>& buffer, int i) {
  const float* p = buffer.data() + t.offset(i);
  return std::vector<float>(p, p + (size_t)t.m * t.n);
}

// x [rows, cols] -> [cols, rows].
std::vector<float> transposed(const std::vector<float>& x, int rows, int cols) {
  std::vector<float> y(x.size());
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) y[(size_t)c * rows + r] = x[(size_t)r * cols + c];
  }
  return y;
}

struct Device {
  DeviceArray<floatX> params;
  DeviceArray<float> master, momentum, second;
  DeviceArray<floatX> grads;
  DeviceArray<floatX*> param_ptrs;
  DeviceArray<float*> master_ptrs, momentum_ptrs, second_ptrs;
  DeviceArray<floatX*> grad_ptrs;
  DeviceArray<uint8_t> tall;
  DeviceArray<float> rates;
  Device(const TestGroup& t, const HostState& s)
      : params(s.params), master(s.master), momentum(s.momentum), second(s.second), grads(s.grads),
        param_ptrs(t.count()), master_ptrs(t.count()), momentum_ptrs(t.count()), second_ptrs(t.count()),
        grad_ptrs(t.count()), tall(t.tall), rates(t.count()) {
    std::vector<floatX*> p;
    std::vector<float*> pm, pmo, ps;
    std::vector<floatX*> pg;
    std::vector<float> r;
    for (int i = 0; i < t.count(); i++) {
      p.push_back((floatX*)params + t.offset(i));
      pm.push_back((float*)master + t.offset(i));
      pmo.push_back((float*)momentum + t.offset(i));
      ps.push_back((float*)second + t.offset(i));
      pg.push_back((floatX*)grads + t.offset(i));
      r.push_back(test_rate(i));
    }
    param_ptrs.upload(p);
    master_ptrs.upload(pm);
    momentum_ptrs.upload(pmo);
    second_ptrs.upload(ps);
    grad_ptrs.upload(pg);
    rates.upload(r);
  }
  void reset(const HostState& s) {
    grads.upload(s.grads);
    params.upload(s.params);
    master.upload(s.master);
    momentum.upload(s.momentum);
    second.upload(s.second);
  }
  // normuon: with NorMuon's state; rates: with test_rate's multipliers.
  MuonGroup group(const TestGroup& t, bool with_master, bool normuon = false, bool with_rates = false) const {
    MuonGroup g;
    g.m = t.m;
    g.n = t.n;
    g.count = t.count();
    g.params = param_ptrs;
    g.master = with_master ? (float**)master_ptrs : nullptr;
    g.grads = grad_ptrs;
    g.momentum = momentum_ptrs;
    g.tall = tall;
    g.second_moments = normuon ? (float**)second_ptrs : nullptr;
    g.lr_scale = with_rates ? (const float*)rates : nullptr;
    return g;
  }
  Snapshot snapshot() const { return Snapshot(params, master, momentum, second); }
};

void poison(MuonWorkspace& ws) {
  const size_t n = ws.capacity;
  for (__nv_bfloat16* x : ws.x) cudaCheck(cudaMemset(x, 0xff, n * ws.x_elements * sizeof(__nv_bfloat16)));
  cudaCheck(cudaMemset(ws.a, 0xff, n * ws.square_elements * sizeof(__nv_bfloat16)));
  cudaCheck(cudaMemset(ws.b, 0xff, n * ws.square_elements * sizeof(__nv_bfloat16)));
  cudaCheck(cudaMemset(ws.partials, 0xff, n * ws.partial_count * sizeof(float)));
  cudaCheck(cudaMemset(ws.denominators, 0xff, n * sizeof(float)));
  cudaCheck(cudaMemset(ws.second_means, 0xff, n * ws.side_elements * sizeof(float)));
  cudaCheck(cudaMemset(ws.second_factors, 0xff, n * sizeof(float)));
}

// Every value of `got` outside the group's matrices equals `before`'s (the gaps are not written).
void check_gaps(const std::string& name, const TestGroup& t, const std::vector<float>& got,
                const std::vector<float>& before) {
  size_t changed = 0;
  for (int i = 0; i <= t.count(); i++) {
    const size_t end = t.offset(i), begin = end - TestGroup::kGap;
    for (size_t k = begin; k < end; k++) changed += memcmp(&got[k], &before[k], sizeof(float)) != 0;
  }
  testing::check_verbose(changed == 0, llmc::strformat("%s: %zu values between the matrices changed",
                                                       name.c_str(), changed));
}

// X X^T of each orthogonalised matrix (wide, [m, n]) against the identity.
void check_orthogonal(const std::vector<float>& x, int m, int n, int count) {
  double worst = 0.0;
  for (int z = 0; z < count; z++) {
    const float* a = x.data() + (size_t)z * m * n;
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < m; j++) {
        double dot = 0.0;
        for (int k = 0; k < n; k++) dot += (double)a[(size_t)i * n + k] * a[(size_t)j * n + k];
        worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
      }
    }
  }
  testing::check_verbose(worst <= kTolIdentity,
                         llmc::strformat("X X^T = I within %.4f (bound %.2f)", worst, kTolIdentity));
}

// Process `rank` of `world` with a stand-in for the broadcasts: the others' shares of the updates
// are filled in from the whole group's (staged_x, slot i for matrix i), and the values of its own
// share that differ from them are counted in share_differs.
OptimizerSpread stand_in_spread(int rank, int world, const std::vector<__nv_bfloat16>& staged_x,
                           size_t& share_differs) {
  OptimizerSpread spread;
  spread.rank = rank;
  spread.world = world;
  spread.gather = [rank, world, &staged_x, &share_differs](__nv_bfloat16* x, size_t elements, int count,
                                                           cudaStream_t stream) {
    std::vector<__nv_bfloat16> got((size_t)count * elements);
    cudaCheck(cudaMemcpyAsync(got.data(), x, got.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost,
                              stream));
    cudaCheck(cudaStreamSynchronize(stream));
    const MuonShare share = muon_share(count, rank, world);
    for (size_t k = share.begin * elements; k < share.end * elements; k++) {
      share_differs += memcmp(&got[k], &staged_x[k], sizeof(__nv_bfloat16)) != 0;
    }
    std::vector<__nv_bfloat16> gathered = staged_x;
    std::copy(got.begin() + share.begin * elements, got.begin() + share.end * elements,
              gathered.begin() + share.begin * elements);
    cudaCheck(cudaMemcpyAsync(x, gathered.data(), gathered.size() * sizeof(__nv_bfloat16),
                              cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaStreamSynchronize(stream));
  };
  return spread;
}

void check_share(const std::string& name, const TestGroup& t, int rank, int world, size_t share_differs) {
  const MuonShare share = muon_share(t.count(), rank, world);
  testing::check_verbose(share_differs == 0,
                         llmc::strformat("%s, process %d of %d: its share [%d, %d) orthogonalised, %zu "
                                         "values differ from the whole group's",
                                         name.c_str(), rank, world, share.begin, share.end, share_differs));
}

// muon_update_spread as each process of 1, 2 and 3 runs it: its share orthogonalised must have the
// whole group's bits, and with the others' shares filled in from them, as their processes'
// broadcasts would, the step must give the whole group's bits.
void test_spread(const TestGroup& t, const HostState& s, Device& d, const MuonGroup& g, const MuonParams& hp,
                 uint32_t seed, const std::vector<__nv_bfloat16>& staged_x, const Snapshot& staged) {
  MuonWorkspace ws;
  muon_workspace_alloc(ws, {g}, t.count());
  for (int world = 1; world <= 3; world++) {
    for (int rank = 0; rank < world; rank++) {
      size_t share_differs = 0;
      const OptimizerSpread spread = stand_in_spread(rank, world, staged_x, share_differs);
      d.reset(s);
      poison(ws);
      muon_update_spread(g, hp, seed, ws, spread, 0);
      check_share("spread", t, rank, world, share_differs);
      check_same_bits(llmc::strformat("spread, process %d of %d", rank, world), staged,
                      d.snapshot());
    }
  }
  muon_workspace_free(ws);
}

// Copies shard [begin, end) of got into assembled; returns how many values of got outside it
// differ from before's (a process must write its shard alone).
template <class T>
size_t take_shard(const std::vector<T>& got, const std::vector<T>& before, size_t begin, size_t end,
                  std::vector<T>& assembled) {
  size_t outside = 0;
  for (size_t k = 0; k < got.size(); k++) {
    if (k >= begin && k < end) assembled[k] = got[k];
    else outside += memcmp(&got[k], &before[k], sizeof(T)) != 0;
  }
  return outside;
}

// -od 1's step as each process of 2 and 3 runs it (muon_update_spread, spread.divided): each
// steps its share's matrices alone, every value outside them as it was, and its share's
// parameters, master weights, momentum and NorMuon's state, assembled with the others', have the
// whole group's bits.
void test_divided(const TestGroup& t, const HostState& s, Device& d, const MuonGroup& g, const MuonParams& hp,
                  uint32_t seed, const Snapshot& staged) {
  MuonWorkspace ws;
  muon_workspace_alloc(ws, {g}, t.count());
  d.reset(s);
  const std::vector<floatX> params_before = d.params.raw();
  const std::vector<float> master_before = d.master.raw(), momentum_before = d.momentum.raw(),
                           second_before = d.second.raw();
  for (int world = 2; world <= 3; world++) {
    std::vector<floatX> params = params_before;
    std::vector<float> master = master_before, momentum = momentum_before, second = second_before;
    size_t outside = 0;
    for (int rank = 0; rank < world; rank++) {
      OptimizerSpread spread;
      spread.rank = rank;
      spread.world = world;
      spread.divided = true;
      d.reset(s);
      poison(ws);
      muon_update_spread(g, hp, seed, ws, spread, 0);
      const MuonShare share = muon_share(t.count(), rank, world);
      const size_t begin = t.offset(share.begin), end = share.end > share.begin ? t.offset(share.end) : begin;
      outside += take_shard(d.params.raw(), params_before, begin, end, params);
      outside += take_shard(d.master.raw(), master_before, begin, end, master);
      outside += take_shard(d.momentum.raw(), momentum_before, begin, end, momentum);
      outside += take_shard(d.second.raw(), second_before, begin, end, second);
    }
    testing::check_verbose(outside == 0, llmc::strformat("divided on %d processes: %zu values written outside "
                                                         "their process's share", world, outside));
    d.params.upload(params);
    d.master.upload(master);
    d.momentum.upload(momentum);
    d.second.upload(second);
    check_same_bits(llmc::strformat("divided on %d processes", world), staged, d.snapshot());
  }
  muon_workspace_free(ws);
}

// The ZeRO-1 step as each process of 2 and 3 runs it, the buffer cut into shards of an odd size
// whose ends fall inside matrices: muon_prepare_shard on each shard, the shards' Nesterov inputs
// assembled as the all-gather would, then muon_update_sharded on each (the others' shares of the
// updates from the whole group's, as in test_spread). Each process must write its shard alone,
// and the shards of the parameters, master weights and momentum, assembled, must have the whole
// group's bits.
void test_zero(const TestGroup& t, const HostState& s, Device& d, const MuonGroup& g, const MuonParams& hp,
               uint32_t seed, const std::vector<__nv_bfloat16>& staged_x, const Snapshot& staged) {
  if (hp.normuon) return;  // NorMuon's state is whole on every process (the trainer runs it with -zs 0)
  MuonWorkspace ws;
  muon_workspace_alloc(ws, {g}, t.count());
  const size_t total = t.elements();
  d.reset(s);
  const std::vector<floatX> grads_before = d.grads.raw(), params_before = d.params.raw();
  const std::vector<float> momentum_before = d.momentum.raw(), master_before = d.master.raw();
  for (int world = 2; world <= 3; world++) {
    const size_t shard_size = ceil_div((long)total, world) | 1;
    std::vector<floatX> inputs(total), params(total);
    std::vector<float> momentum(total), master(total);
    size_t outside = 0;
    printf("ZeRO-1 on %d processes: shards of %zu of the %zu elements\n", world, shard_size, total);
    auto shard = [&](int rank) {
      const size_t begin = rank * shard_size, end = std::min(total, begin + shard_size);
      return MuonShard{(floatX*)d.grads + begin, (floatX*)d.grads + end, (floatX*)d.params + begin,
                       (floatX*)d.params + end};
    };
    for (int rank = 0; rank < world; rank++) {
      d.reset(s);
      muon_prepare_shard(g, hp, shard(rank), 0);
      const size_t begin = rank * shard_size, end = begin + shard_size;
      outside += take_shard(d.grads.raw(), grads_before, begin, end, inputs);
      outside += take_shard(d.momentum.raw(), momentum_before, begin, end, momentum);
    }
    for (int rank = 0; rank < world; rank++) {
      size_t share_differs = 0;
      const OptimizerSpread spread = stand_in_spread(rank, world, staged_x, share_differs);
      d.reset(s);
      d.grads.upload(inputs);
      poison(ws);
      muon_update_sharded(g, hp, seed, ws, spread, shard(rank), 0);
      check_share("ZeRO-1", t, rank, world, share_differs);
      const size_t begin = rank * shard_size, end = begin + shard_size;
      outside += take_shard(d.params.raw(), params_before, begin, end, params);
      outside += take_shard(d.master.raw(), master_before, begin, end, master);
    }
    testing::check_verbose(outside == 0, llmc::strformat("ZeRO-1 on %d processes: %zu values written outside "
                                                         "their process's shard", world, outside));
    d.params.upload(params);
    d.master.upload(master);
    d.momentum.upload(momentum);
    check_same_bits(llmc::strformat("ZeRO-1 on %d processes", world), staged,
                    d.snapshot());
  }
  muon_workspace_free(ws);
}

// Matrix i's weights `old` after the step from its orthogonalised update x [m, n] (the wide
// orientation, as the GPU leaves it): x transposed back and scaled for a tall matrix as
// muon_apply_tile does, then the decoupled step p (1 - lr wd) - lr u, or the cautious one with the
// matrix's lr_eff, lr and lr_eff times the matrix's rate multiplier.
std::vector<float> cpu_muon_apply(const TestGroup& t, int i, std::vector<float> x, std::vector<float> old,
                                  const MuonParams& hp, float rate = 1.0f) {
  const double scale = hp.scale_tall ? std::sqrt((double)t.n / t.m) : 1.0;
  if (t.tall[i]) {
    x = transposed(x, t.m, t.n);
    for (float& v : x) v = bf16_round(v * (float)scale);
  }
  const float decay = (float)(1.0 - (double)hp.lr * hp.weight_decay);
  const float wd_lr = (float)((double)hp.weight_decay * hp.lr);
  const float lr = hp.lr * rate, lr_eff = (t.tall[i] ? (float)(hp.lr * scale) : hp.lr) * rate;
  for (size_t k = 0; k < old.size(); k++) {
    old[k] = hp.decay == llmc::WeightDecayKind::kCautious ? cpu_cautious_decay(old[k], x[k], lr, wd_lr, lr_eff)
                                                          : old[k] * decay - lr * x[k];
  }
  return old;
}

// A recipe's hyperparameters, the bound on its orthogonalised update against the CPU's, and
// whether its iteration takes the singular values to 1 (the baseline's), where X X^T = I is checked,
// and whether its matrices take test_rate's multipliers.
struct TestRecipe {
  const char* name;
  MuonParams hp;
  float tol_orthogonal;
  bool converges;
  bool rates = false;
};

void test_group(const TestGroup& t, bool with_master, const TestRecipe& recipe, llmc::Rng& rng) {
  const MuonParams& hp = recipe.hp;
  const llmc::NewtonSchulz& ns = hp.newton_schulz;
  printf("\nmuon %s: %d of %dx%d, %s master weights; %s: %s, tall %s%s%s\n", t.name, t.count(), t.m, t.n,
         with_master ? "with" : "without", recipe.name, llmc::newton_schulz_description(ns).c_str(),
         hp.scale_tall ? "scaled" : "unscaled", hp.normuon ? ", NorMuon" : "",
         recipe.rates ? ", rates x 1, 2, 0.75" : "");
  const size_t total = t.elements();
  const int m = t.m, n = t.n, count = t.count();
  HostState s;
  s.params = random_stored(rng, total, 0.0f, 0.05f);
  s.master = s.params;
  // Master weights are not storage-rounded; perturb them below BF16 resolution.
  for (float& p : s.master) p *= 1.0f + 1e-3f * (rng.uniform_float() - 0.5f);
  s.grads = random_stored(rng, total, 0.0f, 1.0f);
  s.momentum.resize(total);
  rng.normal(s.momentum.data(), total, 0.0f, 0.5f);
  // A running state: squares of the orthogonalised update's size (about 1 / n an entry).
  s.second = random_stored(rng, total, 0.0f, 1.0f / std::sqrt((float)n));
  for (float& v : s.second) v *= v;
  Device d(t, s);
  const MuonGroup g = d.group(t, with_master, hp.normuon, recipe.rates);
  MuonWorkspace ws;
  muon_workspace_alloc(ws, {g}, count);
  const uint32_t seed = rng.u32();

  // Stage by stage, against the CPU.
  poison(ws);
  muon_prepare(g, 0, count, hp, ws, 0, 0);
  muon_orthogonalize(g, ns, 0, count, ws, 0);
  const std::vector<float> got_momentum = d.momentum.download();
  std::vector<float> got_denominators(count), ref_denominators(count);
  cudaCheck(cudaMemcpy(got_denominators.data(), ws.denominators, count * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<__nv_bfloat16> staged_x((size_t)count * m * n);
  cudaCheck(cudaMemcpy(staged_x.data(), ws.x[0], staged_x.size() * sizeof(__nv_bfloat16),
                       cudaMemcpyDeviceToHost));
  std::vector<float> got_x(staged_x.size());
  for (size_t i = 0; i < staged_x.size(); i++) got_x[i] = __bfloat162float(staged_x[i]);
  check_gaps("momentum", t, got_momentum, s.momentum);
  for (int i = 0; i < count; i++) {
    const std::vector<float> g_i = matrix(t, s.grads, i);
    std::vector<float> m_i = matrix(t, s.momentum, i), u(m_i.size());
    for (size_t k = 0; k < m_i.size(); k++) {
      m_i[k] = m_i[k] + (1.0f - hp.momentum) * (g_i[k] - m_i[k]);
      u[k] = bf16_round(m_i[k] - (m_i[k] - g_i[k]) * (1.0f - hp.momentum));
    }
    check_close(llmc::strformat("momentum %d", i), matrix(t, got_momentum, i), m_i, kTolFP32);
    ref_denominators[i] = cpu_newton_schulz_denominator(u, ns);
    const std::vector<float> ref_x = cpu_newton_schulz(t.tall[i] ? transposed(u, n, m) : u, m, n, ns);
    const float* x_i = got_x.data() + (size_t)i * m * n;
    check_close(llmc::strformat("orthogonalised %d", i), std::vector<float>(x_i, x_i + (size_t)m * n), ref_x,
                recipe.tol_orthogonal);
  }
  check_close("norm denominators", got_denominators, ref_denominators, kTolNorm);
  // A random square matrix may be ill-conditioned.
  if (m < n && recipe.converges) check_orthogonal(got_x, m, n, count);
  if (hp.normuon) {
    muon_second_moment(g, 0, count, hp, ws, 0, 0);
    std::vector<__nv_bfloat16> normalized(staged_x.size());
    cudaCheck(cudaMemcpy(normalized.data(), ws.x[0], normalized.size() * sizeof(__nv_bfloat16),
                         cudaMemcpyDeviceToHost));
    const std::vector<float> got_second = d.second.download();
    for (int i = 0; i < count; i++) {
      const float* x_i = got_x.data() + (size_t)i * m * n;
      std::vector<float> s_i(s.second.begin() + t.offset(i), s.second.begin() + t.offset(i) + n);
      const std::vector<float> ref = cpu_second_moment(std::vector<float>(x_i, x_i + (size_t)m * n), m, n, s_i,
                                                       hp.normuon_weight);
      std::vector<float> got_i(m * (size_t)n);
      for (size_t k = 0; k < got_i.size(); k++) got_i[k] = __bfloat162float(normalized[(size_t)i * m * n + k]);
      check_close(llmc::strformat("NorMuon's update %d", i), got_i, ref, kTolNorMuon);
      const float* g_s = got_second.data() + t.offset(i);
      check_close(llmc::strformat("NorMuon's state %d", i), std::vector<float>(g_s, g_s + n), s_i, 0.0f);
    }
    // The state's other elements (past a matrix's n values) are not written.
    size_t changed = 0;
    for (int i = 0; i < count; i++) {
      for (size_t k = t.offset(i) + n; k < t.offset(i + 1); k++) {
        changed += memcmp(&got_second[k], &s.second[k], sizeof(float)) != 0;
      }
    }
    testing::check_verbose(changed == 0, llmc::strformat("NorMuon's state: %zu values past the matrices' n changed",
                                                         changed));
    for (size_t k = 0; k < got_x.size(); k++) got_x[k] = __bfloat162float(normalized[k]);
  }

  muon_apply(g, 0, count, hp, seed, ws, 0, 0);
  const std::vector<float> got_params = d.params.download(), got_master = d.master.download();
  check_gaps("params", t, got_params, s.params);
  check_gaps("master", t, got_master, s.master);
  // The GPU may fuse the decoupled step's product and difference; the cautious step it rounds as
  // the CPU does.
  const float master_tol = hp.decay == llmc::WeightDecayKind::kCautious ? 0.0f : kTolFP32;
  for (int i = 0; i < count; i++) {
    const float* x_i = got_x.data() + (size_t)i * m * n;
    const std::vector<float> ref = cpu_muon_apply(t, i, std::vector<float>(x_i, x_i + (size_t)m * n),
                                                  matrix(t, with_master ? s.master : s.params, i), hp,
                                                  recipe.rates ? test_rate(i) : 1.0f);
    // Stochastic rounding of the FP32 result: within one ulp (kTolSum).
    check_close(llmc::strformat("params %d", i), matrix(t, got_params, i), ref, kTolSum);
    if (with_master) check_close(llmc::strformat("master %d", i), matrix(t, got_master, i), ref, master_tol);
    else check_same_bits(llmc::strformat("master %d untouched", i), Snapshot(DeviceArray<float>(s.master)),
                         Snapshot(d.master));
  }
  const Snapshot staged(d.params, d.master, d.momentum);

  // muon_update: the stages' bits, twice; in pieces of a workspace for 2 matrices; by sub-ranges.
  auto update = [&](MuonWorkspace& w, int begin, int end) {
    poison(w);
    muon_update(g, begin, end, hp, seed, w, 0);
  };
  d.reset(s);
  update(ws, 0, count);
  check_same_bits("muon_update = stages", staged, d.snapshot());
  d.reset(s);
  update(ws, 0, count);
  check_same_bits("muon_update twice", staged, d.snapshot());
  MuonWorkspace small;
  muon_workspace_alloc(small, {g}, 2);
  d.reset(s);
  update(small, 0, count);
  check_same_bits("two at a time", staged, d.snapshot());
  // Matrices [1, count), then [0, 1): after the first, matrix 0 as it was and the others updated.
  const int split = std::min(1, count);
  d.reset(s);
  update(small, split, count);
  const std::vector<float> partial_params = d.params.download(), partial_momentum = d.momentum.download();
  size_t wrong = 0;
  for (size_t k = 0; k < total; k++) {
    const bool updated = k >= t.offset(split) - TestGroup::kGap;
    const float expected_params = updated ? got_params[k] : s.params[k];
    const float expected_momentum = updated ? got_momentum[k] : s.momentum[k];
    wrong += memcmp(&partial_params[k], &expected_params, sizeof(float)) != 0;
    wrong += memcmp(&partial_momentum[k], &expected_momentum, sizeof(float)) != 0;
  }
  testing::check_verbose(wrong == 0, llmc::strformat("[%d, %d) alone: %zu values differ from the whole "
                                                     "group's or the initial ones", split, count, wrong));
  update(small, 0, split);
  check_same_bits("[1, count) then [0, 1)", staged, d.snapshot());
  test_spread(t, s, d, g, hp, seed, staged_x, staged);
  test_divided(t, s, d, g, hp, seed, staged);
  test_zero(t, s, d, g, hp, seed, staged_x, staged);
  muon_workspace_free(small);
  muon_workspace_free(ws);
}

// The cautious step (muon_apply) from updates x placed in the workspace: weights of both signs
// with every 7th zero, updates of both signs with every 5th zero, wide and tall matrices (the
// tall ones scaled, their lr_eff lr sqrt(n / m)), with master weights: the master weights bit for
// bit the CPU's formula (a weight whose update is zero decays, the non-strict mask; one the update
// moves away from zero does not), the parameters within one ulp, each case present (u p > 0,
// u p < 0, u = 0 with p != 0, p = 0), twice the same bits. With high_bits (record #89's -mk 1)
// the parameters are the master weights' high 16 bits, bit for bit (in FP32 builds the master).
void test_apply_cautious(llmc::Rng& rng, bool high_bits) {
  const TestGroup t = {"wide and tall", 96, 160, {0, 1, 0, 0, 1}};
  MuonParams hp = {0.05f, 1.2f, 0.95f, 1.0f, llmc::kNewtonSchulzPolar, true, llmc::WeightDecayKind::kCautious};
  hp.high_bits = high_bits;
  printf("\nmuon_apply %s: %d of %dx%d, the cautious weight decay%s\n", t.name, t.count(), t.m, t.n,
         high_bits ? ", the parameters the master's high 16 bits" : "");
  const int m = t.m, n = t.n, count = t.count();
  HostState s;
  s.params = random_stored(rng, t.elements(), 0.0f, 0.05f);
  for (size_t k = 0; k < s.params.size(); k += 7) s.params[k] = 0.0f;
  s.master = s.params;
  s.grads = s.params;
  s.momentum.assign(t.elements(), 0.0f);
  s.second.assign(t.elements(), 0.0f);
  std::vector<float> x((size_t)count * m * n);
  rng.normal(x.data(), x.size(), 0.0f, 0.03f);
  std::vector<__nv_bfloat16> staged(x.size());
  for (size_t k = 0; k < x.size(); k++) {
    if (k % 5 == 3) x[k] = 0.0f;
    staged[k] = __float2bfloat16_rn(x[k]);
    x[k] = __bfloat162float(staged[k]);
  }
  Device d(t, s);
  const MuonGroup g = d.group(t, true);
  MuonWorkspace ws;
  muon_workspace_alloc(ws, {g}, count);
  auto run = [&] {
    d.reset(s);
    cudaCheck(cudaMemcpy(ws.x[0], staged.data(), staged.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    muon_apply(g, 0, count, hp, 4321u, ws, 0, 0);
  };
  run();
  const std::vector<float> got_params = d.params.download(), got_master = d.master.download();
  size_t cases[4] = {};  // u p > 0, u p < 0, u = 0 with p != 0, p = 0
  for (int i = 0; i < count; i++) {
    const std::vector<float> x_i(x.begin() + (size_t)i * m * n, x.begin() + (size_t)(i + 1) * m * n);
    const std::vector<float> old = matrix(t, s.master, i), ref = cpu_muon_apply(t, i, x_i, old, hp);
    const std::vector<float> u = t.tall[i] ? transposed(x_i, m, n) : x_i;  // the signs of the scaled update
    for (size_t k = 0; k < old.size(); k++) {
      cases[old[k] == 0.0f ? 3 : u[k] == 0.0f ? 2 : u[k] * old[k] > 0.0f ? 0 : 1]++;
    }
    check_close(llmc::strformat("master %d", i), matrix(t, got_master, i), ref, 0.0f);
    if (high_bits) check_close(llmc::strformat("params %d", i), matrix(t, got_params, i), toward_zero(ref), 0.0f);
    else check_close(llmc::strformat("params %d", i), matrix(t, got_params, i), ref, kTolSum);
  }
  check_gaps("master", t, got_master, s.master);
  testing::check_verbose(cases[0] > 0 && cases[1] > 0 && cases[2] > 0 && cases[3] > 0,
                         llmc::strformat("u p > 0: %zu, u p < 0: %zu, u = 0 with p != 0 (decayed): %zu, p = 0: %zu",
                                         cases[0], cases[1], cases[2], cases[3]));
  const Snapshot bits(d.params, d.master);
  run();
  check_same_bits("twice", bits, Snapshot(d.params, d.master));
  muon_workspace_free(ws);
}

// NorMuon's step alone (muon_second_moment) on updates x placed in the workspace, of rows and
// columns of unequal sizes (so that a state of the wrong side's entries would show), from a zero
// state and then from the one it left over a second step: the state bit for bit the CPU's, the
// update within kTolNorMuon, its norm kept, a matrix's zero update left zero, twice the same bits.
void test_second_moment(const TestGroup& t, llmc::Rng& rng) {
  const int m = t.m, n = t.n, count = t.count();
  printf("\nmuon_second_moment %s: %d of %dx%d\n", t.name, count, m, n);
  MuonParams hp = {};
  hp.normuon = true;
  hp.normuon_weight = (float)(1.0 - llmc::kNorMuonBeta2);
  HostState s;
  s.params = s.master = s.grads = s.momentum = s.second = std::vector<float>(t.elements(), 0.0f);
  Device d(t, s);
  const MuonGroup g = d.group(t, false, true);
  MuonWorkspace ws;
  muon_workspace_alloc(ws, {g}, count);
  std::vector<float> state = s.second;
  for (int step = 0; step < 2; step++) {
    std::vector<float> x((size_t)count * m * n);
    rng.normal(x.data(), x.size(), 0.0f, 0.05f);
    for (size_t k = 0; k < x.size(); k++) {  // rows and columns of unequal sizes
      const size_t r = k / n % m, c = k % n;
      x[k] = bf16_round(x[k] * (1.0f + (float)(r % 5)) * (1.0f + 0.25f * (float)(c % 7)));
    }
    std::fill(x.begin(), x.begin() + (size_t)m * n, 0.0f);  // matrix 0's update zero: the clamps
    std::vector<__nv_bfloat16> staged(x.size());
    for (size_t k = 0; k < x.size(); k++) staged[k] = __float2bfloat16_rn(x[k]);
    std::vector<__nv_bfloat16> first;
    for (int run = 0; run < 2; run++) {
      d.second.upload(std::vector<float>(state));
      poison(ws);
      cudaCheck(cudaMemcpy(ws.x[0], staged.data(), staged.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
      muon_second_moment(g, 0, count, hp, ws, 0, 0);
      std::vector<__nv_bfloat16> got(staged.size());
      cudaCheck(cudaMemcpy(got.data(), ws.x[0], got.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
      if (run == 0) {
        first = got;
        continue;
      }
      testing::check_verbose(memcmp(first.data(), got.data(), got.size() * sizeof(__nv_bfloat16)) == 0,
                             llmc::strformat("step %d twice: the same bits", step + 1));
    }
    const std::vector<float> got_state = d.second.download();
    for (int i = 0; i < count; i++) {
      std::vector<float> s_i(state.begin() + t.offset(i), state.begin() + t.offset(i) + n);
      const std::vector<float> x_i(x.begin() + (size_t)i * m * n, x.begin() + (size_t)(i + 1) * m * n);
      const std::vector<float> ref = cpu_second_moment(x_i, m, n, s_i, hp.normuon_weight);
      std::vector<float> got_i(x_i.size());
      double before_norm = 0.0, after_norm = 0.0;
      for (size_t k = 0; k < got_i.size(); k++) {
        got_i[k] = __bfloat162float(first[(size_t)i * m * n + k]);
        before_norm += (double)x_i[k] * x_i[k];
        after_norm += (double)got_i[k] * got_i[k];
      }
      check_close(llmc::strformat("step %d, update %d", step + 1, i), got_i, ref, kTolNorMuon);
      check_close(llmc::strformat("step %d, state %d", step + 1, i),
                  std::vector<float>(got_state.begin() + t.offset(i), got_state.begin() + t.offset(i) + n), s_i, 0.0f);
      const double kept = before_norm > 0.0 ? std::fabs(std::sqrt(after_norm / before_norm) - 1.0) : after_norm;
      testing::check_verbose(kept <= kTolNorMuon, llmc::strformat("step %d, update %d: norm kept within %.1e",
                                                                  step + 1, i, kept));
      std::copy(s_i.begin(), s_i.end(), state.begin() + t.offset(i));
    }
  }
  muon_workspace_free(ws);
}

// Record #89's Q and K in head pairs (-mq 2; muon_matrix_rows) on the speedrun's qkvw, a layer's
// [3C, C] of C = 768 and 6 heads of 128: Q's rows listed as 3 blocks of 2 heads, then K's, V
// whole, other tensors untouched; a head count that the blocks do not divide refused. Then the
// blocks' group, 6 wide [256, 768] matrices side by side (one layer's), run by test_group under
// `recipe` (each block orthogonalised on its own, its second moments a row of 768).
void test_qk_blocks(const TestRecipe& recipe, llmc::Rng& rng) {
  llmc::GPT2Config c;
  c.channels = 768;
  c.num_heads = 6;
  llmc::ParamSpec qkvw = {}, fcw = {};
  qkvw.rows = qkvw.cols = fcw.cols = c.channels;
  qkvw.split = 3;
  fcw.rows = 4 * c.channels;
  printf("\nmuon_matrix_rows: qkvw [%d, %d] of %d heads\n", 3 * c.channels, c.channels, c.num_heads);
  auto listed = [&](int heads) { return muon_matrix_rows(llmc::kQkvw, qkvw, heads, c); };
  testing::check_verbose(listed(2) == std::vector<int>{256, 256, 256, 256, 256, 256, 768},
                         "-mq 2: Q's rows in 3 blocks of 256, then K's, V's 768 whole");
  testing::check_verbose(listed(0) == std::vector<int>{768, 768, 768} && listed(6) == listed(0) &&
                             listed(3) == std::vector<int>{384, 384, 384, 384, 768} &&
                             muon_matrix_rows(llmc::kFcw, fcw, 2, c) == std::vector<int>{3072},
                         "-mq 0 and -mq 6: Q, K and V whole; -mq 3: blocks of 384; fcw whole under -mq 2");
  testing::check_throws([&] { listed(4); }, "Muon: Q and K in blocks of 4 heads, of 6 heads", "-mq 4 of 6 heads");
  test_group({"Q and K head pairs", 256, 768, std::vector<uint8_t>(6, 0)}, true, recipe, rng);
}

void run() {
  llmc::Rng rng(1337);
  const std::vector<TestGroup> groups = {{"wide and tall", 96, 160, {0, 1, 0, 0, 1}},
                                         {"square", 64, 64, {0}},
                                         {"gates' shape", 6, 12, {0, 0, 0, 1, 0}}};
  llmc::NewtonSchulz steep3 = llmc::kNewtonSchulzSpeedrun;
  steep3.steps = 3;
  const std::vector<TestRecipe> recipes = {
      {"modern", {0.025f, 0.05f, 0.95f}, kTolOrthogonal, true},
      {"speedrun", {0.05f, 0.0f, 0.85f, 1.0f, llmc::kNewtonSchulzSpeedrun, false}, kTolSteepOrthogonal, false},
      {"3 steps", {0.05f, 0.01f, 0.9f, 1.0f, steep3, true}, kTolSteepOrthogonal, false},
      {"polar", {0.05f, 0.0f, 0.95f, 1.0f, llmc::kNewtonSchulzPolar, true}, kTolPolarOrthogonal, false},
      {"cautious", {0.05f, 1.2f, 0.95f, 1.0f, llmc::kNewtonSchulzPolar, true, llmc::WeightDecayKind::kCautious},
       kTolPolarOrthogonal, false},
      {"normuon",
       {0.05f, 1.2f, 0.95f, 1.0f, llmc::kNewtonSchulzPolar, true, llmc::WeightDecayKind::kCautious, true,
        (float)(1.0 - llmc::kNorMuonBeta2)},
       kTolPolarOrthogonal, false, true}};
  for (const TestRecipe& recipe : recipes) {
    for (const TestGroup& t : groups) {
      for (bool with_master : {true, false}) test_group(t, with_master, recipe, rng);
    }
  }
  test_apply_cautious(rng, false);
  test_apply_cautious(rng, true);
  test_qk_blocks(recipes.back(), rng);
  for (const TestGroup& t : {TestGroup{"tall and wide", 37, 101, {1, 0, 1, 0}}, TestGroup{"square", 48, 48, {0, 0}},
                             TestGroup{"gates' shape", 6, 12, {0, 1, 0}}}) {
    test_second_moment(t, rng);
  }
}

}  // namespace muon_tests
