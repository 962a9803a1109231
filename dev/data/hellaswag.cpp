// Converts the official HellaSwag jsonl (github.com/rowanz/hellaswag, e.g. hellaswag_val.jsonl)
// into llm.c's eval file, the format described at the top of llmc/hellaswag.h. The context is
// "ctx" encoded with GPT-2's encoder, each ending " " + ending.
//
//   build/hellaswag --input FILE.jsonl --output FILE.bin [--encoder_dir DIR]
#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "llmc/hellaswag.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

namespace {

const char* kUsage =
    "usage: build/hellaswag --input FILE.jsonl --output FILE.bin [--encoder_dir DIR]\n"
    "  --input FILE.jsonl  the official HellaSwag jsonl (one JSON object per line with ctx,\n"
    "                      endings and label), e.g. hellaswag_val.jsonl\n"
    "  --output FILE.bin   the eval file to write (llm.c's format, see llmc/hellaswag.h)\n"
    "  --encoder_dir DIR   directory with encoder.json and vocab.bpe (default dev/data/gpt2)\n";

int run(int argc, char** argv) {
  std::string input, output, encoder_dir = "dev/data/gpt2";
  for (int i = 1; i < argc; i++) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      printf("%s", kUsage);
      return 0;
    }
    if (i + 1 >= argc) LLMC_FAIL("%s needs a value (or is not a flag)\n%s", flag.c_str(), kUsage);
    const std::string value = argv[++i];
    if (flag == "--input") {
      input = value;
    } else if (flag == "--output") {
      output = value;
    } else if (flag == "--encoder_dir") {
      encoder_dir = value;
    } else {
      LLMC_FAIL("unknown flag '%s'\n%s", flag.c_str(), kUsage);
    }
  }
  if (input.empty()) LLMC_FAIL("--input FILE.jsonl is required\n%s", kUsage);
  if (output.empty()) LLMC_FAIL("--output FILE.bin is required\n%s", kUsage);

  const std::string text = llmc::read_text_file(input);
  const std::vector<llmc::HellaSwagText> records = llmc::hellaswag_parse_jsonl(text, input);
  if (records.empty()) {
    LLMC_FAIL("%s holds no examples: give the official HellaSwag jsonl (one JSON object per line)",
              input.c_str());
  }
  llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(encoder_dir);
  const std::vector<llmc::HellaSwagExample> examples = llmc::hellaswag_tokenize(
      records, input, [&](std::string_view s) { return encoder.encode(s); });
  llmc::hellaswag_write(output, examples);

  std::array<int, llmc::kHellaSwagEndings> labels{};
  size_t longest_row = 0;
  for (const llmc::HellaSwagExample& example : examples) {
    labels[example.label]++;
    for (const auto& ending : example.endings) {
      longest_row = std::max(longest_row, example.context.size() + ending.size());
    }
  }
  printf("wrote %s: %zu examples (labels 0-3: %d %d %d %d), longest context + ending %zu tokens\n",
         output.c_str(), examples.size(), labels[0], labels[1], labels[2], labels[3], longest_row);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
