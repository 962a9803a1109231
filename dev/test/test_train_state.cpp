// Tests llmc/train_state.h, the training-state file a resume reads: a round trip gives back every
// byte, and a file damaged anywhere (each header field, an unused header slot, a payload byte, its
// length) fails with an error naming the file and the problem, before anything is restored. Files
// go to build/test_tmp/train_state/.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/train_state.h"

using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const std::string kDir = "build/test_tmp/train_state";
const char* kRemedy = "resume from an earlier checkpoint";
constexpr size_t kParams = 1000;
constexpr int kStep = 10;

struct Saved {
  llmc::TrainStateId id;
  llmc::HostTrainState host;
  std::vector<float> adam_m, adam_v, master;
  std::vector<char> bytes;  // the file as written
};

int32_t read_int(const std::vector<char>& bytes, int slot) {
  int32_t value;
  memcpy(&value, bytes.data() + 4L * slot, sizeof(value));
  return value;
}

std::vector<char> read_bytes(const std::string& path) {
  const std::string text = llmc::read_text_file(path);
  return std::vector<char>(text.begin(), text.end());
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  llmc::File f(path, "wb");
  f.write(bytes.data(), bytes.size(), "test bytes");
  f.close();
}

Saved save(const std::string& path, bool master_weights) {
  Saved s;
  s.id.step = kStep;
  s.id.rank = 1;
  s.id.world = 2;
  s.id.num_params = kParams;
  s.id.master_weights = master_weights;
  s.id.matrix_optimizer = llmc::kMatrixOptimizerMuon;
  s.id.data_tokens = 12345678901;  // above 2^32: both of its header slots
  memset(&s.host, 0, sizeof(s.host));
  llmc::Rng rng(5);
  rng.u32();
  s.host.model_rng = rng.state();
  s.host.train_loader.epoch = 3;
  s.host.train_loader.order = llmc::DataOrder::kDocuments;
  s.host.train_loader.token_position = 123456;
  s.host.train_loader.grad_accum = 4;
  s.host.loss_window.count = 2;
  s.host.loss_window.values[1] = 4.5;
  for (size_t i = 0; i < kParams; i++) {
    s.adam_m.push_back(0.001f * i);
    s.adam_v.push_back(1e-6f * i);
    if (master_weights) s.master.push_back(-0.5f + 0.001f * i);
  }
  llmc::train_state_save(path, s.id, /*optimizer_steps=*/kStep - 1, s.host, s.adam_m.data(),
                         s.adam_v.data(), master_weights ? s.master.data() : nullptr);
  s.bytes = read_bytes(path);
  return s;
}

void test_round_trip() {
  for (bool master : {true, false}) {
    const std::string path = kDir + (master ? "/state_master.bin" : "/state.bin");
    const Saved saved = save(path, master);
    const llmc::TrainState loaded = llmc::train_state_load(path, saved.id, kRemedy);
    check_verbose(loaded.optimizer_steps == kStep - 1 &&
                      memcmp(&loaded.host, &saved.host, sizeof(saved.host)) == 0 &&
                      loaded.adam_m == saved.adam_m && loaded.adam_v == saved.adam_v &&
                      loaded.master == saved.master,
                  std::string("state round trip ") + (master ? "with" : "without") +
                      " master weights: every byte back");
    check(!llmc::file_exists(path + ".tmp"), "train_state_save leaves no temporary file");
  }
}

// Loaded into a caller's buffer (a resume's pinned host memory), the arrays land one after
// another, bit for bit, and nothing past them is written; the vectors stay empty; a damaged
// payload still fails on its checksum.
void test_load_into() {
  for (bool master : {true, false}) {
    const std::string path = kDir + (master ? "/into_master.bin" : "/into.bin");
    const Saved saved = save(path, master);
    const size_t arrays = master ? 3 : 2;
    std::vector<float> buffer(3 * kParams + 1, -7.0f);
    const llmc::TrainState loaded = llmc::train_state_load(path, saved.id, kRemedy, buffer.data());
    bool same = memcmp(buffer.data(), saved.adam_m.data(), kParams * sizeof(float)) == 0 &&
                memcmp(buffer.data() + kParams, saved.adam_v.data(), kParams * sizeof(float)) == 0 &&
                (!master || memcmp(buffer.data() + 2 * kParams, saved.master.data(), kParams * sizeof(float)) == 0);
    for (size_t i = arrays * kParams; i < buffer.size(); i++) same = same && buffer[i] == -7.0f;
    check_verbose(same && loaded.adam_m.empty() && loaded.adam_v.empty() && loaded.master.empty() &&
                      loaded.optimizer_steps == kStep - 1 &&
                      memcmp(&loaded.host, &saved.host, sizeof(saved.host)) == 0,
                  std::string("state loaded into a buffer ") + (master ? "with" : "without") +
                      " master weights: its arrays there, nothing past them");
    std::vector<char> bytes = saved.bytes;
    bytes[bytes.size() - 3] ^= 0x10;
    const std::string damaged = kDir + "/into_damaged.bin";
    write_bytes(damaged, bytes);
    check_throws([&] { llmc::train_state_load(damaged, saved.id, kRemedy, buffer.data()); },
                 "checksum", "a damaged payload loaded into a buffer fails on its checksum");
  }
}

// The bytes of a current file in the layout of an older `version`: the data loader state cut at
// kDataLoaderStateBytesV4, the version set and the checksum recomputed.
std::vector<char> older_file(std::vector<char> bytes, int version) {
  const size_t loader_end = llmc::kHeaderInts * sizeof(int) + 2 * sizeof(llmc::RngState) +
                            llmc::kDataLoaderStateBytesV4;
  const size_t since_v5 = sizeof(llmc::DataLoaderState) - llmc::kDataLoaderStateBytesV4;
  bytes.erase(bytes.begin() + loader_end, bytes.begin() + loader_end + since_v5);
  int h[llmc::kHeaderInts];
  memcpy(h, bytes.data(), sizeof(h));
  h[1] = version;
  llmc::header_store_checksum(h, llmc::crc32_update(llmc::header_checksum_begin(h), bytes.data() + sizeof(h),
                                                    bytes.size() - sizeof(h)));
  memcpy(bytes.data(), h, sizeof(h));
  return bytes;
}

// -fp8 2's amax history comes back with the rest. Older files still load: version 4 (a data loader
// state without its order, token position and grad_accum, which read as zero: contiguous batches)
// and version 3 (that, and no history or [10], [11]).
void test_fp8_history_and_older_versions() {
  const std::string path = kDir + "/state_fp8.bin";
  const Saved plain = save(kDir + "/state_plain.bin", true);
  llmc::Fp8History fp8;
  fp8.recorded_steps = kStep - 2;
  for (uint32_t i = 0; i < 40; i++) fp8.amax.push_back(0x3f800000u + 977u * i);
  llmc::train_state_save(path, plain.id, kStep - 1, plain.host, plain.adam_m.data(), plain.adam_v.data(),
                         plain.master.data(), fp8);
  const llmc::TrainState loaded = llmc::train_state_load(path, plain.id, kRemedy);
  check_verbose(loaded.fp8.recorded_steps == fp8.recorded_steps && loaded.fp8.amax == fp8.amax &&
                    loaded.adam_m == plain.adam_m && loaded.master == plain.master,
                "the FP8 amax history and its step count come back with the state");
  llmc::HostTrainState batches_only = plain.host;
  batches_only.train_loader.order = llmc::DataOrder::kBatches;
  batches_only.train_loader.token_position = 0;
  batches_only.train_loader.grad_accum = 0;
  const std::string v4 = kDir + "/state_v4.bin";
  write_bytes(v4, older_file(read_bytes(path), 4));
  const llmc::TrainState four = llmc::train_state_load(v4, plain.id, kRemedy);
  check_verbose(memcmp(&four.host, &batches_only, sizeof(batches_only)) == 0 &&
                    four.fp8.amax == fp8.amax && four.adam_v == plain.adam_v &&
                    four.master == plain.master,
                llmc::strformat("a version 4 state file (%zu bytes shorter) loads, its data loader "
                                "state of contiguous batches",
                                read_bytes(path).size() - read_bytes(v4).size()));
  const std::string v3 = kDir + "/state_v3.bin";
  write_bytes(v3, older_file(plain.bytes, 3));
  const llmc::TrainState three = llmc::train_state_load(v3, plain.id, kRemedy);
  check_verbose(memcmp(&three.host, &batches_only, sizeof(batches_only)) == 0 &&
                    three.fp8.amax.empty() && three.fp8.recorded_steps == 0 &&
                    three.adam_v == plain.adam_v && three.master == plain.master,
                "a version 3 state file loads, with no FP8 history");
}

void test_damaged() {
  const std::string good_path = kDir + "/good.bin";
  const Saved saved = save(good_path, true);
  // Writes a copy of the good file with one int32 changed (at a byte offset) or a new length.
  auto damaged = [&](const std::string& name, long offset, int32_t value, long size) {
    std::vector<char> bytes = saved.bytes;
    if (offset >= 0) memcpy(bytes.data() + offset, &value, sizeof(value));
    bytes.resize(size);
    const std::string path = kDir + "/" + name;
    write_bytes(path, bytes);
    return path;
  };
  auto load = [&](const std::string& path, const llmc::TrainStateId& id) {
    return [path, id] { llmc::train_state_load(path, id, kRemedy); };
  };
  const long size = (long)saved.bytes.size();
  struct HeaderCase {
    const char* what;
    int slot;
    int32_t value;
    std::string needle;
  };
  const std::vector<HeaderCase> cases = {
      {"a wrong magic", 0, 20240326, "not a training-state file of version 3 to 5 (magic 20240326"},
      {"the state version of an earlier format", 1, 2,
       "not a training-state file of version 3 to 5 (magic 20240528, version 2;"},
      {"a state version from the future", 1, 6,
       "not a training-state file of version 3 to 5 (magic 20240528, version 6;"},
      {"a negative FP8 history", 10, -1, "an FP8 history of -1 entries over 0 steps at step 10"},
      {"an FP8 history of more steps than the run's", 11, kStep + 1,
       "an FP8 history of 0 entries over 11 steps at step 10: the header is damaged"},
      {"FP8 history entries the file does not hold", 10, 4,
       "a state for 1000 parameters with master weights (and 4 FP8 history entries) should be"},
      {"another step", 2, kStep + 1, "state of step 11 in the file of step 10: the header is damaged"},
      {"another rank", 3, 0, "state of rank 0 of 2, expected rank 1 of 2: resume with the process"},
      {"AdamW updates above the step", 5, kStep + 1,
       "11 AdamW updates recorded at step 10 (must be 0..10): the header is damaged; " +
           std::string(kRemedy)},
      {"negative AdamW updates", 5, -1, "-1 AdamW updates recorded at step 10 (must be 0..10)"},
      {"a master-weights flag of 2", 6, 2,
       "master-weights flag 2 (must be 0 or 1): the header is damaged; " + std::string(kRemedy)},
      {"no master weights", 6, 0, "state for 1000 parameters without master weights, but the model"},
      {"an optimizer of 4", 12, 4, "optimizer 4 (must be 0 to 3): the header is damaged; " + std::string(kRemedy)},
      {"negative data tokens", 14, -1, "training data of -"},
      {"another parameter count", 8, (int32_t)kParams + 1, "state for 1001 parameters"},
      {"no checksum kind", llmc::kHeaderChecksumKindSlot, 0, "the header has no checksum"},
      {"a flipped bit in a reserved slot", 100, 1 << 12,
       "reserved header slot 100 holds 4096 (must be 0): the header is damaged; " + std::string(kRemedy)},
      {"a negative untie step", 15, -1, "untie step -2: the header is damaged; " + std::string(kRemedy)},
            {"an AdamW interval of 1", 16, 1, "AdamW every 1 steps, 0 of its updates, kept gradients 0"},
      {"AdamW's updates without an interval", 17, 3, "AdamW every 0 steps, 3 of its updates"},
      {"kept gradients without an interval", 18, 1, "AdamW every 0 steps, 0 of its updates, kept gradients 1"},
      {"negative Q and K blocks", 19, -2,
       "Muon's Q and K in blocks of -2 heads: the header is damaged; " + std::string(kRemedy)},
      {"the first reserved slot set", 20, 1, "reserved header slot 20 holds 1 (must be 0)"},
      {"the last reserved slot set", llmc::kHeaderChecksumKindSlot - 1, -1, "reserved header slot 253 holds -1"},
      {"a flipped bit in the checksum", llmc::kHeaderChecksumSlot,
       (int32_t)(read_int(saved.bytes, llmc::kHeaderChecksumSlot) ^ 1), "checksum mismatch"},
  };
  for (const HeaderCase& c : cases) {
    const std::string path = damaged(std::string("slot_") + std::to_string(c.slot) + "_" +
                                         std::to_string(c.value) + ".bin",
                                     4L * c.slot, c.value, size);
    check_throws(load(path, saved.id), path + ": " + c.needle, std::string("state file with ") + c.what);
  }
  const long payload = 4L * llmc::kHeaderInts;
  std::string p = damaged("host_byte.bin", payload + 8, 12345, size);
  check_throws(load(p, saved.id), p + ": checksum mismatch", "state file with a damaged RNG state");
  p = damaged("moment_byte.bin", size - 4 * (long)kParams - 8, 1, size);
  check_throws(load(p, saved.id), p + ": checksum mismatch (CRC-32 ",
               "state file with a damaged AdamW moment");
  p = damaged("truncated.bin", -1, 0, size - 4);
  check_throws(load(p, saved.id), "should be " + std::to_string(size) + " bytes but is " +
                                      std::to_string(size - 4) + " (truncated): " + kRemedy,
               "truncated state file");
  p = damaged("trailing.bin", -1, 0, size + 1);
  check_throws(load(p, saved.id), "(trailing data)", "state file with trailing bytes");
  p = damaged("short.bin", -1, 0, 100);
  check_throws(load(p, saved.id), p + ": file is truncated: reading the state header",
               "state file shorter than its header");
  llmc::TrainStateId other = saved.id;
  other.world = 1;
  other.rank = 0;
  check_throws(load(good_path, other), "resume with the process count",
               "a state file of two processes read by one");
  other = saved.id;
  other.matrix_optimizer = llmc::kMatrixOptimizerAdamw;
  check_throws(load(good_path, other),
               good_path + ": written with -opt muon for the blocks' matrices, but this run has -opt adamw: resume "
                           "with -opt muon",
               "a state file with Muon's momentum read by a run with AdamW for the matrices");
  other.matrix_optimizer = llmc::kMatrixOptimizerNorMuon;
  check_throws(load(good_path, other),
               good_path + ": written with -opt muon for the blocks' matrices, but this run has -opt muon -mn 1: "
                           "resume with -opt muon",
               "a state file of Muon without NorMuon's second moments read by a run with them");
  other = saved.id;
  other.data_tokens += 1;
  check_throws(load(good_path, other),
               good_path + ": written over training data of 12345678901 tokens, but this run's -i holds 12345678902: "
                           "resume with the run's training data",
               "a state file of training data of another size");
  other = saved.id;
  other.untie_step = 846;
  check_throws(load(good_path, other),
               good_path + ": written by a run with -ut -1, but this run has -ut 846: resume with -ut -1",
               "a state file of a run without -ut read by one with it");
  const std::string untie_path = kDir + "/state_untie.bin";
  llmc::train_state_save(untie_path, other, kStep - 1, saved.host, saved.adam_m.data(), saved.adam_v.data(),
                         saved.master.data());
  int updates = 0;
  check_verbose(llmc::train_state_read_id(untie_path, &updates, kRemedy).untie_step == 846 &&
                    llmc::train_state_load(untie_path, other, kRemedy).adam_v == saved.adam_v,
                "-ut 846 written in header slot 15 (847) and read back");
  check_throws(load(untie_path, saved.id),
               untie_path + ": written by a run with -ut 846, but this run has -ut -1: resume with -ut 846",
               "a state file of a run with -ut read by one without it");
  other = saved.id;
  other.muon_qk_heads = 2;
  const std::string pairs_path = kDir + "/state_qk_pairs.bin";
  llmc::train_state_save(pairs_path, other, kStep - 1, saved.host, saved.adam_m.data(), saved.adam_v.data(),
                         saved.master.data());
  check_verbose(llmc::train_state_read_id(pairs_path, &updates, kRemedy).muon_qk_heads == 2 &&
                    llmc::train_state_load(pairs_path, other, kRemedy).adam_v == saved.adam_v,
                "-mq 2 written in header slot 19 and read back");
  check_throws(load(pairs_path, saved.id),
               pairs_path + ": written by a run with -mq 2, but this run has -mq 0: resume with -mq 2",
               "a state file of Muon's Q and K in head pairs read by a run with them whole");
  check_throws(load(good_path, other),
               good_path + ": written by a run with -mq 0, but this run has -mq 2: resume with -mq 0",
               "a state file of Muon's Q and K whole read by a run with them in head pairs");
  // A file from before the optimizer and the data were recorded ([12] to [14] = 0) loads with any.
  llmc::TrainStateId unrecorded = saved.id;
  unrecorded.matrix_optimizer = llmc::kMatrixOptimizerUnrecorded;
  unrecorded.data_tokens = 0;
  const std::string old_path = kDir + "/state_unrecorded.bin";
  llmc::train_state_save(old_path, unrecorded, kStep - 1, saved.host, saved.adam_m.data(), saved.adam_v.data(),
                         saved.master.data());
  bool loads = true;
  for (const int optimizer :
       {llmc::kMatrixOptimizerAdamw, llmc::kMatrixOptimizerMuon, llmc::kMatrixOptimizerNorMuon}) {
    other = saved.id;
    other.matrix_optimizer = optimizer;
    loads = loads && llmc::train_state_load(old_path, other, kRemedy).adam_m == saved.adam_m;
  }
  check_verbose(loads, "a state file without a recorded optimizer or data loads with AdamW and with Muon, and any data");
}

// -ao K: the interval, AdamW's updates and the gradients kept since its last one come back (after
// the FP8 history), or none kept; a file without -ao reads as AdamW updated at every step. A run of
// another interval refuses the file either way, and every field of them is checked.
void test_adam_every() {
  const Saved plain = save(kDir + "/state_plain_ao.bin", true);
  llmc::TrainStateId id = plain.id;
  id.adam_every = 2;
  llmc::AdamKept kept;
  kept.updates = 4;
  for (size_t i = 0; i < kParams; i++) kept.grads.push_back(0.25f - 1e-4f * i);
  llmc::Fp8History fp8;
  fp8.recorded_steps = 3;
  fp8.amax = {0x3f800000u, 0x40000000u};
  const std::string path = kDir + "/state_ao_kept.bin";
  llmc::train_state_save(path, id, kStep - 1, plain.host, plain.adam_m.data(), plain.adam_v.data(),
                         plain.master.data(), fp8, kept);
  const std::vector<char> bytes = read_bytes(path);
  const llmc::TrainState loaded = llmc::train_state_load(path, id, kRemedy);
  check_verbose(loaded.adam.updates == 4 && loaded.adam.grads == kept.grads && loaded.fp8.amax == fp8.amax &&
                    loaded.adam_m == plain.adam_m && loaded.master == plain.master && read_int(bytes, 16) == 2 &&
                    read_int(bytes, 17) == 4 && read_int(bytes, 18) == 1 &&
                    bytes.size() == plain.bytes.size() + fp8.amax.size() * sizeof(uint32_t) + kParams * sizeof(float),
                "-ao 2 in header slot 16, AdamW's 4 updates in 17, its kept gradients (18: 1) after the FP8 history: "
                "every value back");
  kept.grads.clear();
  const std::string applied = kDir + "/state_ao_applied.bin";
  llmc::train_state_save(applied, id, kStep - 1, plain.host, plain.adam_m.data(), plain.adam_v.data(),
                         plain.master.data(), llmc::Fp8History(), kept);
  const llmc::TrainState none_kept = llmc::train_state_load(applied, id, kRemedy);
  check_verbose(none_kept.adam.updates == 4 && none_kept.adam.grads.empty() &&
                    read_bytes(applied).size() == plain.bytes.size(),
                "-ao 2 after AdamW's update: its updates back, no gradients kept");
  const llmc::TrainState every_step = llmc::train_state_load(kDir + "/state_plain_ao.bin", plain.id, kRemedy);
  check_verbose(every_step.adam.updates == kStep - 1 && every_step.adam.grads.empty() &&
                    read_int(plain.bytes, 16) == 0 && read_int(plain.bytes, 17) == 0 && read_int(plain.bytes, 18) == 0,
                "without -ao: slots 16 to 18 zero, AdamW's updates the optimizer's, no gradients");
  check_throws([&] { llmc::train_state_load(path, plain.id, kRemedy); },
               path + ": written by a run with -ao 2, but this run has -ao 1: resume with -ao 2",
               "a state file of -ao 2 read by a run without it");
  check_throws([&] { llmc::train_state_load(applied, plain.id, kRemedy); }, "resume with -ao 2",
               "a state file of -ao 2 without kept gradients read by a run without it");
  llmc::TrainStateId four = id;
  four.adam_every = 4;
  check_throws([&] { llmc::train_state_load(path, four, kRemedy); }, "this run has -ao 4: resume with -ao 2",
               "a state file of -ao 2 read by a run of -ao 4");
  check_throws([&] { llmc::train_state_load(kDir + "/state_plain_ao.bin", id, kRemedy); },
               "written by a run with -ao 1, but this run has -ao 2: resume with -ao 1",
               "a state file without -ao read by a run with it");
  kept.grads.assign(kParams, 1.0f);
  check_throws([&] {
    llmc::train_state_save(kDir + "/state_ao_bad.bin", plain.id, kStep - 1, plain.host, plain.adam_m.data(),
                           plain.adam_v.data(), plain.master.data(), llmc::Fp8History(), kept);
  }, "1000 kept gradients for 1000 parameters with AdamW every 1 steps", "kept gradients without an interval");
  auto damaged = [&](const std::string& name, int slot, int32_t value) {
    std::vector<char> copy = bytes;
    if (slot >= 0) memcpy(copy.data() + 4L * slot, &value, sizeof(value));
    if (slot < 0) copy[copy.size() - 5] ^= 0x40;  // in the kept gradients
    write_bytes(kDir + "/" + name, copy);
    return kDir + "/" + name;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {damaged("ao_updates.bin", 17, kStep), "AdamW every 2 steps, 10 of its updates, kept gradients 1 (the interval "
                                             "0 or 2 and more, the updates 0..9"},
      {damaged("ao_negative.bin", 16, -2), "AdamW every -2 steps"},
      {damaged("ao_flag.bin", 18, 2), "kept gradients 2"},
      {damaged("ao_no_grads.bin", 18, 0), "should be"},
      {damaged("ao_grad_byte.bin", -1, 0), "checksum mismatch"},
  };
  for (const auto& [damaged_path, needle] : cases) {
    check_throws([&] { llmc::train_state_load(damaged_path, id, kRemedy); }, needle,
                 "a damaged -ao state file: " + needle);
  }
}

}  // namespace

int main() {
  try {
    llmc::make_dirs(kDir);
    test_round_trip();
    test_load_into();
    test_damaged();
    test_fp8_history_and_older_versions();
    test_adam_every();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_train_state");
}
