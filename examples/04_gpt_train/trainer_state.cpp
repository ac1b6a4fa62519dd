#include "trainer_state.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "quintet/core/log.hpp"

namespace gpt {

quintet::train::Checkpointer checkpointer(const TrainConfig& c, const std::string& dir,
                                          quintet::Communicator& world) {
  // The data spec may hold ';' or '=' (a list of shards): keep only what cannot clash.
  std::string data = c.data.empty() ? "builtin:" + c.data_dir : c.data;
  for (char& ch : data) {
    if (ch == ';' || ch == '=' || ch == '"' || ch == '\\') ch = '_';
  }
  // (The global batch is in the library's identity already.)
  return quintet::train::Checkpointer(
      dir, world, fmt::format("data={};synthetic_order={}", data, c.synthetic_order));
}

std::string run_metadata(const TrainConfig& c) {
  return nlohmann::json{{"lr", c.lr}, {"steps", c.steps}}.dump();
}

std::function<void()> exit_during_save(const TrainConfig& c, std::int64_t step) {
  if (c.exit_during_save != step) return {};
  return [step] {
    quintet::log::warn("--exit-during-save {}: exiting before the checkpoint is committed", step);
    std::_Exit(3);
  };
}

}  // namespace gpt
