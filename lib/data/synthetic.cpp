#include "quintet/data/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "quintet/core/error.hpp"
#include "quintet/core/philox.hpp"
#include "quintet/data/shard_writer.hpp"

namespace quintet::data {

namespace {

constexpr std::uint64_t kTwo32 = std::uint64_t{1} << 32;
constexpr std::uint64_t kTableStream = 0xffffffffULL;  // Philox stream of the transition table

double entropy_of(const std::vector<double>& probs) {
  double h = 0.0;
  for (double p : probs) {
    if (p > 0) h -= p * std::log2(p);
  }
  return h;
}

// Integer weights (summing to 2^32, each >= 1) closest to probs; returns the cumulative bounds and
// writes the realised probabilities.
std::vector<std::uint64_t> quantize(const std::vector<double>& probs, std::vector<double>* exact) {
  std::vector<std::uint64_t> counts(probs.size());
  std::uint64_t total = 0;
  for (std::size_t i = 0; i + 1 < probs.size(); ++i) {
    counts[i] =
        std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(probs[i] * kTwo32)));
    total += counts[i];
  }
  QUINTET_CHECK(total < kTwo32, "synthetic source: probabilities too skewed to quantise");
  counts.back() = kTwo32 - total;
  std::vector<std::uint64_t> cumulative(counts.size());
  exact->resize(counts.size());
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    acc += counts[i];
    cumulative[i] = acc;
    (*exact)[i] = static_cast<double>(counts[i]) / static_cast<double>(kTwo32);
  }
  return cumulative;
}

std::size_t pick(const std::vector<std::uint64_t>& cumulative, std::uint32_t word) {
  std::size_t i = 0;
  while (word >= cumulative[i]) ++i;  // small tables: linear is fastest
  return i;
}

inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::string SyntheticConfig::describe() const {
  return fmt::format("v{}-k{}-c{}-b{}-z{}-q{}-l{}-d{}-m{}-s{}-seed{}", vocab_size, order,
                     context_classes, branches, zipf_exponent, copy_prob, copy_len, num_offsets,
                     min_distance, distance_step, seed);
}

SyntheticSource::SyntheticSource(const SyntheticConfig& config) : config_(config) {
  const SyntheticConfig& c = config;
  QUINTET_CHECK(c.vocab_size >= 3 && c.vocab_size <= 65536,
                "synthetic source: vocab_size {} must be in [3, 65536]", c.vocab_size);
  QUINTET_CHECK(c.order >= 1 && c.order <= 16, "synthetic source: order {} must be in [1, 16]",
                c.order);
  QUINTET_CHECK(c.context_classes >= 1, "synthetic source: context_classes {} must be >= 1",
                c.context_classes);
  QUINTET_CHECK(c.branches >= 1 && c.branches <= c.vocab_size - 1,
                "synthetic source: branches {} must be in [1, vocab_size - 1 = {}] (the marker is "
                "never a successor)",
                c.branches, c.vocab_size - 1);
  QUINTET_CHECK(c.zipf_exponent >= 0 && c.zipf_exponent <= 8,
                "synthetic source: zipf_exponent {} must be in [0, 8]", c.zipf_exponent);
  QUINTET_CHECK(c.copy_prob >= 0 && c.copy_prob < 1,
                "synthetic source: copy_prob {} must be in "
                "[0, 1)",
                c.copy_prob);
  QUINTET_CHECK(c.copy_len >= 1, "synthetic source: copy_len {} must be >= 1", c.copy_len);
  QUINTET_CHECK(c.num_offsets >= 1 && c.num_offsets <= c.vocab_size,
                "synthetic source: num_offsets {} must be in [1, vocab_size = {}] (offsets are "
                "tokens)",
                c.num_offsets, c.vocab_size);
  QUINTET_CHECK(c.min_distance >= 1 && c.distance_step >= 0,
                "synthetic source: min_distance {} must be >= 1 and distance_step {} >= 0",
                c.min_distance, c.distance_step);

  copy_threshold_ = static_cast<std::uint64_t>(std::llround(c.copy_prob * kTwo32));
  if (c.copy_prob > 0 && copy_threshold_ == 0) copy_threshold_ = 1;

  std::vector<double> p(static_cast<std::size_t>(c.branches));
  double z = 0;
  for (std::size_t i = 0; i < p.size(); ++i)
    z += p[i] = std::pow(static_cast<double>(i + 1), -c.zipf_exponent);
  for (double& v : p) v /= z;
  successor_cumulative_ = quantize(p, &successor_probs_);
  offset_cumulative_ =
      quantize(std::vector<double>(static_cast<std::size_t>(c.num_offsets), 1.0 / c.num_offsets),
               &offset_probs_);

  // The sparse transition table: per class, `branches` distinct tokens in [0, V - 1).
  const auto non_marker = static_cast<std::uint32_t>(c.vocab_size - 1);
  table_.resize(static_cast<std::size_t>(c.context_classes) * c.branches);
  for (std::uint64_t cls = 0; cls < static_cast<std::uint64_t>(c.context_classes); ++cls) {
    std::uint32_t* row = table_.data() + cls * c.branches;
    std::uint64_t draw = 0;
    for (int b = 0; b < c.branches;) {
      const auto w = philox::draw(c.seed, kTableStream, (cls << 20) + draw++);
      const std::uint32_t t =
          static_cast<std::uint32_t>((static_cast<std::uint64_t>(w.v[0]) * non_marker) >> 32);
      if (std::find(row, row + b, t) == row + b) row[b++] = t;
    }
  }
}

double SyntheticSource::copy_prob() const {
  return static_cast<double>(copy_threshold_) / static_cast<double>(kTwo32);
}

double SyntheticSource::entropy_bits() const {
  const double q = copy_prob();
  const double hq = (q > 0 && q < 1) ? -q * std::log2(q) - (1 - q) * std::log2(1 - q) : 0.0;
  const double free_bits =
      hq + (1 - q) * entropy_of(successor_probs_) + q * entropy_of(offset_probs_);
  return free_bits / (1 + q * (1 + config_.copy_len));
}

double SyntheticSource::entropy_nats() const { return entropy_bits() * std::log(2.0); }

std::uint32_t SyntheticSource::context_class(const std::uint32_t* tokens, std::int64_t n) const {
  std::uint64_t h = mix(config_.seed ^ 0x243f6a8885a308d3ULL);
  for (int j = 1; j <= config_.order; ++j) {
    const std::uint64_t t = n - j >= 0 ? tokens[n - j] : 0;
    h = mix(h ^ (t + (static_cast<std::uint64_t>(j) << 32)));
  }
  return static_cast<std::uint32_t>(h % static_cast<std::uint64_t>(config_.context_classes));
}

const std::uint32_t* SyntheticSource::successors(std::uint32_t context_class) const {
  QUINTET_CHECK(context_class < static_cast<std::uint32_t>(config_.context_classes),
                "context class {} out of range [0, {})", context_class, config_.context_classes);
  return table_.data() + static_cast<std::size_t>(context_class) * config_.branches;
}

std::vector<std::uint32_t> SyntheticSource::generate(std::uint64_t stream, std::int64_t count,
                                                     double* realized_bits) const {
  QUINTET_CHECK(count >= 0, "SyntheticSource::generate: count {} < 0", count);
  const double q = copy_prob();
  const double hq = (q > 0 && q < 1) ? -q * std::log2(q) - (1 - q) * std::log2(1 - q) : 0.0;
  const double h_markov = entropy_of(successor_probs_);
  const double h_free = hq + (1 - q) * h_markov;  // a free position once copies are enabled
  const double h_offset = entropy_of(offset_probs_);
  const std::int64_t warmup = config_.max_distance();

  std::vector<std::uint32_t> x(static_cast<std::size_t>(count));
  double bits = 0.0;
  std::int64_t n = 0;
  while (n < count) {
    const auto w = philox::draw(config_.seed, stream, static_cast<std::uint64_t>(n));
    if (n >= warmup && w.v[0] < copy_threshold_) {
      x[n] = marker();
      bits += h_free;
      ++n;
      if (n >= count) break;
      const int d = static_cast<int>(pick(offset_cumulative_, w.v[2]));
      x[n] = static_cast<std::uint32_t>(d);
      bits += h_offset;
      ++n;
      const std::int64_t dist = distance(d);
      for (int j = 0; j < config_.copy_len && n < count; ++j, ++n) x[n] = x[n - dist];
    } else {
      const std::uint32_t* succ = successors(context_class(x.data(), n));
      x[n] = succ[pick(successor_cumulative_, w.v[1])];
      bits += n >= warmup ? h_free : h_markov;
      ++n;
    }
  }
  if (realized_bits != nullptr)
    *realized_bits = count > 0 ? bits / static_cast<double>(count) : 0.0;
  return x;
}

// ---- The dataset on disk ----

namespace {

std::string shard_path(const std::string& dir, const char* split, int i) {
  return fmt::format("{}/{}_{:03d}.qts", dir, split, i);
}

void ensure_shard(const SyntheticSource& source, const std::string& path, std::uint64_t stream,
                  std::int64_t tokens, const std::string& split) {
  const std::string params = source.config().describe();
  if (std::filesystem::exists(path)) {
    const TokenFile f = TokenFile::open(path, TokenFileOptions{/*verify_checksum=*/false});
    const auto it = f.metadata().find("synthetic");
    const std::string found = it == f.metadata().end() ? "<none>" : it->second;
    QUINTET_CHECK(found == params && f.num_tokens() == tokens,
                  "{} holds other data: expected the synthetic dataset {} with {} tokens, found "
                  "'{}' with {} tokens; delete it or choose another data directory",
                  path, params, tokens, found, f.num_tokens());
    return;
  }
  double realized = 0.0;
  const std::vector<std::uint32_t> x = source.generate(stream, tokens, &realized);
  QuintetShardOptions opt;
  opt.token_type = source.config().vocab_size <= 65536 ? TokenType::u16 : TokenType::u32;
  opt.metadata = {{"synthetic", params},
                  {"split", split},
                  {"stream", std::to_string(stream)},
                  {"vocab_size", std::to_string(source.config().vocab_size)},
                  {"entropy_floor_bits", fmt::format("{:.17g}", source.entropy_bits())},
                  {"entropy_floor_nats", fmt::format("{:.17g}", source.entropy_nats())},
                  {"entropy_realized_bits", fmt::format("{:.17g}", realized)}};
  write_quintet_shard(path, x.data(), static_cast<std::int64_t>(x.size()), opt);
}

}  // namespace

SyntheticDataset ensure_synthetic_dataset(const std::string& dir, const SyntheticConfig& config,
                                          int train_shards, std::int64_t tokens_per_shard,
                                          std::int64_t val_tokens) {
  QUINTET_CHECK(train_shards >= 1 && tokens_per_shard >= 2 && val_tokens >= 2,
                "ensure_synthetic_dataset: need >= 1 train shard and >= 2 tokens per shard; got "
                "{} shards of {} tokens, {} validation tokens",
                train_shards, tokens_per_shard, val_tokens);
  const SyntheticSource source(config);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) QUINTET_THROW(System, "cannot create data directory {}: {}", dir, ec.message());
  SyntheticDataset out;
  for (int i = 0; i < train_shards; ++i) {
    out.train.push_back(shard_path(dir, "train", i));
    ensure_shard(source, out.train.back(), static_cast<std::uint64_t>(i), tokens_per_shard,
                 "train");
  }
  out.val.push_back(shard_path(dir, "val", 0));
  ensure_shard(source, out.val.back(), static_cast<std::uint64_t>(train_shards), val_tokens, "val");
  out.entropy_bits = source.entropy_bits();
  out.entropy_nats = source.entropy_nats();
  return out;
}

std::optional<double> entropy_floor_nats(const TokenDataset& dataset) {
  std::optional<double> value;
  for (const TokenFile& f : dataset.files()) {
    const auto it = f.metadata().find("entropy_floor_nats");
    if (it == f.metadata().end()) return std::nullopt;
    const double v = std::stod(it->second);
    if (value && *value != v) return std::nullopt;
    value = v;
  }
  return value;
}

}  // namespace quintet::data
