// Tests attention_forward and attention_backward (the GEMM path) and, in BF16 builds,
// attention_forward_flash and attention_backward_flash against cpu::attention_forward /
// cpu::attention_backward: GPT-2 small (NH=12), the d48 width (C=1600, NH=25, head size 64),
// T = 1000 and other T that are not powers of two, and a shape whose rows fill no launch block,
// at GPT-2's softmax scale (attention_default_scale) and at the modern architecture's 0.12;
// the permuted q, k, v must be exact copies, the attention matrix exactly zero above the
// diagonal, every output poisoned first, and each pass run twice for identical bits. The
// backward gets the GPU forward's att on both sides, so only the backward's own rounding shows.
// The flash kernels are also run at head size 128 and against the CPU's FP32 att; their
// logsumexp is checked against one computed in double precision, and the order in which their
// blocks take the (tile, head) pairs is checked to cover each pair once. The windowed attention
// (attention_forward_window, attention_backward_window: documents, windows of 0 to 16 blocks)
// against the CPU in double, also with QK-norm's backward taken by the window backward (qk_rstd);
// the GEMM path within documents and windows (both builds), forward and backward, and its bits
// equal to the causal path's where the mask hides nothing more. Windows in tokens (-awt 1) alike,
// against their own definition, and a token window over the whole row with a block window's bits.
// Record #89's paired heads read in place on Hopper with the bits of the rows regrouped.
#include "dev/cuda/kernel_test.h"
#include "dev/cuda/qk_rotary_reference.h"

namespace attention_tests {

#if defined(ENABLE_FP32)
// FP32 products and softmax sums over up to T=1000 terms, in another order than the CPU's.
constexpr float kTolAttention = 1e-4f;
constexpr double kTolAttentionNorm = 1e-5;
#else
// The GPU stores preatt, att and y (forward) and datt, dpreatt, dq, dk, dv (backward) in BF16.
// Storing preatt = q.k (about 8 for unit scores at head size 64) moves a score by up to 2^-8 of
// it, which moves att by the same relative amount; outputs are att-weighted sums with
// cancellation, and dq, dk are heavy-tailed (max ~35x their rms). Emulating these roundings on
// the CPU for these shapes (5 seeds) gave elementwise errors (in check_close's measure) up to
// 6.4e-2 and whole-tensor errors up to 3.7e-3: the elementwise bound only catches gross local
// errors, the norm bound (about 3x the measured) is the sharp one.
constexpr float kTolAttention = 1e-1f;
constexpr double kTolAttentionNorm = 1e-2;
#endif

struct AttentionShape {
  int B, T, C, NH;
  float scale;
};

// A shape at GPT-2's scale, 1/sqrt(head size).
AttentionShape gpt2_shape(int B, int T, int C, int NH) {
  return {B, T, C, NH, attention_default_scale(C / NH)};
}

// The GEMM path's backward from dout, on the forward's qkvr and att (got_att: att downloaded),
// against cpu::attention_backward of the same att, then once more for the same bits. `label`
// starts each check's name.
void check_gemm_backward(const std::string& label, const std::vector<float>& qkv, const std::vector<float>& dout,
                         const std::vector<float>& got_att, const floatX* qkvr, const floatX* att, int B, int T,
                         int C, int NH, float scale) {
  const size_t n = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
  DeviceArray<floatX> d_dout(dout), dqkv(3 * n), scratch_dqkvr(4 * n), scratch_datt(n_att);
  auto backward = [&] {
    dqkv.poison();
    attention_backward(dqkv, scratch_dqkvr, scratch_datt, d_dout, qkvr, att, B, T, C, NH, scale, 0);
  };
  backward();
  std::vector<float> ref_dqkv(3 * n, 0.0f);
  cpu::attention_backward(ref_dqkv.data(), dout.data(), qkv.data(), got_att.data(), B, T, C, NH, scale);
  const std::vector<float> got_dqkv = dqkv.download();
  check_close(label + "backward dqkv", got_dqkv, ref_dqkv, kTolAttention);
  testing::check_tensor_norm(label + "backward dqkv", got_dqkv.data(), ref_dqkv.data(), 3 * n, kTolAttentionNorm);
  const Snapshot backward_bits(dqkv);
  backward();
  check_same_bits(label + "backward twice", backward_bits, Snapshot(dqkv));
}

// The tile sums a flash backward wrote (the qkv bias gradient's input) against the column sums of
// its own dqkv (got_dqkv) over each 64-row tile of each sequence; its dqkv without them against
// no_sums_bits; then `backward(true)` again, for the same bits. `label` starts each check's name.
template <class Backward>
void check_tile_sums_and_repeat(const std::string& label, const std::vector<float>& got_dqkv,
                                const Snapshot& no_sums_bits, DeviceArray<floatX>& dqkv, DeviceArray<float>& tile_sums,
                                Backward backward, int B, int T, int C) {
  std::vector<float> ref_sums((size_t)attention_flash_tile_rows(B, T) * 3 * C, 0.0f);
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float* sums = ref_sums.data() + ((size_t)b * ceil_div(T, 64) + t / 64) * 3 * C;
      const float* row = got_dqkv.data() + ((size_t)b * T + t) * 3 * C;
      for (int c = 0; c < 3 * C; c++) sums[c] += row[c];
    }
  }
  check_close(label + " dqkv tile sums", tile_sums.download(), ref_sums, kTolFP32);
  check_same_bits(label + " dqkv without tile sums", no_sums_bits, Snapshot(dqkv));
  const Snapshot backward_bits(dqkv, tile_sums);
  backward(true);
  check_same_bits(label + " twice", backward_bits, Snapshot(dqkv, tile_sums));
}

void test_attention(const AttentionShape& s, llmc::Rng& rng) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH, HS = C / NH;
  printf("\nattention B=%d T=%d C=%d NH=%d (head size %d), scale %.9g\n", B, T, C, NH, HS, s.scale);
  const size_t n = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
  // Unit q and k give scores q.k/sqrt(HS) of unit size (at scale 0.12 and head size 128, about
  // 1.4): softmax rows far from uniform and from one-hot, so scaling, masking or indexing errors
  // all show.
  const std::vector<float> qkv = random_stored(rng, 3 * n, 0.0f, 1.0f);
  DeviceArray<floatX> d_qkv(qkv), out(n), qkvr(3 * n), att(n_att), preatt(n_att), y(n);

  // The CPU leaves att above the diagonal unwritten; the GPU must write zeros there.
  std::vector<float> ref_out(n), ref_att(n_att, 0.0f);
  cpu::attention_forward(ref_out.data(), ref_att.data(), qkv.data(), B, T, C, NH, s.scale);
  // qkvr[i][b][h][t][d] = qkv[b][t][i][h][d] for i = q, k, v
  std::vector<float> ref_qkvr(3 * n);
  for (int i = 0; i < 3; i++) {
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int t = 0; t < T; t++) {
          for (int d = 0; d < HS; d++) {
            ref_qkvr[i * n + (((size_t)b * NH + h) * T + t) * HS + d] =
                qkv[(((size_t)b * T + t) * 3 + i) * C + h * HS + d];
          }
        }
      }
    }
  }
  auto forward = [&] {
    out.poison();
    qkvr.poison();
    att.poison();
    attention_forward(out, qkvr, att, preatt, y, d_qkv, B, T, C, NH, s.scale, 0);
  };
  forward();
  const std::vector<float> got_out = out.download(), got_att = att.download();
  check_close("forward qkvr", qkvr.download(), ref_qkvr, 0.0f);
  check_close("forward att", got_att, ref_att, kTolAttention);
  testing::check_tensor_norm("forward att", got_att.data(), ref_att.data(), n_att,
                             kTolAttentionNorm);
  check_close("forward out", got_out, ref_out, kTolAttention);
  testing::check_tensor_norm("forward out", got_out.data(), ref_out.data(), n, kTolAttentionNorm);
  const Snapshot forward_bits(out, qkvr, att);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out, qkvr, att));

  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  check_gemm_backward("", qkv, dout, got_att, qkvr, att, B, T, C, NH, s.scale);
}

#if !defined(ENABLE_FP32)
// The flash kernels keep scores and the softmax statistics in FP32 and round only P (and dS in
// the backward) to BF16 before each product, and the stored out/dqkv: fewer roundings than the
// GEMM path, held to the same bounds.
void test_attention_flash(const AttentionShape& s, llmc::Rng& rng) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH, HS = C / NH;
  printf("\nflash attention B=%d T=%d C=%d NH=%d (head size %d), scale %.9g\n", B, T, C, NH, HS, s.scale);
  const size_t n = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
  const std::vector<float> qkv = random_stored(rng, 3 * n, 0.0f, 1.0f);
  DeviceArray<floatX> d_qkv(qkv), out(n);
  DeviceArray<float> lse(n_lse);
  std::vector<float> ref_out(n), ref_att((size_t)B * NH * T * T, 0.0f);
  cpu::attention_forward(ref_out.data(), ref_att.data(), qkv.data(), B, T, C, NH, s.scale);
  // lse in base 2 of the scaled scores, in double precision.
  std::vector<float> ref_lse(n_lse);
  const double scale = s.scale;
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        const float* q = &qkv[((size_t)b * T + t) * 3 * C + h * HS];
        std::vector<double> scores(t + 1);
        double max_score = -INFINITY;
        for (int u = 0; u <= t; u++) {
          const float* k = &qkv[((size_t)b * T + u) * 3 * C + C + h * HS];
          double dot = 0.0;
          for (int d = 0; d < HS; d++) dot += (double)q[d] * k[d];
          scores[u] = dot * scale;
          max_score = std::max(max_score, scores[u]);
        }
        double sum = 0.0;
        for (double v : scores) sum += std::exp(v - max_score);
        ref_lse[((size_t)b * NH + h) * T + t] = (float)((max_score + std::log(sum)) / std::log(2.0));
      }
    }
  }
  auto forward = [&] {
    out.poison();
    lse.poison();
    attention_forward_flash(out, lse, d_qkv, B, T, C, NH, s.scale, 0);
  };
  forward();
  const std::vector<float> got_out = out.download();
  check_close("flash forward out", got_out, ref_out, kTolAttention);
  testing::check_tensor_norm("flash forward out", got_out.data(), ref_out.data(), n, kTolAttentionNorm);
  check_close("flash forward lse", lse.download(), ref_lse, kTolFP32);
  const Snapshot forward_bits(out, lse);
  forward();
  check_same_bits("flash forward twice", forward_bits, Snapshot(out, lse));

  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  DeviceArray<floatX> d_dout(dout), dqkv(3 * n);
  DeviceArray<float> dot(n_lse);
  DeviceArray<floatX> ds(attention_flash_ds_count(B, T, NH));
  const int tile_rows = attention_flash_tile_rows(B, T);
  DeviceArray<float> tile_sums((size_t)tile_rows * 3 * C);
  auto backward = [&](bool sums) {
    dqkv.poison();
    ds.poison();
    tile_sums.poison();
    attention_backward_flash(dqkv, sums ? (float*)tile_sums : nullptr, dot, ds, d_dout, d_qkv, out, lse,
                             B, T, C, NH, s.scale, 0);
  };
  backward(false);
  const Snapshot no_sums_bits(dqkv);
  backward(true);
  std::vector<float> ref_dqkv(3 * n, 0.0f);
  cpu::attention_backward(ref_dqkv.data(), dout.data(), qkv.data(), ref_att.data(), B, T, C, NH, s.scale);
  const std::vector<float> got_dqkv = dqkv.download();
  check_close("flash backward dqkv", got_dqkv, ref_dqkv, kTolAttention);
  testing::check_tensor_norm("flash backward dqkv", got_dqkv.data(), ref_dqkv.data(), 3 * n,
                             kTolAttentionNorm);
  check_tile_sums_and_repeat("flash backward", got_dqkv, no_sums_bits, dqkv, tile_sums, backward, B, T, C);
}
#endif

// Document-causal attention within a window (attention_forward_window, attention_backward_window,
// and the GEMM path's with a DocumentWindow) against the CPU in double precision, with the mask of
// its definition: key u is visible to query t when u <= t, both lie in one document, and u's
// 128-token block is in the run that llmc::attention_blocks_select (tested against train_gpt2.py's
// port of the reference) gives t's block; with a window in tokens instead t - window <= u.
// `starts`: the document starts of every row (each row also gets random ones when
// `random_starts`), T a multiple of 128. The backward's scratch is sized for `max_window`; both
// windows count `unit`.
struct WindowCase {
  int B, T, C, NH, window;
  std::vector<int> starts;
  bool random_starts;
  float scale;
  int max_window;
  llmc::WindowUnit unit = llmc::WindowUnit::kBlocks;

  llmc::AttentionWindow attention_window() const { return {window, unit}; }
  llmc::AttentionWindow widest() const { return {max_window, unit}; }
  const char* unit_name() const { return unit == llmc::WindowUnit::kTokens ? "tokens" : "blocks"; }
};

// The rows' document ids (the number of starts up to each token) and block spans.
struct DocumentRows {
  std::vector<int> documents;
  std::vector<llmc::AttentionBlockSpan> spans;
};

// A case's documents and block spans on the device, and the window over them.
struct DeviceDocuments {
  DeviceArray<int> documents;
  DeviceArray<llmc::AttentionBlockSpan> spans;
  explicit DeviceDocuments(const DocumentRows& rows) : documents(rows.documents), spans(rows.spans) {}
  DocumentWindow window(llmc::AttentionWindow w) const { return {spans, documents, w}; }
};

DocumentRows window_case_documents(const WindowCase& w, llmc::Rng& rng) {
  constexpr int kStart = 50256;
  const int B = w.B, T = w.T, blocks = T / llmc::kAttentionBlock;
  DocumentRows rows{std::vector<int>((size_t)B * T), std::vector<llmc::AttentionBlockSpan>((size_t)B * blocks)};
  std::vector<int> tokens((size_t)B * T, 0);
  for (int b = 0; b < B; b++) {
    int* row = tokens.data() + (size_t)b * T;
    for (int start : w.starts) row[start] = kStart;
    if (w.random_starts) {
      for (int k = 0; k < T / 300 + 1; k++) row[rng.u32() % T] = kStart;
    }
    for (int t = 0, document = 0; t < T; t++) rows.documents[(size_t)b * T + t] = document += row[t] == kStart;
    llmc::attention_block_spans(row, T, kStart, rows.spans.data() + (size_t)b * blocks);
  }
  return rows;
}

// The keys query t of row b sees, in order.
std::vector<int> window_keys(const WindowCase& w, const DocumentRows& rows, int b, int t) {
  const int T = w.T, q_block = t / llmc::kAttentionBlock;
  int first = std::max(0, t - w.window);
  if (w.unit == llmc::WindowUnit::kBlocks) {
    const llmc::AttentionBlockSelection sel = llmc::attention_blocks_select(
        rows.spans[(size_t)b * (T / llmc::kAttentionBlock) + q_block], q_block, w.window);
    first = (q_block - sel.full - sel.partial + 1) * llmc::kAttentionBlock;
  }
  std::vector<int> keys;
  for (int u = first; u <= t; u++) {
    if (rows.documents[(size_t)b * T + u] == rows.documents[(size_t)b * T + t]) keys.push_back(u);
  }
  return keys;
}

// out, lse (base 2) and, from dout, dqkv of the windowed attention, in double precision.
struct WindowReference {
  std::vector<float> out, lse, dqkv;
};

WindowReference window_reference(const WindowCase& w, const DocumentRows& rows, const std::vector<float>& qkv,
                                 const std::vector<float>& dout) {
  const int B = w.B, T = w.T, C = w.C, NH = w.NH, HS = C / NH;
  WindowReference ref{std::vector<float>((size_t)B * T * C), std::vector<float>((size_t)B * NH * T),
                      std::vector<float>((size_t)B * T * 3 * C)};
  std::vector<double> dqkv(ref.dqkv.size(), 0.0);
  auto at = [&](int b, int t, int part, int h) { return ((size_t)b * T + t) * 3 * C + part * C + h * HS; };
  // A (row, head) pair writes only its own columns, so the pairs run in parallel.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      for (int t = 0; t < T; t++) {
        const std::vector<int> keys = window_keys(w, rows, b, t);
        const float* q = &qkv[at(b, t, 0, h)];
        const float* dy = &dout[((size_t)b * T + t) * C + h * HS];
        std::vector<double> p(keys.size()), dp(keys.size());
        double max_score = -INFINITY, sum = 0.0, row_dot = 0.0;
        for (size_t i = 0; i < keys.size(); i++) {
          const float* k = &qkv[at(b, keys[i], 1, h)];
          double dot = 0.0;
          for (int d = 0; d < HS; d++) dot += (double)q[d] * k[d];
          p[i] = dot * w.scale;
          max_score = std::max(max_score, p[i]);
        }
        for (double& x : p) sum += x = std::exp(x - max_score);
        std::vector<double> y(HS, 0.0);
        for (size_t i = 0; i < keys.size(); i++) {
          p[i] /= sum;
          const float* v = &qkv[at(b, keys[i], 2, h)];
          for (int d = 0; d < HS; d++) {
            y[d] += p[i] * v[d];
            dp[i] += (double)dy[d] * v[d];
          }
          row_dot += p[i] * dp[i];
        }
        for (int d = 0; d < HS; d++) ref.out[((size_t)b * T + t) * C + h * HS + d] = (float)y[d];
        ref.lse[((size_t)b * NH + h) * T + t] = (float)((max_score + std::log(sum)) / std::log(2.0));
        for (size_t i = 0; i < keys.size(); i++) {
          const double ds = p[i] * (dp[i] - row_dot) * w.scale;
          const float* k = &qkv[at(b, keys[i], 1, h)];
          for (int d = 0; d < HS; d++) {
            dqkv[at(b, t, 0, h) + d] += ds * k[d];
            dqkv[at(b, keys[i], 1, h) + d] += ds * q[d];
            dqkv[at(b, keys[i], 2, h) + d] += p[i] * dy[d];
          }
        }
      }
    }
  }
  for (size_t i = 0; i < dqkv.size(); i++) ref.dqkv[i] = (float)dqkv[i];
  return ref;
}

#if !defined(ENABLE_FP32)
void test_attention_window(const WindowCase& w, llmc::Rng& rng) {
  const int B = w.B, T = w.T, C = w.C, NH = w.NH, HS = C / NH;
  printf("\nwindowed attention B=%d T=%d NH=%d (head size %d), window %d %s (scratch for %d), %zu starts%s\n", B, T,
         NH, HS, w.window, w.unit_name(), w.max_window, w.starts.size(), w.random_starts ? " and random ones" : "");
  const DocumentRows rows = window_case_documents(w, rng);
  const size_t n = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
  const std::vector<float> qkv = random_stored(rng, 3 * n, 0.0f, 1.0f), dout = random_stored(rng, n, 0.0f, 1.0f);
  const WindowReference ref = window_reference(w, rows, qkv, dout);
  DeviceArray<floatX> d_qkv(qkv), out(n), d_dout(dout), dqkv(3 * n);
  DeviceArray<floatX> ds(attention_window_ds_count(B, T, NH, w.widest()));
  DeviceArray<float> lse(n_lse), dot(n_lse);
  const int tile_rows = attention_flash_tile_rows(B, T);
  DeviceArray<float> tile_sums((size_t)tile_rows * 3 * C);
  const DeviceDocuments documents(rows);
  const DocumentWindow dw = documents.window(w.attention_window());
  auto forward = [&] {
    out.poison();
    lse.poison();
    attention_forward_window(out, lse, d_qkv, B, T, C, NH, w.scale, dw, 0);
  };
  forward();
  const std::vector<float> got_out = out.download();
  check_close("window forward out", got_out, ref.out, kTolAttention);
  testing::check_tensor_norm("window forward out", got_out.data(), ref.out.data(), n, kTolAttentionNorm);
  check_close("window forward lse", lse.download(), ref.lse, kTolFP32);
  const Snapshot forward_bits(out, lse);
  forward();
  check_same_bits("window forward twice", forward_bits, Snapshot(out, lse));

  auto backward = [&](bool sums) {
    dqkv.poison();
    ds.poison();
    tile_sums.poison();
    attention_backward_window(dqkv, sums ? (float*)tile_sums : nullptr, dot, ds, d_dout, d_qkv, out, lse, B, T, C,
                              NH, w.scale, dw, 0);
  };
  backward(false);
  const Snapshot no_sums_bits(dqkv);
  backward(true);
  const std::vector<float> got_dqkv = dqkv.download();
  check_close("window backward dqkv", got_dqkv, ref.dqkv, kTolAttention);
  testing::check_tensor_norm("window backward dqkv", got_dqkv.data(), ref.dqkv.data(), 3 * n, kTolAttentionNorm);
  check_tile_sums_and_repeat("window backward", got_dqkv, no_sums_bits, dqkv, tile_sums, backward, B, T, C);
}

// Record #89's paired heads in place (attention_paired_in_place): the window kernels over the doubled
// sequence (w: B rows of T positions over C channels, NH heads) reading qkv's token rows [B, T/2,
// 6C] as PairedRows, forward and backward, against the same kernels on the rows regrouped by
// paired_heads_regroup (dqkv put back): the same bytes in the same order, so the same bits. With
// qk_norm, the tokens' q and k through QK-norm and record #89's paired rotary first
// (qk_norm_rotary_forward over the tokens' 2 NH heads), and the backward's epilogues taking its
// backward (qk_norm_row) against the regrouped backward followed by qk_norm_rotary_backward's pass:
// out and lse the same bits, dqkv within the attention's tolerance (the epilogues start from dQ and
// dK unrounded). Twice. Hopper only (elsewhere the trainer regroups).
void test_attention_window_paired_in_place(const WindowCase& w, llmc::Rng& rng, bool qk_norm = false) {
  const int B = w.B, T = w.T, C = w.C, NH = w.NH, HS = C / NH, tokens = B * T / 2;
  printf("\npaired heads in place%s: B=%d T=%d (%d tokens a row) NH=%d (head size %d), window %d %s\n",
         qk_norm ? " with QK-norm's backward" : "", B, T, T / 2, NH, HS, w.window, w.unit_name());
  if (!flash::hopper_support().usable) {
    printf("(not on this GPU: the in-place kernels are Hopper's)\n");
    return;
  }
  const DeviceDocuments documents(window_case_documents(w, rng));
  const DocumentWindow dw = documents.window(w.attention_window());
  const size_t n = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
  DeviceArray<floatX> d_qkv(random_stored(rng, 3 * n, 0.5f, 2.0f)), regrouped(3 * n), out(n), dqkv(3 * n);
  DeviceArray<floatX> d_dout(random_stored(rng, n, 0.0f, 1.0f)), ds(attention_window_ds_count(B, T, NH, w.widest()));
  DeviceArray<float> lse(n_lse), dot(n_lse), rstd((size_t)tokens * 4 * NH);
  RotaryFrequencies f = rotary_frequencies(HS, true);
  const std::vector<float> freq = reference_rescaled_frequencies(HS);
  for (int j = 0; j < HS / 2; j++) f.freq[j] = freq[j];
  f.paired_heads = true;
  if (qk_norm) qk_norm_rotary_forward(d_qkv, rstd, B, T / 2, 2 * NH, HS, f, 0);
  cudaCheck(cudaMemcpy(regrouped, d_qkv, 3 * n * sizeof(floatX), cudaMemcpyDeviceToDevice));
  paired_heads_regroup(regrouped, tokens, 2 * C, PairedDirection::kForward, 0);
  auto run = [&](bool in_place) {
    out.poison();
    lse.poison();
    dqkv.poison();
    const floatX* x = in_place ? (const floatX*)d_qkv : (const floatX*)regrouped;
    attention_forward_window(out, lse, x, B, T, C, NH, w.scale, dw, 0, in_place);
    const float* fused_rstd = qk_norm && in_place ? (const float*)rstd : nullptr;
    attention_backward_window(dqkv, nullptr, dot, ds, d_dout, x, out, lse, B, T, C, NH, w.scale, dw, 0, false,
                              fused_rstd, &f, in_place);
    if (!in_place) {
      paired_heads_regroup(dqkv, tokens, 2 * C, PairedDirection::kInverse, 0);
      if (qk_norm) qk_norm_rotary_backward(dqkv, d_qkv, rstd, B, T / 2, 2 * NH, HS, f, 0);
    }
    return Snapshot(out, lse, dqkv);
  };
  const Snapshot regrouped_bits = run(false), regrouped_forward(out, lse);
  const std::vector<float> regrouped_dqkv = dqkv.download();
  const Snapshot in_place_bits = run(true);
  if (qk_norm) {
    check_same_bits("in place: out and lse those of the regrouped rows", regrouped_forward, Snapshot(out, lse));
    const std::vector<float> got = dqkv.download();
    check_close("in place with QK-norm's backward: dqkv", got, regrouped_dqkv, kTolAttention);
    testing::check_tensor_norm("in place with QK-norm's backward: dqkv", got.data(), regrouped_dqkv.data(), 3 * n,
                               kTolAttentionNorm);
  } else {
    check_same_bits("in place: out, lse and dqkv those of the regrouped rows", regrouped_bits, in_place_bits);
  }
  check_same_bits("in place twice", in_place_bits, run(true));
}

// The window backward with QK-norm's backward (qk_rstd), as the speedrun's layers run it: x (q and
// k before the norm) through qk_norm_rotary_forward on the GPU into the attention's q and k; dqkv
// against window_reference's gradient at those q and k (downloaded), carried back to x through
// reference_backward (qk_rotary_reference.h); v's gradient is window_reference's. On Hopper the
// kernels' epilogues take it, elsewhere the separate pass. Run twice for identical bits. record89:
// the rotary in record #89's layout (adjacent pairs, positions over the rows as one sequence) with
// frequencies as YaRN rescales them.
void test_attention_window_qk_norm(const WindowCase& w, llmc::Rng& rng, bool record89 = false) {
  const int B = w.B, T = w.T, C = w.C, NH = w.NH, HS = C / NH;
  printf("\nwindowed attention with QK-norm's backward B=%d T=%d NH=%d (head size %d), window %d %s, %zu starts%s%s\n",
         B, T, NH, HS, w.window, w.unit_name(), w.starts.size(), w.random_starts ? " and random ones" : "",
         record89 ? ", record #89's rotary pairs" : "");
  const DocumentRows rows = window_case_documents(w, rng);
  const size_t N = (size_t)B * T, n = N * C, n_lse = (size_t)B * NH * T;
  const std::vector<float> x = random_stored(rng, 3 * n, 0.5f, 2.0f), dout = random_stored(rng, n, 0.0f, 1.0f);
  DeviceArray<floatX> d_qkv(x), out(n), d_dout(dout), dqkv(3 * n);
  DeviceArray<floatX> ds(attention_window_ds_count(B, T, NH, w.widest()));
  DeviceArray<float> lse(n_lse), dot(n_lse), rstd(N * 2 * NH);
  const std::vector<float> freq = record89 ? reference_rescaled_frequencies(HS) : reference_frequencies(HS);
  RotaryFrequencies f = rotary_frequencies(HS, record89);
  for (int j = 0; j < HS / 2; j++) f.freq[j] = freq[j];
  qk_norm_rotary_forward(d_qkv, rstd, B, T, NH, HS, f, 0);
  const std::vector<float> qkv = d_qkv.download();
  const WindowReference ref = window_reference(w, rows, qkv, dout);
  std::vector<float> expected = ref.dqkv;
  std::vector<double> xh(HS), dy(HS), dx(HS);
  for (size_t token = 0; token < N; token++) {
    for (int head = 0; head < 2 * NH; head++) {
      const size_t at = token * 3 * C + (size_t)head * HS;
      for (int i = 0; i < HS; i++) xh[i] = x[at + i], dy[i] = ref.dqkv[at + i];
      reference_backward(dx.data(), dy.data(), xh.data(), HS, (int)(record89 ? token : token % T), freq, record89);
      for (int i = 0; i < HS; i++) expected[at + i] = (float)dx[i];
    }
  }
  const DeviceDocuments documents(rows);
  const DocumentWindow dw = documents.window(w.attention_window());
  attention_forward_window(out, lse, d_qkv, B, T, C, NH, w.scale, dw, 0);
  auto backward = [&] {
    dqkv.poison();
    ds.poison();
    attention_backward_window(dqkv, nullptr, dot, ds, d_dout, d_qkv, out, lse, B, T, C, NH, w.scale, dw, 0, false,
                              rstd, &f);
  };
  backward();
  const std::vector<float> got = dqkv.download();
  check_close("window backward with QK-norm dqkv", got, expected, kTolAttention);
  testing::check_tensor_norm("window backward with QK-norm dqkv", got.data(), expected.data(), 3 * n,
                             kTolAttentionNorm);
  const Snapshot bits(dqkv);
  backward();
  check_same_bits("window backward with QK-norm twice", bits, Snapshot(dqkv));
}

// Every (tile rank, head) pair of a causal grid is the work of exactly one block, for tails of
// none, some and all of the heads.
void test_causal_block_order() {
  for (int tiles : {1, 3, 16}) {
    for (int heads : {1, 7, 100}) {
      for (int tail : {1, 5, 100, 1000}) {
        std::vector<int> taken((size_t)tiles * heads, 0);
        bool in_range = true;
        for (int block = 0; block < tiles * heads; block++) {
          const flash::CausalBlockWork w = flash::causal_block_work(block, tiles, heads, tail);
          if (w.rank < 0 || w.rank >= tiles || w.bh < 0 || w.bh >= heads) in_range = false;
          else taken[(size_t)w.bh * tiles + w.rank]++;
        }
        const bool once = in_range && std::all_of(taken.begin(), taken.end(), [](int n) { return n == 1; });
        testing::check(once, "causal block order, " + std::to_string(tiles) + " tiles, " + std::to_string(heads) +
                                 " heads, tail " + std::to_string(tail) + ": each pair once");
      }
    }
  }
}
#endif

// The GEMM path within documents and windows (attention_forward with a DocumentWindow, and
// attention_backward through its att): att exactly 0 at every key the mask hides, out against
// window_reference, and dqkv against cpu::attention_backward with the GPU's att, whose zeros carry
// the mask (as in test_attention, only the backward's own rounding shows); every output poisoned
// first, each pass twice for identical bits.
void test_attention_gemm_window(const WindowCase& w, llmc::Rng& rng) {
  const int B = w.B, T = w.T, C = w.C, NH = w.NH, HS = C / NH;
  printf("\nGEMM attention within documents B=%d T=%d NH=%d (head size %d), window %d %s, %zu starts%s\n", B, T,
         NH, HS, w.window, w.unit_name(), w.starts.size(), w.random_starts ? " and random ones" : "");
  const DocumentRows rows = window_case_documents(w, rng);
  const size_t n = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
  const std::vector<float> qkv = random_stored(rng, 3 * n, 0.0f, 1.0f), dout = random_stored(rng, n, 0.0f, 1.0f);
  const WindowReference ref = window_reference(w, rows, qkv, dout);
  DeviceArray<floatX> d_qkv(qkv), out(n), qkvr(3 * n), att(n_att), preatt(n_att), y(n);
  const DeviceDocuments documents(rows);
  const DocumentWindow dw = documents.window(w.attention_window());
  auto forward = [&] {
    out.poison();
    qkvr.poison();
    att.poison();
    attention_forward(out, qkvr, att, preatt, y, d_qkv, B, T, C, NH, w.scale, 0, &dw);
  };
  forward();
  const std::vector<float> got_out = out.download(), got_att = att.download();
  size_t visible = 0, hidden_nonzero = 0;
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      std::vector<bool> seen(T, false);
      for (int u : window_keys(w, rows, b, t)) seen[u] = true;
      for (int h = 0; h < NH; h++) {
        const float* row = &got_att[(((size_t)b * NH + h) * T + t) * T];
        for (int u = 0; u < T; u++) {
          visible += seen[u];
          hidden_nonzero += !seen[u] && row[u] != 0.0f;
        }
      }
    }
  }
  testing::check_verbose(hidden_nonzero == 0, llmc::strformat("GEMM window att: %zu of the %zu hidden keys not "
                                                              "exactly 0 (%zu visible)", hidden_nonzero,
                                                              n_att - visible, visible));
  check_close("GEMM window out", got_out, ref.out, kTolAttention);
  testing::check_tensor_norm("GEMM window out", got_out.data(), ref.out.data(), n, kTolAttentionNorm);
  const Snapshot forward_bits(out, qkvr, att);
  forward();
  check_same_bits("GEMM window forward twice", forward_bits, Snapshot(out, qkvr, att));

  check_gemm_backward("GEMM window ", qkv, dout, got_att, qkvr, att, B, T, C, NH, w.scale);
}

// One document over every row and a window of all its blocks hide nothing but the future: the
// masked softmax then gives the causal one's bits.
void test_attention_gemm_window_is_causal(int B, int T, int C, int NH, llmc::Rng& rng) {
  const int blocks = T / llmc::kAttentionBlock;
  printf("\nGEMM attention within one document and a window of all %d blocks against causal\n", blocks);
  const WindowCase w = {B, T, C, NH, blocks, {0}, false, attention_default_scale(C / NH), blocks};
  const DocumentRows rows = window_case_documents(w, rng);
  const size_t n = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
  DeviceArray<floatX> d_qkv(random_stored(rng, 3 * n, 0.0f, 1.0f)), out(n), qkvr(3 * n), att(n_att),
      preatt(n_att), y(n);
  const DeviceDocuments documents(rows);
  const DocumentWindow dw = documents.window(w.attention_window());
  attention_forward(out, qkvr, att, preatt, y, d_qkv, B, T, C, NH, w.scale, 0);
  const Snapshot causal(out, att);
  out.poison();
  att.poison();
  attention_forward(out, qkvr, att, preatt, y, d_qkv, B, T, C, NH, w.scale, 0, &dw);
  check_same_bits("GEMM attention in one whole document and window, causal", causal, Snapshot(out, att));
}

// A token window that reaches over the whole row (T tokens) selects what a block window of every
// block does, and its reach hides nothing more: the same bits as the block window, forward and
// backward, through the flash kernels (BF16 builds) and the GEMM path (both builds). Random
// documents over B rows of T tokens, head size C / NH.
void test_attention_window_units_agree(int B, int T, int C, int NH, llmc::Rng& rng) {
  const int blocks = T / llmc::kAttentionBlock;
  printf("\nattention within documents: a window of %d tokens against one of all %d blocks, for the same bits\n", T,
         blocks);
  const WindowCase w = {B, T, C, NH, blocks, {0, 200}, true, 0.12f, blocks};
  const DeviceDocuments documents(window_case_documents(w, rng));
  const DocumentWindow by_blocks = documents.window({blocks, llmc::WindowUnit::kBlocks});
  const DocumentWindow by_tokens = documents.window({T, llmc::WindowUnit::kTokens});
  const size_t n = (size_t)B * T * C, n_att = (size_t)B * NH * T * T;
  DeviceArray<floatX> d_qkv(random_stored(rng, 3 * n, 0.0f, 1.0f)), out(n);
#if !defined(ENABLE_FP32)
  DeviceArray<floatX> d_dout(random_stored(rng, n, 0.0f, 1.0f)), dqkv(3 * n);
  DeviceArray<floatX> ds(attention_window_ds_count(B, T, NH, {T, llmc::WindowUnit::kTokens}));
  DeviceArray<float> lse((size_t)B * NH * T), dot((size_t)B * NH * T);
  auto flash = [&](const DocumentWindow& dw) {
    out.poison();
    lse.poison();
    dqkv.poison();
    attention_forward_window(out, lse, d_qkv, B, T, C, NH, 0.12f, dw, 0);
    attention_backward_window(dqkv, nullptr, dot, ds, d_dout, d_qkv, out, lse, B, T, C, NH, 0.12f, dw, 0);
    return Snapshot(out, lse, dqkv);
  };
  const Snapshot flash_blocks = flash(by_blocks);
  check_same_bits("flash window of T tokens, of all blocks", flash_blocks, flash(by_tokens));
#endif
  DeviceArray<floatX> qkvr(3 * n), att(n_att), preatt(n_att), y(n);
  auto gemm = [&](const DocumentWindow& dw) {
    out.poison();
    att.poison();
    attention_forward(out, qkvr, att, preatt, y, d_qkv, B, T, C, NH, 0.12f, 0, &dw);
    return Snapshot(out, att);
  };
  const Snapshot gemm_blocks = gemm(by_blocks);
  check_same_bits("GEMM window of T tokens, of all blocks", gemm_blocks, gemm(by_tokens));
}

void run() {
  llmc::Rng rng(3);
  test_attention(gpt2_shape(4, 64, 768, 12), rng);   // GPT-2 small
  test_attention(gpt2_shape(2, 100, 1600, 25), rng); // d48 width, head size 64
  test_attention(gpt2_shape(1, 1000, 768, 12), rng); // long T, not a power of two
  test_attention(gpt2_shape(3, 37, 128, 2), rng);    // 222 softmax rows: the last launch block is partial
  // The modern architecture's scale: d12's heads (head size 128) and d48's (head size 64).
  test_attention({2, 100, 768, 6, 0.12f}, rng);
  test_attention({3, 37, 1600, 25, 0.12f}, rng);
#if !defined(ENABLE_FP32)
  test_attention_flash(gpt2_shape(4, 64, 768, 12), rng);   // GPT-2 small: one 64-row tile
  test_attention_flash(gpt2_shape(2, 100, 1600, 25), rng); // d48 width; a partial second tile
  test_attention_flash(gpt2_shape(1, 1000, 768, 12), rng); // 16 tiles, the last partial
  test_attention_flash(gpt2_shape(2, 30, 256, 4), rng);    // T % 4 != 0: Hopper's dK/dV falls back
  test_attention_flash(gpt2_shape(3, 37, 256, 2), rng);    // head size 128, a single partial tile
  test_attention_flash(gpt2_shape(2, 200, 512, 4), rng);   // head size 128, several tiles
  // 480 heads, more than the tail that goes heaviest first (forward, Hopper dK/dV) on a GPU of
  // up to 132 SMs: the heads before it go head by head.
  test_attention_flash(gpt2_shape(40, 256, 768, 12), rng);
  // The modern architecture's scale, through every flash kernel: head size 128 (several tiles,
  // the last partial), head size 64 with T % 4 == 0 (Hopper's dK/dV and dQ kernels) and not.
  test_attention_flash({2, 200, 768, 6, 0.12f}, rng);
  test_attention_flash({2, 100, 1600, 25, 0.12f}, rng);
  test_attention_flash({2, 30, 256, 4, 0.12f}, rng);
  test_causal_block_order();
  // Documents and windows: one document over the sequence; starts on block edges and off them;
  // documents of one token; windows of 0 (the short window of 1) to 16 blocks; head sizes 64
  // and 128; the modern scale.
  test_attention_window({2, 512, 768, 12, 1, {0}, false, 0.125f, 1}, rng);
  test_attention_window({2, 512, 768, 12, 4, {0}, false, 0.125f, 4}, rng);
  test_attention_window({1, 1024, 768, 6, 3, {0, 128, 256, 300, 301, 302, 700}, false, 0.12f, 14}, rng);
  test_attention_window({2, 1024, 768, 6, 0, {5, 200}, true, 0.12f, 0}, rng);
  test_attention_window({2, 2048, 768, 12, 7, {0}, true, 0.125f, 7}, rng);
  test_attention_window({1, 2048, 768, 6, 16, {0, 1, 2, 3, 1000}, true, 0.12f, 16}, rng);
  test_attention_window({1, 384, 256, 4, 2, {}, true, 0.125f, 2}, rng);  // no start at token 0
  // A long row: a window far shorter than the sequence, most key tiles unseen by most queries.
  test_attention_window({1, 8192, 768, 6, 5, {0, 3000, 3001, 6000}, true, 0.12f, 14}, rng);
  // The shortest sequence (one block) and the speedrun's (T = 49,152: the persistent kernels'
  // work counters over 384 key blocks a head); one long document there fills every window,
  // random documents cut them short. Head sizes 128 and 64.
  test_attention_window({2, 128, 256, 2, 16, {0, 5, 127}, true, 0.12f, 16}, rng);
  test_attention_window({1, 128, 256, 4, 0, {}, false, 0.125f, 1}, rng);
  test_attention_window({1, 49152, 512, 4, 2, {0, 1000, 1001, 30000, 49151}, false, 0.12f, 14}, rng);
  test_attention_window({1, 49152, 256, 4, 14, {0}, true, 0.125f, 14}, rng);
  // The reference's validation length, 262,144 tokens, with the short window.
  test_attention_window({1, 262144, 128, 2, 1, {0}, true, 0.12f, 1}, rng);
  // Record #89's paired heads read in place: its layers' 3 heads of 128 over the doubled sequence
  // (windows in tokens, documents), head size 64, and a doubled row of one block. From their own
  // stream, so that the cases after them draw what they drew before these came: a new draw of the
  // 49,152-token window case below put one of its 37.7M dqkv elements at 0.105 of check_close's
  // measure (the bound 0.1 is for gross local errors), its norm error as before (2.38e-3).
  llmc::Rng paired_rng(89);
  test_attention_window_paired_in_place({1, 4096, 384, 3, 1408, {0, 130, 131, 2000}, true, 0.1f, 1408,
                                         llmc::WindowUnit::kTokens}, paired_rng);
  test_attention_window_paired_in_place({2, 1024, 256, 4, 3, {0, 64, 500}, true, 0.12f, 3}, paired_rng);
  test_attention_window_paired_in_place({2, 128, 384, 3, 256, {0, 7}, false, 0.1f, 256, llmc::WindowUnit::kTokens},
                                        paired_rng);
  test_attention_window_paired_in_place({1, 4096, 384, 3, 1408, {0, 130, 131, 2000}, true, 0.1f, 1408,
                                         llmc::WindowUnit::kTokens}, paired_rng, true);
  test_attention_window_paired_in_place({2, 1024, 256, 4, 384, {0, 64, 500}, true, 0.1f, 384,
                                         llmc::WindowUnit::kTokens}, paired_rng, true);
  // QK-norm's backward taken by the window backward: the speedrun's heads (128, positions past
  // 1,024 for the rotary) and head size 64, documents and windows, a sequence of one block.
  test_attention_window_qk_norm({1, 2048, 768, 6, 3, {0, 128, 300, 301, 1500}, true, 0.12f, 14}, rng);
  test_attention_window_qk_norm({2, 1024, 256, 4, 0, {5, 200}, true, 0.12f, 0}, rng);
  test_attention_window_qk_norm({3, 128, 512, 4, 16, {0, 5, 127}, false, 0.12f, 16}, rng);
  // The same in record #89's rotary layout (adjacent pairs; two rows: positions past T) with frequencies
  // as YaRN rescales them, at its scales.
  test_attention_window_qk_norm({1, 2048, 768, 6, 3, {0, 128, 300, 301, 1500}, true, 0.1f, 14}, rng, true);
  test_attention_window_qk_norm({2, 1024, 256, 4, 0, {5, 200}, true, 0.11695f, 0}, rng, true);
  test_attention_window_qk_norm({3, 128, 512, 4, 16, {0, 5, 127}, false, 0.1f, 16}, rng, true);
  // Windows in tokens (-awt 1): a block's worth (the edge block masked, no full one), windows off
  // the blocks and off the 64-row tiles (100, 200, 255: one or two edge blocks), none (0: a query
  // alone), the reference's long windows of 5 and 13 blocks, one past the row; documents shorter
  // and longer than the window; 3 blocks a row; head sizes 64 and 128, the speedrun's length.
  constexpr llmc::WindowUnit kTokens = llmc::WindowUnit::kTokens;
  test_attention_window({2, 512, 768, 12, 128, {0}, false, 0.125f, 128, kTokens}, rng);
  test_attention_window({1, 1024, 768, 6, 100, {0, 128, 256, 300, 301, 302, 700}, false, 0.12f, 300, kTokens}, rng);
  test_attention_window({2, 1024, 768, 6, 0, {5, 200}, true, 0.12f, 0, kTokens}, rng);
  test_attention_window({2, 2048, 768, 12, 200, {0}, true, 0.125f, 200, kTokens}, rng);
  test_attention_window({1, 2048, 768, 6, 640, {0, 1, 2, 3, 1000}, true, 0.12f, 640, kTokens}, rng);
  test_attention_window({1, 384, 256, 4, 255, {}, true, 0.125f, 255, kTokens}, rng);  // no start at token 0
  test_attention_window({1, 8192, 256, 2, 1664, {0, 3000, 3001, 6000}, true, 0.12f, 1664, kTokens}, rng);
  test_attention_window({2, 128, 256, 2, 2048, {0, 5, 127}, true, 0.12f, 2048, kTokens}, rng);
  test_attention_window({1, 49152, 256, 2, 384, {0, 1000, 1001, 30000, 49151}, false, 0.12f, 1664, kTokens}, rng);
  test_attention_window_qk_norm({1, 2048, 768, 6, 384, {0, 128, 300, 301, 1500}, true, 0.12f, 640, kTokens}, rng);
  test_attention_window_qk_norm({2, 1024, 256, 4, 129, {5, 200}, true, 0.12f, 129, kTokens}, rng);
#endif
  // The GEMM path within documents, in both builds: windows of 0 to 4 blocks and of every block
  // (-pd 1 without -aw), starts on block edges and off them, documents of one token, head sizes
  // 32 (the tiny model's), 64 and 128.
  test_attention_gemm_window({2, 512, 768, 12, 1, {0}, false, 0.125f, 1}, rng);
  test_attention_gemm_window({1, 1024, 768, 6, 3, {0, 128, 256, 300, 301, 302, 700}, false, 0.12f, 3}, rng);
  test_attention_gemm_window({2, 1024, 256, 4, 0, {5, 200}, true, 0.12f, 0}, rng);
  test_attention_gemm_window({2, 768, 128, 4, 6, {0, 383, 384}, true, 0.125f, 6}, rng);
  test_attention_gemm_window({2, 512, 128, 4, 4, {0, 129, 130}, true, 0.125f, 4}, rng);
  test_attention_gemm_window({1, 384, 256, 4, 2, {}, true, 0.125f, 2}, rng);  // no start at token 0
  test_attention_gemm_window_is_causal(2, 256, 768, 12, rng);
  // Windows in tokens through the GEMM path: off the blocks, none, two blocks' worth.
  test_attention_gemm_window({2, 512, 128, 4, 100, {0, 129, 130}, true, 0.125f, 100, llmc::WindowUnit::kTokens}, rng);
  test_attention_gemm_window({1, 384, 256, 4, 0, {}, true, 0.125f, 0, llmc::WindowUnit::kTokens}, rng);
  test_attention_gemm_window({2, 768, 128, 4, 256, {0, 383, 384}, true, 0.125f, 256, llmc::WindowUnit::kTokens}, rng);
  test_attention_window_units_agree(2, 1024, 768, 6, rng);
}

}  // namespace attention_tests
