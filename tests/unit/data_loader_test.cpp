// DataLoader on the CPU: batches equal windows read one token at a time in the sampler's order,
// whatever the thread count; resume equals the uninterrupted run; worker errors reach next();
// the destructor stops cleanly at any point; read_delay_ms slows each read.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"

#include "quintet/data/loader.hpp"
#include "quintet/data/shard_writer.hpp"

using namespace quintet;
using namespace quintet::data;

namespace {

const std::string& data_dir() {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() /
                     ("quintet_data_loader_" + std::to_string(::getpid())))
                        .string();
    std::filesystem::create_directories(d);
    std::mt19937 rng(11);
    // Three shards of different formats and sizes.
    std::vector<std::uint32_t> t(5000);
    for (auto& v : t) v = rng() % 50000;
    write_quintet_shard(d + "/a.qts", t.data(), 5000);
    write_llmc_shard(d + "/b.bin", t.data(), 3001);
    write_megatron_dataset(d + "/c", t.data() + 100, 2222, {0, 1000, 2222}, TokenType::i32);
    return d;
  }();
  return dir;
}

TokenDataset dataset() {
  return TokenDataset::open(data_dir() + "/a.qts," + data_dir() + "/b.bin," + data_dir() + "/c");
}

LoaderConfig config(int threads, std::int64_t seq_len = 33, std::int64_t batch = 4) {
  LoaderConfig c;
  c.seq_len = seq_len;
  c.batch_size = batch;
  c.threads = threads;
  c.seed = 2024;
  return c;
}

// Batch n computed without the loader: the sampler's windows, read token by token.
void check_batch(const Batch& b, const Sampler& sampler, const TokenDataset& ds,
                 std::int64_t seq_len, std::uint64_t n) {
  REQUIRE(b.index == n);
  REQUIRE(b.tokens.shape() == Shape{sampler.config().batch_size, seq_len});
  REQUIRE(b.tokens.dtype() == DType::i32);
  const std::vector<SampleRef> refs = sampler.batch(n);
  REQUIRE(b.samples.size() == refs.size());
  const auto tok = b.tokens.to_vector<std::int64_t>();
  const auto tgt = b.targets.to_vector<std::int64_t>();
  // Window w's file and start, by walking the files.
  for (std::size_t i = 0; i < refs.size(); ++i) {
    REQUIRE(b.samples[i].window == refs[i].window);
    std::uint64_t w = refs[i].window;
    std::size_t f = 0;
    for (;; ++f) {
      const std::uint64_t nw =
          static_cast<std::uint64_t>((ds.files()[f].num_tokens() - 1) / seq_len);
      if (w < nw) break;
      w -= nw;
    }
    const TokenFile& file = ds.files()[f];
    const std::int64_t start = static_cast<std::int64_t>(w) * seq_len;
    for (std::int64_t j = 0; j < seq_len; ++j) {
      const std::size_t at = i * static_cast<std::size_t>(seq_len) + static_cast<std::size_t>(j);
      if (tok[at] != file.token(start + j) || tgt[at] != file.token(start + j + 1)) {
        FAIL("batch " << n << " row " << i << " position " << j << " differs from the file");
      }
    }
  }
}

std::vector<std::vector<std::int32_t>> collect(const LoaderConfig& c, int steps) {
  DataLoader loader(dataset(), c);
  std::vector<std::vector<std::int32_t>> out;
  for (int s = 0; s < steps; ++s) {
    const Batch b = loader.next();
    auto v = b.tokens.to_vector<std::int32_t>();
    const auto t = b.targets.to_vector<std::int32_t>();
    v.insert(v.end(), t.begin(), t.end());
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace

TEST_CASE("batches are the sampler's windows, the same for any thread count") {
  const TokenDataset ds = dataset();
  // 5000/33 + 3000/33 + 2221/33 = 151 + 90 + 67 = 308 windows; 100 batches of 4 span 2 epochs.
  const LoaderConfig c1 = config(1);
  {
    DataLoader loader(ds, c1);
    REQUIRE(loader.windows().count() == 308);
    for (std::uint64_t n = 0; n < 100; ++n) {
      const Batch b = loader.next();
      check_batch(b, loader.sampler(), ds, 33, n);
      CHECK(b.ready == nullptr);
      CHECK(b.next_state.epoch * 308 + b.next_state.sample_index == (n + 1) * 4);
    }
    CHECK(loader.stats().batches == 100);
  }
  const auto reference = collect(c1, 100);
  for (int threads : {2, 3, 8}) {
    for (int depth : {1, 0, 5}) {
      LoaderConfig c = config(threads);
      c.queue_depth = depth;
      INFO("threads " << threads << " queue depth " << depth);
      CHECK(collect(c, 100) == reference);
    }
  }
}

TEST_CASE("resuming after 0, 1 and k batches equals the uninterrupted run") {
  const auto whole = collect(config(3), 40);
  for (int k : {0, 1, 17, 39}) {
    SamplerState state;
    {
      DataLoader first(dataset(), config(2));
      for (int s = 0; s < k; ++s) first.next();
      state = first.state();
    }  // destroyed with batches still queued
    LoaderConfig c = config(4);
    c.start = state;
    const auto rest = collect(c, 40 - k);
    for (int s = 0; s < 40 - k; ++s) CHECK(rest[s] == whole[k + s]);
  }
}

TEST_CASE("seek restarts the stream at a saved state, forward or back") {
  const auto whole = collect(config(3), 31);
  auto both = [](const Batch& b) {  // collect's form: tokens, then targets
    auto v = b.tokens.to_vector<std::int32_t>();
    const auto t = b.targets.to_vector<std::int32_t>();
    v.insert(v.end(), t.begin(), t.end());
    return v;
  };
  DataLoader loader(dataset(), config(2));
  for (int s = 0; s < 20; ++s) loader.next();  // batches queued ahead of the consumer
  const SamplerState at_20 = loader.state();
  DataLoader other(dataset(), config(2));
  for (int s = 0; s < 5; ++s) other.next();
  const SamplerState at_5 = other.state();
  for (const auto& [state, k] : {std::pair{at_5, 5}, std::pair{at_20, 20}}) {
    INFO("seek to batch " << k);
    loader.seek(state);
    CHECK(loader.state().epoch == state.epoch);
    CHECK(loader.state().sample_index == state.sample_index);
    for (int s = k; s < 30; ++s) {
      CHECK(both(loader.next()) == whole[s]);
    }
  }
  // A state outside the dataset is refused and the loader stays where it was.
  SamplerState outside = at_20;
  outside.sample_index = 1u << 30;
  REQUIRE_THROWS_QUINTET(loader.seek(outside), InvalidArgument,
                         "start sample_index 1073741824 must be < the number of windows");
  CHECK(both(loader.next()) == whole[30]);
}

TEST_CASE("data-parallel loaders split each step's samples") {
  const auto single = collect(config(2, 16, 6), 10);  // R = 1, 6 per step
  std::vector<std::vector<std::int32_t>> parts[3];
  for (int r = 0; r < 3; ++r) {
    LoaderConfig c = config(2, 16, 2);
    c.dp_rank = r;
    c.dp_size = 3;
    parts[r] = collect(c, 10);
  }
  // Global sample i of a step is rank i % 3's row i / 3.
  for (int s = 0; s < 10; ++s) {
    for (int i = 0; i < 6; ++i) {
      for (int j = 0; j < 16; ++j) {
        const auto& part = parts[i % 3][s];
        REQUIRE(part[(i / 3) * 16 + j] == single[s][i * 16 + j]);            // tokens
        REQUIRE(part[32 + (i / 3) * 16 + j] == single[s][96 + i * 16 + j]);  // targets
      }
    }
  }
}

TEST_CASE("a worker error comes out of next() when its batch is reached, and stays") {
  std::vector<std::uint32_t> t(400, 7);
  t[250] = 0xffffffffu;  // stored as i64 4294967295: too large for an int32 token id
  write_megatron_dataset(data_dir() + "/negative", t.data(), 400, {}, TokenType::i64);
  LoaderConfig c = config(3, 10, 1);
  c.shuffle = false;  // window 24 holds token 250
  DataLoader loader(TokenDataset::open(data_dir() + "/negative"), c);
  for (int s = 0; s < 24; ++s) CHECK(loader.next().tokens.to_vector<std::int32_t>()[0] == 7);
  REQUIRE_THROWS_QUINTET(loader.next(), InvalidArgument,
                         "is 4294967295: expected an integer in [0, 2^31)");
  REQUIRE_THROWS_QUINTET(loader.next(), InvalidArgument, "is 4294967295");
  CHECK(loader.state().sample_index == 24);
}

TEST_CASE("bad loader arguments are rejected before any thread starts") {
  LoaderConfig c = config(0);
  REQUIRE_THROWS_QUINTET(DataLoader(dataset(), c), InvalidArgument,
                         "threads 0 must be in [1, 1024]");
  c = config(2, 6000);
  REQUIRE_THROWS_QUINTET(DataLoader(dataset(), c), InvalidArgument, "no window of 6000 + 1 tokens");
  c = config(2);
  c.start.sample_index = 308;
  REQUIRE_THROWS_QUINTET(DataLoader(dataset(), c), InvalidArgument, "start sample_index 308");
  c = config(2);
  c.read_delay_ms = -1.0;
  REQUIRE_THROWS_QUINTET(DataLoader(dataset(), c), InvalidArgument,
                         "read_delay_ms -1 must be a finite time >= 0");
}

TEST_CASE("read_delay_ms makes each batch's read that much slower (a slow disk)") {
  LoaderConfig c = config(1);
  c.read_delay_ms = 30.0;
  const auto t0 = std::chrono::steady_clock::now();
  DataLoader loader(dataset(), c);
  for (int i = 0; i < 3; ++i) loader.next();
  // One worker: the third batch cannot be out before three reads of 30 ms each (a lower bound
  // only, so a slow machine cannot fail it); next() waited for most of it.
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(90));
  CHECK(loader.stats().wait_seconds > 0.0);
}

TEST_CASE("loaders are destroyed cleanly before, during and after use") {
  for (int threads : {1, 4, 8}) {
    { DataLoader idle(dataset(), config(threads)); }
    {
      DataLoader busy(dataset(), config(threads, 5, 64));
      busy.next();
    }
  }
}
