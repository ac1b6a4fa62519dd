// A training run saved and restored in one call (see checkpointer.hpp).
#include "quintet/parallel/train/checkpointer.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "quintet/core/error.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"
#include "quintet/parallel/checkpoint/global_index.hpp"

namespace quintet::train {

namespace {

// Keys of the Checkpointer's part of the metadata (under checkpoint.json's "user"; the caller's
// own JSON is under our "user").
constexpr const char* kStep = "trainer_step";
constexpr const char* kEpoch = "trainer_data_epoch";
constexpr const char* kSample = "trainer_data_sample_index";
constexpr const char* kIdentity = "trainer_identity";
constexpr const char* kUser = "user";
constexpr const char* kOptimizerStep = "trainer_optimizer_step";
constexpr const char* kLayout = "trainer_layout";
constexpr const char* kModel = "trainer_model";

// The Checkpointer's metadata of a checkpoint; InvalidArgument when it was not saved by one.
nlohmann::ordered_json checkpointer_metadata(const checkpoint::CheckpointInfo& info) {
  nlohmann::ordered_json meta = nlohmann::ordered_json::parse(info.user_json, nullptr, false);
  QUINTET_CHECK(meta.is_object() && meta.contains(kIdentity) && meta.contains(kStep),
                "Checkpointer: {} has no {} in its metadata; it was not saved by a Checkpointer",
                info.path, kIdentity);
  return meta;
}

// An unsigned integer field of that metadata; InvalidArgument naming it when missing.
std::uint64_t read_u64(const nlohmann::ordered_json& meta, const char* key,
                       const std::string& path) {
  const auto it = meta.find(key);
  QUINTET_CHECK(it != meta.end() && it->is_number_unsigned(),
                "Checkpointer: {} has no {} in its metadata; it was not saved by a Checkpointer",
                path, key);
  return it->get<std::uint64_t>();
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

// The box a parameter's local tensor is in its global tensor: (start, global shape).
std::pair<Shape, Shape> box_of(const nn::Parameter& p) {
  const nn::ParameterAttributes& a = p.attributes();
  if (a.full_shape.empty()) return {Shape(p.shape().size(), 0), p.shape()};
  return {a.shard_start, a.full_shape};
}

// Whether this rank writes p's pieces: one rank of each group that holds the same box (the
// replicas over dp and cp, and over tp for a tensor tp does not split or a shard held by
// tp_replicas ranks; for an expert weight, its replicas over edp). The second copy of a tied
// weight is never written: it equals its owner.
bool writes(const nn::Parameter& p, const Mesh& mesh) {
  const nn::ParameterAttributes& a = p.attributes();
  if (a.tied == nn::TiedRole::copy) return false;
  if (a.is_expert) return mesh.rank(Axis::edp) == 0;
  const bool split = !a.full_shape.empty() && a.full_shape != p.shape();
  const int tp = mesh.rank(Axis::tp);
  return mesh.rank(Axis::dp) == 0 && mesh.rank(Axis::cp) == 0 &&
         (split ? tp % a.tp_replicas == 0 : tp == 0);
}

// The global names of a stage's MoE balancing biases: the router weight's name with
// "router.weight" replaced by "balance_bias", in the order of chunk->moe_layers().
std::vector<std::string> bias_names(const TrainingStage& s) {
  std::vector<std::string> out;
  const std::string router = "router.weight";
  for (const nn::Parameter* p : s.store->parameters()) {
    const std::string& n = p->name();
    if (n.size() >= router.size() &&
        n.compare(n.size() - router.size(), router.size(), router) == 0)
      out.push_back(n.substr(0, n.size() - router.size()) + "balance_bias");
  }
  QUINTET_CHECK(out.size() == s.chunk->moe_layers().size(),
                "Checkpointer: {} router weights for {} MoE layers in stage {}", out.size(),
                s.chunk->moe_layers().size(), s.stage);
  return out;
}

constexpr const char* kStateFields[] = {"master", "exp_avg", "exp_avg_sq"};

// Delayed FP8 scaling's state, by the scale's global name ("block0.attn.qkv.fp8_x"): its amax
// history [amax_history] (newest first) and its scale [1]. Current scaling keeps none.
constexpr const char* kFp8History = "fp8_amax_history";
constexpr const char* kFp8Scale = "fp8_scale";
std::vector<std::pair<std::string, nn::Fp8TensorScale*>> delayed_fp8(const TrainingStage& s) {
  std::vector<std::pair<std::string, nn::Fp8TensorScale*>> out;
  for (auto& [name, f] : s.chunk->named_fp8_scales()) {
    if (f->recipe().scaling == nn::Fp8Scaling::delayed) out.emplace_back(name, f);
  }
  return out;
}

// The identity holds its kinds as enum numbers (kept so that older checkpoints resume); a
// refusal names them as the flags do ("norm = layernorm", not "norm = 0").
std::string identity_value_text(const std::string& key, const std::string& value) {
  struct KindName {
    const char* key;
    int number;
    const char* name;
  };
  const KindName names[] = {{"norm", static_cast<int>(nn::NormKind::layernorm), "layernorm"},
                            {"norm", static_cast<int>(nn::NormKind::rmsnorm), "rmsnorm"},
                            {"activation", static_cast<int>(nn::Activation::gelu), "gelu"},
                            {"activation", static_cast<int>(nn::Activation::swiglu), "swiglu"},
                            {"mlp", static_cast<int>(model::MlpKind::dense), "dense"},
                            {"mlp", static_cast<int>(model::MlpKind::moe), "moe"},
                            {"router", static_cast<int>(expert::RouterScore::softmax), "softmax"},
                            {"router", static_cast<int>(expert::RouterScore::sigmoid), "sigmoid"}};
  for (const KindName& k : names) {
    if (key == k.key && value == std::to_string(k.number)) return k.name;
  }
  return value;
}

}  // namespace

std::string run_identity(const TrainingModel& model, const data::DataLoader& loader) {
  const TrainingConfig& c = model.config();
  const model::GptConfig& m = c.model;
  const data::LoaderConfig& lc = loader.config();
  // What the numbers depend on: the model, the global batch, the init seed and the data order;
  // not the layout (tp, cp, pp, dp, ep, etp, vpp, ZeRO, micro-batch, sequence parallelism),
  // which a restore may change.
  return fmt::format(
             "layers={};hidden={};heads={};mlp_width={};vocab={};seq_len={};norm={};activation={};"
             "bias={};tied_embeddings={};learned_positions={};init_std={};output_init_std={};eps={}"
             ";dtype={};attention={};mlp={};global_batch={};seed={};loader_seed={};shuffle={}",
             m.layers, m.hidden, m.heads, m.mlp_width(), m.vocab, m.seq_len,
             static_cast<int>(m.norm), static_cast<int>(m.activation), m.bias, m.tied_embeddings,
             m.learned_positions, m.init_std, m.output_init_std(), m.eps, dtype_name(m.dtype),
             static_cast<int>(m.attention), static_cast<int>(m.mlp), c.global_batch(model.mesh()),
             c.seed, lc.seed, lc.shuffle) +
         (m.mlp != model::MlpKind::moe
              ? std::string()
              : fmt::format(";experts={};top_k={};expert_width={};moe_every={};shared_experts={};"
                            "router={};capacity_factor={}",
                            m.moe.router.experts, m.moe.router.top_k, m.expert_width(), m.moe.every,
                            m.moe.shared_experts, static_cast<int>(m.moe.router.score),
                            m.moe.router.capacity_factor)) +
         (m.moe.dense_layers.empty()  // (only when some: older checkpoints resume)
              ? std::string()
              : ";dense_layers=" + model::layer_list_text(m.moe.dense_layers)) +
         (m.kv_heads == 0 && m.head_dim == 0 && !m.rope && !m.qk_norm
              ? std::string()  // as before these fields existed, so older checkpoints resume
              : fmt::format(";kv_heads={};head_dim={};rope={};rope_theta={};qk_norm={}",
                            m.kv_head_count(), m.head_size(), m.rope, m.rope_theta, m.qk_norm)) +
         (m.bias && !m.proj_bias ? ";proj_bias=0" : "") +  // (only when off: older ones resume)
         (m.rope_scaling.factor == 0.0
              ? std::string()
              : fmt::format(";rope_scaling=llama3,{},{},{},{}", m.rope_scaling.factor,
                            m.rope_scaling.low_freq_factor, m.rope_scaling.high_freq_factor,
                            m.rope_scaling.original_max_position_embeddings));
}

// The model's structure and sizes (checkpoint_model reads them back).
nlohmann::ordered_json model_record(const model::GptConfig& m) {
  const expert::RouterConfig& r = m.moe.router;
  return {{"family", model::model_family_name(m.family)},
          {"layers", m.layers},
          {"hidden", m.hidden},
          {"heads", m.heads},
          {"kv_heads", m.kv_head_count()},
          {"head_dim", m.head_size()},
          {"ffn_hidden", m.mlp_width()},
          {"vocab", m.vocab},
          {"seq_len", m.seq_len},
          {"norm", m.norm == nn::NormKind::rmsnorm ? "rmsnorm" : "layernorm"},
          {"activation", m.activation == nn::Activation::swiglu ? "swiglu" : "gelu"},
          {"bias", m.bias},
          {"proj_bias", m.proj_bias},
          {"tied_embeddings", m.tied_embeddings},
          {"learned_positions", m.learned_positions},
          {"rope", m.rope},
          {"rope_theta", m.rope_theta},
          {"rope_scaling",
           {m.rope_scaling.factor, m.rope_scaling.low_freq_factor, m.rope_scaling.high_freq_factor,
            m.rope_scaling.original_max_position_embeddings}},
          {"qk_norm", m.qk_norm},
          {"eps", m.eps},
          {"init_std", m.init_std},
          {"dtype", dtype_name(m.dtype)},
          {"moe", m.mlp == model::MlpKind::moe},
          {"experts", r.experts},
          {"top_k", r.top_k},
          {"router", r.score == expert::RouterScore::softmax ? "softmax" : "sigmoid"},
          {"renormalize", r.renormalize},
          {"aux_loss_coeff", r.aux_loss_coeff},
          {"bias_rate", r.bias_rate},
          {"expert_ffn", m.expert_width()},
          {"shared_experts", m.moe.shared_experts},
          {"moe_every", m.moe.every},
          {"dense_layers", m.moe.dense_layers}};
}

// The layout a checkpoint was saved at (recorded for the record and the inspection tool, not
// checked: a restore may use another).
std::string run_layout(const TrainingModel& model) {
  const Mesh& mesh = model.mesh();
  const TrainingConfig& c = model.config();
  return fmt::format(
      "tp={};cp={};pp={};dp={};ep={};etp={};vpp={};zero_stage={};micro_batch={};"
      "sequence_parallel={}",
      mesh.size(Axis::tp), mesh.size(Axis::cp), mesh.size(Axis::pp), mesh.size(Axis::dp),
      mesh.size(Axis::ep), mesh.size(Axis::etp), c.vpp, c.data_parallel.zero_stage, c.micro_batch,
      c.model.sequence_parallel);
}

std::string checkpoint_model_json(const model::GptConfig& model) {
  return model_record(model).dump();
}

model::GptConfig checkpoint_model(const checkpoint::CheckpointInfo& checkpoint) {
  const nlohmann::ordered_json meta = checkpointer_metadata(checkpoint);
  QUINTET_CHECK(meta.contains(kModel) && meta[kModel].is_object(),
                "{} has no {} in its metadata: it was saved before checkpoints recorded their "
                "model; resume it and save again",
                checkpoint.path, kModel);
  const nlohmann::ordered_json& j = meta[kModel];
  model::GptConfig m;
  try {
    m.family = model::parse_model_family(j.at("family").get<std::string>());
    m.layers = j.at("layers").get<std::int64_t>();
    m.hidden = j.at("hidden").get<std::int64_t>();
    m.heads = j.at("heads").get<std::int64_t>();
    m.kv_heads = j.at("kv_heads").get<std::int64_t>();
    m.head_dim = j.at("head_dim").get<std::int64_t>();
    m.ffn_hidden = j.at("ffn_hidden").get<std::int64_t>();
    m.vocab = j.at("vocab").get<std::int64_t>();
    m.seq_len = j.at("seq_len").get<std::int64_t>();
    m.norm = model::parse_norm_kind(j.at("norm").get<std::string>());
    m.activation = model::parse_activation(j.at("activation").get<std::string>());
    m.bias = j.at("bias").get<bool>();
    m.proj_bias = j.at("proj_bias").get<bool>();
    m.tied_embeddings = j.at("tied_embeddings").get<bool>();
    m.learned_positions = j.at("learned_positions").get<bool>();
    m.rope = j.at("rope").get<bool>();
    m.rope_theta = j.at("rope_theta").get<double>();
    const nlohmann::ordered_json& rs = j.at("rope_scaling");  // [factor, low, high, original]
    m.rope_scaling = {rs.at(0).get<double>(), rs.at(1).get<double>(), rs.at(2).get<double>(),
                      rs.at(3).get<std::int64_t>()};
    m.qk_norm = j.at("qk_norm").get<bool>();
    m.eps = j.at("eps").get<float>();
    m.init_std = j.at("init_std").get<float>();
    m.dtype = parse_dtype(j.at("dtype").get<std::string>());
    m.mlp = j.at("moe").get<bool>() ? model::MlpKind::moe : model::MlpKind::dense;
    expert::RouterConfig& r = m.moe.router;
    r.experts = j.at("experts").get<std::int64_t>();
    r.top_k = j.at("top_k").get<int>();
    r.score = expert::parse_router_score(j.at("router").get<std::string>());
    r.renormalize = j.at("renormalize").get<bool>();
    r.aux_loss_coeff = j.at("aux_loss_coeff").get<float>();
    r.bias_rate = j.at("bias_rate").get<float>();
    m.moe.expert_ffn = j.at("expert_ffn").get<std::int64_t>();
    m.moe.shared_experts = j.at("shared_experts").get<int>();
    m.moe.every = j.at("moe_every").get<int>();
    if (j.contains("dense_layers"))  // (checkpoints saved before it have none)
      m.moe.dense_layers = j.at("dense_layers").get<std::vector<std::int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    QUINTET_THROW(InvalidArgument, "{}: its {} is malformed ({})", checkpoint.path, kModel,
                  e.what());
  }
  return m;
}

std::vector<checkpoint::NamedTensor> master_weight_pieces(TrainingModel& model) {
  const Stream& stream = model.stream();
  std::vector<checkpoint::NamedTensor> tensors;
  for (TrainingStage& s : model.stages()) {
    s.optimizer->wait_for_parameters(stream);
    Tensor master;
    for (auto& [field, buffer] : s.optimizer->full_state(stream)) {
      if (field == "master") master = buffer;
    }
    QUINTET_CHECK(master.defined(), "master_weight_pieces: the optimizer has no master weights");
    for (const nn::Parameter* p : s.store->parameters()) {
      if (!writes(*p, model.mesh())) continue;
      const auto [start, global] = box_of(*p);
      tensors.push_back({checkpoint::encode_piece_name({"master", p->name(), start, global}),
                         master.narrow(0, p->offset(), p->numel()).view(p->shape())});
    }
  }
  return tensors;
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

Checkpointer::~Checkpointer() {
  try {
    wait();
  } catch (...) {
  }
}

std::pair<std::vector<checkpoint::NamedTensor>, std::string> Checkpointer::snapshot(
    std::int64_t step, TrainingModel& model, const data::DataLoader& loader,
    const std::string& user_json) {
  QUINTET_CHECK(!user_json.empty(), "Checkpointer::save: empty user_json; pass a JSON value");
  const Stream& stream = model.stream();
  const Mesh& mesh = model.mesh();
  std::vector<checkpoint::NamedTensor> tensors;
  std::int64_t optimizer_steps = 0;
  for (TrainingStage& s : model.stages()) {
    s.optimizer->wait_for_parameters(stream);  // ZeRO: every value current before it is written
    // Every element's optimizer state (ZeRO: gathered over each bucket's group).
    const auto full = s.optimizer->full_state(stream);
    optimizer_steps = s.optimizer->steps();
    for (const nn::Parameter* p : s.store->parameters()) {
      if (!writes(*p, mesh)) continue;
      const auto [start, global] = box_of(*p);
      tensors.push_back(
          {checkpoint::encode_piece_name({"value", p->name(), start, global}), p->data()});
      for (const auto& [field, buffer] : full) {
        tensors.push_back({checkpoint::encode_piece_name({field, p->name(), start, global}),
                           buffer.narrow(0, p->offset(), p->numel()).view(p->shape())});
      }
    }
    // The MoE balancing biases: the same on every rank of the stage.
    if (mesh.rank(Axis::dp) == 0 && mesh.rank(Axis::cp) == 0 && mesh.rank(Axis::tp) == 0) {
      const std::vector<std::string> names = bias_names(s);
      for (std::size_t i = 0; i < names.size(); ++i) {
        const Tensor& b = s.chunk->moe_layers()[i]->balance_bias();
        tensors.push_back({checkpoint::encode_piece_name({"value", names[i], {0}, b.shape()}), b});
      }
      // FP8 delayed scaling's histories: the same on every rank of the stage (reduced each step).
      for (const auto& [name, f] : delayed_fp8(s)) {
        const std::vector<float>& h = f->history();
        const Shape shape{static_cast<std::int64_t>(h.size())};
        tensors.push_back({checkpoint::encode_piece_name({kFp8History, name, {0}, shape}),
                           Tensor::from_vector(h, shape)});
        tensors.push_back({checkpoint::encode_piece_name({kFp8Scale, name, {0}, {1}}),
                           Tensor::from_vector(std::vector<float>{f->delayed_scale()}, {1})});
      }
    }
  }
  const data::SamplerState position = loader.state();
  nlohmann::ordered_json user;
  try {
    user = nlohmann::ordered_json::parse(user_json);
  } catch (const nlohmann::json::exception& e) {
    QUINTET_THROW(InvalidArgument, "Checkpointer::save: user_json is not a JSON value ({}): {}",
                  e.what(), user_json);
  }
  const nlohmann::ordered_json meta{{kStep, step},
                                    {kOptimizerStep, optimizer_steps},
                                    {kEpoch, position.epoch},
                                    {kSample, position.sample_index},
                                    {kIdentity, identity(model, loader)},
                                    {kLayout, run_layout(model)},
                                    {kModel, model_record(model.config().model)},
                                    {kUser, std::move(user)}};
  return {std::move(tensors), meta.dump()};
}

void Checkpointer::save(std::int64_t step, TrainingModel& model, const data::DataLoader& loader,
                        const std::string& user_json, const std::function<void()>& before_commit) {
  wait();
  auto [tensors, meta] = snapshot(step, model, loader, user_json);
  checkpoint::save_checkpoint(dir_, step, tensors, meta, world_, model.stream(), before_commit);
  if (keep_last_ > 0 && world_.rank() == 0) checkpoint::prune_checkpoints(dir_, keep_last_);
}

void Checkpointer::set_keep_last(int n) {
  QUINTET_CHECK(n >= 0, "Checkpointer::set_keep_last({}): expected >= 0 (0 keeps every one)", n);
  keep_last_ = n;
}

void Checkpointer::fit_host_buffers(const std::vector<checkpoint::NamedTensor>& tensors) {
  if (host_buffers_.size() != tensors.size()) host_buffers_.assign(tensors.size(), Tensor());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].tensor;
    Tensor& h = host_buffers_[i];
    if (!h.defined() || h.shape() != t.shape() || h.dtype() != t.dtype()) {
      h = t.device().is_cuda() ? Tensor::empty_pinned(t.shape(), t.dtype())
                               : Tensor::empty(t.shape(), t.dtype());
    }
  }
}

void Checkpointer::prepare_async(TrainingModel& model, const data::DataLoader& loader) {
  wait();
  fit_host_buffers(snapshot(0, model, loader, "{}").first);
}

void Checkpointer::save_async(std::int64_t step, TrainingModel& model,
                              const data::DataLoader& loader, const std::string& user_json,
                              const std::function<void()>& before_commit) {
  wait();  // one save at a time; the previous one's error surfaces here
  QUINTET_CHECK(world_.device().is_cpu(),
                "Checkpointer::save_async: the Checkpointer's communicator moves {} tensors; "
                "asynchronous saves agree over a CPU communicator: pass World::cpu_comm()",
                world_.device().str());
  if (!async_comm_) async_comm_ = world_.split(0, world_.rank(), "checkpoint");
  auto [tensors, meta] = snapshot(step, model, loader, user_json);
  // The copies the thread writes, into the buffers of prepare_async or the last save.
  const Stream& stream = model.stream();
  bool gpu = false;
  std::vector<checkpoint::NamedTensor> copies;
  fit_host_buffers(tensors);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].tensor;
    gpu = gpu || t.device().is_cuda();
    host_buffers_[i].copy_(t, stream);  // GPU: asynchronous on stream, into pinned memory
    copies.push_back({tensors[i].name, host_buffers_[i]});
  }
  std::shared_ptr<Event> copied;
  if (gpu) {
    copied = std::make_shared<Event>(stream.device());
    copied->record(stream);
  }
  Communicator* comm = async_comm_.get();
  pending_ = std::async(
      std::launch::async, [dir = dir_, step, copies = std::move(copies), meta = std::move(meta),
                           comm, copied, before_commit, keep = keep_last_] {
        // Below the training thread: the write should take what the step leaves (Linux: a thread's
        // nice value is its own).
        (void)setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
        if (copied) copied->synchronize();
        checkpoint::save_checkpoint(dir, step, copies, meta, *comm, Stream(), before_commit);
        if (keep > 0 && comm->rank() == 0) checkpoint::prune_checkpoints(dir, keep);
      });
}

void Checkpointer::check() {
  if (!pending_.valid()) return;
  // Whether every rank's background save has ended, agreed over world, so that every rank takes
  // the result (and its error) at the same step.
  const bool ended = pending_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  Tensor all_ended = Tensor::full({1}, ended ? 1.0 : 0.0, DType::i32);
  world_.all_reduce(all_ended, ReduceOp::min).synchronize();
  if (all_ended.item({0}) == 1.0) wait();
}

void Checkpointer::wait() {
  if (!pending_.valid()) return;
  std::future<void> done = std::move(pending_);
  done.get();
}

std::optional<std::int64_t> Checkpointer::restore(TrainingModel& model, data::DataLoader& loader) {
  wait();
  const std::optional<checkpoint::CheckpointInfo> info = checkpoint::latest_checkpoint(dir_);
  if (!info) return std::nullopt;
  const nlohmann::ordered_json meta = checkpointer_metadata(*info);
  // The identity first: a checkpoint of another run is refused before any tensor is read.
  QUINTET_CHECK(meta[kIdentity].is_string(), "Checkpointer: {}: {} is not a string", info->path,
                kIdentity);
  const auto saved = split_identity(meta[kIdentity].get<std::string>());
  for (const auto& [key, value] : split_identity(identity(model, loader))) {
    std::string was = "(none)";
    for (const auto& [k, v] : saved) {
      if (k == key) was = v;
    }
    QUINTET_CHECK(was == value,
                  "Checkpointer::restore: {} was saved by a run with {} = {}, this run has {} = "
                  "{}; restore into the same model, global batch, seed and data order (the layout "
                  "may differ)",
                  info->path, key, identity_value_text(key, was), key,
                  identity_value_text(key, value));
  }
  const Stream& stream = model.stream();
  // Every rank reads what it needs of the pieces any layout saved; a failure on one rank (a
  // missing piece, a corrupt file) makes every rank throw before training goes on.
  checkpoint::run_on_every_rank(world_, "Checkpointer::restore", [&] {
    const checkpoint::GlobalIndex index(*info);
    QUINTET_CHECK(!index.empty(),
                  "Checkpointer::restore: {} holds no global tensors: it was saved in the older "
                  "per-rank format, which this version does not read",
                  info->path);
    const std::int64_t optimizer_steps =
        static_cast<std::int64_t>(read_u64(meta, kOptimizerStep, info->path));
    for (TrainingStage& s : model.stages()) {
      const nn::ParameterStore& store = *s.store;
      const DType acc = nn::accum_dtype(store.dtype());
      const std::int64_t n = store.data_buffer().numel();
      std::vector<std::pair<std::string, Tensor>> full;
      for (const char* field : kStateFields) {
        Tensor t = Tensor::empty({n}, acc, store.device(), stream);
        t.fill_(0.0, stream);
        full.emplace_back(field, t);
      }
      for (const nn::Parameter* p : store.parameters()) {
        const auto [start, global] = box_of(*p);
        index.assemble("value", p->name(), global, start, p->data(), stream);
        for (const auto& [field, buffer] : full) {
          index.assemble(field, p->name(), global, start,
                         buffer.narrow(0, p->offset(), p->numel()).view(p->shape()), stream);
        }
      }
      s.optimizer->load_full_state(full, optimizer_steps, stream);
      const std::vector<std::string> names = bias_names(s);
      for (std::size_t i = 0; i < names.size(); ++i) {
        expert::MoELayer* m = s.chunk->moe_layers()[i];
        Tensor b = Tensor::empty(m->balance_bias().shape(), DType::f32);
        index.assemble("value", names[i], b.shape(), {0}, b, stream);
        m->set_balance_bias(b.to_vector<float>());
      }
      // FP8 delayed scaling continues from the saved histories; a checkpoint without them (of
      // a run without delayed scaling) starts them afresh.
      for (const auto& [name, f] : delayed_fp8(s)) {
        const auto* pieces = index.find(kFp8History, name);
        if (pieces == nullptr) continue;
        const Shape shape{static_cast<std::int64_t>(f->history().size())};
        QUINTET_CHECK(pieces->front().id.global_shape == shape,
                      "Checkpointer::restore: {} holds an amax history of {} steps for {}, this "
                      "run has --fp8-amax-history {}; resume with the same length",
                      info->path, shape_str(pieces->front().id.global_shape), name, shape[0]);
        Tensor h = Tensor::empty(shape, DType::f32), scale = Tensor::empty({1}, DType::f32);
        index.assemble(kFp8History, name, shape, {0}, h, stream);
        index.assemble(kFp8Scale, name, {1}, {0}, scale, stream);
        f->set_state(h.to_vector<float>(), scale.to_vector<float>().at(0));
      }
    }
  });
  data::SamplerState position;
  position.epoch = read_u64(meta, kEpoch, info->path);
  position.sample_index = read_u64(meta, kSample, info->path);
  loader.seek(position);
  user_json_ = meta.contains(kUser) ? meta[kUser].dump() : "{}";
  return static_cast<std::int64_t>(read_u64(meta, kStep, info->path));
}

}  // namespace quintet::train
