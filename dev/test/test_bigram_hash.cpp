// Tests llmc/bigram_hash.h against the reference's get_bigram_hash and sign index (modded-nanogpt
// record #89), their values computed with its int32 arithmetic: GPT-2 tokens at Vp 50,304; tokens
// whose products wrap past int32 (negative hashes, whose remainder must still be non-negative); a
// small table; and on random tokens every id within the table, the last row at position 0 alone.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/bigram_hash.h"
#include "llmc/rand.h"
#include "llmc/utils.h"

namespace {

void check_rows(const std::string& what, const std::vector<int>& tokens, int table_rows,
                const std::vector<int>& expected_ids, const std::vector<int>& expected_signs) {
  const int n = (int)tokens.size();
  std::vector<int> ids(n), sign_rows(n);
  llmc::bigram_rows(ids.data(), sign_rows.data(), tokens.data(), n, table_rows);
  for (int t = 0; t < n; t++) {
    testing::check(ids[t] == expected_ids[t],
                   llmc::strformat("%s: id at %d is %d, expected %d", what.c_str(), t, ids[t], expected_ids[t]));
    testing::check(sign_rows[t] == expected_signs[t], llmc::strformat("%s: sign row at %d is %d, expected %d",
                                                                      what.c_str(), t, sign_rows[t],
                                                                      expected_signs[t]));
  }
  printf("ok   %s: %d positions\n", what.c_str(), n);
}

void test_ranges() {
  const int rows = llmc::bigram_table_rows(50304), n = 100000;
  llmc::Rng rng(89);
  std::vector<int> tokens(n), ids(n), sign_rows(n);
  for (int& v : tokens) v = (int)(rng.u32() % 50304u);
  llmc::bigram_rows(ids.data(), sign_rows.data(), tokens.data(), n, rows);
  int outside = 0;
  for (int t = 1; t < n; t++) {
    if (ids[t] < 0 || ids[t] >= rows - 1 || sign_rows[t] < 0 || sign_rows[t] >= llmc::kBigramSignRows) outside++;
  }
  testing::check_verbose(outside == 0 && ids[0] == rows - 1 && sign_rows[0] == 0,
                         llmc::strformat("%d random tokens: %d rows outside the tables, position 0's id %d", n,
                                         outside, ids[0]));
}

// The sign table against torch.randint(0, 2, (8192, 128), generator seeded 89) * 2 - 1, which
// train_gpt2.py draws: its first 16 and last 8 values and its sum, pinned from torch 1.13.
void test_sign_table() {
  const std::vector<float> signs = llmc::bigram_sign_table(128);
  const std::vector<float> first = {1, -1, -1, 1, -1, 1, 1, -1, -1, -1, -1, 1, -1, 1, 1, -1};
  const std::vector<float> last = {-1, 1, -1, 1, -1, -1, -1, 1};
  double sum = 0.0;
  for (float v : signs) sum += v;
  testing::check_verbose(signs.size() == (size_t)8192 * 128 && std::equal(first.begin(), first.end(), signs.begin()) &&
                             std::equal(last.begin(), last.end(), signs.end() - last.size()) && sum == 1262.0,
                         llmc::strformat("the sign table [8192, 128]: torch's first and last values, sum %g "
                                         "(torch's 1262)", sum));
}

}  // namespace

int main() {
  testing::check_verbose(llmc::bigram_table_rows(50304) == 377280, "the table's rows at Vp 50304: 377280");
  // Position 1 hashes 377,279 (position 0 overwritten), not the first token.
  check_rows("GPT-2 tokens", {50256, 15496, 11, 995, 0, 50303, 7}, 377280,
             {377279, 126884, 175303, 56405, 268236, 245200, 46095}, {0, 6360, 7299, 1000, 995, 1151, 1144});
  check_rows("wrapping products", {100000, 2000000000, 59139, 5, 123456789}, 377280,
             {377279, 54871, 145461, 166078, 97912}, {0, 4768, 4867, 1798, 3344});
  check_rows("a table of 480 rows", {3, 1, 4, 1, 5, 9, 2, 6}, 480, {479, 156, 246, 289, 89, 7, 164, 410},
             {0, 2, 5, 5, 4, 12, 11, 4});
  test_ranges();
  test_sign_table();
  return testing::summary("test_bigram_hash");
}
