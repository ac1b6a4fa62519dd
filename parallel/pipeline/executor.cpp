// The pipeline executor: one walk over the rank's actions per step.
#include "quintet/parallel/pipeline/executor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <utility>

#include "quintet/nn/ops.hpp"
#include "quintet/parallel/pipeline/simulator.hpp"

namespace quintet::pipeline {

namespace {
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

bool is_backward(ActionKind k) { return k == ActionKind::backward || k == ActionKind::input_grad; }
// The actions whose backward marks gradients ready (all of a (stage, microbatch)'s marks happen at
// its B, or at its W when split).
bool marks_gradients(ActionKind k) {
  return k == ActionKind::backward || k == ActionKind::weight_grad;
}
// Microbatch data, fetched in increasing order when a first or last stage first needs it.
class Fetcher {
 public:
  explicit Fetcher(const std::function<MicrobatchData(int)>& data) : data_(data) {}
  const MicrobatchData& operator()(int mb) {
    while (next_ <= mb) {
      fetched_.emplace(next_, data_(next_));
      ++next_;
    }
    return fetched_.at(mb);
  }
  // Forgets the microbatches before mb (their forwards are done).
  void drop_before(int mb) {
    std::erase_if(fetched_, [mb](const auto& f) { return f.first < mb; });
  }

 private:
  const std::function<MicrobatchData(int)>& data_;
  std::map<int, MicrobatchData> fetched_;
  int next_ = 0;
};

}  // namespace

// The state of one (stage, microbatch) during a step.
struct PipelineExecutor::Slot {
  std::unique_ptr<nn::Context> ctx;
  Tensor input;        // the stage's input (received or handed over)
  Work input_recv;     // the batch that receives input, when it travels
  Tensor output;       // the stage's output, until its send is issued
  Tensor grad_output;  // d(output): received or handed over (none on the last stage)
  Work grad_recv;
  Tensor grad_input;  // d(input), until its send is issued
};

PipelineExecutor::PipelineExecutor(Schedule schedule, Communicator& pp,
                                   std::vector<StageModule> stages, ExecutorConfig config)
    : schedule_(std::move(schedule)), pp_(&pp), stages_(std::move(stages)), config_(config) {
  check_schedule(schedule_);
  QUINTET_CHECK(pp.size() == schedule_.pp,
                "PipelineExecutor: the schedule is for pp = {} ranks, but the pipeline "
                "communicator has {}",
                schedule_.pp, pp.size());
  rank_ = pp.rank();
  const std::vector<int> want = schedule_.stages_of(rank_);
  std::vector<int> got;
  for (const StageModule& s : stages_) {
    QUINTET_CHECK(s.chunk != nullptr, "PipelineExecutor: stage {} has no model chunk", s.stage);
    got.push_back(s.stage);
  }
  std::sort(got.begin(), got.end());
  QUINTET_CHECK(got == want,
                "PipelineExecutor: pipeline rank {} holds stages [{}] in this schedule, but was "
                "given chunks for stages [{}]",
                rank_, fmt::join(want, ", "), fmt::join(got, ", "));
  QUINTET_CHECK(config_.activation_shape.size() >= 2 && shape_numel(config_.activation_shape) > 0,
                "PipelineExecutor: activation_shape {} must be [batch, seq, ...] with no zero",
                shape_str(config_.activation_shape));
  last_marking_.assign(static_cast<std::size_t>(schedule_.num_stages()), kNone);
  const auto& actions = schedule_.actions[static_cast<std::size_t>(rank_)];
  for (std::size_t i = 0; i < actions.size(); ++i) {
    if (marks_gradients(actions[i].kind)) {
      last_marking_[static_cast<std::size_t>(actions[i].stage)] = i;
    }
  }
}

PipelineExecutor::~PipelineExecutor() = default;

bool PipelineExecutor::local_stage(int stage) const {
  return stage >= 0 && stage < schedule_.num_stages() &&
         schedule_.stage_rank[static_cast<std::size_t>(stage)] == rank_;
}

const StageModule& PipelineExecutor::stage_module(int stage) const {
  for (const StageModule& s : stages_) {
    if (s.stage == stage) return s;
  }
  QUINTET_THROW(InvalidArgument, "PipelineExecutor: rank {} holds no stage {}", rank_, stage);
}

Tensor PipelineExecutor::run(const std::function<MicrobatchData(int)>& data, float loss_scale,
                             const Stream& stream) {
  const int last_stage = schedule_.num_stages() - 1;
  const auto& actions = schedule_.actions[static_cast<std::size_t>(rank_)];
  const auto& stage_rank = schedule_.stage_rank;
  std::map<std::pair<int, int>, Slot> slots;
  auto slot_of = [&](int stage, int mb) -> Slot& { return slots[{stage, mb}]; };
  const auto t0 = std::chrono::steady_clock::now();
  auto now_ms = [&t0] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  stats_ = ExecutorStats{};
  int in_flight = 0;
  for (const StageModule& sm : stages_) {
    if (sm.sync) sm.sync->begin_step();
  }

  Fetcher data_of(data);

  Tensor loss_sum;
  // The batches issued and not yet seen complete, with their send buffers, which stay alive until
  // then (released as soon as the host sees the batch done, so a sent activation is not held for
  // the rest of the step).
  struct Issued {
    Work work;
    std::vector<Tensor> sends;
  };
  std::deque<Issued> issued;
  std::vector<P2POp> batch;        // the batch being built
  std::vector<Work*> batch_recvs;  // where its receives' Work goes once issued
  auto issue = [&] {
    if (batch.empty()) return;
    Issued b{pp_->p2p(batch, stream), {}};
    for (const P2POp& op : batch) {
      if (op.kind == P2POp::Kind::send) b.sends.push_back(op.tensor);
    }
    for (Work* r : batch_recvs) *r = b.work;
    issued.push_back(std::move(b));
    batch.clear();
    batch_recvs.clear();
  };
  auto release_done = [&] {
    std::erase_if(issued, [](const Issued& b) { return b.work.is_completed(); });
  };
  auto buffer = [&] {
    return Tensor::empty(config_.activation_shape, config_.activation_dtype, stream.device(),
                         stream);
  };

  for (std::size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int s = a.stage, m = a.microbatch;
    Slot& sl = slot_of(s, m);
    if (!is_compute(a.kind)) {
      switch (a.kind) {
        case ActionKind::send_forward:
          batch.push_back(P2POp::send(sl.output, stage_rank[s + 1]));
          sl.output = Tensor();
          break;
        case ActionKind::recv_forward:
          sl.input = buffer();
          batch.push_back(P2POp::recv(sl.input, stage_rank[s - 1]));
          batch_recvs.push_back(&sl.input_recv);
          break;
        case ActionKind::send_backward:
          batch.push_back(P2POp::send(sl.grad_input, stage_rank[s - 1]));
          sl.grad_input = Tensor();
          break;
        default:  // recv_backward
          sl.grad_output = buffer();
          batch.push_back(P2POp::recv(sl.grad_output, stage_rank[s + 1]));
          batch_recvs.push_back(&sl.grad_recv);
          break;
      }
      // A batch is a maximal run of consecutive transfers.
      if (i + 1 == actions.size() || is_compute(actions[i + 1].kind)) issue();
      continue;
    }

    release_done();
    const StageModule& sm = stage_module(s);
    if (marks_gradients(a.kind) && sm.sync) sm.sync->set_last_microbatch(i == last_marking_[s]);
    // The receive this action consumes (a no-op for a local hand-over or the first stage).
    if (a.kind == ActionKind::forward && s > 0) sl.input_recv.wait(stream);
    if (is_backward(a.kind) && s != last_stage) sl.grad_recv.wait(stream);
    double start = 0.0;
    if (config_.record_timeline) {
      stream.synchronize();
      start = now_ms();
    }
    if (a.kind == ActionKind::forward) {
      sl.ctx = std::make_unique<nn::Context>(stream);
      sl.ctx->set_loss_scale(loss_scale);
      stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight);
      const Tensor x = s == 0 ? data_of(m).tokens : std::move(sl.input);
      if (s == last_stage) {
        sl.ctx->set_targets(data_of(m).targets, loss_scale);
        const Tensor loss = sm.chunk->forward(*sl.ctx, x);
        if (!loss_sum.defined()) {
          loss_sum = Tensor::empty({}, DType::f32, stream.device(), stream);
          loss_sum.fill_(0.0, stream);
        }
        nn::add_(loss_sum, loss, loss_scale, stream);
      } else {
        Tensor y = sm.chunk->forward(*sl.ctx, x);
        (local_stage(s + 1) ? slot_of(s + 1, m).input : sl.output) = std::move(y);
      }
    } else if (is_backward(a.kind)) {
      const Tensor dy = s != last_stage ? std::move(sl.grad_output) : Tensor();
      const bool split = a.kind == ActionKind::input_grad;
      sl.ctx->set_defer_weight_gradients(split);
      Tensor dx = sm.chunk->backward(*sl.ctx, dy);
      sl.ctx->set_defer_weight_gradients(false);
      if (!split) {  // the saved activations are no longer needed
        sl.ctx.reset();
        --in_flight;
      }
      if (s > 0)
        (local_stage(s - 1) ? slot_of(s - 1, m).grad_output : sl.grad_input) = std::move(dx);
    } else {  // weight_grad
      sl.ctx->run_deferred_gradients();
      sl.ctx.reset();
      --in_flight;
    }
    if (config_.record_timeline) {
      stream.synchronize();
      const double end = now_ms();
      stats_.timeline.push_back({a, start, end});
      stats_.busy_ms += end - start;
    }
  }
  issue();
  for (Issued& b : issued) b.work.wait(stream);
  issued.clear();
  stats_.step_ms = now_ms();
  return loss_sum;
}

Tensor PipelineExecutor::forward(int microbatches, const std::function<MicrobatchData(int)>& data,
                                 const Stream& stream) {
  QUINTET_CHECK(microbatches >= 1, "PipelineExecutor::forward: {} microbatches; give at least one",
                microbatches);
  const int pp = schedule_.pp, last_stage = schedule_.num_stages() - 1;
  const auto peer = [this](int stage) {
    return schedule_.stage_rank[static_cast<std::size_t>(stage)];
  };
  Fetcher data_of(data);
  std::map<std::pair<int, int>, Tensor> handed;  // (stage, microbatch): from a stage on this rank
  std::deque<std::pair<Work, Tensor>> sends;     // issued, with their buffers
  Tensor loss_sum;
  // Blocks (group, stage) in order; each block's receives are posted before its first forward.
  for (int g0 = 0; g0 < microbatches; g0 += pp) {
    const int g1 = std::min(microbatches, g0 + pp);
    data_of.drop_before(g0);
    for (int s = 0; s <= last_stage; ++s) {
      if (!local_stage(s)) continue;
      const StageModule& sm = stage_module(s);
      const bool receives = s > 0 && !local_stage(s - 1);
      std::vector<std::pair<Work, Tensor>> received;
      for (int m = g0; receives && m < g1; ++m) {
        Tensor x = Tensor::empty(config_.activation_shape, config_.activation_dtype,
                                 stream.device(), stream);
        received.emplace_back(pp_->p2p({P2POp::recv(x, peer(s - 1))}, stream), x);
      }
      for (int m = g0; m < g1; ++m) {
        Tensor x;
        if (s == 0) {
          x = data_of(m).tokens;
        } else if (receives) {
          auto& [work, buffer] = received[static_cast<std::size_t>(m - g0)];
          work.wait(stream);
          x = std::move(buffer);
        } else {
          x = std::move(handed.at({s, m}));
          handed.erase({s, m});
        }
        nn::Context ctx(stream);
        ctx.set_forward_only(true);
        if (s == last_stage) {
          ctx.set_targets(data_of(m).targets);
          const Tensor loss = sm.chunk->forward(ctx, x);
          if (!loss_sum.defined()) {
            loss_sum = Tensor::empty({}, DType::f32, stream.device(), stream);
            loss_sum.fill_(0.0, stream);
          }
          nn::add_(loss_sum, loss, 1.0f, stream);
          continue;
        }
        Tensor y = sm.chunk->forward(ctx, x);
        if (local_stage(s + 1)) {
          handed[{s + 1, m}] = std::move(y);
          continue;
        }
        // At most 2 pp sends in flight (their buffers held): a first stage runs ahead no further.
        std::erase_if(sends, [](const auto& w) { return w.first.is_completed(); });
        while (static_cast<int>(sends.size()) >= 2 * pp) {
          sends.front().first.wait(stream);
          sends.pop_front();
        }
        Work w = pp_->p2p({P2POp::send(y, peer(s + 1))}, stream);
        sends.emplace_back(std::move(w), std::move(y));
      }
    }
  }
  for (auto& w : sends) w.first.wait(stream);
  return loss_sum;
}

}  // namespace quintet::pipeline
