// Writes the C++ DataLoader's first batches to a file, for the Python module's test to compare
// against (tests/python/loader_test.py): per batch, its tokens then its targets, int32 row-major.
//
//   python_dump_batches SPEC SEQ_LEN BATCH DP_RANK DP_SIZE SEED THREADS EPOCH SAMPLE_INDEX
//                       SHUFFLE(0|1) COUNT OUT
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include "quintet/data/loader.hpp"

int main(int argc, char** argv) {
  if (argc != 13) {
    fmt::print(stderr,
               "usage: {} SPEC SEQ_LEN BATCH DP_RANK DP_SIZE SEED THREADS EPOCH SAMPLE_INDEX "
               "SHUFFLE COUNT OUT\n",
               argv[0]);
    return 2;
  }
  try {
    using namespace quintet::data;
    LoaderConfig c;
    c.seq_len = std::stoll(argv[2]);
    c.batch_size = std::stoll(argv[3]);
    c.dp_rank = std::stoi(argv[4]);
    c.dp_size = std::stoi(argv[5]);
    c.seed = std::stoull(argv[6]);
    c.threads = std::stoi(argv[7]);
    c.start = SamplerState{std::stoull(argv[8]), std::stoull(argv[9])};
    c.shuffle = std::string(argv[10]) == "1";
    const long count = std::stol(argv[11]);
    DataLoader loader(TokenDataset::open(argv[1]), c);
    std::ofstream out(argv[12], std::ios::binary);
    for (long i = 0; i < count; ++i) {
      const Batch b = loader.next();
      out.write(static_cast<const char*>(b.tokens.data_ptr()), b.tokens.nbytes());
      out.write(static_cast<const char*>(b.targets.data_ptr()), b.targets.nbytes());
    }
    if (!out) throw std::runtime_error(fmt::format("cannot write {}", argv[12]));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
