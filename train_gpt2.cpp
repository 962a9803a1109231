// GPT-2 training in FP32 on the CPU: the readable reference implementation. test_gpt2.cpp checks
// it against PyTorch; the CUDA kernels' tests check against its layer functions.
//
// Contents
//   1. Layers       encoder, layernorm, matmul, attention, GELU, residual, softmax + cross-entropy;
//                   each forward next to its backward
//   2. Optimizer    global gradient norm, clipping, AdamW
//   3. Model        activation table, the GPT2 struct, forward, zero_grad, backward, update
//   4. Checkpoints  load (FP32 or BF16), save (FP32), random init from a preset and a seed
//                   (the formats and the init itself are llmc/gpt2.h's)
//   5. Sampling
//   6. CLI and main (left out under TESTING: test_gpt2.cpp includes this file)
//
// Conventions. Tensors are row-major float arrays; BT = B*T token rows; linear weights are
// PyTorch's [out, in]. Every *_backward accumulates (+=) into every gradient it produces, of
// parameters and of inputs alike: the model zeroes its activation-gradient buffers before use, and
// gradient accumulation over micro-steps is repeated backward calls between zero_grad calls.
// Parallel loops give each thread whole output elements and every reduction runs in a fixed
// order, so results are bitwise the same for any number of threads.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/flags.h"
#include "llmc/gpt2.h"
#include "llmc/logger.h"
#include "llmc/progress.h"
#include "llmc/rand.h"
#include "llmc/schedulers.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

using namespace llmc;

// ------------------------------------------------------------------------------------------------
// 1. Layers

// Encoder: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. Overwrites out (B,T,C).
void encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B,
                     int T, int C) {
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float* out_bt = out + ((size_t)b * T + t) * C;
      const float* token_row = wte + (size_t)tokens[b * T + t] * C;
      const float* position_row = wpe + (size_t)t * C;
      for (int c = 0; c < C; c++) out_bt[c] = token_row[c] + position_row[c];
    }
  }
}

// Serial on purpose: a token that repeats adds into the same dwte row, and the work is O(B*T*C),
// nothing next to the matmuls.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                      int C) {
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      const float* dout_bt = dout + ((size_t)b * T + t) * C;
      float* dtoken_row = dwte + (size_t)tokens[b * T + t] * C;
      float* dposition_row = dwpe + (size_t)t * C;
      for (int c = 0; c < C; c++) {
        dtoken_row[c] += dout_bt[c];
        dposition_row[c] += dout_bt[c];
      }
    }
  }
}

// LayerNorm over the last dimension, eps 1e-5 (PyTorch's default), biased variance. Overwrites
// out (BT,C) and saves mean and rstd (BT) for the backward. The statistics are summed in double:
// it costs nothing at O(C) per row and keeps their rounding out of the comparison with PyTorch.
constexpr float kLayerNormEps = 1e-5f;

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int BT, int C) {
#pragma omp parallel for
  for (int r = 0; r < BT; r++) {
    const float* x = inp + (size_t)r * C;
    double sum = 0.0;
    for (int c = 0; c < C; c++) sum += x[c];
    const float m = (float)(sum / C);
    double squares = 0.0;
    for (int c = 0; c < C; c++) {
      const double d = x[c] - m;
      squares += d * d;
    }
    const float s = (float)(1.0 / std::sqrt(squares / C + kLayerNormEps));
    float* y = out + (size_t)r * C;
    for (int c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

// dinp is a per-row formula; dweight and dbias sum over rows, so a second pass hands each thread
// a slice of channels and walks the rows in order (no atomics, no thread-count dependence).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int BT, int C) {
#pragma omp parallel for
  for (int r = 0; r < BT; r++) {
    const float* x = inp + (size_t)r * C;
    const float* dy = dout + (size_t)r * C;
    const float m = mean[r], s = rstd[r];
    double dnorm_sum = 0.0, dnorm_norm_sum = 0.0;
    for (int c = 0; c < C; c++) {
      const float dnorm = dy[c] * weight[c];
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * ((x[c] - m) * s);
    }
    const float dnorm_mean = (float)(dnorm_sum / C);
    const float dnorm_norm_mean = (float)(dnorm_norm_sum / C);
    float* dx = dinp + (size_t)r * C;
    for (int c = 0; c < C; c++) {
      const float norm = (x[c] - m) * s;
      dx[c] += (dy[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
  constexpr int kChannelSlice = 64;
#pragma omp parallel for
  for (int c0 = 0; c0 < C; c0 += kChannelSlice) {
    const int c1 = std::min(C, c0 + kChannelSlice);
    for (int r = 0; r < BT; r++) {
      const float* x = inp + (size_t)r * C;
      const float* dy = dout + (size_t)r * C;
      for (int c = c0; c < c1; c++) {
        dweight[c] += dy[c] * ((x[c] - mean[r]) * rstd[r]);
        dbias[c] += dy[c];
      }
    }
  }
}

// Matmul. The three products of a linear layer are one kernel, gemm_accumulate:
//     C(i,j) += sum_k A(i,k) * B(k,j)
// with B row-major and contiguous in j (the vectorised direction), and A and C addressed through
// row and column strides, which expresses each transpose without copying the large operand:
//     forward  out^T[OC,BT]  = W[OC,C] . inp^T[C,BT]   (inp, the small one, is transposed)
//     dinp     dinp[BT,C]   += dout[BT,OC] . W[OC,C]
//     dweight  dW[OC,C]     += dout^T[OC,BT] . inp[BT,C]
// Every C element is a plain sum over k in increasing order, continued from its current value, so
// the result does not depend on threads or vector width, and a batch split into two backward
// calls gives bitwise the sum of one call over the whole batch. Blocking: a kGemmBlockK x
// kGemmBlockN panel of B stays in L2 while every row tile of A passes over it; a
// kGemmTileRows x kGemmTileCols tile of C is held in registers. 2*M*N*K FLOPs per call.
constexpr int kGemmTileRows = 4;
constexpr int kGemmTileCols = 16;
constexpr int kGemmBlockK = 256;
constexpr int kGemmBlockN = 256;

struct ConstStrided {  // element (i, j) at data[i * row_stride + j * col_stride]
  const float* data;
  long row_stride;
  long col_stride;
};

struct Strided {
  float* data;
  long row_stride;
  long col_stride;
};

// One full register tile over k in [k0, k1). a and c point at the tile's first row and column;
// b points at column j0 of row 0.
static inline void gemm_tile(Strided c, ConstStrided a, const float* b, long ldb, int k0, int k1) {
  float acc[kGemmTileRows][kGemmTileCols];
  for (int i = 0; i < kGemmTileRows; i++) {
    for (int j = 0; j < kGemmTileCols; j++) acc[i][j] = c.data[i * c.row_stride + j * c.col_stride];
  }
  for (int k = k0; k < k1; k++) {
    const float* b_row = b + (long)k * ldb;
    for (int i = 0; i < kGemmTileRows; i++) {
      const float a_ik = a.data[i * a.row_stride + k * a.col_stride];
      // Without the pragma GCC vectorises along k instead and keeps the sums in memory (4x slower).
#pragma omp simd
      for (int j = 0; j < kGemmTileCols; j++) acc[i][j] += a_ik * b_row[j];
    }
  }
  for (int i = 0; i < kGemmTileRows; i++) {
    for (int j = 0; j < kGemmTileCols; j++) c.data[i * c.row_stride + j * c.col_stride] = acc[i][j];
  }
}

// A partial tile at the right or bottom edge, summed in the same order as gemm_tile.
static void gemm_edge_tile(Strided c, ConstStrided a, const float* b, long ldb, int rows, int cols,
                           int k0, int k1) {
  for (int i = 0; i < rows; i++) {
    for (int j = 0; j < cols; j++) {
      float sum = c.data[i * c.row_stride + j * c.col_stride];
      for (int k = k0; k < k1; k++) {
        sum += a.data[i * a.row_stride + k * a.col_stride] * b[(long)k * ldb + j];
      }
      c.data[i * c.row_stride + j * c.col_stride] = sum;
    }
  }
}

// Each thread owns a contiguous band of row tiles for the whole call, so there is one parallel
// region and no barrier inside it (barriers cost most when other programs share the cores).
void gemm_accumulate(Strided c, ConstStrided a, const float* b, long ldb, int M, int N, int K) {
  const int row_tiles = (M + kGemmTileRows - 1) / kGemmTileRows;
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int i_begin = (int)((long)row_tiles * thread / threads) * kGemmTileRows;
    const int i_end = std::min(M, (int)((long)row_tiles * (thread + 1) / threads) * kGemmTileRows);
    for (int k0 = 0; k0 < K; k0 += kGemmBlockK) {
      const int k1 = std::min(K, k0 + kGemmBlockK);
      for (int n0 = 0; n0 < N; n0 += kGemmBlockN) {
        const int n1 = std::min(N, n0 + kGemmBlockN);
        for (int i0 = i_begin; i0 < i_end; i0 += kGemmTileRows) {
          const int rows = std::min(kGemmTileRows, M - i0);
          const ConstStrided a_tile = {a.data + (long)i0 * a.row_stride, a.row_stride,
                                       a.col_stride};
          for (int j0 = n0; j0 < n1; j0 += kGemmTileCols) {
            const int cols = std::min(kGemmTileCols, n1 - j0);
            const Strided c_tile = {c.data + (long)i0 * c.row_stride + (long)j0 * c.col_stride,
                                    c.row_stride, c.col_stride};
            if (rows == kGemmTileRows && cols == kGemmTileCols) {
              gemm_tile(c_tile, a_tile, b + j0, ldb, k0, k1);
            } else {
              gemm_edge_tile(c_tile, a_tile, b + j0, ldb, rows, cols, k0, k1);
            }
          }
        }
      }
    }
  }
}

// out (BT,OC) = inp (BT,C) . weight^T + bias, weight (OC,C), bias (OC) or null. Overwrites out.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT,
                    int C, int OC) {
  std::vector<float> inp_t((size_t)C * BT);
#pragma omp parallel for
  for (int k = 0; k < C; k++) {
    for (int r = 0; r < BT; r++) inp_t[(size_t)k * BT + r] = inp[(size_t)r * C + k];
  }
#pragma omp parallel for
  for (int r = 0; r < BT; r++) {
    float* out_r = out + (size_t)r * OC;
    for (int o = 0; o < OC; o++) out_r[o] = bias ? bias[o] : 0.0f;
  }
  gemm_accumulate({out, 1, OC}, {weight, C, 1}, inp_t.data(), BT, OC, BT, C);
}

// dbias sums over rows: each thread takes a slice of outputs and walks the rows in order.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC) {
  gemm_accumulate({dinp, C, 1}, {dout, OC, 1}, weight, C, BT, C, OC);
  gemm_accumulate({dweight, C, 1}, {dout, 1, OC}, inp, C, OC, C, BT);
  if (!dbias) return;
  constexpr int kOutputSlice = 64;
#pragma omp parallel for
  for (int o0 = 0; o0 < OC; o0 += kOutputSlice) {
    const int o1 = std::min(OC, o0 + kOutputSlice);
    for (int r = 0; r < BT; r++) {
      const float* dout_r = dout + (size_t)r * OC;
      for (int o = o0; o < o1; o++) dbias[o] += dout_r[o];
    }
  }
}

// Attention: causal multi-head self-attention. qkv (B,T,3C) holds q, k and v side by side, each
// split into NH heads of hs = C/NH channels. Overwrites out (B,T,C) and att (B,NH,T,T), whose row
// att[b,h,t,0..t] is the softmax of the scaled scores scale * q_t.k_t2 (GPT-2's scale:
// attention_default_scale); entries past t are never read. The row maximum is subtracted before
// exp so that exp cannot overflow. ~2*B*NH*T*T*hs FLOPs each way (half of it masked out), small
// next to the matmuls at GPT-2 sizes.
inline float attention_default_scale(int hs) { return 1.0f / std::sqrt((float)hs); }

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                       float scale) {
  const int hs = C / NH;
  const size_t row3 = 3 * (size_t)C;
#pragma omp parallel for collapse(3)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const float* q = qkv + ((size_t)b * T + t) * row3 + h * hs;
        float* att_row = att + (((size_t)b * NH + h) * T + t) * T;
        float max_score = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* k = qkv + ((size_t)b * T + t2) * row3 + C + h * hs;
          float dot = 0.0f;
          for (int i = 0; i < hs; i++) dot += q[i] * k[i];
          att_row[t2] = dot * scale;
          max_score = std::max(max_score, att_row[t2]);
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          att_row[t2] = std::exp(att_row[t2] - max_score);
          sum += att_row[t2];
        }
        const float inv_sum = 1.0f / sum;
        for (int t2 = 0; t2 <= t; t2++) att_row[t2] *= inv_sum;
        float* y = out + ((size_t)b * T + t) * C + h * hs;
        for (int i = 0; i < hs; i++) y[i] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* v = qkv + ((size_t)b * T + t2) * row3 + 2 * C + h * hs;
          for (int i = 0; i < hs; i++) y[i] += att_row[t2] * v[i];
        }
      }
    }
  }
}

// One thread per (batch, head): dk and dv of a position collect from every later query, and all
// of them stay inside that head's slice of dqkv.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH, float scale) {
  const int hs = C / NH;
  const size_t row3 = 3 * (size_t)C;
#pragma omp parallel for collapse(2)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      std::vector<float> datt(T);
      for (int t = 0; t < T; t++) {
        const float* att_row = att + (((size_t)b * NH + h) * T + t) * T;
        const float* dy = dout + ((size_t)b * T + t) * C + h * hs;
        const float* q = qkv + ((size_t)b * T + t) * row3 + h * hs;
        float* dq = dqkv + ((size_t)b * T + t) * row3 + h * hs;
        for (int t2 = 0; t2 <= t; t2++) {
          const float* v = qkv + ((size_t)b * T + t2) * row3 + 2 * C + h * hs;
          float* dv = dqkv + ((size_t)b * T + t2) * row3 + 2 * C + h * hs;
          float dot = 0.0f;
          for (int i = 0; i < hs; i++) {
            dot += dy[i] * v[i];
            dv[i] += att_row[t2] * dy[i];
          }
          datt[t2] = dot;
        }
        // Softmax backward: dscore = att * (datt - sum(att * datt)).
        float weighted = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) weighted += att_row[t2] * datt[t2];
        for (int t2 = 0; t2 <= t; t2++) {
          const float dscore = att_row[t2] * (datt[t2] - weighted) * scale;
          const float* k = qkv + ((size_t)b * T + t2) * row3 + C + h * hs;
          float* dk = dqkv + ((size_t)b * T + t2) * row3 + C + h * hs;
          for (int i = 0; i < hs; i++) {
            dq[i] += dscore * k[i];
            dk[i] += dscore * q[i];
          }
        }
      }
    }
  }
}

// GELU, tanh approximation (GPT-2's, PyTorch's approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Overwrites out.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

void gelu_forward(float* out, const float* inp, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float th = std::tanh(kGeluScale * (x + kGeluCubic * x * x * x));
    const float dth = (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += (0.5f * (1.0f + th) + 0.5f * x * dth) * dout[i];
  }
}

// Residual: out = a + b, overwriting out.
void residual_forward(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// Softmax and cross-entropy over the first V of the Vp columns of logits (BT,Vp); the padded
// columns get probability 0. Overwrites probs (BT,Vp) and, when targets is not null, losses (BT).
// The loss is log(sum exp(l - max)) - (l_target - max) rather than -log(prob), which stays exact
// when the target's probability is near 0 or 1. The exp sum runs in double: V is 50257 terms.
void softmax_crossentropy_forward(float* probs, float* losses, const float* logits,
                                  const int* targets, int BT, int V, int Vp) {
#pragma omp parallel for
  for (int r = 0; r < BT; r++) {
    const float* l = logits + (size_t)r * Vp;
    float* p = probs + (size_t)r * Vp;
    float max_logit = -INFINITY;
    for (int i = 0; i < V; i++) max_logit = std::max(max_logit, l[i]);
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
      p[i] = std::exp(l[i] - max_logit);
      sum += p[i];
    }
    const float inv_sum = (float)(1.0 / sum);
    for (int i = 0; i < V; i++) p[i] *= inv_sum;
    for (int i = V; i < Vp; i++) p[i] = 0.0f;
    if (targets) losses[r] = (float)(std::log(sum) - ((double)l[targets[r]] - max_logit));
  }
}

// Gradient of dloss * sum_r losses[r] with respect to the logits: (probs - onehot) * dloss on the
// first V columns, nothing on the padding.
void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets,
                                   float dloss, int BT, int V, int Vp) {
#pragma omp parallel for
  for (int r = 0; r < BT; r++) {
    const float* p = probs + (size_t)r * Vp;
    float* dl = dlogits + (size_t)r * Vp;
    for (int i = 0; i < V; i++) dl[i] += (p[i] - (i == targets[r] ? 1.0f : 0.0f)) * dloss;
  }
}

// ------------------------------------------------------------------------------------------------
// 2. Optimizer

// sqrt(sum of squares). Partial sums in double over a fixed number of chunks, added in chunk
// order: the same bits for any thread count.
float global_norm(const float* x, size_t n) {
  constexpr int kChunks = 64;
  double partial[kChunks];
  const size_t chunk = (n + kChunks - 1) / kChunks;
#pragma omp parallel for
  for (int c = 0; c < kChunks; c++) {
    const size_t begin = std::min(n, c * chunk), end = std::min(n, begin + chunk);
    double sum = 0.0;
    for (size_t i = begin; i < end; i++) sum += (double)x[i] * x[i];
    partial[c] = sum;
  }
  double total = 0.0;
  for (int c = 0; c < kChunks; c++) total += partial[c];
  return (float)std::sqrt(total);
}

// SPEC.md clipping (PyTorch's clip_grad_norm_): when norm > clip, scale by clip / (norm + 1e-6).
void clip_gradients(float* grads, size_t n, float norm, float clip) {
  if (!(norm > clip)) return;
  const float factor = clip / (norm + 1e-6f);
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) grads[i] *= factor;
}

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// SPEC.md AdamW on one tensor, step t counting from 1; weight decay only when `decayed`. The bias
// corrections are computed in double and rounded once, as train_gpt2.py does.
void adamw_update(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                  const AdamWConfig& config, bool decayed, int t) {
  const float beta1 = config.beta1, beta2 = config.beta2, eps = config.eps;
  const float weight_decay = decayed ? config.weight_decay : 0.0f;
  const float one_minus_beta1 = (float)(1.0 - (double)beta1);
  const float one_minus_beta2 = (float)(1.0 - (double)beta2);
  const float bias_correction1 = (float)(1.0 - std::pow((double)beta1, t));
  const float bias_correction2 = (float)(1.0 - std::pow((double)beta2, t));
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) {
    const float g = grads[i];
    m[i] = beta1 * m[i] + one_minus_beta1 * g;
    v[i] = beta2 * v[i] + one_minus_beta2 * g * g;
    const float m_hat = m[i] / bias_correction1;
    const float v_hat = v[i] / bias_correction2;
    params[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * params[i]);
  }
}

// ------------------------------------------------------------------------------------------------
// 3. Model

// Activations and the backward's scratch, described once: sizes and offsets in the one buffer
// follow from this table. Per-layer entries hold num_layers equal slices. The backward's
// activation gradients need one layer's worth (the d_* entries, reused layer after layer), since
// the residual stream carries the gradient from layer to layer.
enum ActivationIndex {
  kEncoded, kLn1, kLn1Mean, kLn1Rstd, kQkv, kAtty, kAtt, kResidual2, kLn2, kLn2Mean, kLn2Rstd,
  kFch, kFchGelu, kResidual3, kProj, kLnf, kLnfMean, kLnfRstd, kLogits, kProbs, kLosses,
  kDLogits, kDResidualOut, kDResidualIn, kDResidual2, kDProj, kDLn, kDAtty, kDQkv, kDFchGelu,
  kDFch,
  kNumActivations
};

struct ActivationSpec {
  const char* name;
  size_t size;     // elements, for a forward of B x T
  bool per_layer;  // size = num_layers * layer slice
};

void activation_table(const GPT2Config& c, int B, int T, ActivationSpec table[kNumActivations]) {
  const size_t L = c.num_layers, NH = c.num_heads, C = c.channels, Vp = c.padded_vocab_size;
  const size_t BT = (size_t)B * T;
  const ActivationSpec t[kNumActivations] = {
      {"encoded", BT * C, false},  // token + position embedding, the first residual
      {"ln1", L * BT * C, true},
      {"ln1_mean", L * BT, true},
      {"ln1_rstd", L * BT, true},
      {"qkv", L * BT * 3 * C, true},
      {"atty", L * BT * C, true},         // attention output before the projection
      {"att", L * B * NH * T * T, true},  // softmax of the scores
      {"residual2", L * BT * C, true},    // residual + attention projection
      {"ln2", L * BT * C, true},
      {"ln2_mean", L * BT, true},
      {"ln2_rstd", L * BT, true},
      {"fch", L * BT * 4 * C, true},
      {"fch_gelu", L * BT * 4 * C, true},
      {"residual3", L * BT * C, true},  // residual2 + MLP projection: the layer's output
      {"proj", BT * C, false},          // attention / MLP projection, consumed at once
      {"lnf", BT * C, false},
      {"lnf_mean", BT, false},
      {"lnf_rstd", BT, false},
      {"logits", BT * Vp, false},
      {"probs", BT * Vp, false},
      {"losses", BT, false},
      {"d_logits", BT * Vp, false},
      {"d_residual_out", BT * C, false},  // gradient of the layer's output
      {"d_residual_in", BT * C, false},   // gradient of the layer's input
      {"d_residual2", BT * C, false},
      {"d_proj", BT * C, false},
      {"d_ln", BT * C, false},
      {"d_atty", BT * C, false},
      {"d_qkv", BT * 3 * C, false},
      {"d_fch_gelu", BT * 4 * C, false},
      {"d_fch", BT * 4 * C, false},
  };
  for (int i = 0; i < kNumActivations; i++) table[i] = t[i];
}

// Empty for GPT-2's architecture, the one this trainer runs; else why not and what trains it.
std::string arch_refusal(const GPT2Config& c) {
  if (c.arch == llmc::Arch::kGpt2) return "";
  const char* trainer = c.speedrun() ? "train_gpt2.py --recipe speedrun" : "train_gpt2cu";
  return llmc::strformat("the CPU trainer runs GPT-2's architecture only, not the %s one (%s): train it with %s",
                         llmc::arch_spec(c.arch).name, c.describe().c_str(), trainer);
}

struct GPT2 {
  GPT2Config config;
  llmc::LayerPlan plan;
  ParamSpec param_specs[kNumParamTensors];
  size_t param_offsets[kNumParamTensors];
  size_t num_parameters = 0;
  std::vector<float> params;
  std::vector<float> grads;           // allocated by the first zero_grad or backward
  std::vector<float> adam_m, adam_v;  // allocated by the first update
  int adam_step = 0;

  // Activations are sized for the largest forward so far (capacity_B x capacity_T); smaller
  // forwards use the front of each slice.
  int capacity_B = 0, capacity_T = 0;
  ActivationSpec act_specs[kNumActivations];
  size_t act_offsets[kNumActivations];
  std::vector<float> acts;

  // The last forward, for the backward.
  int B = 0, T = 0;
  std::vector<int> inputs, targets;
  bool has_targets = false;

  GPT2(const GPT2Config& c, std::vector<float> values) : config(c), params(std::move(values)) {
    const std::string refusal = arch_refusal(c);
    if (!refusal.empty()) LLMC_FAIL("%s", refusal.c_str());
    plan = llmc::layer_plan(c);
    llmc::param_table(c, param_specs);
    llmc::param_offsets(c, param_offsets);
    num_parameters = llmc::num_parameters(c);
    if (params.size() != num_parameters) {
      LLMC_FAIL("GPT2: %zu parameter values for a model of %zu (%s)", params.size(), num_parameters,
                c.describe().c_str());
    }
  }

  size_t param_layer_size(int tensor) const {
    return llmc::param_slab_size(plan, param_specs[tensor]);
  }
  float* param(int tensor, int layer = 0) {
    return params.data() + param_offsets[tensor] + layer * param_layer_size(tensor);
  }
  float* grad(int tensor, int layer = 0) {
    return grads.data() + param_offsets[tensor] + layer * param_layer_size(tensor);
  }
  float* act(int index, int layer = 0) {
    const ActivationSpec& s = act_specs[index];
    return acts.data() + act_offsets[index] +
           (s.per_layer ? layer * (s.size / config.num_layers) : 0);
  }
};

// Grows the activations to hold a forward of B x T (contents are not kept).
void gpt2_reserve_activations(GPT2& model, int B, int T) {
  if (B <= model.capacity_B && T <= model.capacity_T) return;
  model.capacity_B = std::max(B, model.capacity_B);
  model.capacity_T = std::max(T, model.capacity_T);
  activation_table(model.config, model.capacity_B, model.capacity_T, model.act_specs);
  size_t total = 0;
  for (int i = 0; i < kNumActivations; i++) {
    model.act_offsets[i] = total;
    total += model.act_specs[i].size;
  }
  model.acts.clear();
  model.acts.shrink_to_fit();
  model.acts.resize(total);
}

static void check_tokens(const int* tokens, int n, int vocab_size, const char* what) {
  for (int i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      LLMC_FAIL("%s token %d at position %d is outside the model's vocabulary [0, %d): the "
                "data was made for another tokenizer or model", what, tokens[i], i, vocab_size);
    }
  }
}

// The forward on inputs (B x T) through the probabilities and, when targets is not null, the
// losses; returns their mean (0 without targets).
static float gpt2_forward_pass(GPT2& model, const int* inputs, const int* targets, int B, int T) {
  const GPT2Config& cfg = model.config;
  if (B < 1 || T < 1 || T > cfg.max_seq_len || (long)B * T > INT32_MAX) {
    LLMC_FAIL("forward with B=%d T=%d: need B >= 1, T within [1, %d] (the model's max_seq_len) "
              "and B*T below 2^31", B, T, cfg.max_seq_len);
  }
  check_tokens(inputs, B * T, cfg.vocab_size, "input");
  if (targets) check_tokens(targets, B * T, cfg.vocab_size, "target");
  gpt2_reserve_activations(model, B, T);
  model.B = B;
  model.T = T;
  model.inputs.assign(inputs, inputs + (size_t)B * T);
  model.has_targets = targets != nullptr;
  if (targets) model.targets.assign(targets, targets + (size_t)B * T);

  const int L = cfg.num_layers, NH = cfg.num_heads, C = cfg.channels;
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size, BT = B * T;
  const size_t btc = (size_t)BT * C;
  encoder_forward(model.act(kEncoded), inputs, model.param(kWte), model.param(kWpe), B, T, C);
  for (int l = 0; l < L; l++) {
    const float* residual = l == 0 ? model.act(kEncoded) : model.act(kResidual3, l - 1);
    float* ln1 = model.act(kLn1, l);
    float* qkv = model.act(kQkv, l);
    float* atty = model.act(kAtty, l);
    float* residual2 = model.act(kResidual2, l);
    float* ln2 = model.act(kLn2, l);
    float* fch = model.act(kFch, l);
    float* fch_gelu = model.act(kFchGelu, l);
    float* proj = model.act(kProj);
    layernorm_forward(ln1, model.act(kLn1Mean, l), model.act(kLn1Rstd, l), residual,
                      model.param(kLn1w, l), model.param(kLn1b, l), BT, C);
    matmul_forward(qkv, ln1, model.param(kQkvw, l), model.param(kQkvb, l), BT, C, 3 * C);
    attention_forward(atty, model.act(kAtt, l), qkv, B, T, C, NH, attention_default_scale(C / NH));
    matmul_forward(proj, atty, model.param(kAttprojw, l), model.param(kAttprojb, l), BT, C, C);
    residual_forward(residual2, residual, proj, btc);
    layernorm_forward(ln2, model.act(kLn2Mean, l), model.act(kLn2Rstd, l), residual2,
                      model.param(kLn2w, l), model.param(kLn2b, l), BT, C);
    matmul_forward(fch, ln2, model.param(kFcw, l), model.param(kFcb, l), BT, C, 4 * C);
    gelu_forward(fch_gelu, fch, 4 * btc);
    matmul_forward(proj, fch_gelu, model.param(kFcprojw, l), model.param(kFcprojb, l), BT, 4 * C,
                   C);
    residual_forward(model.act(kResidual3, l), residual2, proj, btc);
  }
  layernorm_forward(model.act(kLnf), model.act(kLnfMean), model.act(kLnfRstd),
                    model.act(kResidual3, L - 1), model.param(kLnfw), model.param(kLnfb), BT, C);
  // The classifier shares wte; its padded rows are zero, so the padded logits are too.
  matmul_forward(model.act(kLogits), model.act(kLnf), model.param(kWte), nullptr, BT, C, Vp);
  float* losses = model.act(kLosses);
  softmax_crossentropy_forward(model.act(kProbs), losses, model.act(kLogits), targets, BT, V, Vp);
  if (!targets) return 0.0f;
  double sum = 0.0;
  for (int r = 0; r < BT; r++) sum += losses[r];
  return (float)(sum / BT);
}

// Runs the model on inputs (B x T) through the probabilities (the "probs" activation).
void gpt2_forward(GPT2& model, const int* inputs, int B, int T) {
  gpt2_forward_pass(model, inputs, nullptr, B, T);
}

// The forward and the cross-entropy against targets (B x T); returns the mean loss.
float gpt2_forward(GPT2& model, const int* inputs, const int* targets, int B, int T) {
  return gpt2_forward_pass(model, inputs, targets, B, T);
}

void gpt2_zero_grad(GPT2& model) { model.grads.assign(model.num_parameters, 0.0f); }

// Adds the gradient of loss_scale * (mean loss of the last forward) to model.grads. Gradient
// accumulation over n micro-steps passes loss_scale = 1/n to each.
void gpt2_backward(GPT2& model, float loss_scale) {
  if (!model.has_targets) {
    LLMC_FAIL("gpt2_backward: the last forward had no targets; call gpt2_forward with targets");
  }
  if (model.grads.size() != model.num_parameters) gpt2_zero_grad(model);
  const GPT2Config& cfg = model.config;
  const int B = model.B, T = model.T, BT = B * T;
  const int L = cfg.num_layers, NH = cfg.num_heads, C = cfg.channels;
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size;
  const size_t btc = (size_t)BT * C;
  // One layer's worth of activation gradients, reused layer after layer; each buffer is zeroed
  // right before the first call that accumulates into it.
  float* dlogits = model.act(kDLogits);
  float* dresidual_out = model.act(kDResidualOut);
  float* dresidual_in = model.act(kDResidualIn);
  float* dresidual2 = model.act(kDResidual2);
  float* dproj = model.act(kDProj);
  float* dln = model.act(kDLn);
  float* datty = model.act(kDAtty);
  float* dqkv = model.act(kDQkv);
  float* dfch_gelu = model.act(kDFchGelu);
  float* dfch = model.act(kDFch);
  const auto zero = [](float* p, size_t n) { std::fill(p, p + n, 0.0f); };

  zero(dlogits, (size_t)BT * Vp);
  softmax_crossentropy_backward(dlogits, model.act(kProbs), model.targets.data(), loss_scale / BT,
                                BT, V, Vp);
  zero(dln, btc);
  matmul_backward(dln, model.grad(kWte), nullptr, dlogits, model.act(kLnf), model.param(kWte), BT,
                  C, Vp);
  zero(dresidual_out, btc);
  layernorm_backward(dresidual_out, model.grad(kLnfw), model.grad(kLnfb), dln,
                     model.act(kResidual3, L - 1), model.param(kLnfw), model.act(kLnfMean),
                     model.act(kLnfRstd), BT, C);
  for (int l = L - 1; l >= 0; l--) {
    const float* residual = l == 0 ? model.act(kEncoded) : model.act(kResidual3, l - 1);
    // MLP half: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
    zero(dresidual2, btc);
    zero(dproj, btc);
    residual_backward(dresidual2, dproj, dresidual_out, btc);
    zero(dfch_gelu, 4 * btc);
    matmul_backward(dfch_gelu, model.grad(kFcprojw, l), model.grad(kFcprojb, l), dproj,
                    model.act(kFchGelu, l), model.param(kFcprojw, l), BT, 4 * C, C);
    zero(dfch, 4 * btc);
    gelu_backward(dfch, model.act(kFch, l), dfch_gelu, 4 * btc);
    zero(dln, btc);
    matmul_backward(dln, model.grad(kFcw, l), model.grad(kFcb, l), dfch, model.act(kLn2, l),
                    model.param(kFcw, l), BT, C, 4 * C);
    layernorm_backward(dresidual2, model.grad(kLn2w, l), model.grad(kLn2b, l), dln,
                       model.act(kResidual2, l), model.param(kLn2w, l), model.act(kLn2Mean, l),
                       model.act(kLn2Rstd, l), BT, C);
    // Attention half: residual2 = residual + attproj(attention(qkv(ln1(residual)))).
    zero(dresidual_in, btc);
    zero(dproj, btc);
    residual_backward(dresidual_in, dproj, dresidual2, btc);
    zero(datty, btc);
    matmul_backward(datty, model.grad(kAttprojw, l), model.grad(kAttprojb, l), dproj,
                    model.act(kAtty, l), model.param(kAttprojw, l), BT, C, C);
    zero(dqkv, 3 * btc);
    attention_backward(dqkv, datty, model.act(kQkv, l), model.act(kAtt, l), B, T, C, NH,
                       attention_default_scale(C / NH));
    zero(dln, btc);
    matmul_backward(dln, model.grad(kQkvw, l), model.grad(kQkvb, l), dqkv, model.act(kLn1, l),
                    model.param(kQkvw, l), BT, C, 3 * C);
    layernorm_backward(dresidual_in, model.grad(kLn1w, l), model.grad(kLn1b, l), dln, residual,
                       model.param(kLn1w, l), model.act(kLn1Mean, l), model.act(kLn1Rstd, l), BT,
                       C);
    std::swap(dresidual_out, dresidual_in);  // this layer's input is the next one's output
  }
  encoder_backward(model.grad(kWte), model.grad(kWpe), dresidual_out, model.inputs.data(), B, T, C);
}

// Clips the gradients to grad_clip (0 = no clipping) and returns their norm before clipping.
float gpt2_clip_gradients(GPT2& model, float grad_clip) {
  const float norm = global_norm(model.grads.data(), model.grads.size());
  if (grad_clip > 0.0f) clip_gradients(model.grads.data(), model.grads.size(), norm, grad_clip);
  return norm;
}

// One AdamW step; weight decay only on the tensors param_table() marks as decayed.
void gpt2_update(GPT2& model, float lr, const AdamWConfig& config) {
  if (model.grads.size() != model.num_parameters) {
    LLMC_FAIL("gpt2_update: no gradients yet; run gpt2_backward first");
  }
  if (model.adam_m.empty()) {
    model.adam_m.assign(model.num_parameters, 0.0f);
    model.adam_v.assign(model.num_parameters, 0.0f);
  }
  model.adam_step++;
  for (int i = 0; i < kNumParamTensors; i++) {
    const size_t o = model.param_offsets[i];
    adamw_update(model.params.data() + o, model.grads.data() + o, model.adam_m.data() + o,
                 model.adam_v.data() + o, model.param_specs[i].size, lr, config,
                 model.param_specs[i].decayed, model.adam_step);
  }
}

// ------------------------------------------------------------------------------------------------
// 4. Checkpoints and initialisation (formats and the seeded init live in llmc/gpt2.h)

GPT2 gpt2_from_checkpoint(const std::string& path) {
  std::vector<float> params;
  const GPT2Config config = checkpoint_load(path, &params);
  const std::string refusal = arch_refusal(config);
  if (!refusal.empty()) LLMC_FAIL("%s: %s", path.c_str(), refusal.c_str());
  return GPT2(config, std::move(params));
}

void gpt2_save_checkpoint(const GPT2& model, const std::string& path) {
  checkpoint_save(path, model.config, model.params.data(), kCheckpointVersionFP32);
}

// SPEC.md "Model initialisation from a seed": equal to train_gpt2.py's init for the same seed.
GPT2 gpt2_from_seed(const GPT2Config& config, uint64_t seed) {
  return GPT2(config, init_params_from_seed(config, seed));
}

// -e: a preset name (random init from seed) or a checkpoint path.
GPT2 gpt2_build(const std::string& preset_or_checkpoint, uint64_t seed) {
  GPT2Config config;
  if (config_from_preset(preset_or_checkpoint, &config)) return gpt2_from_seed(config, seed);
  require_model_file(preset_or_checkpoint, nullptr);
  return gpt2_from_checkpoint(preset_or_checkpoint);
}

// ------------------------------------------------------------------------------------------------
// 5. Sampling

// The token whose cumulative probability first exceeds coin (uniform in [0, 1)); the last token
// with nonzero probability when rounding leaves the total just below coin.
int sample_token(const float* probs, int V, float coin) {
  double cumulative = 0.0;
  int last_possible = 0;
  for (int i = 0; i < V; i++) {
    if (probs[i] <= 0.0f) continue;
    cumulative += probs[i];
    last_possible = i;
    if (coin < cumulative) return i;
  }
  return last_possible;
}

// Generates a sequence of `length` tokens that starts with `first_token`, each next token drawn
// from the model's distribution (temperature 1). Each step runs the forward on the tokens so far
// only (B = 1): attention is causal, so later positions cannot change the last one.
std::vector<int> gpt2_generate(GPT2& model, Rng& rng, int first_token, int length) {
  std::vector<int> tokens = {first_token};
  const int V = model.config.vocab_size, Vp = model.config.padded_vocab_size;
  while ((int)tokens.size() < length) {
    const int t = (int)tokens.size();
    gpt2_forward(model, tokens.data(), 1, t);
    const float* probs = model.act(kProbs) + (size_t)(t - 1) * Vp;
    tokens.push_back(sample_token(probs, V, rng.uniform_float()));
  }
  return tokens;
}

// ------------------------------------------------------------------------------------------------
// 6. CLI and main

// The CPU trainer takes the flags both trainers share (llmc/flags.h) and no others.
struct TrainConfig : TrainFlags {
  bool help = false;  // --help (or -h: this trainer has no -h flag): print the usage and exit
};

// The CUDA trainer's own flags (train_gpt2.cu's train_flags, but its -h, which here asks for the
// usage): refused as its, not as unknown. test_bad_input.sh checks them against its --help.
constexpr const char* kCudaTrainerFlags[] = {
    "-sl", "-sg", "-temp", "-topk", "-p", "-bpe", "-f", "-w", "-r", "-fp8", "-fp8g", "-fh", "-fhs", "-n", "-nk",
    "-nm", "-ac", "-y", "-halt", "-hs", "-sh", "-pr", "-pn", "-pl", "-rv", "-rt", "-ct", "-zs",
    "-ov", "-oc", "-os", "-od", "-pt", "-pk", "-recipe", "-opt", "-ml", "-mw", "-ns", "-cd", "-mn", "-mk", "-mq", "-mc",
    "-mtp", "-lc", "-pw", "-kd", "-kc", "-pd", "-aw", "-awf", "-awt", "-sp", "-vt", "-ut", "-ao", "-ko", "-ar",
    "-sm", "-bg", "-rp", "-asc", "-ri", "-vg", "-yn", "-rl", "-xs", "-lp", "-ph", "-al", "-mg", "-ca", "-mt",
    "-md", "-mr", "-fm"};

void fail_cuda_trainer_flag(const std::string& name) {
  for (const char* flag : kCudaTrainerFlags) {
    if (name == flag) {
      LLMC_FAIL("%s is a flag of the CUDA trainer (./train_gpt2cu), which this CPU trainer does not "
                "take: it trains GPT-2 in FP32 with AdamW only (./train_gpt2 --help lists its "
                "flags)", flag);
    }
  }
}

TrainConfig parse_args(const std::vector<std::string>& args) {
  TrainConfig c;
  c.help = !parse_flags(args, train_flags(c), "./train_gpt2", fail_cuda_trainer_flag);
  return c;
}

#ifndef TESTING

constexpr const char* kQuickStart =
    "./train_gpt2 -e tiny -b 8 -t 64 -x 100 -v 25 -s 50   (the tiny model: minutes on a few cores)";

// From about this size (d12 has 124M parameters) a step on a few cores takes many seconds.
constexpr size_t kSlowOnCpuParameters = 50000000;

void print_startup_table(TrainConfig& c, const GPT2& model, const AdamWConfig& adamw,
                         const StepBatch& batch, int steps, const DataLoader& train_loader) {
  StartupTable table;
  table.flag_rows(train_flags(c));
  table.rule();
  table.row("model", model.config.describe());
  table.row("parameters", strformat("%zu (%.0f MiB each: params, grads, AdamW m, v)",
                                    model.num_parameters, model.num_parameters * 4.0 / (1 << 20)));
  int largest = 0;
  for (int i = 0; i < kNumActivations; i++) {
    if (model.act_specs[i].size > model.act_specs[largest].size) largest = i;
  }
  table.row("activations", strformat("%.0f MiB (largest: %s, %.0f MiB)",
                                     model.acts.size() * 4.0 / (1 << 20),
                                     model.act_specs[largest].name,
                                     model.act_specs[largest].size * 4.0 / (1 << 20)));
  table.row("train tokens / batches", strformat("%ld / %ld per epoch", train_loader.total_tokens(),
                                                train_loader.batches_per_epoch()));
  table.row("total batch", strformat("%ld tokens = %d micro step(s) of %d x %d", batch.tokens,
                                     batch.micro_steps, c.B, c.T));
  table.row("steps", std::to_string(steps));
  table.row("AdamW", strformat("beta1 %g, beta2 %g, eps %g", adamw.beta1, adamw.beta2, adamw.eps));
  table.row("OpenMP threads", std::to_string(omp_get_max_threads()));
  table.row("MFU", "n/a on the CPU (printed as 'MFU n/a')");
  table.print();
}

float evaluate_validation(GPT2& model, DataLoader& loader, int batches, int B, int T) {
  loader.reset();
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  double sum = 0.0;
  for (int i = 0; i < batches; i++) {
    loader.next_batch(inputs.data(), targets.data());
    sum += gpt2_forward(model, inputs.data(), targets.data(), B, T);
  }
  return (float)(sum / batches);
}

// Samples `length` tokens (-g, at most the model's maximum sequence length - 1) after the
// end-of-text token.
void print_sample(GPT2& model, Rng& rng, const Tokenizer* tokenizer, int length) {
  // GPT-2's end-of-text token is the last of its vocabulary.
  const int eot = tokenizer ? tokenizer->eot_token() : model.config.vocab_size - 1;
  const std::vector<int> tokens = gpt2_generate(model, rng, eot, length + 1);
  printf("sample:");
  if (tokenizer) {
    Utf8Joiner joiner;
    std::string text;
    for (size_t i = 1; i < tokens.size(); i++) text += joiner.push(tokenizer->decode(tokens[i]));
    printf(" %s%s\n", text.c_str(), joiner.finish().c_str());
  } else {
    for (size_t i = 1; i < tokens.size(); i++) printf(" %d", tokens[i]);
    printf("   (token ids: no vocabulary file for -tk)\n");
  }
}

int train_main(int argc, char** argv) {
  const double run_start = wall_seconds();
  TrainConfig c = parse_args(std::vector<std::string>(argv + 1, argv + argc));
  if (c.help) {
    print_usage("./train_gpt2", "GPT-2 training in FP32 on the CPU", kQuickStart, train_flags(c));
    return 0;
  }
  resolve_tokenizer(c);
  const bool run_val = c.val_every > 0 && c.val_batches > 0;
  // The data's patterns fail before a multi-second random init.
  if (run_val) {
    require_disjoint_shards(c.train_pattern, c.val_pattern);
  } else {
    glob_files(c.train_pattern, "-i");
  }
  GPT2 model = gpt2_build(c.model, (uint64_t)c.seed);
  resolve_sequence_length(c, model.config.max_seq_len);
  resolve_sample_length(c, model.config.max_seq_len);
  const StepBatch batch = step_batch(c, 1);
  gpt2_reserve_activations(model, c.B, c.T);
  const int V = model.config.vocab_size;
  DataLoader train_loader(c.train_pattern, "-i", c.B, c.T, 0, 1, true, (uint64_t)c.seed, V);
  std::unique_ptr<DataLoader> val_loader;
  if (run_val) {
    val_loader.reset(
        new DataLoader(c.val_pattern, "-j", c.B, c.T, 0, 1, false, (uint64_t)c.seed, V));
  }
  const int steps =
      c.max_steps >= 0
          ? c.max_steps
          : (int)std::max<long>(1, train_loader.batches_per_epoch() / batch.micro_steps);
  const LrSchedule schedule =
      make_lr_schedule(c.schedule, "-k", c.lr, c.warmup, std::max(1, steps), c.final_lr_frac);
  std::unique_ptr<Tokenizer> tokenizer;
  if (c.sample_every > 0 && !c.tokenizer.empty()) tokenizer.reset(new Tokenizer(c.tokenizer));
  std::unique_ptr<Logger> logger;
  if (!c.output_dir.empty()) {
    logger.reset(new Logger(c.output_dir, "-o", nullptr, LogMode::kNew));
  }
  AdamWConfig adamw;
  adamw.weight_decay = c.weight_decay;
  print_startup_table(c, model, adamw, batch, steps, train_loader);
  if (steps > 0 && model.num_parameters >= kSlowOnCpuParameters) {
    printf("note: %.0fM parameters train slowly on the CPU (the ETA comes after step 2); a quick "
           "first run: %s\n", model.num_parameters / 1e6, kQuickStart);
  }

  Rng sample_rng((uint64_t)c.seed + 1);
  std::vector<int> inputs((size_t)c.B * c.T), targets((size_t)c.B * c.T);
  if (c.overfit) train_loader.next_batch(inputs.data(), targets.data());
  double total_seconds = 0.0;
  RunSummary summary(run_start, batch.tokens);
  EtaEstimator eta(kEtaWindow);
  for (int step = 0; step <= steps; step++) {
    const bool last = step == steps;
    if (run_val && (step % c.val_every == 0 || last)) {
      const float val_loss = evaluate_validation(model, *val_loader, c.val_batches, c.B, c.T);
      printf("step %4d/%d | val loss %.6f\n", step, steps, val_loss);
      if (logger) logger->val(step, val_loss);
      summary.val_loss(step, val_loss);
    }
    if (c.sample_every > 0 && step > 0 && (step % c.sample_every == 0 || last)) {
      print_sample(model, sample_rng, tokenizer.get(), c.gen_len);
    }
    if (last) break;

    const auto start = std::chrono::steady_clock::now();
    gpt2_zero_grad(model);
    double loss_sum = 0.0;
    for (int micro_step = 0; micro_step < batch.micro_steps; micro_step++) {
      if (!c.overfit) train_loader.next_batch(inputs.data(), targets.data());
      loss_sum += gpt2_forward(model, inputs.data(), targets.data(), c.B, c.T);
      gpt2_backward(model, 1.0f / batch.micro_steps);
    }
    const float loss = (float)(loss_sum / batch.micro_steps);
    const float norm = gpt2_clip_gradients(model, c.grad_clip);
    const float lr = (float)schedule.at(step);
    gpt2_update(model, lr, adamw);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    total_seconds += seconds;
    const double tokens_per_s = batch.tokens / seconds;
    eta.step_finished(wall_seconds());
    printf("step %4d/%d | loss %.6f | norm %.4f | lr %.3e | %.2f ms | MFU n/a | %.0f tok/s | ETA %s\n",
           step + 1, steps, loss, norm, lr, 1e3 * seconds, tokens_per_s,
           eta.time_left(step + 1, steps - step - 1).c_str());
    fflush(stdout);
    if (logger) logger->train(step + 1, loss, norm, lr, 1e3 * seconds, tokens_per_s);
  }
  if (steps > 0) {
    printf("average %.2f ms per step, %.0f tok/s\n", 1e3 * total_seconds / steps,
           batch.tokens * steps / total_seconds);
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  printf("peak memory: %ld MiB\n", usage.ru_maxrss / 1024);  // Linux reports KiB
  if (!c.output_dir.empty() && steps > 0) {
    const std::string path = strformat("%s/model_%08d.bin", c.output_dir.c_str(), steps);
    gpt2_save_checkpoint(model, path);
    printf("wrote %s\n", path.c_str());
    summary.checkpoint(path);
  }
  summary.print(wall_seconds(), steps);
  return 0;
}

int main(int argc, char** argv) { return llmc::run_main(train_main, argc, argv); }
#endif  // TESTING
