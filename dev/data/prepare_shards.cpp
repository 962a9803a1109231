// Tokenizes UTF-8 text files with GPT-2's encoder into token shards (format in dev/SPEC.md:
// 256 int32 header [0] 20240520 [1] 1 [2] token count, then the tokens as uint16).
//
// Every document is preceded by the EOT token, as llm.c's data scripts do. The first --val_tokens
// tokens of the stream go to the val split, the rest to train, each cut into shards of
// --shard_size tokens: NAME_val_000000.bin, NAME_train_000000.bin, NAME_train_000001.bin, ...
// With the defaults the val split is exactly the first shard, as in FineWeb's distribution.
// Each input file is read into memory whole. A directory that already holds NAME_ shards is
// refused, and the shards are renamed into place only when the whole run has succeeded.

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/shard_writer.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

namespace {

const char* kUsage =
    "usage: build/prepare_shards --input FILE [--input FILE ...] --output_dir DIR --name NAME\n"
    "                            [--shard_size TOKENS] [--val_tokens N]\n"
    "                            [--documents file|blank_lines] [--encoder_dir DIR]\n"
    "  --input FILE       UTF-8 text; repeat for several files (their order is kept)\n"
    "  --output_dir DIR   where the shards go (created if missing; must hold no NAME_ shards)\n"
    "  --name NAME        shard file prefix: NAME_val_000000.bin, NAME_train_000000.bin, ...\n"
    "  --shard_size N     tokens per shard (default 100000000)\n"
    "  --val_tokens N     the first N tokens form the val split (default: one shard)\n"
    "  --documents MODE   file: each file is one document (default); blank_lines: documents\n"
    "                     end at each \"\\n\\n\", which stays with the document before it\n"
    "  --encoder_dir DIR  directory with encoder.json and vocab.bpe (default dev/data/gpt2)\n";

enum class DocumentMode { kFile, kBlankLines };

struct Options {
  std::vector<std::string> inputs;
  std::string output_dir;
  std::string name;
  long long shard_size = 100000000;
  long long val_tokens = -1;  // -1: one shard
  DocumentMode documents = DocumentMode::kFile;
  std::string encoder_dir = "dev/data/gpt2";
};

long long parse_count(const std::string& flag, const std::string& value, long long min_value) {
  char* end = nullptr;
  errno = 0;
  long long parsed = strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || parsed < min_value || parsed > INT_MAX) {
    LLMC_FAIL("%s '%s' must be an integer from %lld to %d", flag.c_str(), value.c_str(), min_value,
              INT_MAX);
  }
  return parsed;
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i++) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      printf("%s", kUsage);
      exit(0);
    }
    if (i + 1 >= argc) LLMC_FAIL("%s needs a value (or is not a flag)\n%s", flag.c_str(), kUsage);
    std::string value = argv[++i];
    if (flag == "--input") {
      options.inputs.push_back(value);
    } else if (flag == "--output_dir") {
      options.output_dir = value;
    } else if (flag == "--name") {
      options.name = value;
    } else if (flag == "--shard_size") {
      options.shard_size = parse_count(flag, value, 1);
    } else if (flag == "--val_tokens") {
      options.val_tokens = parse_count(flag, value, 0);
    } else if (flag == "--documents") {
      if (value == "file") {
        options.documents = DocumentMode::kFile;
      } else if (value == "blank_lines") {
        options.documents = DocumentMode::kBlankLines;
      } else {
        LLMC_FAIL("--documents '%s' is not a mode: use file or blank_lines", value.c_str());
      }
    } else if (flag == "--encoder_dir") {
      options.encoder_dir = value;
    } else {
      LLMC_FAIL("unknown flag '%s'\n%s", flag.c_str(), kUsage);
    }
  }
  if (options.inputs.empty()) LLMC_FAIL("no --input FILE given\n%s", kUsage);
  if (options.output_dir.empty()) LLMC_FAIL("--output_dir DIR is required\n%s", kUsage);
  if (options.name.empty() || options.name.find('/') != std::string::npos) {
    LLMC_FAIL("--name must be a non-empty file name prefix without '/' (got '%s')",
              options.name.c_str());
  }
  if (options.val_tokens < 0) options.val_tokens = options.shard_size;
  return options;
}

// The documents of one file. In blank_lines mode the text is cut after every "\n\n" (Python's
// text.split("\n\n") with the separator kept on each part but the last), as llm.c's
// tinyshakespeare.py does; the last part may be empty and is still a document.
std::vector<std::string_view> split_documents(std::string_view text, DocumentMode mode) {
  if (mode == DocumentMode::kFile) return {text};
  std::vector<std::string_view> documents;
  size_t start = 0;
  for (size_t separator; (separator = text.find("\n\n", start)) != std::string_view::npos;) {
    documents.push_back(text.substr(start, separator + 2 - start));
    start = separator + 2;
  }
  documents.push_back(text.substr(start));
  return documents;
}

// The path of shard `index` of one split.
std::string shard_path(const Options& options, const char* split, int index) {
  return llmc::strformat("%s/%s_%s_%06d.bin", options.output_dir.c_str(), options.name.c_str(),
                         split, index);
}

// An input that cannot be read, or holds no text, fails now, before any work is done.
void check_inputs(const Options& options) {
  for (const std::string& input : options.inputs) {
    llmc::File f(input, "rb");
    if (f.size() == 0) {
      LLMC_FAIL("--input %s is empty: give a file with text (an empty file would be a document of "
                "EOT alone)", input.c_str());
    }
  }
}

int run(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  check_inputs(options);
  llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(options.encoder_dir);
  llmc::require_vocabulary_fits_shards(encoder.vocab_size(), options.encoder_dir);
  llmc::make_writable_dirs(options.output_dir, "--output_dir");
  llmc::require_no_shards(options.output_dir, options.name);

  llmc::StagedFiles files;
  llmc::TokenShardStream val(&files, options.shard_size,
                             [&](int index) { return shard_path(options, "val", index); });
  llmc::TokenShardStream train(&files, options.shard_size,
                               [&](int index) { return shard_path(options, "train", index); });
  size_t documents = 0;
  for (const std::string& input : options.inputs) {
    const std::string text = llmc::read_text_file(input);
    try {
      llmc::utf8_validate(text);
    } catch (const llmc::Error& e) {
      LLMC_FAIL("%s: %s", input.c_str(), e.what());
    }
    for (std::string_view document : split_documents(text, options.documents)) {
      const std::vector<int> tokens = encoder.encode_with_eot(document);
      const size_t to_val = std::min(tokens.size(), (size_t)options.val_tokens - val.total());
      val.add(tokens.data(), to_val);
      train.add(tokens.data() + to_val, tokens.size() - to_val);
      documents++;
    }
  }
  if (train.total() == 0) {
    LLMC_FAIL("all %zu tokens went to the val split: lower --val_tokens (now %lld) or add input",
              val.total(), options.val_tokens);
  }
  val.finish();
  train.finish();
  files.commit();
  val.print_written();
  train.print_written();
  printf("%zu documents from %zu files: %zu val tokens in %d shards, %zu train tokens in %d "
         "shards\n", documents, options.inputs.size(), val.total(), val.shard_count(),
         train.total(), train.shard_count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
