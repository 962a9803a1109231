// A watchdog for multi-process runs: a thread that calls on_expire when the process has made no
// progress for timeout_s while armed. A process waiting in a collective for a peer that died or
// hangs makes no progress, so it ends within the timeout instead of waiting forever.
//
// The owner calls progress() at points that prove the run moves (each micro step, each
// evaluation batch) and pause() before local work of unbounded length (building the model,
// writing a checkpoint); the next progress() re-arms it. on_expire runs on the watchdog's thread
// and must end the process (it is called once).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace llmc {

class Watchdog {
 public:
  Watchdog(double timeout_s, std::function<void()> on_expire)
      : timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))),
        on_expire_(std::move(on_expire)) {
    progress();
    thread_ = std::thread([this] { watch(); });
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void progress() {
    last_progress_.store(Clock::now().time_since_epoch().count());
    armed_.store(true);
  }
  void pause() { armed_.store(false); }

 private:
  using Clock = std::chrono::steady_clock;

  void watch() {
    // Checks ten times per timeout (at most every second), so it fires within 1.1 timeouts.
    const auto period = std::min<Clock::duration>(timeout_ / 10, std::chrono::seconds(1));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
      const Clock::duration idle =
          Clock::now().time_since_epoch() - Clock::duration(last_progress_.load());
      if (armed_.load() && idle > timeout_) {
        on_expire_();
        return;
      }
    }
  }

  const Clock::duration timeout_;
  const std::function<void()> on_expire_;
  std::atomic<Clock::rep> last_progress_{0};
  std::atomic<bool> armed_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace llmc
