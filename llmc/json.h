// JSON (RFC 8259) as the project reads it: GPT-2's encoder.json and each line of HellaSwag's jsonl.
// Objects, arrays, strings with every escape, numbers, true/false/null. Strings come out as UTF-8;
// invalid UTF-8 and unpaired surrogates are errors, as the tokenizer could not encode them.
//
// Errors read "PATH:LINE:COLUMN: problem (what the file must be)", the column in bytes from 1.
// Nesting deeper than kJsonMaxDepth is an error, so that a hostile file cannot exhaust the stack
// (parsing and freeing a value both recurse); memory is otherwise linear in the text.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "utf8.h"
#include "utils.h"

namespace llmc {

// Far deeper than either file ever nests.
constexpr int kJsonMaxDepth = 64;

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string text;                                         // kString
  std::vector<JsonValue> items;                             // kArray
  std::vector<std::pair<std::string, JsonValue>> members;  // kObject, in text order, repeats kept

  // The member named key, or nullptr; the last one when a key repeats, as Python's json does.
  const JsonValue* find(const std::string& key) const {
    const JsonValue* found = nullptr;
    for (const auto& member : members) {
      if (member.first == key) found = &member.second;
    }
    return found;
  }
};

inline const char* json_type_name(JsonValue::Type type) {
  switch (type) {
    case JsonValue::Type::kNull: return "null";
    case JsonValue::Type::kBool: return "a boolean";
    case JsonValue::Type::kNumber: return "a number";
    case JsonValue::Type::kString: return "a string";
    case JsonValue::Type::kArray: return "an array";
    case JsonValue::Type::kObject: return "an object";
  }
  return "?";
}

// A number without a fractional part: 1, 1.0 and 1e0 alike, as Python's json compares them.
inline bool json_is_integer(const JsonValue& value) {
  return value.type == JsonValue::Type::kNumber && value.number == std::floor(value.number);
}

// A value as an error message names it: a number by its value, anything else by its type.
inline std::string json_describe(const JsonValue& value) {
  return value.type == JsonValue::Type::kNumber ? strformat("%g", value.number)
                                                : json_type_name(value.type);
}

// Parses one JSON text. `path` and `first_line` place the text in its file (a jsonl line is a
// text of its own); `expected` says what the file must be, for the errors.
class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& path, size_t first_line,
             const std::string& expected)
      : text_(text), path_(path), first_line_(first_line), expected_(expected) {}

  JsonValue parse() {
    skip_space();
    JsonValue value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    size_t line = first_line_, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); i++) {
      if (text_[i] == '\n') {
        line++;
        column = 1;
      } else {
        column++;
      }
    }
    LLMC_FAIL("%s:%zu:%zu: %s (%s)", path_.c_str(), line, column, problem.c_str(),
              expected_.c_str());
  }

  int peek() const { return pos_ < text_.size() ? (unsigned char)text_[pos_] : -1; }

  void expect(char c, const char* context) {
    if (peek() != c) fail(strformat("expected '%c' %s", c, context));
    pos_++;
  }

  void skip_space() {
    while (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r') pos_++;
  }

  bool take_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  JsonValue parse_value(int depth) {
    if (depth > kJsonMaxDepth) fail(strformat("nested deeper than %d levels", kJsonMaxDepth));
    JsonValue value;
    const int c = peek();
    if (c == '{') {
      value.type = JsonValue::Type::kObject;
      parse_object(depth, &value);
    } else if (c == '[') {
      value.type = JsonValue::Type::kArray;
      parse_array(depth, &value);
    } else if (c == '"') {
      value.type = JsonValue::Type::kString;
      value.text = parse_string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      value.type = JsonValue::Type::kNumber;
      value.number = parse_number();
    } else if (take_word("true")) {
      value.type = JsonValue::Type::kBool;
      value.boolean = true;
    } else if (take_word("false")) {
      value.type = JsonValue::Type::kBool;
    } else if (!take_word("null")) {
      fail(c < 0 ? "the text ends where a value should start" : "expected a value");
    }
    return value;
  }

  void parse_object(int depth, JsonValue* object) {
    pos_++;
    skip_space();
    if (peek() == '}') {
      pos_++;
      return;
    }
    for (;;) {
      skip_space();
      if (peek() != '"') fail("expected a string key in an object");
      std::string key = parse_string();
      skip_space();
      expect(':', "after an object key");
      skip_space();
      object->members.emplace_back(std::move(key), parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        pos_++;
        continue;
      }
      expect('}', "or ',' in an object");
      return;
    }
  }

  void parse_array(int depth, JsonValue* array) {
    pos_++;
    skip_space();
    if (peek() == ']') {
      pos_++;
      return;
    }
    for (;;) {
      skip_space();
      array->items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        pos_++;
        continue;
      }
      expect(']', "or ',' in an array");
      return;
    }
  }

  // The strict JSON number grammar -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, then strtod.
  double parse_number() {
    const size_t start = pos_;
    auto digits = [&](const char* after) {
      if (!(peek() >= '0' && peek() <= '9')) fail(strformat("expected a digit %s", after));
      while (peek() >= '0' && peek() <= '9') pos_++;
    };
    if (peek() == '-') pos_++;
    if (peek() == '0') {
      pos_++;
      if (peek() >= '0' && peek() <= '9') fail("a number cannot have a leading zero");
    } else {
      digits("in a number");
    }
    if (peek() == '.') {
      pos_++;
      digits("after a decimal point");
    }
    if (peek() == 'e' || peek() == 'E') {
      pos_++;
      if (peek() == '+' || peek() == '-') pos_++;
      digits("in an exponent");
    }
    return strtod(std::string(text_.substr(start, pos_ - start)).c_str(), nullptr);
  }

  uint32_t parse_hex4() {
    uint32_t value = 0;
    for (int i = 0; i < 4; i++) {
      const int c = peek();
      const int digit = c >= '0' && c <= '9' ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (digit < 0) fail("expected four hex digits after \\u");
      value = value * 16 + digit;
      pos_++;
    }
    return value;
  }

  // A \u escape (the "\u" already read): one code point, or a UTF-16 surrogate pair.
  uint32_t parse_unicode_escape() {
    const uint32_t unit = parse_hex4();
    if (unit >= 0xDC00 && unit <= 0xDFFF) {
      fail(strformat("\\u%04X is a low surrogate without a high one before it: the string is not "
                     "valid Unicode", unit));
    }
    if (unit < 0xD800 || unit > 0xDBFF) return unit;
    if (!take_word("\\u")) {
      fail(strformat("\\u%04X is a high surrogate not followed by a \\u low surrogate: the string "
                     "is not valid Unicode", unit));
    }
    const uint32_t low = parse_hex4();
    if (low < 0xDC00 || low > 0xDFFF) {
      fail(strformat("\\u%04X is a high surrogate followed by \\u%04X, not a low surrogate: the "
                     "string is not valid Unicode", unit, low));
    }
    return 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
  }

  std::string parse_string() {
    pos_++;  // the opening quote
    std::string out;
    for (;;) {
      const int c = peek();
      if (c < 0) fail("the text ends inside a string (a missing closing quote?)");
      if (c == '"') {
        pos_++;
        return out;
      }
      if (c < 0x20) {
        fail(strformat("raw control character 0x%02X inside a string (write it as an escape)", c));
      }
      if (c >= 0x80) {
        const auto* bytes = reinterpret_cast<const unsigned char*>(text_.data()) + pos_;
        const Utf8CodePoint decoded = utf8_decode(bytes, text_.size() - pos_);
        if (decoded.status != Utf8Status::kValid) {
          fail("invalid UTF-8 inside a string: convert the file to UTF-8");
        }
        out.append(text_.substr(pos_, decoded.length));
        pos_ += decoded.length;
        continue;
      }
      if (c != '\\') {
        out.push_back((char)c);
        pos_++;
        continue;
      }
      pos_++;
      const int escape = peek();
      pos_++;
      switch (escape) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': utf8_append(parse_unicode_escape(), &out); break;
        default:
          pos_--;
          fail(escape < 0 ? "the text ends inside an escape"
                          : strformat("\\%c is not a JSON escape", escape));
      }
    }
  }

  std::string_view text_;
  std::string path_;
  size_t first_line_;
  std::string expected_;
  size_t pos_ = 0;
};

}  // namespace llmc
