// Encodes a UTF-8 text file with the GPT-2 encoder and prints the token ids, space-separated: one
// line for the whole file, or with --lines one line per line of the file (each encoded on its
// own, without its newline). With --pieces it prints the byte lengths of the pre-tokenization
// pieces instead. dev/test/tokenizer_reference.sh compares this output with independent
// implementations.
//
//   build/encode_text [--encoder_dir DIR] [--lines] [--pieces] FILE
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "llmc/tokenizer.h"
#include "llmc/utils.h"

namespace {

const char* kUsage =
    "usage: build/encode_text [--encoder_dir DIR] [--lines] [--pieces] FILE\n"
    "  --encoder_dir DIR  directory with encoder.json and vocab.bpe (default dev/data/gpt2)\n"
    "  --lines            encode each line separately (without its newline), one output line each\n"
    "  --pieces           print the byte length of each pre-tokenization piece, not token ids\n";

void print_numbers(const std::vector<size_t>& numbers) {
  std::string line;
  for (size_t i = 0; i < numbers.size(); i++) {
    if (i > 0) line.push_back(' ');
    line += std::to_string(numbers[i]);
  }
  line.push_back('\n');
  fwrite(line.data(), 1, line.size(), stdout);
}

int run(int argc, char** argv) {
  std::string encoder_dir = "dev/data/gpt2";
  std::string input;
  bool by_line = false;
  bool pieces = false;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--encoder_dir" && i + 1 < argc) {
      encoder_dir = argv[++i];
    } else if (arg == "--lines") {
      by_line = true;
    } else if (arg == "--pieces") {
      pieces = true;
    } else if (arg == "-h" || arg == "--help") {
      printf("%s", kUsage);
      return 0;
    } else if (!arg.empty() && arg[0] != '-' && input.empty()) {
      input = arg;
    } else {
      LLMC_FAIL("unexpected argument '%s' (a flag without its value, or a second FILE)\n%s",
                arg.c_str(), kUsage);
    }
  }
  if (input.empty()) LLMC_FAIL("no input FILE given\n%s", kUsage);

  llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(encoder_dir);
  const std::string text = llmc::read_text_file(input);
  const auto start = std::chrono::steady_clock::now();
  size_t count = 0;
  auto encode_and_print = [&](std::string_view part) {
    std::vector<size_t> numbers;
    if (pieces) {
      for (std::string_view piece : llmc::gpt2_split(part)) numbers.push_back(piece.size());
    } else {
      for (int id : encoder.encode(part)) numbers.push_back((size_t)id);
    }
    count += numbers.size();
    print_numbers(numbers);
  };
  try {
    if (by_line) {
      std::string_view rest(text);
      while (!rest.empty()) {
        size_t newline = rest.find('\n');
        encode_and_print(rest.substr(0, newline));
        rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
      }
    } else {
      encode_and_print(text);
    }
  } catch (const llmc::Error& e) {
    LLMC_FAIL("%s: %s", input.c_str(), e.what());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fprintf(stderr, "encode_text: %s: %zu bytes -> %zu %s in %.3f s\n", input.c_str(), text.size(),
          count, pieces ? "pieces" : "tokens", seconds);
  if (fflush(stdout) != 0 || ferror(stdout)) LLMC_FAIL("writing the token ids to stdout failed");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
