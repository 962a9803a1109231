// Resharding the training state of a checkpoint for another process count and ZeRO stage.
//
// AdamW's moments and the master weights are per parameter, in the parameters' order, so the state
// of P processes with ZeRO stage s is one set of flat arrays cut into shards (zero_shard in
// llmc/train_state.h): stage 0 gives every rank all of it, stage 1 rank r the shard r. Resharding
// joins the shards into the whole arrays and cuts them again for P' processes and stage s'; the
// values are moved, never recomputed, so a round trip gives back every bit.
//
// The host state is the same on every rank (one seed for the generators, one data order, the
// spike detectors see the global loss and norm), so rank 0's is carried to every new rank; the
// inputs must agree on it. Its data loader position stays that of P processes: DataLoader::restore
// continues it with P' (the rule is at DataLoaderState in llmc/dataloader.h).
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "train_state.h"
#include "utils.h"

namespace llmc {

namespace reshard_detail {

// Checks that `inputs` are the state files of every rank of one checkpoint of a model of
// num_params parameters, in rank order.
inline void check_inputs(const std::vector<TrainStateFile>& inputs, size_t num_params) {
  if (inputs.empty()) LLMC_FAIL("reshard: no state files given");
  const TrainStateFile& first = inputs[0];
  const int world = first.id.world;
  if ((int)inputs.size() != world) {
    LLMC_FAIL("%s: state of a run of %d processes, but %zu state files were given: give one per "
              "rank", first.path.c_str(), world, inputs.size());
  }
  const ZeroShard shard = zero_shard(num_params, zero_shard_count(world, first.id.zero_stage), 0);
  for (int r = 0; r < world; r++) {
    const TrainStateFile& in = inputs[r];
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
    if (in.id.zero_stage != first.id.zero_stage ||
        in.id.master_weights != first.id.master_weights) {
      LLMC_FAIL("%s: ZeRO stage %d %s master weights, but %s has stage %d %s: give the state files "
                "of one checkpoint", path, in.id.zero_stage,
                in.id.master_weights ? "with" : "without", first.path.c_str(),
                first.id.zero_stage, first.id.master_weights ? "with" : "without");
    }
    if (in.id.num_params != shard.size) {
      LLMC_FAIL("%s: state of %zu parameters, but a model of %zu parameters over %d processes with "
                "ZeRO stage %d has %zu per rank: give the model the checkpoint was written for",
                path, in.id.num_params, num_params, world, first.id.zero_stage, shard.size);
    }
    const HostTrainState& a = in.state.host;
    const HostTrainState& b = first.state.host;
    if (memcmp(&a.train_loader, &b.train_loader, sizeof(a.train_loader)) != 0 ||
        memcmp(&a.loss_window, &b.loss_window, sizeof(a.loss_window)) != 0 ||
        memcmp(&a.norm_window, &b.norm_window, sizeof(a.norm_window)) != 0) {
      LLMC_FAIL("%s: its data position or spike-detector windows differ from those of %s, which "
                "every rank of one run shares: give the state files of one checkpoint", path,
                first.path.c_str());
    }
  }
}

}  // namespace reshard_detail

// The state files of `new_world` processes with ZeRO stage `new_zero_stage` (0 or 1) for the
// checkpoint whose state files of every rank are `inputs` (in rank order), for a model of
// num_params parameters. The results' paths are empty: the caller names them.
inline std::vector<TrainStateFile> reshard_train_state(const std::vector<TrainStateFile>& inputs,
                                                       size_t num_params, int new_world,
                                                       int new_zero_stage) {
  if (new_world < 1) LLMC_FAIL("reshard: %d processes (must be at least 1)", new_world);
  if (new_zero_stage != 0 && new_zero_stage != 1) {
    LLMC_FAIL("reshard: ZeRO stage %d (must be 0 or 1)", new_zero_stage);
  }
  reshard_detail::check_inputs(inputs, num_params);
  const TrainStateFile& first = inputs[0];
  const bool master = first.id.master_weights;
  TrainState whole;
  whole.adam_m.assign(num_params, 0.0f);
  whole.adam_v.assign(num_params, 0.0f);
  whole.master.assign(master ? num_params : 0, 0.0f);
  const int shard_count = zero_shard_count(first.id.world, first.id.zero_stage);
  // Without ZeRO every rank holds the whole arrays, the same on all: rank 0's are taken.
  for (int r = 0; r < shard_count; r++) {
    const ZeroShard shard = zero_shard(num_params, shard_count, r);
    const TrainState& in = inputs[r].state;
    std::copy_n(in.adam_m.begin(), shard.real, whole.adam_m.begin() + shard.offset);
    std::copy_n(in.adam_v.begin(), shard.real, whole.adam_v.begin() + shard.offset);
    if (master) std::copy_n(in.master.begin(), shard.real, whole.master.begin() + shard.offset);
  }
  const int new_shard_count = zero_shard_count(new_world, new_zero_stage);
  std::vector<TrainStateFile> outputs(new_world);
  for (int r = 0; r < new_world; r++) {
    const ZeroShard shard = zero_shard(num_params, new_shard_count, new_shard_count == 1 ? 0 : r);
    TrainStateFile& out = outputs[r];
    out.id = first.id;
    out.id.rank = r;
    out.id.world = new_world;
    out.id.num_params = shard.size;
    out.id.zero_stage = new_shard_count > 1 ? 1 : 0;
    out.state.optimizer_steps = first.state.optimizer_steps;
    out.state.host = first.state.host;
    out.state.adam_m.assign(shard.size, 0.0f);
    out.state.adam_v.assign(shard.size, 0.0f);
    out.state.master.assign(master ? shard.size : 0, 0.0f);
    std::copy_n(whole.adam_m.begin() + shard.offset, shard.real, out.state.adam_m.begin());
    std::copy_n(whole.adam_v.begin() + shard.offset, shard.real, out.state.adam_v.begin());
    if (master) std::copy_n(whole.master.begin() + shard.offset, shard.real, out.state.master.begin());
  }
  return outputs;
}

}  // namespace llmc
