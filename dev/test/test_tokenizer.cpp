// Tests llmc/tokenizer.h: GPT-2 encodings known from tiktoken, the pre-tokenization pattern,
// round trips, the vocabulary file (write, read back, malformed files), UTF-8 handling and the
// encoder files; record #89's prefix table against its reference's construction. With TINYSHAKESPEARE set (the path of its input.txt) it also encodes the
// whole text, timing it. Run from the repository root; scratch files go to build/.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/tokenizer.h"

using testing::check_throws;
using testing::check_verbose;

namespace {

const char* kEncoderDir = "dev/data/gpt2";
const char* kScratchDir = "build/scratch/test_tokenizer";

std::string ids_text(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); i++) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

// A string shown safely in a message: non-ASCII and control bytes as \xNN.
std::string quoted(const std::string& bytes) {
  std::string s = "\"";
  for (unsigned char c : bytes) {
    s += (c >= 0x20 && c < 0x7F && c != '"') ? std::string(1, (char)c)
                                             : llmc::strformat("\\x%02X", c);
  }
  return s + "\"";
}

std::string scratch_path(const std::string& name) {
  llmc::make_dirs(kScratchDir);
  return std::string(kScratchDir) + "/" + name;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  llmc::File f(path, "wb");
  f.write(bytes.data(), bytes.size(), "test data");
  f.close();
}

void test_known_encodings(llmc::BpeEncoder& encoder) {
  // Expected ids from tiktoken's "gpt2" encoding (encode_ordinary).
  struct Case {
    std::string text;
    std::vector<int> ids;
  };
  const std::vector<Case> cases = {
      {"Hello world", {15496, 995}},
      {"", {}},
      {" 's", {705, 82}},
      {"it's I'm we're they've she'd you'll can't",
       {270, 338, 314, 1101, 356, 821, 484, 1053, 673, 1549, 345, 1183, 460, 470}},
      {"IT'S 'S 'Ll", {2043, 6, 50, 705, 50, 705, 43, 75}},
      {"12345 3.14 1,000,000", {10163, 2231, 513, 13, 1415, 352, 11, 830, 11, 830}},
      {"a  b   c\t\td", {64, 220, 275, 220, 220, 269, 197, 197, 67}},
      {"line1\nline2\n\nline3\n\n\n", {1370, 16, 198, 1370, 17, 198, 198, 1370, 18, 628, 198}},
      {"   ", {220, 220, 220}},
      {"na\xC3\xAFve caf\xC3\xA9 \xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC "
       "\xD0\xA0\xD1\x83\xD1\x81\xD1\x81\xD0\xBA\xD0\xB8\xD0\xB9",
       {2616, 38776, 40304, 7377, 243,   39377, 39377, 138,   115,   26180, 29945, 43000,
        138,  105,   12466, 254,  35072, 21727, 21727, 31583, 18849, 140,   117}},
      {"\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",  // 你好，世界
       {19526, 254, 25001, 121, 171, 120, 234, 10310, 244, 45911, 234}},
      {"\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",  // grinning face, thumbs up, skin tone
       {47249, 222, 41840, 235, 8582, 237, 121}},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},  // plain text, not the EOT token
      // U+0085 is white space for tiktoken (Rust's \s) but not for JavaScript's \s; U+FEFF the
      // reverse. These follow tiktoken.
      {"x \xC2\x85y", {87, 220, 126, 227, 88}},
      {"a\xC2\x85\xC2\x85"
       "b",
       {64, 126, 227, 126, 227, 65}},
      {"x \xEF\xBB\xBFy", {87, 27332, 119, 123, 88}},
  };
  for (const Case& c : cases) {
    std::vector<int> got = encoder.encode(c.text);
    check_verbose(got == c.ids, "encode(" + quoted(c.text) + ") = " + ids_text(got) +
                                    ", tiktoken gives " + ids_text(c.ids));
  }
  std::vector<int> document = encoder.encode_with_eot("Hello world");
  check_verbose(document == std::vector<int>({50256, 15496, 995}),
                "encode_with_eot(\"Hello world\") = " + ids_text(document));
  check_verbose(encoder.vocab_size() == 50257 && encoder.eot_token() == 50256,
                llmc::strformat("GPT-2 vocabulary: %d tokens, EOT %d", encoder.vocab_size(),
                                encoder.eot_token()));
}

void test_pieces() {
  // Expected pieces from the pattern run by a regex engine.
  struct Case {
    std::string text;
    std::vector<std::string> pieces;
  };
  const std::vector<Case> cases = {
      {"Hello  world\n\n", {"Hello", " ", " world", "\n\n"}},
      {"it's IT'S  'x", {"it", "'s", " IT", "'", "S", " ", " '", "x"}},
      {"a \n\nb", {"a", " \n", "\n", "b"}},
      {"\t x", {"\t", " x"}},
      {"\tx\t\ty", {"\t", "x", "\t", "\t", "y"}},
      {"x  ", {"x", "  "}},
      {" 123abc!!? ", {" 123", "abc", "!!?", " "}},
      {"\n\nfoo", {"\n", "\n", "foo"}},
      {"we'll've 'd'", {"we", "'ll", "'ve", " '", "d", "'"}},
      {" ", {" "}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> got;
    for (std::string_view piece : llmc::gpt2_split(c.text)) got.emplace_back(piece);
    std::string shown;
    for (const std::string& piece : got) shown += quoted(piece) + " ";
    check_verbose(got == c.pieces, "gpt2_split(" + quoted(c.text) + ") = " + shown);
  }
}

void test_round_trips(llmc::BpeEncoder& encoder, const llmc::Tokenizer& tokenizer) {
  const std::vector<std::string> texts = {
      "",
      "Hello world",
      "  leading and trailing  \t\n",
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 family emoji",
      "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
      "<|endoftext|> stays text",
      "code: for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }\n",
      std::string(5000, 'a') + std::string(3000, '7') + std::string(2000, '!'),
  };
  for (const std::string& text : texts) {
    std::vector<int> ids = encoder.encode(text);
    check_verbose(encoder.decode(ids) == text,
                  "BpeEncoder::decode(encode(x)) == x for " + quoted(text.substr(0, 40)));
    check_verbose(tokenizer.decode(ids) == text,
                  "Tokenizer::decode(encode(x)) == x for " + quoted(text.substr(0, 40)));
  }
}

void test_tiny_shakespeare(llmc::BpeEncoder& encoder, const llmc::Tokenizer& tokenizer) {
  const char* path = getenv("TINYSHAKESPEARE");
  if (!path || !*path) {
    printf("skipped tiny shakespeare: TINYSHAKESPEARE is not set (the path of its input.txt)\n");
    return;
  }
  const std::string text = llmc::read_text_file(path);
  llmc::BpeEncoder fresh = llmc::BpeEncoder::from_dir(kEncoderDir);  // an empty cache, for timing
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> ids = fresh.encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  printf("tiny shakespeare: %zu bytes -> %zu tokens in %.3f s\n", text.size(), ids.size(), seconds);
  check_verbose(ids.size() == 338025,
                llmc::strformat("tiny shakespeare is %zu tokens, tiktoken: 338025", ids.size()));
  check_verbose(ids == encoder.encode(text), "tiny shakespeare encodes the same with a warm cache");
  check_verbose(tokenizer.decode(ids) == text, "tiny shakespeare: decode(encode(text)) == text");
  check_verbose(seconds < 5.0,
                llmc::strformat("tiny shakespeare encodes in %.3f s (bound 5 s)", seconds));
}

void test_long_pieces(llmc::BpeEncoder& encoder) {
  // One piece of 200k bytes: the merge loop must not be quadratic.
  const std::string digits(200000, '9');
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> ids = encoder.encode(digits);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check_verbose(encoder.decode(ids) == digits && seconds < 2.0,
                llmc::strformat("a 200000-digit piece round trips, %zu tokens in %.3f s",
                                ids.size(), seconds));
}

void test_vocabulary_file(const llmc::BpeEncoder& encoder, const std::string& good_path) {
  llmc::Tokenizer tokenizer(good_path);
  check_verbose(tokenizer.vocab_size() == 50257 && tokenizer.eot_token() == 50256,
                llmc::strformat("vocabulary file: %d tokens, EOT %d", tokenizer.vocab_size(),
                                tokenizer.eot_token()));
  bool all_equal = true;
  for (int id = 0; id < encoder.vocab_size(); id++) {
    all_equal = all_equal && tokenizer.decode(id) == encoder.token_bytes()[id];
  }
  check_verbose(all_equal, "vocabulary file: every token's bytes read back as written");
  check_verbose(tokenizer.decode(15496) == "Hello" && tokenizer.decode(50256) == "<|endoftext|>",
                "decode(15496) == \"Hello\", decode(50256) == \"<|endoftext|>\"");
  check_throws([&] { tokenizer.decode(50257); }, "outside the vocabulary", "decode(50257)");
  check_throws([&] { tokenizer.decode(-1); }, "outside the vocabulary", "decode(-1)");

  const std::string good = llmc::read_text_file(good_path);
  auto with_header_int = [](std::string bytes, int index, int value) {
    memcpy(&bytes[4 * index], &value, 4);
    return bytes;
  };
  struct Malformed {
    std::string name, bytes, needle;
  };
  std::string zero_length = good;
  zero_length[1024] = 0;
  const std::vector<Malformed> malformed = {
      {"bad magic", with_header_int(good, 0, 20240326), "not a tokenizer vocabulary file"},
      {"bad version", with_header_int(good, 1, 3), "version 3 is not supported"},
      {"version 1, not 50257 tokens", with_header_int(with_header_int(good, 1, 1), 2, 100),
       "version 1 file has no EOT"},
      {"EOT out of range", with_header_int(good, 3, 50257), "EOT token id 50257 is outside"},
      {"vocabulary size 0", with_header_int(good, 2, 0), "implausible"},
      {"header only", good.substr(0, 1024), "truncated"},
      {"half a header", good.substr(0, 500), "truncated"},
      {"cut inside a token", good.substr(0, good.size() - 3), "truncated"},
      {"trailing bytes", good + "xyz", "3 bytes follow the last"},
      {"zero-length token", zero_length, "length 0"},
  };
  // A version 1 file of GPT-2's size is valid; its EOT is 50256.
  write_bytes(scratch_path("version1.bin"), with_header_int(good, 1, 1));
  check_verbose(llmc::Tokenizer(scratch_path("version1.bin")).eot_token() == 50256,
                "a version 1 file of 50257 tokens has EOT 50256");
  for (const Malformed& m : malformed) {
    const std::string path = scratch_path("malformed.bin");
    write_bytes(path, m.bytes);
    check_throws([&] { llmc::Tokenizer t(path); }, m.needle, "vocabulary file with " + m.name);
  }
  check_throws([&] { llmc::Tokenizer t(scratch_path("missing.bin")); }, "cannot open",
               "missing vocabulary file");
  check_throws(
      [&] { llmc::write_tokenizer_bin(scratch_path("long.bin"), {std::string(256, 'x')}, 0); },
      "stores 1..255", "writing a 256-byte token");
}

void test_utf8() {
  struct Valid {
    std::string bytes;
    uint32_t code_point;
  };
  for (const Valid& v : std::vector<Valid>{{"A", 0x41},
                                           {"\xC3\xA9", 0xE9},
                                           {"\xE2\x82\xAC", 0x20AC},
                                           {"\xF0\x9F\x98\x80", 0x1F600},
                                           {"\xF4\x8F\xBF\xBF", 0x10FFFF}}) {
    llmc::Utf8CodePoint d =
        llmc::utf8_decode(reinterpret_cast<const unsigned char*>(v.bytes.data()), v.bytes.size());
    check_verbose(
        d.status == llmc::Utf8Status::kValid && d.code_point == v.code_point &&
            d.length == (int)v.bytes.size(),
        llmc::strformat("utf8_decode %s = U+%04X", quoted(v.bytes).c_str(), v.code_point));
  }
  const std::vector<std::pair<std::string, std::string>> invalid = {
      {"abc\xFF", "at byte 3"},
      {"ab\xC0\xAF", "at byte 2"},            // overlong '/'
      {"a\xED\xA0\x80", "at byte 1"},         // surrogate U+D800
      {"xyz\xE2\x82", "cut off by the end"},  // truncated euro sign
      {"\xF4\x90\x80\x80", "at byte 0"},      // above U+10FFFF
      {"\x80", "at byte 0"},                  // lone continuation byte
  };
  for (const auto& bytes_and_needle : invalid) {
    const std::string& bytes = bytes_and_needle.first;
    check_throws([&] { llmc::utf8_validate(bytes); }, bytes_and_needle.second,
                 "invalid UTF-8 " + quoted(bytes));
  }

  llmc::Utf8Joiner joiner;
  std::string out = joiner.push("a\xF0\x9F");  // an emoji split across tokens
  out += "|" + joiner.push("\x98");
  out += "|" + joiner.push(
                   "\x80"
                   "b");
  out += "|" + joiner.push(
                   "\xFF"
                   "c\xE2\x82");
  out += "|" + joiner.finish();
  check_verbose(out ==
                    "a||\xF0\x9F\x98\x80"
                    "b|\xEF\xBF\xBD"
                    "c|\xEF\xBF\xBD",
                "Utf8Joiner holds cut-off characters and replaces invalid bytes: " + quoted(out));
}

void test_encoder_files() {
  const std::string encoder_json = std::string(kEncoderDir) + "/encoder.json";
  const std::string vocab_bpe = std::string(kEncoderDir) + "/vocab.bpe";
  std::string merges = llmc::read_text_file(vocab_bpe);
  // Swapping the first two merges gives both the wrong rank.
  size_t first = merges.find('\n') + 1, second = merges.find('\n', first) + 1;
  size_t third = merges.find('\n', second) + 1;
  std::string swapped = merges.substr(0, first) + merges.substr(second, third - second) +
                        merges.substr(first, second - first) + merges.substr(third);
  write_bytes(scratch_path("swapped.bpe"), swapped);
  check_throws([&] { llmc::BpeEncoder e(encoder_json, scratch_path("swapped.bpe")); },
               "rank 256 (merge on line 2) is not token id 256", "vocab.bpe with swapped merges");
  write_bytes(scratch_path("bad_line.bpe"), "#version: 0.2\nabc\n");
  check_throws([&] { llmc::BpeEncoder e(encoder_json, scratch_path("bad_line.bpe")); },
               "bad_line.bpe:2: expected two tokens", "vocab.bpe with a malformed line");
  write_bytes(scratch_path("no_eot.json"), "{\"!\": 0}");
  check_throws([&] { llmc::BpeEncoder e(scratch_path("no_eot.json"), vocab_bpe); },
               "has no <|endoftext|> token", "encoder.json without EOT");
  write_bytes(scratch_path("gap.json"), "{\"!\": 0, \"<|endoftext|>\": 2}");
  check_throws([&] { llmc::BpeEncoder e(scratch_path("gap.json"), vocab_bpe); },
               "token ids must be 0..1", "encoder.json with a gap in the ids");
  // The JSON itself is tested in test_json; here, that its errors name encoder.json.
  write_bytes(scratch_path("no_colon.json"), "{\"!\": 0,\n \"<|endoftext|>\" 1}");
  check_throws([&] { llmc::BpeEncoder e(scratch_path("no_colon.json"), vocab_bpe); },
               "no_colon.json:2:18: expected ':' after an object key (the file must be GPT-2's "
               "encoder.json", "encoder.json that is not JSON");
  write_bytes(scratch_path("array.json"), "[\"!\", \"<|endoftext|>\"]");
  check_throws([&] { llmc::BpeEncoder e(scratch_path("array.json"), vocab_bpe); },
               "array.json: the file holds an array", "encoder.json that is not an object");
  for (const char* id : {"-1", "0.5", "\"1\"", "1e9"}) {
    write_bytes(scratch_path("bad_id.json"),
                std::string("{\"!\": 0, \"<|endoftext|>\": ") + id + "}");
    check_throws([&] { llmc::BpeEncoder e(scratch_path("bad_id.json"), vocab_bpe); },
                 "token ids must be 0..1, each once; '<|endoftext|>' has id",
                 std::string("encoder.json with the id ") + id);
  }
  check_throws([&] { llmc::BpeEncoder::from_dir("no/such/dir"); }, "no/such/dir/encoder.json",
               "missing encoder directory");
}

}  // namespace

// The prefix table as record #89's reference builds it from tiktoken's ranks: the byte strings in
// sorted order, a stack of the current one's prefixes that are tokens, its top the longest.
std::vector<int> sorted_prefix_table(const std::vector<std::string>& tokens, int eot_token, int rows) {
  std::vector<std::pair<std::string, int>> sorted;
  for (int id = 0; id < (int)tokens.size(); id++) {
    if (id != eot_token) sorted.emplace_back(tokens[id], id);
  }
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> table(rows, -1);
  std::vector<std::pair<std::string, int>> stack;
  for (const auto& [bytes, id] : sorted) {
    while (!stack.empty() && bytes.compare(0, stack.back().first.size(), stack.back().first) != 0) stack.pop_back();
    if (!stack.empty()) table[id] = stack.back().second;
    stack.emplace_back(bytes, id);
  }
  return table;
}

// llmc::token_prefix_table of GPT-2's vocabulary (encoder.json's and the vocabulary file's, 50,304
// rows as the padded head) against the reference's construction; a few entries by their text; the
// count of tokens with a prefix and a checksum, sum of id * prefix, which test_train_gpt2_py.sh
// holds train_gpt2.py's table to.
void test_prefix_table(llmc::BpeEncoder& encoder, const llmc::Tokenizer& tokenizer) {
  constexpr int kRows = 50304;
  const std::vector<int> table = llmc::token_prefix_table(tokenizer.token_bytes(), tokenizer.eot_token(), kRows);
  check_verbose(table == sorted_prefix_table(encoder.token_bytes(), encoder.eot_token(), kRows),
                "prefix table: the vocabulary file's, as the reference builds it from the sorted byte strings");
  check_verbose(table == llmc::token_prefix_table(encoder.token_bytes(), encoder.eot_token(), kRows),
                "prefix table: encoder.json's tokens give the vocabulary file's");
  const auto id = [&](const char* text) { return encoder.encode(text).at(0); };
  const std::vector<std::pair<const char*, const char*>> pairs = {
      {" the", " th"}, {" th", " t"}, {" t", " "}, {"the", "th"}, {" gazed", " gaze"}};
  for (const auto& [token, prefix] : pairs) {
    check_verbose(table[id(token)] == id(prefix), llmc::strformat("prefix of \"%s\" is \"%s\"", token, prefix));
  }
  int with_prefix = 0, byte_tokens_without = 0;
  long long checksum = 0;
  for (int t = 0; t < kRows; t++) {
    if (table[t] >= 0) with_prefix++, checksum = (checksum + (long long)t * table[t]) % 1000000007;
    if (t < (int)tokenizer.token_bytes().size() && tokenizer.token_bytes()[t].size() == 1) byte_tokens_without += table[t] < 0;
  }
  const bool tail_empty = std::all_of(table.begin() + tokenizer.eot_token(), table.end(), [](int p) { return p < 0; });
  check_verbose(byte_tokens_without == 256 && tail_empty,
                "prefix table: none for the 256 byte tokens, the end-of-text token and the padded rows");
  check_verbose(with_prefix == 50000 && checksum == 641303553,
                llmc::strformat("prefix table: %d tokens with a prefix (50,000), checksum %lld (641303553)", with_prefix,
                                checksum));
}

int main() {
  try {
    const auto start = std::chrono::steady_clock::now();
    llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(kEncoderDir);
    printf("loaded %s in %.3f s\n", kEncoderDir,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    const std::string vocabulary_path = scratch_path("gpt2_tokenizer.bin");
    llmc::write_tokenizer_bin(vocabulary_path, encoder.token_bytes(), encoder.eot_token());
    llmc::Tokenizer tokenizer(vocabulary_path);

    test_known_encodings(encoder);
    test_pieces();
    test_round_trips(encoder, tokenizer);
    test_long_pieces(encoder);
    test_vocabulary_file(encoder, vocabulary_path);
    test_utf8();
    test_encoder_files();
    test_tiny_shakespeare(encoder, tokenizer);
    test_prefix_table(encoder, tokenizer);
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_tokenizer");
}
