// DataLoader on a GPU: batches copied on the loader's copy stream, ordered by the batch event,
// equal the CPU loader's; the host never waits on the copy in next().
#include <unistd.h>

#include <filesystem>
#include <random>
#include <vector>

#include "support/catch.hpp"

#include "quintet/data/loader.hpp"
#include "quintet/data/shard_writer.hpp"

using namespace quintet;
using namespace quintet::data;

TEST_CASE("GPU batches arrive through the copy stream and equal the CPU loader's") {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("quintet_gpu_loader_" + std::to_string(::getpid())))
                              .string();
  std::filesystem::create_directories(dir);
  std::mt19937 rng(5);
  std::vector<std::uint32_t> t(1 << 20);
  for (auto& v : t) v = rng() % 50257;
  write_llmc_shard(dir + "/a.bin", t.data(), static_cast<std::int64_t>(t.size()));
  const TokenDataset ds = TokenDataset::open(dir + "/a.bin");

  LoaderConfig c;
  c.seq_len = 512;
  c.batch_size = 16;
  c.threads = 4;
  c.seed = 9;
  DataLoader cpu(ds, c);
  c.device = Device::cuda(0);
  DataLoader gpu(ds, c);
  Stream compute = Stream::create(Device::cuda(0));
  std::vector<Batch> kept;
  for (int step = 0; step < 50; ++step) {
    Batch g = gpu.next(compute);
    REQUIRE(g.tokens.device() == Device::cuda(0));
    REQUIRE(g.ready != nullptr);
    g.wait(compute);
    // A clone on the compute stream after the wait: reads the copied data in stream order.
    Batch on_compute = g;
    on_compute.tokens = g.tokens.clone(compute);
    on_compute.targets = g.targets.clone(compute);
    kept.push_back(on_compute);
  }
  compute.synchronize();
  for (int step = 0; step < 50; ++step) {
    const Batch h = cpu.next();
    INFO("step " << step);
    CHECK(kept[static_cast<std::size_t>(step)].tokens.to_vector<std::int32_t>() ==
          h.tokens.to_vector<std::int32_t>());
    CHECK(kept[static_cast<std::size_t>(step)].targets.to_vector<std::int32_t>() ==
          h.targets.to_vector<std::int32_t>());
  }
  CHECK(gpu.state().sample_index == 50 * 16);
  REQUIRE_THROWS_QUINTET(gpu.next(Stream()), InvalidArgument, "the consumer stream is on cpu");
  std::filesystem::remove_all(dir);
}
