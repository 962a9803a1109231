// Record #89's bigram hash (dev/SPEC.md "Record #89's embedding"): which rows of the bigram table
// and of its sign table each token of a forward reads, from the tokens as one flat sequence, as the
// reference's get_bigram_hash and sign index compute them. Host code: the encoder's plan of the
// table's gradient (train_gpt2.cu section 3) is made from these ids on the CPU as well.
#pragma once

#include <cstdint>

namespace llmc {

// The sign table's rows (the reference's bigram_sign_table_rows).
constexpr int kBigramSignRows = 8192;
// The hash's factors of the token and of the one before it.
constexpr int32_t kBigramHashCurrent = 36313, kBigramHashPrevious = 27191;

// The table's rows for a padded vocabulary of Vp (377,280 at 50,304).
inline int bigram_table_rows(int Vp) { return Vp * 15 / 2; }

// ids [N] and sign_rows [N] of tokens [N] (each in [0, 2^31)): with m = table_rows - 1, id_0 = m
// and id_t = (36313 p_t XOR 27191 p_{t-1}) mod m in int32, the products wrapping and the remainder
// non-negative (torch's), p the tokens with p_0 replaced by m: the reference overwrites position 0
// before its shifted read, so id_1 hashes m, not the first token. sign_row_0 = 0, sign_row_t =
// (token_{t-1} XOR token_t) mod 8192.
inline void bigram_rows(int* ids, int* sign_rows, const int* tokens, int N, int table_rows) {
  const int32_t m = table_rows - 1;
  auto wrapped = [](int32_t factor, int32_t v) { return (int32_t)((uint32_t)factor * (uint32_t)v); };
  for (int t = 0; t < N; t++) {
    if (t == 0) {
      ids[t] = m;
      sign_rows[t] = 0;
      continue;
    }
    const int32_t previous = t == 1 ? m : tokens[t - 1];
    const int32_t h = wrapped(kBigramHashCurrent, tokens[t]) ^ wrapped(kBigramHashPrevious, previous);
    ids[t] = (h % m + m) % m;
    sign_rows[t] = (tokens[t - 1] ^ tokens[t]) % kBigramSignRows;
  }
}

}  // namespace llmc
