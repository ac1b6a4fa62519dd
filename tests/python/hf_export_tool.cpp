// A Hugging Face directory imported and exported again at any layout, without a step (for
// tests/python/hf_export_test.py: export -> import -> export must give the same bytes):
//
//   mpirun -np N hf_export_tool dense|moe[:MAX_SHARD_BYTES] --init-from-hf DIR --export-hf OUT
//                               [job flags...]
//
// Builds the model of DIR's config.json at the job's layout, loads its weights (each rank its own
// boxes) and exports them to OUT (each rank its pieces and its share of the files: files of at
// most MAX_SHARD_BYTES, so that there are several, when given). Errors exit 2
// with the message on stderr.
#include <csignal>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/train/hf_checkpoint.hpp"
#include "quintet/parallel/train/hf_export.hpp"
#include "quintet/parallel/train/job_program.hpp"
#include "quintet/parallel/train/training_model.hpp"

namespace {

int run(int argc, char** argv) {
  using namespace quintet;
  const std::string kind = argv[1];
  const std::size_t colon = kind.find(':');
  const bool moe = kind.substr(0, colon) == "moe";
  return train::run_job_program(
      "hf_export_tool", argc, argv, 1, moe ? train::JobConfig::moe_preset() : train::JobConfig(),
      [](train::JobConfig&) {},
      [&](const train::JobConfig& job, World& world, Mesh& mesh, Stream& stream) {
        train::TrainingModel model(job, mesh, stream);
        train::load_hf_weights(train::read_hf_config(job.checkpoint.init_from_hf), model,
                               world.comm());
        train::HfExportOptions options;
        options.dtype = train::parse_hf_export_dtype(job.checkpoint.export_dtype);
        options.tokenizer_dir = job.checkpoint.init_from_hf;
        if (colon != std::string::npos) {
          options.max_shard_bytes = std::stoull(kind.substr(colon + 1));
        }
        train::export_hf(job.checkpoint.export_hf, model, world.comm(), options);
        return 0;
      });
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f, the test of a failed export) makes a write fail with EFBIG, an
  // error on every rank, instead of killing this rank with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  return quintet::train::job_program_main(
      "hf_export_tool", argc, argv, 1, "dense|moe --init-from-hf DIR --export-hf OUT [job flags]",
      [&] { return run(argc, argv); });
}
