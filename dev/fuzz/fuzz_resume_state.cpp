// Fuzzes the restore() functions that a resume feeds with host state read from a training-state
// file: DataLoader::restore and DocumentLoader::restore (with the Rng::restore inside them) and
// OutlierDetector::restore. Input: one byte k, then bytes XORed into a DataLoaderState (of each
// loader), then bytes XORed into an OutlierState. The states are genuine ones, taken after k % 64
// batches from a loader over three fixed shards (up to three epochs) and after k values of a
// fixed series; a restore of the damaged state that succeeds must keep working within bounds, and
// with nothing changed (XOR bytes all zero) it must continue exactly like the original.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/dataloader.h"
#include "llmc/outlier.h"

namespace {

constexpr int kVocabSize = 500;
constexpr int kDocumentVocabSize = 50257;  // the document loader's shards hold document starts
constexpr int B = 2, T = 3;
constexpr uint64_t kSeed = 11;
constexpr long kBatches = 40;  // taken after a restore: two epochs of the DataLoader
// Batches of B*T = 6 tokens: 6, 10 and 4 per shard, 20 per epoch.
constexpr int kShardTokens[] = {40, 61, 25};

// Three fixed shards, name_0.bin, name_1.bin, name_2.bin, of token(shard, position).
struct Shards {
  fuzz::ScratchFile files[3];
  std::string pattern;

  template <class Token>
  Shards(const std::string& name, Token token)
      : files{fuzz::ScratchFile(name + "_0.bin"), fuzz::ScratchFile(name + "_1.bin"),
              fuzz::ScratchFile(name + "_2.bin")} {
    for (int s = 0; s < 3; s++) {
      std::vector<uint16_t> tokens(kShardTokens[s]);
      for (int i = 0; i < kShardTokens[s]; i++) tokens[i] = token(s, i);
      llmc::write_token_shard(files[s].path(), tokens);
    }
    // The shard index is the fifth character from the end ("0.bin"): a glob for all three.
    pattern = files[0].path();
    pattern.replace(pattern.size() - 5, 1, "?");
  }
};

// XORs the input bytes into a state; whether any bit changed.
template <typename State>
bool damage(State* state, const uint8_t* data, size_t size) {
  unsigned char* bytes = reinterpret_cast<unsigned char*>(state);
  bool changed = false;
  for (size_t i = 0; i < std::min(size, sizeof(State)); i++) {
    bytes[i] ^= data[i];
    changed = changed || data[i] != 0;
  }
  return changed;
}

template <class Loader>
std::vector<int> take_batch(Loader& loader, int tokens, int vocab_size) {
  std::vector<int> inputs(tokens), targets(tokens);
  loader.next_batch(inputs.data(), targets.data());
  for (int i = 0; i < tokens; i++) {
    fuzz::require(inputs[i] >= 0 && inputs[i] < vocab_size && targets[i] >= 0 &&
                      targets[i] < vocab_size,
                  "a restored loader gives tokens of the vocabulary");
  }
  inputs.insert(inputs.end(), targets.begin(), targets.end());
  return inputs;
}

// make() builds a loader of batches of `tokens` tokens.
template <class Make>
void check_loader(Make make, int tokens, int vocab_size, int k, const uint8_t* data, size_t size) {
  auto original = make();
  for (int i = 0; i < k % 64; i++) take_batch(original, tokens, vocab_size);
  llmc::DataLoaderState state = original.state();
  const bool changed = damage(&state, data, size);
  auto resumed = make();
  try {
    resumed.restore(state);
  } catch (const llmc::Error&) {
    fuzz::require(changed, "a loader's own state restores");
    return;
  }
  for (long step = 0; step < kBatches; step++) {
    const std::vector<int> batch = take_batch(resumed, tokens, vocab_size);
    if (!changed) {
      fuzz::require(batch == take_batch(original, tokens, vocab_size),
                    "a restored loader continues identically");
    }
  }
}

// A falling series with a spike, a NaN and an Inf.
double series_value(int i) {
  if (i % 50 == 17) return i % 100 == 17 ? NAN : INFINITY;
  return 3.0 + 5.0 / (1 + i) + 0.01 * (i % 7) + (i % 31 == 5 ? 10.0 : 0.0);
}

void check_outlier(int k, const uint8_t* data, size_t size) {
  llmc::OutlierDetector original;
  for (int i = 0; i < k; i++) original.update_and_score(series_value(i));
  llmc::OutlierState state = original.state();
  const bool changed = damage(&state, data, size);
  llmc::OutlierDetector resumed;
  try {
    resumed.restore(state);
  } catch (const llmc::Error&) {
    fuzz::require(changed, "a detector's own state restores");
    return;
  }
  for (int i = k; i < k + 2 * resumed.window(); i++) {
    const double z = resumed.update_and_score(series_value(i));
    fuzz::require(!std::isnan(z) && resumed.count() <= resumed.window(),
                  "a restored detector scores without NaN and keeps its window");
    if (!changed) {
      const double z_original = original.update_and_score(series_value(i));
      fuzz::require(memcmp(&z, &z_original, sizeof(z)) == 0,
                    "a restored detector continues identically");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Shards shards("resume_shard", [](int s, int i) {
    return (uint16_t)((s * 131 + i * 7) % kVocabSize);
  });
  // Document starts every 3 tokens, none, and two in every 9 (i*i + shard = 0 mod 9); a step of
  // 2 micro batches of one sequence needs 14 tokens a shard.
  static const Shards documents("resume_documents", [](int s, int i) {
    return (uint16_t)((i * i + s) % 9 == 0 ? llmc::kDocumentStartToken : (s * 131 + i * 7) % 500);
  });
  if (size == 0) return 0;
  const int k = data[0];
  const size_t loader_bytes = std::min(size - 1, sizeof(llmc::DataLoaderState));
  check_loader([] { return llmc::DataLoader(shards.pattern, "-i", B, T, /*rank=*/0, /*world=*/1,
                                            /*shuffle=*/true, kSeed, kVocabSize); },
               B * T, kVocabSize, k, data + 1, loader_bytes);
  check_loader([] { return llmc::DocumentLoader(documents.pattern, "-i", 1, T, /*grad_accum=*/2,
                                                /*rank=*/0, /*world=*/1, /*shuffle=*/true, kSeed,
                                                kDocumentVocabSize); },
               T, kDocumentVocabSize, k, data + 1, loader_bytes);
  check_outlier(k, data + 1 + loader_bytes, size - 1 - loader_bytes);
  return 0;
}
