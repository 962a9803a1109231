// HellaSwag: the eval file, its conversion from the official jsonl, and the half of the
// evaluation that does not depend on the model (the rows to run, scoring their losses, the split
// across ranks).
//
// Eval file (llm.c's, as its dev/data/hellaswag.py writes it with data_common.write_evalfile):
//   256 int32 header: [0] magic 20240522  [1] version 1  [2] number of examples
//                     [3] the longest example's byte length (llm.c sizes its read buffer by it;
//                         HellaSwagSet::longest_row gives the longest row in tokens)
//   then per example a stream of uint16:
//     65535 (delimiter), the example's byte length (all its uint16s, the delimiter included),
//     the example index (0, 1, 2, ... in file order), label (0-3), number of completions (4),
//     context length, context tokens, then per completion: its length, its tokens.
//   As every field is a uint16, token ids are 0..65534 (65535 is the delimiter), an example is
//   under 65536 bytes and a file holds under 65536 examples.
//
// Conversion (build/hellaswag): the context is "ctx" encoded on its own and each ending is
// " " + ending encoded on its own (completion style, as GPT-2 evaluations do), so a row's tokens
// are not always the encoding of ctx + " " + ending.
//
// Evaluating one example:
//   HellaSwagRows rows = hellaswag_rows(example, T);   // 4 rows of T: context + ending i, padded
//   run the model on rows.inputs/rows.targets (B = 4) for a loss per position, row-major
//   (the loss at t predicts targets[t] = inputs[t+1]);
//   HellaSwagResult r = hellaswag_score(rows, losses);  // acc and acc_norm picks
//   counts.add(r);
// Rank r of world evaluates the examples hellaswag_rank_examples() gives it (i % world == r);
// the ranks' counts are then summed (HellaSwagCounts::add) and acc_norm() is the score reported.
//
// Contents: jsonl records (parsed with llmc/json.h) -> tokenized examples -> file writer and
// reader -> rows -> scoring and counts -> ranks.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "json.h"
#include "tokenizer.h"
#include "utils.h"

namespace llmc {

constexpr int kHellaSwagMagic = 20240522;
constexpr int kHellaSwagVersion = 1;
constexpr int kHellaSwagHeaderInts = 256;
constexpr int kHellaSwagEndings = 4;  // also the B of one example's rows
constexpr uint16_t kHellaSwagDelimiter = 65535;
constexpr int kHellaSwagMaxTokenId = 65534;
constexpr int kHellaSwagMaxExamples = 65535;
constexpr int kHellaSwagMaxExampleBytes = 65535;
// The example header: delimiter, byte length, index, label, completions, context length.
constexpr int kHellaSwagExampleHeaderFields = 6;
// Fills the rows past each ending's last token: a valid id in every vocabulary. Attention is
// causal and the mask leaves those positions out, so the choice cannot change a score.
constexpr int kHellaSwagPadToken = 0;

// ----------------------------------------------------------------------------------------------
// The official jsonl: one object per line with "ctx" (string), "endings" (4 strings) and "label"
// (0-3); other fields ("ind", "activity_label", "ctx_a", "ctx_b", "split", ...) are ignored.

struct HellaSwagText {
  int line = 0;  // in the jsonl, from 1
  std::string context;
  std::array<std::string, kHellaSwagEndings> endings;
  int label = 0;
};

// One line's object as a record; `where` is "FILE:LINE".
inline HellaSwagText hellaswag_text_from_json(const JsonValue& object, const std::string& where,
                                              int line) {
  const char* kNeeds = "each line needs \"ctx\" (a string), \"endings\" (4 strings) and "
                       "\"label\" (0-3)";
  if (object.type != JsonValue::Type::kObject) {
    LLMC_FAIL("%s: the line is %s, not an object: %s", where.c_str(),
              json_type_name(object.type), kNeeds);
  }
  HellaSwagText record;
  record.line = line;
  const JsonValue* context = object.find("ctx");
  if (!context) LLMC_FAIL("%s: no \"ctx\" field: %s", where.c_str(), kNeeds);
  if (context->type != JsonValue::Type::kString) {
    LLMC_FAIL("%s: \"ctx\" is %s, not a string", where.c_str(), json_type_name(context->type));
  }
  record.context = context->text;

  const JsonValue* endings = object.find("endings");
  if (!endings) LLMC_FAIL("%s: no \"endings\" field: %s", where.c_str(), kNeeds);
  if (endings->type != JsonValue::Type::kArray) {
    LLMC_FAIL("%s: \"endings\" is %s, not an array of %d strings", where.c_str(),
              json_type_name(endings->type), kHellaSwagEndings);
  }
  if (endings->items.size() != (size_t)kHellaSwagEndings) {
    LLMC_FAIL("%s: \"endings\" has %zu entries, not %d", where.c_str(), endings->items.size(),
              kHellaSwagEndings);
  }
  for (int i = 0; i < kHellaSwagEndings; i++) {
    if (endings->items[i].type != JsonValue::Type::kString) {
      LLMC_FAIL("%s: ending %d is %s, not a string", where.c_str(), i,
                json_type_name(endings->items[i].type));
    }
    record.endings[i] = endings->items[i].text;
  }

  const JsonValue* label = object.find("label");
  if (!label) {
    LLMC_FAIL("%s: no \"label\" field: %s (the test split has no labels: use the val split)",
              where.c_str(), kNeeds);
  }
  if (!json_is_integer(*label) || label->number < 0 || label->number >= kHellaSwagEndings) {
    LLMC_FAIL("%s: \"label\" is %s: it must be an integer from 0 to %d", where.c_str(),
              json_describe(*label).c_str(), kHellaSwagEndings - 1);
  }
  record.label = (int)label->number;
  return record;
}

// Every record of a jsonl text; blank lines are skipped. `path` names the file in errors.
inline std::vector<HellaSwagText> hellaswag_parse_jsonl(std::string_view text,
                                                        const std::string& path) {
  std::vector<HellaSwagText> records;
  size_t start = 0;
  for (int line = 1; start < text.size(); line++) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view content = text.substr(start, end - start);
    start = end + 1;
    if (content.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const JsonValue object =
        JsonParser(content, path, line, "each line must be one JSON object").parse();
    records.push_back(
        hellaswag_text_from_json(object, strformat("%s:%d", path.c_str(), line), line));
  }
  return records;
}

// ----------------------------------------------------------------------------------------------
// Tokenized examples

struct HellaSwagExample {
  int index = 0;  // position in the file, from 0
  int label = 0;
  std::vector<int> context;
  std::array<std::vector<int>, kHellaSwagEndings> endings;
};

// The example's byte length in the eval file.
inline long hellaswag_example_bytes(const HellaSwagExample& example) {
  long fields = kHellaSwagExampleHeaderFields + (long)example.context.size();
  for (const auto& ending : example.endings) fields += 1 + (long)ending.size();
  return 2 * fields;
}

// Checks that the example fits the file format; `where` names it ("FILE:LINE", "example 7").
inline void hellaswag_check_example(const HellaSwagExample& example, const std::string& where) {
  if (example.label < 0 || example.label >= kHellaSwagEndings) {
    LLMC_FAIL("%s: label %d is not 0 to %d", where.c_str(), example.label, kHellaSwagEndings - 1);
  }
  if (example.context.empty()) {
    LLMC_FAIL("%s: the context encodes to no tokens: an ending's first token needs a context "
              "position to be predicted from", where.c_str());
  }
  auto check_ids = [&](const std::vector<int>& tokens, const std::string& what) {
    if (tokens.empty()) LLMC_FAIL("%s: %s has no tokens", where.c_str(), what.c_str());
    for (int id : tokens) {
      if (id < 0 || id > kHellaSwagMaxTokenId) {
        LLMC_FAIL("%s: %s has token id %d, outside 0..%d: the eval file stores uint16 ids with "
                  "65535 as its delimiter", where.c_str(), what.c_str(), id,
                  kHellaSwagMaxTokenId);
      }
    }
  };
  check_ids(example.context, "the context");
  for (int i = 0; i < kHellaSwagEndings; i++) {
    check_ids(example.endings[i], strformat("ending %d", i));
  }
  const long bytes = hellaswag_example_bytes(example);
  if (bytes > kHellaSwagMaxExampleBytes) {
    LLMC_FAIL("%s: the example takes %ld bytes, over the format's %d (its byte length is a "
              "uint16): shorten its context or endings", where.c_str(), bytes,
              kHellaSwagMaxExampleBytes);
  }
}

// Encodes records as the eval file stores them: the context alone, each ending as " " + ending.
// `encode` is the tokenizer (BpeEncoder::encode for GPT-2); `path` names the jsonl in errors.
inline std::vector<HellaSwagExample> hellaswag_tokenize(
    const std::vector<HellaSwagText>& records, const std::string& path,
    const std::function<std::vector<int>(std::string_view)>& encode) {
  if (records.size() > (size_t)kHellaSwagMaxExamples) {
    LLMC_FAIL("%s holds %zu examples, over the eval file's %d (indices are uint16): split it",
              path.c_str(), records.size(), kHellaSwagMaxExamples);
  }
  std::vector<HellaSwagExample> examples;
  for (const HellaSwagText& record : records) {
    const std::string where = strformat("%s:%d", path.c_str(), record.line);
    HellaSwagExample example;
    example.index = (int)examples.size();
    example.label = record.label;
    auto encode_at = [&](const std::string& text, const std::string& what) {
      try {
        return encode(text);
      } catch (const Error& e) {
        LLMC_FAIL("%s: %s: %s", where.c_str(), what.c_str(), e.what());
      }
    };
    example.context = encode_at(record.context, "ctx");
    for (int i = 0; i < kHellaSwagEndings; i++) {
      example.endings[i] = encode_at(" " + record.endings[i], strformat("ending %d", i));
    }
    hellaswag_check_example(example, where);
    examples.push_back(std::move(example));
  }
  return examples;
}

// ----------------------------------------------------------------------------------------------
// The eval file

inline void hellaswag_write(const std::string& path,
                            const std::vector<HellaSwagExample>& examples) {
  if (examples.empty()) LLMC_FAIL("%s: no examples to write", path.c_str());
  if (examples.size() > (size_t)kHellaSwagMaxExamples) {
    LLMC_FAIL("%s: %zu examples are over the eval file's %d (indices are uint16)", path.c_str(),
              examples.size(), kHellaSwagMaxExamples);
  }
  std::vector<uint16_t> stream;
  long longest_bytes = 0;
  for (size_t i = 0; i < examples.size(); i++) {
    const HellaSwagExample& example = examples[i];
    hellaswag_check_example(example, strformat("%s: example %zu", path.c_str(), i));
    const long bytes = hellaswag_example_bytes(example);
    longest_bytes = std::max(longest_bytes, bytes);
    // The index written is the position, whatever example.index says, so that a file always
    // reads back with indices 0, 1, 2, ...
    for (long field : {(long)kHellaSwagDelimiter, bytes, (long)i, (long)example.label,
                       (long)kHellaSwagEndings, (long)example.context.size()}) {
      stream.push_back((uint16_t)field);
    }
    stream.insert(stream.end(), example.context.begin(), example.context.end());
    for (const auto& ending : example.endings) {
      stream.push_back((uint16_t)ending.size());
      stream.insert(stream.end(), ending.begin(), ending.end());
    }
  }
  int32_t header[kHellaSwagHeaderInts] = {};
  header[0] = kHellaSwagMagic;
  header[1] = kHellaSwagVersion;
  header[2] = (int32_t)examples.size();
  header[3] = (int32_t)longest_bytes;
  write_file_atomically(path, [&](File& f) {
    f.write(header, sizeof(header), "the header");
    f.write(stream.data(), stream.size() * sizeof(uint16_t), "the examples");
  });
}

struct HellaSwagSet {
  std::vector<HellaSwagExample> examples;
  int longest_row = 0;  // most tokens in context + one ending: the smallest T that fits them all
};

// Reads and checks a whole eval file. `vocab_size` is the model's: an id outside it would index
// past the embedding table, so such a file is rejected here.
inline HellaSwagSet hellaswag_read(const std::string& path, int vocab_size) {
  File f(path, "rb");
  const long file_size = f.size();
  int32_t header[kHellaSwagHeaderInts];
  f.read(header, sizeof(header), "the header");
  const char* kRemake = "make it with build/hellaswag (see dev/data/README.md)";
  if (header[0] != kHellaSwagMagic) {
    LLMC_FAIL("%s: magic number %d is not %d: not a HellaSwag eval file; %s", path.c_str(),
              header[0], kHellaSwagMagic, kRemake);
  }
  if (header[1] != kHellaSwagVersion) {
    LLMC_FAIL("%s: version %d is not %d, the only one known; %s", path.c_str(), header[1],
              kHellaSwagVersion, kRemake);
  }
  const int count = header[2], longest_bytes = header[3];
  if (count <= 0 || count > kHellaSwagMaxExamples) {
    LLMC_FAIL("%s: the header's example count %d is not 1 to %d: the file is damaged; %s",
              path.c_str(), count, kHellaSwagMaxExamples, kRemake);
  }
  if (longest_bytes <= 0 || longest_bytes > kHellaSwagMaxExampleBytes) {
    LLMC_FAIL("%s: the header's longest example, %d bytes, is not 1 to %d: the file is damaged; "
              "%s", path.c_str(), longest_bytes, kHellaSwagMaxExampleBytes, kRemake);
  }
  const long stream_bytes = file_size - (long)sizeof(header);
  if (stream_bytes % 2 != 0) {
    LLMC_FAIL("%s: %ld bytes follow the header, an odd number for a stream of uint16: the file "
              "is damaged; %s", path.c_str(), stream_bytes, kRemake);
  }
  std::vector<uint16_t> stream(stream_bytes / 2);
  if (!stream.empty()) f.read(stream.data(), stream_bytes, "the examples");

  HellaSwagSet set;
  size_t pos = 0;
  int actual_longest_bytes = 0;
  for (int n = 0; n < count; n++) {
    const size_t start = pos;
    auto byte_offset = [&](size_t at) { return (long)sizeof(header) + 2 * (long)at; };
    auto next = [&](const char* what) -> int {
      if (pos >= stream.size()) {
        LLMC_FAIL("%s: the file is truncated: it ends at byte %ld, in example %d of %d (reading "
                  "its %s); %s", path.c_str(), file_size, n, count, what, kRemake);
      }
      return stream[pos++];
    };
    auto fail_example = [&](const std::string& problem) {
      LLMC_FAIL("%s: example %d (at byte %ld): %s: the file is damaged; %s", path.c_str(), n,
                byte_offset(start), problem.c_str(), kRemake);
    };
    auto read_tokens = [&](const std::string& what) {
      const int length = next(what.c_str());
      if (length == 0) fail_example(strformat("its %s has no tokens", what.c_str()));
      std::vector<int> tokens(length);
      for (int& token : tokens) {
        token = next(what.c_str());
        if (token >= vocab_size) {
          LLMC_FAIL("%s: example %d: its %s has token id %d, outside the model's vocabulary of "
                    "%d: the file was made with another tokenizer; %s", path.c_str(), n,
                    what.c_str(), token, vocab_size, kRemake);
        }
      }
      return tokens;
    };
    const int delimiter = next("delimiter");
    if (delimiter != kHellaSwagDelimiter) {
      fail_example(strformat("it starts with %d, not the delimiter %d", delimiter,
                             kHellaSwagDelimiter));
    }
    const int bytes = next("byte length");
    HellaSwagExample example;
    example.index = next("index");
    if (example.index != n) fail_example(strformat("its index is %d", example.index));
    example.label = next("label");
    if (example.label >= kHellaSwagEndings) {
      fail_example(strformat("its label is %d, not 0 to %d", example.label,
                             kHellaSwagEndings - 1));
    }
    const int completions = next("number of completions");
    if (completions != kHellaSwagEndings) {
      fail_example(strformat("it has %d completions, not %d", completions, kHellaSwagEndings));
    }
    example.context = read_tokens("context");
    for (int i = 0; i < kHellaSwagEndings; i++) {
      example.endings[i] = read_tokens(strformat("ending %d", i));
      set.longest_row =
          std::max(set.longest_row, (int)(example.context.size() + example.endings[i].size()));
    }
    const long actual_bytes = 2 * (long)(pos - start);
    if (actual_bytes != bytes) {
      fail_example(strformat("its byte length says %d, its fields take %ld", bytes,
                             actual_bytes));
    }
    actual_longest_bytes = std::max(actual_longest_bytes, bytes);
    set.examples.push_back(std::move(example));
  }
  if (pos != stream.size()) {
    LLMC_FAIL("%s: %ld bytes follow the last of the header's %d examples: the file is damaged; %s",
              path.c_str(), 2 * (long)(stream.size() - pos), count, kRemake);
  }
  if (actual_longest_bytes != longest_bytes) {
    LLMC_FAIL("%s: the header says the longest example takes %d bytes, it takes %d: the file is "
              "damaged; %s", path.c_str(), longest_bytes, actual_longest_bytes, kRemake);
  }
  return set;
}

// ----------------------------------------------------------------------------------------------
// Rows: what the model runs for one example

struct HellaSwagRows {
  int T = 0;
  int example_index = 0;
  int label = 0;
  // Each kHellaSwagEndings * T, row-major; row i is the context then ending i, then padding.
  std::vector<int> inputs;
  std::vector<int> targets;   // targets[t] = inputs[t+1] within a row; padding after its end
  std::vector<uint8_t> mask;  // 1 where targets[t] is a token of the row's ending
};

// Fails when a context + ending is longer than T; compare HellaSwagSet::longest_row with T once
// up front for a single clear error before evaluating.
inline HellaSwagRows hellaswag_rows(const HellaSwagExample& example, int T) {
  // Every row needs a context token to predict its ending's first token from, and an ending to
  // score; examples from hellaswag_read() always pass.
  hellaswag_check_example(example, strformat("HellaSwag example %d", example.index));
  HellaSwagRows rows;
  rows.T = T;
  rows.example_index = example.index;
  rows.label = example.label;
  const size_t n = (size_t)kHellaSwagEndings * T;
  rows.inputs.assign(n, kHellaSwagPadToken);
  rows.targets.assign(n, kHellaSwagPadToken);
  rows.mask.assign(n, 0);
  const int context_length = (int)example.context.size();
  for (int i = 0; i < kHellaSwagEndings; i++) {
    const std::vector<int>& ending = example.endings[i];
    const int length = context_length + (int)ending.size();
    if (length > T) {
      LLMC_FAIL("HellaSwag example %d: context + ending %d take %d tokens, more than the sequence "
                "length %d: evaluate with T at least the set's longest_row", example.index, i,
                length, T);
    }
    int* inputs = &rows.inputs[(size_t)i * T];
    int* targets = &rows.targets[(size_t)i * T];
    uint8_t* mask = &rows.mask[(size_t)i * T];
    for (int t = 0; t < length; t++) {
      inputs[t] = t < context_length ? example.context[t] : ending[t - context_length];
    }
    for (int t = 0; t + 1 < length; t++) targets[t] = inputs[t + 1];
    // The ending's tokens are predicted at the positions before them: the last context token's
    // position predicts the first ending token.
    for (int t = context_length - 1; t + 1 < length; t++) mask[t] = 1;
  }
  return rows;
}

// ----------------------------------------------------------------------------------------------
// Scoring

struct HellaSwagResult {
  int example_index = 0;
  int label = 0;
  int predicted = 0;       // lowest sum of ending-token losses (acc)
  int predicted_norm = 0;  // lowest mean of ending-token losses (acc_norm)
};

// `losses` holds kHellaSwagEndings * rows.T per-position losses, row-major (any common scale:
// only their order matters). Ties go to the lower ending, as torch.argmin does; a NaN loss
// counts as +inf, so a diverged row is never the pick.
inline HellaSwagResult hellaswag_score(const HellaSwagRows& rows, const float* losses) {
  HellaSwagResult result;
  result.example_index = rows.example_index;
  result.label = rows.label;
  double best_sum = 0.0, best_mean = 0.0;
  for (int i = 0; i < kHellaSwagEndings; i++) {
    double sum = 0.0;  // double: the order of the picks should not hinge on float rounding
    int count = 0;
    for (int t = 0; t < rows.T; t++) {
      const size_t at = (size_t)i * rows.T + t;
      if (!rows.mask[at]) continue;
      sum += std::isnan(losses[at]) ? std::numeric_limits<double>::infinity() : losses[at];
      count++;
    }
    const double mean = sum / count;
    if (i == 0 || sum < best_sum) {
      best_sum = sum;
      result.predicted = i;
    }
    if (i == 0 || mean < best_mean) {
      best_mean = mean;
      result.predicted_norm = i;
    }
  }
  return result;
}

inline HellaSwagResult hellaswag_score(const HellaSwagRows& rows,
                                       const std::vector<float>& losses) {
  const size_t expected = (size_t)kHellaSwagEndings * rows.T;
  if (losses.size() != expected) {
    LLMC_FAIL("hellaswag_score: %zu losses given for example %d, expected one per position of "
              "its %d rows of %d: %zu", losses.size(), rows.example_index, kHellaSwagEndings,
              rows.T, expected);
  }
  return hellaswag_score(rows, losses.data());
}

struct HellaSwagCounts {
  long long examples = 0;
  long long correct = 0;       // acc
  long long correct_norm = 0;  // acc_norm

  void add(const HellaSwagResult& result) {
    examples++;
    correct += result.predicted == result.label;
    correct_norm += result.predicted_norm == result.label;
  }

  // Another rank's counts.
  void add(const HellaSwagCounts& other) {
    examples += other.examples;
    correct += other.correct;
    correct_norm += other.correct_norm;
  }

  // 0 when nothing was counted.
  double acc() const { return examples ? (double)correct / (double)examples : 0.0; }
  double acc_norm() const { return examples ? (double)correct_norm / (double)examples : 0.0; }
};

// ----------------------------------------------------------------------------------------------
// Ranks

// The examples rank `rank` of `world` evaluates: indices i with i % world == rank, ascending.
// Ranks get counts that differ by at most one.
inline std::vector<int> hellaswag_rank_examples(int example_count, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    LLMC_FAIL("hellaswag_rank_examples: rank %d of world %d: the world size must be at least 1 "
              "and the rank 0 to world-1", rank, world);
  }
  std::vector<int> indices;
  for (int i = rank; i < example_count; i += world) indices.push_back(i);
  return indices;
}

}  // namespace llmc
