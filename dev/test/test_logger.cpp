// Tests llmc/logger.h: the line format, parsing it back, the three opening
// modes, and the errors. Logs go to build/test_tmp/logger/.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/logger.h"

using llmc::Logger;
using llmc::LogMode;
using llmc::LogRecord;
using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const std::string kDir = "build/test_tmp/logger";

void write_text(const std::string& path, const std::string& text) {
  llmc::File f(path, "w");
  f.write(text.data(), text.size(), "test text");
  f.close();
}

void test_format_and_parse() {
  const std::string dir = kDir + "/format";
  {
    Logger log(dir, "-o", nullptr, LogMode::kOverwrite);
    log.train(12, 3.4567891, 1.23451, 6e-4, 123.454, 532100.4);
    log.val(12, 3.5123449);
    log.eval(12, "hellaswag", 0.295);
    // Flushed per line: readable while the logger is still open.
    check_verbose(llmc::read_run_log(log.path()).size() == 3, "lines are readable before close");
    log.train(13, NAN, INFINITY, 6e-4, 1.0, 0.0);
  }
  const std::string text = llmc::read_text_file(dir + "/main.log");
  const std::string expected =
      "step=12 kind=train loss=3.456789 norm=1.2345 lr=6.0000e-04 ms=123.45 tok_per_s=532100\n"
      "step=12 kind=val loss=3.512345\n"
      "step=12 kind=eval hellaswag=0.295000\n"
      "step=13 kind=train loss=nan norm=inf lr=6.0000e-04 ms=1.00 tok_per_s=0\n";
  if (!check_verbose(text == expected, "main.log holds exactly the documented lines")) {
    printf("     got:\n%s     expected:\n%s", text.c_str(), expected.c_str());
  }

  const std::vector<LogRecord> records = llmc::read_run_log(dir + "/main.log");
  check_verbose(records.size() == 4 && records[0].step == 12 && records[0].kind == "train" &&
                    records[0].number("loss") == 3.456789 && records[0].number("norm") == 1.2345 &&
                    records[0].number("lr") == 6e-4 && records[0].number("ms") == 123.45 &&
                    records[0].number("tok_per_s") == 532100.0 && records[1].kind == "val" &&
                    records[1].number("loss") == 3.512345 && records[2].kind == "eval" &&
                    records[2].number("hellaswag") == 0.295 &&
                    std::isnan(records[3].number("loss")) && std::isinf(records[3].number("norm")),
                "read_run_log parses every line back, nan and inf included");
  check(records[0].has("lr") && !records[0].has("hellaswag"), "LogRecord::has");
  check_throws([&] { records[1].number("norm"); }, "has no norm", "a missing key");
}

void test_modes() {
  const std::string dir = kDir + "/modes";
  { Logger log(dir, "-o", nullptr, LogMode::kOverwrite); }
  {
    Logger log(dir, "-o", nullptr, LogMode::kNew);  // an empty log may be reused
    for (long step = 0; step < 6; step++) {
      log.train(step, 5.0 - step, 1.0, 1e-3, 10.0, 1000.0);
      if (step % 2 == 0) log.val(step, 6.0 - step);
    }
  }
  check_throws([&] { Logger log(dir, "-o", "-y 1", LogMode::kNew); },
               "modes/main.log already holds a run log: resume that run with -y 1, give -o "
               "another directory, or delete the log",
               "a new run refuses to clobber an existing log, in a program that resumes");
  check_throws([&] { Logger log(dir, "-o", nullptr, LogMode::kNew); },
               "modes/main.log already holds a run log: give -o another directory, or delete the log",
               "the same in a program that cannot resume: no word of resuming");
  {
    Logger log(dir, "-o", nullptr, LogMode::kResume, 3);
    log.train(3, 0.5, 1.0, 1e-3, 10.0, 1000.0);
  }
  std::vector<LogRecord> records = llmc::read_run_log(dir + "/main.log");
  std::string steps;
  for (const LogRecord& r : records) steps += llmc::strformat("%ld%s ", r.step, r.kind.c_str());
  check_verbose(steps == "0train 0val 1train 2train 2val 3train ",
                "resume at step 3 keeps steps 0-2, drops 3-5 of the interrupted run, appends: " +
                    steps);
  check_verbose(records.back().number("loss") == 0.5, "the appended line is the resumed run's");

  write_text(dir + "/main.log",
             "step=0 kind=train loss=1.0\nstep=1 kind=train loss=0.9\nstep=2 kin");
  { Logger log(dir, "-o", nullptr, LogMode::kResume, 5); }
  records = llmc::read_run_log(dir + "/main.log");
  check_verbose(records.size() == 2 && llmc::read_text_file(dir + "/main.log").back() == '\n',
                "resume drops a last line cut short by the interruption");

  { Logger log(dir, "-o", nullptr, LogMode::kOverwrite); }
  check_verbose(llmc::read_text_file(dir + "/main.log").empty(), "overwrite starts an empty log");

  const std::string fresh = kDir + "/resume_without_log";
  std::remove((fresh + "/main.log").c_str());
  {
    Logger log(fresh, "-o", nullptr, LogMode::kResume, 10);
    log.val(10, 2.0);
  }
  check_verbose(llmc::read_run_log(fresh + "/main.log").size() == 1,
                "resume without an existing log starts one");
}

void test_errors() {
  check_throws([] { llmc::parse_log_line("kind=train step=1", "x.log:1"); },
               "x.log:1: a log line must start with step=N", "kind before step");
  check_throws([] { llmc::parse_log_line("step=1x kind=train", "x.log:2"); },
               "x.log:2: a log line must start with step=N", "a step that is not a number");
  check_throws([] { llmc::parse_log_line("step=1 loss=2", "x.log:3"); },
               "x.log:3: the second key of a log line must be kind", "a line without kind");
  check_throws([] { llmc::parse_log_line("step=1 kind=train loss", "x.log:4"); },
               "x.log:4: 'loss' is not key=value", "a token without '='");
  check_throws([] { llmc::parse_log_line("step=1", "x.log:5"); },
               "x.log:5: 'step=1' is not a log line", "a line with only a step");

  const std::string dir = kDir + "/errors";
  { Logger log(dir, "-o", nullptr, LogMode::kOverwrite); }
  write_text(dir + "/main.log", "step=0 kind=train loss=1.0\nthis is not a log\n");
  check_throws([&] { Logger log(dir, "-o", nullptr, LogMode::kResume, 1); },
               "errors/main.log:2: 'this' is not key=value",
               "resume over a damaged log names the line");
  Logger log(dir, "-o", nullptr, LogMode::kOverwrite);
  check_throws([&] { log.eval(1, "hella swag", 0.1); },
               "eval name 'hella swag' cannot be a log key", "an eval name with a space");
  check_throws([&] { log.eval(1, "step", 0.1); }, "cannot be a log key", "an eval named step");

  write_text(kDir + "/a_file", "x");
  check_throws([] { Logger l(kDir + "/a_file", "-o", nullptr, LogMode::kNew); },
               "-o build/test_tmp/logger/a_file: build/test_tmp/logger/a_file is a file: Not a "
               "directory", "a directory that is a file");
  check_throws([] { Logger l(kDir + "/a_file/sub", "-o", nullptr, LogMode::kNew); },
               "-o build/test_tmp/logger/a_file/sub: build/test_tmp/logger/a_file is a file: Not a "
               "directory", "a directory below a file");
  // check_log_dir: the same checks, and nothing created.
  check_throws([] { llmc::check_log_dir(kDir + "/a_file/sub", "-o", nullptr, LogMode::kNew); },
               "build/test_tmp/logger/a_file is a file", "check_log_dir: a directory below a file");
  // Root passes the permission check of /proc, where no directory can be made all the same (the
  // message goes on "in the kernel's proc filesystem" for root, "not writable" for the others).
  check_throws([] { llmc::check_log_dir("/proc/x/run", "-o", nullptr, LogMode::kNew); },
               "-o /proc/x/run: the directory cannot be created: /proc is ",
               "check_log_dir: a directory in /proc");
  check_throws([] { llmc::check_log_dir("/proc", "-o", nullptr, LogMode::kNew); },
               "-o /proc: no file can be written in it: /proc is", "check_log_dir: /proc itself");
  llmc::check_log_dir(kDir + "/new/run", "-o", nullptr, LogMode::kNew);
  check_verbose(!llmc::file_exists(kDir + "/new"), "check_log_dir creates nothing");
  check_throws([] { llmc::read_run_log(kDir + "/missing/main.log"); },
               "cannot open build/test_tmp/logger/missing/main.log for reading", "a missing log");
}

}  // namespace

int main() {
  try {
    llmc::make_dirs(kDir);
    test_format_and_parse();
    test_modes();
    test_errors();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_logger");
}
