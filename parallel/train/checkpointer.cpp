// A training run saved and restored in one call (see checkpointer.hpp).
#include "quintet/parallel/train/checkpointer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"

namespace quintet::train {

namespace {

// Keys of the Checkpointer's part of the metadata (prefixed, so that the search below never
// finds a key of the user's JSON first: ours are written before it).
constexpr const char* kStep = "\"trainer_step\": ";
constexpr const char* kEpoch = "\"trainer_data_epoch\": ";
constexpr const char* kSample = "\"trainer_data_sample_index\": ";
constexpr const char* kIdentity = "\"trainer_identity\": \"";
constexpr const char* kUser = "\"user\": ";

// The position just past key in text, at or after from; throws when it is missing.
std::size_t after(const std::string& text, const std::string& key, std::size_t from,
                  const std::string& path) {
  const std::size_t pos = text.find(key, from);
  QUINTET_CHECK(pos != std::string::npos,
                "Checkpointer: {} has no {} in its metadata; it was not saved by a Checkpointer",
                path, key);
  return pos + key.size();
}

std::uint64_t read_u64(const std::string& text, const std::string& key, const std::string& path) {
  return std::stoull(text.substr(after(text, key, 0, path)));
}

// "k1=v1;k2=v2" into its pairs, in order.
std::vector<std::pair<std::string, std::string>> split_identity(const std::string& identity) {
  std::vector<std::pair<std::string, std::string>> out;
  std::size_t begin = 0;
  while (begin < identity.size()) {
    std::size_t end = identity.find(';', begin);
    if (end == std::string::npos) end = identity.size();
    const std::string item = identity.substr(begin, end - begin);
    const std::size_t eq = item.find('=');
    out.emplace_back(item.substr(0, eq), eq == std::string::npos ? "" : item.substr(eq + 1));
    begin = end + 1;
  }
  return out;
}

// This rank's tensors: the values and optimizer state of each stage it holds.
std::string prefix(const TrainingModel& model, const TrainingStage& s) {
  return model.stages().size() == 1 ? std::string() : fmt::format("stage{}.", s.stage);
}

// The balancing biases of a stage's MoE layers, concatenated (undefined without MoE layers).
Tensor moe_biases(const TrainingStage& s) {
  std::vector<float> all;
  for (const expert::MoELayer* m : s.chunk->moe_layers()) {
    const std::vector<float> b = m->balance_bias().to_vector<float>();
    all.insert(all.end(), b.begin(), b.end());
  }
  if (all.empty()) return Tensor();
  return Tensor::from_vector(all, {static_cast<std::int64_t>(all.size())});
}

}  // namespace

std::string run_identity(const TrainingModel& model, const data::DataLoader& loader) {
  const TrainingConfig& c = model.config();
  const model::GptConfig& m = c.model;
  const Mesh& mesh = model.mesh();
  const data::LoaderConfig& lc = loader.config();
  return fmt::format(
             "layers={};hidden={};heads={};mlp_width={};vocab={};seq_len={};norm={};activation={};"
             "bias={};tied_embeddings={};learned_positions={};init_std={};output_init_std={};eps={}"
             ";"
             "dtype={};sequence_parallel={};attention={};mlp={};tp={};cp={};pp={};dp={};vpp={};"
             "micro_batch={};microbatches={};zero_stage={};seed={};loader_seed={};shuffle={}",
             m.layers, m.hidden, m.heads, m.mlp_width(), m.vocab, m.seq_len,
             static_cast<int>(m.norm), static_cast<int>(m.activation), m.bias, m.tied_embeddings,
             m.learned_positions, m.init_std, m.output_init_std(), m.eps, dtype_name(m.dtype),
             m.sequence_parallel, static_cast<int>(m.attention), static_cast<int>(m.mlp),
             mesh.size(Axis::tp), mesh.size(Axis::cp), mesh.size(Axis::pp), mesh.size(Axis::dp),
             c.vpp, c.micro_batch, c.microbatches, c.data_parallel.zero_stage, c.seed, lc.seed,
             lc.shuffle) +
         (m.mlp != model::MlpKind::moe
              ? std::string()
              : fmt::format(";experts={};top_k={};expert_width={};moe_every={};shared_experts={};"
                            "router={};capacity_factor={};ep={};etp={}",
                            m.moe.router.experts, m.moe.router.top_k, m.expert_width(), m.moe.every,
                            m.moe.shared_experts, static_cast<int>(m.moe.router.score),
                            m.moe.router.capacity_factor, mesh.size(Axis::ep),
                            mesh.size(Axis::etp)));
}

Checkpointer::Checkpointer(std::string dir, Communicator& world, std::string extra_identity)
    : dir_(std::move(dir)), world_(world), extra_identity_(std::move(extra_identity)) {
  QUINTET_CHECK(!dir_.empty(), "Checkpointer: empty directory");
  QUINTET_CHECK(extra_identity_.find_first_of("\"\\\n") == std::string::npos,
                "Checkpointer: extra_identity \"{}\" holds a quote, backslash or newline",
                extra_identity_);
  std::size_t pairs = 0;
  for (const auto& [key, value] : split_identity(extra_identity_)) {
    QUINTET_CHECK(!key.empty(), "Checkpointer: extra_identity \"{}\" has an empty key",
                  extra_identity_);
    ++pairs;
  }
  QUINTET_CHECK(
      static_cast<std::size_t>(std::count(extra_identity_.begin(), extra_identity_.end(), '=')) ==
          pairs,
      "Checkpointer: extra_identity \"{}\" is not key=value pairs joined by ';'", extra_identity_);
}

std::string Checkpointer::identity(const TrainingModel& model,
                                   const data::DataLoader& loader) const {
  const std::string base = run_identity(model, loader);
  return extra_identity_.empty() ? base : base + ";" + extra_identity_;
}

void Checkpointer::save(std::int64_t step, TrainingModel& model, const data::DataLoader& loader,
                        const std::string& user_json, const std::function<void()>& before_commit) {
  QUINTET_CHECK(!user_json.empty(), "Checkpointer::save: empty user_json; pass a JSON value");
  const Stream& stream = model.stream();
  std::vector<NamedTensor> tensors;
  for (TrainingStage& s : model.stages()) {
    s.optimizer->wait_for_parameters(stream);  // ZeRO: every value current before it is written
    tensors.push_back({prefix(model, s) + "params", s.store->data_buffer()});
    for (auto& [name, t] : s.optimizer->state()) {
      tensors.push_back({prefix(model, s) + "optimizer." + name, t});
    }
    const Tensor bias = moe_biases(s);
    if (bias.defined()) tensors.push_back({prefix(model, s) + "moe_bias", bias});
  }
  const data::SamplerState position = loader.state();
  const std::string meta = fmt::format("{{{}{}, {}{}, {}{}, {}{}\", {}{}}}", kStep, step, kEpoch,
                                       position.epoch, kSample, position.sample_index, kIdentity,
                                       identity(model, loader), kUser, user_json);
  save_checkpoint(dir_, step, tensors, meta, world_, stream, before_commit);
}

std::optional<std::int64_t> Checkpointer::restore(TrainingModel& model, data::DataLoader& loader) {
  const std::optional<CheckpointInfo> info = latest_checkpoint(dir_);
  if (!info) return std::nullopt;
  const std::string& text = info->metadata_json;
  // The identity first: a checkpoint of another run is refused before any tensor is read.
  const std::size_t id_begin = after(text, kIdentity, 0, info->path);
  const std::size_t id_end = text.find('"', id_begin);
  const auto saved = split_identity(text.substr(id_begin, id_end - id_begin));
  for (const auto& [key, value] : split_identity(identity(model, loader))) {
    std::string was = "(none)";
    for (const auto& [k, v] : saved) {
      if (k == key) was = v;
    }
    QUINTET_CHECK(was == value,
                  "Checkpointer::restore: {} was saved by a run with {} = {}, this run has {} = "
                  "{}; restore into the same model, layout, batch, seed and data order",
                  info->path, key, was, key, value);
  }
  QUINTET_CHECK(info->world_size == world_.size(),
                "Checkpointer::restore: {} was saved by {} ranks, this job has {}", info->path,
                info->world_size, world_.size());
  const Stream& stream = model.stream();
  // Values load in place; the optimizer state into copies it then takes (its "step" is a copy).
  std::vector<NamedTensor> tensors;
  std::vector<std::vector<std::pair<std::string, Tensor>>> states;
  std::vector<Tensor> biases;
  for (TrainingStage& s : model.stages()) {
    biases.push_back(moe_biases(s));
    if (biases.back().defined()) tensors.push_back({prefix(model, s) + "moe_bias", biases.back()});
    tensors.push_back({prefix(model, s) + "params", s.store->data_buffer()});
    states.push_back(s.optimizer->state());
    for (auto& [name, t] : states.back()) {
      t = Tensor::empty(t.shape(), t.dtype(), t.device(), stream);
      tensors.push_back({prefix(model, s) + "optimizer." + name, t});
    }
  }
  load_checkpoint(*info, tensors, world_, stream);
  std::size_t i = 0;
  for (TrainingStage& s : model.stages()) {
    s.optimizer->load_state(states[i], stream);
    if (biases[i].defined()) {
      const std::vector<float> all = biases[i].to_vector<float>();
      std::size_t at = 0;
      for (expert::MoELayer* m : s.chunk->moe_layers()) {
        const std::size_t e = static_cast<std::size_t>(m->options().router.experts);
        m->set_balance_bias(std::vector<float>(all.begin() + at, all.begin() + at + e));
        at += e;
      }
    }
    ++i;
  }
  data::SamplerState position;
  position.epoch = read_u64(text, kEpoch, info->path);
  position.sample_index = read_u64(text, kSample, info->path);
  loader.seek(position);
  // The user's JSON: from our "user" key (after the identity) to the close of our object, which
  // the checkpoint's own closing brace follows.
  const std::size_t user_begin = after(text, kUser, id_end, info->path);
  const std::size_t ours_close = text.rfind('}', text.rfind('}') - 1);
  user_json_ = text.substr(user_begin, ours_close - user_begin);
  return static_cast<std::int64_t>(read_u64(text, kStep, info->path));
}

}  // namespace quintet::train
