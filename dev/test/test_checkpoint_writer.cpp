// Tests llmc/checkpoint_writer.h, the background writer of checkpoints: its files are byte for
// byte those of a synchronous write, the DONE marker comes after every file and pruning after the
// marker, one job is in flight at a time, wait() drains, and a failed write is reported with the
// file and the reason while the earlier checkpoints stay intact. Also: a BF16 checkpoint written
// from the parameters' bits is the one written from their FP32 values (what the CUDA trainer's
// background path relies on), pruning, and the newest complete checkpoint. Files go to
// build/test_tmp/checkpoint_writer/.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/checkpoint_writer.h"
#include "llmc/gpt2.h"
#include "llmc/train_state.h"

using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const std::string kRoot = "build/test_tmp/checkpoint_writer";
const char* kRemedy = "free space and resume";

// A small model's checkpoint and a state file, as the trainer writes them: the BF16 parameters
// (their bits, and the same values as FP32) and the optimizer state of rank 0 of 1.
struct Checkpoint {
  llmc::GPT2Config config = llmc::make_config(1, 2, 16, 8, 100);
  std::vector<uint16_t> bf16_bits;
  std::vector<float> values;  // exactly the BF16 values
  llmc::TrainStateId id;
  llmc::HostTrainState host;
  std::vector<float> adam_m, adam_v, master;

  explicit Checkpoint(int step) {
    const size_t n = llmc::num_parameters(config);
    llmc::Rng rng(step);
    for (size_t i = 0; i < n; i++) {
      bf16_bits.push_back(llmc::float_to_bf16_bits(rng.uniform_float() - 0.5f));
      values.push_back(llmc::bf16_bits_to_float(bf16_bits.back()));
      adam_m.push_back(rng.uniform_float());
      adam_v.push_back(rng.uniform_float());
      master.push_back(rng.uniform_float());
    }
    id.step = step;
    id.num_params = n;
    id.master_weights = true;
    memset(&host, 0, sizeof(host));
    host.model_rng = rng.state();
  }

  void save_model_from_bits(const std::string& dir) const {
    llmc::checkpoint_save_payload(llmc::checkpoint_path(dir, "model", id.step), config,
                                  llmc::kCheckpointVersionBF16, bf16_bits.data());
  }
  void save_state(const std::string& dir) const {
    llmc::train_state_save(llmc::checkpoint_path(dir, "state", id.step, 0), id, id.step, host,
                           adam_m.data(), adam_v.data(), master.data());
  }

  // The trainer's job for this checkpoint: the model from its bits, then the state, then DONE.
  llmc::CheckpointJob job(const std::string& dir, int keep_last = 0) const {
    llmc::CheckpointJob job;
    job.dir = dir;
    job.step = id.step;
    job.write_files = {[this, dir] { save_model_from_bits(dir); }, [this, dir] { save_state(dir); }};
    job.mark_done = true;
    job.keep_last = keep_last;
    job.remedy = kRemedy;
    return job;
  }
};

std::vector<std::string> files_matching(const std::string& pattern) {
  std::vector<std::string> paths;
  glob_t g;
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  return paths;
}

// An empty directory for one test (of files: the tests make no subdirectories).
std::string fresh_dir(const std::string& name) {
  const std::string dir = kRoot + "/" + name;
  for (const std::string& f : files_matching(dir + "/*")) remove(f.c_str());
  llmc::make_dirs(dir);
  return dir;
}

bool same_bytes(const std::string& a, const std::string& b) {
  return llmc::file_exists(a) && llmc::file_exists(b) &&
         llmc::read_text_file(a) == llmc::read_text_file(b);
}

bool no_temporary_files(const std::string& dir) {
  return files_matching(dir + "/*.tmp").empty();
}

// A job that cannot finish before release(): for watching what happens meanwhile.
class Gate {
 public:
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    opened_.wait(lock, [this] { return open_; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

void test_same_bytes_as_synchronous() {
  const Checkpoint c(5);
  const std::string sync_dir = fresh_dir("sync"), async_dir = fresh_dir("async");
  llmc::checkpoint_save(llmc::checkpoint_path(sync_dir, "model", 5), c.config, c.values.data(),
                        llmc::kCheckpointVersionBF16);
  c.save_state(sync_dir);
  llmc::write_done_marker(sync_dir, 5);
  llmc::CheckpointWriter writer;
  writer.submit(c.job(async_dir));
  writer.wait();
  check_verbose(same_bytes(sync_dir + "/model_00000005.bin", async_dir + "/model_00000005.bin"),
                "background model_00000005.bin (from the BF16 bits) is byte for byte the "
                "synchronous one (from the FP32 values)");
  for (const std::string name : {"state_00000005_00000.bin", "DONE_00000005"}) {
    check_verbose(same_bytes(sync_dir + "/" + name, async_dir + "/" + name),
                  "background " + name + " is byte for byte the synchronous one");
  }
  check(no_temporary_files(async_dir), "the background write leaves no temporary file");
}

void test_done_after_files_and_prune_after_done() {
  const std::string dir = fresh_dir("order");
  const Checkpoint old_checkpoint(1), c(2);
  llmc::CheckpointWriter writer;
  writer.submit(old_checkpoint.job(dir));
  writer.wait();
  std::vector<std::string> events;
  llmc::CheckpointJob job = c.job(dir, /*keep_last=*/1);
  job.wait_for_data = [&] { events.push_back("data"); };
  for (std::function<void()>& write : job.write_files) {
    write = [&events, dir, write] {
      const bool done = llmc::file_exists(llmc::done_marker_path(dir, 2));
      const bool old_kept = llmc::file_exists(llmc::done_marker_path(dir, 1));
      write();
      events.push_back(std::string("file") + (done ? " after DONE" : "") + (old_kept ? "" : " after pruning"));
    };
  }
  writer.submit(job);
  writer.wait();
  check_verbose(events == std::vector<std::string>({"data", "file", "file"}),
                "the data is waited for first, then each file, none after DONE_2 or the pruning");
  check_verbose(llmc::file_exists(llmc::done_marker_path(dir, 2)), "DONE_2 is written after the files");
  check_verbose(!llmc::file_exists(llmc::done_marker_path(dir, 1)) &&
                    !llmc::file_exists(llmc::checkpoint_path(dir, "model", 1)) &&
                    !llmc::file_exists(llmc::checkpoint_path(dir, "state", 1, 0)),
                "with keep_last 1 the checkpoint of step 1 is pruned once DONE_2 exists");
}

void test_one_job_in_flight() {
  const std::string dir = fresh_dir("in_flight");
  Gate gate;
  std::vector<int> order;
  llmc::CheckpointWriter writer;
  llmc::CheckpointJob first;
  first.dir = dir;
  first.step = 1;
  first.write_files = {[&] { gate.wait(); order.push_back(1); }};
  writer.submit(first);
  llmc::CheckpointJob second = first;
  second.step = 2;
  second.write_files = {[&] { order.push_back(2); }};
  std::atomic<bool> second_submitted{false};
  std::thread submitter([&] {
    writer.submit(second);
    second_submitted = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  check_verbose(writer.busy() && !writer.done() && !second_submitted,
                "while a job is in flight the writer is busy, not done, and the next submit waits");
  gate.release();
  submitter.join();
  writer.wait();
  check_verbose(second_submitted && order == std::vector<int>({1, 2}) && !writer.busy() && writer.done(),
                "the next job starts once the one in flight is done; wait() leaves the writer done");
}

void test_wait_drains() {
  const std::string dir = fresh_dir("drain");
  const Checkpoint c(3);
  llmc::CheckpointWriter writer;
  llmc::CheckpointJob job = c.job(dir);
  job.wait_for_data = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  writer.submit(job);
  const bool busy_after_submit = writer.busy();
  const double before = writer.last_write_seconds();
  writer.wait();
  check_verbose(busy_after_submit && !writer.busy() && llmc::latest_checkpoint_step(dir) == 3,
                "submit returns while the job runs; wait() returns with its DONE marker written");
  const double with_files = writer.last_write_seconds();
  llmc::CheckpointJob marker_only;
  marker_only.dir = dir;
  marker_only.step = 3;
  marker_only.mark_done = true;
  writer.submit(marker_only);
  writer.wait();
  check_verbose(before == 0.0 && with_files >= 0.2 && writer.last_write_seconds() == with_files,
                llmc::strformat("the write's seconds (%.3f) count its wait for the data (0.2 s); a "
                                "job with the marker alone leaves them", with_files));
  {
    const Checkpoint fourth(4);
    llmc::CheckpointWriter leaving;
    llmc::CheckpointJob next = fourth.job(dir);
    next.wait_for_data = job.wait_for_data;
    leaving.submit(next);
  }
  check_verbose(llmc::latest_checkpoint_step(dir) == 4,
                "a writer going out of scope finishes the job in flight, DONE marker included");
}

void test_failure() {
  const std::string dir = fresh_dir("failure");
  const Checkpoint first(1), second(2), third(3);
  llmc::CheckpointWriter writer;
  writer.submit(first.job(dir, /*keep_last=*/1));
  writer.wait();
  const std::string first_model = llmc::read_text_file(llmc::checkpoint_path(dir, "model", 1));
  const std::string first_state = llmc::read_text_file(llmc::checkpoint_path(dir, "state", 1, 0));
  // The state file of step 2 goes where a regular file stands for its directory: opening it
  // fails (ENOTDIR) for any user, root included.
  const std::string blocker = dir + "/blocker";
  llmc::File(blocker, "wb").close();
  llmc::CheckpointJob job = second.job(dir, /*keep_last=*/1);
  job.write_files[1] = [&] { second.save_state(blocker); };
  writer.submit(job);
  const std::string expected = "checkpoint write failed (step 2): cannot open " +
                               llmc::checkpoint_path(blocker, "state", 2, 0) +
                               ".tmp for writing: Not a directory; " + kRemedy;
  check_throws([&] { writer.wait(); }, expected, "a job whose state file cannot be opened");
  check_verbose(writer.failed() && !writer.busy() && !writer.done(),
                "the writer keeps the failure: idle, but not done");
  check_throws([&] { writer.check(); }, expected, "check() after the failure");
  bool third_ran = false;
  llmc::CheckpointJob later = third.job(dir);
  later.wait_for_data = [&] { third_ran = true; };
  check_throws([&] { writer.submit(later); }, expected, "submit() after the failure");
  writer.drain();
  check(!third_ran, "no job runs after a failure");
  check_verbose(!llmc::file_exists(llmc::done_marker_path(dir, 2)) &&
                    llmc::latest_checkpoint_step(dir) == 1,
                "the failed checkpoint has no DONE marker: the newest complete one is step 1");
  check_verbose(llmc::read_text_file(llmc::checkpoint_path(dir, "model", 1)) == first_model &&
                    llmc::read_text_file(llmc::checkpoint_path(dir, "state", 1, 0)) == first_state,
                "the checkpoint of step 1 is intact, not pruned (keep_last 1) by the failed step 2");
  check(no_temporary_files(dir), "the failed write leaves no temporary file");

  // A full disk: /dev/full fails every write with ENOSPC, which reaches the report as it is.
  llmc::CheckpointWriter full_disk;
  llmc::CheckpointJob to_full;
  to_full.dir = dir;
  to_full.step = 4;
  to_full.write_files = {[&] {
    llmc::File f("/dev/full", "wb");
    f.write(first_model.data(), first_model.size(), "the parameters");
    f.close(/*sync=*/true);
  }};
  to_full.remedy = kRemedy;
  full_disk.submit(to_full);
  check_throws([&] { full_disk.wait(); }, "checkpoint write failed (step 4): /dev/full: ",
               "a write to a full disk");
  check_throws([&] { full_disk.check(); }, "No space left on device", "the full disk's reason");
}

void test_prune_and_latest() {
  const std::string dir = fresh_dir("prune");
  check(llmc::latest_checkpoint_step(dir) == -1, "an empty directory has no complete checkpoint");
  for (int step = 1; step <= 7; step++) {
    llmc::File(llmc::checkpoint_path(dir, "model", step), "wb").close();
    llmc::File(llmc::checkpoint_path(dir, "state", step, 0), "wb").close();
    llmc::File(llmc::checkpoint_path(dir, "state", step, 1), "wb").close();
    if (step != 7) llmc::write_done_marker(dir, step);
  }
  check_verbose(llmc::latest_checkpoint_step(dir) == 6, "step 7 has no DONE marker: the newest is 6");
  llmc::prune_checkpoints(dir, /*keep_last=*/2, /*keep_every=*/3);
  std::vector<int> kept;
  for (int step = 1; step <= 7; step++) {
    if (llmc::file_exists(llmc::checkpoint_path(dir, "model", step))) kept.push_back(step);
  }
  check_verbose(llmc::checkpoint_done_steps(dir) == std::vector<int>({3, 5, 6}) &&
                    kept == std::vector<int>({3, 5, 6, 7}),
                "keep 2 and every 3rd: steps 3, 5, 6 stay, 7 (no marker) is left alone");
  check(!llmc::file_exists(llmc::checkpoint_path(dir, "state", 4, 1)),
        "pruning deletes every rank's state file");
}

// A file of an old checkpoint that cannot be deleted (a directory with a file in it, where a
// state file was): the new checkpoint is complete and the failure says so, not that it failed.
void test_prune_failure() {
  const std::string dir = fresh_dir("prune_failure");
  const std::string undeletable = llmc::checkpoint_path(dir, "state", 1, 1);
  const std::string inside = undeletable + "/file";
  remove(inside.c_str());
  rmdir(undeletable.c_str());
  const Checkpoint first(1), second(2);
  llmc::CheckpointWriter writer;
  writer.submit(first.job(dir));
  writer.wait();
  llmc::make_dirs(undeletable);
  llmc::File(inside, "wb").close();
  writer.submit(second.job(dir, /*keep_last=*/1));
  check_throws([&] { writer.wait(); },
               "the checkpoint of step 2 is complete, but deleting an older one (-nk) failed: "
               "cannot delete the old checkpoint file " + undeletable + ": Directory not empty; "
               "fix the permissions in " + dir + " and resume with -y 1",
               "a file pruning cannot delete");
  check_verbose(llmc::latest_checkpoint_step(dir) == 2 &&
                    llmc::file_exists(llmc::checkpoint_path(dir, "state", 2, 0)),
                "the new checkpoint is complete: the newest to resume from");
  check_verbose(llmc::checkpoint_done_steps(dir) == std::vector<int>({2}),
                "the old checkpoint's marker went first: it is not taken for a complete one");
  remove(inside.c_str());
  rmdir(undeletable.c_str());
}

}  // namespace

int main() {
  try {
    llmc::make_dirs(kRoot);
    test_same_bytes_as_synchronous();
    test_done_after_files_and_prune_after_done();
    test_one_job_in_flight();
    test_wait_drains();
    test_failure();
    test_prune_and_latest();
    test_prune_failure();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_checkpoint_writer");
}
