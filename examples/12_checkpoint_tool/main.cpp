// 12_checkpoint_tool: prints what a checkpoint written by train::Checkpointer holds and verifies
// it, without a model, a GPU or MPI.
//
//   12_checkpoint_tool DIR             the latest checkpoint of DIR: step, ranks, identity, layout,
//                                      and each global tensor (field, name, shape, dtype, pieces)
//   12_checkpoint_tool DIR --verify    also reads every byte: each shard's XXH64 against its
//                                      trailer and checkpoint.json, each tensor's against its
//                                      header, and that the pieces of each tensor cover it once
//   12_checkpoint_tool --to-hf DIR OUT [--export-dtype f32|bf16] [--tokenizer-from HFDIR]
//                      [--max-shard-bytes N]
//                                      DIR's latest checkpoint as a Hugging Face model directory
//                                      OUT (config.json, model*.safetensors; docs/huggingface.md):
//                                      the master weights, f32 (default) or rounded to bf16; the
//                                      tokenizer files of HFDIR copied beside them
//   12_checkpoint_tool --help          this usage
// Exit status: 0 when it holds a checkpoint (and verifies, or is exported), 1 when DIR holds none,
// 2 on an error (a bad command line among them). Installed with the library
// (bin/12_checkpoint_tool).
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "quintet/parallel/checkpoint/checkpoint.hpp"
#include "quintet/parallel/checkpoint/global_index.hpp"
#include "quintet/parallel/train/hf_export.hpp"

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
  std::vector<std::string> to_hf;
  std::string export_dtype = "f32";
  quintet::train::HfExportOptions options;
  app.add_option("DIR", dir,
                 "a checkpoint directory (the one --save wrote; its latest checkpoint is shown)");
  app.add_flag("--verify", verify,
               "also read every byte: each shard's and each tensor's XXH64, and that the pieces of "
               "each tensor cover it once");
  app.add_option("--to-hf", to_hf,
                 "CHECKPOINT OUT: export CHECKPOINT's latest checkpoint as a Hugging Face model "
                 "directory OUT (which must not exist), written atomically")
      ->expected(2)
      ->type_name("CHECKPOINT OUT");
  app.add_option("--export-dtype", export_dtype,
                 "with --to-hf: f32 (the master weights, lossless) or bf16 (rounded to nearest "
                 "even)")
      ->capture_default_str();
  app.add_option("--tokenizer-from", options.tokenizer_dir,
                 "with --to-hf: a Hugging Face model directory whose tokenizer.json, "
                 "tokenizer_config.json and special_tokens_map.json (and config.json's bos/eos "
                 "ids) the export takes");
  app.add_option("--max-shard-bytes", options.max_shard_bytes,
                 "with --to-hf: the largest safetensors file; more files get "
                 "model.safetensors.index.json")
      ->capture_default_str();
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
  if (to_hf.empty() == dir.empty()) {
    std::fprintf(stderr, "%s\nRun with --help for more information.\n",
                 dir.empty() ? "DIR (or --to-hf CHECKPOINT OUT) is required"
                             : "--to-hf takes its own CHECKPOINT: give DIR or --to-hf, not both");
    return 2;
  }
  try {
    if (!to_hf.empty()) {
      options.dtype = quintet::train::parse_hf_export_dtype(export_dtype);
      const auto info = quintet::checkpoint::latest_checkpoint(to_hf[0]);
      if (!info) {
        fmt::print("{}: no checkpoint\n", to_hf[0]);
        return 1;
      }
      quintet::train::export_hf_checkpoint(*info, to_hf[1], options);
      fmt::print("exported {} (step {}) to {} ({})\n", info->path, info->step, to_hf[1],
                 export_dtype);
      return 0;
    }
    const auto info = quintet::checkpoint::latest_checkpoint(dir);
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
    const quintet::checkpoint::GlobalIndex index(*info);
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
      quintet::checkpoint::verify_checkpoint(*info);
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
