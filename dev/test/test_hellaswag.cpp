// Tests llmc/hellaswag.h and build/hellaswag: converting dev/test/hellaswag_sample.jsonl (escapes,
// surrogate pairs, raw UTF-8, extra and nested fields) and reading it back against GPT-2's
// encoder, every malformed jsonl line, tokenization and file error, the rows the model runs,
// scoring (acc and acc_norm, including an example where they disagree) and the rank split.
// Run from the repository root; scratch files go to build/test_tmp/hellaswag.
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/hellaswag.h"
#include "llmc/tokenizer.h"

using llmc::HellaSwagExample;
using llmc::HellaSwagRows;
using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const char* kEncoderDir = "dev/data/gpt2";
const char* kSamplePath = "dev/test/hellaswag_sample.jsonl";
const std::string kDir = "build/test_tmp/hellaswag";
const int kVocabSize = llmc::kGpt2VocabSize;

std::string ids_text(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); i++) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  llmc::File f(path, "wb");
  f.write(bytes.data(), bytes.size(), "test data");
  f.close();
}

// ----------------------------------------------------------------------------------------------
// The sample file, converted and read back

// What dev/test/hellaswag_sample.jsonl holds, written out independently of the JSON parser:
// the escapes there as C++ escapes or raw UTF-8 here.
struct ExpectedExample {
  int line;
  int label;
  std::string context;
  std::array<std::string, 4> endings;
};

const std::vector<ExpectedExample>& expected_sample() {
  static const std::vector<ExpectedExample> examples = {
      {1, 0, "A woman stands in a kitchen holding a whisk. she",
       {"beats three eggs in a glass bowl.", "throws the whisk at the ceiling fan.",
        "sings into the whisk like a microphone.", "paints the cabinets bright green."}},
      {2, 1, "The coach shouts \"Faster!\" at the runners. they",
       {"stop and sit on the grass\\mud.", "speed up along the track / road.",
        "turn around and walk home\tslowly.", "say \"no\" and leave."}},
      {3, 2, "At the caf\u00e9, Zo\u00eb slices a cr\u00e8me br\u00fbl\u00e9e\u2026",
       {"and serves it with \u5bff\u53f8 on the side.", "then drops it on the floor \U0001F62C.",
        "and decorates it with a tiny \U0001F389 flag.", "before na\u00efvely eating the spoon."}},
      {4, 3, "A man pours hot water \u2014 carefully \u2014 into a cup. he",
       {"adds caf\u00e9 au lait and stirs.", "smiles \U0001F600 at the camera.",
        "writes \u4e2d\u6587 on the mug.", "adds a tea bag and waits for it to steep."}},
      {5, 3,
       "[header] How to repot a cactus [title] Wear thick gloves.\n[step] Cactus spines can be "
       "sharp.",
       {"[title] Water the cactus daily. [step] It's a desert plant.",
        "[title] Paint the pot.\n[step] Use 3 colors.",
        "[title] Sing to it. [step] Cactuses like music.",
        "[title] Choose a pot one size larger. [step] Make sure it has a drainage hole."}},
      {6, 2, "Two children play soccer in a park. They",
       {"run off the field.", "eat the ball.", "kick the ball into the goal.", "fly away."}},
      {7, 1, "Two dogs run across a snowy field.",
       {"", "They chase each other and roll in the snow.", "The snow turns into sand.",
        "<|endoftext|> then nothing."}},
      {8, 0, "It's the end of the month and she has $1,000. she",
       {"pays the rent of $950 and saves the rest.", "buys 1,000,000 balloons.",
        "spends it on a \b\f\r control-character party.", "prints more money."}},
  };
  return examples;
}

void test_sample(llmc::BpeEncoder& encoder) {
  const std::vector<ExpectedExample>& expected = expected_sample();
  const std::string text = llmc::read_text_file(kSamplePath);
  const std::vector<llmc::HellaSwagText> records = llmc::hellaswag_parse_jsonl(text, kSamplePath);
  check_verbose(records.size() == expected.size(),
                llmc::strformat("%zu records parsed from %s", records.size(), kSamplePath));
  bool all_same = records.size() == expected.size();
  for (size_t i = 0; i < records.size() && i < expected.size(); i++) {
    bool same = records[i].line == expected[i].line && records[i].label == expected[i].label &&
                records[i].context == expected[i].context;
    for (int k = 0; k < 4; k++) same = same && records[i].endings[k] == expected[i].endings[k];
    check(same, llmc::strformat("record %zu: line, label, ctx and endings as written", i));
    all_same = all_same && same;
  }
  check_verbose(all_same, "every record's strings as written: escapes \\\" \\\\ \\/ \\t \\n "
                          "\\b \\f \\r, \\u00e9, surrogate pair \\ud83d\\ude00, raw UTF-8, "
                          "extra fields");

  const std::vector<HellaSwagExample> examples = llmc::hellaswag_tokenize(
      records, kSamplePath, [&](std::string_view s) { return encoder.encode(s); });
  const std::string path = kDir + "/sample.bin";
  llmc::hellaswag_write(path, examples);

  // The header and size, from the expected token counts alone.
  long total_bytes = 0, longest_bytes = 0;
  int longest_row = 0;
  for (const ExpectedExample& e : expected) {
    long fields = 6 + (long)encoder.encode(e.context).size();
    for (const std::string& ending : e.endings) {
      const int n = (int)encoder.encode(" " + ending).size();
      fields += 1 + n;
      longest_row = std::max(longest_row, (int)encoder.encode(e.context).size() + n);
    }
    total_bytes += 2 * fields;
    longest_bytes = std::max(longest_bytes, 2 * fields);
  }
  const std::string bytes = llmc::read_text_file(path);
  int32_t header[4];
  memcpy(header, bytes.data(), sizeof(header));
  check_verbose(header[0] == 20240522 && header[1] == 1 && header[2] == (int)expected.size() &&
                    header[3] == longest_bytes,
                llmc::strformat("header: magic %d version %d examples %d longest %d bytes "
                                "(expected %ld)", header[0], header[1], header[2], header[3],
                                longest_bytes));
  check_verbose((long)bytes.size() == 1024 + total_bytes,
                llmc::strformat("file size %zu = 1024 + %ld", bytes.size(), total_bytes));

  const llmc::HellaSwagSet set = llmc::hellaswag_read(path, kVocabSize);
  check_verbose(set.examples.size() == expected.size() && set.longest_row == longest_row,
                llmc::strformat("read back %zu examples, longest row %d tokens (expected %d)",
                                set.examples.size(), set.longest_row, longest_row));
  for (size_t i = 0; i < set.examples.size() && i < expected.size(); i++) {
    const HellaSwagExample& got = set.examples[i];
    const ExpectedExample& want = expected[i];
    check(got.index == (int)i && got.label == want.label,
          llmc::strformat("example %zu: index %d label %d (expected label %d)", i, got.index,
                          got.label, want.label));
    const std::vector<int> context = encoder.encode(want.context);
    check(got.context == context, llmc::strformat("example %zu: context %s == encode(ctx) %s", i,
                                                  ids_text(got.context).c_str(),
                                                  ids_text(context).c_str()));
    check(encoder.decode(got.context) == want.context,
          llmc::strformat("example %zu: context decodes to ctx", i));
    for (int k = 0; k < 4; k++) {
      const std::vector<int> ending = encoder.encode(" " + want.endings[k]);
      check(got.endings[k] == ending,
            llmc::strformat("example %zu ending %d: %s == encode(\" \" + ending) %s", i, k,
                            ids_text(got.endings[k]).c_str(), ids_text(ending).c_str()));
    }
  }
  check_verbose(set.examples.size() == 8 && set.examples[6].endings[0] == std::vector<int>{220},
                "an empty ending is the single token \" \" (220)");
  bool no_eot = true;
  for (int id : set.examples[6].endings[3]) no_eot = no_eot && id != llmc::kGpt2EotToken;
  check_verbose(no_eot, "\"<|endoftext|>\" in an ending is plain text, not the EOT token");
}

// build/hellaswag writes the same bytes as the functions above and fails cleanly on bad flags.
void test_command_line() {
  const char* tool = "build/hellaswag";
  if (!llmc::file_exists(tool)) {
    check(false, "build/hellaswag exists (build it with make)");
    return;
  }
  const std::string out = kDir + "/cli.bin", log = kDir + "/cli.log";
  auto run = [&](const std::string& args) {
    const std::string command = std::string(tool) + " " + args + " > " + log + " 2>&1";
    const int status = system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  const int status = run(std::string("--input ") + kSamplePath + " --output " + out);
  check_verbose(status == 0 && llmc::read_text_file(out) ==
                                   llmc::read_text_file(kDir + "/sample.bin"),
                "build/hellaswag --input sample --output FILE: same bytes as hellaswag_write");
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      {std::string("--input ") + kSamplePath, "--output FILE.bin is required"},
      {"--output " + out, "--input FILE.jsonl is required"},
      {"--input build/test_tmp/hellaswag/missing.jsonl --output " + out, "cannot open"},
      {std::string("--input ") + kSamplePath + " --output " + out + " --bogus 1",
       "unknown flag '--bogus'"},
      {std::string("--input ") + kSamplePath + " --output " + out + " --encoder_dir nowhere",
       "nowhere/encoder.json"},
      {std::string("--input ") + kSamplePath + " --output", "--output needs a value"},
  };
  for (const Case& c : cases) {
    const int code = run(c.args);
    const std::string output = llmc::read_text_file(log);
    const bool ok = code == 1 && output.rfind("error: ", 0) == 0 &&
                    output.find(c.needle) != std::string::npos;
    if (!ok) printf("     (exit %d, output: %s)\n", code, output.c_str());
    check(ok, "build/hellaswag " + c.args + " -> exit 1, error mentioning '" + c.needle + "'");
  }
}

// ----------------------------------------------------------------------------------------------
// Malformed jsonl

void test_jsonl_errors() {
  const std::string good =
      "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 1}";
  // Each bad line follows a good one and a blank line, so its errors must name line 3.
  struct Case {
    std::string line, needle;
  };
  const std::vector<Case> cases = {
      {"not json", "expected a value"},
      {"[1, 2]", "the line is an array, not an object"},
      {"\"text\"", "the line is a string, not an object"},
      {"{\"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 1}", "no \"ctx\" field"},
      {"{\"ctx\": \"c\", \"label\": 1}", "no \"endings\" field"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"]}", "no \"label\" field"},
      {"{\"ctx\": 5, \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 1}",
       "\"ctx\" is a number, not a string"},
      {"{\"ctx\": \"c\", \"endings\": \"abcd\", \"label\": 1}", "\"endings\" is a string"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\"], \"label\": 1}",
       "\"endings\" has 3 entries, not 4"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\", \"e\"], \"label\": 1}",
       "\"endings\" has 5 entries, not 4"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", null, \"c\", \"d\"], \"label\": 1}",
       "ending 1 is null, not a string"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 4}",
       "\"label\" is 4: it must be an integer from 0 to 3"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": -1}",
       "\"label\" is -1"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 1.5}",
       "\"label\" is 1.5"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": \"1\"}",
       "\"label\" is a string"},
      {"{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 1} x",
       "unexpected text after the JSON value"},
      {"{\"ctx\": \"c\", \"label\": 1,}", "expected a string key"},
      {"{\"ctx\" \"c\"}", "expected ':' after an object key"},
      {"{\"ctx\": \"c\" \"label\": 1}", "expected '}' or ',' in an object"},
      {"{\"endings\": [\"a\" \"b\"]}", "expected ']' or ',' in an array"},
      {"{\"ctx\": \"unterminated}", "the text ends inside a string"},
      {"{\"ctx\": \"bad \\x escape\"}", "\\x is not a JSON escape"},
      {"{\"ctx\": \"\\u12G4\"}", "expected four hex digits after \\u"},
      {"{\"ctx\": \"\\ud83d alone\"}", "high surrogate not followed by a \\u low surrogate"},
      {"{\"ctx\": \"\\ud83d\\u0041\"}", "followed by \\u0041, not a low surrogate"},
      {"{\"ctx\": \"\\ude00\"}", "low surrogate without a high one"},
      {"{\"ctx\": \"tab\there\"}", "raw control character 0x09"},
      {"{\"ctx\": \"bad \xC3\x28 byte\"}", "invalid UTF-8 inside a string"},
      {"{\"ctx\": \"cut \xE2\x82\"}", "invalid UTF-8 inside a string"},
      {"{\"n\": 012}", "leading zero"},
      {"{\"n\": 1.}", "expected a digit after a decimal point"},
      {"{\"n\": 1e}", "expected a digit in an exponent"},
      {"{\"n\": -}", "expected a digit in a number"},
      {"{\"n\": tru}", "expected a value"},
      {"{\"ctx\": ", "the text ends where a value should start"},
      {std::string(100, '[') + std::string(100, ']'), "nested deeper than 64 levels"},
  };
  for (const Case& c : cases) {
    check_throws([&] { llmc::hellaswag_parse_jsonl(good + "\n\n" + c.line + "\n", "bad.jsonl"); },
                 c.needle, "jsonl line '" + c.line.substr(0, 50) + "'");
    check_throws([&] { llmc::hellaswag_parse_jsonl(good + "\n\n" + c.line + "\n", "bad.jsonl"); },
                 "bad.jsonl:3", "  ...names the file and line");
  }

  // Accepted: CRLF line ends, a last line without a newline, blank lines, any member order,
  // repeated keys (the last wins, as in Python), numbers in every JSON form in other fields.
  const std::string text =
      "\n" + good + "\r\n  \n"
      "{\"label\": 0, \"label\": 3, \"x\": [-0.5e+10, 0, 1E2, true, false, null, {}], "
      "\"endings\": [\"\\u0041\", \"\\\\\", \"\\/\", \"\\\"\"], \"ctx\": \"\\uD83D\\uDE00\"}";
  const auto records = llmc::hellaswag_parse_jsonl(text, "good.jsonl");
  check_verbose(records.size() == 2 && records[0].line == 2 && records[1].line == 4 &&
                    records[1].label == 3 && records[1].context == "\U0001F600" &&
                    records[1].endings[0] == "A" && records[1].endings[1] == "\\" &&
                    records[1].endings[2] == "/" && records[1].endings[3] == "\"",
                "CRLF, blank lines, no final newline, repeated key, member order, escapes");
  check_verbose(llmc::hellaswag_parse_jsonl("\n \n", "empty.jsonl").empty(),
                "a file of blank lines has no records");
}

// ----------------------------------------------------------------------------------------------
// Tokenization errors (a stand-in encoder makes the cases the GPT-2 encoder cannot)

void test_tokenize_errors(llmc::BpeEncoder& encoder) {
  const auto records = llmc::hellaswag_parse_jsonl(
      "{\"ctx\": \"c\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 1}\n"
      "{\"ctx\": \"\", \"endings\": [\"a\", \"b\", \"c\", \"d\"], \"label\": 2}\n",
      "t.jsonl");
  check_throws([&] {
    llmc::hellaswag_tokenize(records, "t.jsonl",
                             [&](std::string_view s) { return encoder.encode(s); });
  }, "t.jsonl:2: the context encodes to no tokens", "an empty ctx");
  const std::vector<llmc::HellaSwagText> first(records.begin(), records.begin() + 1);
  check_throws([&] {
    llmc::hellaswag_tokenize(first, "t.jsonl",
                             [](std::string_view) { return std::vector<int>{5, 70000}; });
  }, "t.jsonl:1: the context has token id 70000, outside 0..65534", "a token id over 65534");
  check_throws([&] {
    llmc::hellaswag_tokenize(first, "t.jsonl", [](std::string_view s) {
      return s == " b" ? std::vector<int>{65535} : std::vector<int>{7};
    });
  }, "t.jsonl:1: ending 1 has token id 65535", "the delimiter as a token id");
  check_throws([&] {
    llmc::hellaswag_tokenize(first, "t.jsonl",
                             [](std::string_view) { return std::vector<int>(8000, 1); });
  }, "t.jsonl:1: the example takes 80020 bytes, over the format's 65535", "an example too long");
  check_throws([&] {
    llmc::hellaswag_tokenize(first, "t.jsonl", [](std::string_view) -> std::vector<int> {
      LLMC_FAIL("the encoder failed");
    });
  }, "t.jsonl:1: ctx: the encoder failed", "an encoder error names the line and field");
  const std::vector<llmc::HellaSwagText> too_many(65536, records[0]);
  check_throws([&] {
    llmc::hellaswag_tokenize(too_many, "t.jsonl",
                             [](std::string_view) { return std::vector<int>{1}; });
  }, "t.jsonl holds 65536 examples, over the eval file's 65535", "too many examples");
}

// ----------------------------------------------------------------------------------------------
// The eval file: writer checks and every reader error

// Two small examples; example 0's stream (uint16 offsets from byte 1024):
//   0 delimiter, 1 bytes, 2 index, 3 label, 4 completions, 5 context length, 6-8 context,
//   9 len, 10 ending 0, 11 len, 12-13 ending 1, 14 len, 15-17 ending 2, 18 len, 19 ending 3.
std::vector<HellaSwagExample> small_examples() {
  HellaSwagExample a;
  a.index = 0;
  a.label = 2;
  a.context = {1, 2, 3};
  a.endings = {std::vector<int>{10}, {20, 21}, {30, 31, 32}, {40}};
  HellaSwagExample b;
  b.index = 1;
  b.label = 0;
  b.context = {5};
  b.endings = {std::vector<int>{50256}, {60, 61}, {70}, {80}};
  return {a, b};
}

void set_u16(std::string* bytes, int field, int value) {
  const uint16_t v = (uint16_t)value;
  memcpy(&(*bytes)[1024 + 2 * field], &v, 2);
}

void set_i32(std::string* bytes, int index, int value) {
  memcpy(&(*bytes)[4 * index], &value, 4);
}

void test_file() {
  const std::string path = kDir + "/small.bin";
  llmc::hellaswag_write(path, small_examples());
  const llmc::HellaSwagSet set = llmc::hellaswag_read(path, kVocabSize);
  const std::vector<HellaSwagExample> written = small_examples();
  bool same = set.examples.size() == 2 && set.longest_row == 6;
  for (size_t i = 0; same && i < 2; i++) {
    const HellaSwagExample& want = written[i];
    same = set.examples[i].index == want.index && set.examples[i].label == want.label &&
           set.examples[i].context == want.context && set.examples[i].endings == want.endings;
  }
  check_verbose(same, "small file round trip: tokens, labels, indices, longest_row 6");
  const std::string good = llmc::read_text_file(path);
  check_verbose(good.size() == 1024 + 40 + 32, "small file: 1024 + 40 + 32 bytes");

  struct Case {
    const char* what;
    std::string bytes;
    std::string needle;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, const std::string& needle, auto change) {
    std::string bytes = good;
    change(&bytes);
    cases.push_back({what, bytes, needle});
  };
  add("bad magic", "magic number 20240520 is not 20240522", [](std::string* b) {
    set_i32(b, 0, 20240520);
  });
  add("bad version", "version 2 is not 1", [](std::string* b) { set_i32(b, 1, 2); });
  add("no examples", "example count 0 is not 1 to 65535", [](std::string* b) { set_i32(b, 2, 0); });
  add("more examples than the file holds", "the file is truncated",
      [](std::string* b) { set_i32(b, 2, 3); });
  add("longest bytes wrong", "the header says the longest example takes 42 bytes, it takes 40",
      [](std::string* b) { set_i32(b, 3, 42); });
  add("longest bytes out of range", "longest example, 0 bytes", [](std::string* b) {
    set_i32(b, 3, 0);
  });
  add("cut inside the header", "file is truncated", [](std::string* b) { b->resize(1000); });
  add("cut inside example 1", "it ends at byte 1084, in example 1 of 2",
      [](std::string* b) { b->resize(1084); });
  add("odd size", "an odd number", [](std::string* b) { b->push_back('\0'); });
  add("trailing example data", "2 bytes follow the last of the header's 2 examples",
      [](std::string* b) { b->append(2, '\0'); });
  add("bad delimiter", "example 0 (at byte 1024): it starts with 65534, not the delimiter 65535",
      [](std::string* b) { set_u16(b, 0, 65534); });
  add("bad delimiter of example 1", "example 1 (at byte 1064)",
      [](std::string* b) { set_u16(b, 20, 0); });
  add("byte length wrong", "its byte length says 38, its fields take 40",
      [](std::string* b) { set_u16(b, 1, 38); });
  add("index wrong", "its index is 5", [](std::string* b) { set_u16(b, 2, 5); });
  add("label out of range", "its label is 4, not 0 to 3", [](std::string* b) { set_u16(b, 3, 4); });
  add("3 completions", "it has 3 completions, not 4", [](std::string* b) { set_u16(b, 4, 3); });
  add("empty context", "its context has no tokens", [](std::string* b) { set_u16(b, 5, 0); });
  add("empty ending", "its ending 0 has no tokens", [](std::string* b) { set_u16(b, 9, 0); });
  add("token outside the vocabulary", "its ending 2 has token id 50257, outside the model's "
      "vocabulary of 50257", [](std::string* b) { set_u16(b, 16, 50257); });
  for (const Case& c : cases) {
    const std::string bad = kDir + "/bad.bin";
    write_bytes(bad, c.bytes);
    check_throws([&] { llmc::hellaswag_read(bad, kVocabSize); }, c.needle,
                 std::string("eval file: ") + c.what);
  }
  write_bytes(kDir + "/empty.bin", "");
  check_throws([&] { llmc::hellaswag_read(kDir + "/empty.bin", kVocabSize); },
               "empty.bin: file is truncated: reading the header", "an empty eval file");
  check_throws([&] { llmc::hellaswag_read(kDir + "/missing.bin", kVocabSize); },
               "cannot open build/test_tmp/hellaswag/missing.bin", "a missing eval file");
  check_throws([&] { llmc::hellaswag_read(path, 50); },
               "example 1: its ending 0 has token id 50256, outside the model's vocabulary of 50",
               "a vocabulary smaller than the file's ids");

  check_throws([&] { llmc::hellaswag_write(kDir + "/none.bin", {}); }, "no examples to write",
               "writing no examples");
  std::vector<HellaSwagExample> bad_label = small_examples();
  bad_label[1].label = 7;
  check_throws([&] { llmc::hellaswag_write(kDir + "/w.bin", bad_label); },
               "w.bin: example 1: label 7 is not 0 to 3", "writing a bad label");
  std::vector<HellaSwagExample> bad_id = small_examples();
  bad_id[0].endings[3] = {-1};
  check_throws([&] { llmc::hellaswag_write(kDir + "/w.bin", bad_id); },
               "example 0: ending 3 has token id -1", "writing a negative token id");
}

// ----------------------------------------------------------------------------------------------
// Rows and scoring

void test_rows() {
  const HellaSwagExample example = small_examples()[0];  // context 1 2 3, label 2
  const HellaSwagRows rows = llmc::hellaswag_rows(example, 7);
  const std::vector<int> inputs = {1, 2, 3, 10, 0,  0,  0,   // ending 0: 10
                                   1, 2, 3, 20, 21, 0,  0,   // ending 1: 20 21
                                   1, 2, 3, 30, 31, 32, 0,   // ending 2: 30 31 32
                                   1, 2, 3, 40, 0,  0,  0};
  const std::vector<int> targets = {2, 3, 10, 0,  0,  0,  0,
                                    2, 3, 20, 21, 0,  0,  0,
                                    2, 3, 30, 31, 32, 0,  0,
                                    2, 3, 40, 0,  0,  0,  0};
  const std::vector<uint8_t> mask = {0, 0, 1, 0, 0, 0, 0,
                                     0, 0, 1, 1, 0, 0, 0,
                                     0, 0, 1, 1, 1, 0, 0,
                                     0, 0, 1, 0, 0, 0, 0};
  check_verbose(rows.T == 7 && rows.label == 2 && rows.example_index == 0,
                "rows: T, label and example index");
  check_verbose(rows.inputs == inputs, "rows: inputs are context + ending, padded with 0");
  check_verbose(rows.targets == targets, "rows: targets are the inputs shifted by one");
  check_verbose(rows.mask == mask, "rows: the mask marks the positions predicting the ending");
  const HellaSwagRows exact = llmc::hellaswag_rows(example, 6);
  check_verbose(exact.inputs[2 * 6 + 5] == 32 && exact.targets[2 * 6 + 4] == 32 &&
                    exact.mask[2 * 6 + 4] == 1 && exact.mask[2 * 6 + 5] == 0,
                "rows: context + ending of exactly T tokens fits");
  check_throws([&] { llmc::hellaswag_rows(example, 5); },
               "HellaSwag example 0: context + ending 2 take 6 tokens, more than the sequence "
               "length 5", "rows: T shorter than context + ending");
  HellaSwagExample no_context = example;
  no_context.context.clear();
  check_throws([&] { llmc::hellaswag_rows(no_context, 8); }, "context encodes to no tokens",
               "rows: an example without context");
}

// Losses for the 4 rows: `ending_losses[i]` on row i's masked positions, in order; every other
// position gets `elsewhere`, which must not matter.
std::vector<float> make_losses(const HellaSwagRows& rows,
                               const std::array<std::vector<float>, 4>& ending_losses,
                               float elsewhere) {
  std::vector<float> losses(4 * rows.T, elsewhere);
  for (int i = 0; i < 4; i++) {
    size_t next = 0;
    for (int t = 0; t < rows.T; t++) {
      if (rows.mask[i * rows.T + t]) losses[i * rows.T + t] = ending_losses[i].at(next++);
    }
  }
  return losses;
}

void test_scoring() {
  const HellaSwagExample example = small_examples()[0];  // endings of 1, 2, 3, 1 tokens; label 2
  const HellaSwagRows rows = llmc::hellaswag_rows(example, 8);
  struct Case {
    const char* what;
    std::array<std::vector<float>, 4> losses;
    float elsewhere;
    int predicted, predicted_norm;
  };
  const std::vector<Case> cases = {
      // sums 5, 4, 1.5, 3: both pick ending 2.
      {"both pick the label", {{{5}, {2, 2}, {0.5f, 0.5f, 0.5f}, {3}}}, 100.0f, 2, 2},
      // sums 2.5, 3, 4.5, 4; means 2.5, 1.5, 1.5, 4: acc picks ending 0, acc_norm ending 1
      // (the first of two equal means).
      {"acc and acc_norm differ", {{{2.5f}, {1.5f, 1.5f}, {1.5f, 1.5f, 1.5f}, {4}}}, 0.0f, 0, 1},
      // sums 3, 4, 3.3, 9; means 3, 2, 1.1, 9: acc picks 0, acc_norm the label.
      {"acc_norm right, acc wrong", {{{3}, {2, 2}, {1.1f, 1.1f, 1.1f}, {9}}}, -50.0f, 0, 2},
      // NaN everywhere outside the mask, and in ending 0: a NaN row is never the pick.
      {"NaN outside the mask and in one ending", {{{NAN}, {1, 1}, {0.9f, 0.9f, 0.9f}, {2.5f}}},
       NAN, 1, 2},
      // Endings 0 and 3 tie on both sums and means: the first wins, as with torch.argmin.
      {"ties go to the first ending", {{{2}, {3, 3}, {4, 4, 4}, {2}}}, 7.0f, 0, 0},
  };
  for (const Case& c : cases) {
    const std::vector<float> losses = make_losses(rows, c.losses, c.elsewhere);
    const llmc::HellaSwagResult r = llmc::hellaswag_score(rows, losses);
    check_verbose(r.predicted == c.predicted && r.predicted_norm == c.predicted_norm &&
                      r.label == 2 && r.example_index == 0,
                  llmc::strformat("score, %s: acc picks %d (expected %d), acc_norm %d (expected "
                                  "%d)", c.what, r.predicted, c.predicted, r.predicted_norm,
                                  c.predicted_norm));
  }
  // The pointer form reads one example's losses out of a larger batch.
  std::vector<float> batch(3 * 4 * rows.T, 99.0f);
  const std::vector<float> second = make_losses(rows, cases[1].losses, 0.0f);
  std::copy(second.begin(), second.end(), batch.begin() + 4 * rows.T);
  const llmc::HellaSwagResult from_batch = llmc::hellaswag_score(rows, batch.data() + 4 * rows.T);
  check_verbose(from_batch.predicted == 0 && from_batch.predicted_norm == 1,
                "score from a slice of a larger batch");
  check_throws([&] { llmc::hellaswag_score(rows, std::vector<float>(4 * rows.T - 1)); },
               "31 losses given for example 0, expected one per position of its 4 rows of 8: 32",
               "score with the wrong number of losses");

  // A stand-in model whose loss at t depends only on targets[t]: cheap for the ending tokens,
  // 100 for anything else (context tokens, padding). Ending sums 5, 2, 0.6, 3 pick ending 2 for
  // both; a mask or targets off by one position would pull in a 100 and change the picks.
  auto loss_of_target = [](int token) {
    switch (token) {
      case 10: return 5.0f;
      case 20: case 21: return 1.0f;
      case 30: case 31: case 32: return 0.2f;
      case 40: return 3.0f;
      default: return 100.0f;
    }
  };
  std::vector<float> by_target(4 * rows.T);
  for (size_t i = 0; i < by_target.size(); i++) by_target[i] = loss_of_target(rows.targets[i]);
  const llmc::HellaSwagResult toy = llmc::hellaswag_score(rows, by_target);
  check_verbose(toy.predicted == 2 && toy.predicted_norm == 2,
                "score with loss = f(target): sums over exactly the ending's own tokens");

  llmc::HellaSwagCounts counts;
  counts.add(llmc::HellaSwagResult{0, 2, 2, 2});
  counts.add(llmc::HellaSwagResult{1, 1, 0, 1});
  counts.add(llmc::HellaSwagResult{2, 3, 0, 1});
  counts.add(llmc::HellaSwagResult{3, 0, 0, 3});
  check_verbose(counts.examples == 4 && counts.correct == 2 && counts.correct_norm == 2 &&
                    counts.acc() == 0.5 && counts.acc_norm() == 0.5,
                "counts: 4 examples, acc 2/4, acc_norm 2/4");
  check_verbose(llmc::HellaSwagCounts().acc_norm() == 0.0, "counts: acc_norm of nothing is 0");
}

// ----------------------------------------------------------------------------------------------
// Ranks

void test_ranks() {
  bool all_ok = true;
  for (int count : {0, 1, 7, 8, 10042}) {
    for (int world : {1, 2, 3, 8}) {
      std::vector<int> seen(count, 0);
      size_t smallest = (size_t)count, largest = 0;
      bool ascending_and_own = true;
      llmc::HellaSwagCounts total;
      for (int rank = 0; rank < world; rank++) {
        const std::vector<int> mine = llmc::hellaswag_rank_examples(count, rank, world);
        smallest = std::min(smallest, mine.size());
        largest = std::max(largest, mine.size());
        llmc::HellaSwagCounts counts;
        for (size_t k = 0; k < mine.size(); k++) {
          ascending_and_own = ascending_and_own && mine[k] % world == rank &&
                              (k == 0 || mine[k] > mine[k - 1]) && mine[k] < count;
          if (mine[k] >= 0 && mine[k] < count) seen[mine[k]]++;
          // A made-up result per example, the same whichever rank scores it.
          const int i = mine[k];
          counts.add(llmc::HellaSwagResult{i, i % 4, (i / 2) % 4, (i / 3) % 4});
        }
        total.add(counts);
      }
      bool once = true;
      llmc::HellaSwagCounts direct;
      for (int i = 0; i < count; i++) {
        once = once && seen[i] == 1;
        direct.add(llmc::HellaSwagResult{i, i % 4, (i / 2) % 4, (i / 3) % 4});
      }
      const bool ok = once && ascending_and_own && largest - smallest <= (count ? 1u : 0u) &&
                      total.examples == direct.examples && total.correct == direct.correct &&
                      total.correct_norm == direct.correct_norm;
      all_ok = all_ok && ok;
      check(ok, llmc::strformat("ranks: %d examples over %d ranks: each exactly once, sizes "
                                "%zu-%zu, summed counts equal one rank's", count, world,
                                smallest, largest));
    }
  }
  check_verbose(all_ok, "ranks: every example exactly once for 0, 1, 7, 8, 10042 examples over "
                      "1, 2, 3, 8 ranks; summed counts equal the single-rank counts");
  check_throws([] { llmc::hellaswag_rank_examples(10, 2, 2); }, "rank 2 of world 2",
               "ranks: rank == world");
  check_throws([] { llmc::hellaswag_rank_examples(10, 0, 0); }, "rank 0 of world 0",
               "ranks: world 0");
}

}  // namespace

int main() {
  llmc::make_dirs(kDir);
  try {
    llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(kEncoderDir);
    test_sample(encoder);
    test_command_line();
    test_jsonl_errors();
    test_tokenize_errors(encoder);
    test_file();
    test_rows();
    test_scoring();
    test_ranks();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_hellaswag");
}
