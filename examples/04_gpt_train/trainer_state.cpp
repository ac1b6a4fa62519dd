#include "trainer_state.hpp"

#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "quintet/parallel/checkpoint/checkpoint.hpp"

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace gpt {

quintet::train::Checkpointer checkpointer(const quintet::train::JobConfig& job,
                                          const std::string& dir, quintet::Communicator& world) {
  // The data spec may hold ';' or '=' (a list of shards): keep only what cannot clash.
  std::string data = job.data.shards.empty() ? "builtin:" + job.data.dir : job.data.shards;
  for (char& ch : data) {
    if (ch == ';' || ch == '=' || ch == '"' || ch == '\\') ch = '_';
  }
  // (The global batch is in the library's identity already.) The Markov order belongs to the
  // built-in dataset only: a run on --data leaves it out, so a checkpoint that recorded it (the
  // order an earlier version let --data runs set to no effect) resumes all the same.
  const std::string identity = job.data.shards.empty() ? fmt::format("data={};synthetic_order={}",
                                                                     data, job.data.synthetic_order)
                                                       : fmt::format("data={}", data);
  quintet::train::Checkpointer saver(dir, world, identity);
  saver.set_keep_last(job.checkpoint.keep_last);  // --keep-last (pruning after each save)
  return saver;
}

quintet::train::HfExportOptions hf_export_options(const quintet::train::JobConfig& job) {
  quintet::train::HfExportOptions o;
  o.dtype = quintet::train::parse_hf_export_dtype(job.checkpoint.export_dtype);
  o.tokenizer_dir = job.checkpoint.init_from_hf;
  return o;
}

std::string run_metadata(const quintet::train::JobConfig& job) {
  return nlohmann::json{{"lr", job.training.lr}, {"steps", job.training.steps}}.dump();
}

std::function<void()> exit_during_save(const quintet::train::JobConfig& job, std::int64_t step) {
  if (job.checkpoint.exit_during_save != step) return {};
  return [step] {
    quintet::log::warn("--exit-during-save {}: exiting before the checkpoint is committed", step);
    std::_Exit(3);
  };
}

void install_checkpoint_fault(const quintet::RuntimeConfig& runtime) {
  const std::optional<std::string> spec = runtime.get_env("QUINTET_CHECKPOINT_FAULT");
  if (!spec || spec->empty()) return;
  const std::size_t colon = spec->find(':');
  const std::string point = spec->substr(0, colon);
  const int only_rank = colon == std::string::npos ? -1 : std::stoi(spec->substr(colon + 1));
  quintet::checkpoint::set_save_point_hook(
      [point, only_rank, text = *spec](std::string_view at, int rank) {
        if (at != point || (only_rank >= 0 && rank != only_rank)) return;
        std::fprintf(stderr, "QUINTET_CHECKPOINT_FAULT=%s: rank %d kills itself at '%s'\n",
                     text.c_str(), rank, point.c_str());
        std::fflush(stderr);
        std::raise(SIGKILL);
      });
}

void inject_fault(const quintet::train::JobConfig& job, std::int64_t step, int rank) {
  if (job.observe.inject_fault.empty()) return;
  char kind[16] = {};
  long long at_step = 0;
  int at_rank = 0;
  QUINTET_CHECK(std::sscanf(job.observe.inject_fault.c_str(), "%15[a-z]:%lld:%d", kind, &at_step,
                            &at_rank) == 3 &&
                    (std::strcmp(kind, "throw") == 0 || std::strcmp(kind, "stop") == 0),
                "--inject-fault {}: expected KIND:STEP:RANK with KIND throw or stop",
                job.observe.inject_fault);
  if (step != at_step || rank != at_rank) return;
  if (std::strcmp(kind, "stop") == 0) {
    quintet::log::warn("--inject-fault {}: rank {} stops itself (SIGSTOP) at step {}",
                       job.observe.inject_fault, rank, step);
    std::raise(SIGSTOP);
    return;
  }
  QUINTET_THROW(InvalidArgument, "--inject-fault {}: rank {} fails on its own at step {}",
                job.observe.inject_fault, rank, step);
}

}  // namespace gpt
