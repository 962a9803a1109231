// Resharding the training state of a checkpoint for another process count and ZeRO stage.
//
// AdamW's moments and the master weights are per parameter, in the parameters' order, so the state
// of P processes with ZeRO stage s is one set of flat arrays cut into shards (zero_shard in
// llmc/train_state.h): stage 0 gives every rank all of it, stage 1 rank r the shard r. Resharding
// joins the shards into the whole arrays and cuts them again for P' processes and stage s'; the
// values are moved, never recomputed, so a round trip gives back every bit.
//
// The host state is the same on every rank (one seed for the generators, one data order, the
// spike detectors see the global loss and norm), and so is the FP8 amax history (the amaxes are
// reduced over the ranks), so rank 0's are carried to every new rank; the inputs must agree on
// the host state. So are AdamW's kept gradients (-ao, without ZeRO: averaged at each step). Its
// data loader position stays that of P processes: DataLoader::restore and
// DocumentLoader::restore continue it with P' (the rules are at DataLoaderState in
// llmc/dataloader.h).
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint_files.h"
#include "file_header.h"
#include "gpt2.h"
#include "train_state.h"
#include "utils.h"

namespace llmc {

namespace reshard_detail {

// Checks that `in` is the state file of rank r of the checkpoint whose rank 0 file is `first`,
// for a model of num_params parameters; with host, that it carries the same host state (which
// every rank of one run shares).
inline void check_input(const TrainStateFile& first, const TrainStateFile& in, int r,
                        size_t num_params, bool host) {
  const int world = first.id.world;
  const ZeroShard shard = zero_shard(num_params, zero_shard_count(world, first.id.zero_stage), 0);
  const char* path = in.path.c_str();
  if (in.id.world != world || in.id.rank != r) {
    LLMC_FAIL("%s: state of rank %d of %d, expected rank %d of %d: give the state files of one "
              "checkpoint in rank order", path, in.id.rank, in.id.world, r, world);
  }
  if (in.id.step != first.id.step || in.state.optimizer_steps != first.state.optimizer_steps) {
    LLMC_FAIL("%s: state of step %d after %d AdamW updates, but %s is of step %d after %d: give "
              "the state files of one checkpoint", path, in.id.step, in.state.optimizer_steps,
              first.path.c_str(), first.id.step, first.state.optimizer_steps);
  }
  if (in.id.zero_stage != first.id.zero_stage || in.id.master_weights != first.id.master_weights) {
    LLMC_FAIL("%s: ZeRO stage %d %s master weights, but %s has stage %d %s: give the state files "
              "of one checkpoint", path, in.id.zero_stage,
              in.id.master_weights ? "with" : "without", first.path.c_str(), first.id.zero_stage,
              first.id.master_weights ? "with" : "without");
  }
  if (in.id.num_params != shard.size) {
    LLMC_FAIL("%s: state of %zu parameters, but a model of %zu parameters over %d processes with "
              "ZeRO stage %d has %zu per rank: give the model the checkpoint was written for",
              path, in.id.num_params, num_params, world, first.id.zero_stage, shard.size);
  }
  if (!host) return;
  const HostTrainState& a = in.state.host;
  const HostTrainState& b = first.state.host;
  if (memcmp(&a.train_loader, &b.train_loader, sizeof(a.train_loader)) != 0 ||
      memcmp(&a.loss_window, &b.loss_window, sizeof(a.loss_window)) != 0 ||
      memcmp(&a.norm_window, &b.norm_window, sizeof(a.norm_window)) != 0) {
    LLMC_FAIL("%s: its data position or spike-detector windows differ from those of %s, which "
              "every rank of one run shares: give the state files of one checkpoint", path,
              first.path.c_str());
  }
  if (in.state.fp8.recorded_steps != first.state.fp8.recorded_steps || in.state.fp8.amax != first.state.fp8.amax) {
    LLMC_FAIL("%s: its FP8 amax history differs from that of %s, which every rank of one run "
              "shares: give the state files of one checkpoint", path, first.path.c_str());
  }
}

// The parameters [begin, end) that shards `from` and `to` both hold (begin >= end: none).
struct ShardOverlap {
  size_t begin, end;
  bool empty() const { return begin >= end; }
};

inline ShardOverlap shard_overlap(const ZeroShard& from, const ZeroShard& to) {
  return {std::max(from.offset, to.offset), std::min(from.offset + from.real, to.offset + to.real)};
}

// Copies the overlap of shards `from` (of `in`) and `to` (of `out`).
inline void copy_overlap(const TrainState& in, const ZeroShard& from, TrainState& out,
                         const ZeroShard& to, const ShardOverlap& o) {
  auto copy = [&](const std::vector<float>& src, std::vector<float>& dst) {
    std::copy(src.begin() + (o.begin - from.offset), src.begin() + (o.end - from.offset),
              dst.begin() + (o.begin - to.offset));
  };
  copy(in.adam_m, out.adam_m);
  copy(in.adam_v, out.adam_v);
  if (!out.master.empty()) copy(in.master, out.master);
}

// The state file of rank new_rank of new_world processes with ZeRO stage new_zero_stage, from
// the checkpoint whose rank 0 file is `first`. read_rank(r) gives rank r's file; it is called
// only for the shards that hold part of the new rank's, in rank order, and what it returns is
// checked against `first` and dropped before the next, so one input is held at a time.
template <class ReadRank>
TrainStateFile reshard_rank(const TrainStateFile& first, size_t num_params, int new_world,
                            int new_zero_stage, int new_rank, ReadRank read_rank) {
  if (new_world < 1) LLMC_FAIL("reshard: %d processes (must be at least 1)", new_world);
  if (new_zero_stage != 0 && new_zero_stage != 1) {
    LLMC_FAIL("reshard: ZeRO stage %d (must be 0 or 1)", new_zero_stage);
  }
  if (new_rank < 0 || new_rank >= new_world) {
    LLMC_FAIL("reshard: rank %d of %d processes", new_rank, new_world);
  }
  check_input(first, first, 0, num_params, false);
  const int shard_count = zero_shard_count(first.id.world, first.id.zero_stage);
  const int new_shard_count = zero_shard_count(new_world, new_zero_stage);
  if (first.id.adam_every > 1 && (shard_count > 1 || new_shard_count > 1)) {
    LLMC_FAIL("%s: written with -ao %d, whose kept gradients every process holds whole: resume it without "
              "ZeRO-1 (-zs 0)", first.path.c_str(), first.id.adam_every);
  }
  const ZeroShard to = zero_shard(num_params, new_shard_count, new_shard_count == 1 ? 0 : new_rank);
  TrainStateFile out;
  out.id = first.id;
  out.id.rank = new_rank;
  out.id.world = new_world;
  out.id.num_params = to.size;
  out.id.zero_stage = new_shard_count > 1 ? 1 : 0;
  out.state.optimizer_steps = first.state.optimizer_steps;
  // AdamW's bias-correction step and, with -ao, the gradients it keeps between its updates: whole
  // on every rank and the same (averaged over the processes at each step), so rank 0's.
  out.state.adam = first.state.adam;
  out.state.host = first.state.host;
  out.state.fp8 = first.state.fp8;
  out.state.adam_m.assign(to.size, 0.0f);
  out.state.adam_v.assign(to.size, 0.0f);
  out.state.master.assign(first.id.master_weights ? to.size : 0, 0.0f);
  // Without ZeRO every rank holds the whole arrays, the same on all: rank 0's are taken.
  for (int r = 0; r < shard_count; r++) {
    const ZeroShard from = zero_shard(num_params, shard_count, r);
    const ShardOverlap overlap = shard_overlap(from, to);
    if (overlap.empty()) continue;
    if (r == 0) {
      copy_overlap(first.state, from, out.state, to, overlap);
    } else {
      const TrainStateFile in = read_rank(r);
      check_input(first, in, r, num_params, true);
      copy_overlap(in.state, from, out.state, to, overlap);
    }
  }
  return out;
}

}  // namespace reshard_detail

// The state files of `new_world` processes with ZeRO stage `new_zero_stage` (0 or 1) for the
// checkpoint whose state files of every rank are `inputs` (in rank order), for a model of
// num_params parameters. The results' paths are empty: the caller names them.
inline std::vector<TrainStateFile> reshard_train_state(const std::vector<TrainStateFile>& inputs,
                                                       size_t num_params, int new_world,
                                                       int new_zero_stage) {
  if (inputs.empty()) LLMC_FAIL("reshard: no state files given");
  const TrainStateFile& first = inputs[0];
  if ((int)inputs.size() != first.id.world) {
    LLMC_FAIL("%s: state of a run of %d processes, but %zu state files were given: give one per "
              "rank", first.path.c_str(), first.id.world, inputs.size());
  }
  for (int r = 0; r < first.id.world; r++) {
    reshard_detail::check_input(first, inputs[r], r, num_params, true);
  }
  std::vector<TrainStateFile> outputs;
  for (int r = 0; r < std::max(new_world, 1); r++) {
    outputs.push_back(reshard_detail::reshard_rank(first, num_params, new_world, new_zero_stage, r,
                                                   [&](int k) { return inputs[k]; }));
  }
  return outputs;
}

namespace reshard_detail {

// The rank 0 state file of a checkpoint whose ranks' files are state_path(r), read whole, with
// every other rank's header checked against it (for a model of num_params parameters).
template <class StatePath>
TrainStateFile read_first_checking_headers(StatePath state_path, size_t num_params,
                                           const char* remedy) {
  TrainStateFile first = train_state_read(state_path(0), remedy);
  for (int r = 1; r < first.id.world; r++) {
    TrainStateFile header;
    header.path = state_path(r);
    header.id = train_state_read_id(header.path, &header.state.optimizer_steps, remedy);
    check_input(first, header, r, num_params, false);
  }
  return first;
}

}  // namespace reshard_detail

// The state of rank new_rank of new_world processes with ZeRO stage new_zero_stage from the
// state files of a checkpoint, state_path(r) for each of its ranks r (as many as rank 0's file
// says), for a model of num_params parameters. Every file's header is checked first; then only
// the files whose shard overlaps the new rank's are read whole (and their checksums verified),
// one at a time. `remedy` says what to do when a file is damaged.
template <class StatePath>
TrainStateFile reshard_state_files(StatePath state_path, size_t num_params, int new_world,
                                   int new_zero_stage, int new_rank, const char* remedy) {
  const TrainStateFile first = reshard_detail::read_first_checking_headers(state_path, num_params, remedy);
  return reshard_detail::reshard_rank(first, num_params, new_world, new_zero_stage, new_rank,
                                      [&](int r) { return train_state_read(state_path(r), remedy); });
}

// The training state of the run `expected` describes (its step, rank, process count, ZeRO stage,
// shard size and master weights) from the checkpoint of that step in dir: the rank's own state
// file when the checkpoint was written with the same process count and ZeRO stage, else the state
// resharded from the files of the layout it was written with (reshard_state_files). `written`
// gets the id of rank 0's file, whose world and zero_stage say which layout that was. With `into`
// (room for 2 arrays of expected.num_params, 3 with master weights), a rank's own file is read
// straight into it, AdamW's moments and the master weights one after another, and the returned
// arrays are empty; a resharded state comes in the returned arrays.
inline TrainState checkpoint_train_state(const std::string& dir, const TrainStateId& expected,
                                         size_t num_params, const char* remedy,
                                         TrainStateId* written, float* into = nullptr) {
  auto state_path = [&](int rank) { return checkpoint_path(dir, "state", expected.step, rank); };
  int updates = 0;
  *written = train_state_read_id(state_path(0), &updates, remedy);
  require_same_run(state_path(0).c_str(), *written, expected);
  if (written->world == expected.world && written->zero_stage == expected.zero_stage) {
    return train_state_load(state_path(expected.rank), expected, remedy, into);
  }
  if (written->master_weights != expected.master_weights) {
    LLMC_FAIL("%s: state %s master weights, but this run has %s: resume with the same -w setting",
              state_path(0).c_str(), written->master_weights ? "with" : "without",
              expected.master_weights ? "them" : "none");
  }
  TrainStateFile f = reshard_state_files(state_path, num_params, expected.world,
                                         expected.zero_stage, expected.rank, remedy);
  if (f.id.num_params != expected.num_params) {
    LLMC_FAIL("%s: resharded to %zu parameters per rank, but this run has %zu: resume with the "
              "model of the checkpoint", state_path(0).c_str(), f.id.num_params,
              expected.num_params);
  }
  return std::move(f.state);
}

// Writes the checkpoint of `step` in dir to new_dir for `processes` processes with ZeRO stage
// zero_stage: the model file as it is, each new rank's state file (reshard_state_files), the run
// log (main.log) as it is, and the DONE marker last, so a conversion cut short leaves nothing that
// -y 1 takes for a checkpoint. dir is only read; new_dir must hold no checkpoint and no run log.
// Returns the process count the checkpoint was written by.
inline int reshard_checkpoint(const std::string& dir, const std::string& new_dir, int step,
                              int processes, int zero_stage) {
  if (!file_exists(done_marker_path(dir, step))) {
    LLMC_FAIL("%s has no complete checkpoint of step %d (no %s)", dir.c_str(), step,
              done_marker_path(dir, step).c_str());
  }
  if (latest_checkpoint_step(new_dir) >= 0 || file_exists(new_dir + "/main.log")) {
    LLMC_FAIL("%s already holds a checkpoint or a run log (main.log): give a new directory",
              new_dir.c_str());
  }
  const std::string model = checkpoint_path(dir, "model", step);
  size_t num_params = 0;
  {
    File f(model, "rb");
    int h[kHeaderInts];
    num_params = num_parameters(checkpoint_read_header(f, h));
  }
  const char* remedy = "convert an earlier checkpoint";
  auto state_path = [&](int rank) { return checkpoint_path(dir, "state", step, rank); };
  // Rank 0's file (which every new rank needs) is read once; the others as each new rank needs them.
  const TrainStateFile first = reshard_detail::read_first_checking_headers(state_path, num_params, remedy);
  make_dirs(new_dir);
  for (int rank = 0; rank < processes; rank++) {
    const TrainStateFile out = reshard_detail::reshard_rank(
        first, num_params, processes, zero_stage, rank,
        [&](int r) { return train_state_read(state_path(r), remedy); });
    const TrainState& s = out.state;
    train_state_save(checkpoint_path(new_dir, "state", step, rank), out.id, s.optimizer_steps,
                     s.host, s.adam_m.data(), s.adam_v.data(),
                     s.master.empty() ? nullptr : s.master.data(), s.fp8, s.adam);
  }
  copy_file_atomically(model, checkpoint_path(new_dir, "model", step));
  if (file_exists(dir + "/main.log")) copy_file_atomically(dir + "/main.log", new_dir + "/main.log");
  write_done_marker(new_dir, step);
  return first.id.world;
}

}  // namespace llmc
