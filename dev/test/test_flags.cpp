// Tests llmc/flags.h: the shared flags' defaults, parsing and ranges, the messages for an unknown
// flag, a stray word and a missing value, when the usage is asked for, a program's own flags after
// the shared ones, the sequence length, sample length, vocabulary file and batch that follow from
// the flags, and the start-up table's box.
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
  check_throws([&] { parse(f, {"-l"}); }, "flag -l needs a value: peak learning rate",
               "a flag without its value says what the value is");
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
               "flag -h needs a value: 1: HellaSwag",
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
  f.tokenizer = "dev/test/test_flags.cpp";
  llmc::resolve_tokenizer(f);
  check_verbose(f.tokenizer == "dev/test/test_flags.cpp", "-tk naming a file stays");
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

// Every line of the box has the same width, however long a value is (d12's parameters row once
// overflowed a fixed-width box).
void test_startup_table() {
  TrainFlags f;
  llmc::StartupTable table;
  table.flag_rows(llmc::train_flags(f));
  table.rule();
  table.row("parameters", "124475904 (475 MiB each: params, grads, AdamW m, v, and a long tail)");
  const std::vector<std::string> lines = table.lines();
  bool same_width = true, rules = true;
  for (const std::string& line : lines) same_width = same_width && line.size() == lines[0].size();
  for (size_t i : {(size_t)0, lines.size() - 3, lines.size() - 1}) {
    rules = rules && lines[i].find_first_not_of("+-") == std::string::npos;
  }
  check_verbose(same_width && rules && lines.size() == 21 + 4,
                llmc::strformat("the box: %zu lines of %zu characters, rules at the top, between "
                                "the groups and at the bottom", lines.size(), lines[0].size()));
  const std::string value = "dev/data/tinyshakespeare/tiny_shakespeare_train_*.bin";
  check_verbose(lines[1].rfind("| -i    train data           | " + value + " ", 0) == 0 &&
                    lines[1].find_first_not_of(' ', 31 + value.size()) == lines[1].size() - 1,
                "a flag row: its name, label and value, padded to the box: " + lines[1]);
}

}  // namespace

int main() {
  try {
    test_defaults();
    test_parsing();
    test_messages();
    test_help();
    test_program_flags();
    test_model_and_batch();
    test_startup_table();
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_flags");
}
