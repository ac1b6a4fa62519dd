// The pipeline executor (quintet/parallel/pipeline/executor.hpp) under mpirun, CPU, f32: one
// training step of the library GPT cut into pp * vpp stages, under every schedule, combined with
// tp (with and without sequence parallelism) and dp (ZeRO 0 and 1), equals the whole model on one
// rank over the same global batch: the loss, every gradient after the data-parallel reduction,
// and (with ZeRO-1) the parameters after an optimizer step; and its forward-only evaluation
// (train::evaluate) the whole model's mean loss. Which layouts run depends on the job's
// size (2, 3, 4 or 8 ranks). Bad inputs are refused before any communication.
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/collectives/mpi.hpp"
#include "quintet/parallel/data_parallel/distributed_optimizer.hpp"
#include "quintet/parallel/model/gpt.hpp"
#include "quintet/parallel/pipeline/executor.hpp"
#include "quintet/parallel/pipeline/simulator.hpp"
#include "quintet/parallel/train/evaluate.hpp"
#include "quintet/parallel/train/step.hpp"
#include "support/nn_adamw.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace tp_test;
using pipeline::ScheduleKind;

namespace {

const Stream kCpu;
constexpr std::uint64_t kSeed = 7;
constexpr std::int64_t kRows = 2;  // sequences per microbatch

struct Case {
  int pp, vpp, tp, dp;
  ScheduleKind kind;
  int micro;  // microbatches per step on each dp rank
  bool sp = false;
  int zero = 0;
  bool tied = false;  // tied embeddings: the first and the last stage each hold the table
  std::string str() const {
    return fmt::format("pp {} vpp {} tp {} dp {} {} m {}{} zero {}{}", pp, vpp, tp, dp,
                       pipeline::schedule_kind_name(kind), micro, sp ? " sp" : "", zero,
                       tied ? " tied" : "");
  }
};

std::vector<Case> cases_for(int world) {
  std::vector<Case> out;
  auto every_schedule = [&](int pp) {
    out.push_back({pp, 1, 1, 1, ScheduleKind::gpipe, pp + 1});
    out.push_back({pp, 1, 1, 1, ScheduleKind::one_f_one_b, 2 * pp});
    out.push_back({pp, 1, 1, 1, ScheduleKind::zb_h1, 2 * pp});
    out.push_back({pp, 2, 1, 1, ScheduleKind::interleaved, 2 * pp});
    out.push_back({pp, 2, 1, 1, ScheduleKind::zb_v, 2 * pp});
  };
  if (world == 2 || world == 3 || world == 4) every_schedule(world);
  if (world == 2) {  // tied across ranks (1F1B), and on one rank (ZB-V's V puts both ends on 0)
    out.push_back({2, 1, 1, 1, ScheduleKind::one_f_one_b, 3, false, 0, true});
    out.push_back({2, 2, 1, 1, ScheduleKind::zb_v, 2, false, 0, true});
  }
  if (world == 3) out.push_back({3, 2, 1, 1, ScheduleKind::interleaved, 6, false, 0, true});
  if (world == 4) {
    for (bool sp : {false, true}) {
      out.push_back({2, 1, 2, 1, ScheduleKind::one_f_one_b, 4, sp});
      out.push_back({2, 1, 2, 1, ScheduleKind::zb_h1, 4, sp});
    }
    out.push_back({2, 1, 1, 2, ScheduleKind::one_f_one_b, 4, false, 0});
    out.push_back({2, 1, 1, 2, ScheduleKind::one_f_one_b, 4, false, 1});
    out.push_back({2, 2, 1, 2, ScheduleKind::interleaved, 4, false, 1});
    out.push_back({2, 1, 1, 2, ScheduleKind::zb_h1, 3, false, 2});
    out.push_back({2, 1, 2, 1, ScheduleKind::zb_h1, 2, true, 0, true});
    out.push_back({2, 1, 1, 2, ScheduleKind::one_f_one_b, 3, false, 1, true});
    out.push_back({2, 2, 1, 2, ScheduleKind::zb_v, 2, false, 2, true});
  }
  if (world == 8) {
    out.push_back({2, 1, 2, 2, ScheduleKind::one_f_one_b, 4, true, 2, true});
    out.push_back({2, 1, 2, 2, ScheduleKind::one_f_one_b, 4, false, 0});
    out.push_back({2, 1, 2, 2, ScheduleKind::one_f_one_b, 4, true, 1});
    out.push_back({2, 2, 2, 2, ScheduleKind::zb_v, 4, true, 1});
    out.push_back({2, 2, 2, 2, ScheduleKind::interleaved, 4, false, 1});
  }
  return out;
}

model::GptConfig gpt_config(const Case& c) {
  return model::GptConfig{.layers = 2 * c.pp * c.vpp,
                          .hidden = 16,
                          .heads = 4,
                          .ffn_hidden = 32,
                          .vocab = 32,
                          .seq_len = 8,
                          .tied_embeddings = c.tied,
                          .init_std = 0.2f,
                          .proj_init_std = 0.1f,
                          .sequence_parallel = c.sp};
}

// Global microbatch g's data (the same on every rank that asks).
pipeline::MicrobatchData microbatch(const model::GptConfig& c, int g) {
  std::vector<std::int64_t> ids, targets;
  for (std::int64_t i = 0; i < kRows * c.seq_len; ++i) {
    ids.push_back((7 * g + 5 * i + 3) % c.vocab);
    targets.push_back((11 * g + 3 * i + 1) % c.vocab);
  }
  return {Tensor::from_vector(ids, {kRows, c.seq_len}),
          Tensor::from_vector(targets, {kRows, c.seq_len})};
}

nn::AdamWConfig adam() {
  nn::AdamWConfig a;
  a.hyper.lr = 1e-2f;
  // eps well above the smallest gradients (~1e-5), so that one step's value does not amplify
  // their f32 rounding (with eps << |g| an update is lr * sign(g), whatever g's precision).
  a.hyper.eps = 1e-3f;
  a.max_grad_norm = 0.0f;  // no clipping: each chunk's optimizer steps on its own
  return a;
}

void run_case(const Case& c, Communicator& world) {
  INFO(c.str());
  const Mesh mesh(Layout(ParallelConfig{.tp = c.tp, .dp = c.dp, .pp = c.pp}, world.size()), world);
  const model::GptConfig config = gpt_config(c);
  model::GptConfig ref_config = config;
  ref_config.sequence_parallel = false;
  const int pp_rank = mesh.rank(Axis::pp), dp_rank = mesh.rank(Axis::dp);
  const pipeline::Schedule schedule = pipeline::make_schedule(c.kind, c.pp, c.vpp, c.micro);
  const auto specs = model::split_into_chunks(config, c.pp * c.vpp);

  // This rank's stages: a chunk, its store, its data parallelism (and optimizer) each.
  std::vector<train::TrainingStage> held;
  std::vector<pipeline::StageModule> stages;
  data_parallel::DataParallelConfig dpc;
  dpc.zero_stage = c.zero;
  dpc.first_bucket_bytes = 512;
  dpc.bucket_bytes = 2048;
  for (int s : schedule.stages_of(pp_rank)) {
    train::TrainingStage h;
    h.stage = s;
    h.chunk = model::build_gpt_chunk(config, {&mesh.comm(Axis::tp)}, specs[s]);
    h.store = std::make_unique<nn::ParameterStore>(*h.chunk, DType::f32, kCpu, kSeed);
    h.data_parallel = std::make_unique<data_parallel::DataParallel>(*h.store, mesh, dpc, kCpu);
    if (c.zero > 0) {
      h.optimizer =
          std::make_unique<data_parallel::DistributedOptimizer>(*h.data_parallel, adam(), kCpu);
    }
    stages.push_back({s, h.chunk.get(), h.data_parallel.get()});
    held.push_back(std::move(h));
  }
  const std::int64_t seq = c.sp ? config.seq_len / c.tp : config.seq_len;
  pipeline::PipelineExecutor executor(schedule, mesh.comm(Axis::pp), stages,
                                      {{kRows, seq, config.hidden}, DType::f32, true});

  // The reference: the whole model on this rank over every dp rank's microbatches.
  auto solo = make_self_communicator(Device::cpu(), "solo");
  auto ref = model::build_gpt_chunk(ref_config, {solo.get()}, model::ChunkSpec::whole(ref_config));
  nn::ParameterStore ref_store(*ref, DType::f32, kCpu, kSeed);
  const int total = c.dp * c.micro;
  double ref_loss = 0.0;
  for (int g = 0; g < total; ++g) {
    const pipeline::MicrobatchData d = microbatch(config, g);
    nn::Context ctx(kCpu);
    ctx.set_targets(d.targets, 1.0f / static_cast<float>(total));
    ref_loss += ref->forward(ctx, d.tokens).item() / total;
    ref->backward(ctx, Tensor());
  }

  // Evaluation first (it changes nothing): train::evaluate over micro + 1 microbatches per replica
  // (not the schedule's count) equals the whole model's mean forward loss over the same ones.
  const int eval_micro = c.micro + 1;
  double ref_eval = 0.0;
  for (int g = 0; g < c.dp * eval_micro; ++g) {
    const pipeline::MicrobatchData d = microbatch(config, 1000 + g);
    nn::Context ctx(kCpu);
    ctx.set_forward_only(true);
    ctx.set_targets(d.targets);
    ref_eval += ref->forward(ctx, d.tokens).item() / (c.dp * eval_micro);
  }
  int eval_fetched = 0;
  const double eval = train::evaluate(
      executor, mesh, eval_micro,
      [&](int m) {
        CHECK(m == eval_fetched++);
        return microbatch(config, 1000 + dp_rank * eval_micro + m);
      },
      kCpu);

  int fetched = 0;
  auto data = [&](int m) {
    CHECK(m == fetched++);  // in increasing order, once each
    return microbatch(config, dp_rank * c.micro + m);
  };
  // ZeRO 0: the executor's step and the gradients finished (train::finalize_gradients: the
  // data-parallel reduction, the tied embedding's sum), then the gradients. ZeRO 1, 2: the
  // library's whole optimizer step (train::step: the schedule, the gradients finished, the joint
  // optimizer step, the global loss), then the parameters.
  Tensor loss;
  double step_loss = 0.0;
  if (c.zero == 0) {
    loss = executor.run(data, 1.0f / static_cast<float>(c.micro), kCpu);
    train::finalize_gradients(executor, held, mesh, kCpu);
  } else {
    step_loss = train::step(executor, held, mesh, data, kCpu).loss;
    for (train::TrainingStage& h : held) h.optimizer->wait_for_parameters(kCpu);
  }
  agreed(world, [&] {
    const bool last = schedule.stage_rank.back() == pp_rank;
    CHECK(std::abs(eval - ref_eval) <= 1e-5 * std::abs(ref_eval));
    if (c.zero > 0) {  // on every rank
      CHECK(std::abs(step_loss - ref_loss) <= 1e-5 * std::abs(ref_loss));
    } else {
      REQUIRE(loss.defined() == last);
    }
    if (last && c.zero == 0) {
      Tensor mean = loss.clone();
      mesh.comm(Axis::dp).all_reduce(mean, ReduceOp::avg).wait();
      CHECK(std::abs(mean.item() - ref_loss) <= 1e-5 * std::abs(ref_loss));
    }
    // The measured step: every compute action of this rank's list once, in order, inside the
    // step; as many activations held at once as the simulator counts from the same order.
    const pipeline::ExecutorStats& stats = executor.last_step_stats();
    std::vector<pipeline::Action> computed;
    for (const auto& a : schedule.actions[static_cast<std::size_t>(pp_rank)]) {
      if (pipeline::is_compute(a.kind)) computed.push_back(a);
    }
    REQUIRE(stats.timeline.size() == computed.size());
    double previous_end = 0.0;
    for (std::size_t i = 0; i < computed.size(); ++i) {
      CHECK(stats.timeline[i].action == computed[i]);
      CHECK(stats.timeline[i].start >= previous_end);
      CHECK(stats.timeline[i].end >= stats.timeline[i].start);
      previous_end = stats.timeline[i].end;
    }
    CHECK(previous_end <= stats.step_ms);
    CHECK(stats.busy_ms <= stats.step_ms);
    CHECK(stats.peak_in_flight == pipeline::simulate(schedule).peak_in_flight[pp_rank]);
    const bool holds_ends = last || schedule.stage_rank.front() == pp_rank;
    CHECK((fetched == c.micro) == holds_ends);
    CHECK((fetched == 0) == !holds_ends);

    if (c.zero == 0) {
      for (train::TrainingStage& h : held) {
        for (auto& [name, p] : h.chunk->named_parameters()) {
          require_close(p->grad(), shard_of(ref_store.find(name).grad(), *p), "gradient of " + name,
                        2e-6, 1e-5);
        }
      }
      return;
    }
    // ZeRO 1, 2: the reference's optimizer step, then the parameters.
    nn::AdamW ref_opt(ref_store, adam(), kCpu);
    ref_opt.step(kCpu);
    for (train::TrainingStage& h : held) {
      for (auto& [name, p] : h.chunk->named_parameters()) {
        require_close(p->data(), shard_of(ref_store.find(name).data(), *p), "value of " + name,
                      2e-6, 1e-5);
      }
    }
  });
}

}  // namespace

TEST_CASE("pp: one step under every schedule and layout equals one rank", "[pp]") {
  World world = cpu_world();
  const auto cases = cases_for(world.size());
  REQUIRE(!cases.empty());
  for (const Case& c : cases) run_case(c, world.comm());
}

TEST_CASE("pp: bad inputs are refused before any communication", "[pp]") {
  World world = cpu_world();
  const int n = world.size();
  const Mesh mesh(Layout(ParallelConfig{.pp = n}, n), world.comm());
  const pipeline::Schedule good = pipeline::make_schedule(ScheduleKind::one_f_one_b, n, 1, n);
  model::GptConfig config = gpt_config({n, 1, 1, 1, ScheduleKind::one_f_one_b, n});
  const auto specs = model::split_into_chunks(config, n);
  auto chunk = model::build_gpt_chunk(config, {&mesh.comm(Axis::tp)}, specs[mesh.rank(Axis::pp)]);
  nn::ParameterStore store(*chunk, DType::f32, kCpu, kSeed);
  const pipeline::ExecutorConfig ec{{kRows, config.seq_len, config.hidden}, DType::f32};
  const int other = (mesh.rank(Axis::pp) + 1) % n;
  // Chunks for another rank's stage.
  REQUIRE_THROWS_QUINTET(
      pipeline::PipelineExecutor(good, mesh.comm(Axis::pp), {{other, chunk.get()}}, ec),
      InvalidArgument, fmt::format("holds stages [{}]", mesh.rank(Axis::pp)));
  // A schedule for another pipeline size.
  const pipeline::Schedule wrong = pipeline::make_schedule(ScheduleKind::gpipe, n + 1, 1, 2);
  REQUIRE_THROWS_QUINTET(pipeline::PipelineExecutor(wrong, mesh.comm(Axis::pp),
                                                    {{mesh.rank(Axis::pp), chunk.get()}}, ec),
                         InvalidArgument, "schedule is for pp");
  // A schedule whose first send on rank 0 was removed: refused, naming the rank and the action.
  pipeline::Schedule broken = good;
  auto& a0 = broken.actions[0];
  for (std::size_t i = 0; i < a0.size(); ++i) {
    if (a0[i].kind == pipeline::ActionKind::send_forward) {
      a0.erase(a0.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  REQUIRE_THROWS_QUINTET(pipeline::PipelineExecutor(broken, mesh.comm(Axis::pp),
                                                    {{mesh.rank(Axis::pp), chunk.get()}}, ec),
                         InvalidArgument, "on rank 0, 0SF0 must come after 0F0");
  // train::step over stages that are not the executor's, or without an optimizer for a stage, or
  // with one over another DataParallel.
  pipeline::PipelineExecutor plain(good, mesh.comm(Axis::pp), {{mesh.rank(Axis::pp), chunk.get()}},
                                   ec);
  auto no_data = [&](int m) { return microbatch(config, m); };
  REQUIRE_THROWS_QUINTET(train::step(plain, {}, mesh, no_data, kCpu), InvalidArgument,
                         "0 stages given for the 1 stages");
  {
    // (Declared first, so that it outlives the optimizer built over it below.)
    auto other_chunk =
        model::build_gpt_chunk(config, {&mesh.comm(Axis::tp)}, specs[mesh.rank(Axis::pp)]);
    nn::ParameterStore other_store(*other_chunk, DType::f32, kCpu, kSeed);
    data_parallel::DataParallel other_dp(other_store, mesh, data_parallel::DataParallelConfig{},
                                         kCpu);
    std::vector<train::TrainingStage> stages(1);
    stages[0].stage = mesh.rank(Axis::pp);
    stages[0].chunk =
        model::build_gpt_chunk(config, {&mesh.comm(Axis::tp)}, specs[mesh.rank(Axis::pp)]);
    stages[0].store =
        std::make_unique<nn::ParameterStore>(*stages[0].chunk, DType::f32, kCpu, kSeed);
    stages[0].data_parallel = std::make_unique<data_parallel::DataParallel>(
        *stages[0].store, mesh, data_parallel::DataParallelConfig{}, kCpu);
    // Another chunk than the executor's.
    REQUIRE_THROWS_QUINTET(train::step(plain, stages, mesh, no_data, kCpu), InvalidArgument,
                           "is not the executor's stage");
    REQUIRE_THROWS_QUINTET(train::finalize_gradients(plain, stages, mesh, kCpu), InvalidArgument,
                           "is not the executor's stage");
    // The executor's chunk and DataParallel, without an optimizer, then with one over another
    // DataParallel.
    pipeline::PipelineExecutor with_dp(
        good, mesh.comm(Axis::pp),
        {{mesh.rank(Axis::pp), stages[0].chunk.get(), stages[0].data_parallel.get()}}, ec);
    REQUIRE_THROWS_QUINTET(train::step(with_dp, stages, mesh, no_data, kCpu), InvalidArgument,
                           "has no optimizer over its DataParallel");
    stages[0].optimizer =
        std::make_unique<data_parallel::DistributedOptimizer>(other_dp, adam(), kCpu);
    REQUIRE_THROWS_QUINTET(train::step(with_dp, stages, mesh, no_data, kCpu), InvalidArgument,
                           "has no optimizer over its DataParallel");
  }
  // Layers that do not split into the stages.
  REQUIRE_THROWS_QUINTET(model::split_into_chunks(config, static_cast<int>(config.layers) + 1),
                         InvalidArgument, "chunks for");
}
