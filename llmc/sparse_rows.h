// The embedding tables' gradient reduced by rows (-os 1): a table that only token lookups read (an
// untied embedding, the value embeddings, record #89's bigram table) has a gradient in the rows its
// process's tokens read and zeros in every other. With -od 1 each part of a table is reduced to the
// process that steps it; with sparse rows each process sends to that owner only the rows its own
// tokens read, and the owner adds them into its own part in rank order. Every process marks the
// rows of its step's ids in a bitmap, the bitmaps are all-gathered, and every process plans from
// them alike which pieces of rows go where (plan_sparse_rows): what one process sends another is
// what that one plans to receive from it, piece for piece. Host code.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace llmc {

// Rows of `width` elements of the gradient buffer from element `begin`, read by the ids of
// `family` (kTokenRows: the tokens; kBigramRows: record #89's bigram ids).
struct SparseTable {
  size_t begin;
  int rows, width, family;
};
constexpr int kTokenRows = 0, kBigramRows = 1, kRowFamilies = 2;

// Elements [begin, begin + count) of the gradient buffer that process `owner` steps.
struct OwnerRun {
  size_t begin, count;
  int owner;
};

// Elements [begin, begin + count) of the gradient buffer, at element `at` of a message's buffer.
struct RowPiece {
  size_t begin, at;
  uint32_t count;
};

// A process's marked rows, a bit a row, the families' words one after another.
struct RowBitmapLayout {
  int rows[kRowFamilies] = {0, 0};
  size_t first_word(int family) const { return family == 0 ? 0 : words_of(rows[0]); }
  size_t words() const { return words_of(rows[0]) + words_of(rows[1]); }
  static size_t words_of(int n) { return ((size_t)n + 31) / 32; }
};

inline void mark_rows(uint32_t* family_bits, const int* ids, int n) {
  for (int i = 0; i < n; i++) family_bits[ids[i] >> 5] |= 1u << (ids[i] & 31);
}

inline bool row_marked(const uint32_t* family_bits, int row) { return family_bits[row >> 5] >> (row & 31) & 1u; }

// The pieces of the rows that `bits` (one process's bitmap) marks in each table, cut to the runs
// of `owner`, in table order, then element order; `at` counts on from *at.
inline void append_row_pieces(const std::vector<SparseTable>& tables, const RowBitmapLayout& layout,
                              const uint32_t* bits, const std::vector<OwnerRun>& runs, int owner,
                              std::vector<RowPiece>* pieces, size_t* at) {
  for (const SparseTable& t : tables) {
    const uint32_t* family_bits = bits + layout.first_word(t.family);
    const size_t table_end = t.begin + (size_t)t.rows * t.width;
    for (const OwnerRun& run : runs) {
      const size_t from = std::max(run.begin, t.begin), to = std::min(run.begin + run.count, table_end);
      if (run.owner != owner || from >= to) continue;
      for (size_t row = (from - t.begin) / t.width, last = (to - 1 - t.begin) / t.width; row <= last; row++) {
        if (!row_marked(family_bits, (int)row)) continue;
        const size_t row_begin = t.begin + row * t.width;
        const size_t begin = std::max(row_begin, from), end = std::min(row_begin + t.width, to);
        pieces->push_back({begin, *at, (uint32_t)(end - begin)});
        *at += end - begin;
      }
    }
  }
}

// One process's part of the exchange: the pieces it sends, every peer's after the one before (its
// own none), and those it receives likewise, with each peer's element range in the two buffers; and
// the pieces of its runs that any process marked, the only ones whose average is not zero.
struct SparsePlan {
  std::vector<RowPiece> send, recv, marked;
  std::vector<size_t> send_at, send_count, recv_at, recv_count;  // [world]
  std::vector<size_t> recv_first_piece;                          // [world + 1]
  std::vector<uint32_t> marked_anywhere;                         // the bitmaps' union
};

// bitmaps: world x layout.words(), process p's at p * words. runs: the owners' runs of the tables'
// elements (those of other elements are ignored). Into *plan, whose vectors keep their room from
// step to step.
inline void plan_sparse_rows(const std::vector<SparseTable>& tables, const RowBitmapLayout& layout,
                             const uint32_t* bitmaps, const std::vector<OwnerRun>& runs, int rank, int world,
                             SparsePlan* plan) {
  plan->send.clear();
  plan->recv.clear();
  plan->send_at.assign(world, 0);
  plan->send_count.assign(world, 0);
  plan->recv_at.assign(world, 0);
  plan->recv_count.assign(world, 0);
  plan->recv_first_piece.assign(world + 1, 0);
  size_t send_at = 0, recv_at = 0;
  for (int p = 0; p < world; p++) {
    plan->recv_first_piece[p] = plan->recv.size();
    if (p == rank) continue;
    plan->send_at[p] = send_at;
    append_row_pieces(tables, layout, bitmaps + (size_t)rank * layout.words(), runs, p, &plan->send, &send_at);
    plan->send_count[p] = send_at - plan->send_at[p];
    plan->recv_at[p] = recv_at;
    append_row_pieces(tables, layout, bitmaps + (size_t)p * layout.words(), runs, rank, &plan->recv, &recv_at);
    plan->recv_count[p] = recv_at - plan->recv_at[p];
  }
  plan->recv_first_piece[world] = plan->recv.size();
  plan->marked_anywhere.assign(bitmaps, bitmaps + layout.words());
  for (int p = 1; p < world; p++) {
    for (size_t w = 0; w < layout.words(); w++) plan->marked_anywhere[w] |= bitmaps[p * layout.words() + w];
  }
  plan->marked.clear();
  size_t marked_at = 0;
  append_row_pieces(tables, layout, plan->marked_anywhere.data(), runs, rank, &plan->marked, &marked_at);
}

}  // namespace llmc
