// Writes llm.c's tokenizer vocabulary file (version 2, with the EOT id; format in
// llmc/tokenizer.h) from GPT-2's encoder.json and vocab.bpe, for decoding in the trainers.
//
//   build/write_tokenizer [--encoder_dir DIR] --output FILE
#include <cstdio>
#include <string>

#include "llmc/tokenizer.h"
#include "llmc/utils.h"

namespace {

const char* kUsage =
    "usage: build/write_tokenizer [--encoder_dir DIR] --output FILE\n"
    "  --encoder_dir DIR  directory with encoder.json and vocab.bpe (default dev/data/gpt2)\n"
    "  --output FILE      the vocabulary file to write (llm.c calls it gpt2_tokenizer.bin)\n";

int run(int argc, char** argv) {
  std::string encoder_dir = "dev/data/gpt2";
  std::string output;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      printf("%s", kUsage);
      return 0;
    }
    if (i + 1 >= argc) LLMC_FAIL("%s needs a value (or is not a flag)\n%s", arg.c_str(), kUsage);
    if (arg == "--encoder_dir") {
      encoder_dir = argv[++i];
    } else if (arg == "--output") {
      output = argv[++i];
    } else {
      LLMC_FAIL("unknown flag '%s'\n%s", arg.c_str(), kUsage);
    }
  }
  if (output.empty()) LLMC_FAIL("--output FILE is required\n%s", kUsage);

  llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(encoder_dir);
  llmc::write_tokenizer_bin(output, encoder.token_bytes(), encoder.eot_token());
  printf("wrote %s: %d tokens, EOT %d\n", output.c_str(), encoder.vocab_size(),
         encoder.eot_token());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
