// Writing token shards (format in llmc/dataloader.h), shared by the data tools: the check that an
// output directory holds no shards of the name yet, and a stream that cuts tokens into shards.
//
// A tool stages every shard of a run in one StagedFiles (llmc/utils.h) and commits them when the
// whole run has succeeded, so a failed or killed run leaves no shard under a final name. Staging
// instead of renaming each shard when it is full (and removing them on failure) also covers a
// run killed outright, whose renamed shards nothing would remove and which a glob would read as a
// whole data set.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dataloader.h"
#include "utils.h"

namespace llmc {

// Shards of an earlier run would be overwritten, or mixed with this one's under a glob: they must
// be moved first. Checked before any work is done.
inline void require_no_shards(const std::string& dir, const std::string& name) {
  const std::string pattern = dir + "/" + name + "_*_[0-9]*.bin";
  glob_t g;
  const bool found = glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
  const std::string first = found ? g.gl_pathv[0] : "";
  globfree(&g);
  if (found) {
    LLMC_FAIL("%s already holds shards (%s): delete them, or use another --output_dir or --name",
              dir.c_str(), first.c_str());
  }
}

// Cuts a stream of tokens into shards of shard_size tokens (the last one shorter), each staged in
// `files` when it is full; path_of(i) names the stream's shard i (from 0).
class TokenShardStream {
 public:
  TokenShardStream(StagedFiles* files, long long shard_size,
                   std::function<std::string(int index)> path_of)
      : files_(files), shard_size_((size_t)shard_size), path_of_(std::move(path_of)) {}

  // Token ids must fit uint16 (require_vocabulary_fits_shards).
  template <class Token>
  void add(const Token* tokens, size_t count) {
    for (size_t i = 0; i < count; i++) {
      buffer_.push_back((uint16_t)tokens[i]);
      if (buffer_.size() == shard_size_) write_shard();
    }
    total_ += count;
  }

  void finish() {
    if (!buffer_.empty()) write_shard();
  }

  size_t total() const { return total_; }
  int shard_count() const { return (int)written_.size(); }
  size_t shard_tokens(int index) const { return written_[index].second; }

  // One line per shard; called after the files are committed, when the shards have their names.
  void print_written() const {
    for (const auto& [path, tokens] : written_) printf("wrote %s: %zu tokens\n", path.c_str(), tokens);
  }

 private:
  void write_shard() {
    const std::string path = path_of_(shard_count());
    files_->write(path, [&](File& f) { write_token_shard(f, buffer_); });
    written_.emplace_back(path, buffer_.size());
    buffer_.clear();
  }

  StagedFiles* files_;
  size_t shard_size_;
  std::function<std::string(int)> path_of_;
  std::vector<uint16_t> buffer_;
  std::vector<std::pair<std::string, size_t>> written_;  // path and token count of each shard
  size_t total_ = 0;
};

}  // namespace llmc
