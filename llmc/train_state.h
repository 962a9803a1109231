// The training-state file a rank writes beside each checkpoint (state_<step>_<rank>.bin): what a
// resume needs besides the parameters, so that it continues bit for bit.
//
// 256 int32 header (llmc/file_header.h)
//   [0] magic 20240528  [1] version 5  [2] step  [3] rank  [4] world size
//   [5] AdamW updates applied so far (0..step: non-finite and skipped steps apply none)
//   [6] 1 with FP32 master weights, 0 without  [7] ZeRO stage (0, or 1: the file holds this
//   rank's shard of the optimizer state only)  [8..9] parameter count n of the file (uint64)
//   [10] FP8 amax history entries h (0 unless -fp8 2)  [11] the steps the history has recorded
//   [12] the optimizer of the blocks' matrices: 1 AdamW, 2 Muon  [13..14] the tokens of the
//   training data, all its shards (int64)  ([12] to [14] are 0 in files written before they were
//   recorded, which load with any)  [15] the untie step + 1 (-ut; 0: the embedding and the head
//   apart throughout, as in files written before it)  [16] AdamW's interval (-ao K; 0 where K is
//   1, as in files written before it)  [17] AdamW's updates so far, its bias correction's step
//   (with [16]; else [5])  [18] 1 where the gradients AdamW keeps between its steps follow
//   [19] Muon's Q and K blocks in heads (-mq; 0: whole, as in files written before it; NorMuon's
//   second moments lie a row a block)  [20..253] reserved, 0
//   [254] [255] checksum kind (always CRC-32) and the CRC-32 over the whole file
// then HostTrainState (its bytes as laid out here), AdamW's first and second moments (n float32
// each; for a matrix Muon updates, its momentum and zeros), when [6] is 1 the FP32 master
// weights (n float32), the FP8 amax history (h uint32, the trainer's delayed scaling state,
// the same on every rank), and when [18] is 1 the gradients (n float32: AdamW's tensors' sums of
// the steps since its last update, the others' unread). Older files still load: version 4 (its DataLoaderState ends at its
// generator, kDataLoaderStateBytesV4 bytes, and is of contiguous batches) and version 3 (that,
// and no [10], [11] or history).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dataloader.h"
#include "file_header.h"
#include "outlier.h"
#include "rand.h"
#include "utils.h"

namespace llmc {

constexpr int kStateMagic = 20240528;
constexpr int kStateVersion = 5;
constexpr int kStateVersionBatchesOnly = 4;  // still read: the data loader state before DataOrder
constexpr int kStateVersionNoFp8 = 3;        // still read: that, and no FP8 history
constexpr int kStateReservedFirstSlot = 20;  // header slots [20, 254) are 0

// The host-side part of a rank's training state.
struct HostTrainState {
  RngState model_rng;   // stochastic-rounding seeds
  RngState sample_rng;  // sampling
  DataLoaderState train_loader;
  OutlierState loss_window;  // the spike detectors' recent values
  OutlierState norm_window;
};
static_assert(sizeof(HostTrainState) == 2 * sizeof(RngState) + sizeof(DataLoaderState) +
                                            2 * sizeof(OutlierState),
              "HostTrainState is stored member by member: no padding");

// Who a state file belongs to; load checks the file against the run resuming from it.
struct TrainStateId {
  int step = 0;
  int rank = 0;
  int world = 1;
  size_t num_params = 0;  // of this rank's optimizer shard
  bool master_weights = false;
  int zero_stage = 0;
  int matrix_optimizer = 0;  // kMatrixOptimizer...: header [12]
  int64_t data_tokens = 0;   // of the training data (-i): header [13..14]; 0: not recorded
  int untie_step = -1;       // -ut: header [15] (its value + 1); -1: none
  int adam_every = 1;        // -ao: header [16] (0: 1)
  int muon_qk_heads = 0;     // -mq: header [19]; 0: Q and K whole
};

// NorMuon: Muon with its second moments in v's place (-opt muon -mn 1).
constexpr int kMatrixOptimizerUnrecorded = 0, kMatrixOptimizerAdamw = 1, kMatrixOptimizerMuon = 2,
              kMatrixOptimizerNorMuon = 3;

inline const char* matrix_optimizer_name(int optimizer) {
  switch (optimizer) {
    case kMatrixOptimizerAdamw: return "adamw";
    case kMatrixOptimizerMuon: return "muon";
    case kMatrixOptimizerNorMuon: return "muon -mn 1";
    default: return "unrecorded";
  }
}

// Fails where the state file at path was written by a run that `expected` cannot continue, as far
// as both record it (0: not recorded): another optimizer for the blocks' matrices (Muon's momentum
// would be read as AdamW's first moment, or the reverse; NorMuon's second moments dropped or taken
// as zero), or training data of another size (the
// loader's position would be taken in other text; another shard count fails in the loader itself).
inline void require_same_run(const char* path, const TrainStateId& written, const TrainStateId& expected) {
  if (written.matrix_optimizer != kMatrixOptimizerUnrecorded &&
      expected.matrix_optimizer != kMatrixOptimizerUnrecorded &&
      written.matrix_optimizer != expected.matrix_optimizer) {
    LLMC_FAIL("%s: written with -opt %s for the blocks' matrices, but this run has -opt %s: resume with -opt %s",
              path, matrix_optimizer_name(written.matrix_optimizer),
              matrix_optimizer_name(expected.matrix_optimizer), matrix_optimizer_name(written.matrix_optimizer));
  }
  if (written.data_tokens != 0 && expected.data_tokens != 0 && written.data_tokens != expected.data_tokens) {
    LLMC_FAIL("%s: written over training data of %lld tokens, but this run's -i holds %lld: resume with the run's "
              "training data", path, (long long)written.data_tokens, (long long)expected.data_tokens);
  }
  // Muon's matrices, and so where NorMuon's second moments lie in the state, are the run's.
  if (written.muon_qk_heads != expected.muon_qk_heads) {
    LLMC_FAIL("%s: written by a run with -mq %d, but this run has -mq %d: resume with -mq %d", path,
              written.muon_qk_heads, expected.muon_qk_heads, written.muon_qk_heads);
  }
  // Whether the embedding is tied at the checkpoint's step, and when it unties, are the run's.
  if (written.untie_step != expected.untie_step) {
    LLMC_FAIL("%s: written by a run with -ut %d, but this run has -ut %d: resume with -ut %d", path,
              written.untie_step, expected.untie_step, written.untie_step);
  }
  // The kept gradients and AdamW's step count are those of the run's interval.
  if (written.adam_every != expected.adam_every) {
    LLMC_FAIL("%s: written by a run with -ao %d, but this run has -ao %d: resume with -ao %d", path,
              written.adam_every, expected.adam_every, written.adam_every);
  }
}

// Delayed FP8 scaling's state: the amaxes of the last steps (FP32 bits, as the trainer lays them
// out) and how many steps it has recorded. Empty without -fp8 2.
struct Fp8History {
  int recorded_steps = 0;
  std::vector<uint32_t> amax;
};

// AdamW under -ao K > 1: its updates so far (the step of its bias correction) and the gradients
// kept since its last update (n values; empty: none kept, as after an update).
struct AdamKept {
  int updates = 0;
  std::vector<float> grads;
};

struct TrainState {
  int optimizer_steps = 0;
  HostTrainState host;
  std::vector<float> adam_m, adam_v, master;  // master is empty without master weights
  Fp8History fp8;
  AdamKept adam;  // without -ao: updates optimizer_steps, no gradients
};

// ZeRO stage 1 splits the parameter-ordered optimizer state (AdamW's moments, the master weights)
// over the processes: shard r is [offset, offset + size) of that order. Every shard has the same
// size, a whole multiple of 64 elements so that each starts 256-byte aligned on the GPU; the last
// shards extend past the parameters (or lie wholly past them) and are zero there. One shard is
// the whole state, unpadded.
struct ZeroShard {
  size_t offset = 0;
  size_t size = 0;
  size_t real = 0;  // elements below the parameter count: [offset, offset + real)
};

// The number of shards of a run of `world` processes with -zs `zero_stage`.
inline int zero_shard_count(int world, int zero_stage) { return zero_stage == 1 ? world : 1; }

inline ZeroShard zero_shard(size_t num_params, int shard_count, int shard_rank) {
  ZeroShard s;
  s.size = shard_count == 1 ? num_params : round_up((num_params + shard_count - 1) / shard_count, 64);
  s.offset = (size_t)shard_rank * s.size;
  s.real = s.offset < num_params ? std::min(s.size, num_params - s.offset) : 0;
  return s;
}

namespace train_state_detail {

// Calls visit(address, bytes) for each member of `host` (a HostTrainState, const or not) in file
// order, with the bytes a file of `version` holds: before version 5 the data loader state ends at
// its generator, and the fields after it are not in the file.
template <class Host, class Visit>
void host_parts(Host& host, int version, Visit visit) {
  visit(&host.model_rng, sizeof(host.model_rng));
  visit(&host.sample_rng, sizeof(host.sample_rng));
  visit(&host.train_loader,
        version > kStateVersionBatchesOnly ? sizeof(host.train_loader) : kDataLoaderStateBytesV4);
  visit(&host.loss_window, sizeof(host.loss_window));
  visit(&host.norm_window, sizeof(host.norm_window));
}

inline size_t host_bytes(int version) {
  const size_t missing = sizeof(DataLoaderState) - kDataLoaderStateBytesV4;  // before version 5
  return sizeof(HostTrainState) - (version > kStateVersionBatchesOnly ? 0 : missing);
}

inline uint32_t payload_crc32(uint32_t crc, int version, const HostTrainState& host,
                              const float* adam_m, const float* adam_v, const float* master,
                              size_t n, const Fp8History& fp8, const AdamKept& adam) {
  host_parts(host, version,
             [&](const void* p, size_t bytes) { crc = crc32_update(crc, p, bytes); });
  crc = crc32_update(crc, adam_m, n * sizeof(float));
  crc = crc32_update(crc, adam_v, n * sizeof(float));
  if (master) crc = crc32_update(crc, master, n * sizeof(float));
  crc = crc32_update(crc, fp8.amax.data(), fp8.amax.size() * sizeof(uint32_t));
  return crc32_update(crc, adam.grads.data(), adam.grads.size() * sizeof(float));
}

}  // namespace train_state_detail

// Writes a state file through write_file_atomically. master is null without master weights; adam
// is read where id.adam_every > 1, its gradients empty or n values.
inline void train_state_save(const std::string& path, const TrainStateId& id, int optimizer_steps,
                             const HostTrainState& host, const float* adam_m, const float* adam_v,
                             const float* master, const Fp8History& fp8 = Fp8History(),
                             const AdamKept& adam = AdamKept()) {
  int h[kHeaderInts] = {};
  h[0] = kStateMagic;
  h[1] = kStateVersion;
  h[2] = id.step;
  h[3] = id.rank;
  h[4] = id.world;
  h[5] = optimizer_steps;
  h[6] = master ? 1 : 0;
  h[7] = id.zero_stage;
  const uint64_t n = id.num_params;
  memcpy(&h[8], &n, sizeof(n));
  h[10] = (int)fp8.amax.size();
  h[11] = fp8.recorded_steps;
  h[12] = id.matrix_optimizer;
  memcpy(&h[13], &id.data_tokens, sizeof(id.data_tokens));
  h[15] = id.untie_step + 1;
  const bool interval = id.adam_every > 1;
  if ((!interval && !adam.grads.empty()) || (!adam.grads.empty() && adam.grads.size() != n)) {
    LLMC_FAIL("%s: %zu kept gradients for %llu parameters with AdamW every %d steps (n, and only with more than "
              "1): a bug in the caller", path.c_str(), adam.grads.size(), (unsigned long long)n, id.adam_every);
  }
  h[16] = interval ? id.adam_every : 0;
  h[17] = interval ? adam.updates : 0;
  h[18] = adam.grads.empty() ? 0 : 1;
  const AdamKept& kept = interval ? adam : AdamKept();
  h[19] = id.muon_qk_heads;
  header_store_checksum(h, train_state_detail::payload_crc32(header_checksum_begin(h), h[1], host,
                                                             adam_m, adam_v, master, n, fp8, kept));
  write_file_atomically(path, [&](File& f) {
    f.write(h, sizeof(h), "the state header");
    train_state_detail::host_parts(host, h[1], [&](const void* p, size_t bytes) {
      f.write(p, bytes, "the RNG and data loader state");
    });
    f.write(adam_m, n * sizeof(float), "AdamW's first moments");
    f.write(adam_v, n * sizeof(float), "AdamW's second moments");
    if (master) f.write(master, n * sizeof(float), "the master weights");
    if (!fp8.amax.empty()) f.write(fp8.amax.data(), fp8.amax.size() * sizeof(uint32_t), "the FP8 amax history");
    if (h[18]) f.write(kept.grads.data(), n * sizeof(float), "AdamW's kept gradients");
  });
}

// A state file as read: where from, whose, and what it holds.
struct TrainStateFile {
  std::string path;
  TrainStateId id;
  TrainState state;
};

namespace train_state_detail {

// Reads and checks a state file's header (which leaves f at the payload); with `expected`, against
// it (its step, rank, world, ZeRO stage, shard size and master weights), else only for a header
// in range. Every field is checked, and the file's size is compared with the header before
// anything is allocated.
inline TrainStateId read_header(File& f, int h[kHeaderInts], const TrainStateId* expected,
                                const char* remedy) {
  const char* path = f.path().c_str();
  f.read(h, kHeaderInts * sizeof(int), "the state header");
  if (h[0] != kStateMagic || h[1] < kStateVersionNoFp8 || h[1] > kStateVersion) {
    LLMC_FAIL("%s: not a training-state file of version %d to %d (magic %d, version %d; expected "
              "%d): %s", path, kStateVersionNoFp8, kStateVersion, h[0], h[1], kStateMagic, remedy);
  }
  if (h[1] == kStateVersionNoFp8 && (h[10] != 0 || h[11] != 0)) {
    LLMC_FAIL("%s: version %d with FP8 history fields set: the header is damaged; %s", path, h[1],
              remedy);
  }
  if (h[10] < 0 || h[11] < 0 || h[11] > h[2]) {
    LLMC_FAIL("%s: an FP8 history of %d entries over %d steps at step %d: the header is damaged; "
              "%s", path, h[10], h[11], h[2], remedy);
  }
  if (expected && (h[3] != expected->rank || h[4] != expected->world)) {
    LLMC_FAIL("%s: state of rank %d of %d, expected rank %d of %d: resume with the process count "
              "the checkpoint was written with", path, h[3], h[4], expected->rank,
              expected->world);
  }
  if (h[4] < 1 || h[3] < 0 || h[3] >= h[4]) {
    LLMC_FAIL("%s: state of rank %d of %d: the header is damaged; %s", path, h[3], h[4], remedy);
  }
  if (expected && h[2] != expected->step) {
    LLMC_FAIL("%s: state of step %d in the file of step %d: the header is damaged; %s", path, h[2],
              expected->step, remedy);
  }
  const int step = h[2];
  if (step < 0) LLMC_FAIL("%s: state of step %d: the header is damaged; %s", path, step, remedy);
  if (h[5] < 0 || h[5] > step) {
    LLMC_FAIL("%s: %d AdamW updates recorded at step %d (must be 0..%d): the header is damaged; "
              "%s", path, h[5], step, step, remedy);
  }
  if (h[12] < kMatrixOptimizerUnrecorded || h[12] > kMatrixOptimizerNorMuon) {
    LLMC_FAIL("%s: optimizer %d (must be 0 to 3): the header is damaged; %s", path, h[12], remedy);
  }
  if (h[15] < 0) LLMC_FAIL("%s: untie step %lld: the header is damaged; %s", path, (long long)h[15] - 1, remedy);
  if (h[16] < 0 || h[16] == 1 || (h[16] == 0 && (h[17] != 0 || h[18] != 0)) || h[17] < 0 || h[17] > h[5] ||
      (h[18] != 0 && h[18] != 1)) {
    LLMC_FAIL("%s: AdamW every %d steps, %d of its updates, kept gradients %d (the interval 0 or 2 and more, the "
              "updates 0..%d, the flag 0 or 1, both 0 without an interval): the header is damaged; %s", path, h[16],
              h[17], h[18], h[5], remedy);
  }
  if (h[19] < 0) {
    LLMC_FAIL("%s: Muon's Q and K in blocks of %d heads: the header is damaged; %s", path, h[19], remedy);
  }
  // Slots past [19] are reserved: every writer leaves them 0, so a set one is damage, even where
  // the checksum was recomputed over it.
  for (int slot = kStateReservedFirstSlot; slot < kHeaderChecksumKindSlot; slot++) {
    if (h[slot] != 0) {
      LLMC_FAIL("%s: reserved header slot %d holds %d (must be 0): the header is damaged; %s", path, slot,
                h[slot], remedy);
    }
  }
  if (h[6] != 0 && h[6] != 1) {
    LLMC_FAIL("%s: master-weights flag %d (must be 0 or 1): the header is damaged; %s", path, h[6],
              remedy);
  }
  if (expected && h[7] != expected->zero_stage) {
    LLMC_FAIL("%s: written with ZeRO stage %d, but this run has -zs %d: resume with -zs %d", path,
              h[7], expected->zero_stage, h[7]);
  }
  if (h[7] != 0 && h[7] != 1) {
    LLMC_FAIL("%s: ZeRO stage %d (must be 0 or 1): the header is damaged; %s", path, h[7], remedy);
  }
  uint64_t n = 0;
  memcpy(&n, &h[8], sizeof(n));
  const bool master = h[6] == 1;
  if (expected && (n != expected->num_params || master != expected->master_weights)) {
    LLMC_FAIL("%s: state for %llu parameters %s master weights, but the model has %zu %s: resume "
              "with the same model and -w setting", path, (unsigned long long)n,
              master ? "with" : "without", expected->num_params,
              expected->master_weights ? "with" : "without");
  }
  if (!header_has_checksum(h, f.path())) {
    LLMC_FAIL("%s: the header has no checksum, which every state file of version %d has: the "
              "header is damaged; %s", path, h[1], remedy);
  }
  const long expected_bytes = (long)(kHeaderInts * sizeof(int) + host_bytes(h[1]) +
                                     (2 + (master ? 1 : 0)) * n * sizeof(float) +
                                     (size_t)h[10] * sizeof(uint32_t) + (h[18] ? n * sizeof(float) : 0));
  const long actual = f.size();
  if (actual != expected_bytes) {
    LLMC_FAIL("%s: a state for %llu parameters %s master weights (and %d FP8 history entries) "
              "should be %ld bytes but is %ld (%s): %s", path, (unsigned long long)n,
              master ? "with" : "without", h[10], expected_bytes, actual,
              actual < expected_bytes ? "truncated" : "trailing data", remedy);
  }
  TrainStateId id;
  id.step = step;
  id.rank = h[3];
  id.world = h[4];
  id.num_params = n;
  id.master_weights = master;
  id.zero_stage = h[7];
  id.matrix_optimizer = h[12];
  memcpy(&id.data_tokens, &h[13], sizeof(id.data_tokens));
  id.untie_step = h[15] - 1;
  id.adam_every = std::max(1, h[16]);
  id.muon_qk_heads = h[19];
  if (id.data_tokens < 0) {
    LLMC_FAIL("%s: training data of %lld tokens: the header is damaged; %s", path, (long long)id.data_tokens, remedy);
  }
  if (expected) require_same_run(path, id, *expected);
  return id;
}

// Reads and checks a whole state file (read_header, then the payload and its checksum). With
// `into`, AdamW's moments and the master weights go there, one array after another (room for
// the file's 2 arrays, 3 with master weights), and the state's vectors stay empty.
inline TrainStateFile read(const std::string& path, const TrainStateId* expected,
                           const char* remedy, float* into = nullptr) {
  File f(path, "rb");
  int h[kHeaderInts];
  TrainStateFile file;
  file.path = path;
  file.id = read_header(f, h, expected, remedy);
  const size_t n = file.id.num_params;
  TrainState& s = file.state;
  s.optimizer_steps = h[5];
  s.adam.updates = h[16] ? h[17] : h[5];
  if (!into) {
    s.adam_m.resize(n);
    s.adam_v.resize(n);
    s.master.resize(file.id.master_weights ? n : 0);
  }
  float* adam_m = into ? into : s.adam_m.data();
  float* adam_v = into ? into + n : s.adam_v.data();
  float* master = !file.id.master_weights ? nullptr : into ? into + 2 * n : s.master.data();
  memset(&s.host, 0, sizeof(s.host));
  host_parts(s.host, h[1], [&](void* p, size_t bytes) {
    f.read(p, bytes, "the RNG and data loader state");
  });
  f.read(adam_m, n * sizeof(float), "AdamW's first moments");
  f.read(adam_v, n * sizeof(float), "AdamW's second moments");
  if (master) f.read(master, n * sizeof(float), "the master weights");
  s.fp8.recorded_steps = h[11];
  s.fp8.amax.resize((size_t)h[10]);
  if (h[10] > 0) f.read(s.fp8.amax.data(), s.fp8.amax.size() * sizeof(uint32_t), "the FP8 amax history");
  s.adam.grads.resize(h[18] ? n : 0);
  if (h[18]) f.read(s.adam.grads.data(), n * sizeof(float), "AdamW's kept gradients");
  header_verify_checksum(h, payload_crc32(header_checksum_start(h), h[1], s.host, adam_m, adam_v,
                                          master, n, s.fp8, s.adam),
                         path, remedy);
  return file;
}

}  // namespace train_state_detail

// Reads and checks the state file of `expected`; `remedy` says what to do when the file is damaged.
// With `into`, the arrays are read there instead (see train_state_detail::read).
inline TrainState train_state_load(const std::string& path, const TrainStateId& expected,
                                   const char* remedy, float* into = nullptr) {
  return train_state_detail::read(path, &expected, remedy, into).state;
}

// Reads and checks a state file of any step, rank, process count and ZeRO stage (to reshard it).
inline TrainStateFile train_state_read(const std::string& path, const char* remedy) {
  return train_state_detail::read(path, nullptr, remedy);
}

// Reads and checks only the header of a state file (whose it is), and that the file has the size
// the header gives; optimizer_steps is the header's too. The payload's checksum is not verified.
inline TrainStateId train_state_read_id(const std::string& path, int* optimizer_steps,
                                        const char* remedy) {
  File f(path, "rb");
  int h[kHeaderInts];
  const TrainStateId id = train_state_detail::read_header(f, h, nullptr, remedy);
  *optimizer_steps = h[5];
  return id;
}

}  // namespace llmc
