// Fuzzes the JSON parser, llmc::JsonParser, with the input as the text. Deep nesting must end in
// llmc::Error, not a stack overflow; every string of an accepted text (keys included) must be
// valid UTF-8, as the tokenizer needs.
#include <cstdint>
#include <string_view>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/json.h"

namespace {

void require_utf8_strings(const llmc::JsonValue& value) {
  fuzz::require(fuzz::is_utf8(value.text), "every string is valid UTF-8");
  for (const llmc::JsonValue& item : value.items) require_utf8_strings(item);
  for (const auto& [key, member] : value.members) {
    fuzz::require(fuzz::is_utf8(key), "every key is valid UTF-8");
    require_utf8_strings(member);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    require_utf8_strings(llmc::JsonParser(text, "fuzz.json", 1, "any JSON text").parse());
  } catch (const llmc::Error&) {
  }
  return 0;
}
