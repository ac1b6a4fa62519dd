// This rank's share of the GPT for training (see training_model.hpp).
#include "quintet/parallel/train/training_model.hpp"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "quintet/core/error.hpp"
#include "quintet/parallel/context/ring_attention.hpp"
#include "quintet/parallel/data_parallel/loader_for_mesh.hpp"
#include "quintet/parallel/train/evaluate.hpp"

namespace quintet::train {

namespace {

// Every check of the config that needs no layer yet; the builders check the rest the same way.
void validate(const TrainingConfig& c, const ModelCommunicators& comms, const Mesh& mesh) {
  const int tp = mesh.size(Axis::tp), cp = mesh.size(Axis::cp);
  c.model.validate(tp, cp);
  c.model.validate_experts(mesh.size(Axis::ep), mesh.size(Axis::etp));
  QUINTET_CHECK(c.micro_batch >= 1, "TrainingConfig: micro_batch {} must be >= 1", c.micro_batch);
  QUINTET_CHECK(c.microbatches >= 1, "TrainingConfig: microbatches {} must be >= 1",
                c.microbatches);
  QUINTET_CHECK(c.vpp >= 1, "TrainingConfig: vpp {} must be >= 1", c.vpp);
  QUINTET_CHECK(!c.model.sequence_parallel || (c.model.seq_len / cp) % tp == 0,
                "TrainingConfig: sequence parallelism splits each cp rank's seq_len {} / cp {} "
                "tokens over tp {}, which does not divide them; pick a seq_len that does, or "
                "turn it off",
                c.model.seq_len, cp, tp);
  const std::int64_t chunks = static_cast<std::int64_t>(mesh.size(Axis::pp)) * c.vpp;
  QUINTET_CHECK(c.model.layers >= chunks,
                "TrainingConfig: {} layers cannot fill pp {} x vpp {} = {} stages; use more "
                "layers or fewer stages",
                c.model.layers, mesh.size(Axis::pp), c.vpp, chunks);
  QUINTET_CHECK(comms.tp == nullptr || comms.tp->size() == tp,
                "TrainingConfig: the tp communicator has {} ranks, the mesh's tp axis {}; pass "
                "the mesh's (or a wrapper of it)",
                comms.tp == nullptr ? 0 : comms.tp->size(), tp);
  QUINTET_CHECK(comms.cp == nullptr || comms.cp->size() == cp,
                "TrainingConfig: the cp communicator has {} ranks, the mesh's cp axis {}; pass "
                "the mesh's (or a wrapper of it)",
                comms.cp == nullptr ? 0 : comms.cp->size(), cp);
  QUINTET_CHECK(comms.ep == nullptr || comms.ep->size() == mesh.size(Axis::ep),
                "TrainingConfig: the ep communicator has {} ranks, the mesh's ep axis {}; pass "
                "the mesh's (or a wrapper of it)",
                comms.ep == nullptr ? 0 : comms.ep->size(), mesh.size(Axis::ep));
  QUINTET_CHECK(comms.pp == nullptr || comms.pp->size() == mesh.size(Axis::pp),
                "TrainingConfig: the pp communicator has {} ranks, the mesh's pp axis {}; pass "
                "the mesh's (or a wrapper of it)",
                comms.pp == nullptr ? 0 : comms.pp->size(), mesh.size(Axis::pp));
  c.data_parallel.validate();
}

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// CPU time of the calling thread, in milliseconds.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// A non-owning stream on the same device and queue as s.
Stream view_of(const Stream& s) {
  if (s.device().is_cpu()) return Stream();
  if (s.handle() == nullptr) return Stream::default_stream(s.device());
  return Stream::borrow(s.device(), s.handle());
}

}  // namespace

std::int64_t TrainingConfig::global_batch(const Mesh& mesh) const {
  return micro_batch * microbatches * mesh.size(Axis::dp);
}

TrainingConfig TrainingConfig::from_job(const JobConfig& job) {
  TrainingConfig c;
  c.model = job.gpt_config();
  c.micro_batch = job.training.micro_batch;
  c.microbatches = static_cast<int>(job.accumulation());
  c.schedule = job.training.schedule;
  c.vpp = job.parallel.vpp;
  c.data_parallel = job.data_parallel();
  c.optimizer = job.optimizer();
  c.seed = job.training.seed;
  c.check_batches = job.training.check_batches;
  c.measure_communication = true;
  return c;
}

TrainingModel::TrainingModel(const JobConfig& job, Mesh& mesh, const Stream& stream,
                             const ModelCommunicators& comms)
    : TrainingModel(TrainingConfig::from_job(job), mesh, stream, comms) {}

TrainingModel::TrainingModel(const TrainingConfig& config, Mesh& mesh, const Stream& stream,
                             const ModelCommunicators& comms)
    : config_(config), comms_(comms), mesh_(mesh), stream_(view_of(stream)) {
  validate(config_, comms_, mesh_);
  pipeline::Schedule schedule =
      pipeline::make_schedule(config_.schedule, mesh_.size(Axis::pp), config_.vpp,
                              config_.microbatches, config_.schedule_costs);
  const std::vector<model::ChunkSpec> chunks =
      model::split_into_chunks(config_.model, schedule.num_stages());
  // Each axis's communicator: the caller's or the mesh's, through a timing wrapper when measured.
  auto comm_of = [this](Communicator* given, Axis axis,
                        std::optional<overlap::TimedCommunicator>& timed) -> Communicator& {
    Communicator& c = given != nullptr ? *given : mesh_.comm(axis);
    if (!config_.measure_communication || c.size() == 1) return c;
    return timed.emplace(c, overlap::TimedCommunicator::Measure::from_wait);
  };
  Communicator& tp = comm_of(comms_.tp, Axis::tp, timed_tp_);
  Communicator& cp = comm_of(comms_.cp, Axis::cp, timed_cp_);
  Communicator& ep = comm_of(comms_.ep, Axis::ep, timed_ep_);
  Communicator& pp = comm_of(comms_.pp, Axis::pp, timed_pp_);
  const model::ModelGroups groups{&tp, &cp, &ep, &mesh_.comm(Axis::etp),
                                  &mesh_.comm(Axis::tp_dp_cp)};
  std::vector<pipeline::StageModule> modules;
  for (int s : schedule.stages_of(mesh_.rank(Axis::pp))) {
    TrainingStage st;
    st.stage = s;
    st.chunk = model::build_gpt_chunk(config_.model, groups, chunks[static_cast<std::size_t>(s)]);
    st.store =
        std::make_unique<nn::ParameterStore>(*st.chunk, config_.model.dtype, stream_, config_.seed);
    st.data_parallel = std::make_unique<data_parallel::DataParallel>(
        *st.store, mesh_, config_.data_parallel, stream_);
    st.optimizer = std::make_unique<data_parallel::DistributedOptimizer>(
        *st.data_parallel, config_.optimizer, stream_);
    modules.push_back({s, st.chunk.get(), st.data_parallel.get()});
    optimizers_.push_back(st.optimizer.get());
    stages_.push_back(std::move(st));
  }
  const int tp_size = mesh_.size(Axis::tp);
  const std::int64_t mine = config_.model.seq_len / mesh_.size(Axis::cp);  // this cp rank's
  const std::int64_t seq = config_.model.sequence_parallel ? mine / tp_size : mine;
  executor_ = std::make_unique<pipeline::PipelineExecutor>(
      std::move(schedule), pp, std::move(modules),
      pipeline::ExecutorConfig{{config_.micro_batch, seq, config_.model.hidden},
                               config_.model.dtype});
  if (stream_.device().is_cuda()) {
    span_start_ = Event(stream_.device(), true);
    span_end_ = Event(stream_.device(), true);
  }
}

TrainingModel::~TrainingModel() = default;

data::LoaderConfig TrainingModel::loader_config(data::LoaderConfig base) const {
  base.batch_size = config_.micro_batch;
  base.seq_len = config_.model.seq_len;
  base.device = stream_.device();
  return data_parallel::loader_config_for(mesh_, base);
}

void TrainingModel::check_loader(const data::DataLoader& loader, const char* who) const {
  const data::LoaderConfig& lc = loader.config();
  QUINTET_CHECK(lc.batch_size == config_.micro_batch && lc.seq_len == config_.model.seq_len,
                "TrainingModel::{}: the loader makes [{}, {}] batches, the model takes "
                "microbatches of [{}, {}] (micro_batch, seq_len); build the loader from "
                "model.loader_config()",
                who, lc.batch_size, lc.seq_len, config_.micro_batch, config_.model.seq_len);
  QUINTET_CHECK(lc.dp_rank == mesh_.rank(Axis::dp) && lc.dp_size == mesh_.size(Axis::dp),
                "TrainingModel::{}: the loader reads for data-parallel rank {} of {}, but this "
                "rank is rank {} of {} on the mesh's dp axis, so the ranks of one replica would "
                "train on different data; build the loader from model.loader_config()",
                who, lc.dp_rank, lc.dp_size, mesh_.rank(Axis::dp), mesh_.size(Axis::dp));
  QUINTET_CHECK(lc.device == stream_.device(),
                "TrainingModel::{}: the loader delivers to {}, the model runs on {}", who,
                lc.device.str(), stream_.device().str());
}

pipeline::MicrobatchData TrainingModel::next_microbatch(data::DataLoader& loader) {
  data::Batch batch = loader.next(stream_);
  batch.wait(stream_);
  if (config_.check_batches)
    data_parallel::check_same_batch(mesh_.comm(Axis::tp), batch.tokens, stream_);
  return local_part({batch.tokens, batch.targets});
}

StepStats TrainingModel::step(data::DataLoader& loader) {
  check_loader(loader, "step");
  // Input time: the host blocked in next(), and on a GPU the stream's wait for the batch's copy
  // (timing events around it, read once the step has synchronised the stream).
  const bool gpu = stream_.device().is_cuda();
  double blocked_ms = 0.0;
  std::size_t marks = 0;
  StepStats r = step([&](int) {
    const auto t0 = Clock::now();
    data::Batch batch = loader.next(stream_);
    blocked_ms += ms_since(t0);
    if (!gpu) return pipeline::MicrobatchData{batch.tokens, batch.targets};
    if (marks == input_marks_.size()) {
      input_marks_.emplace_back(Event(stream_.device(), true), Event(stream_.device(), true));
    }
    auto& [before, after] = input_marks_[marks++];
    before.record(stream_);
    batch.wait(stream_);
    after.record(stream_);
    return pipeline::MicrobatchData{batch.tokens, batch.targets};
  });
  double copy_wait_ms = 0.0;
  for (std::size_t i = 0; i < marks; ++i) {
    input_marks_[i].second.synchronize();
    copy_wait_ms += input_marks_[i].second.elapsed_ms(input_marks_[i].first);
  }
  r.time.input_ms = blocked_ms + copy_wait_ms;
  r.time.busy_ms = std::max(0.0, r.time.busy_ms - copy_wait_ms);  // the span held the wait
  return r;
}

double TrainingModel::evaluate(data::DataLoader& loader, std::int64_t batches) {
  check_loader(loader, "evaluate");
  const std::int64_t microbatches = batches * config_.microbatches;
  QUINTET_CHECK(batches >= 1 && microbatches <= std::numeric_limits<int>::max(),
                "TrainingModel::evaluate: {} batches; expected 1 .. {}", batches,
                std::numeric_limits<int>::max() / config_.microbatches);
  return train::evaluate(
      *executor_, mesh_, static_cast<int>(microbatches),
      [&loader, this](int) { return next_microbatch(loader); }, stream_);
}

pipeline::MicrobatchData TrainingModel::local_part(pipeline::MicrobatchData d) const {
  const int cp = mesh_.size(Axis::cp);
  if (cp == 1) return d;
  const int r = mesh_.rank(Axis::cp);
  if (d.tokens.defined()) d.tokens = context::cp_split(d.tokens, 1, cp, r, stream_);
  if (d.targets.defined()) d.targets = context::cp_split(d.targets, 1, cp, r, stream_);
  return d;
}

StepStats TrainingModel::step(const std::function<pipeline::MicrobatchData(int)>& data) {
  for (auto* t : {&timed_tp_, &timed_cp_, &timed_ep_, &timed_pp_}) {
    if (*t) (*t)->reset();  // the window is this step
  }
  const bool gpu = stream_.device().is_cuda();
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_ms();
  if (gpu) span_start_.record(stream_);
  // data gives whole sequences; each cp rank keeps its chunks of them.
  StepStats r = train::step(
      *executor_, stages_, mesh_,
      [&data, this](int m) {
        pipeline::MicrobatchData d = data(m);
        if (config_.check_batches)
          data_parallel::check_same_batch(mesh_.comm(Axis::tp), d.tokens, stream_);
        return local_part(std::move(d));
      },
      stream_);
  const auto take = [](std::optional<overlap::TimedCommunicator>& t, AxisCommunication& out) {
    if (!t) return;
    const overlap::TimedCommunicator::Stats s = t->take_stats();
    out = {s.comm_ms, s.exposed_ms, s.bytes, s.ops};
  };
  take(timed_tp_, r.tp);
  take(timed_cp_, r.cp);
  take(timed_ep_, r.ep);
  take(timed_pp_, r.pp);
  // The step's time (bound_by.hpp): on a GPU the stream's span from before its first work to after
  // its last, its measured waits taken out; on the CPU the thread's CPU time.
  if (gpu) {
    span_end_.record(stream_);
    span_end_.synchronize();  // at once: the step has synchronised the stream for the loss
    const double span = span_end_.elapsed_ms(span_start_);
    const double waits =
        r.dp.exposed_ms + r.tp.exposed_ms + r.cp.exposed_ms + r.ep.exposed_ms + r.pp.exposed_ms;
    r.time.wall_ms = ms_since(t0);
    r.time.busy_ms = std::max(0.0, span - waits);
    r.time.host_ms = std::max(0.0, r.time.wall_ms - span);
  } else {
    r.time.busy_ms = thread_cpu_ms() - cpu0;
    r.time.wall_ms = ms_since(t0);
  }
  return r;
}

void TrainingModel::set_lr(float lr) {
  for (data_parallel::DistributedOptimizer* o : optimizers_) o->set_lr(lr);
}

std::int64_t TrainingModel::steps() const { return optimizers_.front()->steps(); }

}  // namespace quintet::train
