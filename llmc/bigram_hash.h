// Record #89's bigram hash (dev/SPEC.md "Record #89's embedding"): which rows of the bigram table
// and of its sign table each token of a forward reads, from the tokens as one flat sequence, as the
// reference's get_bigram_hash and sign index compute them. Host code: the encoder's plan of the
// table's gradient (train_gpt2.cu section 3) is made from these ids on the CPU as well.
#pragma once

#include <cstdint>
#include <vector>

#include "rand.h"

namespace llmc {

// The sign table's rows (the reference's bigram_sign_table_rows).
constexpr int kBigramSignRows = 8192;
// The hash's factors of the token and of the one before it.
constexpr int32_t kBigramHashCurrent = 36313, kBigramHashPrevious = 27191;

// The sign table [kBigramSignRows, C] of +-1, a fixed buffer (not a parameter): the reference draws
// sign(randn) unseeded; ours is pinned, train_gpt2.py's torch.randint(0, 2, (8192, C)) * 2 - 1 from
// a generator seeded with kBigramSignSeed: one u32 a value in row order, odd +1, even -1.
constexpr uint64_t kBigramSignSeed = 89;
inline std::vector<float> bigram_sign_table(int C) {
  Rng rng(kBigramSignSeed);
  std::vector<float> signs((size_t)kBigramSignRows * C);
  for (float& v : signs) v = rng.u32() % 2 ? 1.0f : -1.0f;
  return signs;
}

// The table's rows for a padded vocabulary of Vp (377,280 at 50,304).
inline int bigram_table_rows(int Vp) { return Vp * 15 / 2; }

// Position t's rows of a flat sequence, `previous` the token at t - 1 (unread at t = 0): with m =
// table_rows - 1, id_0 = m and id_t = (36313 p_t XOR 27191 p_{t-1}) mod m in int32, the products
// wrapping and the remainder non-negative (torch's), p the tokens with p_0 replaced by m: the
// reference overwrites position 0 before its shifted read, so id_1 hashes m, not the first token.
// sign_row_0 = 0, sign_row_t = (token_{t-1} XOR token_t) mod 8192. Tokens lie in [0, 2^31).
inline void bigram_row_at(int t, int32_t token, int32_t previous, int table_rows, int* id, int* sign_row) {
  const int32_t m = table_rows - 1;
  if (t == 0) {
    *id = m;
    *sign_row = 0;
    return;
  }
  auto wrapped = [](int32_t factor, int32_t v) { return (int32_t)((uint32_t)factor * (uint32_t)v); };
  const int32_t hashed = t == 1 ? m : previous;
  const int32_t h = wrapped(kBigramHashCurrent, token) ^ wrapped(kBigramHashPrevious, hashed);
  *id = (h % m + m) % m;
  *sign_row = (previous ^ token) % kBigramSignRows;
}

// ids [N] and sign_rows [N] of tokens [N] as one flat sequence (bigram_row_at's).
inline void bigram_rows(int* ids, int* sign_rows, const int* tokens, int N, int table_rows) {
  for (int t = 0; t < N; t++) {
    bigram_row_at(t, tokens[t], t > 0 ? tokens[t - 1] : 0, table_rows, ids + t, sign_rows + t);
  }
}

}  // namespace llmc
