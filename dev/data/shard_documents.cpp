// Tokenizes a stream of documents into token shards laid out as FineWeb's are distributed (llm.c's
// fineweb.py): every document is preceded by the EOT token and the stream is cut into shards of
// --shard_size tokens, a document that does not fit the current shard being split and its
// remainder starting the next. Shards are numbered in order and shard 0 is the val split:
// NAME_val_000000.bin, NAME_train_000001.bin, NAME_train_000002.bin, ... (format in dev/SPEC.md).
//
// Input on stdin: each document as a little-endian uint32 byte count and that many bytes of UTF-8,
// then the count 0xFFFFFFFF to mark the end (dev/data/shard_dump.py writes it from jsonl or
// parquet). Input that stops without the end mark came from a producer that failed: no shard of
// this run is kept (shards are staged as .tmp files and renamed only when the run succeeds).
// Documents are tokenized in batches by --threads threads, each with its own encoder (an
// encoder's cache is not shared), and written in input order.
#include <omp.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/flags.h"
#include "llmc/shard_writer.h"
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
  llmc::parse_tool_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
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
      return false;
    }
    return true;
  });
  if (options.output_dir.empty()) LLMC_FAIL("--output_dir DIR is required; --help lists the flags");
  if (options.name.empty() || options.name.find('/') != std::string::npos) {
    LLMC_FAIL("--name must be a non-empty file name prefix without '/' (got '%s')",
              options.name.c_str());
  }
  return options;
}

// FineWeb's numbering: one sequence over the whole stream, shard 0 the val split.
std::string shard_path(const Options& options, int index) {
  return llmc::strformat("%s/%s_%s_%06d.bin", options.output_dir.c_str(), options.name.c_str(),
                         index == 0 ? "val" : "train", index);
}

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
                "documents failed; no shard of this run was kept", document);
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
  llmc::require_no_shards(options.output_dir, options.name);

  std::vector<llmc::BpeEncoder> encoders(options.threads, encoder);
  llmc::StagedFiles files;
  llmc::TokenShardStream shards(&files, options.shard_size,
                                [&](int index) { return shard_path(options, index); });
  size_t documents = 0;
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
      shards.add(tokens[i].data(), tokens[i].size());
    }
    documents += batch.size();
  }
  shards.finish();
  if (shards.shard_count() < 2) {
    LLMC_FAIL("all %zu tokens went to the val shard, leaving none to train on: lower "
              "--shard_size (now %lld) or add documents", shards.total(), options.shard_size);
  }
  files.commit();
  shards.print_written();
  const size_t val_tokens = shards.shard_tokens(0);
  printf("%zu documents, %zu tokens: %zu in the val shard, %zu in %d train shards\n", documents,
         shards.total(), val_tokens, shards.total() - val_tokens, shards.shard_count() - 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
