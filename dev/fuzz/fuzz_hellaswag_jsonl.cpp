// Fuzzes the HellaSwag jsonl converter with the input as the jsonl text: hellaswag_parse_jsonl
// (its JSON parser), then hellaswag_tokenize with GPT-2's encoder from dev/data/gpt2 (run from
// the repository root). Accepted examples must write an eval file that hellaswag_read gives back
// unchanged.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/hellaswag.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ScratchFile eval_file("hellaswag_from_jsonl.bin");
  static llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir("dev/data/gpt2");
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<llmc::HellaSwagExample> examples;
  try {
    const std::vector<llmc::HellaSwagText> records =
        llmc::hellaswag_parse_jsonl(text, "fuzz.jsonl");
    examples = llmc::hellaswag_tokenize(records, "fuzz.jsonl",
                                        [&](std::string_view s) { return encoder.encode(s); });
    if (examples.empty()) return 0;
  } catch (const llmc::Error&) {
    return 0;
  }
  // Examples that passed hellaswag_tokenize's checks: writing and reading them must not fail.
  llmc::hellaswag_write(eval_file.path(), examples);
  const llmc::HellaSwagSet set = llmc::hellaswag_read(eval_file.path(), encoder.vocab_size());
  fuzz::require(set.examples.size() == examples.size(), "the eval file holds every example");
  for (size_t i = 0; i < examples.size(); i++) {
    const llmc::HellaSwagExample& a = examples[i];
    const llmc::HellaSwagExample& b = set.examples[i];
    fuzz::require(b.index == (int)i && a.label == b.label && a.context == b.context &&
                      a.endings == b.endings,
                  "an example reads back as it was written");
  }
  return 0;
}
