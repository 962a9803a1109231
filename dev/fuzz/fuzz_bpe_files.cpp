// Fuzzes the BPE encoder's file parsers: the input is an encoder.json, a NUL byte, then a
// vocab.bpe (without a NUL the whole input is the encoder.json and vocab.bpe is empty). An accepted
// pair must encode a fixed text into ids whose bytes are the text again.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/tokenizer.h"

namespace {

// Letters, digits, contractions, white space runs, punctuation and multi-byte characters: every
// branch of the pre-tokenizer, and bytes that only the byte tokens can spell.
const char* kText = "Hello world, it's 2024!\n\n  \tThey'll re-run the 12345 tests... "
                    "\xC2\xBFQu\xC3\xA9 tal? \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82 "
                    "<|endoftext|>";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ScratchFile encoder_json("encoder.json");
  static fuzz::ScratchFile vocab_bpe("vocab.bpe");
  const uint8_t* separator = static_cast<const uint8_t*>(memchr(data, 0, size));
  const size_t json_size = separator ? (size_t)(separator - data) : size;
  encoder_json.write(data, json_size);
  vocab_bpe.write(data + json_size + (separator ? 1 : 0), size - json_size - (separator ? 1 : 0));
  try {
    llmc::BpeEncoder encoder(encoder_json.path(), vocab_bpe.path());
    const int n = encoder.vocab_size();
    fuzz::require(n >= 256 && encoder.eot_token() >= 0 && encoder.eot_token() < n,
                  "an accepted vocabulary holds the 256 bytes and the EOT token");
    const std::vector<int> ids = encoder.encode(kText);
    for (int id : ids) fuzz::require(id >= 0 && id < n, "every id is in the vocabulary");
    fuzz::require(encoder.decode(ids) == kText, "decoding the encoding gives the text back");
  } catch (const llmc::Error&) {
  }
  return 0;
}
