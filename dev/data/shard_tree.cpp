// Tokenizes directory trees of text files (a corpus of source code, such as the Python packages
// installed on a machine, or those with /usr/share and /usr/include beside them) into token shards
// (format in dev/SPEC.md).
//
// Every regular file under the --root folders (one, or several apart by commas) whose name
// matches --glob is one document, preceded by the EOT token as in the other data tools. Files are
// taken by their root's position in the list, then in the byte order of their paths, so the
// output depends only on the trees; roots that overlap are refused, as their common files would
// be read twice. The files under the top-level folders named by --val_dirs (in any root) form
// the val split and all others train, so that near-copies within a package never straddle the
// split; each split is cut into shards of --shard_size tokens: NAME_val_000000.bin, ...,
// NAME_train_000000.bin, ... Symbolic links are not followed. Empty files, and files that are not
// UTF-8 text (invalid UTF-8 or a NUL byte, as in binary data), are skipped and counted: a corpus
// of installed packages holds a few, and one of them is no reason to lose the rest. With
// --min_tokens, documents of fewer tokens are skipped and counted too: a trainer that packs
// documents into fixed slots a sequence (record #89's script) needs them no shorter than its
// data's.
//
// Several roots, --max_tokens and --shuffle are for a trainer with a per-document cap (record
// #89's script keeps the first 896 or 2,048 tokens of a document), which would otherwise read a
// corpus of source files many times over (the rest of each long file never seen) and meet its
// kinds of text one after another (one root's, then the next's). --max_tokens N cuts a file of
// more than N tokens into consecutive documents of N, the last holding the rest, each with its
// own EOT; --min_tokens applies to each of them, so a short tail is left out. --shuffle SEED puts
// the listed files in an order fixed by the seed (a file's documents stay together, in order), so
// that every stretch of the shards holds the same mixture: the order in which the trainer's loader
// takes its shards, perm = llmc::random_permutation(n) of the n files from llmc::Rng(SEED)
// (dev/SPEC.md permutation(n)), the i-th file written being the listing's perm[i]. It depends on
// the seed alone, not on the standard library; SEED is one of MT19937's 2^32 seeds.
//
// Files are read and tokenized in batches on --threads threads, each with its own encoder (an
// encoder's cache is not shared), and added to the shards in the listing's order: the bytes
// written do not depend on the thread count. The shards are staged and renamed into place only
// when the run has succeeded, and a directory that already holds NAME_ shards is refused.
#include <dirent.h>
#include <fnmatch.h>
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "llmc/dataloader.h"
#include "llmc/flags.h"
#include "llmc/rand.h"
#include "llmc/shard_writer.h"
#include "llmc/tokenizer.h"
#include "llmc/utils.h"

namespace {

const char* kUsage =
    "usage: build/shard_tree --root DIR[,DIR...] --val_dirs NAME[,NAME...] --output_dir DIR\n"
    "                        --name NAME [--glob PATTERN] [--shard_size TOKENS] [--threads N]\n"
    "                        [--min_tokens N] [--max_tokens N] [--shuffle SEED]\n"
    "                        [--encoder_dir DIR]\n"
    "  --root DIRS        the trees of text files, apart by commas; each file is one document\n"
    "                     (or several: --max_tokens), taken by root, then by path\n"
    "  --glob PATTERN     file names to take, a shell pattern (default '*'; quote it: '*.py')\n"
    "  --val_dirs NAMES   top-level folders of the roots whose files form the val split\n"
    "  --output_dir DIR   where the shards go (created if missing; must hold no NAME_ shards)\n"
    "  --name NAME        shard file prefix: NAME_val_000000.bin, NAME_train_000000.bin, ...\n"
    "  --shard_size N     tokens per shard (default 100000000)\n"
    "  --threads N        tokenizing threads (default: OpenMP's, one per core)\n"
    "  --min_tokens N     skip documents of fewer tokens (EOT not counted; default 0: none)\n"
    "  --max_tokens N     cut a longer file into documents of N tokens, the last holding the rest\n"
    "                     (EOT not counted; default: files kept whole)\n"
    "  --shuffle SEED     the files in an order fixed by SEED, 0 to 2^32-1 (drawn as the trainer's\n"
    "                     shard order), each file's documents together (default: by root, then path)\n"
    "  --encoder_dir DIR  directory with encoder.json and vocab.bpe (default dev/data/gpt2)\n";

// Files read and tokenized per parallel batch: bounded by count and by bytes, to bound memory.
constexpr size_t kBatchFiles = 4096;
constexpr size_t kBatchBytes = 64u << 20;

struct Options {
  std::vector<std::string> roots;
  std::string glob = "*";
  std::vector<std::string> val_dirs;
  std::string output_dir;
  std::string name;
  long shard_size = 100000000;
  int threads = omp_get_max_threads();
  long min_tokens = 0;
  long max_tokens = 0;                   // 0: files are kept whole
  std::optional<uint32_t> shuffle_seed;  // none: files in root, path order
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

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string list;
  for (size_t i = 0; i < parts.size(); i++) list += (i == 0 ? "" : separator) + parts[i];
  return list;
}

// The checks of the lists and between the flags, once all are read.
void check_options(const Options& options) {
  if (options.roots.empty()) LLMC_FAIL("--root DIR is required; --help lists the flags");
  if (std::find(options.roots.begin(), options.roots.end(), "") != options.roots.end()) {
    LLMC_FAIL("--root '%s': an empty folder name; give folders apart by single commas",
              join(options.roots, ",").c_str());
  }
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
  if (options.max_tokens > 0 && options.max_tokens < options.min_tokens) {
    LLMC_FAIL("--max_tokens %ld is under --min_tokens %ld: every document would be left out; "
              "give --max_tokens at least %ld", options.max_tokens, options.min_tokens,
              options.min_tokens);
  }
}

Options parse_options(int argc, char** argv) {
  Options options;
  llmc::parse_tool_flags(argc, argv, kUsage, [&](const std::string& flag, const std::string& value) {
    if (flag == "--root") {
      options.roots = split_commas(value);
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
    } else if (flag == "--max_tokens") {
      options.max_tokens = llmc::parse_int("--max_tokens", value.c_str(), 1, INT32_MAX);
    } else if (flag == "--shuffle") {
      options.shuffle_seed = (uint32_t)llmc::parse_int("--shuffle", value.c_str(), 0, UINT32_MAX);
    } else if (flag == "--encoder_dir") {
      options.encoder_dir = value;
    } else {
      return false;
    }
    return true;
  });
  check_options(options);
  return options;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A folder's path with links, "." and ".." resolved, ending in '/': one root lies in another
// exactly when its path starts with the other's.
std::string canonical_folder(const std::string& dir) {
  char* resolved = realpath(dir.c_str(), nullptr);
  if (!resolved) LLMC_FAIL("cannot resolve --root %s: %s", dir.c_str(), strerror(errno));
  const std::string path = resolved;
  free(resolved);
  return path.back() == '/' ? path : path + "/";
}

// Each root must be a folder, and no two may overlap (one the other, or inside it): the files
// they share would be documents twice.
void check_roots(const Options& options) {
  std::vector<std::string> canonical;
  for (const std::string& root : options.roots) {
    if (!is_directory(root)) {
      LLMC_FAIL("--root %s is not a directory: give the folder of the text files", root.c_str());
    }
    canonical.push_back(canonical_folder(root));
  }
  for (size_t i = 0; i < canonical.size(); i++) {
    for (size_t j = 0; j < i; j++) {
      const size_t shorter = std::min(canonical[i].size(), canonical[j].size());
      if (canonical[i].compare(0, shorter, canonical[j], 0, shorter) == 0) {
        LLMC_FAIL("--root %s and %s overlap (one is or holds the other): their files would be "
                  "read twice; give folders apart", options.roots[j].c_str(),
                  options.roots[i].c_str());
      }
    }
  }
}

struct TreeFile {
  int root;          // its root's position in --root
  std::string path;  // relative to the root
  size_t bytes;
};

std::string full_path(const Options& options, const TreeFile& file) {
  return options.roots[file.root] + "/" + file.path;
}

// Adds the regular files under the root's dir (dir empty: the root) whose names match the glob.
void find_files(const Options& options, int root, const std::string& dir,
                std::vector<TreeFile>* files) {
  const std::string& root_dir = options.roots[root];
  const std::string full = dir.empty() ? root_dir : root_dir + "/" + dir;
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
    if (lstat((root_dir + "/" + path).c_str(), &st) != 0) {
      LLMC_FAIL("cannot stat %s/%s: %s", root_dir.c_str(), path.c_str(), strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
      find_files(options, root, path, files);
    } else if (S_ISREG(st.st_mode) && fnmatch(options.glob.c_str(), name.c_str(), 0) == 0) {
      files->push_back({root, path, (size_t)st.st_size});
    }
  }
}

bool in_val_dirs(const Options& options, const std::string& path) {
  const std::string top = path.substr(0, path.find('/'));
  return top.size() < path.size() &&
         std::find(options.val_dirs.begin(), options.val_dirs.end(), top) != options.val_dirs.end();
}

// "P is not a folder" of one path, "none of P, Q is a folder" of several: a message's subject.
std::string none_of(const std::vector<std::string>& paths, const char* one, const char* several) {
  return paths.size() == 1 ? paths[0] + " " + one : "none of " + join(paths, ", ") + " " + several;
}

// A --val_dirs name must be a top-level folder of at least one root, and those folders must hold
// a matching file.
void check_val_dir(const Options& options, const std::vector<TreeFile>& files,
                   const std::string& dir) {
  std::vector<std::string> paths, folders;
  for (const std::string& root : options.roots) {
    paths.push_back(root + "/" + dir);
    if (is_directory(paths.back())) folders.push_back(paths.back());
  }
  if (folders.empty()) {
    LLMC_FAIL("--val_dirs %s: %s: name top-level folders of --root", dir.c_str(),
              none_of(paths, "is not a folder", "is a folder").c_str());
  }
  const bool matched = std::any_of(files.begin(), files.end(), [&](const TreeFile& f) {
    return f.path.compare(0, dir.size() + 1, dir + "/") == 0;
  });
  if (!matched) {
    LLMC_FAIL("--val_dirs %s: %s --glob '%s': name folders with text", dir.c_str(),
              none_of(folders, "holds no file matching", "holds a file matching").c_str(),
              options.glob.c_str());
  }
}

// The matching files by root, then in path order; fails where a root holds none, or a --val_dirs
// name is no folder of a root or holds none.
std::vector<TreeFile> list_files(const Options& options) {
  check_roots(options);
  std::vector<TreeFile> files;
  for (int root = 0; root < (int)options.roots.size(); root++) {
    const size_t listed = files.size();
    find_files(options, root, "", &files);
    if (files.size() == listed) {
      LLMC_FAIL("--root %s holds no file matching --glob '%s': check the folder and the pattern",
                options.roots[root].c_str(), options.glob.c_str());
    }
  }
  std::sort(files.begin(), files.end(), [](const TreeFile& a, const TreeFile& b) {
    return std::tie(a.root, a.path) < std::tie(b.root, b.path);
  });
  for (const std::string& dir : options.val_dirs) check_val_dir(options, files, dir);
  return files;
}

// The listing in --shuffle's order: the i-th file is the listing's perm[i], as the i-th shard an
// epoch of the trainer's loader reads is shards[perm[i]].
std::vector<TreeFile> shuffled_files(uint32_t seed, const std::vector<TreeFile>& files) {
  llmc::Rng rng(seed);
  std::vector<TreeFile> order;
  order.reserve(files.size());
  for (int i : llmc::random_permutation(rng, (int)files.size())) order.push_back(files[i]);
  return order;
}

enum class FileKind { kText, kEmpty, kNotText, kShort };

// One file's documents (each EOT first, then its tokens), or why it is skipped.
struct TokenizedFile {
  FileKind kind = FileKind::kText;
  std::vector<uint16_t> tokens;
  size_t documents = 0;
  bool short_tail = false;  // its last piece was under --min_tokens and left out
};

// Cuts a file's tokens into documents of --max_tokens (one document without it). A file under
// --min_tokens is kShort; of a longer one only the last piece can be under it (--max_tokens is
// at least --min_tokens), and it is left out.
void cut_documents(const std::vector<int>& ids, const Options& options, int eot,
                   TokenizedFile* file) {
  if ((long)ids.size() < options.min_tokens) {
    file->kind = FileKind::kShort;
    return;
  }
  const size_t piece = options.max_tokens > 0 ? (size_t)options.max_tokens : ids.size();
  for (size_t begin = 0; begin < ids.size(); begin += piece) {
    const size_t end = std::min(begin + piece, ids.size());
    if ((long)(end - begin) < options.min_tokens) {
      file->short_tail = true;
      return;
    }
    file->tokens.push_back((uint16_t)eot);
    file->tokens.insert(file->tokens.end(), ids.begin() + begin, ids.begin() + end);
    file->documents++;
  }
}

TokenizedFile tokenize_file(const std::string& path, const Options& options,
                            llmc::BpeEncoder& encoder) {
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
  cut_documents(encoder.encode(text), options, encoder.eot_token(), &result);
  return result;
}

// Files and documents of a split.
struct SplitCounts {
  size_t files = 0, documents = 0;
};

// What the run did, for its closing lines.
struct Counts {
  SplitCounts val, train;
  size_t empty = 0, not_text = 0, short_files = 0, short_tails = 0;
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
          tokenize_file(full_path(options, files[i]), options, encoders[omp_get_thread_num()]);
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
      if (counts->not_text++ == 0) counts->first_not_text = full_path(options, files[i]);
    } else if (file.kind == FileKind::kShort) {
      counts->short_files++;
    } else {
      const bool is_val = in_val_dirs(options, files[i].path);
      (is_val ? val : train).add(file.tokens.data(), file.tokens.size());
      SplitCounts& split = is_val ? counts->val : counts->train;
      split.files++;
      split.documents += file.documents;
      counts->short_tails += file.short_tail;
    }
  }
}

std::string shard_path(const Options& options, const char* split, int index) {
  return llmc::strformat("%s/%s_%s_%06d.bin", options.output_dir.c_str(), options.name.c_str(),
                         split, index);
}

std::string documents_after_cut(const Options& options, const SplitCounts& split) {
  return llmc::strformat("%zu documents after --max_tokens %ld", split.documents,
                         options.max_tokens);
}

// The count lines; where --max_tokens cut files, the documents they became and the tails left out.
void print_counts(const Options& options, const Counts& counts, const llmc::TokenShardStream& val,
                  const llmc::TokenShardStream& train) {
  const bool cut = options.max_tokens > 0;
  const std::string val_about =
      join(options.val_dirs, ",") + (cut ? "; " + documents_after_cut(options, counts.val) : "");
  const std::string train_about =
      cut ? " (" + documents_after_cut(options, counts.train) + ")" : "";
  const std::string tails = cut ? llmc::strformat(", %zu tails of cut files under %ld tokens",
                                                  counts.short_tails, options.min_tokens)
                                : "";
  printf("val:   %zu files (%s): %zu tokens in %d shards\n", counts.val.files, val_about.c_str(),
         val.total(), val.shard_count());
  printf("train: %zu files%s: %zu tokens in %d shards\n", counts.train.files, train_about.c_str(),
         train.total(), train.shard_count());
  printf("skipped: %zu empty files, %zu not UTF-8 text%s%s, %zu under %ld tokens%s\n",
         counts.empty, counts.not_text, counts.not_text ? " (the first: " : "",
         counts.not_text ? (counts.first_not_text + ")").c_str() : "", counts.short_files,
         options.min_tokens, tails.c_str());
}

int run(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  std::vector<TreeFile> files = list_files(options);
  if (options.shuffle_seed) files = shuffled_files(*options.shuffle_seed, files);
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
