// Fuzzes the checkpoint reader with the input as a checkpoint file: checkpoint_read_header, then
// checkpoint_load. An accepted file must hold exactly the parameters of the config it describes,
// counted here again in 128-bit arithmetic from the shapes in llmc/gpt2.h's parameter table, so
// that a count that overflowed 64 bits (and wrapped to a size matching the file) is caught.
#include <cstdint>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/gpt2.h"

namespace {

unsigned __int128 exact_parameter_count(const llmc::GPT2Config& c) {
  const unsigned __int128 L = c.num_layers, C = c.channels, T = c.max_seq_len;
  const unsigned __int128 Vp = c.padded_vocab_size;
  // wte, wpe, lnf, then per layer: the four matrices (3CC + CC + 4CC + 4CC) and the vectors
  // (ln1 2C, qkvb 3C, attprojb C, ln2 2C, fcb 4C, fcprojb C).
  return Vp * C + T * C + 2 * C + L * (12 * C * C + 13 * C);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ScratchFile checkpoint("checkpoint.bin");
  const std::string& path = checkpoint.write(data, size);
  try {
    llmc::File f(path, "rb");
    int header[llmc::kHeaderInts];
    const llmc::GPT2Config header_config = llmc::checkpoint_read_header(f, header);
    const int version = header[1];
    std::vector<float> params;
    const llmc::GPT2Config config = llmc::checkpoint_load(path, &params);
    fuzz::require(config == header_config, "checkpoint_load reads the config of the header");
    fuzz::require(config.padded_vocab_size >= config.vocab_size &&
                      config.padded_vocab_size % llmc::kVocabPadMultiple == 0,
                  "the padded vocabulary is the vocabulary rounded up");
    fuzz::require(exact_parameter_count(config) == params.size(),
                  "the parameter count did not overflow");
    const size_t element = version == llmc::kCheckpointVersionFP32 ? 4 : 2;
    fuzz::require(params.size() == llmc::num_parameters(config) &&
                      size == llmc::kHeaderInts * sizeof(int) + params.size() * element,
                  "an accepted checkpoint holds exactly the parameters of its config");
  } catch (const llmc::Error&) {
  }
  return 0;
}
