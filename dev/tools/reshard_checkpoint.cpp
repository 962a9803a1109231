// Converts a checkpoint of the CUDA trainer for another process count and ZeRO stage, offline.
//
//   build/reshard_checkpoint -i DIR -o NEW_DIR -p PROCESSES [-zs 0|1] [-s STEP]
//
// The checkpoint of step STEP in DIR (default: the newest complete one), written by P processes
// with -zs s, is written to NEW_DIR for PROCESSES processes with -zs given: the model file as it
// is, one state file per new rank (llmc/reshard.h: AdamW's moments and the master weights moved,
// never recomputed; the host state, data position included, carried), the run log (a resumed
// run drops its lines after the step), and the DONE marker last. `train_gpt2cu -y 1 -o NEW_DIR`
// on PROCESSES processes resumes from it; the data position continues by the rule at
// DataLoaderState in llmc/dataloader.h. DIR is only read, and NEW_DIR must hold no checkpoint
// and no run log: nothing is replaced.
#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "llmc/flags.h"
#include "llmc/reshard.h"
#include "llmc/utils.h"

namespace {

int run(int argc, char** argv) {
  std::string dir, new_dir;
  int processes = 0, zero_stage = 1, step = -1;
  const std::vector<llmc::Flag> flags = {
      llmc::text_flag("-i", "input", "the run's output directory (-o of train_gpt2cu); only read", &dir),
      llmc::text_flag("-o", "output", "where the converted checkpoint goes (a new directory)", &new_dir),
      llmc::int_flag("-p", "processes", "the process count of the run that resumes from it",
                     &processes, 1, 1 << 20),
      llmc::int_flag("-zs", "ZeRO stage", "its ZeRO stage (as train_gpt2cu's -zs)", &zero_stage, 0, 1),
      llmc::int_flag("-s", "step", "the checkpoint's step (-1: the newest complete one in -i)",
                     &step, -1, INT32_MAX),
  };
  const char* program = "build/reshard_checkpoint";
  if (!llmc::parse_flags(std::vector<std::string>(argv + 1, argv + argc), flags, program)) {
    llmc::print_usage(program, "a checkpoint of train_gpt2cu for another process count and -zs",
                      "build/reshard_checkpoint -i log_d12 -o log_d12_on_4 -p 4", flags);
    printf("then: mpirun -np 4 ./train_gpt2cu -y 1 -o log_d12_on_4 (and the run's other flags)\n");
    return 0;
  }
  if (dir.empty() || new_dir.empty() || processes == 0) {
    LLMC_FAIL("-i, -o and -p are required: %s --help", program);
  }
  llmc::require_directory(dir, "-i");
  if (step < 0) {
    step = llmc::latest_checkpoint_step(dir);
    if (step < 0) LLMC_FAIL("-i %s: no complete checkpoint (a DONE_<step> marker) in it", dir.c_str());
  }
  const int old_world = llmc::reshard_checkpoint(dir, new_dir, step, processes, zero_stage);
  const int new_zero_stage = llmc::zero_shard_count(processes, zero_stage) > 1 ? 1 : 0;
  printf("checkpoint of step %d: %d process%s -> %d process%s with -zs %d in %s\n", step, old_world,
         old_world == 1 ? "" : "es", processes, processes == 1 ? "" : "es", new_zero_stage,
         new_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
