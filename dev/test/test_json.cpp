// Tests llmc/json.h: every kind of value, every escape (surrogate pairs included), numbers in each
// form, nesting up to the limit, and malformed texts (truncated, bad escapes, unpaired surrogates,
// invalid UTF-8, too deep, trailing text), each with an error naming the file, line and column.
#include <cstdio>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/json.h"

using llmc::JsonValue;
using testing::check_throws;
using testing::check_verbose;

namespace {

const char* kExpected = "a test document";

JsonValue parse(const std::string& text) {
  return llmc::JsonParser(text, "t.json", 1, kExpected).parse();
}

void test_values() {
  const JsonValue doc = parse(
      " {\"s\": \"text\", \"n\": -12.5e1, \"t\": true, \"f\": false, \"z\": null,\n"
      "  \"a\": [1, [], {}, \"x\"], \"o\": {\"k\": 0}, \"s\": \"again\"}\r\n");
  const JsonValue* a = doc.find("a");
  const JsonValue* o = doc.find("o");
  check_verbose(doc.type == JsonValue::Type::kObject && doc.members.size() == 8 &&
                    doc.members[0].first == "s" && doc.members[0].second.text == "text" &&
                    doc.find("s")->text == "again" && doc.find("n")->number == -125.0 &&
                    doc.find("t")->boolean && doc.find("f")->type == JsonValue::Type::kBool &&
                    !doc.find("f")->boolean && doc.find("z")->type == JsonValue::Type::kNull &&
                    doc.find("missing") == nullptr,
                "an object of every kind of value, members in text order, the last repeat found");
  check_verbose(a && a->type == JsonValue::Type::kArray && a->items.size() == 4 &&
                    a->items[0].number == 1.0 && a->items[1].type == JsonValue::Type::kArray &&
                    a->items[1].items.empty() && a->items[2].type == JsonValue::Type::kObject &&
                    a->items[2].members.empty() && a->items[3].text == "x" && o &&
                    o->find("k")->number == 0.0,
                "nested arrays and objects, empty ones included");

  struct NumberCase {
    const char* text;
    double value;
    bool integer;
  };
  const std::vector<NumberCase> numbers = {
      {"0", 0, true},      {"-0", 0, true},      {"50256", 50256, true},  {"1.0", 1, true},
      {"1E2", 100, true},  {"2e-1", 0.2, false}, {"-0.5e+1", -5, true},   {"3.25", 3.25, false}};
  for (const NumberCase& c : numbers) {
    const JsonValue number = parse(c.text);
    check_verbose(number.type == JsonValue::Type::kNumber && number.number == c.value &&
                      llmc::json_is_integer(number) == c.integer,
                  llmc::strformat("number %s is %g, %san integer", c.text, c.value,
                                  c.integer ? "" : "not "));
  }
  check_verbose(llmc::json_describe(parse("1.5")) == "1.5" &&
                    llmc::json_describe(parse("[]")) == "an array" &&
                    llmc::json_describe(parse("null")) == "null" &&
                    !llmc::json_is_integer(parse("\"1\"")),
                "values as errors name them; a string is no integer");

  const std::string nested = std::string(llmc::kJsonMaxDepth, '[') + "7" +
                             std::string(llmc::kJsonMaxDepth, ']');
  const JsonValue* innermost = nullptr;
  JsonValue deep = parse(nested);
  for (innermost = &deep; innermost->type == JsonValue::Type::kArray;) {
    innermost = &innermost->items[0];
  }
  check_verbose(innermost->number == 7.0,
                llmc::strformat("%d levels of nesting, the limit, parse", llmc::kJsonMaxDepth));
}

void test_escapes() {
  const JsonValue s = parse("\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"");
  check_verbose(s.text == "\" \\ / \b \f \n \r \t", "the two-character escapes");
  check_verbose(parse("\"\\u0041\\u00e9\\u20AC\"").text == "A\xC3\xA9\xE2\x82\xAC",
                "\\u escapes of 1, 2 and 3 UTF-8 bytes, either case of hex digit");
  check_verbose(parse("\"\\ud83d\\ude00\"").text == "\xF0\x9F\x98\x80",
                "a surrogate pair is one 4-byte character");
  check_verbose(parse("\"\\u0000\"").text == std::string(1, '\0'), "\\u0000 is a NUL byte");
  check_verbose(parse("\"caf\xC3\xA9 \xF0\x9F\x98\x80\"").text == "caf\xC3\xA9 \xF0\x9F\x98\x80",
                "raw UTF-8 passes through");
}

void test_errors() {
  struct Case {
    std::string text, needle;
  };
  const std::vector<Case> cases = {
      {"", "t.json:1:1: the text ends where a value should start (a test document)"},
      {"   ", "t.json:1:4: the text ends where a value should start"},
      {"{\"a\": ", "the text ends where a value should start"},
      {"{\"a\": 1", "t.json:1:8: expected '}' or ',' in an object"},
      {"[1, 2", "expected ']' or ',' in an array"},
      {"[1,]", "expected a value"},
      {"{\"a\": 1,}", "expected a string key in an object"},
      {"{a: 1}", "expected a string key in an object"},
      {"{\"a\" 1}", "expected ':' after an object key"},
      {"\"abc", "t.json:1:5: the text ends inside a string"},
      {"\"abc\\", "the text ends inside an escape"},
      {"\"\\x\"", "t.json:1:3: \\x is not a JSON escape"},
      {"\"\\u12G4\"", "expected four hex digits after \\u"},
      {"\"\\u12\"", "expected four hex digits after \\u"},
      {"\"\\ud83d\"", "\\uD83D is a high surrogate not followed by a \\u low surrogate"},
      {"\"\\ud83d\\n\"", "\\uD83D is a high surrogate not followed by a \\u low surrogate"},
      {"\"\\ud83d\\u0041\"", "\\uD83D is a high surrogate followed by \\u0041, not a low"},
      {"\"\\ude00\"", "\\uDE00 is a low surrogate without a high one"},
      {"\"a\tb\"", "raw control character 0x09 inside a string"},
      {"\"\xC3\x28\"", "invalid UTF-8 inside a string"},
      {"\"\xED\xA0\x80\"", "invalid UTF-8 inside a string"},  // an encoded surrogate
      {"\"\xE2\x82\"", "invalid UTF-8 inside a string"},      // cut off by the end
      {"012", "a number cannot have a leading zero"},
      {"-", "expected a digit in a number"},
      {"1.", "expected a digit after a decimal point"},
      {"1e+", "expected a digit in an exponent"},
      {"+1", "expected a value"},
      {"tru", "expected a value"},
      {"nul", "expected a value"},
      {"{} {}", "t.json:1:4: unexpected text after the JSON value"},
      {"1 x", "unexpected text after the JSON value"},
      {"[1]]", "unexpected text after the JSON value"},
      {std::string(llmc::kJsonMaxDepth + 1, '[') + "7" +
           std::string(llmc::kJsonMaxDepth + 1, ']'),
       llmc::strformat("nested deeper than %d levels", llmc::kJsonMaxDepth)},
      {std::string(100000, '['), llmc::strformat("t.json:1:%d: nested deeper than %d levels",
                                                 llmc::kJsonMaxDepth + 2, llmc::kJsonMaxDepth)},
  };
  for (const Case& c : cases) {
    check_throws([&] { parse(c.text); }, c.needle, "'" + c.text.substr(0, 40) + "'");
  }
  // Lines count from the caller's first line, so a jsonl line's errors name its line in the file.
  check_throws([&] { 
    llmc::JsonParser("{\"a\": 1,\n\n  \"b\" 2}", "f.jsonl", 7, kExpected).parse();
  },
               "f.jsonl:9:7: expected ':' after an object key (a test document)",
               "an error on the third line of a text that starts on line 7");
}

}  // namespace

int main() {
  try {
    test_values();
    test_escapes();
    test_errors();
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_json");
}
