// Fuzzes the vocabulary file reader, Tokenizer(path), with the input as the file. An accepted
// vocabulary must decode every id, refuse ids outside it with llmc::Error, and print through
// Utf8Joiner as valid UTF-8 whatever bytes its tokens hold.
#include <cstdint>
#include <string>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/tokenizer.h"

namespace {

bool decode_fails(const llmc::Tokenizer& tokenizer, int id) {
  try {
    tokenizer.decode(id);
  } catch (const llmc::Error&) {
    return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ScratchFile vocabulary("tokenizer.bin");
  const std::string& path = vocabulary.write(data, size);
  try {
    const llmc::Tokenizer tokenizer(path);
    const int n = tokenizer.vocab_size();
    fuzz::require(n > 0 && tokenizer.eot_token() >= 0 && tokenizer.eot_token() < n,
                  "an accepted vocabulary is not empty and holds its EOT token");
    llmc::Utf8Joiner joiner;
    std::string printed;
    for (int id = 0; id < n; id++) {
      const std::string& bytes = tokenizer.decode(id);
      fuzz::require(!bytes.empty(), "every token has at least one byte");
      printed += joiner.push(bytes);
    }
    printed += joiner.finish();
    fuzz::require(fuzz::is_utf8(printed), "Utf8Joiner prints valid UTF-8");
    fuzz::require(decode_fails(tokenizer, -1) && decode_fails(tokenizer, n),
                  "ids outside the vocabulary are refused");
  } catch (const llmc::Error&) {
  }
  return 0;
}
