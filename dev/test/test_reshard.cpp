// Tests llmc/reshard.h: the optimizer state of P processes and ZeRO stage s resharded for P' and
// s' holds the same value for every parameter, bit for bit (P=2 stage 1 -> 1 process -> P=2 stage
// 1 gives back the same files; 3 shards of a size not divisible by 3; stage 0 -> stage 1), the
// host state is rank 0's, and state files that are not one checkpoint fail with one line naming
// the file. Files go to build/test_tmp/reshard/.
#include <cstring>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/reshard.h"

using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const std::string kDir = "build/test_tmp/reshard";
constexpr size_t kParams = 1000;  // not a multiple of 64, 2 or 3: every layout pads
constexpr int kStep = 7;

// Random whole arrays of the parameters' state: value i of each array differs from every other.
llmc::TrainState random_whole_state(bool master) {
  llmc::TrainState s;
  llmc::Rng rng(42);
  auto fill = [&](std::vector<float>& v) {
    v.resize(kParams);
    for (float& x : v) x = (float)rng.u32() / 4294967296.0f - 0.5f;
  };
  fill(s.adam_m);
  fill(s.adam_v);
  if (master) fill(s.master);
  s.optimizer_steps = kStep - 2;
  memset(&s.host, 0, sizeof(s.host));
  s.host.train_loader.batch_position = 5;
  s.host.train_loader.world = 2;
  s.host.loss_window.count = 3;
  s.host.loss_window.values[2] = 3.25;
  s.host.norm_window.next = 1;
  return s;
}

// The state files a run of `world` processes with `zero_stage` writes for `whole`.
std::vector<llmc::TrainStateFile> files_of(const llmc::TrainState& whole, int world, int zero_stage) {
  std::vector<llmc::TrainStateFile> files(world);
  const int shard_count = llmc::zero_shard_count(world, zero_stage);
  for (int r = 0; r < world; r++) {
    const llmc::ZeroShard shard = llmc::zero_shard(kParams, shard_count, shard_count == 1 ? 0 : r);
    llmc::TrainStateFile& f = files[r];
    f.path = llmc::strformat("%s/state_%d_of_%d.bin", kDir.c_str(), r, world);
    f.id.step = kStep;
    f.id.rank = r;
    f.id.world = world;
    f.id.num_params = shard.size;
    f.id.master_weights = !whole.master.empty();
    f.id.zero_stage = shard_count > 1 ? 1 : 0;
    f.state.optimizer_steps = whole.optimizer_steps;
    f.state.host = whole.host;
    auto slice = [&](const std::vector<float>& v) {
      std::vector<float> out(shard.size, 0.0f);
      std::copy_n(v.begin() + shard.offset, shard.real, out.begin());
      return out;
    };
    f.state.adam_m = slice(whole.adam_m);
    f.state.adam_v = slice(whole.adam_v);
    if (!whole.master.empty()) f.state.master = slice(whole.master);
  }
  return files;
}

bool same_file(const llmc::TrainStateFile& a, const llmc::TrainStateFile& b) {
  return a.id.step == b.id.step && a.id.rank == b.id.rank && a.id.world == b.id.world &&
         a.id.num_params == b.id.num_params && a.id.master_weights == b.id.master_weights &&
         a.id.zero_stage == b.id.zero_stage &&
         a.state.optimizer_steps == b.state.optimizer_steps &&
         memcmp(&a.state.host, &b.state.host, sizeof(a.state.host)) == 0 &&
         a.state.adam_m == b.state.adam_m && a.state.adam_v == b.state.adam_v &&
         a.state.master == b.state.master;  // float ==: no NaN here, so equal means equal bits
}

bool same_files(const std::vector<llmc::TrainStateFile>& a,
                const std::vector<llmc::TrainStateFile>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++) {
    if (!same_file(a[i], b[i])) return false;
  }
  return true;
}

void test_layouts() {
  for (bool master : {true, false}) {
    const llmc::TrainState whole = random_whole_state(master);
    const std::string what = master ? " (with master weights)" : " (without)";
    const auto two_zero = files_of(whole, 2, 1);
    const auto one = llmc::reshard_train_state(two_zero, kParams, 1, 0);
    check_verbose(same_files(one, files_of(whole, 1, 0)),
                  "2 processes, ZeRO 1 -> 1 process: the whole arrays, unpadded" + what);
    check_verbose(same_files(llmc::reshard_train_state(one, kParams, 2, 1), two_zero),
                  "... -> 2 processes, ZeRO 1: the same shards, bit for bit" + what);
    const auto three = llmc::reshard_train_state(two_zero, kParams, 3, 1);
    check_verbose(same_files(three, files_of(whole, 3, 1)) && three[2].id.num_params == 384 &&
                      llmc::zero_shard(kParams, 3, 2).real == 1000 - 2 * 384,
                  "2 processes -> 3, ZeRO 1: shards of 384, the last one holding 232" + what);
    check_verbose(same_files(llmc::reshard_train_state(three, kParams, 2, 0), files_of(whole, 2, 0)),
                  "3 processes, ZeRO 1 -> 2, ZeRO 0: every rank the whole arrays" + what);
    check_verbose(same_files(llmc::reshard_train_state(files_of(whole, 2, 0), kParams, 4, 1),
                             files_of(whole, 4, 1)),
                  "2 processes, ZeRO 0 -> 4, ZeRO 1" + what);
    check_verbose(same_files(llmc::reshard_train_state(two_zero, kParams, 1, 1), files_of(whole, 1, 0)),
                  "-zs 1 on one process is stage 0 in the files, as the trainer writes it" + what);
  }
}

void test_file_round_trip() {
  const llmc::TrainState whole = random_whole_state(true);
  std::vector<llmc::TrainStateFile> read;
  for (const llmc::TrainStateFile& f : files_of(whole, 3, 1)) {
    llmc::train_state_save(f.path, f.id, f.state.optimizer_steps, f.state.host,
                           f.state.adam_m.data(), f.state.adam_v.data(), f.state.master.data());
    read.push_back(llmc::train_state_read(f.path, "re-create it"));
  }
  check_verbose(same_files(read, files_of(whole, 3, 1)),
                "train_state_read gives back the id and state of each file written");
}

void test_mismatched_inputs() {
  const llmc::TrainState whole = random_whole_state(true);
  const auto good = files_of(whole, 2, 1);
  auto reshard = [](std::vector<llmc::TrainStateFile> files, size_t num_params) {
    return [files, num_params] { llmc::reshard_train_state(files, num_params, 1, 0); };
  };
  const std::string second = good[1].path;
  auto changed = [&](auto change) {
    std::vector<llmc::TrainStateFile> files = good;
    change(files[1]);
    return files;
  };
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.id.step = kStep + 1; }), kParams),
               second + ": state of step 8 after 5 AdamW updates, but " + good[0].path +
                   " is of step 7 after 5: give the state files of one checkpoint",
               "state files of two steps");
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.state.optimizer_steps--; }), kParams),
               second + ": state of step 7 after 4 AdamW updates", "state files of two update counts");
  check_throws(reshard(good, kParams + 200),
               good[0].path + ": state of 512 parameters, but a model of 1200 parameters over 2 "
                              "processes with ZeRO stage 1 has 640 per rank",
               "state files of another model");
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.id.num_params = 448; }), kParams),
               second + ": state of 448 parameters", "one state file of another shard size");
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.id.master_weights = false; }), kParams),
               second + ": ZeRO stage 1 without master weights, but", "state files of two -w settings");
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.id.rank = 0; }), kParams),
               second + ": state of rank 0 of 2, expected rank 1 of 2", "a rank given twice");
  check_throws(reshard({good[0]}, kParams),
               good[0].path + ": state of a run of 2 processes, but 1 state files were given",
               "a rank missing");
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.state.host.train_loader.batch_position++; }),
                       kParams),
               second + ": its data position or spike-detector windows differ", "two data positions");
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.state.host.norm_window.count++; }),
                       kParams),
               second + ": its data position or spike-detector windows differ", "two norm windows");
  check_throws([&] { llmc::reshard_train_state(good, kParams, 0, 0); }, "reshard: 0 processes",
               "no processes");
  check_throws([&] { llmc::reshard_train_state(good, kParams, 2, 2); }, "reshard: ZeRO stage 2",
               "an unknown ZeRO stage");
}

}  // namespace

int main() {
  try {
    llmc::make_dirs(kDir);
    test_layouts();
    test_file_round_trip();
    test_mismatched_inputs();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_reshard");
}
