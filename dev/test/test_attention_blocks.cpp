// Tests llmc/attention_blocks.h on hand-worked sequences: the spans of each query block, and the
// key blocks selected for windows of 0 to 16 blocks (documents crossing block edges, starting on
// them, one token long, one spanning the whole sequence) and token windows against their
// definition; the document ids of each token, by hand
// and against the spans of random sequences. dev/test/test_attention_blocks_py.sh
// compares the rule with train_gpt2.py's port of the reference on random documents, through
// the dump modes:
//   test_attention_blocks --dump IN OUT   IN: int32 cases, each T, the largest window W, then T
//       tokens; OUT: int32, for each case, window 0..W and query block q: full, partial, then the
//       selected blocks nearest first, a full block k written as -(k + 1)
//   test_attention_blocks --windows N     attention_window_blocks(s, N) for s = 0..N, one line
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/attention_blocks.h"
#include "llmc/schedulers.h"
#include "llmc/utils.h"

using llmc::AttentionBlockSelection;
using llmc::AttentionBlockSpan;
using testing::check;
using testing::check_verbose;

namespace {

constexpr int kStart = 50256;

// T tokens, document starts at `starts`, other tokens 7.
std::vector<int> sequence(int T, const std::vector<int>& starts) {
  std::vector<int> tokens(T, 7);
  for (int p : starts) tokens[p] = kStart;
  return tokens;
}

std::vector<AttentionBlockSpan> spans_of(const std::vector<int>& tokens) {
  std::vector<AttentionBlockSpan> spans(tokens.size() / llmc::kAttentionBlock);
  llmc::attention_block_spans(tokens.data(), (int)tokens.size(), kStart, spans.data());
  return spans;
}

// The selected blocks of query block q, nearest first, a full block k as -(k + 1).
std::vector<int> selected(const AttentionBlockSpan& span, int q, int window) {
  const AttentionBlockSelection s = llmc::attention_blocks_select(span, q, window);
  std::vector<int> blocks;
  for (int i = 0; i < s.full + s.partial; i++) {
    bool full = false;
    const int k = llmc::attention_key_block(s, q, i, &full);
    blocks.push_back(full ? -(k + 1) : k);
  }
  return blocks;
}

std::string describe(const std::vector<int>& blocks) {
  std::string text;
  for (int b : blocks) text += b < 0 ? llmc::strformat(" %df", -b - 1) : llmc::strformat(" %d", b);
  return text;
}

struct Expect {
  int q, window;
  std::vector<int> blocks;  // as selected() writes them
};

void check_case(const char* what, const std::vector<int>& tokens,
                const std::vector<AttentionBlockSpan>& expected_spans,
                const std::vector<Expect>& expected) {
  const std::vector<AttentionBlockSpan> spans = spans_of(tokens);
  bool spans_ok = spans.size() == expected_spans.size();
  std::string text;
  for (size_t q = 0; spans_ok && q < spans.size(); q++) {
    spans_ok = spans[q].first_key == expected_spans[q].first_key &&
               spans[q].first_full == expected_spans[q].first_full;
  }
  for (const AttentionBlockSpan& s : spans) {
    text += llmc::strformat(" (%d,%d)", s.first_key, s.first_full);
  }
  check_verbose(spans_ok, llmc::strformat("%s: spans (first_key, first_full)", what) + text);
  bool all = true;
  std::string lists;
  for (const Expect& e : expected) {
    const std::vector<int> got = selected(spans[e.q], e.q, e.window);
    all = check(got == e.blocks, llmc::strformat("%s: block %d, window %d:", what, e.q, e.window) +
                                     describe(got) + ", expected" + describe(e.blocks)) && all;
    lists += llmc::strformat(" q%d w%d:", e.q, e.window) + describe(got) + ";";
  }
  check_verbose(all, llmc::strformat("%s: selected (f: full)", what) + lists);
}

void test_hand_cases() {
  // Blocks of 128 tokens: 0-127 | 128-255 | 256-383 | 384-511 | 512-639 | 640-767. Documents
  // start at 0, 300, 301 (one token) and 640 (on a block's edge).
  check_case("documents at 0, 300, 301, 640", sequence(768, {0, 300, 301, 640}),
             {{0, 0}, {0, 0}, {0, 2}, {2, 3}, {2, 3}, {5, 5}},
             {{0, 0, {0}},
              {1, 1, {1}},
              {1, 2, {1, -1}},
              {2, 2, {2, 1}},
              {2, 16, {2, 1, 0}},
              {3, 16, {3, 2}},
              {4, 0, {4}},
              {4, 1, {4}},
              {4, 2, {4, -4}},
              {4, 3, {4, -4, 2}},
              {4, 16, {4, -4, 2}},
              {5, 16, {5}}});
  // One document over the whole sequence (no document start): a plain sliding window, every
  // block before q full.
  check_case("no document start", sequence(1024, {}),
             {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}},
             {{7, 0, {7}},
              {7, 1, {7}},
              {7, 3, {7, -7, -6}},
              {7, 8, {7, -7, -6, -5, -4, -3, -2, -1}},
              {7, 16, {7, -7, -6, -5, -4, -3, -2, -1}},
              {0, 16, {0}}});
  // Every token a document: only the block itself, masked.
  std::vector<int> every(256, kStart);
  check_case("every token a document start", every, {{0, 0}, {1, 1}}, {{1, 16, {1}}, {0, 1, {0}}});
  // Documents starting on block edges only: no block straddles one.
  check_case("documents at 0, 256, 512", sequence(768, {0, 256, 512}),
             {{0, 0}, {0, 0}, {2, 2}, {2, 2}, {4, 4}, {4, 4}},
             {{3, 1, {3}}, {3, 2, {3, -3}}, {3, 16, {3, -3}}, {4, 16, {4}}, {5, 16, {5, -5}}});
  // Tokens before the first document start (document 0), a start at 130: block 1 spans two
  // documents, block 2 lies inside the second, which began in block 1.
  check_case("a document at 130", sequence(512, {130}), {{0, 0}, {0, 1}, {1, 2}, {1, 2}},
             {{1, 4, {1, 0}}, {2, 16, {2, 1}}, {3, 1, {3}}, {3, 2, {3, -3}}, {3, 3, {3, -3, 1}},
              {3, 16, {3, -3, 1}}});
}

// attention_first_key against the definition, on random sequences: key u is visible to query t
// when u <= t, both lie in one document, and u's block is in the selection of t's block; the
// visible keys must be exactly [attention_first_key, t]. Windows of 0 to 14 blocks, and ones whose
// tokens (blocks x 128) an int does not hold.
void test_first_key() {
  std::vector<int> windows;
  for (int window = 0; window <= 14; window++) windows.push_back(window);
  for (int window : {1 << 24, (1 << 24) + 1, INT32_MAX}) windows.push_back(window);
  uint64_t state = 12345;
  auto next = [&state] { return (uint32_t)((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33); };
  std::string failure;
  int queries = 0;
  for (int round = 0; round < 40 && failure.empty(); round++) {
    const int T = llmc::kAttentionBlock * (1 + next() % 12);
    std::vector<int> tokens(T, 7), documents(T);
    const int starts = next() % 12;
    for (int k = 0; k < starts; k++) tokens[next() % T] = kStart;
    if (round % 4 == 0) tokens[0] = kStart;
    for (int t = 0, document = 0; t < T; t++) documents[t] = document += tokens[t] == kStart;
    const std::vector<AttentionBlockSpan> spans = spans_of(tokens);
    for (int window : windows) {
      if (!failure.empty()) break;
      int document_start = 0;
      for (int t = 0; t < T && failure.empty(); t++, queries++) {
        if (tokens[t] == kStart) document_start = t;
        const int q = t / llmc::kAttentionBlock;
        const AttentionBlockSelection s = llmc::attention_blocks_select(spans[q], q, window);
        const int first = llmc::attention_first_key(t, document_start, window);
        for (int u = 0; u <= t; u++) {
          const bool visible = u >= (q - s.full - s.partial + 1) * llmc::kAttentionBlock && documents[u] == documents[t];
          if (visible != (u >= first)) {
            failure = llmc::strformat("T %d, window %d, query %d: key %d is %s, attention_first_key gives %d", T,
                                      window, t, u, visible ? "visible" : "hidden", first);
            break;
          }
        }
      }
    }
  }
  check_verbose(failure.empty(), llmc::strformat("attention_first_key: the visible keys of %d queries are [it, t]",
                                                 queries) + (failure.empty() ? "" : ": " + failure));
}

// Token windows against their definition, on random sequences: key u is visible to query t when
// t - w <= u <= t and both lie in one document. For every query block q the selection's run must
// hold every key visible to one of q's queries, its first block must hold one (the run is no
// longer than it needs), and every full block must hide nothing from any of q's queries; the
// visible keys of each query must be exactly [attention_window_first_key, t], and no selection
// longer than attention_window_run. Windows of 0 tokens up to past the sequence, on block edges,
// one off them and between.
void test_token_windows() {
  std::vector<int> windows = {0, 1, 63, 64, 100, 126, 127, 128, 129, 200, 255, 256, 257, 383, 384, 1000, 1537,
                              INT32_MAX};
  uint64_t state = 777;
  auto next = [&state] { return (uint32_t)((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33); };
  std::string failure;
  int blocks_checked = 0;
  for (int round = 0; round < 40 && failure.empty(); round++) {
    const int T = llmc::kAttentionBlock * (1 + next() % 12);
    std::vector<int> tokens(T, 7), documents(T);
    const int starts = next() % (round % 2 ? 3 : 12);
    for (int k = 0; k < starts; k++) tokens[next() % T] = kStart;
    if (round % 4 == 0) tokens[0] = kStart;
    for (int t = 0, document = 0; t < T; t++) documents[t] = document += tokens[t] == kStart;
    const std::vector<AttentionBlockSpan> spans = spans_of(tokens);
    for (int w : windows) {
      const llmc::AttentionWindow window{w, llmc::WindowUnit::kTokens};
      auto visible = [&](int t, int u) { return u <= t && t - u <= w && documents[u] == documents[t]; };
      for (int q = 0; q * llmc::kAttentionBlock < T && failure.empty(); q++, blocks_checked++) {
        const AttentionBlockSelection s = llmc::attention_window_select(spans[q], q, window);
        const int first_block = q - s.full - s.partial + 1, rows = q * llmc::kAttentionBlock;
        if (s.full < 0 || s.partial < 1 || s.full + s.partial > llmc::attention_window_run(window)) {
          failure = llmc::strformat("full %d, partial %d, run at most %d", s.full, s.partial,
                                    llmc::attention_window_run(window));
        }
        bool first_block_seen = false;
        for (int t = rows; t < rows + llmc::kAttentionBlock && failure.empty(); t++) {
          for (int u = 0; u <= t; u++) {
            const int k = u / llmc::kAttentionBlock;
            if (visible(t, u) && k < first_block) failure = llmc::strformat("key %d of query %d is visible", u, t);
            if (!visible(t, u) && k >= q - s.full && k < q) {
              failure = llmc::strformat("key %d of query %d is hidden in full block %d", u, t, k);
            }
            first_block_seen = first_block_seen || (visible(t, u) && k == first_block);
          }
        }
        if (failure.empty() && !first_block_seen) failure = llmc::strformat("no key of block %d visible", first_block);
        if (!failure.empty()) failure = llmc::strformat("T %d, window %d, query block %d: ", T, w, q) + failure;
      }
      int document_start = 0;
      for (int t = 0; t < T && failure.empty(); t++) {
        if (tokens[t] == kStart) document_start = t;
        const int first = llmc::attention_window_first_key(t, document_start, window);
        for (int u = 0; u <= t; u++) {
          if (visible(t, u) != (u >= first)) {
            failure = llmc::strformat("T %d, window %d, query %d: key %d is %s, attention_window_first_key gives %d",
                                      T, w, t, u, visible(t, u) ? "visible" : "hidden", first);
            break;
          }
        }
      }
    }
  }
  check_verbose(failure.empty(), llmc::strformat("token windows: the selections of %d query blocks hold exactly "
                                                 "their visible keys, full blocks none hidden", blocks_checked) +
                                     (failure.empty() ? "" : ": " + failure));
  // By hand, one document: a window of 128 tokens reaches into block q - 1 (query 128i sees key
  // 128(i - 1)) with no full block; 255 and 256 make q - 1 full and q - 2 the edge; 0 is q alone.
  const std::vector<AttentionBlockSpan> one = spans_of(sequence(1024, {0}));
  const AttentionBlockSelection w128 = llmc::attention_tokens_select(one[5], 5, 128);
  const AttentionBlockSelection w256 = llmc::attention_tokens_select(one[5], 5, 256);
  const AttentionBlockSelection w0 = llmc::attention_tokens_select(one[5], 5, 0);
  const AttentionBlockSelection w255 = llmc::attention_tokens_select(one[5], 5, 255);
  check_verbose(w128.full == 0 && w128.partial == 2 && w256.full == 1 && w256.partial == 2 && w0.full == 0 &&
                    w0.partial == 1 && w255.full == 1 && w255.partial == 2,
                llmc::strformat("token windows at block 5 of one document (full, partial): 128 (%d, %d), 256 (%d, "
                                "%d), 255 (%d, %d), 0 (%d, %d); expected (0, 2), (1, 2), (1, 2), (0, 1)",
                                w128.full, w128.partial, w256.full, w256.partial, w255.full, w255.partial, w0.full,
                                w0.partial));
}

std::vector<int> ids_of(const std::vector<int>& tokens) {
  std::vector<int> ids(tokens.size());
  llmc::document_ids(tokens.data(), (int)tokens.size(), kStart, ids.data());
  return ids;
}

// The document ids on hand-worked sequences, and on random ones against the spans: the first
// token of a query block's document (the first token with its id) lies in block first_key, and
// the block's documents begin in one block exactly when its first and last ids are equal.
void test_document_ids() {
  const std::vector<int> ids = ids_of(sequence(768, {0, 300, 301, 640}));
  check_verbose(ids[0] == 1 && ids[299] == 1 && ids[300] == 2 && ids[301] == 3 && ids[639] == 3 &&
                    ids[640] == 4 && ids[767] == 4,
                llmc::strformat("ids of documents at 0, 300, 301, 640: %d %d %d %d %d %d %d at tokens 0, 299, "
                                "300, 301, 639, 640, 767 (1 1 2 3 3 4 4)", ids[0], ids[299], ids[300],
                                ids[301], ids[639], ids[640], ids[767]));
  const std::vector<int> none = ids_of(sequence(256, {})), before = ids_of(sequence(256, {130}));
  check_verbose(none[0] == 0 && none[255] == 0 && before[129] == 0 && before[130] == 1 && before[255] == 1,
                "ids without a start at token 0: 0 up to the first start");
  const std::vector<int> every = ids_of(std::vector<int>(256, kStart));
  check_verbose(every[0] == 1 && every[255] == 256, "every token a start: ids 1 to 256");
  uint32_t state = 12345;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  bool agree = true;
  for (int sample = 0; sample < 200; sample++) {
    const int T = llmc::kAttentionBlock * (1 + next() % 8);
    std::vector<int> starts;
    for (int k = 0, n = next() % 12; k < n; k++) starts.push_back(next() % T);
    const std::vector<int> tokens = sequence(T, starts);
    const std::vector<int> sample_ids = ids_of(tokens);
    const std::vector<AttentionBlockSpan> spans = spans_of(tokens);
    for (int q = 0; q < (int)spans.size(); q++) {
      const int first = q * llmc::kAttentionBlock, last = first + llmc::kAttentionBlock - 1;
      int document_start = first;
      while (document_start > 0 && sample_ids[document_start - 1] == sample_ids[first]) document_start--;
      const bool one_document = sample_ids[first] == sample_ids[last];
      agree = agree && spans[q].first_key == document_start / llmc::kAttentionBlock &&
              (spans[q].first_full == q) == (!one_document || document_start > first - llmc::kAttentionBlock);
    }
  }
  check_verbose(agree, "ids of 200 random sequences agree with their spans (first_key, whether a block "
                       "lies in one document)");
}

int dump_blocks(const char* in_path, const char* out_path) {
  llmc::File in(in_path, "rb");
  std::vector<int32_t> cases(in.size() / sizeof(int32_t));
  in.read(cases.data(), cases.size() * sizeof(int32_t), "the cases");
  std::vector<int32_t> out;
  int count = 0;
  for (size_t at = 0; at + 2 <= cases.size(); count++) {
    const int T = cases[at], windows = cases[at + 1];
    const std::vector<int> tokens(cases.begin() + at + 2, cases.begin() + at + 2 + T);
    at += 2 + T;
    const std::vector<AttentionBlockSpan> spans = spans_of(tokens);
    for (int w = 0; w <= windows; w++) {
      for (int q = 0; q < (int)spans.size(); q++) {
        const AttentionBlockSelection s = llmc::attention_blocks_select(spans[q], q, w);
        out.push_back(s.full);
        out.push_back(s.partial);
        for (int k : selected(spans[q], q, w)) out.push_back(k);
      }
    }
  }
  llmc::write_file_atomically(out_path, [&](llmc::File& f) {
    f.write(out.data(), out.size() * sizeof(int32_t), "the selections");
  });
  printf("%d cases to %s\n", count, out_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 4 && std::string(argv[1]) == "--dump") return dump_blocks(argv[2], argv[3]);
    if (argc == 3 && std::string(argv[1]) == "--windows") {
      const long n = atol(argv[2]);
      for (long s = 0; s <= n; s++) {
        printf("%d%s", llmc::attention_window_blocks(s, n), s < n ? " " : "\n");
      }
      return 0;
    }
    if (argc > 1) {
      fprintf(stderr, "usage: %s [--dump IN OUT | --windows N]\n", argv[0]);
      return 2;
    }
    test_hand_cases();
    test_first_key();
    test_token_windows();
    test_document_ids();
  } catch (const llmc::Error& e) {
    if (argc > 1) {
      fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_attention_blocks");
}
