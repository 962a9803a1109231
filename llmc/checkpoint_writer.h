// The checkpoints of a run's output directory, and the thread that writes them in the background.
//
// A checkpoint of step s in DIR is a set of files (model_<s>.bin, state_<s>_<rank>.bin) and the
// marker DONE_<s>, written once every file of it is complete. Each file is written under a
// temporary name, synced and renamed (write_file_atomically), so a checkpoint with a marker is
// whole however its writer ended, and one without a marker is ignored. Older checkpoints are
// pruned only after the newest one's marker exists.
//
// CheckpointWriter runs checkpoint jobs on one thread, one job at a time: submit() first waits for
// the job in flight, so the buffers a job reads can be refilled once submit() or drain() has
// returned. A job stops at its first failure (a full disk, a missing permission), which is kept
// with the file and the reason and reported by every later submit(), check() and wait(); the
// failed job writes no marker and prunes nothing, so the earlier checkpoints stay as they were.
#pragma once

#include <algorithm>
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

#include <glob.h>

#include "utils.h"

namespace llmc {

// kind "model": DIR/model_<step>.bin; with a rank, kind "state": DIR/state_<step>_<rank>.bin.
inline std::string checkpoint_path(const std::string& dir, const char* kind, int step, int rank = -1) {
  return rank < 0 ? strformat("%s/%s_%08d.bin", dir.c_str(), kind, step)
                  : strformat("%s/%s_%08d_%05d.bin", dir.c_str(), kind, step, rank);
}

inline std::string done_marker_path(const std::string& dir, int step) {
  return strformat("%s/DONE_%08d", dir.c_str(), step);
}

// The steps of the complete checkpoints in dir (those with a DONE marker), ascending.
inline std::vector<int> checkpoint_done_steps(const std::string& dir) {
  std::vector<int> steps;
  glob_t g;
  if (glob((dir + "/DONE_*").c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; i++) {
      int step = -1;
      if (sscanf(strrchr(g.gl_pathv[i], '/') + 1, "DONE_%d", &step) == 1) steps.push_back(step);
    }
  }
  globfree(&g);
  std::sort(steps.begin(), steps.end());
  return steps;
}

// The newest complete checkpoint's step in dir, or -1.
inline int latest_checkpoint_step(const std::string& dir) {
  const std::vector<int> steps = checkpoint_done_steps(dir);
  return steps.empty() ? -1 : steps.back();
}

inline void write_done_marker(const std::string& dir, int step) {
  File f(done_marker_path(dir, step), "wb");
  f.close(/*sync=*/true);
}

// Deletes complete checkpoints other than the newest keep_last and those whose step is a multiple
// of keep_every (0: none kept that way). keep_last 0 keeps everything. The DONE marker goes first,
// so a checkpoint being deleted is never taken for a complete one.
inline void prune_checkpoints(const std::string& dir, int keep_last, int keep_every) {
  if (keep_last <= 0) return;
  const std::vector<int> steps = checkpoint_done_steps(dir);
  for (size_t i = 0; i + keep_last < steps.size(); i++) {
    const int step = steps[i];
    if (keep_every > 0 && step % keep_every == 0) continue;
    std::vector<std::string> files = {done_marker_path(dir, step), checkpoint_path(dir, "model", step)};
    glob_t g;
    if (glob(strformat("%s/state_%08d_*.bin", dir.c_str(), step).c_str(), 0, nullptr, &g) == 0) {
      for (size_t k = 0; k < g.gl_pathc; k++) files.emplace_back(g.gl_pathv[k]);
    }
    globfree(&g);
    for (const std::string& f : files) {
      if (remove(f.c_str()) != 0 && errno != ENOENT) {
        LLMC_FAIL("cannot delete the old checkpoint file %s: %s", f.c_str(), strerror(errno));
      }
    }
  }
}

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

// Runs a job on the calling thread; throws the first failure as it comes.
inline void checkpoint_job_run(const CheckpointJob& job) {
  if (job.wait_for_data) job.wait_for_data();
  for (const std::function<void()>& write_file : job.write_files) write_file();
  if (!job.mark_done) return;
  write_done_marker(job.dir, job.step);
  prune_checkpoints(job.dir, job.keep_last, job.keep_every);
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
      const std::string failure = run_and_describe_failure(*job_);
      lock.lock();
      if (failure_.empty()) failure_ = failure;
      job_.reset();
      idle_.notify_all();
    }
  }

  // The failure message of a job, "" when it succeeded.
  static std::string run_and_describe_failure(const CheckpointJob& job) {
    try {
      checkpoint_job_run(job);
      return "";
    } catch (const std::exception& e) {
      return strformat("checkpoint write failed (step %d): %s; %s", job.step, e.what(),
                       job.remedy.c_str());
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable job_ready_, idle_;
  std::unique_ptr<CheckpointJob> job_;  // the job in flight
  std::string failure_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

}  // namespace llmc
