// UTF-8: strict decoding of one code point (the tokenizer's input, JSON strings), encoding one
// code point, and Utf8Joiner for printing token bytes that may cut a character in two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "utils.h"

namespace llmc {

enum class Utf8Status { kValid, kIncomplete, kInvalid };

struct Utf8CodePoint {
  Utf8Status status;
  uint32_t code_point;  // meaningful when kValid
  int length;           // bytes consumed when kValid
};

// Decodes the code point at the start of bytes[0, available). kIncomplete means the bytes so far
// are a valid prefix that runs out before the sequence ends. Overlong forms, surrogates and
// values above U+10FFFF are kInvalid, as in every strict decoder (Python's, Rust's).
inline Utf8CodePoint utf8_decode(const unsigned char* bytes, size_t available) {
  const unsigned char lead = bytes[0];
  if (lead < 0x80) return {Utf8Status::kValid, lead, 1};
  int length;
  uint32_t code_point;
  unsigned char second_min = 0x80, second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code_point = lead & 0x0F;
    if (lead == 0xE0) second_min = 0xA0;  // below: overlong
    if (lead == 0xED) second_max = 0x9F;  // above: surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code_point = lead & 0x07;
    if (lead == 0xF0) second_min = 0x90;  // below: overlong
    if (lead == 0xF4) second_max = 0x8F;  // above: beyond U+10FFFF
  } else {
    return {Utf8Status::kInvalid, 0, 0};
  }
  for (int i = 1; i < length; i++) {
    if ((size_t)i >= available) return {Utf8Status::kIncomplete, 0, 0};
    const unsigned char low = i == 1 ? second_min : 0x80;
    const unsigned char high = i == 1 ? second_max : 0xBF;
    if (bytes[i] < low || bytes[i] > high) return {Utf8Status::kInvalid, 0, 0};
    code_point = (code_point << 6) | (bytes[i] & 0x3F);
  }
  return {Utf8Status::kValid, code_point, length};
}

// The code point at byte `pos` of text, or an Error naming the offset.
inline Utf8CodePoint utf8_decode_at(std::string_view text, size_t pos) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  Utf8CodePoint decoded = utf8_decode(bytes, text.size() - pos);
  if (decoded.status != Utf8Status::kValid) {
    std::string shown;
    for (size_t i = pos; i < text.size() && i < pos + 4; i++) {
      shown += strformat(" %02X", (unsigned char)text[i]);
    }
    LLMC_FAIL("invalid UTF-8 at byte %zu (bytes%s%s): the text to encode must be UTF-8; "
              "convert it to UTF-8 first", pos, shown.c_str(),
              decoded.status == Utf8Status::kIncomplete ? ", a sequence cut off by the end" : "");
  }
  return decoded;
}

// Checks a whole text up front, so a tool can reject a bad file before writing any output.
inline void utf8_validate(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    pos += (unsigned char)text[pos] < 0x80 ? 1 : utf8_decode_at(text, pos).length;
  }
}

inline void utf8_append(uint32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back((char)code_point);
  } else if (code_point < 0x800) {
    out->push_back((char)(0xC0 | (code_point >> 6)));
    out->push_back((char)(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back((char)(0xE0 | (code_point >> 12)));
    out->push_back((char)(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back((char)(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back((char)(0xF0 | (code_point >> 18)));
    out->push_back((char)(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back((char)(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back((char)(0x80 | (code_point & 0x3F)));
  }
}

// Joins the bytes of decoded tokens into printable UTF-8. A token may end in the middle of a
// character (an emoji is often several byte tokens), so push() returns only the complete
// characters and keeps a cut-off sequence until the next token completes it. Bytes that can never
// become valid UTF-8 come out as U+FFFD, so the result is always safe to print.
class Utf8Joiner {
 public:
  std::string push(std::string_view token_bytes) {
    pending_.append(token_bytes.data(), token_bytes.size());
    std::string out;
    size_t pos = 0;
    while (pos < pending_.size()) {
      const auto* bytes = reinterpret_cast<const unsigned char*>(pending_.data()) + pos;
      Utf8CodePoint decoded = utf8_decode(bytes, pending_.size() - pos);
      if (decoded.status == Utf8Status::kIncomplete) break;
      if (decoded.status == Utf8Status::kInvalid) {
        utf8_append(kReplacement, &out);
        pos += 1;
      } else {
        out.append(pending_, pos, decoded.length);
        pos += decoded.length;
      }
    }
    pending_.erase(0, pos);
    return out;
  }

  // Whatever is still pending can no longer be completed.
  std::string finish() {
    std::string out;
    if (!pending_.empty()) utf8_append(kReplacement, &out);
    pending_.clear();
    return out;
  }

 private:
  static constexpr uint32_t kReplacement = 0xFFFD;
  std::string pending_;
};

}  // namespace llmc
