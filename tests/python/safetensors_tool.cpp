// The C++ safetensors reader and writer driven from the command line, for the cross-check against
// an independent Python reader and writer (tests/python/safetensors_test.py):
//
//   safetensors_tool copy SRC DST_DIR MAX_SHARD_BYTES   every tensor of SRC (a file, an index or a
//                                                       directory) in its dtype, with the first
//                                                       file's metadata, into DST_DIR (sharded)
//   safetensors_tool to_f32 SRC DST_FILE                every tensor of SRC converted to f32
//   safetensors_tool box SRC NAME DST_FILE B0 E0 [B1 E1 ...]
//                                                       the box [B0, E0) x [B1, E1) ... of NAME,
//                                                       as f32, in DST_FILE under the same name
// A quintet::Error is printed and makes the exit status 1.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "quintet/data/safetensors.hpp"

using namespace quintet;
using namespace quintet::data;

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 4 && args[0] == "copy") {
      const auto src = SafetensorsCheckpoint::open(args[1]);
      std::vector<NamedTensor> tensors;
      for (const std::string& name : src.names()) tensors.push_back({name, src.read(name)});
      SafetensorsShardOptions opt;
      opt.max_shard_bytes = std::stoull(args[3]);
      if (!src.files().empty()) opt.metadata = src.files()[0].metadata();
      write_safetensors_sharded(args[2], tensors, opt);
      return 0;
    }
    if (args.size() == 3 && args[0] == "to_f32") {
      const auto src = SafetensorsCheckpoint::open(args[1]);
      std::vector<NamedTensor> tensors;
      for (const std::string& name : src.names()) {
        tensors.push_back({name, src.read(name, DType::f32)});
      }
      write_safetensors(args[2], tensors);
      return 0;
    }
    if (args.size() >= 4 && args.size() % 2 == 0 && args[0] == "box") {
      std::vector<IndexRange> box;
      for (std::size_t i = 4; i < args.size(); i += 2) {
        box.push_back({std::stoll(args[i]), std::stoll(args[i + 1])});
      }
      const auto src = SafetensorsCheckpoint::open(args[1]);
      write_safetensors(args[3], {{args[2], src.read_box(args[2], box, DType::f32)}});
      return 0;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  fmt::print(stderr,
             "usage: {0} copy SRC DST_DIR MAX_SHARD_BYTES | {0} to_f32 SRC DST_FILE | "
             "{0} box SRC NAME DST_FILE B0 E0 [B1 E1 ...]\n",
             argv[0]);
  return 2;
}
