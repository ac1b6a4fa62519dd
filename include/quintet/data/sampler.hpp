// Sampler: which windows each data-parallel rank reads, batch after batch, deterministically.
//
// Windows (token_dataset.hpp) are visited epoch after epoch, each epoch in the order of a
// pseudo-random permutation that depends only on (seed, epoch). Think of one global stream of
// samples: position t of epoch e is window permutation(seed, e)(t). A training step takes the
// next batch_size x dp_size positions of the stream; rank r of R takes every R-th of them,
// starting at the r-th: its i-th sample of the step is stream position g + i R + r, where g is
// the step's first position. A step that runs past the end of an epoch continues at the start
// of the next one. So over one epoch the ranks together see every window exactly once, and the
// state (epoch, g) does not depend on R: a run saved at one data-parallel size resumes at
// another, and the rest of the epoch is covered exactly once.
//
// Worked example: W = 10 windows, batch_size 2, R = 2. Step 0 takes positions 0..3 (rank 0: 0 and
// 2, rank 1: 1 and 3), step 1 positions 4..7, step 2 positions 8, 9 of epoch 0 and 0, 1 of
// epoch 1. After step 1 the state is {epoch 0, sample_index 8}.
//
// The permutation is a keyed Feistel network over the next power of four >= W with cycle
// walking: O(1) memory and time per sample, the same on every rank and thread. A Sampler is an
// immutable value; all methods are thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace quintet::data {

// Where the sample stream stands: the next global sample is position sample_index of epoch.
struct SamplerState {
  std::uint64_t epoch = 0;
  std::uint64_t sample_index = 0;  // in [0, num_windows), counted over all data-parallel ranks
};

struct SampleRef {
  std::uint64_t epoch = 0;
  std::uint64_t position = 0;  // position in the epoch's permutation
  std::uint64_t window = 0;    // the window read
};

struct SamplerConfig {
  std::uint64_t seed = 0;
  std::int64_t batch_size = 1;  // samples per rank per step
  int dp_rank = 0;
  int dp_size = 1;
  bool shuffle = true;  // false: every epoch in window order (evaluation)
  SamplerState start;   // where batch 0 starts
};

class Sampler {
 public:
  // Throws InvalidArgument for num_windows == 0, batch_size < 1, dp_rank outside [0, dp_size) or
  // a start.sample_index >= num_windows.
  Sampler(std::uint64_t num_windows, const SamplerConfig& config);

  std::uint64_t num_windows() const { return num_windows_; }
  const SamplerConfig& config() const { return config_; }
  // Samples of one step over all ranks: batch_size * dp_size.
  std::uint64_t global_batch_size() const;

  // The window at position of epoch: a bijection of [0, num_windows) for each (seed, epoch).
  std::uint64_t permute(std::uint64_t epoch, std::uint64_t position) const;
  // This rank's n-th batch after config.start (batch_size samples in order).
  std::vector<SampleRef> batch(std::uint64_t n) const;
  // The state once n batches (of every rank) have been consumed from config.start.
  SamplerState state_after(std::uint64_t n) const;

 private:
  std::uint64_t feistel(std::uint64_t epoch, std::uint64_t x) const;
  std::uint64_t num_windows_;
  SamplerConfig config_;
  int half_bits_ = 1;  // the Feistel domain is 2^(2 half_bits_)
};

}  // namespace quintet::data
