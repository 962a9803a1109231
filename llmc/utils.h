// Host-side helpers shared by every program: errors that name the file and the
// problem, checked file I/O, and small filesystem utilities.
//
// Errors are thrown as llmc::Error (one line, already naming the file and the
// fix where there is one); each main catches it, prints "error: <message>" and
// exits non-zero. Throwing instead of exiting lets the unit tests check the
// messages in-process.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <glob.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/types.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace llmc {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// printf-style formatting into a std::string.
inline std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string strformat(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? n : 0, '\0');
  if (n > 0) vsnprintf(&out[0], n + 1, fmt, args);
  va_end(args);
  return out;
}

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

#define LLMC_FAIL(...) ::llmc::fail(::llmc::strformat(__VA_ARGS__))

// The threads of a large pass over host memory (a checkpoint's CRC, its copies and conversions):
// half the cores, 2 to 8, leaving the rest to the training loop (a checkpoint's CRC runs on the
// writer's thread beside it) and to the other ranks of a node. 1 without OpenMP.
inline int host_pass_threads() {
#ifdef _OPENMP
  return std::min(8, std::max(2, omp_get_num_procs() / 2));
#else
  return 1;
#endif
}

// A FILE* that knows its path and turns every failure into an Error naming the
// path, what was being read or written, and the byte offset.
class File {
 public:
  File(const std::string& path, const char* mode) : path_(path), mode_(mode) {
    f_ = fopen(path.c_str(), mode);
    if (!f_) {
      const bool writing = strchr(mode, 'w') || strchr(mode, 'a');
      LLMC_FAIL("cannot open %s for %s: %s", path.c_str(), writing ? "writing" : "reading",
                strerror(errno));
    }
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (f_) fclose(f_);
  }

  const std::string& path() const { return path_; }
  FILE* handle() { return f_; }

  // Reads exactly `bytes` bytes or fails, naming what was being read.
  void read(void* dst, size_t bytes, const char* what) {
    long offset = ftell(f_);
    size_t got = fread(dst, 1, bytes, f_);
    if (got != bytes) {
      if (ferror(f_)) {
        LLMC_FAIL("%s: read error while reading %s at byte %ld: %s", path_.c_str(), what, offset,
                  strerror(errno));
      }
      LLMC_FAIL("%s: file is truncated: reading %s at byte %ld needs %zu bytes, only %zu remain",
                path_.c_str(), what, offset, bytes, got);
    }
  }

  void write(const void* src, size_t bytes, const char* what) {
    size_t put = fwrite(src, 1, bytes, f_);
    if (put != bytes) {
      LLMC_FAIL("%s: writing %s failed after %zu of %zu bytes: %s (is the disk full?)",
                path_.c_str(), what, put, bytes, strerror(errno));
    }
  }

  void seek(long offset) {
    if (fseek(f_, offset, SEEK_SET) != 0) {
      LLMC_FAIL("%s: cannot seek to byte %ld: %s", path_.c_str(), offset, strerror(errno));
    }
  }

  // Size in bytes; leaves the position where it was.
  long size() {
    long here = ftell(f_);
    if (fseek(f_, 0, SEEK_END) != 0) {
      LLMC_FAIL("%s: cannot determine the file size: %s", path_.c_str(), strerror(errno));
    }
    long end = ftell(f_);
    seek(here);
    return end;
  }

  // Flushes to the OS and, with sync, to the disk; reports failures that only
  // surface at close (a full disk often shows up here, not in fwrite).
  void close(bool sync = false) {
    if (!f_) return;
    bool ok = fflush(f_) == 0;
    if (ok && sync) ok = fsync(fileno(f_)) == 0;
    int saved_errno = errno;
    ok = (fclose(f_) == 0) && ok;
    f_ = nullptr;
    if (!ok) {
      LLMC_FAIL("%s: closing the file failed: %s (is the disk full?)", path_.c_str(),
                strerror(saved_errno ? saved_errno : errno));
    }
  }

 private:
  std::string path_;
  std::string mode_;
  FILE* f_ = nullptr;
};

// Writes path through write_body(File&), flushes it to the disk and closes it; a failed write
// removes the file, so that a full disk keeps no partial file and gets its space back.
template <class WriteBody>
void write_file_synced(const std::string& path, WriteBody write_body) {
  try {
    File f(path, "wb");
    write_body(f);
    f.close(/*sync=*/true);
  } catch (const Error&) {
    remove(path.c_str());
    throw;
  }
}

// Writes path through write(File&) under the name path + ".tmp", flushes it to disk and renames
// it: an interrupted write never leaves a partial file under the final name, and a failed one
// removes its temporary file (so a full disk keeps the space of the earlier files free).
template <class WriteBody>
void write_file_atomically(const std::string& path, WriteBody write_body) {
  const std::string tmp = path + ".tmp";
  write_file_synced(tmp, write_body);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    LLMC_FAIL("cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), strerror(errno));
  }
}

// Makes the entries of dir (files created or renamed there) durable.
inline void sync_directory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) LLMC_FAIL("cannot open the directory %s to sync it: %s", dir.c_str(), strerror(errno));
  const int synced = fsync(fd);
  const int err = errno;
  close(fd);
  if (synced != 0) LLMC_FAIL("cannot sync the directory %s: %s", dir.c_str(), strerror(err));
}

// The files of one run of a data tool, all or none: write() writes each as NAME.tmp (synced to
// the disk), commit() renames them all to their names once the whole run has succeeded. Until
// then no file under a final name exists, so a run that fails, or is killed, never leaves a part
// of a data set that a glob of *.bin would take for the whole; a failed run's .tmp files are
// removed when the StagedFiles is destroyed uncommitted.
class StagedFiles {
 public:
  StagedFiles() = default;
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  ~StagedFiles() {
    for (const std::string& path : paths_) remove((path + ".tmp").c_str());
  }

  template <class WriteBody>
  void write(const std::string& path, WriteBody write_body) {
    write_file_synced(path + ".tmp", write_body);
    paths_.push_back(path);
  }

  // Renames every file to its name and syncs the directories that hold them. A rename that
  // fails removes the files already renamed, so that the run still leaves nothing.
  void commit() {
    for (size_t i = 0; i < paths_.size(); i++) {
      const std::string tmp = paths_[i] + ".tmp";
      if (rename(tmp.c_str(), paths_[i].c_str()) != 0) {
        const int err = errno;
        for (size_t j = 0; j < i; j++) remove(paths_[j].c_str());
        LLMC_FAIL("cannot rename %s to %s: %s", tmp.c_str(), paths_[i].c_str(), strerror(err));
      }
    }
    std::vector<std::string> dirs;
    for (const std::string& path : paths_) {
      const size_t slash = path.rfind('/');
      dirs.push_back(slash == std::string::npos ? "." : path.substr(0, slash));
    }
    std::sort(dirs.begin(), dirs.end());
    dirs.erase(std::unique(dirs.begin(), dirs.end()), dirs.end());
    paths_.clear();
    for (const std::string& dir : dirs) sync_directory(dir);
  }

 private:
  std::vector<std::string> paths_;  // final names, in the order written
};

// Copies src to dst through write_file_atomically, in chunks of 64 MiB.
inline void copy_file_atomically(const std::string& src, const std::string& dst) {
  File in(src, "rb");
  const long size = in.size();
  std::vector<char> chunk((size_t)std::min<long>(size, 64l << 20));
  write_file_atomically(dst, [&](File& out) {
    for (long done = 0; done < size;) {
      const size_t n = (size_t)std::min<long>((long)chunk.size(), size - done);
      in.read(chunk.data(), n, "the file to copy");
      out.write(chunk.data(), n, "the copy");
      done += (long)n;
    }
  });
}

inline std::string read_text_file(const std::string& path) {
  File f(path, "rb");
  long n = f.size();
  std::string text(n, '\0');
  if (n > 0) f.read(&text[0], n, "the text");
  return text;
}

inline bool file_exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

enum class PathKind { kMissing, kFile, kDirectory, kOther };

// What path names, its links followed: a regular file, a directory, something else (a device, a
// pipe) or nothing.
inline PathKind path_kind(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return PathKind::kMissing;
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  return S_ISDIR(st.st_mode) ? PathKind::kDirectory : PathKind::kOther;
}

// Whether two files hold the same bytes: their sizes are compared first, and their contents only
// where those are equal, up to the first chunk that differs (two shards of one size, the common
// case, differ in their first chunk).
inline bool file_contents_equal(const std::string& a, const std::string& b) {
  File fa(a, "rb"), fb(b, "rb");
  long left = fa.size();
  if (left != fb.size()) return false;
  std::vector<char> chunk_a((size_t)std::min(left, 1l << 16)), chunk_b(chunk_a.size());
  while (left > 0) {
    const size_t n = (size_t)std::min<long>((long)chunk_a.size(), left);
    fa.read(chunk_a.data(), n, "a chunk to compare");
    fb.read(chunk_b.data(), n, "a chunk to compare");
    if (memcmp(chunk_a.data(), chunk_b.data(), n) != 0) return false;
    left -= (long)n;
  }
  return true;
}

// Expands a shell glob pattern, sorted; fails with a message naming the
// pattern when nothing matches.
inline std::vector<std::string> glob_files(const std::string& pattern, const char* flag) {
  glob_t result;
  std::vector<std::string> paths;
  int rc = glob(pattern.c_str(), 0, nullptr, &result);
  if (rc == 0) {
    for (size_t i = 0; i < result.gl_pathc; i++) paths.emplace_back(result.gl_pathv[i]);
  }
  globfree(&result);
  if (paths.empty()) {
    LLMC_FAIL("no files match %s '%s': check the path, or prepare the data first "
              "(see README.md)", flag, pattern.c_str());
  }
  return paths;
}

// mkdir -p; fails with the path and reason.
inline void make_dirs(const std::string& path) {
  std::string partial;
  for (size_t i = 0; i <= path.size(); i++) {
    if (i == path.size() || path[i] == '/') {
      partial = path.substr(0, i);
      if (!partial.empty() && mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        LLMC_FAIL("cannot create directory %s: %s", partial.c_str(), strerror(errno));
      }
    }
  }
}

// make_dirs, then a check that files can be written there, before any work is done; `flag`
// names where the path came from.
inline void make_writable_dirs(const std::string& path, const char* flag) {
  make_dirs(path);
  if (access(path.c_str(), W_OK) != 0) {
    LLMC_FAIL("%s %s is not writable: %s", flag, path.c_str(), strerror(errno));
  }
}

// Fails unless path is an existing directory; `flag` names where it came from.
inline void require_directory(const std::string& path, const char* flag) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) LLMC_FAIL("%s %s: no such directory", flag, path.c_str());
  if (!S_ISDIR(st.st_mode)) LLMC_FAIL("%s %s: %s", flag, path.c_str(), strerror(ENOTDIR));
}

// The kernel's filesystems that show its state as files (a path in them is no place for a run's
// output): root passes their permission checks, but no file or directory can be made there. The
// name of the one dir is in, or nullptr.
inline const char* kernel_filesystem_name(const std::string& dir) {
  struct statfs fs;
  if (statfs(dir.c_str(), &fs) != 0) return nullptr;
  switch (fs.f_type) {
    case PROC_SUPER_MAGIC: return "proc";
    case SYSFS_MAGIC: return "sysfs";
    case CGROUP_SUPER_MAGIC: return "cgroup";
    case CGROUP2_SUPER_MAGIC: return "cgroup2";
    case DEBUGFS_MAGIC: return "debugfs";
    case SECURITYFS_MAGIC: return "securityfs";
    default: return nullptr;
  }
}

// The nearest of path and the directories above it that exists.
inline std::string existing_ancestor(const std::string& path) {
  std::string existing = path;
  while (!file_exists(existing)) {
    const size_t slash = existing.find_last_of('/');
    existing = slash == std::string::npos ? "." : slash == 0 ? "/" : existing.substr(0, slash);
  }
  return existing;
}

// What make_writable_dirs(path) would find, without creating anything: path is a directory
// files can be written in, or the nearest existing directory above it is one that path can be
// created in.
inline void require_writable_dirs(const std::string& path, const char* flag) {
  const std::string existing = existing_ancestor(path);
  if (path_kind(existing) != PathKind::kDirectory) {
    LLMC_FAIL("%s %s: %s is a file: %s", flag, path.c_str(), existing.c_str(), strerror(ENOTDIR));
  }
  std::string why;
  if (access(existing.c_str(), W_OK) != 0) {
    why = strformat("%s is not writable (%s)", existing.c_str(), strerror(errno));
  } else if (const char* filesystem = kernel_filesystem_name(existing)) {
    why = strformat("%s is in the kernel's %s filesystem, where no files can be made",
                    existing.c_str(), filesystem);
  } else {
    return;
  }
  LLMC_FAIL("%s %s: %s: %s; give %s a directory you can write to", flag, path.c_str(),
            existing == path ? "no file can be written in it" : "the directory cannot be created",
            why.c_str(), flag);
}

// The path with its links and "." and ".." resolved, to tell whether two names are one file; the
// path as given where it cannot be resolved.
inline std::string real_path(const std::string& path) {
  char* resolved = realpath(path.c_str(), nullptr);
  if (!resolved) return path;
  const std::string result = resolved;
  free(resolved);
  return result;
}

inline void* malloc_checked(size_t bytes, const char* what) {
  void* p = malloc(bytes);
  if (!p && bytes > 0) LLMC_FAIL("out of host memory allocating %zu bytes for %s", bytes, what);
  return p;
}

// Zeroed; a large block comes from the system's zero pages, with no pass over it.
inline void* calloc_checked(size_t bytes, const char* what) {
  void* p = calloc(bytes, 1);
  if (!p && bytes > 0) LLMC_FAIL("out of host memory allocating %zu bytes for %s", bytes, what);
  return p;
}

// Rounds a up to a multiple of b.
inline size_t round_up(size_t a, size_t b) { return (a + b - 1) / b * b; }

// A program's main: runs body and turns any error into one line "error: <message>" on stderr
// and exit status 1.
inline int run_main(int (*body)(int, char**), int argc, char** argv) {
  try {
    return body(argc, argv);
  } catch (const std::bad_alloc&) {
    fflush(stdout);
    fprintf(stderr, "error: out of host memory: use a smaller model (-e), micro batch (-b) or "
                    "sequence length (-t)\n");
    return 1;
  } catch (const std::exception& e) {
    fflush(stdout);
    fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace llmc
