// Tokenizes a stream of documents into token shards laid out as FineWeb's are distributed (llm.c's
// fineweb.py): every document is preceded by the EOT token and the stream is cut into shards of
// --shard_size tokens, a document that does not fit the current shard being split and its
// remainder starting the next. Shards are numbered in order and shard 0 is the val split:
// NAME_val_000000.bin, NAME_train_000001.bin, NAME_train_000002.bin, ... (format in dev/SPEC.md).
//
// Input on stdin: each document as a little-endian uint32 byte count and that many bytes of UTF-8,
// then the count 0xFFFFFFFF to mark the end (dev/data/shard_dump.py writes it from jsonl or
// parquet). Input that stops without the end mark came from a producer that failed: the shards of
// this run are removed. Documents are tokenized in batches by --threads threads, each with its own
// encoder (an encoder's cache is not shared), and written in input order.
#include <glob.h>
#include <omp.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

namespace {

const char* kUsage =
    "usage: build/shard_documents --output_dir DIR [--name NAME] [--shard_size TOKENS]\n"
    "                             [--threads N] [--encoder_dir DIR]   < documents\n"
    "  --output_dir DIR   where the shards go (created if missing; must hold no NAME_ shards)\n"
    "  --name NAME        shard file prefix (default fineweb): NAME_val_000000.bin,\n"
    "                     NAME_train_000001.bin, ...\n"
    "  --shard_size N     tokens per shard (default 100000000)\n"
    "  --threads N        tokenizing threads (default: OpenMP's, one per core)\n"
    "  --encoder_dir DIR  directory with encoder.json and vocab.bpe (default dev/data/gpt2)\n"
    "stdin: per document a little-endian uint32 byte count and the UTF-8 bytes; 0xFFFFFFFF ends\n";

constexpr uint32_t kEndMark = 0xFFFFFFFFu;
// Documents tokenized per parallel batch: bounded by count and by bytes, to bound memory.
constexpr size_t kBatchDocuments = 4096;
constexpr size_t kBatchBytes = 64u << 20;

struct Options {
  std::string output_dir;
  std::string name = "fineweb";
  long long shard_size = 100000000;
  int threads = omp_get_max_threads();
  std::string encoder_dir = "dev/data/gpt2";
};

long long parse_count(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const long long parsed = strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || parsed < 1 || parsed > INT_MAX) {
    LLMC_FAIL("%s '%s' must be an integer from 1 to %d", flag.c_str(), value.c_str(), INT_MAX);
  }
  return parsed;
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      printf("%s", kUsage);
      exit(0);
    }
    if (i + 1 >= argc) LLMC_FAIL("%s needs a value (or is not a flag); --help lists the flags", flag.c_str());
    const std::string value = argv[i + 1];
    if (flag == "--output_dir") {
      options.output_dir = value;
    } else if (flag == "--name") {
      options.name = value;
    } else if (flag == "--shard_size") {
      options.shard_size = parse_count(flag, value);
    } else if (flag == "--threads") {
      options.threads = (int)parse_count(flag, value);
    } else if (flag == "--encoder_dir") {
      options.encoder_dir = value;
    } else {
      LLMC_FAIL("unknown flag '%s'; --help lists the flags", flag.c_str());
    }
  }
  if (options.output_dir.empty()) LLMC_FAIL("--output_dir DIR is required; --help lists the flags");
  if (options.name.empty() || options.name.find('/') != std::string::npos) {
    LLMC_FAIL("--name must be a non-empty file name prefix without '/' (got '%s')",
              options.name.c_str());
  }
  return options;
}

// Shards of an earlier run would mix with this one's under a glob: they must be moved first.
void require_no_shards(const Options& options) {
  const std::string pattern = options.output_dir + "/" + options.name + "_*_[0-9]*.bin";
  glob_t g;
  const bool found = glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
  const std::string first = found ? g.gl_pathv[0] : "";
  globfree(&g);
  if (found) {
    LLMC_FAIL("%s already holds shards (%s): delete them, or use another --output_dir or --name",
              options.output_dir.c_str(), first.c_str());
  }
}

// Fills shards of shard_size tokens and writes each when it is full; remembers what it wrote so
// that a failed run can remove it.
class FinewebShardWriter {
 public:
  explicit FinewebShardWriter(const Options& options) : options_(options) {}

  void add(const std::vector<int>& tokens) {
    for (int token : tokens) {
      buffer_.push_back((uint16_t)token);
      if ((long long)buffer_.size() == options_.shard_size) write_shard();
    }
    total_ += tokens.size();
  }

  void finish() {
    if (!buffer_.empty()) write_shard();
  }

  void remove_written() {
    for (const std::string& path : written_) remove(path.c_str());
  }

  size_t total() const { return total_; }
  size_t shard_count() const { return written_.size(); }
  size_t val_tokens() const { return val_tokens_; }

 private:
  void write_shard() {
    const size_t index = written_.size();
    const std::string path = llmc::strformat("%s/%s_%s_%06zu.bin", options_.output_dir.c_str(),
                                             options_.name.c_str(), index == 0 ? "val" : "train", index);
    written_.push_back(path);
    llmc::write_token_shard(path, buffer_);
    if (index == 0) val_tokens_ = buffer_.size();
    printf("wrote %s: %zu tokens\n", path.c_str(), buffer_.size());
    fflush(stdout);
    buffer_.clear();
  }

  const Options& options_;
  std::vector<uint16_t> buffer_;
  std::vector<std::string> written_;
  size_t total_ = 0;
  size_t val_tokens_ = 0;
};

// Reads exactly `bytes` bytes of stdin; false at a clean end of input before the first byte.
bool read_stdin(void* dst, size_t bytes, size_t document) {
  const size_t got = fread(dst, 1, bytes, stdin);
  if (got == bytes) return true;
  if (ferror(stdin)) LLMC_FAIL("stdin: read error in document %zu: %s", document + 1, strerror(errno));
  if (got > 0) LLMC_FAIL("stdin: the input stops inside document %zu", document + 1);
  return false;
}

// Reads the next batch of documents; sets *ended when the end mark was read.
std::vector<std::string> read_batch(size_t first_document, bool* ended) {
  std::vector<std::string> batch;
  size_t bytes = 0;
  while (batch.size() < kBatchDocuments && bytes < kBatchBytes) {
    const size_t document = first_document + batch.size();
    uint32_t length = 0;
    if (!read_stdin(&length, sizeof(length), document)) {
      LLMC_FAIL("stdin ended after %zu documents without the end mark: the program writing the "
                "documents failed; the shards of this run were removed", document);
    }
    if (length == kEndMark) {
      *ended = true;
      break;
    }
    std::string text(length, '\0');
    if (length > 0 && !read_stdin(&text[0], length, document)) {
      LLMC_FAIL("stdin: the input stops inside document %zu", document + 1);
    }
    bytes += length;
    batch.push_back(std::move(text));
  }
  return batch;
}

int run(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  const llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(options.encoder_dir);
  llmc::require_vocabulary_fits_shards(encoder.vocab_size(), options.encoder_dir);
  llmc::make_writable_dirs(options.output_dir, "--output_dir");
  require_no_shards(options);

  std::vector<llmc::BpeEncoder> encoders(options.threads, encoder);
  FinewebShardWriter writer(options);
  size_t documents = 0;
  try {
    for (bool ended = false; !ended;) {
      const std::vector<std::string> batch = read_batch(documents, &ended);
      std::vector<std::vector<int>> tokens(batch.size());
      std::vector<std::string> errors(batch.size());
#pragma omp parallel for schedule(dynamic, 16) num_threads(options.threads)
      for (size_t i = 0; i < batch.size(); i++) {
        try {
          llmc::utf8_validate(batch[i]);
          tokens[i] = encoders[omp_get_thread_num()].encode_with_eot(batch[i]);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      }
      for (size_t i = 0; i < batch.size(); i++) {
        if (!errors[i].empty()) LLMC_FAIL("document %zu: %s", documents + i + 1, errors[i].c_str());
        writer.add(tokens[i]);
      }
      documents += batch.size();
    }
    writer.finish();
    if (writer.shard_count() < 2) {
      LLMC_FAIL("all %zu tokens went to the val shard, leaving none to train on: lower "
                "--shard_size (now %lld) or add documents", writer.total(), options.shard_size);
    }
  } catch (...) {
    writer.remove_written();
    throw;
  }
  printf("%zu documents, %zu tokens: %zu in the val shard, %zu in %zu train shards\n", documents,
         writer.total(), writer.val_tokens(), writer.total() - writer.val_tokens(),
         writer.shard_count() - 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
