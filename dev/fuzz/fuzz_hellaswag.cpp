// Fuzzes the HellaSwag eval file reader, hellaswag_read, with the input as the file. Every example
// of an accepted file must make rows at the set's longest_row and score without error, as the
// evaluation relies on.
#include <cstdint>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/hellaswag.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ScratchFile eval_file("hellaswag.bin");
  const std::string& path = eval_file.write(data, size);
  llmc::HellaSwagSet set;
  try {
    set = llmc::hellaswag_read(path, llmc::kGpt2VocabSize);
  } catch (const llmc::Error&) {
    return 0;
  }
  // The file was accepted: from here on an llmc::Error is a bug, so nothing catches it.
  llmc::HellaSwagCounts counts;
  for (const llmc::HellaSwagExample& example : set.examples) {
    const llmc::HellaSwagRows rows = llmc::hellaswag_rows(example, set.longest_row);
    const std::vector<float> losses(rows.inputs.size(), 1.0f);
    const llmc::HellaSwagResult result = llmc::hellaswag_score(rows, losses);
    fuzz::require(result.predicted >= 0 && result.predicted < llmc::kHellaSwagEndings &&
                      result.predicted_norm >= 0 &&
                      result.predicted_norm < llmc::kHellaSwagEndings,
                  "every pick is one of the endings");
    counts.add(result);
  }
  fuzz::require(counts.examples == (long long)set.examples.size(), "every example is counted");
  return 0;
}
