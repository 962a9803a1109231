// Tokenizes a directory tree of text files (a corpus of source code, such as the Python packages
// installed on a machine) into token shards (format in dev/SPEC.md).
//
// Every regular file under --root whose name matches --glob is one document, preceded by the EOT
// token as in the other data tools. Files are taken in the byte order of their paths, so the
// output depends only on the tree. The files under the top-level folders named by --val_dirs
// form the val split and all others train, so that near-copies within a package never straddle
// the split; each split is cut into shards of --shard_size tokens: NAME_val_000000.bin, ...,
// NAME_train_000000.bin, ... Symbolic links are not followed. Empty files, and files that are not
// UTF-8 text (invalid UTF-8 or a NUL byte, as in binary data), are skipped and counted: a corpus
// of installed packages holds a few, and one of them is no reason to lose the rest. With
// --min_tokens, files of fewer tokens are skipped and counted too: a trainer that packs documents
// into fixed slots a sequence (record #89's script) needs them no shorter than its data's.
//
// Files are read and tokenized in batches on --threads threads, each with its own encoder (an
// encoder's cache is not shared), and added to the shards in path order: the bytes written do not
// depend on the thread count. The shards are staged and renamed into place only when the run has
// succeeded, and a directory that already holds NAME_ shards is refused.
#include <dirent.h>
#include <fnmatch.h>
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
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
    "usage: build/shard_tree --root DIR --val_dirs NAME[,NAME...] --output_dir DIR --name NAME\n"
    "                        [--glob PATTERN] [--shard_size TOKENS] [--threads N]\n"
    "                        [--min_tokens N] [--encoder_dir DIR]\n"
    "  --root DIR         the tree of text files; each file is one document\n"
    "  --glob PATTERN     file names to take, a shell pattern (default '*'; quote it: '*.py')\n"
    "  --val_dirs NAMES   top-level folders of --root whose files form the val split\n"
    "  --output_dir DIR   where the shards go (created if missing; must hold no NAME_ shards)\n"
    "  --name NAME        shard file prefix: NAME_val_000000.bin, NAME_train_000000.bin, ...\n"
    "  --shard_size N     tokens per shard (default 100000000)\n"
    "  --threads N        tokenizing threads (default: OpenMP's, one per core)\n"
    "  --min_tokens N     skip files of fewer tokens (EOT not counted; default 0, none skipped)\n"
    "  --encoder_dir DIR  directory with encoder.json and vocab.bpe (default dev/data/gpt2)\n";

// Files read and tokenized per parallel batch: bounded by count and by bytes, to bound memory.
constexpr size_t kBatchFiles = 4096;
constexpr size_t kBatchBytes = 64u << 20;

struct Options {
  std::string root;
  std::string glob = "*";
  std::vector<std::string> val_dirs;
  std::string output_dir;
  std::string name;
  long shard_size = 100000000;
  int threads = omp_get_max_threads();
  long min_tokens = 0;
  std::string encoder_dir = "dev/data/gpt2";
};

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t comma = list.find(',', start);
    parts.push_back(list.substr(start, comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

Options parse_options(int argc, char** argv) {
  Options options;
  llmc::parse_tool_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    if (flag == "--root") {
      options.root = value;
    } else if (flag == "--glob") {
      options.glob = value;
    } else if (flag == "--val_dirs") {
      options.val_dirs = split_commas(value);
    } else if (flag == "--output_dir") {
      options.output_dir = value;
    } else if (flag == "--name") {
      options.name = value;
    } else if (flag == "--shard_size") {
      options.shard_size = llmc::parse_int("--shard_size", value.c_str(), 1, INT32_MAX);
    } else if (flag == "--threads") {
      options.threads = (int)llmc::parse_int("--threads", value.c_str(), 1, 4096);
    } else if (flag == "--min_tokens") {
      options.min_tokens = llmc::parse_int("--min_tokens", value.c_str(), 0, INT32_MAX);
    } else if (flag == "--encoder_dir") {
      options.encoder_dir = value;
    } else {
      return false;
    }
    return true;
  });
  if (options.root.empty()) LLMC_FAIL("--root DIR is required; --help lists the flags");
  if (options.output_dir.empty()) LLMC_FAIL("--output_dir DIR is required; --help lists the flags");
  if (options.name.empty() || options.name.find('/') != std::string::npos) {
    LLMC_FAIL("--name must be a non-empty file name prefix without '/' (got '%s')",
              options.name.c_str());
  }
  if (options.val_dirs.empty()) {
    LLMC_FAIL("--val_dirs is required: name the top-level folders of --root to hold out for "
              "validation, e.g. --val_dirs numpy,scipy");
  }
  for (const std::string& dir : options.val_dirs) {
    if (dir.empty() || dir == "." || dir == ".." || dir.find('/') != std::string::npos) {
      LLMC_FAIL("--val_dirs '%s': each name must be one top-level folder of --root, without '/'",
                dir.c_str());
    }
  }
  return options;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

struct TreeFile {
  std::string path;  // relative to the root
  size_t bytes;
};

// Adds the regular files under root/dir (dir empty: the root) whose names match the glob.
void find_files(const Options& options, const std::string& dir, std::vector<TreeFile>* files) {
  const std::string full = dir.empty() ? options.root : options.root + "/" + dir;
  DIR* handle = opendir(full.c_str());
  if (!handle) LLMC_FAIL("cannot read the directory %s: %s", full.c_str(), strerror(errno));
  std::vector<std::string> names;
  for (dirent* entry; (entry = readdir(handle)) != nullptr;) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(handle);
  for (const std::string& name : names) {
    const std::string path = dir.empty() ? name : dir + "/" + name;
    struct stat st;
    if (lstat((options.root + "/" + path).c_str(), &st) != 0) {
      LLMC_FAIL("cannot stat %s/%s: %s", options.root.c_str(), path.c_str(), strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
      find_files(options, path, files);
    } else if (S_ISREG(st.st_mode) && fnmatch(options.glob.c_str(), name.c_str(), 0) == 0) {
      files->push_back({path, (size_t)st.st_size});
    }
  }
}

bool in_val_dirs(const Options& options, const std::string& path) {
  const std::string top = path.substr(0, path.find('/'));
  return top.size() < path.size() &&
         std::find(options.val_dirs.begin(), options.val_dirs.end(), top) != options.val_dirs.end();
}

// The matching files in path order; fails when there are none, or a --val_dirs folder has none.
std::vector<TreeFile> list_files(const Options& options) {
  if (!is_directory(options.root)) {
    LLMC_FAIL("--root %s is not a directory: give the folder of the text files",
              options.root.c_str());
  }
  std::vector<TreeFile> files;
  find_files(options, "", &files);
  if (files.empty()) {
    LLMC_FAIL("--root %s holds no file matching --glob '%s': check the folder and the pattern",
              options.root.c_str(), options.glob.c_str());
  }
  std::sort(files.begin(), files.end(),
            [](const TreeFile& a, const TreeFile& b) { return a.path < b.path; });
  for (const std::string& dir : options.val_dirs) {
    if (!is_directory(options.root + "/" + dir)) {
      LLMC_FAIL("--val_dirs %s: %s/%s is not a folder: name top-level folders of --root",
                dir.c_str(), options.root.c_str(), dir.c_str());
    }
    const bool matched = std::any_of(files.begin(), files.end(), [&](const TreeFile& f) {
      return f.path.compare(0, dir.size() + 1, dir + "/") == 0;
    });
    if (!matched) {
      LLMC_FAIL("--val_dirs %s: %s/%s holds no file matching --glob '%s': name folders with text",
                dir.c_str(), options.root.c_str(), dir.c_str(), options.glob.c_str());
    }
  }
  return files;
}

enum class FileKind { kText, kEmpty, kNotText, kShort };

// One file's tokens (EOT first), or why it is skipped.
struct TokenizedFile {
  FileKind kind = FileKind::kText;
  std::vector<uint16_t> tokens;
};

TokenizedFile tokenize_file(const std::string& path, long min_tokens, llmc::BpeEncoder& encoder) {
  TokenizedFile result;
  const std::string text = llmc::read_text_file(path);
  if (text.empty()) {
    result.kind = FileKind::kEmpty;
    return result;
  }
  try {
    llmc::utf8_validate(text);
  } catch (const llmc::Error&) {
    result.kind = FileKind::kNotText;
    return result;
  }
  if (text.find('\0') != std::string::npos) {
    result.kind = FileKind::kNotText;
    return result;
  }
  const std::vector<int> ids = encoder.encode_with_eot(text);
  if ((long)ids.size() - 1 < min_tokens) {
    result.kind = FileKind::kShort;
    return result;
  }
  result.tokens.assign(ids.begin(), ids.end());
  return result;
}

// What the run did, for its closing lines.
struct Counts {
  size_t val_files = 0, train_files = 0, empty = 0, not_text = 0, short_files = 0;
  std::string first_not_text;
};

// Tokenizes files[begin, end) in parallel and adds them, in order, to the val or train shards.
void shard_batch(const Options& options, const std::vector<TreeFile>& files, size_t begin,
                 size_t end, std::vector<llmc::BpeEncoder>& encoders, llmc::TokenShardStream& val,
                 llmc::TokenShardStream& train, Counts* counts) {
  std::vector<TokenizedFile> tokenized(end - begin);
  std::vector<std::string> errors(end - begin);
#pragma omp parallel for schedule(dynamic, 1) num_threads(options.threads)
  for (size_t i = begin; i < end; i++) {
    try {
      tokenized[i - begin] =
          tokenize_file(options.root + "/" + files[i].path, options.min_tokens,
                        encoders[omp_get_thread_num()]);
    } catch (const std::exception& e) {
      errors[i - begin] = e.what();
    }
  }
  for (size_t i = begin; i < end; i++) {
    if (!errors[i - begin].empty()) llmc::fail(errors[i - begin]);
    const TokenizedFile& file = tokenized[i - begin];
    if (file.kind == FileKind::kEmpty) {
      counts->empty++;
    } else if (file.kind == FileKind::kNotText) {
      if (counts->not_text++ == 0) counts->first_not_text = options.root + "/" + files[i].path;
    } else if (file.kind == FileKind::kShort) {
      counts->short_files++;
    } else if (in_val_dirs(options, files[i].path)) {
      val.add(file.tokens.data(), file.tokens.size());
      counts->val_files++;
    } else {
      train.add(file.tokens.data(), file.tokens.size());
      counts->train_files++;
    }
  }
}

std::string shard_path(const Options& options, const char* split, int index) {
  return llmc::strformat("%s/%s_%s_%06d.bin", options.output_dir.c_str(), options.name.c_str(),
                         split, index);
}

void print_counts(const Options& options, const Counts& counts, const llmc::TokenShardStream& val,
                  const llmc::TokenShardStream& train) {
  std::string val_dirs;
  for (const std::string& dir : options.val_dirs) val_dirs += (val_dirs.empty() ? "" : ",") + dir;
  printf("val:   %zu files (%s): %zu tokens in %d shards\n", counts.val_files, val_dirs.c_str(),
         val.total(), val.shard_count());
  printf("train: %zu files: %zu tokens in %d shards\n", counts.train_files, train.total(),
         train.shard_count());
  printf("skipped: %zu empty files, %zu not UTF-8 text%s%s, %zu under %ld tokens\n", counts.empty,
         counts.not_text, counts.not_text ? " (the first: " : "",
         counts.not_text ? (counts.first_not_text + ")").c_str() : "", counts.short_files,
         options.min_tokens);
}

int run(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  const std::vector<TreeFile> files = list_files(options);
  const llmc::BpeEncoder encoder = llmc::BpeEncoder::from_dir(options.encoder_dir);
  llmc::require_vocabulary_fits_shards(encoder.vocab_size(), options.encoder_dir);
  llmc::make_writable_dirs(options.output_dir, "--output_dir");
  llmc::require_no_shards(options.output_dir, options.name);

  std::vector<llmc::BpeEncoder> encoders(options.threads, encoder);
  llmc::StagedFiles staged;
  llmc::TokenShardStream val(&staged, options.shard_size,
                             [&](int index) { return shard_path(options, "val", index); });
  llmc::TokenShardStream train(&staged, options.shard_size,
                               [&](int index) { return shard_path(options, "train", index); });
  Counts counts;
  for (size_t begin = 0; begin < files.size();) {
    size_t end = begin, bytes = 0;
    while (end < files.size() && end - begin < kBatchFiles && bytes < kBatchBytes) {
      bytes += files[end++].bytes;
    }
    shard_batch(options, files, begin, end, encoders, val, train, &counts);
    begin = end;
  }
  if (val.total() == 0) {
    LLMC_FAIL("the --val_dirs folders hold no text (their matching files are all empty, not "
              "UTF-8 or under --min_tokens): name other folders");
  }
  if (train.total() == 0) {
    LLMC_FAIL("no text is left to train on: every matching file with text is under --val_dirs; "
              "hold out fewer folders");
  }
  val.finish();
  train.finish();
  staged.commit();
  val.print_written();
  train.print_written();
  print_counts(options, counts, val, train);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
