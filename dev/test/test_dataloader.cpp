// Tests llmc/dataloader.h: shard writing and validation, the data order of
// SPEC.md (plain, shuffled, split over ranks, over epochs), reset and
// state/restore (also from another process count), and -i and -j kept apart; then the
// document-aligned order of DocumentLoader (hand-worked streams and cuts, the same sequences over
// process counts, epochs and shuffle, state/restore, errors, a 663,000-token document), its
// document cap and its reshape at a stage's boundary. Shards go to build/test_tmp/dataloader/. With
// --dump-documents it writes a DocumentLoader's sequences instead (dump_documents), with
// --dump-stages those of loaders following a stage plan (dump_stages).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/dataloader.h"
#include "llmc/stages.h"

using llmc::DataLoader;
using llmc::DocumentLoader;
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
  s.epoch = INT64_MAX;  // the next epoch's count would overflow
  check_throws([&] { loader.restore(s); }, "corrupt position (epoch 9223372036854775807,",
               "restore of an epoch no run reaches");
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

// ---------------------------------------------------------------------------------------------
// DocumentLoader (SPEC.md "Document-aligned order"). A shard is written as documents, each the
// token 50256 and then its body; it may begin with a body of `prefix` tokens (no document start).
// Body tokens say where they are (shard * kBodyStride + position, below 50000), so that a row
// can be located in the small shards of these tests.

constexpr int kBodyStride = 10007;

std::vector<uint16_t> document_tokens(int shard, const std::vector<int>& lengths, int prefix = 0) {
  std::vector<uint16_t> tokens;
  auto body = [&] { return (uint16_t)((shard * kBodyStride + tokens.size()) % 50000); };
  for (int i = 0; i < prefix; i++) tokens.push_back(body());
  for (int length : lengths) {
    tokens.push_back(llmc::kDocumentStartToken);
    for (int i = 1; i < length; i++) tokens.push_back(body());
  }
  return tokens;
}

// Writes the shards `name_000.bin`, ...; returns their glob.
std::string write_document_shards(const std::string& name,
                                  const std::vector<std::vector<uint16_t>>& shards) {
  for (size_t s = 0; s < shards.size(); s++) {
    llmc::write_token_shard(shard_path(name, (int)s), shards[s]);
  }
  return kDir + "/" + name + "_*.bin";
}

using Row = std::vector<int>;  // one sequence: T inputs and the last target

struct Settings {
  int B, T, grad_accum, world;
  bool shuffle = false;
  uint64_t seed = 5;
  int cap = 0;  // the document cap (0: none)
};

std::vector<DocumentLoader> document_loaders(const std::string& pattern, const Settings& s) {
  std::vector<DocumentLoader> ranks;
  for (int r = 0; r < s.world; r++) {
    ranks.emplace_back(pattern, "-i", s.B, s.T, s.grad_accum, r, s.world, s.shuffle, s.seed,
                       kVocab, s.cap);
  }
  return ranks;
}

// The rows the ranks read in their next `steps` steps, in stream order (micro batch by micro
// batch, rank by rank, row by row); clears *shifted when targets are not the inputs shifted.
std::vector<Row> take_rows(std::vector<DocumentLoader>& ranks, const Settings& s, int steps,
                           bool* shifted) {
  std::vector<Row> rows;
  std::vector<int> x(s.B * s.T), y(s.B * s.T);
  for (int step = 0; step < steps; step++) {
    for (int m = 0; m < s.grad_accum; m++) {
      for (DocumentLoader& rank : ranks) {
        rank.next_batch(x.data(), y.data());
        for (int b = 0; b < s.B; b++) {
          Row row(x.begin() + b * s.T, x.begin() + (b + 1) * s.T);
          row.push_back(y[(b + 1) * s.T - 1]);
          for (int t = 0; t + 1 < s.T; t++) {
            *shifted = *shifted && y[b * s.T + t] == x[b * s.T + t + 1];
          }
          rows.push_back(row);
        }
      }
    }
  }
  return rows;
}

// Where each row lies: (shard, first position), or (-1, -1) when it is no slice of a shard.
std::vector<Batch> locate(const std::vector<Row>& rows,
                          const std::vector<std::vector<uint16_t>>& shards) {
  std::vector<Batch> out;
  for (const Row& row : rows) {
    Batch found;
    for (size_t s = 0; s < shards.size() && found.shard < 0; s++) {
      for (size_t p = 0; p + row.size() <= shards[s].size(); p++) {
        if (std::equal(row.begin(), row.end(), shards[s].begin() + p)) {
          found = {(int)s, (int)p};
          break;
        }
      }
    }
    out.push_back(found);
  }
  return out;
}

std::string describe(const std::vector<Batch>& at) {
  std::string text;
  for (const Batch& b : at) text += llmc::strformat(" %d:%d", b.shard, b.position);
  return text;
}

// Hand-worked streams with T=4 and one sequence a step (a window of 8 tokens): the search runs on
// past the window (where the reference gives up), and the cuts where a shard has no document
// start with T tokens after it.
void test_documents_by_hand() {
  const Settings one{1, 4, 1, 1};
  // 2 tokens before the first document; the window of a step at 0 holds no document 4 tokens on.
  const std::vector<std::vector<uint16_t>> plain = {
      document_tokens(0, {3, 6, 1, 1, 5, 2, 9, 4, 12, 3, 3}, 2)};
  std::vector<DocumentLoader> loader =
      document_loaders(write_document_shards("doc_hand", plain), one);
  bool shifted = true;
  std::vector<Batch> at = locate(take_rows(loader, one, 7, &shifted), plain);
  check_verbose(shifted &&
                    at == batches({{0, 2}, {0, 11}, {0, 18}, {0, 29}, {0, 33}, {0, 2}, {0, 11}}, 1),
                "T=4: the 2 tokens before the first document are skipped; a sequence runs from a "
                "document start to T+1 tokens, the next starts at the first document T or more "
                "tokens on; 33+8+1 >= 51 tokens begins the next epoch:" + describe(at));
  check(loader[0].epoch() == 1, "the sixth step is of epoch 1");

  // A document of 20 > the window, one reaching the shard's end, a shard without a document start
  // (a document spanning it), one whose only document start has T-1 tokens after it, and one
  // whose only document start has T.
  std::vector<uint16_t> bare(20), late(20), edge(20);
  for (int i = 0; i < 20; i++) {
    bare[i] = (uint16_t)(kBodyStride + i);
    late[i] = (uint16_t)(2 * kBodyStride + i);
    edge[i] = (uint16_t)(3 * kBodyStride + i);
  }
  late[16] = llmc::kDocumentStartToken;
  edge[15] = llmc::kDocumentStartToken;
  const std::vector<std::vector<uint16_t>> cuts = {document_tokens(0, {5, 20, 3, 30}), bare, late,
                                                   edge};
  loader = document_loaders(write_document_shards("doc_cuts", cuts), one);
  at = locate(take_rows(loader, one, 14, &shifted), cuts);
  check_verbose(shifted && at == batches({{0, 0}, {0, 5}, {0, 25}, {0, 29}, {0, 33}, {0, 37},
                                          {0, 41}, {0, 45}, {1, 0}, {1, 4}, {1, 8}, {2, 0},
                                          {3, 15}, {0, 0}}, 1),
                "the long document's tail is skipped; with no document start T on, sequences step "
                "T tokens through the last document and the bare shard; a document start with "
                "T-1 tokens after it is passed over, one with T taken:" + describe(at));

  // Two sequences a step: in the first shard the first runs to the document start 3 tokens before
  // its end, so the second begins the next shard within the step; in the third the second starts
  // T+1 tokens before the end, the last place a sequence fits.
  const Settings two{1, 4, 2, 1};
  const std::vector<std::vector<uint16_t>> split = {document_tokens(0, {27, 3}),
                                                    document_tokens(1, {5, 5, 5, 5, 5, 5}),
                                                    document_tokens(2, {25, 5})};
  loader = document_loaders(write_document_shards("doc_split", split), two);
  at = locate(take_rows(loader, two, 4, &shifted), split);
  check_verbose(shifted && at == batches({{0, 0}, {1, 0}, {1, 5}, {1, 10}, {2, 0}, {2, 25},
                                          {0, 0}, {1, 0}}, 1),
                "a step whose sequences run out of a shard goes on in the next:" + describe(at));
  std::vector<DocumentLoader> ranks = document_loaders(kDir + "/doc_split_*.bin", {1, 4, 1, 2});
  check_verbose(locate(take_rows(ranks, {1, 4, 1, 2}, 4, &shifted), split) == at,
                "the same with 2 processes of one micro batch each");
}

// Random documents of 1 to `longest` T tokens (a fifth of one token, some longer than a window of
// 16T by default), over shards of which the second begins 7 tokens before its first document and
// the last is a single document.
std::vector<std::vector<uint16_t>> random_document_shards(int T, int count, uint64_t seed, int longest = 24) {
  llmc::Rng rng(seed);
  std::vector<std::vector<uint16_t>> shards;
  for (int s = 0; s < count; s++) {
    std::vector<int> lengths;
    int total = 0;
    const int target = 40 * T + (int)(rng.u32() % (20 * T));
    while (total < target) {
      const uint32_t kind = rng.u32() % 10;
      const int length = kind < 2   ? 1
                         : kind < 8 ? 1 + (int)(rng.u32() % T)
                                    : 1 + (int)(rng.u32() % (longest * T));
      lengths.push_back(length);
      total += length;
    }
    if (s == count - 1) lengths = {total};  // one document spans the shard
    shards.push_back(document_tokens(s, lengths, s == 1 ? 7 : 0));
  }
  return shards;
}

// A step's sequences are one stream: whatever the processes, micro batches and B, runs whose
// steps take as many sequences read the same ones in the same order; with a cap (> 0) too, over
// shards without the last one (a single document, which cannot fill a step of capped documents)
// and of shorter documents (up to 3T), so that a shard holds many steps of them.
void test_documents_over_processes(int cap) {
  const int T = 8;
  std::vector<std::vector<uint16_t>> shards = random_document_shards(T, 4, 3, cap > 0 ? 3 : 24);
  if (cap > 0) shards.pop_back();
  const std::string pattern = write_document_shards(llmc::strformat("doc_world_cap%d", cap), shards);
  for (bool shuffle : {false, true}) {
    // 8 sequences a step: 1 process x 8 micro batches of 1, 2 x 4, 4 x 2, 8 x 1, and B=2 and 4.
    const std::vector<Settings> layouts = {{1, T, 8, 1}, {1, T, 4, 2}, {1, T, 2, 4}, {1, T, 1, 8},
                                           {2, T, 4, 1}, {2, T, 2, 2}, {4, T, 1, 2}};
    std::vector<Row> first;
    bool all_equal = true, shifted = true;
    for (Settings s : layouts) {
      s.shuffle = shuffle;
      s.cap = cap;
      std::vector<DocumentLoader> ranks = document_loaders(pattern, s);
      const std::vector<Row> rows = take_rows(ranks, s, 40, &shifted);
      if (first.empty()) first = rows;
      all_equal = check(rows == first, llmc::strformat("%s: %d processes x %d micro batches x B=%d",
                                                        shuffle ? "shuffled" : "plain", s.world,
                                                        s.grad_accum, s.B)) && all_equal;
    }
    const std::vector<Batch> at = locate(first, shards);
    long starts = 0, in_shards = 0;
    for (size_t i = 0; i < at.size(); i++) {
      in_shards += at[i].shard >= 0;
      starts += first[i][0] == llmc::kDocumentStartToken;
    }
    if (cap > 0) {
      check_verbose(all_equal && shifted && starts == (long)first.size(),
                    llmc::strformat("%s, cap %d: 7 layouts of 8 sequences a step read the same %zu "
                                    "sequences over 40 steps, each starting at a document",
                                    shuffle ? "shuffled" : "plain", cap, first.size()));
      continue;
    }
    check_verbose(all_equal && shifted && in_shards == (long)at.size(),
                  llmc::strformat("%s: 7 layouts of 8 sequences a step read the same %zu "
                                  "sequences over 40 steps, each a slice of one shard (%ld start "
                                  "at a document)", shuffle ? "shuffled" : "plain", first.size(),
                                  starts));
  }
}

// Epochs take the shards in the order of SPEC.md's per-epoch permutations (MT19937(seed)); the
// same seed gives the same sequences, another seed another order; without shuffle each epoch
// repeats the first.
void test_document_epochs() {
  const int T = 8;
  const std::vector<std::vector<uint16_t>> shards = random_document_shards(T, 4, 9);
  const std::string pattern = write_document_shards("doc_epochs", shards);
  for (bool shuffle : {false, true}) {
    const Settings s{1, T, 2, 2, shuffle, 1337};
    std::vector<DocumentLoader> ranks = document_loaders(pattern, s);
    bool shifted = true;
    std::vector<std::vector<int>> epoch_shards(3);  // the shards each epoch visits, in order
    std::vector<std::vector<Row>> epoch_rows(3);
    while (ranks[0].epoch() < 3) {
      const long epoch = ranks[0].epoch();
      const std::vector<Row> rows = take_rows(ranks, s, 1, &shifted);
      for (const Batch& b : locate(rows, shards)) {
        std::vector<int>& visited = epoch_shards[epoch];
        if (visited.empty() || visited.back() != b.shard) visited.push_back(b.shard);
      }
      epoch_rows[epoch].insert(epoch_rows[epoch].end(), rows.begin(), rows.end());
    }
    llmc::Rng rng(1337);
    std::vector<std::vector<int>> expected;
    for (int e = 0; e < 3; e++) {
      expected.push_back(shuffle ? llmc::random_permutation(rng, 4) : std::vector<int>{0, 1, 2, 3});
    }
    std::string order;
    for (const std::vector<int>& e : epoch_shards) {
      order += " [";
      for (int shard : e) order += llmc::strformat("%d", shard);
      order += "]";
    }
    check_verbose(shifted && epoch_shards == expected,
                  std::string(shuffle ? "shuffled" : "plain") +
                      ": 3 epochs visit the shards in the order" + order +
                      (shuffle ? " of permutation(4) drawn per epoch from MT19937(1337)" : ""));
    if (!shuffle) {
      check_verbose(epoch_rows[1] == epoch_rows[0] && epoch_rows[2] == epoch_rows[0],
                    llmc::strformat("without shuffle every epoch reads the same %zu sequences",
                                    epoch_rows[0].size()));
    } else {
      std::vector<DocumentLoader> same = document_loaders(pattern, s);
      Settings other_seed = s;
      other_seed.seed = 1338;
      std::vector<DocumentLoader> other = document_loaders(pattern, other_seed);
      const size_t n = epoch_rows[0].size() + epoch_rows[1].size();
      std::vector<Row> both = epoch_rows[0];
      both.insert(both.end(), epoch_rows[1].begin(), epoch_rows[1].end());
      const std::vector<Row> again = take_rows(same, s, (int)(n / 4), &shifted);
      const std::vector<Row> different = take_rows(other, other_seed, (int)(n / 4), &shifted);
      check_verbose(std::vector<Row>(both.begin(), both.begin() + again.size()) == again &&
                        std::vector<Row>(both.begin(), both.begin() + different.size()) != different,
                    "the same seed gives the same sequences, seed 1338 others");
      ranks[0].reset();
      ranks[1].reset();
      check_verbose(take_rows(ranks, s, 3, &shifted) == std::vector<Row>(both.begin(), both.begin() + 12),
                    "reset() goes back to the first step of epoch 0");
    }
  }
}

// state() and restore() continue at the same sequence: between steps and within one, across a
// shard and an epoch, into another process count (as many sequences a step), and B; with a cap
// (> 0) too, over shards of documents up to 3T without the last one (a single document).
void test_document_restore(int cap) {
  const int T = 8;
  std::vector<std::vector<uint16_t>> shards = random_document_shards(T, cap > 0 ? 4 : 3, 21, cap > 0 ? 3 : 24);
  if (cap > 0) shards.pop_back();
  const std::string pattern = write_document_shards(llmc::strformat("doc_restore_cap%d", cap), shards);
  Settings four{1, T, 4, 1, true, 21};
  four.cap = cap;
  std::vector<DocumentLoader> reference = document_loaders(pattern, four);
  bool shifted = true;
  const std::vector<Row> stream = take_rows(reference, four, 120, &shifted);  // past 2 epochs
  check(reference[0].epoch() >= 2, "120 steps of 4 sequences reach epoch 2");
  // Resumes after `taken` sequences of the 1-process run, into `into`.
  auto resume = [&](long taken, const Settings& into) {
    std::vector<DocumentLoader> original = document_loaders(pattern, four);
    std::vector<int> x(T), y(T);
    for (long i = 0; i < taken; i++) original[0].next_batch(x.data(), y.data());
    const llmc::DataLoaderState saved = original[0].state();
    Settings other = into;
    other.cap = cap;
    other.shuffle = true;
    other.seed = 999;  // the generator comes from the state
    std::vector<DocumentLoader> ranks = document_loaders(pattern, other);
    take_rows(ranks, other, 1, &shifted);
    for (DocumentLoader& rank : ranks) rank.restore(saved);
    // The rest of the current step micro batch by micro batch, then whole steps.
    const int per_batch = into.world * into.B;
    std::vector<Row> rows;
    Settings one_batch = into;
    one_batch.grad_accum = 1;
    for (long q = taken; q % (4L) != 0; q += per_batch) {
      const std::vector<Row> part = take_rows(ranks, one_batch, 1, &shifted);
      rows.insert(rows.end(), part.begin(), part.end());
    }
    const std::vector<Row> steps = take_rows(ranks, into, 30, &shifted);
    rows.insert(rows.end(), steps.begin(), steps.end());
    return std::vector<Row>(stream.begin() + taken, stream.begin() + taken + rows.size()) == rows;
  };
  bool all = true;
  for (long taken : {0L, 1L, 3L, 4L, 38L, 41L, 150L, 203L, 300L}) {
    all = check(resume(taken, four),
                llmc::strformat("restore after %ld sequences continues identically", taken)) && all;
  }
  check_verbose(all, llmc::strformat("cap %d: state/restore continues identically from 9 positions (within steps, "
                                     "across shards and epochs)", cap));
  all = true;
  const std::vector<std::pair<Settings, std::vector<long>>> others = {
      {{1, T, 2, 2}, {0, 2, 40, 122}}, {{1, T, 1, 4}, {0, 8, 124}},
      {{2, T, 2, 1}, {0, 2, 122}}, {{2, T, 1, 2}, {0, 40, 124}}};
  for (const auto& [into, positions] : others) {
    for (long taken : positions) {
      all = check(resume(taken, into),
                  llmc::strformat("1 process -> %d x %d micro batches x B=%d after %ld sequences",
                                  into.world, into.grad_accum, into.B, taken)) && all;
    }
  }
  check_verbose(all, llmc::strformat("cap %d: a state restores into 2 and 4 processes and B=2 (as many sequences "
                                     "a step), within steps too", cap));
  std::vector<DocumentLoader> loader = document_loaders(pattern, four);
  std::vector<int> x(T), y(T);
  loader[0].next_batch(x.data(), y.data());
  std::vector<DocumentLoader> two = document_loaders(pattern, {1, T, 2, 2, true, 21});
  check_throws([&] { two[0].restore(loader[0].state()); },
               "the checkpoint was taken after 1 of a step's 4 sequences, not a whole number of this "
               "run's micro batches (2 processes x B=1); resume from a checkpoint taken between steps",
               "a state within a step that the new micro batches cannot continue");
}

// The tokens of a shard's slices (position, count), one after another: a capped row.
Row slices(const std::vector<uint16_t>& shard, const std::vector<std::pair<int, int>>& parts) {
  Row row;
  for (const auto& [position, count] : parts) row.insert(row.end(), shard.begin() + position, shard.begin() + position + count);
  return row;
}

// Documents capped at 4 tokens, T=4 (rows of 5), one row a step: each row takes each document's
// first 4 tokens from a document start until it is full, the last document cut to fit; the next
// row starts at the document start after the last document's, however little of it was taken.
void test_document_cap_by_hand() {
  const std::vector<std::vector<uint16_t>> shards = {document_tokens(0, {10, 3, 7, 2, 20, 6}, 2)};
  const std::string pattern = write_document_shards("doc_cap", shards);
  const std::vector<uint16_t>& x = shards[0];  // documents at 2, 12, 15, 22, 24, 44 (50 tokens)
  Settings capped{1, 4, 1, 1};
  capped.cap = 4;
  std::vector<DocumentLoader> loader = document_loaders(pattern, capped);
  bool shifted = true;
  const std::vector<Row> rows = take_rows(loader, capped, 5, &shifted);
  const Row first = slices(x, {{2, 4}, {12, 1}}), second = slices(x, {{15, 4}, {22, 1}});
  const std::vector<Row> expected = {first, second, slices(x, {{24, 4}, {44, 1}}), first, second};
  check_verbose(shifted && rows == expected,
                "cap 4, T=4: rows of capped documents (2 tokens before the first document skipped, the "
                "10-token document cut to 4, a row ending on a document's start going on at the next "
                "document), then the next epoch where no document is left");
  Settings too_small = capped;
  too_small.T = 128;
  check_throws([&] { document_loaders(write_document_shards("doc_cap_small", {document_tokens(0, {300})}), too_small); },
               "its documents, capped at 4 tokens each, hold fewer than one step's 1 sequence of T+1 = 129 tokens "
               "from its first document start",
               "a shard whose capped documents cannot fill one step");
}

// Documents capped at 8 tokens, T=4, two rows a step: a document of exactly T+1 tokens fills a
// row, a longer one is cut to T+1 (the cap above the row's length), a document runs to the
// shard's end; where the shard cannot give both rows of a step, the whole step comes from the
// next shard's first document start, whatever the processes, micro batches and B.
void test_document_packing_by_hand() {
  const std::vector<std::vector<uint16_t>> shards = {document_tokens(0, {5, 9, 3, 4}, 3),
                                                     document_tokens(1, {2, 6, 12})};
  const std::string pattern = write_document_shards("doc_pack", shards);
  const std::vector<uint16_t>& a = shards[0];  // documents at 3, 8, 17, 20 (24 tokens)
  const std::vector<uint16_t>& b = shards[1];  // documents at 0, 2, 8 (20 tokens)
  const Row step1_a = slices(a, {{3, 5}}), step1_b = slices(a, {{8, 5}});
  // Step 2 from shard 0 would be [17, 3) + [20, 2) and then nothing: it is read from shard 1.
  const std::vector<Row> expected = {step1_a, step1_b, slices(b, {{0, 2}, {2, 3}}), slices(b, {{8, 5}}),
                                     step1_a, step1_b};
  bool all = true, shifted = true;
  for (Settings s : std::vector<Settings>{{1, 4, 2, 1}, {1, 4, 1, 2}, {2, 4, 1, 1}}) {
    s.cap = 8;
    std::vector<DocumentLoader> ranks = document_loaders(pattern, s);
    all = check(take_rows(ranks, s, 3, &shifted) == expected,
                llmc::strformat("%d processes x %d micro batches x B=%d", s.world, s.grad_accum, s.B)) && all;
  }
  check_verbose(all && shifted, "cap 8, T=4, 2 rows a step (1 x 2 micro batches, 2 processes, B=2): a document of "
                                "T+1 whole, one of 9 cut to T+1, the step the first shard cannot finish read "
                                "whole from the second, then the next epoch");
}

// A stage's new shape (reshape between steps) reads the step about to begin again, as a loader
// made with that shape at the step's place would; the shape it has changes nothing; within a step
// it fails.
void test_document_reshape() {
  const int T = 8;
  std::vector<std::vector<uint16_t>> shards = random_document_shards(T, 4, 17);
  shards.pop_back();  // a single document, which capped documents cannot fill a row from
  const std::string pattern = write_document_shards("doc_reshape", shards);
  bool all = true, shifted = true;
  for (bool shuffle : {false, true}) {
    for (int world : {1, 2}) {
      Settings before{1, T, 2, world, shuffle, 17};
      Settings after{1, 2 * T, 1, world, shuffle, 17};
      after.cap = 11;
      for (int boundary : {1, 7, 40}) {
        std::vector<DocumentLoader> straight = document_loaders(pattern, before);
        take_rows(straight, before, boundary, &shifted);
        const llmc::DataLoaderState place = straight[0].state();
        for (DocumentLoader& rank : straight) rank.reshape(after.T, after.grad_accum, after.cap);
        const std::vector<Row> reshaped = take_rows(straight, after, 25, &shifted);
        // A loader of the new shape at the step's place: the state as that shape would have saved it.
        llmc::DataLoaderState moved = place;
        moved.seq_len = after.T;
        moved.grad_accum = after.grad_accum;
        std::vector<DocumentLoader> fresh = document_loaders(pattern, after);
        for (DocumentLoader& rank : fresh) rank.restore(moved);
        all = check(take_rows(fresh, after, 25, &shifted) == reshaped,
                    llmc::strformat("%s, %d process(es): reshaped after step %d", shuffle ? "shuffled" : "plain",
                                    world, boundary)) && all;
      }
    }
  }
  check_verbose(all && shifted, "T 8 -> 16, 2 -> 1 micro batches, cap 0 -> 11 after steps 1, 7 and 40 (plain and "
                                "shuffled, 1 and 2 processes): the rows of a loader made with the new shape there");
  const Settings plain{1, T, 2, 1};
  std::vector<DocumentLoader> a = document_loaders(pattern, plain), b = document_loaders(pattern, plain);
  take_rows(a, plain, 3, &shifted);
  take_rows(b, plain, 3, &shifted);
  b[0].reshape(T, 2, 0);
  check_verbose(take_rows(a, plain, 20, &shifted) == take_rows(b, plain, 20, &shifted),
                "a reshape to the shape held changes nothing");
  std::vector<int> x(T), y(T);
  b[0].next_batch(x.data(), y.data());
  check_throws([&] { b[0].reshape(2 * T, 1, 0); }, "changes between steps only", "a reshape within a step");
}

void test_document_errors() {
  const int failed_before = testing::failed_count(), passed_before = testing::passed_count();
  const int T = 8;
  const std::string pattern = write_document_shards("doc_errors", random_document_shards(T, 2, 4));
  DocumentLoader loader(pattern, "-i", 1, T, 4, 0, 2, true, 3, kVocab);
  const llmc::DataLoaderState good = loader.state();
  auto restore_changed = [&](void (*change)(llmc::DataLoaderState&)) {
    llmc::DataLoaderState s = good;
    change(s);
    return [&loader, s] { loader.restore(s); };
  };
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.seq_len = 16; }),
               "the checkpoint was taken with 2 shards, T=16, shuffle 1, but this run has 2, T=8, "
               "1; resume with the same data and settings", "a state of another T");
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.shuffle = 0; }),
               "resume with the same data and settings", "a state without shuffle");
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.num_shards = 3; }),
               "resume with the same data and settings", "a state of 3 shards");
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.grad_accum = 2; }),
               "a step of the checkpoint took 2 processes x 2 micro batches x B=1 sequences, a step "
               "of this run takes 2 x 4 x B=1 = 8; keep processes x micro batches x B the same",
               "a state of steps of 4 sequences into steps of 8");
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.world = 3; }),
               "keep processes x micro batches x B the same", "a state of 3 processes");
  check_throws(restore_changed([](llmc::DataLoaderState& s) {
                 s.order = llmc::DataOrder::kBatches;
               }),
               "the checkpoint read contiguous batches, this run reads document-aligned sequences",
               "a state of contiguous batches");
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.world = 0; }),
               "corrupt step of 0 processes x 4 micro batches x B=1", "a state of no processes");
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.batch_position = 4; }),
               "corrupt position (epoch 0, shard 0 of 2, micro batch 4 of 4)",
               "a micro batch past the step");
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.shard_position = -1; }),
               "corrupt position", "a negative shard position");
  check_throws(restore_changed([](llmc::DataLoaderState& s) { s.token_position = 1L << 40; }),
               "corrupt position (token 1099511627776 of", "a token position past the shard");
  DataLoader batches(pattern, "-i", 1, T, 0, 1, false, 3, kVocab);
  check_throws([&] { batches.restore(good); },
               "the checkpoint read document-aligned sequences, this run reads contiguous batches",
               "a document-aligned state into a DataLoader");

  // Each shard must hold a step's window (2 x 4 x 1 x 8 x 2 = 128 tokens) and 2 more.
  llmc::write_token_shard(kDir + "/doc_short.bin", document_tokens(0, {60, 69}));
  check_throws([&] {
                 DocumentLoader d(kDir + "/doc_short.bin", "-i", 1, T, 4, 1, 2, false, 0, kVocab);
               },
               "doc_short.bin: 129 tokens are too few for one step of document-aligned sequences, "
               "which are sought in twice a step's tokens: 2 x -z 64 (4 micro batches x B=1 x T=8 "
               "x 2 processes) + 2 needs at least 130; use a smaller -z (or -b, -t) or a longer "
               "shard", "a shard one token short of a step's window");
  check_throws([&] { DocumentLoader d(pattern, "-i", 1, T, 0, 0, 1, false, 0, kVocab); },
               "data loader for -i: 0 micro batches per step must be positive", "no micro batches");
  check_throws([&] { DocumentLoader d(pattern, "-i", 1, T, 1, 2, 2, false, 0, kVocab); }, "rank 2",
               "rank outside the world");
  std::vector<uint16_t> bad = document_tokens(0, {100, 100});
  bad[150] = 50300;
  llmc::write_token_shard(kDir + "/doc_vocab.bin", bad);
  check_throws([&] {
                 DocumentLoader d(kDir + "/doc_vocab.bin", "-i", 1, T, 1, 0, 1, false, 0, kVocab);
               },
               "doc_vocab.bin: token 50300 at position 150 is >= vocab size 50257",
               "a token outside the vocabulary");
  printf("%s %d bad states and settings each fail with a one-line message naming the problem\n",
         testing::failed_count() == failed_before ? "ok  " : "FAIL",
         testing::passed_count() - passed_before + testing::failed_count() - failed_before);
}

// modded-nanogpt's own setting (T = 48K, 8 processes of one micro batch: a window of 786,432
// tokens) with a 663,000-token document: the reference stops there (its first sequence takes the
// whole document, and 7 more do not fit what is left of the window); here the document's
// sequence is its first T+1 tokens and the next starts at the document after it. 16 documents of
// T tokens come first, so that the third step starts at the long one.
void test_long_document() {
  const int T = 48 * 1024;
  std::vector<int> lengths(16, T);
  const size_t long_index = lengths.size();
  lengths.push_back(663000);
  llmc::Rng rng(2);
  for (int i = 0; i < 100; i++) lengths.push_back(1 + (int)(rng.u32() % 30000));
  const std::vector<uint16_t> tokens = document_tokens(0, lengths);
  long long_start = 0;
  for (size_t i = 0; i < long_index; i++) long_start += lengths[i];
  const std::string pattern = write_document_shards("doc_long", {tokens});
  const Settings eight{1, T, 1, 8};
  std::vector<DocumentLoader> ranks = document_loaders(pattern, eight);
  bool shifted = true;
  const std::vector<Row> rows = take_rows(ranks, eight, 4, &shifted);
  std::vector<DocumentLoader> one = document_loaders(pattern, {1, T, 8, 1});
  long at_long = -1;
  for (size_t i = 0; i < rows.size(); i++) {
    if (std::equal(rows[i].begin(), rows[i].end(), tokens.begin() + long_start)) at_long = (long)i;
  }
  const bool next_after = at_long >= 0 && at_long + 1 < (long)rows.size() &&
                          std::equal(rows[at_long + 1].begin(), rows[at_long + 1].end(),
                                     tokens.begin() + long_start + 663000);
  check_verbose(shifted && next_after && take_rows(one, {1, T, 8, 1}, 4, &shifted) == rows,
                llmc::strformat("a 663000-token document at T=%d over 8 processes: sequence %ld is its "
                                "first T+1 tokens, the next starts after it; 1 process x 8 micro "
                                "batches reads the same 32 sequences", T, at_long));
}

// --dump-documents: the sequences of DocumentLoaders of every rank, for dev/test/test_documents.sh
// to compare with train_gpt2.py's DocumentLoader; int32, in stream order (step by step, micro
// batch by micro batch, rank by rank, row by row), T+1 tokens a sequence; with CAP, of documents
// capped at CAP tokens.
// --dump-stages: the sequences of DocumentLoaders of every rank following a stage plan
// (llmc/stages.h) over its N + E steps, reshaped where a step's shape changes; as --dump-documents,
// T_s+1 tokens a sequence.
int dump_stages(char** argv) {
  const int B = atoi(argv[4]), world = atoi(argv[5]);
  llmc::StagePlan plan(argv[8], "-sp", atoi(argv[9]), atol(argv[10]), {});
  plan.resolve(atol(argv[11]));
  llmc::StepPlan shape = plan.at(0, B, world);
  std::vector<DocumentLoader> ranks;
  for (int r = 0; r < world; r++) {
    ranks.emplace_back(argv[3], "-i", B, shape.T, shape.micro_steps, r, world, atoi(argv[6]) != 0,
                       (uint64_t)atoll(argv[7]), kVocab, shape.cap);
  }
  std::vector<Row> rows;
  bool shifted = true;
  for (long step = 0; step < plan.total_steps(); step++) {
    shape = plan.at(step, B, world);
    for (DocumentLoader& rank : ranks) rank.reshape(shape.T, shape.micro_steps, shape.cap);
    const std::vector<Row> part = take_rows(ranks, {B, shape.T, shape.micro_steps, world}, 1, &shifted);
    rows.insert(rows.end(), part.begin(), part.end());
  }
  if (!shifted) LLMC_FAIL("the targets of a row are not its inputs shifted by one");
  llmc::write_file_atomically(argv[2], [&](llmc::File& f) {
    for (const Row& row : rows) f.write(row.data(), row.size() * sizeof(int), "a sequence");
  });
  printf("%zu sequences over %ld steps to %s\n", rows.size(), plan.total_steps(), argv[2]);
  return 0;
}

int dump_documents(int argc, char** argv) {
  if ((argc != 11 && argc != 12) || std::string(argv[1]) != "--dump-documents") {
    fprintf(stderr, "usage: %s [--dump-documents OUT PATTERN B T GRAD_ACCUM WORLD SHUFFLE SEED "
                    "STEPS [CAP] | --dump-stages OUT PATTERN B WORLD SHUFFLE SEED PLAN T Z STEPS]\n", argv[0]);
    return 2;
  }
  const Settings s{atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), atoi(argv[8]) != 0,
                   (uint64_t)atoll(argv[9]), argc == 12 ? atoi(argv[11]) : 0};
  std::vector<DocumentLoader> ranks = document_loaders(argv[3], s);
  bool shifted = true;
  const std::vector<Row> rows = take_rows(ranks, s, atoi(argv[10]), &shifted);
  if (!shifted) LLMC_FAIL("the targets of a row are not its inputs shifted by one");
  llmc::write_file_atomically(argv[2], [&](llmc::File& f) {
    for (const Row& row : rows) f.write(row.data(), row.size() * sizeof(int), "a sequence");
  });
  printf("%zu sequences of %d tokens to %s\n", rows.size(), s.T + 1, argv[2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    try {
      if (argc == 12 && std::string(argv[1]) == "--dump-stages") return dump_stages(argv);
      return dump_documents(argc, argv);
    } catch (const llmc::Error& e) {
      fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
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
    test_documents_by_hand();
    test_documents_over_processes(0);
    test_documents_over_processes(5);
    test_document_epochs();
    test_document_restore(0);
    test_document_restore(5);
    test_document_cap_by_hand();
    test_document_packing_by_hand();
    test_document_reshape();
    test_document_errors();
    test_long_document();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_dataloader");
}
