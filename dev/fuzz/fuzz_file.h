// What the fuzz targets share. The parsers read files by path, so each input is written to a
// scratch file first; and a target checks more than "no crash" with require(), which aborts (a
// crash to libFuzzer, which saves the input) when a property of an accepted file does not hold.
//
// llmc::Error is the expected outcome of a bad input and each target catches it; anything else
// escaping a target (std::bad_alloc from a size no file check bounded, any other exception)
// reaches std::terminate and is reported as a crash.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <unistd.h>

#include "llmc/utf8.h"
#include "llmc/utils.h"

namespace fuzz {

[[noreturn]] inline void fail_property(const char* what) {
  fprintf(stderr, "fuzz property violated: %s\n", what);
  abort();
}

inline void require(bool ok, const char* what) {
  if (!ok) fail_property(what);
}

inline bool is_utf8(std::string_view text) {
  try {
    llmc::utf8_validate(text);
  } catch (const llmc::Error&) {
    return false;
  }
  return true;
}

// A file under $TMPDIR (or /tmp) named after the process, so that parallel fuzzing jobs do not
// share one; rewritten for each input and removed when the process exits normally.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& name) {
    const char* dir = getenv("TMPDIR");
    path_ = llmc::strformat("%s/llmc_fuzz_%d_%s", dir && *dir ? dir : "/tmp", (int)getpid(),
                            name.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile() { unlink(path_.c_str()); }

  const std::string& path() const { return path_; }

  const std::string& write(const uint8_t* data, size_t size) {
    llmc::File f(path_, "wb");
    if (size > 0) f.write(data, size, "the fuzz input");
    f.close();
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace fuzz
