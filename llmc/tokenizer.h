// GPT-2 tokenization: decoding with llm.c's vocabulary file, and encoding that reproduces
// tiktoken's "gpt2" (r50k_base) encoding exactly.
//
// Contents:
//   character class  \s, \p{L}, \p{N} from the generated llmc/unicode_tables.h
//   pre-tokenization gpt2_piece_end / gpt2_split: the GPT-2 pattern, by hand
//   BpeEncoder       encoder.json (read with llmc/json.h) + vocab.bpe -> byte-level BPE by rank,
//                    with a cache
//   vocabulary file  write_tokenizer_bin and Tokenizer (decoding)
//
// Vocabulary file (llm.c): 256 int32 header [0] magic 20240328 [1] version (1 or 2)
// [2] vocab size [3] EOT token id (version 2 only), then per token one uint8 byte count and
// that many bytes. Version 1 files carry no EOT id; as in llm.c they must hold GPT-2's 50257
// tokens and EOT is 50256.
//
// Encoding follows tiktoken's encode_ordinary: special tokens in the text ("<|endoftext|>") are
// encoded as plain text; encode_with_eot() prepends the EOT token explicitly. The input must be
// valid UTF-8: invalid bytes (overlong forms, surrogates, truncated sequences) raise an
// llmc::Error naming the byte offset rather than being replaced, so a corrupt corpus is noticed.
// \p{L} and \p{N} follow the Unicode version recorded in unicode_tables.h; characters assigned
// after the version that a given tiktoken build uses may split differently there.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <iterator>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "json.h"
#include "unicode_tables.h"
#include "utf8.h"
#include "utils.h"

namespace llmc {

constexpr int kTokenizerMagic = 20240328;
constexpr int kTokenizerHeaderInts = 256;
constexpr int kGpt2VocabSize = 50257;
constexpr int kGpt2EotToken = 50256;
constexpr const char* kEndOfTextText = "<|endoftext|>";

// ----------------------------------------------------------------------------------------------
// Character classes of the pre-tokenization pattern

enum class CharClass : uint8_t { kWhiteSpace, kLetter, kNumber, kOther };

inline bool code_point_in(uint32_t code_point, const CodePointRange* ranges, size_t count) {
  size_t lo = 0, hi = count;  // first range whose last >= code_point
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (ranges[mid].last < code_point) lo = mid + 1; else hi = mid;
  }
  return lo < count && ranges[lo].first <= code_point;
}

inline CharClass char_class_lookup(uint32_t code_point) {
  if (code_point_in(code_point, kWhiteSpaceRanges, std::size(kWhiteSpaceRanges))) {
    return CharClass::kWhiteSpace;
  }
  if (code_point_in(code_point, kLetterRanges, std::size(kLetterRanges))) return CharClass::kLetter;
  if (code_point_in(code_point, kNumberRanges, std::size(kNumberRanges))) return CharClass::kNumber;
  return CharClass::kOther;
}

inline CharClass char_class(uint32_t code_point) {
  // Most text is Latin-1; answer it from a table built once from the same ranges.
  static const std::array<CharClass, 256> latin1 = [] {
    std::array<CharClass, 256> table{};
    for (uint32_t c = 0; c < 256; c++) table[c] = char_class_lookup(c);
    return table;
  }();
  return code_point < 256 ? latin1[code_point] : char_class_lookup(code_point);
}

// ----------------------------------------------------------------------------------------------
// Pre-tokenization: GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// evaluated as a backtracking regex engine does (leftmost match, first alternative that matches).
// Every character is in exactly one of \s, \p{L}, \p{N} or the rest, so the matches tile the text.

// Length of the contraction ('s 't 'm 'd 're 've 'll, lowercase only) after an apostrophe at
// `pos - 1`, or 0.
inline size_t contraction_length(std::string_view text, size_t pos) {
  if (pos >= text.size()) return 0;
  const char c = text[pos];
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 1;
  if (pos + 1 < text.size()) {
    const std::string_view two = text.substr(pos, 2);
    if (two == "re" || two == "ve" || two == "ll") return 2;
  }
  return 0;
}

// End (byte offset) of the piece that starts at byte `start` of text.
inline size_t gpt2_piece_end(std::string_view text, size_t start) {
  const size_t n = text.size();
  const Utf8CodePoint first = utf8_decode_at(text, start);
  if (first.code_point == '\'') {
    size_t length = contraction_length(text, start + 1);
    if (length > 0) return start + 1 + length;
  }
  // " ?\p{L}+", " ?\p{N}+" and " ?[^\s\p{L}\p{N}]+": an optional space, then a run of one class.
  size_t run_start = start;
  CharClass run_class = char_class(first.code_point);
  if (first.code_point == ' ' && start + 1 < n) {
    run_start = start + 1;
    run_class = char_class(utf8_decode_at(text, run_start).code_point);
  }
  if (run_class != CharClass::kWhiteSpace) {
    size_t end = run_start;
    while (end < n) {
      Utf8CodePoint next = utf8_decode_at(text, end);
      if (char_class(next.code_point) != run_class) break;
      end += next.length;
    }
    return end;
  }
  // "\s+(?!\S)|\s+": the white space run, less its last character when a non-space follows (that
  // character then leads the next piece, e.g. " word"); a single one before a non-space is "\s+".
  size_t end = start, last_start = start;
  while (end < n) {
    Utf8CodePoint next = utf8_decode_at(text, end);
    if (char_class(next.code_point) != CharClass::kWhiteSpace) break;
    last_start = end;
    end += next.length;
  }
  if (end < n && last_start > start) return last_start;
  return end;
}

inline std::vector<std::string_view> gpt2_split(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = gpt2_piece_end(text, pos);
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

// ----------------------------------------------------------------------------------------------
// GPT-2's byte <-> unicode alphabet: encoder.json and vocab.bpe spell every byte as a printable
// character. The 188 printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves; the other 68 map, in ascending order, to U+0100 onwards.

inline bool gpt2_byte_is_printable(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
}

// -1 where the code point spells no byte.
inline const std::array<int, 512>& gpt2_unicode_to_byte() {
  static const std::array<int, 512> table = [] {
    std::array<int, 512> t;
    t.fill(-1);
    int next_unprintable = 256;
    for (int byte = 0; byte < 256; byte++) {
      t[gpt2_byte_is_printable(byte) ? byte : next_unprintable++] = byte;
    }
    return t;
  }();
  return table;
}

// The bytes spelled by a string of encoder.json / vocab.bpe.
inline std::string gpt2_symbol_bytes(std::string_view symbol, const std::string& where) {
  std::string bytes;
  for (size_t pos = 0; pos < symbol.size();) {
    const auto* raw = reinterpret_cast<const unsigned char*>(symbol.data()) + pos;
    Utf8CodePoint decoded = utf8_decode(raw, symbol.size() - pos);
    const auto& table = gpt2_unicode_to_byte();
    if (decoded.status != Utf8Status::kValid || decoded.code_point >= table.size() ||
        table[decoded.code_point] < 0) {
      LLMC_FAIL("%s: token '%.*s' has a character outside GPT-2's byte alphabet: the file is not "
                "a GPT-2 BPE file", where.c_str(), (int)symbol.size(), symbol.data());
    }
    bytes.push_back((char)table[decoded.code_point]);
    pos += decoded.length;
  }
  return bytes;
}

// ----------------------------------------------------------------------------------------------
// BpeEncoder

// Byte-level BPE as tiktoken does it: a piece that is itself a token is that token; otherwise
// start from its bytes and repeatedly merge the adjacent pair whose concatenation has the lowest
// rank (leftmost on ties) until no adjacent pair is a token. The rank of a token is its id.
// (With GPT-2's vocabulary every token merges back to itself, so the first rule only saves time.)
//
// encode() keeps a cache of the pieces seen, so one encoder must not be used by several threads
// at once.
class BpeEncoder {
 public:
  BpeEncoder(const std::string& encoder_json_path, const std::string& vocab_bpe_path) {
    load_encoder_json(encoder_json_path);
    check_merges(vocab_bpe_path);
  }

  // dir/encoder.json and dir/vocab.bpe (the repository ships them in dev/data/gpt2).
  static BpeEncoder from_dir(const std::string& dir) {
    return BpeEncoder(dir + "/encoder.json", dir + "/vocab.bpe");
  }

  int vocab_size() const { return (int)tokens_.size(); }
  int eot_token() const { return eot_token_; }
  const std::vector<std::string>& token_bytes() const { return tokens_; }

  std::vector<int> encode(std::string_view text) {
    std::vector<int> ids;
    encode_append(text, &ids);
    return ids;
  }

  // A document as llm.c lays them out: the EOT token, then the text.
  std::vector<int> encode_with_eot(std::string_view text) {
    std::vector<int> ids{eot_token_};
    encode_append(text, &ids);
    return ids;
  }

  void encode_append(std::string_view text, std::vector<int>* ids) {
    for (size_t pos = 0; pos < text.size();) {
      size_t end = gpt2_piece_end(text, pos);
      encode_piece(text.substr(pos, end - pos), ids);
      pos = end;
    }
  }

  std::string decode(const std::vector<int>& ids) const {
    std::string bytes;
    for (int id : ids) {
      if (id < 0 || id >= vocab_size()) {
        LLMC_FAIL("cannot decode token id %d: the vocabulary has ids 0..%d", id, vocab_size() - 1);
      }
      bytes += tokens_[id];
    }
    return bytes;
  }

 private:
  static constexpr int kNoRank = -1;
  // The cache is cleared when it reaches this many pieces, bounding its memory on huge corpora;
  // pieces longer than kMaxCachedPieceBytes (rare, and seldom repeated) are not cached.
  static constexpr size_t kMaxCacheEntries = 1 << 20;
  static constexpr size_t kMaxCachedPieceBytes = 256;

  void load_encoder_json(const std::string& path) {
    const char* kEncoderJson =
        "the file must be GPT-2's encoder.json, a JSON object of token -> id";
    const std::string text = read_text_file(path);
    const JsonValue vocabulary = JsonParser(text, path, 1, kEncoderJson).parse();
    if (vocabulary.type != JsonValue::Type::kObject) {
      LLMC_FAIL("%s: the file holds %s: %s", path.c_str(), json_type_name(vocabulary.type),
                kEncoderJson);
    }
    const auto& entries = vocabulary.members;
    if (entries.empty()) {
      LLMC_FAIL("%s: the vocabulary is empty: use GPT-2's encoder.json", path.c_str());
    }
    tokens_.assign(entries.size(), std::string());
    std::vector<bool> seen(entries.size(), false);
    for (const auto& [symbol, value] : entries) {
      if (!json_is_integer(value) || value.number < 0 || value.number >= (double)entries.size() ||
          seen[(size_t)value.number]) {
        LLMC_FAIL("%s: token ids must be 0..%zu, each once; '%s' has id %s: the file is damaged",
                  path.c_str(), entries.size() - 1, symbol.c_str(), json_describe(value).c_str());
      }
      const int id = (int)value.number;
      seen[id] = true;
      tokens_[id] = gpt2_symbol_bytes(symbol, path);
      if (tokens_[id] == kEndOfTextText) eot_token_ = id;
    }
    if (eot_token_ < 0) {
      LLMC_FAIL("%s: has no %s token: use GPT-2's encoder.json", path.c_str(), kEndOfTextText);
    }
  }

  // tiktoken derives the ranks from vocab.bpe (the 256 bytes in alphabet order, then one rank
  // per merge) and requires them to equal encoder.json's ids; the tokens that no merge makes are
  // the special ones. Checking the same here catches mismatched or damaged files.
  void check_merges(const std::string& path) {
    std::vector<std::string> ranked;
    for (int byte = 0; byte < 256; byte++) {
      if (gpt2_byte_is_printable(byte)) ranked.push_back(std::string(1, (char)byte));
    }
    for (int byte = 0; byte < 256; byte++) {
      if (!gpt2_byte_is_printable(byte)) ranked.push_back(std::string(1, (char)byte));
    }
    std::vector<size_t> merge_lines;  // line of vocab.bpe of ranked[256 + i]
    const std::string text = read_text_file(path);
    size_t line_number = 0;
    for (size_t pos = 0; pos < text.size();) {
      size_t newline = text.find('\n', pos);
      if (newline == std::string::npos) newline = text.size();
      std::string_view line(text.data() + pos, newline - pos);
      pos = newline + 1;
      line_number++;
      if (line.empty() || (line_number == 1 && line.substr(0, 9) == "#version:")) continue;
      size_t space = line.find(' ');
      if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string_view::npos) {
        LLMC_FAIL("%s:%zu: expected two tokens separated by one space: the file must be GPT-2's "
                  "vocab.bpe", path.c_str(), line_number);
      }
      std::string where = strformat("%s:%zu", path.c_str(), line_number);
      ranked.push_back(gpt2_symbol_bytes(line.substr(0, space), where) +
                       gpt2_symbol_bytes(line.substr(space + 1), where));
      merge_lines.push_back(line_number);
    }
    if (ranked.size() > tokens_.size()) {
      LLMC_FAIL("%s: %zu merges need %zu token ids, encoder.json has %zu: use the encoder.json and "
                "vocab.bpe of the same release", path.c_str(), ranked.size() - 256, ranked.size(),
                tokens_.size());
    }
    for (size_t rank = 0; rank < ranked.size(); rank++) {
      if (tokens_[rank] != ranked[rank]) {
        const std::string made_by =
            rank < 256 ? "a byte" : strformat("merge on line %zu", merge_lines[rank - 256]);
        LLMC_FAIL("%s: rank %zu (%s) is not token id %zu of encoder.json: use the encoder.json and "
                  "vocab.bpe of the same release", path.c_str(), rank, made_by.c_str(), rank);
      }
      if (!ranks_.emplace(ranked[rank], (int)rank).second) {
        LLMC_FAIL("%s: token of rank %zu is made twice: the file is damaged", path.c_str(), rank);
      }
    }
  }

  int rank_of(std::string_view bytes) {
    key_.assign(bytes.data(), bytes.size());
    auto it = ranks_.find(key_);
    return it == ranks_.end() ? kNoRank : it->second;
  }

  void encode_piece(std::string_view piece, std::vector<int>* ids) {
    int whole = rank_of(piece);
    if (whole != kNoRank) {
      ids->push_back(whole);
      return;
    }
    const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
    if (cacheable) {
      auto it = cache_.find(key_);  // key_ holds the piece after rank_of
      if (it != cache_.end()) {
        ids->insert(ids->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first_new = ids->size();
    merge_bytes(piece, ids);
    if (cacheable) {
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      cache_.emplace(std::string(piece), std::vector<int>(ids->begin() + first_new, ids->end()));
    }
  }

  // The merge loop with a heap of candidate pairs, O(n log n) in the piece length, so that a long
  // run without spaces (a base64 blob, a line of digits) stays fast. A heap entry is stale once
  // either of its parts has changed; stale entries are skipped when they come up.
  void merge_bytes(std::string_view piece, std::vector<int>* ids) {
    const int n = (int)piece.size();
    std::vector<int> next(n), prev(n);  // part boundaries, indexed by a part's first byte
    std::vector<bool> alive(n, true);
    for (int i = 0; i < n; i++) {
      next[i] = i + 1;
      prev[i] = i - 1;
    }
    struct Candidate {
      int rank, left, middle, end;  // parts [left, middle) and [middle, end)
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto consider = [&](int left, int middle) {
      if (left < 0 || middle >= n) return;
      int end = next[middle];
      int rank = rank_of(piece.substr(left, end - left));
      if (rank != kNoRank) heap.push({rank, left, middle, end});
    };
    for (int i = 0; i + 1 < n; i++) consider(i, i + 1);
    while (!heap.empty()) {
      Candidate c = heap.top();
      heap.pop();
      if (!alive[c.left] || !alive[c.middle] || next[c.left] != c.middle ||
          next[c.middle] != c.end) {
        continue;
      }
      alive[c.middle] = false;
      next[c.left] = c.end;
      if (c.end < n) prev[c.end] = c.left;
      consider(prev[c.left], c.left);
      consider(c.left, c.end);
    }
    for (int i = 0; i < n; i = next[i]) ids->push_back(rank_of(piece.substr(i, next[i] - i)));
  }

  std::vector<std::string> tokens_;              // id -> bytes
  std::unordered_map<std::string, int> ranks_;   // bytes -> rank (= id), special tokens excluded
  std::unordered_map<std::string, std::vector<int>> cache_;
  std::string key_;                              // reused lookup key
  int eot_token_ = -1;
};

// ----------------------------------------------------------------------------------------------
// Vocabulary file

inline void write_tokenizer_bin(const std::string& path, const std::vector<std::string>& tokens,
                                int eot_token) {
  if (eot_token < 0 || eot_token >= (int)tokens.size()) {
    LLMC_FAIL("%s: EOT token id %d is outside the vocabulary of %zu tokens", path.c_str(),
              eot_token, tokens.size());
  }
  int header[kTokenizerHeaderInts] = {};
  header[0] = kTokenizerMagic;
  header[1] = 2;
  header[2] = (int)tokens.size();
  header[3] = eot_token;
  for (size_t id = 0; id < tokens.size(); id++) {
    if (tokens[id].empty() || tokens[id].size() > 255) {
      LLMC_FAIL("%s: token %zu has %zu bytes; the format stores 1..255", path.c_str(), id,
                tokens[id].size());
    }
  }
  write_file_atomically(path, [&](File& f) {
    f.write(header, sizeof(header), "the header");
    for (const std::string& token : tokens) {
      const unsigned char length = (unsigned char)token.size();
      f.write(&length, 1, "a token length");
      f.write(token.data(), length, "token bytes");
    }
  });
}

// The header of a vocabulary file (see the top of this file).
struct TokenizerHeader {
  int vocab_size;
  int eot_token;
};

// Reads f's header and checks it against the file's size; `where` names the file in errors (its
// path, or the flag and path it came from). Leaves f at the first token.
inline TokenizerHeader tokenizer_read_header(File& f, const std::string& where) {
  const char* name = where.c_str();
  const long file_size = f.size();
  int header[kTokenizerHeaderInts];
  if (file_size < (long)sizeof(header)) {
    LLMC_FAIL("%s: the file is truncated, or not a tokenizer vocabulary file: %ld bytes, less than "
              "the %zu-byte header: write one with build/write_tokenizer", name, file_size,
              sizeof(header));
  }
  f.read(header, sizeof(header), "the header");
  if (header[0] != kTokenizerMagic) {
    LLMC_FAIL("%s: not a tokenizer vocabulary file (magic %d, expected %d): write one with "
              "build/write_tokenizer", name, header[0], kTokenizerMagic);
  }
  const int version = header[1];
  const int vocab_size = header[2];
  if (version != 1 && version != 2) {
    LLMC_FAIL("%s: tokenizer version %d is not supported (only 1 and 2): rewrite it with "
              "build/write_tokenizer", name, version);
  }
  if (vocab_size <= 0 || vocab_size > (1 << 24)) {
    LLMC_FAIL("%s: vocabulary size %d in the header is implausible: the file is damaged", name,
              vocab_size);
  }
  // Every token takes at least two bytes (its length and one byte). Checked before the tokens
  // are allocated, so that a damaged size fails here instead of allocating for it.
  const long body_bytes = file_size - (long)sizeof(header);
  if (vocab_size > body_bytes / 2) {
    LLMC_FAIL("%s: the file is truncated: %d tokens need at least %ld bytes after the header, "
              "it has %ld", name, vocab_size, 2 * (long)vocab_size, body_bytes);
  }
  if (version == 1) {
    if (vocab_size != kGpt2VocabSize) {
      LLMC_FAIL("%s: a version 1 file has no EOT id, so it must be GPT-2's %d tokens, not %d: "
                "rewrite it with build/write_tokenizer", name, kGpt2VocabSize, vocab_size);
    }
    return {vocab_size, kGpt2EotToken};
  }
  if (header[3] < 0 || header[3] >= vocab_size) {
    LLMC_FAIL("%s: EOT token id %d is outside the vocabulary of %d tokens: the file is damaged",
              name, header[3], vocab_size);
  }
  return {vocab_size, header[3]};
}

// Decodes token ids with an llm.c vocabulary file (see the top of this file).
class Tokenizer {
 public:
  explicit Tokenizer(const std::string& path) : path_(path) {
    File f(path, "rb");
    const long file_size = f.size();
    const TokenizerHeader header = tokenizer_read_header(f, path);
    const int vocab_size = header.vocab_size;
    eot_token_ = header.eot_token;
    tokens_.resize(vocab_size);
    for (int id = 0; id < vocab_size; id++) {
      unsigned char length;
      f.read(&length, 1, "a token length");
      if (length == 0) {
        LLMC_FAIL("%s: token %d has length 0 (every token has at least one byte): the file is "
                  "damaged", path.c_str(), id);
      }
      tokens_[id].resize(length);
      f.read(&tokens_[id][0], length, "token bytes");
    }
    const long used = (long)ftell(f.handle());
    if (used != file_size) {
      LLMC_FAIL("%s: %ld bytes follow the last of the %d tokens: the file is damaged or its "
                "header's vocabulary size is wrong", path.c_str(), file_size - used, vocab_size);
    }
  }

  int vocab_size() const { return (int)tokens_.size(); }
  int eot_token() const { return eot_token_; }
  const std::vector<std::string>& token_bytes() const { return tokens_; }

  // The token's bytes: possibly only part of a UTF-8 character (see Utf8Joiner).
  const std::string& decode(int id) const {
    if (id < 0 || id >= vocab_size()) {
      LLMC_FAIL("token id %d is outside the vocabulary of %d tokens (%s)", id, vocab_size(),
                path_.c_str());
    }
    return tokens_[id];
  }

  std::string decode(const std::vector<int>& ids) const {
    std::string bytes;
    for (int id : ids) bytes += decode(id);
    return bytes;
  }

 private:
  std::string path_;
  std::vector<std::string> tokens_;
  int eot_token_ = -1;
};

// ----------------------------------------------------------------------------------------------
// Prefix tokens

// Each token's prefix token (modded-nanogpt record #89's prefix prediction): the id of the longest
// proper prefix of its bytes that is itself a token, -1 where none is (the 256 byte tokens), for
// `rows` ids, the padded rows -1. The end-of-text token stands for no bytes: it has no prefix and
// is none. Each token looks up its prefixes from the longest down (GPT-2's are at most 128 bytes);
// the reference's sort of the byte strings finds the same ids (a proper prefix sorts before its
// extensions, and each token after the longest of them).
inline std::vector<int> token_prefix_table(const std::vector<std::string>& tokens, int eot_token, int rows) {
  if (rows < (int)tokens.size()) {
    LLMC_FAIL("token_prefix_table: %d rows for a vocabulary of %zu tokens", rows, tokens.size());
  }
  std::unordered_map<std::string_view, int> ids;
  for (int id = 0; id < (int)tokens.size(); id++) {
    if (id != eot_token) ids.emplace(tokens[id], id);
  }
  std::vector<int> table(rows, -1);
  for (int id = 0; id < (int)tokens.size(); id++) {
    const std::string_view bytes = tokens[id];
    for (size_t length = bytes.size() - 1; id != eot_token && length > 0; length--) {
      const auto found = ids.find(bytes.substr(0, length));
      if (found != ids.end()) {
        table[id] = found->second;
        break;
      }
    }
  }
  return table;
}

}  // namespace llmc
