// Fuzzes the training-state reader (llmc/train_state.h) with the input as the state file of step
// 3, rank 0 of 1, for a model of 4 parameters, with and without master weights. A file it accepts
// must be exactly the file train_state_save writes for what was loaded: every header field in
// range, the sizes those of the header, the checksum right.
#include <cstdint>
#include <cstring>
#include <string>

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
    llmc::TrainState s;
    try {
      s = llmc::train_state_load(path, id, "test");
    } catch (const llmc::Error&) {
      continue;
    }
    fuzz::require(s.optimizer_steps >= 0 && s.optimizer_steps <= id.step,
                  "an accepted state has 0..step AdamW updates");
    llmc::train_state_save(rewritten.path(), id, s.optimizer_steps, s.host, s.adam_m.data(),
                           s.adam_v.data(), master_weights ? s.master.data() : nullptr, s.fp8);
    int version = 0;
    memcpy(&version, data + sizeof(int), sizeof(version));
    if (version == llmc::kStateVersionNoFp8) {
      // An older file is rewritten in the current format: the same contents, not the same bytes.
      const llmc::TrainState again = llmc::train_state_load(rewritten.path(), id, "test");
      fuzz::require(again.optimizer_steps == s.optimizer_steps &&
                        memcmp(&again.host, &s.host, sizeof(s.host)) == 0 &&
                        again.adam_m.size() == s.adam_m.size() && again.fp8.amax.empty(),
                    "an accepted version 3 state loads again from its rewrite");
      continue;
    }
    const std::string again = llmc::read_text_file(rewritten.path());
    fuzz::require(again.size() == size && memcmp(again.data(), data, size) == 0,
                  "an accepted state file is the one train_state_save writes for its contents");
  }
  return 0;
}
