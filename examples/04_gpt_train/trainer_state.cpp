#include "trainer_state.hpp"

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace gpt {

namespace {

// The settings a resumed run must share with the run that saved it.
nlohmann::json identity(const TrainConfig& c) {
  return {{"layers", c.layers},
          {"hidden", c.hidden},
          {"heads", c.heads},
          {"vocab", c.vocab},
          {"seq_len", c.seq_len},
          {"tied_embeddings", c.tied_embeddings},
          {"micro_batch", c.micro_batch},
          {"global_batch", c.global_batch},
          {"tp", c.tp},
          {"dp", c.dp},
          {"pp", c.pp},
          {"vpp", c.vpp},
          {"sp", c.sp},
          {"zero", c.zero},
          {"seed", c.seed},
          {"data", c.data.empty() ? "builtin:" + c.data_dir : c.data},
          {"synthetic_order", c.synthetic_order}};
}

// The tensor names of a stage: plain when the rank holds one stage, else prefixed.
std::string prefix(const std::vector<StageState>& stages, const StageState& s) {
  return stages.size() == 1 ? std::string() : "stage" + std::to_string(s.stage) + ".";
}

std::vector<quintet::NamedTensor> run_tensors(const std::vector<StageState>& stages) {
  std::vector<quintet::NamedTensor> tensors;
  for (const StageState& s : stages) {
    tensors.push_back({prefix(stages, s) + "params", s.store->data_buffer()});
    for (auto& [name, t] : s.optimizer->state()) {
      tensors.push_back({prefix(stages, s) + "optimizer." + name, t});
    }
  }
  return tensors;
}

}  // namespace

void save_run(const TrainConfig& c, const RunPosition& pos, const std::vector<StageState>& stages,
              quintet::Communicator& world, const quintet::Stream& stream) {
  // ZeRO: every value current before it is written.
  for (const StageState& s : stages) s.optimizer->wait_for_parameters(stream);
  nlohmann::json meta{{"config", identity(c)},
                      {"step", pos.step},
                      {"data_epoch", pos.data.epoch},
                      {"data_sample_index", pos.data.sample_index},
                      {"lr", c.lr},
                      {"steps", c.steps}};
  std::function<void()> before_commit;
  if (c.exit_during_save == pos.step) {
    before_commit = [step = pos.step] {
      quintet::log::warn("--exit-during-save {}: exiting before the checkpoint is committed", step);
      std::_Exit(3);
    };
  }
  quintet::save_checkpoint(c.save, pos.step, run_tensors(stages), meta.dump(), world, stream,
                           before_commit);
}

std::optional<RunPosition> resume_run(const TrainConfig& c, const std::vector<StageState>& stages,
                                      quintet::Communicator& world, const quintet::Stream& stream) {
  const auto info = quintet::latest_checkpoint(c.resume);
  if (!info) return std::nullopt;
  const nlohmann::json meta = nlohmann::json::parse(info->metadata_json).at("user");
  const nlohmann::json saved = meta.at("config");
  const nlohmann::json now = identity(c);
  for (const auto& [key, value] : now.items()) {
    QUINTET_CHECK(saved.contains(key) && saved[key] == value,
                  "--resume {}: the checkpoint was saved with {} = {}, this run has {}; resume "
                  "with the same model, layout, batch, seed and data",
                  info->path, key, saved.contains(key) ? saved[key].dump() : "(none)",
                  value.dump());
  }
  // Parameter values load in place; the optimizer state into copies it then takes (its "step" is
  // not a view).
  std::vector<quintet::NamedTensor> tensors;
  std::vector<std::vector<std::pair<std::string, quintet::Tensor>>> states;
  for (const StageState& s : stages) {
    tensors.push_back({prefix(stages, s) + "params", s.store->data_buffer()});
    states.push_back(s.optimizer->state());
    for (auto& [name, t] : states.back()) {
      t = quintet::Tensor::empty(t.shape(), t.dtype(), t.device(), stream);
      tensors.push_back({prefix(stages, s) + "optimizer." + name, t});
    }
  }
  quintet::load_checkpoint(*info, tensors, world, stream);
  for (std::size_t i = 0; i < stages.size(); ++i) {
    stages[i].optimizer->load_state(states[i], stream);
  }
  RunPosition pos;
  pos.step = meta.at("step").get<std::int64_t>();
  pos.data.epoch = meta.at("data_epoch").get<std::uint64_t>();
  pos.data.sample_index = meta.at("data_sample_index").get<std::uint64_t>();
  return pos;
}

}  // namespace gpt
