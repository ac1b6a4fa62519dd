// The first-step loss of a model imported from a Hugging Face directory, on given tokens, at any
// layout (for tests/python/hf_import_test.py, which compares it with hf_reference.py's):
//
//   mpirun -np N hf_import_tool dense|moe TOKENS --init-from-hf DIR [job flags...]
//
// TOKENS holds global_batch rows of seq_len + 1 int32 tokens; row i's inputs are its first
// seq_len tokens and its targets the last seq_len. dp replica r takes rows (r * accumulation + m)
// * micro_batch ... for its microbatch m. Rank 0 prints "loss <value>" (the mean cross-entropy
// over the global batch, train::StepStats::loss) and "loss2 <value>", the loss of a second step on
// the same batch after a first at learning rate 0; errors exit 2 with the message on stderr.
#include <fmt/format.h>

#include <fstream>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/train/hf_checkpoint.hpp"
#include "quintet/parallel/train/job_program.hpp"
#include "quintet/parallel/train/training_model.hpp"

namespace {

std::vector<std::int32_t> read_tokens(const std::string& path, std::int64_t count) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::int32_t> out(static_cast<std::size_t>(count));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * 4));
  QUINTET_CHECK(in.gcount() == count * 4, "{}: expected {} int32 tokens", path, count);
  return out;
}

int run(int argc, char** argv) {
  using namespace quintet;
  const std::string tokens_path = argv[2];
  return train::run_job_program(
      "hf_import_tool", argc, argv, 2,
      std::string(argv[1]) == "moe" ? train::JobConfig::moe_preset() : train::JobConfig(),
      // The tokens are TOKENS' (not the built-in dataset's vocabulary).
      [&](train::JobConfig& job) { job.data.shards = tokens_path; },
      [&](const train::JobConfig& job, World& world, Mesh& mesh, Stream& stream) {
        train::TrainingModel model(job, mesh, stream);
        train::load_hf_weights(train::read_hf_config(job.checkpoint.init_from_hf), model,
                               world.comm());
        const std::int64_t S = job.model.seq_len, B = job.training.micro_batch;
        const std::vector<std::int32_t> rows =
            read_tokens(tokens_path, job.training.global_batch * (S + 1));
        const std::int64_t first = mesh.rank(Axis::dp) * job.accumulation();
        const auto batch = [&](int m) {
          std::vector<std::int32_t> tokens, targets;
          for (std::int64_t b = 0; b < B; ++b) {
            const std::int32_t* row = rows.data() + ((first + m) * B + b) * (S + 1);
            tokens.insert(tokens.end(), row, row + S);
            targets.insert(targets.end(), row + 1, row + S + 1);
          }
          return pipeline::MicrobatchData{Tensor::from_vector<std::int32_t>(tokens, {B, S}),
                                          Tensor::from_vector<std::int32_t>(targets, {B, S})};
        };
        // Two steps on the same batch at learning rate 0: AdamW leaves the master weights as
        // they are and rounds the values from them, so the second loss equals the first only if
        // the import set the optimizer's master copy to the values.
        model.set_lr(0.0f);
        const double loss = model.step(batch).loss;
        const double loss2 = model.step(batch).loss;
        if (world.rank() == 0) fmt::print("loss {:.12e}\nloss2 {:.12e}\n", loss, loss2);
        return 0;
      });
}

}  // namespace

int main(int argc, char** argv) {
  return quintet::train::job_program_main("hf_import_tool", argc, argv, 2,
                                          "dense|moe TOKENS --init-from-hf DIR [job flags]",
                                          [&] { return run(argc, argv); });
}
