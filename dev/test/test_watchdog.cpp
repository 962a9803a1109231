// Tests llmc/watchdog.h in forked processes: without progress it ends the process within the
// bound; fed progress, or paused, it does not fire.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "dev/test/testing.h"
#include "llmc/watchdog.h"

using testing::check_verbose;

namespace {

constexpr int kExpiredStatus = 7;

// Runs body in a child with a 0.5 s watchdog; returns its exit status and the seconds it took.
int run_child(void (*body)(llmc::Watchdog&), double* seconds) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    llmc::Watchdog watchdog(0.5, [] { _exit(kExpiredStatus); });
    body(watchdog);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

}  // namespace

int main() {
  double seconds = 0;
  int status = run_child([](llmc::Watchdog&) { sleep_s(5.0); }, &seconds);
  check_verbose(status == kExpiredStatus && seconds >= 0.5 && seconds < 1.0,
                llmc::strformat("no progress: expired after %.2f s (timeout 0.5 s), status %d", seconds, status));
  status = run_child([](llmc::Watchdog& w) {
    for (int i = 0; i < 15; i++) {
      sleep_s(0.1);
      w.progress();
    }
  }, &seconds);
  check_verbose(status == 0, llmc::strformat("progress every 0.1 s for %.2f s: not expired", seconds));
  status = run_child([](llmc::Watchdog& w) {
    w.pause();
    sleep_s(1.2);
    w.progress();
    sleep_s(5.0);
  }, &seconds);
  check_verbose(status == kExpiredStatus && seconds >= 1.7 && seconds < 2.3,
                llmc::strformat("paused 1.2 s, then re-armed: expired after %.2f s", seconds));
  return testing::summary("test_watchdog");
}
