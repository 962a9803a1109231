// Tests llmc/progress.h: duration formatting, the time-left estimate over a window of steps (the
// first left out), and the summary lines (including validation losses taken from a resumed run's
// log).
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/progress.h"

using testing::check_verbose;

namespace {

void check_equal(const std::string& got, const std::string& expected, const std::string& what) {
  check_verbose(got == expected, what + ": '" + got + "' (expected '" + expected + "')");
}

void test_format_duration() {
  check_equal(llmc::format_duration(0.4), "0s", "under a second");
  check_equal(llmc::format_duration(59.4), "59s", "seconds");
  check_equal(llmc::format_duration(725), "12m05s", "minutes and seconds");
  check_equal(llmc::format_duration(3 * 3600 + 7 * 60 + 59), "3h07m", "hours and minutes");
  check_equal(llmc::format_duration(2 * 86400 + 4 * 3600 + 5), "2d04h", "days and hours");
  check_equal(llmc::format_duration(-3), "0s", "a negative time is zero");
}

void test_eta() {
  llmc::EtaEstimator eta(3);
  eta.step_finished(110.0);  // the first step, with its warm-up: left out
  check_verbose(eta.seconds_left(10) == 0.0, "only the first step finished: no estimate");
  check_equal(eta.time_left(1, 9), "after step 2", "the first step's line names the step that gives one");
  check_equal(eta.time_left(1, 0), "0s", "nothing left after a one-step run");
  eta.step_finished(112.0);
  check_verbose(eta.seconds_left(4) == 8.0, "one step of 2 s after the first, 4 left: 8 s");
  check_equal(eta.time_left(2, 4), "8s", "the second step's line has the time left");
  eta.step_finished(120.0);
  eta.step_finished(122.0);
  check_verbose(eta.seconds_left(3) == 12.0, "steps of 2, 8, 2 s, 3 left: 12 s");
  eta.step_finished(124.0);  // the 2 s step after the first leaves the window of 3
  check_verbose(eta.seconds_left(5) == 20.0, "the window keeps the last 3 steps: 8, 2, 2 s, 5 left: 20 s");
}

void test_summary() {
  llmc::RunSummary fresh(1000.0, 256);
  check_equal(fresh.lines(1012.5, 4)[0], "summary: wall time 13s (12.5 s), 4 steps", "wall time");
  check_equal(fresh.lines(1012.5, 4)[1], "summary: tokens seen 1024 (4 steps of 256)", "tokens seen");
  check_equal(fresh.lines(1012.5, 4)[2], "summary: best val loss none (no validation)", "no validation");
  check_equal(fresh.lines(1012.5, 4)[3], "summary: last checkpoint none", "no checkpoint");
  llmc::RunSummary staged(0.0, [](long steps) { return steps <= 3 ? steps * 100 : 300 + (steps - 3) * 200; });
  check_equal(staged.lines(1.0, 5)[1], "summary: tokens seen 700 (5 steps of the stage plan)",
              "tokens seen where a stage plan changes a step's tokens");

  llmc::RunSummary resumed(0.0, 100);
  resumed.add_logged({llmc::parse_log_line("step=0 kind=val loss=5.5", "log:1"),
                      llmc::parse_log_line("step=1 kind=train loss=1.0 norm=1 lr=1 ms=1 tok_per_s=1", "log:2"),
                      llmc::parse_log_line("step=10 kind=val loss=4.25", "log:3"),
                      llmc::parse_log_line("step=10 kind=eval hellaswag=0.3", "log:4")});
  resumed.val_loss(20, 4.5);
  resumed.checkpoint("out/model_00000010.bin");
  resumed.checkpoint("out/model_00000020.bin");
  check_equal(resumed.lines(1.0, 20)[2], "summary: best val loss 4.250000 at step 10",
              "the best val loss, from the log of the earlier part");
  check_equal(resumed.lines(1.0, 20)[3], "summary: last checkpoint out/model_00000020.bin",
              "the last checkpoint written");
  resumed.val_loss(30, 4.0);
  check_equal(resumed.lines(1.0, 30)[2], "summary: best val loss 4.000000 at step 30", "a new best");
}

}  // namespace

int main() {
  try {
    test_format_duration();
    test_eta();
    test_summary();
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_progress");
}
