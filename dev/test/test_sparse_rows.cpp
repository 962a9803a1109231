// Tests llmc/sparse_rows.h, the plan of -os 1's exchange of the embedding tables' rows, on the CPU:
// processes whose random tokens mark rows of two token tables and of a bigram table, the tables cut
// among the owners at element counts that are not whole rows (as -od 1 cuts AdamW's tensors). What
// a process plans to send another is what that one plans to receive from it, piece for piece; the
// exchange carried out in FP32 on the host (each owner's runs: its own values plus the pieces it
// received, the rows any process marked divided by the count) gives every owner the average over
// all processes of every element of its runs, the rows no process marked zero; and no received
// piece leaves the owner's runs.
#include <cstdio>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/rand.h"
#include "llmc/sparse_rows.h"
#include "llmc/utils.h"

namespace {

struct Case {
  int world, width, token_rows, bigram_rows;
  std::vector<int> tokens;  // a process's count of token ids
};

void test_plan(const Case& c, llmc::Rng& rng) {
  const std::string name = llmc::strformat("%d processes, rows of %d", c.world, c.width);
  const size_t prefix = 37, token_table = (size_t)c.token_rows * c.width;
  const std::vector<llmc::SparseTable> tables = {
      {prefix, c.token_rows, c.width, llmc::kTokenRows},
      {prefix + token_table, c.token_rows, c.width, llmc::kTokenRows},
      {prefix + 2 * token_table, c.bigram_rows, c.width, llmc::kBigramRows}};
  const size_t total = prefix + 2 * token_table + (size_t)c.bigram_rows * c.width + 11;
  std::vector<llmc::OwnerRun> runs;
  for (const llmc::SparseTable& t : tables) {
    const size_t size = (size_t)t.rows * t.width;
    for (int r = 0; r < c.world; r++) {
      const size_t from = size * r / c.world / 8 * 8, to = r + 1 == c.world ? size : size * (r + 1) / c.world / 8 * 8;
      runs.push_back({t.begin + from, to - from, r});
    }
  }
  llmc::RowBitmapLayout layout;
  layout.rows[llmc::kTokenRows] = c.token_rows;
  layout.rows[llmc::kBigramRows] = c.bigram_rows;
  const size_t words = layout.words();
  std::vector<uint32_t> bitmaps(c.world * words, 0);
  std::vector<std::vector<float>> grads(c.world, std::vector<float>(total, 0.0f));
  for (int p = 0; p < c.world; p++) {
    std::vector<int> token_ids(c.tokens[p]), bigram_ids(c.tokens[p]);
    for (int& id : token_ids) id = (int)(rng.u32() % (uint32_t)c.token_rows);
    for (int& id : bigram_ids) id = (int)(rng.u32() % (uint32_t)c.bigram_rows);
    uint32_t* bits = bitmaps.data() + p * words;
    llmc::mark_rows(bits + layout.first_word(llmc::kTokenRows), token_ids.data(), c.tokens[p]);
    llmc::mark_rows(bits + layout.first_word(llmc::kBigramRows), bigram_ids.data(), c.tokens[p]);
    for (const llmc::SparseTable& t : tables) {
      for (int row = 0; row < t.rows; row++) {
        if (!llmc::row_marked(bits + layout.first_word(t.family), row)) continue;
        float* values = grads[p].data() + t.begin + (size_t)row * t.width;
        for (int i = 0; i < t.width; i++) values[i] = (float)(rng.u32() % 1000) + 1.0f;
      }
    }
  }
  std::vector<llmc::SparsePlan> plans(c.world);
  for (int p = 0; p < c.world; p++) llmc::plan_sparse_rows(tables, layout, bitmaps.data(), runs, p, c.world, &plans[p]);
  int mismatched = 0, outside = 0;
  for (int s = 0; s < c.world; s++) {
    for (int r = 0; r < c.world; r++) {
      if (s == r) continue;
      const llmc::SparsePlan &from = plans[s], &to = plans[r];
      mismatched += from.send_count[r] != to.recv_count[s];
      const size_t sent = from.send_count[r];
      for (size_t k = 0, first = to.recv_first_piece[s]; k < to.recv_first_piece[s + 1] - first && sent; k++) {
        const llmc::RowPiece& got = to.recv[first + k];
        const bool inside_run = [&] {
          for (const llmc::OwnerRun& run : runs) {
            if (run.owner == r && got.begin >= run.begin && got.begin + got.count <= run.begin + run.count) return true;
          }
          return false;
        }();
        outside += !inside_run;
      }
    }
  }
  testing::check(mismatched == 0, name + ": " + std::to_string(mismatched) + " send and receive counts differ");
  testing::check(outside == 0, name + ": " + std::to_string(outside) + " received pieces outside the owner's runs");
  // The exchange: each sender's packed buffer, each receiver's pieces added into its own values.
  std::vector<std::vector<float>> merged = grads;
  for (int r = 0; r < c.world; r++) {
    for (int s = 0; s < c.world; s++) {
      if (s == r) continue;
      std::vector<float> packed;
      for (size_t k = 0; k < plans[s].send.size(); k++) {
        const llmc::RowPiece& piece = plans[s].send[k];
        if (piece.at < plans[s].send_at[r] || piece.at >= plans[s].send_at[r] + plans[s].send_count[r]) continue;
        packed.insert(packed.end(), grads[s].begin() + piece.begin, grads[s].begin() + piece.begin + piece.count);
      }
      for (size_t k = plans[r].recv_first_piece[s]; k < plans[r].recv_first_piece[s + 1]; k++) {
        const llmc::RowPiece& piece = plans[r].recv[k];
        for (uint32_t i = 0; i < piece.count; i++) {
          merged[r][piece.begin + i] += packed.at(piece.at - plans[r].recv_at[s] + i);
        }
      }
    }
  }
  const float inverse = 1.0f / c.world;
  for (int r = 0; r < c.world; r++) {
    for (const llmc::RowPiece& piece : plans[r].marked) {
      for (uint32_t i = 0; i < piece.count; i++) merged[r][piece.begin + i] *= inverse;
    }
  }
  int wrong = 0, checked = 0;
  for (const llmc::OwnerRun& run : runs) {
    for (size_t e = run.begin; e < run.begin + run.count; e++, checked++) {
      float sum = 0.0f;
      for (int p = 0; p < c.world; p++) sum += grads[p][e];
      wrong += merged[run.owner][e] != sum * inverse;
    }
  }
  testing::check(wrong == 0, name + ": " + std::to_string(wrong) + " of the owners' elements are not the average");
  printf("ok   %s: %d elements of the owners' runs the averages\n", name.c_str(), checked);
}

}  // namespace

int main() {
  llmc::Rng rng(71);
  test_plan({2, 768, 503, 1201, {300, 250}}, rng);
  test_plan({3, 40, 97, 311, {60, 0, 200}}, rng);  // a process of no tokens sends nothing
  test_plan({8, 12, 50, 77, {9, 40, 1, 30, 30, 2, 50, 0}}, rng);
  return testing::summary("test_sparse_rows");
}
