// Token shards and the data loaders (SPEC.md "Token shard", "Data order" and "Document-aligned
// order").
//
// A shard is a 256-int32 header [0]=20240520 [1]=1 [2]=token count, then that
// many uint16 tokens; the file is exactly 1024 + 2*count bytes. The data tools
// write token 50256 (GPT-2's end of text) before every document.
//
// DataLoader hands each rank micro batches of B*T int32 inputs and targets
// (targets are the inputs shifted by one token). With chunk = B*T, a shard of
// n tokens has num_batches = (n - 1) / (world*chunk) batches; batch b gives
// rank r the tokens at o = (b*world + r)*chunk. One MT19937 seeded with `seed`
// (the same on every rank) orders the data: each epoch starts with
// permutation(num_shards) for the shard order, and each shard, when opened,
// draws permutation(num_batches) for its batch order (both identity without
// shuffle). After a shard's last batch the next shard of the epoch's order is
// opened; after the last shard a new epoch begins.
//
// DocumentLoader hands out the same shapes, but every row is a sequence that starts at a
// document, chosen as modded-nanogpt chooses them (at DocumentLoader); its epochs take the shards
// in the same per-epoch order. Both share ShardOrder, which reads the shards and saves, checks
// and restores the part of a loader's state that is about them.
//
// Every shard's header and size are checked when a loader is built, so a
// bad file fails at start-up; token ids are checked against the vocabulary
// when a shard is loaded, because that is the only time its tokens are read.
// Only one shard is held in memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "rand.h"
#include "utils.h"

namespace llmc {

constexpr int kShardMagic = 20240520;
constexpr int kShardVersion = 1;
constexpr int kShardHeaderInts = 256;
constexpr long kShardHeaderBytes = kShardHeaderInts * 4;

// Shards hold uint16 ids: a vocabulary (read from `source`) must fit them.
inline void require_vocabulary_fits_shards(int vocab_size, const std::string& source) {
  if (vocab_size > 65536) {
    LLMC_FAIL("%s: %d tokens do not fit the shards' uint16 ids", source.c_str(), vocab_size);
  }
}

// Writes a token shard's bytes into f (the data tools stage shards through llmc/shard_writer.h).
inline void write_token_shard(File& f, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > (size_t)INT32_MAX) {
    LLMC_FAIL("%s: %zu tokens do not fit one shard (at most %d); split them over several shards",
              f.path().c_str(), tokens.size(), INT32_MAX);
  }
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = (int32_t)tokens.size();
  f.write(header, sizeof(header), "the shard header");
  if (!tokens.empty()) f.write(tokens.data(), tokens.size() * sizeof(uint16_t), "the tokens");
}

// Writes a token shard through write_file_atomically (used by the tests).
inline void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_file_atomically(path, [&](File& f) { write_token_shard(f, tokens); });
}

// Checks a shard's header against its size and returns its token count.
inline long read_shard_header(File& f) {
  const long size = f.size();
  const char* path = f.path().c_str();
  if (size == 0) LLMC_FAIL("%s: the file is empty, not a token shard; re-create it", path);
  if (size < kShardHeaderBytes) {
    LLMC_FAIL("%s: %ld bytes is shorter than the %ld-byte token shard header; re-create it", path,
              size, kShardHeaderBytes);
  }
  int32_t header[kShardHeaderInts];
  f.seek(0);
  f.read(header, sizeof(header), "the shard header");
  if (header[0] != kShardMagic) {
    LLMC_FAIL("%s: not a token shard (magic %d, expected %d); point the data flag at .bin "
              "token shards", path, header[0], kShardMagic);
  }
  if (header[1] != kShardVersion) {
    LLMC_FAIL("%s: unsupported token shard version %d (expected %d: uint16 tokens); re-create "
              "it with this project's data tools", path, header[1], kShardVersion);
  }
  const long count = header[2];
  const long expected = kShardHeaderBytes + 2 * count;
  if (count < 0 || size != expected) {
    LLMC_FAIL("%s: header says %ld tokens, so the file should be %ld bytes, but it is %ld bytes "
              "(%s); re-create it", path, count, expected, size,
              size < expected ? "truncated" : "trailing bytes");
  }
  return count;
}

struct ShardHeader {
  std::string path;
  long num_tokens;
};

// The shards `pattern` matches (`flag` names where it came from), each header checked against its
// file's size and holding at least `min_tokens` tokens; `too_few` ends the message for a shorter
// one ("<path>: <n> tokens are too few for <too_few>").
inline std::vector<ShardHeader> read_shard_headers(const std::string& pattern, const char* flag,
                                                   long min_tokens, const std::string& too_few) {
  std::vector<ShardHeader> headers;
  for (const std::string& path : glob_files(pattern, flag)) {
    File f(path, "rb");
    const long count = read_shard_header(f);
    if (count < min_tokens) {
      LLMC_FAIL("%s: %ld tokens are too few for %s", path.c_str(), count, too_few.c_str());
    }
    headers.push_back({path, count});
  }
  return headers;
}

// The shards of `pattern`, each holding at least one batch of B*T tokens for each of `world`
// processes: what a DataLoader checks when it is built, for a program to check before it sets
// anything else up.
inline std::vector<ShardHeader> read_shard_headers(const std::string& pattern, const char* flag,
                                                   int B, int T, int world) {
  const long stride = (long)world * B * T;  // tokens one batch index covers over all ranks
  return read_shard_headers(pattern, flag, stride + 1,
                            strformat("one batch: B=%d x T=%d x %d processes needs at least %ld; "
                                      "use smaller batches or a longer shard", B, T, world,
                                      stride + 1));
}

// The tokens a DocumentLoader's step searches for its sequences (the reference's token window):
// twice the tokens of its grad_accum*world*B sequences of T.
inline long document_window(int B, int T, int grad_accum, int world) {
  return 2L * grad_accum * world * B * T;
}

// The shards of `pattern`, each holding a step's window and 2 tokens more (a step begins in the
// next shard when the window does not fit before the last token): what a DocumentLoader checks.
// The message names the step's tokens as -z, whose value a recipe may have set.
inline std::vector<ShardHeader> read_document_shard_headers(const std::string& pattern,
                                                            const char* flag, int B, int T,
                                                            int grad_accum, int world) {
  const long need = document_window(B, T, grad_accum, world) + 2;
  const long step_tokens = (long)grad_accum * world * B * T;
  return read_shard_headers(pattern, flag, need,
                            strformat("one step of document-aligned sequences, which are sought in "
                                      "twice a step's tokens: 2 x -z %ld (%d micro batches x B=%d "
                                      "x T=%d x %d process%s) + 2 needs at least %ld; use a "
                                      "smaller -z (or -b, -t) or a longer shard", step_tokens,
                                      grad_accum, B, T, world, world == 1 ? "" : "es", need));
}

// Fails when a file matches both the training and the validation pattern, or a validation shard
// holds the same bytes as a training shard (a copy under another name): the validation loss would
// be measured on data the model trained on.
inline void require_disjoint_shards(const std::string& train_pattern,
                                    const std::string& val_pattern) {
  const std::vector<std::string> train_files = glob_files(train_pattern, "-i");
  const std::vector<std::string> val_files = glob_files(val_pattern, "-j");
  for (const std::string& train : train_files) {
    const std::string train_real = real_path(train);
    for (const std::string& val : val_files) {
      if (train_real == real_path(val)) {
        LLMC_FAIL("%s is matched by both -i '%s' and -j '%s': the run would train on its "
                  "validation data; give -i a pattern that leaves it out", train.c_str(),
                  train_pattern.c_str(), val_pattern.c_str());
      }
      if (file_contents_equal(train, val)) {
        LLMC_FAIL("%s (-j '%s') holds the same bytes as %s (-i '%s'): the run would train on its "
                  "validation data; give -j shards that are not copies of -i's", val.c_str(),
                  val_pattern.c_str(), train.c_str(), train_pattern.c_str());
      }
    }
  }
}

// Reads a whole shard, checking every token against the vocabulary.
inline void read_token_shard(const std::string& path, int vocab_size,
                             std::vector<uint16_t>* tokens) {
  File f(path, "rb");
  const long count = read_shard_header(f);
  tokens->resize(count);
  if (count > 0) f.read(tokens->data(), count * sizeof(uint16_t), "the tokens");
  for (long i = 0; i < count; i++) {
    if ((*tokens)[i] >= vocab_size) {
      LLMC_FAIL("%s: token %d at position %ld is >= vocab size %d; the shard is damaged or was "
                "made with another tokenizer, re-create it", path.c_str(), (*tokens)[i], i,
                vocab_size);
    }
  }
}

// How a loader orders its data: contiguous batches (DataLoader) or document-aligned sequences
// (DocumentLoader). A state of one cannot be restored by the other.
enum class DataOrder : int64_t { kBatches = 0, kDocuments = 1 };

// Everything needed to continue a loader exactly where it was: the position
// and the generator as it was when the current epoch began (restore() replays
// the epoch's permutations from there, so no shard has to be re-read). The
// remaining fields describe the data and settings it belongs to, so that a
// resume with different ones fails instead of silently reading other data.
// Plain fixed-size data without padding: a checkpoint stores it byte for byte.
//
// A state saved by `world` = P processes restores into a loader of P' processes (a checkpoint
// resharded for another process count, llmc/reshard.h) by this rule: the same epoch, the same
// generator state at its start (so the same shard order), the same shard, and of that shard's
// batches k*P/P' (rounded down) taken, where the P processes had taken k. Without shuffle batch b
// of P processes holds the shard's chunks b*P .. b*P+P-1 in order, so when P' divides k*P (P' a
// divisor of P, for one) the next batch holds exactly the tokens a P-process run would have read
// next, else it starts fewer than P' chunks before them (re-read, none skipped). Either way the
// shard then goes on in order, but P and P' processes drop a different tail of each shard (its
// chunks past a multiple of the process count), so from the next shard on the order is that of
// P' processes. With shuffle a shard's batch order is a permutation of its batch count, which
// depends on the process count, so the P' order of the current shard (and the generator after
// it) is its own: the fraction of the shard taken is kept, not which tokens were read.
//
// A DocumentLoader state is that of the start of the current step (the shard and token where its
// search began, the generator at its epoch's start) and the micro batches of that step already
// taken; it restores into a loader whose steps take as many sequences (world * grad_accum * B)
// of the same T, whatever its process count: both read the same stream of sequences, so the
// resumed run reads exactly the sequences the saved one would have read next.
struct DataLoaderState {
  int64_t epoch;
  int64_t shard_position;  // index into the epoch's shard order
  int64_t batch_position;  // batches already taken from that shard (documents: of the step)
  int64_t num_shards;
  int64_t batches_per_epoch;  // contiguous batches; 0 for documents
  int64_t batch_size;
  int64_t seq_len;
  int64_t world;
  int64_t shuffle;
  RngState rng_at_epoch_start;
  // Since training-state version 5; older files hold only the fields above, of contiguous batches.
  DataOrder order;
  int64_t token_position;  // documents: where the step's search begins in the shard; else 0
  int64_t grad_accum;      // documents: micro batches per step; else 0
};

// The bytes of a DataLoaderState in training-state files before version 5.
constexpr size_t kDataLoaderStateBytesV4 = offsetof(DataLoaderState, order);
static_assert(kDataLoaderStateBytesV4 == 9 * 8 + sizeof(RngState) &&
                  sizeof(DataLoaderState) == kDataLoaderStateBytesV4 + 3 * 8,
              "DataLoaderState is stored byte for byte: no padding");

namespace dataloader_detail {

// Checks the settings every loader takes; `flag` names the data flag, for the messages.
inline void check_settings(const char* flag, int B, int T, int rank, int world, int vocab_size) {
  if (B <= 0 || T <= 0) {
    LLMC_FAIL("data loader for %s: batch size %d and sequence length %d must be positive", flag,
              B, T);
  }
  if (world <= 0 || rank < 0 || rank >= world) {
    LLMC_FAIL("data loader for %s: rank %d is not in [0, %d); check the process count", flag,
              rank, world);
  }
  if (vocab_size <= 0) {
    LLMC_FAIL("data loader for %s: vocab size %d must be positive", flag, vocab_size);
  }
}

// Fails for a saved state that no loader could have written, naming what of it is corrupt.
[[noreturn]] inline void fail_corrupt_state(const std::string& what) {
  LLMC_FAIL("cannot resume the data loader: corrupt %s; the checkpoint is damaged", what.c_str());
}

inline const char* order_name(DataOrder order) {
  return order == DataOrder::kDocuments ? "document-aligned sequences" : "contiguous batches";
}

// Fails unless `s` is a state of a loader of `order`.
inline void require_order(const DataLoaderState& s, DataOrder order) {
  if (s.order != DataOrder::kBatches && s.order != DataOrder::kDocuments) {
    fail_corrupt_state(strformat("data order %lld", (long long)s.order));
  }
  if (s.order != order) {
    LLMC_FAIL("cannot resume the data loader: the checkpoint read %s, this run reads %s; resume "
              "with the data order the checkpoint was written with", order_name(s.order),
              order_name(order));
  }
}

}  // namespace dataloader_detail

// The shards one loader reads, one at a time, in the order of each epoch (SPEC.md "Data order"):
// one MT19937 seeded with `seed` (the same on every rank) draws permutation(num_shards) when an
// epoch begins (the identity without shuffle); DataLoader draws each shard's batch order from it
// in between. Token ids are checked against the vocabulary when a shard is read, because that is
// the only time its tokens are read; only that shard is held in memory.
class ShardOrder {
 public:
  ShardOrder(std::vector<ShardHeader> shards, bool shuffle, uint64_t seed, int vocab_size)
      : shards_(std::move(shards)), shuffle_(shuffle), seed_(seed), vocab_size_(vocab_size),
        rng_(seed) {
    for (const ShardHeader& h : shards_) total_tokens_ += h.num_tokens;
  }

  // Epoch 0, generator reseeded; open() a shard next.
  void reset() {
    rng_.seed(seed_);
    begin_epoch(0);
  }

  // The fields of a loader's state that are this order's: the data it reads (shard count,
  // shuffle) and where it is (epoch, shard, the generator at the epoch's start).
  void save(DataLoaderState* s) const {
    s->epoch = epoch_;
    s->shard_position = position_;
    s->num_shards = num_shards();
    s->shuffle = shuffle_ ? 1 : 0;
    s->rng_at_epoch_start = rng_at_epoch_start_;
  }

  // Fails unless `s` was saved over the same data (shard count and shuffle) and with the loader's
  // own settings (`own_same`): `own_saved` and `own_run` name those of `s` and of this run, in
  // the message between the shard count and shuffle.
  void require_same_data(const DataLoaderState& s, bool own_same, const std::string& own_saved,
                         const std::string& own_run) const {
    const int shuffle = shuffle_ ? 1 : 0;
    if (s.num_shards != num_shards() || !own_same || s.shuffle != shuffle) {
      LLMC_FAIL("cannot resume the data loader: the checkpoint was taken with %lld shards, %s, "
                "shuffle %lld, but this run has %d, %s, %d; resume with the same data and "
                "settings", (long long)s.num_shards, own_saved.c_str(), (long long)s.shuffle,
                num_shards(), own_run.c_str(), shuffle);
    }
  }

  // Fails unless `s`'s epoch and shard are a position of the order and the loader's own part of
  // its position is valid (`own_ok`; `own` names it, in the message after the shard). No run
  // reaches 2^62 epochs (each takes a batch at least), and the next epoch's count must not overflow.
  void require_position(const DataLoaderState& s, bool own_ok = true,
                        const std::string& own = "") const {
    constexpr int64_t kEpochLimit = int64_t(1) << 62;
    if (s.epoch < 0 || s.epoch >= kEpochLimit || s.shard_position < 0 || s.shard_position >= s.num_shards ||
        !own_ok) {
      dataloader_detail::fail_corrupt_state(strformat(
          "position (epoch %lld, shard %lld of %lld%s)", (long long)s.epoch,
          (long long)s.shard_position, (long long)s.num_shards, own.c_str()));
    }
  }

  // The epoch of `s` with the generator as it was when that epoch began; open() a shard next.
  void restore(const DataLoaderState& s) {
    rng_.restore(s.rng_at_epoch_start);
    begin_epoch((long)s.epoch);
  }

  // Holds the shard at `position` of the epoch's order, reading it unless it is held already.
  void open(long position) {
    position_ = position;
    const long index = order_[position];
    if (index == loaded_) return;
    const ShardHeader& shard = shards_[index];
    read_token_shard(shard.path, vocab_size_, &tokens_);
    if ((long)tokens_.size() != shard.num_tokens) {
      LLMC_FAIL("%s: the shard changed while training (%ld tokens, was %ld); keep the data fixed "
                "during a run", shard.path.c_str(), (long)tokens_.size(), shard.num_tokens);
    }
    loaded_ = index;
  }

  // The next shard of the epoch's order; after the last one, the first of a new epoch.
  void open_next() {
    if (position_ + 1 < num_shards()) {
      open(position_ + 1);
      return;
    }
    begin_epoch(epoch_ + 1);
    open(0);
  }

  // 0..n-1, or with shuffle a permutation of it drawn from the generator.
  std::vector<int> identity_or_permutation(int n) {
    if (shuffle_) return random_permutation(rng_, n);
    std::vector<int> order(n);
    for (int i = 0; i < n; i++) order[i] = i;
    return order;
  }

  const ShardHeader& at(long position) const { return shards_[order_[position]]; }
  const ShardHeader& current() const { return at(position_); }
  const std::vector<uint16_t>& tokens() const { return tokens_; }  // of the current shard
  long epoch() const { return epoch_; }
  int num_shards() const { return (int)shards_.size(); }
  const std::vector<ShardHeader>& shards() const { return shards_; }  // in name order
  long total_tokens() const { return total_tokens_; }

 private:
  void begin_epoch(long epoch) {
    epoch_ = epoch;
    rng_at_epoch_start_ = rng_.state();
    order_ = identity_or_permutation(num_shards());
  }

  std::vector<ShardHeader> shards_;
  bool shuffle_;
  uint64_t seed_;
  int vocab_size_;
  Rng rng_;
  RngState rng_at_epoch_start_;
  long total_tokens_ = 0;
  long epoch_ = 0;
  std::vector<int> order_;
  long position_ = 0;
  long loaded_ = -1;
  std::vector<uint16_t> tokens_;
};

class DataLoader {
 public:
  // `flag` names the command-line flag the pattern came from, for error messages.
  DataLoader(const std::string& pattern, const char* flag, int B, int T, int rank, int world,
             bool shuffle, uint64_t seed, int vocab_size)
      : B_(B), T_(T), rank_(rank), world_(world),
        shards_(checked_headers(pattern, flag, B, T, rank, world, vocab_size), shuffle, seed,
                vocab_size) {
    batches_per_epoch_ = batches_per_epoch_of(world);
    reset();
  }

  // Back to the first batch of the first epoch, generator reseeded.
  void reset() {
    shards_.reset();
    open_shard(0);
  }

  // Fills inputs and targets, B*T int32 each.
  void next_batch(int* inputs, int* targets) {
    if (batch_position_ == (long)batch_order_.size()) {
      shards_.open_next();
      draw_batch_order();
    }
    const long b = batch_order_[batch_position_++];
    const long offset = (b * world_ + rank_) * chunk();
    const uint16_t* x = shards_.tokens().data() + offset;
    for (long i = 0; i < chunk(); i++) {
      inputs[i] = x[i];
      targets[i] = x[i + 1];
    }
  }

  DataLoaderState state() const {
    DataLoaderState s = {};
    s.order = DataOrder::kBatches;
    shards_.save(&s);
    s.batch_position = batch_position_;
    s.batches_per_epoch = batches_per_epoch_;
    s.batch_size = B_;
    s.seq_len = T_;
    s.world = world_;
    return s;
  }

  // `s` may be of another process count: see DataLoaderState.
  void restore(const DataLoaderState& s) {
    dataloader_detail::require_order(s, DataOrder::kBatches);
    if (s.world < 1 || s.world > INT32_MAX) {
      dataloader_detail::fail_corrupt_state(strformat("process count %lld", (long long)s.world));
    }
    const long batches = batches_per_epoch_of((int)s.world);  // this data at the saved count
    shards_.require_same_data(
        s, s.batches_per_epoch == batches && s.batch_size == B_ && s.seq_len == T_,
        strformat("%lld batches per epoch, B=%lld T=%lld, %lld processes",
                  (long long)s.batches_per_epoch, (long long)s.batch_size, (long long)s.seq_len,
                  (long long)s.world),
        strformat("%ld, B=%d T=%d, %d", batches, B_, T_, world_));
    shards_.require_position(s);
    shards_.restore(s);
    // Replay the batch permutations of the shards already opened this epoch.
    for (long p = 0; p < (long)s.shard_position; p++) {
      shards_.identity_or_permutation((int)batches_of(shards_.at(p), world_));
    }
    open_shard((long)s.shard_position);
    const ShardHeader& shard = shards_.current();
    const long saved_limit = batches_of(shard, (int)s.world);
    if (s.batch_position < 0 || s.batch_position > saved_limit) {
      dataloader_detail::fail_corrupt_state(
          strformat("position (batch %lld of %ld in %s)", (long long)s.batch_position,
                    saved_limit, shard.path.c_str()));
    }
    batch_position_ = (long)(s.batch_position * s.world / world_);
  }

  long total_tokens() const { return shards_.total_tokens(); }  // in all shards
  long batches_per_epoch() const { return batches_per_epoch_; }  // next_batch calls per epoch
  long tokens_per_batch() const { return chunk(); }
  int num_shards() const { return shards_.num_shards(); }
  long epoch() const { return shards_.epoch(); }
  const std::string& current_shard() const { return shards_.current().path; }

 private:
  static std::vector<ShardHeader> checked_headers(const std::string& pattern, const char* flag,
                                                  int B, int T, int rank, int world,
                                                  int vocab_size) {
    dataloader_detail::check_settings(flag, B, T, rank, world, vocab_size);
    return read_shard_headers(pattern, flag, B, T, world);
  }

  long chunk() const { return (long)B_ * T_; }
  long batches_of(const ShardHeader& shard, int world) const {
    return (shard.num_tokens - 1) / (world * chunk());
  }
  long batches_per_epoch_of(int world) const {
    long total = 0;
    for (const ShardHeader& shard : shards_.shards()) total += batches_of(shard, world);
    return total;
  }

  // Opens the shard at `position` of the epoch's order and draws its batch order.
  void open_shard(long position) {
    shards_.open(position);
    draw_batch_order();
  }

  void draw_batch_order() {
    batch_order_ = shards_.identity_or_permutation((int)batches_of(shards_.current(), world_));
    batch_position_ = 0;
  }

  int B_, T_, rank_, world_;
  ShardOrder shards_;
  long batches_per_epoch_ = 0;
  std::vector<int> batch_order_;
  long batch_position_ = 0;
};

// GPT-2's end-of-text token (kGpt2EotToken in llmc/tokenizer.h), which the data tools write
// before every document: a document starts at each of its positions.
constexpr int kDocumentStartToken = 50256;

// Document-aligned ("packed") sequences, SPEC.md "Document-aligned order": every sequence starts
// at a document (a token kDocumentStartToken) and is the T+1 tokens from there (inputs, and
// targets shifted by one), as modded-nanogpt's distributed_data_generator(align_to_bos=True)
// chooses them. A step (grad_accum micro batches) takes its world*grad_accum*B sequences one
// after another from one stream that every rank computes alike, and gives rank r, row b of micro
// batch m the step's sequence (m*world + r)*B + b; so runs whose steps take as many sequences
// read the same ones, whatever their process count. The reference searches only the step's
// window (document_window) and gives up where that holds no document start, or none T or more
// tokens after one; this searches on to the shard's end (what a larger window would find) and
// cuts where the shard has none (next_sequence), so it never fails and never reads past a shard.
// With a document cap (a stage's cap=) every sequence is instead a group of capped documents, as
// record #89's loader packs a forward (read_packed_step); the groups of a step come from one shard.
// The step's rows of this rank are read when the previous step ends, so that state() between
// steps is simply where the next one begins.
class DocumentLoader {
 public:
  // `flag` names the command-line flag the pattern came from, for error messages.
  // cap: the tokens of one document a sequence takes (0: none, the sequences above; pack_group).
  DocumentLoader(const std::string& pattern, const char* flag, int B, int T, int grad_accum,
                 int rank, int world, bool shuffle, uint64_t seed, int vocab_size, int cap = 0)
      : B_(B), T_(T), grad_accum_(grad_accum), rank_(rank), world_(world), cap_(cap),
        shards_(checked_headers(pattern, flag, B, T, grad_accum, rank, world, vocab_size),
                shuffle, seed, vocab_size),
        rows_((size_t)grad_accum * B * (T + 1)) {
    reset();
  }

  // A stage's new shape (llmc/stages.h), between steps: the step about to begin is read again from
  // where its search began, with T, grad_accum and the cap given; so it reads what a loader made
  // with them at that place would. The shape it has already changes nothing.
  void reshape(int T, int grad_accum, int cap) {
    if (T == T_ && grad_accum == grad_accum_ && cap == cap_) return;
    if (batch_ != 0) {
      LLMC_FAIL("the data loader's shape changes between steps only (%d of %d micro batches taken)", batch_,
                grad_accum_);
    }
    if (T <= 0 || grad_accum <= 0 || cap < 0) {
      LLMC_FAIL("data loader: a stage of T=%d, %d micro batches and a cap of %d tokens: T and the micro "
                "batches must be positive, the cap 0 or more", T, grad_accum, cap);
    }
    T_ = T;
    grad_accum_ = grad_accum;
    cap_ = cap;
    rows_.assign((size_t)grad_accum * B_ * (T + 1), 0);
    const DataLoaderState start = step_start_;
    shards_.restore(start);
    open_shard((long)start.shard_position);
    position_ = (long)start.token_position;
    read_step();
  }

  // Back to the first step of the first epoch, generator reseeded.
  void reset() {
    shards_.reset();
    open_shard(0);
    read_step();
  }

  // Fills inputs and targets, B*T int32 each: this rank's rows of the step's next micro batch.
  void next_batch(int* inputs, int* targets) {
    const uint16_t* row = rows_.data() + (size_t)batch_ * B_ * (T_ + 1);
    for (long b = 0; b < B_; b++, row += T_ + 1) {
      for (long t = 0; t < T_; t++) {
        inputs[b * T_ + t] = row[t];
        targets[b * T_ + t] = row[t + 1];
      }
    }
    if (++batch_ == grad_accum_) read_step();
  }

  DataLoaderState state() const {
    DataLoaderState s = step_start_;
    s.batch_position = batch_;
    return s;
  }

  // `s` may be of another process count, grad_accum and B: see DataLoaderState.
  void restore(const DataLoaderState& s) {
    dataloader_detail::require_order(s, DataOrder::kDocuments);
    if (s.world < 1 || s.world > INT32_MAX || s.grad_accum < 1 || s.grad_accum > INT32_MAX ||
        s.batch_size < 1 || s.batch_size > INT32_MAX) {
      dataloader_detail::fail_corrupt_state(
          strformat("step of %lld processes x %lld micro batches x B=%lld", (long long)s.world,
                    (long long)s.grad_accum, (long long)s.batch_size));
    }
    shards_.require_same_data(s, s.seq_len == T_, strformat("T=%lld", (long long)s.seq_len),
                              strformat("T=%d", T_));
    // world * grad_accum fits 62 bits; with B it might not, so B divides instead.
    if (step_sequences() % s.batch_size != 0 ||
        s.world * s.grad_accum != step_sequences() / s.batch_size) {
      LLMC_FAIL("cannot resume the data loader: a step of the checkpoint took %lld processes x "
                "%lld micro batches x B=%lld sequences, a step of this run takes %d x %d x B=%d = "
                "%ld; keep processes x micro batches x B the same", (long long)s.world,
                (long long)s.grad_accum, (long long)s.batch_size, world_, grad_accum_, B_,
                step_sequences());
    }
    shards_.require_position(s, s.batch_position >= 0 && s.batch_position < s.grad_accum,
                             strformat(", micro batch %lld of %lld", (long long)s.batch_position,
                                       (long long)s.grad_accum));
    const long taken = (long)(s.batch_position * s.world * s.batch_size);  // sequences of the step
    const long per_batch = (long)world_ * B_;
    if (taken % per_batch != 0) {
      LLMC_FAIL("cannot resume the data loader: the checkpoint was taken after %ld of a step's %ld "
                "sequences, not a whole number of this run's micro batches (%d processes x B=%d); "
                "resume from a checkpoint taken between steps", taken, step_sequences(), world_,
                B_);
    }
    shards_.restore(s);
    open_shard((long)s.shard_position);
    const long length = (long)shards_.tokens().size();
    if (s.token_position < 0 || s.token_position > length) {
      dataloader_detail::fail_corrupt_state(strformat("position (token %lld of %ld in %s)",
                                                      (long long)s.token_position, length,
                                                      shards_.current().path.c_str()));
    }
    position_ = (long)s.token_position;
    read_step();
    batch_ = (int)(taken / per_batch);
  }

  long total_tokens() const { return shards_.total_tokens(); }  // in all shards
  long tokens_per_batch() const { return (long)B_ * T_; }
  int num_shards() const { return shards_.num_shards(); }
  long epoch() const { return shards_.epoch(); }
  const std::string& current_shard() const { return shards_.current().path; }

 private:
  static std::vector<ShardHeader> checked_headers(const std::string& pattern, const char* flag,
                                                  int B, int T, int grad_accum, int rank,
                                                  int world, int vocab_size) {
    dataloader_detail::check_settings(flag, B, T, rank, world, vocab_size);
    if (grad_accum <= 0) {
      LLMC_FAIL("data loader for %s: %d micro batches per step must be positive", flag,
                grad_accum);
    }
    return read_document_shard_headers(pattern, flag, B, T, grad_accum, world);
  }

  long step_sequences() const { return (long)world_ * grad_accum_ * B_; }
  long window() const { return document_window(B_, T_, grad_accum_, world_); }
  long shard_length() const { return (long)shards_.tokens().size(); }

  // Opens the shard at `position` of the epoch's order (or the next shard) at its first token.
  void open_shard(long position) {
    shards_.open(position);
    find_documents();
  }
  void open_next_shard() {
    shards_.open_next();
    find_documents();
  }
  void find_documents() {
    position_ = 0;
    documents_.clear();
    const std::vector<uint16_t>& x = shards_.tokens();
    for (long i = 0; i < (long)x.size(); i++) {
      if (x[i] == kDocumentStartToken) documents_.push_back(i);
    }
  }

  // The first document start at or after `from`, or the shard's length when none is.
  long next_document(long from) const {
    const auto it = std::lower_bound(documents_.begin(), documents_.end(), from);
    return it == documents_.end() ? shard_length() : *it;
  }

  // Reads the step's sequences in stream order and keeps this rank's rows (the step's sequence q
  // is row q % B of micro batch q / (world*B), on rank (q / B) % world). Where the step begins is
  // kept before it may move on to the next shard, so that a reshape or a resume there decides that
  // again with its own shape.
  void read_step() {
    save_step_start();
    if (cap_ > 0) {
      read_packed_step();
    } else {
      // The step begins in the next shard when its window and one token more do not fit before the
      // shard's end (the reference's test).
      if (position_ + window() + 1 >= shard_length()) open_next_shard();
      for (long q = 0; q < step_sequences(); q++) {
        const long start = next_sequence();
        uint16_t* row = row_of(q);
        if (row) std::copy_n(shards_.tokens().data() + start, T_ + 1, row);
      }
    }
    batch_ = 0;
  }

  void save_step_start() {
    step_start_ = {};
    step_start_.order = DataOrder::kDocuments;
    shards_.save(&step_start_);
    step_start_.token_position = position_;
    step_start_.batch_size = B_;
    step_start_.seq_len = T_;
    step_start_.world = world_;
    step_start_.grad_accum = grad_accum_;
  }

  // Where the step's sequence q goes: this rank's row of it, or null when another rank's.
  uint16_t* row_of(long q) {
    const long per_batch = (long)world_ * B_;
    if ((q % per_batch) / B_ != rank_) return nullptr;
    return rows_.data() + (q / per_batch * B_ + q % B_) * (T_ + 1);
  }

  // Record #89's packing (its Shard.next_batch) with the cap: every sequence of the step is a group
  // of documents taken from the position in the shard held, all of them from that shard; where it
  // cannot give them all, the whole step is taken from the next shard's first document start on,
  // as the reference's call for 8 processes of one forward each moves on. A shard that cannot give
  // one step from its start fails, naming it.
  void read_packed_step() {
    while (!pack_step()) {
      if (position_ == 0) {
        LLMC_FAIL("%s: its documents, capped at %d tokens each, hold fewer than one step's %ld sequence%s of "
                  "T+1 = %d tokens from its first document start: use a smaller -t or -z, a larger cap, or "
                  "longer shards", shards_.current().path.c_str(), cap_, step_sequences(),
                  step_sequences() == 1 ? "" : "s", T_ + 1);
      }
      open_next_shard();
    }
  }

  // The step's groups from the position on; false (the position kept) where the shard ends first.
  bool pack_step() {
    long position = position_;
    std::vector<uint16_t> others((size_t)T_ + 1);  // the rows of other ranks, read and dropped
    for (long q = 0; q < step_sequences(); q++) {
      uint16_t* row = row_of(q);
      if (!pack_group(&position, row ? row : others.data())) return false;
    }
    position_ = position;
    return true;
  }

  // One group of T+1 tokens into `row`: from the first document start at or after *position, each
  // document's first tokens up to the cap, until the row is full (the last document cut to fit);
  // a document runs to the next document start or the shard's end. *position moves to the
  // document start after the last document's, whatever of it was taken (the reference's index
  // into its document starts). False where no document start is left before the row is full.
  bool pack_group(long* position, uint16_t* row) {
    const uint16_t* x = shards_.tokens().data();
    auto next = std::lower_bound(documents_.begin(), documents_.end(), *position);
    long filled = 0;
    while (filled < T_ + 1) {
      if (next == documents_.end()) return false;
      const long start = *next++;
      const long end = next == documents_.end() ? shard_length() : *next;
      const long n = std::min({end - start, (long)cap_, (long)T_ + 1 - filled});
      std::copy_n(x + start, n, row + filled);
      filled += n;
    }
    *position = next == documents_.end() ? shard_length() : *next;
    return true;
  }

  // The next sequence of the stream: the position of its first token in the shard held, with T
  // more after it. As the reference: the first document start at or after the position, and the
  // position moves on to the first document start T or more tokens after that, both searched to
  // the shard's end. The cuts, where the shard has none: with no document start that has T tokens
  // after it, the sequence starts at the position itself; with no document start T or more
  // tokens on, the position moves T tokens on (the next sequence goes on with the document); and
  // when fewer than T+1 tokens are left, the next shard begins.
  long next_sequence() {
    if (position_ + T_ >= shard_length()) open_next_shard();
    long start = next_document(position_);
    if (start + T_ >= shard_length()) start = position_;
    const long end = next_document(start + T_);
    position_ = end < shard_length() ? end : start + T_;
    return start;
  }

  int B_, T_, grad_accum_, rank_, world_;
  int cap_;                        // tokens of one document a sequence takes (0: all)
  ShardOrder shards_;
  std::vector<uint16_t> rows_;     // this rank's rows of the step, T+1 tokens each
  int batch_ = 0;                  // micro batches of the step taken
  DataLoaderState step_start_;     // where the step began, as state() gives it
  long position_ = 0;              // in the shard held: where the stream goes on
  std::vector<long> documents_;    // the document starts of the shard held
};

}  // namespace llmc
