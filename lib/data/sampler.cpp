#include "quintet/data/sampler.hpp"

#include "quintet/core/error.hpp"

namespace quintet::data {

namespace {

// splitmix64's finaliser: a strong 64-bit mixer.
inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr int kRounds = 6;

}  // namespace

Sampler::Sampler(std::uint64_t num_windows, const SamplerConfig& config)
    : num_windows_(num_windows), config_(config) {
  QUINTET_CHECK(num_windows > 0, "Sampler: the dataset has no window");
  QUINTET_CHECK(config.batch_size >= 1, "Sampler: batch_size {} must be >= 1", config.batch_size);
  QUINTET_CHECK(config.dp_size >= 1 && config.dp_rank >= 0 && config.dp_rank < config.dp_size,
                "Sampler: data-parallel rank {} must be in [0, dp_size = {})", config.dp_rank,
                config.dp_size);
  QUINTET_CHECK(config.start.sample_index < num_windows,
                "Sampler: start sample_index {} must be < the number of windows {} (was the state "
                "saved with another dataset or sequence length?)",
                config.start.sample_index, num_windows);
  while ((std::uint64_t{1} << (2 * half_bits_)) < num_windows) ++half_bits_;
}

std::uint64_t Sampler::global_batch_size() const {
  return static_cast<std::uint64_t>(config_.batch_size) *
         static_cast<std::uint64_t>(config_.dp_size);
}

std::uint64_t Sampler::feistel(std::uint64_t epoch, std::uint64_t x) const {
  const std::uint64_t mask = (std::uint64_t{1} << half_bits_) - 1;
  std::uint64_t left = x >> half_bits_, right = x & mask;
  const std::uint64_t key = mix(config_.seed ^ mix(epoch + 0x5851f42d4c957f2dULL));
  for (int r = 0; r < kRounds; ++r) {
    const std::uint64_t f =
        mix(key + mix(right + static_cast<std::uint64_t>(r) * 0x632be59bd9b4e019ULL));
    const std::uint64_t next = left ^ (f & mask);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

std::uint64_t Sampler::permute(std::uint64_t epoch, std::uint64_t position) const {
  QUINTET_CHECK(position < num_windows_, "Sampler::permute: position {} >= {} windows", position,
                num_windows_);
  if (!config_.shuffle) return position;
  // Cycle walking: the Feistel network permutes [0, 4^half_bits); applying it until the value
  // lands in [0, W) restricts it to a permutation of [0, W) (at most ~4 steps on average).
  std::uint64_t x = position;
  do {
    x = feistel(epoch, x);
  } while (x >= num_windows_);
  return x;
}

std::vector<SampleRef> Sampler::batch(std::uint64_t n) const {
  const std::uint64_t w = num_windows_;
  const std::uint64_t r = static_cast<std::uint64_t>(config_.dp_rank);
  const std::uint64_t R = static_cast<std::uint64_t>(config_.dp_size);
  // Stream positions are relative to the start of config.start's epoch.
  const std::uint64_t first = config_.start.sample_index + n * global_batch_size();
  std::vector<SampleRef> out(static_cast<std::size_t>(config_.batch_size));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::uint64_t t = first + i * R + r;
    SampleRef& s = out[i];
    s.epoch = config_.start.epoch + t / w;
    s.position = t % w;
    s.window = permute(s.epoch, s.position);
  }
  return out;
}

SamplerState Sampler::state_after(std::uint64_t n) const {
  const std::uint64_t t = config_.start.sample_index + n * global_batch_size();
  return SamplerState{config_.start.epoch + t / num_windows_, t % num_windows_};
}

}  // namespace quintet::data
