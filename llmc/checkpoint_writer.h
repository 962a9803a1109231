// The thread that writes a run's checkpoints in the background (the files of a checkpoint, its
// DONE marker and pruning: llmc/checkpoint_files.h).
//
// CheckpointWriter runs checkpoint jobs on one thread, one job at a time: submit() first waits for
// the job in flight, so the buffers a job reads can be refilled once submit() or drain() has
// returned. A job stops at its first failure (a full disk, a missing permission), which is kept
// with the file and the reason and reported by every later submit(), check() and wait(); the
// failed job writes no marker and prunes nothing, so the earlier checkpoints stay as they were.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint_files.h"
#include "utils.h"

namespace llmc {

// What one checkpoint writes. wait_for_data (when set) returns once the buffers the files are
// written from hold the checkpoint (copies from a GPU); each of write_files writes one file
// through write_file_atomically and throws Error on failure.
struct CheckpointJob {
  std::string dir;
  int step = 0;
  std::function<void()> wait_for_data;
  std::vector<std::function<void()>> write_files;
  bool mark_done = false;  // then DONE_<step>, then prune_checkpoints(keep_last, keep_every)
  int keep_last = 0, keep_every = 0;
  std::string remedy;  // what to do after a failure, the end of its message
};

// Runs a job on the calling thread, up to its DONE marker; throws the first failure as it comes.
inline void checkpoint_job_write(const CheckpointJob& job) {
  if (job.wait_for_data) job.wait_for_data();
  for (const std::function<void()>& write_file : job.write_files) write_file();
  if (job.mark_done) write_done_marker(job.dir, job.step);
}

// The message of a job's failure, "" when it succeeded. Pruning comes after the marker: a failure
// there leaves the job's checkpoint complete, and says so.
inline std::string checkpoint_job_run(const CheckpointJob& job) {
  try {
    checkpoint_job_write(job);
  } catch (const std::exception& e) {
    return strformat("checkpoint write failed (step %d): %s; %s", job.step, e.what(), job.remedy.c_str());
  }
  if (!job.mark_done) return "";
  try {
    prune_checkpoints(job.dir, job.keep_last, job.keep_every);
  } catch (const std::exception& e) {
    return strformat("the checkpoint of step %d is complete, but deleting an older one (-nk) failed: "
                     "%s; fix the permissions in %s and resume with -y 1", job.step, e.what(),
                     job.dir.c_str());
  }
  return "";
}

class CheckpointWriter {
 public:
  CheckpointWriter() : thread_([this] { work(); }) {}
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Finishes the job in flight (its files, and its marker when it has one), so that leaving with
  // an error elsewhere still completes a checkpoint whose data was taken.
  ~CheckpointWriter() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    job_ready_.notify_all();
    thread_.join();
  }

  // Waits for the job in flight, then starts this one; fails with the kept failure instead when
  // an earlier job failed.
  void submit(CheckpointJob job) {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return !job_; });
    if (!failure_.empty()) fail(failure_);
    job_.reset(new CheckpointJob(std::move(job)));
    job_ready_.notify_all();
  }

  bool busy() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return job_ != nullptr;
  }

  bool failed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !failure_.empty();
  }

  // Every job submitted so far has written all it had to: none in flight and none failed (asked
  // at once, so a job that fails between two questions never passes for one that succeeded).
  bool done() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !job_ && failure_.empty();
  }

  // Returns once no job is in flight.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return !job_; });
  }

  // Seconds the last job with files took, from its start (waiting for its data included) to its
  // marker; 0 before one has succeeded. A job with the marker alone leaves it as it was.
  double last_write_seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_write_seconds_;
  }

  // Throws the first failure of any job so far: "checkpoint write failed (step S): <what failed,
  // naming the file and the reason>; <the job's remedy>".
  void check() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) fail(failure_);
  }

  void wait() {
    drain();
    check();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      job_ready_.wait(lock, [this] { return job_ || stopping_; });
      if (!job_) return;
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      const std::string failure = checkpoint_job_run(*job_);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      lock.lock();
      if (failure.empty() && !job_->write_files.empty()) last_write_seconds_ = seconds;
      if (failure_.empty()) failure_ = failure;
      job_.reset();
      idle_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable job_ready_, idle_;
  std::unique_ptr<CheckpointJob> job_;  // the job in flight
  std::string failure_;
  double last_write_seconds_ = 0.0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

}  // namespace llmc
