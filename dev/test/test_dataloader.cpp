// Tests llmc/dataloader.h: shard writing and validation, the data order of
// SPEC.md (plain, shuffled, split over ranks, over epochs), reset and
// state/restore (also from another process count), and -i and -j kept apart. Shards go to
// build/test_tmp/dataloader/.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/dataloader.h"

using llmc::DataLoader;
using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const std::string kDir = "build/test_tmp/dataloader";
constexpr int kVocab = 50257;
constexpr int kB = 2, kT = 4, kChunk = kB * kT;

// Token ids say where they came from: shard * 1000 + position.
constexpr int kShardStride = 1000;

std::string shard_path(const std::string& name, int index) {
  return llmc::strformat("%s/%s_%03d.bin", kDir.c_str(), name.c_str(), index);
}

// Writes shards `name_000.bin`, ... of the given token counts; returns their glob.
std::string write_shards(const std::string& name, const std::vector<int>& counts) {
  for (size_t s = 0; s < counts.size(); s++) {
    std::vector<uint16_t> tokens(counts[s]);
    for (int i = 0; i < counts[s]; i++) tokens[i] = (uint16_t)(s * kShardStride + i);
    llmc::write_token_shard(shard_path(name, (int)s), tokens);
  }
  return kDir + "/" + name + "_*.bin";
}

// One batch as (shard, first position), after checking that its inputs are a
// contiguous run of one shard and its targets the same run shifted by one.
struct Batch {
  int shard = -1;
  int position = -1;
  bool operator<(const Batch& o) const {
    return shard != o.shard ? shard < o.shard : position < o.position;
  }
  bool operator==(const Batch& o) const { return shard == o.shard && position == o.position; }
};

Batch take(DataLoader& loader, int chunk, bool* contiguous) {
  std::vector<int> x(chunk), y(chunk);
  loader.next_batch(x.data(), y.data());
  Batch b{x[0] / kShardStride, x[0] % kShardStride};
  for (int i = 0; i < chunk; i++) {
    const int expected = b.shard * kShardStride + b.position + i;
    if (x[i] != expected || y[i] != expected + 1) *contiguous = false;
  }
  return b;
}

std::vector<Batch> take_many(DataLoader& loader, int chunk, int n, bool* contiguous) {
  std::vector<Batch> out;
  for (int i = 0; i < n; i++) out.push_back(take(loader, chunk, contiguous));
  return out;
}

std::vector<Batch> batches(const std::vector<std::pair<int, int>>& shard_and_batch, int stride) {
  std::vector<Batch> out;
  for (const auto& [s, b] : shard_and_batch) out.push_back({s, b * stride});
  return out;
}

// Shards of 4, 5 and 3 batches of 8 tokens (the last with 2 spare tokens).
const std::vector<int> kCounts = {33, 41, 27};

void test_plain_order() {
  const std::string pattern = write_shards("plain", kCounts);
  DataLoader loader(pattern, "-i", kB, kT, 0, 1, false, 0, kVocab);
  check_verbose(loader.num_shards() == 3 && loader.total_tokens() == 33 + 41 + 27 &&
                    loader.batches_per_epoch() == 12 && loader.tokens_per_batch() == kChunk,
                llmc::strformat("3 shards: %ld tokens, %ld batches per epoch",
                                loader.total_tokens(), loader.batches_per_epoch()));
  bool contiguous = true;
  const std::vector<Batch> got = take_many(loader, kChunk, 14, &contiguous);
  const std::vector<Batch> expected =
      batches({{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4},
               {2, 0}, {2, 1}, {2, 2}, {0, 0}, {0, 1}}, kChunk);
  check_verbose(contiguous, "targets are the inputs shifted by one token");
  check_verbose(got == expected, "without shuffle: shards in name order, batches in file order, "
                                 "then the next epoch starts over");
  check_verbose(loader.epoch() == 1, "the 13th batch begins epoch 1");
  loader.reset();
  contiguous = true;
  check_verbose(take(loader, kChunk, &contiguous) == Batch{0, 0} && loader.epoch() == 0,
                "reset() goes back to the first batch of epoch 0");
}

void test_shuffled_order() {
  const std::string pattern = write_shards("shuffled", kCounts);
  DataLoader loader(pattern, "-i", kB, kT, 0, 1, true, 1337, kVocab);
  bool contiguous = true;
  const std::vector<Batch> got = take_many(loader, kChunk, 24, &contiguous);
  // SPEC.md's permutations over MT19937(1337), computed independently of
  // llmc/rand.h (with numpy's MT19937, whose seeding and outputs match torch's).
  const std::vector<Batch> expected = batches(
      {{0, 3}, {0, 2}, {0, 1}, {0, 0}, {2, 0}, {2, 2}, {2, 1}, {1, 1}, {1, 4}, {1, 3}, {1, 2},
       {1, 0}, {2, 2}, {2, 0}, {2, 1}, {1, 0}, {1, 2}, {1, 1}, {1, 4}, {1, 3}, {0, 1}, {0, 0},
       {0, 2}, {0, 3}}, kChunk);
  check_verbose(contiguous && got == expected,
                "shuffled order of two epochs (seed 1337) equals the hand-computed expectation");
  check_verbose(loader.epoch() == 1, "24 batches end in epoch 1");

  DataLoader same(pattern, "-i", kB, kT, 0, 1, true, 1337, kVocab);
  DataLoader other(pattern, "-i", kB, kT, 0, 1, true, 1338, kVocab);
  const std::vector<Batch> again = take_many(same, kChunk, 24, &contiguous);
  const std::vector<Batch> different = take_many(other, kChunk, 24, &contiguous);
  check_verbose(again == got, "the same seed gives the same order");
  check_verbose(different != got, "another seed gives another order");
  loader.reset();
  check_verbose(take_many(loader, kChunk, 24, &contiguous) == got,
                "reset() of a shuffled loader replays the same order");
}

// Over each epoch every batch is seen exactly once, and epochs differ.
void test_epoch_coverage() {
  const std::vector<int> counts = {8 * 17 + 1, 8 * 9 + 5, 8 * 30 + 1, 8 * 2 + 1, 8 * 11 + 7};
  const std::string pattern = write_shards("coverage", counts);
  DataLoader loader(pattern, "-i", kB, kT, 0, 1, true, 7, kVocab);
  const long per_epoch = loader.batches_per_epoch();
  std::set<Batch> all;
  for (size_t s = 0; s < counts.size(); s++) {
    for (int b = 0; b < (counts[s] - 1) / kChunk; b++) all.insert({(int)s, b * kChunk});
  }
  bool contiguous = true;
  std::vector<std::vector<Batch>> epochs;
  bool each_once = true;
  for (int e = 0; e < 3; e++) {
    epochs.push_back(take_many(loader, kChunk, (int)per_epoch, &contiguous));
    std::multiset<Batch> seen(epochs.back().begin(), epochs.back().end());
    each_once = each_once && std::set<Batch>(seen.begin(), seen.end()) == all &&
                seen.size() == all.size();
  }
  check_verbose(contiguous && each_once && per_epoch == (long)all.size(),
                llmc::strformat("3 shuffled epochs of %ld batches: each visits every batch once",
                                per_epoch));
  check_verbose(epochs[0] != epochs[1] && epochs[1] != epochs[2] && loader.epoch() == 2,
                "each epoch is reshuffled");
}

// With world W, rank r's batch b is world 1's batch b*W + r of the same shard.
void test_rank_splits(bool shuffle) {
  const std::vector<int> counts = {8 * 13 + 1, 8 * 7 + 3, 8 * 24 + 1};
  const std::string pattern = write_shards(shuffle ? "split_shuffled" : "split_plain", counts);
  for (int world : {2, 3}) {
    std::vector<DataLoader> ranks;
    for (int r = 0; r < world; r++)
      ranks.emplace_back(pattern, "-i", kB, kT, r, world, shuffle, 11, kVocab);
    long expected_batches = 0;
    for (int n : counts) expected_batches += (n - 1) / (world * kChunk);
    bool contiguous = true, aligned = true;
    std::set<Batch> covered;
    const long steps = ranks[0].batches_per_epoch();
    for (long step = 0; step < steps; step++) {
      Batch first = take(ranks[0], kChunk, &contiguous);
      aligned = aligned && first.position % (world * kChunk) == 0;
      covered.insert(first);
      for (int r = 1; r < world; r++) {
        Batch b = take(ranks[r], kChunk, &contiguous);
        aligned = aligned && b.shard == first.shard && b.position == first.position + r * kChunk;
        covered.insert(b);
      }
    }
    std::set<Batch> world_one;
    for (size_t s = 0; s < counts.size(); s++) {
      const int usable = (counts[s] - 1) / (world * kChunk) * world;
      for (int b = 0; b < usable; b++) world_one.insert({(int)s, b * kChunk});
    }
    check_verbose(steps == expected_batches && contiguous && aligned && covered == world_one &&
                      covered.size() == (size_t)(steps * world),
                  llmc::strformat("%s, world %d: ranks take disjoint neighbouring batches whose "
                                  "union is world 1's batches (%ld steps)",
                                  shuffle ? "shuffled" : "plain", world, steps));
  }
}

void test_state_restore() {
  const std::vector<int> counts = {8 * 5 + 1, 8 * 3 + 1, 8 * 6 + 1};
  const std::string pattern = write_shards("resume", counts);
  bool all_equal = true;
  const int per_epoch = 14;
  // Positions: start, mid-shard, end of a shard, end of an epoch, second and third epoch.
  for (int taken : {0, 2, 5, 8, 13, 14, 15, 30, 41}) {
    DataLoader original(pattern, "-i", kB, kT, 0, 1, true, 21, kVocab);
    bool contiguous = true;
    take_many(original, kChunk, taken, &contiguous);
    const llmc::DataLoaderState saved = original.state();
    const std::vector<Batch> continued = take_many(original, kChunk, 2 * per_epoch, &contiguous);
    DataLoader resumed(pattern, "-i", kB, kT, 0, 1, true, 999,
                       kVocab);  // the seed comes from the state
    take_many(resumed, kChunk, 3, &contiguous);
    resumed.restore(saved);
    const std::vector<Batch> replayed = take_many(resumed, kChunk, 2 * per_epoch, &contiguous);
    if (!check(contiguous && continued == replayed,
               llmc::strformat("restore after %d batches continues identically", taken))) {
      all_equal = false;
    }
  }
  check_verbose(all_equal, "state/restore continues identically from 9 positions over 3 epochs");

  DataLoader loader(pattern, "-i", kB, kT, 0, 1, true, 21, kVocab);
  llmc::DataLoaderState s = loader.state();
  DataLoader unshuffled(pattern, "-i", kB, kT, 0, 1, false, 21, kVocab);
  check_throws([&] { unshuffled.restore(s); }, "same data and settings",
               "restore into a loader with other settings");
  DataLoader longer(pattern, "-i", kB, kT * 2, 0, 1, true, 21, kVocab);
  check_throws([&] { longer.restore(s); }, "same data and settings",
               "restore into a loader with another T");
  s.shard_position = 3;
  check_throws([&] { loader.restore(s); }, "corrupt position", "restore of a bad shard position");
  s = loader.state();
  s.batch_position = 100;
  check_throws([&] { loader.restore(s); }, "corrupt position", "restore of a bad batch position");
  s = loader.state();
  s.order = llmc::DataOrder::kDocuments;
  check_throws([&] { loader.restore(s); },
               "the checkpoint read document-aligned sequences, this run reads contiguous batches; "
               "resume with the data order the checkpoint was written with",
               "restore of a document-aligned state");
  s.order = (llmc::DataOrder)7;
  check_throws([&] { loader.restore(s); }, "corrupt data order 7", "restore of a bad data order");
}

// The chunks (shard, position) the ranks of `world` processes read in their next `steps` batches.
std::vector<Batch> take_all_ranks(std::vector<DataLoader>& ranks, int steps, bool* contiguous) {
  std::vector<Batch> out;
  for (int step = 0; step < steps; step++) {
    for (DataLoader& rank : ranks) out.push_back(take(rank, kChunk, contiguous));
  }
  return out;
}

std::vector<DataLoader> loaders(const std::string& pattern, int world, bool shuffle) {
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; r++) ranks.emplace_back(pattern, "-i", kB, kT, r, world, shuffle, 21, kVocab);
  return ranks;
}

// A state of P processes restored by P' (a resharded checkpoint): DataLoaderState's rule.
void test_restore_other_world() {
  // 10 chunks in shard 0 and 7 in shard 1: 5 and 3 batches of 2 processes, 3 and 2 of 3.
  const std::string pattern = write_shards("reshard", {8 * 10 + 1, 8 * 7 + 1});
  bool contiguous = true;
  std::vector<DataLoader> two = loaders(pattern, 2, false);
  take_all_ranks(two, 2, &contiguous);  // chunks 0..3 of shard 0
  std::vector<DataLoader> one = loaders(pattern, 1, false);
  one[0].restore(two[0].state());
  check_verbose(take_all_ranks(one, 7, &contiguous) ==
                    batches({{0, 4}, {0, 5}, {0, 6}, {0, 7}, {0, 8}, {0, 9}, {1, 0}}, kChunk),
                "2 processes -> 1: the next chunk is the one 2 processes would have read next, "
                "then the shard in order");
  std::vector<DataLoader> three = loaders(pattern, 3, false);
  for (DataLoader& rank : three) rank.restore(two[1].state());
  check_verbose(take_all_ranks(three, 2, &contiguous) ==
                    batches({{0, 3}, {0, 4}, {0, 5}, {0, 6}, {0, 7}, {0, 8}}, kChunk),
                "2 processes (4 chunks taken) -> 3: from chunk 3, one chunk re-read, none skipped");
  for (DataLoader& rank : two) rank.restore(three[0].state());
  check_verbose(take_all_ranks(two, 2, &contiguous) ==
                    batches({{0, 8}, {0, 9}, {1, 0}, {1, 1}}, kChunk),
                "3 processes (shard 0 done: 9 chunks) -> 2: chunks 8 and 9 (the tail 3 processes "
                "drop), then the next shard");
  check(contiguous, "every batch restored from another process count is contiguous");

  std::vector<DataLoader> shuffled = loaders(pattern, 3, true);
  take_all_ranks(shuffled, 4, &contiguous);  // shard 0's 3 batches and the first of shard 1
  std::vector<DataLoader> shuffled_two = loaders(pattern, 2, true);
  shuffled_two[0].restore(shuffled[0].state());
  const llmc::DataLoaderState moved = shuffled_two[0].state();
  check_verbose(moved.shard_position == 1 && moved.batch_position == 1 && moved.world == 2 &&
                    moved.epoch == 0,
                "shuffled, 3 processes -> 2: the same shard, 1 of its 3 batches taken (1*3/2)");
  llmc::DataLoaderState s = shuffled[0].state();
  s.batch_position = 3;
  check_throws([&] { shuffled_two[0].restore(s); }, "corrupt position (batch 3 of 2 in",
               "a batch position past the saved process count's batches");
  s = shuffled[0].state();
  s.world = 0;
  check_throws([&] { shuffled_two[0].restore(s); }, "corrupt process count 0",
               "a state of no processes");
  s = shuffled[0].state();
  s.batches_per_epoch++;
  check_throws([&] { shuffled_two[0].restore(s); }, "same data and settings",
               "a state of 3 processes over other data");
}

void write_raw(const std::string& path, const std::vector<int32_t>& header_ints, long header_bytes,
               const std::vector<uint16_t>& tokens) {
  std::vector<char> bytes(header_bytes, 0);
  memcpy(bytes.data(), header_ints.data(),
         std::min(header_ints.size() * sizeof(int32_t), (size_t)header_bytes));
  llmc::File f(path, "wb");
  if (!bytes.empty()) f.write(bytes.data(), bytes.size(), "a test header");
  if (!tokens.empty()) f.write(tokens.data(), tokens.size() * 2, "test tokens");
  f.close();
}

void test_malformed_shards() {
  const int failed_before = testing::failed_count(), passed_before = testing::passed_count();
  auto open = [](const std::string& pattern) {
    return [pattern] { DataLoader d(pattern, "-i", kB, kT, 0, 1, false, 0, kVocab); };
  };
  check_throws(open(kDir + "/missing_*.bin"), "no files match -i", "a pattern matching nothing");
  check_throws(open(kDir + "/missing.bin"), "no files match -i", "a missing file");

  const std::vector<uint16_t> tokens(40, 5);
  const std::string base = kDir + "/bad_";
  write_raw(base + "empty.bin", {}, 0, {});
  check_throws(open(base + "empty.bin"), "bad_empty.bin: the file is empty", "an empty file");
  write_raw(base + "short.bin", {llmc::kShardMagic, 1, 0}, 100, {});
  check_throws(open(base + "short.bin"), "bad_short.bin: 100 bytes is shorter than the 1024-byte",
               "a header shorter than 1024 bytes");
  write_raw(base + "magic.bin", {20240326, 1, 40}, 1024, tokens);
  check_throws(open(base + "magic.bin"), "bad_magic.bin: not a token shard (magic 20240326",
               "a wrong magic");
  write_raw(base + "version.bin", {llmc::kShardMagic, 2, 40}, 1024, tokens);
  check_throws(open(base + "version.bin"), "bad_version.bin: unsupported token shard version 2",
               "a wrong version");
  write_raw(base + "truncated.bin", {llmc::kShardMagic, 1, 41}, 1024, tokens);
  check_throws(open(base + "truncated.bin"),
               "bad_truncated.bin: header says 41 tokens, so the file should be 1106 bytes, but it "
               "is 1104 bytes (truncated)", "a truncated shard");
  write_raw(base + "trailing.bin", {llmc::kShardMagic, 1, 39}, 1024, tokens);
  check_throws(open(base + "trailing.bin"), "(trailing bytes)", "a shard with trailing bytes");
  write_raw(base + "negative.bin", {llmc::kShardMagic, 1, -3}, 1024, tokens);
  check_throws(open(base + "negative.bin"), "header says -3 tokens", "a negative token count");

  std::vector<uint16_t> out_of_vocab(200, 1);
  out_of_vocab[123] = 50300;
  llmc::write_token_shard(base + "vocab.bin", out_of_vocab);
  check_throws(open(base + "vocab.bin"),
               "bad_vocab.bin: token 50300 at position 123 is >= vocab size 50257",
               "a token outside the vocabulary");
  out_of_vocab[123] = 65535;
  llmc::write_token_shard(base + "damaged.bin", out_of_vocab);
  check_throws(open(base + "damaged.bin"),
               "token 65535 at position 123 is >= vocab size 50257; the shard is damaged or was "
               "made with another tokenizer", "a token 65535, as damaged bytes often read");
  llmc::write_token_shard(base + "few.bin", std::vector<uint16_t>(kChunk, 1));
  check_throws(open(base + "few.bin"), "bad_few.bin: 8 tokens are too few for one batch",
               "a shard one token short of a batch");
  llmc::write_token_shard(base + "few_world.bin", std::vector<uint16_t>(2 * kChunk, 1));
  check_throws([&] { DataLoader d(base + "few_world.bin", "-i", kB, kT, 1, 2, false, 0, kVocab); },
               "needs at least 17", "a shard too short for one batch over 2 ranks");

  // A bad token in a later shard surfaces when that shard is opened.
  const std::string pattern = write_shards("later_bad", {9, 9});  // one batch each
  std::vector<uint16_t> bad(9, 1);
  bad[8] = 60000;
  llmc::write_token_shard(shard_path("later_bad", 1), bad);
  DataLoader loader(pattern, "-i", kB, kT, 0, 1, false, 0, kVocab);
  std::vector<int> x(kChunk), y(kChunk);
  loader.next_batch(x.data(), y.data());
  check_throws([&] { loader.next_batch(x.data(), y.data()); },
               "later_bad_001.bin: token 60000 at position 8", "a bad token in the second shard");

  // A shard rewritten with another length during the run.
  const std::string changing = write_shards("changing", {9, 9});
  DataLoader changed(changing, "-i", kB, kT, 0, 1, false, 0, kVocab);
  llmc::write_token_shard(shard_path("changing", 1), std::vector<uint16_t>(25, 1));
  changed.next_batch(x.data(), y.data());
  check_throws([&] { changed.next_batch(x.data(), y.data()); }, "changed while training",
               "a shard that changed length during the run");

  const std::string good = write_shards("good", {17});
  check_throws([&] { DataLoader d(good, "-i", kB, kT, 2, 2, false, 0, kVocab); }, "rank 2",
               "rank outside the world");
  check_throws([&] { DataLoader d(good, "-i", 0, kT, 0, 1, false, 0, kVocab); },
               "must be positive", "zero batch size");
  printf("%s %d malformed inputs each fail with a message naming the file and the problem\n",
         testing::failed_count() == failed_before ? "ok  " : "FAIL",
         testing::passed_count() - passed_before + testing::failed_count() - failed_before);
}

void test_shard_round_trip() {
  std::vector<uint16_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint16_t)((i * 7919) % kVocab);
  const std::string path = kDir + "/round_trip.bin";
  llmc::write_token_shard(path, tokens);
  std::vector<uint16_t> back;
  llmc::read_token_shard(path, kVocab, &back);
  llmc::File f(path, "rb");
  check_verbose(back == tokens && f.size() == 1024 + 2 * 5000,
                "write_token_shard/read_token_shard round trip (5000 tokens, 11024 bytes)");
}

// require_disjoint_shards: no shard of -j is one of -i's, by its path or by its bytes (a copy
// under another name); shards of one size that differ only in their last token, past the first
// chunk compared, are two shards.
void test_disjoint_shards() {
  std::vector<uint16_t> tokens(40000);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (uint16_t)((i * 7919) % kVocab);
  const std::string train = kDir + "/disjoint_train.bin";
  for (const char* dir : {"copy", "last", "shorter"}) llmc::make_dirs(kDir + "/disjoint_" + dir);
  llmc::write_token_shard(train, tokens);
  llmc::write_token_shard(kDir + "/disjoint_copy/val.bin", tokens);
  tokens.back() ^= 1;
  llmc::write_token_shard(kDir + "/disjoint_last/val.bin", tokens);
  tokens.pop_back();
  llmc::write_token_shard(kDir + "/disjoint_shorter/val.bin", tokens);
  const std::string copy_pattern = kDir + "/disjoint_copy/*.bin";
  check_throws([&] { llmc::require_disjoint_shards(train, copy_pattern); },
               kDir + "/disjoint_copy/val.bin (-j '" + copy_pattern + "') holds the same bytes as " +
                   train + " (-i '" + train + "'): the run would train on its validation data; "
                   "give -j shards that are not copies of -i's",
               "a -j shard that is a copy of an -i shard, under another name");
  check_throws([&] { llmc::require_disjoint_shards(kDir + "/disjoint_*.bin", train); },
               train + " is matched by both -i '" + kDir + "/disjoint_*.bin' and -j '" + train + "'",
               "one shard matched by -i and -j");
  const std::vector<std::pair<std::string, std::string>> apart = {
      {"last", "with its last token changed"}, {"shorter", "one token shorter"}};
  for (const auto& [dir, what] : apart) {
    std::string error;
    try {
      llmc::require_disjoint_shards(train, kDir + "/disjoint_" + dir + "/val.bin");
    } catch (const llmc::Error& e) {
      error = e.what();
    }
    check_verbose(error.empty(), "a copy of the -i shard " + what + " is accepted as -j " + error);
  }
}

}  // namespace

int main() {
  try {
    llmc::make_dirs(kDir);
    test_shard_round_trip();
    test_plain_order();
    test_shuffled_order();
    test_epoch_coverage();
    test_rank_splits(false);
    test_rank_splits(true);
    test_state_restore();
    test_restore_other_world();
    test_malformed_shards();
    test_disjoint_shards();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_dataloader");
}
