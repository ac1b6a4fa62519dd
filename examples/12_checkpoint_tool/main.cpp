// 12_checkpoint_tool: prints what a checkpoint written by train::Checkpointer holds and verifies
// it, without a model, a GPU or MPI.
//
//   12_checkpoint_tool DIR             the latest checkpoint of DIR: step, ranks, identity, layout,
//                                      and each global tensor (field, name, shape, dtype, pieces)
//   12_checkpoint_tool DIR --verify    also reads every byte: each shard's XXH64 against its
//                                      trailer and checkpoint.json, each tensor's against its
//                                      header, and that the pieces of each tensor cover it once
//   12_checkpoint_tool --help          this usage
// Exit status: 0 when it holds a checkpoint (and verifies), 1 when DIR holds none, 2 on an error
// (a bad command line among them). Installed with the library (bin/12_checkpoint_tool).
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

#include "quintet/parallel/checkpoint/checkpoint.hpp"
#include "quintet/parallel/checkpoint/global_index.hpp"

namespace {

// The Checkpointer's field key of a checkpoint's metadata, as text ("" when absent).
std::string field(const nlohmann::json& meta, const std::string& key) {
  if (!meta.is_object() || !meta.contains(key)) return "";
  const nlohmann::json& v = meta[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "12_checkpoint_tool: what a checkpoint written by train::Checkpointer holds (step, identity, "
      "layout, every global tensor and its pieces) and, with --verify, every checksum; no model, "
      "GPU or MPI needed"};
  std::string dir;
  bool verify = false;
  app.add_option("DIR", dir,
                 "a checkpoint directory (the one --save wrote; its latest checkpoint is shown)")
      ->required();
  app.add_flag("--verify", verify,
               "also read every byte: each shard's and each tensor's XXH64, and that the pieces of "
               "each tensor cover it once");
  app.footer(
      "Exit status: 0 when DIR holds a checkpoint (and it verifies), 1 when it holds none, 2 on "
      "an error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    const auto info = quintet::latest_checkpoint(dir);
    if (!info) {
      fmt::print("{}: no checkpoint\n", dir);
      return 1;
    }
    const nlohmann::json meta = nlohmann::json::parse(info->user_json, nullptr, false);
    fmt::print("checkpoint {}: step {}, saved by {} ranks\n", info->path, info->step,
               info->world_size);
    fmt::print("  identity: {}\n  layout:   {}\n  data:     epoch {}, sample {}\n",
               field(meta, "trainer_identity"), field(meta, "trainer_layout"),
               field(meta, "trainer_data_epoch"), field(meta, "trainer_data_sample_index"));
    const quintet::GlobalIndex index(*info);
    const auto tensors = index.summary();
    std::int64_t elements = 0;
    int gaps = 0;
    fmt::print("{:<12} {:<48} {:>16} {:>6} {:>7}\n", "field", "tensor", "shape", "dtype", "pieces");
    for (const auto& t : tensors) {
      const std::int64_t n = quintet::shape_numel(t.global_shape);
      elements += n;
      const bool whole = t.covered == n;
      gaps += whole ? 0 : 1;
      fmt::print("{:<12} {:<48} {:>16} {:>6} {:>7}{}\n", t.field, t.name,
                 quintet::shape_str(t.global_shape), quintet::dtype_name(t.dtype), t.pieces,
                 whole ? "" : fmt::format("  covers {} of {} elements", t.covered, n));
    }
    fmt::print("{} global tensors, {} elements\n", tensors.size(), elements);
    if (verify) {
      quintet::verify_checkpoint(*info);
      if (gaps > 0) {
        fmt::print(stderr, "verify: {} tensors are not covered exactly once by their pieces\n",
                   gaps);
        return 2;
      }
      fmt::print(
          "verified: {} shards, every file and tensor checksum matches, every tensor "
          "whole\n",
          info->world_size);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "12_checkpoint_tool: %s\n", e.what());
    return 2;
  }
}
