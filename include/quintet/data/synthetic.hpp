// The built-in dataset: a seeded synthetic token source whose entropy per token is known exactly,
// so a trainer can print the loss floor next to the loss.
//
// The source (vocabulary V, marker token M = V - 1) emits tokens one at a time:
//   * Markov step. The context class c = hash(seed, last `order` tokens) mod context_classes
//     picks `branches` distinct successor tokens in [0, V - 1) (a seeded sparse transition
//     table). With probability 1 - q the next token is successor i with probability p_i, where
//     p_i is proportional to (i + 1)^-zipf_exponent.
//   * Copy event. With probability q (only once at least max_distance tokens exist) the next
//     token is the marker M, then an offset token d in [0, num_offsets) drawn uniformly, then
//     copy_len tokens copied verbatim from distance(d) = min_distance + d * distance_step tokens
//     back (x[m] = x[m - distance(d)]).
// The marker and the offset token signal the copy, so every token's distribution given all
// earlier tokens is known, and the entropy rate (bits per token) follows by renewal: each free
// position emits 1 token plus, with probability q, 1 + copy_len more, hence
//
//     H = ( h(q) + (1 - q) H(p) + q H(d) ) / ( 1 + q (1 + copy_len) )
//
// with h(q) the binary entropy, H(p) the successor entropy and H(d) the offset entropy
// (log2 num_offsets). All probabilities are realised exactly as integer thresholds on 32-bit
// random words (so q, p_i, and the offset probabilities are multiples of 2^-32), and the formula
// uses those exact values. Predicting the copied span needs attention to a token
// min_distance..max_distance back: a model can approach H only with attention, and only where the
// source lies inside its window. The first tokens of a stream (before copies are enabled) have
// entropy H(p); SyntheticSource::generate reports the realised average too.
//
// Random words come from Philox (core/philox.hpp) keyed by (seed, stream): the same tokens on
// every machine. Thread-safe after construction.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quintet/data/token_dataset.hpp"

namespace quintet::data {

struct SyntheticConfig {
  std::uint64_t seed = 1234;
  int vocab_size = 256;        // tokens 0..vocab_size-1; the marker is vocab_size-1
  int order = 2;               // Markov order: tokens of context
  int context_classes = 1024;  // hashed contexts, each with its own successor set
  int branches = 4;            // successors per context class
  double zipf_exponent = 1.0;  // p_i proportional to (i + 1)^-zipf_exponent
  double copy_prob = 0.05;     // q: probability of a copy event at a free position
  int copy_len = 24;           // tokens copied per event
  int num_offsets = 16;        // distinct copy distances
  int min_distance = 32;       // tokens back to the first distance
  int distance_step = 8;       // spacing of the distances

  int max_distance() const { return min_distance + (num_offsets - 1) * distance_step; }
  // "v256-k2-c1024-b4-z1-q0.05-l24-d16-m32-s8-seed1234": identifies the generated data.
  std::string describe() const;
};

class SyntheticSource {
 public:
  // Throws InvalidArgument for parameters out of range (each message says which and why).
  explicit SyntheticSource(const SyntheticConfig& config);

  const SyntheticConfig& config() const { return config_; }
  // Exact entropy rate in bits (nats) per token, from the formula above.
  double entropy_bits() const;
  double entropy_nats() const;

  // count tokens of stream `stream` (0, 1, ...: independent sequences of one source). When
  // realized_bits is given it receives the average entropy of the distributions the tokens were
  // actually drawn from (differs from entropy_bits() by the warm-up and by chance).
  std::vector<std::uint32_t> generate(std::uint64_t stream, std::int64_t count,
                                      double* realized_bits = nullptr) const;

  // ---- The model, for tests and analysis ----
  std::uint32_t marker() const { return static_cast<std::uint32_t>(config_.vocab_size - 1); }
  // Context class for predicting tokens[n] from tokens[0..n) (missing history counts as 0).
  std::uint32_t context_class(const std::uint32_t* tokens, std::int64_t n) const;
  // The `branches` successor tokens of a class, in order of decreasing probability.
  const std::uint32_t* successors(std::uint32_t context_class) const;
  // Exact realised probabilities (multiples of 2^-32).
  const std::vector<double>& successor_probs() const { return successor_probs_; }
  const std::vector<double>& offset_probs() const { return offset_probs_; }
  double copy_prob() const;
  int distance(int offset) const { return config_.min_distance + offset * config_.distance_step; }

 private:
  SyntheticConfig config_;
  std::uint64_t copy_threshold_ = 0;                 // copy iff word < threshold
  std::vector<std::uint64_t> successor_cumulative_;  // upper bounds of each successor's range
  std::vector<std::uint64_t> offset_cumulative_;
  std::vector<double> successor_probs_, offset_probs_;
  std::vector<std::uint32_t> table_;  // context_classes x branches
};

struct SyntheticDataset {
  std::vector<std::string> train;  // shard paths
  std::vector<std::string> val;
  double entropy_bits = 0.0;  // per token
  double entropy_nats = 0.0;
};

// Makes sure dir holds the built-in dataset for config: train_000.qts .. (train_shards shards of
// tokens_per_shard tokens, streams 0..) and val_000.qts (val_tokens tokens, the stream after the
// training ones), u16 Quintet shards whose metadata records the parameters and the entropy floor
// (keys "synthetic", "entropy_floor_bits", "entropy_floor_nats", "entropy_realized_bits").
// Existing shards made with the same parameters are kept; shards made with other parameters make
// it throw InvalidArgument (delete them or use another dir). Creates dir. Safe to call from
// several processes at once (each file appears atomically).
SyntheticDataset ensure_synthetic_dataset(const std::string& dir,
                                          const SyntheticConfig& config = {}, int train_shards = 4,
                                          std::int64_t tokens_per_shard = std::int64_t{1} << 23,
                                          std::int64_t val_tokens = std::int64_t{1} << 20);

// The entropy floor (nats per token) recorded in the metadata of every file of dataset, or
// nullopt when some file does not carry one or they disagree.
std::optional<double> entropy_floor_nats(const TokenDataset& dataset);

}  // namespace quintet::data
