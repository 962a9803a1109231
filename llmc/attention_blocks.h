// Which key blocks a query block attends to under document-causal attention with a sliding window
// (SPEC.md "Attention blocks"): the blocks modded-nanogpt's create_blockmasks and build_bm select
// for flex attention, in a form a kernel evaluates in O(1) per query block from two ints of
// metadata. Plain C++ for host and device code: the device-callable functions use no std::.
//
// The reference: tokens in blocks of kAttentionBlock; the document of token i is the number of
// document starts (token 50256, llmc/dataloader.h) among tokens 0..i, and docs_low/docs_high of a
// block are those of its first and last token. Key block k is "any" for query block q when k <= q
// and their document ranges overlap, "all" (full) when k < q and both lie wholly inside one same
// document; partial = any and not full. Each list is ordered nearest first (descending k). With a
// window of w blocks it keeps the min(F, w - 1) nearest full blocks (none when w - 1 < 0) and the
// min(P, max(w - F, 1)) nearest partial ones, F and P being the totals (F before that clamp).
//
// Why two ints suffice: documents are contiguous runs of tokens, so document ids never decrease.
// Let s be the first token of the document that holds q's first token. A block k <= q overlaps
// q's documents exactly when its last token is at or after s, i.e. k >= s / 128 (first_key); and
// when q lies in one document, k < q lies in it exactly when its first token is at or after s,
// i.e. k >= ceil(s / 128) (first_full; q itself when q spans documents). So the full blocks are
// the run [first_full, q - 1] and the partial ones q and the run [first_key, first_full - 1]. The
// selection is then one run [q - full - partial + 1, q] too: when the window cuts the full blocks
// short (w - 1 < F) only q is partial, and otherwise every full block is kept and the partial
// ones below them continue the run.
#pragma once

#if defined(__CUDACC__)
#define LLMC_HOST_DEVICE __host__ __device__
#else
#define LLMC_HOST_DEVICE
#endif

namespace llmc {

constexpr int kAttentionBlock = 128;  // tokens per query and key block

// A query block's documents, as the key blocks where they begin: first_key is the first block
// that shares a document with it, first_full the first block wholly inside its document when it
// lies wholly inside one (itself when it does not).
struct AttentionBlockSpan {
  int first_key;
  int first_full;
};

// What query block q attends to: the run of key blocks [q - full - partial + 1, q].
struct AttentionBlockSelection {
  int full;     // blocks of q's document wholly before q: every query attends to every key there
  int partial;  // q itself and blocks straddling its document's start: masked token by token
};

// The key blocks query block q (with its span) attends to with a window of `window` blocks (0 or
// more; 0 keeps q alone, as the reference's short window w // 2 of w = 1).
LLMC_HOST_DEVICE inline AttentionBlockSelection attention_blocks_select(AttentionBlockSpan span,
                                                                        int q, int window) {
  const int full_total = q - span.first_full;
  const int partial_total = 1 + span.first_full - span.first_key;
  int full = full_total < window - 1 ? full_total : window - 1;
  if (full < 0) full = 0;
  const int partial_room = window - full_total > 1 ? window - full_total : 1;
  const int partial = partial_total < partial_room ? partial_total : partial_room;
  return {full, partial};
}

// The i-th key block of a selection, nearest first (0 <= i < full + partial): q - i, a full block
// for 1 <= i <= full (*full set), else partial. Each list of the reference, full and partial, is
// this order with the other kind left out.
LLMC_HOST_DEVICE inline int attention_key_block(AttentionBlockSelection selection, int q, int i,
                                                bool* full) {
  *full = i >= 1 && i <= selection.full;
  return q - i;
}

// The spans of the T / kAttentionBlock query blocks of one sequence of T tokens (T a multiple of
// kAttentionBlock) whose documents begin at the tokens equal to `document_start`; O(T), on the
// host.
inline void attention_block_spans(const int* tokens, int T, int document_start,
                                  AttentionBlockSpan* spans) {
  int start = 0;  // of the document of the current token (tokens before the first start: 0)
  for (int q = 0; q * kAttentionBlock < T; q++) {
    const int first = q * kAttentionBlock;
    if (tokens[first] == document_start) start = first;
    const int block_start = start;
    for (int i = first + 1; i < first + kAttentionBlock; i++) {
      if (tokens[i] == document_start) start = i;
    }
    const bool one_document = start == block_start;
    spans[q].first_key = block_start / kAttentionBlock;
    spans[q].first_full = one_document ? (block_start + kAttentionBlock - 1) / kAttentionBlock : q;
  }
}

// The keys query token t attends to, as one range [attention_first_key(...), t]: the selection
// holds min(q - first_key + 1, max(window, 1)) blocks for every span (whichever of its cases
// applies), so it starts at block max(first_key, q - max(window, 1) + 1); the tokens of t's own
// document in it are the tokens from the later of its start and t's document's start (documents
// are contiguous, and t's starts at or after first_key's block). document_start: the first token
// of t's document (0 when no start precedes t). What the KV-cache decoder needs, which sees only
// the tokens up to t (the spans read the whole block).
LLMC_HOST_DEVICE inline int attention_first_key(int t, int document_start, int window) {
  const int run = window > 1 ? window : 1;
  // A window reaching back past token 0 starts there: clamped in blocks, before the scaling to
  // tokens, so that no window (up to INT_MAX blocks) overflows an int.
  const int first_block = t / kAttentionBlock - run + 1;
  const int window_start = first_block > 0 ? first_block * kAttentionBlock : 0;
  return document_start > window_start ? document_start : window_start;
}

// A sliding window in blocks (the reference's block mask above) or in tokens (record #89's
// FlashAttention window_size=(w, 0): key j is seen by query i when i - w <= j <= i, w + 1 keys).
// A token window is the same run of key blocks, reaching back to the block of the query block's
// first row's farthest key, with the full blocks those whose every key lies within w tokens of
// every query of q; the blocks at the window's edge join the partial ones, masked token by token.
enum class WindowUnit { kBlocks, kTokens };

struct AttentionWindow {
  int size;  // blocks (0: the query's own block) or tokens (0: the query alone)
  WindowUnit unit;

  // A window of `blocks` blocks of kAttentionBlock tokens, as blocks or as that many tokens.
  LLMC_HOST_DEVICE static AttentionWindow of_blocks(int blocks, WindowUnit unit) {
    return {unit == WindowUnit::kTokens ? blocks * kAttentionBlock : blocks, unit};
  }
};

// The key blocks query block q (with its span) attends to with a window of `tokens` tokens (0 or
// more): the run of at most ceil(tokens / 128) + 1 blocks, of which the nearest blocks wholly in
// q's document and wholly within reach ((q - k) x 128 + 127 <= tokens) are full.
LLMC_HOST_DEVICE inline AttentionBlockSelection attention_tokens_select(AttentionBlockSpan span, int q, int tokens) {
  const int back = tokens / kAttentionBlock + (tokens % kAttentionBlock != 0);
  const int full_room = tokens >= kAttentionBlock - 1 ? (tokens - (kAttentionBlock - 1)) / kAttentionBlock : 0;
  const int full_total = q - span.first_full, total = q - span.first_key + 1;
  const int run = total < back + 1 ? total : back + 1;
  const int full = full_total < full_room ? full_total : full_room;
  return {full, run - full};
}

// The selection of either unit.
LLMC_HOST_DEVICE inline AttentionBlockSelection attention_window_select(AttentionBlockSpan span, int q,
                                                                        AttentionWindow window) {
  return window.unit == WindowUnit::kTokens ? attention_tokens_select(span, q, window.size)
                                            : attention_blocks_select(span, q, window.size);
}

// The most key blocks a selection of `window` holds: what a key block's readers and a query
// block's scratch are sized for.
LLMC_HOST_DEVICE inline int attention_window_run(AttentionWindow window) {
  if (window.unit == WindowUnit::kBlocks) return window.size > 1 ? window.size : 1;
  return window.size / kAttentionBlock + (window.size % kAttentionBlock != 0) + 1;
}

// The farthest a key may lie behind its query, in tokens, within a selection's partial blocks: a
// token window's size, and for a block window no limit (its blocks are the whole of it).
LLMC_HOST_DEVICE inline int attention_window_reach(AttentionWindow window) {
  return window.unit == WindowUnit::kTokens ? window.size : 0x7fffffff;
}

// attention_first_key for either unit: a token window starts w tokens back (not before token 0).
LLMC_HOST_DEVICE inline int attention_window_first_key(int t, int document_start, AttentionWindow window) {
  if (window.unit == WindowUnit::kBlocks) return attention_first_key(t, document_start, window.size);
  const int window_start = t > window.size ? t - window.size : 0;
  return document_start > window_start ? document_start : window_start;
}

// The document of each of the T tokens of one sequence, as the reference counts them: the number
// of tokens equal to `document_start` among tokens 0..i (0 before the first start). Ids only ever
// grow along a sequence, so two tokens share a document exactly when their ids are equal; on the
// host.
inline void document_ids(const int* tokens, int T, int document_start, int* ids) {
  int document = 0;
  for (int i = 0; i < T; i++) {
    if (tokens[i] == document_start) document++;
    ids[i] = document;
  }
}

}  // namespace llmc
