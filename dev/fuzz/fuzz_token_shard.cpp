// Fuzzes the token shard reader and the data loader with the input as one shard file:
// read_shard_header, read_token_shard, then a shuffling DataLoader (rank 1 of 2) over two epochs
// and a bit. Each epoch must give every batch of this rank (SPEC.md "Data order") exactly once,
// and a second loader restored from the state() taken half way must continue identically.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/dataloader.h"

namespace {

// Small enough that arbitrary token bytes are often out of range, large enough for valid shards.
constexpr int kVocabSize = 1000;
constexpr int B = 2, T = 3, kRank = 1, kWorld = 2;
constexpr uint64_t kSeed = 7;

std::vector<int> take_batch(llmc::DataLoader& loader) {
  std::vector<int> inputs(B * T), targets(B * T);
  loader.next_batch(inputs.data(), targets.data());
  inputs.insert(inputs.end(), targets.begin(), targets.end());
  return inputs;
}

// This rank's batches of the shard (inputs, then targets), in sorted order.
std::vector<std::vector<int>> expected_batches(const std::vector<uint16_t>& tokens,
                                               long num_batches) {
  std::vector<std::vector<int>> batches;
  for (long b = 0; b < num_batches; b++) {
    const uint16_t* x = tokens.data() + (b * kWorld + kRank) * B * T;
    std::vector<int> batch(x, x + B * T);
    batch.insert(batch.end(), x + 1, x + B * T + 1);
    batches.push_back(batch);
  }
  std::sort(batches.begin(), batches.end());
  return batches;
}

// The loader over an accepted shard: from here on an llmc::Error is a bug as much as a crash is,
// so nothing catches it.
void check_loader(const std::string& path, const std::vector<uint16_t>& tokens,
                  llmc::DataLoader& loader) {
  const long per_epoch = loader.batches_per_epoch();
  const std::vector<std::vector<int>> expected = expected_batches(tokens, per_epoch);
  const long steps = 2 * per_epoch + 1;
  llmc::DataLoaderState half_way{};
  std::vector<std::vector<int>> batches;
  for (long step = 0; step < steps; step++) {
    if (step == steps / 2) half_way = loader.state();
    batches.push_back(take_batch(loader));
  }
  for (long epoch = 0; epoch < 2; epoch++) {
    std::vector<std::vector<int>> taken(batches.begin() + epoch * per_epoch,
                                        batches.begin() + (epoch + 1) * per_epoch);
    std::sort(taken.begin(), taken.end());
    fuzz::require(taken == expected, "each epoch gives every batch of this rank once");
  }
  llmc::DataLoader resumed(path, "-i", B, T, kRank, kWorld, /*shuffle=*/true, kSeed, kVocabSize);
  resumed.restore(half_way);
  for (long step = steps / 2; step < steps; step++) {
    fuzz::require(take_batch(resumed) == batches[step], "a restored loader continues identically");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::ScratchFile shard("token_shard.bin");
  const std::string& path = shard.write(data, size);
  std::optional<llmc::DataLoader> loader;
  std::vector<uint16_t> tokens;
  try {
    llmc::File f(path, "rb");
    const long count = llmc::read_shard_header(f);
    llmc::read_token_shard(path, kVocabSize, &tokens);
    fuzz::require((long)tokens.size() == count, "read_token_shard reads the header's token count");
    loader.emplace(path, "-i", B, T, kRank, kWorld, /*shuffle=*/true, kSeed, kVocabSize);
  } catch (const llmc::Error&) {
    return 0;
  }
  check_loader(path, tokens, *loader);
  return 0;
}
