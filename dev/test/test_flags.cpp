// Tests llmc/flags.h: the shared flags' defaults, parsing and ranges, the messages for an unknown
// flag (and another program's flag), a stray word and a missing value, when the usage is asked
// for, a program's own flags after the shared ones, the flags a recipe sets, the sequence length,
// sample length, vocabulary file and batch that follow from the flags, the CUDA trainer's document
// flags against -t and -x and its window against the sequence length, AdamW's tensors' rows (-ar),
// the speedrun's init (-ri), the start-up table's box and the usage, both within kScreenWidth.
// Scratch files go to build/test_tmp/flags/.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/flags.h"

using llmc::Flag;
using llmc::TrainFlags;
using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const std::string kDir = "build/test_tmp/flags";

// A program with flags of its own, built the way the CUDA trainer builds its table.
struct ProgramFlags : TrainFlags {
  int hellaswag = 0;
  float temperature = 1.0f;
};

std::vector<Flag> program_flags(ProgramFlags& p) {
  return llmc::train_flags(
      p, {llmc::int_flag("-h", "HellaSwag", "1: HellaSwag", &p.hellaswag, 0, 1),
          llmc::float_flag("-temp", "temperature", "sampling temperature", &p.temperature, 0.0f,
                           FLT_MAX)});
}

bool parse(TrainFlags& f, const std::vector<std::string>& args) {
  return llmc::parse_flags(args, llmc::train_flags(f), "./prog");
}

const Flag* find(const std::vector<Flag>& flags, const std::string& name) {
  for (const Flag& f : flags) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// The defaults every trainer starts from (README.md's flag tables list them).
void test_defaults() {
  TrainFlags f;
  const std::vector<Flag> flags = llmc::train_flags(f);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"-i", "dev/data/tinyshakespeare/tiny_shakespeare_train_*.bin"},
      {"-j", "dev/data/tinyshakespeare/tiny_shakespeare_val_*.bin"},
      {"-e", "d12"}, {"-o", "none"}, {"-tk", "none"},
      {"-b", "4"}, {"-t", "0"}, {"-z", "-1"}, {"-l", "0.0003"}, {"-u", "0"}, {"-q", "0"},
      {"-k", "cosine"}, {"-c", "0.1"}, {"-gc", "1"}, {"-x", "-1"}, {"-v", "20"}, {"-m", "20"},
      {"-s", "20"}, {"-g", "0"}, {"-a", "0"}, {"-S", "42"}};
  check_verbose(flags.size() == expected.size(),
                llmc::strformat("%zu shared flags (expected %zu)", flags.size(), expected.size()));
  for (const auto& e : expected) {
    const Flag* flag = find(flags, e.first);
    const std::string shown = flag ? flag->show() : "(missing)";
    check(shown == e.second, e.first + " defaults to " + e.second + ", not " + shown);
  }
  check_verbose(parse(f, {}), "no flags: the defaults");
}

void test_parsing() {
  TrainFlags f;
  check_verbose(parse(f, {"-b", "8", "-t", "64", "-z", "1099511627776", "-l", "6e-4", "-k", "wsd",
                          "-e", "tiny", "-o", "out", "-q", "0.1"}) &&
                    f.B == 8 && f.T == 64 && f.total_batch == 1099511627776L && f.lr == 6e-4f &&
                    f.schedule == "wsd" && f.model == "tiny" && f.output_dir == "out" &&
                    f.final_lr_frac == 0.1f,
                "values of every kind are set: int, long, float, schedule, text");
  check_verbose(parse(f, {"-b", "2", "-b", "3"}) && f.B == 3, "a flag given twice: the last wins");
  check_throws([&] { parse(f, {"-b", "0"}); }, "-b 0: must be at least 1", "-b below its range");
  check_throws([&] { parse(f, {"-q", "2"}); }, "-q 2: must be within [0, 1]", "-q above its range");
  check_throws([&] { parse(f, {"-a", "2"}); }, "-a 2: must be 0 or 1",
               "a switch other than 0 or 1");
  check_throws([&] { parse(f, {"-l", "-1e-3"}); }, "-l -0.001: must be at least 0",
               "a negative learning rate");
  check_throws([&] { parse(f, {"-x", "-2"}); }, "-x -2: must be at least -1", "-x below -1");
  check_throws([&] { parse(f, {"-b", "x"}); }, "-b 'x': not an integer", "a word for an integer");
  check_throws([&] { parse(f, {"-b", "4.5"}); }, "-b '4.5': not an integer",
               "a fraction for an integer");
  check_throws([&] { parse(f, {"-b", "99999999999"}); },
               "-b 99999999999: must be at most 2147483647", "an integer too large for an int");
  check_throws([&] { parse(f, {"-l", "abc"}); }, "-l 'abc': not a number", "a word for a number");
  check_throws([&] { parse(f, {"-l", "inf"}); }, "-l 'inf': not a number", "inf for a number");
  check_throws([&] { parse(f, {"-l", "nan"}); }, "-l 'nan': not a number", "nan for a number");
  check_throws([&] { parse(f, {"-k", "step"}); }, "unknown learning-rate schedule 'step' for -k",
               "an unknown schedule");
  double fraction = 0.0;
  const llmc::Flag kc = llmc::double_flag("-kc", "cooldown fraction", "a fraction", &fraction, 0.0, 1.0);
  kc.set("0.6");
  check_verbose(fraction == 0.6 && (float)fraction == 0.6f && fraction != (double)0.6f && kc.show() == "0.6",
                "a double flag reads 0.6 as the double nearest it (Python's float), not a float's");
  check_throws([&] { kc.set("1.5"); }, "-kc 1.5: must be within [0, 1]", "a double flag above its range");
  check_throws([&] { kc.set("1e999"); }, "-kc '1e999': not a number", "a double flag out of a double's range");
}

void test_messages() {
  TrainFlags f;
  check_throws([&] { parse(f, {"-bogus", "1"}); },
               "unknown flag '-bogus': ./prog --help lists the flags",
               "an unknown flag names the program's --help");
  check_throws([&] { parse(f, {"-i", "a.bin", "b.bin"}); },
               "'b.bin' is not a flag: flags start with '-' and take one value each (quote a glob "
               "pattern, -i 'dir/*.bin'",
               "a stray word (the shell expanded an unquoted glob)");
  check_throws([&] { parse(f, {"-l"}); },
               "flag -l needs a value: peak learning rate (--help for the usage)",
               "a flag without its value says what the value is, and where the usage is");
  const auto fail_foreign = [](const std::string& name) {
    if (name == "-opt") LLMC_FAIL("-opt is the other program's");
  };
  check_throws([&] { llmc::parse_flags({"-opt", "muon"}, llmc::train_flags(f), "./prog", fail_foreign); },
               "-opt is the other program's", "fail_foreign names a flag it knows");
  check_throws([&] { llmc::parse_flags({"-bogus", "1"}, llmc::train_flags(f), "./prog", fail_foreign); },
               "unknown flag '-bogus': ./prog --help lists the flags",
               "a flag fail_foreign lets pass is unknown");
}

void test_help() {
  TrainFlags f;
  check_verbose(!parse(f, {"--help"}) && !parse(f, {"-b", "2", "--help"}),
                "--help, first or later, asks for the usage");
  check_verbose(!parse(f, {"-h"}) && !parse(f, {"-h", "1"}),
                "-h asks for the usage where the program has no -h flag");
  ProgramFlags p;
  const std::vector<Flag> flags = program_flags(p);
  check_verbose(llmc::parse_flags({"-h", "1"}, flags, "./prog") && p.hellaswag == 1,
                "-h with a value sets the program's own -h flag");
  check_verbose(!llmc::parse_flags({"-b", "2", "--help"}, flags, "./prog"),
                "--help asks for the usage there too");
  check_throws([&] { llmc::parse_flags({"-b", "2", "-h"}, flags, "./prog"); },
               "flag -h needs a value: 1: HellaSwag (--help for the usage)",
               "-h with nothing after it is the program's -h flag without its value");
}

// A program's table: every shared flag first, with the shared defaults, then its own.
void test_program_flags() {
  TrainFlags shared;
  ProgramFlags p;
  const std::vector<Flag> shared_flags = llmc::train_flags(shared);
  const std::vector<Flag> flags = program_flags(p);
  bool same = flags.size() == shared_flags.size() + 2;
  for (size_t i = 0; same && i < shared_flags.size(); i++) {
    same = std::string(flags[i].name) == shared_flags[i].name &&
           std::string(flags[i].help) == shared_flags[i].help &&
           flags[i].show() == shared_flags[i].show();
  }
  check_verbose(same, "the shared flags open a program's table with the same help and defaults");
  check_verbose(std::string(flags[flags.size() - 2].name) == "-h" &&
                    std::string(flags.back().name) == "-temp",
                "the program's own flags follow them");
  check_verbose(llmc::parse_flags({"-temp", "0.5", "-b", "2"}, flags, "./prog") &&
                    p.temperature == 0.5f && p.B == 2,
                "one parse sets shared and own flags");
  check_throws([&] {
    llmc::train_flags(p, {llmc::int_flag("-b", "batch", "a second -b", &p.B, 1, 8)});
  }, "flag -b is defined twice", "a program's flag may not reuse a shared name");
}

// The flags a recipe sets are those whose settings lie in the run's record (llmc::Recipe), listed in
// the record's order, a program's own among them; a recipe copied into the record is what the
// flags show until the command line overrides it.
void test_recipe_flags() {
  ProgramFlags p;
  const std::vector<Flag> flags = llmc::train_flags(
      p, {llmc::int_flag("-h", "HellaSwag", "1: HellaSwag", &p.hellaswag, 0, 1),
          llmc::int_flag("-vt", "validation length", "validation sequence length", &p.val_T, 0, 1 << 20),
          llmc::int_flag("-sh", "shuffle", "1: shuffle", &p.shuffle, 0, 1)});
  std::string names;
  for (const Flag* f : llmc::recipe_flags(p, flags)) names += std::string(" ") + f->name;
  check_verbose(names == " -l -c -gc -k -q -z -b -t -x -v -m -vt -sh",
                "the flags that write the record, in its order:" + names);
  static_cast<llmc::Recipe&>(p) = llmc::recipe_speedrun();
  check_verbose(find(flags, "-t")->show() == "49152" && find(flags, "-k")->show() == "wsd" &&
                    find(flags, "-sh")->show() == "0" && find(flags, "-S")->show() == "42",
                "-recipe speedrun's record: -t 49152, -k wsd, -sh 0 shown; -S, not in it, keeps 42");
  check_verbose(llmc::parse_flags({"-t", "256"}, flags, "./prog") && p.T == 256 && p.B == 1,
                "-t 256 overrides the recipe's -t and leaves its -b 1");
}

void test_model_and_batch() {
  TrainFlags f;
  llmc::resolve_sequence_length(f, 1024);
  check_verbose(f.T == 1024, "-t 0 (the default) becomes the model's maximum sequence length");
  f.T = 256;
  llmc::resolve_sequence_length(f, 1024);
  check_verbose(f.T == 256, "a shorter -t stays");
  f.T = 128;
  check_throws([&] { llmc::resolve_sequence_length(f, 64); },
               "-t 128 is above the model's maximum sequence length 64: use -t 64 or less",
               "-t above the model's maximum");

  llmc::resolve_sample_length(f, 1024);
  check_verbose(f.gen_len == 64, "-g 0 (the default) becomes 64 tokens");
  f.gen_len = 0;
  llmc::resolve_sample_length(f, 64);
  check_verbose(f.gen_len == 63, "-g 0 becomes the model's maximum sequence length - 1 where less");
  f.gen_len = 1023;
  llmc::resolve_sample_length(f, 1024);
  check_verbose(f.gen_len == 1023, "-g up to the model's maximum sequence length - 1 stays");
  f.gen_len = 64;
  check_throws([&] { llmc::resolve_sample_length(f, 64); },
               "-g 64 is above the model's maximum sequence length - 1 = 63 (a sample starts from "
               "one token): use -g 63 or less", "-g above the model's maximum - 1");

  f.tokenizer = "build/test_tmp/no_such_tokenizer.bin";
  check_throws([&] { llmc::resolve_tokenizer(f); },
               "-tk build/test_tmp/no_such_tokenizer.bin: no such vocabulary file",
               "-tk naming no file");
  f.tokenizer = kDir;
  check_throws([&] { llmc::resolve_tokenizer(f); },
               "-tk build/test_tmp/flags is a folder, not a vocabulary file; make one with "
               "dev/data/tinyshakespeare.sh", "-tk naming a folder");
  f.tokenizer = "dev/test/test_flags.cpp";
  check_throws([&] { llmc::resolve_tokenizer(f); },
               "-tk dev/test/test_flags.cpp: not a tokenizer vocabulary file (magic ",
               "-tk naming a file that is no vocabulary file");
  const std::string vocabulary = kDir + "/vocabulary.bin";
  llmc::write_tokenizer_bin(vocabulary, {"a", "b", "<|endoftext|>"}, 2);
  f.tokenizer = vocabulary;
  llmc::resolve_tokenizer(f);
  check_verbose(f.tokenizer == vocabulary, "-tk naming a vocabulary file stays");
  f.tokenizer = "";
  llmc::resolve_tokenizer(f);
  check_verbose(f.tokenizer == (llmc::file_exists(llmc::kDefaultTokenizer) ? llmc::kDefaultTokenizer : ""),
                "-tk none: tiny shakespeare's vocabulary file where it exists, else none");

  f.B = 4;
  f.T = 64;
  llmc::StepBatch batch = llmc::step_batch(f, 2);
  check_verbose(batch.tokens == 512 && batch.micro_steps == 1,
                "-z -1: B*T*processes, one micro step");
  f.total_batch = 2048;
  batch = llmc::step_batch(f, 2);
  check_verbose(batch.tokens == 2048 && batch.micro_steps == 4,
                "-z 2048 of 4*64*2: four micro steps");
  f.total_batch = 1000;
  check_throws([&] { llmc::step_batch(f, 2); },
               "-z 1000 is not a multiple of B*T*processes = 4*64*2 = 512: use -z 512 or another "
               "multiple", "-z not a multiple of B*T*processes");
  f.total_batch = 0;
  check_throws([&] { llmc::step_batch(f, 1); }, "-z 0 is not a multiple", "-z 0");
  f.total_batch = 256L << 32;
  check_throws([&] { llmc::step_batch(f, 1); }, "more than the 2147483647 one step can take",
               "-z of more micro steps than an int counts");
}

// -pd and -aw (the CUDA trainer's): -aw's values, and the checks against -t and -x that
// train_gpt2.py's check_document_args makes.
void test_document_flags() {
  const llmc::WindowSetting pair = llmc::parse_window_flag("-aw", "6/13");
  check_verbose(llmc::parse_window_flag("-aw", "14").long_blocks == 14 &&
                    !llmc::parse_window_flag("-aw", "14").short_given() &&
                    llmc::parse_window_flag("-aw", "-1").long_blocks == -1 &&
                    llmc::parse_window_flag("-aw", "0").long_blocks == 0 && pair.long_blocks == 13 &&
                    pair.short_blocks == 6 && pair.text() == "6/13" && llmc::parse_window_flag("-aw", "3/3").short_given(),
                "-aw takes N blocks, -1 (the schedule), 0 (none) and S/L (1 <= S <= L)");
  check_throws([] { llmc::parse_window_flag("-aw", "-2"); },
               "-aw -2: give a window of 1 or more blocks, -1 for the schedule or 0 for none", "-aw -2");
  check_throws([] { llmc::parse_window_flag("-aw", "x"); },
               "-aw x: give the window in blocks of 128 tokens (N, -1 for the schedule, 0 for none), or the short "
               "and the long window as S/L", "-aw x");
  check_throws([] { llmc::parse_window_flag("-aw", "4/3"); },
               "-aw 4/3: the short window 4 is not within 1 and the long window 3: give S/L with 1 <= S <= L",
               "-aw 4/3: a short window above its long one");
  check_throws([] { llmc::parse_window_flag("-aw", "2/-1"); },
               "-aw 2/-1: a short window takes a fixed long one of 1 or more blocks", "-aw 2/-1: a short window "
               "beside the schedule");
  check_throws([] { llmc::parse_window_flag("-aw", "1/0"); }, "-aw 1/0: a short window takes a fixed long one",
               "-aw 1/0: a short window without a window");
  std::string accepted;
  for (const std::vector<int>& flags : {std::vector<int>{0, 0, 64, -1}, {1, 0, 256, 10}, {1, -1, 1024, 1},
                                        {1, 3, 128, 0}}) {
    try {
      llmc::check_document_flags(flags[0], flags[1], flags[2], flags[3]);
      accepted += llmc::strformat(" (-pd %d -aw %d -t %d -x %d)", flags[0], flags[1], flags[2], flags[3]);
    } catch (const llmc::Error& e) {
      accepted += llmc::strformat(" refused: %s", e.what());
    }
  }
  check_verbose(accepted == " (-pd 0 -aw 0 -t 64 -x -1) (-pd 1 -aw 0 -t 256 -x 10) (-pd 1 -aw -1 -t 1024 -x 1)"
                            " (-pd 1 -aw 3 -t 128 -x 0)",
                "accepted:" + accepted);
  check_throws([] { llmc::check_document_flags(0, 2, 256, 10); },
               "-aw 2 windows document-causal attention; add -pd 1", "a window without documents");
  check_throws([] { llmc::check_document_flags(1, 0, 200, 10); },
               "-pd 1 attends within whole blocks of 128 tokens: -t 200 is not a multiple of 128; use -t 128",
               "documents at -t 200");
  check_throws([] { llmc::check_document_flags(1, 1, 64, 10); }, "-t 64 is not a multiple of 128; use -t 128",
               "documents at -t 64");
  check_throws([] { llmc::check_document_flags(1, 0, 256, -1); },
               "-pd 1 reads document-aligned sequences, which have no epoch to count the steps by: give the "
               "steps with -x", "documents without -x");
  check_throws([] { llmc::check_document_flags(1, -1, 256, 0); },
               "-aw -1 grows the window over the run's steps, and -x 0 has none", "the schedule at -x 0");
}

// -aw N against the longest sequence: up to the window that spans it (with 12 layers twice its
// blocks, the short layers taking half; with a short window given, its blocks), the schedule and no
// window at any length.
void test_window_length() {
  std::string accepted;
  for (const std::vector<int>& w : {std::vector<int>{2, 128, 12}, {3, 128, 12}, {8, 1024, 4}, {9, 1024, 4},
                                    {16, 1024, 12}, {17, 1024, 12}, {-1, 128, 12}, {0, 128, 4}}) {
    try {
      llmc::check_window_length({w[0]}, "-t", w[1], llmc::layer_plan(llmc::Arch::kGpt2, w[2]));
      accepted += llmc::strformat(" %d", w[0]);
    } catch (const llmc::Error&) {
      accepted += llmc::strformat(" (%d)", w[0]);
    }
  }
  check_verbose(accepted == " 2 (3) 8 (9) 16 (17) -1 0",
                "-aw against -t 128 (12 layers), 1024 (4 layers), 1024 (12 layers), refused in ():" + accepted);
  const llmc::LayerPlan twelve = llmc::layer_plan(llmc::Arch::kGpt2, 12);
  bool given_short_spans = true;
  try {
    llmc::check_window_length({8, 3}, "-t", 1024, twelve);
  } catch (const llmc::Error&) {
    given_short_spans = false;
  }
  check_verbose(given_short_spans, "-aw 3/8 at -t 1024 (8 blocks), 12 layers: the long window spans it");
  check_throws([] { llmc::check_window_length({9, 3}, "-t", 1024, llmc::layer_plan(llmc::Arch::kGpt2, 12)); },
               "-aw 3/9 counts blocks of 128 tokens, and -t 1024 is 8 blocks: -aw 8 already attends to all of it; "
               "use -aw 8 or less (the long one)", "-aw 3/9 at -t 1024, 12 layers: a short window given, the long one "
               "spans at 8");
  check_throws([] { llmc::check_window_length({100000}, "-t", 128, llmc::layer_plan(llmc::Arch::kGpt2, 12)); },
               "-aw 100000 counts blocks of 128 tokens, and -t 128 is 1 block: -aw 2 already attends to all of "
               "it (the short layers take half the window); use -aw 2 or less (0: no window)",
               "-aw 100000 (tokens for blocks) at -t 128, 12 layers");
  check_throws([] { llmc::check_window_length({INT32_MAX}, "-vt", 262144, llmc::layer_plan(llmc::Arch::kGpt2, 4)); },
               "-aw 2147483647 counts blocks of 128 tokens, and -vt 262144 is 2048 blocks: -aw 2048 already "
               "attends to all of it; use -aw 2048 or less (0: no window)",
               "-aw INT_MAX at -vt 262144, 4 layers");
}

// The words of lines, in order, less the characters in `frame` (a box's bars).
std::vector<std::string> words_of(const std::vector<std::string>& lines, const std::string& frame) {
  std::vector<std::string> words;
  for (const std::string& line : lines) {
    std::string word;
    for (char c : line + " ") {
      if (c != ' ' && frame.find(c) == std::string::npos) {
        word += c;
      } else if (!word.empty()) {
        words.push_back(word);
        word.clear();
      }
    }
  }
  return words;
}

// The longest of lines.
size_t widest(const std::vector<std::string>& lines) {
  size_t width = 0;
  for (const std::string& line : lines) width = std::max(width, line.size());
  return width;
}

void test_text_wrap() {
  check_verbose(llmc::text_wrap("one two  three", 9) ==
                    std::vector<std::string>({"one two", "three"}),
                "text_wrap cuts at a space, and drops the spaces at the cut");
  check_verbose(llmc::text_wrap("a  b   c", 20) == std::vector<std::string>({"a  b   c"}),
                "text_wrap keeps the spaces inside a line");
  check_verbose(llmc::text_wrap("ab abcdefghij", 4) ==
                    std::vector<std::string>({"ab", "abcd", "efgh", "ij"}),
                "text_wrap cuts a word longer than a line into pieces");
  check_verbose(llmc::text_wrap("", 4) == std::vector<std::string>({""}),
                "text_wrap of nothing: one empty line");
}

// Every line of the box has the same width, however long a value is (d12's parameters row once
// overflowed a fixed-width box), and at most kScreenWidth: a long value goes on over rows of its
// own below its key, in the value's column, with every word kept.
void test_startup_table() {
  TrainFlags f;
  llmc::StartupTable table;
  table.flag_rows(llmc::train_flags(f));
  table.rule();
  const std::string long_value =
      "every 100 steps into " + std::string(60, 'd') + "/model_<step>.bin and its state files "
      "state_<step>_<rank>.bin, keeping the newest 3 and every multiple of 1000, written in the "
      "background through a snapshot in host memory, " + std::string(120, 'x');
  table.row("checkpoints", long_value);
  table.row("parameters", "124475904 (475 MiB each)");
  const std::vector<std::string> lines = table.lines();
  bool same_width = true, rules = true;
  for (const std::string& line : lines) same_width = same_width && line.size() == lines[0].size();
  for (size_t i : {(size_t)0, (size_t)22, lines.size() - 1}) {
    rules = rules && lines[i].find_first_not_of("+-") == std::string::npos;
  }
  check_verbose(same_width && rules && lines[0].size() <= llmc::kScreenWidth,
                llmc::strformat("the box: %zu lines of %zu characters (at most %zu), rules at the "
                                "top, between the groups and at the bottom", lines.size(),
                                lines[0].size(), llmc::kScreenWidth));
  const std::vector<std::string> value_rows(lines.begin() + 23, lines.end() - 2);
  bool under_key = value_rows.size() > 1;
  for (size_t i = 1; i < value_rows.size(); i++) {
    under_key = under_key && value_rows[i].rfind("| " + std::string(26, ' ') + " | ", 0) == 0;
  }
  check_verbose(under_key, llmc::strformat("the long value: %zu rows, the later ones with no key",
                                           value_rows.size()));
  std::vector<std::string> words = words_of(value_rows, "|");
  words.erase(words.begin());  // the key
  const std::vector<std::string> original = words_of({long_value}, "");
  std::string joined, joined_original;
  for (const std::string& word : words) joined += word;
  for (const std::string& word : original) joined_original += word;
  check_verbose(joined == joined_original && words.size() == original.size() + 2,
                llmc::strformat("the long value's %zu words are all there, in order, the two too "
                                "long for a row cut in two", original.size()));
  const std::string value = "dev/data/tinyshakespeare/tiny_shakespeare_train_*.bin";
  check_verbose(lines[1].rfind("| -i    train data           | " + value + " ", 0) == 0 &&
                    lines[1].find_first_not_of(' ', 31 + value.size()) == lines[1].size() - 1,
                "a flag row: its name, label and value, padded to the box: " + lines[1]);

  llmc::StartupTable small;
  small.row("steps", "100");
  small.rule();
  small.row("model", "d12: 12 layers");
  check_verbose(small.lines() == std::vector<std::string>({"+-------+----------------+",
                                                           "| steps | 100            |",
                                                           "+-------+----------------+",
                                                           "| model | d12: 12 layers |",
                                                           "+-------+----------------+"}),
                "a table of short values: a box as wide as its longest key and value");
}

// --help within kScreenWidth: a long help goes on under its help column, its default kept whole,
// with every word kept; a short one stays one line.
void test_usage() {
  ProgramFlags p;
  std::vector<Flag> flags = program_flags(p);
  std::string long_help;
  for (int i = 0; i < 30; i++) long_help += llmc::strformat("word%d ", i);
  flags.push_back(llmc::text_flag("-long", "long", long_help.c_str(), &p.train_pattern));
  const std::string quick_start = "./prog -e tiny -b 8 -t 64 -x 100 -v 25 -s 50   (the tiny "
                                  "model: minutes on a few cores, or seconds on many)";
  const std::vector<std::string> lines =
      llmc::usage_lines("./prog", "a test program", quick_start.c_str(), flags);
  check_verbose(widest(lines) <= llmc::kScreenWidth,
                llmc::strformat("%zu usage lines, the widest %zu characters (at most %zu)",
                                lines.size(), widest(lines), llmc::kScreenWidth));
  std::vector<std::string> expected = {"usage:", "./prog", "[flags]", "(a", "test", "program)",
                                       "a", "quick", "first", "run:"};
  for (const std::string& word : words_of({quick_start}, "")) expected.push_back(word);
  for (const Flag& f : flags) {
    expected.push_back(f.name);
    for (const std::string& word : words_of({f.help, "(default", f.show() + ")"}, "")) {
      expected.push_back(word);
    }
  }
  for (const char* word : {"--help", "prints", "this", "(-h", "is", "a", "flag", "of", "its",
                           "own", "above:", "it", "takes", "a", "value)"}) {
    expected.push_back(word);
  }
  check_verbose(words_of(lines, "") == expected,
                llmc::strformat("every word of the usage is there, in order (%zu)", expected.size()));
  size_t long_line = 0;
  while (long_line < lines.size() && lines[long_line].rfind("  -long ", 0) != 0) long_line++;
  bool hanging = long_line + 2 < lines.size();
  for (size_t i = long_line + 1; hanging && i < lines.size() - 1; i++) {
    hanging = lines[i].rfind(std::string(8, ' ') + "word", 0) == 0 ||
              lines[i].rfind(std::string(8, ' ') + "(default", 0) == 0;
  }
  check_verbose(hanging, "-long's help goes on under its help column: " + lines[long_line + 1]);
  check_verbose(std::find(lines.begin(), lines.end(),
                          "  -b    micro batch size: sequences per process and micro step (default "
                          "4)") != lines.end(),
                "a short help stays one line, with its default");
}

}  // namespace

// -mt's multipliers: tensors Muon takes by their table names, each positive, shown back in table order
// and read back exactly; another tensor, a bad number, a pair without '=' or a tensor named twice
// refused with the flag; "" none; a debug state's settings carry them.
void test_muon_tensor_lr() {
  const llmc::TensorMultipliers x = llmc::parse_muon_tensor_lr("-mt", "fcprojw=4,fcw=2");
  llmc::TensorMultipliers want = llmc::tensor_multipliers_one();
  want[llmc::kFcw] = 2.0f;
  want[llmc::kFcprojw] = 4.0f;
  check_verbose(x == want && llmc::muon_tensor_lr_text(x) == "fcw=2,fcprojw=4" &&
                    llmc::parse_muon_tensor_lr("-mt", llmc::muon_tensor_lr_text(x)) == x,
                "-mt fcprojw=4,fcw=2: parsed, shown as fcw=2,fcprojw=4 and read back");
  llmc::TensorMultipliers odd = llmc::tensor_multipliers_one();
  odd[llmc::kQkvw] = 1.0f / 3.0f;
  check_verbose(llmc::parse_muon_tensor_lr("-mt", llmc::muon_tensor_lr_text(odd)) == odd,
                "-mt " + llmc::muon_tensor_lr_text(odd) + ": a third read back exactly");
  check_verbose(llmc::parse_muon_tensor_lr("-mt", "") == llmc::tensor_multipliers_one() &&
                    llmc::muon_tensor_lr_text(llmc::tensor_multipliers_one()).empty(),
                "-mt '': none, shown as ''");
  check_throws([] { llmc::parse_muon_tensor_lr("-mt", "wte=2"); }, "-mt wte=2: 'wte' is not a tensor Muon takes",
               "-mt of an AdamW tensor");
  check_throws([] { llmc::parse_muon_tensor_lr("-mt", "fcw=0"); }, "-mt fcw=0: give NAME=X, X the tensor's",
               "-mt fcw=0");
  check_throws([] { llmc::parse_muon_tensor_lr("-mt", "fcw=x"); }, "-mt fcw 'x': not a number", "-mt fcw=x");
  check_throws([] { llmc::parse_muon_tensor_lr("-mt", "fcw"); }, "-mt fcw: give NAME=X", "-mt fcw");
  check_throws([] { llmc::parse_muon_tensor_lr("-mt", "fcw=2,fcw=3"); }, "-mt fcw=2,fcw=3: fcw is named twice",
               "-mt fcw twice");
  llmc::DebugState d;
  d.settings = "-mn 1 -mt fcw=2,fcprojw=4";
  check_verbose(llmc::debug_state_settings(d, "d.bin").muon_tensor_lr == want &&
                    llmc::debug_state_settings(llmc::DebugState(), "d.bin").muon_tensor_lr ==
                        llmc::tensor_multipliers_one(),
                "a debug state's -mt fcw=2,fcprojw=4 read (none: every tensor's 1)");
}

// -ar's rows: tensors by their table names, each key once read (lr and wd multipliers, b1 and b2
// betas, bf16's kind), shown back as given in table order; an unknown tensor, key, number or beta, a row without
// its keys or a tensor named twice is refused with the flag and the row; "" none.
void test_adam_rows() {
  const llmc::AdamTensorRows rows = llmc::parse_adam_rows("-ar", "ve:lr=75,b1=0.75,b2=0.95,wd=5;headw:b1=0.5");
  const llmc::AdamTensorRow& ve = rows[llmc::kVe];
  const llmc::AdamTensorRow& head = rows[llmc::kHeadw];
  const bool others = std::count(rows.begin(), rows.end(), llmc::AdamTensorRow()) == llmc::kNumParamTensors - 2;
  check_verbose(ve.lr == 75.0f && ve.beta1 == 0.75f && ve.beta2 == 0.95f && ve.weight_decay == 5.0f &&
                    head.lr == 1.0f && head.beta1 == 0.5f && !head.beta2 && head.weight_decay == 1.0f && others &&
                    llmc::adam_rows_text(rows) == "headw:b1=0.5;ve:lr=75,b1=0.75,b2=0.95,wd=5" &&
                    llmc::parse_adam_rows("-ar", llmc::adam_rows_text(rows)) == rows,
                "-ar ve:lr=75,b1=0.75,b2=0.95,wd=5;headw:b1=0.5 read, shown as " + llmc::adam_rows_text(rows));
  const llmc::AdamTensorRows own = llmc::parse_adam_rows("-ar", "smearw:rate=8e-05,decay=0;wte:decay=0.75");
  check_verbose(own[llmc::kSmearw].rate == 8e-05f && own[llmc::kSmearw].decay == 0.0f && !own[llmc::kWte].rate &&
                    own[llmc::kWte].decay == 0.75f &&
                    llmc::adam_rows_text(own) == "wte:decay=0.75;smearw:rate=8e-05,decay=0" &&
                    llmc::parse_adam_rows("-ar", llmc::adam_rows_text(own)) == own,
                "-ar smearw:rate=8e-05,decay=0;wte:decay=0.75 read (the rate and decay their own), shown as " +
                    llmc::adam_rows_text(own));
  const llmc::AdamTensorRows bf16 = llmc::parse_adam_rows("-ar", "headw:bf16=weight;wte:b1=0.5,bf16=all;ve:bf16=none");
  check_verbose(bf16[llmc::kHeadw].bf16 == llmc::AdamBf16::kWeight && bf16[llmc::kWte].bf16 == llmc::AdamBf16::kAll &&
                    bf16[llmc::kVe].bf16 == llmc::AdamBf16::kNone && bf16[llmc::kVe] != llmc::AdamTensorRow() &&
                    llmc::adam_rows_text(bf16) == "wte:b1=0.5,bf16=all;headw:bf16=weight;ve:bf16=none" &&
                    llmc::parse_adam_rows("-ar", llmc::adam_rows_text(bf16)) == bf16,
                "-ar's bf16 key (weight, all, none) read, shown as " + llmc::adam_rows_text(bf16));
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:bf16=1"); }, "-ar wte:bf16 '1': give none (FP32), weight (the "
               "weight rounded to BF16) or all (the moments too)", "-ar wte:bf16=1");
  llmc::AdamTensorRows unround;
  unround[llmc::kWte].rate = 1.0f / 3;  // 8 digits to read back
  check_verbose(llmc::adam_rows_text(unround) == "wte:rate=0.33333334" &&
                    llmc::parse_adam_rows("-ar", llmc::adam_rows_text(unround)) == unround,
                "a rate of more than 6 digits shown in as many as read back: " + llmc::adam_rows_text(unround));
  check_verbose(llmc::parse_adam_rows("-ar", "") == llmc::AdamTensorRows() &&
                    llmc::adam_rows_text(llmc::AdamTensorRows()).empty(), "-ar '': no rows");
  check_throws([] { llmc::parse_adam_rows("-ar", "emb:lr=2"); }, "-ar emb:lr=2: no parameter tensor 'emb': name "
               "one of wte, wpe, lnew, ", "-ar of an unknown tensor");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:lr=x"); }, "-ar wte:lr 'x': not a number", "-ar wte:lr=x");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:wd=-1"); }, "-ar wte:wd -1: must be at least 0",
               "-ar wte:wd=-1");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:b2=1"); }, "-ar wte:b2 1: must be within (0, 1)",
               "-ar wte:b2=1");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:b1=0"); }, "-ar wte:b1 0: must be within (0, 1)",
               "-ar wte:b1=0");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:beta1=0.5"); }, "-ar wte:beta1=0.5: 'beta1=0.5' is not "
               "key=value of lr, rate, b1, b2, wd, decay or bf16", "-ar of an unknown key");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:rate=0.008,lr=2"); }, "-ar wte:rate=0.008,lr=2: wte sets "
               "its own rate and a multiplier of its role's: give one of rate and lr", "-ar with rate and lr");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:wd=2,decay=0.1"); }, "give one of decay and wd",
               "-ar with wd and decay");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:lr=2,"); }, "-ar wte:lr=2,: '' is not key=value",
               "-ar with an empty key");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte"); }, "-ar 'wte': a row is NAME:key=value,...",
               "-ar of a tensor without keys");
  check_throws([] { llmc::parse_adam_rows("-ar", "wte:lr=2;wte:b1=0.5"); }, "-ar wte:lr=2;wte:b1=0.5: wte has two "
               "rows: give it one", "-ar naming wte twice");
  // Record #89's value-embedding gates (-vg 1) and residual lambdas (-rl 1): AdamW's, the scalars'
  // role (so Muon never takes them), and the reference's rows of them accepted beside -opt muon.
  llmc::Recipe speedrun = llmc::recipe_speedrun();
  speedrun.adam_rows = llmc::parse_adam_rows("-ar", "vegate:b1=0.9,b2=0.99;resid_lambdas:b1=0.9;"
                                             "post_lambdas:lr=0.2,b1=0.9");
  llmc::adam_rows_check(speedrun, "-ar");
  const llmc::OptimizerTable table = llmc::optimizer_table(speedrun, true);
  const llmc::RoleOptimizer& gates = table.of_tensor(llmc::kVegate);
  const llmc::RoleOptimizer& scalars = table.of(llmc::ParamRole::kVector);
  check_verbose(gates.method == llmc::OptimizerKind::kAdamW && gates.lr == scalars.lr && gates.beta1 == 0.9f &&
                    gates.beta2 == 0.99f && gates.weight_decay == scalars.weight_decay,
                llmc::strformat("-recipe speedrun -ar vegate:b1=0.9,b2=0.99: the gates' AdamW row the scalars' (lr %g, "
                                "decay %g) with betas %g %g", gates.lr, gates.weight_decay, gates.beta1, gates.beta2));
  const llmc::RoleOptimizer& resid = table.of_tensor(llmc::kResidLambdas);
  const llmc::RoleOptimizer& post = table.of_tensor(llmc::kPostLambdas);
  check_verbose(resid.method == llmc::OptimizerKind::kAdamW && post.method == llmc::OptimizerKind::kAdamW &&
                    resid.lr == scalars.lr && post.lr == scalars.lr * 0.2f && resid.beta1 == 0.9f &&
                    post.beta1 == 0.9f && resid.beta2 == scalars.beta2 && resid.weight_decay == 0.0f &&
                    post.weight_decay == 0.0f,
                llmc::strformat("-ar resid_lambdas:b1=0.9;post_lambdas:lr=0.2,b1=0.9: rates %g and %g (the scalars' "
                                "%g), betas 0.9 %g, no decay", resid.lr, post.lr, scalars.lr, resid.beta2));
  // Record #89's XSA strengths (-xs 1): AdamW's, the scalars' own row where -ar names none.
  const llmc::RoleOptimizer& strengths = table.of_tensor(llmc::kXsaAlpha);
  check_verbose(strengths.method == llmc::OptimizerKind::kAdamW && strengths.lr == scalars.lr &&
                    strengths.beta1 == scalars.beta1 && strengths.beta2 == scalars.beta2 &&
                    strengths.weight_decay == scalars.weight_decay,
                llmc::strformat("-recipe speedrun: xsa_alpha's AdamW row the scalars' (lr %g, betas %g %g, decay %g)",
                                strengths.lr, strengths.beta1, strengths.beta2, strengths.weight_decay));
  // Record #89's plan's gates (-lp 1): x0_gates and skip_gate AdamW's, the scalars' row likewise; its
  // attention lambdas (-al 1) too, the reference's own row (betas 0.9 0.99, rate x5, no decay) through -ar.
  for (int i : {llmc::kX0Gates, llmc::kSkipGate, llmc::kAttnLambdas}) {
    const llmc::RoleOptimizer& gate = table.of_tensor(i);
    const char* name = i == llmc::kX0Gates ? "x0_gates" : i == llmc::kSkipGate ? "skip_gate" : "attn_lambdas";
    check_verbose(gate.method == llmc::OptimizerKind::kAdamW && gate.lr == scalars.lr &&
                      gate.beta1 == scalars.beta1 && gate.beta2 == scalars.beta2 &&
                      gate.weight_decay == scalars.weight_decay,
                  llmc::strformat("-recipe speedrun: %s's AdamW row the scalars' (lr %g, betas %g %g, decay %g)",
                                  name, gate.lr, gate.beta1, gate.beta2, gate.weight_decay));
  }
}

// The loss's values (-lc, -mtp, -pw): their texts parsed, and a version-5 debug state's settings
// read as those flags, -ut, -awt, -ao, -ko, -asc and -yn, the defaults where it names none, a table beside -pw 0 kept
// (a stage plan's pw= weights it); settings that are not such pairs, or a prefix weight without its
// table, refused.
void test_loss_settings() {
  const llmc::PredictionWeights w = llmc::parse_prediction_weights("-mtp", "1,0.5,0.25");
  const llmc::LogitCapSetting cap = llmc::parse_logit_cap_setting("-lc", "23,5");
  check_verbose(w.count == 3 && w.weight[1] == 0.5f && w.weight[2] == 0.25f && llmc::prediction_weights_text(w) ==
                    "1,0.5,0.25" && cap.cap == 23.0f && cap.shift == 5.0f,
                "-mtp 1,0.5,0.25 and -lc 23,5 parsed and shown");
  const llmc::LogitCapSetting rounded = llmc::parse_logit_cap_setting("-lc", "23,5,bf16");
  check_verbose(rounded.cap == 23.0f && rounded.shift == 5.0f && rounded.bf16_sigmoid && !cap.bf16_sigmoid &&
                    llmc::logit_cap_setting_text(rounded) == "23,5,bf16" && llmc::logit_cap_setting_text(cap) == "23,5",
                "-lc 23,5,bf16: the sigmoid in BF16, parsed and shown");
  llmc::LogitCap trained = {llmc::LogitCap::kSigmoid, 23.0f, 7.5f, 5.0f};
  trained.bf16_sigmoid = true;
  const llmc::LogitCap evaluated = trained.evaluation();
  const double z = 0.3, exact = 23.0 / (1.0 + std::exp(-(z + 5.0) / 7.5));
  check_verbose(!evaluated.bf16_sigmoid && evaluated.cap == 23.0f && evaluated.shift == 5.0f &&
                    evaluated.scale == 7.5f && std::fabs(evaluated.apply(z) - exact) < 1e-12 &&
                    std::fabs(trained.apply(z) - exact) > 1e-3,
                "-lc 23,5,bf16: evaluation's cap takes the sigmoid unrounded, training's rounded");
  check_throws([] { llmc::parse_logit_cap_setting("-lc", "23,5,fp8"); },
               "-lc 23,5,fp8: the third item rounds the sigmoid to BF16 and can only be bf16", "-lc's third item refused");
  llmc::DebugState d;
  d.settings = "-lc 23.0,5.0 -mtp 1.0,0.5,0.25 -pw 0.25 -mn 1 -mq 2 -cd 1";
  d.prefix_table.assign(128, -1);
  const llmc::DebugStateSettings s = llmc::debug_state_settings(d, "d.bin");
  check_verbose(s.logit_cap.cap == 23.0f && s.logit_cap.shift == 5.0f && s.next_token_weights.count == 3 &&
                    s.next_token_weights.weight[2] == 0.25f && s.prefix_weight == 0.25f && s.normuon == 1 &&
                    s.muon_qk_heads == 2 && s.cautious_decay == 1,
                "a debug state's settings '" + d.settings + "' read as the flags'");
  const llmc::DebugStateSettings none = llmc::debug_state_settings(llmc::DebugState(), "d.bin");
  check_verbose(none.logit_cap.cap == 0.0f && none.next_token_weights.count == 1 &&
                    none.next_token_weights.weight[0] == 1.0f && none.prefix_weight == 0.0f && none.normuon == 0 &&
                    none.muon_qk_heads == 0 && none.cautious_decay == 0,
                "a debug state without settings: the architecture's cap, the next token's loss alone, the decay "
                "decoupled");
  d.settings = "-mtp 1 -ns polar";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "d.bin: settings '-mtp 1 -ns polar' are not pairs",
               "a debug state's setting of another flag");
  d.settings = "-pw 0.0 -ut 4";
  const llmc::DebugStateSettings tied = llmc::debug_state_settings(d, "d.bin");
  check_verbose(tied.prefix_weight == 0.0f && tied.untie_step == 4 && s.untie_step == -1,
                "a debug state's prefix table beside -pw 0.0, for its stage plan's pw=; its -ut 4 (none: -1)");
  d.settings = "-mn 2";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-mn 2: must be 0 or 1",
               "a debug state's -mn out of range");
  d.settings = "-cd 2";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-cd 2: must be 0 or 1",
               "a debug state's -cd out of range");
  d.settings = "-ut 1 -ao 2";
  const llmc::DebugStateSettings odd_steps = llmc::debug_state_settings(d, "d.bin");
  check_verbose(odd_steps.adam_every == 2 && odd_steps.untie_step == 1 && none.adam_every == 1,
                "a debug state's settings '" + d.settings + "': AdamW every 2 steps (none: every step)");
  d.settings = "-ao 0";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-ao 0: must be", "a debug state's -ao 0");
  d.settings = "-mq 0";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-mq 0: must be",
               "a debug state's -mq 0 (its writer names Q and K blocks only where it has them)");
  d.settings = "-pw 0.25";
  d.prefix_table.clear();
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "d.bin: -pw 0.25 and no prefix table: the file "
               "is damaged", "a debug state's prefix weight without its table");
  d.settings = "-mtp 1.0,0.5 -awt 1";
  const llmc::DebugStateSettings with_tokens = llmc::debug_state_settings(d, "d.bin");
  check_verbose(with_tokens.window_unit == llmc::WindowUnit::kTokens && with_tokens.next_token_weights.count == 2 &&
                    s.window_unit == llmc::WindowUnit::kBlocks,
                "a debug state's settings '" + d.settings + "': windows in tokens, two next-token weights (none: "
                "blocks)");
  d.settings = "-awt 2";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-awt 2: must be", "a debug state's -awt 2");
  d.settings = "-fhs 100.0,1.6,0.75";
  const llmc::DebugStateSettings scaled = llmc::debug_state_settings(d, "d.bin");
  check_verbose(scaled.fp8_head_scales == llmc::Fp8HeadScales{100.0, 1.6, 0.75} &&
                    s.fp8_head_scales == llmc::Fp8HeadScales(),
                "a debug state's settings '" + d.settings + "': the FP8 head's scales (none: record #28's)");
  d.settings = "-ao 2 -ko 1";
  const llmc::DebugStateSettings key_offset = llmc::debug_state_settings(d, "d.bin");
  check_verbose(key_offset.key_offset == 1 && key_offset.adam_every == 2 && none.key_offset == 0,
                "a debug state's settings '" + d.settings + "': the key offset (none: off)");
  d.settings = "-ko 2";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-ko 2: must be", "a debug state's -ko 2");
  d.settings = "-ko 1 -asc 0.1";
  const llmc::DebugStateSettings attention_scaled = llmc::debug_state_settings(d, "d.bin");
  check_verbose(attention_scaled.attention_scale == 0.1 && attention_scaled.key_offset == 1 &&
                    none.attention_scale == 0.0,
                "a debug state's settings '" + d.settings + "': the attention's scale, Python's double (none: 0, "
                "the architecture's)");
  for (const char* bad : {"-asc 0", "-asc -0.1"}) {
    d.settings = bad;
    check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "the attention's softmax scale must be positive",
                 std::string("a debug state's ") + bad);
  }
  d.settings = "-asc 0.1 -yn 1";
  const llmc::DebugStateSettings yarn = llmc::debug_state_settings(d, "d.bin");
  check_verbose(yarn.yarn == 1 && yarn.attention_scale == 0.1 && none.yarn == 0,
                "a debug state's settings '" + d.settings + "': YaRN (none: off)");
  d.settings = "-yn 2";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-yn 2: must be", "a debug state's -yn 2");
  d.settings = "-asc inf";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-asc 'inf': not a number", "a debug state's -asc inf");
  d.settings = "-ao 2 -ar ve:lr=75,b1=0.75;headw:b2=0.99";
  const llmc::DebugStateSettings rows = llmc::debug_state_settings(d, "d.bin");
  check_verbose(rows.adam_rows[llmc::kVe].lr == 75.0f && rows.adam_rows[llmc::kHeadw].beta2 == 0.99f &&
                    rows.adam_every == 2 && none.adam_rows == llmc::AdamTensorRows(),
                "a debug state's settings '" + d.settings + "': AdamW's rows of ve and headw (none: no rows)");
  d.settings = "-ar ve:lr=75,b2=2";
  check_throws([&] { llmc::debug_state_settings(d, "d.bin"); }, "-ar ve:b2 2: must be within [0, 1]",
               "a debug state's -ar with a beta of 2");
}

// -fhs's value: three numbers read as doubles (as train_gpt2.py reads them) and shown so that they
// read back; other counts, a negative X, a W or G of 0 refused.
void test_fp8_head_scales() {
  const llmc::Fp8HeadScales s = llmc::parse_fp8_head_scales("-fhs", "100,1.6,0.75");
  check_verbose(s.input == 100.0 && s.weight == 1.6 && s.grad == 0.75 && llmc::fp8_head_scales_text(s) ==
                    "100,1.6,0.75" && llmc::fp8_head_scales_text(llmc::Fp8HeadScales()) == "0,0.875,1",
                "-fhs 100,1.6,0.75 parsed as doubles and shown; the default shown as 0,0.875,1");
  const llmc::Fp8HeadScales third = {0.0, 1.0 / 3.0, 1.0};
  check_verbose(llmc::parse_fp8_head_scales("-fhs", llmc::fp8_head_scales_text(third).c_str()) == third,
                "a scale of 17 digits shown so that it reads back (" + llmc::fp8_head_scales_text(third) + ")");
  check_throws([] { llmc::parse_fp8_head_scales("-fhs", "100,1.6"); }, "-fhs 100,1.6: give three numbers",
               "-fhs with two numbers");
  check_throws([] { llmc::parse_fp8_head_scales("-fhs", "1,2,3,4"); }, "-fhs 1,2,3,4: give three numbers",
               "-fhs with four numbers");
  check_throws([] { llmc::parse_fp8_head_scales("-fhs", "0,0,1"); }, "-fhs 0: must be", "-fhs with W = 0");
  check_throws([] { llmc::parse_fp8_head_scales("-fhs", "-1,1,1"); }, "-fhs -1: must be", "-fhs with X < 0");
  check_throws([] { llmc::parse_fp8_head_scales("-fhs", "1,x,1"); }, "-fhs 'x': not a number", "-fhs with a word");
}

// -ri: 0 and 89 the two inits; any other number, or a word, refused by name.
void test_speedrun_init() {
  check(llmc::parse_speedrun_init("-ri", "89") == llmc::SpeedrunInit::kRecord89 &&
            llmc::parse_speedrun_init("-ri", "0") == llmc::SpeedrunInit::kRecord28,
        "-ri 89 and -ri 0 parsed as record #89's and record #28's inits");
  check_throws([] { llmc::parse_speedrun_init("-ri", "28"); },
               "-ri 28: no such init; give 89 (record #89's) or 0 (record #28's, the speedrun's own)", "-ri 28");
  check_throws([] { llmc::parse_speedrun_init("-ri", "-1"); }, "-ri -1: must be at least 0", "-ri -1");
  check_throws([] { llmc::parse_speedrun_init("-ri", "x"); }, "-ri 'x': not an integer", "-ri with a word");
}

int main() {
  try {
    llmc::make_dirs(kDir);
    test_defaults();
    test_parsing();
    test_messages();
    test_help();
    test_program_flags();
    test_recipe_flags();
    test_model_and_batch();
    test_document_flags();
    test_window_length();
    test_text_wrap();
    test_startup_table();
    test_usage();
    test_adam_rows();
    test_muon_tensor_lr();
    test_loss_settings();
    test_fp8_head_scales();
    test_speedrun_init();
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_flags");
}
