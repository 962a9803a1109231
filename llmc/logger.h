// The run log, DIR/main.log: one line per event, machine-readable.
//
// Format: space-separated key=value pairs; the first key is always step, the
// second always kind; keys and values never contain spaces or '='.
//   step=12 kind=train loss=3.456789 norm=1.2345 lr=6.0000e-04 ms=123.45 tok_per_s=532100
//   step=12 kind=val loss=3.512345
//   step=12 kind=eval hellaswag=0.295000
// Each line is flushed when written, so an interrupted run leaves every line
// up to its last event.
//
// Opening modes:
//   kNew:       start a log; fails if DIR/main.log already has lines, so a
//               second run into the same directory never clobbers the first
//               by accident.
//   kOverwrite: start a log, discarding any existing one.
//   kResume:    continue a run at `first_step`, the first step the resumed run
//               executes: the existing lines with step < first_step are kept,
//               later ones (written after the checkpoint by the interrupted
//               run, and about to be repeated) are dropped, and new lines are
//               appended. The log then reads as one uninterrupted run. A
//               last line cut short by the interruption is dropped too.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "utils.h"

namespace llmc {

enum class LogMode { kNew, kOverwrite, kResume };

struct LogRecord {
  long step = 0;
  std::string kind;
  std::vector<std::pair<std::string, std::string>> fields;  // after step and kind, in order

  bool has(const std::string& key) const {
    for (const auto& f : fields) {
      if (f.first == key) return true;
    }
    return false;
  }

  double number(const std::string& key) const {
    for (const auto& f : fields) {
      if (f.first == key) return strtod(f.second.c_str(), nullptr);
    }
    LLMC_FAIL("log line for step %ld kind=%s has no %s", step, kind.c_str(), key.c_str());
  }
};

// Parses one line; `where` ("DIR/main.log:7") names it in errors.
inline LogRecord parse_log_line(const std::string& line, const std::string& where) {
  LogRecord r;
  size_t pos = 0;
  int index = 0;
  while (pos < line.size()) {
    size_t end = line.find(' ', pos);
    if (end == std::string::npos) end = line.size();
    const std::string token = line.substr(pos, end - pos);
    const size_t eq = token.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == token.size() ||
        token.find('=', eq + 1) != std::string::npos) {
      LLMC_FAIL("%s: '%s' is not key=value; log lines read 'step=N kind=K key=value ...'",
                where.c_str(), token.c_str());
    }
    const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
    if (index == 0) {
      char* rest = nullptr;
      r.step = strtol(value.c_str(), &rest, 10);
      if (key != "step" || *rest != '\0') {
        LLMC_FAIL("%s: a log line must start with step=N, not '%s'", where.c_str(), token.c_str());
      }
    } else if (index == 1) {
      if (key != "kind") {
        LLMC_FAIL("%s: the second key of a log line must be kind, not '%s'", where.c_str(),
                  token.c_str());
      }
      r.kind = value;
    } else {
      r.fields.emplace_back(key, value);
    }
    index++;
    pos = end + 1;
  }
  if (index < 2) {
    LLMC_FAIL("%s: '%s' is not a log line; log lines read 'step=N kind=K key=value ...'",
              where.c_str(), line.c_str());
  }
  return r;
}

// The complete lines of a log's text. A last line without its newline is left
// out: it was being written when the run stopped.
inline std::vector<std::string> complete_log_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (true) {
    const size_t end = text.find('\n', pos);
    if (end == std::string::npos) break;
    lines.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return lines;
}

// Reads a whole log; a missing file is an error naming it.
inline std::vector<LogRecord> read_run_log(const std::string& path) {
  const std::vector<std::string> lines = complete_log_lines(read_text_file(path));
  std::vector<LogRecord> records;
  for (size_t i = 0; i < lines.size(); i++) {
    if (lines[i].empty()) continue;
    records.push_back(parse_log_line(lines[i], strformat("%s:%zu", path.c_str(), i + 1)));
  }
  return records;
}

// The checks a Logger makes before it writes anything, for a program to make before its other
// work: DIR can be written (or created), and a new log (kNew) finds no run log there.
inline void check_log_dir(const std::string& dir, const char* flag, const char* resume_with,
                          LogMode mode) {
  require_writable_dirs(dir, flag);
  const std::string path = dir + "/main.log";
  if (mode == LogMode::kNew && file_exists(path) && File(path, "rb").size() > 0) {
    const std::string resume =
        resume_with ? strformat("resume that run with %s, ", resume_with) : std::string();
    LLMC_FAIL("%s already holds a run log: %sgive %s another directory, or delete the log",
              path.c_str(), resume.c_str(), flag);
  }
}

class Logger {
 public:
  // `flag` names the command-line flag DIR came from, and `resume_with` the flags that resume a
  // run in this program (nullptr where it cannot), for the message about an existing log.
  Logger(const std::string& dir, const char* flag, const char* resume_with, LogMode mode,
         long first_step = 0)
      : path_(dir + "/main.log") {
    check_log_dir(dir, flag, resume_with, mode);
    make_dirs(dir);
    if (mode == LogMode::kResume && file_exists(path_) && File(path_, "rb").size() > 0) {
      keep_lines_before(first_step);
    }
    file_.reset(new File(path_, mode == LogMode::kResume ? "a" : "w"));
  }

  void train(long step, double loss, double norm, double lr, double ms, double tokens_per_second) {
    write_line(strformat("step=%ld kind=train loss=%.6f norm=%.4f lr=%.4e ms=%.2f tok_per_s=%.0f",
                         step, loss, norm, lr, ms, tokens_per_second));
  }

  void val(long step, double loss) {
    write_line(strformat("step=%ld kind=val loss=%.6f", step, loss));
  }

  // An evaluation score, e.g. name "hellaswag" and the accuracy.
  void eval(long step, const std::string& name, double score) {
    bool valid = !name.empty() && name != "step" && name != "kind";
    for (char c : name) {
      valid = valid && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '_');
    }
    if (!valid) {
      LLMC_FAIL("eval name '%s' cannot be a log key: use letters, digits and '_' (not step or "
                "kind)", name.c_str());
    }
    write_line(strformat("step=%ld kind=eval %s=%.6f", step, name.c_str(), score));
  }

  const std::string& path() const { return path_; }

 private:
  void write_line(const std::string& line) {
    const std::string text = line + "\n";
    file_->write(text.data(), text.size(), "a log line");
    if (fflush(file_->handle()) != 0) {
      LLMC_FAIL("%s: writing a log line failed: %s (is the disk full?)", path_.c_str(),
                strerror(errno));
    }
  }

  // Rewrites the log with only the lines before first_step; the rewrite goes
  // to a temporary file renamed over the log, so a crash here loses nothing.
  void keep_lines_before(long first_step) {
    const std::vector<std::string> lines = complete_log_lines(read_text_file(path_));
    std::string kept;
    for (size_t i = 0; i < lines.size(); i++) {
      if (lines[i].empty()) continue;
      const LogRecord r = parse_log_line(lines[i], strformat("%s:%zu", path_.c_str(), i + 1));
      if (r.step < first_step) kept += lines[i] + "\n";
    }
    const std::string temporary = path_ + ".tmp";
    File f(temporary, "w");
    f.write(kept.data(), kept.size(), "the kept log lines");
    f.close(true);
    if (rename(temporary.c_str(), path_.c_str()) != 0) {
      LLMC_FAIL("cannot replace %s with %s: %s", path_.c_str(), temporary.c_str(),
                strerror(errno));
    }
  }

  std::string path_;
  std::unique_ptr<File> file_;
};

}  // namespace llmc
