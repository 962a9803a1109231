// The checkpoints of a run's output directory: their file names, which are complete, pruning.
//
// A checkpoint of step s in DIR is a set of files (model_<s>.bin, state_<s>_<rank>.bin) and the
// marker DONE_<s>, written once every file of it is complete. Each file is written under a
// temporary name, synced and renamed (write_file_atomically), so a checkpoint with a marker is
// whole however its writer ended, and one without a marker is ignored. Older checkpoints are
// pruned only after the newest one's marker exists.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <glob.h>

#include "utils.h"

namespace llmc {
// kind "model": DIR/model_<step>.bin; with a rank, kind "state": DIR/state_<step>_<rank>.bin.
inline std::string checkpoint_path(const std::string& dir, const char* kind, int step, int rank = -1) {
  return rank < 0 ? strformat("%s/%s_%08d.bin", dir.c_str(), kind, step)
                  : strformat("%s/%s_%08d_%05d.bin", dir.c_str(), kind, step, rank);
}

inline std::string done_marker_path(const std::string& dir, int step) {
  return strformat("%s/DONE_%08d", dir.c_str(), step);
}

// The steps of the complete checkpoints in dir (those with a DONE marker), ascending.
inline std::vector<int> checkpoint_done_steps(const std::string& dir) {
  std::vector<int> steps;
  glob_t g;
  if (glob((dir + "/DONE_*").c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; i++) {
      int step = -1;
      if (sscanf(strrchr(g.gl_pathv[i], '/') + 1, "DONE_%d", &step) == 1) steps.push_back(step);
    }
  }
  globfree(&g);
  std::sort(steps.begin(), steps.end());
  return steps;
}

// The newest complete checkpoint's step in dir, or -1.
inline int latest_checkpoint_step(const std::string& dir) {
  const std::vector<int> steps = checkpoint_done_steps(dir);
  return steps.empty() ? -1 : steps.back();
}

// The checkpoint's files were renamed into dir; the directory is synced first so that, after a
// power loss too, a marker on disk means the renames before it are.
inline void write_done_marker(const std::string& dir, int step) {
  sync_directory(dir);
  File f(done_marker_path(dir, step), "wb");
  f.close(/*sync=*/true);
  sync_directory(dir);
}

// Deletes complete checkpoints other than the newest keep_last and those whose step is a multiple
// of keep_every (0: none kept that way). keep_last 0 keeps everything. The DONE marker goes first,
// so a checkpoint being deleted is never taken for a complete one.
inline void prune_checkpoints(const std::string& dir, int keep_last, int keep_every) {
  if (keep_last <= 0) return;
  const std::vector<int> steps = checkpoint_done_steps(dir);
  for (size_t i = 0; i + keep_last < steps.size(); i++) {
    const int step = steps[i];
    if (keep_every > 0 && step % keep_every == 0) continue;
    std::vector<std::string> files = {done_marker_path(dir, step), checkpoint_path(dir, "model", step)};
    glob_t g;
    if (glob(strformat("%s/state_%08d_*.bin", dir.c_str(), step).c_str(), 0, nullptr, &g) == 0) {
      for (size_t k = 0; k < g.gl_pathc; k++) files.emplace_back(g.gl_pathv[k]);
    }
    globfree(&g);
    for (const std::string& f : files) {
      if (remove(f.c_str()) != 0 && errno != ENOENT) {
        LLMC_FAIL("cannot delete the old checkpoint file %s: %s", f.c_str(), strerror(errno));
      }
    }
  }
}


}  // namespace llmc
