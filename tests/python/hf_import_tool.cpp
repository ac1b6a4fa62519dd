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

#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/train/hf_checkpoint.hpp"
#include "quintet/parallel/train/training_model.hpp"

namespace {

std::vector<std::int32_t> read_tokens(const std::string& path, std::int64_t count) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::int32_t> out(static_cast<std::size_t>(count));
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(count * 4));
  QUINTET_CHECK(in.gcount() == count * 4, "{}: expected {} int32 tokens", path, count);
  return out;
}

int run(const std::vector<std::string>& argv_in) {
  using namespace quintet;
  std::vector<const char*> argv{argv_in[0].c_str()};
  for (std::size_t i = 3; i < argv_in.size(); ++i) argv.push_back(argv_in[i].c_str());
  const RuntimeConfig runtime =
      RuntimeConfig::from_args(static_cast<int>(argv.size()), argv.data());
  train::JobConfig job = argv_in[1] == "moe" ? train::JobConfig::moe_preset() : train::JobConfig();
  if (auto exit = train::parse_job_args(runtime, "hf_import_tool", &job)) return *exit;
  job.data.shards = argv_in[2];  // the tokens are TOKENS' (not the built-in dataset's vocabulary)
  World world = init(runtime);
  try {
    job.validate(world.size());
    Stream stream;
    Mesh mesh(Layout(job.parallel, world.size()), world.comm());
    train::TrainingModel model(job, mesh, stream);
    train::load_hf_weights(train::read_hf_config(job.checkpoint.init_from_hf), model, world.comm());
    const std::int64_t S = job.model.seq_len, B = job.training.micro_batch;
    const std::vector<std::int32_t> rows =
        read_tokens(argv_in[2], job.training.global_batch * (S + 1));
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
    // Two steps on the same batch at learning rate 0: AdamW leaves the master weights as they
    // are and rounds the values from them, so the second loss equals the first only if the
    // import set the optimizer's master copy to the values.
    model.set_lr(0.0f);
    const double loss = model.step(batch).loss;
    const double loss2 = model.step(batch).loss;
    if (world.rank() == 0) fmt::print("loss {:.12e}\nloss2 {:.12e}\n", loss, loss2);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_import_tool: %s\n", e.what());
    world.fail(e, 2);
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 3) {
      std::fprintf(stderr, "usage: %s dense|moe TOKENS --init-from-hf DIR [job flags]\n", argv[0]);
      return 2;
    }
    return run(std::vector<std::string>(argv, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_import_tool: %s\n", e.what());
    return 2;
  }
}
