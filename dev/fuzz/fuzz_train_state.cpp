// Fuzzes the training-state reader (llmc/train_state.h) with the input as the state file of step
// 3, rank 0 of 1, for a model of 4 parameters, with and without master weights. A file of the
// current version it accepts must be exactly the file train_state_save writes for what was loaded:
// every header field in range, the sizes those of the header, the checksum right; an older one
// must load again, with the same contents, from that rewrite.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/train_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ScratchFile input("train_state.bin");
  static fuzz::ScratchFile rewritten("train_state_rewritten.bin");
  const std::string& path = input.write(data, size);
  for (bool master_weights : {false, true}) {
    llmc::TrainStateId id;
    id.step = 3;
    id.num_params = 4;
    id.master_weights = master_weights;
    llmc::TrainStateFile file;
    try {
      file = llmc::train_state_detail::read(path, &id, "test");
    } catch (const llmc::Error&) {
      continue;
    }
    const llmc::TrainState& s = file.state;
    fuzz::require(s.optimizer_steps >= 0 && s.optimizer_steps <= id.step,
                  "an accepted state has 0..step AdamW updates");
    // The fields this id leaves unrecorded (any value loads) are rewritten as the file has them.
    id.matrix_optimizer = file.id.matrix_optimizer;
    id.data_tokens = file.id.data_tokens;
    llmc::train_state_save(rewritten.path(), id, s.optimizer_steps, s.host, s.adam_m.data(),
                           s.adam_v.data(), master_weights ? s.master.data() : nullptr, s.fp8);
    int version = 0;
    memcpy(&version, data + sizeof(int), sizeof(version));
    if (version != llmc::kStateVersion) {
      // An older file is rewritten in the current format: the same contents, not the same bytes.
      const llmc::TrainState again = llmc::train_state_load(rewritten.path(), id, "test");
      // Bytes, not floats, are compared: the moments may hold NaNs.
      auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      fuzz::require(again.optimizer_steps == s.optimizer_steps &&
                        memcmp(&again.host, &s.host, sizeof(s.host)) == 0 &&
                        same(again.adam_m, s.adam_m) && same(again.adam_v, s.adam_v) &&
                        same(again.master, s.master) && again.fp8.amax == s.fp8.amax &&
                        again.fp8.recorded_steps == s.fp8.recorded_steps,
                    "an accepted older state loads again from its rewrite");
      continue;
    }
    const std::string again = llmc::read_text_file(rewritten.path());
    fuzz::require(again.size() == size && memcmp(again.data(), data, size) == 0,
                  "an accepted state file is the one train_state_save writes for its contents");
  }
  return 0;
}
