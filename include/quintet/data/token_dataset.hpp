// TokenDataset: a list of token files (any formats, see token_file.hpp) opened from paths or
// globs, and Windows: the fixed-length training windows cut from it.
//
// A window of sequence length T is T + 1 consecutive tokens of one file: tokens [0, T) are the
// inputs, [1, T + 1) the targets. File f of n_f tokens holds floor((n_f - 1) / T) windows, window
// j starting at token j T (neighbours share one token, so every token but the last of a file is a
// target exactly once); windows never cross files. Windows are numbered across files in file
// order. Both classes are immutable after construction and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quintet/data/token_file.hpp"

namespace quintet::data {

class TokenDataset {
 public:
  TokenDataset() = default;
  explicit TokenDataset(std::vector<TokenFile> files);

  // spec: one or more comma-separated entries, each a path or a glob ("data/train_*.qts");
  // matches are sorted by name. A Megatron dataset may be named by its .bin, .idx or prefix (a
  // glob matching both its .bin and .idx yields it once). Throws InvalidArgument when an entry
  // matches nothing (naming it), or the errors of TokenFile::open.
  static TokenDataset open(const std::string& spec, const TokenFileOptions& options = {});

  const std::vector<TokenFile>& files() const { return files_; }
  std::int64_t num_tokens() const;

 private:
  std::vector<TokenFile> files_;
};

class Windows {
 public:
  struct Location {
    int file = 0;            // index into the dataset's files
    std::int64_t start = 0;  // token index of the window's first token in that file
  };

  // Throws InvalidArgument when seq_len < 1 or no file holds a single window.
  Windows(TokenDataset dataset, std::int64_t seq_len);

  std::int64_t seq_len() const { return seq_len_; }
  std::uint64_t count() const { return first_.back(); }
  const TokenDataset& dataset() const { return dataset_; }
  Location locate(std::uint64_t window) const;
  // Writes window's inputs into tokens[0..T) and its targets into targets[0..T) (int32).
  void read(std::uint64_t window, std::int32_t* tokens, std::int32_t* targets) const;

 private:
  TokenDataset dataset_;
  std::int64_t seq_len_ = 0;
  std::vector<std::uint64_t> first_;  // first window of each file, then the total
};

}  // namespace quintet::data
