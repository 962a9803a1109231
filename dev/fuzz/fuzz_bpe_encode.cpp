// Fuzzes BpeEncoder::encode with GPT-2's encoder from dev/data/gpt2 (run from the repository root)
// on arbitrary bytes. Invalid UTF-8 must give llmc::Error, exactly when utf8_validate refuses the
// text; valid text must split into pieces that tile it and encode to ids that decode to it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/tokenizer.h"

namespace {

bool is_utf8(std::string_view text) {
  try {
    llmc::utf8_validate(text);
  } catch (const llmc::Error&) {
    return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir("dev/data/gpt2");
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int> ids;
  try {
    ids = encoder.encode(text);
  } catch (const llmc::Error&) {
    fuzz::require(!is_utf8(text), "encode refuses only invalid UTF-8");
    return 0;
  }
  fuzz::require(is_utf8(text), "encode accepts only valid UTF-8");
  std::string joined;
  for (std::string_view piece : llmc::gpt2_split(text)) {
    fuzz::require(!piece.empty(), "pre-tokenization makes no empty piece");
    joined += piece;
  }
  fuzz::require(joined == text, "the pieces tile the text");
  for (int id : ids) {
    fuzz::require(id >= 0 && id < encoder.vocab_size(), "ids are in the vocabulary");
  }
  fuzz::require(encoder.decode(ids) == text, "decoding the encoding gives the text back");
  return 0;
}
