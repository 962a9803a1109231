// Tests llmc/reshard.h: the optimizer state of P processes and ZeRO stage s resharded for P' and
// s' holds the same value for every parameter, bit for bit (P=2 stage 1 -> 1 process -> P=2 stage
// 1 gives back the same files; 3 shards of a size not divisible by 3; stage 0 -> stage 1), the
// host state and the FP8 amax history are rank 0's, and state files that are not one checkpoint
// fail with one line naming the file. Files go to build/test_tmp/reshard/.
#include <cstdlib>
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
llmc::TrainState random_whole_state(bool master, size_t num_params = kParams) {
  llmc::TrainState s;
  llmc::Rng rng(42);
  auto fill = [&](std::vector<float>& v) {
    v.resize(num_params);
    for (float& x : v) x = (float)rng.u32() / 4294967296.0f - 0.5f;
  };
  fill(s.adam_m);
  fill(s.adam_v);
  if (master) fill(s.master);
  s.optimizer_steps = kStep - 2;
  s.adam.updates = s.optimizer_steps;  // as a file without -ao's interval reads back
  memset(&s.host, 0, sizeof(s.host));
  s.host.train_loader.batch_position = 5;
  s.host.train_loader.world = 2;
  s.host.loss_window.count = 3;
  s.host.loss_window.values[2] = 3.25;
  s.host.norm_window.next = 1;
  s.fp8.recorded_steps = 3;
  s.fp8.amax = {0x3f800000u, 0x40000000u, 0x3e000000u, 0x41200000u};
  return s;
}

// The state files a run of `world` processes with `zero_stage` writes for `whole`.
std::vector<llmc::TrainStateFile> files_of(const llmc::TrainState& whole, int world, int zero_stage,
                                          const std::string& dir = "") {
  std::vector<llmc::TrainStateFile> files(world);
  const int shard_count = llmc::zero_shard_count(world, zero_stage);
  const size_t num_params = whole.adam_m.size();
  for (int r = 0; r < world; r++) {
    const llmc::ZeroShard shard = llmc::zero_shard(num_params, shard_count, shard_count == 1 ? 0 : r);
    llmc::TrainStateFile& f = files[r];
    f.path = dir.empty() ? llmc::strformat("%s/state_%d_of_%d.bin", kDir.c_str(), r, world)
                         : llmc::checkpoint_path(dir, "state", kStep, r);
    f.id.step = kStep;
    f.id.rank = r;
    f.id.world = world;
    f.id.num_params = shard.size;
    f.id.master_weights = !whole.master.empty();
    f.id.zero_stage = shard_count > 1 ? 1 : 0;
    f.id.matrix_optimizer = llmc::kMatrixOptimizerMuon;
    f.id.data_tokens = 5000;
    f.state.optimizer_steps = whole.optimizer_steps;
    f.state.adam.updates = whole.adam.updates;
    f.state.host = whole.host;
    f.state.fp8 = whole.fp8;  // every rank's, reduced over the ranks at each step
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
         a.state.optimizer_steps == b.state.optimizer_steps && a.state.adam.updates == b.state.adam.updates &&
         a.state.adam.grads == b.state.adam.grads && a.id.adam_every == b.id.adam_every &&
         memcmp(&a.state.host, &b.state.host, sizeof(a.state.host)) == 0 &&
         a.state.adam_m == b.state.adam_m && a.state.adam_v == b.state.adam_v &&
         a.state.master == b.state.master &&  // float ==: no NaN here, so equal means equal bits
         a.state.fp8.recorded_steps == b.state.fp8.recorded_steps && a.state.fp8.amax == b.state.fp8.amax;
}

void save(const llmc::TrainStateFile& f) {
  llmc::train_state_save(f.path, f.id, f.state.optimizer_steps, f.state.host, f.state.adam_m.data(),
                         f.state.adam_v.data(), f.state.master.empty() ? nullptr : f.state.master.data(),
                         f.state.fp8, f.state.adam);
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
    save(f);
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
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.state.fp8.amax[2]++; }), kParams),
               second + ": its FP8 amax history differs from that of " + good[0].path,
               "two FP8 histories");
  check_throws(reshard(changed([](llmc::TrainStateFile& f) { f.state.fp8.recorded_steps++; }), kParams),
               second + ": its FP8 amax history differs", "two FP8 recorded-step counts");
  check_throws([&] { llmc::reshard_train_state(good, kParams, 0, 0); }, "reshard: 0 processes",
               "no processes");
  check_throws([&] { llmc::reshard_train_state(good, kParams, 2, 2); }, "reshard: ZeRO stage 2",
               "an unknown ZeRO stage");
}

// The files of `world` processes without ZeRO of a run with AdamW every 2 steps, after a step
// without its update: every rank keeps the same averaged gradients (AdamKept).
std::vector<llmc::TrainStateFile> kept_files_of(const llmc::TrainState& whole, int world,
                                                const std::string& dir = "") {
  std::vector<llmc::TrainStateFile> files = files_of(whole, world, 0, dir);
  for (llmc::TrainStateFile& f : files) {
    f.id.adam_every = 2;
    f.state.adam.updates = 3;
    f.state.adam.grads.resize(f.id.num_params);
    for (size_t i = 0; i < f.state.adam.grads.size(); i++) f.state.adam.grads[i] = 0.25f * (float)i - 7.0f;
  }
  return files;
}

// -ao 2 (AdamW's kept gradients): without ZeRO, a checkpoint of 2 processes resharded for 1 and 3
// carries rank 0's kept gradients and update count to every rank, through the files too; ZeRO-1 on
// either side is refused with one line.
void test_kept_gradients() {
  const llmc::TrainState whole = random_whole_state(true);
  const auto two = kept_files_of(whole, 2);
  check_verbose(same_files(llmc::reshard_train_state(two, kParams, 1, 0), kept_files_of(whole, 1)) &&
                    same_files(llmc::reshard_train_state(two, kParams, 3, 0), kept_files_of(whole, 3)),
                "-ao 2, 2 processes -> 1 and -> 3 (ZeRO 0): every rank rank 0's kept gradients and count");
  const std::string refusal = ": written with -ao 2, whose kept gradients every process holds whole: resume it "
                              "without ZeRO-1 (-zs 0)";
  check_throws([&] { llmc::reshard_train_state(two, kParams, 2, 1); }, two[0].path + refusal,
               "-ao 2 resharded for ZeRO-1");
  std::vector<llmc::TrainStateFile> sharded = files_of(whole, 2, 1);
  for (llmc::TrainStateFile& f : sharded) f.id.adam_every = 2;
  check_throws([&] { llmc::reshard_train_state(sharded, kParams, 1, 0); }, sharded[0].path + refusal,
               "-ao 2 state files sharded by ZeRO-1");
  const llmc::GPT2Config config = llmc::make_config(1, 2, 32, 16, 200);
  const size_t n = llmc::num_parameters(config);
  const llmc::TrainState whole_model = random_whole_state(true, n);
  const std::string dir = kDir + "/kept", one = kDir + "/kept_on_1";
  llmc::make_dirs(dir);
  const std::vector<float> params(whole_model.master);
  llmc::checkpoint_save(llmc::checkpoint_path(dir, "model", kStep), config, params.data(),
                        llmc::kCheckpointVersionBF16);
  for (const llmc::TrainStateFile& f : kept_files_of(whole_model, 2, dir)) save(f);
  llmc::write_done_marker(dir, kStep);
  llmc::reshard_checkpoint(dir, one, kStep, 1, 0);
  llmc::TrainStateFile read_back = llmc::train_state_read(llmc::checkpoint_path(one, "state", kStep, 0), "");
  llmc::TrainStateFile expected = kept_files_of(whole_model, 1)[0];
  read_back.path = expected.path = "";
  check_verbose(same_file(read_back, expected), "reshard_checkpoint writes the kept gradients and count");
}

// Every byte of a file, for comparisons.
std::string bytes_of(const std::string& path) { return llmc::read_text_file(path); }

// reshard_state_files reads every header but only the files whose shard the new rank needs.
void test_state_files() {
  const llmc::TrainState whole = random_whole_state(true);
  const std::string dir = kDir + "/three";
  llmc::make_dirs(dir);
  for (const llmc::TrainStateFile& f : files_of(whole, 3, 1, dir)) save(f);
  auto state_path = [&](int r) { return llmc::checkpoint_path(dir, "state", kStep, r); };
  auto resharded = [&](int world, int zero_stage, int rank) {
    llmc::TrainStateFile f = llmc::reshard_state_files(state_path, kParams, world, zero_stage, rank,
                                                       "re-create it");
    f.path.clear();
    return f;
  };
  auto unnamed = [](std::vector<llmc::TrainStateFile> files) {
    for (llmc::TrainStateFile& f : files) f.path.clear();
    return files;
  };
  const auto two = unnamed(files_of(whole, 2, 1));
  check_verbose(same_file(resharded(2, 1, 0), two[0]) && same_file(resharded(2, 1, 1), two[1]),
                "the state files of 3 processes read for each rank of 2 (ZeRO 1)");
  check_verbose(same_file(resharded(1, 0, 0), unnamed(files_of(whole, 1, 0))[0]),
                "... and for 1 process");
  // Rank 0 of 2 holds [0, 512), which shards 0 and 1 of 3 ([0, 384), [384, 768)) hold.
  const std::string third = state_path(2);
  const std::string good = bytes_of(third);
  std::string damaged = good;
  damaged[damaged.size() - 1] ^= 1;
  llmc::write_file_atomically(third, [&](llmc::File& f) { f.write(damaged.data(), damaged.size(), "x"); });
  check_verbose(same_file(resharded(2, 1, 0), two[0]),
                "a damaged payload in rank 2's file: rank 0 of 2, which needs none of it, is read");
  check_throws([&] { resharded(2, 1, 1); }, third + ": checksum mismatch",
               "... rank 1 of 2, which needs part of it, fails naming it");
  llmc::write_file_atomically(third, [&](llmc::File& f) { f.write(good.data(), good.size() - 4, "x"); });
  check_throws([&] { resharded(2, 1, 0); }, third + ": a state for 384 parameters with master weights",
               "a truncated file fails every rank (every header is checked)");
  remove(third.c_str());
  check_throws([&] { resharded(2, 1, 0); }, "cannot open " + third, "a missing rank's file");
}

// checkpoint_train_state: a rank's own file for the layout the checkpoint was written with, the
// resharded state for any other, and one line for a -w setting that cannot resume from it.
void test_checkpoint_train_state(const std::string& dir, const llmc::TrainState& whole) {
  const size_t n = whole.adam_m.size();
  auto expected_id = [&](int world, int zero_stage, int rank) {
    const int shard_count = llmc::zero_shard_count(world, zero_stage);
    llmc::TrainStateId id;
    id.step = kStep;
    id.rank = rank;
    id.world = world;
    id.num_params = llmc::zero_shard(n, shard_count, 0).size;
    id.master_weights = true;
    id.zero_stage = shard_count > 1 ? 1 : 0;
    id.matrix_optimizer = llmc::kMatrixOptimizerMuon;
    id.data_tokens = 5000;
    return id;
  };
  auto same_state = [](const llmc::TrainState& a, const llmc::TrainState& b) {
    return a.optimizer_steps == b.optimizer_steps && a.adam.updates == b.adam.updates && a.adam_m == b.adam_m &&
           a.adam_v == b.adam_v &&
           a.master == b.master && memcmp(&a.host, &b.host, sizeof(a.host)) == 0 &&
           a.fp8.amax == b.fp8.amax && a.fp8.recorded_steps == b.fp8.recorded_steps;
  };
  llmc::TrainStateId written;
  struct Layout { int world, zero_stage, rank; const char* what; };
  const Layout layouts[] = {
      {2, 1, 1, "the layout it was written with (2 processes, ZeRO 1): rank 1's own file"},
      {1, 0, 0, "1 process: the whole arrays"},
      {3, 1, 2, "3 processes, ZeRO 1: rank 2's shard"},
      {2, 0, 1, "2 processes, ZeRO 0: the whole arrays on rank 1"},
  };
  for (const Layout& l : layouts) {
    const llmc::TrainState got = llmc::checkpoint_train_state(
        dir, expected_id(l.world, l.zero_stage, l.rank), n, "re-create it", &written);
    const llmc::TrainState want = files_of(whole, l.world, l.zero_stage)[l.rank].state;
    check_verbose(same_state(got, want) && written.world == 2 && written.zero_stage == 1,
                  std::string("checkpoint_train_state, ") + l.what);
    // Given a buffer, a rank's own file is read into it; a resharded state still comes returned.
    std::vector<float> buffer(3 * want.adam_m.size());
    const llmc::TrainState into = llmc::checkpoint_train_state(
        dir, expected_id(l.world, l.zero_stage, l.rank), n, "re-create it", &written, buffer.data());
    const bool own = l.world == 2 && l.zero_stage == 1;
    std::vector<float> arrays(want.adam_m);
    arrays.insert(arrays.end(), want.adam_v.begin(), want.adam_v.end());
    arrays.insert(arrays.end(), want.master.begin(), want.master.end());
    check_verbose(own ? into.adam_m.empty() && buffer == arrays : same_state(into, want),
                  std::string("checkpoint_train_state into a buffer, ") + l.what);
  }
  llmc::TrainStateId no_master = expected_id(1, 0, 0);
  no_master.master_weights = false;
  check_throws([&] { llmc::checkpoint_train_state(dir, no_master, n, "re-create it", &written); },
               llmc::checkpoint_path(dir, "state", kStep, 0) +
                   ": state with master weights, but this run has none: resume with the same -w setting",
               "a run without master weights from a checkpoint with them, on another layout");
  llmc::TrainStateId other_model = expected_id(2, 1, 0);
  other_model.num_params += 64;
  check_throws([&] { llmc::checkpoint_train_state(dir, other_model, n + 128, "re-create it", &written); },
               "resume with the same model and -w setting",
               "another model on the layout the checkpoint was written with");
  // Muon's momentum is stored as the first moments: a run with AdamW for the matrices cannot take it.
  const Layout adamw_layouts[] = {{1, 0, 0, "on another layout"}, {2, 1, 1, "on the layout it was written with"}};
  for (const Layout& l : adamw_layouts) {
    llmc::TrainStateId adamw = expected_id(l.world, l.zero_stage, l.rank);
    adamw.matrix_optimizer = llmc::kMatrixOptimizerAdamw;
    check_throws([&] { llmc::checkpoint_train_state(dir, adamw, n, "re-create it", &written); },
                 ": written with -opt muon for the blocks' matrices, but this run has -opt adamw: resume with -opt muon",
                 std::string("a run with AdamW for the matrices from a checkpoint with Muon's, ") + l.what);
    llmc::TrainStateId other_data = expected_id(l.world, l.zero_stage, l.rank);
    other_data.data_tokens = 6000;
    check_throws([&] { llmc::checkpoint_train_state(dir, other_data, n, "re-create it", &written); },
                 ": written over training data of 5000 tokens, but this run's -i holds 6000",
                 std::string("a run over training data of another size, ") + l.what);
  }
}

// reshard_checkpoint: a checkpoint directory of 2 processes (ZeRO 1) converted for 1 and back
// gives every file back byte for byte; the input directory is never written.
void test_checkpoint_dir() {
  const llmc::GPT2Config config = llmc::make_config(1, 2, 32, 16, 200);
  const size_t n = llmc::num_parameters(config);
  const llmc::TrainState whole = random_whole_state(true, n);
  const std::string dir = kDir + "/run", one = kDir + "/run_on_1", back = kDir + "/run_on_2";
  llmc::make_dirs(dir);
  const std::vector<float> params(whole.master);
  llmc::checkpoint_save(llmc::checkpoint_path(dir, "model", kStep), config, params.data(),
                        llmc::kCheckpointVersionBF16);
  for (const llmc::TrainStateFile& f : files_of(whole, 2, 1, dir)) save(f);
  llmc::write_file_atomically(dir + "/main.log", [](llmc::File& f) { f.write("step=0 kind=train\n", 18, "x"); });
  llmc::write_done_marker(dir, kStep);
  const std::vector<std::string> names = {"model_00000007.bin", "state_00000007_00000.bin",
                                          "state_00000007_00001.bin", "main.log", "DONE_00000007"};
  std::vector<std::string> before;
  for (const std::string& name : names) before.push_back(bytes_of(dir + "/" + name));

  test_checkpoint_train_state(dir, whole);
  check_verbose(llmc::reshard_checkpoint(dir, one, kStep, 1, 1) == 2,
                "2 processes -> 1: the process count of the input is returned");
  llmc::TrainStateFile read_back = llmc::train_state_read(llmc::checkpoint_path(one, "state", kStep, 0), "");
  read_back.path.clear();
  llmc::TrainStateFile expected = files_of(whole, 1, 0)[0];
  expected.path.clear();
  check_verbose(same_file(read_back, expected) &&
                    bytes_of(one + "/model_00000007.bin") == before[0] &&
                    bytes_of(one + "/main.log") == before[3] &&
                    llmc::latest_checkpoint_step(one) == kStep &&
                    !llmc::file_exists(llmc::checkpoint_path(one, "state", kStep, 1)),
                "... one state file of the whole arrays; the model file, the log and DONE as they were");
  llmc::reshard_checkpoint(one, back, kStep, 2, 1);
  bool same = true;
  for (size_t i = 0; i < names.size(); i++) same = same && bytes_of(back + "/" + names[i]) == before[i];
  check_verbose(same, "... -> 2 processes again: every file byte for byte the original");
  check_throws([&] { llmc::reshard_checkpoint(dir, one, kStep, 3, 1); },
               one + " already holds a checkpoint or a run log (main.log): give a new directory",
               "a directory with a checkpoint is not written into");
  check_throws([&] { llmc::reshard_checkpoint(dir, kDir + "/run_on_3", kStep + 1, 3, 1); },
               dir + " has no complete checkpoint of step 8 (no " + dir + "/DONE_00000008)",
               "a step without a DONE marker");
  bool untouched = true;
  for (size_t i = 0; i < names.size(); i++) untouched = untouched && bytes_of(dir + "/" + names[i]) == before[i];
  check_verbose(untouched, "the input directory is as it was");
}

}  // namespace

int main() {
  try {
    if (system(("rm -rf " + kDir).c_str()) != 0) check(false, "cannot clear " + kDir);
    llmc::make_dirs(kDir);
    test_layouts();
    test_file_round_trip();
    test_mismatched_inputs();
    test_state_files();
    test_checkpoint_dir();
    test_kept_gradients();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_reshard");
}
