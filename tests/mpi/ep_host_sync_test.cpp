// The host synchronisations of the MoE layer (quintet/parallel/expert/token_dispatcher.hpp), by
// quintet::host_sync_count on the CPU, which counts where a GPU run would wait: with an exchange
// (ep 2, or etp 2 at ep 1) forward makes exactly one, the copy of the exchanged counts; at ep = 1
// (tp 1, tp 2 with and without sequence parallelism; dropless and with capacity dropping; the
// experts in bf16/f32 or FP8) there is no count exchange and forward makes none, the experts'
// grouped GEMMs reading their row offsets on the device (moe_layer.hpp); backward makes none;
// finish_step makes one, the step's end. The statistics stay right without the per-forward copies:
// the load and the drops counted on the device equal a one-rank layer's.
#include <memory>
#include <string>
#include <vector>

#include "quintet/nn/context.hpp"
#include "quintet/parallel/expert/moe_layer.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/mesh.hpp"
#include "tp_support.hpp"

using namespace quintet;
using namespace quintet::expert;
using namespace tp_test;

namespace {

const Stream kCpu;
constexpr std::int64_t kB = 2, kS = 8, kD = 16, kF = 12;

struct Case {
  std::string name;
  ParallelConfig layout;
  bool sequence_parallel = false;
  float capacity_factor = 0.0f;
  int forward_syncs = 0;  // what the header documents
  bool fp8 = false;       // the experts in FP8 (current scaling), whose GEMMs are grouped too
};

void run_case(World& world, const Case& c) {
  INFO("case " << c.name << " at " << world.size() << " ranks");
  Mesh mesh(Layout(c.layout, world.size()), world.comm());
  Communicator& tp = mesh.comm(Axis::tp);
  MoEOptions o;
  o.router = RouterConfig{.experts = 4,
                          .top_k = 2,
                          .capacity_factor = c.capacity_factor,
                          .aux_loss_coeff = 0.01f,
                          .z_loss_coeff = 0.001f,
                          .bias_rate = 1e-3f};
  o.expert_ffn = kF;
  o.activation = nn::Activation::swiglu;
  o.sequence_parallel = c.sequence_parallel;
  if (c.fp8) o.fp8.mode = nn::Fp8Mode::hybrid;
  MoELayer layer(
      {&tp, nullptr, &mesh.comm(Axis::ep), &mesh.comm(Axis::etp), &mesh.comm(Axis::tp_dp_cp)}, kD,
      o);
  nn::ParameterStore store(layer, DType::f32, kCpu, 5);
  const std::unique_ptr<Communicator> self = world.comm().split(world.rank(), 0, "self");
  MoELayer ref({self.get(), nullptr, nullptr, nullptr, self.get()}, kD, o);
  nn::ParameterStore ref_store(ref, DType::f32, kCpu, 5);
  // Every rank of a tp group holds the same tokens (its dp shard); sp splits the sequence.
  const int shard = mesh.rank(Axis::dp);
  const Tensor x = Tensor::randn({kB, kS, kD}, 40 + shard);
  const Tensor dy = Tensor::randn({kB, kS, kD}, 60 + shard);
  const auto local = [&](const Tensor& full) {
    return c.sequence_parallel ? chunk(full, 1, tp.rank(), tp.size()) : full;
  };
  const Tensor x_mine = local(x).contiguous(), dy_mine = local(dy).contiguous();

  nn::Context ctx(kCpu);
  const std::uint64_t at_start = host_sync_count();
  (void)layer.forward(ctx, x_mine);
  const std::uint64_t after_forward = host_sync_count();
  (void)layer.backward(ctx, dy_mine);
  const std::uint64_t after_backward = host_sync_count();
  const MoEStats stats = layer.finish_step(mesh.comm(Axis::tp_dp_cp));
  const std::uint64_t after_step = host_sync_count();

  // The statistics, from the device counters, against one rank's layer over every shard.
  for (int r = 0; r < mesh.size(Axis::dp); ++r) {
    nn::Context rctx(kCpu);
    (void)ref.forward(rctx, Tensor::randn({kB, kS, kD}, 40 + r));
  }
  const MoEStats want = ref.finish_step(*self);
  agreed(world.comm(), [&] {
    CHECK(after_forward - at_start == static_cast<std::uint64_t>(c.forward_syncs));
    CHECK(after_backward - after_forward == 0);
    CHECK(after_step - after_backward == 1);
    CHECK(stats.load == want.load);
    CHECK(stats.assignments == want.assignments);
    CHECK(stats.dropped == want.dropped);
    CHECK((stats.dropped > 0) == (c.capacity_factor > 0.0f));
  });
}

}  // namespace

TEST_CASE("ep: the MoE layer waits for the host only where the exchange needs the counts", "[ep]") {
  World world = cpu_world();
  const int n = world.size();
  std::vector<Case> cases;
  // ep = 1: no wait in forward or backward, dropless or dropping, tp 1 or 2 (+sp).
  cases.push_back({"ep 1, dropless", ParallelConfig{}, false, 0.0f, 0});
  cases.push_back({"ep 1, capacity 0.5", ParallelConfig{}, false, 0.5f, 0});
  // FP8 experts at ep = 1: their grouped FP8 GEMMs read the offsets on the device too.
  cases.push_back({"ep 1, fp8", ParallelConfig{}, false, 0.0f, 0, true});
  cases.push_back({"ep 1, capacity 0.5, fp8", ParallelConfig{}, false, 0.5f, 0, true});
  if (n % 2 == 0) {
    // (etp 1: etp is tp unless set.) With sp each tp rank routes its own tokens, under a capacity
    // of its own that the one-rank reference does not share: dropless there.
    cases.push_back(
        {"tp 2, ep 1, capacity 0.5", ParallelConfig{.tp = 2, .etp = 1}, false, 0.5f, 0});
    cases.push_back({"tp 2 + sp, ep 1", ParallelConfig{.tp = 2, .etp = 1}, true, 0.0f, 0});
    // An exchange: the one copy of the counts per forward.
    cases.push_back({"ep 2", ParallelConfig{.ep = 2}, false, 0.0f, 1});
    cases.push_back({"ep 2, capacity 0.5", ParallelConfig{.ep = 2}, false, 0.5f, 1});
    cases.push_back({"etp 2 at ep 1", ParallelConfig{.ep = 1, .etp = 2}, false, 0.0f, 1});
    cases.push_back(
        {"tp 2 + sp, ep 1, fp8", ParallelConfig{.tp = 2, .etp = 1}, true, 0.0f, 0, true});
    cases.push_back({"ep 2, fp8", ParallelConfig{.ep = 2}, false, 0.0f, 1, true});
  }
  for (const Case& c : cases) run_case(world, c);
}
