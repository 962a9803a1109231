// Fuzzes debug_state_load with the input as a debug-state file for a fixed tiny model (below; the
// seeds that dev/test/test_fuzz.sh writes are for the same model). An accepted file's arrays must
// have the sizes its header gives (versions 5 and 6: and the settings' block; 6: the gradients at the
// BF16 weights).
#include <cstdint>
#include <cstring>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/gpt2.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ScratchFile state("debug_state.bin");
  static const llmc::GPT2Config config = llmc::make_config(/*num_layers=*/1, /*num_heads=*/1,
                                                           /*channels=*/4, /*max_seq_len=*/4,
                                                           /*vocab_size=*/8);
  const std::string& path = state.write(data, size);
  try {
    const llmc::DebugState d = llmc::debug_state_load(path, config);
    int version = 0;
    memcpy(&version, data + sizeof(int), sizeof(int));
    const size_t BT = (size_t)d.B * d.T;
    const size_t at_bf16_weights =
        version == llmc::kDebugStateVersionBf16Weights ? llmc::debug_state_bf16_weights_size(config) : 0;
    fuzz::require(d.T <= config.max_seq_len && d.inputs.size() == BT && d.targets.size() == BT &&
                      d.logits.size() == BT * config.vocab_size &&
                      d.grads.size() == llmc::num_parameters(config) &&
                      d.losses.size() == (size_t)d.steps &&
                      d.grads_at_bf16_weights.size() == at_bf16_weights,
                  "an accepted debug state has the sizes of its header");
    const size_t settings = version < llmc::kDebugStateVersionSettings
                                ? 0
                                : 2 * sizeof(int) + (d.settings.size() + 3) / 4 * 4 + sizeof(int) * d.prefix_table.size();
    fuzz::require(size == llmc::kHeaderInts * sizeof(int) + settings +
                              sizeof(float) * (2 * BT + d.logits.size() + 1 + d.grads.size() +
                                               d.grads_at_bf16_weights.size() + d.losses.size()),
                  "an accepted debug state has no bytes beyond its arrays (and the settings' block)");
  } catch (const llmc::Error&) {
  }
  return 0;
}
